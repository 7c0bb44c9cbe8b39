"""MAPPO end to end: jaderl against TorchRL's multi-agent PPO on the same env, with the same settings and networks.

Usage (from the repository root; TorchRL comes with ``pip install -r benchmarks/requirements.txt``)::

    .venv/bin/python benchmarks/marl.py                     # seeds 0-2, 40 iterations each (about 1M env steps), CPU
    .venv/bin/python benchmarks/marl.py --device cuda       # on a GPU
    .venv/bin/python benchmarks/marl.py --iterations 4 --seeds 0  # a quick check that both sides run

Both sides train MAPPO on the same env, jaderl's torch-native ``jaderl/simple_spread`` (3 agents, 25-step episodes,
MPE2's rewards): TorchRL through a thin ``EnvBase`` over that env (``SpreadForTorchRL`` below: no copies, so both
sides pay the same env cost and the comparison is of the training stacks), jaderl through its own ``Trainer``.
The peer is TorchRL 0.14's multi-agent PPO as its tutorial builds it: ``MultiAgentMLP`` actor (parameters shared) and
centralised critic (every agent's observation), ``ProbabilisticActor``, ``Collector``, ``ClipPPOLoss`` with its GAE,
a ``ReplayBuffer`` of the rollout sampled without replacement. BenchMARL's MAPPO is this same TorchRL stack.

Same on both sides (``SETTINGS``, jaderl's MAPPO defaults): 1,024 sub-envs x 25 steps = 25,600 env steps per
rollout, 5 epochs of minibatches of 6,400 sub-env steps (all agents of each), Adam lr 0.01 (eps 1e-5), tanh MLPs of
64 x 64, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value-loss weight 0.5 (squared error), advantages
standardised per minibatch, gradient norm clipped at 10, every episode end ending the returns (no bootstrap at the
25-step limit). What differs is each library's own MAPPO: jaderl's critic reads the global state and is trained on
normalised value targets (MAPPO's value normalisation), its actor sees the agent's one-hot id, and both networks start
from the MAPPO code's initialisation (orthogonal hidden layers at tanh's gain 5/3, zero biases, the policy's output
layer at gain 0.01); TorchRL's critic reads all observations, its loss has no value normalisation and its networks
start from PyTorch's default initialisation. ``--peer-init jaderl`` gives TorchRL's networks jaderl's initialisation
(:func:`orthogonal_like_jaderl`), to tell how much of the difference in env steps to the target comes from it.

For each of ``--seeds`` (0, 1, 2) the two runs alternate iteration by iteration in this process (so both see the same
load on a shared machine; which one goes first alternates too), each on one torch thread. An iteration is one rollout
and its update; its wall time is the training time. Every ``--eval-every`` iterations (1) each policy is evaluated on
the same 1,000 deterministic episodes (excluded from the training time). The table gives, per seed, training
env-steps/s, the team return reached, and the training time until the first evaluation at ``--target`` (default -57:
30 % better than a random policy's -81); the summary, the medians over the seeds of jaderl's rate over TorchRL's and of
TorchRL's time to the target over jaderl's (a seed's trajectory decides when either side first crosses the target, so
one seed alone swings the ratio by 1.5x). Target: jaderl >= 3x faster to the same return. ``--write`` records the table
in the ``## marl`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_md import write_section

import jaderl  # after the path insert, so the checkout is what is timed
from jaderl.envs.mpe import SimpleSpreadEnv

SECTION = "## marl"
AGENTS, EPISODE, ACTIONS = 3, 25, 5
SETTINGS: dict[str, Any] = {"num_envs": 1024, "horizon": 25, "num_epochs": 5, "minibatch_size": 6400, "lr": 0.01,
                            "hidden": [64, 64], "gamma": 0.99, "gae_lambda": 0.95, "clip_ratio": 0.2,
                            "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 10.0}
Act = Callable[[torch.Tensor], torch.Tensor]
"""Observations (N, agents, obs_dim) -> deterministic discrete actions (N, agents)."""


@torch.no_grad()
def team_return(act: Act, device: str, episodes: int = 1000, seed: int = 123) -> float:
    """Mean team return (rewards summed over agents and steps) of ``episodes`` deterministic episodes."""
    env = SimpleSpreadEnv(episodes, device=device, seed=seed)
    obs, total = env.reset(seed=seed), torch.zeros(episodes, device=device)
    for _ in range(EPISODE):  # every sub-env ends together after 25 steps
        obs, reward, _, _, _ = env.step(act(obs))
        total += reward.sum(-1)
    return float(total.mean())


class JaderlSide:
    """jaderl's MAPPO: a Trainer stepped one iteration at a time."""

    name = "jaderl"

    def __init__(self, device: str, seed: int, run_dir: str) -> None:
        config = jaderl.make_config("mappo", "jaderl/simple_spread", device=device, seed=seed, run_dir=run_dir,
                                    num_threads=1, eval_every=10**12, checkpoint_every=10**12, **SETTINGS)
        self.trainer = jaderl.Trainer(config, jaderl.api.ALGOS["mappo"].agent_cls)

    def iterate(self) -> None:
        self.trainer.step()

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trainer.agent.act(obs, deterministic=True)

    def close(self) -> None:
        self.trainer.close()


