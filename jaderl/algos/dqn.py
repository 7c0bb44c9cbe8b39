"""DQN with a target network and epsilon-greedy exploration; Double, Dueling, Noisy and n-step DQN as options.

Mnih et al. 2015 (https://doi.org/10.1038/nature14236). Each gradient step regresses Q(s, a) on the target

    y = R + gamma^k (1 - terminated) Q_target(s', argmax_a' Q(s', a'))      (double=True, van Hasselt et al. 2016)
    y = R + gamma^k (1 - terminated) max_a' Q_target(s', a')                 (double=False)

where R sums the discounted rewards of up to k = ``n_step`` steps (Sutton 1988; k = 1 is plain DQN), with the
Huber loss, importance-weighted when ``use_per`` (prioritized replay, Schaul et al. 2016). ``dueling=True`` splits Q
into V(s) + A(s, a) - mean_a A(s, a) (Wang et al. 2016); ``noisy=True`` explores with factorised Gaussian noisy
layers instead of epsilon (Fortunato et al. 2018). The target network is copied every ``target_update_every``
gradient steps (``tau=1``) or Polyak-averaged (``tau<1``); ``max_grad_norm`` clips gradients; ``reward_scale``
rescales rewards and ``clip_rewards`` clips them to their sign (Mnih et al.; the default on Atari ids).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from jaderl.algos.base import OffPolicyAgent, OffPolicyConfig
from jaderl.algos.nets import EncodedNet, QNet
from jaderl.core.agent import Hyperparameter
from jaderl.core.buffers import ReplayBuffer
from jaderl.core.config import param
from jaderl.envs.vec import EnvSpec


@dataclasses.dataclass
class DQNConfig(OffPolicyConfig):
    """DQN settings; the defaults follow RL-Zoo's CartPole-v1 tuning."""

    lr: float = param(2.3e-3, "Adam learning rate", low=0.0, open_low=True)
    buffer_size: int = param(100_000, "replay capacity in transitions", low=1)
    batch_size: int = param(64, "transitions per gradient step", low=1)
    updates_per_step: float = param(0.5, "gradient steps per env step collected (all sub-envs counted)",
                                    low=0.0, open_low=True)
    target_update_every: int = param(100, "gradient steps between target network updates", low=1)
    tau: float = param(1.0, "target update rate: 1 copies the network, less Polyak-averages it",
                       low=0.0, high=1.0, open_low=True)
    epsilon_start: float = param(1.0, "exploration rate at the start", low=0.0, high=1.0)
    epsilon_end: float = param(0.04, "exploration rate after the decay", low=0.0, high=1.0)
    epsilon_decay_steps: int = param(8_000, "env steps over which epsilon decays linearly", low=1)
    max_grad_norm: float = param(10.0, "clip gradient norm to this (0 disables)", low=0.0)
    double: bool = param(False, "Double DQN: the online network picks the target action")
    dueling: bool = param(False, "Dueling DQN: separate value and advantage streams")
    noisy: bool = param(False, "Noisy DQN: noisy layers explore (set epsilon_start=epsilon_end=0 to rely on them)")


class DQN(OffPolicyAgent):
    """DQN and its Double, Dueling, Noisy and n-step variants for discrete actions."""

    config_cls = DQNConfig
    compiled_methods = ("act", "q_loss")
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {**OffPolicyAgent.hyperparameters,
                                                           "epsilon_end": Hyperparameter(0.0, 0.2)}
    config: DQNConfig

    @classmethod
    def live_hyperparameters(cls, config: DQNConfig, spec: EnvSpec) -> dict[str, Hyperparameter]:
        """The mutable hyperparameters that change training under ``config``: not ``epsilon_end`` when noisy layers
        alone explore (``noisy`` with ``epsilon_start = epsilon_end = 0``, the ``noisy_dqn`` preset), where epsilon
        stays 0."""
        noisy_only = config.noisy and config.epsilon_start == 0 and config.epsilon_end == 0
        return {k: h for k, h in cls.hyperparameters.items() if k != "epsilon_end" or not noisy_only}

    def __init__(self, config: DQNConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        q_head = QNet(self.obs_dim, self.action_dim, config.hidden, config.dueling, config.noisy)
        # images: the Q network owns the encoder, so the target network below gets its own copy (Mnih et al. 2015)
        encoder, self.encoder = self.encoder, None
        self.q_net = (q_head if encoder is None else EncodedNet(encoder, q_head)).to(device)
        self.q_target = copy.deepcopy(self.q_net).requires_grad_(False)
        self.optimizer = self.adam(self.q_net.parameters(), lr=config.lr)
        self.num_updates = 0

    @classmethod
    def accepts(cls, spec: EnvSpec) -> str | None:
        return "its actions are continuous; use sac, td3 or ppo" if not spec.is_discrete else super().accepts(spec)

    def networks(self) -> dict[str, nn.Module]:
        return {"q_net": self.q_net, "q_target": self.q_target}  # the encoder, if any, is inside each

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
        return self.q_net(self.features(obs), noise=not deterministic).argmax(-1)

    def noisy_action(self, obs: torch.Tensor) -> torch.Tensor:
        """Epsilon-greedy (noisy when ``noisy``) actions."""
        random = self.random_action(obs.shape[0])
        explore = torch.rand(obs.shape[0], device=self.device) < self.epsilon()
        return torch.where(explore, random, self.act(obs))

    def update(self, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        stats = super().update(buffer)
        return {**stats, "epsilon": torch.tensor(self.epsilon())} if stats else {}

    def q_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The Huber loss on a sampled batch (B, ...), Q(s, a) (B,) and the TD errors (B,)."""
        cfg = self.config
        obs, next_obs = self.features(batch["obs"]), self.features(batch["next_obs"])
        with torch.no_grad():
            next_q_target = self.q_target(next_obs, noise=True)  # (B, num_actions)
            if cfg.double:
                next_action = self.q_net(next_obs, noise=True).argmax(-1, keepdim=True)
                next_q = next_q_target.gather(-1, next_action).squeeze(-1)
            else:
                next_q = next_q_target.max(-1).values
            target = batch["reward"] + batch["discount"] * (~batch["terminated"]) * next_q
        q = self.q_net(obs, noise=True).gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
        loss = self.weighted_mean(F.smooth_l1_loss(q, target, reduction="none"), batch)
        return loss, q.detach(), (q - target).detach()

    def update_once(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step on a sampled batch (B, ...), then the target update when it is due."""
        cfg = self.config
        loss, q, td_error = self.q_loss(batch)
        self.optimize(self.optimizer, loss)
        self.num_updates += 1
        if self.num_updates % cfg.target_update_every == 0:
            self.soft_update(self.q_target, self.q_net, cfg.tau)
        return {"loss/q": loss.detach(), "q/mean": q.mean()}, td_error
