"""Pipeline parallelism: explorer worker processes, one learner and one evaluator process (``--workers N``).

Each of the N explorer workers owns ``num_envs`` sub-envs and a copy of the agent's policy; it calls the same
``agent.explore(env, horizon)`` the single-process loop calls and sends the trajectory to the learner. The learner
(this process) joins one trajectory per worker into a (horizon, N * num_envs) batch, feeds it to its buffer and runs
``agent.update``, then publishes the new policy. The evaluator process evaluates published policies and writes
metrics, TensorBoard, the learning curve and the best policy, while training goes on.

    off-policy  workers keep exploring while the learner updates (each may have one finished trajectory waiting),
                on the newest policy published when they start a round (weights are pushed every round); the
                ``pipeline/policy_lag`` statistic says how many publications behind the data was, on average
    on-policy   synchronised rounds: every worker explores with the policy the learner published after its last
                update, so the learner's update sees exactly on-policy data

Policies travel through shared memory: the learner copies its policy tensors into one shared block and bumps a
version number; a worker reloads when the version changed (no pickling of weights). Trajectories travel through
``torch.multiprocessing`` queues, which move tensors through shared memory as well.

Robustness: processes are started with ``forkserver`` (safe with threads and CUDA: they fork from a clean server
process that never touched either and has imported jaderl, so each starts in a fraction of a second). A worker or
the evaluator that raises reports its error, one that dies is noticed by its exit code; either way the learner saves
a checkpoint, stops the other processes and raises :class:`WorkerError` naming the process within about a second.
Ctrl-C (workers ignore SIGINT; the learner handles it), a ``stop`` file, and SIGTERM to any of the processes (the
learner's stops like Ctrl-C; a worker's or the evaluator's writes the ``stop`` file), so also to all of them at once,
end every process after a last checkpoint. Workers also exit by themselves when the learner disappears. A run
resumes from its checkpoints like a single-process one.

Workers and the evaluator act on the CPU; the learner uses ``config.device``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing.forkserver
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as tmp

from jaderl.accel import mixed_precision, native_bfloat16
from jaderl.core.agent import Agent
from jaderl.core.config import Config, ConfigError
from jaderl.core.loop import PeerError, Trainer, TrainingError, TrainResult
from jaderl.envs import EnvSpec, make_env
from jaderl.parallel.exits import END_SIGNAL, children_starting, describe_exit, stop_on_sigterm

POLL_S = 0.5
"""How often a waiting process checks on the others (seconds)."""
JOIN_S = 5.0
"""How long shutdown waits for a process to exit by itself before terminating it."""
WORKER_SEED_STRIDE = 10_007
"""Worker w explores sub-envs seeded from ``seed + (w + 1) * WORKER_SEED_STRIDE`` (+ the steps done, on resume)."""
MAX_WORKERS_PER_CPU = 4
"""More explorer processes than this per CPU are refused: they only wait for a CPU, and each holds torch's memory."""
HYPERPARAMETER_BYTES = 8192
"""Room for the learner's mutable hyperparameters as JSON, sent to the explorers with each policy."""


class WorkerError(PeerError):
    """An explorer worker or the evaluator raised or died; the learner saved a checkpoint and stopped the others."""


@dataclasses.dataclass
class _Shared:
    """The state the learner shares with its children (passed to them at start; tensors in shared memory)."""

    policy: dict[str, torch.Tensor]  # the newest published policy
    eval_policy: dict[str, torch.Tensor]  # the policy of the pending evaluation request
    version: Any  # mp.Value('q'): bumped on every publication
    steps: Any  # mp.Value('q'): the learner's env-step count at the last publication
    lock: Any  # guards policy, version and steps
    stop: Any  # mp.Value('b'), set to 1: every process ends its loop
    hyperparameters: Any  # mp.Array('c'): the learner's mutable hyperparameters as JSON, written with each policy
    # (version, steps and stop are plain shared memory: their reads and writes take no lock of their own, which a
    # process killed inside one would hold for ever; writes of version and steps happen under ``lock``)
    errors: Any  # queue of (process name, message)


def _cpu_policy(agent: Agent) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in agent.policy_state_dict().items()}


