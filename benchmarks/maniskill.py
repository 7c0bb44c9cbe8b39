"""ManiSkill3 on a GPU through jaderl's ``TorchVectorEnv``: the adapter's cost per step, and PPO on a ManiSkill3 task.

Usage (from the repository root, on a machine with a CUDA GPU and Vulkan; ``pip install mani_skill``)::

    python benchmarks/maniskill.py                                    # both sections, PushCube-v1
    python benchmarks/maniskill.py --section env --counts 1024,4096   # env throughput only
    python benchmarks/maniskill.py --section ppo --ppo-steps 2000000
    python benchmarks/maniskill.py --sim cpu --counts 1 --ppo-steps 20000 --episodes 20   # CPU simulation, 1 sub-env

Prints markdown tables to stdout and writes no file (``--run-dir`` keeps the PPO run's metrics and checkpoints).

Sections
    env   env-steps/s of ``step`` with random actions at each of ``--counts`` sub-envs, on ManiSkill3's GPU
          simulation (``sim_backend="physx_cuda"``; ``--sim cpu``: ``physx_cpu``, one sub-env, its tensors moved to
          the GPU by the adapter), ``obs_mode="state"``, control ``pd_joint_delta_pos``: its own
          ``ManiSkillVectorEnv`` (auto-reset, terminations kept) stepped with actions in the action space's bounds,
          against the same env instance wrapped in jaderl's ``TorchVectorEnv`` and stepped with actions in
          ``[-1, 1]`` (which it rescales, and whose flags, rewards and final observations it hands over as jaderl's
          contract wants them). Actions are drawn on the GPU beforehand (a pool of 16 batches, cycled); each timing
          lasts about ``--min-time`` seconds and ends with a device synchronisation; the table gives the median of
          ``--repeats`` timings taken round-robin. The ratio is the adapter's cost: 1.0 would be none.
    ppo   jaderl's PPO on ``maniskill/TASK`` (jaderl's id for ManiSkill3's tasks), with ManiSkill3's published PPO
          baseline settings for PushCube-v1 (2,048 sub-envs, rollouts of 20 steps, 8 epochs of minibatches of 1,280,
          gamma 0.8, GAE lambda 0.9, gradient clipping at 0.5, target KL 0.1, actor and critic MLPs of
          [256, 256, 256] tanh; total 2M env steps). Reports training
          samples/s (env steps per second of training wall time, evaluations included) and the success rate of the
          final deterministic policy over ``--episodes`` fresh episodes (a PushCube episode ends early, terminated,
          when the cube reaches its goal; success = terminated before the time limit). ``--sim cpu`` trains on one
          sub-env (rollouts of 500 steps, minibatches of 250) with the learner on the GPU, on ``maniskill-cpu/TASK``,
          which the script registers with ``jaderl.envs.register_env``.

SAPIEN downloads PhysX's GPU library from GitHub on the first GPU simulation (see docs/simulators.md); a machine
without network access needs it in place beforehand.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import gymnasium as gym
import torch

import jaderl
from jaderl.envs import register_env
from jaderl.envs.torch_vector import TorchVectorEnv, make_maniskill_env


def maniskill_env(task: str, num_envs: int, sim: str) -> gym.vector.VectorEnv:
    """ManiSkill3's own vector env of ``task`` as jaderl's ``maniskill/`` ids build it (the ``ManiSkillVectorEnv``
    inside their adapter): GPU simulation (``sim="gpu"``) or CPU simulation (one sub-env)."""
    return make_maniskill_env(task, num_envs, "cuda" if sim == "gpu" else "cpu").env


def register(task: str, sim: str) -> str:
    """The id PPO trains on: jaderl's own ``maniskill/TASK`` (GPU simulation on the training device), or, for the CPU
    simulation with the learner on the GPU, ``maniskill-cpu/TASK`` registered with ``jaderl.envs.register_env``."""
    if sim == "gpu":
        return f"maniskill/{task}"

    def factory(num_envs: int, device: torch.device, seed: int | None) -> TorchVectorEnv:
        return TorchVectorEnv(maniskill_env(task, num_envs, sim), device)

    name = f"maniskill-cpu/{task}"
    register_env(name, factory)
    return name


def _rate(step, actions: list[torch.Tensor], num_envs: int, min_time: float) -> float:
    """env-steps/s of ``step`` cycled over ``actions``, over a loop calibrated to last about ``min_time`` s."""
    n = 0
    torch.cuda.synchronize()
    start = time.perf_counter()
    while True:
        for _ in range(8):
            step(actions[n % len(actions)])
            n += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return n * num_envs / elapsed


def env_section(task: str, counts: list[int], min_time: float, repeats: int, sim: str) -> None:
    device = torch.device("cuda")
    rows = []
    for num_envs in counts:
        raw = maniskill_env(task, num_envs, sim)
        adapter = TorchVectorEnv(raw, device)
        sim_device = adapter.env_device
        low = torch.as_tensor(raw.single_action_space.low, device=sim_device)
        high = torch.as_tensor(raw.single_action_space.high, device=sim_device)
        unit = [torch.rand(num_envs, adapter.action_dim, device=device) * 2 - 1 for _ in range(16)]
        bounded = [(low + (a.to(sim_device) + 1) * 0.5 * (high - low)).reshape(raw.action_space.shape) for a in unit]
        raw.reset(seed=0)
        adapter.reset(seed=0)
        for _ in range(50):  # warm-up: a whole episode, so that the auto-reset path runs too
            raw.step(bounded[0])
            adapter.step(unit[0])
        times: dict[str, list[float]] = {"ManiSkill3": [], "TorchVectorEnv": []}
        for _ in range(repeats):
            times["ManiSkill3"].append(_rate(raw.step, bounded, num_envs, min_time))
            times["TorchVectorEnv"].append(_rate(adapter.step, unit, num_envs, min_time))
        ms, jd = (statistics.median(times[k]) for k in ("ManiSkill3", "TorchVectorEnv"))
        rows.append((num_envs, ms, jd))
        print(f"  {num_envs} sub-envs: ManiSkill3 {ms:,.0f}, TorchVectorEnv {jd:,.0f} env-steps/s; episodes of "
              f"{adapter.max_steps} steps", flush=True)
        adapter.close()
        del raw, adapter
        torch.cuda.empty_cache()
    print(f"\n### env: {task} env-steps/s, {sim.upper()} simulation, tensors to the GPU, random actions, median of "
          f"{repeats}\n")
    print("| sub-envs | ManiSkillVectorEnv | jaderl TorchVectorEnv | TorchVectorEnv / ManiSkill3 |")
    print("|---:|---:|---:|---:|")
    for num_envs, ms, jd in rows:
        print(f"| {num_envs:,} | {ms:,.0f} | {jd:,.0f} | {jd / ms:.2f} |")


@torch.no_grad()
def success_rate(run_dir: str, task: str, episodes: int, sim: str) -> tuple[float, float]:
    """Fraction of ``episodes`` fresh episodes that the run's final deterministic policy ends by success (terminated
    before the time limit), and their mean length: the first episode of each sub-env, in waves of fresh resets."""
    agent = jaderl.load(run_dir, best=False, device="cuda")
    num_envs = episodes if sim == "gpu" else 1
    env = TorchVectorEnv(maniskill_env(task, num_envs, sim), "cuda")
    successes, lengths = [], []
    for wave in range(episodes // num_envs):
        obs = env.reset(seed=10_000 + wave)
        done = torch.zeros(num_envs, dtype=torch.bool, device="cuda")
        success = torch.zeros_like(done)
        length = torch.zeros(num_envs, device="cuda")
        for _ in range(env.max_steps):
            obs, _, terminated, truncated, _ = env.step(agent.act(obs, deterministic=True))
            success |= terminated & ~done
            length += (~done).float()
            done |= terminated | truncated
        successes.append(success.float())
        lengths.append(length)
    env.close()
    return float(torch.cat(successes).mean()), float(torch.cat(lengths).mean())


def ppo_section(task: str, total_steps: int, episodes: int, run_dir: str, seed: int, sim: str) -> None:
    name = register(task, sim)
    if sim == "gpu":  # ManiSkill3's PPO baseline for PushCube-v1
        sizes = dict(num_envs=2048, horizon=20, minibatch_size=1280, eval_every=200_000, eval_episodes=64)
    else:  # CPU simulation steps one sub-env per process
        sizes = dict(num_envs=1, horizon=500, minibatch_size=250, eval_every=total_steps // 2, eval_episodes=1)
    settings = dict(device="cuda", seed=seed, **sizes, num_epochs=8, gamma=0.8, gae_lambda=0.9, lr=3e-4,
                    max_grad_norm=0.5, target_kl=0.1, hidden=[256, 256, 256], zoo=False, total_steps=total_steps,
                    checkpoint_every=10 * total_steps, run_dir=run_dir)
    print(f"jaderl.train('ppo', {name!r}, **{settings})", flush=True)
    result = jaderl.train("ppo", name, **settings)
    rate, length = success_rate(result.run_dir, task, episodes, sim)
    print(f"\n### ppo: jaderl's PPO on {name}, {sim.upper()} simulation, seed {seed}\n")
    print("| sub-envs | env steps | training time (s) | samples/s | last eval return | success rate (final policy) | "
          "mean episode length |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {sizes['num_envs']:,} | {result.steps:,} | {result.time_s:.1f} | {result.steps / result.time_s:,.0f} | "
          f"{result.last_eval_return:.2f} | {rate:.1%} ({episodes:,} episodes) | {length:.1f} |")
    metrics = Path(result.run_dir) / "metrics.csv"
    if metrics.exists():
        print("\nmetrics.csv (evaluations):")
        print(metrics.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=("env", "ppo", "all"), default="all")
    parser.add_argument("--task", default="PushCube-v1", help="a ManiSkill3 env id with state observations")
    parser.add_argument("--counts", default="256,1024,4096,16384", help="sub-env counts of the env section")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per timing (env section)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ppo-steps", type=int, default=2_000_000)
    parser.add_argument("--episodes", type=int, default=1024, help="episodes of the final policy's success rate")
    parser.add_argument("--sim", choices=("gpu", "cpu"), default="gpu",
                        help="ManiSkill3's GPU simulation (physx_cuda), or its CPU simulation of one sub-env")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default="", help="keep the PPO run here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/maniskill.py needs a CUDA GPU (ManiSkill3's GPU simulation), and none is visible",
              file=sys.stderr)
        return 2
    import mani_skill
    import sapien

    print(f"Machine: {torch.cuda.get_device_name()}; Python {platform.python_version()}, torch {torch.__version__}, "
          f"mani_skill {mani_skill.__version__}, sapien {sapien.__version__}", flush=True)
    failed = False
    if args.section in ("env", "all"):
        try:
            env_section(args.task, [int(c) for c in args.counts.split(",")], args.min_time, args.repeats,
                        args.sim)
        except Exception:
            traceback.print_exc()
            failed = True
    if args.section in ("ppo", "all"):
        with tempfile.TemporaryDirectory() as tmp:
            ppo_section(args.task, args.ppo_steps, args.episodes, args.run_dir or str(Path(tmp) / "run"),
                        args.seed, args.sim)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
