"""The zoo against SB3: what jaderl reaches with its zoo entry, against SB3 with RL Zoo's settings on the same budget.

Usage (from the repository root)::

    python benchmarks/zoo_vs_sb3.py                                  # LunarLanderContinuous-v3, PPO, seeds 0-3
    python benchmarks/zoo_vs_sb3.py --envs Hopper-v5 --seeds 0 --budget 200000     # a shorter check
    python benchmarks/zoo_vs_sb3.py --envs BipedalWalker-v3,Ant-v5 --jobs 8 --write  # tables into RESULTS.md

Each run (one library, env and seed) is a process of its own with one torch thread; ``--jobs`` run at a time (give it at
most the machine's cores, counting ``--env-workers``). jaderl trains ``jaderl.train("ppo", ENV, seed=S,
total_steps=BUDGET)`` and nothing else, so its settings are the zoo's entry (``jaderl/zoo/``); ``--env-workers N`` steps
its sub-envs in N worker processes (entries with several sub-envs), which changes where they run and not what they
compute. SB3 trains its PPO with RL Zoo's hyperparameters for the task (``TASKS``; ``normalize`` is RL Zoo's
``VecNormalize`` of observations and rewards), SB3's defaults otherwise. Both are CPU runs on Gymnasium's env. The score
of a run is the mean return of 10 deterministic episodes of its final policy (jaderl's evaluation at the end of the
budget; SB3's ``evaluate_policy`` on a new env seeded ``seed + 1``, with the training run's observation statistics); a
run stopped by ``--time-cap`` is marked so and scored the same way. Ten episodes move a settled policy's score by a
few points, so each run is also scored on ``--eval-episodes`` (100: Gymnasium's definition of solving a task, an average
over 100 consecutive trials) new episodes seeded ``10,000 + seed``: its final policy, and for jaderl the policy that
``jaderl.load`` and ``jaderl eval`` give by default (the best that its evaluations found). Target: the task's
threshold at RL Zoo's budget or fewer; the summary counts the seeds that reach it for each of the three scores (the
final policy over 10 and over ``--eval-episodes`` episodes, the policy jaderl gives over ``--eval-episodes``). Each
env's table goes to its own ``## zoo_vs_sb3: ENV`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import platform
import shlex
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_md import write_section

EVAL_SEED = 10_000
"""The seed of the longer evaluations' first episode, plus the run's seed."""

# rl-baselines3-zoo, hyperparams/ppo.yml: budget (n_timesteps), the threshold to reach, SB3's settings
# RL Zoo's `mujoco-defaults` (its Ant entry; jaderl's Hopper entry uses them too): SB3's PPO defaults
_MUJOCO_DEFAULTS = {"n_envs": 1, "normalize": True}
TASKS: dict[str, dict[str, Any]] = {
    "LunarLanderContinuous-v3": {"budget": 1_000_000, "threshold": 200, "sb3": {
        "n_envs": 16, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4,
        "ent_coef": 0.01}},
    "BipedalWalker-v3": {"budget": 5_000_000, "threshold": 300, "sb3": {
        "n_envs": 32, "normalize": True, "n_steps": 2048, "batch_size": 64, "gae_lambda": 0.95, "gamma": 0.999,
        "n_epochs": 10, "ent_coef": 0.0, "learning_rate": 3e-4, "clip_range": 0.18}},
    "Hopper-v5": {"budget": 1_000_000, "threshold": 3800, "sb3": _MUJOCO_DEFAULTS},
    "HalfCheetah-v5": {"budget": 1_000_000, "threshold": 4800, "sb3": {  # its tuned HalfCheetah-v3 entry
        "n_envs": 1, "normalize": True, "n_steps": 512, "batch_size": 64, "gamma": 0.98, "learning_rate": 2.0633e-5,
        "ent_coef": 0.000401762, "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.92, "max_grad_norm": 0.8,
        "vf_coef": 0.58096, "policy_kwargs": {"log_std_init": -2, "ortho_init": False, "activation_fn": "ReLU",
                                              "net_arch": {"pi": [256, 256], "vf": [256, 256]}}}},
    "Ant-v5": {"budget": 1_000_000, "threshold": 6000, "sb3": _MUJOCO_DEFAULTS},
}


def run(library: str, env_id: str, seed: int, budget: int, time_cap: float, env_workers: int,
        episodes: int) -> dict[str, Any]:
    """One run's row; a run that fails is a row with its error (the other runs go on)."""
    start = time.perf_counter()
    try:
        return _train(library, env_id, seed, budget, time_cap, env_workers, episodes)
    except Exception as exc:  # reported in the table
        return {"library": "jaderl" if library == "jaderl" else "SB3", "env": env_id, "seed": seed,
                "score": float("nan"), "final": float("nan"), "best": float("nan"), "steps": 0,
                "stop": f"error: {type(exc).__name__}: {exc}"[:200],
                "wall_s": time.perf_counter() - start}


