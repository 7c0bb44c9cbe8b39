"""REINFORCE (Monte-Carlo policy gradient) and VPG (REINFORCE with a learned value baseline and an entropy bonus).

Williams 1992, https://doi.org/10.1007/BF00992696; VPG as in OpenAI Spinning Up. Each iteration collects
``horizon`` steps from every sub-env with the current policy, computes the discounted return G_t of every step
backwards over the rollout, and takes one gradient step on

    L = -E[log pi(a_t|s_t) A_t] + vf_coef E[(V(s_t) - G_t)^2] - ent_coef E[H(pi(.|s_t))],

with A_t = G_t (``baseline=False``, REINFORCE) or A_t = G_t - V(s_t) (``baseline=True``, VPG; the value terms
vanish without a baseline). ``normalize_advantages`` standardises A over the rollout (a constant baseline and a
step-size scale, as in most REINFORCE implementations).

Where a return is cut. G_t sums rewards up to the end of its episode (terminated or truncated) or of the rollout,
whichever comes first, and then adds the discounted value of what follows:

* terminated: nothing follows, G_t is the plain sum of rewards;
* truncated (time limit) or cut by the rollout end: with a baseline, V of the observation reached (the real final
  observation, before the auto-reset); without one there is no estimate of the future, so REINFORCE treats both
  like a termination (Williams' episodic setting: the return is the rewards observed). That underestimates the
  returns of the last ~1 / (1 - gamma) steps before a cut, so without a baseline keep ``horizon`` well above
  1 / (1 - gamma), ideally at least the env's episode length (the first update warns when it is not); whole-episode
  rollouts are not required.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from jaderl.algos.base import OnPolicyAgent, OnPolicyConfig
from jaderl.core.agent import Hyperparameter
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.config import param
from jaderl.envs.vec import EnvSpec


def discounted_returns(reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, gamma: float,
                       next_value: torch.Tensor | None = None) -> torch.Tensor:
    """Discounted returns (T, N), cut at every episode end and at the rollout end.

    ``next_value[t]`` (T, N) is V of the observation reached at step t before any auto-reset; it is added
    (discounted) where a return is cut by truncation or by the rollout end, never after a termination.
    ``None`` bootstraps nothing (REINFORCE without a critic).
    """
    done = terminated | truncated
    bootstrap = torch.zeros_like(reward) if next_value is None else next_value * (~terminated).to(reward.dtype)
    returns = torch.empty_like(reward)
    running = bootstrap[-1]  # the value beyond the rollout's last step
    for t in range(reward.shape[0] - 1, -1, -1):  # over time only; every sub-env at once
        running = reward[t] + gamma * torch.where(done[t], bootstrap[t], running)
        returns[t] = running
    return returns


@dataclasses.dataclass
class ReinforceConfig(OnPolicyConfig):
    """REINFORCE / VPG settings; the ``vpg`` preset sets ``baseline=True`` and an entropy bonus."""

    num_envs: int = param(16, "sub-envs stepped in one batch", low=1)
    horizon: int = param(512, "steps each sub-env takes per rollout; without a baseline keep it >> 1 / (1 - gamma)",
                         low=1, high=100_000)
    lr: float = param(3e-3, "Adam learning rate", low=0.0, open_low=True)
    baseline: bool = param(False, "learn a value baseline V(s): A = G - V(s), and bootstrap cut returns from V")
    vf_coef: float = param(0.5, "value loss weight (with a baseline)", low=0.0)
    log_std_init: float = param(-0.5, "initial log standard deviation of the Gaussian policy (continuous actions); "
                                "without a baseline a wide policy learns where a narrow one may not (0.75 on Pendulum)")


class Reinforce(OnPolicyAgent):
    """REINFORCE and VPG for discrete (categorical) and continuous (Gaussian) actions."""

    config_cls = ReinforceConfig
    compiled_methods = ("act", "explore_action")
    config: ReinforceConfig

    @classmethod
    def live_hyperparameters(cls, config: ReinforceConfig, spec: EnvSpec) -> dict[str, Hyperparameter]:
        """The mutable hyperparameters that change training under ``config``: ``vf_coef`` only with a baseline
        (without one there is no value loss to weigh)."""
        return {k: h for k, h in cls.hyperparameters.items() if k != "vf_coef" or config.baseline}

    def __init__(self, config: ReinforceConfig, spec: EnvSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        # Adam's own epsilon (1e-8): the policy-gradient steps are small and 1e-5 damps them (fewer seeds solve
        # Pendulum)
        self.build_actor_critic(config.hidden, critic=config.baseline, log_std_init=config.log_std_init, eps=1e-8)

    def update(self, buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
        cfg, data = self.config, buffer.data
        schedule = self.begin_update(data)
        if not cfg.baseline and cfg.horizon * (1.0 - cfg.gamma) < 1.0 and self.steps == cfg.horizon * self.num_envs:
            warnings.warn(f"REINFORCE without a baseline cuts returns at the rollout end and horizon={cfg.horizon} "
                          "< 1 / (1 - gamma), so returns are biased toward zero; raise horizon or set baseline=true",
                          stacklevel=2)  # once, at the first update of a run
        obs = self.features(data["obs"])  # (T, N, obs_dim)
        # 1. returns and advantages (T, N)
        value = next_value = None
        if cfg.baseline:
            value = self.critic(obs).squeeze(-1)
            with torch.no_grad():
                next_value = self.critic(self.features(data["next_obs"])).squeeze(-1)
        returns = discounted_returns(data["reward"], data["terminated"], data["truncated"], cfg.gamma, next_value)
        advantage = returns if value is None else returns - value.detach()
        if cfg.normalize_advantages:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        # 2. one gradient step on the whole rollout
        log_prob, entropy = self.actor.evaluate(obs.flatten(0, 1), data["action"].flatten(0, 1))
        policy_loss = -(log_prob * advantage.flatten()).mean()
        value_loss = torch.zeros((), device=self.device) if value is None else (value - returns).square().mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy.mean()
        self.optimize(self.optimizer, loss)
        self.obs_norm.update(data["obs"])  # after learning, so the log-probabilities above used the acting statistics
        return {"loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(),
                "policy/entropy": entropy.mean().detach(), "policy/return_mean": returns.mean()} | schedule
