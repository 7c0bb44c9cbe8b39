"""Bad input at the Gymnasium adapter (jaderl.envs.vec.GymnasiumVecEnv, built by make_env): a missing package, an env
that raises, an observation space jaderl cannot read. Each is one sentence that says what to do, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from action_checks import check_list_actions, check_refused_actions

from jaderl.cli import main
from jaderl.envs import make_env
from jaderl.envs.vec import EnvError, GymnasiumVecEnv, missing_dependency

EXPLODING = "JaderlTestExploding-v0"


class ExplodingEnv(gym.Env):
    """A Box env whose simulator raises in ``step`` (or in ``reset``, with ``in_reset``)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, in_reset: bool = False) -> None:
        self.in_reset = in_reset

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if self.in_reset:
            raise ValueError("no initial state\n  (tried 3 times)")  # a message over two lines reads as one
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        raise RuntimeError("simulator exploded")


@pytest.fixture
def exploding() -> Iterator[str]:
    gym.register(EXPLODING, entry_point=ExplodingEnv, max_episode_steps=10)
    yield EXPLODING
    del gym.registry[EXPLODING]


# -- a Gymnasium id whose package is not installed ------------------------------------------------------------------

def test_a_missing_mujoco_names_the_env_the_package_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(*args: Any, **kwargs: Any) -> gym.Env:  # what gym.make says without MuJoCo
        raise gym.error.DependencyNotInstalled('MuJoCo is not installed, run `pip install "gymnasium[mujoco]"`')

    monkeypatch.setattr(gym, "make", make)
    with pytest.raises(EnvError) as info:
        make_env("HalfCheetah-v5", 2)
    assert str(info.value) == "env 'HalfCheetah-v5' needs MuJoCo, which is not installed; pip install 'jaderl[mujoco]'"


def test_a_missing_box2d_is_found_before_any_env_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Box2D's envs check their package when their module is imported: as if Box2D had never been installed."""
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for module in [m for m in sys.modules if m == "gymnasium.envs.box2d" or m.startswith("gymnasium.envs.box2d.")]:
        monkeypatch.delitem(sys.modules, module)
    message = "env 'LunarLanderContinuous-v3' needs Box2D, which is not installed; pip install 'jaderl[box2d]'"
    with pytest.raises(EnvError) as info:
        make_env("LunarLanderContinuous-v3", 2)
    assert str(info.value) == message
    with pytest.raises(EnvError) as info:
        make_env("LunarLanderContinuous-v3", 2, workers=1)  # refused before a worker starts
    assert str(info.value) == message


def test_a_package_jaderl_has_no_extra_for_gets_gymnasiums() -> None:
    error = gym.error.DependencyNotInstalled('pygame is not installed, run `pip install "gymnasium[classic-control]"`')
    assert str(missing_dependency("CartPole-v1", error)) == (
        "env 'CartPole-v1' needs pygame, which is not installed; pip install 'gymnasium[classic-control]'")
    odd = gym.error.DependencyNotInstalled("the simulator's shared library could not be loaded")
    assert str(missing_dependency("Walker-v0", odd, "gymnasium.envs.mujoco.walker2d_v5:Walker2dEnv")) == (
        "env 'Walker-v0' needs a package that is not installed (the simulator's shared library could not be loaded); "
        "pip install 'jaderl[mujoco]'")


# -- an env that raises, stepped in this process ---------------------------------------------------------------------

def test_an_env_that_raises_in_step_is_one_sentence(exploding: str) -> None:
    env = make_env(exploding, 2)
    env.reset(seed=0)
    with pytest.raises(EnvError) as info:
        env.step(torch.zeros(2, 1))
    assert str(info.value) == f"env '{exploding}' (stepped in this process) failed: RuntimeError: simulator exploded"
    assert isinstance(info.value.__cause__, RuntimeError)  # the env's own traceback is kept for debugging


def test_an_env_that_raises_in_reset_or_when_built_is_one_sentence(exploding: str) -> None:
    env = GymnasiumVecEnv(exploding, 2, env_kwargs={"in_reset": True})
    with pytest.raises(EnvError) as info:
        env.reset()
    assert str(info.value) == (f"env '{exploding}' (reset in this process) failed: ValueError: no initial state "
                               "(tried 3 times)")
    with pytest.raises(EnvError, match=rf"^env '{exploding}' \(built in this process\) failed: TypeError: .*'colour'"):
        GymnasiumVecEnv(exploding, 2, env_kwargs={"colour": "red"})


