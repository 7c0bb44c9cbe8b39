"""Shared fixtures: one torch thread per test (the machine is shared) and tiny training settings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

TINY_PPO: dict[str, Any] = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden=[32, 32],
                                eval_every=256, checkpoint_every=256, eval_episodes=2, total_steps=512,
                                device="cpu", seed=3)
"""A PPO run on jaderl/CartPole-v1 that takes about a second on one CPU thread."""


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Run every test on one torch CPU thread and restore the previous count afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_ppo() -> Callable[..., dict[str, Any]]:
    """A factory of tiny PPO settings (see ``TINY_PPO``) with keyword overrides."""
    return lambda **overrides: TINY_PPO | overrides
