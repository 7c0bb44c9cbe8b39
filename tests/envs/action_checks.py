"""Checks shared by the env tests: every env jaderl builds or adapts takes a list, tuple or NumPy array of numbers as
actions, steps it as the same tensor would, and refuses in one sentence what is not numbers (and, for discrete
actions, floats that are not whole numbers)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from jaderl.envs.vec import EnvError, VecEnv

Step = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]
"""What ``VecEnv.step`` returns: obs, reward, terminated, truncated, info."""

JUNK_ACTIONS: tuple[Any, ...] = (["left", "right"], None, np.array(["a", "b"]))
"""Actions that are not numbers: text, nothing, a NumPy array of text."""


def assert_same_step(got: Step, want: Step, action: Any = None) -> None:
    """``got`` and ``want`` hold equal observations, rewards, terminations and truncations (``action`` names the
    case when they differ)."""
    assert all(torch.equal(a, b) for a, b in zip(got[:4], want[:4], strict=True)), action


def check_list_actions(env: VecEnv, values: list[Any], restart: Callable[[], object]) -> Step:
    """Check that ``env`` steps ``values`` given as a list, tuple, NumPy array and float32 NumPy array (and, for
    discrete envs, as a float32 tensor of whole numbers, which is taken) as it steps ``torch.tensor(values)``, each
    from the start ``restart`` sets (a seeded reset, or loading a saved state); return the step of the tensor."""
    restart()
    want = env.step(torch.tensor(values))
    forms: list[Any] = [values, tuple(values), np.array(values), np.array(values, dtype=np.float32)]
    if env.is_discrete:
        forms.append(torch.tensor(values, dtype=torch.float32))
    for action in forms:
        restart()
        assert_same_step(env.step(action), want, action)
    return want


def check_refused_actions(env: VecEnv, *, name: str = "the env", non_integral: Sequence[Any] = (),
                          junk: Sequence[Any] = JUNK_ACTIONS) -> None:
    """Check that ``env`` refuses every ``non_integral`` discrete action in one sentence quoting its first value that
    is not a whole number, and every ``junk`` action in one sentence naming what ``name`` takes. The caller checks
    that nothing refused reached a sub-env."""
    for action in non_integral:
        flat = np.asarray(action, dtype=np.float64).ravel()
        first = flat[flat != np.trunc(flat)][0]
        with pytest.raises(EnvError, match=rf"^{re.escape(name)} takes discrete actions as whole numbers, got "
                                           rf"{re.escape(f'{first:g}')}; pass integer actions \(an int64 tensor"):
            env.step(action)
    for action in junk:
        with pytest.raises(EnvError, match=rf"^{re.escape(name)} cannot read actions from a \w+ \([^)]*\)+; pass a "
                                           r"torch\.Tensor, or a NumPy array or list of real numbers$"):
            env.step(action)
