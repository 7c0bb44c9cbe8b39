"""Ctrl-C between training steps: a step (explore, store, update) is never cut in half by the first Ctrl-C.

A KeyboardInterrupt raised in the middle of a step leaves the state half-written: a replay buffer whose fields were
overwritten for some keys and not others, critics stepped but their targets not averaged, an env stepped whose
transition was never stored. The training loops checkpoint when they catch a Ctrl-C, so such a state would be saved
and resumed from. :func:`deferred_interrupt` holds the first Ctrl-C until the step ends and raises it there; a
second Ctrl-C during the same step raises :class:`ForcedInterrupt` at once, which the loops let through without a
checkpoint (the last complete checkpoint is kept).

Under :func:`sigterm_as_ctrl_c` (the ``jaderl`` command runs under it) SIGTERM, as ``kill``, job schedulers and
container runtimes send it, stops the same way: it raises :class:`Terminated`, a KeyboardInterrupt, and inside
:func:`deferred_interrupt` it is held to the end of the step like the first Ctrl-C.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class ForcedInterrupt(KeyboardInterrupt):
    """A second Ctrl-C in the middle of a step: the step's state is incomplete and must not be checkpointed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM under :func:`sigterm_as_ctrl_c`: a stop requested from outside, handled as a Ctrl-C."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Run the block with SIGTERM raising :class:`Terminated` (a KeyboardInterrupt) instead of ending the process at
    once, so that training stops after its step under way with a last checkpoint. Also for background jobs, which
    the shell starts with SIGINT ignored. Main thread only; elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Run the block with the first SIGINT held until the block ends (then KeyboardInterrupt is raised there); the
    same for SIGTERM under :func:`sigterm_as_ctrl_c`, where either signal counts as the first.

    Only the main thread receives signals in Python; elsewhere, or where SIGINT is ignored and SIGTERM not turned
    into a Ctrl-C, the block runs as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[signal.Signals] = []
    if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None):  # ignored on purpose (a pipeline child, a
        held.append(signal.SIGINT)  # background job), or set from outside Python
    if signal.getsignal(signal.SIGTERM) is _terminate:
        held.append(signal.SIGTERM)
    if not held:
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if pending:
            raise ForcedInterrupt
        pending.append(signum)

    previous = {signum: signal.signal(signum, hold) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if pending:
        raise Terminated if pending[0] == signal.SIGTERM else KeyboardInterrupt
