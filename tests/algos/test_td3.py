"""Tests of TD3 / DDPG (jaderl.algos.td3) against the paper's formulas written out by hand."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from jaderl.algos import ALGOS
from jaderl.algos.td3 import TD3, TD3Config
from jaderl.api import make_config
from jaderl.core.config import ConfigError
from jaderl.envs import make_env

OBS_DIM, ACTION_DIM, BATCH = 3, 1, 64  # Pendulum


def make_agent(algo: str = "td3", num_envs: int = 1, **settings: Any) -> TD3:
    config = make_config(algo, "jaderl/Pendulum-v1", hidden=[16, 16], device="cpu", num_envs=num_envs, **settings)
    env = make_env(config.env, num_envs, "cpu", seed=0)
    torch.manual_seed(0)
    agent = TD3(config, env, torch.device("cpu"))
    env.close()
    return agent


def random_batch(seed: int = 0, gamma: float = 0.99) -> dict[str, torch.Tensor]:
    """A replay batch as the buffer samples it; ``discount`` is gamma or, for 2-step transitions, gamma^2."""
    g = torch.Generator().manual_seed(seed)
    return {"discount": gamma ** torch.randint(1, 3, (BATCH,), generator=g).float(),
            "obs": torch.randn(BATCH, OBS_DIM, generator=g),
            "action": torch.rand(BATCH, ACTION_DIM, generator=g) * 2 - 1,
            "reward": torch.randn(BATCH, generator=g),
            "terminated": torch.rand(BATCH, generator=g) < 0.3,
            "truncated": torch.zeros(BATCH, dtype=torch.bool),
            "next_obs": torch.randn(BATCH, OBS_DIM, generator=g)}


def reference_target(agent: TD3, batch: dict[str, torch.Tensor], target_noise: float, noise_clip: float
                     ) -> torch.Tensor:
    """Fujimoto et al. 2018, eq. 14 and 15 with each critic evaluated on its own."""
    with torch.no_grad():
        mu = agent.actor_target(batch["next_obs"])
        noise = torch.randn(mu.shape) * target_noise
        next_action = torch.clamp(mu + torch.clamp(noise, -noise_clip, noise_clip), -1.0, 1.0)
        q_values = agent.critic_target(batch["next_obs"], next_action)  # (E, B)
        q_min = q_values[0]
        for i in range(1, q_values.shape[0]):
            q_min = torch.minimum(q_min, q_values[i])
        not_terminated = 1.0 - batch["terminated"].float()
        return batch["reward"] + batch["discount"] * not_terminated * q_min


def test_clipped_double_q_target_with_smoothing_noise() -> None:
    agent = make_agent(target_noise=0.3, noise_clip=0.4)
    batch = random_batch(gamma=0.9)
    torch.manual_seed(7)
    target = agent.td_target(batch)
    torch.manual_seed(7)  # same noise draw in the reference
    torch.testing.assert_close(target, reference_target(agent, batch, 0.3, 0.4))
    # terminated transitions do not bootstrap
    done = batch["terminated"]
    torch.testing.assert_close(target[done], batch["reward"][done])


def test_critic_loss_and_td_errors_with_importance_weights() -> None:
    agent = make_agent(target_noise=0.3, noise_clip=0.4)
    batch = random_batch() | {"weight": torch.rand(BATCH)}  # as prioritized replay samples it
    with torch.no_grad():
        q = agent.critic(batch["obs"], batch["action"])  # (2, B) before the step
    torch.manual_seed(3)
    td_error = q - reference_target(agent, batch, 0.3, 0.4)
    torch.manual_seed(3)
    stats, priorities = agent.update_once(batch)
    # sum over the critics of each one's squared error, importance-weighted mean over the batch
    torch.testing.assert_close(stats["loss/critic"], (batch["weight"] * (td_error[0] ** 2 + td_error[1] ** 2)).mean())
    torch.testing.assert_close(priorities, td_error.abs().mean(0))


def test_target_action_is_clipped_around_the_target_actor() -> None:
    agent = make_agent(target_noise=10.0, noise_clip=0.25)
    next_obs = torch.randn(4096, OBS_DIM)
    mu = agent.actor_target(next_obs)
    action = agent.target_action(next_obs)
    assert action.abs().max() <= 1.0
    assert (action - mu).abs().max() <= 0.25 + 1e-6
    # with std 10 and clip 0.25, P(|noise| >= 0.25) = P(|z| >= 0.025) = 98%: it sits at +-0.25 (where [-1, 1] allows)
    at_clip = ((action - mu).abs() - 0.25).abs() < 1e-6
    assert 0.96 < float(at_clip[mu.abs() < 0.7].float().mean()) < 1.0


def test_hand_computed_target() -> None:
    # twin target critics made constant (Q_1 = 3, Q_2 = -2), no smoothing: y = r + gamma (1 - done) min(3, -2)
    agent = make_agent(num_critics=2, target_noise=0.0)
    with torch.no_grad():
        for layer in agent.critic_target.layers:
            layer.weight.zero_()
            layer.bias.zero_()
        agent.critic_target.layers[-1].bias[0].fill_(3.0)
        agent.critic_target.layers[-1].bias[1].fill_(-2.0)
    batch = {"reward": torch.tensor([1.0, 1.0, 1.0]), "terminated": torch.tensor([False, True, False]),
             "next_obs": torch.zeros(3, OBS_DIM), "discount": torch.tensor([0.5, 0.5, 0.25])}  # last: 2-step
    torch.testing.assert_close(agent.td_target(batch), torch.tensor([1.0 + 0.5 * -2.0, 1.0, 1.0 + 0.25 * -2.0]))


def changed(module: torch.nn.Module, before: list[torch.Tensor]) -> bool:
    return any(not torch.equal(p, b) for p, b in zip(module.parameters(), before, strict=True))


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize(("algo", "delay"), [("td3", 3), ("ddpg", 1)])
def test_actor_and_targets_update_every_policy_delay_critic_steps(algo: str, delay: int) -> None:
    agent = make_agent(algo, policy_delay=delay)
    actor_steps = []
    for step in range(1, 10):
        actor, critic = snapshot(agent.actor), snapshot(agent.critic)
        actor_target, critic_target = snapshot(agent.actor_target), snapshot(agent.critic_target)
        stats, td_error = agent.update_once(random_batch(step))
        assert td_error.shape == (BATCH,) and (td_error >= 0).all()
        assert changed(agent.critic, critic)  # every step
        moved = changed(agent.actor, actor)
        assert changed(agent.actor_target, actor_target) == moved
        assert changed(agent.critic_target, critic_target) == moved
        if moved:
            actor_steps.append(step)
        assert set(stats) >= {"loss/critic", "q/mean"} and all(v.dim() == 0 for v in stats.values())
        assert ("loss/actor" in stats) == (step >= delay)
    assert actor_steps == list(range(delay, 10, delay))
    assert agent.num_updates == 9


def test_a_resumed_agent_reports_the_latest_actor_loss_until_its_next_actor_step() -> None:
    agent = make_agent("td3", policy_delay=3)
    for step in range(1, 5):  # the actor stepped at 3; update 4 reports that loss
        stats, _ = agent.update_once(random_batch(step))
    resumed = make_agent("td3", policy_delay=3)
    resumed.load_state_dict(agent.state_dict())
    resumed.load_counters(agent.counters())
    assert torch.equal(resumed.update_once(random_batch(5))[0]["loss/actor"], stats["loss/actor"])
    fresh = make_agent("td3", policy_delay=3)
    fresh.load_state_dict(make_agent("td3", policy_delay=3).state_dict())  # no actor step yet: nothing to report
    assert fresh.actor_loss_value is None


def test_ddpg_preset() -> None:
    config = make_config("ddpg", "jaderl/Pendulum-v1")
    assert (config.num_critics, config.policy_delay, config.target_noise) == (1, 1, 0.0)
    assert ALGOS["ddpg"].agent_cls is ALGOS["td3"].agent_cls is TD3 and ALGOS["td3"].preset == {}
    agent = make_agent("ddpg")
    assert agent.critic.num == 1 and agent.critic(torch.zeros(5, OBS_DIM), torch.zeros(5, ACTION_DIM)).shape == (1, 5)
    next_obs = torch.randn(8, OBS_DIM)
    torch.testing.assert_close(agent.target_action(next_obs), agent.actor_target(next_obs))  # no smoothing


def test_update_waits_for_warmup_then_pays_owed_updates() -> None:
    agent = make_agent(num_envs=4, warmup_steps=64, batch_size=32, updates_per_step=0.5)
    env = make_env("jaderl/Pendulum-v1", 4, "cpu", seed=0)
    buffer = agent.make_buffer()
    for _ in range(15):  # 60 of the 64 warm-up steps: no update
        buffer.add(agent.explore(env, 1))
        assert agent.update(buffer) == {}
    assert agent.num_updates == 0
    for _ in range(3):  # steps 64, 68, 72: 4 sub-envs x 0.5 = 2 updates each
        buffer.add(agent.explore(env, 1))
        agent.update(buffer)
    assert agent.num_updates == 6
    env.close()


def explore_noise(agent: TD3, env: Any, steps: int) -> torch.Tensor:
    """The OU state after ``steps`` exploration steps: (N, action_dim)."""
    agent.explore(env, steps)
    return agent.ou_noise.clone()


def test_ou_noise_statistics_and_reset_at_episode_ends() -> None:
    theta, sigma, num_envs = 0.15, 0.3, 4096
    agent = make_agent(num_envs=num_envs, noise="ou", ou_theta=theta, ou_sigma=sigma, warmup_steps=0)
    env = make_env("jaderl/Pendulum-v1", num_envs, "cpu", seed=0)  # every episode is 200 steps, in step
    # x_t = (1 - theta) x_{t-1} + sigma eps_t from x_0 = 0:
    # Var x_t = sigma^2 (1 - (1 - theta)^(2t)) / (1 - (1 - theta)^2), and 1 - (1 - theta)^2 = theta (2 - theta)
    stationary_std = sigma / math.sqrt(theta * (2 - theta))

    def expected_std(t: int) -> float:
        return stationary_std * math.sqrt(1 - (1 - theta) ** (2 * t))

    def check(noise: torch.Tensor, mean: float, std: float) -> None:
        stderr = std / math.sqrt(noise.numel())
        assert abs(float(noise.mean()) - mean) < 5 * stderr + 1e-6
        assert abs(float(noise.std()) - std) < 0.05 * std

    check(explore_noise(agent, env, 1), 0.0, sigma)
    check(explore_noise(agent, env, 4), 0.0, expected_std(5))
    check(explore_noise(agent, env, 195), 0.0, stationary_std)  # step 200: the episodes end here
    check(explore_noise(agent, env, 1), 0.0, sigma)  # first step of the next episodes: restarted from 0
    # mean reversion: from x = 1 the mean decays as (1 - theta)^t
    agent.ou_noise.fill_(1.0)
    check(explore_noise(agent, env, 5), (1 - theta) ** 5, expected_std(5))
    env.close()


def test_gaussian_exploration_noise() -> None:
    agent = make_agent(num_envs=4096, exploration_noise=0.2, warmup_steps=0)
    obs = torch.zeros(4096, OBS_DIM)
    with torch.no_grad():
        noise = agent.explore_action(obs) - agent.act(obs)
    assert abs(float(noise.mean())) < 0.02 and abs(float(noise.std()) - 0.2) < 0.01  # mu(0) is far from +-1
    assert torch.equal(agent.act(obs, deterministic=False), agent.act(obs, deterministic=True))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("noise", "pink", "noise='pink' is invalid: use gaussian or ou"),
    ("batch_size", 512, "batch_size=512 is larger than buffer_size=256"),
    ("policy_delay", 0, "policy_delay=0 is out of range: it must be >= 1"),
    ("num_critics", 0, "num_critics=0 is out of range: it must be >= 1"),
    ("target_noise", -0.1, "target_noise=-0.1 is out of range: it must be >= 0.0"),
    ("noise_clip", -1.0, "noise_clip=-1.0 is out of range: it must be >= 0.0"),
    ("exploration_noise", -0.1, "exploration_noise=-0.1 is out of range"),
    ("ou_theta", 0.0, "ou_theta=0.0 is out of range: it must be > 0.0 and <= 1.0"),
    ("ou_theta", 1.5, "ou_theta=1.5 is out of range"),
    ("ou_sigma", -0.2, "ou_sigma=-0.2 is out of range"),
    ("tau", 0.0, "tau=0.0 is out of range: it must be > 0.0 and <= 1.0"),
    ("warmup_steps", -1, "warmup_steps=-1 is out of range"),
    ("updates_per_step", 0.0, "updates_per_step=0.0 is out of range"),
])
def test_config_validation(field: str, value: Any, message: str) -> None:
    settings = {"buffer_size": 256} if field == "batch_size" else {}
    with pytest.raises(ConfigError, match=re.escape(message)):
        TD3Config(**settings, **{field: value})


@pytest.mark.parametrize(("settings", "std"), [
    ({"exploration_noise": 0.2}, 0.2),
    ({"exploration_noise": 0.0}, 0.05),  # at least 0.05: no H-term gradient scaled up without bound
    ({"noise": "ou", "ou_sigma": 0.3, "ou_theta": 0.5}, 0.3 / 0.75 ** 0.5),  # OU: its stationary std
])
def test_the_hterm_likelihood_uses_the_std_of_the_noise_explored_with(settings: dict[str, Any], std: float) -> None:
    agent = make_agent(**settings)
    features, action = torch.randn(5, 3), torch.rand(5, 1) * 2 - 1
    with torch.no_grad():
        expected = -(action - agent.actor(features)).square().sum(-1) / (2 * std ** 2)
        torch.testing.assert_close(agent.hterm_log_prob(features, action), expected)
