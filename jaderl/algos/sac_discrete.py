"""SAC for discrete actions: a categorical policy, critics that score every action, a learned entropy coefficient.

Christodoulou 2019, https://arxiv.org/abs/1910.07207. With pi(.|s) known exactly, expectations over actions are
sums instead of samples; each gradient step

    1. critic: y = r + gamma (1 - terminated) sum_a' pi(a'|s') [min_i Q_target_i(s', a') - alpha log pi(a'|s')]
               (n-step sums and prioritized replay as in every off-policy algorithm)
    2. actor:  minimise E_s[ sum_a pi(a|s) (alpha log pi(a|s) - min_i Q_i(s, a)) ]
    3. alpha:  minimise E_s[ log alpha (H(pi(.|s)) - target_entropy) ],  target_entropy = ratio * log(A)
(the target critics are Polyak-averaged after every critic step).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

from jaderl.algos.base import OffPolicyAgent, OffPolicyConfig
from jaderl.algos.nets import CategoricalActor, EnsembleQ, Temperature
from jaderl.core.config import param
from jaderl.envs.vec import EnvSpec


@dataclasses.dataclass
class DiscreteSACConfig(OffPolicyConfig):
    """Discrete SAC settings."""

    buffer_size: int = param(100_000, "replay capacity in transitions", low=1)
    tau: float = param(0.005, "Polyak averaging rate of the target critics", low=0.0, high=1.0, open_low=True)
    num_critics: int = param(2, "critics in the ensemble; the target takes their minimum", low=1)
    init_alpha: float = param(0.2, "initial entropy coefficient", low=0.0, open_low=True)
    target_entropy_ratio: float = param(0.5, "target entropy as a fraction of the maximum, log(num_actions)",
                                        low=0.0, high=1.0)


class DiscreteSAC(OffPolicyAgent):
    """SAC for discrete actions."""

    config_cls = DiscreteSACConfig
    compiled_methods = ("act", "critic_loss", "actor_loss")
    config: DiscreteSACConfig

    def __init__(self, config: DiscreteSACConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.actor = CategoricalActor(self.obs_dim, self.action_dim, config.hidden, activation=nn.ReLU).to(device)
        self.critic = EnsembleQ(self.obs_dim, 0, config.hidden, config.num_critics, self.action_dim).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.alpha = Temperature(config.init_alpha).to(device)
        self.actor_optimizer = self.adam(self.actor.parameters(), lr=config.lr)
        self.critic_optimizer = self.adam([*self.encoder_parameters(), *self.critic.parameters()], lr=config.lr)
        self.alpha_optimizer = self.adam(self.alpha.parameters(), lr=config.lr)
        self.target_entropy = config.target_entropy_ratio * math.log(self.action_dim)

    @classmethod
    def accepts(cls, spec: EnvSpec) -> str | None:
        return "its actions are continuous; use sac" if not spec.is_discrete else super().accepts(spec)

    def networks(self) -> dict[str, nn.Module]:
        return super().networks() | {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target,
                                     "alpha": self.alpha}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer, "alpha": self.alpha_optimizer}

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        return self.actor(x) if deterministic else self.actor.sample(x)

    @torch.no_grad()
    def td_target(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
        """The soft Bellman target y (B,) of step 1 in the module docstring."""
        next_obs = self.features(batch["next_obs"])  # images: the online encoder's, as in DrQ-v2 (see SAC)
        log_p = F.log_softmax(self.actor.net(next_obs), -1)  # (B, A)
        next_q = self.critic_target(next_obs).min(0).values  # (B, A)
        soft_value = (log_p.exp() * (next_q - alpha * log_p)).sum(-1)
        return batch["reward"] + batch["discount"] * (~batch["terminated"]) * soft_value

    def critic_loss(self, obs: torch.Tensor, batch: dict[str, torch.Tensor],
                    alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The critics' loss of step 1 for features ``obs`` (B, obs_dim) and the TD errors (E, B)."""
        q_all = self.critic(obs)  # (E, B, A): Q of every action, every member at once
        index = batch["action"].long().view(1, -1, 1).expand(self.config.num_critics, -1, 1)
        td_error = q_all.gather(-1, index).squeeze(-1) - self.td_target(batch, alpha)  # (E, B)
        return self.weighted_mean(td_error.square().sum(0), batch), td_error.detach()

    def actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's loss of step 2 (an exact expectation over actions) and the policy's entropy (B,)."""
        log_p = F.log_softmax(self.actor.net(obs), -1)
        probs = log_p.exp()
        with torch.no_grad():
            q = self.critic(obs).min(0).values  # (B, A)
        actor_loss = (probs * (alpha * log_p - q)).sum(-1).mean()
        return actor_loss, -(probs * log_p).sum(-1).detach()

    def update_once(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        cfg = self.config
        obs = self.features(batch["obs"])
        alpha = self.alpha().detach()
        # 1. critic
        critic_loss, td_error = self.critic_loss(obs, batch, alpha)
        self.optimize(self.critic_optimizer, critic_loss)
        self.soft_update(self.critic_target, self.critic, cfg.tau)
        # 2. actor, under the (just updated) critics
        actor_loss, entropy = self.actor_loss(obs, alpha)
        self.optimize(self.actor_optimizer, actor_loss)
        # 3. entropy coefficient
        alpha_loss = (self.alpha.log_alpha * (entropy - self.target_entropy)).mean()
        self.optimize(self.alpha_optimizer, alpha_loss)
        stats = {"loss/critic": critic_loss.detach(), "loss/actor": actor_loss.detach(), "alpha": alpha,
                 "policy/entropy": entropy.mean()}
        return stats, td_error.abs().mean(0)
