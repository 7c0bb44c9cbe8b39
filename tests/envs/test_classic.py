"""Tests of jaderl.envs.classic: step-for-step equivalence with Gymnasium (float64), auto-reset, seeding, shapes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch

from jaderl.envs.classic import TORCH_ENVS, CartPoleEnv, PendulumEnv
from jaderl.envs.vec import EnvError, VecEnv

N_SYNC = 8  # sub-envs compared with Gymnasium
SYNC_STEPS = 500
TOL = 1e-6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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
    return torch.as_tensor(np.stack([env.unwrapped.state for env in envs]), dtype=torch.float64)


def _gym_step(envs: list[gym.Env], actions: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    results = [env.step(a) for env, a in zip(envs, actions, strict=True)]
    obs, reward, terminated, truncated, _ = zip(*results, strict=True)
    return np.stack(obs), np.array(reward, dtype=np.float64), np.array(terminated), np.array(truncated)


def _run_against_gymnasium(
    torch_env: PendulumEnv | CartPoleEnv,
    gym_envs: list[gym.Env],
    draw_action: Callable[[], np.ndarray],
    to_gym: Callable[[np.ndarray], object],
) -> tuple[int, int]:
    """Step both sides SYNC_STEPS times with the same actions; re-sync finished rows. Returns (#terminated, #trunc)."""
    n_term = n_trunc = 0
    for t in range(SYNC_STEPS):
        action = draw_action()
        obs, reward, terminated, truncated, info = torch_env.step(torch.from_numpy(action))
        g_obs, g_reward, g_term, g_trunc = _gym_step(gym_envs, [to_gym(a) for a in action])

        final_obs = info["final_obs"]
        assert final_obs.shape == obs.shape and final_obs.dtype == torch.float64
        assert np.abs(final_obs.numpy() - g_obs).max() <= TOL, f"step {t}: final_obs differs from Gymnasium's obs"
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
        counters = np.array([env._elapsed_steps for env in gym_envs])
        np.testing.assert_array_equal(torch_env.elapsed_steps.numpy(), counters, err_msg=f"step {t}: step counters")
    return n_term, n_trunc


def test_pendulum_matches_gymnasium_step_for_step() -> None:
    gym_envs = _make_gym("Pendulum-v1", N_SYNC, seed=0)
    # stagger the time limits so sub-envs truncate on different steps
    offsets = np.arange(N_SYNC) * 25
    for env, k in zip(gym_envs, offsets, strict=True):
        env._elapsed_steps = int(k)
    torch_env = PendulumEnv(N_SYNC, dtype=torch.float64, seed=0)
    torch_env.set_state(_gym_state(gym_envs), elapsed_steps=torch.from_numpy(offsets))
    rng = np.random.default_rng(1)

    # actions beyond [-1, 1] exercise the clipping; Gymnasium gets the torque 2 * a. The torque is float64 on purpose:
    # with a float32 action Gymnasium computes `3.0 * u` and `0.001 * u**2` in float32 (NumPy 2 promotion), and the
    # chaotic dynamics amplify that rounding to ~1e-5 within an episode.
    n_term, n_trunc = _run_against_gymnasium(
        torch_env,
        gym_envs,
        draw_action=lambda: rng.uniform(-1.25, 1.25, size=(N_SYNC, 1)),
        to_gym=lambda a: 2.0 * a,
    )
    assert n_term == 0
    expected = sum(len(range(200 - int(k), SYNC_STEPS + 1, 200)) for k in offsets)
    assert n_trunc == expected


def test_cartpole_matches_gymnasium_step_for_step() -> None:
    gym_envs = _make_gym("CartPole-v1", N_SYNC, seed=100)
    # some sub-envs start close to the 500-step limit so truncation is compared as well
    offsets = np.array([0, 0, 300, 470, 490, 495, 498, 499])
    for env, k in zip(gym_envs, offsets, strict=True):
        env._elapsed_steps = int(k)
    torch_env = CartPoleEnv(N_SYNC, dtype=torch.float64, seed=0)
    torch_env.set_state(_gym_state(gym_envs), elapsed_steps=torch.from_numpy(offsets))
    rng = np.random.default_rng(2)
    n_term, n_trunc = _run_against_gymnasium(
        torch_env,
        gym_envs,
        draw_action=lambda: rng.integers(0, 2, size=N_SYNC),
        to_gym=int,
    )
    assert n_term > 50  # random actions drop the pole often: plenty of resets were compared
    assert n_trunc >= 1


def test_cartpole_terminated_and_truncated_on_the_same_step_like_time_limit() -> None:
    """TimeLimit sets truncated once the counter reaches the limit even when the env terminated on that step."""
    gym_env = _make_gym("CartPole-v1", 1, seed=0)[0]
    edge = np.array([2.39, 1.0, 0.0, 0.0])  # x goes to 2.41 > 2.4 on the next step
    gym_env.unwrapped.state = edge.copy()
    gym_env._elapsed_steps = 499
    g_obs, g_reward, g_term, g_trunc, _ = gym_env.step(1)
    assert g_term and g_trunc and g_reward == 1.0

    env = CartPoleEnv(1, dtype=torch.float64, seed=0)
    env.set_state(torch.as_tensor(edge).unsqueeze(0), elapsed_steps=499)
    obs, reward, terminated, truncated, info = env.step(torch.ones(1, dtype=torch.int64))
    assert terminated.tolist() == [True] and truncated.tolist() == [True] and reward.tolist() == [1.0]
    assert np.abs(info["final_obs"][0].numpy() - g_obs).max() <= TOL
    assert env.elapsed_steps.tolist() == [0] and (obs.abs() <= 0.05).all()


@pytest.mark.parametrize("sync_free", [False, True])
def test_pendulum_truncates_at_exactly_200_and_auto_resets(sync_free: bool) -> None:
    n = 64
    env = PendulumEnv(n, dtype=torch.float64, seed=3)
    env.sync_free = sync_free
    env.reset()
    late = torch.arange(n) % 2 == 1
    env.set_state(env.state, elapsed_steps=torch.where(late, 150, 0))  # odd rows: 50 steps left
    gen = torch.Generator().manual_seed(0)
    for t in range(1, 201):
        before = env.state
        action = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 2 - 1
        obs, _, terminated, truncated, info = env.step(action)
        assert not terminated.any()
        expected = late if t == 50 else (~late if t == 200 else torch.zeros(n, dtype=torch.bool))
        assert torch.equal(truncated, expected), f"step {t}"
        if expected.any():
            state = env.state
            th, thdot = state[:, 0], state[:, 1]
            assert (env.elapsed_steps[expected] == 0).all()
            assert (env.elapsed_steps[~expected] == (150 if t == 200 else t)).all()
            assert (th[expected].abs() <= np.pi).all() and (thdot[expected].abs() <= 1.0).all()
            assert torch.allclose(obs, torch.stack((th.cos(), th.sin(), thdot), dim=1))
            # the fresh state is a new draw, and final_obs is the observation reached before the reset
            assert not torch.equal(state[expected], before[expected])
            assert (info["final_obs"][expected] - obs[expected]).abs().amax(dim=1).gt(0).all()
            assert torch.equal(info["final_obs"][~expected], obs[~expected])
        else:
            assert torch.equal(info["final_obs"], obs)
    assert (env.elapsed_steps == torch.where(late, 150, 0)).all()


@pytest.mark.parametrize("sync_free", [False, True])
def test_cartpole_auto_resets_terminated_sub_envs(sync_free: bool) -> None:
    n = 32
    env = CartPoleEnv(n, dtype=torch.float64, seed=4)
    env.sync_free = sync_free
    falling = torch.arange(n) < n // 2
    state = env.state
    state[falling] = torch.tensor([2.39, 1.0, 0.0, 0.0], dtype=torch.float64)  # leaves the track on the next step
    env.set_state(state)
    obs, reward, terminated, truncated, info = env.step(torch.zeros(n, dtype=torch.int64))
    assert torch.equal(terminated, falling) and not truncated.any()
    assert (reward == 1.0).all() and reward.dtype == torch.float32
    assert (info["final_obs"][falling, 0] > 2.4).all()
    assert (obs[falling].abs() <= 0.05).all() and torch.equal(obs, env.state)
    assert torch.equal(info["final_obs"][~falling], obs[~falling])
    assert torch.equal(env.elapsed_steps, (~falling).long())


@pytest.mark.parametrize("cls", [PendulumEnv, CartPoleEnv])
def test_a_restored_random_stream_is_what_the_next_reset_draws_from(cls: type[PendulumEnv | CartPoleEnv]) -> None:
    """A checkpoint's generator state replaces the constructor's draw, so a resumed run does not repeat its first
    episodes' starts."""
    source = cls(4, seed=1)
    first = source.reset()
    source.reset()  # the stream moves on
    state, expected = source.generator.get_state(), source.reset()
    env = cls(4, seed=1)
    env.set_rng_state(state)
    assert torch.equal(env.reset(), expected) and not torch.equal(expected, first)


def test_a_random_stream_saved_on_another_kind_of_device_reseeds_the_env() -> None:
    """A CUDA generator's state (a seed and an offset, 16 bytes) does not fit a CPU generator (a Mersenne Twister),
    nor the other way round: a run resumed on the other kind of device goes on from a seed derived from the saved
    state, so the same checkpoint still gives the same episodes."""
    foreign = torch.arange(16, dtype=torch.uint8)
    a, b = PendulumEnv(4, seed=1), PendulumEnv(4, seed=2)
    for env in (a, b):
        env.set_rng_state(foreign)
    first = a.reset()
    assert torch.equal(first, b.reset()) and not torch.equal(first, PendulumEnv(4, seed=1).reset())
    c = PendulumEnv(4, seed=1)
    c.set_rng_state(foreign + 1)
    assert not torch.equal(c.reset(), first)
    if torch.cuda.is_available():
        gpu = [PendulumEnv(4, device="cuda", seed=s) for s in (1, 2)]
        for env in gpu:
            env.set_rng_state(PendulumEnv(4, seed=3).generator.get_state())
        assert torch.equal(gpu[0].reset(), gpu[1].reset())


def test_skipping_idle_resets_changes_nothing_before_the_first_reset() -> None:
    """On the CPU a step with no finished sub-env skips the reset work (``sync_free=False``); both modes agree until
    a sub-env resets, and ``obs`` never shares memory with ``info["final_obs"]``."""
    assert PendulumEnv(4).sync_free is False
    n = 8
    envs = [PendulumEnv(n, dtype=torch.float64, seed=2) for _ in range(2)]
    envs[1].sync_free = True
    first = [env.reset() for env in envs]
    assert torch.equal(first[0], first[1])
    gen = torch.Generator().manual_seed(0)
    for t in range(1, 201):
        action = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 2 - 1
        (obs, reward, _, truncated, info), (obs1, reward1, _, truncated1, info1) = (env.step(action) for env in envs)
        assert torch.equal(info["final_obs"], info1["final_obs"]) and torch.equal(reward, reward1), f"step {t}"
        assert torch.equal(truncated, truncated1) and truncated.all() == (t == 200)
        if t < 200:
            assert torch.equal(obs, obs1)
        obs.add_(1.0)  # a caller writing into obs leaves final_obs alone
        assert not torch.equal(obs, info["final_obs"])


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("cls", [PendulumEnv, CartPoleEnv])
def test_same_seed_same_rollout_different_seed_different(cls: type[PendulumEnv | CartPoleEnv], sync_free: bool) -> None:
    n, steps = 16, 210  # past Pendulum's 200-step limit, so auto-resets are covered too

    def rollout(seed: int, via_reset: bool) -> torch.Tensor:
        env = cls(n) if via_reset else cls(n, seed=seed)
        env.sync_free = sync_free
        first = env.reset(seed=seed) if via_reset else env.reset()
        gen = torch.Generator().manual_seed(123)  # the same actions for every rollout
        out = [first]
        for _ in range(steps):
            if env.is_discrete:
                action = torch.randint(0, 2, (n,), generator=gen)
            else:
                action = torch.rand(n, 1, generator=gen) * 2 - 1
            obs, _, _, _, info = env.step(action)
            out += [obs, info["final_obs"]]
        return torch.stack(out)

    a = rollout(7, via_reset=False)
    assert torch.equal(a, rollout(7, via_reset=False))
    assert torch.equal(a, rollout(7, via_reset=True))  # Env(seed=s).reset() == Env().reset(seed=s)
    b = rollout(8, via_reset=False)
    assert not torch.equal(a[0], b[0]) and not torch.equal(a, b)

    env = cls(n, seed=1)
    first = env.reset(seed=5)
    env.step(torch.zeros(n, dtype=torch.int64) if env.is_discrete else torch.zeros(n, 1))
    assert not torch.equal(env.reset(), first)  # reset() without a seed draws new states
    assert torch.equal(env.reset(seed=5), first)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls", [PendulumEnv, CartPoleEnv])
def test_batch_shapes_dtypes_devices(cls: type[PendulumEnv | CartPoleEnv], dtype: torch.dtype, device: str) -> None:
    n = 4096
    env = cls(n, device=device, dtype=dtype, seed=0)
    assert isinstance(env, VecEnv)
    assert env.num_envs == n and env.device == torch.device(device)
    if cls is PendulumEnv:
        assert env.obs_shape == (3,) and not env.is_discrete and env.action_dim == 1 and env.max_steps == 200
        action = torch.rand(n, 1, device=device) * 2 - 1
    else:
        assert env.obs_shape == (4,) and env.is_discrete and env.action_dim == 2 and env.max_steps == 500
        action = torch.randint(0, 2, (n,), device=device)
    obs = env.reset()
    assert obs.shape == (n, *env.obs_shape) and obs.dtype == dtype and obs.device.type == env.device.type
    assert env.state.shape == (n, env.state_dim) and env.state.dtype == dtype
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.shape == (n, *env.obs_shape) and obs.dtype == dtype and obs.is_contiguous()
        assert reward.shape == (n,) and reward.dtype == torch.float32
        assert terminated.shape == (n,) and terminated.dtype == torch.bool
        assert truncated.shape == (n,) and truncated.dtype == torch.bool
        assert info["final_obs"].shape == obs.shape and info["final_obs"].dtype == dtype
        for t in (obs, reward, terminated, truncated, info["final_obs"], env.elapsed_steps):
            assert t.device.type == env.device.type
        assert bool(torch.isfinite(obs).all())
    assert (env.elapsed_steps == 3).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls", [PendulumEnv, CartPoleEnv])
def test_step_does_not_synchronize_on_cuda(cls: type[PendulumEnv | CartPoleEnv]) -> None:
    env = cls(4096, device="cuda", seed=0)
    action = (
        torch.zeros(4096, dtype=torch.int64, device="cuda") if env.is_discrete else torch.zeros(4096, 1, device="cuda")
    )
    env.step(action)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_set_state_validates_shape_and_returns_obs() -> None:
    env = PendulumEnv(3, dtype=torch.float64)
    with pytest.raises(EnvError):
        env.set_state(torch.zeros(3, 3))
    obs = env.set_state(torch.tensor([[0.0, 0.5], [np.pi / 2, 0.0], [np.pi, -1.0]], dtype=torch.float64))
    expected = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.0], [-1.0, 0.0, -1.0]], dtype=torch.float64)
    assert torch.allclose(obs, expected, atol=1e-12)
    with pytest.raises(EnvError):
        CartPoleEnv(2).step(torch.zeros(3, dtype=torch.int64))


def test_registry() -> None:
    assert set(TORCH_ENVS) == {"jaderl/Pendulum-v1", "jaderl/CartPole-v1"}
    assert TORCH_ENVS["jaderl/Pendulum-v1"] is PendulumEnv and TORCH_ENVS["jaderl/CartPole-v1"] is CartPoleEnv
