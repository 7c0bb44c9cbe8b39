"""Several agents as one: fused into a single run (parameters averaged), or an ensemble that combines their actions.

* :func:`fuse_runs` reads finished runs of one algorithm with the same settings (different seeds, or members of a
  population), averages their parameters and optimizer states and merges their running normalisers with
  :func:`jaderl.parallel.fusion.fuse_agents`, evaluates the result and writes it as a new, ordinary run directory
  (``jaderl eval``, ``jaderl.load`` and ``jaderl train --resume`` accept it; it trains on the first run's device).
  ``jaderl fuse RUN_DIR ... --out DIR``.
* :class:`Ensemble` keeps the agents apart and combines what they do at inference: continuous actions are averaged;
  discrete actions are decided by majority vote (ties go to the smaller action index). A vote, not a mean of
  probabilities, because every algorithm gives actions but not all give probabilities (DQN's greedy action has none).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jaderl.algos.base import ReturnNorm
from jaderl.api import ALGOS, episode_count, load
from jaderl.core.agent import Agent
from jaderl.core.checkpoint import atomic_write, load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.core.evaluator import run_episodes
from jaderl.core.loop import Trainer
from jaderl.envs import make_env
from jaderl.envs.observations import observation_batch
from jaderl.parallel.fusion import fuse_agents

FREE_SETTINGS = ("seed", "run_dir", "total_steps", "time_limit", "target_return", "eval_every", "eval_episodes",
                 "checkpoint_every", "device", "num_threads", "compile", "env_workers", "workers", "learners",
                 "record_every", "zoo")
"""Settings in which fused runs may differ (besides the algorithm's mutable hyperparameters); any other difference
means networks or optimizers of another shape, or another task."""


def check_same_settings(agents: Sequence[Agent], names: Sequence[str]) -> None:
    """Refuse in one sentence agents of different algorithms, envs or network-shaping settings."""
    first = agents[0].config.to_dict()
    free = set(FREE_SETTINGS) | set(type(agents[0]).hyperparameters)
    for agent, name in zip(agents[1:], names[1:], strict=True):
        other = agent.config.to_dict()
        if other["algo"] != first["algo"]:  # named first: every other setting may differ between algorithms
            raise ConfigError(f"{names[0]} is {_a(first['algo'])} run and {name} {_a(other['algo'])} run; only runs "
                              "of one algorithm can be fused (an Ensemble combines agents of several algorithms)")
        for key in first:
            if key not in free and other.get(key) != first[key]:
                raise ConfigError(f"{name} has {key}={other.get(key)!r} but {names[0]} has {key}={first[key]!r}; only "
                                  "runs of one algorithm and env with the same settings (other seeds) can be combined")


def _a(algo: str) -> str:
    """``algo`` with its indefinite article: "a ppo", "an a2c"."""
    return f"{'an' if algo[0] in 'aeiou' else 'a'} {algo}"


def fuse_runs(run_dirs: Sequence[str | Path], out: str | Path, device: str = "cpu") -> dict[str, Any]:
    """Fuse the last checkpoints of ``run_dirs`` into a new run directory ``out``: the first run's whole state
    (replay buffer, env state, counters, a reward normaliser's running return of each of its sub-envs) with every
    other tensor of the agent averaged over all runs (running normalisers merged as the statistics of all runs'
    samples); evaluated once. ``device`` is where the fusion and its evaluation compute; the new run's config keeps
    the first run's device, on which ``jaderl train --resume`` continues it.
    Returns ``{"run_dir", "eval_return", "fused"}``."""
    if isinstance(run_dirs, str | Path):  # (a string is a sequence too: of one-letter "run directories")
        raise ConfigError(f'fuse_runs takes a list of run directories, not one path: pass ["{run_dirs}", ...]')
    if len(run_dirs) < 2:
        raise ConfigError(f"fusion needs two or more run directories, got {len(run_dirs)}")
    if Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise ConfigError(f"{out} already exists and is not an empty directory; pick another --out")
    names = [str(d) for d in run_dirs]
    seen: dict[Path, str] = {}
    for name in names:  # before anything is read or written
        if (first := seen.get(key := Path(name).resolve())) is not None:
            twice = f"{name} is given twice" if first == name else f"{first} and {name} are the same run directory"
            raise ConfigError(f"{twice}; fusing a run with itself averages its agent with itself and changes nothing, "
                              "so pass each run directory once")
        seen[key] = name
    agents = [load(name, best=False, device=device, remedy=f"fusion averages the runs' last checkpoints, so restore "
                                                            f"{name} from a copy or leave it out") for name in names]
    check_same_settings(agents, names)
    config = agents[0].config.replace(run_dir=str(out), device=device)
    existed = Path(out).exists()
    try:
        with Trainer(config, ALGOS[config.algo].agent_cls) as trainer:
            state = load_checkpoint(run_dirs[0], trainer.device)
            trainer.load_state_dict({**state, "evaluator": {"rows": []}})  # the fused agent's own evaluations only
            # a reward normaliser's running returns belong to the first run's sub-envs' episodes, which go on
            returns = [(s, s.running.clone()) for s in trainer.agent.running_stats().values()
                       if isinstance(s, ReturnNorm)]
            try:
                fuse_agents([trainer.agent, *agents[1:]])
            except ValueError as exc:
                raise ConfigError(f"cannot fuse {', '.join(names)}: {exc}") from None
            for stat, running in returns:
                stat.running.copy_(running)
            score = trainer.evaluate()
            trainer.config = trainer.config.replace(device=state["config"]["device"])  # the runs' own device
            atomic_write(trainer.run_dir / "config.yaml", lambda p: trainer.config.save_yaml(p, trainer.history))
            trainer.checkpoint()
    except BaseException:  # no half-written run is left in ``out``, which a second try would refuse
        shutil.rmtree(out, ignore_errors=True)
        if existed:
            Path(out).mkdir()
        raise
    return {"run_dir": str(out), "eval_return": score, "fused": names}


class Ensemble:
    """Agents of one env acting together: ``act`` and ``predict`` combine every agent's deterministic action (mean
    for continuous actions, majority vote for discrete ones; see the module docstring)."""

    def __init__(self, agents: Sequence[Agent]) -> None:
        if not agents:
            raise ConfigError("an ensemble needs one or more agents")
        envs = {a.config.env for a in agents}
        if len(envs) > 1 or len({(a.is_discrete, a.action_dim) for a in agents}) > 1:
            raise ConfigError(f"an ensemble's agents must act in one env with one action space; got {sorted(envs)}")
        self.agents = list(agents)
        self.spec, self.device, self.is_discrete = agents[0].spec, agents[0].device, agents[0].is_discrete
        self.config = agents[0].config

    @classmethod
    def from_runs(cls, run_dirs: Sequence[str | Path], best: bool = True, device: str = "cpu") -> Ensemble:
        """The agents saved in ``run_dirs`` (their best policies, or last states with ``best=False``); they may be of
        different algorithms."""
        if isinstance(run_dirs, str | Path):  # (a string is a sequence too: of one-letter "run directories")
            raise ConfigError(f'from_runs takes a list of run directories, not one path: pass ["{run_dirs}"]')
        return cls([load(d, best=best, device=device) for d in run_dirs])

    def combine(self, actions: torch.Tensor) -> torch.Tensor:
        """One action per row from the agents' actions (K, N, ...): their mean, or the discrete majority."""
        if not self.is_discrete:
            return actions.float().mean(0)
        votes = torch.nn.functional.one_hot(actions.long(), self.agents[0].action_dim).sum(0)  # (N, ..., actions)
        return votes.argmax(-1)  # ties: the first maximum, the smaller index

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Combined actions (N,) or (N, action_dim) in [-1, 1] for raw observations (N, *obs_shape)."""
        return self.combine(torch.stack([agent.act(obs, deterministic) for agent in self.agents]))

    def predict(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """Combined actions in the env's own action space, as :meth:`Agent.predict` gives them (combined in [-1, 1],
        then rescaled: an integer Box's mean is rounded once)."""
        spec = self.spec
        x, single = observation_batch(obs, spec.obs_shape, spec.num_agents, self.device, spec.obs_dtype)
        out = spec.env_actions(self.act(x, deterministic))
        return out[0] if single else out

    def evaluate(self, episodes: int = 10, seed: int = 12_345) -> dict[str, Any]:
        """Mean and std of the ensemble's return over ``episodes`` deterministic episodes (as ``jaderl eval``)."""
        episodes = episode_count(episodes)
        env = make_env(self.config.env, episodes, self.device, seed=seed)
        try:
            returns, _ = run_episodes(self, env, seed)  # type: ignore[arg-type]  # it acts like an agent
        finally:
            env.close()
        returns = returns.sum(-1) if returns.dim() > 1 else returns  # several agents: the team's return
        return {"mean": returns.mean().item(), "std": returns.std(unbiased=False).item(), "episodes": episodes}
