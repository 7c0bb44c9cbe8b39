"""What training under ``lightning.Trainer.fit`` costs against jaderl's own loop, side by side in one run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/lightning_overhead.py [--repeats 3] [--cases ppo,dqn] [--write]

Each case trains the same algorithm with the same settings, seed and env-step budget twice per repeat: with
``jaderl.train`` (jaderl's loop: evaluations every ``eval_every`` steps, metrics.csv, one checkpoint at the end) and
with :class:`jaderl.integrations.lightning.JaderlModule` under ``lightning.Trainer.fit`` (a CSVLogger, the default
ModelCheckpoint writing a safetensors checkpoint after every evaluation, no progress bar). The two alternate, one
CPU thread each, and the CPU time of the whole call (set-up included) is compared by the median of the repeats (wall
times move with other work on a shared machine; their ratio is shown beside).
The cases are the two ends of the per-iteration work: PPO takes 256 env steps and 20 epochs of minibatches per
iteration; DQN takes one env step and half a gradient step per iteration, so Lightning's fixed cost per training
step weighs most there. Both leave the zoo out (``zoo=False``), so that its tuned settings do not change the cases.
The table is printed; ``--write`` also puts it in the ``## lightning_overhead`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from results_md import write_section

SECTION = "## lightning_overhead"
REPO = Path(__file__).resolve().parents[1]
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # configs/ppo_cartpole.yaml's settings, a fixed budget and no target (both runs do the same work)
    "ppo": ("ppo", {"num_envs": 8, "horizon": 32, "lr": 1e-3, "num_epochs": 20, "minibatch_size": 256,
                    "gamma": 0.98, "gae_lambda": 0.8, "total_steps": 51_200, "eval_every": 10_240, "zoo": False}),
    # DQN's defaults on the same env (one sub-env: not the zoo's eight, which would take 8 env steps an iteration)
    "dqn": ("dqn", {"total_steps": 10_000, "eval_every": 2_000, "zoo": False}),
}
TARGET_OVERHEAD = 0.10


def run_jaderl(algo: str, settings: dict[str, Any], tmp: str) -> tuple[float, float]:
    import jaderl

    start, cpu_start = time.perf_counter(), time.process_time()
    jaderl.train(algo, "jaderl/CartPole-v1", run_dir=f"{tmp}/jaderl", device="cpu", seed=0, **settings)
    return time.process_time() - cpu_start, time.perf_counter() - start


def run_lightning(algo: str, settings: dict[str, Any], tmp: str) -> tuple[float, float]:
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from jaderl.integrations.lightning import JaderlModule

    start, cpu_start = time.perf_counter(), time.process_time()
    model = JaderlModule(algo, "jaderl/CartPole-v1", device="cpu", seed=0, **settings)
    trainer = L.Trainer(default_root_dir=tmp, logger=CSVLogger(tmp), enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model)
    elapsed = time.process_time() - cpu_start, time.perf_counter() - start
    assert model.agent.steps >= settings["total_steps"]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    import logging

    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    rows = []
    for name in args.cases.split(","):
        algo, settings = CASES[name]
        cpu: dict[str, list[float]] = {"jaderl": [], "lightning": []}
        wall: dict[str, list[float]] = {"jaderl": [], "lightning": []}
        for repeat in range(args.repeats):
            for kind, run in (("jaderl", run_jaderl), ("lightning", run_lightning)):
                with tempfile.TemporaryDirectory() as tmp:
                    cpu_s, wall_s = run(algo, settings, tmp)
                cpu[kind].append(cpu_s)
                wall[kind].append(wall_s)
                print(f"{name} repeat {repeat}: {kind} {cpu_s:.2f} s CPU, {wall_s:.2f} s wall", flush=True)
        own, lightning = statistics.median(cpu["jaderl"]), statistics.median(cpu["lightning"])
        wall_ratio = statistics.median(wall["lightning"]) / statistics.median(wall["jaderl"])
        overhead = lightning / own - 1
        rows.append(f"| {name} | `{settings}` | {own:.2f} | {lightning:.2f} | **{lightning / own:.3f}** "
                    f"| {wall_ratio:.3f} | {'yes' if overhead <= TARGET_OVERHEAD else 'no'} |")
        print(f"{name}: jaderl {own:.2f} s CPU, Lightning {lightning:.2f} s CPU, ratio {lightning / own:.3f} (wall "
              f"{wall_ratio:.3f})", flush=True)
    command = " ".join([".venv/bin/python", "benchmarks/lightning_overhead.py", *sys.argv[1:]])
    section = "\n".join([
        SECTION, "", f"Command: `{command}`  ", f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        "Task: the same algorithm, settings, seed 0 and env-step budget on `jaderl/CartPole-v1`, trained by "
        "`jaderl.train` and by `JaderlModule` under `lightning.Trainer.fit` (CSVLogger, default ModelCheckpoint, no "
        f"progress bar), alternating, one CPU thread each; the median of {args.repeats} repeats of the whole call's "
        f"CPU time of this process (the ratio of the median wall times beside it: other work on the machine moves "
        f"those). Target: at most {TARGET_OVERHEAD:.0%} overhead. A DQN "
        "training batch runs 32 one-step iterations (`iterations_per_batch`, picked for at least 32 env steps); a PPO "
        "batch is one iteration of 256 env steps.", "",
        "| case | settings | jaderl loop, CPU (s) | Lightning fit, CPU (s) | ratio | wall-time ratio | within 10 % |",
        "|---|---|---|---|---|---|---|",
        *rows, ""])
    print(section)
    if args.write:
        write_section(SECTION, section)


if __name__ == "__main__":
    main()
