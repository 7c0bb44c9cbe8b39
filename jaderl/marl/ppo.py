"""MAPPO and IPPO: PPO with one parameter-shared actor for all agents, and a centralised or a decentralised critic.

MAPPO, Yu et al. 2022, https://arxiv.org/abs/2103.01955; IPPO, de Witt et al. 2020, https://arxiv.org/abs/2011.09533.
One actor pi(a_i | o_i, i) acts for every agent (its one-hot id is in the input, :class:`~jaderl.marl.base.MultiAgent`)
and is trained on every agent's samples with PPO's clipped objective

    L = -E_i,t[min(r A, clip(r, 1 - eps, 1 + eps) A)] + vf_coef E[(V - V_target)^2] - ent_coef E[H(pi)],

with r = pi(a_i|o_i) / pi_old(a_i|o_i). The presets differ in the critic and the reward it learns:

* MAPPO (``centralised_critic=True``): one value V(s) per sub-env for the whole team, read from the global state s
  (simple_spread: every agent's observation concatenated, the paper's "CL" state for MPE), learned from the *team
  reward* sum_i r_i. This is what the paper's MPE runs do: their env gives every agent the sum of the agents' rewards
  (``shared_reward``) and every agent's critic reads the same concatenated observations, so the agents' values and
  advantages are one team value and advantage repeated. Every agent's actor takes the team's advantage.
* IPPO (``centralised_critic=False``): a value V(o_i, i) per agent from its own observation and id (the same shared
  network), learned from the agent's *own reward* r_i, and an advantage per agent. On simple_spread r_i is half the
  shared coverage term plus half agent i's own collision term (see :mod:`jaderl.envs.mpe`), so IPPO's agents
  cooperate through the shared half.

Advantages are GAE(lambda) over each sub-env's steps (:func:`jaderl.core.buffers.gae`). Every episode end, the time
limit included, ends the returns, as the MAPPO and IPPO code treat MPE's 25-step limit; ``bootstrap_truncated``
bootstraps a truncated step from the value of the state it reached instead. That is off by default because those
states are never a rollout's ``obs`` (the env resets first), so the critic is never trained on them: on simple_spread,
whose observations carry no time, IPPO's agents learned to drift to where the critic over-estimated them (team return
-100 after 200k steps, worse than random). Value normalisation (the MAPPO paper's ``use_valuenorm``, on by default):
the critic predicts values in units of a running mean and standard deviation of the value targets (``value_norm``, a
running statistic: checkpointed, and merged exactly by data-parallel learners before any of them normalises its
targets with it); GAE reads the denormalised predictions, and the value loss compares the prediction with the
normalised target. The statistics are those of every target seen (the paper's exponential average with beta =
0.99999 is nearly that), updated once per rollout before its epochs; as in the paper's code, the variance is floored at
1e-2 (:class:`ValueNorm`), so targets that have barely varied yet (a sparse reward before its first success) are not
scaled up without bound. The actor and the critic are tanh MLPs (``activation``) trained by one Adam (the paper's two
optimizers share one learning rate). Discrete and continuous actions; the defaults are tuned for
``jaderl/simple_spread``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch
from torch import nn

from jaderl.algos import AlgoSpec
from jaderl.algos.base import ACTIVATIONS, OnPolicyAgent, OnPolicyConfig
from jaderl.algos.ppo import PPO, explained_variance
from jaderl.core.agent import Hyperparameter
from jaderl.core.buffers import Batch, RolloutBuffer, gae
from jaderl.core.config import ConfigError, param
from jaderl.core.nets import ObsNorm, mlp
from jaderl.envs.vec import EnvSpec
from jaderl.marl.base import MultiAgent, present_mean, present_obs


class ValueNorm(ObsNorm):
    """The running mean and variance of the value targets (an :class:`~jaderl.core.nets.ObsNorm` of scalars, so that
    checkpoints and data-parallel learners treat it as every normaliser), with the variance that scales values
    floored at ``min_var``: the MAPPO code's ``ValueNorm`` floors it at 1e-2 (a standard deviation of 0.1). Without
    the floor, targets that have barely varied so far (a sparse reward before its first success, a critic that
    learned to predict 0 for them) leave a variance near 0, and the first reward that differs becomes a normalised
    target of tens to thousands, whose value loss dominates the gradient norm the actor and the critic are clipped
    to together."""

    def __init__(self, enabled: bool, min_var: float = 1e-2) -> None:
        super().__init__((1,), enabled, clip=math.inf)
        self.min_var = min_var

    def scale(self) -> torch.Tensor:
        """The standard deviation values are scaled by, (1,): that of the targets, at least sqrt(min_var)."""
        return self.var.clamp(min=self.min_var).sqrt()

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        """Values in reward units as the critic's normalised units (unchanged when disabled)."""
        return (value.float() - self.mean) / self.scale() if self.enabled else value.float()

    def denormalize(self, value: torch.Tensor) -> torch.Tensor:
        """The critic's normalised values in reward units (unchanged when disabled)."""
        return value * self.scale() + self.mean if self.enabled else value


