"""How the process-parallel modes (pipeline workers, data-parallel learners) start, end and describe a child."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

SIGTERM_EXIT = 128 + signal.SIGTERM
"""The exit code of a child ended by SIGTERM: it raised SystemExit, so its ``finally`` blocks (closing envs, their
worker processes and shared memory, and files) ran before it exited."""
END_SIGNAL = signal.SIGUSR1
"""The signal with which a parent ends a child that must stop now (the survivors of a failed run), where SIGTERM
from outside is a request to stop the run (:func:`stop_on_sigterm`)."""
ENDED_EXIT = 128 + END_SIGNAL
"""The exit code of a child ended by :data:`END_SIGNAL`: like :data:`SIGTERM_EXIT`, its ``finally`` blocks ran."""


def exit_on_sigterm() -> None:
    """In a child: turn SIGTERM into ``SystemExit(SIGTERM_EXIT)`` instead of an immediate death."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(SIGTERM_EXIT))


def stop_on_sigterm(stop_file: Path) -> None:
    """In a child that trains with others (a data-parallel learner): SIGTERM asks the run to stop, as Ctrl-C to the
    parent does. The first touches ``stop_file`` (the run directory's ``stop`` file, which the main learner reads
    between steps, so that every learner stops at the same step after a last checkpoint) and training goes on until
    then; a second SIGTERM, or one whose stop file cannot be written, raises ``SystemExit(SIGTERM_EXIT)`` at once.
    :data:`END_SIGNAL` raises ``SystemExit(ENDED_EXIT)`` at once: the parent's way to end the child now. SIGTERM is
    then unblocked in this thread: one that arrived while the process started with it blocked
    (:func:`signals_blocked`) asks for the stop now, as if it had come just after."""
    requested: list[int] = []

    def request_stop(signum: int, frame: FrameType | None) -> None:
        if requested:  # already stopping: end now, like a second Ctrl-C
            sys.exit(SIGTERM_EXIT)
        requested.append(signum)
        try:
            stop_file.touch()
        except OSError:  # the request cannot reach the main learner: end now, the last checkpoint is kept
            sys.exit(SIGTERM_EXIT)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(END_SIGNAL, lambda *_: sys.exit(ENDED_EXIT))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


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


@contextlib.contextmanager
def signals_blocked(*signums: signal.Signals) -> Iterator[None]:
    """Block ``signums`` in this thread in the block: processes started in it (``spawn``, and the ``forkserver``
    server, whose children start with its mask) begin with them blocked, so that one sent to such a process before it
    can answer it is kept pending, not lost, until the process unblocks it (:func:`stop_on_sigterm` does, once its
    handler is installed). Linux keeps a blocked signal pending even where its disposition is to ignore it
    (:func:`signals_ignored`, the outer block): so a child cannot die of it while it starts and still sees it
    afterwards, while this process, which unblocks before it restores its handlers, drops the ones sent to it
    meanwhile as before. Starting multiprocessing's resource tracker unblocks SIGINT and SIGTERM: it should be
    running before the block."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def children_starting() -> Iterator[None]:
    """Where the process-parallel modes start their children (``spawn`` processes, or the ``forkserver`` server that
    forks them): the children ignore SIGINT (the parent decides) and SIGTERM from their first instruction, with SIGTERM
    blocked too (:func:`signals_ignored`, :func:`signals_blocked`), so one sent to a child while it starts waits
    until it installs its handler (:func:`stop_on_sigterm`), then asks for a stop. Multiprocessing's resource tracker
    is started first, as starting it inside the block would unblock SIGTERM."""
    import multiprocessing.resource_tracker

    multiprocessing.resource_tracker.ensure_running()
    with signals_ignored(signal.SIGINT, signal.SIGTERM), signals_blocked(signal.SIGTERM):
        yield


def describe_exit(code: int) -> str:
    """How a child that reported no error ended, from its exit code, as the end of a sentence naming it."""
    if code == SIGTERM_EXIT:
        return "was stopped by SIGTERM (sent from outside jaderl, e.g. by `kill` or a job scheduler)"
    if code == ENDED_EXIT:
        return f"was ended by {END_SIGNAL.name} (sent from outside jaderl)"
    if code < 0:
        with contextlib.suppress(ValueError):
            oom = " (out of memory, or killed from outside)" if -code == signal.SIGKILL else ""
            return f"was killed by {signal.Signals(-code).name}{oom}"
    return f"exited with code {code} before it could report an error (its output above says why)"
