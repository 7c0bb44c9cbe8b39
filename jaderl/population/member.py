"""A population member: one :class:`~jaderl.Trainer` that a Ray actor holds, driven through the Trainer's own verbs.

The member trains to a step target (``run(steps=...)``), reports the evaluation its period ended with, gives its whole
state (``state_dict()``) to the object store, and takes another member's state and new hyperparameters
(``load_state_dict()`` and ``set_hyperparameters()``). It checkpoints into its own run directory at every period's end
and after every copy, so a member whose process dies is restarted from its last state, and the population directory
always holds every member as an ordinary run directory.

:class:`Member` is a plain class; :func:`remote_member` makes it a Ray actor class (Ray is imported only then).
:class:`Standby` is an idle worker with jaderl (and torch) already imported that becomes a member when one dies, so
the member trains again in seconds instead of waiting for a new process to import torch.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from jaderl.api import ALGOS, make_config
from jaderl.core.checkpoint import CHECKPOINT_JSON, save_tensors
from jaderl.core.evaluator import BEST_POLICY
from jaderl.core.loop import Trainer, TrainingError
from jaderl.envs.vec import NONFINITE_ACTIONS, EnvError


class Member:
    """One member: a Trainer built from ``settings`` (a config as a dict, naming its ``algo``, ``env`` and
    ``run_dir``). It continues from the checkpoint in that directory when there is one (a restarted member, a resumed
    population); otherwise it starts afresh there with ``hyperparameters``, clearing what a member that died before
    its first period's end left behind."""

    def __init__(self, settings: dict[str, Any], hyperparameters: dict[str, float] | None = None) -> None:
        # the hyperparameters are the config's: a fresh member starts with them, and a restarted one keeps them
        # (a resumed Trainer applies the config's values over its checkpoint's, which are the same unless they moved)
        config = make_config(**{**settings, **(hyperparameters or {})})
        run_dir = Path(config.run_dir)
        resume = (run_dir / CHECKPOINT_JSON).exists()
        if not resume and run_dir.exists():
            shutil.rmtree(run_dir)
        self.trainer = Trainer(config, ALGOS[config.algo].agent_cls, resume=resume)

    def describe(self) -> dict[str, Any]:
        """Where it runs and what it is: env steps, mutable hyperparameters, run directory, host, Ray node, process."""
        trainer = self.trainer
        return {"steps": trainer.agent.steps, "run_dir": str(trainer.run_dir), "algo": trainer.config.algo,
                "hyperparameters": {k: getattr(trainer.config, k) for k in trainer.agent.hyperparameters},
                "host": socket.gethostname(), "node": _node_id(), "pid": os.getpid()}

    def train_until(self, steps: int | None = None, time_s: float | None = None) -> dict[str, Any]:
        """Train until ``steps`` env steps, or until ``time_s`` seconds of this run's training time (nothing if already
        there), evaluate and checkpoint; returns ``{"steps", "score", "stop_reason"}`` with the score of the
        evaluation at the end (a run that could not evaluate scores -inf)."""
        trainer = self.trainer
        try:
            if steps is not None and steps > trainer.agent.steps:
                reason = trainer.run(steps=steps - trainer.agent.steps).stop_reason  # evaluates, checkpoints at the end
                score = trainer.last_eval
            elif time_s is not None and time_s > trainer.time_s:
                reason = trainer.run(until_time_s=time_s).stop_reason
                score = trainer.last_eval
            else:  # reached in an earlier attempt (a population resumed after its driver died): its evaluation then
                rows = [] if trainer.evaluator is None else trainer.evaluator.rows
                reason, score = "period", rows[-1]["eval_return_mean"] if rows else math.nan
                if not rows or rows[-1]["step"] != trainer.agent.steps:  # (it died before evaluating)
                    score = trainer.evaluate()
                    trainer.checkpoint()
        except EnvError as exc:  # NaN actions (continuous ones reach the env before a NaN checkpoint): diverged too
            if exc.args != (NONFINITE_ACTIONS,):
                raise
            raise TrainingError(f"the agent diverged by step {trainer.agent.steps}: {exc}") from None
        return {"steps": trainer.agent.steps, "score": score if math.isfinite(score) else -math.inf,
                "stop_reason": reason}

    def train_for(self, steps: int) -> dict[str, Any]:
        """Train ``steps`` more env steps (see :meth:`train_until`)."""
        return self.train_until(steps=self.trainer.agent.steps + steps)

    def state(self, include_buffer: bool = True) -> dict[str, Any]:
        """The Trainer's whole state (without the replay buffer unless ``include_buffer``) and the best policy this
        run saved (its tensors and metadata; None before its first evaluation), for another member."""
        state = self.trainer.state_dict()
        return {**state, "best_policy": read_best_policy(self.trainer.run_dir)} | \
            ({} if include_buffer else {"buffer": None})

    def exploit(self, state: dict[str, Any], hyperparameters: dict[str, float]) -> None:
        """Continue from another member's ``state`` (networks, optimizers, normalisers, counters, the env's state, its
        replay buffer if the state holds one) with ``hyperparameters``, keeping this member's own random streams so
        the copy does not retrace its parent's steps; then checkpoint."""
        trainer = self.trainer
        own_rng, generator = trainer.rng, getattr(trainer.env, "generator", None)
        own_env_rng = None if generator is None else generator.get_state()
        own_buffer = list(trainer.buffer.state_dict()) if state["buffer"] is None else None
        best, state = state.get("best_policy"), {k: v for k, v in state.items() if k != "best_policy"}
        write_best_policy(trainer.run_dir, best)  # the parent's best policy goes with its evaluation history
        trainer.load_state_dict(state if own_buffer is None else {**state, "buffer": own_buffer})
        if own_buffer is not None:  # its own transitions stay; their episodes end where the parent's begin
            trainer.buffer.load_state_dict(*own_buffer, cut_episodes=True)
        trainer.rng = own_rng
        if generator is not None:  # the env's own stream (its resets) too
            generator.set_state(own_env_rng)
        if hyperparameters:  # (none when every one is set for every member: nothing is searched)
            trainer.set_hyperparameters(**hyperparameters)
        trainer.checkpoint()

    def reseed(self, seed: int) -> None:
        """Draw from new random streams (:meth:`Trainer.reseed`): a member continued from a copy of another run."""
        self.trainer.reseed(seed)

    def set_hyperparameters(self, values: dict[str, float]) -> None:
        """Change hyperparameters now (those that differ, recorded in the run's config.yaml) and checkpoint."""
        if changed := {k: v for k, v in values.items() if getattr(self.trainer.config, k, None) != v}:
            self.trainer.set_hyperparameters(**changed)
        self.trainer.checkpoint()

    def close(self) -> None:
        """Close the Trainer's envs and evaluator (its last plot)."""
        self.trainer.close()


