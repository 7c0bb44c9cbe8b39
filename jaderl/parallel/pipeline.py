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
Ctrl-C (workers ignore SIGINT; the learner handles it) and a ``stop`` file end every process after a last
checkpoint. Workers also exit by themselves when the learner disappears. A run resumes from its checkpoints like a
single-process one.

Workers and the evaluator act on the CPU; the learner uses ``config.device``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.context import SpawnProcess
from typing import Any

import torch
import torch.multiprocessing as tmp

from jaderl.accel import accelerate, mixed_precision, native_bfloat16
from jaderl.core.agent import Agent
from jaderl.core.config import Config
from jaderl.core.loop import (
    TrainingError,
    TrainResult,
    budget_reason,
    check_actions,
    checked_floats,
    new_counters,
    prepare_run_dir,
    resolve_device,
    restore_state,
    save_state,
)
from jaderl.envs import make_env
from jaderl.interrupts import ForcedInterrupt, deferred_interrupt
from jaderl.parallel.exits import describe_exit, exit_on_sigterm

POLL_S = 0.5
"""How often a waiting process checks on the others (seconds)."""
JOIN_S = 5.0
"""How long shutdown waits for a process to exit by itself before terminating it."""
WORKER_SEED_STRIDE = 10_007
"""Worker w explores sub-envs seeded from ``seed + (w + 1) * WORKER_SEED_STRIDE`` (+ the steps done, on resume)."""


class WorkerError(TrainingError):
    """An explorer worker or the evaluator raised or died; the learner saved a checkpoint and stopped the others."""


@dataclasses.dataclass
class _Spaces:
    """What an agent reads from its env: the learner's agent sees all workers' sub-envs as one batch."""

    num_envs: int
    obs_shape: tuple[int, ...]
    is_discrete: bool
    action_dim: int


@dataclasses.dataclass
class _Shared:
    """The state the learner shares with its children (passed to them at start; tensors in shared memory)."""

    policy: dict[str, torch.Tensor]  # the newest published policy
    eval_policy: dict[str, torch.Tensor]  # the policy of the pending evaluation request
    version: Any  # mp.Value('q'): bumped on every publication
    steps: Any  # mp.Value('q'): the learner's env-step count at the last publication
    lock: Any  # guards policy, version and steps
    stop: Any  # mp.Event: every process ends its loop
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
    if shared.stop.is_set() or _orphaned():
        raise SystemExit(0)


