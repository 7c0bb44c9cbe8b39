"""Device-resident buffers: a circular replay buffer of (T, N, ...) tensors and a rollout buffer with GAE."""

from __future__ import annotations

import torch

Batch = dict[str, torch.Tensor]


class ReplayBuffer:
    """Circular buffer of whole horizons: every field is one contiguous (T, N, ...) tensor on ``device``.

    ``add`` writes a (H, N, ...) trajectory at once; ``sample`` draws transitions uniformly over every stored
    (t, n) pair with one gather per field. Storage is allocated on the first ``add`` from the trajectory's
    shapes and dtypes, so any field an algorithm records (obs, next_obs, log-probs ...) is kept.
    """

    def __init__(self, capacity: int, num_envs: int, device: torch.device | str) -> None:
        self.rows = max(1, -(-capacity // num_envs))  # ceil: capacity counts transitions over all sub-envs
        self.num_envs, self.device = num_envs, torch.device(device)
        self.data: Batch = {}
        self.ptr = 0
        self.size = 0  # rows filled

    def __len__(self) -> int:
        return self.size * self.num_envs

    def add(self, traj: Batch) -> None:
        horizon = next(iter(traj.values())).shape[0]
        if not self.data:
            self.data = {k: torch.zeros((self.rows, *v.shape[1:]), dtype=v.dtype, device=self.device)
                         for k, v in traj.items()}
        if horizon > self.rows:
            traj, horizon = {k: v[-self.rows:] for k, v in traj.items()}, self.rows
        first = min(horizon, self.rows - self.ptr)  # rows before the wrap-around
        for key, value in traj.items():
            self.data[key][self.ptr:self.ptr + first] = value[:first]
            if horizon > first:
                self.data[key][:horizon - first] = value[first:]
        self.ptr = (self.ptr + horizon) % self.rows
        self.size = min(self.size + horizon, self.rows)

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99) -> Batch:
        """A uniform batch (B, ...) of stored transitions with their ``discount`` (see :meth:`gather`)."""
        idx = torch.randint(self.size * self.num_envs, (batch_size,), device=self.device)  # flat t * N + n
        return self.gather(idx, n_step, gamma)

    def gather(self, idx: torch.Tensor, n_step: int, gamma: float) -> Batch:
        """Transitions at flat indices ``idx`` (t * N + n), as n-step transitions when ``n_step > 1``.

        An n-step transition sums ``gamma**j * reward`` over the next steps of the same sub-env until its episode
        ends or the newest stored step is reached, and takes ``next_obs`` and ``terminated`` from its last step;
        ``discount`` is ``gamma ** steps_summed``, so every target reads ``reward + discount * (1 - terminated) * V``.
        """
        flat = {k: v.view(-1, *v.shape[2:]) for k, v in self.data.items()}
        batch = {k: v[idx] for k, v in flat.items()}
        batch["discount"] = torch.full(idx.shape, gamma, device=self.device)
        if n_step == 1:
            return batch
        t, n = idx // self.num_envs, idx % self.num_envs
        age = (t - (self.ptr - self.size)) % self.rows  # 0 for the oldest stored row
        alive = ~(batch["terminated"] | batch["truncated"])
        for j in range(1, n_step):  # over the n steps only; the whole batch at once
            ok = alive & (age + j < self.size)
            k = ((t + j) % self.rows) * self.num_envs + n
            batch["reward"] = batch["reward"] + ok * gamma**j * flat["reward"][k]
            batch["next_obs"] = torch.where(ok.view(-1, *[1] * (batch["next_obs"].dim() - 1)), flat["next_obs"][k],
                                            batch["next_obs"])
            batch["terminated"] = torch.where(ok, flat["terminated"][k], batch["terminated"])
            batch["discount"] = torch.where(ok, gamma ** (j + 1), batch["discount"])
            alive = ok & ~(flat["terminated"][k] | flat["truncated"][k])
        return batch

    def state_dict(self) -> tuple[Batch, dict]:
        """Tensors of the filled rows and the counters, for checkpoints."""
        return {k: v[:self.size] for k, v in self.data.items()}, {"ptr": self.ptr, "size": self.size}

    def load_state_dict(self, tensors: Batch, meta: dict) -> None:
        """Restore the rows and counters of :meth:`state_dict` (for a resumed run).

        A resumed run restarts its envs, so the episodes in progress at the newest stored row end there: that row
        is marked ``truncated`` (it still bootstraps from its ``next_obs``), so that n-step sums and H-term
        segments do not run on into the new episodes that the next ``add`` appends.
        """
        self.data, self.ptr, self.size = {}, 0, 0
        if tensors:
            self.add(tensors)  # allocates rows on the device and copies into them (no second device copy)
        self.ptr, self.size = meta["ptr"], meta["size"]
        if self.size and "truncated" in self.data and "terminated" in self.data:
            newest = (self.ptr - 1) % self.rows
            self.data["truncated"][newest] |= ~self.data["terminated"][newest]


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

    def load_state_dict(self, tensors: Batch, meta: dict) -> None:
        tensors = dict(tensors)
        tree, max_priority = tensors.pop("_tree"), tensors.pop("_max_priority")
        super().load_state_dict(tensors, meta)
        self.tree.copy_(tree)
        self.max_priority = max_priority.to(self.device)


def gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor,
        truncated: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over (T, N) tensors (Schulman et al. 2016, eq. 16).

    ``next_value[t]`` is V of the observation reached at step t *before* any auto-reset, so a truncated
    step bootstraps from its real final state, while a terminated step does not bootstrap at all. The
    recursion stops at every episode end (terminated or truncated). Returns (advantages, value targets).
    """
    not_terminated, not_done = (~terminated).to(value.dtype), (~(terminated | truncated)).to(value.dtype)
    delta = reward + gamma * not_terminated * next_value - value  # (T, N)
    advantages, last = torch.empty_like(value), torch.zeros_like(value[0])
    for t in range(reward.shape[0] - 1, -1, -1):  # over time only; every sub-env at once
        last = delta[t] + gamma * lam * not_done[t] * last
        advantages[t] = last
    return advantages, advantages + value


class RolloutBuffer:
    """The latest on-policy trajectory (T, N, ...) and its advantages; refilled by every ``add``."""

    def __init__(self) -> None:
        self.data: Batch = {}

    def add(self, traj: Batch) -> None:
        self.data = dict(traj)

    def compute_gae(self, value: torch.Tensor, next_value: torch.Tensor, gamma: float, lam: float) -> None:
        """Store ``advantage`` and ``value_target`` (T, N) computed from the stored reward and episode ends."""
        d = self.data
        d["value"] = value
        d["advantage"], d["value_target"] = gae(d["reward"], value, next_value, d["terminated"], d["truncated"],
                                                gamma, lam)

    def flat(self) -> Batch:
        """Every field reshaped from (T, N, ...) to (T * N, ...)."""
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in self.data.items()}

    def state_dict(self) -> tuple[Batch, dict]:
        return {}, {}  # refilled from scratch every iteration: nothing to checkpoint

    def load_state_dict(self, tensors: Batch, meta: dict) -> None:
        self.data = {}
