"""Tests of MADDPG / MATD3 (jaderl.marl.maddpg) against the papers' formulas written out agent by agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import jaderl
from jaderl.algos.td3 import DDPG_PRESET
from jaderl.api import ALGOS, load, make_config
from jaderl.core.checkpoint import load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.core.loop import check_spec
from jaderl.envs import make_env
from jaderl.envs.vec import EnvSpec
from jaderl.marl.maddpg import MADDPG

SPREAD, CONTINUOUS, TAG = "jaderl/simple_spread", "jaderl/simple_spread?continuous=true", "jaderl/simple_tag"
AGENTS, BATCH = 3, 32


def make_agent(algo: str = "matd3", env_id: str = CONTINUOUS, num_envs: int = 1, **settings: Any) -> MADDPG:
    config = make_config(algo, env_id, hidden=[16, 16], device="cpu", num_envs=num_envs, **settings)
    env = make_env(env_id, num_envs, "cpu", seed=0)
    torch.manual_seed(0)
    agent = MADDPG(config, env, torch.device("cpu"))
    env.close()
    return agent


def random_batch(agent: MADDPG, seed: int = 0, gamma: float = 0.95) -> dict[str, torch.Tensor]:
    """A replay batch as the buffer samples it: per-agent rewards, 1- and 2-step discounts, some terminations."""
    g = torch.Generator().manual_seed(seed)
    obs_dim, state_dim, a = agent.spec.obs_shape[0], agent.state_dim, agent.num_agents
    if agent.is_discrete:
        action = torch.randint(agent.action_dim, (BATCH, a), generator=g)
    else:
        action = torch.rand(BATCH, a, agent.action_dim, generator=g) * 2 - 1
    return {"obs": torch.randn(BATCH, a, obs_dim, generator=g), "next_obs": torch.randn(BATCH, a, obs_dim, generator=g),
            "state": torch.randn(BATCH, state_dim, generator=g),
            "next_state": torch.randn(BATCH, state_dim, generator=g), "action": action,
            "reward": torch.randn(BATCH, a, generator=g),
            "terminated": torch.rand(BATCH, generator=g) < 0.3, "truncated": torch.zeros(BATCH, dtype=torch.bool),
            "discount": gamma ** torch.randint(1, 3, (BATCH,), generator=g).float()}


def with_id(agent: MADDPG, obs: torch.Tensor, i: int) -> torch.Tensor:
    """Agent i's actor input (B, obs_dim + A): its observation and one-hot id."""
    return torch.cat([obs[:, i], F.one_hot(torch.full((obs.shape[0],), i), agent.num_agents).float()], -1)


def one_hot(agent: MADDPG, action: torch.Tensor) -> torch.Tensor:
    return F.one_hot(action, agent.action_dim).float() if agent.is_discrete else action


