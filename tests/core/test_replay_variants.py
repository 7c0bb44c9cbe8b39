"""Prioritized replay (sum tree on the device) and n-step sampling, checked against plain reference code."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import jaderl
from jaderl.algos import DQN
from jaderl.algos.per import PrioritizedReplayBuffer
from jaderl.api import make_config
from jaderl.core.buffers import ReplayBuffer
from jaderl.envs import make_env


def _traj(horizon: int, num_envs: int, start: int = 0, done_prob: float = 0.0, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    steps = torch.arange(start, start + horizon, dtype=torch.float32)[:, None].expand(horizon, num_envs)
    env_ids = torch.arange(num_envs, dtype=torch.float32)[None].expand(horizon, num_envs)
    ended = torch.rand(horizon, num_envs, generator=g) < done_prob
    terminated = ended & (torch.rand(horizon, num_envs, generator=g) < 0.5)
    return {"obs": torch.stack([steps, env_ids], -1), "next_obs": torch.stack([steps + 0.5, env_ids], -1),
            "reward": torch.randn(horizon, num_envs, generator=g), "terminated": terminated,
            "truncated": ended & ~terminated, "action": torch.zeros(horizon, num_envs, dtype=torch.long)}


def test_sum_tree_total_and_new_items_at_max_priority() -> None:
    buf = PrioritizedReplayBuffer(capacity=24, num_envs=3, device="cpu", alpha=0.7)
    buf.add(_traj(5, 3))
    leaves = buf.tree[buf.leaves:buf.leaves + 15]
    assert torch.allclose(leaves, torch.ones(15, dtype=torch.float64))  # max priority starts at 1
    idx = torch.tensor([0, 4, 4, 9])  # duplicates in one update are allowed
    buf.update_priorities(idx, torch.tensor([2.0, -3.0, -3.0, 0.5]))
    assert buf.max_priority.item() == pytest.approx(3.0 + buf.eps)
    buf.add(_traj(2, 3, start=5))  # new rows 5 and 6 -> flat 15..20 at the max priority so far
    new = buf.tree[buf.leaves + 15:buf.leaves + 21]
    assert torch.allclose(new, torch.full((6,), (3.0 + buf.eps) ** 0.7, dtype=torch.float64))
    assert buf.tree[1].item() == pytest.approx(buf.tree[buf.leaves:].sum().item())
    for level_start in (buf.leaves // 2, buf.leaves // 4):  # every inner node is the sum of its children
        nodes = torch.arange(level_start, 2 * level_start)
        assert torch.allclose(buf.tree[nodes], buf.tree[2 * nodes] + buf.tree[2 * nodes + 1])


@pytest.mark.parametrize("span_levels", [0, 2, 8])  # 16 leaves: searches over 16 x 1, 4 x 4 and 1 x 16
def test_sampling_frequencies_follow_priorities_to_the_alpha(span_levels: int) -> None:
    torch.manual_seed(0)
    alpha, n = 0.6, 12
    buf = PrioritizedReplayBuffer(capacity=n, num_envs=2, device="cpu", alpha=alpha)
    buf.span_levels = span_levels
    buf.add(_traj(6, 2))
    td = torch.linspace(0.1, 4.0, n)
    buf.update_priorities(torch.arange(n), td)
    draws = torch.cat([buf.sample(512)["index"] for _ in range(400)])  # 204,800 draws
    freq = torch.bincount(draws, minlength=n).double() / draws.numel()
    expected = (td.double() + buf.eps) ** alpha
    expected /= expected.sum()
    # stratified sampling is at least as precise as multinomial: 5 binomial standard deviations
    sigma = (expected * (1 - expected) / draws.numel()).sqrt()
    assert ((freq - expected).abs() <= 5 * sigma).all(), (freq, expected)


def test_sum_tree_stays_the_sum_of_its_leaves() -> None:
    """Many batched writes (repeated indices, wrap-arounds) keep every inner node equal to the sum of the leaves
    below it, and the leaves equal to the priorities last written."""
    g = torch.Generator().manual_seed(3)
    buf = PrioritizedReplayBuffer(capacity=300, num_envs=3, device="cpu", alpha=0.6)
    expected = torch.zeros(buf.leaves, dtype=torch.float64)
    for k in range(200):
        start = buf.ptr
        buf.add(_traj(5, 3, start=5 * k, seed=k))
        rows = (start + torch.arange(5)) % buf.rows
        expected[(rows[:, None] * 3 + torch.arange(3)).flatten()] = buf.max_priority.item() ** 0.6
        distinct = torch.randperm(len(buf), generator=g)[:24]
        idx = distinct.repeat_interleave(2)  # every index twice, with the same TD error as in a real batch
        td = (torch.rand(len(distinct), generator=g, dtype=torch.float64) * 5).repeat_interleave(2)
        buf.update_priorities(idx, td)
        expected[idx] = (td.abs() + buf.eps) ** 0.6
    assert torch.equal(buf.tree[buf.leaves:], expected)
    level = expected
    for depth in range(buf.depth - 1, -1, -1):  # every level, from the leaves' parents up to the root
        level = level.view(-1, 2).sum(1)
        torch.testing.assert_close(buf.tree[1 << depth:2 << depth], level, rtol=1e-12, atol=1e-9)


def test_importance_weights_match_the_formula() -> None:
    torch.manual_seed(1)
    buf = PrioritizedReplayBuffer(capacity=16, num_envs=2, device="cpu", alpha=0.5)
    buf.add(_traj(8, 2))
    buf.update_priorities(torch.arange(16), torch.rand(16) * 3)
    beta = 0.4
    batch = buf.sample(64, beta=beta)
    priorities = buf.tree[buf.leaves:buf.leaves + 16]
    prob = priorities / priorities.sum()
    raw = (16 * prob[batch["index"]]) ** -beta
    assert torch.allclose(batch["weight"].double(), raw / raw.max(), atol=1e-6)
    assert batch["weight"].max().item() == pytest.approx(1.0)


def test_prioritized_buffer_state_round_trip() -> None:
    buf = PrioritizedReplayBuffer(capacity=10, num_envs=2, device="cpu", alpha=0.6)
    buf.add(_traj(7, 2))
    buf.update_priorities(torch.tensor([1, 3]), torch.tensor([5.0, 0.1]))
    copy = PrioritizedReplayBuffer(capacity=10, num_envs=2, device="cpu", alpha=0.6)
    copy.load_state_dict(*buf.state_dict())
    assert torch.equal(copy.tree, buf.tree) and torch.equal(copy.max_priority, buf.max_priority)
    assert (copy.ptr, copy.size) == (buf.ptr, buf.size)


def _reference_n_step(buf: ReplayBuffer, flat_index: int, n_step: int, gamma: float) -> tuple:
    """Plain Python: walk forward in time for the same sub-env, oldest-to-newest order of the circular buffer."""
    rows, num_envs = buf.rows, buf.num_envs
    t, n = divmod(flat_index, num_envs)
    oldest = (buf.ptr - buf.size) % rows
    order = [(oldest + i) % rows for i in range(buf.size)]  # stored rows, oldest first
    pos = order.index(t)
    total, discount = 0.0, 1.0
    last = t
    for j in range(n_step):
        if pos + j >= len(order):
            break
        row = order[pos + j]
        total += discount * float(buf.data["reward"][row, n])
        discount *= gamma
        last = row
        if bool(buf.data["terminated"][row, n]) or bool(buf.data["truncated"][row, n]):
            break
    return total, discount, buf.data["next_obs"][last, n], bool(buf.data["terminated"][last, n])


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_n_step_returns_match_reference(n_step: int) -> None:
    gamma = 0.9
    buf = ReplayBuffer(capacity=30, num_envs=3, device="cpu")  # 10 rows: the adds below wrap around
    for k, horizon in enumerate((4, 4, 4, 3)):
        buf.add(_traj(horizon, 3, start=10 * k, done_prob=0.25, seed=k))
    idx = torch.arange(buf.size * buf.num_envs)
    batch = buf.gather(idx, n_step, gamma)
    for i in idx.tolist():
        total, discount, next_obs, terminated = _reference_n_step(buf, i, n_step, gamma)
        assert batch["reward"][i].item() == pytest.approx(total, abs=1e-5)
        assert batch["discount"][i].item() == pytest.approx(discount)
        assert torch.equal(batch["next_obs"][i], next_obs)
        assert bool(batch["terminated"][i]) == terminated


def test_double_q_target_matches_reference() -> None:
    torch.manual_seed(0)
    config = make_config("double_dqn", "jaderl/CartPole-v1", hidden=[16], warmup_steps=0, batch_size=8,
                         buffer_size=64, max_grad_norm=0.0)
    env = make_env(config.env, 4, "cpu", seed=0)
    agent = DQN(config, env, torch.device("cpu"))
    with torch.no_grad():  # make the target network differ from the online one
        for p in agent.q_target.parameters():
            p.add_(0.3 * torch.randn_like(p))
    buf = agent.make_buffer()
    buf.add(agent.explore(env, 8))
    batch = buf.sample(8, 1, config.gamma)
    with torch.no_grad():
        next_online = agent.q_net(batch["next_obs"])
        next_target = agent.q_target(batch["next_obs"])
        best = next_online.argmax(-1)
        target = [float(batch["reward"][i]) + config.gamma * (not bool(batch["terminated"][i]))
                  * float(next_target[i, best[i]]) for i in range(8)]
        q = agent.q_net(batch["obs"]).gather(-1, batch["action"][:, None]).squeeze(-1)
        expected = F.smooth_l1_loss(q, torch.tensor(target))
    stats, td_error = agent.update_once(batch)
    assert stats["loss/q"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(td_error, q - torch.tensor(target), atol=1e-5)


@pytest.mark.parametrize(("algo", "env"), [("dqn", "jaderl/CartPole-v1"), ("sac", "jaderl/Pendulum-v1"),
                                           ("noisy_dqn", "jaderl/CartPole-v1")])
def test_prioritized_n_step_training_runs_and_resumes(algo: str, env: str, tmp_path: Path) -> None:
    settings = dict(num_envs=2, hidden=[16, 16], total_steps=400, warmup_steps=100, batch_size=16,
                    buffer_size=300, use_per=True, n_step=3, eval_every=200, checkpoint_every=200, eval_episodes=2,
                    device="cpu")
    result = jaderl.train(algo, env, run_dir=str(tmp_path / "run"), **settings)
    assert result.steps == 400 and math.isfinite(result.best_eval_return)
    agent = jaderl.load(tmp_path / "run", best=False)
    assert agent.config.use_per and agent.config.n_step == 3
    resumed = jaderl.resume(tmp_path / "run", total_steps=600)
    assert resumed.steps == 600


def test_n_step_sums_stop_where_a_resumed_run_restarted_its_envs(tmp_path: Path) -> None:
    """A resumed run whose envs could not be carried over (Gymnasium's) resets them, so the episodes in progress at
    the checkpoint end at the buffer's newest row: their n-step sums must not add the rewards of the new episodes
    appended after the resume."""
    from jaderl.core.checkpoint import load_checkpoint

    gamma, n_step = 0.9, 3
    settings = dict(num_envs=4, hidden=[16], total_steps=160, warmup_steps=1_000, batch_size=16, buffer_size=400,
                    n_step=n_step, gamma=gamma, eval_every=160, checkpoint_every=160, eval_episodes=1,
                    device="cpu")
    jaderl.train("dqn", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), **settings)
    config = make_config("dqn", "jaderl/CartPole-v1", **settings)
    env = make_env(config.env, 4, "cpu", seed=0)
    agent = DQN(config, env.spec, torch.device("cpu"))
    buf = agent.make_buffer()
    state = load_checkpoint(tmp_path / "run")
    agent.load_state_dict(state["agent"])
    buf.load_state_dict(*state["buffer"], cut_episodes=True)  # as a resume with an env it could not copy does
    last = (buf.ptr - 1) % buf.rows
    cut = ~buf.data["terminated"][last]  # sub-envs whose episodes were in progress at the checkpoint
    assert cut.any()
    stored_next_obs = buf.data["next_obs"][last].clone()
    buf.add(agent.explore(env, 2))  # new episodes from reset observations
    assert not torch.equal(buf.data["obs"][(last + 1) % buf.rows][cut], stored_next_obs[cut])
    batch = buf.gather(last * 4 + torch.arange(4), n_step, gamma)
    torch.testing.assert_close(batch["reward"], buf.data["reward"][last])  # CartPole: 1, not 1 + 0.9 + 0.81
    torch.testing.assert_close(batch["discount"], torch.full((4,), gamma))
    assert torch.equal(batch["next_obs"], stored_next_obs)  # the truncated steps bootstrap from their real state
    assert torch.equal(batch["terminated"], buf.data["terminated"][last])
    env.close()
