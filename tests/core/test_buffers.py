"""Tests of jaderl.core.buffers: the circular (T, N, ...) replay buffer and GAE against a plain reference loop."""

from __future__ import annotations

import pytest
import torch

from jaderl.core.buffers import ReplayBuffer, RolloutBuffer, gae

N = 3


def _traj(start: int, horizon: int, num_envs: int = N) -> dict[str, torch.Tensor]:
    """A trajectory whose every entry encodes its global time step t and sub-env n as 100 * t + n."""
    t = torch.arange(start, start + horizon).view(-1, 1)
    n = torch.arange(num_envs).view(1, -1)
    ident = (100 * t + n).float()  # (H, N)
    return {"obs": torch.stack([ident, -ident], -1), "reward": ident, "action": (100 * t + n),
            "terminated": (t + n) % 2 == 0}


def test_capacity_counts_transitions() -> None:
    assert ReplayBuffer(10, N, "cpu").rows == 4  # ceil(10 / 3)
    assert ReplayBuffer(12, N, "cpu").rows == 4
    assert ReplayBuffer(1, N, "cpu").rows == 1


def test_add_keeps_shapes_and_dtypes() -> None:
    buf = ReplayBuffer(8 * N, N, "cpu")
    buf.add(_traj(0, 3))
    assert buf.data["obs"].shape == (8, N, 2) and buf.data["reward"].shape == (8, N)
    assert buf.data["action"].dtype == torch.int64 and buf.data["terminated"].dtype == torch.bool
    assert len(buf) == 3 * N and buf.size == 3 and buf.ptr == 3


def test_wrap_around_keeps_the_newest_rows() -> None:
    buf = ReplayBuffer(5 * N, N, "cpu")
    step = 0
    for horizon in (2, 2, 2, 3, 1, 4):  # crosses the end several times, once with horizon == rows - 1
        buf.add(_traj(step, horizon))
        step += horizon
        assert buf.ptr == step % 5 and buf.size == min(step, 5) and len(buf) == min(step, 5) * N
    for row in range(5):
        t = max(s for s in range(step) if s % 5 == row)  # the newest step stored in this row
        assert torch.equal(buf.data["reward"][row], (100 * t + torch.arange(N)).float())
        assert torch.equal(buf.data["obs"][row, :, 1], -(100 * t + torch.arange(N)).float())


def test_horizon_longer_than_capacity() -> None:
    buf = ReplayBuffer(4 * N, N, "cpu")
    buf.add(_traj(0, 3))
    buf.add(_traj(3, 10))  # only the last 4 of these fit
    stored = sorted(int(r) // 100 for r in buf.data["reward"][:, 0])
    assert stored == [9, 10, 11, 12] and buf.size == 4


def test_sampling_covers_filled_rows_only() -> None:
    torch.manual_seed(0)
    buf = ReplayBuffer(10 * N, N, "cpu")
    buf.add(_traj(0, 4))  # rows 0..3 filled, 4..9 zero
    batch = buf.sample(3000)
    assert batch["obs"].shape == (3000, 2) and batch["reward"].shape == (3000,)
    assert batch["action"].dtype == torch.int64
    seen = set(batch["action"].tolist())
    assert seen == {100 * t + n for t in range(4) for n in range(N)}
    # every field of a sampled transition comes from the same (t, n)
    assert torch.equal(batch["reward"], batch["action"].float())
    assert torch.equal(batch["obs"][:, 0], batch["reward"])
    t, n = batch["action"] // 100, batch["action"] % 100
    assert torch.equal(batch["terminated"], (t + n) % 2 == 0)


def test_sampling_after_wrap_covers_everything() -> None:
    torch.manual_seed(1)
    buf = ReplayBuffer(3 * N, N, "cpu")
    buf.add(_traj(0, 2))
    buf.add(_traj(2, 2))  # steps 1, 2, 3 are stored; step 0 was overwritten
    seen = set(buf.sample(2000)["action"].tolist())
    assert seen == {100 * t + n for t in (1, 2, 3) for n in range(N)}


def test_state_dict_round_trip() -> None:
    buf = ReplayBuffer(6 * N, N, "cpu")
    for i in range(3):
        buf.add(_traj(4 * i, 4))  # wrapped: size 6, ptr 0
    tensors, meta = buf.state_dict()
    assert meta == {"ptr": buf.ptr, "size": buf.size}
    other = ReplayBuffer(6 * N, N, "cpu")
    other.load_state_dict({k: v.clone() for k, v in tensors.items()}, dict(meta))
    assert (other.ptr, other.size, len(other)) == (buf.ptr, buf.size, len(buf))
    for key in buf.data:
        assert torch.equal(other.data[key], buf.data[key])
    # both continue identically
    buf.add(_traj(100, 2))
    other.add(_traj(100, 2))
    for key in buf.data:
        assert torch.equal(other.data[key], buf.data[key])


def test_state_dict_of_partly_filled_buffer() -> None:
    buf = ReplayBuffer(6 * N, N, "cpu")
    buf.add(_traj(0, 2))
    tensors, meta = buf.state_dict()
    assert tensors["reward"].shape == (2, N)
    other = ReplayBuffer(6 * N, N, "cpu")
    other.load_state_dict(tensors, meta)
    assert other.data["reward"].shape == (6, N) and (other.ptr, other.size) == (2, 2)
    assert torch.equal(other.data["reward"][:2], buf.data["reward"][:2])
    empty = ReplayBuffer(6 * N, N, "cpu")
    empty.load_state_dict(*ReplayBuffer(6 * N, N, "cpu").state_dict())
    assert len(empty) == 0


def _reference_gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor,
                   truncated: torch.Tensor, gamma: float, lam: float) -> tuple[list[list[float]], list[list[float]]]:
    """GAE written out per sub-env and per step with Python floats."""
    horizon, num_envs = reward.shape
    adv = [[0.0] * num_envs for _ in range(horizon)]
    for n in range(num_envs):
        running = 0.0
        for t in reversed(range(horizon)):
            r, v, nv = float(reward[t, n]), float(value[t, n]), float(next_value[t, n])
            term, trunc = bool(terminated[t, n]), bool(truncated[t, n])
            bootstrap = 0.0 if term else gamma * nv  # a truncated step still bootstraps from its final state
            delta = r + bootstrap - v
            if term or trunc:
                running = 0.0  # the episode ends here: nothing from the next episode leaks back
            running = delta + gamma * lam * running
            adv[t][n] = running
    targets = [[adv[t][n] + float(value[t, n]) for n in range(num_envs)] for t in range(horizon)]
    return adv, targets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    horizon, num_envs, gamma, lam = 17, 5, 0.97, 0.9
    reward = torch.randn(horizon, num_envs, generator=g, dtype=torch.float64)
    value = torch.randn(horizon, num_envs, generator=g, dtype=torch.float64)
    next_value = torch.randn(horizon, num_envs, generator=g, dtype=torch.float64)
    terminated = torch.rand(horizon, num_envs, generator=g) < 0.15
    truncated = torch.rand(horizon, num_envs, generator=g) < 0.15
    assert terminated.any() and truncated.any() and (terminated & ~truncated).any()
    adv, target = gae(reward, value, next_value, terminated, truncated, gamma, lam)
    ref_adv, ref_target = _reference_gae(reward, value, next_value, terminated, truncated, gamma, lam)
    assert adv.shape == (horizon, num_envs)
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(target, torch.tensor(ref_target, dtype=torch.float64), rtol=1e-10, atol=1e-10)


