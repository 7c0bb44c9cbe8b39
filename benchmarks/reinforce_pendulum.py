"""REINFORCE without a baseline on Pendulum: a random search of its settings at the policy-gradient budget.

Usage (from the repository root)::

    .venv/bin/python benchmarks/reinforce_pendulum.py [--trials 40] [--search-seed 1] [--confirm-seeds 1,2,3,4]

Each trial draws one setting from ``SPACE`` (seeded by ``--search-seed``) and trains ``reinforce`` on
``jaderl/Pendulum-v1`` with seed 0 for up to ``--budget`` env steps (1M: RL-Zoo's A2C budget on Pendulum, the
largest of its policy-gradient family), evaluating 10 deterministic episodes every 20k steps and stopping at -200.
The best setting is then trained on ``--confirm-seeds``: a setting that reaches -200 on one seed only is luck, not
a solver. The tables go to the ``## reinforce_pendulum`` section of benchmarks/RESULTS.md (other sections kept).

``--long`` skips the search and trains ``LONG_SETTINGS`` (the search's best) on ``--long-seeds`` for up to
``--long-budget`` env steps (10M), evaluating every 100k: how far past the budget plain REINFORCE needs to go. Its
table goes to the ``## reinforce_pendulum_long`` section.
"""

from __future__ import annotations

import argparse
import datetime
import random
import sys
import tempfile
import time
import warnings
from typing import Any

from results_md import write_section

import jaderl

SECTION = "## reinforce_pendulum"
TARGET = -200.0
SPACE: dict[str, list[Any]] = {
    "num_envs": [16, 32, 64, 128], "horizon": [200, 400], "gamma": [0.9, 0.95, 0.97], "lr": [1e-3, 3e-3, 1e-2],
    "log_std_init": [-1.0, -0.5, 0.0], "hidden": [[64, 64], [128, 128]], "normalize_obs": [False, True],
    "max_grad_norm": [0.5, 0.0],
}
LONG_SECTION = "## reinforce_pendulum_long"
LONG_SETTINGS: dict[str, Any] = {  # the best setting of the search recorded in RESULTS.md (search seed 1)
    "num_envs": 32, "horizon": 400, "gamma": 0.97, "lr": 1e-2, "log_std_init": -0.5, "hidden": [128, 128],
    "normalize_obs": True, "max_grad_norm": 0.0,
}


def run(settings: dict[str, Any], seed: int, budget: int, eval_every: int = 20_000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        result = jaderl.train("reinforce", "jaderl/Pendulum-v1", run_dir=f"{tmp}/run", device="cpu", seed=seed,
                              total_steps=budget, eval_every=eval_every, target_return=TARGET, **settings)
    return {"best": result.best_eval_return, "steps": result.steps, "solved": result.solved,
            "wall_s": time.perf_counter() - start}


def row(settings: dict[str, Any], result: dict[str, Any], seed: int) -> str:
    cells = [str(settings[k]) for k in SPACE]
    solved = f"yes, at {result['steps']:,} steps" if result["solved"] else "no"
    return f"| {seed} | {' | '.join(cells)} | {result['best']:.0f} | {solved} |"


def long_runs(args: argparse.Namespace) -> None:
    """``--long``: how many env steps ``LONG_SETTINGS`` needs to reach the target when the budget is not capped."""
    results = []
    for seed in [int(s) for s in args.long_seeds.split(",") if s]:
        result = run(LONG_SETTINGS, seed, args.long_budget, eval_every=100_000)
        results.append((seed, result))
        print(f"seed {seed}: best {result['best']:.0f}, {'solved' if result['solved'] else 'not solved'} "
              f"at {result['steps']:,} steps ({result['wall_s']:.0f} s)", flush=True)
    command = " ".join(["python", "benchmarks/reinforce_pendulum.py", *sys.argv[1:]])
    rows = [f"| {seed} | {r['best']:.0f} | {'yes, at ' + format(r['steps'], ',') + ' steps' if r['solved'] else 'no'} "
            f"| {r['wall_s']:.0f} |" for seed, r in results]
    section = "\n".join([
        LONG_SECTION, "", f"Command: `{command}`  ",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Task: `reinforce` (no baseline) on `jaderl/Pendulum-v1` with the search's best setting `{LONG_SETTINGS}`, "
        f"up to {args.long_budget:,} env steps ({args.long_budget / 1e6:g}x the 1M policy-gradient budget), "
        f"stopping at {TARGET:.0f}; evaluation: 10 deterministic episodes every 100k steps.", "",
        f"| seed | best evaluation | reached {TARGET:.0f} | wall time (s) |", "|---|---|---|---|", *rows, ""])
    print(section)
    write_section(LONG_SECTION, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--search-seed", type=int, default=1)
    parser.add_argument("--confirm-seeds", default="1,2,3,4")
    parser.add_argument("--budget", type=int, default=1_000_000)
    parser.add_argument("--show", type=int, default=10, help="trials listed in the table (best first)")
    parser.add_argument("--long", action="store_true", help="no search: train LONG_SETTINGS without the 1M cap")
    parser.add_argument("--long-seeds", default="0,1,2")
    parser.add_argument("--long-budget", type=int, default=10_000_000)
    args = parser.parse_args()
    if args.long:
        long_runs(args)
        return
    rng = random.Random(args.search_seed)
    trials = []
    for k in range(args.trials):
        settings = {name: rng.choice(values) for name, values in SPACE.items()}
        result = run(settings, 0, args.budget)
        trials.append((settings, result))
        print(f"trial {k}: best {result['best']:.0f} in {result['steps']:,} steps ({result['wall_s']:.0f} s) "
              f"{settings}", flush=True)
    trials.sort(key=lambda t: -t[1]["best"])
    best_settings = trials[0][0]
    confirm = []
    for seed in [int(s) for s in args.confirm_seeds.split(",") if s]:
        result = run(best_settings, seed, args.budget)
        confirm.append((seed, result))
        print(f"best setting, seed {seed}: best {result['best']:.0f}", flush=True)
    header = f"| seed | {' | '.join(SPACE)} | best evaluation | reached {TARGET:.0f} |"
    rule = "|" + "---|" * (len(SPACE) + 3)
    solved = sum(r["solved"] for _, r in trials)
    command = " ".join(["python", "benchmarks/reinforce_pendulum.py", *sys.argv[1:]])
    section = "\n".join([
        SECTION, "", f"Command: `{command}`  ", f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Task: `reinforce` (no baseline) on `jaderl/Pendulum-v1`, at most {args.budget:,} env steps per run, stop at "
        f"{TARGET:.0f}; evaluation: 10 deterministic episodes every 20k steps. {args.trials} settings drawn at random "
        f"(search seed {args.search_seed}) from the grid in the script, each trained on seed 0; {solved} reached "
        f"{TARGET:.0f}. The best {min(args.show, len(trials))}:", "", header, rule,
        *(row(s, r, 0) for s, r in trials[:args.show]), "",
        "The best setting on further seeds:", "", header, rule, *(row(best_settings, r, seed) for seed, r in confirm),
        ""])
    print(section)
    write_section(SECTION, section)


if __name__ == "__main__":
    main()
