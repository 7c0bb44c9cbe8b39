"""The algorithm registry: name -> agent class and preset settings, used by :mod:`jaderl.api` and the CLI."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaderl.algos.dqn import DQN, DQNConfig
from jaderl.algos.ppo import PPO, PPOConfig
from jaderl.algos.sac import SAC, SACConfig
from jaderl.core.agent import Agent


@dataclasses.dataclass(frozen=True)
class AlgoSpec:
    """A registered algorithm: the agent class, settings that make this variant, and a one-line summary."""

    agent_cls: type[Agent]
    preset: dict[str, Any]
    summary: str


ALGOS: dict[str, AlgoSpec] = {
    "ppo": AlgoSpec(PPO, {}, "Proximal Policy Optimization (clipped objective, GAE)"),
    "sac": AlgoSpec(SAC, {}, "Soft Actor-Critic (twin critics, learned entropy coefficient)"),
    "dqn": AlgoSpec(DQN, {}, "Deep Q-Network (target network, epsilon-greedy)"),
    "double_dqn": AlgoSpec(DQN, {"double": True}, "Double DQN: the online network picks the target action"),
    "dueling_dqn": AlgoSpec(DQN, {"dueling": True}, "Dueling DQN: value and advantage streams"),
    "d3qn": AlgoSpec(DQN, {"double": True, "dueling": True}, "Dueling Double DQN"),
}

__all__ = ["ALGOS", "DQN", "PPO", "SAC", "AlgoSpec", "DQNConfig", "PPOConfig", "SACConfig"]
