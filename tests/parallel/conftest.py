"""Fixtures of the parallel tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

InThreads = Callable[[int, Callable[[int, dist.ProcessGroup], Any]], list[Any]]


def _run_in_threads(world: int, fn: Callable[[int, dist.ProcessGroup], Any]) -> list[Any]:
    """``fn(rank, group)`` in ``world`` threads joined by an in-process gloo group: their results by rank."""
    store = dist.HashStore()
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank, dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=20)))
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a collective hung"
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def in_threads() -> InThreads:
    """``in_threads(world, fn)``: ``fn(rank, group)`` in ``world`` threads joined by an in-process gloo group (a
    stand-in for ``world`` processes); returns their results by rank and re-raises the first error."""
    return _run_in_threads