def _worker_seed(config: Config, worker: int, steps: int) -> int:
    return config.seed + (worker + 1) * WORKER_SEED_STRIDE + steps


def _orphaned() -> bool:
    import multiprocessing

    parent = multiprocessing.parent_process()
    return parent is not None and not parent.is_alive()


@contextlib.contextmanager
def _holding(lock: Any, still_ok: Callable[[], None]) -> Iterator[None]:
    """Hold ``lock``, calling ``still_ok`` (which raises when waiting is pointless) while it is taken: a process
    killed while holding a multiprocessing lock never releases it."""
    while not lock.acquire(timeout=POLL_S):
        still_ok()
    try:
        yield
    finally:
        lock.release()


def _exit_if_abandoned(shared: _Shared) -> None:
    if shared.stop.value or _orphaned():
        raise SystemExit(0)


def _child_main(name: str, shared: _Shared, body: Callable[[], None], stop_file: Path) -> None:
    """Run ``body`` in a child: SIGINT ignored (the learner decides), SIGTERM asking the run to stop through
    ``stop_file`` (the run directory's ``stop`` file, which the learner reads between steps; a second SIGTERM, or the
    learner's :data:`~jaderl.parallel.exits.END_SIGNAL`, raises SystemExit, so ``finally`` blocks close envs and
    files), one thread, errors reported by name."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop_on_sigterm(stop_file)
    torch.set_num_threads(1)
    try:
        body()
    except SystemExit:  # told to stop, or the learner is gone
        raise
    except BaseException as exc:  # report anything, then exit non-zero
        origin = exc  # where it started: an env's own error that an EnvError quotes (raised from it)
        while origin.__cause__ is not None:
            origin = origin.__cause__
        last = traceback.extract_tb(origin.__traceback__)[-1:] if origin.__traceback__ else []
        where = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
        shared.errors.put((name, f"{type(exc).__name__}: {exc}{where}"))
        raise SystemExit(1) from None


def _explorer(worker: int, config_dict: dict[str, Any], agent_cls: type[Agent], shared: _Shared,
              out: Any, go: Any, stop_file: Path) -> None:
    def body() -> None:
        start_steps = shared.steps.value  # the learner's steps when it started the children
        config = agent_cls.config_cls.from_dict(config_dict)
        config = config.replace(seed=_worker_seed(config, worker, start_steps))
        torch.manual_seed(config.seed)
        env = make_env(config.env, config.num_envs, "cpu", seed=config.seed, workers=config.env_workers)
        agent = agent_cls(config, env.spec, torch.device("cpu"))
        if native_bfloat16(agent.device):  # config.precision: act as the learner's networks compute, where that is
            mixed_precision(agent, warn=False)  # not slower (the learner may be a GPU, the explorers a plain CPU)
        elif config.precision == "bfloat16":  # log-probabilities of float32 networks are not the learner's: it
            agent.record_keys = ()  # computes them (PPO's old_log_prob)
        agent.steps = start_steps  # config.seed (this worker's, from start_steps) seeds the env
        used = -1
        try:
            while not shared.stop.value:
                # on-policy: wait for the policy of this round (the learner releases `go` after publishing it);
                # off-policy: wait until the learner took the last trajectory (it releases `go` then), so at most
                # one finished trajectory waits, then take the newest policy, if there is a new one, and go on
                if used >= 0 and not go.acquire(timeout=POLL_S):
                    if _orphaned():
                        return
                    continue
                if shared.version.value != used:
                    with _holding(shared.lock, lambda: _exit_if_abandoned(shared)):
                        agent.load_policy_state_dict(shared.policy)
                        used, agent.steps = shared.version.value, shared.steps.value
                        values = json.loads(shared.hyperparameters.value or b"{}")
                    if values and any(getattr(agent.config, k) != v for k, v in values.items()):
                        agent.set_hyperparameters(**values)  # changed in the learner since the last policy
                if agent.last_obs is None:
                    agent.last_obs = env.reset(seed=config.seed)
                traj = agent.explore(env, config.horizon)
                episodes = agent.episodes.take()
                while not shared.stop.value:
                    try:
                        out.put((traj, episodes, used), timeout=POLL_S)
                        break
                    except queue.Full:
                        if _orphaned():
                            return
        finally:
            out.cancel_join_thread()  # exit even if the learner no longer reads this queue
            env.close()

    _child_main(f"explorer worker {worker}", shared, body, stop_file)


def _evaluator(config_dict: dict[str, Any], agent_cls: type[Agent], shared: _Shared, requests: Any,
               results: Any, rows: list[dict[str, float]], stop_file: Path) -> None:
    def body() -> None:
        from jaderl.core.evaluator import Evaluator

        config = agent_cls.config_cls.from_dict(config_dict)
        env = make_env(config.env, config.eval_episodes, "cpu", seed=config.seed + 1)
        agent = agent_cls(config, env.spec, torch.device("cpu"))
        if native_bfloat16(agent.device):  # as the explorers
            mixed_precision(agent, warn=False)
        evaluator = Evaluator(env, Path(config.run_dir), seed=config.seed + 1)
        evaluator.load_state_dict({"rows": rows})
        results.put(("ready", evaluator.best_return))
        try:
            while not _orphaned():
                try:
                    request = requests.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if request is None:
                    return
                step, time_s, stats = request
                agent.load_policy_state_dict(shared.eval_policy)
                results.put(("eval", evaluator.evaluate(agent, step, time_s, stats)))
        finally:
            results.cancel_join_thread()
            evaluator.close()

    _child_main("evaluator", shared, body, stop_file)


class _Pipeline:
    """The learner's side: starts, feeds, watches and stops the worker and evaluator processes. It is also the
    Trainer's evaluator (``request``, ``poll``, ``pending_step``, the rows of metrics.csv as its state): the
    evaluator process evaluates while training goes on."""

    def __init__(self, config: Config, agent_cls: type[Agent], agent: Agent) -> None:
        ctx = tmp.get_context("forkserver")  # children fork from a clean server that has imported jaderl (and torch)
        ctx.set_forkserver_preload(["__main__", "jaderl.parallel.pipeline", "jaderl.algos"])
        self.config, self.agent_cls, self.agent = config, agent_cls, agent
        policy = _cpu_policy(agent)
        self.shared = _Shared(policy={k: v.share_memory_() for k, v in policy.items()},
                              eval_policy={k: v.clone().share_memory_() for k, v in policy.items()},
                              version=ctx.Value("q", 0, lock=False), steps=ctx.Value("q", agent.steps, lock=False),
                              lock=ctx.Lock(), stop=ctx.Value("b", 0, lock=False), errors=ctx.Queue(),
                              hyperparameters=ctx.Array("c", HYPERPARAMETER_BYTES, lock=False))
        self.trajectories = [ctx.Queue(maxsize=1) for _ in range(config.workers)]
        self.go = [ctx.Semaphore(0) for _ in range(config.workers)]
        self.policy_lag = 0.0  # mean number of publications the policies of the last round were behind
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.pending_step: int | None = None  # the step of the evaluation under way
        self.rows: list[dict[str, float]] = []  # metrics.csv's rows, as the evaluator process wrote them
        self.best_return = -math.inf
        self.stop_file = (Path(config.run_dir) / "stop").absolute()  # a child's SIGTERM asks for a stop through it
        # created now, started by start(): their arguments are sent then, with the rows and steps of that moment
        self.processes: dict[str, SpawnProcess] = {"evaluator": ctx.Process(
            target=_evaluator, name="jaderl-evaluator", daemon=True,
            args=(config.to_dict(), agent_cls, self.shared, self.requests, self.results, self.rows, self.stop_file))}
        for w in range(config.workers):
            self.processes[f"explorer worker {w}"] = ctx.Process(
                target=_explorer, name=f"jaderl-explorer{w}", daemon=config.env_workers == 0,
                args=(w, config.to_dict(), agent_cls, self.shared, self.trajectories[w], self.go[w], self.stop_file))
        self.started = False

    def start(self) -> None:
        """Start the children with the learner's current policy and steps, and wait until the evaluator has set up
        the run's metrics."""
        for key, tensor in self.agent.policy_state_dict().items():
            self.shared.policy[key].copy_(tensor)
        self.shared.steps.value = self.agent.steps  # the explorers start from it
        self._write_hyperparameters()
        self.started = True
        # A fork server started now ignores SIGINT, and so does every child from its start (the learner decides);
        # it ignores SIGTERM too, so that one sent to the whole process group asks each child for a stop
        # (stop_on_sigterm) and does not end the server, whose end would leave every child's exit code unknown (255).
        # It keeps SIGTERM blocked as well, and its children start so: one sent to a child while it starts waits until
        # the child installs its handler, then asks for a stop.
        with children_starting():
            multiprocessing.forkserver.ensure_running()
        for process in self.processes.values():
            process.start()
        _, self.best_return = self._get(self.results, "evaluator")

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.started:
            raise TrainingError("a running pipeline cannot take another state; load it before the first step")
        self.rows[:] = [dict(row) for row in state["rows"]]  # the evaluator process's argument

    # --- watching ---
    def check(self) -> None:
        """Raise WorkerError if a child reported an error or exited."""
        try:
            name, message = self.shared.errors.get_nowait()
        except queue.Empty:
            pass
        else:
            raise WorkerError(f"{name} failed: {message}")
        for name, process in self.processes.items():
            if process.exitcode is not None:
                time.sleep(0.2)  # its error report may still be on the way
                try:
                    name, message = self.shared.errors.get_nowait()
                except queue.Empty:
                    raise WorkerError(f"{name} {describe_exit(process.exitcode)}") from None
                raise WorkerError(f"{name} failed: {message}")

    def _get(self, source: Any, sender: str) -> Any:
        """The next item ``sender`` put in ``source``, checking on the children while waiting.

        Tensors travel as file descriptors that the sender hands over when the item is read, so an item whose sender
        died after putting it cannot be read: that raises the sender's failure, not an unrelated OSError."""
        while True:
            try:
                return source.get(timeout=POLL_S)
            except queue.Empty:
                self.check()
            except Exception:
                self.processes[sender].join(JOIN_S)  # it is exiting: wait for its exit code and error report
                self.check()
                raise

    # --- the learner's verbs ---
    def publish(self) -> None:
        """Make the learner's current policy the one workers explore with."""
        policy = self.agent.policy_state_dict()
        with _holding(self.shared.lock, self.check):
            for key, tensor in self.shared.policy.items():
                tensor.copy_(policy[key])
            self.shared.steps.value = self.agent.steps
            self._write_hyperparameters()
            self.shared.version.value += 1
        if self.agent.on_policy:
            for go in self.go:
                go.release()

    def _write_hyperparameters(self) -> None:
        """The learner's mutable hyperparameters (those set while it trains: a PBT exploit, Trainer.set_hyperparameters)
        for the explorers, which take them with the next policy (exploration noise, epsilon)."""
        names = self.agent.hyperparameters
        values = json.dumps({name: getattr(self.agent.config, name) for name in names}).encode()
        if len(values) >= HYPERPARAMETER_BYTES:
            raise TrainingError(f"{type(self.agent).__name__}'s hyperparameters take {len(values)} bytes as JSON, "
                                f"more than the {HYPERPARAMETER_BYTES} the explorers are sent")
        self.shared.hyperparameters.value = values

    def collect(self) -> dict[str, torch.Tensor]:
        """One trajectory from every worker, joined along the sub-env axis on the learner's device."""
        self.check()  # also when trajectories are always ready and no wait below times out
        parts = []
        for w, q in enumerate(self.trajectories):
            parts.append(self._get(q, f"explorer worker {w}"))
            if not self.agent.on_policy:  # it explores the next round while this one is learned from
                self.go[w].release()
        version = self.shared.version.value
        self.policy_lag = sum(version - p[2] for p in parts) / len(parts)
        if self.agent.on_policy and self.policy_lag:
            raise TrainingError(f"on-policy rounds went out of step (policy lag {self.policy_lag})")
        device = self.agent.device
        traj = {k: torch.cat([p[0][k] for p in parts], dim=1).to(device) for k in parts[0][0]}
        self.agent.episodes.add(sum(p[1] for p in parts))
        self.agent.steps += traj["reward"].shape[0] * traj["reward"].shape[1]
        if not self.agent.on_policy:  # what explore() does in one process
            self.agent.observe(traj)
        return traj

    def request(self, agent: Agent, step: int, time_s: float, stats: dict[str, float]) -> None:
        """Ask for an evaluation of the current policy. An evaluation still under way (``pending_step``, e.g. when
        ``Trainer.evaluate`` is called between training steps) finishes first and is recorded: the evaluator reads
        the policy it evaluates from shared memory."""
        if not self.started:  # an evaluation by hand before the first step: the evaluator process starts now
            self.start()
        if self.pending_step is not None:
            self.poll(wait=True)
        for key, tensor in agent.policy_state_dict().items():
            self.shared.eval_policy[key].copy_(tensor)
        self.requests.put((step, time_s, stats))
        self.pending_step = step

    def poll(self, wait: bool | float = False) -> float | None:
        """The return of the evaluation that finished since the last call, if any (``wait``: wait for it, or at
        most that many seconds)."""
        if self.pending_step is None:
            return None
        try:
            if wait is True:
                _, row = self._get(self.results, "evaluator")
            else:
                _, row = self.results.get(timeout=wait) if wait else self.results.get_nowait()
        except queue.Empty:
            return None
        self.pending_step = None
        self.rows.append(row)
        self.best_return = max(self.best_return, row["eval_return_mean"])
        return row["eval_return_mean"]

    def close(self, plot: bool = True) -> None:
        """Stop every child: ask, wait, then terminate and kill what is left (the evaluator process draws the
        curve as it ends, whatever ``plot`` says)."""
        self.shared.stop.value = 1
        started = [p for p in self.processes.values() if p.pid is not None]
        if "evaluator" in self.processes and self.processes["evaluator"].is_alive():
            self.requests.put(None)
        deadline = time.monotonic() + JOIN_S
        for process in started:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in started:
            if process.is_alive():  # (SIGTERM would only ask for a stop)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, END_SIGNAL)
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join()
        for q in (*self.trajectories, self.requests, self.results, self.shared.errors):
            q.cancel_join_thread()
            q.close()
        with contextlib.suppress(OSError):  # a stop a child's SIGTERM asked for when the run ended anyway (a resume
            self.stop_file.unlink(missing_ok=True)  # would stop at once)


