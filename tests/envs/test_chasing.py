"""Tests of jaderl.envs.chasing: shapes, dynamics and reward, masked resets, catching, truncation, seeding, scale."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from action_checks import check_list_actions, check_refused_actions
from torch.utils._python_dispatch import TorchDispatchMode

from jaderl.envs import TORCH_ENVS, make_env
from jaderl.envs.chasing import ChasingEnv
from jaderl.envs.vec import EnvError, VecEnv

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _state(p0: list[float], v0: list[float], p1: list[float], v1: list[float]) -> list[float]:
    return [*p0, *v0, *p1, *v1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [2, 3])
def test_shapes_layout_and_initial_state(dim: int, device: str) -> None:
    n = 4096
    env = ChasingEnv(n, device=device, seed=0, dim=dim)
    assert isinstance(env, VecEnv)
    assert env.obs_shape == (4 * dim,) and not env.is_discrete and env.action_dim == dim and env.max_steps == 1024
    obs = env.reset()
    assert obs.shape == (n, 4 * dim) and obs.dtype == torch.float32 and obs.device.type == env.device.type
    assert torch.equal(obs, env.state)
    p0, v0, p1, v1 = obs.view(n, 4, dim).unbind(1)
    assert (v0 == 0).all() and (v1 == 0).all()
    assert abs(p0.mean().item()) < 0.1 and abs(p0.std().item() - 1) < 0.1
    assert abs(p1.mean().item() + 8.0) < 0.1 and abs(p1.std().item() - 1) < 0.1
    action = torch.rand(n, dim, device=device) * 2 - 1
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.shape == (n, 4 * dim) and obs.is_contiguous() and info["final_obs"].shape == obs.shape
        assert reward.shape == terminated.shape == truncated.shape == (n,)
        assert reward.dtype == torch.float32 and terminated.dtype == truncated.dtype == torch.bool
        for t in (obs, reward, terminated, truncated, info["final_obs"]):
            assert t.device.type == env.device.type
    assert (env.elapsed_steps == 3).all()


def test_dynamics_and_reward_follow_the_formulas() -> None:
    n, dim = 64, 2
    env = ChasingEnv(n, dtype=torch.float64, seed=1, dim=dim)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        before = env.state.view(n, 4, dim)
        action = torch.rand(n, dim, generator=gen, dtype=torch.float64) * 3 - 1.5  # beyond [-1, 1] at times
        probe = env.generator.get_state()
        obs, reward, terminated, _, _ = env.step(action)
        assert not terminated.any()
        # replay the target's random acceleration from the same generator state
        u = torch.rand(dim, n, dtype=torch.float64, generator=torch.Generator().set_state(probe)).T
        u = u / u.norm(dim=1, keepdim=True).clamp_min(1.0)
        a = action.clamp(-1, 1)
        a_norm = a.norm(dim=1)
        a = a / a_norm.clamp_min(1.0).unsqueeze(1)
        v0 = 0.5 * before[:, 1] + u
        v1 = 0.75 * before[:, 3] + a
        p0 = before[:, 0] + 0.01 * v0
        p1 = before[:, 2] + 0.01 * v1
        expected = torch.stack((p0, v0, p1, v1), dim=1).reshape(n, 4 * dim)
        assert torch.allclose(obs, expected, atol=1e-12)
        d_before = (before[:, 0] - before[:, 2]).norm(dim=1)
        d_after = (p0 - p1).norm(dim=1)
        assert torch.allclose(reward.double(), d_before - d_after - 0.02 * a_norm, atol=1e-6)
        assert (v1.norm(dim=1) <= 4.0 + 1e-9).all()  # |v1| <= 1 / (1 - 0.75)


def test_catching_terminates_with_bonus_and_resets_only_those_rows() -> None:
    n, dim = 32, 2
    env = ChasingEnv(n, dtype=torch.float64, seed=2, dim=dim)
    close = torch.arange(n) % 3 == 0
    state = env.state
    state[close] = torch.tensor(_state([0.0, 0.0], [0.0, 0.0], [-1.005, 0.0], [0.0, 0.0]), dtype=torch.float64)
    env.set_state(state, elapsed_steps=7)
    before = env.state
    # the agent, at rest 1.005 behind the target, pushes towards it at full power: it moves 0.01 along x, the target
    # 0.01 u (u its random acceleration, replayed here), so about half of the close rows catch it
    action = torch.tensor([[1.0, 0.0]], dtype=torch.float64).expand(n, dim)
    probe = env.generator.get_state()
    obs, reward, terminated, truncated, info = env.step(action)
    u = torch.rand(dim, n, dtype=torch.float64, generator=torch.Generator().set_state(probe)).T
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1.0)
    gap = 1.005 + 0.01 * u[:, 0] - 0.01  # new x distance of the close rows
    caught_expected = close & (torch.sqrt(gap**2 + (0.01 * u[:, 1]) ** 2) < 1.0)
    assert 0 < caught_expected.sum() < close.sum()
    assert torch.equal(terminated, caught_expected) and not truncated.any()
    assert (reward[terminated] > 7.0).all() and (reward[~terminated] < 1.0).all()
    # caught rows: final_obs shows the catch, obs/state is a fresh episode; other rows: untouched continuation
    fin = info["final_obs"].view(n, 4, dim)
    assert ((fin[terminated, 0] - fin[terminated, 2]).norm(dim=1) < 1.0).all()
    fresh = obs.view(n, 4, dim)[terminated]
    assert (fresh[:, 1] == 0).all() and (fresh[:, 3] == 0).all() and (fresh[:, 2].mean() < -4)
    assert torch.equal(env.elapsed_steps, torch.where(terminated, 0, 8))
    assert torch.equal(obs[~terminated], info["final_obs"][~terminated])
    assert not torch.equal(obs[~terminated], before[~terminated])
    # the next reward of a fresh episode starts from its own distance (no jump of -8 or more)
    _, reward, *_ = env.step(torch.zeros(n, dim, dtype=torch.float64))
    assert (reward[terminated].abs() < 0.1).all()


def test_truncation_at_max_steps_and_both_flags() -> None:
    n, dim = 8, 2
    env = ChasingEnv(n, seed=3, dim=dim, max_steps=5)
    for t in range(1, 11):
        _, _, terminated, truncated, _ = env.step(torch.zeros(n, dim))
        assert not terminated.any()
        assert truncated.all() == (t % 5 == 0) and (truncated.any() == truncated.all())
    env = ChasingEnv(1, dtype=torch.float64, seed=3, dim=dim, max_steps=5)
    env.set_state(torch.tensor([_state([0.0, 0.0], [0.0, 0.0], [0.5, 0.0], [0.0, 0.0])]), elapsed_steps=4)
    _, reward, terminated, truncated, _ = env.step(torch.zeros(1, dim))
    assert terminated.tolist() == [True] and truncated.tolist() == [True] and reward.item() > 7.0


def test_same_seed_same_rollout() -> None:
    n, dim, steps = 16, 2, 40

    def rollout(seed: int, via_reset: bool) -> torch.Tensor:
        env = ChasingEnv(n, dim=dim, max_steps=15) if via_reset else ChasingEnv(n, seed=seed, dim=dim, max_steps=15)
        out = [env.reset(seed=seed) if via_reset else env.reset()]
        gen = torch.Generator().manual_seed(9)
        for _ in range(steps):
            obs, _, _, _, info = env.step(torch.rand(n, dim, generator=gen) * 2 - 1)
            out += [obs, info["final_obs"]]
        return torch.stack(out)

    a = rollout(5, via_reset=False)
    assert torch.equal(a, rollout(5, via_reset=False)) and torch.equal(a, rollout(5, via_reset=True))
    assert not torch.equal(a, rollout(6, via_reset=False))


class _OpCounter(TorchDispatchMode):
    """Counts the tensor operations dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_many_envs_step_without_a_python_loop() -> None:
    """No per-env Python loop: a step dispatches as many tensor ops for 65,536 envs as for 4 (a loop's count would
    grow with the number of envs). How fast it runs is benchmarks/' business, not a unit test's."""
    def step_ops(n: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        env = ChasingEnv(n, seed=0, max_steps=3)  # truncation every 3 steps: the masked reset runs on every row
        action = torch.rand(n, 2, generator=torch.Generator().manual_seed(0)) * 2 - 1
        env.step(action)
        counter = _OpCounter()
        with counter:
            for _ in range(12):
                obs, _, _, truncated, _ = env.step(action)
        return counter.ops, obs, truncated

    n = 65_536
    ops, obs, truncated = step_ops(n)
    assert obs.shape == (n, 8) and bool(torch.isfinite(obs).all()) and truncated.sum() in (0, n)
    few_ops, _, _ = step_ops(4)
    assert ops > 0 and ops == few_ops, f"12 steps dispatched {ops} ops for {n} envs but {few_ops} for 4"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_does_not_synchronize_on_cuda() -> None:
    env = ChasingEnv(4096, device="cuda", seed=0, max_steps=2)
    action = torch.zeros(4096, 2, device="cuda")
    env.step(action)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_nan_actions_are_refused_before_anything_moves() -> None:
    env = ChasingEnv(3, seed=0)
    before, state = env.generator.get_state(), env.state
    actions = [torch.zeros(3, 2).index_put_((torch.tensor(1), torch.tensor(0)), torch.tensor(value))
               for value in (math.nan, math.inf)]
    for action in actions:
        with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite; lower the learning rate"):
            env.step(action)
    assert torch.equal(env.state, state) and torch.equal(env.generator.get_state(), before)
    assert (env.elapsed_steps == 0).all()
    env.sync_free = True  # the GPU's mode reads nothing back, so it does not check
    obs, *_ = env.step(actions[0])
    assert obs[1].isnan().any()



def test_lists_and_numpy_actions_step_as_the_same_tensor() -> None:
    """A list, tuple or NumPy array of actions steps as the same tensor would; what is not numbers is refused in one
    sentence naming what the env takes, before anything moves."""
    env = ChasingEnv(2, dtype=torch.float64, seed=0)
    env.reset()
    before = {k: v.clone() for k, v in env.state_dict().items()}
    check_list_actions(env, [[0.5, -0.25], [1.0, 0.75]], lambda: env.load_state_dict(before))
    env.load_state_dict(before)
    check_refused_actions(env, name="ChasingEnv", junk=(["left", "right"], [[0.5], [0.5, 0.5]], None, [1j, 2j]))
    after = env.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing moved

def test_registry_validation_and_make_env() -> None:
    assert TORCH_ENVS["jaderl/Chasing-v0"] is ChasingEnv
    env = make_env("jaderl/Chasing-v0", 4, seed=0)
    assert type(env) is ChasingEnv and env.reset().shape == (4, 8)
    with pytest.raises(EnvError):
        env.step(torch.zeros(4))
    with pytest.raises(EnvError):
        ChasingEnv(2, dim=0)
    with pytest.raises(EnvError):
        env.set_state(torch.zeros(4, 6))
