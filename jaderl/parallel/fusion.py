"""Model fusion: average the parameters and optimizer states of several copies of one agent.

Copies of an agent trained from the same start on different seeds (or data) are fused by setting every copy to
their mean, in place: the networks' parameters and floating buffers (:func:`average_parameters`), the optimizers'
per-parameter statistics such as Adam's ``exp_avg``, ``exp_avg_sq`` and ``step`` (:func:`average_optimizer_states`),
or all of an agent's state at once (:func:`fuse_agents`). :func:`all_reduce_average` does the same across the
processes of a ``torch.distributed`` group, one all-reduce per dtype and device.

Running normalisers (:class:`~jaderl.core.nets.ObsNorm` and its subclasses: observation, state, reward and value
normalisers) are not averaged but merged: every copy gets the mean and variance of the union of the copies' samples
(:func:`merge_norms`: means weighted by the counts, variances with the spread of the means between the copies), and
the mean of their counts, so that a longer run's statistics weigh more, while copies that share their history
(members fused again and again) do not count it several times.

    >>> fuse_agents([agent_a, agent_b])          # both now hold the mean networks and optimizer states
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from jaderl.core.agent import Agent
from jaderl.core.nets import ObsNorm

Fusible = nn.Module | torch.optim.Optimizer | Agent


def _walk(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors of a nested dict / list / tuple, dict entries in sorted key order (stable across copies)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            yield from _walk(obj[key])
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _walk(item)


def state_tensors(obj: Fusible) -> list[torch.Tensor]:
    """Every tensor of ``obj.state_dict()`` in a fixed order, sharing storage with ``obj`` (writing to one writes
    to the live module, optimizer or agent): parameters, buffers, optimizer statistics, free parameters."""
    state = obj.state_dict() if not isinstance(obj, nn.Parameter) else obj
    return [t.detach() for t in _walk(state)]


def _parameter_tensors(item: nn.Module | Agent) -> list[torch.Tensor]:
    """Parameters and buffers of a module, or of every network of an agent (no optimizers)."""
    if isinstance(item, Agent):
        return [t for net in item.networks().values() for t in state_tensors(net)]
    return state_tensors(item)


def _norms(modules: Sequence[nn.Module]) -> list[ObsNorm]:
    """The enabled running normalisers among ``modules`` and their submodules, each once, in a fixed order (the same
    for copies of one agent)."""
    found = {id(m): m for module in modules for m in module.modules() if isinstance(m, ObsNorm) and m.enabled}
    return list(found.values())


def _parameter_norms(item: Fusible) -> list[ObsNorm]:
    """The normalisers among what :func:`_parameter_tensors` returns: in a module, or in an agent's networks."""
    if isinstance(item, Agent):
        return _norms(list(item.networks().values()))
    return _norms([item]) if isinstance(item, nn.Module) else []


def _agent_norms(item: Fusible) -> list[ObsNorm]:
    """The normalisers among what ``state_dict`` holds: in a module, or in an agent's networks and running
    statistics (an optimizer holds none)."""
    if isinstance(item, Agent):
        stats = [v for v in item.running_stats().values() if isinstance(v, nn.Module)]
        return _norms([*item.networks().values(), *stats])
    return _parameter_norms(item)


def _norm_buffers(norms: Sequence[ObsNorm]) -> set[int]:
    """The storage addresses of the count, mean and variance of ``norms`` (merged, so not averaged)."""
    return {t.data_ptr() for norm in norms for t in (norm.count, norm.mean, norm.var)}


@torch.no_grad()
def merge_norms(norms: Sequence[ObsNorm]) -> None:
    """Set every normaliser of ``norms`` to the statistics of the union of their samples, in place: the count-weighted
    mean and the variance of the pooled samples (the copies' variances weighted by their counts plus the spread of
    their means about the pooled mean), computed in float64. The count is the mean of the counts, not their sum:
    copies of one agent fused repeatedly share the samples they saw before, and a summed count would grow with every
    fusion until the statistics stopped adapting."""
    first = norms[0]
    counts = torch.stack([n.count.to(first.count.device, torch.float64) for n in norms])
    means = torch.stack([n.mean.to(first.mean.device, torch.float64) for n in norms])
    variances = torch.stack([n.var.to(first.var.device, torch.float64) for n in norms])
    weights = counts.view(-1, *(1,) * first.mean.dim())  # (copies, 1, ...): one count per copy
    count = counts.sum(0)
    mean = (weights * means).sum(0) / count
    var = (weights * (variances + (means - mean).square())).sum(0) / count
    for norm in norms:
        norm.count.copy_(count / len(norms))
        norm.mean.copy_(mean)
        norm.var.copy_(var)


