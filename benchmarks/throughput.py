"""Environment and training throughput benchmarks, one function per section.

Usage (from the repository root)::

    .venv/bin/python benchmarks/throughput.py                      # every section, full settings
    .venv/bin/python benchmarks/throughput.py --quick              # every section, small settings (a smoke check)
    .venv/bin/python benchmarks/throughput.py --section subproc    # one section
    .venv/bin/python benchmarks/throughput.py --section subproc --env Pendulum-v1 --steps 1000
    .venv/bin/python benchmarks/throughput.py --section torch-envs --device cuda   # on a GPU

Each section prints a markdown table to stdout and writes no file. The machine's load average is printed with
every table; numbers measured from a 1-minute load above 1.5 are marked as measured under load.

Sections
    subproc   env-steps/s of ordinary Gymnasium envs (HalfCheetah-v5 by default, Pendulum-v1 when MuJoCo is missing)
              stepped with random actions by Gymnasium's SyncVectorEnv and AsyncVectorEnv (one process per env,
              shared-memory observations), jaderl's SubprocVecEnv (``--workers`` stepping processes: the caller
              and ``--workers - 1`` workers, shared memory both ways, torch tensors out) and envpool
              (``num_threads=--workers``) when it is installed (benchmarks/requirements.txt) and has the env.
              Every variant is built once, warmed up, then timed ``--repeats`` times round-robin over ``--steps``
              batched steps; the table gives the median. Targets: SubprocVecEnv >= 3x Async and
              >= 0.9x envpool.
    torch-envs
              env-steps/s of every single-agent torch-native env in ``jaderl.envs.TORCH_ENVS`` (the stock-trading
              one when ``vega_datasets``, which holds its prices, is installed), at 1, 16,
              256, 4,096 and 65,536 sub-envs on the CPU (one thread), at 1, 256, 4,096, 65,536, 262,144 and 1,048,576 on
              a GPU (``--quick``: 1, 256, 4,096), on ``--device``. Random actions are drawn on the device before timing
              (a pool of 16 batches, cycled); only ``step`` is timed, in a loop after a warm-up, long enough to last
              ``--min-time`` seconds; the table gives the median of ``--repeats`` timings. On the CPU the envs skip the
              reset work of steps where no sub-env finished (``sync_free=False``, their CPU default); an extra row times
              Pendulum with ``sync_free=True``, the GPU's way of stepping. Targets: the torch Pendulum at 4,096 envs >=
              10M env-steps/s on the CPU; >= 200M env-steps/s on a GPU (its best size).
    ppo       end-to-end PPO training samples/s: env steps collected and learned from per second of wall time, setup and
              a warm-up iteration excluded, no evaluation or logging. jaderl: PPO on ``--ppo-envs`` sub-envs of its
              torch ``jaderl/Pendulum-v1`` (on ``--device``), one ``explore`` + ``update`` per iteration. SB3: PPO on
              Gymnasium's Pendulum-v1 in a DummyVecEnv of the same number of envs (CPU; the envs are Gymnasium's Python
              envs: that is the comparison the target is about). Both: actor and critic MLPs [64, 64] with tanh,
              rollouts of ``--ppo-horizon`` steps per env, minibatches of ``--ppo-minibatch``, ``--ppo-epochs`` epochs,
              gradient clipping at 0.5. Each library runs in its own subprocess with one torch thread, for at least 5 x
              ``--min-time`` seconds, once per round of ``--rounds`` (every row in turn, round after round; the table
              gives the medians). Target: jaderl >= 10x SB3 on the CPU; >= 2M samples/s on a GPU. On the CPU the last
              rows time the matrix products of an iteration alone (acting, and each minibatch's forward and backward
              pass of actor and critic, each product into a preallocated output): the ceiling of that arithmetic in
              PyTorch's float32 kernels, and as ``precision=bfloat16`` splits it (hidden layers in bfloat16, first and
              output layers in float32). ``--no-sb3`` times jaderl alone (GPU-sized rollouts: SB3's Python envs would
              take minutes per one).
    sac       SAC gradient updates per second: critics, actor and entropy coefficient, twin critics and actor of
              [256, 256], batch 256, on the observation and action sizes of ``--sac-env`` (HalfCheetah-v5 by
              default, Pendulum-v1 when MuJoCo is missing), from a replay buffer pre-filled with ``--sac-fill`` random
              transitions; only the update loop is timed (after warm-up updates). jaderl: ``update_once`` on uniform
              batches drawn from its ``ReplayBuffer``, exactly what ``update`` runs per owed gradient step. SB3:
              ``model.train(gradient_steps=..., batch_size=256)`` on its filled ``ReplayBuffer``. Each in its own
              subprocess, one torch thread, median of ``--repeats`` timings, once per round of ``--rounds`` as in ppo.
              Target: jaderl >= 2x SB3. On the CPU the last rows time the update's matrix products alone (target,
              critics' forward and backward pass, actor's pass through the frozen critics): the ceiling of that
              arithmetic in PyTorch's float32 kernels, and as ``precision=bfloat16`` splits it.
    pipeline  PPO training env-steps/s on ``--env`` (a Gymnasium env stepped in Python) in one process with
              ``--num-envs`` sub-envs against ``jaderl.parallel.pipeline`` with ``--workers`` explorer processes of
              ``--num-envs / --workers`` sub-envs each (same rollout size), training time only, median of
              ``--repeats`` runs taken round-robin. No target: it shows what explorer processes buy on this machine.
    The ppo and sac tables give rates per second of wall time (the figures the targets are about) and per CPU-second
    of the measuring process (less sensitive to other load on a shared machine; with one thread the two agree on
    an idle one). The ppo and sac sections also time jaderl with ``compile=True`` (``torch.compile`` of its act and loss
    functions, :mod:`jaderl.accel`) unless ``--no-compiled``; ``--quick`` leaves it out unless ``--compiled``; and,
    on a GPU or a CPU with bfloat16 matrix units (AVX-512 BF16, AMX), jaderl with ``precision=bfloat16`` (hidden
    layers in bfloat16, everything else float32), whose ratio to SB3's float32 is printed on a line of its own, as
    such: SB3 has no mixed-precision option.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import platform
import statistics
import subprocess
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
    # --workers stepping processes, as envpool gets --workers threads: K - 1 workers and this process
    sub_workers = max(args.workers - 1, 1)
    sub = SubprocVecEnv(env_id, n, num_workers=sub_workers, step_in_parent=args.workers > 1)
    sub.reset(seed=0)
    in_parent = sub._local_slice[1] > 0  # there were more envs than workers
    sub_label = f"{sub_workers} worker{'s' if sub_workers > 1 else ''}{' + this process' if in_parent else ''}"
    variants[f"jaderl SubprocVecEnv ({sub_label})"] = (lambda i: sub.step(unit_t[i]), sub.close)
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


# -- section: torch-envs -------------------------------------------------------------------------------------------

ENV_SIZES = (1, 16, 256, 4096, 65536)
GPU_ENV_SIZES = (1, 256, 4096, 65536, 262144, 1048576)  # a GPU's best size is far above a CPU's
QUICK_ENV_SIZES = (1, 256, 4096)
SKIPPED_ENVS = ("simple_spread", "simple_tag")  # the multi-agent ones: benchmarks/marl_envs.py


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _time_env(env_cls: Any, num_envs: int, device: str, min_time: float, repeats: int,
              sync_free: bool | None = None) -> float:
    """Median env-steps/s of ``step`` with random actions drawn on the device beforehand (``sync_free``: that mode
    instead of the device's default)."""
    import torch

    env = env_cls(num_envs=num_envs, device=device, seed=0)
    if sync_free is not None:
        env.sync_free = sync_free
    env.reset(seed=0)
    gen = torch.Generator(device=device).manual_seed(0)
    pool = 16
    if env.is_discrete:
        actions = torch.randint(env.action_dim, (pool, num_envs), device=device, generator=gen)
    else:
        actions = torch.rand(pool, num_envs, env.action_dim, device=device, generator=gen) * 2 - 1
    for i in range(20):  # warm-up, then calibrate the loop length to last about min_time
        env.step(actions[i % pool])
    _sync(device)
    steps, elapsed = 8, 0.0
    while elapsed < min_time / 4:
        steps *= 2
        start = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % pool])
        _sync(device)
        elapsed = time.perf_counter() - start
    steps = max(8, int(steps * min_time / elapsed))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % pool])
        _sync(device)
        rates.append(num_envs * steps / (time.perf_counter() - start))
    env.close()
    return statistics.median(rates)


