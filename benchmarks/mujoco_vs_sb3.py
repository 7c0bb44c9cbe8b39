"""SAC and TD3 on MuJoCo (HalfCheetah-v5, Hopper-v5): jaderl vs Stable-Baselines3 at a fixed step budget.

Usage (from the repository root; needs ``pip install -e .[mujoco]``)::

    .venv/bin/python benchmarks/mujoco_vs_sb3.py            # 2 algos x 2 envs x 3 seeds x 2 libraries, 100k steps
    .venv/bin/python benchmarks/mujoco_vs_sb3.py --algos sac --envs Hopper-v5 --seeds 1
    .venv/bin/python benchmarks/mujoco_vs_sb3.py --quick    # smoke check: 1 seed, 3k steps, writes no file

Every run (one library, algorithm, env and seed) is a fresh subprocess of this script that trains for ``--steps``
env steps with no early stop, then evaluates the final deterministic policy over 10 episodes on a separate env
(seeded ``seed + 1``). Both libraries use RL-Zoo's MuJoCo settings for these algorithms where they differ from the
defaults: 10,000 warm-up steps of uniform random actions and, for TD3, Gaussian exploration noise of std 0.1; the
batch (256), learning rates (SAC 3e-4; TD3 1e-3), one gradient step per env step and the rest are each library's
defaults, which agree, except TD3's networks: jaderl's default is [256, 256] and SB3's (and RL Zoo's) [400, 300]
(SAC: [256, 256] on both sides). Each run uses one torch thread and the CPU.

Each finished run is saved as JSON in ``--runs-dir`` (``benchmarks/mujoco_runs``) and skipped when the script runs
again, so the full grid (many CPU hours) can be run in pieces or on several machines and merged; ``--rerun`` repeats
runs. The table of every saved run (mean and std of the final return across seeds, median wall time) goes to the
``## mujoco`` section of benchmarks/RESULTS.md; other sections are kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results_md import write_section

ROOT = Path(__file__).resolve().parent
SECTION = "## mujoco"
ALGOS, ENVS = ("sac", "td3"), ("HalfCheetah-v5", "Hopper-v5")
WARMUP, TD3_NOISE, EVAL_EPISODES = 10_000, 0.1, 10


def run_jaderl(algo: str, env: str, seed: int, steps: int, warmup: int) -> dict[str, Any]:
    import jaderl

    settings: dict[str, Any] = {"warmup_steps": warmup, "device": "cpu", "seed": seed, "total_steps": steps,
                                "eval_every": steps, "eval_episodes": EVAL_EPISODES, "checkpoint_every": 10 * steps}
    if algo == "td3":
        settings["exploration_noise"] = TD3_NOISE
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = jaderl.train(algo, env, run_dir=f"{tmp}/run", **settings)
        wall = time.perf_counter() - start
    return {"final_return": result.last_eval_return, "wall_s": wall, "steps": result.steps}


def run_sb3(algo: str, env: str, seed: int, steps: int, warmup: int) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    start = time.perf_counter()
    train_env = gym.make(env)
    kwargs: dict[str, Any] = {"learning_starts": warmup, "seed": seed, "device": "cpu", "verbose": 0}
    if algo == "td3":
        dim = train_env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dim), TD3_NOISE * np.ones(dim))
    model = (SAC if algo == "sac" else TD3)("MlpPolicy", train_env, **kwargs)
    model.set_logger(Logger(None, []))  # no output (SB3's default logger also leaves an empty folder in /tmp)
    model.learn(steps)
    eval_env = gym.make(env)
    eval_env.reset(seed=seed + 1)
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True,
                                 return_episode_rewards=True)
    wall = time.perf_counter() - start
    return {"final_return": float(np.mean(returns)), "wall_s": wall, "steps": model.num_timesteps}


def run_in_subprocess(library: str, algo: str, env: str, seed: int, steps: int, warmup: int) -> dict[str, Any]:
    spec = json.dumps({"library": library, "algo": algo, "env": env, "seed": seed, "steps": steps, "warmup": warmup})
    done = subprocess.run([sys.executable, __file__, "--worker", spec], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{library} {algo} {env} seed {seed} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(runs: list[dict[str, Any]], command: str) -> str:
    rows = []
    for algo in ALGOS:
        for env in ENVS:
            for library in ("jaderl", "SB3"):
                own = [r for r in runs if (r["library"], r["algo"], r["env"]) == (library, algo, env)]
                if not own:
                    continue
                finals = [r["final_return"] for r in own]
                std = f"{statistics.pstdev(finals):,.0f}" if len(finals) > 1 else "n/a"
                rows.append(f"| {algo.upper()} | {env} | {library} | {len(own)} | {statistics.mean(finals):,.0f} | "
                            f"{std} | {', '.join(f'{x:,.0f}' for x in finals)} | "
                            f"{statistics.median(r['wall_s'] for r in own):,.0f} |")
    dates = sorted(r["date"] for r in runs)
    machines = sorted({r["machine"] for r in runs})
    loads = sorted(r["load"] for r in runs)
    grid = {(lib, a, e, seed) for lib in ("jaderl", "SB3") for a in ALGOS for e in ENVS for seed in range(3)}
    missing = len(grid - {(r["library"], r["algo"], r["env"], r["seed"]) for r in runs})
    return "\n".join([
        SECTION, "",
        f"Every run saved in `benchmarks/mujoco_runs/` (each is one subprocess; the latest command: `{command}`).  ",
        f"Missing from the full grid (2 algorithms x 2 envs x 3 seeds x 2 libraries): {missing} of {len(grid)} runs.  "
        if missing else "The full grid (2 algorithms x 2 envs x 3 seeds x 2 libraries) is complete.  ",
        f"Runs dated {dates[0]} to {dates[-1]} on: {'; '.join(machines)}; 1-minute load average when a run "
        f"ended: {loads[0]:.2f} to {loads[-1]:.2f} (wall times are only comparable between runs at similar load).  ",
        f"Budget: {runs[0]['steps']:,} env steps per run, no early stop; final evaluation: {EVAL_EPISODES} "
        "deterministic episodes. Settings in benchmarks/mujoco_vs_sb3.py (RL-Zoo's warm-up and TD3 noise, otherwise "
        "library defaults, so TD3's networks are [256, 256] in jaderl and [400, 300] in SB3; one CPU thread each).",
        "",
        "| algorithm | env | library | seeds | mean final return | std across seeds (population, n) | per seed "
        "| median wall (s) |",
        "|---|---|---|---:|---:|---:|---|---:|", *rows, ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default=",".join(ALGOS), help="comma-separated: sac, td3")
    parser.add_argument("--envs", default=",".join(ENVS), help="comma-separated MuJoCo ids")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--libraries", default="jaderl,sb3", help="comma-separated: jaderl, sb3")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "mujoco_runs")
    parser.add_argument("--rerun", action="store_true", help="repeat runs that are saved already")
    parser.add_argument("--quick", action="store_true", help="1 seed, 3k steps (1k warm-up); saves and writes nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        runner = run_jaderl if spec.pop("library") == "jaderl" else run_sb3
        print(json.dumps(runner(**spec)))
        return
    steps, warmup, seeds = (3_000, 1_000, 1) if args.quick else (args.steps, WARMUP, args.seeds)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    for algo in args.algos.split(","):
        for env in args.envs.split(","):
            for seed in range(seeds):
                for library in args.libraries.split(",") if seed % 2 == 0 else args.libraries.split(",")[::-1]:
                    path = args.runs_dir / f"{library}-{algo}-{env}-s{seed}-{steps}.json"
                    if path.exists() and not args.rerun and not args.quick:
                        continue
                    result = run_in_subprocess(library, algo, env, seed, steps, warmup)
                    name = "SB3" if library == "sb3" else "jaderl"
                    print(f"{name:>6} {algo} {env} seed {seed}: final return {result['final_return']:9.1f}, "
                          f"{result['wall_s']:7.1f} s", flush=True)
                    if not args.quick:
                        record = {"library": name, "algo": algo, "env": env, "seed": seed, **result,
                                  "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                                  "machine": machine, "load": round(os.getloadavg()[0], 2)}
                        path.write_text(json.dumps(record, indent=1) + "\n")
    if args.quick:
        return
    runs = [json.loads(p.read_text()) for p in sorted(args.runs_dir.glob(f"*-{steps}.json"))]
    if runs:
        section = report(runs, " ".join([Path(sys.executable).name, "benchmarks/mujoco_vs_sb3.py", *sys.argv[1:]]))
        print(section)
        write_section(SECTION, section)


if __name__ == "__main__":
    main()
