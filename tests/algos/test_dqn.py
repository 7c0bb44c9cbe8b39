"""DQN's exploration checked against what the config promises: uniformly random actions during the warm-up."""

from __future__ import annotations

import pytest
import torch

from jaderl.algos import DQN
from jaderl.api import make_config
from jaderl.envs import make_env


@pytest.mark.parametrize(("algo", "settings"), [("noisy_dqn", {}), ("dqn", {"epsilon_start": 0.2}),
                                                ("dqn", {})])
def test_warmup_actions_are_uniformly_random(algo: str, settings: dict) -> None:
    """``warmup_steps``: "env steps of uniformly random actions before learning starts", whatever epsilon is then
    (noisy_dqn's is 0 throughout)."""
    torch.manual_seed(0)
    config = make_config(algo, "jaderl/Acrobot-v1", hidden=[16], warmup_steps=10_000, num_envs=256, device="cpu",
                         **settings)
    env = make_env(config.env, 256, "cpu", seed=0)
    agent = DQN(config, env, torch.device("cpu"))
    with torch.no_grad():  # a greedy policy that always picks action 0, so that any greedy action shows
        agent.q_net.advantage.bias.copy_(torch.tensor([100.0, 0.0, 0.0]))
    action = agent.explore(env, 8)["action"].flatten()  # 2048 warm-up actions
    freq = torch.bincount(action, minlength=3).double() / action.numel()
    sigma = (1 / 3 * 2 / 3 / action.numel()) ** 0.5
    assert ((freq - 1 / 3).abs() < 5 * sigma).all(), freq
    # after the warm-up the greedy (noisy) action takes over wherever epsilon does not explore
    agent.steps = config.warmup_steps
    action = agent.explore(env, 8)["action"].flatten()
    greedy_share = float((action == 0).double().mean())
    expected = 1 - agent.epsilon() * 2 / 3
    assert greedy_share == pytest.approx(expected, abs=0.05)
    env.close()
