"""What :meth:`jaderl.core.agent.Agent.predict` takes: one observation or a batch, checked against the env's shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest magnitude an observation may have: the agent computes in float32."""


def observation_batch(obs: Any, obs_shape: Sequence[int], num_agents: int, device: torch.device,
                      obs_dtype: str = "float32") -> tuple[torch.Tensor, bool]:
    """``obs`` (numpy, torch or nested lists) as a batch tensor on ``device`` in the env's ``obs_dtype`` (uint8 for
    pixels, float32 otherwise), and whether it was one observation.

    One observation has the env's ``obs_shape`` (several agents: ``(agents, *obs_shape)``), a batch one more leading
    axis. Anything else is refused in one sentence: a shape the agent was not trained on, a non-numeric value, or
    NaN or infinite numbers, or float64 ones beyond float32's range (an action computed from them would be
    meaningless), or, for pixels, values that are not whole numbers in 0..255 (a frame scaled to [0, 1], say)."""
    array = obs
    if torch.is_tensor(obs):  # (numpy has no bfloat16)
        array = (obs.float() if obs.dtype == torch.bfloat16 else obs).detach().cpu().numpy()
    try:
        array = np.asarray(array)
    except (TypeError, ValueError) as exc:  # ragged lists
        raise ValueError(f"predict takes observations as a numpy array or torch tensor; could not read one from "
                         f"{type(obs).__name__} ({exc})") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(f"predict takes numeric observations (a numpy array or torch tensor); got "
                         f"{type(obs).__name__} of dtype {array.dtype}")
    one = (num_agents, *obs_shape) if num_agents > 1 else tuple(obs_shape)
    single = array.shape == one
    if not single and array.shape[1:] != one:
        agents = f"this agent acts for {num_agents} agents: " if num_agents > 1 else ""
        raise ValueError(f"{agents}predict takes observations of shape {one} (one) or (N, {', '.join(map(str, one))})"
                         f" (a batch); got shape {array.shape}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError("predict got NaN or infinite observations; check what the env returned")
    if array.dtype.kind == "f" and array.dtype.itemsize > 4 and array.size and np.abs(array).max() > FLOAT32_MAX:
        # the agent computes in float32, where such a value is infinite: its action would be NaN
        raise ValueError(f"predict got observations beyond float32's range (+-{FLOAT32_MAX:.4g}), which the agent "
                         "computes in; check what the env returned")
    if obs_dtype == "uint8" and array.size and (array.min() < 0 or array.max() > 255 or (
            array.dtype.kind == "f" and not (array == np.trunc(array)).all())):
        raise ValueError("predict takes pixel observations as whole numbers in 0..255, as the env gives them (uint8); "
                         f"got values from {array.min():g} to {array.max():g}")
    x = torch.as_tensor(np.ascontiguousarray(array), device=device)  # (a flipped view has negative strides)
    x = x.to(torch.uint8) if obs_dtype == "uint8" else x.float()
    return (x.unsqueeze(0) if single else x), single


def flag(name: str, value: Any) -> bool:
    """``value`` of a true-or-false argument ``name`` as a bool; anything but a bool (NumPy's too) raises a TypeError
    naming it, since a string such as ``"no"`` would otherwise count as true."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise TypeError(f"{name} must be True or False, not {value!r}")