class TorchRLSide:
    """TorchRL's multi-agent PPO (its tutorial's construction) on :class:`SpreadForTorchRL`."""

    name = "TorchRL"

    def __init__(self, device: str, seed: int, peer_init: str = "default") -> None:
        from tensordict.nn import TensorDictModule
        from torchrl.collectors import Collector
        from torchrl.data.replay_buffers import ReplayBuffer
        from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
        from torchrl.data.replay_buffers.storages import LazyTensorStorage
        from torchrl.modules import MultiAgentMLP, ProbabilisticActor
        from torchrl.objectives import ClipPPOLoss, ValueEstimators

        torch.manual_seed(seed)
        n, frames = SETTINGS["num_envs"], SETTINGS["num_envs"] * SETTINGS["horizon"]
        self.env = spread_for_torchrl(n, device, seed)
        obs_dim, hidden = self.env.spread.obs_shape[0], SETTINGS["hidden"]
        mlp = {"n_agents": AGENTS, "share_params": True, "depth": len(hidden), "num_cells": hidden,
               "activation_class": nn.Tanh, "device": device}
        self.actor_net = MultiAgentMLP(n_agent_inputs=obs_dim, n_agent_outputs=ACTIONS, centralized=False, **mlp)
        actor = ProbabilisticActor(
            TensorDictModule(self.actor_net, in_keys=[("agents", "observation")], out_keys=[("agents", "logits")]),
            in_keys=[("agents", "logits")], out_keys=[("agents", "action")],
            distribution_class=torch.distributions.Categorical, return_log_prob=True)
        critic_net = MultiAgentMLP(n_agent_inputs=obs_dim, n_agent_outputs=1, centralized=True, **mlp)
        if peer_init == "jaderl":
            orthogonal_like_jaderl(self.actor_net, out_gain=0.01)
            orthogonal_like_jaderl(critic_net, out_gain=1.0)
        critic = TensorDictModule(critic_net, in_keys=[("agents", "observation")],
                                  out_keys=[("agents", "state_value")])
        self.loss = ClipPPOLoss(actor, critic, clip_epsilon=SETTINGS["clip_ratio"],
                                entropy_coeff=SETTINGS["ent_coef"], critic_coeff=SETTINGS["vf_coef"],
                                loss_critic_type="l2", normalize_advantage=True)
        self.loss.set_keys(reward=("agents", "reward"), action=("agents", "action"),
                           value=("agents", "state_value"), done=("agents", "done"),
                           terminated=("agents", "terminated"))
        self.loss.make_value_estimator(ValueEstimators.GAE, gamma=SETTINGS["gamma"], lmbda=SETTINGS["gae_lambda"])
        self.optimizer = torch.optim.Adam(self.loss.parameters(), lr=SETTINGS["lr"], eps=1e-5)
        self.collector = Collector(self.env, actor, frames_per_batch=frames, total_frames=-1, device=device)
        self.batches = iter(self.collector)
        self.buffer = ReplayBuffer(storage=LazyTensorStorage(frames, device=device),
                                   sampler=SamplerWithoutReplacement(), batch_size=SETTINGS["minibatch_size"])
        self.minibatches = frames // SETTINGS["minibatch_size"]

    def iterate(self) -> None:
        data = next(self.batches)
        shape = data.get_item_shape(("next", "agents", "reward"))
        for key in ("done", "terminated"):  # per sub-env flags, as every agent's
            data.set(("next", "agents", key), data.get(("next", key)).unsqueeze(-1).expand(shape))
        with torch.no_grad():
            self.loss.value_estimator(data, params=self.loss.critic_network_params,
                                      target_params=self.loss.target_critic_network_params)
        self.buffer.extend(data.reshape(-1))
        for _ in range(SETTINGS["num_epochs"]):
            for _ in range(self.minibatches):
                out = self.loss(self.buffer.sample())
                (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
                nn.utils.clip_grad_norm_(self.loss.parameters(), SETTINGS["max_grad_norm"])
                self.optimizer.step()
                self.optimizer.zero_grad()
        self.collector.update_policy_weights_()

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_net(obs).argmax(-1)

    def close(self) -> None:
        self.collector.shutdown()


@torch.no_grad()
def orthogonal_like_jaderl(net: nn.Module, out_gain: float) -> None:
    """jaderl's MAPPO initialisation on a TorchRL ``MultiAgentMLP``: orthogonal weights at tanh's gain (5/3) for the
    hidden layers and at ``out_gain`` for the output layer, zero biases."""
    weights = [p for name, p in net.named_parameters() if name.endswith("weight")]
    for i, weight in enumerate(weights):
        nn.init.orthogonal_(weight, out_gain if i == len(weights) - 1 else nn.init.calculate_gain("tanh"))
    for name, p in net.named_parameters():
        if name.endswith("bias"):
            p.zero_()


def spread_for_torchrl(num_envs: int, device: str, seed: int) -> Any:
    """jaderl's SimpleSpreadEnv behind TorchRL's ``EnvBase`` API: observations, actions and rewards under
    ``"agents"`` with a batch of (sub-envs, agents), done flags per sub-env. The env resets its finished sub-envs
    itself, so ``_step`` reports what they reached (``final_obs``) and ``_reset`` hands out what they were reset to.
    Every episode end is reported as terminated, so that TorchRL's GAE ends the returns there, as jaderl's MAPPO
    does by default."""
    from tensordict import TensorDict
    from torchrl.data import Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase

    class SpreadForTorchRL(EnvBase):
        def __init__(self) -> None:
            super().__init__(device=device, batch_size=torch.Size([num_envs]))
            self.spread = SimpleSpreadEnv(num_envs, device=device, seed=seed)
            n, dim = (num_envs, AGENTS), self.spread.obs_shape[0]
            self.observation_spec = Composite(
                agents=Composite(observation=Unbounded((*n, dim), device=device), shape=n), shape=(num_envs,))
            self.action_spec = Composite(
                agents=Composite(action=Categorical(ACTIONS, n, device=device), shape=n), shape=(num_envs,))
            self.reward_spec = Composite(
                agents=Composite(reward=Unbounded((*n, 1), device=device), shape=n), shape=(num_envs,))
            flag = Categorical(2, (num_envs, 1), dtype=torch.bool, device=device)
            self.done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(num_envs,))
            self.current = self.spread.reset(seed=seed)

        def _flags(self, done: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"done": done, "terminated": done, "truncated": torch.zeros_like(done)}

        def _reset(self, tensordict: Any, **kwargs: Any) -> Any:
            done = torch.zeros(num_envs, 1, dtype=torch.bool, device=device)
            agents = TensorDict({"observation": self.current}, batch_size=(num_envs, AGENTS), device=device)
            return TensorDict({"agents": agents, **self._flags(done)}, batch_size=self.batch_size, device=device)

        def _step(self, tensordict: Any) -> Any:
            obs, reward, terminated, truncated, info = self.spread.step(tensordict.get(("agents", "action")))
            self.current = obs
            done = (terminated | truncated).unsqueeze(-1)
            agents = TensorDict({"observation": info["final_obs"], "reward": reward.unsqueeze(-1)},
                                batch_size=(num_envs, AGENTS), device=device)
            return TensorDict({"agents": agents, **self._flags(done)}, batch_size=self.batch_size, device=device)

        def _set_seed(self, seed: int | None) -> None:
            pass  # seeded at construction

    return SpreadForTorchRL()


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Both libraries from ``seed``, alternating iteration by iteration: per library its training env-steps/s, its
    evaluations (env steps, team return, training seconds) and its first evaluation at the target."""
    frames = SETTINGS["num_envs"] * SETTINGS["horizon"]
    with tempfile.TemporaryDirectory() as tmp:
        sides = [JaderlSide(args.device, seed, f"{tmp}/run"), TorchRLSide(args.device, seed, args.peer_init)]
        times: dict[str, list[float]] = {side.name: [] for side in sides}
        evals: dict[str, list[tuple[int, float, float]]] = {side.name: [] for side in sides}  # (steps, return, s)
        for it in range(1, args.iterations + 1):
            for side in sides if it % 2 else sides[::-1]:  # which side steps first alternates
                start = time.perf_counter()
                side.iterate()
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                times[side.name].append(time.perf_counter() - start)
                if it % args.eval_every == 0 or it == args.iterations:
                    value = team_return(side.act, args.device)
                    evals[side.name].append((it * frames, value, sum(times[side.name])))
                    print(f"seed {seed} {side.name:8s} {it * frames:>9,} env steps  team return {value:7.2f}  "
                          f"training {sum(times[side.name]):6.1f} s", flush=True)
        for side in sides:
            side.close()
    result: dict[str, Any] = {}
    for name in times:
        result[name] = {"rate": frames / statistics.median(times[name][1:] or times[name]),  # the first warms up
                        "first": next(((s, t) for s, v, t in evals[name] if v >= args.target), None),
                        "last": evals[name][-1][1], "best": max(v for _, v, _ in evals[name]),
                        "time_s": sum(times[name])}
    jd, tr = result["jaderl"], result["TorchRL"]
    if jd["first"] and tr["first"]:
        result["ratio"], result["ratio_text"] = tr["first"][1] / jd["first"][1], None
    elif jd["first"]:  # at least this much: TorchRL's whole run against jaderl's time to the target
        result["ratio"] = tr["time_s"] / jd["first"][1]
        result["ratio_text"] = f"> {result['ratio']:.1f}x (TorchRL did not reach it)"
    else:
        result["ratio"], result["ratio_text"] = 0.0, "jaderl did not reach it"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40, help="rollouts (25,600 env steps each) per library")
    parser.add_argument("--eval-every", type=int, default=1, help="iterations between evaluations")
    parser.add_argument("--target", type=float, default=-57.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", default="0,1,2", help="one pair of runs per seed, one seed after another")
    parser.add_argument("--peer-init", choices=("default", "jaderl"), default="default",
                        help="TorchRL's networks' initialisation: its default (PyTorch's), or jaderl's")
    parser.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args()
    if importlib.util.find_spec("torchrl") is None:
        sys.exit("benchmarks/marl.py compares against TorchRL, which is not installed: pip install -r "
                 "benchmarks/requirements.txt")
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    frames = SETTINGS["num_envs"] * SETTINGS["horizon"]
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    results = {seed: run_seed(args, seed) for seed in seeds}
    rows = []
    for seed, result in results.items():
        for name in ("jaderl", "TorchRL"):
            r = result[name]
            at = f"{r['first'][0]:,} env steps, {r['first'][1]:.1f} s" if r["first"] else "not reached"
            ratio = "" if name == "TorchRL" else (result["ratio_text"] or f"{result['ratio']:.1f}x")
            rows.append(f"| {seed} | {name} | {r['rate']:,.0f} | {r['last']:.1f} | {r['best']:.1f} | {at} | {ratio} |")
    rate_ratio = statistics.median(r["jaderl"]["rate"] / r["TorchRL"]["rate"] for r in results.values())
    ratio = statistics.median(r["ratio"] for r in results.values())
    import torchrl

    section = "\n".join([
        SECTION, "",
        f"Command: `python benchmarks/marl.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {platform.machine()}, {args.device}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"torchrl {torchrl.__version__}; one torch thread, the two runs of a seed alternating iteration by iteration",
        "",
        f"MAPPO on `jaderl/simple_spread` (3 agents), {args.iterations} rollouts of {frames:,} env steps each, the "
        "same settings and network sizes on both sides (see the script's docstring), TorchRL's networks initialised "
        f"{'as jaderl initialises its own (--peer-init jaderl)' if args.peer_init == 'jaderl' else 'by default'}; "
        "team return of 1,000 "
        f"deterministic episodes every {args.eval_every} rollout(s); target {args.target:g}; *time to the target*: "
        "TorchRL's training time to its first evaluation at the target over jaderl's:",
        "",
        "| seed | library | training env-steps/s | last team return | best team return | first evaluation at the "
        "target | TorchRL's time to the target over jaderl's |",
        "|---:|---|---:|---:|---:|---|---:|",
        *rows, "",
        f"Medians over {len(seeds)} seed(s): jaderl trains {rate_ratio:.1f}x TorchRL's env-steps/s and reaches "
        f"{args.target:g} {ratio:.1f}x faster (target: >= 3x: {'met' if ratio >= 3 else '**not met**'}).",
    ])
    print("\n" + section)
    if args.write:
        write_section(SECTION, section)


if __name__ == "__main__":
    main()