def test_the_cli_reports_an_env_that_raises_in_one_line(exploding: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "sac", exploding, "--device", "cpu", "--run-dir", str(tmp_path / "run"), "--total-steps", "64"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (f"jaderl: error: env '{exploding}' (stepped in this process) failed: "
                                       "RuntimeError: simulator exploded\n")


# -- an observation space that is not a Box --------------------------------------------------------------------------

@pytest.mark.parametrize(("env_id", "space"), [("FrozenLake-v1", "Discrete(16)"),
                                               ("Blackjack-v1", "Tuple(Discrete(32), Discrete(11), Discrete(2))")])
def test_a_discrete_observation_space_is_refused_with_the_wrapper_that_fixes_it(env_id: str, space: str) -> None:
    with pytest.raises(EnvError) as info:
        make_env(env_id, 2)
    assert str(info.value) == (
        f"observation space {space} is not supported: jaderl needs a Box observation space; wrap the env in "
        "gymnasium.wrappers.FlattenObservation (a Discrete becomes a one-hot Box) and pass the wrapped env to "
        "GymnasiumVecEnv, or register_env a factory that builds it")
    env = GymnasiumVecEnv(gym.wrappers.FlattenObservation(gym.make(env_id)))  # the fix works
    assert env.reset(seed=0).shape == (1, gym.spaces.flatdim(gym.make(env_id).observation_space))


def test_a_space_gymnasium_cannot_flatten_gets_no_wrapper_advice() -> None:
    class Texts(ExplodingEnv):
        observation_space = gym.spaces.Sequence(gym.spaces.Discrete(3))  # any length: no flat Box

    with pytest.raises(EnvError) as info:
        GymnasiumVecEnv(Texts())
    assert str(info.value).endswith("is not supported: jaderl needs a Box observation space")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_lists_and_numpy_actions_are_read_and_non_integral_discrete_ones_refused(env_id: str) -> None:
    """make_env's Gymnasium adapter steps a list or NumPy array of actions as the same tensor; a float discrete action
    that is not a whole number is refused in one sentence (not truncated to an int), one that is (1.0) is taken;
    what is not numbers is refused in one sentence naming what the env takes."""
    env = make_env(env_id, 2)
    try:
        values = [0, 1] if env.is_discrete else [[0.5], [-0.25]]
        non_integral = [torch.tensor([0.7, 1.5]), [1.0, 0.5]] if env.is_discrete else []
        check_list_actions(env, values, lambda: env.reset(seed=3))
        check_refused_actions(env, non_integral=non_integral)
    finally:
        env.close()


# -- actions and episode ends as the env sees them -------------------------------------------------------------------

class Float64Box(gym.Env):
    """An env with float64 action bounds that checks every action against its space, as many custom envs do."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(np.array([-3.0, -1.0]), np.array([0.1, 1.0]), (2,), np.float64)

    def __init__(self) -> None:
        self.actions: list[np.ndarray] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(action), action
        self.actions.append(action)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_rescaled_actions_never_leave_a_float64_box_by_a_rounding_error() -> None:
    """-3 + (1 + 1) / 2 * (0.1 - -3) is 0.10000000000000009 in float64: the env gets its bound 0.1 exactly."""
    inner = Float64Box()
    env = GymnasiumVecEnv(inner)
    env.reset(seed=0)
    env.step(torch.tensor([[1.0, 1.0]]))
    env.step(torch.tensor([[-1.0, -1.0]]))
    assert [a.tolist() for a in inner.actions] == [[0.1, 1.0], [-3.0, -1.0]]
    env.close()


def test_a_vector_env_that_ends_episodes_without_final_observations_is_one_sentence() -> None:
    """A vector env whose metadata names no autoreset mode passes the check at construction; if it then ends an
    episode without info["final_obs"] (Gymnasium's default next-step mode), that is one sentence, not a KeyError."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=2)] * 2)
    del vec.metadata["autoreset_mode"]
    env = GymnasiumVecEnv(vec)
    env.reset(seed=0)
    env.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(EnvError, match=r"^env 'CartPole-v1' ended sub-envs without info\['final_obs'\]: it does not "
                                       r"auto-reset in the same step; build it with autoreset_mode=gym\.vector\."
                                       r"AutoresetMode\.SAME_STEP$"):
        env.step(torch.zeros(2, dtype=torch.int64))
    env.close()


def test_an_env_instance_is_one_sub_env_and_is_not_copied_into_several() -> None:
    """An env instance cannot be copied into independent sub-envs: with num_envs > 1 it is refused in one sentence
    naming the fix (the id, or a vector env of a function that makes one env per sub-env), which works; with
    num_envs=1 it is the one sub-env."""
    with pytest.raises(EnvError, match=r"^an env instance \('CartPole-v1'\) cannot be copied into 4 independent "
                                       r"sub-envs; pass the env id, or gym\.vector\.SyncVectorEnv\(\[make_env\] \* 4, "
                                       r"autoreset_mode=gym\.vector\.AutoresetMode\.SAME_STEP\) where make_env returns "
                                       r"a new env$"):
        GymnasiumVecEnv(gym.make("CartPole-v1"), num_envs=4)
    with pytest.raises(EnvError, match=r"^an env instance \(Float64Box\) cannot be copied into 2 independent"):
        GymnasiumVecEnv(gym.wrappers.ClipAction(Float64Box()), 2)
    fixed = GymnasiumVecEnv(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4,
                                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    single = GymnasiumVecEnv(gym.make("CartPole-v1"), num_envs=1)
    try:
        assert fixed.num_envs == 4 and fixed.reset(seed=0).shape == (4, 4)
        assert single.num_envs == 1 and single.reset(seed=0).shape == (1, 4)
        obs, reward, *_ = single.step(torch.tensor([1]))
        assert obs.shape == (1, 4) and reward.tolist() == [1.0]
    finally:
        fixed.close()
        single.close()


def test_num_envs_that_no_sub_env_count_can_be_is_one_sentence() -> None:
    """A num_envs below 1, or one a vector env does not have (it keeps its own count), is refused naming the fix."""
    with pytest.raises(EnvError, match=r"^num_envs \(0\) must be at least 1$"):
        GymnasiumVecEnv("CartPole-v1", num_envs=0)
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4,
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        with pytest.raises(EnvError, match=r"^the vector env has 4 sub-envs but num_envs=2 was asked for; leave "
                                           r"num_envs out, or build the vector env with 2$"):
            GymnasiumVecEnv(vector, num_envs=2)
        assert GymnasiumVecEnv(vector, num_envs=4).num_envs == 4
    finally:
        vector.close()
