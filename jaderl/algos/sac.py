"""SAC: Soft Actor-Critic with an ensemble of critics and a learned entropy coefficient; ModSAC and REDQ as options.

Haarnoja et al. 2018, https://arxiv.org/abs/1801.01290 and https://arxiv.org/abs/1812.05905 (automatic alpha).
The critics are one batched module (:class:`~jaderl.algos.nets.EnsembleQ`, twin critics by default); each step

    1. critic: y = r + gamma (1 - terminated) [min_{i in M} Q_target_i(s', a') - alpha log pi(a'|s')],  a' ~ pi(s')
               M: all critics, or a random subset of ``num_target_critics`` of them per step (REDQ);
               with ``n_step > 1``: the n-step reward sum and gamma^n; with ``use_per``: importance-weighted
    2. actor:  minimise E[alpha log pi(a|s) - reduce_i Q_i(s, a)],  a ~ pi(s) (reparameterised),
               reduce = ``actor_reduce``: min (SAC) or mean (REDQ) over the ensemble
    3. alpha:  minimise E[-log alpha (log pi(a|s) + target_entropy)],  target_entropy = -action_dim
(the target critics are Polyak-averaged after every critic step).

Steps 2 and 3 run on every ``actor_every``-th critic step (every one by default).

REDQ (Chen et al. 2021, https://arxiv.org/abs/2101.05982, Algorithm 1) is the preset ``num_critics=10,
num_target_critics=2, actor_reduce=mean`` with an update-to-data ratio ``updates_per_step=20`` and
``actor_every=20``: twenty critic steps and one actor step per env step. ModSAC (``modsac=True``) adapts how often
the actor learns to how well the critics fit: with c the running mean of the critic loss (an exponential moving
average over about 200 critic steps that starts at sqrt(ln 2), as ElegantRL's ModSAC does) and lambda = exp(-c^2)
in (0, 1], the actor steps only while actor_updates / critic_updates < 1 / (2 - lambda), i.e. on every critic step
when the critics fit well (lambda -> 1), on every second one when they do not (lambda -> 0) and on two of three
before any critic loss is known (lambda = 1/2). c is taken once per
``update`` call; the decision stays on the device: the actor and alpha step every time and a step that is not due is
undone (parameters and optimizer states restored), so the schedule costs no host sync (an undone step still draws
its random numbers).

Only ``terminated`` stops the bootstrap; truncated transitions bootstrap from ``next_obs``.

gSDE (``use_sde``, RL Zoo's SAC entries for BipedalWalker and the PyBullet tasks) explores with noise that is a
linear function of the policy's last hidden layer, its weights drawn per sub-env at the start of every explore()
call (every ``horizon`` env steps) and every ``sde_sample_freq`` steps (:class:`~jaderl.algos.nets.TanhSDEActor`);
the losses above read the same per-state distribution.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch
from torch import nn

from jaderl.algos.base import OffPolicyAgent, OffPolicyConfig, SDEConfig, SDEExploration
from jaderl.algos.hterm import HTermConfig, WithHTerm, tanh_gaussian_log_prob
from jaderl.algos.nets import EnsembleQ, TanhGaussianActor, TanhSDEActor, Temperature
from jaderl.core.buffers import ReplayBuffer
from jaderl.core.config import ConfigError, param
from jaderl.envs.vec import EnvSpec


@dataclasses.dataclass
class SACConfig(SDEConfig, OffPolicyConfig, HTermConfig):
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
    actor_every: int = param(1, "one actor and alpha step per this many critic steps (REDQ: 20, i.e. one per env "
                             "step at 20 updates per step)", low=1)
    init_alpha: float = param(1.0, "initial entropy coefficient", low=0.0, open_low=True)
    log_std_init: float = param(-3.0, "gSDE (use_sde): initial log std of the noise weights (SB3's SAC: -3)")

    def validate(self) -> None:
        super().validate()
        if self.modsac and self.actor_every > 1:
            raise ConfigError(f"modsac=true schedules the actor's steps itself, so actor_every={self.actor_every} "
                              "cannot apply; leave actor_every at 1 or set modsac=false")
        if self.actor_reduce not in ("min", "mean"):
            raise ConfigError(f"actor_reduce={self.actor_reduce!r} is invalid: use min or mean")
        if self.num_target_critics > self.num_critics:
            raise ConfigError(f"num_target_critics={self.num_target_critics} is larger than "
                              f"num_critics={self.num_critics}; lower it or add critics")


class SAC(WithHTerm, SDEExploration, OffPolicyAgent):
    """SAC, ModSAC and REDQ for continuous actions."""

    config_cls = SACConfig
    compiled_methods = ("act", "critic_loss", "actor_loss")
    config: SACConfig

    def __init__(self, config: SACConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.actor: TanhGaussianActor | TanhSDEActor = (
            TanhSDEActor(self.obs_dim, self.action_dim, config.hidden, config.log_std_init) if config.use_sde
            else TanhGaussianActor(self.obs_dim, self.action_dim, config.hidden)).to(device)
        self.critic = EnsembleQ(self.obs_dim, self.action_dim, config.hidden, config.num_critics).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.alpha = Temperature(config.init_alpha).to(device)
        self.actor_optimizer = self.adam(self.actor.parameters(), lr=config.lr)
        self.critic_optimizer = self.adam([*self.encoder_parameters(), *self.critic.parameters()], lr=config.lr)
        self.alpha_optimizer = self.adam(self.alpha.parameters(), lr=config.lr)
        self.target_entropy = -float(self.action_dim)
        self.critic_updates = 0
        self._actor_updates = torch.zeros((), dtype=torch.float64, device=device)  # on the device: ModSAC adds a bool
        zero = torch.zeros((), device=device)
        self._actor_stats = {"loss/actor": zero, "policy/entropy": zero}  # the latest actor step's
        # ModSAC's running critic loss c, from sqrt(ln 2): lambda = 1/2 until the critics' loss is known; and the value
        # the current update() call uses
        self._critic_loss_ema = torch.full((), math.sqrt(math.log(2.0)), device=device)
        self._critic_loss_seen = torch.zeros((), dtype=torch.float64, device=device)

    @classmethod
    def accepts(cls, spec: EnvSpec) -> str | None:
        return "its actions are discrete; use sac_discrete" if spec.is_discrete else super().accepts(spec)

    def networks(self) -> dict[str, nn.Module]:
        return super().networks() | {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target,
                                     "alpha": self.alpha}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer, "alpha": self.alpha_optimizer}

    def running_stats(self) -> dict[str, nn.Module | torch.Tensor]:
        return super().running_stats() | {"critic_loss_ema": self._critic_loss_ema}  # ModSAC resumes its schedule

    def counters(self) -> dict[str, int | float]:
        return super().counters() | {"critic_updates": self.critic_updates, "actor_updates": self.actor_updates}

    def load_counters(self, counters: dict[str, Any]) -> None:
        super().load_counters(counters)
        self.critic_updates = int(counters["critic_updates"])
        self._actor_updates.fill_(counters["actor_updates"])

    @property
    def critic_loss_avg(self) -> float:
        """ModSAC's running mean critic loss c as the current ``update`` call uses it (reading it syncs)."""
        return self._critic_loss_seen.item()

    @critic_loss_avg.setter
    def critic_loss_avg(self, value: float) -> None:
        self._critic_loss_seen.fill_(value)

    @property
    def actor_updates(self) -> int:
        """Actor steps taken (kept on the device; reading it syncs, so only checkpoints, logs and tests do)."""
        return int(self._actor_updates.item())

    def hterm_log_prob(self, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        if isinstance(self.actor, TanhSDEActor):
            return self.actor.log_prob(features, action)
        return tanh_gaussian_log_prob(self.actor, features, action)

    def hterm_actor(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        return self.actor, self.actor_optimizer

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        if deterministic:
            return self.actor(x)
        return self.actor.explore(x) if isinstance(self.actor, TanhSDEActor) else self.actor.sample(x)[0]

    def update(self, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        if self.config.modsac:
            self._critic_loss_seen.copy_(self._critic_loss_ema)  # on the device: no sync
        return super().update(buffer)

    @torch.no_grad()
    def td_target(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
        """The soft Bellman target y (B,) of step 1 in the module docstring."""
        cfg = self.config
        next_obs = self.features(batch["next_obs"])  # images: the online encoder's features, as in DrQ-v2 (the
        next_action, next_log_prob = self.actor.sample(next_obs)  # target critics are heads on those features)
        members = None  # REDQ: only the random subset of target critics is evaluated
        if 0 < cfg.num_target_critics < cfg.num_critics:
            members = torch.randperm(cfg.num_critics, device=self.device)[:cfg.num_target_critics]
        next_q = self.critic_target(next_obs, next_action, members)  # (M, B)
        soft_value = next_q.min(0).values - alpha * next_log_prob
        return batch["reward"] + batch["discount"] * (~batch["terminated"]) * soft_value

    def critic_loss(self, obs: torch.Tensor, batch: dict[str, torch.Tensor],
                    alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The critics' loss of step 1 for features ``obs`` (B, obs_dim) and the TD errors (E, B)."""
        td_error = self.critic(obs, batch["action"]) - self.td_target(batch, alpha)  # (E, B)
        return self.weighted_mean(td_error.square().sum(0), batch), td_error.detach()

    def actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's loss of step 2 and the log-probabilities (B,) of its reparameterised actions."""
        action, log_prob = self.actor.sample(obs)
        q = self.critic(obs, action, frozen=True)  # gradients reach the action, not the critics
        value = q.min(0).values if self.config.actor_reduce == "min" else q.mean(0)
        return (alpha * log_prob - value).mean(), log_prob.detach()

    def update_once(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step of the critics on a sampled batch (B, ...), then of the actor and alpha when due."""
        cfg = self.config
        obs = self.features(batch["obs"])
        alpha = self.alpha().detach()
        # 1. critic
        critic_loss, td_error = self.critic_loss(obs, batch, alpha)
        self.optimize(self.critic_optimizer, critic_loss)
        self.soft_update(self.critic_target, self.critic, cfg.tau)
        self.critic_updates += 1
        if cfg.modsac:
            self._critic_loss_ema.lerp_(critic_loss.detach() / cfg.num_critics, 0.005)
        if self.critic_updates % cfg.actor_every == 0:  # a host-side count: no sync
            self.actor_step(obs, alpha)
        stats = {"loss/critic": critic_loss.detach(), "alpha": alpha, **self._actor_stats}
        return stats, td_error.abs().mean(0)

    def actor_step(self, obs: torch.Tensor, alpha: torch.Tensor) -> None:
        """Steps 2 and 3 of the module docstring on features ``obs`` (B, obs_dim), after a critic step; ModSAC undoes
        them where its schedule did not call for them."""
        cfg = self.config
        due: torch.Tensor | None = None
        if cfg.modsac:
            fit = torch.exp(-self._critic_loss_seen.square())  # lambda, in float64 as the schedule's counters
            due = (self._actor_updates < self.critic_updates / (2.0 - fit)).squeeze(0)  # a bool on the device
            saved = self._actor_state()
        # 2. actor (gradients reach the actor's parameters only)
        actor_loss, log_prob = self.actor_loss(obs, alpha)
        self.optimize(self.actor_optimizer, actor_loss, list(self.actor.parameters()))
        # 3. entropy coefficient
        alpha_loss = -(self.alpha.log_alpha * (log_prob + self.target_entropy)).mean()
        self.optimize(self.alpha_optimizer, alpha_loss)
        actor_stats = {"loss/actor": actor_loss.detach(), "policy/entropy": -log_prob.mean()}
        if due is None:
            self._actor_updates += 1
            self._actor_stats = actor_stats
        else:  # undo the actor and alpha steps that ModSAC's schedule did not call for
            self._restore_where_not(due, saved)
            self._actor_updates += due
            self._actor_stats = {k: torch.where(due, v, self._actor_stats[k]) for k, v in actor_stats.items()}

    def _actor_tensors(self) -> list[torch.Tensor]:
        """The actor's and alpha's parameters and their optimizers' state tensors (created if not yet stepped)."""
        tensors: list[torch.Tensor] = [*self.actor.parameters(), self.alpha.log_alpha]
        for optimizer in (self.actor_optimizer, self.alpha_optimizer):
            for group in optimizer.param_groups:
                for p in group["params"]:
                    state = optimizer.state[p]
                    if not state:  # as Adam creates them at its first step, so that a restored state is fresh
                        state.update(step=torch.zeros((), dtype=torch.float32, device=p.device),
                                     exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                                     exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))
                    tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return tensors

    def _actor_state(self) -> list[torch.Tensor]:
        return [t.detach().clone() for t in self._actor_tensors()]

    @torch.no_grad()
    def _restore_where_not(self, due: torch.Tensor, saved: list[torch.Tensor]) -> None:
        for tensor, old in zip(self._actor_tensors(), saved, strict=True):
            tensor.copy_(torch.where(due, tensor, old))