def reference_target(agent: MADDPG, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """y_i = r_i + discount (1 - terminated) min_e Q'_e,i(s', a'_1 .. a'_A), one agent at a time (B, A); the
    continuous target action a'_j = clip(mu'(o'_j) + clip(eps, -c, c), -1, 1) draws eps in agent order."""
    cfg = agent.config
    with torch.no_grad():
        mu = [agent.actor_target(with_id(agent, batch["next_obs"], j)) for j in range(agent.num_agents)]
        noise = torch.randn(BATCH, agent.num_agents, agent.action_dim) * cfg.target_noise
        next_action = [torch.clamp(mu[j] + noise[:, j].clamp(-cfg.noise_clip, cfg.noise_clip), -1.0, 1.0)
                       for j in range(agent.num_agents)]
        joint = torch.cat(next_action, -1)
        q = agent.critic_target(batch["next_state"], joint)  # (E, B, A)
        not_done = 1.0 - batch["terminated"].float()
        columns = []
        for i in range(agent.num_agents):
            q_min = q[0, :, i]
            for e in range(1, q.shape[0]):
                q_min = torch.minimum(q_min, q[e, :, i])
            columns.append(batch["reward"][:, i] + batch["discount"] * not_done * q_min)
        return torch.stack(columns, -1)


def test_per_agent_td_target_with_twin_critics_and_smoothing() -> None:
    agent = make_agent(target_noise=0.3, noise_clip=0.4)
    batch = random_batch(agent)
    torch.manual_seed(7)
    target = agent.td_target(batch)
    torch.manual_seed(7)  # the same noise draws in the reference
    torch.testing.assert_close(target, reference_target(agent, batch))
    done = batch["terminated"]
    torch.testing.assert_close(target[done], batch["reward"][done])  # no bootstrap after termination


def test_hand_computed_target() -> None:
    # constant target critics, one output per agent: Q_1 = (1, 2, 3), Q_2 = (0, 5, -1); no smoothing
    agent = make_agent(target_noise=0.0)
    with torch.no_grad():
        for layer in agent.critic_target.layers:
            layer.weight.zero_()
            layer.bias.zero_()
        agent.critic_target.layers[-1].bias[0, 0] = torch.tensor([1.0, 2.0, 3.0])
        agent.critic_target.layers[-1].bias[1, 0] = torch.tensor([0.0, 5.0, -1.0])
    batch = random_batch(agent)
    batch["reward"] = torch.tensor([[1.0, -1.0, 0.5]]).expand(BATCH, -1)
    min_q = torch.tensor([0.0, 2.0, -1.0])
    expected = batch["reward"] + (batch["discount"] * ~batch["terminated"])[:, None] * min_q
    torch.testing.assert_close(agent.td_target(batch), expected)


@pytest.mark.parametrize("env_id", [CONTINUOUS, SPREAD])
def test_critic_loss_and_td_errors_with_importance_weights(env_id: str) -> None:
    agent = make_agent(env_id=env_id, target_noise=0.3)
    batch = random_batch(agent) | {"weight": torch.rand(BATCH)}  # as prioritized replay samples it
    joint = one_hot(agent, batch["action"]).flatten(1)  # every agent's stored action, (B, A * action_dim)
    with torch.no_grad():
        q = agent.critic(batch["state"], joint)  # (2, B, A) before the step
    torch.manual_seed(3)
    td_error = q - agent.td_target(batch)
    torch.manual_seed(3)
    stats, priorities = agent.update_once(batch)
    # sum over the critics, mean over the agents, importance-weighted mean over the batch
    per_transition = sum((td_error[e] ** 2).mean(-1) for e in range(2))
    torch.testing.assert_close(stats["loss/critic"], (batch["weight"] * per_transition).mean())
    torch.testing.assert_close(priorities, td_error.abs().mean(-1).mean(0))
    assert priorities.shape == (BATCH,)


def reference_actor_loss(agent: MADDPG, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """-1/A sum_i mean_b Q_1,i(s, a_1 .. mu(o_i) .. a_A): for each agent i a joint action with only its own
    replaced (the paper's eq. 6); discrete: mu(o_i) is the straight-through Gumbel-softmax sample, drawn in agent
    order after all agents' logits."""
    stored = one_hot(agent, batch["action"])
    logits = [agent.actor(with_id(agent, batch["obs"], i)) for i in range(agent.num_agents)]
    if agent.is_discrete:
        policy = F.gumbel_softmax(torch.stack(logits, 1), agent.config.gumbel_temperature, hard=True).unbind(1)
    else:
        policy = logits
    loss = torch.zeros(())
    for i in range(agent.num_agents):
        joint = torch.cat([policy[j] if j == i else stored[:, j] for j in range(agent.num_agents)], -1)
        loss = loss - agent.critic(batch["state"], joint)[0, :, i].mean() / agent.num_agents
    if agent.is_discrete:
        loss = loss + agent.config.actor_reg * torch.stack(logits, 1).square().mean()
    return loss


@pytest.mark.parametrize("env_id", [CONTINUOUS, SPREAD])
def test_actor_loss_replaces_only_the_agents_own_action(env_id: str) -> None:
    agent = make_agent(env_id=env_id, actor_reg=0.1)
    batch = random_batch(agent)
    agent.replayed = batch
    torch.manual_seed(5)
    loss = agent.actor_loss(agent.features(batch["obs"]))
    torch.manual_seed(5)
    reference = reference_actor_loss(agent, batch)
    torch.testing.assert_close(loss, reference)
    # the same gradients reach the actor; none reach the critic (a constant in the actor's objective)
    grads = torch.autograd.grad(loss, list(agent.actor.parameters()))
    ref_grads = torch.autograd.grad(reference, list(agent.actor.parameters()))
    for grad, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref)
    assert all(p.grad is None for p in agent.critic.parameters())


def test_straight_through_gumbel_softmax_gradient() -> None:
    # the forward value is one-hot; the gradient is that of softmax((l + g) / temperature)
    logits = torch.randn(4, 5, requires_grad=True)
    weights = torch.randn(4, 5)
    torch.manual_seed(1)
    hard = F.gumbel_softmax(logits, 0.5, hard=True)
    (hard * weights).sum().backward()
    assert torch.equal(hard.sum(-1), torch.ones(4)) and set(hard.unique().tolist()) <= {0.0, 1.0}
    torch.manual_seed(1)
    gumbel = -torch.empty_like(logits).exponential_().log()
    soft_logits = logits.detach().clone().requires_grad_(True)
    (F.softmax((soft_logits + gumbel) / 0.5, -1) * weights).sum().backward()
    torch.testing.assert_close(logits.grad, soft_logits.grad)
    assert torch.equal(hard.argmax(-1), (logits + gumbel).argmax(-1))


def test_discrete_actions_and_exploration() -> None:
    agent = make_agent(env_id=SPREAD, num_envs=4)
    env = make_env(SPREAD, 4, "cpu", seed=1)
    obs = env.reset()
    logits = agent.actor(agent.features(obs))
    action = agent.act(obs, deterministic=True)
    assert action.shape == (4, AGENTS) and action.dtype == torch.int64 and torch.equal(action, logits.argmax(-1))
    # exploring samples softmax(logits): with sharp logits, nearly always the argmax; with flat ones, all actions
    with torch.no_grad():
        agent.actor[0][-1].bias.copy_(torch.tensor([0.0, 0.0, 8.0, 0.0, 0.0]))
        agent.actor[0][-1].weight.zero_()
    samples = torch.stack([agent.noisy_action(obs) for _ in range(200)])
    assert samples.shape == (200, 4, AGENTS) and 0.97 < float((samples == 2).float().mean()) < 1.0
    target = agent.target_action(agent.features(obs))
    assert target.shape == (4, AGENTS, 5) and torch.equal(target.sum(-1), torch.ones(4, AGENTS))
    env.step(agent.noisy_action(obs))


def test_continuous_exploration_noise() -> None:
    agent = make_agent(num_envs=256, exploration_noise=0.2)
    obs = torch.randn(256, AGENTS, agent.spec.obs_shape[0])
    mu = agent.act(obs)
    assert mu.shape == (256, AGENTS, 2) and mu.abs().max() <= 1.0
    noisy = agent.noisy_action(obs)
    assert noisy.abs().max() <= 1.0
    inside = mu.abs() < 0.4  # where [-1, 1] does not clip
    assert 0.17 < float((noisy - mu)[inside].std()) < 0.23


def changed(module: torch.nn.Module, before: list[torch.Tensor]) -> bool:
    return any(not torch.equal(p, b) for p, b in zip(module.parameters(), before, strict=True))


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize(("algo", "delay"), [("matd3", 2), ("maddpg", 1)])
def test_actor_and_targets_update_every_policy_delay_steps(algo: str, delay: int) -> None:
    agent = make_agent(algo, env_id=SPREAD)
    for step in range(1, 7):
        actor, critic, actor_target = snapshot(agent.actor), snapshot(agent.critic), snapshot(agent.actor_target)
        stats, _ = agent.update_once(random_batch(agent, step))
        assert changed(agent.critic, critic)
        assert changed(agent.actor, actor) == changed(agent.actor_target, actor_target) == (step % delay == 0)
        assert set(stats) >= {"loss/critic", "q/mean"} and all(v.dim() == 0 for v in stats.values())
    assert agent.num_updates == 6


def test_presets_and_registry() -> None:
    assert ALGOS["maddpg"].agent_cls is ALGOS["matd3"].agent_cls is MADDPG
    assert ALGOS["maddpg"].preset == DDPG_PRESET and ALGOS["matd3"].preset == {}
    maddpg, matd3 = make_config("maddpg", SPREAD), make_config("matd3", SPREAD)
    assert (maddpg.num_critics, maddpg.policy_delay, maddpg.target_noise) == (1, 1, 0.0)
    assert (matd3.num_critics, matd3.policy_delay, matd3.target_noise) == (2, 2, 0.2)
    agent = make_agent("maddpg", env_id=SPREAD)
    assert agent.critic.num == 1  # one output per agent:
    assert agent.critic(torch.zeros(5, agent.state_dim), torch.zeros(5, 3 * 5)).shape == (1, 5, AGENTS)
    assert set(agent.networks()) == {"actor", "critic", "actor_target", "critic_target"}
    assert set(agent.optimizers()) == {"actor", "critic"} and "num_updates" in agent.counters()
    for name in ("lr", "gamma", "tau"):
        low, high = agent.hyperparameters[name].low, agent.hyperparameters[name].high
        assert low <= getattr(agent.config, name) <= high
    agent.set_hyperparameters(lr=5e-4)
    assert all(g["lr"] == 5e-4 for opt in agent.optimizers().values() for g in opt.param_groups)


def test_accepts_multi_agent_envs_of_both_action_kinds() -> None:
    single = EnvSpec(num_envs=1, obs_shape=(3,), is_discrete=False, action_dim=1)
    assert "single agent" in MADDPG.accepts(single)
    for env_id in (SPREAD, CONTINUOUS, TAG):
        assert MADDPG.accepts(make_env(env_id, 1).spec) is None
    with pytest.raises(ConfigError, match="cannot train on jaderl/Pendulum-v1"):
        check_spec(make_config("maddpg", "jaderl/Pendulum-v1"), MADDPG, make_env("jaderl/Pendulum-v1", 1).spec)


def test_unsupported_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="use_hterm"):
        make_config("maddpg", SPREAD, use_hterm=True)
    with pytest.raises(ConfigError, match="noise='ou'"):
        make_config("matd3", SPREAD, noise="ou")


