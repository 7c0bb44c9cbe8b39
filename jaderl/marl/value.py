"""QMIX, VDN and IQL: value-based multi-agent learning with one shared Q network and a mixer of the agents' values.

Every agent i picks its action greedily from one shared Q network Q_i(o_i, .) (parameter sharing: the observation
carries the agent's one-hot id, :class:`~jaderl.marl.base.MultiAgent`), so acting stays decentralised. Learning
regresses a mix of the agents' chosen values on the team's TD target:

    Q_tot(s, a) = mix(Q_1(o_1, a_1), ..., Q_A(o_A, a_A); s)
    y = R + gamma^k (1 - terminated) mix_target(Q_target_1(o'_1, a'_1), ...; s'),  a'_i = argmax Q_i(o'_i, .)

with R the team reward (the sum of the agents' rewards, the return jaderl reports) summed over up to k = ``n_step``
steps, and a'_i picked by the online network (``double``, van Hasselt et al. 2016) or by the target network. The mixer:

* ``qmix`` (Rashid et al. 2018, https://arxiv.org/abs/1803.11485): a two-layer network on the agents' values whose
  weights hypernetworks compute from the global state s and make non-negative with abs, so Q_tot is monotonic in every
  Q_i and each agent's greedy action is the team's; an ELU between its layers, state-dependent biases (the last one a
  two-layer hypernetwork, V(s));
* ``vdn`` (Sunehag et al. 2017, https://arxiv.org/abs/1706.05296): Q_tot = sum_i Q_i;
* ``none``, independent Q-learning (IQL, Tan 1993): no mixing, every agent regresses its own Q_i on its own reward,
  y_i = r_i + gamma^k (1 - terminated) Q_target_i(o'_i, a'_i).

Where agents may leave an episode early (PettingZoo), an agent that has left adds nothing: its chosen value is 0 in
the mix, and so is its next value in the target (IQL: its own loss is left out).

Agents explore epsilon-greedily, each drawing for itself, with epsilon decaying linearly over env steps. Target
networks (agent Q and mixer) are copied every ``target_update_every`` gradient steps (``tau=1``) or Polyak-averaged.
The loss is the Huber loss by default (as jaderl's DQN): Q_tot starts near 0 and must fall to about -50 on
simple_spread (team rewards near -3 a step, gamma 0.95), and the Huber loss bounds each transition's gradient while
the TD errors are that large, so no outlier batch throws the mixer's hypernetworks off; the squared error
(``loss=mse``, PyMARL's choice, kept in check there by gradient clipping as here) learned about as well in our runs on
simple_spread (QMIX seed 0: -52 after 100k steps, Huber -51), so either is sound. Warm-up, owed updates,
prioritized replay and n-step returns come from :class:`~jaderl.algos.base.OffPolicyAgent`. Discrete actions only.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from jaderl.algos import AlgoSpec
from jaderl.algos.base import OffPolicyAgent, OffPolicyConfig
from jaderl.algos.nets import QNet
from jaderl.core.agent import Hyperparameter
from jaderl.core.buffers import Batch, ReplayBuffer
from jaderl.core.config import ConfigError, param
from jaderl.core.nets import declare_precision, mlp
from jaderl.envs.vec import EnvSpec
from jaderl.marl.base import MultiAgent, present_mean

MIXERS = ("qmix", "vdn", "none")
LOSSES = {"huber": F.smooth_l1_loss, "mse": F.mse_loss}


@dataclasses.dataclass
class QMIXConfig(OffPolicyConfig):
    """QMIX / VDN / IQL settings; the defaults are tuned on jaderl/simple_spread (one CPU core)."""

    mixer: str = param("qmix", "how the agents' values make the team's: qmix (monotonic hypernetwork mixer), vdn "
                       "(sum) or none (IQL: each agent learns from its own reward)")
    num_envs: int = param(16, "sub-envs stepped in one batch", low=1)
    lr: float = param(5e-4, "Adam learning rate (agent Q network and mixer)", low=0.0, open_low=True)
    gamma: float = param(0.95, "discount factor", low=0.0, high=1.0)
    hidden: list[int] = param((64, 64), "hidden layer sizes of the shared agent Q network")
    mixing_embed_dim: int = param(32, "QMIX: width of the mixing network's hidden layer", low=1)
    hypernet_hidden: list[int] = param((64,), "QMIX: hidden layer sizes of the hypernetworks")
    buffer_size: int = param(200_000, "replay capacity in transitions (all sub-envs counted)", low=1)
    batch_size: int = param(128, "transitions per gradient step", low=1)
    warmup_steps: int = param(5_000, "env steps of uniformly random actions before learning starts", low=0)
    updates_per_step: float = param(0.125, "gradient steps per env step collected (all sub-envs counted)",
                                    low=0.0, open_low=True)
    n_step: int = param(3, "n-step returns: rewards summed over up to n steps before bootstrapping", low=1)
    target_update_every: int = param(1, "gradient steps between target network updates", low=1)
    tau: float = param(0.005, "target update rate: 1 copies the networks, less Polyak-averages them",
                       low=0.0, high=1.0, open_low=True)
    epsilon_start: float = param(1.0, "exploration rate at the start (each agent draws for itself)", low=0.0, high=1.0)
    epsilon_end: float = param(0.05, "exploration rate after the decay", low=0.0, high=1.0)
    epsilon_decay_steps: int = param(50_000, "env steps over which epsilon decays linearly", low=1)
    double: bool = param(True, "double Q-learning: the online network picks the target actions")
    loss: str = param("huber", "TD loss: huber (bounded gradients) or mse")
    max_grad_norm: float = param(10.0, "clip gradient norm to this (0 disables)", low=0.0)
    total_steps: int = param(400_000, "stop after this many env steps (all sub-envs counted)", low=1)
    eval_every: int = param(20_000, "evaluate every this many env steps", low=1)

    def validate(self) -> None:
        super().validate()
        if self.mixer not in MIXERS:
            raise ConfigError(f"mixer={self.mixer!r} is invalid: use {', '.join(MIXERS)}")
        if self.loss not in LOSSES:
            raise ConfigError(f"loss={self.loss!r} is invalid: use huber or mse")
        if not self.hypernet_hidden or any(h < 1 for h in self.hypernet_hidden):
            raise ConfigError(f"hypernet_hidden={self.hypernet_hidden} is invalid: give one or more positive sizes")


class QMixer(nn.Module):
    """QMIX's monotonic mixing network: Q_tot = w2(s) . elu(W1(s)^T q + b1(s)) + V(s) with W1, w2 >= 0 (abs).

    The hypernetworks are MLPs on the state (ReLU between layers); the first bias is one linear layer, V a two-layer
    network (Rashid et al. 2018, section 4). Precision: each hypernetwork's first layer reads the raw state and its
    last computes the weights, both in float32; the layers between them compute in bfloat16; the mixing itself
    (agent values times generated weights) is float32."""

    def __init__(self, num_agents: int, state_dim: int, embed_dim: int, hypernet_hidden: list[int]) -> None:
        super().__init__()
        self.num_agents, self.embed_dim = num_agents, embed_dim
        self.hyper_w1 = mlp([state_dim, *hypernet_hidden, num_agents * embed_dim])
        self.hyper_w2 = mlp([state_dim, *hypernet_hidden, embed_dim])
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.hyper_v = mlp([state_dim, hypernet_hidden[-1], 1])
        declare_precision([self.hyper_b1])  # one layer: reads the state, gives the bias, float32

    def forward(self, agent_q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Q_tot (...) for the agents' chosen values (..., agents) and the global state (..., state_dim)."""
        lead = agent_q.shape[:-1]
        q = agent_q.reshape(-1, 1, self.num_agents).float()  # (B, 1, agents)
        s = state.reshape(-1, state.shape[-1])  # (B, state_dim)
        w1 = self.hyper_w1(s).abs().view(-1, self.num_agents, self.embed_dim)  # (B, agents, embed)
        hidden = F.elu(torch.bmm(q, w1) + self.hyper_b1(s).unsqueeze(1))  # (B, 1, embed)
        w2 = self.hyper_w2(s).abs().unsqueeze(-1)  # (B, embed, 1)
        return (torch.bmm(hidden, w2).view(-1) + self.hyper_v(s).view(-1)).view(lead)


