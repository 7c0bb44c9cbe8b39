"""MARL env throughput: jaderl's torch-native ``jaderl/simple_spread`` against MPE2 and VMAS.

Usage (from the repository root)::

    .venv/bin/python benchmarks/marl_envs.py                   # CPU, 1 to 65,536 sub-envs
    .venv/bin/python benchmarks/marl_envs.py --device cuda     # jaderl and VMAS on a GPU (MPE2 stays on the CPU)
    .venv/bin/python benchmarks/marl_envs.py --quick           # 1, 64 and 4,096 sub-envs, short timings

Prints one markdown table to stdout and writes no file. The rate is env-steps/s: sub-env steps per second of wall
time (one step of a sub-env moves all its 3 agents), random discrete actions, with the episode resets every 25 steps
included for all three:

* jaderl: ``SimpleSpreadEnv`` (``jaderl.envs.mpe``, 3 agents, 3 landmarks, episodes of 25 steps) with ``N`` sub-envs
  on ``--device``, stepped with ``(N, 3)`` actions drawn on the device beforehand (a pool of 16 batches, cycled); it
  resets its sub-envs itself inside ``step``. On the CPU it skips the reset work of the 24 steps in 25 where no
  sub-env finishes (``sync_free=False``, its CPU default).
* MPE2: ``mpe2.simple_spread_v3.parallel_env()`` (the same game and defaults), one sub-env stepped in a Python loop
  with dicts of actions drawn beforehand and ``reset()`` when its episode ends; its rate does not depend on ``N``
  (stepping ``N`` of them in a loop takes ``N`` times as long), so every row holds the same measurement, taken again
  beside the others of that row.
* VMAS: ``vmas.make_env("simple_spread", num_envs=N, device=..., continuous_actions=False, max_steps=25)``, stepped
  with lists of 3 ``(N,)`` action tensors drawn beforehand and ``reset()`` every 25 steps (it has no auto-reset). VMAS
  is a different implementation of the game (its own physics engine and observations), the same size of problem.

Each variant is built once, warmed up, calibrated to last about ``--min-time`` seconds per timing, then timed
``--repeats`` times round-robin with the others at the same count (so all see the same load on a shared machine);
the table gives the medians. On the CPU the ratios are also given per CPU-second of this process (in parentheses),
which other load on a shared machine disturbs less. A VMAS count whose single step takes more than
``--vmas-max-step`` seconds is skipped. Everything runs in this process on one torch CPU thread; the default settings
take about a minute on a 2-core machine. Targets, on the CPU at 4,096 sub-envs: jaderl >= 100x MPE2 and >= 3x VMAS.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaderl.envs.mpe import SimpleSpreadEnv  # after the path insert, so the checkout is what is timed

COUNTS = (1, 64, 1024, 4096, 16384, 65536)
QUICK_COUNTS = (1, 64, 4096)
AGENTS = 3
EPISODE = 25
TARGET_COUNT = 4096
TARGET_MPE2, TARGET_VMAS = 100.0, 3.0

Stepper = Callable[[int], object]
"""Takes the step's index, advances every sub-env one step."""


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _calibrate(step: Stepper, device: str, min_time: float, warmup: int = 3) -> int:
    """Steps per timing so that one timing lasts about ``min_time`` seconds (after ``warmup`` untimed steps)."""
    for i in range(warmup):
        step(i)
    _sync(device)
    steps, elapsed = 1, 0.0
    while elapsed < min_time / 4:
        steps *= 2
        start = time.perf_counter()
        for i in range(steps):
            step(i)
        _sync(device)
        elapsed = time.perf_counter() - start
    return max(2, int(steps * min_time / elapsed))


def _time(step: Stepper, steps: int, device: str, num_envs: int) -> tuple[float, float]:
    """env-steps per second of wall time and per CPU-second of this process, over ``steps`` calls of ``step``."""
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(i)
    _sync(device)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return num_envs * steps / wall, num_envs * steps / max(cpu, 1e-9)


def jaderl_stepper(num_envs: int, device: str) -> Stepper:
    """jaderl's SimpleSpreadEnv with ``num_envs`` sub-envs on ``device`` and a pool of 16 random action batches."""
    env = SimpleSpreadEnv(num_envs, device=device, seed=0)
    env.reset()
    gen = torch.Generator(device=device).manual_seed(0)
    actions = torch.randint(0, 5, (16, num_envs, AGENTS), device=device, generator=gen)
    return lambda i: env.step(actions[i % 16])


