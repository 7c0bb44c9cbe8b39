"""Multi-process stepping of ordinary (non-vectorised) Gymnasium envs through shared memory.

:class:`SubprocVecEnv` splits the ``num_envs`` sub-envs into contiguous slices: ``num_workers`` worker processes
each own one, and by default the calling process steps the first slice itself while the workers step theirs, so K
workers keep K + 1 CPUs busy (``step_in_parent=False`` leaves every env to the workers, isolating the caller from
envs that crash the interpreter).
All per-step data lives in one ``multiprocessing.shared_memory`` segment allocated once (actions, observations,
final observations, rewards, terminated, truncated), viewed as numpy arrays on both sides, so no observation or
action is ever pickled. Each step the parent writes the actions into shared memory and sends every worker a
one-byte message over its pipe; the worker steps its slice (same-step auto-reset, keeping the final observation),
writes the results into shared memory and answers with one byte. A worker that raises answers with its error
instead (which env and the exception's last traceback line); a worker that dies closes its pipe, and the parent
also polls every worker's exit code while it waits, so both are reported by name within a second of the parent
finishing its own slice. An env of the caller's slice that raises is reported as such; the workers are stopped.

Waking a process that sleeps on a pipe costs more than a MuJoCo step on many virtual machines (the kernel has to
wake an idle CPU). So where every waiting process can have a CPU of its own (workers + 1 <= usable CPUs, in a
top-level process) both sides first poll their pipe without sleeping for up to 1 ms, as envpool's threads do; on
the 2-CPU development machine 1 worker + the caller step HalfCheetah 1.6x to 1.7x faster than one process this way,
against 1.3x when they sleep. Explorer and learner processes (``--workers``, ``--learners``) never
spin, since they share the CPUs with each other. The ``spin`` argument, or else the environment variable
``JADERL_SPIN=0`` / ``1``, overrides the choice (e.g. for several training runs side by side on one machine).

Workers start with ``forkserver`` (default) or ``spawn``, never ``fork``: they are safe to create from a process
that has threads or has initialised CUDA. ``close()`` (also run when the env is garbage-collected and at interpreter
exit) stops, joins and if need be kills every worker and frees the shared memory.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import select
import signal
import time
import weakref
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from jaderl.envs.vec import EnvError, GymnasiumSpaces, _gym_factory, check_finite, error_line

_STEP, _RESET, _RESET_SEEDED, _CLOSE, _OK, _ERROR = b"s", b"r", b"R", b"c", b"k", b"e"
"""One-byte signals written straight to the pipes' file descriptors once the worker is set up: one system call
each way per worker and step. An error is ``_ERROR`` followed by a framed message (``Connection.send_bytes``)."""
_POLL_S = 0.25
"""How often the parent checks that the workers it waits on are still alive."""
_SPIN_S = 1e-3
"""With ``spin``, how long a process that waits for the other side polls its pipe before it sleeps in the kernel."""
END_SIGNAL = signal.SIGUSR1
"""How the parent ends a worker that did not close when told: its default action ends the process, as SIGTERM's would,
while SIGTERM itself is ignored by the workers (a stop sent to the whole run is the parent's to handle)."""


def _wait(poller: select.poll, spin_s: float, timeout_ms: float) -> list[tuple[int, int]]:
    """``poller.poll(timeout_ms)``, but first poll without sleeping for up to ``spin_s`` seconds.

    A process that sleeps until a pipe is written is woken by the kernel, which on a virtual machine whose other
    CPU went idle can take longer than the env step itself; a process that keeps polling sees the byte at once.
    """
    if spin_s:
        deadline = time.perf_counter() + spin_s
        while time.perf_counter() < deadline:
            events = poller.poll(0)
            if events:
                return events
    return poller.poll(timeout_ms)


def _usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota (containers)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()  # "max 100000" or "200000 100000"
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    return cpus


def _layout(num_envs: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype, act_shape: tuple[int, ...],
            act_dtype: np.dtype) -> tuple[dict[str, tuple[int, tuple[int, ...], str]], int]:
    """Offsets, shapes and dtypes of the shared buffers (64-byte aligned) and the segment's total size."""
    specs = {
        "action": ((num_envs, *act_shape), np.dtype(act_dtype)),
        "obs": ((num_envs, *obs_shape), np.dtype(obs_dtype)),
        "final_obs": ((num_envs, *obs_shape), np.dtype(obs_dtype)),
        "reward": ((num_envs,), np.dtype(np.float64)),
        "terminated": ((num_envs,), np.dtype(np.bool_)),
        "truncated": ((num_envs,), np.dtype(np.bool_)),
        "seed": ((1,), np.dtype(np.int64)),
    }
    layout, offset = {}, 0
    for name, (shape, dtype) in specs.items():
        layout[name] = (offset, shape, dtype.str)
        offset += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64
    return layout, max(offset, 64)


def _views(buf: Any, layout: dict[str, tuple[int, tuple[int, ...], str]]) -> dict[str, np.ndarray]:
    return {name: np.ndarray(shape, dtype=np.dtype(dtype), buffer=buf, offset=offset)
            for name, (offset, shape, dtype) in layout.items()}


def _error_line(exc: BaseException) -> str:
    """The env's error on one line: ``Type: message``, or an EnvError's own sentence."""
    return str(exc) if isinstance(exc, EnvError) else error_line(exc)


def _worker(conn: mpc.Connection, factory: Callable[[], gym.Env], start: int, stop: int, spin_s: float) -> None:
    """Own sub-envs ``start..stop-1``: build them, then serve reset/step requests until told to close."""
    # Ctrl-C, and SIGTERM sent to every process of the run (`kill -- -PGID`, a job scheduler), are the parent's to
    # handle: it stops after its step and then closes the workers (a worker that must end now gets END_SIGNAL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    envs: list[gym.Env] = []
    shm = None
    where = [start]  # the sub-env being built or stepped, for error messages
    raw = False  # whether this worker's answers are one-byte signals yet (they are after the spaces are sent)
    try:
        for index in range(start, stop):
            where[0] = index
            envs.append(factory())
        env = envs[0]
        conn.send((env.observation_space, env.action_space, int(getattr(env.spec, "max_episode_steps", None) or 0)))
        raw = True
        name, layout = conn.recv()
        shm = shared_memory.SharedMemory(name=name)
        os.write(conn.fileno(), _OK)
        _serve(conn.fileno(), envs, _views(shm.buf, layout), start, stop, where, spin_s)
    except Exception as exc:  # report it to the parent, which raises it by worker name
        message = f"env {where[0]}: {_error_line(exc)}".encode()
        with contextlib.suppress(OSError, ValueError):
            if raw:
                os.write(conn.fileno(), _ERROR)
                conn.send_bytes(message)
            else:
                conn.send_bytes(_ERROR + message)
    finally:
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()
        if shm is not None:
            with contextlib.suppress(BufferError):  # a view survived in a traceback; it goes with the process
                shm.close()
        conn.close()


def _slice_views(views: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {name: view[start:stop] for name, view in views.items() if name != "seed"}


def _step_slice(envs: list[gym.Env], views: dict[str, np.ndarray], start: int, where: list[int]) -> None:
    """Step every env of a slice with its action from ``views`` (same-step auto-reset) and write the results."""
    act, obs_buf, fin_buf = views["action"], views["obs"], views["final_obs"]
    rew_buf, term_buf, trunc_buf = views["reward"], views["terminated"], views["truncated"]
    discrete = act.ndim == 1
    for j, env in enumerate(envs):
        where[0] = start + j
        obs, reward, terminated, truncated, _ = env.step(act[j] if discrete else act[j].copy())
        rew_buf[j], term_buf[j], trunc_buf[j] = reward, terminated, truncated
        fin_buf[j] = obs
        if terminated or truncated:
            obs, _ = env.reset()
        obs_buf[j] = obs


def _reset_slice(envs: list[gym.Env], views: dict[str, np.ndarray], start: int, seed: int | None,
                 where: list[int]) -> None:
    """Reset every env of a slice; sub-env ``i`` gets ``seed + i`` when a seed is given."""
    for j, env in enumerate(envs):
        where[0] = start + j
        views["obs"][j], _ = env.reset(seed=None if seed is None else seed + start + j)


def _serve(fd: int, envs: list[gym.Env], views: dict[str, np.ndarray], start: int, stop: int,
           where: list[int], spin_s: float) -> None:
    mine = _slice_views(views, start, stop)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        if spin_s:
            _wait(poller, spin_s, -1)
        try:
            command = os.read(fd, 1)
        except OSError:  # the parent is gone (an empty read says the same)
            return
        if command == _STEP:
            _step_slice(envs, mine, start, where)
        elif command in (_RESET, _RESET_SEEDED):
            _reset_slice(envs, mine, start, int(views["seed"][0]) if command == _RESET_SEEDED else None, where)
        else:
            return
        os.write(fd, _OK)


class _Workers:
    """The worker processes, their pipes and the shared memory: everything :meth:`close` must release.

    Kept apart from :class:`SubprocVecEnv` so a ``weakref.finalize`` can release it without referencing the env.
    """

    def __init__(self) -> None:
        self.processes: list[mp.process.BaseProcess] = []
        self.conns: list[mpc.Connection] = []
        self.shm: shared_memory.SharedMemory | None = None
        self.views: dict[str, np.ndarray] = {}
        self.local: list[gym.Env] = []  # the slice this process steps itself
        self.local_views: dict[str, np.ndarray] = {}  # its part of the shared buffers

    def close(self) -> None:
        for conn, process in zip(self.conns, self.processes, strict=True):
            if process.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    os.write(conn.fileno(), _CLOSE)
        deadline = time.monotonic() + 1.0
        for process in self.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive() and process.pid is not None:  # (it ignores SIGTERM)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, END_SIGNAL)
                process.join(timeout=1.0)
            if process.is_alive():
                process.kill()
                process.join()
            process.close()
        for conn in self.conns:
            conn.close()
        for env in self.local:
            with contextlib.suppress(Exception):
                env.close()
        self.processes, self.conns, self.local = [], [], []
        self.views, self.local_views = {}, {}  # no view may outlive the shared memory
        if self.shm is not None:
            self.shm.close()
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()
            self.shm = None


class SubprocVecEnv(GymnasiumSpaces):
    """``num_envs`` copies of a Gymnasium env stepped by ``num_workers`` processes (and this one) through shared memory.

    ``env_id_or_factory`` is a Gymnasium id or a picklable callable (a module-level function or a
    ``functools.partial``) returning a ``gym.Env``; ``env_kwargs`` are passed to ``gym.make`` or to the factory.
    ``step_in_parent``: this process steps the first of ``num_workers + 1`` slices itself (when there are more
    sub-envs than workers); ``False`` gives every sub-env to a worker. ``spin``: poll without sleeping while
    waiting for the other side (``None``: where every waiting process has a CPU; see the module docstring).
    Semantics match :class:`~jaderl.envs.vec.GymnasiumVecEnv` on a ``SyncVectorEnv``: Box actions are rescaled
    from ``[-1, 1]``, ``reset(seed)`` seeds sub-env ``i`` with ``seed + i``, finished sub-envs reset in the same step
    and ``info["final_obs"]`` holds the observation before the reset. See the module docstring for the design.
    """

    def __init__(
        self,
        env_id_or_factory: str | Callable[..., gym.Env],
        num_envs: int,
        num_workers: int = 2,
        device: str | torch.device = "cpu",
        env_kwargs: dict[str, Any] | None = None,
        start_method: str = "forkserver",
        step_in_parent: bool = True,
        spin: bool | None = None,
    ) -> None:
        if num_envs < 1 or num_workers < 1:
            raise EnvError(f"num_envs ({num_envs}) and num_workers ({num_workers}) must be at least 1")
        if start_method not in ("forkserver", "spawn"):
            raise EnvError(f"start_method {start_method!r} is not supported: use 'forkserver' or 'spawn' "
                           "('fork' is unsafe once threads or CUDA are running)")
        self.device = torch.device(device)
        self.num_envs = num_envs
        self._workers = _Workers()
        self._finalizer = weakref.finalize(self, self._workers.close)
        if isinstance(env_id_or_factory, str):
            # a picklable gym.make; an unknown id or a missing package (MuJoCo, Box2D) raises EnvError here
            factory: Callable[[], gym.Env] = _gym_factory(env_id_or_factory, env_kwargs or {})
            label = env_id_or_factory.replace("/", "-")
        elif callable(env_id_or_factory):
            factory = functools.partial(env_id_or_factory, **(env_kwargs or {}))
            label = getattr(env_id_or_factory, "__name__", type(env_id_or_factory).__name__)
        else:
            raise EnvError(f"cannot build envs from {type(env_id_or_factory).__name__}: pass a Gymnasium id or a "
                           "factory returning a gym.Env")
        num_workers = min(num_workers, num_envs)
        if spin is None and os.environ.get("JADERL_SPIN") in ("0", "1"):
            spin = os.environ["JADERL_SPIN"] == "1"
        if spin is None:  # spin only where every waiting process can have a CPU of its own
            spin = mp.parent_process() is None and num_workers + 1 <= _usable_cpus()
        self._spin_s = _SPIN_S if spin else 0.0
        try:
            self._start(factory, label, num_workers, start_method, step_in_parent and num_envs > num_workers)
        except BaseException:
            self.close()
            raise

    # -- construction -------------------------------------------------------------------------------------------

    def _start(self, factory: Callable[[], gym.Env], label: str, num_workers: int, start_method: str,
               step_in_parent: bool) -> None:
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":  # workers fork from a server that has imported this module (and torch)
            ctx.set_forkserver_preload(["__main__", "jaderl.envs.subproc"])  # "__main__" is the default
        # this process's slice is the smallest (it also runs the policy and copies the results), the rest even
        local = self.num_envs // (num_workers + 1) if step_in_parent else 0
        bounds = np.linspace(local, self.num_envs, num_workers + 1).round().astype(int)
        self._local_slice = (0, local)
        self._slices = [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
        self._names = [f"jaderl-{label}-worker{k}" for k in range(num_workers)]
        workers = self._workers
        for name, (start, stop) in zip(self._names, self._slices, strict=True):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            process = ctx.Process(target=_worker, args=(child_conn, factory, start, stop, self._spin_s), name=name,
                                  daemon=True)
            try:
                process.start()
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                parent_conn.close()
                child_conn.close()
                raise EnvError(f"cannot send the env factory to the workers ({exc}); with start method "
                               f"{start_method!r} it must be picklable: a module-level function or a "
                               "functools.partial, not a lambda or a local function") from None
            child_conn.close()  # so the parent sees EOF when the worker dies
            workers.processes.append(process)
            workers.conns.append(parent_conn)
        self._poller = select.poll()  # reused every step: cheaper than multiprocessing.connection.wait
        self._fds = {conn.fileno(): k for k, conn in enumerate(workers.conns)}
        for fd in self._fds:
            self._poller.register(fd, select.POLLIN)
        self._where = [0]  # the local sub-env being built or stepped, for error messages

        def build() -> None:  # while the workers build theirs
            for index in range(*self._local_slice):
                self._where[0] = index
                workers.local.append(factory())

        self._in_parent(build, "built")
        spaces = self._gather(setup=True)
        names = self._names
        if workers.local:  # the reference spaces are those of this process's envs
            env = workers.local[0]
            spaces.insert(0, (env.observation_space, env.action_space,
                              int(getattr(env.spec, "max_episode_steps", None) or 0)))
            names = ["this process", *names]
        obs_space, act_space, max_steps = spaces[0]
        for k, other in enumerate(spaces[1:], 1):
            if other[0] != obs_space or other[1] != act_space:
                raise EnvError(f"the envs of {names[k]} have spaces {other[0]}, {other[1]} but those of "
                               f"{names[0]} have {obs_space}, {act_space}: all sub-envs must match")
        self._read_spaces(obs_space, act_space)
        act_shape, act_dtype = ((), np.dtype(np.int64)) if self.is_discrete else ((self.action_dim,), act_space.dtype)
        self.max_steps = max_steps
        layout, size = _layout(self.num_envs, self.obs_shape, np.dtype(obs_space.dtype), act_shape, act_dtype)
        workers.shm = shared_memory.SharedMemory(create=True, size=size)
        workers.views = _views(workers.shm.buf, layout)
        for k, conn in enumerate(workers.conns):
            try:
                conn.send((workers.shm.name, layout))
            except OSError:  # it died after sending its spaces
                raise EnvError(self._death(k)) from None
        workers.local_views = _slice_views(workers.views, *self._local_slice)
        self._gather()

    # -- talking to the workers ---------------------------------------------------------------------------------

    def _gather(self, setup: bool = False) -> list[Any]:
        """Wait for one answer from every worker; raise :class:`EnvError` naming the first that failed or died.

        Answers are one-byte signals, except the first after start-up (``setup``): a pickled (spaces, max_steps)
        tuple.
        """
        workers = self._workers
        if not workers.conns:
            raise EnvError("the env is closed")
        answers: list[Any] = [None] * len(workers.conns)
        pending = set(range(len(workers.conns)))
        try:
            while pending:
                events = _wait(self._poller, self._spin_s, _POLL_S * 1000)
                for fd, event in events:
                    k = self._fds[fd]
                    if k not in pending:  # it answered this round, so only a hang-up wakes us: it died since
                        if event & (select.POLLHUP | select.POLLERR):
                            raise EnvError(self._death(k))
                        continue
                    pending.discard(k)
                    conn = workers.conns[k]
                    try:
                        message = conn.recv_bytes() if setup else os.read(fd, 1)
                        if message[:1] == _ERROR:
                            error = message[1:] if setup else conn.recv_bytes()
                            raise EnvError(f"worker {self._names[k]} failed: {error.decode(errors='replace')}")
                    except (EOFError, OSError):
                        message = b""
                    if not message:  # end of file: the worker is gone
                        raise EnvError(self._death(k))
                    answers[k] = pickle.loads(message) if setup else message
                if not events:
                    for k in sorted(pending):
                        if not workers.processes[k].is_alive():
                            raise EnvError(self._death(k))
        except BaseException:  # an error, or Ctrl-C mid-step: the workers are out of step with us, so stop them
            self.close()
            raise
        return answers

    def _in_parent(self, work: Callable[[], None], done: str) -> None:
        """Run this process's share of a build, step or reset (``done``: "built", "stepped" or "reset"); an error in
        an env becomes an EnvError naming it and what was done to it."""
        try:
            work()
        except Exception as exc:
            raise EnvError(f"env {self._where[0]} ({done} in this process) failed: {_error_line(exc)}") from exc

    def _round(self, command: bytes, local_work: Callable[[], None], done: str) -> None:
        """Signal the workers, do this process's slice while they do theirs, wait for them. Any failure or Ctrl-C
        on the way closes the env: the workers would be out of step with this process."""
        try:
            self._broadcast(command)
            if self._workers.local:
                self._in_parent(local_work, done)
            self._gather()
        except BaseException:
            self.close()
            raise

    def _death(self, k: int) -> str:
        process = self._workers.processes[k]
        process.join(timeout=1.0)
        code = process.exitcode
        how = "is still running" if code is None else (
            f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
        return f"worker {self._names[k]} failed: it died ({how}) without reporting an error"

    def _broadcast(self, message: bytes) -> None:
        for k, conn in enumerate(self._workers.conns):
            try:
                os.write(conn.fileno(), message)
            except (OSError, ValueError):
                message = self._death(k)
                self.close()
                raise EnvError(message) from None

    # -- the contract --------------------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if not self._workers.conns:
            raise EnvError("the env is closed")
        if seed is not None:
            self._workers.views["seed"][0] = int(seed)
        workers = self._workers
        self._round(_RESET if seed is None else _RESET_SEEDED,
                    lambda: _reset_slice(workers.local, workers.local_views, 0, seed, self._where), "reset")
        obs = self._workers.views["obs"]
        check_finite("observation", obs)
        return self._tensor(obs, self._obs_dtype)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        views = self._workers.views
        if not views:
            raise EnvError("the env is closed")
        views["action"][:] = self._env_actions(action)
        workers = self._workers  # this process steps its slice (sub-envs 0..) while the workers step theirs
        self._round(_STEP, lambda: _step_slice(workers.local, workers.local_views, 0, self._where), "stepped")
        obs, final_obs, reward = views["obs"], views["final_obs"], views["reward"]
        check_finite("observation", obs)
        check_finite("reward", reward)
        done = views["terminated"] | views["truncated"]
        if done.any():
            check_finite("observation", final_obs[done])
        info = {"final_obs": self._tensor(final_obs, self._obs_dtype)}
        return (
            self._tensor(obs, self._obs_dtype),
            self._tensor(reward, torch.float32),
            self._tensor(views["terminated"], torch.bool),
            self._tensor(views["truncated"], torch.bool),
            info,
        )

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (empty once closed)."""
        return [p.pid for p in self._workers.processes if p.pid is not None]

    @property
    def worker_names(self) -> list[str]:
        return list(self._names)

    def close(self) -> None:
        self._finalizer()
