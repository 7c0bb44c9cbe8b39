"""The Python API: train, resume, load and evaluate agents by registry name.

    >>> import jaderl
    >>> result = jaderl.train("ppo", "jaderl/CartPole-v1", target_return=475, run_dir="runs/ppo-cartpole")
    >>> agent = jaderl.load(result.run_dir)
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import numbers
import os
import re
import shutil
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from jaderl.accel import mixed_precision
from jaderl.algos import ALGOS as SINGLE_AGENT_ALGOS
from jaderl.algos import AlgoSpec
from jaderl.algos.base import ReturnNorm
from jaderl.core.agent import Agent
from jaderl.core.checkpoint import CHECKPOINT_JSON, finite_or_raise, load_checkpoint
from jaderl.core.config import Config, ConfigError
from jaderl.core.evaluator import BEST_POLICY, run_episodes
from jaderl.core.loop import Trainer, TrainingError, TrainResult, resolve_device
from jaderl.core.loop import train as train_loop
from jaderl.envs import EnvError, EnvSpec, make_env
from jaderl.envs.atari import is_atari_id
from jaderl.envs.stock import with_absolute_csv
from jaderl.marl import MARL_ALGOS
from jaderl.marl.base import TeamRewardWarning
from jaderl.zoo import ZooEntry, lookup

Progress = Callable[[dict[str, Any]], None]

ALGOS: dict[str, AlgoSpec] = {**SINGLE_AGENT_ALGOS, **MARL_ALGOS}
"""Every registered algorithm, single- and multi-agent, by name."""


def _run_dir(run_dir: Any) -> Path:
    """``run_dir`` as a Path, or one sentence when it is not a path at all."""
    if not isinstance(run_dir, str | os.PathLike):
        raise ConfigError(f"run_dir must be a run directory's path (a str or pathlib.Path), not {run_dir!r}")
    return Path(run_dir)


def make_config(algo: str, env: str, **settings: Any) -> Config:
    """The validated config of ``algo`` on ``env``: class defaults, then the algorithm's preset, then
    ``clip_rewards=True`` for an Atari id (``ALE/...``, ``PongNoFrameskip-v4``), then the zoo's tuned settings for
    the pair (:mod:`jaderl.zoo`; not with ``zoo=False``, and without the entry's settings that go together with one
    in ``settings``), then ``settings`` (a stock-trading id's relative ``csv=`` path is made absolute)."""
    if not isinstance(algo, str) or algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; choose one of: {', '.join(ALGOS)}")
    if not isinstance(env, str):
        raise ConfigError(f"env must be an env id (a str such as 'jaderl/CartPole-v1'), not {env!r}")
    spec = ALGOS[algo]
    settings = {k: v for k, v in settings.items() if k not in ("algo", "env")}
    env = with_absolute_csv(env)  # a run must find its price file again when resumed from another directory
    atari = {"clip_rewards": True} if is_atari_id(env) else {}  # the standard for Atari, unless set
    tuned = zoo_entry.applied(settings) if (zoo_entry := zoo_for(algo, env, settings)) else {}
    return spec.agent_cls.config_cls.from_dict({**spec.preset, **atari, **tuned, **settings, "algo": algo,
                                                "env": env})


def zoo_for(algo: str, env: str, settings: dict[str, Any]) -> ZooEntry | None:
    """The zoo entry that :func:`make_config` applies to ``algo`` on ``env`` given ``settings`` (None with
    ``zoo=False`` among them)."""
    return None if settings.get("zoo", True) is False else lookup(algo, env)


def train(algo: str, env: str, progress: Progress | None = None, **settings: Any) -> TrainResult:
    """Train ``algo`` on ``env`` in this process; ``settings`` are config fields (``total_steps=...``)."""
    return _run(make_config(algo, env, **settings), resume=False, progress=progress)


def _run(config: Config, resume: bool, progress: Progress | None) -> TrainResult:
    """Pick the trainer: explorer/learner/evaluator processes, data-parallel learners, or one process. A new run
    that stops before it saved anything leaves no directory behind (an empty one given stays empty)."""
    given = None if resume or not config.run_dir else Path(config.run_dir)
    existed = given is not None and given.is_dir()
    if given is not None and (given.is_file() or (existed and any(given.iterdir()))):
        given = None  # not this run's to remove (the run refuses it)
    try:
        return _dispatch(config, resume, progress)
    except BaseException:
        if given is not None:
            _remove_if_nothing_was_saved(given, existed)
        raise


def _dispatch(config: Config, resume: bool, progress: Progress | None) -> TrainResult:
    agent_cls = ALGOS[config.algo].agent_cls
    try:
        if config.workers > 0:
            from jaderl.parallel.pipeline import train_pipeline

            return train_pipeline(config, agent_cls, resume=resume, progress=progress)
        if config.learners > 1:
            from jaderl.parallel.ddp import launched_by_torchrun, train_ddp, train_torchrun

            if launched_by_torchrun():  # this process is one learner of a group on one or several machines
                return train_torchrun(config, agent_cls, resume=resume, progress=progress)
            return train_ddp(config, agent_cls, resume=resume, progress=progress)
        return train_loop(config, agent_cls, resume=resume, progress=progress)
    except (RuntimeError, MemoryError) as exc:
        if not isinstance(exc, TrainingError) and _out_of_memory(exc):
            raise TrainingError(_memory_advice(config, exc)) from exc
        _say_if_nothing_was_saved(config, exc)
        raise
    except EnvError as exc:
        _say_if_nothing_was_saved(config, exc)
        raise


def _remove_if_nothing_was_saved(run_dir: Path, existed: bool) -> None:
    """Remove the directory of a new run that stopped before it saved anything (no checkpoint, no evaluation: only
    its config.yaml and an empty metrics.csv), so that the same command can run again; one that was given empty is
    left empty."""
    try:
        metrics = run_dir / "metrics.csv"
        if not {p.name for p in run_dir.iterdir()} <= {"config.yaml", "metrics.csv"} or \
                (metrics.exists() and len(metrics.read_text().splitlines()) > 1):
            return
        shutil.rmtree(run_dir)
        if existed:
            run_dir.mkdir()
    except OSError:  # (gone already, or not ours to remove: left as it is)
        return


def _say_if_nothing_was_saved(config: Config, exc: Exception) -> None:
    """Errors say "the last checkpoint is kept"; before the first checkpoint, raise one that says what is true. After
    it, an env's error (a worker that died, NaN from the env) says which checkpoint is kept and how to continue."""
    kept = "the last checkpoint is kept"
    saved = bool(config.run_dir) and (Path(config.run_dir) / CHECKPOINT_JSON).exists()
    if kept in str(exc) and not saved:
        message = str(exc).replace(kept, "no checkpoint had been written yet, so there is nothing to resume")
        raise type(exc)(message) from exc
    if saved and isinstance(exc, EnvError) and kept not in str(exc) and "--resume" not in str(exc):
        try:
            step = _checkpoint_meta(config.run_dir)["steps"]
        except ConfigError:  # a checkpoint that cannot be read: the error as it is
            return
        raise EnvError(f"{exc}; the run's last checkpoint (step {step:,}) is kept: continue it with `jaderl train "
                       f"--resume {config.run_dir}` once the env is fixed") from exc


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: torch's CPU allocator raises a plain RuntimeError, CUDA its own,
    numpy (Gymnasium envs) a MemoryError."""
    return isinstance(exc, torch.OutOfMemoryError | MemoryError) or "can't allocate memory" in str(exc)


def _allocation(exc: BaseException, device: torch.device) -> str:
    """"out of memory: 20.00 GiB could not be allocated on cuda:0": how much (where the error says) and where."""
    size = re.search(r"allocate (\d+) bytes|Tried to allocate ([\d.]+ \w+)|Unable to allocate ([\d.]+ \w+)", str(exc))
    amount = "" if size is None else f"{int(size[1]) / 1e9:.1f} GB " if size[1] else f"{size[2] or size[3]} "
    return f"out of memory: {amount}could not be allocated on {device}"


def _entity_counts(env: str) -> str:
    """The options of the env id that count agents or other entities (``num_agents=64``, VMAS's ``n_agents``,
    MPE2's ``N``): each sub-env holds that many, and every agent observes the others, so they size memory too."""
    counts = re.findall(r"(?:^|&)((?:num_|n_)\w+|N)=(\d+)", env.partition("?")[2])
    if not counts:
        return ""
    given = ", ".join(f"{key}={value}" for key, value in counts)
    return f", or lower {given} in the env id (each sub-env holds that many entities)"


def _in_evaluation(exc: BaseException) -> bool:
    """Whether ``exc`` came from building the evaluation env or running its episodes."""
    codes = {inspect.unwrap(run_episodes).__code__, Trainer.make_evaluator.__code__}
    return any(frame.f_code in codes for frame, _ in traceback.walk_tb(exc.__traceback__))


def _memory_advice(config: Config, exc: BaseException) -> str:
    """One sentence for an allocation failure: how much, where, and the settings that size the big tensors (those of
    the evaluation when it ran out: it runs ``eval_episodes`` sub-envs side by side)."""
    where, counts = _allocation(exc, resolve_device(config.device)), _entity_counts(config.env)
    if _in_evaluation(exc):
        return (f"{where} while evaluating eval_episodes={config.eval_episodes} episodes side by side (one sub-env "
                f"each); lower eval_episodes (--eval-episodes, which a resumed run may change too){counts}")
    settings = ("buffer_size (the replay buffer keeps every transition's observation and the next one)"
                if hasattr(config, "buffer_size") else "num_envs or horizon (the rollout), or minibatch_size")
    return f"{where}; start a new run with a lower {settings}{counts}"


RESUME_SETTINGS = ("total_steps", "time_limit", "target_return", "eval_every", "eval_episodes", "checkpoint_every",
                   "record_every", "device", "num_threads", "compile", "precision", "env_workers")
"""The settings a resumed run may change besides the algorithm's mutable hyperparameters (``Agent.hyperparameters``,
recorded in the run's config.yaml): budgets, evaluation, checkpoint and video cadence, and where and how it runs. Every
other setting shaped the checkpoint's networks, optimizer states or replay buffer, so changing it means a new run."""


def _checkpoint_meta(run_dir: str | Path) -> dict[str, Any]:
    """The JSON part of ``run_dir``'s checkpoint (config, counters, step), read without its tensors."""
    if _run_dir(run_dir).is_file():  # (checkpoint.json itself, say)
        raise ConfigError(f"{run_dir} is a file, not a run directory; pass the run directory that holds it "
                          f"({Path(run_dir).parent})")
    path = _run_dir(run_dir) / CHECKPOINT_JSON
    try:
        state = json.loads(path.read_text())["state"]
        rows = (state.get("evaluator") or {}).get("rows", [])
        return {"config": dict(state["config"]), "time_s": float(state["counters"]["time_s"]),
                "steps": int(state["agent"]["counters"]["steps"]),
                "best": max((float(row["eval_return_mean"]) for row in rows), default=-math.inf)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"{run_dir} holds no readable checkpoint ({path} is missing or damaged); pass the run "
                          "directory of a run that has saved one, or start a new run") from None


def _saved_config(run_dir: str | Path, meta: dict[str, Any] | None = None) -> Config:
    """The config ``run_dir``'s checkpoint was saved with (``meta``: its :func:`_checkpoint_meta`, if already read)."""
    saved = (meta or _checkpoint_meta(run_dir))["config"]
    try:
        return make_config(**saved)  # saved holds algo and env too
    except TypeError:
        raise ConfigError(f"{run_dir} holds no readable checkpoint (its config is damaged)") from None


def resume(run_dir: str | Path, /, progress: Progress | None = None, **settings: Any) -> TrainResult:
    """Continue the run in ``run_dir`` from its last checkpoint; ``settings`` may change the
    :data:`RESUME_SETTINGS` (budgets such as ``total_steps``, cadences, device) and the algorithm's mutable
    hyperparameters (``lr``, ``gamma`` ...: checked against their ranges and recorded in config.yaml)."""
    meta = _checkpoint_meta(run_dir)
    config = _saved_config(run_dir, meta)
    if "run_dir" in settings and _run_dir(settings["run_dir"]).resolve() != Path(run_dir).resolve():
        raise ConfigError(f"run_dir={settings['run_dir']!r} cannot be given when resuming {run_dir}: the run goes "
                          "on in its own directory; drop --run-dir (or run_dir from the --config file)")
    mutable = ALGOS[config.algo].agent_cls.hyperparameters
    allowed = (*RESUME_SETTINGS, *mutable)
    fields = {field.name for field in dataclasses.fields(config)}  # (an unknown key is refused by replace below)
    for key, value in settings.items():
        if key not in fields or key == "run_dir":
            continue
        same = _as_field(config, key, value) == getattr(config, key)  # (hidden=(64, 64) is the saved [64, 64])
        if key in mutable and not same:  # (a value it already has passes: it trains with it)
            mutable[key].check(key, value)
        if key not in allowed and not same:
            raise ConfigError(f"{key}={value!r} cannot change when resuming {run_dir}, which was started with "
                              f"{key}={getattr(config, key)!r}; a resume may change only {', '.join(allowed)}; start "
                              "a new run for other settings")
    config = config.replace(**{**settings, "run_dir": str(run_dir)})
    budgets = {"total_steps": (config.total_steps, meta["steps"]), "time_limit": (config.time_limit, meta["time_s"])}
    reached = [f"{name}={limit}" for name, (limit, used) in budgets.items() if limit is not None and used >= limit]
    if reached:
        raise ConfigError(f"{run_dir} already reached its budget ({reached[0]}) at step {meta['steps']:,}; resume "
                          "with a larger --total-steps or --time-limit to train on")
    if config.target_return is not None and meta["best"] >= config.target_return:
        raise ConfigError(f"{run_dir} already reached its target (target_return={config.target_return:g}; its best "
                          f"evaluation returned {meta['best']:g}); resume with a higher --target-return to train on")
    return _run(config, resume=True, progress=progress)


def _as_field(config: Config, key: str, value: Any) -> Any:
    """``value`` as ``config`` would hold it in field ``key`` (a tuple as a list, 4.0 as 4), or as given where the
    field refuses it."""
    try:
        return getattr(config.replace(**{key: value}), key)
    except ConfigError:
        return value


def load(run_dir: str | Path, best: bool = True, device: str = "cpu", *, remedy: str | None = None) -> Agent:
    """The agent saved in ``run_dir``, with its best evaluated policy (``best=True``) or its last state.

    With ``best=True`` and a best-policy file, only that file's tensors are read (with the config from the
    checkpoint's JSON, or from the run's ``config.yaml`` if that is unreadable), so a damaged checkpoint tensor file
    does not stop an evaluation; the checkpoint's tensors are read for ``best=False`` or a run without a best policy.
    Anything damaged that is needed, or parameters that are NaN or infinite, raise one sentence naming the file; so
    does a file given as ``run_dir`` (the run's ``best_policy.safetensors``: load takes the directory that holds it).
    ``remedy`` replaces what that sentence tells the user to do when the checkpoint it needs is missing or damaged
    (by default: load the best policy instead, where there is one, or pass the directory of another run)."""
    run_dir = _run_dir(run_dir)
    if not isinstance(best, bool):
        raise ConfigError(f"best={best!r} must be True (the best evaluated policy) or False (the last state)")
    if run_dir.is_file():  # such as its best_policy.safetensors: the file alone has no config to build the agent from
        raise ConfigError(f"{run_dir} is a file, not a run directory; pass the run directory that holds it "
                          f"({run_dir.parent})")
    meta = _checkpoint_json(run_dir)
    config = _load_config(run_dir, meta).replace(device=device)
    best_path = run_dir / BEST_POLICY
    use_best = best and best_path.exists()
    if not use_best and meta is None:
        instead = "load its best policy (best=True) or " if best_path.exists() else ""
        raise ConfigError(f"{run_dir} holds no readable checkpoint ({run_dir / CHECKPOINT_JSON} is missing or "
                          f"damaged); {remedy or instead + 'pass the run directory of a run that has saved one'}")
    env = make_env(config.env, 1, resolve_device(device))
    try:
        spec = env.spec  # agents are built from the env's description
    finally:
        env.close()
    agent = build_saved_agent(config, spec, resolve_device(device))
    if use_best:
        _load_best_policy(agent, best_path)
        if meta is not None:
            _load_counters(agent, meta["state"]["agent"])
    else:
        assert meta is not None
        _load_checkpoint_agent(agent, run_dir, meta, best_path.exists(), remedy)
    return agent


def _checkpoint_json(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir``'s checkpoint.json (its ``tensor_file`` and ``state`` with the config), or None if unreadable."""
    try:
        meta = json.loads((run_dir / CHECKPOINT_JSON).read_text())
    except (OSError, ValueError):
        return None
    if (isinstance(meta, dict) and isinstance(meta.get("tensor_file"), str) and isinstance(meta.get("state"), dict)
            and isinstance(meta["state"].get("config"), dict) and isinstance(meta["state"].get("agent"), dict)):
        return meta
    return None


def _load_config(run_dir: Path, meta: dict[str, Any] | None) -> Config:
    """The run's config: from its checkpoint's JSON, or from its ``config.yaml`` where that JSON is unreadable."""
    if meta is not None:
        return _saved_config(run_dir, {"config": meta["state"]["config"]})
    yaml_path = run_dir / "config.yaml"
    missing = f"{run_dir} holds no readable checkpoint ({run_dir / CHECKPOINT_JSON} and {yaml_path} are missing or "
    try:
        saved = Config.read_yaml(yaml_path)
    except ConfigError:
        raise ConfigError(f"{missing}unreadable); pass the run directory of a run that has saved one") from None
    try:
        return make_config(**saved)  # saved holds algo and env too
    except TypeError:
        raise ConfigError(f"{missing}damaged); pass the run directory of a run that has saved one") from None


def _load_counters(agent: Agent, saved: dict[str, Any]) -> None:
    """Set ``agent``'s counters (its steps) from the JSON of its checkpoint: plain numbers, no tensor file read."""
    saved = saved.get("counters")
    if isinstance(saved, dict):
        current = agent.counters()
        agent.load_counters({**current, **{k: v for k, v in saved.items() if k in current
                                           and isinstance(v, (int, float)) and not isinstance(v, bool)}})


def _load_best_policy(agent: Agent, best_path: Path) -> None:
    """Load ``best_path`` into ``agent``'s policy modules, refusing a damaged file or non-finite parameters."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    fix = "delete it to use the run's last checkpoint instead"
    try:
        tensors = load_file(str(best_path), device=str(agent.device))
        finite_or_raise(tensors, str(best_path), fix=fix)
        agent.load_policy_state_dict(tensors)
    except (OSError, SafetensorError, KeyError, RuntimeError) as exc:
        raise FileNotFoundError(f"{best_path} is damaged ({str(exc).splitlines()[0]}); {fix}") from None


def _load_checkpoint_agent(agent: Agent, run_dir: Path, meta: dict[str, Any], has_best: bool,
                           remedy: str | None = None) -> None:
    """Load the agent state of ``run_dir``'s checkpoint (not its replay buffer) into ``agent``, refusing a damaged
    tensor file or non-finite parameters in one sentence (ending in ``remedy`` when given)."""
    tensor_path = run_dir / meta["tensor_file"]
    fix = remedy or (("load its best policy instead (`jaderl eval` without --last; best=True in Python), or "
                      if has_best else "") + "restore the run directory from a copy or start a new run")
    try:
        state = load_checkpoint(run_dir, agent.device, part="agent")
        finite_or_raise({"agent": state}, str(tensor_path))
        load_saved_agent(agent, state)
    except ConfigError:
        raise
    except (FileNotFoundError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        cause = exc.__context__ if isinstance(exc, FileNotFoundError) and exc.__context__ is not None else exc
        reason = (str(cause).splitlines() or [type(cause).__name__])[0]
        raise FileNotFoundError(f"{run_dir} holds no readable checkpoint: {tensor_path} is missing or damaged "
                                f"({reason}); {fix}") from None


def build_saved_agent(config: Config, spec: EnvSpec, device: torch.device) -> Agent:
    """A new agent for a saved run's ``config``, computing as it did in training (``config.precision``), without
    repeating the warnings its training gave about the run's settings; its state is loaded next."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TeamRewardWarning)
        agent = ALGOS[config.algo].agent_cls(config, spec, device)
    mixed_precision(agent, warn=False)
    return agent


def load_saved_agent(agent: Agent, state: dict[str, Any]) -> None:
    """Load the agent state of a run's checkpoint into ``agent``, built for one sub-env: a reward normaliser keeps a
    return per sub-env of the run, so it is sized as the run's first."""
    for name, stat in agent.running_stats().items():
        saved = state["running_stats"].get(name)
        if isinstance(stat, ReturnNorm) and isinstance(saved, dict) and "running" in saved:
            stat.running = torch.zeros_like(saved["running"], device=stat.running.device)
    agent.load_state_dict(state)


def episode_count(episodes: Any) -> int:
    """``episodes`` as a number of episodes to run (a whole number >= 1, numpy's integers too), or one sentence: the
    check of :func:`evaluate`, ensembles' ``evaluate`` and ``jaderl record``."""
    if isinstance(episodes, bool) or not isinstance(episodes, numbers.Integral) or episodes < 1:
        raise ConfigError(f"episodes={episodes!r} is out of range: it must be a whole number >= 1 (how many episodes "
                          "to run)")
    return int(episodes)


def evaluate(run_dir: str | Path, episodes: int = 10, seed: int = 12_345, device: str = "cpu",
             best: bool = True) -> dict[str, Any]:
    """Evaluate the best policy of ``run_dir`` (or its last state: ``best=False``, or a run without a best policy)
    deterministically over ``episodes`` episodes: the mean, spread and list of their returns, and ``policy``, which
    was evaluated ("best" or "last"). With several agents the returns are team returns (every agent's summed, as
    metrics.csv reports them), and ``mean_per_agent`` is the mean return per agent; with agents of several kinds
    (simple_tag's predators and prey), ``teams`` holds each kind's mean summed return. Runs of such games keep no
    best policy: their summed return does not rank policies."""
    episodes = episode_count(episodes)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ConfigError(f"seed={seed!r} is out of range: it must be a whole number >= 0 (the evaluation envs' seed)")
    agent = load(run_dir, best=best, device=device)
    try:
        env = make_env(agent.config.env, episodes, agent.device, seed=seed)
        try:
            returns, _ = run_episodes(agent, env, seed)
            kinds = list(env.teams)
        finally:
            env.close()
    except (RuntimeError, MemoryError) as exc:  # the episodes run side by side, one sub-env each
        if not _out_of_memory(exc):
            raise
        raise ConfigError(f"{_allocation(exc, agent.device)} while evaluating {episodes} episodes side by side (one "
                          "sub-env each); evaluate fewer episodes") from exc
    team = returns.sum(-1) if returns.dim() > 1 else returns  # (episodes, agents): the team's
    extra: dict[str, Any] = {"mean_per_agent": returns.mean().item()} if returns.dim() > 1 else {}
    if len(set(kinds)) > 1:
        extra["teams"] = {kind: returns[:, [i for i, k in enumerate(kinds) if k == kind]].sum(-1).mean().item()
                          for kind in dict.fromkeys(kinds)}
    policy = "best" if best and (Path(run_dir) / BEST_POLICY).exists() else "last"
    return {"mean": team.mean().item(), "std": team.std(unbiased=False).item(), "episodes": episodes,
            "returns": [round(r, 4) for r in team.tolist()], "policy": policy, **extra}


__all__ = ["TrainResult", "evaluate", "load", "make_config", "resume", "train"]
