"""Learning tests of MADDPG and MATD3 with their default settings (slow: `-m slow`).

simple_spread: a uniformly random policy scores about -80 team return per 25-step episode (the agents' rewards
summed, jaderl.envs.mpe "Rewards"); the target is 30 % better, -57, reached by one deterministic evaluation of 100
episodes within 10 minutes of one CPU core. simple_tag: predators and prey (3 adversaries, 1 good agent) train
together; then trained predators must catch the trained prey at least twice as often as random predators do.
Measured when written (seed 0, one thread, on a 2-core machine shared with 3 other training processes: CPU seconds
of the process, wall seconds of the test in brackets) are in the comments; seed 1 reached -57 within 40k steps with
both algorithms, and matd3's simple_tag run caught 2.2 vs 0.25 times per episode.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import jaderl
from jaderl.core.agent import Agent
from jaderl.envs import make_env

pytestmark = pytest.mark.slow

SPREAD_TARGET = -57.0
SPREAD_CASES = {
    # algo, env: the steps of the first evaluation >= -57 (run on to 150k-200k steps, both reach about -36)
    "maddpg": ("maddpg", "jaderl/simple_spread"),  # 50k steps (~90 s CPU [97 s])
    "matd3": ("matd3", "jaderl/simple_spread"),  # 60k steps (~70 s CPU [77 s])
    "maddpg-continuous": ("maddpg", "jaderl/simple_spread?continuous=true"),  # 40k steps (~60 s CPU [75 s])
}


@pytest.mark.slow(seconds=80)
@pytest.mark.parametrize("case", list(SPREAD_CASES))
def test_simple_spread_reaches_target(case: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    algo, env = SPREAD_CASES[case]
    result = jaderl.train(algo, env, seed=0, device="cpu", run_dir=str(tmp_path / case), total_steps=300_000,
                          time_limit=600.0, target_return=SPREAD_TARGET, eval_every=10_000, eval_episodes=100)
    assert result.solved, (f"{case}: best evaluation {result.best_eval_return:.1f} < {SPREAD_TARGET} in "
                           f"{result.steps} steps, {result.time_s:.0f} s")


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


@pytest.mark.slow(seconds=190)
@pytest.mark.parametrize(("algo", "steps"), [("maddpg", 50_000), ("matd3", 100_000)])
def test_simple_tag_trained_predators_catch_more(algo: str, steps: int, tmp_path: Path) -> None:
    # measured: maddpg after 50k steps 1.6 catches per episode vs 0.46 for random predators (after 100k: 2.1 vs 0.23,
    # ~150 s CPU); matd3 after 100k steps 2.1 vs 0.31 (~190 s CPU; after 50k only 0.74 vs 0.45: its delayed actor
    # updates learn the chase later)
    torch.set_num_threads(1)
    run_dir = tmp_path / algo
    result = jaderl.train(algo, TAG, seed=0, device="cpu", run_dir=str(run_dir), total_steps=steps,
                          time_limit=600.0, eval_every=steps)
    assert result.steps == steps, f"{algo}: stopped after {result.steps} steps ({result.stop_reason})"
    agent = jaderl.load(run_dir, best=False)  # the last predators and prey, trained against each other
    trained, random = catches_per_episode(agent, False), catches_per_episode(agent, True)
    assert trained >= CATCH_MARGIN * random and trained > 0.5, \
        f"{algo}: trained predators catch {trained:.2f} times per episode, random ones {random:.2f}"
