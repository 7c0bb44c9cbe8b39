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
import math
from collections.abc import Callable

import torch

from jaderl.core.config import param

Batch = dict[str, torch.Tensor]


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


def hterm_update(agent: object, data: Batch, log_prob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 actor: torch.nn.Module, optimizer: torch.optim.Optimizer, oldest: int = 0,
                 size: int | None = None) -> torch.Tensor | None:
    """One H-term step of ``actor`` on segments of ``data`` when it is due (every ``hterm_every`` iterations);
    ``log_prob_fn(features, action)`` gives log pi (B,). Returns the H-term loss, or None when not due."""
    cfg = agent.config  # type: ignore[attr-defined]
    # this is iteration k once its explore added horizon * num_envs steps; data-parallel learners count the steps
    # of all K learners after each update, (k - 1) K horizon num_envs + horizon num_envs by now: rounding up gives k
    iteration = -(-agent.steps // (cfg.horizon * agent.num_envs * cfg.learners))  # type: ignore[attr-defined]
    if not cfg.use_hterm or iteration % cfg.hterm_every:
        return None
    if size is not None and size > cfg.hterm_window:  # recent behaviour only: skip the buffer's older rows
        oldest, size = oldest + size - cfg.hterm_window, cfg.hterm_window
    segments = sample_segments(data, cfg.hterm_trajectories, cfg.hterm_length, oldest, size)
    num, length = segments["reward"].shape
    features = agent.features(segments["obs"].flatten(0, 1))  # type: ignore[attr-defined]
    log_prob = log_prob_fn(features, segments["action"].flatten(0, 1)).view(num, length)
    loss = cfg.hterm_coef * hterm_loss(log_prob, segments, cfg.gamma)
    agent.optimize(optimizer, loss, list(actor.parameters()))  # type: ignore[attr-defined]
    return loss.detach()


def tanh_gaussian_log_prob(actor: torch.nn.Module, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) (B,) of stored actions a in (-1, 1) under a :class:`~jaderl.core.nets.TanhGaussianActor`."""
    mean, log_std = actor.net(features).chunk(2, -1)
    log_std = log_std.clamp(-5.0, 2.0)
    action = action.clamp(-1 + 1e-3, 1 - 1e-3)  # saturated actions would give atanh -> inf
    u = torch.atanh(action)
    normal = -0.5 * ((u - mean) * (-log_std).exp()).square() - log_std - 0.5 * math.log(2 * math.pi)
    return (normal - torch.log1p(-action.square())).sum(-1)
