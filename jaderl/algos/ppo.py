"""PPO: Proximal Policy Optimization with a clipped surrogate objective.

Schulman et al. 2017, https://arxiv.org/abs/1707.06347. Each iteration collects ``horizon`` steps from every
sub-env with the current policy, estimates advantages with GAE (truncated episodes bootstrap from their final
observation), and then runs ``num_epochs`` passes of minibatch updates on

    L = -E[min(r A, clip(r, 1 - eps, 1 + eps) A)] + vf_coef E[(V - V_target)^2] - ent_coef E[H(pi)],

where r = pi(a|s) / pi_old(a|s), pi_old(a|s) being recorded while exploring (a rollout's log-probabilities are not
computed again). Discrete actions use a categorical policy, continuous ones a Gaussian with a
state-independent standard deviation. Options, all off by default, as CleanRL and Stable-Baselines3 users know them:

* ``anneal_lr`` (CleanRL's; every rollout algorithm takes it): the update after a rollout uses
  lr * (1 - steps done before that rollout / total_steps), CleanRL's ``1 - (iteration - 1) / num_iterations``, so the
  first update uses ``lr`` itself and none uses 0 (SB3's schedules read the progress after the rollout). A function
  of ``steps`` and the config: it follows a changed ``lr`` and is exact after a resume.
* ``clip_value_loss`` (SB3's ``clip_range_vf``): V in the value loss is clipped to within +-clip of the value the
  rollout's critic predicted, V_old + clip(V - V_old, -clip, clip) (CleanRL's ``clip_vloss`` instead takes the larger
  of the clipped and unclipped squared errors).
* ``target_kl`` (SB3's): before each step, a minibatch whose approximate KL to the rollout policy exceeds
  1.5 target_kl ends the epochs without stepping (CleanRL checks after whole epochs). Reading the KL is a host sync
  per minibatch; without target_kl the update reads nothing back.

Besides the losses, an update logs ``policy/approx_kl``, ``policy/clip_fraction`` and ``policy/explained_variance``
(SB3's, over the rollout), and with the options ``train/lr`` and ``policy/epochs`` (epochs begun).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from jaderl.algos.base import OnPolicyAgent, OnPolicyConfig
from jaderl.algos.hterm import HTermConfig, WithHTerm
from jaderl.core.agent import Hyperparameter
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.config import ConfigError, param
from jaderl.envs.vec import EnvSpec


@dataclasses.dataclass
class PPOConfig(OnPolicyConfig, HTermConfig):
    """PPO settings; the defaults suit small control tasks with a few hundred parallel sub-envs."""

    num_envs: int = param(64, "sub-envs stepped in one batch", low=1)
    horizon: int = param(32, "steps each sub-env takes per rollout", low=1, high=100_000)
    lr: float = param(3e-4, "Adam learning rate", low=0.0, open_low=True)
    num_epochs: int = param(10, "passes over each rollout", low=1)
    minibatch_size: int = param(512, "transitions per gradient step (each epoch reshuffles the rollout and leaves "
                                "out its remainder when the size does not divide it)", low=1)
    clip_ratio: float = param(0.2, "PPO clipping range of the probability ratio", low=0.0, open_low=True)
    gae_lambda: float = param(0.95, "GAE lambda", low=0.0, high=1.0)
    normalize_advantages: bool = param(True, "normalise advantages per minibatch")
    clip_value_loss: float = param(0.0, "clip the critic's new prediction to within this of the rollout's before the "
                                   "value loss, in value units (SB3's clip_range_vf; 0 disables)", low=0.0)
    target_kl: float | None = param(None, "stop an update's epochs at the first minibatch whose approximate KL to the "
                                    "rollout policy exceeds 1.5 * target_kl, before its step (SB3's target_kl; "
                                    "None runs every epoch)", low=0.0, open_low=True)

    def validate(self) -> None:
        super().validate()
        rollout = self.num_envs * max(1, self.workers) * self.horizon  # explorer workers add their rollouts
        if self.minibatch_size > rollout:
            sizes = "num_envs * workers * horizon" if self.workers else "num_envs * horizon"
            raise ConfigError(f"minibatch_size={self.minibatch_size} is larger than a rollout "
                              f"({sizes} = {rollout}); lower it or collect more")
        if self.target_kl is not None and self.learners > 1:
            raise ConfigError(f"target_kl={self.target_kl} cannot be combined with learners={self.learners}: each "
                              "learner would stop at a different minibatch while the others wait for its gradients; "
                              "drop target_kl or use one learner")

    def advantage_batch(self) -> tuple[int, str]:
        return self.minibatch_size, "minibatch_size"  # advantages are standardised per minibatch


def explained_variance(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - Var[target - value] / Var[target] over all elements, with population variances (SB3's
    ``explained_variance``): 1 when the critic predicts its targets exactly, 0 when it does no better than their mean.
    SB3 gives NaN where the targets do not vary; that is 0 here, as a non-finite statistic would stop the run."""
    target_var = target.var(correction=0)
    explained = 1 - (target - value).var(correction=0) / target_var
    return torch.where(target_var > 0, explained, torch.zeros_like(explained))


