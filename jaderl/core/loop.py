"""The single-process training loop: explore -> store -> update -> log -> evaluate -> checkpoint.

``train(config, AgentClass)`` runs until the evaluation reaches ``target_return``, ``total_steps`` env steps are
done, ``time_limit`` seconds have passed, or a file named ``stop`` appears in the run directory (Ctrl-C stops it
too, after a last checkpoint). Pass ``resume=True`` with ``config.run_dir`` set to continue from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import torch

from jaderl.accel import accelerate
from jaderl.core.agent import Agent
from jaderl.core.checkpoint import CHECKPOINT_JSON, load_checkpoint, save_checkpoint
from jaderl.core.config import Config, ConfigError
from jaderl.core.evaluator import Evaluator
from jaderl.envs import VecEnv, make_env
from jaderl.interrupts import ForcedInterrupt, deferred_interrupt


class TrainingError(RuntimeError):
    """Training cannot go on (for example a loss became NaN); the last checkpoint is kept."""


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
    """Makes ``train`` one of several data-parallel learners (implemented by :mod:`jaderl.parallel.ddp`)."""

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
        raise ConfigError(f"device={name!r} was asked for but CUDA is not available; use --device cpu")
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


def train(config: Config, agent_cls: type[Agent], resume: bool = False,
          progress: Callable[[dict[str, Any]], None] | None = None,
          coordinator: Coordinator | None = None) -> TrainResult:
    """Train ``agent_cls`` as ``config`` says, in this process; returns the run's summary. With a ``coordinator``,
    this process is one of several learners and ``config.run_dir`` must already exist."""
    torch.set_num_threads(config.num_threads)
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    env = make_env(config.env, config.num_envs, device, seed=config.seed, workers=config.env_workers)
    try:  # a failing set-up (bad checkpoint, run directory, peers) closes the env: no worker process outlives it
        check_actions(config, agent_cls, env.is_discrete)
        run_dir = prepare_run_dir(config, resume) if coordinator is None else Path(config.run_dir)
        agent = agent_cls(config, env, device)
        accelerate(agent)  # config.compile: compiled act and loss functions, eager fallback
        buffer = agent.make_buffer()
        counters = restore_state(run_dir, agent, buffer, env) if resume else new_counters(config)
        if coordinator is not None:
            coordinator.attach(agent)
        config.save_yaml(run_dir / "config.yaml")
        evaluator: Evaluator | None = None  # learners r > 0 neither evaluate nor log: no eval env, metrics.csv, tb/
        if coordinator is None or coordinator.is_main:
            eval_env = make_env(config.env, config.eval_episodes, device, seed=config.seed + 1)
            evaluator = Evaluator(eval_env, run_dir, seed=config.seed + 1, resume_step=agent.steps if resume else None)
    except BaseException:
        env.close()
        raise

    def checkpoint() -> None:
        save_state(run_dir, config, counters, agent, buffer, env)

    def best_return() -> float:
        return evaluator.best_return if evaluator is not None else -math.inf

    last_eval, reason = math.nan, ""
    start = time.perf_counter() - counters["time_s"]
    stats: dict[str, torch.Tensor] = {}
    try:
        while not reason:
            # 1. explore, store, update (a Ctrl-C waits for the step's end: no checkpoint holds half a step)
            with deferred_interrupt():
                traj = agent.explore(env, config.horizon)
                buffer.add(traj)
                stats = agent.update(buffer) or stats
                if coordinator is not None:
                    coordinator.after_update(agent)
            counters["time_s"] = time.perf_counter() - start
            # 2. decide whether to stop (the evaluation below may also stop it)
            reason = budget_reason(config, agent.steps, counters["time_s"], run_dir)
            # 3. evaluate and log (the only host syncs of the loop)
            if evaluator is not None and (agent.steps >= counters["next_eval"] or reason):
                logged = checked_floats(stats, agent.steps) | agent.episode_stats()
                last_eval = evaluator.evaluate(agent, agent.steps, counters["time_s"], logged)["eval_return_mean"]
                # only now: an evaluation cut short by Ctrl-C is due again after a resume
                counters["next_eval"] = (agent.steps // config.eval_every + 1) * config.eval_every
                counters["time_s"] = time.perf_counter() - start  # the evaluation counts as training time
                if config.target_return is not None and last_eval >= config.target_return:
                    reason = "solved"
            if coordinator is not None:
                reason = coordinator.agree(reason)
            # 4. checkpoint
            if agent.steps >= counters["next_checkpoint"] or reason:
                counters["next_checkpoint"] = (agent.steps // config.checkpoint_every + 1) * config.checkpoint_every
                checkpoint()
            if progress is not None:
                progress({"steps": agent.steps, "time_s": counters["time_s"], "eval_return": last_eval,
                          "best_eval_return": best_return(), "done": bool(reason)})
    except ForcedInterrupt:  # a second Ctrl-C cut a step short: its state is not saved
        raise
    except KeyboardInterrupt:
        counters["time_s"] = time.perf_counter() - start
        checkpoint()
        reason = "interrupted"
    finally:
        env.close()
        if evaluator is not None:
            evaluator.close()
    solved = config.target_return is not None and best_return() >= config.target_return
    return TrainResult(solved=solved, steps=agent.steps, time_s=round(counters["time_s"], 3),
                       best_eval_return=best_return(), last_eval_return=last_eval, stop_reason=reason,
                       run_dir=str(run_dir))


def check_actions(config: Config, agent_cls: type[Agent], is_discrete: bool) -> None:
    """One-sentence ConfigError when ``agent_cls`` cannot act in the env's action space."""
    if not (agent_cls.discrete if is_discrete else agent_cls.continuous):
        kind = "discrete" if is_discrete else "continuous"
        raise ConfigError(f"{config.algo or agent_cls.__name__} does not support the {kind} actions of {config.env}; "
                          "run `jaderl algos` to see which algorithms do")