def mpe2_stepper() -> Stepper:
    """One MPE2 simple_spread_v3 parallel env, reset when its episode ends, and a pool of 256 random action dicts."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(N=AGENTS, max_cycles=EPISODE)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = [{agent: int(a) for agent, a in zip(env.possible_agents, row, strict=True)}
               for row in rng.integers(0, 5, size=(256, AGENTS))]

    def step(i: int) -> None:
        if not env.agents:  # the episode ended with the previous step
            env.reset()
        env.step(actions[i % 256])

    return step


def vmas_stepper(num_envs: int, device: str) -> Stepper:
    """VMAS's simple_spread with ``num_envs`` sub-envs on ``device``, reset every 25 steps, and a pool of 16 random
    action lists."""
    import vmas

    env = vmas.make_env("simple_spread", num_envs=num_envs, device=device, continuous_actions=False, seed=0,
                        max_steps=EPISODE)
    env.reset()
    gen = torch.Generator(device=device).manual_seed(0)
    actions = [list(torch.randint(0, 5, (AGENTS, num_envs), device=device, generator=gen)) for _ in range(16)]
    taken = 0

    def step(i: int) -> None:
        nonlocal taken
        env.step(actions[i % 16])
        taken += 1
        if taken % EPISODE == 0:  # every sub-env is done together
            env.reset()

    return step


def _si(value: float) -> str:
    """Rates as 12.3M / 456k / 789 (as throughput.py prints them)."""
    if value >= 1e6:
        return f"{value / 1e6:,.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:,.0f}k"
    return f"{value:,.0f}"


def _times(ratio: float) -> str:
    """A ratio as ``1.4x`` below 10 and ``1,828x`` from there."""
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"


def _ratio(jaderl: tuple[float, float], other: tuple[float, float] | None, cpu: bool) -> str:
    """``jaderl / other`` per second of wall time, and per CPU-second in parentheses on the CPU."""
    if other is None:
        return "-"
    wall = _times(jaderl[0] / other[0])
    return f"{wall} ({_times(jaderl[1] / other[1])})" if cpu else wall


def _measure_row(num_envs: int, args: argparse.Namespace) -> dict[str, tuple[float, float] | None]:
    """Median env-steps per second of wall time and per CPU-second of jaderl, MPE2 and VMAS at ``num_envs``
    sub-envs (None: not measured), timed round-robin."""
    steppers: dict[str, tuple[Stepper, str, int]] = {"jaderl": (jaderl_stepper(num_envs, args.device), args.device,
                                                                num_envs)}
    if "MPE2" in args.libraries:
        steppers["MPE2"] = (mpe2_stepper(), "cpu", 1)
    if "VMAS" in args.libraries:
        vmas_step = vmas_stepper(num_envs, args.device)
        start = time.perf_counter()
        vmas_step(0)
        _sync(args.device)
        if time.perf_counter() - start <= args.vmas_max_step:
            steppers["VMAS"] = (vmas_step, args.device, num_envs)
    lengths = {name: _calibrate(step, device, args.min_time) for name, (step, device, _) in steppers.items()}
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in steppers}
    for _ in range(args.repeats):
        for name, (step, device, n) in steppers.items():
            rates[name].append(_time(step, lengths[name], device, n))
    return {name: (statistics.median(r[0] for r in rates[name]), statistics.median(r[1] for r in rates[name]))
            if name in rates else None for name in ("jaderl", "MPE2", "VMAS")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device of jaderl and VMAS (cpu, cuda)")
    parser.add_argument("--counts", type=lambda s: tuple(int(x) for x in s.split(",")), default=COUNTS,
                        help="sub-env counts, comma-separated (default: 1,64,1024,4096,16384,65536)")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings per variant and count (median reported)")
    parser.add_argument("--vmas-max-step", type=float, default=2.0,
                        help="skip VMAS at counts where one of its steps takes longer than this (seconds)")
    parser.add_argument("--no-mpe2", action="store_true", help="leave MPE2 out")
    parser.add_argument("--no-vmas", action="store_true", help="leave VMAS out")
    parser.add_argument("--quick", action="store_true", help="small settings: a smoke check, not a measurement")
    args = parser.parse_args(argv)
    if args.quick:
        args.counts, args.min_time, args.repeats = QUICK_COUNTS, 0.1, 1
    notes = []
    args.libraries = []
    for name, module, flag in (("MPE2", "mpe2", args.no_mpe2), ("VMAS", "vmas", args.no_vmas)):
        if flag:
            notes.append(f"{name} left out (--no-{module})")
        elif importlib.util.find_spec(module) is None:
            notes.append(f"{name} left out: `{module}` is not installed (pip install {module})")
        else:
            args.libraries.append(name)
    torch.set_num_threads(1)
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    rows = {n: _measure_row(n, args) for n in args.counts}

    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "1 CPU thread"
    print(f"\n## marl-envs: env-steps/s of simple_spread (3 agents, 25-step episodes), random actions, {args.device} "
          f"({where}), median of {args.repeats}\n")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, torch {torch.__version__}; load average (1 min) at start: {load_at_start:.2f}")
    print("note: MPE2 is one sub-env stepped in a Python loop on the CPU (its rate does not depend on the count: "
          "measured again with every row, round-robin with the others); resets every 25 steps included for all")
    cpu = args.device == "cpu"
    if cpu:
        print("note: rates per second of wall time; the ratios in parentheses are per CPU-second of this process "
              "(less sensitive to other load on a shared machine; on an idle one the two agree)")
    for note in notes:
        print(f"note: {note}")
    print()
    print("| sub-envs | jaderl | MPE2 | VMAS | jaderl / MPE2 | jaderl / VMAS |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, rate in rows.items():
        jaderl, mpe2, vmas = rate["jaderl"], rate["MPE2"], rate["VMAS"]
        assert jaderl is not None
        skipped = "skipped" if "VMAS" in args.libraries else "-"
        cells = [_si(jaderl[0]), "-" if mpe2 is None else _si(mpe2[0]), skipped if vmas is None else _si(vmas[0]),
                 _ratio(jaderl, mpe2, cpu), _ratio(jaderl, vmas, cpu)]
        print(f"| {n:,} | " + " | ".join(cells) + " |")
    print()
    target = rows.get(TARGET_COUNT)
    if cpu and target is not None and target["jaderl"] is not None:
        for name, goal in (("MPE2", TARGET_MPE2), ("VMAS", TARGET_VMAS)):
            other = target[name]
            if other is not None:
                ratio = target["jaderl"][0] / other[0]
                print(f"jaderl / {name} at {TARGET_COUNT:,} sub-envs on the CPU: {ratio:,.1f}x (target >= {goal:g}x): "
                      f"{'PASS' if ratio >= goal else 'FAIL'} (per CPU-second: "
                      f"{target['jaderl'][1] / other[1]:,.1f}x)")
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
