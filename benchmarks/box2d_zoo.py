"""The zoo on Box2D: what jaderl reaches with its zoo entry, against SB3 with RL Zoo's settings on the same budget.

Usage (from the repository root)::

    python benchmarks/box2d_zoo.py                                  # LunarLanderContinuous-v3, PPO, seeds 0-3
    python benchmarks/box2d_zoo.py --seeds 0,1 --budget 200000      # a shorter check
    python benchmarks/box2d_zoo.py --jobs 8 --write                 # 8 runs at a time; table into RESULTS.md

Each run (one library, one seed) is a process of its own with one torch thread; ``--jobs`` run at a time (give it
at most the machine's cores). jaderl trains ``jaderl.train(ALGO, ENV, seed=S, total_steps=BUDGET)`` and nothing
else, so its settings are the zoo's entry (``jaderl/zoo/``); SB3 trains its PPO with RL Zoo's hyperparameters for the
task (``SB3_SETTINGS``; SB3's defaults otherwise, which the zoo entry copies where RL Zoo is silent). Both are CPU
runs on Gymnasium's env. The score of a run is the mean return of 10 deterministic episodes of its final policy
(jaderl's evaluation at the end of the budget; SB3's ``evaluate_policy``, seeded ``seed + 1``); a run stopped by
``--time-cap`` is marked so and scored the same way. Target: the final policy reaches Gymnasium's reward threshold
(200 for LunarLanderContinuous) at RL Zoo's budget or fewer.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_md import write_section

SECTION = "## box2d_zoo"
SB3_SETTINGS: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo, hyperparams/ppo.yml, LunarLanderContinuous: n_envs 16, n_timesteps 1e6
    "LunarLanderContinuous-v3": {"n_envs": 16, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999,
                                 "n_epochs": 4, "ent_coef": 0.01},
}


def run(library: str, env_id: str, seed: int, budget: int, time_cap: float) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    if library == "jaderl":
        import jaderl

        with tempfile.TemporaryDirectory() as tmp:
            result = jaderl.train("ppo", env_id, seed=seed, device="cpu", total_steps=budget, time_limit=time_cap,
                                  run_dir=f"{tmp}/run")
        return {"library": library, "seed": seed, "score": result.last_eval_return, "steps": result.steps,
                "stop": result.stop_reason, "wall_s": time.perf_counter() - start}
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    class Cap(BaseCallback):
        def _on_step(self) -> bool:
            return time.perf_counter() - start < time_cap

    settings = dict(SB3_SETTINGS[env_id])
    env = make_vec_env(env_id, n_envs=settings.pop("n_envs"), seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)
    model.learn(total_timesteps=budget, callback=Cap())
    steps = model.num_timesteps
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 1)
    score, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    return {"library": "SB3", "seed": seed, "score": float(score), "steps": steps,
            "stop": "total_steps" if steps >= budget else "time_limit", "wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="LunarLanderContinuous-v3", choices=list(SB3_SETTINGS))
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--budget", type=int, default=1_000_000, help="env steps per run (RL Zoo's: 1M)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--time-cap", type=float, default=3600.0, help="seconds of training per run at most")
    parser.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    jobs = [(lib, args.env, seed, args.budget, args.time_cap) for seed in seeds for lib in ("jaderl", "sb3")]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.starmap(run, jobs)
    rows = ["| library | seed | final score (10 episodes) | env steps | stopped by | wall time (s) |",
            "|---|---:|---:|---:|---|---:|"]
    rows += [f"| {r['library']} | {r['seed']} | {r['score']:.1f} | {r['steps']:,} | {r['stop']} | {r['wall_s']:.0f} |"
             for r in results]
    summary = []
    for lib in ("jaderl", "SB3"):
        scores = [r["score"] for r in results if r["library"] == lib]
        summary.append(f"{lib}: {sum(s >= 200 for s in scores)} of {len(scores)} seeds >= 200, median "
                       f"{statistics.median(scores):.1f}, median wall time "
                       f"{statistics.median(r['wall_s'] for r in results if r['library'] == lib):.0f} s")
    command = "python benchmarks/box2d_zoo.py " + " ".join(sys.argv[1:])
    section = "\n".join([
        SECTION, "", f"Command: `{command.strip()}`  ",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {platform.machine()}, {multiprocessing.cpu_count()} CPUs, {args.jobs} runs at a time, one torch "
        f"thread each  ", f"Task: PPO on `{args.env}`, {args.budget:,} env steps per run; jaderl on its zoo entry, "
        f"SB3 with RL Zoo's settings `{SB3_SETTINGS[args.env]}`", "", *rows, "", "; ".join(summary) + "."])
    print(section)
    if args.write:
        write_section(SECTION, section)


if __name__ == "__main__":
    main()