@dataclasses.dataclass
class MAPPOConfig(OnPolicyConfig):
    """MAPPO / IPPO settings; the defaults are tuned for jaderl/simple_spread (3 agents, 25-step episodes): large
    rollouts (25,600 sub-env steps, 76,800 agent samples) taken in large steps (lr 0.01). The team advantage every
    agent shares is a weak signal for each one; with the paper's smaller batches and lr (7e-4) the policy settles in
    the local optimum where the agents gather between the landmarks (about -54 team return, seeds 0-2)."""

    num_envs: int = param(1024, "sub-envs stepped in one batch", low=1)
    horizon: int = param(25, "steps each sub-env takes per rollout (simple_spread: one whole episode)", low=1,
                         high=100_000)
    total_steps: int = param(2_000_000, "stop after this many env steps (all sub-envs counted)", low=1)
    eval_every: int = param(100_000, "evaluate every this many env steps", low=1)
    lr: float = param(0.01, "Adam learning rate of the actor and the critic", low=0.0, open_low=True)
    gamma: float = param(0.99, "discount factor", low=0.0, high=1.0)
    hidden: list[int] = param((64, 64), "hidden layer sizes of the actor and the critic")
    num_epochs: int = param(5, "passes over each rollout", low=1)
    minibatch_size: int = param(6400, "sub-env steps per gradient step, each with all its agents' samples (each "
                                "epoch reshuffles the rollout and leaves out its remainder)", low=1)
    clip_ratio: float = param(0.2, "PPO clipping range of the probability ratio", low=0.0, open_low=True)
    gae_lambda: float = param(0.95, "GAE lambda", low=0.0, high=1.0)
    ent_coef: float = param(0.01, "entropy bonus weight", low=0.0)
    max_grad_norm: float = param(10.0, "clip gradient norm to this (0 disables)", low=0.0)
    centralised_critic: bool = param(True, "MAPPO: one team value of the global state, learned from the summed "
                                     "rewards; false is IPPO: a value per agent of its own observation and reward")
    bootstrap_truncated: bool = param(False, "a truncated episode's last step bootstraps from the value of the state "
                                      "it reached; false ends the returns there, as MAPPO and IPPO do")
    ortho_init: bool = param(True, "orthogonal initial weights (zero biases) of the actor's and the critic's hidden "
                             "layers, scaled by the activation's gain (tanh 5/3), as the MAPPO code's use_orthogonal; "
                             "false keeps PyTorch's default")
    normalize_values: bool = param(True, "the critic predicts values normalised by a running mean and standard "
                                   "deviation (at least 0.1) of the value targets (MAPPO's use_valuenorm)")

    def validate(self) -> None:
        rollout = self.num_envs * max(1, self.workers) * self.horizon
        if self.minibatch_size > rollout:
            workers = " * workers" if self.workers > 1 else ""
            raise ConfigError(f"minibatch_size={self.minibatch_size} is larger than a rollout (num_envs{workers} * "
                              f"horizon = {rollout} sub-env steps); lower it or collect more")
        super().validate()

    def advantage_batch(self) -> tuple[int, str]:
        # standardised per minibatch: MAPPO's one team advantage per sub-env step, IPPO's one per agent (2 or more)
        return self.minibatch_size * (1 if self.centralised_critic else 2), "minibatch_size"


