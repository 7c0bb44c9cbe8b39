"""Environment and training throughput benchmarks, one function per section.

Usage (from the repository root)::

    .venv/bin/python benchmarks/throughput.py                      # every section
    .venv/bin/python benchmarks/throughput.py --section subproc    # one section
    .venv/bin/python benchmarks/throughput.py --section subproc --env Pendulum-v1 --steps 1000

Each section prints a markdown table to stdout and writes no file. The machine's load average is printed with
every table; numbers measured from a 1-minute load above 1.5 are marked as measured under load.

Sections
    subproc   env-steps/s of ordinary Gymnasium envs (HalfCheetah-v5 by default, Pendulum-v1 when MuJoCo is missing)
              stepped with random actions by Gymnasium's SyncVectorEnv and AsyncVectorEnv (one process per env,
              shared-memory observations), jaderl's SubprocVecEnv (``--workers`` processes, shared memory both
              ways, torch tensors out) and envpool (``num_threads=--workers``) when it is installed and has the env.
              Every variant is built once, warmed up, then timed ``--repeats`` times round-robin over ``--steps``
              batched steps; the table gives the median. Targets from the issue: SubprocVecEnv >= 3x Async and
              >= 0.9x envpool.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LOAD_LIMIT = 1.5


def _load() -> float:
    return os.getloadavg()[0]


def _header(title: str, notes: list[str], load_at_start: float) -> None:
    print(f"\n## {title}\n")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; load average (1 min) at start: {load_at_start:.2f}")
    for note in notes:
        print(f"note: {note}")
    print()


# -- section: subproc ----------------------------------------------------------------------------------------------


def _pick_env(requested: str) -> tuple[str, list[str]]:
    import gymnasium as gym

    try:
        gym.make(requested).close()
        return requested, []
    except Exception as exc:  # MuJoCo missing, most likely
        return "Pendulum-v1", [f"{requested} cannot be built here ({type(exc).__name__}: {exc}); "
                               "fell back to Pendulum-v1"]


def _time_loop(step: Callable[[int], Any], steps: int) -> float:
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    return time.perf_counter() - start


def section_subproc(args: argparse.Namespace) -> None:
    import gymnasium as gym
    import numpy as np
    import torch

    from jaderl.envs.subproc import SubprocVecEnv

    torch.set_num_threads(1)
    load_at_start = _load()
    env_id, notes = _pick_env(args.env)
    n, steps = args.num_envs, args.steps
    same_step = gym.vector.AutoresetMode.SAME_STEP
    probe = gym.make(env_id)
    act_space = probe.action_space
    probe.close()
    rng = np.random.default_rng(0)
    # random actions drawn before timing: raw (in the env's bounds) for Gymnasium/envpool, in [-1, 1] for jaderl
    unit = rng.uniform(-1.0, 1.0, (steps, n, *act_space.shape)).astype(np.float32)
    raw = (act_space.low + (unit + 1.0) * 0.5 * (act_space.high - act_space.low)).astype(act_space.dtype)
    unit_t = torch.from_numpy(unit)

    variants: dict[str, tuple[Callable[[int], Any], Callable[[], None]]] = {}
    factory = lambda: gym.make(env_id)  # noqa: E731 - Sync/Async pickle it with cloudpickle
    sync = gym.vector.SyncVectorEnv([factory] * n, autoreset_mode=same_step)
    sync.reset(seed=0)
    variants["Gymnasium SyncVectorEnv"] = (lambda i: sync.step(raw[i]), sync.close)
    asyn = gym.vector.AsyncVectorEnv([factory] * n, autoreset_mode=same_step)
    asyn.reset(seed=0)
    variants[f"Gymnasium AsyncVectorEnv ({n} processes)"] = (lambda i: asyn.step(raw[i]), asyn.close)
    sub = SubprocVecEnv(env_id, n, num_workers=args.workers)
    sub.reset(seed=0)
    variants[f"jaderl SubprocVecEnv ({args.workers} workers)"] = (lambda i: sub.step(unit_t[i]), sub.close)
    envpool_name = None
    try:
        import envpool

        if env_id in envpool.list_all_envs():
            pool = envpool.make_gymnasium(env_id, num_envs=n, num_threads=args.workers, seed=0)
            pool.reset()
            envpool_name = f"envpool {envpool.__version__} ({args.workers} threads)"
            variants[envpool_name] = (lambda i: pool.step(raw[i]), pool.close)
        else:
            notes.append(f"envpool: has no {env_id}")
    except ImportError:
        notes.append("envpool: not installable here")

    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for step, _ in variants.values():
            _time_loop(step, min(args.warmup, steps))
        for _ in range(args.repeats):
            for name, (step, _) in variants.items():
                times[name].append(_time_loop(step, steps))
    finally:
        for _, close in variants.values():
            close()

    rate = {name: n * steps / statistics.median(t) for name, t in times.items()}
    sub_name = next(name for name in rate if name.startswith("jaderl"))
    async_name = next(name for name in rate if "Async" in name)
    load = _load()
    if load_at_start > LOAD_LIMIT:
        notes.append(f"measured under load (1-min load average {load_at_start:.2f} > {LOAD_LIMIT} at start)")
    _header(f"subproc: {env_id}, {n} envs, random actions, {steps} batched steps x {args.repeats} (median)", notes,
            load_at_start)
    print("| stepper | env-steps/s | SubprocVecEnv / this |")
    print("|---|---:|---:|")
    for name, value in rate.items():
        print(f"| {name} | {value:,.0f} | {rate[sub_name] / value:.2f}x |")
    print()
    print(f"SubprocVecEnv / Async: {rate[sub_name] / rate[async_name]:.2f}x (target >= 3x)")
    if envpool_name is not None:
        print(f"SubprocVecEnv / envpool: {rate[sub_name] / rate[envpool_name]:.2f}x (target >= 0.9x)")
    print(f"load average (1 min) at end: {load:.2f} (includes this benchmark's own processes)")


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {"subproc": section_subproc}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    parser.add_argument("--env", default="HalfCheetah-v5", help="subproc: Gymnasium id")
    parser.add_argument("--num-envs", type=int, default=8, help="subproc: sub-envs per stepper")
    parser.add_argument("--workers", type=int, default=2, help="subproc: SubprocVecEnv workers / envpool threads")
    parser.add_argument("--steps", type=int, default=2000, help="subproc: batched steps per timing")
    parser.add_argument("--warmup", type=int, default=200, help="subproc: untimed batched steps first")
    parser.add_argument("--repeats", type=int, default=3, help="subproc: timings per stepper (median reported)")
    args = parser.parse_args(argv)
    for name, section in SECTIONS.items():
        if args.section in (name, "all"):
            section(args)


if __name__ == "__main__":
    main()
