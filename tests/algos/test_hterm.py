"""The H-term add-on: segment sampling and the objective against plain reference code, and its use by each agent."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from jaderl.algos import ALGOS
from jaderl.algos.hterm import hterm_loss, sample_segments, tanh_gaussian_log_prob
from jaderl.algos.nets import TanhGaussianActor
from jaderl.api import make_config
from jaderl.core.config import ConfigError
from jaderl.envs import make_env


def test_segments_are_consecutive_rows_of_one_sub_env_in_time_order() -> None:
    torch.manual_seed(0)
    rows, num_envs, oldest, size = 10, 3, 7, 10  # a full circular buffer whose oldest row is 7
    t = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, num_envs)
    n = torch.arange(num_envs, dtype=torch.float32)[None].expand(rows, num_envs)
    data = {"obs": torch.stack([t, n], -1), "action": t.clone(), "reward": t.clone(),
            "terminated": torch.zeros(rows, num_envs, dtype=torch.bool), "truncated": torch.zeros(rows, num_envs,
                                                                                                  dtype=torch.bool)}
    seg = sample_segments(data, num=50, length=4, oldest=oldest, size=size)
    assert seg["obs"].shape == (50, 4, 2) and seg["reward"].shape == (50, 4)
    ages = (seg["obs"][..., 0] - oldest) % rows  # time order: age grows by one along each segment, within the data
    assert torch.equal(ages[:, 1:] - ages[:, :-1], torch.ones(50, 3))
    assert (ages <= size - 1).all()
    assert (seg["obs"][..., 1] == seg["obs"][:, :1, 1]).all()  # one sub-env per segment


def test_hterm_loss_matches_reference() -> None:
    g = torch.Generator().manual_seed(1)
    num, length, gamma = 6, 5, 0.9
    log_prob = torch.randn(num, length, generator=g)
    reward = torch.randn(num, length, generator=g)
    terminated = torch.rand(num, length, generator=g) < 0.15
    truncated = torch.rand(num, length, generator=g) < 0.1
    segments = {"reward": reward, "terminated": terminated, "truncated": truncated}
    energies, log_likelihoods = [], []
    for i in range(num):
        ret, logp = 0.0, 0.0
        for k in range(length):
            ret += gamma**k * float(reward[i, k])
            logp += float(log_prob[i, k])
            if terminated[i, k] or truncated[i, k]:
                break
        energies.append(-ret)
        log_likelihoods.append(logp / (k + 1))
    e = torch.tensor(energies)
    e = (e - e.mean()) / (e.std() + 1e-8)
    expected = sum(float(e[i]) * log_likelihoods[i] for i in range(num)) / num
    assert hterm_loss(log_prob, segments, gamma).item() == pytest.approx(expected, rel=1e-5)


def test_tanh_gaussian_log_prob_matches_the_sampled_log_prob() -> None:
    torch.manual_seed(2)
    actor = TanhGaussianActor(3, 2, [16])
    obs = torch.randn(32, 3)
    action, log_prob = actor.sample(obs)
    inside = action.abs().amax(-1) < 1 - 1e-3  # saturated actions are clamped before atanh
    assert inside.sum() > 16
    assert torch.allclose(tanh_gaussian_log_prob(actor, obs, action)[inside], log_prob[inside], atol=1e-3)


@pytest.mark.parametrize("algo", ["ppo", "sac", "td3", "ddpg"])
def test_agents_take_hterm_steps_only_when_enabled(algo: str) -> None:
    torch.manual_seed(3)
    spec = ALGOS[algo]
    settings = {"hidden": [16, 16], "num_envs": 4, "use_hterm": True, "hterm_trajectories": 8, "hterm_length": 4,
                "hterm_every": 1}
    if spec.agent_cls.on_policy:
        settings |= {"horizon": 16, "minibatch_size": 32, "num_epochs": 1}
    else:
        settings |= {"warmup_steps": 0, "batch_size": 16, "buffer_size": 256}
    config = make_config(algo, "jaderl/Pendulum-v1", **settings)
    env = make_env(config.env, 4, "cpu", seed=0)
    agent = spec.agent_cls(config, env, torch.device("cpu"))
    buffer = agent.make_buffer()
    for _ in range(3):
        buffer.add(agent.explore(env, config.horizon if agent.on_policy else 8))
        stats = agent.update(buffer)
    assert "loss/hterm" in stats and torch.isfinite(stats["loss/hterm"])
    without = make_config(algo, "jaderl/Pendulum-v1", **{**settings, "use_hterm": False})
    agent2 = spec.agent_cls(without, env, torch.device("cpu"))
    buffer2 = agent2.make_buffer()
    buffer2.add(agent2.explore(env, without.horizon if agent2.on_policy else 8))
    assert "loss/hterm" not in agent2.update(buffer2)


@pytest.mark.parametrize("learners", [1, 2])
def test_hterm_every_counts_iterations_with_data_parallel_learners(learners: int) -> None:
    """With K learners each update ends with ``steps`` set to the steps of all K (as ``Learners.after_update``
    does): the H-term still runs on every ``hterm_every``-th iteration of each learner."""
    config = make_config("ppo", "jaderl/CartPole-v1", num_envs=2, horizon=4, minibatch_size=8, num_epochs=1,
                         hidden=[8], use_hterm=True, hterm_every=2, hterm_trajectories=2, hterm_length=2,
                         learners=learners)
    env = make_env(config.env, 2, "cpu", seed=0)
    agent = ALGOS["ppo"].agent_cls(config, env, torch.device("cpu"))
    buffer, ran = agent.make_buffer(), []
    for k in range(1, 9):
        buffer.add(agent.explore(env, config.horizon))
        ran.append("loss/hterm" in agent.update(buffer))
        agent.steps = k * learners * config.horizon * config.num_envs
    assert [k for k, due in enumerate(ran, 1) if due] == [2, 4, 6, 8]


def test_hterm_is_offered_only_where_implemented() -> None:
    with pytest.raises(ConfigError, match="use_hterm"):
        make_config("dqn", "jaderl/CartPole-v1", use_hterm=True)


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_an_update_override_that_calls_super_takes_one_hterm_step(algo: str) -> None:
    """A subclass whose ``update`` wraps ``super().update`` (to add statistics, say) gets its H-term step once per
    update, not once for its own hooked update and again for the one it calls."""
    torch.manual_seed(4)
    base = ALGOS[algo].agent_cls

    class Extended(base):  # type: ignore[misc, valid-type]
        def update(self, buffer: Any) -> dict[str, torch.Tensor]:
            stats = super().update(buffer)
            return {**stats, "extra": torch.zeros(())} if stats else stats

    settings: dict[str, Any] = {"hidden": [8], "num_envs": 2, "use_hterm": True, "hterm_trajectories": 2,
                                "hterm_length": 2, "hterm_every": 1}
    settings |= ({"horizon": 4, "minibatch_size": 8, "num_epochs": 1} if base.on_policy
                 else {"warmup_steps": 0, "batch_size": 4, "buffer_size": 64})
    config = make_config(algo, "jaderl/Pendulum-v1", **settings)
    env = make_env(config.env, 2, "cpu", seed=0)
    agent = Extended(config, env, torch.device("cpu"))
    steps: list[torch.Tensor | None] = []
    hterm_step = agent.hterm_step
    agent.hterm_step = lambda *args: steps.append(hterm_step(*args)) or steps[-1]  # type: ignore[method-assign]
    buffer = agent.make_buffer()
    for _ in range(2):
        buffer.add(agent.explore(env, 4))
        stats = agent.update(buffer)
    assert len(steps) == 2 and all(loss is not None for loss in steps)
    assert "loss/hterm" in stats and "extra" in stats
