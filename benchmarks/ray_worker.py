"""How fast the same small-network torch work runs inside a Ray worker process and in a plain process, side by side.

Usage (from the repository root)::

    .venv/bin/python benchmarks/ray_worker.py [--repeats 3] [--write]

A population member trains in a Ray actor, that is in a Ray worker process; the same member trained by ``jaderl
train`` runs in a plain Python process. This measures the difference on its own, away from everything else a
population does. One local Ray (2 CPUs, no dashboard) is up for the whole run, so every place has the same Ray
processes beside it; one place runs at a time, and the places alternate within each repeat.

Workloads (one torch thread, CPU):

mlp
    3,000 Adam steps of a 8-64-64-1 tanh MLP on a batch of 256 (after 300 steps of warm-up): small tensors, where
    the time goes to torch's per-operation work rather than to arithmetic.
ppo
    PPO on ``jaderl/Pendulum-v1`` with ``configs/ppo_pendulum.yaml``'s settings for 32,768 env steps (the population
    benchmark's task), built and trained in the place measured, after a run of 2,048 env steps there that imports
    what training needs.

Places:

plain
    a fresh Python process started by this script.
ray task
    a Ray task (``num_cpus=1``), in a Ray worker process.
spawned from a Ray task
    a fresh Python process started by a Ray task.
forked from a Ray task
    a copy of the Ray worker process (``os.fork``) made by a Ray task.

The CPU time of the measuring thread is reported (``time.thread_time``: waiting for a core is not in it), its median
over the repeats, and each place's ratio to ``plain``. The table goes to the ``## ray_worker`` section of
benchmarks/RESULTS.md with ``--write``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from results_md import write_section  # noqa: E402

SECTION = "## ray_worker"
PPO_STEPS = 32_768
PLACES = ("plain", "ray task", "spawned from a Ray task", "forked from a Ray task")


def mlp() -> float:
    """Thread CPU seconds of 3,000 Adam steps of a small MLP (after a warm-up)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(net.parameters())
    x = torch.randn(256, 8)

    def steps(n: int) -> None:
        for _ in range(n):
            loss = net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    steps(300)
    start = time.thread_time()
    steps(3000)
    return time.thread_time() - start


def ppo() -> float:
    """Thread CPU seconds of a PPO run on jaderl/Pendulum-v1 (building it included), after a short one that imports
    what training needs."""
    import jaderl

    torch.set_num_threads(1)
    settings = {"num_envs": 64, "horizon": 32, "gamma": 0.9, "reward_scale": 0.1, "minibatch_size": 256,
                "hidden": [64, 64], "num_threads": 1, "device": "cpu", "eval_every": 10**9, "seed": 0}
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("ignore")
        jaderl.train("ppo", "jaderl/Pendulum-v1", total_steps=2048, run_dir=str(Path(tmp) / "warm-up"), **settings)
        start = time.thread_time()
        jaderl.train("ppo", "jaderl/Pendulum-v1", total_steps=PPO_STEPS, run_dir=str(Path(tmp) / "run"), **settings)
        return time.thread_time() - start


WORKLOADS: dict[str, Callable[[], float]] = {"mlp": mlp, "ppo": ppo}


def in_spawned(name: str) -> float:
    """``name``'s workload in a fresh Python process started from this one."""
    code = f"import ray_worker; print(ray_worker.WORKLOADS[{name!r}]())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def in_fork(name: str) -> float:
    """``name``'s workload in a copy of this process."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: measure, send, leave without running anything of the parent's
        try:
            os.write(write, repr(WORKLOADS[name]()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        seconds = float(f.read())
    os.waitpid(pid, 0)
    return seconds


def in_place(name: str, how: str) -> float:
    """``name``'s workload here (``task``), in a fresh process started from here (``spawn``) or in a copy of this
    process (``fork``)."""
    return {"task": WORKLOADS[name], "spawn": lambda: in_spawned(name), "fork": lambda: in_fork(name)}[how]()


def in_task(name: str, how: str) -> float:
    """:func:`in_place` inside a Ray task (this module imported there by name)."""
    import ray_worker

    return ray_worker.in_place(name, how)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", default="mlp,ppo")
    parser.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    import ray

    names = args.workloads.split(",")
    load = os.getloadavg()
    began = time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}})
    task = ray.remote(num_cpus=1)(in_task)
    seconds: dict[tuple[str, str], list[float]] = {}
    try:
        for repeat in range(args.repeats):
            for name in names:
                runs = {"plain": lambda n=name: in_spawned(n),
                        "ray task": lambda n=name: ray.get(task.remote(n, "task")),
                        "spawned from a Ray task": lambda n=name: ray.get(task.remote(n, "spawn")),
                        "forked from a Ray task": lambda n=name: ray.get(task.remote(n, "fork"))}
                order = PLACES if repeat % 2 == 0 else PLACES[::-1]  # alternating: a drift hits every place
                for place in order:
                    seconds.setdefault((name, place), []).append(runs[place]())
                    print(f"repeat {repeat + 1}: {name:>4} {place:<24} {seconds[name, place][-1]:.3f} s", flush=True)
    finally:
        ray.shutdown()
    lines = [
        SECTION,
        "",
        f"Command: `{' '.join(['python', 'benchmarks/ray_worker.py', *sys.argv[1:]])}`  ",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (load average 1/5/15 min before: "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}); Python {platform.python_version()}, torch "
        f"{torch.__version__}, ray {ray.__version__}; one local Ray of 2 CPUs up throughout; "
        f"{time.time() - began:.0f} s in all",
        "",
        "The same torch work, one thread, in a plain process and inside a Ray worker process (where a population "
        "member trains); thread CPU time, the median of "
        f"{args.repeats} alternating repeats. *mlp*: 3,000 Adam steps of an 8-64-64-1 MLP on a batch of 256. *ppo*: "
        f"PPO on `jaderl/Pendulum-v1` with the population benchmark's settings, {PPO_STEPS:,} env steps, building "
        "included. How each place is made: the script's docstring.",
        "",
        "| workload | place | CPU time (s) | vs plain |",
        "|---|---|---:|---:|",
    ]
    for name in names:
        plain = statistics.median(seconds[name, "plain"])
        for place in PLACES:
            median = statistics.median(seconds[name, place])
            lines.append(f"| {name} | {place} | {median:.3f} | {median / plain:.3f}x |")
    print("\n".join(lines))
    if args.write:
        write_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
