"""The Python API: train, resume, load and evaluate agents by registry name.

    >>> import jaderl
    >>> result = jaderl.train("ppo", "jaderl/CartPole-v1", target_return=475, run_dir="runs/ppo-cartpole")
    >>> agent = jaderl.load(result.run_dir)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaderl.algos import ALGOS
from jaderl.core.agent import Agent
from jaderl.core.checkpoint import CHECKPOINT_JSON, load_checkpoint
from jaderl.core.config import Config, ConfigError
from jaderl.core.evaluator import BEST_POLICY, run_episodes
from jaderl.core.loop import TrainResult, resolve_device
from jaderl.core.loop import train as train_loop
from jaderl.envs import make_env
from jaderl.envs.stock import with_absolute_csv

Progress = Callable[[dict[str, Any]], None]


def make_config(algo: str, env: str, **settings: Any) -> Config:
    """The validated config of ``algo`` on ``env``: class defaults, then the algorithm's preset, then ``settings``
    (a stock-trading id's relative ``csv=`` path is made absolute)."""
    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; choose one of: {', '.join(ALGOS)}")
    spec = ALGOS[algo]
    settings = {k: v for k, v in settings.items() if k not in ("algo", "env")}
    env = with_absolute_csv(env)  # a run must find its price file again when resumed from another directory
    return spec.agent_cls.config_cls.from_dict({**spec.preset, **settings, "algo": algo, "env": env})


def train(algo: str, env: str, progress: Progress | None = None, **settings: Any) -> TrainResult:
    """Train ``algo`` on ``env`` in this process; ``settings`` are config fields (``total_steps=...``)."""
    return _run(make_config(algo, env, **settings), resume=False, progress=progress)


def _run(config: Config, resume: bool, progress: Progress | None) -> TrainResult:
    """Pick the trainer: explorer/learner/evaluator processes, data-parallel learners, or one process."""
    agent_cls = ALGOS[config.algo].agent_cls
    if config.workers > 0:
        from jaderl.parallel.pipeline import train_pipeline

        return train_pipeline(config, agent_cls, resume=resume, progress=progress)
    if config.learners > 1:
        from jaderl.parallel.ddp import train_ddp

        return train_ddp(config, agent_cls, resume=resume, progress=progress)
    return train_loop(config, agent_cls, resume=resume, progress=progress)


def _saved_config(run_dir: str | Path) -> Config:
    path = Path(run_dir) / CHECKPOINT_JSON
    try:
        saved = json.loads(path.read_text())["state"]["config"]
    except (OSError, ValueError, KeyError):
        raise ConfigError(f"{run_dir} holds no readable checkpoint ({path} is missing or damaged)") from None
    return make_config(**saved)  # saved holds algo and env too


def resume(run_dir: str | Path, /, progress: Progress | None = None, **settings: Any) -> TrainResult:
    """Continue the run in ``run_dir`` from its last checkpoint; ``settings`` may change budgets (``total_steps``)."""
    config = _saved_config(run_dir)
    for key in ("algo", "env", "num_envs", "workers", "learners"):  # the checkpoint only fits these
        if key in settings and settings[key] != getattr(config, key):
            raise ConfigError(f"{key}={settings[key]!r} cannot change when resuming {run_dir}, which was started "
                              f"with {key}={getattr(config, key)!r}; start a new run instead")
    config = config.replace(**{**settings, "run_dir": str(run_dir)})
    return _run(config, resume=True, progress=progress)


def load(run_dir: str | Path, best: bool = True, device: str = "cpu") -> Agent:
    """The agent saved in ``run_dir``, with its best evaluated policy (``best=True``) or its last state."""
    config = _saved_config(run_dir)
    config = config.replace(device=device)
    env = make_env(config.env, 1, resolve_device(device))
    agent = ALGOS[config.algo].agent_cls(config, env, resolve_device(device))
    env.close()
    agent.load_state_dict(load_checkpoint(run_dir)["agent"])
    best_path = Path(run_dir) / BEST_POLICY
    if best and best_path.exists():
        from safetensors.torch import load_file

        agent.load_policy_state_dict(load_file(str(best_path), device=str(agent.device)))
    return agent


def evaluate(run_dir: str | Path, episodes: int = 10, seed: int = 12_345, device: str = "cpu") -> dict[str, Any]:
    """Evaluate the best policy of ``run_dir`` deterministically over ``episodes`` episodes."""
    if episodes < 1:
        raise ConfigError(f"episodes={episodes} is out of range: it must be >= 1")
    agent = load(run_dir, device=device)
    env = make_env(agent.config.env, episodes, agent.device, seed=seed)
    try:
        returns, _ = run_episodes(agent, env, seed)
    finally:
        env.close()
    return {"mean": returns.mean().item(), "std": returns.std(unbiased=False).item(), "episodes": episodes,
            "returns": [round(r, 4) for r in returns.tolist()]}


__all__ = ["TrainResult", "evaluate", "load", "make_config", "resume", "train"]