class PipelineTrainer(Trainer):
    """The Trainer of the learner process: trajectories come from the explorer workers, the new policy is published
    after every update, and the evaluator process evaluates while training goes on."""

    def make_env(self) -> EnvSpec:
        probe = make_env(self.config.env, 1, "cpu")  # check the env and read its spaces before starting any process
        spec = probe.spec.replace(num_envs=self.config.num_envs * self.config.workers)
        probe.close()
        return spec

    def make_evaluator(self) -> _Pipeline:  # type: ignore[override]
        self.pipeline = _Pipeline(self.config, type(self.agent), self.agent)
        return self.pipeline

    def collect(self) -> dict[str, torch.Tensor]:
        if not self.pipeline.started:
            self.pipeline.start()
        return self.pipeline.collect()

    def after_update(self) -> None:
        self.pipeline.publish()

    def logged(self) -> dict[str, float]:
        return super().logged() | {"pipeline/policy_lag": self.pipeline.policy_lag}


def train_pipeline(config: Config, agent_cls: type[Agent], resume: bool = False,
                   progress: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Train with ``config.workers`` explorer processes, this process as the learner and an evaluator process."""
    cpus = os.cpu_count() or 1
    if config.workers > MAX_WORKERS_PER_CPU * cpus:  # each imports torch: a thousand would exhaust the memory
        raise ConfigError(f"workers={config.workers} explorer processes are more than this machine's {cpus} CPUs can "
                          f"serve (at most {MAX_WORKERS_PER_CPU} per CPU); use --workers {cpus} or fewer")
    with PipelineTrainer(config, agent_cls, resume=resume, progress=progress) as trainer:
        return trainer.run()