SMOKE: dict[str, Any] = {"num_envs": 4, "hidden": [32, 32], "warmup_steps": 64, "batch_size": 32,
                         "buffer_size": 2_000, "updates_per_step": 0.25, "eval_every": 200, "eval_episodes": 3,
                         "checkpoint_every": 200, "total_steps": 200, "seed": 1}


@pytest.mark.parametrize(("algo", "env_id", "extra"), [
    ("maddpg", SPREAD, {}), ("matd3", CONTINUOUS, {}), ("matd3", TAG, {"n_step": 3, "use_per": True})])
def test_train_resume_load_act(algo: str, env_id: str, extra: dict[str, Any], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = jaderl.train(algo, env_id, run_dir=str(run_dir), device="cpu", **SMOKE, **extra)
    assert result.steps == 200 and result.stop_reason == "total_steps"
    first = load_checkpoint(run_dir)["agent"]
    assert first["counters"]["num_updates"] > 0 and all(o["state"] for o in first["optimizers"].values())
    result = jaderl.resume(run_dir, total_steps=400)
    assert result.steps == 400
    state = load_checkpoint(run_dir)["agent"]
    assert state["counters"]["num_updates"] > first["counters"]["num_updates"]
    for best in (True, False):
        agent = load(run_dir, best=best)
        assert type(agent) is MADDPG and agent.steps == 400
        env = make_env(env_id, 5, "cpu", seed=2)
        obs = env.reset()
        for deterministic in (True, False):
            action = agent.act(obs, deterministic=deterministic)
            assert not action.requires_grad
            if agent.is_discrete:
                assert action.shape == (5, env.num_agents) and int(action.min()) >= 0 and int(action.max()) < 5
            else:
                assert action.shape == (5, env.num_agents, 2) and action.abs().max() <= 1.0
            env.step(action)
        assert torch.equal(agent.act(obs, deterministic=True), agent.act(obs, deterministic=True))