def new_counters(config: Config) -> dict[str, Any]:
    """The loop's checkpointed counters at the start of a run."""
    return {"time_s": 0.0, "next_eval": config.eval_every, "next_checkpoint": config.checkpoint_every}


def restore_state(run_dir: Path, agent: Agent, buffer: Any, env: VecEnv | None = None) -> dict[str, Any]:
    """Load the last checkpoint of ``run_dir`` into ``agent``, ``buffer``, torch's RNGs and ``env``'s generator (if
    it has one); returns the loop's counters."""
    state = load_checkpoint(run_dir)
    agent.load_state_dict(state["agent"])
    buffer.load_state_dict(*state["buffer"])
    torch.set_rng_state(state["rng"]["torch"])
    if agent.device.type == "cuda" and state["rng"].get("cuda") is not None:
        torch.cuda.set_rng_state(state["rng"]["cuda"], agent.device)
    if env is not None and state["rng"].get("env") is not None:
        env.set_rng_state(state["rng"]["env"])  # the next reset draws from it, not from the env's seed
    return state["counters"]


def save_state(run_dir: Path, config: Config, counters: dict[str, Any], agent: Agent, buffer: Any,
               env: VecEnv | None = None) -> None:
    """Checkpoint everything :func:`restore_state` reads back; a diverged agent (a parameter that is NaN or infinite)
    raises :class:`TrainingError` instead of replacing the last good checkpoint."""
    params = [p for m in vars(agent).values() if isinstance(m, torch.nn.Module) for p in m.parameters()]
    if params and not torch.stack([p.isfinite().all() for p in params]).all():
        raise TrainingError(f"the agent's parameters became NaN or infinite by step {agent.steps}; lower the "
                            "learning rate or check the env's rewards (the last checkpoint is kept)")
    generator = getattr(env, "generator", None)
    rng = {"torch": torch.get_rng_state(),
           "cuda": torch.cuda.get_rng_state(agent.device) if agent.device.type == "cuda" else None,
           "env": generator.get_state() if generator is not None else None}
    state = {"config": config.to_dict(), "counters": counters, "agent": agent.state_dict(),
             "buffer": list(buffer.state_dict()), "rng": rng}
    save_checkpoint(run_dir, state, agent.steps)


def budget_reason(config: Config, steps: int, time_s: float, run_dir: Path) -> str:
    """Why the run must stop now for its budgets or a ``stop`` file (consumed), or "" to go on."""
    if steps >= config.total_steps:
        return "total_steps"
    if config.time_limit is not None and time_s >= config.time_limit:
        return "time_limit"
    if (run_dir / "stop").exists():
        (run_dir / "stop").unlink()
        return "stop_file"
    return ""


def checked_floats(stats: dict[str, torch.Tensor], step: int) -> dict[str, float]:
    values = {k: float(v) for k, v in stats.items()}
    if bad := [k for k, v in values.items() if not math.isfinite(v)]:
        raise TrainingError(f"{bad[0]} became {values[bad[0]]} by step {step}; lower the learning rate or check the "
                            "env's rewards (the last checkpoint is kept)")
    return values
