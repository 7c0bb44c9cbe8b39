"""REINFORCE without a baseline on Pendulum: the zoo's setting trained on many seeds.

Usage (from the repository root)::

    .venv/bin/python benchmarks/reinforce_pendulum.py [--seeds 0,1,...,23] [--budget 1024000] [--jobs 2] [--write]

Trains ``reinforce`` on ``jaderl/Pendulum-v1`` with the zoo's settings (``jaderl/zoo/pendulum.yaml``, which the
``reinforce-pendulum`` case of tests/algos/test_learning.py trains) on every seed for up to ``--budget`` env steps
(1,024k: 80 of the zoo's rollouts of 64 x 200 steps, about RL-Zoo's A2C budget on Pendulum, 1M, the largest of its
policy-gradient family), evaluating 10 deterministic episodes every 25,600 steps and stopping at -200. The learning
test runs a few seeds; this table says how often the setting solves the task. ``--jobs`` runs that many seeds at a
time, one CPU thread each. The table is printed; ``--write`` also puts it in the ``## reinforce_pendulum`` section of
benchmarks/RESULTS.md (other sections kept).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

from results_md import write_section

SECTION = "## reinforce_pendulum"
TARGET = -200.0


def _zoo_settings() -> dict[str, Any]:
    from jaderl import zoo

    entry = zoo.lookup("reinforce", "jaderl/Pendulum-v1")
    assert entry is not None, "jaderl/zoo/pendulum.yaml has no reinforce entry"
    return {k: v for k, v in entry.settings.items() if k != "total_steps"}


def run(seed: int, budget: int) -> dict[str, Any]:
    import torch

    import jaderl

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        result = jaderl.train("reinforce", "jaderl/Pendulum-v1", run_dir=f"{tmp}/run", device="cpu", seed=seed,
                              total_steps=budget, target_return=TARGET)  # the rest: the zoo's entry
    return {"seed": seed, "best": result.best_eval_return, "steps": result.steps, "solved": result.solved,
            "wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=",".join(map(str, range(24))))
    parser.add_argument("--budget", type=int, default=1_024_000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.starmap(run, [(seed, args.budget) for seed in seeds])
    for r in results:
        print(f"seed {r['seed']}: best {r['best']:.0f}, {'solved' if r['solved'] else 'not solved'} at "
              f"{r['steps']:,} steps ({r['wall_s']:.0f} s)", flush=True)
    solved = [r for r in results if r["solved"]]
    rows = [f"| {r['seed']} | {'yes, at ' + format(r['steps'], ',') + ' steps' if r['solved'] else 'no'} "
            f"| {r['best']:.0f} | {r['wall_s']:.0f} |" for r in results]
    median = f"{statistics.median(r['steps'] for r in solved):,.0f}" if solved else "-"
    command = " ".join(["python", "benchmarks/reinforce_pendulum.py", *sys.argv[1:]])
    section = "\n".join([
        SECTION, "", f"Command: `{command}`  ", f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Task: `reinforce` (no baseline) on `jaderl/Pendulum-v1` with the zoo's setting `{_zoo_settings()}`, "
        f"at most {args.budget:,} env steps per run, stopping when an evaluation (10 deterministic episodes every "
        f"25,600 steps) reaches {TARGET:.0f}; {args.jobs} runs at a time, one CPU thread each.", "",
        f"**Reached {TARGET:.0f}: {len(solved)} of {len(results)} seeds** (median {median} env steps among those).", "",
        f"| seed | reached {TARGET:.0f} | best evaluation | wall time (s) |", "|---|---|---|---|", *rows, ""])
    print(section)
    if args.write:
        write_section(SECTION, section)


if __name__ == "__main__":
    main()