@torch.no_grad()
def _average(groups: Sequence[Sequence[torch.Tensor]], norms: Sequence[Sequence[ObsNorm]] = ()) -> None:
    """Set the i-th tensor of every group to the mean of the i-th tensors (floating ones; others are left as they
    are); the j-th normalisers of ``norms`` (one list per group) are merged instead (:func:`merge_norms`)."""
    first = groups[0]
    for other in groups[1:]:
        if len(other) != len(first) or any(a.shape != b.shape for a, b in zip(first, other, strict=True)):
            raise ValueError("cannot fuse models or optimizers of different architectures or with different states; "
                             "fuse copies of one agent that have all taken a step")
    if norms and any(len(other) != len(norms[0]) or any(a.mean.shape != b.mean.shape
                                                        for a, b in zip(norms[0], other, strict=True))
                     for other in norms[1:]):
        raise ValueError("cannot fuse models with different running normalisers; fuse copies of one agent with the "
                         "same normalize_obs and normalize_reward settings")
    merged = _norm_buffers([n for copies in norms for n in copies])
    for copies in zip(*norms, strict=True):
        merge_norms(copies)
    for copies in zip(*groups, strict=True):
        if not copies[0].is_floating_point() or copies[0].data_ptr() in merged:
            continue
        mean = torch.stack([t.to(copies[0].device, torch.float64) for t in copies]).mean(0)
        for t in copies:
            t.copy_(mean)


def average_parameters(items: Sequence[nn.Module | Agent]) -> None:
    """Set the parameters and floating buffers of every module (or every network of every agent, SAC's entropy
    coefficient included) in ``items`` to their mean over ``items``, in place; running normalisers among them are
    merged (:func:`merge_norms`)."""
    _average([_parameter_tensors(item) for item in items], [_parameter_norms(item) for item in items])


def average_optimizer_states(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Set every floating optimizer statistic (Adam: ``exp_avg``, ``exp_avg_sq``, ``step``) to its mean over
    ``optimizers``, in place; the optimizers must hold states for the same parameters."""
    _average([list(_walk(opt.state_dict()["state"])) for opt in optimizers])


def fuse_agents(agents: Sequence[Agent]) -> None:
    """Average everything ``state_dict`` holds in tensors (networks, optimizer states, running statistics) over
    ``agents``, in place, merging the running normalisers (:func:`merge_norms`); counters such as ``steps`` keep each
    agent's own value."""
    _average([state_tensors(agent) for agent in agents], [_agent_norms(agent) for agent in agents])


@torch.no_grad()
def all_reduce_average(obj: Fusible, group: dist.ProcessGroup | None = None) -> None:
    """Set the floating state of ``obj`` (a module, optimizer or agent) to its mean over the processes of
    ``group`` (the default group if None), in place: one all-reduce per dtype and device; its running normalisers
    are merged over the processes as :func:`merge_norms` merges copies (two more all-reduces)."""
    norms = _agent_norms(obj)
    merged = _norm_buffers(norms)
    buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in state_tensors(obj):
        if t.is_floating_point() and t.data_ptr() not in merged:
            buckets.setdefault((t.device, t.dtype), []).append(t)
    for tensors in buckets.values():
        all_reduce_mean_(tensors, group)
    if norms:
        _all_reduce_merge_norms(norms, group)


@torch.no_grad()
def _all_reduce_merge_norms(norms: Sequence[ObsNorm], group: dist.ProcessGroup | None) -> None:
    """Set each of ``norms`` to the statistics of the union of its samples over the processes of ``group``: the
    counts and count-weighted sums are summed first, then the scatter about the pooled mean (float64, on the first
    normaliser's device)."""
    device = norms[0].mean.device
    counts = [n.count.to(device, torch.float64).reshape(1) for n in norms]
    means = [n.mean.to(device, torch.float64).reshape(-1) for n in norms]
    sums = torch.cat([part for c, m in zip(counts, means, strict=True) for part in (c, c * m)])
    dist.all_reduce(sums, group=group)
    totals, pooled, offset = [], [], 0
    for mean in means:
        total = sums[offset:offset + 1]
        totals.append(total)
        pooled.append(sums[offset + 1:offset + 1 + mean.numel()] / total)
        offset += 1 + mean.numel()
    scatter = torch.cat([c * (n.var.to(device, torch.float64).reshape(-1) + (m - p).square())
                         for n, c, m, p in zip(norms, counts, means, pooled, strict=True)])
    dist.all_reduce(scatter, group=group)
    offset = 0
    for norm, total, mean in zip(norms, totals, pooled, strict=True):
        norm.count.copy_((total / dist.get_world_size(group)).view_as(norm.count))
        norm.mean.copy_(mean.view_as(norm.mean))
        norm.var.copy_((scatter[offset:offset + mean.numel()] / total).view_as(norm.var))
        offset += mean.numel()


@torch.no_grad()
def all_reduce_mean_(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None = None) -> None:
    """Set each of ``tensors`` (one device and dtype) to its mean over the processes of ``group``, in place, with
    one all-reduce of their concatenation."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