def test_gae_truncation_bootstraps_and_termination_does_not() -> None:
    reward = torch.tensor([[1.0], [1.0]])
    value = torch.tensor([[0.5], [0.5]])
    next_value = torch.tensor([[2.0], [10.0]])
    no = torch.zeros(2, 1, dtype=torch.bool)
    end = torch.tensor([[False], [True]])
    adv_trunc, _ = gae(reward, value, next_value, no, end, gamma=0.5, lam=1.0)
    adv_term, _ = gae(reward, value, next_value, end, no, gamma=0.5, lam=1.0)
    assert adv_trunc[1, 0].item() == pytest.approx(1.0 + 0.5 * 10.0 - 0.5)
    assert adv_term[1, 0].item() == pytest.approx(1.0 - 0.5)
    # step 0 does not end: it bootstraps from next_value[0] and accumulates step 1's advantage
    assert adv_trunc[0, 0].item() == pytest.approx(1.0 + 0.5 * 2.0 - 0.5 + 0.5 * adv_trunc[1, 0].item())


def test_rollout_buffer() -> None:
    buf = RolloutBuffer()
    reward = torch.ones(4, 2)
    buf.add({"reward": reward, "terminated": torch.zeros(4, 2, dtype=torch.bool),
             "truncated": torch.zeros(4, 2, dtype=torch.bool), "obs": torch.zeros(4, 2, 3)})
    buf.compute_gae(torch.zeros(4, 2), torch.zeros(4, 2), gamma=1.0, lam=1.0)
    torch.testing.assert_close(buf.data["advantage"][:, 0], torch.tensor([4.0, 3.0, 2.0, 1.0]))
    flat = buf.flat()
    assert flat["obs"].shape == (8, 3) and flat["advantage"].shape == (8,)
    assert buf.state_dict() == ({}, {})


def test_state_dict_loads_into_a_used_buffer() -> None:
    buf = ReplayBuffer(6 * N, N, "cpu")
    buf.add(_traj(0, 4))
    used = ReplayBuffer(6 * N, N, "cpu")
    used.add(_traj(50, 3))  # ptr 3: the loaded rows must still land at [0, size)
    used.load_state_dict(*buf.state_dict())
    assert (used.ptr, used.size) == (buf.ptr, buf.size)
    for key in buf.data:
        assert torch.equal(used.data[key][:4], buf.data[key][:4])
