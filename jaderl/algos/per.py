"""Prioritized experience replay on the training device."""

from __future__ import annotations

import torch

from jaderl.core.buffers import Batch, ReplayBuffer


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016, https://arxiv.org/abs/1511.05952) on the device.

    Transition i is drawn with P(i) = p_i^alpha / sum_k p_k^alpha from a sum tree (one float64 tensor, leaves at
    ``[leaves, 2 * leaves)``), always for a whole batch, never per item: a write sets the leaves and adds each
    changed leaf's difference to all of its ancestors in one scatter-add; a draw takes two binary searches, one in
    the prefix sums of the nodes ``span_levels`` above the leaves, one in the prefix sums of the (at most
    ``2 ** span_levels``) leaves under the node it found. New transitions get the largest priority seen so far;
    ``update_priorities`` sets p_i = |td_error_i| + eps. Batches carry ``index`` and the importance-sampling
    ``weight`` w_i = (n P(i))^-beta / max_batch w (n: stored items).
    """

    span_levels = 8
    """A draw's first search runs over the tree level this many levels above the leaves (its nodes hold up to 256
    leaves each), its second over the leaves of one such node."""

    def __init__(self, capacity: int, num_envs: int, device: torch.device | str, alpha: float,
                 eps: float = 1e-6) -> None:
        super().__init__(capacity, num_envs, device)
        self.alpha, self.eps = alpha, eps
        self.depth = max(1, (self.rows * num_envs - 1).bit_length())
        self.leaves = 1 << self.depth
        self.tree = torch.zeros(2 * self.leaves, dtype=torch.float64, device=self.device)  # sums need float64
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)
        self._levels_up = torch.arange(1, self.depth + 1, device=self.device)[:, None]  # node >> k: its ancestors

    def add(self, traj: Batch) -> None:
        start, horizon = self.ptr, min(next(iter(traj.values())).shape[0], self.rows)
        super().add(traj)
        rows = (start + torch.arange(horizon, device=self.device)) % self.rows
        idx = (rows[:, None] * self.num_envs + torch.arange(self.num_envs, device=self.device)).flatten()
        self._set(idx, self.max_priority.pow(self.alpha).expand(idx.shape[0]))

    def _set(self, idx: torch.Tensor, value: torch.Tensor) -> None:
        """Leaves ``idx`` (B,) := ``value`` (B,); a repeated index is written once and its change counted once."""
        node, order = (idx + self.leaves).sort()
        old = self.tree[node]
        self.tree[node] = value[order].to(self.tree.dtype)
        first = torch.ones_like(node, dtype=torch.bool)
        first[1:] = node[1:] != node[:-1]  # sorted: the first copy of every index
        change = (self.tree[node] - old) * first
        ancestors = node >> self._levels_up  # (depth, B): parents, grandparents ... the root
        self.tree.index_put_((ancestors.flatten(),), change.expand(self.depth, -1).flatten(), accumulate=True)

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99, beta: float = 1.0) -> Batch:
        total = self.tree[1]
        # stratified: one uniform draw in each of batch_size equal slices of the total priority mass
        mass = (torch.arange(batch_size, device=self.device) + torch.rand(batch_size, device=self.device,
                                                                          dtype=torch.float64)) / batch_size * total
        # 1. the node k of level `top` whose share of the prefix sums holds the mass (right=True skips empty nodes)
        span = min(self.span_levels, self.depth)
        top = self.depth - span
        level = self.tree[1 << top:2 << top].cumsum(0)
        k = torch.searchsorted(level, mass, right=True).clamp_(max=(1 << top) - 1)
        mass = mass - torch.where(k > 0, level[(k - 1).clamp(min=0)], 0.0)
        # 2. the leaf under node k whose share holds what is left of the mass
        leaf = (k << span).unsqueeze(1) + torch.arange(1 << span, device=self.device)  # (B, 2 ** span)
        below = self.tree[leaf + self.leaves].cumsum(1)
        pos = torch.searchsorted(below, mass.unsqueeze(1), right=True).clamp_(max=(1 << span) - 1)
        idx = leaf.gather(1, pos).squeeze(1).clamp(max=self.size * self.num_envs - 1)  # round-off at the right edge
        weight = (self.size * self.num_envs * self.tree[idx + self.leaves] / total).pow(-beta)
        batch = self.gather(idx, n_step, gamma)
        batch["index"], batch["weight"] = idx, (weight / weight.max()).float()
        return batch

    def update_priorities(self, idx: torch.Tensor, td_error: torch.Tensor) -> None:
        priority = td_error.detach().abs().double() + self.eps
        self.max_priority = torch.maximum(self.max_priority, priority.max())
        self._set(idx, priority.pow(self.alpha))

    def state_dict(self) -> tuple[Batch, dict]:
        tensors, meta = super().state_dict()
        return {**tensors, "_tree": self.tree, "_max_priority": self.max_priority}, meta

    def load_state_dict(self, tensors: Batch, meta: dict, cut_episodes: bool = True) -> None:
        tensors = dict(tensors)
        tree, max_priority = tensors.pop("_tree"), tensors.pop("_max_priority")
        super().load_state_dict(tensors, meta, cut_episodes)
        self.tree.copy_(tree)
        self.max_priority = max_priority.to(self.device)
