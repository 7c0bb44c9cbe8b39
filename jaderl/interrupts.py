"""Ctrl-C between training steps: a step (explore, store, update) is never cut in half by the first Ctrl-C.

A KeyboardInterrupt raised in the middle of a step leaves the state half-written: a replay buffer whose fields were
overwritten for some keys and not others, critics stepped but their targets not averaged, an env stepped whose
transition was never stored. The training loops checkpoint when they catch a Ctrl-C, so such a state would be saved
and resumed from. :func:`deferred_interrupt` holds the first Ctrl-C until the step ends and raises it there; a
second Ctrl-C during the same step raises :class:`ForcedInterrupt` at once, which the loops let through without a
checkpoint (the last complete checkpoint is kept).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class ForcedInterrupt(KeyboardInterrupt):
    """A second Ctrl-C in the middle of a step: the step's state is incomplete and must not be checkpointed."""


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Run the block with the first SIGINT held until the block ends (then KeyboardInterrupt is raised there).

    Only the main thread receives signals in Python; elsewhere, or where SIGINT is ignored, the block runs as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):  # ignored on purpose (a pipeline child), or set from outside Python
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if pending:
            raise ForcedInterrupt
        pending.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt
