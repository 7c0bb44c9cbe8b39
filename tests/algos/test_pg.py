"""The maths of REINFORCE / VPG and A2C, and of the on-policy reward normaliser, against plain Python references
(per env, per step, scalars)."""

from __future__ import annotations

import copy
import math
import statistics
import warnings
from pathlib import Path

import pytest
import torch

import jaderl
from jaderl.algos.a2c import A2C, A2CConfig
from jaderl.algos.base import ReturnNorm
from jaderl.algos.reinforce import Reinforce, ReinforceConfig, discounted_returns
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.checkpoint import load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.envs import make_env

T, N = 13, 5


def random_rollout(seed: int, obs_dim: int = 4, num_actions: int = 2) -> dict[str, torch.Tensor]:
    """A synthetic (T, N) rollout with random rewards and episode ends; some steps are terminated AND truncated."""
    g = torch.Generator().manual_seed(seed)
    data = {"obs": torch.randn(T, N, obs_dim, generator=g), "next_obs": torch.randn(T, N, obs_dim, generator=g),
            "action": torch.randint(num_actions, (T, N), generator=g), "reward": torch.randn(T, N, generator=g),
            "terminated": torch.rand(T, N, generator=g) < 0.15, "truncated": torch.rand(T, N, generator=g) < 0.15}
    # as in a real rollout, a sub-env that goes on starts its next step where the last one ended
    done = (data["terminated"] | data["truncated"])[:-1, :, None]
    data["obs"][1:] = torch.where(done, data["obs"][1:], data["next_obs"][:-1])
    return data


def reference_returns(reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, gamma: float,
                      next_value: torch.Tensor | None) -> list[list[float]]:
    """Backwards over each env separately: cut at every episode end, bootstrap from next_value unless terminated."""
    out = [[0.0] * N for _ in range(T)]
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            r = float(reward[t, n])
            if bool(terminated[t, n]):
                running = r
            elif bool(truncated[t, n]) or t == T - 1:
                running = r + gamma * (0.0 if next_value is None else float(next_value[t, n]))
            else:
                running = r + gamma * running
            out[t][n] = running
    return out


def reference_n_step_targets(reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, gamma: float,
                             next_value: torch.Tensor) -> list[list[float]]:
    """Forwards from each (t, n): sum discounted rewards until the episode or the rollout ends, then add gamma^k V."""
    out = [[0.0] * N for _ in range(T)]
    for n in range(N):
        for t in range(T):
            target, discount = 0.0, 1.0
            for k in range(t, T):
                target += discount * float(reward[k, n])
                discount *= gamma
                if bool(terminated[k, n]):
                    break
                if bool(truncated[k, n]) or k == T - 1:
                    target += discount * float(next_value[k, n])
                    break
            out[t][n] = target
    return out


def make_agent(agent_cls: type, config_cls: type, **settings: object):
    env = make_env("jaderl/CartPole-v1", N, "cpu", seed=0)
    config = config_cls(env="jaderl/CartPole-v1", num_envs=N, horizon=T, hidden=[16], device="cpu", **settings)
    torch.manual_seed(0)
    return agent_cls(config, env, torch.device("cpu"))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bootstrap", [False, True])
def test_discounted_returns_match_reference(seed: int, bootstrap: bool) -> None:
    data = random_rollout(seed)
    next_value = torch.randn(T, N, generator=torch.Generator().manual_seed(100 + seed)) if bootstrap else None
    returns = discounted_returns(data["reward"], data["terminated"], data["truncated"], 0.9, next_value)
    expected = reference_returns(data["reward"], data["terminated"], data["truncated"], 0.9, next_value)
    assert returns.shape == (T, N)
    torch.testing.assert_close(returns, torch.tensor(expected))


def test_discounted_returns_by_hand() -> None:
    ones, no = torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.bool)
    # 1 + 0.9 + 0.81 + 0.729 * V(s_3) with V = 10: the rollout end bootstraps
    g = discounted_returns(ones, no, no, 0.9, torch.full((3, 1), 10.0))
    torch.testing.assert_close(g[0, 0], torch.tensor(10.0))
    # terminated at step 1: no bootstrap there, and step 0 sees only steps 0 and 1
    terminated = torch.tensor([[False], [True], [False]])
    g = discounted_returns(ones, terminated, no, 0.9, torch.full((3, 1), 10.0))
    torch.testing.assert_close(g[:, 0], torch.tensor([1.9, 1.0, 10.0]))
    # truncated (and terminated) at the same step: termination wins, no bootstrap
    g = discounted_returns(ones, terminated, terminated, 0.9, torch.full((3, 1), 10.0))
    torch.testing.assert_close(g[:, 0], torch.tensor([1.9, 1.0, 10.0]))
    # without a critic a truncated return is the rewards observed
    g = discounted_returns(ones, no, terminated, 0.9)
    torch.testing.assert_close(g[:, 0], torch.tensor([1.9, 1.0, 1.0]))


