"""Model fusion: average the parameters and optimizer states of several copies of one agent.

Copies of an agent trained from the same start on different seeds (or data) are fused by setting every copy to
their mean, in place: the networks' parameters and floating buffers (:func:`average_parameters`), the optimizers'
per-parameter statistics such as Adam's ``exp_avg``, ``exp_avg_sq`` and ``step`` (:func:`average_optimizer_states`),
or all of an agent's state at once (:func:`fuse_agents`). :func:`all_reduce_average` does the same across the
processes of a ``torch.distributed`` group, one all-reduce per dtype and device.

    >>> fuse_agents([agent_a, agent_b])          # both now hold the mean networks and optimizer states
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from jaderl.core.agent import Agent

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


@torch.no_grad()
def _average(groups: Sequence[Sequence[torch.Tensor]]) -> None:
    """Set the i-th tensor of every group to the mean of the i-th tensors (floating ones; others are left as they
    are)."""
    first = groups[0]
    for other in groups[1:]:
        if len(other) != len(first) or any(a.shape != b.shape for a, b in zip(first, other, strict=True)):
            raise ValueError("cannot fuse models or optimizers of different architectures or with different states; "
                             "fuse copies of one agent that have all taken a step")
    for copies in zip(*groups, strict=True):
        if not copies[0].is_floating_point():
            continue
        mean = torch.stack([t.to(copies[0].device, torch.float64) for t in copies]).mean(0)
        for t in copies:
            t.copy_(mean)


def average_parameters(items: Sequence[nn.Module | Agent]) -> None:
    """Set the parameters and floating buffers of every module (or every network of every agent, SAC's entropy
    coefficient included) in ``items`` to their mean over ``items``, in place."""
    _average([_parameter_tensors(item) for item in items])


def average_optimizer_states(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Set every floating optimizer statistic (Adam: ``exp_avg``, ``exp_avg_sq``, ``step``) to its mean over
    ``optimizers``, in place; the optimizers must hold states for the same parameters."""
    _average([list(_walk(opt.state_dict()["state"])) for opt in optimizers])


def fuse_agents(agents: Sequence[Agent]) -> None:
    """Average everything ``state_dict`` holds in tensors (networks, optimizer states, running statistics) over
    ``agents``, in place; counters such as ``steps`` keep each agent's own value."""
    _average([state_tensors(agent) for agent in agents])


@torch.no_grad()
def all_reduce_average(obj: Fusible, group: dist.ProcessGroup | None = None) -> None:
    """Set the floating state of ``obj`` (a module, optimizer or agent) to its mean over the processes of
    ``group`` (the default group if None), in place: one all-reduce per dtype and device."""
    buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in state_tensors(obj):
        if t.is_floating_point():
            buckets.setdefault((t.device, t.dtype), []).append(t)
    for tensors in buckets.values():
        all_reduce_mean_(tensors, group)


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
