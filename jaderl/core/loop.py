"""The Trainer: one training run, explore -> store -> update -> evaluate -> checkpoint, one iteration per ``step()``.

    with Trainer(config, PPO) as trainer:       # builds the env, the agent, the buffer and the run directory
        trainer.step()                           # one iteration; returns its named statistics
        result = trainer.run()                   # iterate until a stop condition; evaluations and checkpoints
        state = trainer.state_dict()             # the whole run in memory: copy it into another Trainer ...
        other.load_state_dict(state)             # ... which continues exactly as this one would

``run()`` stops when an evaluation reaches ``target_return``, after ``total_steps`` env steps (or the ``steps`` it is
given), after ``time_limit`` seconds, when a file named ``stop`` appears in the run directory, or on Ctrl-C (after a
last checkpoint). Every way of training drives this class: alone (:func:`train`), as one of several data-parallel
learners (a :class:`Coordinator`), behind explorer processes (:mod:`jaderl.parallel.pipeline` overrides ``collect``,
``after_update`` and the evaluator), or as a member of a population.

A Trainer owns its random streams: torch's generators are swapped in for each of its steps and evaluations and out
again, so several Trainers in one process do not disturb each other. Its state holds the env's own state when the
env can give it (torch-native envs: a copy continues bit for bit); other envs (Gymnasium's) restart their episodes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import torch

from jaderl.accel import accelerate, rng_state, set_rng_state
from jaderl.core.agent import Agent
from jaderl.core.buffers import Batch
from jaderl.core.checkpoint import CHECKPOINT_JSON, atomic_write, finite_or_raise, load_checkpoint, save_checkpoint
from jaderl.core.config import Config, ConfigError
from jaderl.core.evaluator import Evaluator
from jaderl.envs import EnvSpec, VecEnv, make_env
from jaderl.interrupts import ForcedInterrupt, deferred_interrupt

VIDEO_RECORDER: list[tuple[Callable[[Agent, Path], object], Callable[[Config], None]]] = []
"""What ``record_every`` records with, ``(record(agent, out_dir), check(config))``: installed by
:mod:`jaderl.integrations.video` (above the core, which cannot import it)."""

INTERRUPT_GRACE_S = 5.0
"""After Ctrl-C, how long a run waits for an evaluation under way before its last checkpoint (one not finished by
then is due again after a resume)."""


class TrainingError(RuntimeError):
    """Training cannot go on (for example a loss became NaN); the last checkpoint is kept."""


class PeerError(TrainingError):
    """A process beside the trainer failed; the trainer's own state is sound, so it is checkpointed first."""


@dataclasses.dataclass
class TrainResult:
    """What a finished run reports (``jaderl train --json`` prints it)."""

    solved: bool
    steps: int
    time_s: float
    best_eval_return: float
    last_eval_return: float
    stop_reason: str
    run_dir: str