@pytest.mark.parametrize("baseline", [False, True])
def test_reinforce_losses_use_returns_minus_baseline(baseline: bool) -> None:
    agent = make_agent(Reinforce, ReinforceConfig, baseline=baseline, normalize_advantages=False, gamma=0.95)
    data = random_rollout(7)
    actor, critic = copy.deepcopy(agent.actor), copy.deepcopy(getattr(agent, "critic", None))
    buffer = RolloutBuffer()
    buffer.add(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the short horizon warning of REINFORCE without a baseline
        stats = agent.update(buffer)
    with torch.no_grad():
        value = critic(data["obs"]).squeeze(-1) if baseline else torch.zeros(T, N)
        next_value = critic(data["next_obs"]).squeeze(-1) if baseline else None
        returns = torch.tensor(reference_returns(data["reward"], data["terminated"], data["truncated"], 0.95,
                                                 next_value))
        log_prob = actor.evaluate(data["obs"].flatten(0, 1), data["action"].flatten())[0]
    advantage = returns - value  # VPG: G - V(s); REINFORCE: G
    torch.testing.assert_close(stats["loss/policy"], -(log_prob * advantage.flatten()).mean())
    expected_value_loss = (value - returns).square().mean() if baseline else torch.tensor(0.0)
    torch.testing.assert_close(stats["loss/value"], expected_value_loss)
    assert (agent.critic is not None) == baseline


@pytest.mark.parametrize("seed", range(3))
def test_a2c_n_step_targets_match_reference(seed: int) -> None:
    agent = make_agent(A2C, A2CConfig, gamma=0.9)  # gae_lambda=1: n-step returns
    data = random_rollout(seed)
    critic = copy.deepcopy(agent.critic)
    buffer = RolloutBuffer()
    buffer.add(data)
    stats = agent.update(buffer)
    with torch.no_grad():
        value, next_value = critic(data["obs"]).squeeze(-1), critic(data["next_obs"]).squeeze(-1)
    targets = torch.tensor(reference_n_step_targets(data["reward"], data["terminated"], data["truncated"], 0.9,
                                                    next_value))
    torch.testing.assert_close(buffer.data["value_target"], targets)
    torch.testing.assert_close(buffer.data["advantage"], targets - value)
    torch.testing.assert_close(stats["loss/value"], (value - targets).square().mean())


def test_a2c_optimizers_and_one_step_per_rollout() -> None:
    for name, cls in (("rmsprop", torch.optim.RMSprop), ("adam", torch.optim.Adam)):
        agent = make_agent(A2C, A2CConfig, optimizer=name)
        assert isinstance(agent.optimizer, cls)
        buffer = RolloutBuffer()
        buffer.add(random_rollout(0))
        agent.update(buffer)
        assert all(int(s["step"]) == 1 for s in agent.optimizer.state_dict()["state"].values())


def test_continuous_log_std_init() -> None:
    env = make_env("jaderl/Pendulum-v1", 2, "cpu", seed=0)
    for agent_cls, config_cls in ((A2C, A2CConfig), (Reinforce, ReinforceConfig)):
        agent = agent_cls(config_cls(num_envs=2, log_std_init=-2.0, device="cpu"), env, torch.device("cpu"))
        torch.testing.assert_close(agent.actor.log_std.detach(), torch.tensor([-2.0]))


@pytest.mark.parametrize("algo", ["ppo", "a2c", "vpg", "mappo"])
def test_activation_builds_every_hidden_layer(algo: str) -> None:
    env_id = "jaderl/simple_spread" if algo == "mappo" else "jaderl/Pendulum-v1"
    env = make_env(env_id, 2, "cpu", seed=0)
    for name, kind in (("tanh", "Tanh"), ("relu", "ReLU")):
        extra = {"minibatch_size": 8} if algo in ("ppo", "mappo") else {}
        config = jaderl.make_config(algo, env_id, zoo=False, num_envs=2, horizon=8, activation=name, device="cpu",
                                    **extra)
        agent = jaderl.api.ALGOS[algo].agent_cls(config, env, torch.device("cpu"))
        for net in (agent.actor.net, agent.critic):
            layers = [type(m).__name__ for m in net]
            assert layers[1::2] == [kind] * len(config.hidden), layers


def test_short_horizon_without_baseline_warns_once() -> None:
    agent = make_agent(Reinforce, ReinforceConfig)  # horizon 13 < 1 / (1 - 0.99)
    env = make_env("jaderl/CartPole-v1", N, "cpu", seed=0)
    buffer = RolloutBuffer()
    buffer.add(agent.explore(env, T))
    with pytest.warns(UserWarning, match="horizon=13"):
        agent.update(buffer)
    buffer.add(agent.explore(env, T))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agent.update(buffer)
        vpg = make_agent(Reinforce, ReinforceConfig, baseline=True)
        buffer.add(vpg.explore(env, T))
        vpg.update(buffer)


@pytest.mark.parametrize(("config_cls", "settings", "match"), [
    (A2CConfig, {"optimizer": "sgd"}, "optimizer='sgd' is invalid: use one of rmsprop, adam"),
    (A2CConfig, {"gae_lambda": 1.5}, "gae_lambda=1.5 is out of range"),
    (A2CConfig, {"ent_coef": -0.1}, "ent_coef=-0.1 is out of range"),
    (A2CConfig, {"normalize_advantages": True, "num_envs": 1, "horizon": 1}, "normalize_advantages=true needs"),
    (A2CConfig, {"lr": 0.0}, "lr=0.0 is out of range"),
    (ReinforceConfig, {"horizon": 0}, "horizon=0 is out of range"),
    (ReinforceConfig, {"num_envs": 1, "horizon": 1}, "normalize_advantages=true needs at least 2 transitions"),
    (ReinforceConfig, {"vf_coef": -1.0}, "vf_coef=-1.0 is out of range"),
    (ReinforceConfig, {"baseline": "yes"}, "baseline='yes' is invalid"),
    (A2CConfig, {"activation": "gelu"}, "activation='gelu' is invalid: use tanh or relu"),
])
def test_config_validation(config_cls: type, settings: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_cls(**settings)


@pytest.mark.parametrize("agents", [(), (3,)])
def test_return_norm_matches_a_per_env_reference(agents: tuple[int, ...]) -> None:
    """Rewards divided by the standard deviation of every discounted return seen so far (this rollout's included),
    the returns carried across rollouts per sub-env (and agent) and zeroed where an episode ends."""
    gamma, norm = 0.9, ReturnNorm((N, *agents), True)
    running = torch.zeros(N, *agents).tolist() if agents else [0.0] * N
    seen: list[float] = []
    for k in range(2):
        data = random_rollout(k)
        data["reward"] = torch.randn(T, N, *agents, generator=torch.Generator().manual_seed(10 + k))
        if k == 1:
            data["reward"][5, 0] = 1e3  # scaled beyond the clip
        raw, done = data["reward"].clone(), data["terminated"] | data["truncated"]
        for t in range(T):
            for n in range(N):
                for a in range(agents[0] if agents else 1):
                    value = float(raw[t, n, a]) if agents else float(raw[t, n])
                    current = (running[n][a] if agents else running[n]) * gamma + value
                    seen.append(current)
                    current = 0.0 if bool(done[t, n]) else current
                    if agents:
                        running[n][a] = current
                    else:
                        running[n] = current
        std = math.sqrt(statistics.pvariance(seen) + 1e-8)
        norm.normalize_(data, gamma)
        torch.testing.assert_close(data["reward"], (raw / std).clamp(-10, 10), rtol=1e-4, atol=1e-5)
    assert data["reward"][5, 0].max() == 10.0
    torch.testing.assert_close(norm.running, torch.tensor(running))
    assert norm.count.item() == pytest.approx(len(seen))


def test_return_norm_disabled_leaves_rewards() -> None:
    data = random_rollout(0)
    reward = data["reward"]
    ReturnNorm((N,), False).normalize_(data, 0.9)
    assert data["reward"] is reward


@pytest.mark.parametrize("algo", ["a2c", "vpg", "mappo"])
def test_normalize_reward_trains_and_checkpoints(algo: str, tmp_path: Path) -> None:
    env = "jaderl/simple_spread" if algo == "mappo" else "jaderl/Pendulum-v1"
    settings = {"minibatch_size": 16} if algo == "mappo" else {}
    result = jaderl.train(algo, env, run_dir=str(tmp_path / "run"), seed=0, device="cpu", num_envs=4, horizon=8,
                          hidden=[16], total_steps=64, eval_every=64, eval_episodes=1, normalize_reward=True,
                          zoo=False, **settings)
    assert result.steps == 64 and math.isfinite(result.last_eval_return)
    stats = load_checkpoint(tmp_path / "run")["agent"]["running_stats"]["reward_norm"]
    agents = 3 if algo == "mappo" else 1
    assert stats["count"].item() == pytest.approx(64 * agents, abs=1e-3) and stats["running"].shape[0] == 4
