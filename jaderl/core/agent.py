"""The agent base class: the four verbs every trainer (single process, pipeline, population) calls.

    act(obs, deterministic)   -> actions for a batch of observations
    explore(env, horizon)     -> a (T, N, ...) trajectory, stepping the batched env
    update(buffer)            -> a dict of named statistics (tensors; read them only when logging)
    state_dict() / load_state_dict()

An algorithm subclasses :class:`Agent`, builds its networks and optimizers in ``__init__`` and writes
``act`` and ``update``; on-policy algorithms also extend ``explore`` when they need more than the base records.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from jaderl.core.buffers import Batch, PrioritizedReplayBuffer, ReplayBuffer, RolloutBuffer
from jaderl.core.config import Config, OffPolicyConfig
from jaderl.core.nets import CategoricalActor, GaussianActor, NatureCNN, ObsNorm, mlp
from jaderl.envs.vec import EnvError, VecEnv


class Agent:
    """Base of every algorithm. Subclasses set the class attributes and implement ``act`` and ``update``."""

    config_cls: ClassVar[type[Config]] = Config
    on_policy: ClassVar[bool] = True
    """Learns from the latest rollout only (replay-buffer algorithms derive from :class:`OffPolicyAgent`)."""
    discrete: ClassVar[bool] = True
    """Whether the algorithm handles Discrete action spaces."""
    continuous: ClassVar[bool] = True
    """Whether the algorithm handles Box action spaces."""
    policy_modules: ClassVar[tuple[str, ...]] = ("actor",)
    """Attributes (besides ``obs_norm`` and a shared ``encoder``) that ``act`` needs, kept as the best policy."""
    counters: ClassVar[tuple[str, ...]] = ("steps", "update_debt")
    """Plain int / float attributes saved in checkpoints."""

    def __init__(self, config: Config, env: VecEnv, device: torch.device) -> None:
        self.config, self.device = config, device
        self.num_envs, self.obs_shape = env.num_envs, env.obs_shape
        self.is_discrete, self.action_dim = env.is_discrete, env.action_dim
        self.obs_dim, self.is_image = math.prod(self.obs_shape), len(self.obs_shape) == 3
        try:
            self.encoder: NatureCNN | None = NatureCNN(self.obs_shape).to(device) if self.is_image else None
        except ValueError as exc:  # an observation the CNN cannot read: a problem of the env, said in one sentence
            raise EnvError(f"{exc}; wrap the env to resize or flatten its observations") from None
        """The CNN every network reads images through (None for vectors); an algorithm whose networks need their own
        copy (DQN's target network) moves it into them and sets it to None, so ``features`` passes images through."""
        if self.encoder is not None:
            self.obs_dim = self.encoder.out_dim
        # images are scaled by the encoder, not normalised
        self.obs_norm = ObsNorm(self.obs_shape, config.normalize_obs and not self.is_image).to(device)
        self.steps = 0  # env steps explored, all sub-envs counted
        self.update_debt = 0.0  # fractional gradient steps owed to the env steps collected so far
        self.last_obs: torch.Tensor | None = None
        self._episode = torch.zeros(2, env.num_envs, device=device)  # running return, length
        self._finished = torch.zeros(3, device=device)  # count, summed return, summed length
        self.grad_hook: Callable[[list[nn.Parameter]], None] | None = None
        """Called by ``optimize`` between backward and clipping (data-parallel learners average gradients there)."""

    # --- the verbs ---
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions (N,) or (N, action_dim) in [-1, 1] for raw observations (N, *obs_shape), computed without
        gradients (every algorithm's ``act`` runs under ``torch.no_grad``)."""
        raise NotImplementedError

    def explore_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The action taken while exploring; algorithms override it for random warm-up or epsilon-greedy."""
        return self.act(obs, deterministic=False)

    @torch.no_grad()
    def explore(self, env: VecEnv, horizon: int) -> Batch:
        """Step ``env`` for ``horizon`` steps; returns obs, action, reward, terminated, truncated, next_obs (T, N, ...).

        ``next_obs`` is the observation reached before any auto-reset, so truncated steps can be bootstrapped.
        Rewards are clipped to their sign (``config.clip_rewards``), then multiplied by ``config.reward_scale``;
        episode statistics use the raw rewards.
        """
        if self.last_obs is None:  # a resumed run keeps its checkpointed env RNG, or reseeds an env without one
            seeded = self.steps == 0 or getattr(env, "generator", None) is None
            self.last_obs = env.reset(seed=self.config.seed + self.steps if seeded else None)
        steps: list[tuple[torch.Tensor, ...]] = []
        for _ in range(horizon):
            obs = self.last_obs
            action = self.explore_action(obs)
            self.last_obs, reward, terminated, truncated, info = env.step(action)
            steps.append((obs, action, reward, terminated, truncated, info["final_obs"]))
            self._track_episodes(reward, terminated | truncated)
        obs, action, reward, terminated, truncated, next_obs = (torch.stack(x) for x in zip(*steps, strict=True))
        self.steps += horizon * self.num_envs
        if not self.on_policy:  # on-policy agents update it after learning, so old log-probs stay exact
            self.obs_norm.update(obs)
        reward = (reward.sign() if self.config.clip_rewards else reward) * self.config.reward_scale
        return {"obs": obs, "action": action, "reward": reward,
                "terminated": terminated, "truncated": truncated, "next_obs": next_obs}

    def update(self, buffer: Any) -> dict[str, torch.Tensor]:
        """Learn from ``buffer``; returns named statistics such as ``loss/critic`` as 0-d tensors."""
        raise NotImplementedError

    def make_buffer(self) -> ReplayBuffer | RolloutBuffer:
        """The buffer the training loop feeds ``explore``'s trajectories into."""
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

    def _track_episodes(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        self._episode[0] += reward
        self._episode[1] += 1
        done_f = done.float()
        self._finished[0] += done_f.sum()
        self._finished[1:] += (self._episode * done_f).sum(1)
        self._episode *= 1.0 - done_f

    def episode_stats(self) -> dict[str, float]:
        """Mean return and length of the training episodes finished since the last call (host sync: logging only)."""
        count, ret, length = self._finished.tolist()
        self._finished.zero_()
        return {"train/episode_return": ret / count, "train/episode_length": length / count} if count else {}

    def optimize(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor,
                 params: list[torch.nn.Parameter] | None = None) -> None:
        """One optimizer step on ``loss``; gradients flow into ``params`` only (all of the optimizer's if None)."""
        params = params if params is not None else [p for g in optimizer.param_groups for p in g["params"]]
        optimizer.zero_grad(set_to_none=True)
        loss.backward(inputs=params)
        if self.grad_hook is not None:
            self.grad_hook(params)
        if self.config.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(params, self.config.max_grad_norm, foreach=True)
        optimizer.step()

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
    def _components(self) -> dict[str, nn.Module | torch.optim.Optimizer | nn.Parameter]:
        kinds = (nn.Module, torch.optim.Optimizer, nn.Parameter)
        return {k: v for k, v in vars(self).items() if isinstance(v, kinds)}

    def state_dict(self) -> dict[str, Any]:
        """Every network, parameter, optimizer and counter, as a nested dict of tensors and JSON values."""
        state: dict[str, Any] = {k: v if isinstance(v, nn.Parameter) else v.state_dict()
                                 for k, v in self._components().items()}
        state.update({name: getattr(self, name) for name in self.counters})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, component in self._components().items():
            if isinstance(component, nn.Parameter):
                component.data.copy_(state[name])
            else:
                component.load_state_dict(state[name])
        for name in self.counters:
            setattr(self, name, state[name])
        self.last_obs = None

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors of the modules ``act`` needs, for the best-policy file."""
        return {f"{name}.{k}": v for name in self._policy_names()
                for k, v in getattr(self, name).state_dict().items()}

    def _policy_names(self) -> tuple[str, ...]:
        shared = ("obs_norm",) if self.encoder is None else ("obs_norm", "encoder")
        return (*shared, *self.policy_modules)

    def load_policy_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        for name in self._policy_names():
            own = {k.removeprefix(f"{name}."): v for k, v in tensors.items() if k.startswith(f"{name}.")}
            getattr(self, name).load_state_dict(own)


class OffPolicyAgent(Agent):
    """Base of replay-buffer algorithms: ``update`` runs the gradient steps owed to the env steps collected
    (``updates_per_step``) on uniform or prioritized, one- or n-step batches; subclasses write ``update_once``."""

    config_cls: ClassVar[type[Config]] = OffPolicyConfig
    on_policy: ClassVar[bool] = False
    config: OffPolicyConfig

    def make_buffer(self) -> ReplayBuffer:
        cfg = self.config
        if cfg.use_per:
            return PrioritizedReplayBuffer(cfg.buffer_size, self.num_envs, self.device, cfg.per_alpha)
        return ReplayBuffer(cfg.buffer_size, self.num_envs, self.device)

    def update(self, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        cfg = self.config
        if self.steps < cfg.warmup_steps or len(buffer) < cfg.batch_size:
            return {}
        stats: dict[str, torch.Tensor] = {}
        for _ in range(self.owed_updates(cfg.updates_per_step)):
            if isinstance(buffer, PrioritizedReplayBuffer):
                beta = cfg.per_beta + (1.0 - cfg.per_beta) * min(1.0, self.steps / cfg.total_steps)
                batch = buffer.sample(cfg.batch_size, cfg.n_step, cfg.gamma, beta)
                stats, td_error = self.update_once(batch)
                buffer.update_priorities(batch["index"], td_error)
            else:
                stats, _ = self.update_once(buffer.sample(cfg.batch_size, cfg.n_step, cfg.gamma))
        return stats

    def update_once(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step on a batch (B, ...); returns named statistics and the TD errors (B,) for PER."""
        raise NotImplementedError

    @staticmethod
    def weighted_mean(loss: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean of per-transition losses (B,), importance-weighted when the batch comes from prioritized replay."""
        return (loss * batch["weight"]).mean() if "weight" in batch else loss.mean()


class OnPolicyAgent(Agent):
    """Base of rollout algorithms (PPO, A2C, REINFORCE): a categorical or Gaussian actor, optionally a V critic."""

    def build_actor_critic(self, hidden: list[int], critic: bool, log_std_init: float | None = None) -> list:
        """Create ``self.actor`` (and ``self.critic`` if asked); returns every parameter their optimizer trains."""
        actor_cls = CategoricalActor if self.is_discrete else GaussianActor
        self.actor = actor_cls(self.obs_dim, self.action_dim, hidden).to(self.device)
        if log_std_init is not None and isinstance(self.actor, GaussianActor):
            self.actor.log_std.data.fill_(log_std_init)
        params = [*self.encoder_parameters(), *self.actor.parameters()]
        if critic:
            self.critic = mlp([self.obs_dim, *hidden, 1], nn.Tanh, out_gain=1.0).to(self.device)
            params += list(self.critic.parameters())
        return params

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        if deterministic:
            return self.actor(x)
        action = self.actor.sample(x)
        return action if self.is_discrete else action.clamp(-1.0, 1.0)

    def explore_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The unclipped sample: its log-probability is what the update needs (the env clips it to [-1, 1])."""
        return self.actor.sample(self.features(obs))
