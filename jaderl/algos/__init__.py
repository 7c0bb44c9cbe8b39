"""The algorithm registry: name -> agent class and preset settings, used by :mod:`jaderl.api` and the CLI."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaderl.algos.a2c import A2C, A2CConfig
from jaderl.algos.dqn import DQN, DQNConfig
from jaderl.algos.ppo import PPO, PPOConfig
from jaderl.algos.reinforce import Reinforce, ReinforceConfig
from jaderl.algos.sac import SAC, SACConfig
from jaderl.algos.sac_discrete import DiscreteSAC, DiscreteSACConfig
from jaderl.algos.td3 import DDPG_PRESET, TD3, TD3Config
from jaderl.core.agent import Agent
from jaderl.envs.vec import EnvSpec


@dataclasses.dataclass(frozen=True)
class AlgoSpec:
    """A registered algorithm: the agent class, settings that make this variant, and a one-line summary."""

    agent_cls: type[Agent]
    preset: dict[str, Any]
    summary: str


ALGOS: dict[str, AlgoSpec] = {
    "ppo": AlgoSpec(PPO, {}, "Proximal Policy Optimization (clipped objective, GAE)"),
    "sac": AlgoSpec(SAC, {}, "Soft Actor-Critic (twin critics, learned entropy coefficient)"),
    "modsac": AlgoSpec(SAC, {"modsac": True}, "ModSAC: SAC whose actor update frequency follows the critic loss"),
    "sac_discrete": AlgoSpec(DiscreteSAC, {}, "SAC for discrete actions (exact expectations over actions)"),
    "redq": AlgoSpec(SAC, {"num_critics": 10, "num_target_critics": 2, "actor_reduce": "mean",
                           "updates_per_step": 20.0, "actor_every": 20},
                     "REDQ: 10 critics, random pairs in the target, 20 critic updates and 1 actor update per step"),
    "dqn": AlgoSpec(DQN, {}, "Deep Q-Network (target network, epsilon-greedy)"),
    "double_dqn": AlgoSpec(DQN, {"double": True}, "Double DQN: the online network picks the target action"),
    "dueling_dqn": AlgoSpec(DQN, {"dueling": True}, "Dueling DQN: value and advantage streams"),
    "d3qn": AlgoSpec(DQN, {"double": True, "dueling": True}, "Dueling Double DQN"),
    "noisy_dqn": AlgoSpec(DQN, {"noisy": True, "epsilon_start": 0.0, "epsilon_end": 0.0},
                          "Noisy DQN: factorised Gaussian noisy layers explore instead of epsilon"),
    "td3": AlgoSpec(TD3, {}, "Twin Delayed DDPG (clipped double-Q, delayed actor, target policy smoothing)"),
    "ddpg": AlgoSpec(TD3, DDPG_PRESET,
                     "Deep Deterministic Policy Gradient: TD3 with one critic, no delay, no smoothing"),
    "reinforce": AlgoSpec(Reinforce, {}, "REINFORCE: Monte-Carlo policy gradient, no baseline"),
    "vpg": AlgoSpec(Reinforce, {"baseline": True, "ent_coef": 0.01},
                    "Vanilla policy gradient: REINFORCE with a learned value baseline and an entropy bonus"),
    "a2c": AlgoSpec(A2C, {}, "Advantage Actor-Critic (synchronous, n-step returns, one step per rollout)"),
}

def action_spaces(agent_cls: type[Agent]) -> tuple[str, ...]:
    """The action spaces ``agent_cls`` trains on, as its ``accepts`` says: "discrete", "continuous", or for a
    multi-agent algorithm "multi-agent discrete", "multi-agent continuous"."""
    found: tuple[str, ...] = ()
    for agents, prefix in ((1, ""), (3, "multi-agent ")):
        probes = {kind: EnvSpec(num_envs=1, obs_shape=(3,), is_discrete=kind == "discrete", action_dim=2,
                                num_agents=agents, state_shape=(9,) if agents > 1 else None)
                  for kind in ("discrete", "continuous")}
        found += tuple(prefix + kind for kind, spec in probes.items() if agent_cls.accepts(spec) is None)
    return found


__all__ = ["ALGOS", "DQN", "PPO", "SAC", "AlgoSpec", "DQNConfig", "PPOConfig", "SACConfig", "action_spaces"]
__all__ += ["A2C", "A2CConfig", "Reinforce", "ReinforceConfig"]
__all__ += ["TD3", "TD3Config"]
__all__ += ["DiscreteSAC", "DiscreteSACConfig"]
