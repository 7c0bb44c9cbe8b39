"""The agent base class: the verbs every way of training calls, and the seams through which it is handled.

    act(obs, deterministic)   -> actions for a batch of observations
    explore(env, horizon)     -> a (T, N, ...) trajectory, stepping the batched env
    update(buffer)            -> a dict of named statistics (tensors; read them only when logging)

An agent is built from an :class:`~jaderl.envs.vec.EnvSpec` (the env's description, not the env) and states what it
is made of, so that checkpoints, the NaN check, mixed precision, data-parallel averaging and fusion ask instead of
guessing: :meth:`Agent.networks`, :meth:`Agent.optimizers`, :meth:`Agent.running_stats` (learned outside gradients),
:meth:`Agent.policy` (what ``act`` needs) and :meth:`Agent.counters`. :attr:`Agent.hyperparameters` lists what
:meth:`Agent.set_hyperparameters` may change while it trains, with the valid ranges.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from jaderl.accel import optimizer_step, zero_grad
from jaderl.core.buffers import Batch, ReplayBuffer, RolloutBuffer
from jaderl.core.config import Config, ConfigError
from jaderl.core.nets import NatureCNN, ObsNorm
from jaderl.envs.episodes import EpisodeStats
from jaderl.envs.observations import flag, observation_batch
from jaderl.envs.vec import EnvError, EnvSpec, VecEnv


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    """The valid range ``[low, high]`` of a hyperparameter that may change while an agent trains; ``log`` says that
    a search samples it on a log scale (learning rates)."""

    low: float
    high: float
    log: bool = False

    def check(self, name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self.low <= value <= self.high:
            raise ConfigError(f"{name}={value!r} is out of range: it must be a number in [{self.low:g}, {self.high:g}]")
        return float(value)


LEARNING_RATE = Hyperparameter(1e-6, 1e-1, log=True)


class Agent:
    """Base of every algorithm. Subclasses build their networks and optimizers in ``__init__``, state them in
    :meth:`networks` and :meth:`optimizers`, and implement ``act`` and ``update``."""

    config_cls: ClassVar[type[Config]] = Config
    on_policy: ClassVar[bool] = True
    """Learns from the latest rollout only (replay-buffer algorithms derive from :class:`OffPolicyAgent`)."""
    record_keys: tuple[str, ...] = ()
    """What :meth:`explore_action` returns besides the action, when it returns a tuple (PPO: ``("log_prob",)``, the
    rollout policy's log-probability of the action); the trajectory keeps each step's under these names."""
    compiled_methods: ClassVar[tuple[str, ...]] = ("act",)
    """The pure functions :func:`jaderl.accel.accelerate` compiles (the optimizer steps stay eager)."""
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {"lr": LEARNING_RATE, "gamma": Hyperparameter(0.9, 0.9999)}
    """What :meth:`set_hyperparameters` may change while the agent trains, and the valid ranges (a population's search
    space is built from them)."""

    def __init__(self, config: Config, spec: EnvSpec | VecEnv, device: torch.device) -> None:
        spec = spec if isinstance(spec, EnvSpec) else spec.spec  # an env stands for its description
        self.config, self.spec, self.device = config, spec, device
        self.num_envs, self.obs_shape = spec.num_envs, spec.obs_shape
        self.is_discrete, self.action_dim = spec.is_discrete, spec.action_dim
        self.obs_dim, self.is_image = math.prod(self.obs_shape), len(self.obs_shape) == 3
        try:
            self.encoder: NatureCNN | None = NatureCNN(self.obs_shape).to(device) if self.is_image else None
        except ValueError as exc:  # an observation the CNN cannot read: a problem of the env, said in one sentence
            raise EnvError(f"{exc}; wrap the env to resize or flatten its observations") from None
        """The CNN every network reads images through (None for vectors); an algorithm whose networks need their own
        copy (DQN's target network) moves it into them and sets it to None, so ``features`` passes images through."""
        self.obs_dim = getattr(self.encoder, "out_dim", self.obs_dim)  # images: the CNN's features
        # images are scaled by the encoder, not normalised
        self.obs_norm = ObsNorm(self.obs_shape, config.normalize_obs and not self.is_image).to(device)
        self.steps = 0  # env steps explored, all sub-envs counted
        self.update_debt = 0.0  # fractional gradient steps owed to the env steps collected so far
        self.last_obs: torch.Tensor | None = None
        """The observation the next ``explore`` acts on (None: it resets the env first)."""
        self.episodes = EpisodeStats(spec.num_envs, spec.num_agents, device, spec.teams)
        self.grad_hook: Callable[[list[nn.Parameter]], None] | None = None
        """Called by ``optimize`` between backward and clipping (data-parallel learners average gradients there)."""
        self.stats_hook: Callable[[ObsNorm], None] | None = None  # called with a normaliser that an update changes,
        # then reads (MAPPO's value targets): data-parallel learners merge it there (jaderl.parallel.ddp.Learners)

    @classmethod
    def accepts(cls, spec: EnvSpec) -> str | None:
        """None when this algorithm can train on envs like ``spec``; otherwise what stands in the way, as a phrase
        that completes "cannot train on ENV: ..."."""
        if spec.num_agents > 1:
            return f"it has {spec.num_agents} agents and this is a single-agent algorithm; use a multi-agent one"
        return None

    # --- the seams ---
    def networks(self) -> dict[str, nn.Module]:
        """Every network the agent trains or keeps as a target, by name (the image encoder included)."""
        return {} if self.encoder is None else {"encoder": self.encoder}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer, by name."""
        return {}

    def running_stats(self) -> dict[str, nn.Module | torch.Tensor]:
        """State learned outside gradients (the observation normaliser, running averages); data-parallel learners
        merge it after every update instead of averaging gradients."""
        return {"obs_norm": self.obs_norm}

    def policy(self) -> dict[str, nn.Module]:
        """The modules ``act`` needs: saved as the best policy, sent to explorer processes."""
        shared = {"obs_norm": self.obs_norm} | ({} if self.encoder is None else {"encoder": self.encoder})
        return shared | {"actor": self.actor}

    def counters(self) -> dict[str, int | float]:
        """Plain numbers the agent counts with (host values: reading them may sync)."""
        return {"steps": self.steps, "update_debt": self.update_debt}

    def load_counters(self, counters: dict[str, Any]) -> None:
        self.steps, self.update_debt = int(counters["steps"]), float(counters["update_debt"])

    def observe(self, traj: Batch) -> None:
        """Take an explored trajectory (T, N, ...) into the running statistics (off-policy agents, as it comes)."""
        self.obs_norm.update(traj["obs"])

    def restart_episodes(self) -> None:
        """Forget every sub-env's episode in progress: a resume whose env state could not be carried over starts
        new episodes (subclasses also zero their own per-episode state, such as running discounted returns)."""
        self.episodes.running.zero_()

    def parameters(self) -> list[torch.Tensor]:
        """Every network's parameters and floating buffers (each once)."""
        tensors = {id(t): t for net in self.networks().values() for t in [*net.parameters(), *net.buffers()]}
        return [t for t in tensors.values() if t.is_floating_point()]

    # --- live hyperparameters ---
    def set_hyperparameters(self, **values: Any) -> None:
        """Change hyperparameters listed in :attr:`hyperparameters` while the agent trains: the config, and what was
        built from it (learning rates live in the optimizers' parameter groups)."""
        for name, value in values.items():
            if name not in self.hyperparameters:
                raise ConfigError(f"{name} is not a hyperparameter {type(self).__name__} can change while it trains; "
                                  f"it can change {', '.join(self.hyperparameters)}")
            self.hyperparameters[name].check(name, value)
        self.config = self.config.replace(**values)
        self.apply_hyperparameters()

    def apply_hyperparameters(self) -> None:
        """Bring live objects in line with the config's hyperparameters; the base sets every optimizer's learning rate
        to ``config.lr`` (algorithms with several learning rates, or values cached at build time, extend it)."""
        for optimizer in self.optimizers().values():
            for group in optimizer.param_groups:
                group["lr"] = self.config.lr

    # --- the verbs ---
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions (N,) or (N, action_dim) in [-1, 1] for raw observations (N, *obs_shape), computed without
        gradients (every algorithm's ``act`` runs under ``torch.no_grad``)."""
        raise NotImplementedError

    @torch.no_grad()
    def predict(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """Actions in the env's own action space for what the env gives: one observation or a batch, numpy or torch
        (several agents: ``(agents, obs_dim)`` or ``(N, agents, obs_dim)``). Continuous actions are rescaled from
        [-1, 1] to the env's bounds (``spec.action_low`` / ``action_high``, each agent's own), clipped to them, in the
        Box's dtype (``spec.action_dtype``; rounded for an integer Box); discrete ones are int64 indices from 0 (add the
        ``start`` of a Gymnasium ``Discrete`` space that has one). Observations of another shape, non-numeric or
        non-finite, or pixels outside 0..255, raise ValueError (:func:`jaderl.envs.observations.observation_batch`)."""
        x, single = observation_batch(obs, self.obs_shape, self.spec.num_agents, self.device, self.spec.obs_dtype)
        out = self.spec.env_actions(self.act(x, flag("deterministic", deterministic)))
        return out[0] if single else out

    def begin_explore_step(self, t: int) -> None:
        """Called by :meth:`explore` before its step ``t`` (0 to horizon - 1) of a rollout; a hook for exploration
        that changes on a schedule (gSDE's noise weights). Does nothing by default."""

    def explore_action(self, obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The action taken while exploring (and the tensors named by :attr:`record_keys`, if any); algorithms
        override it for noise or epsilon-greedy."""
        return self.act(obs, deterministic=False)

    @torch.no_grad()
    def explore(self, env: VecEnv, horizon: int) -> Batch:
        """Step ``env`` for ``horizon`` steps; returns obs, action, reward, terminated, truncated, next_obs (T, N, ...),
        state, next_state when the env has a global state (several agents), active, next_active when its agents may
        leave (``agents_leave``: the agents in the episode at ``obs`` and after the step), and what
        :attr:`record_keys` names.

        ``next_obs`` (``next_state``) is what was reached before any auto-reset, so truncated steps can be
        bootstrapped. Rewards are clipped to their sign (``config.clip_rewards``), then multiplied by
        ``config.reward_scale``; episode statistics use the raw rewards.
        """
        if self.last_obs is None:  # a fresh env, or one whose episodes could not be carried over: reseed from steps
            self.last_obs = env.reset(seed=self.config.seed + self.steps)
        # what a multi-agent env tells besides the observations: now, and at next_obs (info's final_state ...)
        extras = {k: getattr(env, name) for k, name, on in (("state", "global_state", self.spec.state_shape),
                                                            ("active", "active_agents", self.spec.agents_leave)) if on}
        keys = ["obs", "action", "reward", "terminated", "truncated", "next_obs", *extras,
                *(f"next_{k}" for k in extras), *self.record_keys]
        steps: list[tuple[torch.Tensor, ...]] = []
        for t in range(horizon):
            self.begin_explore_step(t)
            obs, now = self.last_obs, [get() for get in extras.values()]
            action, *record = out if isinstance(out := self.explore_action(obs), tuple) else (out,)
            self.last_obs, reward, terminated, truncated, info = env.step(action)
            final = [info[f"final_{k}"] for k in extras]
            steps.append((obs, action, reward, terminated, truncated, info["final_obs"], *now, *final, *record))
            self.episodes.last_step = terminated, truncated
        traj = dict(zip(keys, (torch.stack(x) for x in zip(*steps, strict=True)), strict=True))
        self.episodes.track(traj["reward"], traj["terminated"] | traj["truncated"])
        self.steps += horizon * self.num_envs
        if not self.on_policy:  # on-policy agents update it after learning, so old log-probs stay exact
            self.observe(traj)
        traj["reward"] = (traj["reward"].sign() if self.config.clip_rewards else traj["reward"]) \
            * self.config.reward_scale
        return traj

    def update(self, buffer: Any) -> dict[str, torch.Tensor]:
        """Learn from ``buffer``; returns named statistics such as ``loss/critic`` as 0-d tensors."""
        raise NotImplementedError

    def make_buffer(self) -> ReplayBuffer | RolloutBuffer:
        """The buffer the trainer feeds ``explore``'s trajectories into."""
        return RolloutBuffer()

    # --- helpers for subclasses ---
    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Network inputs (..., obs_dim) for observations (..., *obs_shape): CNN features of images, or vectors
        flattened and normalised (when enabled)."""
        if self.is_image:
            return obs if self.encoder is None else self.encoder(obs)
        return self.obs_norm(obs).flatten(obs.dim() - len(self.obs_shape))  # the statistics have obs_shape

    def encoder_parameters(self) -> list[nn.Parameter]:
        """The shared image encoder's parameters (none for vector observations), for the optimizer that trains it:
        the single optimizer of on-policy agents, the critics' optimizer of actor-critic ones (as in SAC-AE)."""
        return [] if self.encoder is None else list(self.encoder.parameters())

    def owed_updates(self, updates_per_step: float) -> int:
        """Gradient steps due for the latest ``explore`` call at ``updates_per_step``, carrying the fraction over."""
        self.update_debt += self.config.horizon * self.num_envs * updates_per_step
        num_updates = int(self.update_debt)
        self.update_debt -= num_updates
        return num_updates

    def optimize(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor,
                 params: list[torch.nn.Parameter] | None = None) -> None:
        """One optimizer step on ``loss``; gradients flow into ``params`` only (all of the optimizer's if None)."""
        params = params if params is not None else [p for g in optimizer.param_groups for p in g["params"]]
        zero_grad(optimizer)  # zero_grad and optimizer_step: torch.optim's calls with less Python (jaderl.accel)
        loss.backward(inputs=params)
        if self.grad_hook is not None:
            self.grad_hook(params)
        optimizer_step(optimizer, params, self.config.max_grad_norm)

    @staticmethod
    def adam(params: Any, lr: float, **kwargs: Any) -> torch.optim.Adam:
        """Adam with the fused kernel (one call per step instead of a dozen small ops per parameter)."""
        return torch.optim.Adam(params, lr=lr, fused=True, **kwargs)

    @staticmethod
    @torch.no_grad()
    def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
        """Polyak averaging target <- (1 - tau) target + tau source, in one fused call."""
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)

    # --- state ---
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, running statistics and counters, as a nested dict of tensors and JSON values."""
        return {"networks": {k: v.state_dict() for k, v in self.networks().items()},
                "optimizers": {k: v.state_dict() for k, v in self.optimizers().items()},
                "running_stats": {k: v.state_dict() if isinstance(v, nn.Module) else v
                                  for k, v in self.running_stats().items()}, "counters": self.counters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for kind in ("networks", "optimizers"):
            for name, part in getattr(self, kind)().items():
                part.load_state_dict(state[kind][name])
        for name, stat in self.running_stats().items():
            stat.load_state_dict(state["running_stats"][name]) if isinstance(stat, nn.Module) \
                else stat.copy_(state["running_stats"][name])
        self.load_counters(state["counters"])

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors of :meth:`policy`, for the best-policy file and explorer processes."""
        return {f"{name}.{k}": v for name, module in self.policy().items() for k, v in module.state_dict().items()}

    def load_policy_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, module in self.policy().items():
            module.load_state_dict({k.removeprefix(f"{name}."): v for k, v in tensors.items()
                                    if k.startswith(f"{name}.")})