def _child_main(name: str, shared: _Shared, body: Callable[[], None]) -> None:
    """Run ``body`` in a child: SIGINT ignored (the learner decides), SIGTERM raising SystemExit (so ``finally``
    blocks close envs and files), one thread, errors reported by name."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_on_sigterm()
    torch.set_num_threads(1)
    try:
        body()
    except SystemExit:  # told to stop, or the learner is gone
        raise
    except BaseException as exc:  # report anything, then exit non-zero
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
        shared.errors.put((name, f"{type(exc).__name__}: {exc}{where}"))
        raise SystemExit(1) from None


def _explorer(worker: int, config_dict: dict[str, Any], agent_cls: type[Agent], shared: _Shared,
              out: Any, go: Any, start_steps: int) -> None:
    def body() -> None:
        config = agent_cls.config_cls.from_dict(config_dict)
        config = config.replace(seed=_worker_seed(config, worker, start_steps))
        torch.manual_seed(config.seed)
        env = make_env(config.env, config.num_envs, "cpu", seed=config.seed, workers=config.env_workers)
        agent = agent_cls(config, env, torch.device("cpu"))
        if native_bfloat16(agent.device):  # config.precision: act as the learner's networks compute, where that is
            mixed_precision(agent, warn=False)  # not slower (the learner may be a GPU, the explorers a plain CPU)
        agent.steps = start_steps  # config.seed (this worker's, from start_steps) seeds the env
        used = -1
        try:
            while not shared.stop.is_set():
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
                if agent.last_obs is None:
                    agent.last_obs = env.reset(seed=config.seed)
                traj = agent.explore(env, config.horizon)
                episodes = agent._finished.clone()
                agent._finished.zero_()
                while not shared.stop.is_set():
                    try:
                        out.put((traj, episodes, used), timeout=POLL_S)
                        break
                    except queue.Full:
                        if _orphaned():
                            return
        finally:
            out.cancel_join_thread()  # exit even if the learner no longer reads this queue
            env.close()

    _child_main(f"explorer worker {worker}", shared, body)


def _evaluator(config_dict: dict[str, Any], agent_cls: type[Agent], shared: _Shared, requests: Any,
               results: Any, resume_step: int | None) -> None:
    def body() -> None:
        from pathlib import Path

        from jaderl.core.evaluator import Evaluator

        config = agent_cls.config_cls.from_dict(config_dict)
        env = make_env(config.env, config.eval_episodes, "cpu", seed=config.seed + 1)
        agent = agent_cls(config, env, torch.device("cpu"))
        if native_bfloat16(agent.device):  # as the explorers
            mixed_precision(agent, warn=False)
        evaluator = Evaluator(env, Path(config.run_dir), seed=config.seed + 1, resume_step=resume_step)
        results.put(("ready", evaluator.best_return, evaluator.rows[-1]["step"] if evaluator.rows else None))
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
                row = evaluator.evaluate(agent, step, time_s, stats)
                results.put(("eval", row["eval_return_mean"]))
        finally:
            results.cancel_join_thread()
            evaluator.close()

    _child_main("evaluator", shared, body)


class _Pipeline:
    """The learner's side: starts, feeds, watches and stops the worker and evaluator processes."""

    def __init__(self, config: Config, agent_cls: type[Agent], agent: Agent, resume_step: int | None) -> None:
        ctx = tmp.get_context("forkserver")  # children fork from a clean server that has imported jaderl (and torch)
        ctx.set_forkserver_preload(["__main__", "jaderl.parallel.pipeline", "jaderl.algos"])
        self.config, self.agent = config, agent
        policy = _cpu_policy(agent)
        self.shared = _Shared(policy={k: v.share_memory_() for k, v in policy.items()},
                              eval_policy={k: v.clone().share_memory_() for k, v in policy.items()},
                              version=ctx.Value("q", 0), steps=ctx.Value("q", agent.steps), lock=ctx.Lock(),
                              stop=ctx.Event(), errors=ctx.Queue())
        self.trajectories = [ctx.Queue(maxsize=1) for _ in range(config.workers)]
        self.go = [ctx.Semaphore(0) for _ in range(config.workers)]
        self.policy_lag = 0.0  # mean number of publications the policies of the last round were behind
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.eval_pending = False
        self.eval_step = 0  # the step of the pending evaluation
        self.last_eval_step: int | None = None  # the step of the last evaluation in metrics.csv when started
        self.processes: dict[str, SpawnProcess] = {}
        self.processes["evaluator"] = ctx.Process(
            target=_evaluator, name="jaderl-evaluator", daemon=True,
            args=(config.to_dict(), agent_cls, self.shared, self.requests, self.results, resume_step))
        for w in range(config.workers):
            self.processes[f"explorer worker {w}"] = ctx.Process(
                target=_explorer, name=f"jaderl-explorer{w}", daemon=config.env_workers == 0,
                args=(w, config.to_dict(), agent_cls, self.shared, self.trajectories[w], self.go[w], agent.steps))
        self.best_return = -math.inf

    def start(self) -> None:
        """Start the children and wait until the evaluator has set up the run's metrics."""
        for process in self.processes.values():
            process.start()
        _, self.best_return, self.last_eval_step = self._get(self.results, "evaluator")

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
            self.shared.version.value += 1
        if self.agent.on_policy:
            for go in self.go:
                go.release()

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
        self.agent._finished += sum(p[1] for p in parts).to(device)
        self.agent.steps += traj["reward"].numel()
        return traj

    def request_eval(self, step: int, time_s: float, stats: dict[str, float]) -> None:
        """Ask for an evaluation of the current policy; the evaluator must be idle (``eval_pending`` false)."""
        for key, tensor in self.agent.policy_state_dict().items():
            self.shared.eval_policy[key].copy_(tensor)
        self.requests.put((step, time_s, stats))
        self.eval_pending, self.eval_step = True, step

    def poll_eval(self, wait: bool = False) -> float | None:
        """The return of the evaluation that finished since the last call, if any (``wait``: wait for it)."""
        if not self.eval_pending:
            return None
        try:
            _, value = self._get(self.results, "evaluator") if wait else self.results.get_nowait()
        except queue.Empty:
            return None
        self.eval_pending = False
        self.best_return = max(self.best_return, value)
        return value

    def close(self) -> None:
        """Stop every child: ask, wait, then terminate and kill what is left."""
        self.shared.stop.set()
        started = [p for p in self.processes.values() if p.pid is not None]
        if self.processes["evaluator"].is_alive():
            self.requests.put(None)
        deadline = time.monotonic() + JOIN_S
        for process in started:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in started:
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join()
        for q in (*self.trajectories, self.requests, self.results, self.shared.errors):
            q.cancel_join_thread()
            q.close()