def section_torch_envs(args: argparse.Namespace) -> None:
    import torch

    from jaderl.envs import TORCH_ENVS

    torch.set_num_threads(1)
    load_at_start = _load()
    device = args.device
    sizes = QUICK_ENV_SIZES if args.quick else ENV_SIZES if device == "cpu" else GPU_ENV_SIZES
    min_time = 0.1 if args.quick else args.min_time
    repeats = min(args.repeats, 3) if args.quick else args.repeats
    envs = {name: cls for name, cls in TORCH_ENVS.items() if not any(s in name for s in SKIPPED_ENVS)
            and ("StockTrading" not in name or importlib.util.find_spec("vega_datasets") is not None)}
    notes = [f"skipped: {name}" + (" (its prices need vega_datasets: pip install 'jaderl[stock]')"
                                   if "StockTrading" in name else "") for name in TORCH_ENVS if name not in envs]
    rates = {name: {n: _time_env(cls, n, device, min_time, repeats) for n in sizes} for name, cls in envs.items()}
    if device == "cpu":  # the GPU's step (masked resets every step, no host read) measured on the CPU, for reference
        rates["jaderl/Pendulum-v1, sync_free=True"] = {
            n: _time_env(envs["jaderl/Pendulum-v1"], n, device, min_time, repeats, sync_free=True) for n in sizes}
    if load_at_start > LOAD_LIMIT:
        notes.append(f"measured under load (1-min load average {load_at_start:.2f} > {LOAD_LIMIT} at start)")
    threads = f"{torch.get_num_threads()} CPU thread" if device == "cpu" else _device_name(device)
    _header(f"torch-envs: env-steps/s of `step` with random actions, {device} ({threads}), median of {repeats}", notes,
            load_at_start)
    print("| env | " + " | ".join(f"{n:,} envs" for n in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for name, row in rates.items():
        print(f"| {name} | " + " | ".join(_si(row[n]) for n in sizes) + " |")
    print()
    pendulum = rates.get("jaderl/Pendulum-v1", {})
    if device == "cpu" and 4096 in pendulum:
        value = pendulum[4096]
        print(f"jaderl/Pendulum-v1 at 4,096 envs: {_si(value)} env-steps/s (target >= 10M on the CPU): "
              f"{'PASS' if value >= 10e6 else 'FAIL'}")
    elif pendulum:
        best = max(pendulum, key=pendulum.__getitem__)
        print(f"jaderl/Pendulum-v1, best at {best:,} envs: {_si(pendulum[best])} env-steps/s "
              f"(target >= 200M on a GPU): {'PASS' if pendulum[best] >= 200e6 else 'FAIL'}")
    print(f"load average (1 min) at end: {_load():.2f}")


def _si(value: float) -> str:
    """Rates as 12.3M / 456k / 789."""
    if value >= 1e6:
        return f"{value / 1e6:,.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:,.0f}k"
    return f"{value:,.0f}"


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else device


# -- workers: one library, one measurement, in a fresh subprocess with one torch thread -------------------------------


def _run_worker(task: str, params: dict[str, Any], timeout: float = 1800.0) -> dict[str, Any]:
    """Run ``task`` in a fresh interpreter (one torch / BLAS thread); returns its result or ``{"error": ...}``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps({"task": task, **params})]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"killed after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"}
    return json.loads(lines[-1].removeprefix("RESULT "))


Job = tuple[str, str, str, dict[str, Any]]
"""A measurement: row name, setup text, worker task, worker parameters."""


def _round_robin(jobs: list[Job], rounds: int) -> list[tuple[str, str, dict[str, Any]]]:
    """Run every job (name, setup, task, params) once per round, in the same order each round, so that all of them
    see the same machine from minute to minute: rows (name, setup, result) whose ``rate``, ``cpu_rate`` and
    ``gflops`` are the medians over the rounds and ``rates`` each round's rate (a row that failed in any round keeps
    that round's error)."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _, _ in jobs}
    for _ in range(rounds):
        for name, _, task, params in jobs:
            results[name].append(_run_worker(task, params))
    rows = []
    for name, setup, _, _ in jobs:
        runs = results[name]
        failed = [r for r in runs if "error" in r]
        if failed:
            rows.append((name, setup, failed[0]))
            continue
        merged = {key: statistics.median(r[key] for r in runs) for key in ("rate", "cpu_rate", "gflops")
                  if key in runs[0]}
        rows.append((name, setup, {**runs[0], **merged, "rates": [r["rate"] for r in runs]}))
    return rows


def _timed(iteration: Callable[[], Any], device: str, min_time: float,
           min_iterations: int) -> tuple[int, float, float]:
    """Run ``iteration`` until ``min_time`` seconds and ``min_iterations`` have passed: (iterations, wall seconds,
    CPU seconds of this process)."""
    _sync(device)
    start, cpu_start, count = time.perf_counter(), time.process_time(), 0
    while count < min_iterations or time.perf_counter() - start < min_time:
        iteration()
        count += 1
        if count % 8 == 0:
            _sync(device)
    _sync(device)
    return count, time.perf_counter() - start, time.process_time() - cpu_start


def _worker_ppo_jaderl(p: dict[str, Any]) -> dict[str, Any]:
    import torch

    from jaderl.accel import accelerate
    from jaderl.algos import PPO
    from jaderl.api import make_config
    from jaderl.envs import make_env

    device = torch.device(p["device"])
    config = make_config("ppo", "jaderl/Pendulum-v1", num_envs=p["envs"], horizon=p["horizon"], hidden=[64, 64],
                         minibatch_size=p["minibatch"], num_epochs=p["epochs"], device=p["device"], seed=0,
                         compile=p["compile"], precision=p.get("precision", "float32"))
    env = make_env(config.env, config.num_envs, device, seed=0)
    torch.manual_seed(0)
    agent = PPO(config, env, device)
    accelerate(agent)
    buffer = agent.make_buffer()

    def iteration() -> None:
        buffer.add(agent.explore(env, config.horizon))
        agent.update(buffer)

    for _ in range(p["warmup"]):  # includes compiling when compile=True
        iteration()
    count, elapsed, cpu = _timed(iteration, p["device"], p["min_time"], p["iterations"])
    samples = count * config.horizon * config.num_envs
    return {"rate": samples / elapsed, "cpu_rate": samples / cpu, "iterations": count, "seconds": elapsed}


def _worker_ppo_sb3(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    env = make_vec_env("Pendulum-v1", n_envs=p["envs"], seed=0)  # a DummyVecEnv
    model = PPO("MlpPolicy", env, n_steps=p["horizon"], batch_size=p["minibatch"], n_epochs=p["epochs"],
                max_grad_norm=0.5, device="cpu", seed=0, verbose=0,
                policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh})
    model.set_logger(Logger(None, []))  # no output (SB3's default logger also leaves an empty folder in /tmp)
    batch = p["horizon"] * p["envs"]
    model.learn(total_timesteps=p["warmup"] * batch)
    steps_before = model.num_timesteps

    def iteration() -> None:
        model.learn(total_timesteps=batch, reset_num_timesteps=False)

    count, elapsed, cpu = _timed(iteration, "cpu", p["min_time"], p["iterations"])
    samples = model.num_timesteps - steps_before
    return {"rate": samples / elapsed, "cpu_rate": samples / cpu, "iterations": count, "seconds": elapsed}


def _sac_sizes(env_id: str) -> tuple[int, int]:
    import gymnasium as gym

    env = gym.make(env_id)
    sizes = int(env.observation_space.shape[0]), int(env.action_space.shape[0])
    env.close()
    return sizes


def _worker_sac_jaderl(p: dict[str, Any]) -> dict[str, Any]:
    import torch

    from jaderl.accel import accelerate
    from jaderl.algos import SAC
    from jaderl.api import make_config
    from jaderl.envs import make_env

    device = torch.device(p["device"])
    config = make_config("sac", p["env"], hidden=[256, 256], batch_size=256, buffer_size=p["fill"],
                         device=p["device"], seed=0, compile=p["compile"], precision=p.get("precision", "float32"))
    env = make_env(p["env"], 1, device)  # only for its spaces
    torch.manual_seed(0)
    agent = SAC(config, env, device)
    env.close()
    accelerate(agent)
    buffer = agent.make_buffer()
    n, obs_dim, act_dim = p["fill"], agent.obs_dim, agent.action_dim
    buffer.add({"obs": torch.randn(n, 1, obs_dim, device=device),
                "action": torch.rand(n, 1, act_dim, device=device) * 2 - 1,
                "reward": torch.randn(n, 1, device=device),
                "terminated": torch.rand(n, 1, device=device) < 0.001,
                "truncated": torch.zeros(n, 1, dtype=torch.bool, device=device),
                "next_obs": torch.randn(n, 1, obs_dim, device=device)})

    def updates(count: int) -> None:  # what OffPolicyAgent.update runs per owed gradient step
        for _ in range(count):
            agent.update_once(buffer.sample(config.batch_size, config.n_step, config.gamma))

    updates(p["warmup"])
    return _repeat(lambda: updates(p["updates"]), p["updates"], p["repeats"], p["device"])


def _repeat(run: Callable[[], Any], count: int, repeats: int, device: str) -> dict[str, Any]:
    """Median rates of ``count`` operations per wall second and per CPU second of this process over ``repeats``."""
    rates, cpu_rates = [], []
    for _ in range(repeats):
        _sync(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        run()
        _sync(device)
        rates.append(count / (time.perf_counter() - start))
        cpu_rates.append(count / (time.process_time() - cpu_start))
    return {"rate": statistics.median(rates), "cpu_rate": statistics.median(cpu_rates), "rates": rates}


def _worker_sac_sb3(p: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import Logger

    model = SAC("MlpPolicy", p["env"], batch_size=256, buffer_size=p["fill"], learning_starts=0, device="cpu",
                seed=0, policy_kwargs={"net_arch": [256, 256]})
    model.set_logger(Logger(None, []))  # no output (SB3's default logger also leaves an empty folder in /tmp)
    rb, n, rng = model.replay_buffer, p["fill"], np.random.default_rng(0)
    rb.observations[:] = rng.standard_normal(rb.observations.shape).astype(rb.observations.dtype)
    rb.next_observations[:] = rng.standard_normal(rb.next_observations.shape).astype(rb.next_observations.dtype)
    rb.actions[:] = rng.uniform(-1, 1, rb.actions.shape).astype(rb.actions.dtype)
    rb.rewards[:] = rng.standard_normal(rb.rewards.shape).astype(rb.rewards.dtype)
    rb.dones[:] = (rng.uniform(size=rb.dones.shape) < 0.001).astype(rb.dones.dtype)
    rb.full, rb.pos = True, 0
    assert rb.size() == n
    model.train(gradient_steps=p["warmup"], batch_size=256)
    return _repeat(lambda: model.train(gradient_steps=p["updates"], batch_size=256), p["updates"], p["repeats"], "cpu")


# -- floors: the matrix products alone ------------------------------------------------------------------------------
# A shape (E, m, k, n) is E independent [m, k] x [k, n] products (E > 1: one batched call, as twin critics are).


def _mlp_products(batch: int, sizes: list[int], members: int = 1, weight_grads: bool = True,
                  input_grad: bool = False) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The products of an MLP's forward pass and of its backward pass on ``batch`` rows: weight gradients unless
    ``weight_grads`` is false (a frozen critic), hidden-activation gradients always, the input's only if
    ``input_grad``. A product is (E, m, k, n, hidden): E [m, k] x [k, n] products of a hidden layer (1: those that
    ``precision=bfloat16`` runs in bfloat16) or of the first or the output layer (0)."""
    layers = list(itertools.pairwise(sizes))
    kind = [int(0 < i < len(layers) - 1) for i in range(len(layers))]
    forward = [(members, batch, i, o, kind[index]) for index, (i, o) in enumerate(layers)]
    backward: list[tuple[int, ...]] = []
    for index, (i, o) in reversed(list(enumerate(layers))):
        if weight_grads:
            backward.append((members, i, batch, o, kind[index]))  # dW = x^T dy
        if index > 0 or input_grad:
            backward.append((members, batch, o, i, kind[index]))  # dx = dy W^T
    return forward, backward


def _ppo_products(p: dict[str, Any]) -> tuple[list[tuple[int, ...]], int]:
    """The products of one PPO iteration (acting on the rollout, then every minibatch's forward and backward pass of
    actor and critic) and its samples; the value and log-probability passes before the epochs are left out."""
    obs, act, hidden, batch = 3, 1, [64, 64], p["minibatch"]
    rollout = p["envs"] * p["horizon"]
    acting, _ = _mlp_products(p["envs"], [obs, *hidden, act])
    minibatch: list[tuple[int, ...]] = []
    for out in (act, 1):  # actor (mean; the log std is a parameter), critic
        forward, backward = _mlp_products(batch, [obs, *hidden, out])
        minibatch += forward + backward
    return acting * p["horizon"] + minibatch * (p["epochs"] * (rollout // batch)), rollout


def _sac_products(p: dict[str, Any]) -> list[tuple[int, ...]]:
    """The products of one SAC update on a batch of 256 with twin [256, 256] critics and a [256, 256] actor: the
    target (actor on s', target critics), the critics' loss (forward and backward) and the actor's loss (actor, the
    critics as constants, gradients back through them to the action, then through the actor)."""
    obs, act = _sac_sizes(p["env"])
    batch, hidden = 256, [256, 256]
    actor, critic = [obs, *hidden, 2 * act], [obs + act, *hidden, 1]
    actor_fwd, actor_bwd = _mlp_products(batch, actor)
    critic_fwd, critic_bwd = _mlp_products(batch, critic, members=2)
    _, through_critic = _mlp_products(batch, critic, members=2, weight_grads=False, input_grad=True)
    return actor_fwd + critic_fwd + critic_fwd + critic_bwd + actor_fwd + critic_fwd + through_critic + actor_bwd


def _time_products(shapes: list[tuple[int, ...]], repeats: int, min_time: float, precision: str = "float32") -> float:
    """Median seconds for running every product of ``shapes`` once, each into a preallocated output (no allocation,
    no autograd, nothing but the products): all in float32, or for ``precision="bfloat16"`` the hidden layers'
    products in bfloat16 and the others in float32, as ``precision=bfloat16`` runs them."""
    import torch

    gen = torch.Generator().manual_seed(0)
    calls = []
    for e, m, k, n, hidden in shapes:
        kind = torch.bfloat16 if hidden and precision == "bfloat16" else torch.float32
        a, b = torch.randn(e, m, k, generator=gen).to(kind), torch.randn(e, k, n, generator=gen).to(kind)
        out = torch.empty(e, m, n, dtype=kind)
        calls.append((a[0], b[0], out[0], torch.mm) if e == 1 else (a, b, out, torch.bmm))

    def run() -> None:
        for a, b, out, op in calls:
            op(a, b, out=out)

    for _ in range(3):
        run()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time / 4:
        run()
        count += 1
    count = max(1, int(count * 4))
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(count):
            run()
        timings.append((time.perf_counter() - start) / count)
    return statistics.median(timings)


def _worker_ppo_floor(p: dict[str, Any]) -> dict[str, Any]:
    shapes, samples = _ppo_products(p)
    seconds = _time_products(shapes, 5, p["min_time"], p["precision"])
    flops = sum(2 * e * m * k * n for e, m, k, n, _ in shapes)
    return {"rate": samples / seconds, "cpu_rate": samples / seconds, "gflops": flops / seconds / 1e9}


def _worker_sac_floor(p: dict[str, Any]) -> dict[str, Any]:
    shapes = _sac_products(p)
    seconds = _time_products(shapes, 5, 2.0, p["precision"])
    flops = sum(2 * e * m * k * n for e, m, k, n, _ in shapes)
    return {"rate": 1 / seconds, "cpu_rate": 1 / seconds, "gflops": flops / seconds / 1e9}


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ppo-jaderl": _worker_ppo_jaderl, "ppo-sb3": _worker_ppo_sb3, "ppo-floor": _worker_ppo_floor,
    "sac-jaderl": _worker_sac_jaderl, "sac-sb3": _worker_sac_sb3, "sac-floor": _worker_sac_floor,
}


def worker_main(spec_json: str) -> None:
    """``--worker`` mode: one measurement, its result printed as a ``RESULT {json}`` line."""
    import torch

    torch.set_num_threads(1)
    spec = json.loads(spec_json)
    result = WORKERS[spec.pop("task")](spec)
    print("RESULT " + json.dumps({**result, "threads": torch.get_num_threads()}))


def _compiled(args: argparse.Namespace) -> bool:
    return (not args.quick) if args.compiled is None else args.compiled


def _ratio_table(rows: list[tuple[str, str, dict[str, Any]]], unit: str, reference: str) -> dict[str, float]:
    """Print | variant | setup | rate | ratio to ``reference`` |; returns the rates of the rows that ran."""
    rates = {name: r["rate"] for name, _, r in rows if "rate" in r}
    cpu_rates = {name: r["cpu_rate"] for name, _, r in rows if "cpu_rate" in r}
    print(f"| run | setup | {unit} | {reference} / this | {unit} per CPU-second | {reference} / this |")
    print("|---|---|---:|---:|---:|---:|")
    for name, setup, result in rows:
        if "rate" in result:
            ratio = f"{rates[reference] / result['rate']:.2f}x" if reference in rates else "n/a"
            cpu_ratio = f"{cpu_rates[reference] / result['cpu_rate']:.2f}x" if reference in cpu_rates else "n/a"
            print(f"| {name} | {setup} | {result['rate']:,.0f} | {ratio} | {result['cpu_rate']:,.0f} | {cpu_ratio} |")
        else:
            print(f"| {name} | {setup} | error | | | |")
    print()
    for name, _, result in rows:
        if "error" in result:
            print(f"error in {name}: {result['error']}")
    return rates


# -- section: ppo ----------------------------------------------------------------------------------------------------


def section_ppo(args: argparse.Namespace) -> None:
    load_at_start = _load()
    common = {"envs": args.ppo_envs, "horizon": args.ppo_horizon, "minibatch": args.ppo_minibatch,
              "epochs": args.ppo_epochs, "warmup": 1, "min_time": 1.0 if args.quick else args.min_time * 5,
              "iterations": 1 if args.quick else 3}
    jobs: list[Job] = []
    for name, compile_, precision in _variants(args):
        jobs.append((name, f"PPO, `jaderl/Pendulum-v1` x {args.ppo_envs} (torch, {args.device})", "ppo-jaderl",
                     {**common, "device": args.device, "compile": compile_, "precision": precision}))
    if args.sb3:
        jobs.append(("SB3", f"PPO, Gymnasium `Pendulum-v1` x {args.ppo_envs} (DummyVecEnv, cpu)", "ppo-sb3", common))
    if args.device == "cpu":
        for precision in _precisions():
            jobs.append((FLOORS[precision], f"the acting and minibatch matrix products of an iteration, "
                         f"{FLOOR_SPLIT[precision]}, nothing else", "ppo-floor",
                         {**common, "precision": precision, "min_time": 1.0 if args.quick else args.min_time}))
    rows = _round_robin(jobs, _rounds(args))
    notes = [f"rollout {args.ppo_horizon} steps x {args.ppo_envs} envs = {args.ppo_horizon * args.ppo_envs:,} "
             f"samples per iteration, minibatch {args.ppo_minibatch}, {args.ppo_epochs} epochs, actor and critic "
             "[64, 64] tanh; one torch thread per library; setup and one warm-up iteration not timed; "
             f"{_rounds_note(args)}"]
    if load_at_start > LOAD_LIMIT:
        notes.append(f"measured under load (1-min load average {load_at_start:.2f} > {LOAD_LIMIT} at start)")
    _header("ppo: end-to-end training samples/s (collect + learn)", notes, load_at_start)
    rates = _ratio_table(rows, "samples/s", "jaderl")
    _print_targets(rates, 10)
    _print_rounds(rows)
    _print_floor(rows, rates, "samples/s", 10)
    if args.device != "cpu" and "jaderl" in rates:
        print(f"jaderl on {args.device}: {_si(rates['jaderl'])} samples/s (target >= 2M on a GPU): "
              f"{'PASS' if rates['jaderl'] >= 2e6 else 'FAIL'}")
    print(f"load average (1 min) at end: {_load():.2f}")


# -- section: sac ----------------------------------------------------------------------------------------------------


def section_sac(args: argparse.Namespace) -> None:
    load_at_start = _load()
    env_id, notes = _pick_env(args.sac_env)
    obs_dim, act_dim = _sac_sizes(env_id)
    fill = 10_000 if args.quick else args.sac_fill
    common = {"env": env_id, "fill": fill, "warmup": 10 if args.quick else 50,
              "updates": 50 if args.quick else args.sac_updates, "repeats": min(args.repeats, 3) if args.quick
              else args.repeats}
    jobs: list[Job] = []
    for name, compile_, precision in _variants(args):
        jobs.append((name, f"SAC, {args.device}", "sac-jaderl",
                     {**common, "device": args.device, "compile": compile_, "precision": precision}))
    jobs.append(("SB3", "SAC, cpu", "sac-sb3", common))
    if args.device == "cpu":
        for precision in _precisions():
            jobs.append((FLOORS[precision], f"the matrix products of an update, {FLOOR_SPLIT[precision]}, "
                         "nothing else", "sac-floor", {**common, "precision": precision}))
    rows = _round_robin(jobs, _rounds(args))
    notes.append(f"{env_id} sizes (obs {obs_dim}, action {act_dim}); actor and twin critics [256, 256], batch 256, "
                 f"buffer of {fill:,} random transitions; {common['updates']} updates per timing, median of "
                 f"{common['repeats']}; one torch thread per library; {_rounds_note(args)}")
    if load_at_start > LOAD_LIMIT:
        notes.append(f"measured under load (1-min load average {load_at_start:.2f} > {LOAD_LIMIT} at start)")
    _header("sac: gradient updates/s (critics + actor + alpha)", notes, load_at_start)
    rates = _ratio_table(rows, "updates/s", "jaderl")
    _print_targets(rates, 2)
    _print_rounds(rows)
    _print_floor(rows, rates, "updates/s", 2)
    print(f"load average (1 min) at end: {_load():.2f}")


BF16 = "jaderl precision=bfloat16"
FLOORS = {"float32": "matrix products only", "bfloat16": "matrix products only, precision=bfloat16"}
FLOOR_SPLIT = {"float32": "all in float32",
               "bfloat16": "the hidden layers' in bfloat16 and the first and output layers' in float32"}


def _precisions() -> list[str]:
    """float32, and bfloat16 where this CPU multiplies bfloat16 matrices natively (elsewhere it is slower)."""
    import torch

    from jaderl.accel import native_bfloat16

    return ["float32", "bfloat16"] if native_bfloat16(torch.device("cpu")) else ["float32"]


def _variants(args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    """jaderl's rows: (name, compile, precision); the bfloat16 one on a GPU or a CPU with bfloat16 matrix units."""
    compiled = [("jaderl compile=True", True, "float32")] if _compiled(args) else []
    mixed = [(BF16, False, "bfloat16")] if args.device != "cpu" or "bfloat16" in _precisions() else []
    return [("jaderl", False, "float32"), *compiled, *mixed]


def _rounds(args: argparse.Namespace) -> int:
    """How many rounds the ppo and sac sections run (one with ``--quick``)."""
    return 1 if args.quick else args.rounds


def _rounds_note(args: argparse.Namespace) -> str:
    """The table notes' words for the rounds."""
    rounds = _rounds(args)
    return ("one round" if rounds == 1 else
            f"{rounds} rounds, every row once per round in the same order, each rate the median of its rounds")


def _print_rounds(rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    """jaderl / SB3 in each round (the two measured minutes apart at most), when there was more than one round."""
    found = {name: result.get("rates", []) for name, _, result in rows}
    jaderl, sb3 = found.get("jaderl", []), found.get("SB3", [])
    if len(jaderl) > 1 and len(sb3) == len(jaderl):
        ratios = ", ".join(f"{a / b:.2f}x" for a, b in zip(jaderl, sb3, strict=True))
        print(f"jaderl / SB3 in each round: {ratios}")


def _print_targets(rates: dict[str, float], target: float) -> None:
    """jaderl / SB3 against ``target``: float32 against float32, and mixed precision against SB3's float32 (SB3 has
    no mixed-precision option), said as such."""
    if "SB3" not in rates:
        return
    if "jaderl" in rates:
        ratio = rates["jaderl"] / rates["SB3"]
        verdict = "PASS" if ratio >= target else "FAIL"
        print(f"jaderl / SB3, both float32: {ratio:.2f}x (target >= {target:g}x): {verdict}")
    if BF16 in rates:
        ratio = rates[BF16] / rates["SB3"]
        print(f"jaderl precision=bfloat16 / SB3 float32: {ratio:.2f}x (target >= {target:g}x): "
              f"{'PASS' if ratio >= target else 'FAIL'} (SB3 has no mixed precision; its hidden layers compute in "
              "float32)")


def _print_floor(rows: list[tuple[str, str, dict[str, Any]]], rates: dict[str, float], unit: str,
                 target: float) -> None:
    """The ceilings the matrix products set: an implementation of the same arithmetic with PyTorch's kernels in that
    precision on this CPU thread is not faster than they are alone (each timed as its own call), so (floor rate /
    SB3's rate) bounds the jaderl / SB3 ratio on this machine for that precision."""
    for precision, name in FLOORS.items():
        if name not in rates or "SB3" not in rates:
            continue
        gflops = next(result["gflops"] for row, _, result in rows if row == name)
        ceiling = rates[name] / rates["SB3"]
        reach = ("within reach" if ceiling >= 2 * target else "out of reach" if ceiling < target
                 else "within reach only with almost nothing but the products")
        mode = "float32" if precision == "float32" else "precision=bfloat16"
        print(f"ceiling in {mode}: the matrix products alone run at {rates[name]:,.0f} {unit} ({gflops:,.0f} "
              f"GFLOP/s) = {ceiling:.1f}x SB3, so the {target:g}x target is {reach} on this CPU in {mode}")


# -- section: pipeline ---------------------------------------------------------------------------------------------


def section_pipeline(args: argparse.Namespace) -> None:
    import tempfile

    import jaderl

    load_at_start = _load()
    env, notes = _pick_env(args.env)
    total = 8_192 if args.quick else 65_536
    base = dict(total_steps=total, eval_every=10**9, checkpoint_every=10**9, eval_episodes=2, device="cpu",
                hidden=[64, 64], horizon=256, minibatch_size=1024, num_epochs=4)
    variants = {f"one process, {args.num_envs} sub-envs": dict(num_envs=args.num_envs),
                f"--workers {args.workers}, {args.num_envs // args.workers} sub-envs each":
                    dict(num_envs=args.num_envs // args.workers, workers=args.workers)}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # round-robin, so both see the same machine
        for name, extra in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                result = jaderl.train("ppo", env, run_dir=f"{tmp}/run", **base, **extra)
            rates[name].append(result.steps / result.time_s)
    if load_at_start > LOAD_LIMIT:
        notes.append(f"measured under load (1-min load average {load_at_start:.2f} > {LOAD_LIMIT} at start)")
    notes.append(f"PPO, {total:,} env steps per run, rollouts of 256 steps per sub-env, minibatch 1024, 4 epochs, "
                 "[64, 64]; rate = env steps / training time (process start-up excluded), median of "
                 f"{args.repeats}")
    _header(f"pipeline: PPO training env-steps/s on {env}, one process vs explorer workers", notes, load_at_start)
    reference = statistics.median(rates[next(iter(variants))])
    print("| trainer | env-steps/s | / one process |\n|---|---:|---:|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {statistics.median(values) / reference:.2f}x |")
    print(f"load average (1 min) at end: {_load():.2f}")


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "subproc": section_subproc, "torch-envs": section_torch_envs, "ppo": section_ppo, "sac": section_sac,
    "pipeline": section_pipeline,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="small settings: a smoke check, not a measurement")
    parser.add_argument("--device", default="cpu", help="torch-envs, ppo, sac: device of jaderl's side (cpu, cuda)")
    parser.add_argument("--env", default="HalfCheetah-v5", help="subproc, pipeline: Gymnasium id")
    parser.add_argument("--num-envs", type=int, default=8, help="subproc, pipeline: sub-envs per stepper / trainer")
    parser.add_argument("--workers", type=int, default=2,
                        help="subproc: processes stepping the SubprocVecEnv (this one included) / envpool threads; "
                             "pipeline: explorer workers")
    parser.add_argument("--steps", type=int, default=2000, help="subproc: batched steps per timing")
    parser.add_argument("--warmup", type=int, default=200, help="subproc: untimed batched steps first")
    parser.add_argument("--repeats", type=int, default=3, help="timings per variant (median reported)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="ppo, sac: times every row runs, round-robin (median reported; 1 with --quick)")
    parser.add_argument("--min-time", type=float, default=1.0,
                        help="torch-envs: seconds per timing; ppo: 5x this per library")
    parser.add_argument("--ppo-envs", type=int, default=256, help="ppo: sub-envs (both libraries)")
    parser.add_argument("--ppo-horizon", type=int, default=32, help="ppo: rollout steps per env")
    parser.add_argument("--ppo-minibatch", type=int, default=2048, help="ppo: minibatch size")
    parser.add_argument("--ppo-epochs", type=int, default=10, help="ppo: epochs per rollout")
    parser.add_argument("--sb3", action=argparse.BooleanOptionalAction, default=True,
                        help="ppo: also time SB3 (--no-sb3: jaderl alone, at GPU sizes)")
    parser.add_argument("--sac-env", default="HalfCheetah-v5", help="sac: Gymnasium id whose sizes the networks take")
    parser.add_argument("--sac-fill", type=int, default=100_000, help="sac: random transitions in the buffer")
    parser.add_argument("--sac-updates", type=int, default=500, help="sac: updates per timing")
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=None,
                        help="ppo, sac: also time jaderl with compile=True (default: yes, but not with --quick)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return
    if args.quick:
        args.steps, args.warmup, args.repeats = min(args.steps, 300), min(args.warmup, 50), min(args.repeats, 2)
    for name, section in SECTIONS.items():
        if args.section in (name, "all"):
            section(args)


if __name__ == "__main__":
    main()
