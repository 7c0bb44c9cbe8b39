"""A2C: synchronous advantage actor-critic.

Mnih et al. 2016, https://arxiv.org/abs/1602.01783 (the synchronous variant of A3C). Each iteration collects
``horizon`` steps from every sub-env with the current policy and takes one gradient step, with one optimizer shared
by the actor and the critic, on

    L = -E[log pi(a_t|s_t) A_t] + vf_coef E[(V(s_t) - V_target_t)^2] - ent_coef E[H(pi(.|s_t))].

A_t is GAE(lambda) (Schulman et al. 2016); the default lambda = 1 gives A3C's n-step advantage
A_t = r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1} + gamma^k V(s_{t+k}) - V(s_t), where t + k is the end of the
rollout (n = horizon, so k = horizon - t) or of the episode: a terminated step adds no V, a truncated one adds V of
its real final observation. V_target = A + V(s_t).
"""

from __future__ import annotations

import dataclasses

import torch

from jaderl.algos.base import OnPolicyAgent, OnPolicyConfig
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.config import ConfigError, param
from jaderl.envs.vec import EnvSpec

OPTIMIZERS = ("rmsprop", "adam")


@dataclasses.dataclass
class A2CConfig(OnPolicyConfig):
    """A2C settings; the defaults follow Stable-Baselines3 / RL-Zoo (RMSprop, 5-step returns)."""

    num_envs: int = param(16, "sub-envs stepped in one batch", low=1)
    horizon: int = param(5, "steps each sub-env takes per rollout: n of the n-step returns", low=1, high=100_000)
    lr: float = param(7e-4, "learning rate", low=0.0, open_low=True)
    optimizer: str = param("rmsprop", "rmsprop (as in the paper, alpha=0.99, eps=1e-5) or adam (eps=1e-5)")
    gae_lambda: float = param(1.0, "GAE lambda; 1 gives n-step returns", low=0.0, high=1.0)
    normalize_advantages: bool = param(False, "standardise the advantages over each rollout")

    def validate(self) -> None:
        super().validate()
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer={self.optimizer!r} is invalid: use one of {', '.join(OPTIMIZERS)}")


class A2C(OnPolicyAgent):
    """A2C for discrete (categorical) and continuous (Gaussian) actions."""

    config_cls = A2CConfig
    compiled_methods = ("act", "explore_action")
    config: A2CConfig

    def __init__(self, config: A2CConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.build_actor_critic(config.hidden, critic=True, log_std_init=config.log_std_init)
        if config.optimizer == "rmsprop":  # SB3's A2C optimizer (PyTorch's RMSprop: eps outside the root)
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            self.optimizer = torch.optim.RMSprop(params, lr=config.lr, alpha=0.99, eps=1e-5)

    def update(self, buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
        cfg, data = self.config, buffer.data
        schedule = self.begin_update(data)
        # 1. values and n-step / GAE advantages for the whole rollout (T, N)
        obs = self.features(data["obs"])  # (T, N, obs_dim)
        value = self.critic(obs).squeeze(-1)
        with torch.no_grad():
            next_value = self.critic(self.features(data["next_obs"])).squeeze(-1)
            buffer.compute_gae(value.detach(), next_value, cfg.gamma, cfg.gae_lambda)
        advantage, value_target = data["advantage"], data["value_target"]
        if cfg.normalize_advantages:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        # 2. one gradient step on the whole rollout
        log_prob, entropy = self.actor.evaluate(obs.flatten(0, 1), data["action"].flatten(0, 1))
        policy_loss = -(log_prob * advantage.flatten()).mean()
        value_loss = (value - value_target).square().mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy.mean()
        self.optimize(self.optimizer, loss)
        self.obs_norm.update(data["obs"])  # after learning, so the log-probabilities above used the acting statistics
        return {"loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(),
                "policy/entropy": entropy.mean().detach()} | schedule