def _train(library: str, env_id: str, seed: int, budget: int, time_cap: float, env_workers: int,
           episodes: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    if library == "jaderl":
        import jaderl

        sub_envs = jaderl.make_config("ppo", env_id).num_envs  # a worker steps one sub-env or more
        extra = {"env_workers": min(env_workers, sub_envs)} if env_workers and sub_envs > 1 else {}
        with tempfile.TemporaryDirectory() as tmp:
            result = jaderl.train("ppo", env_id, seed=seed, device="cpu", total_steps=budget, time_limit=time_cap,
                                  run_dir=f"{tmp}/run", **extra)
            wall_s = time.perf_counter() - start
            final, best = (jaderl.evaluate(f"{tmp}/run", episodes=episodes, seed=EVAL_SEED + seed, best=b)["mean"]
                           for b in (False, True))
        return {"library": library, "env": env_id, "seed": seed, "score": result.last_eval_return, "final": final,
                "best": best, "steps": result.steps, "stop": result.stop_reason, "wall_s": wall_s}
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    class Cap(BaseCallback):  # training time from model.learn, as jaderl's time_limit counts its training loop's
        def _on_training_start(self) -> None:
            self.began = time.perf_counter()

        def _on_step(self) -> bool:
            return time.perf_counter() - self.began < time_cap

    settings = dict(TASKS[env_id]["sb3"])
    n_envs, normalize = settings.pop("n_envs"), settings.pop("normalize", False)
    if "policy_kwargs" in settings:  # RL Zoo names the activation's class
        kwargs = settings["policy_kwargs"] = dict(settings["policy_kwargs"])
        kwargs["activation_fn"] = getattr(torch.nn, kwargs.get("activation_fn", "Tanh"))
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        env = VecNormalize(env, gamma=settings.get("gamma", 0.99))
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)
    model.learn(total_timesteps=budget, callback=Cap())
    steps = model.num_timesteps
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 1)
    if normalize:  # the training run's observation statistics, frozen; rewards as the env gives them
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
        eval_env.obs_rms = env.obs_rms
    score, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    wall_s = time.perf_counter() - start
    eval_env = make_vec_env(env_id, n_envs=1, seed=EVAL_SEED + seed)
    if normalize:
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
        eval_env.obs_rms = env.obs_rms
    final, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
    return {"library": "SB3", "env": env_id, "seed": seed, "score": float(score), "final": float(final),
            "best": float("nan"), "steps": steps, "stop": "total_steps" if steps >= budget else "time_limit",
            "wall_s": wall_s}


