"""What algorithms of one family share: the off-policy base (replay buffer, uniform warm-up, owed gradient steps,
prioritized and n-step batches) and the on-policy base (a categorical or Gaussian actor, a V critic, one optimizer),
with their configs."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from jaderl.algos.nets import CategoricalActor, GaussianActor, SDEGaussianActor, orthogonal_hidden_
from jaderl.algos.per import PrioritizedReplayBuffer
from jaderl.core.agent import Agent, Hyperparameter
from jaderl.core.buffers import Batch, ReplayBuffer
from jaderl.core.config import Config, ConfigError, param
from jaderl.core.nets import ObsNorm, mlp
from jaderl.envs.vec import EnvSpec, VecEnv


@dataclasses.dataclass
class OffPolicyConfig(Config):
    """Settings every replay-buffer algorithm shares (subclasses change the defaults)."""

    buffer_size: int = param(1_000_000, "replay capacity in transitions", low=1)
    batch_size: int = param(256, "transitions per gradient step", low=1)
    warmup_steps: int = param(1_000, "env steps of uniformly random actions before learning starts", low=0)
    updates_per_step: float = param(1.0, "gradient steps per env step collected (all sub-envs counted)",
                                    low=0.0, open_low=True)
    n_step: int = param(1, "n-step returns: rewards summed over up to n steps before bootstrapping", low=1)
    use_per: bool = param(False, "prioritized experience replay (proportional, on the training device)")
    per_alpha: float = param(0.6, "PER: priority exponent (0 is uniform)", low=0.0)
    per_beta: float = param(0.4, "PER: initial importance-sampling exponent, annealed to 1 over total_steps",
                            low=0.0, high=1.0)

    def validate(self) -> None:
        super().validate()
        if self.batch_size > self.buffer_size:
            raise ConfigError(f"batch_size={self.batch_size} is larger than buffer_size={self.buffer_size}; "
                              "lower batch_size or raise buffer_size")


@dataclasses.dataclass
class SDEConfig:
    """gSDE's settings, mixed into the configs of the algorithms that explore with it (the rollout algorithms and
    SAC)."""

    use_sde: bool = param(False, "generalised state-dependent exploration (gSDE, continuous actions): the noise is a "
                          "linear function of the policy's last hidden layer, with weights drawn per sub-env at the "
                          "start of every explore() call (a rollout; off-policy: every horizon steps); log_std_init "
                          "is then the log std of those weights (RL Zoo: -2 for A2C and PPO, -3 for SAC)")
    sde_sample_freq: int = param(-1, "gSDE: also draw new noise weights every this many steps of an explore() call "
                                 "(-1: only at its start)", low=-1)

    def validate(self) -> None:
        super().validate()  # type: ignore[misc]  # the Config this is mixed into
        if self.sde_sample_freq == 0:
            raise ConfigError("sde_sample_freq=0 is invalid: give a number of steps, or -1 for once per explore() "
                              "call")


class SDEExploration:
    """gSDE's draw schedule for an agent whose actor has noise weights (``use_sde``): new weights for every sub-env
    (and agent) at the start of every explore() call, and every ``sde_sample_freq`` steps of it."""

    config: SDEConfig
    actor: nn.Module
    last_obs: torch.Tensor
    obs_shape: tuple[int, ...]

    def begin_explore_step(self, t: int) -> None:
        freq = self.config.sde_sample_freq
        if self.config.use_sde and (t == 0 or (freq > 0 and t % freq == 0)):
            obs = self.last_obs
            self.actor.resample(obs.shape[:obs.dim() - len(self.obs_shape)])


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
"""Hidden-layer activations of the rollout algorithms' networks (``activation``)."""


@dataclasses.dataclass
class OnPolicyConfig(SDEConfig, Config):
    """Settings every rollout algorithm (PPO, A2C, REINFORCE) shares (subclasses change the defaults)."""

    num_envs: int = param(16, "sub-envs stepped in one batch", low=1)
    hidden: list[int] = param((64, 64), "hidden layer sizes of the actor and the critic")
    activation: str = param("tanh", "activation of the actor's and the critic's hidden layers: tanh, or relu (as in "
                            "RL Zoo's tuned MuJoCo entries)")
    ent_coef: float = param(0.0, "entropy bonus weight", low=0.0)
    vf_coef: float = param(0.5, "value loss weight", low=0.0)
    max_grad_norm: float = param(0.5, "clip gradient norm to this (0 disables)", low=0.0)
    normalize_advantages: bool = param(True, "standardise the advantages (per minibatch, or over the rollout)")
    log_std_init: float = param(-0.5, "initial log standard deviation of the Gaussian policy (continuous actions)")
    ortho_init: bool = param(False, "orthogonal initial weights (zero biases) of the actor's and the critic's hidden "
                             "layers, scaled by the activation's gain (tanh 5/3, relu sqrt 2), as the MAPPO code's "
                             "use_orthogonal; false keeps PyTorch's default (the output layers are orthogonal either "
                             "way, the policy's at gain 0.01 and the value's at 1)")
    normalize_reward: bool = param(False, "divide rewards by the running standard deviation of the discounted return "
                                   "before learning from them (SB3's VecNormalize norm_reward); the critic learns "
                                   "scaled returns, while logged and evaluated returns stay the env's")
    anneal_lr: bool = param(False, "decay the learning rate linearly towards 0 over total_steps: each update uses "
                            "lr * (1 - env steps done before its rollout / total_steps) (CleanRL's anneal_lr; RL "
                            "Zoo's lin_ learning rates)")

    def validate(self) -> None:
        super().validate()
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation={self.activation!r} is invalid: use {' or '.join(ACTIVATIONS)}")
        count, name = self.advantage_batch()
        if self.normalize_advantages and count < 2:
            raise ConfigError(f"normalize_advantages=true needs at least 2 transitions to standardise ({name} = "
                              f"{count}: a single advantage has no standard deviation); raise {name} or set "
                              "normalize_advantages=false")

    def advantage_batch(self) -> tuple[int, str]:
        """How many advantages are standardised together, and the setting that says so."""
        return self.num_envs * self.horizon, "num_envs * horizon"


