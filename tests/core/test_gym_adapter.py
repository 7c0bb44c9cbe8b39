"""Tests of the Gymnasium adapter jaderl.envs.vec.GymnasiumVecEnv (ids, env instances, vector envs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from jaderl.envs import make_env
from jaderl.envs.vec import EnvError, GymnasiumVecEnv

SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


class CounterEnv(gym.Env):
    """Observation [t, marker]; terminates when t reaches ``end`` (if given); records every action it receives.

    ``nan_at`` makes the observation (``"obs"``) or the reward (``"reward"``) NaN at step ``nan_step``
    (0 is the reset)."""

    def __init__(self, end: int | None = None, box: bool = False, nan_at: str | None = None, nan_step: int = 1,
                 marker: float = 0.0) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        if box:
            low, high = np.array([-2.0, 0.0, 5.0], np.float32), np.array([2.0, 10.0, 6.0], np.float32)
            self.action_space = gym.spaces.Box(low, high, dtype=np.float32)
        else:
            self.action_space = gym.spaces.Discrete(3)
        self.end, self.nan_at, self.nan_step, self.marker = end, nan_at, nan_step, marker
        self.t, self.actions = 0, []

    def _obs(self) -> np.ndarray:
        value = np.nan if self.nan_at == "obs" and self.t == self.nan_step else float(self.t)
        return np.array([value, self.marker], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.actions.append(np.array(action, copy=True))
        self.t += 1
        reward = np.nan if self.nan_at == "reward" and self.t == self.nan_step else float(self.t)
        return self._obs(), reward, self.end is not None and self.t >= self.end, False, {}


@pytest.fixture
def closing() -> Iterator[list[GymnasiumVecEnv]]:
    """Envs appended to this list are closed after the test."""
    envs: list[GymnasiumVecEnv] = []
    yield envs
    for env in envs:
        env.close()


def _check_contract(env: GymnasiumVecEnv, num_envs: int, obs_shape: tuple[int, ...]) -> None:
    obs = env.reset(seed=0)
    assert obs.shape == (num_envs, *obs_shape) and obs.dtype == torch.float32
    shape = (num_envs,) if env.is_discrete else (num_envs, env.action_dim)
    action = torch.zeros(shape, dtype=torch.int64 if env.is_discrete else torch.float32)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs.shape == (num_envs, *obs_shape) and obs.dtype == torch.float32
    assert reward.shape == (num_envs,) and reward.dtype == torch.float32
    assert terminated.shape == truncated.shape == (num_envs,)
    assert terminated.dtype == truncated.dtype == torch.bool
    assert info["final_obs"].shape == obs.shape


def test_from_id(closing: list[GymnasiumVecEnv]) -> None:
    env = GymnasiumVecEnv("CartPole-v1", num_envs=3)
    closing.append(env)
    assert (env.num_envs, env.obs_shape, env.is_discrete, env.action_dim) == (3, (4,), True, 2)
    assert env.max_steps == 500
    _check_contract(env, 3, (4,))


def test_from_id_continuous_through_make_env(closing: list[GymnasiumVecEnv]) -> None:
    env = make_env("Pendulum-v1", 2, seed=0)
    closing.append(env)
    assert isinstance(env, GymnasiumVecEnv)
    assert (env.obs_shape, env.is_discrete, env.action_dim, env.max_steps) == ((3,), False, 1, 200)
    _check_contract(env, 2, (3,))


def test_from_single_env(closing: list[GymnasiumVecEnv]) -> None:
    env = GymnasiumVecEnv(gym.make("CartPole-v1"))
    closing.append(env)
    assert env.num_envs == 1 and env.max_steps == 500
    _check_contract(env, 1, (4,))


def test_from_sync_vector_env(closing: list[GymnasiumVecEnv]) -> None:
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=7)] * 2,
                                   autoreset_mode=SAME_STEP)
    env = GymnasiumVecEnv(vec)
    closing.append(env)
    assert env.num_envs == 2 and env.max_steps == 7 and not env.is_discrete
    _check_contract(env, 2, (3,))
    env.reset(seed=1)
    for i in range(7):
        _, _, terminated, truncated, _ = env.step(torch.zeros(2, 1))
        assert not terminated.any() and truncated.all() == (i == 6)


def test_observations_of_a_vector_env_that_reuses_its_buffer_are_copied(closing: list[GymnasiumVecEnv]) -> None:
    """A vector env made with ``copy=False`` returns the same array every step: a stored observation must not
    change when the env steps again."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")] * 2, copy=False, autoreset_mode=SAME_STEP)
    env = GymnasiumVecEnv(vec)
    closing.append(env)
    first = env.reset(seed=1)
    kept = first.clone()
    second, *_ = env.step(torch.ones(2, 1))
    assert torch.equal(first, kept) and not torch.equal(second, first)
    third, *_ = env.step(torch.ones(2, 1))
    assert not torch.equal(third, second)


