"""The H-term add-on: an extra policy update that lowers the Hamiltonian ("energy") of sampled trajectories.

ElegantRL's H-term (see docs/algorithms.md) rewrites the Bellman equation variationally so that a good policy is a
minimum-energy state of the system, and adds one policy update per ``hterm_every`` learner updates that works on
whole trajectory segments instead of single transitions. jaderl implements it as follows. From the agent's own
data (replay buffer or latest rollout), take L = ``hterm_trajectories`` segments of K = ``hterm_length``
consecutive steps of one sub-env from its newest ``hterm_window`` steps (the current rollout for on-policy
algorithms), cut at the first episode end (steps after it are masked out). The energy of
segment l is minus its discounted return, E_l = -G_l with G_l = sum_k gamma^k r_k^l, and the H-term objective is

    L_H(theta) = 1/L sum_l  e_l * 1/K_l sum_k log pi_theta(a_k^l | s_k^l),   e_l = (E_l - mean E) / (std E + 1e-8),

(K_l: the segment's steps before its cut), whose gradient lowers the likelihood of high-energy (low-return) segments
and raises that of low-energy ones, i.e. a trajectory-level policy-gradient step with a normalised-return baseline,
per step so that its scale does not grow with K; it is scaled by ``hterm_coef`` and stepped with the actor's
optimizer. For deterministic actors (TD3, DDPG), log pi is the Gaussian log-likelihood of the
exploration noise, -|a - mu(s)|^2 / (2 sigma^2) with sigma = ``exploration_noise``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch

from jaderl.core.buffers import Batch, ReplayBuffer
from jaderl.core.config import param


@dataclasses.dataclass
class HTermConfig:
    """Settings of the H-term add-on, mixed into the configs of the algorithms that support it."""

    use_hterm: bool = param(False, "add the H-term policy update (Hamiltonian of L sampled K-step trajectories)")
    hterm_trajectories: int = param(64, "H-term: trajectory segments per update (L)", low=2)
    hterm_length: int = param(16, "H-term: steps per trajectory segment (K)", low=1)
    hterm_coef: float = param(0.1, "H-term: weight of its objective", low=0.0, open_low=True)
    hterm_every: int = param(1, "H-term: one H-term update per this many iterations (explore + update)", low=1)
    hterm_window: int = param(1_000, "H-term: segments come from the newest this many steps of each sub-env "
                              "(off-policy buffers; a rollout is used whole)", low=1)


def sample_segments(data: Batch, num: int, length: int, oldest: int = 0, size: int | None = None) -> Batch:
    """``num`` random segments (L, K, ...) of ``length`` consecutive rows of one sub-env from (T, N, ...) tensors.

    Rows are read in time order starting ``oldest`` (a circular buffer's oldest row) over ``size`` stored rows.
    """
    rows, num_envs = next(iter(data.values())).shape[:2]
    size = rows if size is None else size
    device = next(iter(data.values())).device
    start = torch.randint(max(size - length, 0) + 1, (num,), device=device)
    steps = torch.arange(min(length, size), device=device)
    t = (oldest + start[:, None] + steps) % rows  # (L, K)
    n = torch.randint(num_envs, (num, 1), device=device).expand_as(t)
    return {k: v[t, n] for k, v in data.items() if k in ("obs", "action", "reward", "terminated", "truncated")}


def hterm_loss(log_prob: torch.Tensor, segments: Batch, gamma: float) -> torch.Tensor:
    """L_H of the module docstring from per-step log-probabilities (L, K) of the segments' actions."""
    done = segments["terminated"] | segments["truncated"]
    # a step counts while no earlier step of its segment ended an episode
    alive = torch.cumprod(torch.cat([torch.ones_like(done[:, :1]), ~done[:, :-1]], 1).float(), 1)
    discount = gamma ** torch.arange(done.shape[1], device=done.device, dtype=torch.float32)
    energy = -(segments["reward"] * discount * alive).sum(1)  # (L,)
    energy = (energy - energy.mean()) / (energy.std() + 1e-8)
    return (energy * (log_prob * alive).sum(1) / alive.sum(1)).mean()


class WithHTerm:
    """The H-term, added to an algorithm's ``update`` by inheriting it first: ``class PPO(WithHTerm, OnPolicyAgent)``.

    The algorithm states the log-likelihood its H-term uses (:meth:`hterm_log_prob`) and the actor and optimizer it
    steps (:meth:`hterm_actor`); after every update that learned, one H-term step runs when it is due
    (``use_hterm``, every ``hterm_every`` iterations) on segments of the update's data: the rollout, or the newest
    ``hterm_window`` rows of the replay buffer. The hook is installed on each algorithm class that inherits this, so
    the algorithm's ``update`` stays its own maths; a subclass whose ``update`` calls ``super().update(buffer)`` still
    gets one H-term step per update, after its own.
    """

    config: Any
    steps: int
    num_envs: int
    _hterm_updating: bool = False
    """Whether a hooked ``update`` of this agent is running (a nested one, reached by ``super().update``, adds no
    H-term step)."""

    def hterm_log_prob(self, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) (B,) of stored actions under the current policy (features from ``features(obs)``)."""
        raise NotImplementedError

    def hterm_actor(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The actor the H-term steps and the optimizer it steps it with."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The hook: the algorithm's ``update`` (its own, or the one it inherits) is followed by :meth:`hterm_after`."""
        super().__init_subclass__(**kwargs)
        update = cls.update  # type: ignore[attr-defined]
        if getattr(update, "runs_hterm", False):  # a subclass of an algorithm that has it already
            return

        @functools.wraps(update)
        def update_then_hterm(self: WithHTerm, buffer: Any) -> dict[str, torch.Tensor]:
            # an override's super().update() reaches the hooked update it overrides: only the outermost call steps
            if self._hterm_updating:
                return update(self, buffer)
            self._hterm_updating = True
            try:
                stats = update(self, buffer)
            finally:
                self._hterm_updating = False
            return self.hterm_after(buffer, stats)

        update_then_hterm.runs_hterm = True  # type: ignore[attr-defined]
        cls.update = update_then_hterm  # type: ignore[attr-defined]

    def hterm_after(self, buffer: Any, stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One H-term step after an update that learned, when it is due; its loss joins the statistics."""
        if not stats or not self.config.use_hterm:
            return stats
        replay = isinstance(buffer, ReplayBuffer)  # a circular buffer: rows in time order from its oldest
        loss = self.hterm_step(buffer.data, buffer.ptr - buffer.size if replay else 0, buffer.size if replay else None)
        return stats if loss is None else {**stats, "loss/hterm": loss}

    def hterm_step(self, data: Batch, oldest: int = 0, size: int | None = None) -> torch.Tensor | None:
        """One H-term step on segments of ``data`` (T, N, ...) when it is due; returns its loss, or None."""
        cfg = self.config
        # this is iteration k once its explore added horizon * num_envs steps; data-parallel learners count the
        # steps of all K learners after each update, (k - 1) K horizon num_envs + horizon num_envs by now: rounding
        # up gives k
        iteration = -(-self.steps // (cfg.horizon * self.num_envs * cfg.learners))
        if iteration % cfg.hterm_every:
            return None
        if size is not None and size > cfg.hterm_window:  # recent behaviour only: skip the buffer's older rows
            oldest, size = oldest + size - cfg.hterm_window, cfg.hterm_window
        segments = sample_segments(data, cfg.hterm_trajectories, cfg.hterm_length, oldest, size)
        num, length = segments["reward"].shape
        features = self.features(segments["obs"].flatten(0, 1))  # type: ignore[attr-defined]
        log_prob = self.hterm_log_prob(features, segments["action"].flatten(0, 1)).view(num, length)
        loss = cfg.hterm_coef * hterm_loss(log_prob, segments, cfg.gamma)
        actor, optimizer = self.hterm_actor()
        self.optimize(optimizer, loss, list(actor.parameters()))  # type: ignore[attr-defined]
        return loss.detach()


def tanh_gaussian_log_prob(actor: torch.nn.Module, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) (B,) of stored actions a in (-1, 1) under a :class:`~jaderl.algos.nets.TanhGaussianActor`."""
    mean, log_std = actor.net(features).chunk(2, -1)
    log_std = log_std.clamp(-5.0, 2.0)
    action = action.clamp(-1 + 1e-3, 1 - 1e-3)  # saturated actions would give atanh -> inf
    u = torch.atanh(action)
    normal = -0.5 * ((u - mean) * (-log_std).exp()).square() - log_std - 0.5 * math.log(2 * math.pi)
    return (normal - torch.log1p(-action.square())).sum(-1)
