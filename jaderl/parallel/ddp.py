"""Data-parallel learners: ``learners`` processes train one agent together with ``torch.distributed`` (DDP).

Every learner steps its own envs (seeded ``seed + 10007 * rank``), keeps its own replay or rollout buffer and runs
the ordinary training loop (:func:`jaderl.core.loop.train`) with a :class:`Learners` coordinator, which

* gives every learner learner 0's initial (or resumed) networks, optimizer states and counters;
* averages the gradients of every optimizer step across learners before clipping and stepping (one all-reduce per
  ~25 MiB bucket, through :attr:`Agent.grad_hook <jaderl.core.agent.Agent.grad_hook>`), so the parameters, target
  networks and optimizer states stay identical on all learners: each step learns from ``learners x batch`` samples;
* after each update merges what is learned outside gradients: observation-normalisation statistics (exactly, as if
  one normaliser had seen every learner's observations) and scalar running statistics such as ModSAC's critic-loss
  average (averaged), and, within an update, a normaliser the update changes and then reads (MAPPO's value
  targets, through ``Agent.stats_hook``) as soon as it changes; it checks that the learners' counters agree and
  counts every learner's env steps in ``agent.steps``, so ``total_steps``, ``eval_every``, warm-up and decay
  schedules count env steps of all learners;
* lets learner 0 evaluate, log and decide when to stop; the decision reaches every learner in the same iteration.

Learner 0 writes the run directory as a single-process run does; learner r > 0 checkpoints its own buffer and RNG
state into ``RUN_DIR/learner-r`` at the same steps, so ``jaderl train --resume RUN_DIR`` continues with every
learner's data. Processes are started with ``spawn`` (safe with threads and CUDA), use gloo on CPU and NCCL on GPUs
(learner r on ``cuda:base+r``), and rendezvous through a TCP store held by the parent process on 127.0.0.1.

The parent watches the learners: a learner that raises or dies is reported by rank with its error within a second
or two, and the others are ended at once (:data:`~jaderl.parallel.exits.END_SIGNAL`, then SIGKILL); Ctrl-C to the
parent (learners ignore SIGINT) asks learner 0 for a last checkpoint through the run directory's ``stop`` file and
stops everyone, and so does SIGTERM to any of the processes (the parent's turns into a Ctrl-C; a learner's touches
the ``stop`` file itself), so that ``kill -- -PGID`` or a job scheduler's SIGTERM to every process of the job stops
the run after a last checkpoint; learners also exit when the parent process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import queue as queue_module
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from jaderl.core.agent import Agent
from jaderl.core.checkpoint import CHECKPOINT_JSON, load_checkpoint, save_checkpoint
from jaderl.core.config import Config, ConfigError
from jaderl.core.loop import TrainingError, TrainResult, prepare_run_dir, resolve_device, train
from jaderl.core.nets import ObsNorm
from jaderl.envs.vec import EnvError
from jaderl.parallel.exits import (
    END_SIGNAL,
    ENDED_EXIT,
    SIGTERM_EXIT,
    children_starting,
    describe_exit,
    stop_on_sigterm,
)
from jaderl.parallel.fusion import all_reduce_mean_, state_tensors

SEED_STRIDE = 10_007
"""Learner r explores with seed ``seed + SEED_STRIDE * r``."""
BUCKET_BYTES = 25 * 2**20
"""Gradients are averaged in all-reduces of about this many bytes (DDP's default bucket size)."""
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
"""How long a learner waits in a collective (learner 0's evaluations and checkpoints happen while others wait);
a dead peer is caught much sooner by the parent's watch."""
STOP_GRACE_S = 60.0
"""After Ctrl-C (or SIGTERM) to the parent, how long it waits for the last checkpoint before it ends the learners."""
REASONS = ("", "total_steps", "time_limit", "stop_file", "solved")
"""The stop reasons of :func:`jaderl.core.loop.train`, broadcast by index."""
PASSED_ERRORS: dict[str, type[Exception]] = {"ConfigError": ConfigError, "EnvError": EnvError,
                                             "FileNotFoundError": FileNotFoundError, "TrainingError": TrainingError}
"""Errors of a learner that reach the caller as the same type (the CLI prints them as one line)."""


@torch.no_grad()
def average_gradients(params: list[nn.Parameter], group: dist.ProcessGroup | None = None) -> None:
    """Replace the gradient of each of ``params`` with its mean over the processes of ``group``, in buckets of
    about :data:`BUCKET_BYTES` per dtype and device, each one flattened all-reduce (parameters without a gradient
    are skipped: every process must run the same backward passes)."""
    buckets: dict[tuple[torch.device, torch.dtype], list[list[torch.Tensor]]] = {}
    filled: dict[tuple[torch.device, torch.dtype], int] = {}  # bytes in the last bucket of each kind
    for p in params:
        if p.grad is None:
            continue
        kind = (p.grad.device, p.grad.dtype)
        chain = buckets.setdefault(kind, [[]])
        if filled.get(kind, 0) >= BUCKET_BYTES:
            chain.append([])
            filled[kind] = 0
        chain[-1].append(p.grad)
        filled[kind] = filled.get(kind, 0) + p.grad.numel() * p.grad.element_size()
    for bucket in (b for chain in buckets.values() for b in chain):
        all_reduce_mean_(bucket, group)


def _obs_norms(agent: Agent) -> list[ObsNorm]:
    """The agent's enabled observation normalisers, each once."""
    found = {id(v): v for v in agent.running_stats().values() if isinstance(v, ObsNorm) and v.enabled}
    return list(found.values())


Snapshot = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""A normaliser's count, mean and variance (float64) at the last merge."""


def _snapshot_of(norm: ObsNorm) -> Snapshot:
    return norm.count.double().clone(), norm.mean.double().clone(), norm.var.double().clone()


def _norm_row(norm: ObsNorm, snapshot: Snapshot) -> list[torch.Tensor]:
    """What this learner added to ``norm`` since ``snapshot``: the number of its new samples, their sum and their
    scatter about the snapshot's mean (float64), to be summed over the learners by :func:`_merge_norm`."""
    count0, mean0, var0 = snapshot
    count, shift = norm.count.double(), norm.mean.double() - mean0
    return [(count - count0).reshape(1), (count * shift).reshape(-1),
            (count * norm.var.double() + count * shift.square() - count0 * var0).reshape(-1)]


def _merge_norm(norm: ObsNorm, snapshot: Snapshot, total: torch.Tensor) -> None:
    """Set ``norm`` to the statistics of the snapshot's samples and every learner's new ones (``total``: the sum of
    the learners' :func:`_norm_row`), exactly as if one process had seen them all."""
    count0, mean0, var0 = snapshot
    size = mean0.numel()
    added, shifted, scatter = total[0], total[1:1 + size], total[1 + size:1 + 2 * size]
    count = count0 + added
    shift = shifted.view_as(mean0) / count
    norm.mean.copy_(mean0 + shift)
    norm.var.copy_((count0 * var0 + scatter.view_as(var0)) / count - shift.square())
    norm.count.copy_(count)


class Learners:
    """The :class:`jaderl.core.loop.Coordinator` of one learner among ``dist.get_world_size(group)``."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        if group is None:
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:  # a group made with dist.new_group, or a ProcessGroup built by hand
            self.rank, self.world = group.rank(), group.size()
        self.is_main = self.rank == 0
        self._steps = 0  # agent.steps after the last merge
        self.device = torch.device("cpu")  # where collectives' small tensors live: the agent's device
        self._norm_snapshots: list[Snapshot] = []

    def attach(self, agent: Agent) -> None:
        """Copy learner 0's state to this learner and average every later gradient step. The running returns of a
        reward normaliser (``running``: one per sub-env) stay this learner's own: its sub-envs' episodes go on."""
        self.device = agent.device
        own = {n.running.data_ptr() for n in _obs_norms(agent) if isinstance(getattr(n, "running", None), torch.Tensor)}
        with torch.no_grad():
            for tensor in state_tensors(agent):
                if tensor.data_ptr() in own:
                    continue
                if tensor.device == agent.device:
                    dist.broadcast(tensor, group=self.group, group_src=0)
                else:  # e.g. a CPU step count of a CUDA agent's optimizer: NCCL moves CUDA tensors only
                    moved = tensor.to(agent.device)
                    dist.broadcast(moved, group=self.group, group_src=0)
                    tensor.copy_(moved)
        own = agent.counters()
        counters = torch.tensor([float(v) for v in own.values()], dtype=torch.float64, device=agent.device)
        dist.broadcast(counters, group=self.group, group_src=0)
        agent.load_counters(dict(zip(own, counters.tolist(), strict=True)))
        agent.grad_hook = lambda params: average_gradients(params, self.group)
        agent.stats_hook = lambda norm: self.merge_now(agent, norm)
        self._steps = agent.steps
        self._snapshot(agent)

    def _snapshot(self, agent: Agent) -> None:
        self._norm_snapshots = [_snapshot_of(n) for n in _obs_norms(agent)]

    @torch.no_grad()
    def merge_now(self, agent: Agent, norm: ObsNorm) -> None:
        """Merge ``norm``, which an update has just changed and reads next (MAPPO's value normaliser, before its
        targets are normalised), exactly as :meth:`after_update` merges every normaliser, so that every learner
        normalises with the statistics of all learners' data; its snapshot moves on, so after_update does not count
        that data twice. Called through ``agent.stats_hook``."""
        norms = _obs_norms(agent)
        i = next((i for i, n in enumerate(norms) if n is norm), None)
        if i is None:  # disabled: nothing to merge
            return
        row = torch.cat(_norm_row(norm, self._norm_snapshots[i]))
        rows = [torch.empty_like(row) for _ in range(self.world)]
        dist.all_gather(rows, row, group=self.group)
        _merge_norm(norm, self._norm_snapshots[i], torch.stack(rows).sum(0))
        self._norm_snapshots[i] = _snapshot_of(norm)

    @torch.no_grad()
    def after_update(self, agent: Agent) -> None:
        """Sum the learners' new env steps, merge their normalisers exactly, average scalar running statistics
        and check that their counters agree: one all-gather of a small float64 row per learner."""
        norms = _obs_norms(agent)
        averaged = [t for t in agent.running_stats().values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
        values = {k: v for k, v in agent.counters().items() if k != "steps"}
        counters = list(values)
        parts = [torch.tensor([agent.steps - self._steps, *(float(v) for v in values.values())],
                              dtype=torch.float64, device=agent.device)]
        for norm, snapshot in zip(norms, self._norm_snapshots, strict=True):
            parts += _norm_row(norm, snapshot)
        parts += [t.to(agent.device, torch.float64).reshape(-1) for t in averaged]
        row = torch.cat(parts)
        rows = [torch.empty_like(row) for _ in range(self.world)]
        dist.all_gather(rows, row, group=self.group)
        table = torch.stack(rows)  # (learners, K): the same on every learner, so is everything computed from it
        total = table.sum(0)
        if not torch.equal(table[:, 1:1 + len(counters)], table[:1, 1:1 + len(counters)].expand(self.world, -1)):
            differing = [c for i, c in enumerate(counters) if not bool((table[:, 1 + i] == table[0, 1 + i]).all())]
            raise TrainingError(f"the learners diverged: their {differing[0]} differ "
                                f"({table[:, 1 + counters.index(differing[0])].tolist()}); "
                                "the algorithm's control flow must not depend on a learner's own data")
        agent.steps = self._steps = self._steps + int(total[0].item())
        offset = 1 + len(counters)
        for norm, snapshot in zip(norms, self._norm_snapshots, strict=True):
            size = 1 + 2 * norm.mean.numel()
            _merge_norm(norm, snapshot, total[offset:offset + size])
            offset += size
        for t in averaged:
            t.copy_((total[offset:offset + t.numel()] / self.world).view_as(t))
            offset += t.numel()
        self._snapshot(agent)

    def agree(self, reason: str) -> str:
        """Learner 0's stop reason, on every learner."""
        if reason not in REASONS:
            raise ValueError(f"unknown stop reason {reason!r}")
        code = torch.tensor([REASONS.index(reason)], device=self.device)
        dist.broadcast(code, group=self.group, group_src=0)
        return REASONS[int(code.item())]


# --- the learner processes ---

def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (elsewhere the parent's watch has to do), and die now if
    it already has: the request covers only a death after it, and a learner makes it seconds after its start."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # adopted by another process: the parent is gone
        os.kill(os.getpid(), signal.SIGKILL)


def _learner(rank: int, world: int, port: int, config: Config, agent_cls: type[Agent], resume: bool,
             cuda_index: int | None, messages: Any, stop_file: Path) -> None:
    """One learner process: join the group, run the training loop, report the result (learner 0) or the error.
    SIGTERM touches ``stop_file`` (the run directory's ``stop`` file): the learners stop at the next step learner 0
    reads it, after a last checkpoint; a second SIGTERM, or :data:`END_SIGNAL` from the parent, ends it at once
    (``SystemExit``: the loop's finally blocks close the env, its worker processes and the files). A SIGTERM that
    came while the process started (blocked by the parent, see :func:`train_ddp`) asks for the stop here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into a stop file
    stop_on_sigterm(stop_file)
    _die_with_parent()
    try:
        if cuda_index is not None:
            torch.cuda.set_device(cuda_index)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("nccl" if cuda_index is not None else "gloo", store=store, rank=rank,
                                world_size=world, timeout=COLLECTIVE_TIMEOUT)
        progress = _ProgressSender(messages) if rank == 0 else None
        result = train(config, agent_cls, resume=resume, progress=progress, coordinator=Learners())
        if rank == 0:
            messages.put(("result", rank, dataclasses.asdict(result)))
        dist.destroy_process_group()
        code = 0
    except BaseException as exc:  # every failure goes to the parent, which reports it by rank
        if isinstance(exc, SystemExit) and exc.code in (SIGTERM_EXIT, ENDED_EXIT):
            code = exc.code  # nothing to report: the parent ended it, or says that a second SIGTERM did
        else:
            messages.put(("error", rank, type(exc).__name__, str(exc) or repr(exc), traceback.format_exc()))
            code = 1
    messages.close()
    messages.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown: it is slow with torch loaded, and after an error it could wait on
    # collectives or on peers that are gone (every file was closed and the checkpoint synced by the loop)
    os._exit(code)


class _ProgressSender:
    """Learner 0's progress callback: forwards progress to the parent, at most every 0.2 s unless it matters."""

    def __init__(self, messages: Any) -> None:
        self.messages, self.last_sent, self.last_eval = messages, 0.0, math.nan

    def __call__(self, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        new_eval = info["eval_return"] != self.last_eval and not math.isnan(info["eval_return"])
        if new_eval or info["done"] or now - self.last_sent > 0.2:
            self.last_sent, self.last_eval = now, info["eval_return"]
            self.messages.put(("progress", 0, info))


# --- the parent ---

def _learner_devices(config: Config) -> list[int | None]:
    """The CUDA device index of every learner (None: CPU)."""
    device = resolve_device(config.device)
    if device.type != "cuda":
        return [None] * config.learners
    base = device.index or 0
    if base + config.learners > torch.cuda.device_count():
        raise ConfigError(f"learners={config.learners} need GPUs cuda:{base}..cuda:{base + config.learners - 1} but "
                          f"{torch.cuda.device_count()} are visible; use fewer learners or --device cpu")
    return [base + r for r in range(config.learners)]


def learner_config(config: Config, rank: int) -> Config:
    """The config learner ``rank`` trains with: its own seed and, for rank > 0, its own checkpoint directory."""
    if rank == 0:
        return config
    device = config.device
    if device.startswith("cuda:"):
        device = f"cuda:{int(device.split(':')[1]) + rank}"
    return config.replace(seed=config.seed + SEED_STRIDE * rank, device=device,
                          run_dir=str(Path(config.run_dir) / f"learner-{rank}"))


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the checkpoint in ``run_dir`` (None if there is none), read from its JSON only."""
    try:
        return int(json.loads((run_dir / CHECKPOINT_JSON).read_text())["state"]["agent"]["counters"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _prepare_learner_dirs(config: Config, resume: bool) -> None:
    """Create every learner's directory (see :func:`_prepare_learner_dir`)."""
    for rank in range(1, config.learners):
        _prepare_learner_dir(config, rank, resume)


def _prepare_learner_dir(config: Config, rank: int, resume: bool) -> None:
    """Create learner ``rank``'s directory; when resuming, give it learner 0's data with fresh random streams if its
    checkpoint is missing or from another step (a run started with fewer learners, or stopped between two learners'
    checkpoints)."""
    run_dir = Path(config.run_dir)
    own = learner_config(config, rank)
    learner_dir = Path(own.run_dir)
    learner_dir.mkdir(parents=True, exist_ok=True)
    main_step = checkpoint_step(run_dir) if resume else None
    own_step = checkpoint_step(learner_dir) if resume else None
    # learner 0's checkpoint not readable here (another machine): the learner's own checkpoint is all there is
    if not resume or own_step == main_step or (main_step is None and own_step is not None):
        return
    if main_step is None:
        raise ConfigError(f"learner {rank} cannot resume: its checkpoint in {learner_dir} is missing or from another "
                          f"step, and learner 0's checkpoint in {run_dir} is not readable on this machine; copy "
                          "learner 0's run directory here or start a new run")
    state = load_checkpoint(run_dir)
    generator = torch.Generator().manual_seed(own.seed + int(main_step))
    state["rng"], state["env"], state["last_obs"] = {"torch": generator.get_state(), "cuda": None}, None, None
    state["config"] = own.to_dict()
    save_checkpoint(learner_dir, state, int(main_step))


def _stop(processes: list[Any], grace_s: float = 3.0) -> None:
    """End every learner still running at once: :data:`END_SIGNAL` (SIGTERM would only ask for a stop at the next
    step), then SIGKILL after ``grace_s``; reap them all."""
    started = [p for p in processes if p.pid is not None]
    for p in started:
        if p.exitcode is None:  # not reaped yet, so its pid is still its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, END_SIGNAL)
    deadline = time.monotonic() + grace_s
    for p in started:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def train_ddp(config: Config, agent_cls: type[Agent], resume: bool = False,
              progress: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Train ``agent_cls`` with ``config.learners`` data-parallel learner processes; returns learner 0's summary
    (``steps`` counts the env steps of all learners). Raises :class:`TrainingError` naming the learner that failed."""
    if config.learners < 2:
        raise ConfigError(f"learners={config.learners}: data-parallel training needs at least 2 learners")
    devices = _learner_devices(config)
    run_dir = prepare_run_dir(config, resume)
    _prepare_learner_dirs(config, resume)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    processes = [ctx.Process(target=_learner, name=f"jaderl-learner-{rank}",
                             args=(rank, config.learners, store.port, learner_config(config, rank), agent_cls, resume,
                                   devices[rank], messages, (run_dir / "stop").absolute()))
                 for rank in range(config.learners)]
    setup_failed = False
    try:
        # a SIGTERM to a learner while it starts asks for a stop once it can; the parent's own asks at once
        with children_starting():
            for p in processes:
                p.start()
        return _watch(processes, messages, run_dir, progress)
    except (ConfigError, EnvError):
        # a set-up that failed (learner 0 writes config.yaml when its set-up is done), not a run that trained: an env
        # error mid-run (NaN from the env or the policy) keeps what learner 0 wrote, as one process does
        setup_failed = not resume and not (run_dir / CHECKPOINT_JSON).exists() \
            and not (run_dir / "config.yaml").exists()
        raise
    finally:
        _stop(processes)
        messages.close()
        messages.join_thread()
        with contextlib.suppress(OSError):
            (run_dir / "stop").unlink(missing_ok=True)
        if setup_failed:  # e.g. an algorithm that does not fit the env: leave no half-made run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)


def _watch(processes: list[Any], messages: Any, run_dir: Path,
           progress: Callable[[dict[str, Any]], None] | None) -> TrainResult:
    """Relay progress until learner 0 reports its result and every learner has exited; on the first failure
    report the learner that failed. Ctrl-C (or SIGTERM, under :func:`jaderl.interrupts.sigterm_as_ctrl_c`) writes the
    stop file (a second one, or a slow stop, ends everyone); the run then reports stop reason ``interrupted``, also
    when a learner's own SIGTERM wrote the stop file first."""
    received: dict[str, Any] = {"result": None, "errors": []}
    interrupted_at: float | None = None

    def handle(message: tuple[Any, ...]) -> None:
        kind, rank, *payload = message
        if kind == "progress" and progress is not None:
            progress(payload[0])
        elif kind == "result":
            received["result"] = payload[0]
        elif kind == "error":
            received["errors"].append((rank, *payload))

    while True:
        try:
            try:
                handle(messages.get(timeout=0.1))
                continue  # read every message before looking at exit codes
            except queue_module.Empty:
                pass
            failed = received["errors"] or any(p.exitcode not in (None, 0) for p in processes)
            if failed or all(p.exitcode is not None for p in processes):
                # what was sent just before an exit, and the other learners' reports of the same failure
                # (to tell its cause from its consequences)
                deadline = time.monotonic() + 1.0
                with contextlib.suppress(queue_module.Empty, OSError, EOFError):
                    while time.monotonic() < deadline:
                        handle(messages.get(timeout=0.3))
                break
            if interrupted_at is not None and time.monotonic() - interrupted_at > STOP_GRACE_S:
                raise TrainingError(f"the learners did not stop within {STOP_GRACE_S:.0f} s of Ctrl-C; "
                                    "they were ended, and the last checkpoint is kept")
        except KeyboardInterrupt:
            if interrupted_at is not None:
                raise TrainingError("interrupted twice: the learners were ended without a last checkpoint") from None
            interrupted_at = time.monotonic()
            with contextlib.suppress(OSError):
                (run_dir / "stop").touch()
    if received["errors"] or any(p.exitcode not in (None, 0) for p in processes):
        raise _failure(processes, received["errors"], run_dir)
    result = received["result"]
    if result is None:
        raise TrainingError("learner 0 exited without reporting a result")
    if interrupted_at is not None and result["stop_reason"] == "stop_file":
        result["stop_reason"] = "interrupted"
    return TrainResult(**result)


def _failure(processes: list[Any], errors: list[tuple[int, str, str, str]], run_dir: Path | None = None) -> Exception:
    """The error to raise for a failed run: a learner that died without a word is the cause; otherwise the first
    learner that reported an error (the others usually fail because it left the group). With ``run_dir``, the
    error says how to continue from the last checkpoint when there is one."""
    kept = "the other learners were stopped and the last checkpoint is kept"
    if run_dir is not None and (run_dir / CHECKPOINT_JSON).exists():
        kept += f": continue from it with `jaderl train --resume {run_dir}`"
    reported = {rank for rank, *_ in errors}
    for rank, p in enumerate(processes):
        if p.exitcode not in (None, 0) and rank not in reported:
            return TrainingError(f"learner {rank} {describe_exit(p.exitcode)}; {kept}")
    rank, name, message, trace = errors[0]
    if name in PASSED_ERRORS:
        exc: Exception = PASSED_ERRORS[name](f"learner {rank}: {message}")
    else:
        exc = TrainingError(f"learner {rank} failed: {name}: {message}; {kept}")
    exc.add_note(f"traceback of learner {rank}:\n{trace}")
    return exc


# --- learners started by torchrun (one or several machines) ---

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    """True in a process that ``torchrun`` (or another ``env://`` launcher) started as one of a group."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def _broadcast_text(text: str, device: torch.device) -> str:
    """Learner 0's ``text`` on every learner (UTF-8 bytes in two broadcasts: length, then content)."""
    data = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if int(size.item()) == 0:
        return ""
    buffer = data if dist.get_rank() == 0 else torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=0)
    return bytes(buffer.tolist()).decode()


def train_torchrun(config: Config, agent_cls: type[Agent], resume: bool = False,
                   progress: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Train as one learner of a group that ``torchrun`` started, on one machine or several (``env://`` rendezvous:
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; ``LOCAL_RANK`` picks the GPU). ``WORLD_SIZE`` must
    equal ``config.learners``. Learner 0 writes the run directory; learner r > 0 writes ``RUN_DIR/learner-r`` on its
    own machine's disk (a resume needs each learner's own directory, or learner 0's on a shared disk). torchrun
    watches the processes: a learner that fails ends the group. Returns this learner's summary (learner 0's is the
    run's)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.learners:
        raise ConfigError(f"torchrun started {world} learner process{'es' if world != 1 else ''} but "
                          f"learners={config.learners}; pass "
                          f"--learners {world}")
    device = resolve_device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", (device.index or 0) + int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        failure = ""
        if rank == 0:  # learner 0 names and creates the run directory; the others learn its name
            try:
                prepare_run_dir(config, resume)
            except ConfigError as exc:
                failure = str(exc)
        failure = _broadcast_text(failure, device)
        if failure:
            raise ConfigError(failure if rank == 0 else f"learner 0 could not start the run: {failure}")
        config = config.replace(run_dir=_broadcast_text(str(config.run_dir), device))
        if rank > 0:
            _prepare_learner_dir(config, rank, resume)
        own = learner_config(config, rank).replace(device=str(device))
        return train(own, agent_cls, resume=resume, progress=progress if rank == 0 else None,
                     coordinator=Learners())
    finally:
        dist.destroy_process_group()