class Coordinator(Protocol):
    """Makes a Trainer one of several data-parallel learners (implemented by :mod:`jaderl.parallel.ddp`)."""

    is_main: bool
    """Whether this learner evaluates and reports; every learner checkpoints into its own ``config.run_dir``."""

    def attach(self, agent: Agent) -> None:
        """Give ``agent`` the same state as every other learner's and average its gradients from now on."""

    def after_update(self, agent: Agent) -> None:
        """Count the other learners' env steps in ``agent.steps`` and merge state learned outside gradients."""

    def agree(self, reason: str) -> str:
        """The stop reason of the main learner, the same on every learner."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} was asked for but CUDA is not available; use device cpu (--device cpu)")
    device = torch.device(name)
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"device={name!r}: only {torch.cuda.device_count()} GPUs are visible; use a lower index")
    return device


def prepare_run_dir(config: Config, resume: bool) -> Path:
    if resume:
        return Path(config.run_dir)
    if not config.run_dir:  # a new directory of its own, even for runs started in the same second
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        env = re.sub(r"[^\w.-]+", "_", config.env)[:64]  # ids may hold paths and options (`?csv=...`)
        base = Path("runs") / f"{config.algo or 'agent'}-{env}-s{config.seed}-{stamp}"
        for k in range(1, 1000):
            run_dir = base if k == 1 else base.with_name(f"{base.name}-{k}")
            with contextlib.suppress(FileExistsError):
                run_dir.mkdir(parents=True)  # atomic: exactly one run creates it
                config.run_dir = str(run_dir)
                return run_dir
        raise ConfigError(f"could not create a new directory next to {base}; pass --run-dir")
    run_dir = Path(config.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} is a file; pick another --run-dir")
    if run_dir.exists() and any(run_dir.iterdir()):
        ckpt = (run_dir / CHECKPOINT_JSON).exists()
        held = "a run; resume it with --resume" if ckpt else "files but no checkpoint; delete them"
        raise ConfigError(f"run directory {run_dir} already holds {held} or pick another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def check_spec(config: Config, agent_cls: type[Agent], spec: EnvSpec) -> None:
    """One-sentence ConfigError when ``agent_cls`` cannot train on envs like ``spec``."""
    if reason := agent_cls.accepts(spec):
        raise ConfigError(f"{config.algo or agent_cls.__name__} cannot train on {config.env}: {reason}; run "
                          "`jaderl algos` to see which algorithms fit")


class Trainer:
    """One training run of ``agent_cls`` as ``config`` says (see the module docstring). ``resume`` continues the
    checkpoint in ``config.run_dir``; with a ``coordinator`` this Trainer is one of several data-parallel learners
    and ``config.run_dir`` must exist already; ``progress`` is called once per iteration of :meth:`run`."""

    def __init__(self, config: Config, agent_cls: type[Agent], resume: bool = False,
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 coordinator: Coordinator | None = None) -> None:
        torch.set_num_threads(config.num_threads)
        self.config, self.progress, self.coordinator = config, progress, coordinator
        self.device = resolve_device(config.device)
        self.env: VecEnv | None = None
        self.reseed(config.seed)  # this run's own random streams, from its seed
        self.evaluator: Evaluator | None = None
        if config.record_every:  # before anything is made: a missing package, an env it cannot draw: one sentence
            if not VIDEO_RECORDER:
                raise ConfigError("record_every needs jaderl.integrations.video; import jaderl first")
            VIDEO_RECORDER[0][1](config)
        try:  # a failing set-up (bad checkpoint, run directory, peers) closes the env: no worker process outlives it
            with self.own_rng():
                spec = self.make_env()
                check_spec(config, agent_cls, spec)
                self.run_dir = prepare_run_dir(config, resume) if coordinator is None else Path(config.run_dir)
                self.agent = agent_cls(config, spec, self.device)
                accelerate(self.agent)  # config.compile: compiled act and loss functions, eager fallback
                self.buffer = self.agent.make_buffer()
            self.time_s, self.next_eval, self.next_checkpoint = 0.0, config.eval_every, config.checkpoint_every
            self.next_record = config.record_every
            self.history: list[dict[str, Any]] = []  # hyperparameters changed during the run, with the step
            self.stats: dict[str, torch.Tensor] = {}  # the latest update's statistics
            self.last_eval = math.nan
            if coordinator is None or coordinator.is_main:  # learners r > 0 neither evaluate nor log
                self.evaluator = self.make_evaluator()
            if resume:
                self.resume_from(load_checkpoint(self.run_dir))
            if coordinator is not None:
                coordinator.attach(self.agent)
            atomic_write(self.run_dir / "config.yaml", lambda p: self.config.save_yaml(p, self.history))
        except BaseException:
            self.close()
            raise

    # --- what the pipeline replaces ---
    def make_env(self) -> EnvSpec:
        """Build the env that ``collect`` explores; returns its spec."""
        cfg = self.config
        self.env = make_env(cfg.env, cfg.num_envs, self.device, seed=cfg.seed, workers=cfg.env_workers)
        return self.env.spec

    def make_evaluator(self) -> Evaluator:
        env = make_env(self.config.env, self.config.eval_episodes, self.device, seed=self.config.seed + 1)
        return Evaluator(env, self.run_dir, seed=self.config.seed + 1)

    def collect(self) -> Batch:
        """The next trajectory (T, N, ...) to store."""
        assert self.env is not None
        return self.agent.explore(self.env, self.config.horizon)

    def after_update(self) -> None:
        """Called after every update (the pipeline publishes the new policy here)."""

    def logged(self) -> dict[str, float]:
        """What an evaluation records beside its result (host syncs: once per evaluation)."""
        return checked_floats(self.stats, self.agent.steps) | self.agent.episodes.summary()

    # --- the verbs ---
    @contextlib.contextmanager
    def own_rng(self) -> Iterator[None]:
        """Run the block with this Trainer's random streams in torch's generators, and keep what it drew."""
        outer = rng_state(self.device)
        set_rng_state(self.device, self.rng)
        try:
            yield
        finally:
            self.rng = rng_state(self.device)
            set_rng_state(self.device, outer)

    def step(self) -> dict[str, torch.Tensor]:
        """One iteration: explore, store, update; returns the update's named statistics (empty while warming up).
        A Ctrl-C waits for the step's end, so no state holds half a step."""
        start = time.perf_counter()
        with deferred_interrupt(), self.own_rng():
            self.buffer.add(self.collect())
            stats = self.agent.update(self.buffer)
            if self.coordinator is not None:
                self.coordinator.after_update(self.agent)
            self.after_update()
        self.stats = stats or self.stats
        self.time_s += time.perf_counter() - start
        return stats

    def evaluate(self) -> float:
        """Evaluate the current policy now (recorded in metrics.csv); returns the mean return. The schedule counts
        from it: the next scheduled evaluation comes ``eval_every`` env steps later."""
        if self.evaluator is None:
            raise TrainingError("this learner does not evaluate: learner 0 does")
        with self.own_rng():
            self.evaluator.request(self.agent, self.agent.steps, self.time_s, self.logged())
        self.next_eval = self.agent.steps + self.config.eval_every
        return self._evaluated(self.evaluator.poll(wait=True))

    def _evaluated(self, value: float | None) -> float:
        """Keep the mean return of an evaluation that finished (None: none did) and return it (NaN for none)."""
        if value is not None:
            self.last_eval = value
        return value if value is not None else math.nan

    def run(self, steps: int | None = None, until_time_s: float | None = None) -> TrainResult:
        """Train until a stop condition (see the module docstring); ``steps``: at most this many more env steps
        (stop reason ``period``), e.g. one period of a population member; ``until_time_s``: until the run's training
        time (``time_s``, counted over resumes) reaches this many seconds (stop reason ``time_limit``)."""
        until = None if steps is None else self.agent.steps + steps
        reason = ""
        try:
            while not reason:
                self.step()
                reason = self.budget_reason(until, until_time_s)
                reason = self._evaluate_if_due(reason)
                self.record_if_due()
                if self.coordinator is not None:
                    reason = self.coordinator.agree(reason)
                if self.agent.steps >= self.next_checkpoint or reason:
                    self.next_checkpoint = (self.agent.steps // self.config.checkpoint_every + 1) \
                        * self.config.checkpoint_every
                    self.checkpoint()
                if self.progress is not None:
                    rows = self.evaluator.rows if self.evaluator is not None else []  # the evaluation's own step
                    self.progress({"steps": self.agent.steps, "time_s": self.time_s, "eval_return": self.last_eval,
                                   "eval_step": rows[-1]["step"] if rows else None,
                                   "best_eval_return": self.best_return, "done": bool(reason)})
        except ForcedInterrupt:  # a second Ctrl-C cut a step short: its state is not saved
            raise
        except KeyboardInterrupt:
            if self.evaluator is not None:  # an evaluation under way (the pipeline's) that ends soon is recorded
                self._evaluated(self.evaluator.poll(wait=INTERRUPT_GRACE_S))
            self.checkpoint()
            reason = "interrupted"
        except PeerError as exc:
            self.checkpoint()
            raise type(exc)(f"{exc}; the run was checkpointed at step {self.agent.steps}: continue it with `jaderl "
                            f"train --resume {self.run_dir}`") from exc
        solved = self.config.target_return is not None and self.best_return >= self.config.target_return
        return TrainResult(solved=solved, steps=self.agent.steps, time_s=round(self.time_s, 3),
                           best_eval_return=self.best_return, last_eval_return=self.last_eval, stop_reason=reason,
                           run_dir=str(self.run_dir))

    def _evaluate_if_due(self, reason: str) -> str:
        """Take a finished evaluation, start one when due (always when stopping: the final policy, waited for); an
        evaluator still busy (the pipeline's) postpones the next one while training goes on."""
        evaluator, target, every = self.evaluator, self.config.target_return, self.config.eval_every
        if evaluator is None:
            return reason
        start = time.perf_counter()
        results = [evaluator.poll(wait=bool(reason))]  # an evaluation under way finishes first when stopping
        if (self.agent.steps >= self.next_eval or reason) and evaluator.pending_step is None:
            with self.own_rng():
                evaluator.request(self.agent, self.agent.steps, self.time_s, self.logged())
            # only now: an evaluation cut short by Ctrl-C is due again after a resume; the next point of the
            # schedule, every eval_every env steps from the first (or from an evaluation by hand)
            self.next_eval += ((self.agent.steps - self.next_eval) // every + 1) * every
            results.append(evaluator.poll(wait=bool(reason)))
        for value in map(self._evaluated, results):
            if target is not None and value >= target:
                reason = "solved"
        self.time_s += time.perf_counter() - start  # the evaluation counts as training time
        return reason

    @property
    def best_return(self) -> float:
        return self.evaluator.best_return if self.evaluator is not None else -math.inf

    def budget_reason(self, until: int | None = None, until_time_s: float | None = None) -> str:
        """Why the run must stop now for its budgets (``until``: an env step; ``until_time_s``: a training time
        besides ``time_limit``) or a ``stop`` file (consumed), or "" to go on."""
        limits = [s for s in (self.config.time_limit, until_time_s) if s is not None]
        due = {"total_steps": self.agent.steps >= self.config.total_steps,
               "period": until is not None and self.agent.steps >= until,
               "time_limit": bool(limits) and self.time_s >= min(limits), "stop_file": (self.run_dir / "stop").exists()}
        if due["stop_file"]:  # consumed whichever reason ends the run, so a resume does not stop at once
            (self.run_dir / "stop").unlink()
        return next((reason for reason, reached in due.items() if reached), "")

    # --- state ---
    def state_dict(self) -> dict[str, Any]:
        """The whole run: networks, optimizers, buffer, normalisers, counters, random streams, the env's state (when
        it has one), evaluations and hyperparameter history; tensors are the live ones (copy before changing them)."""
        env_state = None if self.env is None else self.env.state_dict()
        next_eval, evaluator, every = self.next_eval, self.evaluator, self.config.eval_every
        # an evaluation still running (the pipeline's) is due again after a load; one recorded when a Ctrl-C came
        # before the loop set the next one is not
        if evaluator is not None and evaluator.pending_step is not None:
            next_eval = min(next_eval, evaluator.pending_step)
        elif evaluator is not None and evaluator.rows and evaluator.rows[-1]["step"] >= next_eval:
            next_eval += ((evaluator.rows[-1]["step"] - next_eval) // every + 1) * every
        return {"config": self.config.to_dict(), "history": self.history, "agent": self.agent.state_dict(),
                "counters": {"time_s": self.time_s, "next_eval": next_eval, "next_checkpoint": self.next_checkpoint},
                "buffer": list(self.buffer.state_dict()), "rng": {"torch": self.rng[0], "cuda": self.rng[1]},
                "env": env_state, "last_obs": None if env_state is None else self.agent.last_obs,
                "episodes": self.agent.episodes.state_dict(),
                "evaluator": None if self.evaluator is None else self.evaluator.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (of this run, another Trainer or a checkpoint). The state's mutable
        hyperparameters come with it (they live in its optimizers)."""
        finite_or_raise({"agent": state["agent"], "buffer": state["buffer"][0]}, "the state to load")
        self.agent.load_state_dict(copy.deepcopy(state["agent"]))  # optimizers would share another's live tensors
        mutable = {k: v for k, v in state["config"].items() if k in self.agent.hyperparameters}
        self.config = self.agent.config = self.config.replace(**mutable)
        self.agent.apply_hyperparameters()
        self.history = list(state["history"])
        counters, steps, cfg, saved = state["counters"], self.agent.steps, self.config, state["config"]
        # a point already due stays due, and so does the next one of an unchanged cadence (the evaluations' may count
        # from an evaluation by hand); a cadence a resume changes starts afresh
        self.next_eval, self.next_checkpoint, self.next_record = (
            due if due <= steps or every == saved.get(name) else (steps // every + 1) * every if every else 0
            for due, every, name in ((counters["next_eval"], cfg.eval_every, "eval_every"),
                                     (counters["next_checkpoint"], cfg.checkpoint_every, "checkpoint_every"),
                                     (math.inf, cfg.record_every, None)))
        self.time_s = counters["time_s"]
        continued = (state["env"] is not None and state["last_obs"] is not None  # (none before the first step)
                     and self.env is not None and self.env.state_dict() is not None)
        self.buffer.load_state_dict(*state["buffer"], cut_episodes=not continued)
        self.rng = (state["rng"]["torch"].clone(), None if state["rng"]["cuda"] is None else state["rng"]["cuda"])
        self.agent.episodes.load_state_dict(state["episodes"])
        self.agent.last_obs = None  # the next explore resets the env, seeded from the steps done
        if continued:
            self.env.load_state_dict(state["env"])
            self.agent.last_obs = state["last_obs"].to(self.device, copy=True)
        else:
            self.agent.restart_episodes()
        if self.evaluator is not None and state["evaluator"] is not None:
            self.evaluator.load_state_dict(state["evaluator"])

    def record_if_due(self) -> None:
        """Record videos of the policy into ``videos/step-N`` when ``record_every`` env steps have passed since the
        last recording (the process that evaluates)."""
        if self.config.record_every and self.evaluator is not None and self.agent.steps >= self.next_record:
            self.next_record = (self.agent.steps // self.config.record_every + 1) * self.config.record_every
            VIDEO_RECORDER[0][0](self.agent, self.run_dir / "videos" / f"step-{self.agent.steps}")

    def resume_from(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's state, then apply the hyperparameters this run's config changes (recorded in the
        history that config.yaml shows)."""
        wanted = {k: getattr(self.config, k) for k in self.agent.hyperparameters}
        try:
            self.load_state_dict(state)
        except (KeyError, TypeError, IndexError, RuntimeError) as exc:  # tensors or entries at odds with its config
            raise exc if isinstance(exc, torch.OutOfMemoryError) else ConfigError(  # (too large for this device)
                f"{self.run_dir} holds a damaged checkpoint ({' '.join(str(exc).split())[:200]}); restore the run "
                "directory from a copy or start a new run") from None
        if changed := {k: v for k, v in wanted.items() if v != getattr(self.config, k)}:
            self.set_hyperparameters(**changed)

    def set_hyperparameters(self, **values: Any) -> None:
        """Change the agent's mutable hyperparameters now (see :meth:`Agent.set_hyperparameters`), recorded in the
        run's history and config.yaml."""
        old = {k: getattr(self.config, k) for k in values if hasattr(self.config, k)}
        self.agent.set_hyperparameters(**values)
        self.config = self.config.replace(**values)
        self.history.append({"step": self.agent.steps, "changed": {k: [old.get(k), v] for k, v in values.items()}})
        atomic_write(self.run_dir / "config.yaml", lambda p: self.config.save_yaml(p, self.history))

    def reseed(self, seed: int) -> None:
        """New random streams from ``seed``: torch's (exploration noise, minibatches) and the env's own (its
        resets), so a run continued from a copy of another's checkpoint does not retrace that run's draws."""
        outer = rng_state(self.device)
        torch.manual_seed(seed)
        self.rng = rng_state(self.device)
        set_rng_state(self.device, outer)
        if self.env is not None and (generator := getattr(self.env, "generator", None)) is not None:
            generator.manual_seed(seed)

    def checkpoint(self) -> None:
        """Write :meth:`state_dict` into the run directory; a diverged agent (a parameter that is NaN or infinite)
        raises :class:`TrainingError` instead of replacing the last good checkpoint."""
        start = time.perf_counter()
        params = self.agent.parameters()
        if params and not torch.stack([p.isfinite().all() for p in params]).all():
            raise TrainingError(f"the agent's parameters became NaN or infinite by step {self.agent.steps}; lower "
                                "the learning rate or check the env's rewards (the last checkpoint is kept)")
        self.time_s += time.perf_counter() - start
        save_checkpoint(self.run_dir, self.state_dict(), self.agent.steps)

    def close(self, plot: bool = True) -> None:
        """Close the envs and the evaluator (its files, its plot unless ``plot`` is false); the agent stays usable."""
        if self.env is not None:
            self.env.close()
        if self.evaluator is not None:
            self.evaluator.close(plot)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def train(config: Config, agent_cls: type[Agent], resume: bool = False,
          progress: Callable[[dict[str, Any]], None] | None = None,
          coordinator: Coordinator | None = None) -> TrainResult:
    """Train ``agent_cls`` as ``config`` says, in this process, until a stop condition; returns the run's summary."""
    with Trainer(config, agent_cls, resume=resume, progress=progress, coordinator=coordinator) as trainer:
        return trainer.run()


def checked_floats(stats: dict[str, torch.Tensor], step: int) -> dict[str, float]:
    values = {k: float(v) for k, v in stats.items()}
    if bad := [k for k, v in values.items() if not math.isfinite(v)]:
        raise TrainingError(f"{bad[0]} became {values[bad[0]]} by step {step}; lower the learning rate or check the "
                            "env's rewards (the last checkpoint is kept)")
    return values
