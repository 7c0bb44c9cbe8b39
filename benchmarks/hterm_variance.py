"""Seed-to-seed spread with and without the H-term add-on, side by side in one run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/hterm_variance.py [--algo sac] [--env jaderl/Pendulum-v1] [--seeds 5] [--steps 6000]
        [--write]

Every seed trains twice with identical settings, once with ``use_hterm=false`` and once with ``use_hterm=true``,
for a fixed step budget (no early stop); the final evaluation (10 deterministic episodes) of each run is compared
across seeds: mean, standard deviation and worst seed. The table is printed; ``--write``
also puts it in the ``## hterm_variance`` section of benchmarks/RESULTS.md (other sections are kept).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile

from results_md import write_section

import jaderl

SECTION = "## hterm_variance"
SETTINGS = {"hidden": [64, 64], "lr": 1e-3, "eval_every": 2_000, "device": "cpu"}


def final_returns(algo: str, env: str, seeds: int, steps: int, use_hterm: bool) -> list[float]:
    out = []
    for seed in range(seeds):
        with tempfile.TemporaryDirectory() as tmp:
            result = jaderl.train(algo, env, seed=seed, total_steps=steps, run_dir=f"{tmp}/run", use_hterm=use_hterm,
                                  **SETTINGS)
        out.append(result.last_eval_return)
        print(f"  {'with' if use_hterm else 'without'} H-term, seed {seed}: {result.last_eval_return:.1f}",
              flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="sac")
    parser.add_argument("--env", default="jaderl/Pendulum-v1")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6_000)
    parser.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    rows = []
    for use_hterm in (False, True):
        returns = final_returns(args.algo, args.env, args.seeds, args.steps, use_hterm)
        per_seed = ", ".join(f"{r:.0f}" for r in returns)
        rows.append(f"| {'yes' if use_hterm else 'no'} | {statistics.mean(returns):.1f} | "
                    f"{statistics.stdev(returns):.1f} | {min(returns):.1f} | {per_seed} |")
    command = "python " + " ".join(["benchmarks/hterm_variance.py", *sys.argv[1:]])
    section = "\n".join([
        SECTION, "", f"Command: `{command}`  ", f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Task: {args.algo} on `{args.env}`, {args.steps:,} env steps per run, seeds 0-{args.seeds - 1}, settings "
        f"`{SETTINGS}` and the H-term defaults (L=64 segments of K=16 steps from the newest 1,000 steps, "
        "coefficient 0.1, one H-term step per hterm_every iterations: 64 for SAC). "
        "Final evaluation: 10 deterministic episodes. "
        "Five seeds are a small sample: read the spread as an indication, not a significance test.", "",
        "| H-term | mean final return | std across seeds (sample, n - 1) | worst seed | per seed |",
        "|---|---|---|---|---|",
        *rows, ""])
    print(section)
    if args.write:
        write_section(SECTION, section)

if __name__ == "__main__":
    main()
