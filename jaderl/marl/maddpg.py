"""MADDPG and MATD3: deterministic actors trained by centralised critics (MATD3 is MADDPG with TD3's three fixes).

Lowe et al. 2017, https://arxiv.org/abs/1706.02275 (MADDPG); Ackermann et al. 2019, https://arxiv.org/abs/1910.01465
(MATD3). Every agent i acts on its own observation o_i through one actor shared by all agents (parameter sharing, the
agent's one-hot id appended to o_i); the critic reads the global state s and every agent's action and has one output
per agent, Q_i(s, a_1 .. a_A), which learns agent i's own reward r_i, so cooperative (simple_spread) and competitive
games (simple_tag's predators and prey) train the same way. Each gradient step, on a batch of B transitions,

    1. critics: y_i = r_i + gamma (1 - terminated) min_e Q_target_e,i(s', a'_1 .. a'_A),  a'_j = the target actor's
       action for o'_j (continuous: TD3's target smoothing, see jaderl.algos.td3), and minimise
       mean_i sum_e (Q_e,i(s, a_1 .. a_A) - y_i)^2 over the stored joint action;
    2. every ``policy_delay``-th step only: actor: minimise -mean_i Q_1,i(s, a_1 .. mu(o_i) .. a_A), agent i's stored
       action replaced by its current policy's, the others' kept (the paper's eq. 6), then Polyak-average the targets.

MADDPG (``maddpg``) is ``num_critics=1, policy_delay=1, target_noise=0`` (TD3's DDPG preset); MATD3 (``matd3``) keeps
TD3's twin critics, delayed actor and target policy smoothing. Continuous actions (``jaderl/simple_spread?continuous=
true``) are the actor's tanh outputs, explored with Gaussian noise. Discrete actions go through the Gumbel-softmax
(Jang et al. 2016, https://arxiv.org/abs/1611.01144): the actor outputs logits l, the critics read one-hot actions,
and the actor's objective uses the straight-through sample a = one_hot(argmax(l + g)), g ~ Gumbel(0, 1), whose
gradient is that of softmax((l + g) / ``gumbel_temperature``) (lower temperatures: less biased, noisier gradients).
Exploring samples argmax(l + g), i.e. softmax(l); the target action a'_j is such a sample of the target actor (for
discrete actions the sampling is the target smoothing); acting deterministically takes argmax(l). As in the paper's
code, a small penalty ``actor_reg`` mean(l^2) keeps the logits from saturating. Rewards are per agent (N, A); only
``terminated`` stops the bootstrap. n-step returns and prioritized replay (the TD error averaged over agents) come
from the shared off-policy base. Where agents may leave an episode early (PettingZoo), the critics read an agent that
has left as acting 0 (a zero one-hot when discrete), its value is not bootstrapped past its last step, and its values
and actor objective are left out of the losses.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn
from torch.nn import functional as F

from jaderl.algos import AlgoSpec
from jaderl.algos.nets import EnsembleQ
from jaderl.algos.td3 import DDPG_PRESET, TD3, TD3Config
from jaderl.core.agent import Hyperparameter
from jaderl.core.config import ConfigError, param
from jaderl.core.nets import mlp
from jaderl.envs.vec import EnvSpec
from jaderl.marl.base import MultiAgent, present_mean

Batch = dict[str, torch.Tensor]


@dataclasses.dataclass
class MADDPGConfig(TD3Config):
    """MADDPG / MATD3 settings: TD3's, with defaults tuned on jaderl/simple_spread (3 agents, 25-step episodes)."""

    num_envs: int = param(16, "sub-envs stepped in one batch", low=1)
    gamma: float = param(0.95, "discount factor (the paper's 0.95: MPE episodes last 25 steps)", low=0.0, high=1.0)
    lr: float = param(1e-3, "Adam learning rate of actor and critics", low=0.0, open_low=True)
    tau: float = param(0.01, "Polyak averaging rate of the target actor and critics", low=0.0, high=1.0,
                       open_low=True)
    hidden: list[int] = param((128, 128), "hidden layer sizes of the actor and the critics")
    batch_size: int = param(512, "transitions (each with every agent) per gradient step", low=1)
    buffer_size: int = param(1_000_000, "replay capacity in transitions (each with every agent)", low=1)
    warmup_steps: int = param(10_000, "env steps of uniformly random actions before learning starts", low=0)
    updates_per_step: float = param(0.0625, "gradient steps per env step collected (all sub-envs counted); the "
                                    "default is one per explore call of the 16 sub-envs", low=0.0, open_low=True)
    max_grad_norm: float = param(0.5, "clip gradient norm to this (0 disables)", low=0.0)
    exploration_noise: float = param(0.1, "std of the Gaussian exploration noise (continuous actions)", low=0.0)
    gumbel_temperature: float = param(1.0, "temperature of the straight-through Gumbel-softmax (discrete actions)",
                                      low=0.0, open_low=True)
    actor_reg: float = param(1e-3, "weight of the mean squared logit penalty on the actor (discrete actions)",
                             low=0.0)
    eval_every: int = param(25_000, "evaluate every this many env steps", low=1)

    def validate(self) -> None:
        super().validate()
        if self.use_hterm:
            raise ConfigError("use_hterm=true is not supported by maddpg or matd3; leave it false")
        if self.noise != "gaussian":
            raise ConfigError(f"noise={self.noise!r} is not supported by maddpg or matd3: use gaussian")


