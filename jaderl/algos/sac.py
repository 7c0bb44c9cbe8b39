"""SAC: Soft Actor-Critic with twin critics and a learned entropy coefficient.

Haarnoja et al. 2018, https://arxiv.org/abs/1801.01290 and https://arxiv.org/abs/1812.05905 (automatic alpha).
The twin critics are one batched module (:class:`~jaderl.core.nets.EnsembleQ`); each gradient step

    1. critic: y = r + gamma (1 - terminated) [min_i Q_target_i(s', a') - alpha log pi(a'|s')],  a' ~ pi(s')
               (with ``n_step > 1``: the n-step reward sum and gamma^n; with ``use_per``: importance-weighted)
    2. actor:  minimise E[alpha log pi(a|s) - min_i Q_i(s, a)],  a ~ pi(s) (reparameterised)
    3. alpha:  minimise E[-log alpha (log pi(a|s) + target_entropy)],  target_entropy = -action_dim
    4. Polyak-average the target critics.

Only truncation-agnostic ``terminated`` stops the bootstrap; truncated transitions bootstrap from ``next_obs``.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from jaderl.core.agent import OffPolicyAgent
from jaderl.core.config import OffPolicyConfig, param
from jaderl.core.nets import EnsembleQ, TanhGaussianActor
from jaderl.envs.vec import VecEnv


@dataclasses.dataclass
class SACConfig(OffPolicyConfig):
    """SAC settings."""

    num_envs: int = param(1, "sub-envs stepped in one batch", low=1)
    lr: float = param(3e-4, "Adam learning rate of actor, critics and alpha", low=0.0, open_low=True)
    tau: float = param(0.005, "Polyak averaging rate of the target critics", low=0.0, high=1.0, open_low=True)
    num_critics: int = param(2, "critics in the ensemble; the target takes their minimum", low=1)
    init_alpha: float = param(1.0, "initial entropy coefficient", low=0.0, open_low=True)


class SAC(OffPolicyAgent):
    """SAC for continuous actions."""

    config_cls = SACConfig
    discrete = False
    config: SACConfig

    def __init__(self, config: SACConfig, env: VecEnv, device: torch.device) -> None:
        super().__init__(config, env, device)
        self.actor = TanhGaussianActor(self.obs_dim, self.action_dim, config.hidden).to(device)
        self.critic = EnsembleQ(self.obs_dim, self.action_dim, config.hidden, config.num_critics).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(float(config.init_alpha), device=device).log())
        self.actor_optimizer = self.adam(self.actor.parameters(), lr=config.lr)
        self.critic_optimizer = self.adam(self.critic.parameters(), lr=config.lr)
        self.alpha_optimizer = self.adam([self.log_alpha], lr=config.lr)
        self.target_entropy = -float(self.action_dim)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        return self.actor(x) if deterministic else self.actor.sample(x)[0]

    def explore_action(self, obs: torch.Tensor) -> torch.Tensor:
        if self.steps < self.config.warmup_steps:
            return torch.rand(obs.shape[0], self.action_dim, device=self.device) * 2 - 1
        return self.act(obs)

    def update_once(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step of critics, actor and alpha on a sampled batch (B, ...)."""
        cfg = self.config
        obs, next_obs = self.features(batch["obs"]), self.features(batch["next_obs"])
        alpha = self.log_alpha.exp().detach()
        # 1. critic
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(next_obs)
            next_q = self.critic_target(next_obs, next_action).min(0).values - alpha * next_log_prob
            target = batch["reward"] + batch["discount"] * (~batch["terminated"]) * next_q  # (B,)
        td_error = self.critic(obs, batch["action"]) - target  # (E, B)
        critic_loss = self.weighted_mean(td_error.square().sum(0), batch)
        self.optimize(self.critic_optimizer, critic_loss)
        # 2. actor (gradients reach the actor's parameters only)
        action, log_prob = self.actor.sample(obs)
        actor_loss = (alpha * log_prob - self.critic(obs, action).min(0).values).mean()
        self.optimize(self.actor_optimizer, actor_loss, list(self.actor.parameters()))
        # 3. entropy coefficient
        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        self.optimize(self.alpha_optimizer, alpha_loss)
        # 4. target critics
        self.soft_update(self.critic_target, self.critic, cfg.tau)
        stats = {"loss/critic": critic_loss.detach(), "loss/actor": actor_loss.detach(), "alpha": alpha,
                 "policy/entropy": -log_prob.detach().mean()}
        return stats, td_error.detach().abs().mean(0)
