"""TD3: Twin Delayed DDPG; DDPG is its preset with one critic, no delay and no target smoothing.

Fujimoto et al. 2018, https://arxiv.org/abs/1802.09477 (TD3); Lillicrap et al. 2015, https://arxiv.org/abs/1509.02971
(DDPG). A deterministic tanh actor mu(s) and ``num_critics`` critics as one batched module
(:class:`~jaderl.algos.nets.EnsembleQ`); each gradient step

    1. critic: y = r + gamma (1 - terminated) min_i Q_target_i(s', a'),
               a' = clip(mu_target(s') + clip(eps, -noise_clip, noise_clip), -1, 1),  eps ~ N(0, target_noise^2)
       and minimise sum_i (Q_i(s, a) - y)^2                       (clipped double-Q with target policy smoothing)
    2. every ``policy_delay``-th critic step only: actor: minimise -Q_1(s, mu(s)) (deterministic policy gradient),
       then Polyak-average the target actor and target critics.

Exploration adds Gaussian noise N(0, exploration_noise^2), or Ornstein-Uhlenbeck noise per sub-env (``noise="ou"``),
to mu(s) after ``warmup_steps`` of uniformly random actions. DDPG (``ddpg`` in the registry) is ``num_critics=1,
policy_delay=1, target_noise=0``. Only ``terminated`` stops the bootstrap; truncated steps bootstrap from ``next_obs``.
``n_step`` and ``use_per`` (n-step returns, prioritized replay) come from the shared off-policy base.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn

from jaderl.algos.base import OffPolicyAgent, OffPolicyConfig
from jaderl.algos.hterm import HTermConfig, WithHTerm
from jaderl.algos.nets import EnsembleQ
from jaderl.core.agent import Hyperparameter
from jaderl.core.config import ConfigError, param
from jaderl.core.nets import mlp
from jaderl.envs.vec import EnvSpec

NOISE_KINDS = ("gaussian", "ou")

DDPG_PRESET = {"num_critics": 1, "policy_delay": 1, "target_noise": 0.0}
"""The settings that turn TD3 into DDPG (registered as ``ddpg``)."""


@dataclasses.dataclass
class TD3Config(OffPolicyConfig, HTermConfig):
    """TD3 settings; the defaults follow the paper (Fujimoto et al. 2018, appendix C)."""

    hterm_every: int = param(64, "H-term: one H-term update per this many iterations (here: env steps "
                             "with horizon=1, i.e. ~64 gradient steps)", low=1)

    lr: float = param(1e-3, "Adam learning rate of actor and critics", low=0.0, open_low=True)
    tau: float = param(0.005, "Polyak averaging rate of the target actor and critics", low=0.0, high=1.0,
                       open_low=True)
    num_critics: int = param(2, "critics in the ensemble; the target takes their minimum (1: DDPG)", low=1)
    policy_delay: int = param(2, "critic steps per actor and target update (1: DDPG)", low=1)
    target_noise: float = param(0.2, "std of the Gaussian noise smoothing the target action (0: DDPG)", low=0.0)
    noise_clip: float = param(0.5, "the target smoothing noise is clipped to [-noise_clip, noise_clip]", low=0.0)
    noise: str = param("gaussian", "exploration noise: gaussian or ou (Ornstein-Uhlenbeck, per sub-env)")
    exploration_noise: float = param(0.1, "std of the Gaussian exploration noise (noise=gaussian)", low=0.0)
    ou_theta: float = param(0.15, "OU mean-reversion rate per env step (noise=ou)", low=0.0, high=1.0,
                            open_low=True)
    ou_sigma: float = param(0.2, "OU noise scale per env step (noise=ou); stationary std "
                            "ou_sigma / sqrt(ou_theta (2 - ou_theta))", low=0.0)

    def validate(self) -> None:
        super().validate()
        if self.noise not in NOISE_KINDS:
            raise ConfigError(f"noise={self.noise!r} is invalid: use {' or '.join(NOISE_KINDS)}")


class TD3(WithHTerm, OffPolicyAgent):
    """TD3 and DDPG for continuous actions."""

    config_cls = TD3Config
    compiled_methods = ("act", "critic_loss", "actor_loss")
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {**OffPolicyAgent.hyperparameters,
                                                           "exploration_noise": Hyperparameter(0.0, 1.0),
                                                           "target_noise": Hyperparameter(0.0, 1.0)}
    config: TD3Config

    @classmethod
    def live_hyperparameters(cls, config: TD3Config, spec: EnvSpec) -> dict[str, Hyperparameter]:
        """The mutable hyperparameters that a population searches under ``config``: not ``target_noise`` where it is
        0 (DDPG): perturbing 0 leaves it 0, and a fresh draw would turn DDPG's target into TD3's smoothed one; nor
        ``exploration_noise`` under ``noise="ou"``, which explores with ``ou_sigma`` and ``ou_theta``."""
        unused = {"target_noise"} if config.target_noise == 0 else set()
        return {k: h for k, h in cls.hyperparameters.items()
                if k not in unused | ({"exploration_noise"} if config.noise == "ou" else set())}

    def __init__(self, config: TD3Config, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.actor = nn.Sequential(mlp([self.obs_dim, *config.hidden, self.action_dim]), nn.Tanh()).to(device)
        self.critic = EnsembleQ(self.obs_dim, self.action_dim, config.hidden, config.num_critics).to(device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = self.adam(self.actor.parameters(), lr=config.lr)
        self.critic_optimizer = self.adam([*self.encoder_parameters(), *self.critic.parameters()], lr=config.lr)
        self.num_updates = 0  # critic steps taken; the actor steps on every policy_delay-th
        self.ou_noise = torch.zeros(self.num_envs, self.action_dim, device=device)  # (N, action_dim)
        self.actor_loss_value: torch.Tensor | None = None  # the latest, reported between delayed actor steps

    @classmethod
    def accepts(cls, spec: EnvSpec) -> str | None:
        return "its actions are discrete; use dqn or sac_discrete" if spec.is_discrete else super().accepts(spec)

    def networks(self) -> dict[str, nn.Module]:
        return super().networks() | {"actor": self.actor, "critic": self.critic, "actor_target": self.actor_target,
                                     "critic_target": self.critic_target}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    def counters(self) -> dict[str, int | float]:
        return super().counters() | {"num_updates": self.num_updates}

    def load_counters(self, counters: dict[str, Any]) -> None:
        super().load_counters(counters)
        self.num_updates = int(counters["num_updates"])

    def state_dict(self) -> dict[str, Any]:
        # the OU noise of every sub-env, which goes on with the episodes a resumed run continues (torch-native envs);
        # not a running statistic: data-parallel learners each keep their own
        # and the latest actor loss, which the updates report until the next delayed actor step
        loss = {} if self.actor_loss_value is None else {"actor_loss_value": self.actor_loss_value.clone()}
        return super().state_dict() | ({"ou_noise": self.ou_noise.clone()} if self.config.noise == "ou" else {}) | loss

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "ou_noise" in state and state["ou_noise"].shape == self.ou_noise.shape:
            self.ou_noise = state["ou_noise"].to(self.device, copy=True)
        if "actor_loss_value" in state:
            self.actor_loss_value = state["actor_loss_value"].to(self.device, copy=True)

    def hterm_log_prob(self, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The Gaussian log-likelihood of the exploration noise around mu(s), up to a constant: its std is
        ``exploration_noise`` (OU noise: its stationary std), at least 0.05, so that a small noise cannot scale the
        H-term's gradient up by orders of magnitude (warm-up actions lie far from mu(s))."""
        cfg = self.config
        std = cfg.ou_sigma / (cfg.ou_theta * (2 - cfg.ou_theta)) ** 0.5 if cfg.noise == "ou" else cfg.exploration_noise
        return -(action - self.actor(features)).square().sum(-1) / (2 * max(std, 0.05) ** 2)

    def hterm_actor(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        return self.actor, self.actor_optimizer

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """mu(obs): the policy is deterministic either way; ``explore_action`` adds the exploration noise."""
        return self.actor(self.features(obs))

    def noisy_action(self, obs: torch.Tensor) -> torch.Tensor:
        return (self.act(obs) + self.exploration_noise()).clamp(-1.0, 1.0)

    def exploration_noise(self) -> torch.Tensor:
        """Noise (N, action_dim) for the next action of every sub-env."""
        cfg = self.config
        white = torch.randn(self.num_envs, self.action_dim, device=self.device)
        if cfg.noise == "gaussian":
            return cfg.exploration_noise * white
        # OU, discretised with dt = 1 env step: x <- x - theta x + sigma eps, restarted from 0 in every new episode.
        # explore() passes no done flag, but the base class's running episode length is 0 exactly when a sub-env is
        # about to take the first step of an episode (the first call, or after an auto-reset), so that is the reset
        # mask. A run resumed on envs that restart their episodes zeroes this count, hence the noise too; one whose
        # episodes go on (torch-native envs) takes the noise from its checkpoint (state_dict).
        new_episode = self.episodes.new_episode().unsqueeze(-1)  # (N, 1)
        self.ou_noise = torch.where(new_episode, 0.0, self.ou_noise)
        self.ou_noise += cfg.ou_sigma * white - cfg.ou_theta * self.ou_noise
        return self.ou_noise

    def target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        """a' = mu_target(s') plus clipped Gaussian noise (target policy smoothing), in [-1, 1]: (B, action_dim)."""
        cfg = self.config
        action = self.actor_target(next_obs)
        if cfg.target_noise == 0:
            return action
        noise = (torch.randn_like(action) * cfg.target_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
        return (action + noise).clamp(-1.0, 1.0)

    @torch.no_grad()
    def td_target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """y = r + discount (1 - terminated) min_i Q_target_i(s', a') for a batch (B, ...): (B,).

        ``discount`` is gamma, or gamma^k for an n-step transition whose ``reward`` sums k discounted rewards."""
        next_obs = self.features(batch["next_obs"])  # images: the online encoder's, as in DrQ-v2 (see SAC)
        next_q = self.critic_target(next_obs, self.target_action(next_obs)).min(0).values
        return batch["reward"] + batch["discount"] * (~batch["terminated"]) * next_q

    def critic_loss(self, obs: torch.Tensor,
                    batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The critics' loss of step 1 (importance-weighted under prioritized replay) for features ``obs``
        (B, obs_dim), their values Q_i(s, a) (E, B) and the TD errors (E, B)."""
        q = self.critic(obs, batch["action"])  # (E, B)
        td_error = q - self.td_target(batch)
        return self.weighted_mean(td_error.square().sum(0), batch), q.detach(), td_error.detach()

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """-Q_1(s, mu(s)): the first critic only, as a constant (gradients reach the actor's actions)."""
        return -self.critic(obs, self.actor(obs), members=0, frozen=True).mean()

    def update_once(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One critic step on a sampled batch (B, ...); the actor and targets step when ``policy_delay`` says so.
        Returns the statistics and the TD errors (B,) (mean over critics) for prioritized replay."""
        cfg = self.config
        obs = self.features(batch["obs"])
        # 1. critics (importance-weighted under prioritized replay)
        critic_loss, q, td_error = self.critic_loss(obs, batch)
        self.optimize(self.critic_optimizer, critic_loss)
        self.num_updates += 1
        # 2. delayed actor (gradients reach the actor's parameters only) and targets
        if self.num_updates % cfg.policy_delay == 0:
            actor_loss = self.actor_loss(obs)
            self.optimize(self.actor_optimizer, actor_loss, list(self.actor.parameters()))
            self.soft_update(self.actor_target, self.actor, cfg.tau)
            self.soft_update(self.critic_target, self.critic, cfg.tau)
            self.actor_loss_value = actor_loss.detach()
        stats = {"loss/critic": critic_loss.detach(), "q/mean": q.mean()}
        if self.actor_loss_value is not None:
            stats["loss/actor"] = self.actor_loss_value
        return stats, td_error.abs().mean(0)
