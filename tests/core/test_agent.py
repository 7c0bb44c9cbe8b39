"""The agent base class (jaderl.core.agent) on observations the built-in envs do not produce."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from jaderl.algos import ALGOS
from jaderl.api import make_config


@pytest.mark.parametrize("algo", ["ppo", "sac", "dqn"])
def test_normalised_matrix_observations(algo: str) -> None:
    """A 2-D Box observation (not an image) with ``normalize_obs``: each entry normalised by its own statistics,
    then flattened for the MLPs."""
    torch.manual_seed(0)
    discrete = algo == "dqn"
    env = SimpleNamespace(num_envs=4, obs_shape=(2, 3), is_discrete=discrete, action_dim=2)
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
