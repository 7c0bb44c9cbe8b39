"""Tests of MAPPO / IPPO (jaderl.marl.ppo) against the papers' formulas written out by hand, and a smoke test."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from jaderl.api import ALGOS, load, make_config, resume, train
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.checkpoint import load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.envs import EnvSpec, make_env
from jaderl.marl.ppo import MAPPO

ENV = "jaderl/simple_spread"
AGENTS, OBS_DIM, STATE_DIM, ACTIONS = 3, 18, 54, 5
T, N = 6, 4  # a small rollout


def make_agent(algo: str = "mappo", env: str = ENV, **settings: Any) -> MAPPO:
    small = {"hidden": [16, 16], "device": "cpu", "num_envs": N, "horizon": T, "minibatch_size": 8}
    config = make_config(algo, env, **(small | settings))
    spec = make_env(config.env, 1, "cpu", seed=0).spec
    torch.manual_seed(0)
    return MAPPO(config, spec, torch.device("cpu"))


def random_rollout(seed: int = 0, continuous: bool = False) -> dict[str, torch.Tensor]:
    """A (T, N, ...) trajectory as ``explore`` records it, with episode ends of both kinds."""
    g = torch.Generator().manual_seed(seed)
    action = (torch.rand(T, N, AGENTS, 2, generator=g) * 2 - 1 if continuous
              else torch.randint(ACTIONS, (T, N, AGENTS), generator=g))
    return {"obs": torch.randn(T, N, AGENTS, OBS_DIM, generator=g),
            "next_obs": torch.randn(T, N, AGENTS, OBS_DIM, generator=g),
            "state": torch.randn(T, N, STATE_DIM, generator=g),
            "next_state": torch.randn(T, N, STATE_DIM, generator=g),
            "action": action,
            "reward": torch.randn(T, N, AGENTS, generator=g),
            "terminated": torch.rand(T, N, generator=g) < 0.15,
            "truncated": torch.rand(T, N, generator=g) < 0.15}


def critic_input(agent: MAPPO, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """What the critic reads, built by hand: the state (MAPPO), or each agent's observation and one-hot id (IPPO)."""
    if agent.config.centralised_critic:
        return state
    return torch.cat([obs, torch.eye(AGENTS).expand(*obs.shape[:-2], -1, -1)], -1)


