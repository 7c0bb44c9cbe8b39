"""Shared fixtures: one torch thread per test (the machine is shared) and tiny training settings."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import multiprocessing as mp
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

TINY_PPO: dict[str, Any] = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden=[32, 32],
                                eval_every=256, checkpoint_every=256, eval_episodes=2, total_steps=512,
                                device="cpu", seed=3)
"""A PPO run on jaderl/CartPole-v1 that takes about a second on one CPU thread."""


def pytest_configure(config: pytest.Config) -> None:
    """Python's own SIGINT handler, as in a terminal, also when the suite runs as a background job (``nohup ... &``),
    whose shell starts it with SIGINT ignored: the Ctrl-C tests send SIGINT to this process and to training processes
    it starts, which inherit an ignored SIGINT but not a handler."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: tests marked ``@pytest.mark.slow(seconds=S)`` (their measured time on one CPU core) run before
    the others, longest first, so that with one test per CPU (pytest-xdist) no long test starts last while the other
    CPUs sit idle. The order of everything else is kept."""
    def expected(item: pytest.Item) -> float:
        marker = item.get_closest_marker("slow")
        return float(marker.kwargs.get("seconds", 0)) if marker is not None else 0.0

    items.sort(key=lambda item: -expected(item))


@pytest.fixture(autouse=True)
def machine_share(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests marked ``alone`` (their assertions time processes against a limit) run with no other test beside them
    when pytest-xdist runs tests side by side: an ``alone`` test waits for the tests running to end and no test
    starts until it has ended. Every test holds a shared lock on a file of the session and an ``alone`` test an
    exclusive one; a second lock, held while waiting, lets no new test overtake an ``alone`` test that waits."""
    if not hasattr(request.config, "workerinput"):  # one test at a time already
        yield
        return
    locks = tmp_path_factory.getbasetemp().parent  # the session's folder, which every worker's lies in
    alone = request.node.get_closest_marker("alone") is not None
    with open(locks / "turnstile.lock", "a") as turnstile, open(locks / "machine.lock", "a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


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


def _descendants() -> dict[int, tuple[str, str]]:
    """All descendants of this process: pid -> (state, command line), read from /proc."""
    return {pid: (state, cmdline) for pid, (state, cmdline, _) in _process_tree().items()}


def _process_tree() -> dict[int, tuple[str, str, int]]:
    """All descendants of this process: pid -> (state, command line, parent pid), read from /proc."""
    parents, info = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry.name)] = int(fields[1])
        info[int(entry.name)] = (fields[0], cmdline, int(fields[1]))
    found, frontier = {}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = info[pid]
                frontier.append(pid)
    return found


def _is_infrastructure(cmdline: str, ppid: int) -> bool:
    """multiprocessing's forkserver and resource tracker, started once by this process and kept for reuse (the
    processes forked from the forkserver share its command line but are its children, not this process's)."""
    return ppid == os.getpid() and ("multiprocessing.forkserver" in cmdline
                                    or "multiprocessing.resource_tracker" in cmdline)


@pytest.fixture
def descendants() -> Callable[[], dict[int, tuple[str, str]]]:
    """A function listing this process's descendants: pid -> (state, command line), read from /proc."""
    return _descendants


@pytest.fixture
def no_leftover_processes() -> Iterator[None]:
    """Fail the test if it leaves a process (other than multiprocessing's own helpers) or a zombie behind."""
    before = set(_descendants())
    yield
    gc.collect()
    deadline = time.monotonic() + 2.0  # a process that was just told to exit may need a moment
    while True:
        after = _process_tree()
        left = {pid: cmd for pid, (_, cmd, ppid) in after.items()
                if pid not in before and not _is_infrastructure(cmd, ppid)}
        zombies = {pid: cmd for pid, (state, cmd, _) in after.items() if state == "Z"}
        if not (left or zombies) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"
    assert not zombies, f"zombie processes: {zombies}"
    assert not [p for p in mp.active_children() if p.name.startswith("jaderl-")]


def _session_pids(session_id: int) -> list[int]:
    """The pids of every process in session ``session_id`` (``pgrep -s``)."""
    found = subprocess.run(["pgrep", "-s", str(session_id)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def _assert_session_ended(session_id: int, timeout_s: float = 5.0) -> None:
    """Fail unless every process of session ``session_id`` is gone within ``timeout_s`` (multiprocessing's resource
    tracker exits once it sees its parent gone)."""
    deadline = time.monotonic() + timeout_s
    while (survivors := _session_pids(session_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not survivors, f"processes of the run's session still alive: {survivors}"


@contextlib.contextmanager
def own_session(command: list[str], cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """``command`` started in ``cwd`` in a session of its own (its pid the session's and the process group's id), its
    output piped as text; on leaving, its whole group is killed if it still runs, so that a failed check leaves no
    process behind."""
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def session_pids() -> Callable[[int], list[int]]:
    """A function listing the pids of the processes in a session (a run started with ``start_new_session=True``
    has its pid as session id)."""
    return _session_pids


@pytest.fixture
def session_ended() -> Callable[[int], None]:
    """A function that fails the test unless every process of a session (a run started with
    ``start_new_session=True``: its pid) has exited within a few seconds."""
    return _assert_session_ended


class HostSync(AssertionError):
    """A tensor's value was read on the host where nothing may be (the hot loop, an update)."""


@pytest.fixture
def no_host_syncs(monkeypatch: pytest.MonkeyPatch) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """A context manager factory: within ``with no_host_syncs():`` every Python-level read of a tensor's value
    raises :class:`HostSync` (an AssertionError naming the read)."""

    def forbid(name: str) -> Any:
        def raiser(*args: Any, **kwargs: Any) -> Any:
            raise HostSync(f"host sync: {name}")

        return raiser

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        with monkeypatch.context() as m:
            for name in ("item", "tolist", "numpy", "cpu", "nonzero", "__bool__", "__float__", "__int__", "__index__"):
                m.setattr(torch.Tensor, name, forbid(f"Tensor.{name}"))
            for name in ("nonzero", "equal", "allclose", "is_nonzero"):
                m.setattr(torch, name, forbid(f"torch.{name}"))
            yield

    return guard
