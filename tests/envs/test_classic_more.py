"""Tests of the torch-native Acrobot-v1, MountainCar-v0 and MountainCarContinuous-v0 (jaderl.envs.classic):
step-for-step equivalence with Gymnasium 1.4 (float64), auto-reset, seeding, shapes, registry."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch

from jaderl.envs import TORCH_ENVS, make_env
from jaderl.envs.classic import AcrobotEnv, CartPoleEnv, MountainCarContinuousEnv, MountainCarEnv, PendulumEnv
from jaderl.envs.vec import EnvError, VecEnv

N_SYNC = 8  # sub-envs compared with Gymnasium
SYNC_STEPS = 500
TOL = 1e-6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CLASSES = [AcrobotEnv, MountainCarEnv, MountainCarContinuousEnv]
EnvCls = type[AcrobotEnv] | type[MountainCarEnv] | type[MountainCarContinuousEnv]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _make_gym(env_id: str, n: int, seed: int) -> list[gym.Env]:
    envs = [gym.make(env_id) for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
        assert isinstance(env, gym.wrappers.TimeLimit)  # outermost wrapper: holds _elapsed_steps
    return envs


def _gym_state(envs: list[gym.Env]) -> torch.Tensor:
    return torch.as_tensor(np.stack([np.asarray(env.unwrapped.state, dtype=np.float64) for env in envs]))


def _run_against_gymnasium(
    torch_env: VecEnv,
    gym_envs: list[gym.Env],
    draw_action: Callable[[np.ndarray], np.ndarray],
    to_gym: Callable[[np.ndarray], object],
    resync_every: int = 0,
) -> tuple[int, int]:
    """Step both sides SYNC_STEPS times with the same actions; re-sync finished rows. Returns (#terminated, #trunc).

    ``resync_every > 0`` also copies Gymnasium's state into every row after that many steps (for chaotic dynamics).

    Rewards are compared with Gymnasium's rounded to float32 (the contract's reward dtype: MountainCarContinuous's
    ``100 - 0.1 a^2`` has a float32 spacing of 7.6e-6).
    """
    n_term = n_trunc = 0
    obs = torch_env.set_state(torch_env.state)
    for t in range(SYNC_STEPS):
        action = draw_action(obs.numpy())  # the policy may look at the current observation
        obs, reward, terminated, truncated, info = torch_env.step(torch.from_numpy(action))
        results = [env.step(to_gym(a)) for env, a in zip(gym_envs, action, strict=True)]
        g_obs = np.stack([r[0] for r in results]).astype(np.float64)
        g_reward = np.array([r[1] for r in results], dtype=np.float32).astype(np.float64)
        g_term, g_trunc = np.array([r[2] for r in results]), np.array([r[3] for r in results])

        final_obs = info["final_obs"]
        assert final_obs.shape == obs.shape and final_obs.dtype == torch.float64
        assert np.abs(final_obs.numpy() - g_obs).max() <= TOL, f"step {t}: final_obs differs from Gymnasium's obs"
        assert reward.dtype == torch.float32
        assert np.abs(reward.numpy().astype(np.float64) - g_reward).max() <= TOL, f"step {t}: reward differs"
        np.testing.assert_array_equal(terminated.numpy(), g_term, err_msg=f"step {t}: terminated differs")
        np.testing.assert_array_equal(truncated.numpy(), g_trunc, err_msg=f"step {t}: truncated differs")

        done = g_term | g_trunc
        keep = torch.from_numpy(~done)
        assert torch.equal(obs[keep], final_obs[keep]), "obs must equal final_obs where nothing finished"
        n_term, n_trunc = n_term + int(g_term.sum()), n_trunc + int(g_trunc.sum())
        if done.any():
            # the torch env already auto-reset the finished rows (fresh counter); give them Gymnasium's fresh state
            assert (torch_env.elapsed_steps[torch.from_numpy(done)] == 0).all()
            reset_obs = {}
            for i in np.flatnonzero(done):
                reset_obs[i], _ = gym_envs[i].reset(seed=1000 * t + int(i))
            state = torch_env.state
            state[torch.from_numpy(done)] = _gym_state(gym_envs)[torch.from_numpy(done)]
            obs = torch_env.set_state(state)
            for i, g in reset_obs.items():
                assert np.abs(obs[i].numpy() - g).max() <= TOL
        if resync_every and (t + 1) % resync_every == 0:
            obs = torch_env.set_state(_gym_state(gym_envs))
        counters = np.array([env._elapsed_steps for env in gym_envs])
        np.testing.assert_array_equal(torch_env.elapsed_steps.numpy(), counters, err_msg=f"step {t}: step counters")
    return n_term, n_trunc


def _synced(cls: EnvCls, env_id: str, seed: int, offsets: np.ndarray) -> tuple[VecEnv, list[gym.Env]]:
    gym_envs = _make_gym(env_id, N_SYNC, seed=seed)
    for env, k in zip(gym_envs, offsets, strict=True):
        env._elapsed_steps = int(k)
    torch_env = cls(N_SYNC, dtype=torch.float64, seed=0)
    torch_env.set_state(_gym_state(gym_envs), elapsed_steps=torch.from_numpy(offsets))
    return torch_env, gym_envs


def test_acrobot_matches_gymnasium_step_for_step() -> None:
    # random torques rarely swing the acrobot up: start some sub-envs high (in Gymnasium too) to get terminations,
    # and some close to the 500-step limit to get truncations
    offsets = np.array([0, 0, 0, 0, 100, 300, 450, 499])
    torch_env, gym_envs = _synced(AcrobotEnv, "Acrobot-v1", 10, offsets)
    for env, s in zip(gym_envs[:3], ([2.0, 1.0, 1.0, 2.0], [-2.5, 0.5, -2.0, 4.0], [3.0, -0.2, 0.0, 0.0]), strict=True):
        env.unwrapped.state = np.array(s)
    torch_env.set_state(_gym_state(gym_envs))
    rng = np.random.default_rng(3)
    # The double pendulum is chaotic: torch's sin/cos (SLEEF) and NumPy's differ by one ulp on ~0.2% of the inputs,
    # and over 500 steps (100 s) such a difference can grow to 1e-6 and beyond (1e-15 after 100 steps, 1e-12 after
    # 300, 1e-9 after 400 in the worst of 20 random runs). Every row is therefore re-synced every 200 steps.
    n_term, n_trunc = _run_against_gymnasium(
        torch_env, gym_envs, draw_action=lambda _: rng.integers(0, 3, size=N_SYNC), to_gym=int, resync_every=200
    )
    assert n_term >= 3 and n_trunc >= 4


def test_mountain_car_matches_gymnasium_step_for_step() -> None:
    offsets = np.array([0, 0, 0, 0, 50, 100, 150, 190])
    torch_env, gym_envs = _synced(MountainCarEnv, "MountainCar-v0", 20, offsets)
    # some cars start near the goal or against the left wall, so both ends of the track are compared
    starts = ([0.45, 0.05], [0.49, 0.0], [-1.19, -0.05], [0.3, 0.07])
    for env, s in zip(gym_envs[:4], starts, strict=True):
        env.unwrapped.state = np.array(s)
    torch_env.set_state(_gym_state(gym_envs))
    rng = np.random.default_rng(4)

    def draw(obs: np.ndarray) -> np.ndarray:
        # push with the velocity (reaches the goal often), a random action 30% of the time
        act = np.where(obs[:, 1] >= 0, 2, 0)
        return np.where(rng.random(N_SYNC) < 0.3, rng.integers(0, 3, size=N_SYNC), act)

    n_term, n_trunc = _run_against_gymnasium(torch_env, gym_envs, draw_action=draw, to_gym=int)
    assert n_term >= 8 and n_trunc >= 2


def test_mountain_car_continuous_matches_gymnasium_step_for_step() -> None:
    offsets = np.array([0, 0, 0, 0, 200, 990, 995, 998])
    torch_env, gym_envs = _synced(MountainCarContinuousEnv, "MountainCarContinuous-v0", 30, offsets)
    starts = ([0.40, 0.05], [0.44, 0.0], [-1.19, -0.05], [0.3, 0.07])
    for env, s in zip(gym_envs[:4], starts, strict=True):
        env.unwrapped.state = np.array(s)
    torch_env.set_state(_gym_state(gym_envs))
    rng = np.random.default_rng(5)

    def draw(obs: np.ndarray) -> np.ndarray:
        # push with the velocity, scaled by noise up to 1.25: exercises the clipping and reaches the goal often
        base = np.where(obs[:, 1] >= 0, 1.0, -1.0)
        return (base * rng.uniform(0.0, 1.25, size=N_SYNC)).reshape(N_SYNC, 1)

    # Gymnasium gets the action clipped to [-1, 1], as jaderl's Gymnasium adapter does; float64 on purpose (as for
    # Pendulum: with a float32 action Gymnasium computes the velocity update in float32)
    n_term, n_trunc = _run_against_gymnasium(
        torch_env, gym_envs, draw_action=draw, to_gym=lambda a: np.clip(a, -1.0, 1.0)
    )
    assert n_term >= 8 and n_trunc >= 2


def test_mountain_car_reward_and_wall_details() -> None:
    """Terminal reward and both flags on one step (TimeLimit), the left wall zeroes the velocity, clipping."""
    env = MountainCarContinuousEnv(3, dtype=torch.float64, seed=0)
    env.set_state(torch.tensor([[0.44, 0.02], [-1.19, -0.05], [-0.5, 0.0]], dtype=torch.float64), elapsed_steps=998)
    obs, reward, terminated, truncated, info = env.step(torch.tensor([[2.0], [-1.0], [0.5]], dtype=torch.float64))
    assert terminated.tolist() == [True, False, False] and truncated.tolist() == [True, True, True]
    assert reward.tolist() == pytest.approx([100.0 - 0.1, -0.1, -0.025], abs=1e-5)  # the action 2.0 counts as 1.0
    # against the wall: stopped (the position is Gymnasium's float32 -1.2: its state is stored as float32)
    assert info["final_obs"][1].tolist() == [float(np.float32(-1.2)), 0.0]
    assert (env.elapsed_steps == 0).all() and (obs[:, 0] >= -0.6).all() and (obs[:, 0] <= -0.4).all()
    assert (obs[:, 1] == 0).all()

    car = MountainCarEnv(2, dtype=torch.float64, seed=0)
    car.set_state(torch.tensor([[0.49, 0.02], [-0.5, 0.0]], dtype=torch.float64))
    _, reward, terminated, truncated, info = car.step(torch.tensor([2, 2]))  # push right
    assert terminated.tolist() == [True, False] and not truncated.any() and reward.tolist() == [-1.0, -1.0]
    assert info["final_obs"][1, 1] > 0


def test_acrobot_terminal_reward_and_auto_reset() -> None:
    n = 16
    env = AcrobotEnv(n, dtype=torch.float64, seed=1)
    up = torch.arange(n) < n // 2
    state = env.state
    state[up] = torch.tensor([np.pi, 0.0, 0.0, 0.0], dtype=torch.float64)  # hanging straight up: terminal
    env.set_state(state)
    obs, reward, terminated, truncated, info = env.step(torch.ones(n, dtype=torch.int64))
    assert torch.equal(terminated, up) and not truncated.any()
    assert torch.equal(reward, torch.where(up, 0.0, -1.0).float())
    assert (info["final_obs"][up, 0] < -0.99).all()  # cos th1 ~ -1 at the end of the terminal step
    assert (env.state[up].abs() <= 0.1).all() and torch.equal(env.elapsed_steps, (~up).long())
    assert torch.equal(info["final_obs"][~up], obs[~up])
    th = env.state[:, :2]
    assert torch.allclose(obs[:, :4], torch.stack((th[:, 0].cos(), th[:, 0].sin(), th[:, 1].cos(), th[:, 1].sin()), 1))


def test_acrobot_wraps_angles_and_bounds_velocities() -> None:
    env = AcrobotEnv(2, dtype=torch.float64, seed=0)
    env.set_state(torch.tensor([[3.1, -3.1, 3.0, -30.0], [0.0, 0.0, 100.0, -100.0]], dtype=torch.float64))
    env.step(torch.tensor([1, 1]))
    s = env.state
    assert (s[:, :2].abs() <= np.pi).all()
    assert (s[:, 2].abs() <= 4 * np.pi).all() and (s[:, 3].abs() <= 9 * np.pi).all()


@pytest.mark.parametrize("cls", [PendulumEnv, CartPoleEnv, *CLASSES])
def test_nan_and_out_of_range_actions_are_refused_with_one_sentence(cls: type) -> None:
    """On the CPU a NaN or infinite action, or a discrete one outside 0..action_dim-1, is refused before anything
    moves; a continuous action beyond [-1, 1] is clipped, as the contract says. With ``sync_free`` (the GPU's mode,
    which never reads a value back) nothing is checked."""
    n = 4
    env = cls(n, dtype=torch.float64, seed=0)
    env.reset()
    shape = (n,) if env.is_discrete else (n, 1)
    before, steps = env.state, env.elapsed_steps.clone()
    bad = [torch.zeros(shape).index_fill_(0, torch.tensor([2]), value) for value in (math.nan, math.inf, -math.inf)]
    for action in bad:
        with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite; lower the learning rate"):
            env.step(action)
    if env.is_discrete:
        for value in (-1, env.action_dim):
            action = torch.zeros(n, dtype=torch.int64).index_fill_(0, torch.tensor([1]), value)
            with pytest.raises(EnvError, match=rf"^{cls.__name__} takes discrete actions 0 to {env.action_dim - 1}, "
                                               rf"got actions from {min(value, 0)} to {max(value, 0)}; "):
                env.step(action)
    assert torch.equal(env.state, before) and torch.equal(env.elapsed_steps, steps)  # nothing moved
    if not env.is_discrete:
        clipped = env.step(torch.full(shape, 5.0, dtype=torch.float64))
        env.set_state(before, elapsed_steps=steps)
        assert all(torch.equal(a, b) for a, b in zip(clipped[:4], env.step(torch.ones(shape, dtype=torch.float64))[:4],
                                                     strict=True))
    env.sync_free = True
    env.step(bad[0])  # not checked


@pytest.mark.parametrize("cls", CLASSES)
def test_time_limit_and_seeding(cls: EnvCls) -> None:
    n = 16
    env = cls(n, seed=3)
    steps = torch.where(torch.arange(n) % 2 == 1, env.max_steps - 5, 0)
    env.set_state(env.state, elapsed_steps=steps)
    idle = torch.ones(n, dtype=torch.int64) if env.is_discrete else torch.zeros(n, 1)  # no torque / no push
    truncated_at = []
    for t in range(1, 7):
        _, _, terminated, truncated, _ = env.step(idle)
        assert not terminated.any()  # nobody reaches a goal in a few idle steps
        if truncated.any():
            truncated_at.append((t, truncated.nonzero().flatten().tolist()))
    assert truncated_at == [(5, list(range(1, n, 2)))]

    def rollout(seed: int, via_reset: bool) -> torch.Tensor:
        e = cls(n) if via_reset else cls(n, seed=seed)
        out = [e.reset(seed=seed) if via_reset else e.reset()]
        gen = torch.Generator().manual_seed(1)
        for _ in range(30):
            a = torch.randint(0, 3, (n,), generator=gen) if e.is_discrete else torch.rand(n, 1, generator=gen) * 2 - 1
            obs, _, _, _, info = e.step(a)
            out += [obs, info["final_obs"]]
        return torch.stack(out)

    a = rollout(7, via_reset=False)
    assert torch.equal(a, rollout(7, via_reset=True)) and not torch.equal(a, rollout(8, via_reset=False))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls", CLASSES)
def test_batch_shapes_dtypes_devices(cls: EnvCls, dtype: torch.dtype, device: str) -> None:
    n = 4096
    env = cls(n, device=device, dtype=dtype, seed=0)
    expected = {AcrobotEnv: ((6,), True, 3, 500), MountainCarEnv: ((2,), True, 3, 200)}
    expected[MountainCarContinuousEnv] = ((2,), False, 1, 999)
    assert (env.obs_shape, env.is_discrete, env.action_dim, env.max_steps) == expected[cls]
    assert isinstance(env, VecEnv) and env.num_envs == n and env.device == torch.device(device)
    action = torch.randint(0, 3, (n,), device=device) if env.is_discrete else torch.rand(n, 1, device=device) * 2 - 1
    obs = env.reset()
    assert obs.shape == (n, *env.obs_shape) and obs.dtype == dtype
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.shape == (n, *env.obs_shape) and obs.dtype == dtype and obs.is_contiguous()
        assert reward.shape == (n,) and reward.dtype == torch.float32
        assert terminated.shape == truncated.shape == (n,) and terminated.dtype == truncated.dtype == torch.bool
        assert info["final_obs"].shape == obs.shape and info["final_obs"].dtype == dtype
        for t in (obs, reward, terminated, truncated, info["final_obs"], env.elapsed_steps):
            assert t.device.type == env.device.type
        assert bool(torch.isfinite(obs).all())
    assert (env.elapsed_steps == 3).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls", CLASSES)
def test_step_does_not_synchronize_on_cuda(cls: EnvCls) -> None:
    env = cls(4096, device="cuda", dtype=torch.float64, seed=0)
    shape = (4096,) if env.is_discrete else (4096, 1)
    action = torch.ones(shape, dtype=torch.int64 if env.is_discrete else torch.float32, device="cuda")
    env.step(action)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_registry_and_make_env() -> None:
    for name, cls in [
        ("jaderl/Acrobot-v1", AcrobotEnv),
        ("jaderl/MountainCar-v0", MountainCarEnv),
        ("jaderl/MountainCarContinuous-v0", MountainCarContinuousEnv),
    ]:
        assert TORCH_ENVS[name] is cls
        env = make_env(name, 4, seed=0)
        assert type(env) is cls and env.num_envs == 4 and env.reset().shape == (4, *env.obs_shape)
    assert {"jaderl/Pendulum-v1", "jaderl/CartPole-v1"} <= set(TORCH_ENVS)
    with pytest.raises(EnvError):
        AcrobotEnv(2).set_state(torch.zeros(2, 3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("env_id", ["jaderl/CartPole-v1", "jaderl/simple_spread", "CartPole-v1"])
def test_cuda_without_cuda_is_one_sentence(env_id: str) -> None:
    with pytest.raises(EnvError, match="CUDA is not available"):
        make_env(env_id, 2, "cuda")


@pytest.mark.parametrize("workers", [0, 1])
def test_options_on_a_gymnasium_id_are_refused_in_one_sentence(workers: int) -> None:
    with pytest.raises(EnvError, match=r"^Gymnasium ids take no \?options \('CartPole-v1\?sutton_barto_reward=true'\)"):
        make_env("CartPole-v1?sutton_barto_reward=true", 2, workers=workers)


@pytest.mark.parametrize("cls", [PendulumEnv, CartPoleEnv, *CLASSES])
def test_lists_and_numpy_actions_are_read_and_non_integral_discrete_ones_refused(cls: type) -> None:
    """A list or NumPy array of actions steps as the same tensor would; a float discrete action that is not a whole
    number (0.7) is refused in one sentence before anything moves (not truncated), a float one that is (1.0) is
    taken; what is not numbers is refused in one sentence naming what the env takes."""
    n = 2
    env = cls(n, dtype=torch.float64, seed=0)
    env.reset()
    before, steps = env.state, env.elapsed_steps.clone()
    values = [0, 1] if env.is_discrete else [[0.5], [-0.25]]
    want = env.step(torch.tensor(values))
    for action in (values, np.array(values), tuple(values)):
        env.set_state(before, elapsed_steps=steps)
        got = env.step(action)
        assert all(torch.equal(a, b) for a, b in zip(got[:4], want[:4], strict=True)), action
    if env.is_discrete:
        env.set_state(before, elapsed_steps=steps)
        assert all(torch.equal(a, b) for a, b in zip(env.step(torch.tensor([0.0, 1.0]))[:4], want[:4], strict=True))
        env.set_state(before, elapsed_steps=steps)
        for action in (torch.tensor([0.7, 1.5]), [0.7, 1.0], np.array([1.0, 0.5])):
            with pytest.raises(EnvError, match=rf"^{cls.__name__} takes discrete actions as whole numbers, got "
                                               r"0\.[57]; pass integer actions \(an int64 tensor"):
                env.step(action)
        assert torch.equal(env.state, before) and torch.equal(env.elapsed_steps, steps)  # nothing moved
    for junk in (["left", "right"], [[0], [1, 0]], None, [1j, 2j], np.array(["a", "b"])):
        with pytest.raises(EnvError, match=rf"^{cls.__name__} cannot read actions from a \w+ \([^)]*\)+; pass a "
                                           r"torch\.Tensor, or a NumPy array or list of real numbers$"):
            env.step(junk)