def reference_returns(agent: MAPPO, data: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Schulman et al. 2016 eq. 16, one sub-env and one value stream at a time: A_t = sum_l (gamma lambda)^l
    delta_{t+l}, delta_t = r_t + gamma (1 - end_t) V(s_{t+1}) - V(s_t), cut at every episode end; a truncated step
    bootstraps only with bootstrap_truncated. MAPPO: r = the agents' summed rewards, V(state); IPPO: r_i, V(o_i, i)."""
    cfg = agent.config
    with torch.no_grad():
        scale, shift = (agent.value_norm.var + 1e-8).sqrt(), agent.value_norm.mean
        value = agent.critic(critic_input(agent, data["obs"], data["state"])) * scale + shift
        next_value = agent.critic(critic_input(agent, data["next_obs"], data["next_state"])) * scale + shift
    if cfg.centralised_critic:
        reward = data["reward"][..., 0] + data["reward"][..., 1] + data["reward"][..., 2]
        streams = [(reward, value[..., 0], next_value[..., 0])]
    else:
        streams = [(data["reward"][..., i], value[..., i, 0], next_value[..., i, 0]) for i in range(AGENTS)]
    advantages = []
    for reward, v, next_v in streams:
        adv = torch.zeros(T, N)
        for n in range(N):
            running = 0.0
            for t in reversed(range(T)):
                ended = bool(data["terminated"][t, n] or data["truncated"][t, n])
                bootstrap = not data["terminated"][t, n] and (cfg.bootstrap_truncated or not ended)
                delta = reward[t, n] + cfg.gamma * bootstrap * next_v[t, n] - v[t, n]
                running = delta + cfg.gamma * cfg.gae_lambda * (not ended) * running
                adv[t, n] = running
        advantages.append(adv)
    advantage = torch.stack(advantages, -1)  # (T, N, K)
    return advantage, advantage + value.view(advantage.shape)


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
@pytest.mark.parametrize("bootstrap_truncated", [False, True])
def test_advantages_and_targets_match_gae_on_the_right_reward(algo: str, bootstrap_truncated: bool) -> None:
    agent = make_agent(algo, gamma=0.9, gae_lambda=0.8, bootstrap_truncated=bootstrap_truncated)
    agent.value_norm.mean.fill_(-2.0)  # values in reward units: the critic's output denormalised
    agent.value_norm.var.fill_(9.0)
    data = random_rollout()
    with torch.no_grad():
        advantage, target, value = agent.returns(data)
    assert advantage.shape == (T, N, 1 if algo == "mappo" else AGENTS)
    ref_advantage, ref_target = reference_returns(agent, data)
    torch.testing.assert_close(advantage, ref_advantage)
    torch.testing.assert_close(target, ref_target)
    torch.testing.assert_close(target - advantage, value)


def test_minibatch_loss_is_the_clipped_objective_with_the_team_advantage_for_every_agent() -> None:
    agent = make_agent("mappo", clip_ratio=0.1, ent_coef=0.05, vf_coef=0.7)
    data = random_rollout(1)
    g = torch.Generator().manual_seed(2)
    mb = {k: data[k][0] for k in ("obs", "state", "action")}  # (B, ...) with B = N sub-env steps
    mb["log_prob"] = torch.randn(N, AGENTS, generator=g) * 0.2 - 1.6  # old policy: ratios on both sides of the clip
    mb["advantage"] = torch.randn(N, 1, generator=g)
    mb["value_target"] = torch.randn(N, 1, generator=g)
    loss, stats = agent.minibatch_loss(mb)
    with torch.no_grad():
        x = torch.cat([mb["obs"], torch.eye(AGENTS).expand(N, -1, -1)], -1)
        log_p = torch.log_softmax(agent.actor.net(x), -1)  # (B, agents, actions)
        log_prob = log_p.gather(-1, mb["action"].unsqueeze(-1)).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(-1).mean()
        adv = (mb["advantage"] - mb["advantage"].mean()) / (mb["advantage"].std() + 1e-8)
        ratio = (log_prob - mb["log_prob"]).exp()
        surrogate = torch.minimum(ratio * adv, ratio.clamp(0.9, 1.1) * adv)  # adv (B, 1): every agent's
        value_loss = (agent.critic(mb["state"]) - mb["value_target"]).square().mean()
    torch.testing.assert_close(stats["loss/policy"], -surrogate.mean())
    torch.testing.assert_close(stats["loss/value"], value_loss)
    torch.testing.assert_close(stats["policy/entropy"], entropy)
    torch.testing.assert_close(loss.detach(), -surrogate.mean() + 0.7 * value_loss - 0.05 * entropy)
    assert 0 < float(stats["policy/clip_fraction"]) < 1


def hidden_and_output_layers(net: torch.nn.Module) -> tuple[list[torch.nn.Linear], torch.nn.Linear]:
    layers = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    return layers[:-1], layers[-1]


def is_orthogonal(weight: torch.Tensor, gain: float) -> bool:
    """Rows (or columns, whichever are fewer) orthogonal, each of norm ``gain``."""
    w = weight if weight.shape[0] <= weight.shape[1] else weight.T
    return torch.allclose(w @ w.T, gain**2 * torch.eye(w.shape[0]), atol=1e-4)


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_hidden_layers_start_orthogonal_at_the_activations_gain_as_the_mappo_code_does(algo: str) -> None:
    for activation, gain in (("tanh", 5 / 3), ("relu", math.sqrt(2))):
        agent = make_agent(algo, activation=activation)
        for net, out_gain in ((agent.actor, 0.01), (agent.critic, 1.0)):
            hidden, out = hidden_and_output_layers(net)
            assert len(hidden) == 2
            for layer in hidden:
                assert is_orthogonal(layer.weight, gain) and not layer.bias.any()
            assert is_orthogonal(out.weight, out_gain) and not out.bias.any()
    agent = make_agent(algo, ortho_init=False)  # PyTorch's default: uniform weights and biases
    for net in (agent.actor, agent.critic):
        for layer in hidden_and_output_layers(net)[0]:
            assert not is_orthogonal(layer.weight, 5 / 3) and layer.bias.abs().min() > 0
    ppo = ALGOS["ppo"].agent_cls(make_config("ppo", "jaderl/CartPole-v1", hidden=[16, 16], ortho_init=True),
                                 make_env("jaderl/CartPole-v1", 1, "cpu", seed=0).spec, torch.device("cpu"))
    for net in (ppo.actor, ppo.critic):
        assert all(is_orthogonal(layer.weight, 5 / 3) for layer in hidden_and_output_layers(net)[0])


def test_ippo_critic_reads_each_agent_observation_and_id() -> None:
    agent = make_agent("ippo")
    data = random_rollout(2)
    with torch.no_grad():
        value = agent.value(data["obs"], data["state"])
        expected = agent.critic(critic_input(agent, data["obs"], data["state"])).squeeze(-1)
    assert value.shape == (T, N, AGENTS)
    torch.testing.assert_close(value, expected)
    assert agent.critic[0].in_features == OBS_DIM + AGENTS
    assert make_agent("mappo").critic[0].in_features == STATE_DIM


def test_value_normalisation_tracks_every_target_and_the_critic_learns_normalised_targets() -> None:
    agent = make_agent("mappo", num_epochs=1, minibatch_size=T * N)
    buffer, targets = RolloutBuffer(), []
    for seed in range(2):
        data = random_rollout(seed)
        data["reward"] = data["reward"] * 10 + 5  # targets far from mean 0, variance 1
        with torch.no_grad():
            targets.append(agent.returns(data)[1])
        buffer.add(data)
        agent.update(buffer)
        seen = torch.cat(targets).flatten()
        # Chan et al.'s merge from the prior (mean 0, variance 1, count 1e-4): the targets' own statistics
        torch.testing.assert_close(agent.value_norm.mean, seen.mean().view(1), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(agent.value_norm.var, seen.var(correction=0).view(1), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(buffer.data["value_target"],
                                   (targets[-1] - agent.value_norm.mean) / (agent.value_norm.var + 1e-8).sqrt())
    assert "value_norm" in agent.running_stats()
    off = make_agent("mappo", normalize_values=False)
    data = random_rollout(0)
    buffer.add(data)
    with torch.no_grad():
        target = off.returns(data)[1]
    off.update(buffer)
    torch.testing.assert_close(buffer.data["value_target"], target)  # raw targets when it is off


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_value_normalisation_floors_the_variance_as_the_mappo_code_does(algo: str) -> None:
    """A long history of equal targets (a sparse reward before its first success) leaves a variance near 0; values
    are scaled by a standard deviation of at least 0.1 (the MAPPO code's ValueNorm: variance clamped at 1e-2), so the
    first success is a normalised target of 10, not of thousands."""
    agent = make_agent(algo, num_epochs=1, minibatch_size=T * N)
    agent.value_norm.count.fill_(1e6)  # a million targets of 0 seen so far
    agent.value_norm.mean.fill_(0.0)
    agent.value_norm.var.fill_(0.0)
    with torch.no_grad():
        for p in agent.critic.parameters():  # the critic learned to predict 0 for them
            p.zero_()
    data = random_rollout()
    data["reward"].zero_()
    data["reward"][2, 1] = 1.0  # the first success: every agent of sub-env 1 at step 2
    data["terminated"].zero_()
    data["truncated"].zero_()
    with torch.no_grad():
        target = agent.returns(data)[1]
    buffer = RolloutBuffer()
    buffer.add(data)
    agent.update(buffer)
    assert float(agent.value_norm.var) < 1e-4  # the statistics themselves are exact
    torch.testing.assert_close(buffer.data["value_target"], (target - agent.value_norm.mean) / 0.1)
    assert float(buffer.data["value_target"].abs().max()) < 40.0
    # the critic's outputs are read back with the same floored scale
    with torch.no_grad():
        raw = agent.value(data["obs"], data["state"])
        torch.testing.assert_close(agent.denormalize(raw), raw * 0.1 + agent.value_norm.mean)
        torch.testing.assert_close(agent.value_norm(agent.denormalize(raw)), raw)


@pytest.mark.parametrize("env", [ENV, f"{ENV}?continuous=true"])
def test_update_learns_and_act_gives_every_agent_an_action(env: str) -> None:
    agent = make_agent("mappo", env=env)
    before = [p.detach().clone() for p in agent.parameters()]
    buffer = RolloutBuffer()
    buffer.add(random_rollout(3, continuous="continuous" in env))
    stats = agent.update(buffer)
    assert {"loss/policy", "loss/value", "policy/entropy", "policy/approx_kl", "policy/clip_fraction",
            "policy/explained_variance"} <= stats.keys()
    assert all(math.isfinite(float(v)) for v in stats.values())
    assert all(not torch.equal(p, b) for p, b in zip(agent.parameters(), before, strict=True))
    obs = torch.randn(7, AGENTS, OBS_DIM)
    for deterministic in (True, False):
        action = agent.act(obs, deterministic=deterministic)
        assert action.shape == ((7, AGENTS) if "continuous" not in env else (7, AGENTS, 2))


@pytest.mark.parametrize("env", [ENV, f"{ENV}?continuous=true"])
def test_rollouts_record_every_agents_log_probability(env: str) -> None:
    """explore records log pi(a_i|o_i) (T, N, agents) of the actions taken; the update would compute the same."""
    config = make_config("mappo", env, hidden=[16, 16], device="cpu", num_envs=N, horizon=T, minibatch_size=8)
    vec = make_env(config.env, N, "cpu", seed=1)
    agent = MAPPO(config, vec, torch.device("cpu"))
    rollout = agent.explore(vec, T)
    recorded = rollout.pop("log_prob")
    assert recorded.shape == rollout["reward"].shape == (T, N, AGENTS)
    with torch.no_grad():
        torch.testing.assert_close(recorded, agent.old_log_prob(rollout), atol=1e-5, rtol=1e-5)


def test_refuses_single_agent_envs_and_checks_its_settings() -> None:
    single = EnvSpec(num_envs=1, obs_shape=(4,), is_discrete=True, action_dim=2)
    assert "single agent" in MAPPO.accepts(single)
    assert MAPPO.accepts(make_env(ENV, 1, "cpu").spec) is None
    assert MAPPO.accepts(make_env(f"{ENV}?continuous=true", 1, "cpu").spec) is None
    with pytest.raises(ConfigError, match="minibatch_size=9999 is larger than a rollout"):
        make_config("mappo", ENV, num_envs=4, horizon=25, minibatch_size=9999)
    with pytest.raises(ConfigError, match=r"\(num_envs \* workers \* horizon = 200 sub-env steps\)"):
        make_config("mappo", ENV, num_envs=4, horizon=25, workers=2, minibatch_size=250)
    with pytest.raises(ConfigError, match="cannot train on jaderl/CartPole-v1"):
        train("mappo", "jaderl/CartPole-v1", device="cpu", total_steps=100)
    # MAPPO standardises one team advantage per sub-env step of a minibatch: one alone has no standard deviation
    with pytest.raises(ConfigError, match=r"normalize_advantages=true needs .* \(minibatch_size = 1"):
        make_config("mappo", ENV, num_envs=2, horizon=5, minibatch_size=1)
    make_config("ippo", ENV, num_envs=2, horizon=5, minibatch_size=1)  # IPPO: one advantage per agent
    make_config("mappo", ENV, num_envs=2, horizon=5, minibatch_size=1, normalize_advantages=False)


@pytest.mark.parametrize("algo", ["mappo", "qmix", "maddpg"])
def test_every_multi_agent_algorithm_refuses_a_global_state_that_is_no_vector(algo: str) -> None:
    """The critics, mixers and the state normaliser read (..., state_dim): a state of another shape is refused in one
    sentence instead of failing in a matrix product."""
    spec = make_env(ENV, 1, "cpu").spec.replace(state_shape=(AGENTS, STATE_DIM // AGENTS))
    reason = ALGOS[algo].agent_cls.accepts(spec)
    assert reason is not None and "global state has shape (3, 18)" in reason and reason.count(".") == 0
    assert ALGOS[algo].agent_cls.accepts(make_env(ENV, 1, "cpu").spec) is None


def test_registry_presets_and_hyperparameter_ranges() -> None:
    assert ALGOS["mappo"].agent_cls is ALGOS["ippo"].agent_cls is MAPPO
    assert make_config("mappo", ENV).centralised_critic and not make_config("ippo", ENV).centralised_critic
    config = make_config("mappo", ENV)
    assert {"lr", "gamma", "clip_ratio", "gae_lambda", "ent_coef"} <= MAPPO.hyperparameters.keys()
    for name, bounds in MAPPO.hyperparameters.items():
        assert bounds.low <= getattr(config, name) <= bounds.high, name


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_train_resume_load_act(algo: str, tmp_path: Path) -> None:
    settings = {"num_envs": 8, "horizon": 25, "minibatch_size": 100, "num_epochs": 2, "hidden": [16, 16],
                "total_steps": 400, "eval_every": 400, "checkpoint_every": 400, "eval_episodes": 2,
                "device": "cpu", "seed": 1}
    run_dir = tmp_path / algo
    result = train(algo, ENV, run_dir=str(run_dir), **settings)
    assert result.steps == 400 and result.stop_reason == "total_steps"
    state = load_checkpoint(run_dir)["agent"]
    assert state["optimizers"]["optimizer"]["state"]  # the optimizer stepped
    norm = state["running_stats"]["value_norm"]
    assert float(norm["count"]) > 400 * (1 if algo == "mappo" else AGENTS) * 0.5  # the targets seen are counted
    resumed = resume(run_dir, total_steps=800)
    assert resumed.steps == 800
    assert float(load_checkpoint(run_dir)["agent"]["running_stats"]["value_norm"]["count"]) > float(norm["count"])
    for best in (True, False):
        agent = load(run_dir, best=best)
        assert isinstance(agent, MAPPO) and agent.config.centralised_critic == (algo == "mappo")
        env = make_env(ENV, 5, "cpu", seed=2)
        obs = env.reset()
        action = agent.act(obs, deterministic=True)
        assert action.shape == (5, AGENTS) and not action.dtype.is_floating_point and not action.requires_grad
        env.step(action)
    # jaderl eval: team returns (every agent's summed, as metrics.csv reports them) and the mean per agent
    from jaderl.api import evaluate

    report = evaluate(run_dir, episodes=3)
    assert len(report["returns"]) == 3 and report["mean"] == pytest.approx(sum(report["returns"]) / 3, abs=1e-3)
    assert report["mean_per_agent"] == pytest.approx(report["mean"] / AGENTS, rel=1e-5)


def test_data_parallel_learners_merge_the_value_normaliser(tmp_path: Path) -> None:
    settings = {"num_envs": 8, "horizon": 25, "minibatch_size": 100, "num_epochs": 1, "hidden": [16, 16],
                "total_steps": 800, "eval_every": 800, "checkpoint_every": 800, "eval_episodes": 2, "device": "cpu"}
    result = train("mappo", ENV, run_dir=str(tmp_path / "ddp"), learners=2, **settings)
    assert result.steps == 800
    # each learner saw 2 rollouts of 8 x 25 team targets; the merged statistics count both learners' targets
    norm = load_checkpoint(tmp_path / "ddp")["agent"]["running_stats"]["value_norm"]
    assert float(norm["count"]) == pytest.approx(800, abs=1e-3)
