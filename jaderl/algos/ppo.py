"""PPO: Proximal Policy Optimization with a clipped surrogate objective.

Schulman et al. 2017, https://arxiv.org/abs/1707.06347. Each iteration collects ``horizon`` steps from every
sub-env with the current policy, estimates advantages with GAE (truncated episodes bootstrap from their final
observation), and then runs ``num_epochs`` passes of minibatch updates on

    L = -E[min(r A, clip(r, 1 - eps, 1 + eps) A)] + vf_coef E[(V - V_target)^2] - ent_coef E[H(pi)],

where r = pi(a|s) / pi_old(a|s). Discrete actions use a categorical policy, continuous ones a Gaussian with a
state-independent standard deviation.
"""

from __future__ import annotations

import dataclasses

import torch

from jaderl.algos.hterm import HTermConfig, hterm_update
from jaderl.core.agent import OnPolicyAgent
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.config import Config, ConfigError, param
from jaderl.envs.vec import VecEnv


@dataclasses.dataclass
class PPOConfig(Config, HTermConfig):
    """PPO settings; the defaults suit small control tasks with a few hundred parallel sub-envs."""

    num_envs: int = param(64, "sub-envs stepped in one batch", low=1)
    horizon: int = param(32, "steps each sub-env takes per rollout", low=1)
    lr: float = param(3e-4, "Adam learning rate", low=0.0, open_low=True)
    hidden: list[int] = param((64, 64), "hidden layer sizes of the actor and the critic")
    num_epochs: int = param(10, "passes over each rollout", low=1)
    minibatch_size: int = param(512, "transitions per gradient step (each epoch reshuffles the rollout and leaves "
                                "out its remainder when the size does not divide it)", low=1)
    clip_ratio: float = param(0.2, "PPO clipping range of the probability ratio", low=0.0, open_low=True)
    gae_lambda: float = param(0.95, "GAE lambda", low=0.0, high=1.0)
    ent_coef: float = param(0.0, "entropy bonus weight", low=0.0)
    vf_coef: float = param(0.5, "value loss weight", low=0.0)
    max_grad_norm: float = param(0.5, "clip gradient norm to this (0 disables)", low=0.0)
    normalize_advantages: bool = param(True, "normalise advantages per minibatch")
    log_std_init: float = param(-0.5, "initial log standard deviation of the Gaussian policy (continuous actions)")

    def validate(self) -> None:
        super().validate()
        rollout = self.num_envs * max(1, self.workers) * self.horizon  # explorer workers add their rollouts
        if self.minibatch_size > rollout:
            sizes = "num_envs * workers * horizon" if self.workers else "num_envs * horizon"
            raise ConfigError(f"minibatch_size={self.minibatch_size} is larger than a rollout "
                              f"({sizes} = {rollout}); lower it or collect more")
        if self.normalize_advantages and self.minibatch_size < 2:
            raise ConfigError("normalize_advantages=true needs minibatch_size >= 2 (a single advantage has no "
                              "standard deviation); raise minibatch_size or set normalize_advantages=false")


class PPO(OnPolicyAgent):
    """PPO for discrete (categorical) and continuous (Gaussian) actions."""

    config_cls = PPOConfig
    compiled_methods = ("act", "explore_action", "minibatch_loss")
    """The pure functions :func:`jaderl.accel.accelerate` compiles (the optimizer steps stay eager)."""
    config: PPOConfig

    def __init__(self, config: PPOConfig, env: VecEnv, device: torch.device) -> None:
        super().__init__(config, env, device)
        params = self.build_actor_critic(config.hidden, critic=True, log_std_init=config.log_std_init)
        self.optimizer = self.adam(params, lr=config.lr, eps=1e-5)

    def update(self, buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
        cfg, data = self.config, buffer.data
        # 1. values, old log-probabilities and GAE for the whole rollout in three batched calls
        with torch.no_grad():
            obs, next_obs = self.features(data["obs"]), self.features(data["next_obs"])
            value, next_value = self.critic(obs).squeeze(-1), self.critic(next_obs).squeeze(-1)  # (T, N)
            data["log_prob"] = self.actor.evaluate(obs.flatten(0, 1), data["action"].flatten(0, 1))[0].view_as(value)
            buffer.compute_gae(value, next_value, cfg.gamma, cfg.gae_lambda)
        batch = {k: v for k, v in buffer.flat().items()
                 if k in ("obs", "action", "log_prob", "advantage", "value_target")}
        size = batch["advantage"].shape[0]
        # 2. minibatch epochs
        totals = torch.zeros(5, device=self.device)  # policy loss, value loss, entropy, approx KL, clip fraction
        num_updates = 0
        for _ in range(cfg.num_epochs):
            perm = torch.randperm(size, device=self.device)
            for start in range(0, size - cfg.minibatch_size + 1, cfg.minibatch_size):
                loss, mb_stats = self.minibatch_loss({k: v[perm[start:start + cfg.minibatch_size]]
                                                      for k, v in batch.items()})
                self.optimize(self.optimizer, loss)
                totals += mb_stats
                num_updates += 1
        # 3. the optional H-term policy update on segments of this rollout
        hterm = hterm_update(self, data, lambda x, a: self.actor.evaluate(x, a)[0], self.actor, self.optimizer)
        self.obs_norm.update(data["obs"])
        totals /= max(num_updates, 1)
        names = ("loss/policy", "loss/value", "policy/entropy", "policy/approx_kl", "policy/clip_fraction")
        stats = dict(zip(names, totals.unbind(), strict=True))
        return stats if hterm is None else {**stats, "loss/hterm": hterm}

    def minibatch_loss(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss L of the module docstring on a minibatch, and its statistics (5,): policy loss, value loss,
        entropy, approximate KL and clip fraction."""
        cfg = self.config
        features = self.features(mb["obs"])  # again, so that gradients reach an image encoder
        log_prob, entropy = self.actor.evaluate(features, mb["action"])
        log_ratio = log_prob - mb["log_prob"]
        ratio = log_ratio.exp()
        adv = mb["advantage"]
        if cfg.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio) * adv).mean()
        value_loss = (self.critic(features).squeeze(-1) - mb["value_target"]).square().mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy.mean()
        with torch.no_grad():
            clip_frac = ((ratio - 1).abs() > cfg.clip_ratio).float().mean()
            approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance KL estimator
            stats = torch.stack([policy_loss, value_loss, entropy.mean(), approx_kl, clip_frac])
        return loss, stats
