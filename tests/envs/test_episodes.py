"""Episode statistics of training rollouts: tracked per rollout, batched over time, against a per-step reference."""

from __future__ import annotations

import pytest
import torch

from jaderl.envs.episodes import EpisodeStats


def reference(rollouts: list[tuple[torch.Tensor, torch.Tensor]], num_envs: int, agents: int) -> tuple[list, list]:
    """Step by step and sub-env by sub-env: running returns and lengths, and the sums over finished episodes."""
    running = [[0.0] * (agents + 1) for _ in range(num_envs)]
    finished = [0.0] * (agents + 2)
    for reward, done in rollouts:
        for t in range(done.shape[0]):
            for n in range(num_envs):
                for a in range(agents):
                    running[n][a] += float(reward[t, n, a]) if reward.dim() == 3 else float(reward[t, n])
                running[n][-1] += 1
                if bool(done[t, n]):
                    finished[0] += 1
                    finished[1:] = [f + r for f, r in zip(finished[1:], running[n], strict=True)]
                    running[n] = [0.0] * (agents + 1)
    return running, finished


@pytest.mark.parametrize("agents", [1, 3])
def test_rollout_tracking_matches_a_per_step_reference(agents: int) -> None:
    num_envs, gen = 6, torch.Generator().manual_seed(0)
    stats = EpisodeStats(num_envs, agents, torch.device("cpu"))
    rollouts = []
    for steps, p_done in [(1, 0.5), (17, 0.1), (9, 0.0), (30, 0.3), (1, 1.0)]:  # single steps, none or all ending
        shape = (steps, num_envs, agents) if agents > 1 else (steps, num_envs)
        reward, done = torch.randn(*shape, generator=gen), torch.rand(steps, num_envs, generator=gen) < p_done
        rollouts.append((reward, done))
        stats.track(reward, done)
    running, finished = reference(rollouts, num_envs, agents)
    torch.testing.assert_close(stats.running, torch.tensor(running))
    torch.testing.assert_close(stats.finished, torch.tensor(finished))
    assert stats.new_episode().tolist() == [r[-1] == 0 for r in running]


def test_new_episode_during_an_explore_reads_the_last_step() -> None:
    stats = EpisodeStats(3, 1, torch.device("cpu"))
    assert stats.new_episode().all()  # before the first step
    stats.track(torch.ones(2, 3), torch.tensor([[False, True, False], [False, False, False]]))
    assert stats.new_episode().tolist() == [False, False, False]
    stats.last_step = torch.tensor([True, False, False]), torch.tensor([False, False, True])  # a step not tracked yet
    assert stats.new_episode().tolist() == [True, False, True]
    stats.track(torch.ones(1, 3), torch.tensor([[True, False, True]]))
    assert stats.last_step is None and stats.new_episode().tolist() == [True, False, True]
