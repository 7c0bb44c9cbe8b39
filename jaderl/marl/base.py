"""What every multi-agent algorithm shares, mixed in before its family base (``class MAPPO(MultiAgent,
OnPolicyAgent)``).

The multi-agent contract (:class:`~jaderl.envs.vec.EnvSpec` with ``num_agents > 1``): observations
``(N, agents, obs_dim)``, a global state ``(N, state_dim)``, actions ``(N, agents)`` (discrete) or
``(N, agents, action_dim)`` (continuous), rewards ``(N, agents)``. ``explore`` records ``state`` and ``next_state``
beside the observations, so every trajectory and replay batch carries them.

Where agents may leave an episode early (``agents_leave``, PettingZoo envs), ``explore`` also records ``active`` and
``next_active`` (the agents in the episode at ``obs`` and after the step), and every algorithm learns only from the
agents present (:func:`present_mean`): an agent's last step in an episode does not bootstrap its own value, and the
zero observations, rewards and dropped actions of agents that have left take no part in any loss or target.

Agents share their networks' parameters (one actor, one Q network ... for all agents, as in MAPPO, QMIX and the
benchmarks built on them): :meth:`MultiAgent.features` appends each agent's one-hot id to its observation features,
so one network can still act differently per agent. Every per-agent network therefore reads ``obs_dim`` inputs
(the observation plus the id) and works on ``(..., agents, features)`` tensors.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from jaderl.core.buffers import Batch
from jaderl.core.nets import ObsNorm
from jaderl.envs.vec import EnvSpec


def present_mean(x: torch.Tensor, active: torch.Tensor | None, dim: int | None = None) -> torch.Tensor:
    """The mean of ``x`` over ``dim`` (over everything when None) of the entries of agents present: ``active`` is
    bool and broadcasts against ``x`` (its last dim the agents'); None where every agent is always present (the env's
    agents never leave, :attr:`~jaderl.envs.vec.EnvSpec.agents_leave`). A row without an agent present is 0."""
    if active is None:
        return x.mean() if dim is None else x.mean(dim)
    mask = active.expand_as(x)
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = mask.to(x.dtype)
    if dim is None:
        return total.sum() / count.sum().clamp(min=1.0)
    return total.sum(dim) / count.sum(dim).clamp(min=1.0)


def present_obs(traj: Batch) -> Batch:
    """``traj`` with its observations (T, N, agents, obs_dim) cut to those of the agents present (M, obs_dim) where
    agents may leave (``active``), for the running statistics; ``traj`` itself elsewhere."""
    return {**traj, "obs": traj["obs"][traj["active"]]} if "active" in traj else traj


class TeamRewardWarning(UserWarning):
    """An algorithm that learns the team reward built for a game between teams; said when a run is built, not again
    when the run is loaded (:func:`jaderl.load`)."""


class MultiAgent:
    """The multi-agent mixin: refuses single-agent envs, gives features the agent id, knows the agent count."""

    spec: EnvSpec
    obs_dim: int

    def __init__(self, config: Any, spec: Any, device: torch.device) -> None:
        super().__init__(config, spec, device)  # type: ignore[call-arg]
        self.num_agents = self.spec.num_agents
        self.state_dim = int(torch.tensor(self.spec.state_shape or (0,)).prod())
        self.agent_ids = torch.eye(self.num_agents, device=device)  # (agents, agents)
        self.obs_dim += self.num_agents  # the networks read the observation features and the id
        # the global state normalised like the observations (normalize_obs), for the centralised critics and mixers
        self.state_norm = ObsNorm((self.state_dim,), config.normalize_obs).to(device)
        if self.learns_team_reward() and len(teams := dict.fromkeys(self.spec.teams)) > 1:
            warnings.warn(f"{config.algo or type(self).__name__} learns the sum of every agent's reward, and "
                          f"{config.env or 'this env'} has agents of {len(teams)} kinds ({', '.join(teams)}): in a "
                          "game between teams that sum is no team's goal, so use ippo, iql, maddpg or matd3, which "
                          "learn each agent's own reward", TeamRewardWarning, stacklevel=2)

    def running_stats(self) -> dict[str, nn.Module | torch.Tensor]:
        # only when enabled, so that checkpoints written without it still load
        stats: dict[str, nn.Module | torch.Tensor] = super().running_stats()  # type: ignore[misc]
        return stats | ({"state_norm": self.state_norm} if self.state_norm.enabled else {})

    def observe(self, traj: Batch) -> None:
        super().observe(present_obs(traj))  # type: ignore[misc]
        self.state_norm.update(traj["state"])

    def learns_team_reward(self) -> bool:
        """Whether this agent learns the team reward (every agent's summed) rather than each agent's own."""
        return False

    @classmethod
    def accepts(cls, spec: EnvSpec) -> str | None:
        if spec.num_agents < 2:
            return "it has a single agent and this is a multi-agent algorithm; use a single-agent one (ppo, sac, dqn)"
        if spec.state_shape is None:
            return "it has no global state; wrap it to provide one (global_state())"
        if len(spec.obs_shape) != 1:
            return f"its observations have shape {spec.obs_shape}; multi-agent algorithms take vectors"
        if len(spec.state_shape) != 1:  # the critics, mixers and the state normaliser read (..., state_dim)
            return f"its global state has shape {spec.state_shape}; multi-agent algorithms take a vector (flatten it)"
        return None

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., agents, obs_dim + agents): the (normalised) observation of every agent and its one-hot id."""
        x = super().features(obs)  # type: ignore[misc]
        # the ids made contiguous first: concatenating a broadcast (stride-0) tensor is 1.7x slower on the CPU
        return torch.cat([x, self.agent_ids.expand(*x.shape[:-1], self.num_agents).contiguous()], -1)

    def team_reward(self, reward: torch.Tensor) -> torch.Tensor:
        """The team's reward (..., ) from every agent's (..., agents): their sum (the return jaderl reports)."""
        return reward.sum(-1)