class PPO(WithHTerm, OnPolicyAgent):
    """PPO for discrete (categorical) and continuous (Gaussian) actions."""

    config_cls = PPOConfig
    compiled_methods = ("act", "explore_action", "minibatch_loss")
    record_keys = ("log_prob",)
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {**OnPolicyAgent.hyperparameters,
                                                           "clip_ratio": Hyperparameter(0.05, 0.5),
                                                           "gae_lambda": Hyperparameter(0.8, 1.0),
                                                           "clip_value_loss": Hyperparameter(0.0, 1.0)}
    config: PPOConfig

    def __init__(self, config: PPOConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.build_actor_critic(config.hidden, critic=True, log_std_init=config.log_std_init)

    def hterm_log_prob(self, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.actor.evaluate(features, action)[0]

    def hterm_actor(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        return self.actor, self.optimizer

    def update(self, buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
        cfg, data = self.config, buffer.data
        schedule = self.begin_update(data)
        # 1. values and GAE for the whole rollout in two batched calls (the old log-probabilities were recorded)
        with torch.no_grad():
            obs, next_obs = self.features(data["obs"]), self.features(data["next_obs"])
            value, next_value = self.critic(obs).squeeze(-1), self.critic(next_obs).squeeze(-1)  # (T, N)
            data["log_prob"] = self.old_log_prob(data)
            buffer.compute_gae(value, next_value, cfg.gamma, cfg.gae_lambda)
            explained = explained_variance(value, data["value_target"])
        batch = {k: v for k, v in buffer.flat().items()
                 if k in ("obs", "action", "log_prob", "value", "advantage", "value_target")}
        size = batch["advantage"].shape[0]
        # 2. minibatch epochs; with target_kl, the first minibatch too far from the rollout policy ends them unstepped
        totals: dict[str, torch.Tensor] = {}
        num_minibatches = epochs = 0
        kl_reached = False
        while epochs < cfg.num_epochs and not kl_reached:
            epochs += 1
            perm = torch.randperm(size, device=self.device)
            for start in range(0, size - cfg.minibatch_size + 1, cfg.minibatch_size):
                loss, mb_stats = self.minibatch_loss({k: v.index_select(0, perm[start:start + cfg.minibatch_size])
                                                      for k, v in batch.items()})
                totals = {k: totals[k] + v for k, v in mb_stats.items()} if totals else mb_stats
                num_minibatches += 1  # the stopping minibatch is averaged in, as in SB3's logs
                if cfg.target_kl is not None and float(mb_stats["policy/approx_kl"]) > 1.5 * cfg.target_kl:
                    kl_reached = True  # a host read: without target_kl, the update reads nothing back
                    break
                self.optimize(self.optimizer, loss)
        self.obs_norm.update(data["obs"])
        stats = {k: v / num_minibatches for k, v in totals.items()}
        stats |= {"policy/explained_variance": explained} | schedule
        if cfg.target_kl is not None:  # epochs begun, the one cut short included (SB3 counts it too)
            stats["policy/epochs"] = torch.full((), float(epochs), device=self.device)
        return stats

    def minibatch_loss(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss L of the module docstring on a minibatch, and its named statistics."""
        cfg = self.config
        features = self.features(mb["obs"])  # again, so that gradients reach an image encoder
        log_prob, entropy = self.actor.evaluate(features, mb["action"])
        log_ratio = log_prob - mb["log_prob"]
        ratio = log_ratio.exp()
        adv = mb["advantage"]
        if cfg.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio) * adv).mean()
        value = self.critic(features).squeeze(-1)
        if cfg.clip_value_loss > 0:  # mb["value"]: the rollout critic's prediction
            value = mb["value"] + (value - mb["value"]).clamp(-cfg.clip_value_loss, cfg.clip_value_loss)
        value_loss = (value - mb["value_target"]).square().mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy.mean()
        with torch.no_grad():
            clip_frac = ((ratio - 1).abs() > cfg.clip_ratio).float().mean()
            approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance KL estimator
            stats = {"loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(),
                     "policy/entropy": entropy.mean().detach(), "policy/approx_kl": approx_kl,
                     "policy/clip_fraction": clip_frac}
        return loss, stats