class QMIX(MultiAgent, OffPolicyAgent):
    """QMIX, VDN and IQL (``mixer``) with a shared agent Q network, double-Q targets and per-agent epsilon-greedy."""

    config_cls = QMIXConfig
    compiled_methods = ("act", "q_loss")
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {**OffPolicyAgent.hyperparameters,
                                                           "epsilon_end": Hyperparameter(0.0, 0.2)}
    config: QMIXConfig

    def __init__(self, config: QMIXConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.q_net = QNet(self.obs_dim, self.action_dim, config.hidden).to(device)  # shared by the agents
        self.q_target = copy.deepcopy(self.q_net).requires_grad_(False)
        self.mixer: QMixer | None = None
        if config.mixer == "qmix":
            self.mixer = QMixer(self.num_agents, self.state_dim, config.mixing_embed_dim,
                                config.hypernet_hidden).to(device)
            self.mixer_target = copy.deepcopy(self.mixer).requires_grad_(False)
        params = [*self.q_net.parameters(), *([] if self.mixer is None else self.mixer.parameters())]
        self.optimizer = self.adam(params, lr=config.lr)
        self.num_updates = 0

    def learns_team_reward(self) -> bool:
        return self.config.mixer != "none"

    @classmethod
    def accepts(cls, spec: EnvSpec) -> str | None:
        if (reason := super().accepts(spec)) is not None:
            return reason
        return None if spec.is_discrete else "its actions are continuous and QMIX, VDN and IQL pick discrete ones; " \
                                             "use maddpg, matd3 or mappo"

    def networks(self) -> dict[str, nn.Module]:
        mixer = {} if self.mixer is None else {"mixer": self.mixer, "mixer_target": self.mixer_target}
        return {"q_net": self.q_net, "q_target": self.q_target} | mixer

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def policy(self) -> dict[str, nn.Module]:
        return {"obs_norm": self.obs_norm, "q_net": self.q_net}

    def counters(self) -> dict[str, int | float]:
        return super().counters() | {"num_updates": self.num_updates}

    def load_counters(self, counters: dict[str, Any]) -> None:
        super().load_counters(counters)
        self.num_updates = int(counters["num_updates"])

    def epsilon(self) -> float:
        cfg = self.config
        frac = min(1.0, self.steps / cfg.epsilon_decay_steps)
        return cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Every agent's greedy action (N, agents)."""
        return self.q_net(self.features(obs)).argmax(-1)

    def noisy_action(self, obs: torch.Tensor) -> torch.Tensor:
        """Epsilon-greedy: each agent of each sub-env explores on its own draw."""
        random = self.random_action(obs.shape[0])  # (N, agents)
        return torch.where(torch.rand(random.shape, device=self.device) < self.epsilon(), random, self.act(obs))

    def update(self, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        stats = super().update(buffer)
        return {**stats, "epsilon": torch.tensor(self.epsilon())} if stats else {}

    def mix(self, agent_q: torch.Tensor, state: torch.Tensor, target: bool = False) -> torch.Tensor:
        """The team value (B,) of the agents' values (B, agents): QMIX's mixer (or its target), or their sum."""
        if self.mixer is None:
            return agent_q.sum(-1)
        return (self.mixer_target if target else self.mixer)(agent_q, self.state_norm(state))

    def q_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The TD loss on a batch (B, ...), the learned values (B,) or (B, agents) (IQL) and the TD errors (B,)."""
        cfg = self.config
        obs, next_obs = self.features(batch["obs"]), self.features(batch["next_obs"])  # (B, agents, obs_dim)
        independent = cfg.mixer == "none"
        active, next_active = batch.get("active"), batch.get("next_active")  # (B, agents) where agents may leave
        with torch.no_grad():
            # 1. every agent's next value: the target network's, at the online (double) or target network's argmax
            next_q_all = self.q_target(next_obs)  # (B, agents, actions)
            picker = self.q_net(next_obs) if cfg.double else next_q_all
            next_q = next_q_all.gather(-1, picker.argmax(-1, keepdim=True)).squeeze(-1)  # (B, agents)
            if next_active is not None:  # an agent that has left its episode has no value to come
                next_q = next_q * next_active
            # 2. the targets: each agent's own (IQL), or the team's from the target mixer
            bootstrap = batch["discount"] * (~batch["terminated"])  # (B,)
            if independent:
                target = batch["reward"] + bootstrap[:, None] * next_q  # (B, agents)
            else:
                target = self.team_reward(batch["reward"]) + bootstrap * self.mix(next_q, batch["next_state"], True)
        # 3. the chosen actions' values, mixed into the team's
        q = self.q_net(obs).gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)  # (B, agents)
        if active is not None:  # agents that have left add nothing to the team's value
            q = q * active
        q = q if independent else self.mix(q, batch["state"])
        loss = LOSSES[cfg.loss](q, target, reduction="none")
        loss = self.weighted_mean(present_mean(loss, active, -1) if independent else loss, batch)
        td_error = (q - target).detach()
        return loss, q.detach(), present_mean(td_error.abs(), active, -1) if independent else td_error

    def update_once(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step on a batch (B, ...), then the target update when it is due."""
        cfg = self.config
        loss, q, td_error = self.q_loss(batch)
        self.optimize(self.optimizer, loss)
        self.num_updates += 1
        if self.num_updates % cfg.target_update_every == 0:
            self.soft_update(self.q_target, self.q_net, cfg.tau)
            if self.mixer is not None:
                self.soft_update(self.mixer_target, self.mixer, cfg.tau)
        return {"loss/q": loss.detach(), "q/mean": q.mean()}, td_error


ENTRIES: dict[str, AlgoSpec] = {
    "qmix": AlgoSpec(QMIX, {}, "QMIX: agent Q values mixed monotonically by hypernetworks on the global state"),
    "vdn": AlgoSpec(QMIX, {"mixer": "vdn"}, "Value Decomposition Networks: the team's Q is the sum of the agents'"),
    "iql": AlgoSpec(QMIX, {"mixer": "none"}, "Independent Q-learning: each agent learns from its own reward"),
}