class ReturnNorm(ObsNorm):
    """Reward scaling by the running standard deviation of the discounted return, as SB3's ``VecNormalize``
    (``norm_reward``) and Gymnasium's ``NormalizeReward`` do it (Engstrom et al. 2020, https://arxiv.org/abs/2005.12729):
    every sub-env (and agent) keeps R <- gamma R + r, zeroed when its episode ends; the variance of all R seen so far
    scales the rewards, r / sqrt(var + 1e-8), clipped to +-``clip``. The mean is not subtracted, so a reward's sign and
    the task's optimum stay. A rollout's returns enter the statistics before it is scaled (the wrappers update per
    step). An :class:`~jaderl.core.nets.ObsNorm` of scalars, so data-parallel learners merge it exactly; ``running``
    is each sub-env's own and stays with its learner."""

    def __init__(self, running_shape: tuple[int, ...], enabled: bool, clip: float = 10.0) -> None:
        super().__init__((), enabled, clip)
        self.register_buffer("running", torch.zeros(running_shape))

    @torch.no_grad()
    def normalize_(self, data: Batch, gamma: float) -> None:
        """Replace ``data["reward"]`` (T, N, ...) of a rollout by the scaled rewards (nothing when disabled)."""
        if not self.enabled:
            return
        reward = data["reward"].float()
        if reward.shape[1:] != self.running.shape:
            raise ValueError(f"rewards of shape {tuple(reward.shape[1:])} per step do not match the "
                             f"{tuple(self.running.shape)} running returns the normaliser keeps")
        done = data["terminated"] | data["truncated"]  # (T, N): an episode end zeroes all its agents' returns
        done = done.view(*done.shape, *(1,) * (reward.dim() - done.dim()))
        returns, running = torch.empty_like(reward), self.running
        for t in range(reward.shape[0]):  # over time only; every sub-env at once
            running = running * gamma + reward[t]
            returns[t] = running
            running = running.masked_fill(done[t], 0.0)
        self.running.copy_(running)
        present = data.get("active")  # several agents that may leave (agents_leave): the returns of those present
        self.update(returns if present is None else returns[present])
        data["reward"] = (reward / (self.var + 1e-8).sqrt()).clamp(-self.clip, self.clip)


class OffPolicyAgent(Agent):
    """Base of replay-buffer algorithms: uniformly random actions for ``warmup_steps``, then ``update`` runs the
    gradient steps owed to the env steps collected (``updates_per_step``) on uniform or prioritized, one- or n-step
    batches; subclasses write ``update_once`` (and ``noisy_action`` when exploring is not just ``act``)."""

    config_cls: ClassVar[type[Config]] = OffPolicyConfig
    on_policy: ClassVar[bool] = False
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {**Agent.hyperparameters,
                                                           "tau": Hyperparameter(1e-4, 1.0, log=True)}
    config: OffPolicyConfig

    def make_buffer(self) -> ReplayBuffer:
        cfg = self.config
        if cfg.use_per:
            return PrioritizedReplayBuffer(cfg.buffer_size, self.num_envs, self.device, cfg.per_alpha)
        return ReplayBuffer(cfg.buffer_size, self.num_envs, self.device)

    def explore_action(self, obs: torch.Tensor) -> torch.Tensor:
        if self.steps < self.config.warmup_steps:
            return self.random_action(obs.shape[0])
        return self.noisy_action(obs)

    def random_action(self, num: int) -> torch.Tensor:
        """Uniformly random actions for ``num`` sub-envs (and every agent): integers, or floats in [-1, 1]."""
        agents = (self.spec.num_agents,) if self.spec.num_agents > 1 else ()
        if self.is_discrete:
            return torch.randint(self.action_dim, (num, *agents), device=self.device)
        return torch.rand(num, *agents, self.action_dim, device=self.device) * 2 - 1

    def noisy_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The exploring action after the warm-up: the stochastic policy's sample by default."""
        return self.act(obs)

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