class MADDPG(MultiAgent, TD3):
    """MADDPG and MATD3 (presets) for discrete and continuous actions of several agents."""

    config_cls = MADDPGConfig
    config: MADDPGConfig

    @classmethod
    def live_hyperparameters(cls, config: MADDPGConfig, spec: EnvSpec) -> dict[str, Hyperparameter]:
        """TD3's (no ``target_noise`` for MADDPG), and on discrete actions, which explore and smooth the target by
        Gumbel-max samples, neither ``exploration_noise`` nor ``target_noise``."""
        noises = ("exploration_noise", "target_noise") if spec.is_discrete else ()
        return {k: h for k, h in super().live_hyperparameters(config, spec).items() if k not in noises}

    def __init__(self, config: MADDPGConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        # TD3 built single-agent networks; the actor here reads the agent id, the critics the state and joint action
        head = [] if self.is_discrete else [nn.Tanh()]  # logits, or actions in [-1, 1]
        self.actor = nn.Sequential(mlp([self.obs_dim, *config.hidden, self.action_dim]), *head).to(device)
        self.critic = EnsembleQ(self.state_dim, self.num_agents * self.action_dim, config.hidden, config.num_critics,
                                num_outputs=self.num_agents).to(device)  # Q_e(s, a_1 .. a_A): one output per agent
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = self.adam(self.actor.parameters(), lr=config.lr)
        self.critic_optimizer = self.adam(self.critic.parameters(), lr=config.lr)
        self.same_agent = torch.eye(self.num_agents, dtype=torch.bool, device=device).unsqueeze(-1)  # (A, A, 1)
        self.replayed: Batch = {}  # the batch update_once is learning from

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """mu(o_i) for every agent: (N, A, action_dim), or the most likely discrete actions (N, A)."""
        out = self.actor(self.features(obs))
        return out.argmax(-1) if self.is_discrete else out

    @torch.no_grad()
    def noisy_action(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.actor(self.features(obs))
        if self.is_discrete:  # a sample of softmax(logits), by the Gumbel-max trick
            return (out - torch.empty_like(out).exponential_().log()).argmax(-1)
        return (out + self.config.exploration_noise * torch.randn_like(out)).clamp(-1.0, 1.0)

    def target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        """a' (B, A, action_dim): a one-hot Gumbel-max sample of the target actor, or TD3's smoothed action."""
        if not self.is_discrete:
            return super().target_action(next_obs)
        logits = self.actor_target(next_obs)
        return F.one_hot((logits - torch.empty_like(logits).exponential_().log()).argmax(-1), self.action_dim).float()

    def stored_action(self, batch: Batch) -> torch.Tensor:
        """The replayed actions as the critics read them: (B, A, action_dim), one-hot when discrete."""
        action = batch["action"]
        action = F.one_hot(action.long(), self.action_dim).float() if self.is_discrete else action
        return action * batch["active"].unsqueeze(-1) if "active" in batch else action  # 0: the agent has left

    @torch.no_grad()
    def td_target(self, batch: Batch) -> torch.Tensor:
        """y_i = r_i + discount (1 - terminated) min_e Q_target_e,i(s', a') for a batch (B, ...): (B, A)."""
        next_action = self.target_action(self.features(batch["next_obs"]))  # (B, A, action_dim)
        if "next_active" in batch:  # agents that have left act no more, and have no value to come
            next_action = next_action * batch["next_active"].unsqueeze(-1)
        next_q = self.critic_target(self.state_norm(batch["next_state"]), next_action.flatten(1)).min(0).values
        next_q = next_q * batch["next_active"] if "next_active" in batch else next_q  # (B, A)
        return batch["reward"] + (batch["discount"] * ~batch["terminated"]).unsqueeze(-1) * next_q

    def critic_loss(self, obs: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step 1's loss (importance-weighted under prioritized replay), the values Q_e,i (E, B, A) and the TD errors
        |Q_e,i - y_i| averaged over agents (E, B); the critics read the state, not the features ``obs``."""
        q = self.critic(self.state_norm(batch["state"]), self.stored_action(batch).flatten(1))  # (E, B, A)
        td_error = q - self.td_target(batch)
        active = batch.get("active")  # (B, A) where agents may leave: the values of agents present only
        loss = self.weighted_mean(present_mean(td_error.square().sum(0), active, -1), batch)
        return loss, q.detach(), present_mean(td_error.detach().abs(), active, -1)

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """-mean_i Q_1,i(s, a_1 .. mu(o_i) .. a_A) for features ``obs`` (B, A, obs_dim) of the batch being learned
        from, the first critic as a constant, plus the logit penalty when discrete."""
        out = self.actor(obs)  # (B, A, action_dim): logits or actions
        policy = F.gumbel_softmax(out, self.config.gumbel_temperature, hard=True) if self.is_discrete else out
        # row i: agent i's action from the policy, the others' as replayed, (B, A, A * action_dim); Q_1,i is
        # output i of row i
        joint = torch.where(self.same_agent, policy.unsqueeze(1), self.stored_action(self.replayed).unsqueeze(1))
        b, a = joint.shape[:2]
        state = self.state_norm(self.replayed["state"]).unsqueeze(1).expand(b, a, -1)
        q = self.critic(state.flatten(0, 1), joint.flatten(2).flatten(0, 1), members=0, frozen=True)  # (1, B A, A)
        q = q.view(b, a, a).diagonal(dim1=1, dim2=2)  # (B, A)
        active = self.replayed.get("active")
        penalty = self.config.actor_reg * present_mean(out.square().mean(-1), active) if self.is_discrete else 0.0
        return -present_mean(q, active) + penalty

    def update_once(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """TD3's step (critics, then the delayed actor and targets) on a batch (B, ...); returns the statistics and
        the TD errors (B,) (mean over critics and agents) for prioritized replay."""
        self.replayed = batch  # the actor's objective reads the state and the other agents' replayed actions
        return super().update_once(batch)


ENTRIES: dict[str, AlgoSpec] = {
    "maddpg": AlgoSpec(MADDPG, DDPG_PRESET, "MADDPG: shared deterministic actor, centralised critic per agent "
                       "(Gumbel-softmax for discrete actions)"),
    "matd3": AlgoSpec(MADDPG, {}, "MATD3: MADDPG with twin critics, delayed actor and target policy smoothing"),
}