def test_seeded_reset_is_reproducible(closing: list[GymnasiumVecEnv]) -> None:
    a, b = GymnasiumVecEnv("CartPole-v1", 2), GymnasiumVecEnv("CartPole-v1", 2)
    closing += [a, b]
    assert torch.equal(a.reset(seed=5), b.reset(seed=5))
    assert not torch.equal(a.reset(seed=5)[0], a.reset(seed=6)[0])


def test_box_actions_are_rescaled_to_bounds(closing: list[GymnasiumVecEnv]) -> None:
    inner = CounterEnv(box=True)
    env = GymnasiumVecEnv(inner)
    closing.append(env)
    assert not env.is_discrete and env.action_dim == 3
    env.reset()
    for action, expected in [([-1.0, -1.0, -1.0], [-2.0, 0.0, 5.0]), ([1.0, 1.0, 1.0], [2.0, 10.0, 6.0]),
                             ([0.0, 0.5, -0.5], [0.0, 7.5, 5.25]), ([-7.0, 3.0, 1.5], [-2.0, 10.0, 6.0])]:
        env.step(torch.tensor([action]))
        received = inner.actions[-1]
        assert received.dtype == np.float32
        np.testing.assert_allclose(received, expected, rtol=1e-6)


def test_discrete_actions_pass_through(closing: list[GymnasiumVecEnv]) -> None:
    inners = [CounterEnv(), CounterEnv()]
    vec = gym.vector.SyncVectorEnv([lambda e=e: e for e in inners], autoreset_mode=SAME_STEP)
    env = GymnasiumVecEnv(vec)
    closing.append(env)
    env.reset()
    env.step(torch.tensor([2, 1]))
    assert [int(e.actions[-1]) for e in inners] == [2, 1]


def test_final_obs_on_termination_and_truncation(closing: list[GymnasiumVecEnv]) -> None:
    # sub-env 0 terminates at t=2, sub-env 1 is truncated by TimeLimit at t=3, sub-env 2 never finishes
    factories = [lambda: CounterEnv(end=2, marker=0.0),
                 lambda: gym.wrappers.TimeLimit(CounterEnv(marker=1.0), max_episode_steps=3),
                 lambda: CounterEnv(marker=2.0)]
    env = GymnasiumVecEnv(gym.vector.SyncVectorEnv(factories, autoreset_mode=SAME_STEP))
    closing.append(env)
    obs = env.reset()
    assert obs[:, 0].tolist() == [0, 0, 0]
    expected = [  # (obs t, final_obs t, terminated, truncated) per step
        ([1, 1, 1], [1, 1, 1], [False, False, False], [False, False, False]),
        ([0, 2, 2], [2, 2, 2], [True, False, False], [False, False, False]),
        ([1, 0, 3], [1, 3, 3], [False, False, False], [False, True, False]),
        ([0, 1, 4], [2, 1, 4], [True, False, False], [False, False, False]),
    ]
    for obs_t, final_t, term, trunc in expected:
        obs, reward, terminated, truncated, info = env.step(torch.zeros(3, dtype=torch.int64))
        assert obs[:, 0].tolist() == obs_t
        assert info["final_obs"][:, 0].tolist() == final_t
        assert info["final_obs"][:, 1].tolist() == [0.0, 1.0, 2.0]  # each row comes from its own sub-env
        assert terminated.tolist() == term and truncated.tolist() == trunc
    assert reward.tolist() == [2.0, 1.0, 4.0]


def test_next_step_vector_env_is_rejected() -> None:
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    try:
        with pytest.raises(EnvError, match="SAME_STEP") as info:
            GymnasiumVecEnv(vec)
        assert "\n" not in str(info.value)
    finally:
        vec.close()