class Standby(Member):
    """An idle process with jaderl imported, holding no resources, that :meth:`start` turns into a member (a member
    whose process died continues on it; a new standby is started behind it)."""

    def __init__(self) -> None:
        """jaderl and torch come with this module and the Trainer with :meth:`start`; the first optimizer that a
        process builds imports the rest of torch that training needs (``torch._dynamo``, about 1.6 s of CPU time),
        so the standby builds one now, while it waits."""
        torch.optim.Adam([torch.zeros(1, requires_grad=True)])

    def start(self, settings: dict[str, Any], hyperparameters: dict[str, float] | None = None) -> int:
        """Become the member ``Member(settings, hyperparameters)`` (after the previous one's :meth:`close`, whose
        Trainer, replay buffer included, is freed first); returns this process's id."""
        if self.__dict__.pop("trainer", None) is not None:
            gc.collect()
        Member.__init__(self, settings, hyperparameters)
        return os.getpid()


BestPolicy = tuple[dict[str, torch.Tensor], dict[str, str]]
"""A run's best policy as :data:`~jaderl.core.evaluator.BEST_POLICY` holds it: its tensors and its metadata (the
step and the score of the evaluation it came from)."""


def read_best_policy(run_dir: Path) -> BestPolicy | None:
    """The best policy that ``run_dir`` saved (None before its first evaluation)."""
    path = run_dir / BEST_POLICY
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})  # noqa: SIM118


def write_best_policy(run_dir: Path, best: BestPolicy | Sequence[Any] | None) -> None:
    """Make ``best`` (from :func:`read_best_policy`, or its tensors and metadata as a list) the best policy of
    ``run_dir``; None removes the one there (a run copied from one that has not evaluated yet)."""
    path = run_dir / BEST_POLICY
    if best is None:
        path.unlink(missing_ok=True)
    else:
        tensors, metadata = best
        save_tensors(path, tensors, metadata)


def _node_id() -> str:
    """The Ray node this process runs on (the first 12 hex digits of its id; "local" outside Ray)."""
    import ray

    return str(ray.get_runtime_context().get_node_id() or "local")[:12] if ray.is_initialized() else "local"


def remote_member(ray: Any, options: dict[str, Any]) -> Any:
    """:class:`Member` as a Ray actor class with ``options`` (``num_cpus``, ``num_gpus``); Ray does not restart it
    by itself: the population restarts a dead member from its checkpoint."""
    return ray.remote(max_restarts=0, max_concurrency=1, **options)(Member)


def remote_worker(ray: Any, options: dict[str, Any]) -> Any:
    """:class:`Standby` as a Ray actor class holding ``options`` (``num_cpus``, ``num_gpus``) while it lives: a process
    that :meth:`Standby.start` makes a member, then, after the member's :meth:`Member.close`, the next member (the
    tournament's members)."""
    return ray.remote(max_restarts=0, max_concurrency=1, **options)(Standby)


def remote_standby(ray: Any) -> Any:
    """:class:`Standby` as a Ray actor class. It holds no CPU while idle; it takes over a dead member's work, and the
    dead member's resources are free again by then. It holds no GPU either (a process sees only the GPUs Ray gave
    it), so members with GPUs restart in a new process."""
    return ray.remote(max_restarts=0, max_concurrency=1, num_cpus=0, num_gpus=0)(Standby)
