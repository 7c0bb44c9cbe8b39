"""How the process-parallel modes (pipeline workers, data-parallel learners) start, end and describe a child."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

SIGTERM_EXIT = 128 + signal.SIGTERM
"""The exit code of a child ended by SIGTERM: it raised SystemExit, so its ``finally`` blocks (closing envs, their
worker processes and shared memory, and files) ran before it exited."""


def exit_on_sigterm() -> None:
    """In a child: turn SIGTERM into ``SystemExit(SIGTERM_EXIT)`` instead of an immediate death."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(SIGTERM_EXIT))


@contextlib.contextmanager
def signals_ignored(*signums: signal.Signals) -> Iterator[None]:
    """Ignore ``signums`` in the block (main thread only): processes started in it inherit the ignored dispositions
    from their first instruction (``spawn``, and the ``forkserver`` server, whose children restore the disposition it
    started with), so a signal sent to the whole process group while they start cannot end them. A child that
    installs a handler of its own (:func:`exit_on_sigterm`) answers the signal from then on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def describe_exit(code: int) -> str:
    """How a child that reported no error ended, from its exit code, as the end of a sentence naming it."""
    if code == SIGTERM_EXIT:
        return "was stopped by SIGTERM (sent from outside jaderl, e.g. by `kill` or a job scheduler)"
    if code < 0:
        with contextlib.suppress(ValueError):
            oom = " (out of memory, or killed from outside)" if -code == signal.SIGKILL else ""
            return f"was killed by {signal.Signals(-code).name}{oom}"
    return f"exited with code {code} before it could report an error (its output above says why)"
