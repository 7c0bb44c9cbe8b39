"""Learning tests on simple_tag (slow: `-m slow`): predators and prey (3 adversaries, 1 good agent) train together
with an algorithm that learns each agent's own reward (MADDPG, MATD3, IPPO, IQL; default settings, seed 0, one CPU
thread); then the trained predators must catch the trained prey at least twice as often as random predators do.
Measured when written are in the comments (CPU seconds of the process, on a 2-core machine shared with other
training processes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import jaderl
from jaderl.core.agent import Agent
from jaderl.envs import make_env

pytestmark = pytest.mark.slow

TAG, PREDATORS, CATCH_MARGIN = "jaderl/simple_tag", 3, 2.0


@torch.no_grad()
def catches_per_episode(agent: Agent, random_predators: bool, num_envs: int = 2_000, seed: int = 123) -> float:
    """Mean (predator, prey) collisions per 25-step episode over ``num_envs`` sub-envs, every agent acting
    deterministically, the predators replaced by uniformly random ones if asked. Each collision pays every
    predator +10 (the predators share one reward), so a predator's reward / 10 counts them."""
    env = make_env(TAG, num_envs, "cpu", seed=seed)
    obs, generator, total = env.reset(seed=seed), torch.Generator().manual_seed(seed), torch.zeros(num_envs)
    for _ in range(env.max_steps):
        action = agent.act(obs, deterministic=True)  # (N, agents)
        if random_predators:
            action[:, :PREDATORS] = torch.randint(env.action_dim, (num_envs, PREDATORS), generator=generator)
        obs, reward, _, _, _ = env.step(action)
        total += reward[:, 0] / 10.0
    return float(total.mean())


CASES = [
    # measured: maddpg after 50k steps 1.6 catches per episode vs 0.46 for random predators (after 100k: 2.1 vs 0.23,
    # ~150 s CPU); matd3 after 100k steps 2.1 vs 0.31 (~190 s CPU; after 50k only 0.74 vs 0.45: its delayed actor
    # updates learn the chase later; seed 1: 2.2 vs 0.25)
    ("maddpg", 50_000), ("matd3", 100_000),
    # ippo after 512k steps (20 rollouts) 1.86 vs 0.24 (~18 s; after 1M: 2.03 vs 0.27, ~35 s; seed 1: 2.54 vs 0.23 and
    # 1.96 vs 0.29; with PyTorch's default initialisation, ortho_init=false, seed 0: 1.51 vs 0.38); iql after 150k
    # steps 2.41 vs 0.40 (~115 s; after 100k: 0.99 vs 0.50, its epsilon decays over the first 50k)
    ("ippo", 512_000), ("iql", 150_000),
]


@pytest.mark.slow(seconds=190)
@pytest.mark.parametrize(("algo", "steps"), CASES)
def test_simple_tag_trained_predators_catch_more(algo: str, steps: int, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run_dir = tmp_path / algo
    result = jaderl.train(algo, TAG, seed=0, device="cpu", run_dir=str(run_dir), total_steps=steps,
                          time_limit=600.0, eval_every=steps)
    assert result.steps == steps, f"{algo}: stopped after {result.steps} steps ({result.stop_reason})"
    agent = jaderl.load(run_dir, best=False)  # the last predators and prey, trained against each other
    trained, random = catches_per_episode(agent, False), catches_per_episode(agent, True)
    assert trained >= CATCH_MARGIN * random and trained > 0.5, \
        f"{algo}: trained predators catch {trained:.2f} times per episode, random ones {random:.2f}"
