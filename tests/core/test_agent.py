"""The agent base class (jaderl.core.agent) on observations the built-in envs do not produce."""

from __future__ import annotations

import pytest
import torch

from jaderl.algos import ALGOS
from jaderl.api import make_config
from jaderl.envs import EnvSpec


@pytest.mark.parametrize("algo", ["ppo", "sac", "dqn"])
def test_normalised_matrix_observations(algo: str) -> None:
    """A 2-D Box observation (not an image) with ``normalize_obs``: each entry normalised by its own statistics,
    then flattened for the MLPs."""
    torch.manual_seed(0)
    discrete = algo == "dqn"
    env = EnvSpec(num_envs=4, obs_shape=(2, 3), is_discrete=discrete, action_dim=2)
    config = make_config(algo, "jaderl/CartPole-v1" if discrete else "jaderl/Pendulum-v1", normalize_obs=True,
                         hidden=[8], num_envs=4, device="cpu", **({"minibatch_size": 4} if algo == "ppo" else {}))
    agent = ALGOS[algo].agent_cls(config, env, torch.device("cpu"))
    data = torch.randn(50, 4, 2, 3) * torch.arange(1.0, 7.0).view(2, 3) + 10 * torch.arange(6.0).view(2, 3)
    agent.obs_norm.update(data)
    obs = data[0]
    mean, std = data.flatten(0, 1).mean(0), data.flatten(0, 1).std(0, unbiased=False)
    torch.testing.assert_close(agent.features(obs), ((obs - mean) / std).flatten(1), rtol=1e-3, atol=1e-3)
    assert agent.features(data).shape == (50, 4, 6)
    action = agent.act(obs, deterministic=True)
    assert action.shape == ((4,) if discrete else (4, 2))


def test_clipped_rewards_are_learned_from_and_raw_returns_logged() -> None:
    """``clip_rewards`` (the default for Atari ids) stores sign(reward) x reward_scale; the episode statistics keep
    the game's own rewards."""
    from jaderl.envs import make_env

    assert make_config("dqn", "ALE/Pong-v5").clip_rewards  # no env is built: ale-py is not needed here
    assert not make_config("dqn", "ALE/Pong-v5", clip_rewards=False).clip_rewards
    assert not make_config("dqn", "CartPole-v1").clip_rewards
    logged: dict[bool, float] = {}
    for clip in (False, True):
        env = make_env("jaderl/Pendulum-v1", 2, "cpu", seed=0)  # rewards in [-16.3, 0], episodes of 200 steps
        config = make_config("ppo", "jaderl/Pendulum-v1", num_envs=2, horizon=200, minibatch_size=4, hidden=[8],
                             clip_rewards=clip, reward_scale=0.5, device="cpu", seed=0)
        torch.manual_seed(0)
        agent = ALGOS["ppo"].agent_cls(config, env, torch.device("cpu"))
        reward = agent.explore(env, 200)["reward"]
        logged[clip] = agent.episodes.summary()["train/episode_return"]
        if clip:
            assert set(reward.unique().tolist()) <= {-0.5, 0.0} and (reward == -0.5).any()
        else:
            assert reward.min() < -1.0
    assert logged[True] == pytest.approx(logged[False]) and logged[True] < -200  # the same episodes, unclipped