def test_unknown_id() -> None:
    with pytest.raises(EnvError, match="unknown env 'NoSuchEnv-v0'"):
        GymnasiumVecEnv("NoSuchEnv-v0")
    with pytest.raises(EnvError, match=r"unknown env 'jaderl/Nope-v0'.*jaderl/CartPole-v1"):
        make_env("jaderl/Nope-v0", 1)


def test_unsupported_spaces() -> None:
    class DictObs(CounterEnv):
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (1,))})

    class Unbounded(CounterEnv):
        def __init__(self) -> None:
            super().__init__()
            self.action_space = gym.spaces.Box(-np.inf, np.inf, (1,))

    class StackedRGB(CounterEnv):  # what FrameStackObservation makes of RGB frames
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = gym.spaces.Box(0, 255, (4, 84, 84, 3), np.uint8)

    with pytest.raises(EnvError, match="observation space"):
        GymnasiumVecEnv(DictObs())
    with pytest.raises(EnvError, match=r"^observations of shape \(4, 84, 84, 3\) are uint8 images with 4 dimensions, "
                       r"but jaderl's CNN reads one image, \(C, H, W\) or \(H, W, C\); stack the frames on the"):
        GymnasiumVecEnv(StackedRGB())
    with pytest.raises(EnvError, match="unbounded"):
        GymnasiumVecEnv(Unbounded())
    with pytest.raises(EnvError, match="cannot adapt"):
        GymnasiumVecEnv(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(("nan_at", "nan_step", "end"), [
    ("obs", 0, None),     # at reset
    ("obs", 2, None),     # mid-episode
    ("reward", 1, None),
    ("obs", 2, 2),        # on the terminal step: only final_obs holds it, obs is the reset observation
])
def test_nan_from_env_raises_env_error(nan_at: str, nan_step: int, end: int | None,
                                       closing: list[GymnasiumVecEnv]) -> None:
    env = GymnasiumVecEnv(CounterEnv(end=end, nan_at=nan_at, nan_step=nan_step))
    closing.append(env)
    with pytest.raises(EnvError, match=f"non-finite {'reward' if nan_at == 'reward' else 'observation'}"):
        env.reset()
        for _ in range(3):
            env.step(torch.zeros(1, dtype=torch.int64))


@pytest.mark.parametrize("at", ["obs", "reward"])
def test_float64_beyond_float32s_range_raises_env_error(at: str, closing: list[GymnasiumVecEnv]) -> None:
    """A float64 observation or reward of 1e39 is finite but becomes infinity as float32: refused as such."""
    class Huge(CounterEnv):
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)

        def _obs(self) -> np.ndarray:
            return np.array([1e39 if at == "obs" and self.t == 1 else float(self.t), 0.0])

        def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, -1e39 if at == "reward" else reward, terminated, truncated, info

    env = GymnasiumVecEnv(Huge())
    closing.append(env)
    env.reset()
    with pytest.raises(EnvError, match=f"^the env returned a {'reward' if at == 'reward' else 'observation'} beyond "
                                       r"float32's range \(magnitude above 3.4e38\), which jaderl's float32 tensors "
                                       "cannot hold; fix the env or wrap it to clip or rescale"):
        env.step(torch.zeros(1, dtype=torch.int64))


def test_integer_box_actions_are_rounded_to_the_nearest_integer(closing: list[GymnasiumVecEnv]) -> None:
    """[-1, 1] rescaled to an integer Box's bounds goes to the nearest integer: a cast would truncate 9.995 to 9."""
    class IntegerBox(CounterEnv):
        def __init__(self) -> None:
            super().__init__()
            self.action_space = gym.spaces.Box(0, 10, (2,), np.int64)

    sim = IntegerBox()
    env = GymnasiumVecEnv(sim)
    closing.append(env)
    env.reset()
    for action in ([0.999, -0.81], [-1.0, 1.0], [0.05, -0.05]):
        env.step(torch.tensor([action]))
    assert [a.tolist() for a in sim.actions] == [[10, 1], [0, 10], [5, 5]]  # 9.995, 0.95; 0, 10; 5.25, 4.75
    assert all(a.dtype == np.int64 for a in sim.actions)


def test_wrapped_vector_env_keeps_its_time_limit(closing: list[GymnasiumVecEnv]) -> None:
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=SAME_STEP)
    env = GymnasiumVecEnv(gym.wrappers.vector.RecordEpisodeStatistics(vec))
    closing.append(env)
    assert env.max_steps == 500
    _check_contract(env, 2, (4,))