class MAPPO(MultiAgent, OnPolicyAgent):
    """MAPPO (centralised critic) and IPPO (decentralised critic) with a parameter-shared actor."""

    config_cls = MAPPOConfig
    compiled_methods = ("act", "explore_action", "minibatch_loss")
    record_keys = ("log_prob",)
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {
        **OnPolicyAgent.hyperparameters, "clip_ratio": PPO.hyperparameters["clip_ratio"],
        "gae_lambda": PPO.hyperparameters["gae_lambda"]}
    config: MAPPOConfig

    def __init__(self, config: MAPPOConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.build_actor_critic(config.hidden, critic=False, log_std_init=config.log_std_init)  # the actor
        critic_in = self.state_dim if config.centralised_critic else self.obs_dim
        self.critic = mlp([critic_in, *config.hidden, 1], ACTIVATIONS[config.activation], out_gain=1.0).to(device)
        self.init_hidden(self.critic)
        self.optimizer.add_param_group({"params": list(self.critic.parameters())})
        # values normalised by the targets' running statistics (the state like the observations: MultiAgent)
        self.value_norm = ValueNorm(config.normalize_values).to(device)

    def learns_team_reward(self) -> bool:
        return self.config.centralised_critic

    def running_stats(self) -> dict[str, nn.Module | torch.Tensor]:
        return super().running_stats() | {"state_norm": self.state_norm, "value_norm": self.value_norm}

    def value(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The critic's normalised values (..., 1) of the team (MAPPO) or (..., agents) of each agent (IPPO), for
        observations (..., agents, obs_dim) and states (..., state_dim)."""
        if self.config.centralised_critic:
            return self.critic(self.state_norm(state))
        return self.critic(self.features(obs)).squeeze(-1)

    def denormalize(self, value: torch.Tensor) -> torch.Tensor:
        """The critic's values in reward units (:meth:`ValueNorm.denormalize`)."""
        return self.value_norm.denormalize(value)

    def returns(self, data: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE advantages, value targets and the critic's values (T, N, K) of a rollout, in reward units: K = 1 and
        the team reward for MAPPO, K = agents and each agent's reward for IPPO."""
        cfg = self.config
        value = self.denormalize(self.value(data["obs"], data["state"]))
        next_value = self.denormalize(self.value(data["next_obs"], data["next_state"]))
        reward = self.team_reward(data["reward"]).unsqueeze(-1) if cfg.centralised_critic else data["reward"]
        terminated = data["terminated"] if cfg.bootstrap_truncated else data["terminated"] | data["truncated"]
        terminated, truncated = (x.unsqueeze(-1).expand_as(value) for x in (terminated, data["truncated"]))
        if "active" in data and not cfg.centralised_critic:  # an agent that leaves ends its own returns (at an
            terminated = terminated | (data["active"] & ~data["next_active"])  # episode's end: one not cut by time)
        advantage, target = gae(reward, value, next_value, terminated, truncated, cfg.gamma, cfg.gae_lambda)
        return advantage, target, value

    def update(self, buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
        cfg, data = self.config, buffer.data
        schedule = self.begin_update(data)
        # 1. the old log-probabilities (recorded), advantages and the critic's targets (normalised) for the rollout
        with torch.no_grad():
            data["log_prob"] = self.old_log_prob(data)  # (T, N, A)
            data["advantage"], target, value = self.returns(data)
            own = "active" in data and not cfg.centralised_critic  # IPPO's targets of agents present only
            present = data["active"] if own else slice(None)
            explained = explained_variance(value[present], target[present])
            self.value_norm.update(target[data["active"]] if own else target)
            if self.stats_hook is not None:  # data-parallel learners: every learner's targets, one statistic
                self.stats_hook(self.value_norm)
            data["value_target"] = self.value_norm(target)  # in the critic's units
        batch = {k: data[k].flatten(0, 1) for k in ("obs", "state", "action", "log_prob", "advantage",
                                                    "value_target", "active") if k in data}  # (T * N, ...)
        size = batch["advantage"].shape[0]
        # 2. minibatch epochs over sub-env steps, each with all its agents
        totals: dict[str, torch.Tensor] = {}
        num_minibatches = 0
        for _ in range(cfg.num_epochs):
            perm = torch.randperm(size, device=self.device)
            for start in range(0, size - cfg.minibatch_size + 1, cfg.minibatch_size):
                loss, stats = self.minibatch_loss({k: v.index_select(0, perm[start:start + cfg.minibatch_size])
                                                   for k, v in batch.items()})
                self.optimize(self.optimizer, loss)
                totals = {k: totals[k] + v for k, v in stats.items()} if totals else stats
                num_minibatches += 1
        # after learning, so the old log-probabilities used the acting statistics
        self.obs_norm.update(present_obs(data)["obs"])
        self.state_norm.update(data["state"])
        return {k: v / num_minibatches for k, v in totals.items()} | {"policy/explained_variance": explained} \
            | schedule

    def minibatch_loss(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss L of the module docstring on a minibatch of B sub-env steps, and its named statistics."""
        cfg = self.config
        log_prob, entropy = self.actor.evaluate(self.features(mb["obs"]).flatten(0, 1), mb["action"].flatten(0, 1))
        log_prob = log_prob.view(mb["log_prob"].shape)  # (B, A)
        entropy = entropy.view(log_prob.shape)
        log_ratio = log_prob - mb["log_prob"]
        ratio = log_ratio.exp()
        adv = mb["advantage"]  # (B, K)
        active = mb.get("active")  # (B, A): the agents present, where agents may leave (else every agent)
        own = None if cfg.centralised_critic else active  # the team's advantage and value are every step's
        if cfg.normalize_advantages and own is None:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        elif cfg.normalize_advantages:  # over the agents present only (the unbiased variance, as adv.std())
            adv = adv - present_mean(adv, own)
            squares = torch.where(own, adv.square(), torch.zeros((), dtype=adv.dtype, device=adv.device)).sum()
            adv = adv / ((squares / (own.sum() - 1).clamp(min=1)).sqrt() + 1e-8)
        adv = adv.expand_as(ratio)  # the team's advantage for every agent (MAPPO), or each agent's own (IPPO)
        policy_loss = -present_mean(torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio) * adv),
                                    active)
        value_loss = present_mean((self.value(mb["obs"], mb["state"]) - mb["value_target"]).square(), own)
        entropy = present_mean(entropy, active)
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
        with torch.no_grad():
            stats = {"loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(),
                     "policy/entropy": entropy.detach(), "policy/approx_kl": present_mean((ratio - 1) - log_ratio,
                                                                                          active),
                     "policy/clip_fraction": present_mean(((ratio - 1).abs() > cfg.clip_ratio).float(), active)}
        return loss, stats


ENTRIES: dict[str, AlgoSpec] = {
    "mappo": AlgoSpec(MAPPO, {}, "Multi-agent PPO: parameter-shared actor, centralised critic on the global state"),
    "ippo": AlgoSpec(MAPPO, {"centralised_critic": False},
                     "Independent PPO: parameter-shared actor, each agent's critic on its own observation"),
}