class OnPolicyAgent(SDEExploration, Agent):
    """Base of rollout algorithms (PPO, A2C, REINFORCE): a categorical or Gaussian actor, optionally a V critic,
    one optimizer."""

    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {**Agent.hyperparameters,
                                                           "ent_coef": Hyperparameter(0.0, 0.1),
                                                           "vf_coef": Hyperparameter(0.1, 1.0)}

    def __init__(self, config: OnPolicyConfig, spec: EnvSpec | VecEnv, device: torch.device) -> None:
        super().__init__(config, spec, device)
        agents = (self.spec.num_agents,) if self.spec.num_agents > 1 else ()
        self.reward_norm = ReturnNorm((self.num_envs, *agents), config.normalize_reward).to(device)

    def begin_update(self, data: Batch) -> dict[str, torch.Tensor]:
        """What every rollout update does first: scale the rollout's rewards in place (``normalize_reward``) and set
        the learning rate of this update (``anneal_lr``); returns ``train/lr`` when it is annealed."""
        cfg = self.config
        self.reward_norm.normalize_(data, cfg.gamma)
        if not cfg.anneal_lr:
            return {}
        # explore (or the explorer workers) counted this rollout's env steps in self.steps already
        steps_before = self.steps - data["reward"].shape[0] * data["reward"].shape[1]
        lr = cfg.lr * max(0.0, 1.0 - steps_before / cfg.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return {"train/lr": torch.full((), lr, device=self.device)}

    def restart_episodes(self) -> None:
        super().restart_episodes()
        self.reward_norm.running.zero_()  # the discounted returns of episodes that will not go on

    def running_stats(self) -> dict[str, nn.Module | torch.Tensor]:
        # only when enabled, so that checkpoints written without it still load
        return super().running_stats() | ({"reward_norm": self.reward_norm} if self.reward_norm.enabled else {})

    def build_actor_critic(self, hidden: list[int], critic: bool, log_std_init: float | None = None,
                           eps: float = 1e-5) -> None:
        """Create ``self.actor`` (and ``self.critic`` if asked) and ``self.optimizer``, Adam over both (``eps``: Adam's
        epsilon; 1e-5 is PPO's and A2C's usual value)."""
        if self.config.use_sde and self.is_discrete:
            raise ConfigError("use_sde=true needs continuous actions and this env's are discrete; set "
                              "use_sde=false")
        actor_cls = CategoricalActor if self.is_discrete else SDEGaussianActor if self.config.use_sde \
            else GaussianActor
        activation = ACTIVATIONS[self.config.activation]
        self.actor = actor_cls(self.obs_dim, self.action_dim, hidden, activation).to(self.device)
        if log_std_init is not None and isinstance(self.actor, GaussianActor):
            self.actor.log_std.data.fill_(log_std_init)
        self.critic = mlp([self.obs_dim, *hidden, 1], activation, out_gain=1.0).to(self.device) if critic else None
        self.init_hidden(self.actor, self.critic)
        params = [*self.encoder_parameters(), *self.actor.parameters()]
        params += [] if self.critic is None else list(self.critic.parameters())
        self.optimizer: torch.optim.Optimizer = self.adam(params, lr=self.config.lr, eps=eps)

    def init_hidden(self, *nets: nn.Module | None) -> None:
        """Initialise the hidden layers of ``nets`` orthogonally if ``ortho_init`` (:func:`orthogonal_hidden_`)."""
        if self.config.ortho_init:
            gain = nn.init.calculate_gain(self.config.activation)
            for net in nets:
                if net is not None:
                    orthogonal_hidden_(net, gain)

    def networks(self) -> dict[str, nn.Module]:
        critic = {} if self.critic is None else {"critic": self.critic}
        return super().networks() | {"actor": self.actor} | critic

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        if deterministic:
            return self.actor(x)
        action = self.actor.sample(x)
        return action if self.is_discrete else action.clamp(-1.0, 1.0)

    def explore_action(self, obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The unclipped sample (the env clips it to [-1, 1]), whose log-probability is what the update needs; with
        it, when :attr:`record_keys` asks for ``log_prob`` (PPO)."""
        if self.record_keys:
            return self.actor.sample_log_prob(self.features(obs))
        return self.actor.sample(self.features(obs))

    def old_log_prob(self, data: Batch) -> torch.Tensor:
        """The rollout policy's log-probabilities (T, N, ...) of the rollout's actions: those recorded while exploring
        (:attr:`record_keys`), else computed now, before any update (explorer workers that do not compute as the
        learner does, in another precision, leave them out)."""
        if "log_prob" in data:
            return data["log_prob"]
        lead = data["reward"].dim() - 1  # the (T, N) or (T, N, agents) dims flattened into one batch dim
        log_prob = self.actor.evaluate(self.features(data["obs"]).flatten(0, lead), data["action"].flatten(0, lead))[0]
        return log_prob.view(data["reward"].shape)
