"""SAC: Soft Actor-Critic with an ensemble of critics and a learned entropy coefficient; ModSAC and REDQ as options.

Haarnoja et al. 2018, https://arxiv.org/abs/1801.01290 and https://arxiv.org/abs/1812.05905 (automatic alpha).
The critics are one batched module (:class:`~jaderl.core.nets.EnsembleQ`, twin critics by default); each step

    1. critic: y = r + gamma (1 - terminated) [min_{i in M} Q_target_i(s', a') - alpha log pi(a'|s')],  a' ~ pi(s')
               M: all critics, or a random subset of ``num_target_critics`` of them per step (REDQ);
               with ``n_step > 1``: the n-step reward sum and gamma^n; with ``use_per``: importance-weighted
    2. actor:  minimise E[alpha log pi(a|s) - reduce_i Q_i(s, a)],  a ~ pi(s) (reparameterised),
               reduce = ``actor_reduce``: min (SAC) or mean (REDQ) over the ensemble
    3. alpha:  minimise E[-log alpha (log pi(a|s) + target_entropy)],  target_entropy = -action_dim
(the target critics are Polyak-averaged after every critic step).

REDQ (Chen et al. 2021, https://arxiv.org/abs/2101.05982) is the preset ``num_critics=10, num_target_critics=2,
actor_reduce=mean`` with an update-to-data ratio ``updates_per_step`` > 1. ModSAC (``modsac=True``) adapts how often
the actor learns to how well the critics fit: with c the running mean of the critic loss and lambda = exp(-c^2) in
(0, 1], the actor steps only while actor_updates / critic_updates < 1 / (2 - lambda), i.e. on every critic step
when the critics fit well (lambda -> 1) and on every second one when they do not (lambda -> 0). c is read on the
host once per ``update`` call (one sync per iteration, not per gradient step).

Only ``terminated`` stops the bootstrap; truncated transitions bootstrap from ``next_obs``.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch

from jaderl.algos.hterm import HTermConfig, hterm_update, tanh_gaussian_log_prob
from jaderl.core.agent import OffPolicyAgent
from jaderl.core.buffers import ReplayBuffer
from jaderl.core.config import ConfigError, OffPolicyConfig, param
from jaderl.core.nets import EnsembleQ, TanhGaussianActor
from jaderl.envs.vec import VecEnv


@dataclasses.dataclass
class SACConfig(OffPolicyConfig, HTermConfig):
    """SAC settings."""

    hterm_every: int = param(64, "H-term: one H-term update per this many iterations (here: env steps "
                             "with horizon=1, i.e. ~64 gradient steps)", low=1)

    num_envs: int = param(1, "sub-envs stepped in one batch", low=1)
    lr: float = param(3e-4, "Adam learning rate of actor, critics and alpha", low=0.0, open_low=True)
    tau: float = param(0.005, "Polyak averaging rate of the target critics", low=0.0, high=1.0, open_low=True)
    num_critics: int = param(2, "critics in the ensemble (one batched module)", low=1)
    num_target_critics: int = param(0, "size of the random subset of critics whose minimum forms the target "
                                    "(REDQ's M); 0 uses every critic", low=0)
    actor_reduce: str = param("min", "how the actor's objective combines the critics: min or mean")
    modsac: bool = param(False, "ModSAC: update the actor less often while the critic loss is high")
    init_alpha: float = param(1.0, "initial entropy coefficient", low=0.0, open_low=True)

    def validate(self) -> None:
        super().validate()
        if self.actor_reduce not in ("min", "mean"):
            raise ConfigError(f"actor_reduce={self.actor_reduce!r} is invalid: use min or mean")
        if self.num_target_critics > self.num_critics:
            raise ConfigError(f"num_target_critics={self.num_target_critics} is larger than "
                              f"num_critics={self.num_critics}; lower it or add critics")


class SAC(OffPolicyAgent):
    """SAC, ModSAC and REDQ for continuous actions."""

    config_cls = SACConfig
    discrete = False
    counters = (*OffPolicyAgent.counters, "critic_updates", "actor_updates", "critic_loss_avg")
    config: SACConfig

    def __init__(self, config: SACConfig, env: VecEnv, device: torch.device) -> None:
        super().__init__(config, env, device)
        self.actor = TanhGaussianActor(self.obs_dim, self.action_dim, config.hidden).to(device)
        self.critic = EnsembleQ(self.obs_dim, self.action_dim, config.hidden, config.num_critics).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(float(config.init_alpha), device=device).log())
        self.actor_optimizer = self.adam(self.actor.parameters(), lr=config.lr)
        self.critic_optimizer = self.adam([*self.encoder_parameters(), *self.critic.parameters()], lr=config.lr)
        self.alpha_optimizer = self.adam([self.log_alpha], lr=config.lr)
        self.target_entropy = -float(self.action_dim)
        self.critic_updates, self.actor_updates = 0, 0
        self.critic_loss_avg = 0.0  # ModSAC's running critic loss, read from the device once per update() call
        self._critic_loss_ema = torch.zeros((), device=device)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        return self.actor(x) if deterministic else self.actor.sample(x)[0]

    def explore_action(self, obs: torch.Tensor) -> torch.Tensor:
        if self.steps < self.config.warmup_steps:
            return torch.rand(obs.shape[0], self.action_dim, device=self.device) * 2 - 1
        return self.act(obs)

    def update(self, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        if self.config.modsac:
            self.critic_loss_avg = float(self._critic_loss_ema)
        stats = super().update(buffer)
        if stats and self.config.use_hterm:
            hterm = hterm_update(self, buffer.data, lambda x, a: tanh_gaussian_log_prob(self.actor, x, a), self.actor,
                                 self.actor_optimizer, oldest=buffer.ptr - buffer.size, size=buffer.size)
            stats = stats if hterm is None else {**stats, "loss/hterm": hterm}
        return stats

    @torch.no_grad()
    def td_target(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
        """The soft Bellman target y (B,) of step 1 in the module docstring."""
        cfg = self.config
        next_obs = self.features(batch["next_obs"])
        next_action, next_log_prob = self.actor.sample(next_obs)
        next_q = self.critic_target(next_obs, next_action)  # (E, B)
        if 0 < cfg.num_target_critics < cfg.num_critics:
            next_q = next_q[torch.randperm(cfg.num_critics, device=self.device)[:cfg.num_target_critics]]
        soft_value = next_q.min(0).values - alpha * next_log_prob
        return batch["reward"] + batch["discount"] * (~batch["terminated"]) * soft_value

    def update_once(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step of critics, actor and alpha on a sampled batch (B, ...)."""
        cfg = self.config
        obs = self.features(batch["obs"])
        alpha = self.log_alpha.exp().detach()
        # 1. critic
        td_error = self.critic(obs, batch["action"]) - self.td_target(batch, alpha)  # (E, B)
        critic_loss = self.weighted_mean(td_error.square().sum(0), batch)
        self.optimize(self.critic_optimizer, critic_loss)
        self.soft_update(self.critic_target, self.critic, cfg.tau)
        self.critic_updates += 1
        stats = {"loss/critic": critic_loss.detach(), "alpha": alpha}
        if cfg.modsac:
            self._critic_loss_ema.lerp_(critic_loss.detach() / cfg.num_critics, 0.005)
            fit = math.exp(-self.critic_loss_avg ** 2)
            if self.actor_updates >= self.critic_updates / (2.0 - fit):
                return stats, td_error.detach().abs().mean(0)
        # 2. actor (gradients reach the actor's parameters only)
        action, log_prob = self.actor.sample(obs)
        q = self.critic(obs, action)
        actor_loss = (alpha * log_prob - (q.min(0).values if cfg.actor_reduce == "min" else q.mean(0))).mean()
        self.optimize(self.actor_optimizer, actor_loss, list(self.actor.parameters()))
        self.actor_updates += 1
        # 3. entropy coefficient
        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        self.optimize(self.alpha_optimizer, alpha_loss)
        stats.update({"loss/actor": actor_loss.detach(), "policy/entropy": -log_prob.detach().mean()})
        return stats, td_error.detach().abs().mean(0)