def section(env_id: str, results: list[dict[str, Any]], budget: int, args: argparse.Namespace) -> str:
    threshold = TASKS[env_id]["threshold"]
    n = args.eval_episodes
    rows = [f"| library | seed | final score (10 episodes) | final policy, {n} episodes | best evaluated policy, {n} "
            "episodes | env steps | stopped by | wall time (s) |", "|---|---:|---:|---:|---:|---:|---|---:|"]
    rows += [f"| {r['library']} | {r['seed']} | {r['score']:.1f} | {r['final']:.1f} | "
             f"{'-' if math.isnan(r['best']) else format(r['best'], '.1f')} | {r['steps']:,} | {r['stop']} | "
             f"{r['wall_s']:.0f} |" for r in results]
    summary = []
    for lib in ("jaderl", "SB3"):
        mine = [r for r in results if r["library"] == lib]
        for key, what in (("score", "final policy, 10 episodes"), ("final", f"final policy, {n} episodes"),
                          ("best", f"best evaluated policy, {n} episodes")):
            scores = [r[key] for r in mine if r["steps"] and not math.isnan(r[key])]
            if scores:
                summary.append(f"{lib} ({what}): {sum(s >= threshold for s in scores)} of {len(scores)} seeds >= "
                               f"{threshold}, median {statistics.median(scores):.1f}")
        if mine:
            summary.append(f"{lib}: median wall time {statistics.median(r['wall_s'] for r in mine):.0f} s "
                           "(training)")
    command = "python benchmarks/zoo_vs_sb3.py " + shlex.join(sys.argv[1:])
    workers = f", jaderl's sub-envs in {args.env_workers} worker processes" if args.env_workers else ""
    return "\n".join([
        f"## zoo_vs_sb3: {env_id}", "", f"Command: `{command.strip()}`  ",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {platform.machine()}, {multiprocessing.cpu_count()} CPUs, {args.jobs} "
        f"run{'s' if args.jobs > 1 else ''} at a time, one torch "
        f"thread each{workers}; at most {args.time_cap:.0f} s of training per run  ",
        f"Task: PPO on `{env_id}`, {budget:,} env steps per run (RL Zoo's budget: {TASKS[env_id]['budget']:,}); "
        f"jaderl on its zoo entry, SB3 with RL Zoo's settings `{TASKS[env_id]['sb3']}`", "", *rows, "",
        "; ".join(summary) + "."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="LunarLanderContinuous-v3", help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--sb3-seeds", default=None, help="SB3's seeds (default: --seeds)")
    parser.add_argument("--budget", type=int, default=None, help="env steps per run (default: RL Zoo's)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--env-workers", type=int, default=0, help="worker processes for jaderl's sub-envs")
    parser.add_argument("--time-cap", type=float, default=3600.0, help="seconds of training per run at most")
    parser.add_argument("--eval-episodes", type=int, default=100, help="episodes of the second scores")
    parser.add_argument("--write", action="store_true", help="record the tables in benchmarks/RESULTS.md")
    args = parser.parse_args()
    envs = [e for e in args.envs.split(",") if e]
    if unknown := [e for e in envs if e not in TASKS]:
        parser.error(f"unknown env {unknown[0]!r}; choose from {', '.join(TASKS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    sb3_seeds = seeds if args.sb3_seeds is None else [int(s) for s in args.sb3_seeds.split(",") if s]
    budgets = {env: args.budget or TASKS[env]["budget"] for env in envs}
    jobs = [(lib, env, seed, budgets[env], args.time_cap, args.env_workers if lib == "jaderl" else 0,
             args.eval_episodes)
            for env in envs for lib, lib_seeds in (("jaderl", seeds), ("sb3", sb3_seeds)) for seed in lib_seeds]
    jobs.sort(key=lambda job: -budgets[job[1]])  # the longest first
    results = []
    # a process per run (not a daemon: jaderl's env workers are its children)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        for future in as_completed([pool.submit(run, *job) for job in jobs]):  # each run's line as it ends
            results.append(future.result())
            print(json.dumps(results[-1]), flush=True)
    results.sort(key=lambda r: (r["library"] != "jaderl", r["seed"]))
    for env in envs:
        text = section(env, [r for r in results if r["env"] == env], budgets[env], args)
        print(text, "\n", flush=True)
        if args.write:
            write_section(f"## zoo_vs_sb3: {env}", text)


if __name__ == "__main__":
    main()