def train_pipeline(config: Config, agent_cls: type[Agent], resume: bool = False,
                   progress: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Train with ``config.workers`` explorer processes, this process as the learner and an evaluator process."""
    torch.set_num_threads(config.num_threads)
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    probe = make_env(config.env, 1, "cpu")  # check the env and read its spaces before starting any process
    spaces = _Spaces(config.num_envs * config.workers, probe.obs_shape, probe.is_discrete, probe.action_dim)
    probe.close()
    check_actions(config, agent_cls, spaces.is_discrete)
    run_dir = prepare_run_dir(config, resume)
    agent = agent_cls(config, spaces, device)  # type: ignore[arg-type]  # an agent reads only the spaces
    accelerate(agent)  # config.compile: the learner's act and loss functions (explorers stay eager)
    buffer = agent.make_buffer()
    counters = restore_state(run_dir, agent, buffer) if resume else new_counters(config)
    config.save_yaml(run_dir / "config.yaml")

    def checkpoint() -> None:  # the explorers' envs are not saved: they start afresh, seeded from the steps
        # an evaluation still running may never be recorded (the run can be killed, or end before it finishes):
        # it is due again after a resume, unless metrics.csv holds it by then
        saved = dict(counters)
        if pipeline.eval_pending:
            saved["next_eval"] = min(saved["next_eval"], pipeline.eval_step)
        save_state(run_dir, config, saved, agent, buffer)

    def logged() -> dict[str, float]:  # what an evaluation records beside its result (host syncs: once per eval)
        return checked_floats(stats, agent.steps) | agent.episode_stats() | {"pipeline/policy_lag": pipeline.policy_lag}

    pipeline = _Pipeline(config, agent_cls, agent, resume_step=agent.steps if resume else None)
    last_eval, reason = math.nan, ""
    stats: dict[str, torch.Tensor] = {}
    start = time.perf_counter() - counters["time_s"]
    try:
        pipeline.start()
        if pipeline.last_eval_step is not None and pipeline.last_eval_step >= counters["next_eval"]:
            # the evaluation that was running at the checkpoint was recorded after all
            counters["next_eval"] = (pipeline.last_eval_step // config.eval_every + 1) * config.eval_every
        start = time.perf_counter() - counters["time_s"]
        while not reason:
            traj = pipeline.collect()
            with deferred_interrupt():  # a Ctrl-C waits for the step's end: no checkpoint holds half a step
                if not agent.on_policy:  # what explore() does in one process
                    agent.obs_norm.update(traj["obs"])
                buffer.add(traj)
                stats = agent.update(buffer) or stats
            pipeline.publish()
            counters["time_s"] = time.perf_counter() - start
            reason = budget_reason(config, agent.steps, counters["time_s"], run_dir)
            result = pipeline.poll_eval()
            if result is not None:
                last_eval = result
                if config.target_return is not None and result >= config.target_return:
                    reason = reason or "solved"
            if reason:  # a last evaluation of the final policy, waited for
                pipeline.poll_eval(wait=True)
            # an evaluation that is due while the evaluator is busy is postponed: training goes on meanwhile
            if (agent.steps >= counters["next_eval"] or reason) and not pipeline.eval_pending:
                counters["next_eval"] = (agent.steps // config.eval_every + 1) * config.eval_every
                pipeline.request_eval(agent.steps, counters["time_s"], logged())
            if reason:
                last_eval = pipeline.poll_eval(wait=True)
                if config.target_return is not None and last_eval >= config.target_return:
                    reason = "solved"
            if agent.steps >= counters["next_checkpoint"] or reason:
                counters["next_checkpoint"] = (agent.steps // config.checkpoint_every + 1) * config.checkpoint_every
                checkpoint()
            if progress is not None:
                progress({"steps": agent.steps, "time_s": counters["time_s"], "eval_return": last_eval,
                          "best_eval_return": pipeline.best_return, "done": bool(reason)})
    except ForcedInterrupt:  # a second Ctrl-C cut a step short: its state is not saved
        raise
    except KeyboardInterrupt:
        counters["time_s"] = time.perf_counter() - start
        checkpoint()
        reason = "interrupted"
    except WorkerError:
        checkpoint()  # the learner's state is sound: keep it
        raise
    finally:
        pipeline.close()
    solved = config.target_return is not None and pipeline.best_return >= config.target_return
    return TrainResult(solved=solved, steps=agent.steps, time_s=round(counters["time_s"], 3),
                       best_eval_return=pipeline.best_return, last_eval_return=last_eval, stop_reason=reason,
                       run_dir=str(run_dir))
