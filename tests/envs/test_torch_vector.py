"""TorchVectorEnv: Gymnasium-API vector envs that return torch tensors (Isaac Lab, ManiSkill3), tested on the CPU
through Gymnasium's own NumpyToTorch vector wrapper, which serves the same interface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from action_checks import check_list_actions, check_refused_actions
from gymnasium.wrappers.vector import NumpyToTorch  # its converter needs array-api-compat (in the dev extra)

import jaderl
from jaderl.envs import REGISTERED_ENVS, EnvError, GymnasiumVecEnv, make_env, register_env
from jaderl.envs.torch_vector import TorchVectorEnv


class DenseFinalObs(gym.vector.VectorWrapper):
    """Gymnasium's same-step autoreset stores the final observations as an object array (None where nothing ended),
    which NumpyToTorch cannot convert; this stacks them into one (N, *obs_shape) array, as ManiSkill3 gives them."""

    def step(self, actions: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if "final_obs" in info:
            dense = np.array(obs, copy=True)
            ended = info.pop("_final_obs")
            dense[ended] = np.stack(info["final_obs"][ended])
            info = {"final_obs": dense}
        return obs, reward, terminated, truncated, info


class ActionSpy(gym.vector.VectorWrapper):
    """Records the type of every action batch the simulator is given."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.types: list[type] = []

    def step(self, actions: Any) -> Any:
        self.types.append(type(actions))
        return self.env.step(actions)


def torch_env(env_id: str, num_envs: int) -> ActionSpy:
    vec = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs,
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return ActionSpy(NumpyToTorch(DenseFinalObs(vec)))


@pytest.mark.parametrize(("env_id", "steps"), [("Pendulum-v1", 205), ("CartPole-v1", 150)])
def test_matches_the_numpy_adapter_step_for_step(env_id: str, steps: int) -> None:
    """The same sub-envs, seeds and actions through TorchVectorEnv (torch all the way) and GymnasiumVecEnv (numpy):
    identical observations, rewards, flags and final observations, across terminations and truncations."""
    spy = torch_env(env_id, 4)
    ours = TorchVectorEnv(spy)
    reference = GymnasiumVecEnv(env_id, num_envs=4)
    assert ours.spec == reference.spec
    torch.testing.assert_close(ours.reset(seed=7), reference.reset(seed=7))
    gen, ended = torch.Generator().manual_seed(0), 0
    for _ in range(steps):
        if ours.is_discrete:
            action = torch.randint(ours.action_dim, (4,), generator=gen)
        else:
            action = torch.rand(4, ours.action_dim, generator=gen) * 2.4 - 1.2  # some outside [-1, 1]: clipped
        got, want = ours.step(action), reference.step(action)
        for a, b in zip(got[:4], want[:4], strict=True):
            assert a.dtype == b.dtype and a.device == b.device
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(got[4]["final_obs"], want[4]["final_obs"])
        ended += int((got[2] | got[3]).sum())
    assert ended > 0  # episodes ended, so final observations were compared
    assert set(spy.types) == {torch.Tensor}  # the simulator was handed torch tensors, never numpy arrays
    ours.close()
    reference.close()


class IsaacLike:
    """An env shaped like an Isaac Lab task: dict observations {"policy": ...}, torch everywhere, a
    ``max_episode_length``, finished sub-envs reset inside step with no final observation."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs, self.device, self.max_episode_length = num_envs, "cpu", 3
        box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_observation_space = gym.spaces.Dict({"policy": box, "critic": box})
        self.single_action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.unwrapped, self.t, self.actions = self, torch.zeros(num_envs, dtype=torch.long), []

    def _obs(self) -> dict[str, torch.Tensor]:
        policy = torch.stack([self.t.float(), torch.ones(self.num_envs)], -1)
        return {"policy": policy, "critic": -policy}

    def reset(self, seed: int | None = None) -> tuple[dict[str, torch.Tensor], dict]:
        self.t.zero_()
        return self._obs(), {}

    def step(self, action: torch.Tensor) -> tuple[Any, ...]:
        self.actions.append(action)
        self.t += 1
        truncated = self.t >= self.max_episode_length
        self.t[truncated] = 0
        return self._obs(), action[:, 0].clone(), torch.zeros_like(truncated), truncated, {"log": {}}

    def close(self) -> None:
        pass


def test_dict_observations_rescaled_actions_and_no_final_observation() -> None:
    sim = IsaacLike(5)
    env = TorchVectorEnv(sim)
    assert env.obs_shape == (2,) and env.max_steps == 3 and not env.is_discrete
    assert env.spec.action_low == (-2.0,) and env.spec.action_high == (2.0,)
    torch.testing.assert_close(env.reset(), torch.tensor([[0.0, 1.0]] * 5))
    action = torch.tensor([[-1.0], [0.0], [0.5], [1.0], [3.0]])
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(action)
    torch.testing.assert_close(sim.actions[-1], torch.tensor([[-2.0], [0.0], [1.0], [2.0], [2.0]]))
    torch.testing.assert_close(reward, torch.tensor([-2.0, 0.0, 1.0, 2.0, 2.0]))
    assert bool(truncated.all()) and not bool(terminated.any())
    assert info["final_obs"] is obs  # nothing better to bootstrap from: the reset observation (documented)
    with pytest.raises(EnvError, match="pass obs_key= one of them"):
        TorchVectorEnv(IsaacLike(2), obs_key="state")


class NaNRewardAtStep3(IsaacLike):
    def step(self, action: torch.Tensor) -> tuple[Any, ...]:
        obs, reward, *rest = super().step(action)
        return (obs, reward * float("nan") if len(self.actions) == 3 else reward, *rest)


def test_deferred_checks_stop_nan_within_their_period_and_before_a_checkpoint() -> None:
    def env() -> TorchVectorEnv:  # the checks as on a GPU (deferred), here on the CPU
        env = TorchVectorEnv(NaNRewardAtStep3(2))
        env._obs_watch.deferred = env._reward_watch.deferred = True
        env._reward_watch.every = 5
        env.reset()
        return env

    ahead = env()
    for _ in range(4):
        ahead.step(torch.zeros(2, 1))  # the third step's NaN waits for the fifth step's read
    with pytest.raises(EnvError, match="non-finite reward"):
        ahead.step(torch.zeros(2, 1))
    saving = env()
    for _ in range(3):
        saving.step(torch.zeros(2, 1))
    with pytest.raises(EnvError, match="non-finite reward"):
        saving.state_dict()  # a checkpoint reads the checks first
    on_cpu = TorchVectorEnv(NaNRewardAtStep3(2))  # not deferred: at once
    on_cpu.reset()
    on_cpu.step(torch.zeros(2, 1))
    on_cpu.step(torch.zeros(2, 1))
    with pytest.raises(EnvError, match="non-finite reward"):
        on_cpu.step(torch.zeros(2, 1))


class TimeLimitWrapper(gym.Wrapper):
    """ManiSkill3's time limit: a wrapper that keeps the limit as ``_max_episode_steps``."""

    def __init__(self, env: gym.Env, max_episode_steps: int) -> None:
        super().__init__(env)
        self._max_episode_steps = max_episode_steps


def test_episode_limit_found_down_the_wrapper_chain() -> None:
    """ManiSkill3's layout: its vector env holds the time-limit wrapper as ``_env`` and its ``unwrapped`` is the task,
    whose spec (set by gym.make) has no ``max_episode_steps``."""
    sim = IsaacLike(2)
    sim._env = TimeLimitWrapper(gym.make("CartPole-v1").unwrapped, 7)
    sim.unwrapped = sim._env.unwrapped
    del sim.max_episode_length
    assert sim.unwrapped.spec is not None and sim.unwrapped.spec.max_episode_steps is None
    assert TorchVectorEnv(sim).max_steps == 7


class FakeTask(gym.Env):
    """What ``gym.make`` builds of a ManiSkill3 task (its keyword arguments recorded), here a 2-number state."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


class FakeManiSkillVectorEnv:
    """ManiSkill3's vector wrapper: tensors in and out, its time-limit wrapper held as ``_env``."""

    def __init__(self, env: gym.Env, auto_reset: bool, ignore_terminations: bool) -> None:
        self._env, self.options = env, {"auto_reset": auto_reset, "ignore_terminations": ignore_terminations}
        self.num_envs = env.unwrapped.kwargs["num_envs"]
        self.single_observation_space = env.unwrapped.observation_space
        self.single_action_space = env.unwrapped.action_space
        self.unwrapped = env.unwrapped

    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        return torch.zeros(self.num_envs, 2), {}

    def step(self, action: torch.Tensor) -> tuple[Any, ...]:
        done = torch.zeros(self.num_envs, dtype=torch.bool)
        return torch.ones(self.num_envs, 2), action[:, 0].clone(), done, done, {}

    def close(self) -> None:
        pass


@pytest.fixture
def fake_maniskill(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A stand-in for the mani_skill package and one task, ``FakeCube-v1``; returns the ``gym.make`` calls' options."""
    import sys
    import types

    made: list[dict[str, Any]] = []
    wrappers = types.ModuleType("mani_skill.vector.wrappers.gymnasium")
    wrappers.ManiSkillVectorEnv = FakeManiSkillVectorEnv  # type: ignore[attr-defined]
    for module in ("mani_skill", "mani_skill.envs", "mani_skill.vector", "mani_skill.vector.wrappers"):
        monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
    monkeypatch.setitem(sys.modules, "mani_skill.vector.wrappers.gymnasium", wrappers)
    monkeypatch.setitem(gym.registry, "FakeCube-v1", None)

    def make(task: str, **kwargs: Any) -> gym.Env:
        made.append({"task": task, **kwargs})
        return TimeLimitWrapper(FakeTask(**kwargs), 50)

    monkeypatch.setattr(gym, "make", make)
    return made


def test_maniskill_ids(fake_maniskill: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env("maniskill/FakeCube-v1?control_mode=pd_ee_delta_pose", 1, "cpu", seed=0)
    assert fake_maniskill == [{"task": "FakeCube-v1", "num_envs": 1, "obs_mode": "state",
                               "control_mode": "pd_ee_delta_pose", "render_mode": None, "sim_backend": "physx_cpu"}]
    assert isinstance(env, TorchVectorEnv) and env.max_steps == 50 and env.obs_shape == (2,)
    assert env.env.options == {"auto_reset": True, "ignore_terminations": False}
    _, reward, *_ = env.step(torch.tensor([[1.0]]))
    assert reward.tolist() == [2.0]  # jaderl's 1 is the task's upper bound
    with pytest.raises(EnvError, match=r"^ManiSkill3 simulates one sub-env per process on the CPU, and 4 were asked "
                                       r"for; pass --device cuda for its GPU simulation, or num_envs=1 and "
                                       r"eval_episodes=1$"):
        make_env("maniskill/FakeCube-v1", 4, "cpu")
    with pytest.raises(EnvError, match=r"^unknown ManiSkill3 task 'NoCube-v1'; see ManiSkill3's task list"):
        make_env("maniskill/NoCube-v1", 1, "cpu")
    for steps in ("0", "-5", "2.5"):  # Gymnasium's TimeLimit would raise its own error from inside gym.make
        with pytest.raises(EnvError, match=rf"^option max_episode_steps={steps} of ManiSkill3 task 'FakeCube-v1' must "
                                           r"be a whole number of at least 1 \(the steps after which an episode is "
                                           r"truncated\), e\.g\. \?max_episode_steps=100$"):
            make_env(f"maniskill/FakeCube-v1?max_episode_steps={steps}", 1, "cpu")
    assert len(fake_maniskill) == 1  # none of them reached gym.make

    def strict(task: str, **kwargs: Any) -> None:
        raise TypeError("PushCubeEnv.__init__() got an unexpected keyword argument 'colour'")  # as a task says it

    monkeypatch.setattr(gym, "make", strict)
    with pytest.raises(EnvError, match=r"^env 'maniskill/FakeCube-v1\?colour=red': PushCubeEnv got an unexpected "
                                       r"keyword argument 'colour'; see the env's docstring for its options$"):
        make_env("maniskill/FakeCube-v1?colour=red", 1, "cpu")


def test_maniskill_ids_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mani_skill", None)
    with pytest.raises(EnvError, match=r"^ManiSkill3 envs need the mani_skill package: pip install "
                                       r"'jaderl\[maniskill\]' \(ManiSkill3 and SAPIEN; its GPU simulation needs a "
                                       r"CUDA GPU\)$"):
        make_env("maniskill/PushCube-v1", 1, "cpu")


def test_unsupported_spaces_and_bad_actions_are_one_sentence() -> None:
    sim = IsaacLike(2)
    sim.single_action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    with pytest.raises(EnvError, match="unbounded"):
        TorchVectorEnv(sim)
    env = TorchVectorEnv(torch_env("CartPole-v1", 2))
    env.reset(seed=0)
    with pytest.raises(EnvError, match="expected actions of shape"):
        env.step(torch.zeros(3, dtype=torch.long))
    with pytest.raises(EnvError):
        env.step(torch.tensor([0, 2]))
    with pytest.raises(EnvError, match="cannot adapt"):
        TorchVectorEnv(object())
    env.close()
    lake = gym.vector.SyncVectorEnv([lambda: gym.make("FrozenLake-v1")] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(EnvError, match=r"Discrete\(16\) is not supported: jaderl needs a Box observation space; wrap "
                                       r"each sub-env in gymnasium\.wrappers\.FlattenObservation before vectorising"):
        TorchVectorEnv(NumpyToTorch(lake))
    lake.close()
    flat = gym.vector.SyncVectorEnv([lambda: gym.wrappers.FlattenObservation(gym.make("FrozenLake-v1"))] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)  # what it says to do
    env = TorchVectorEnv(NumpyToTorch(DenseFinalObs(flat)))
    assert env.obs_shape == (16,) and env.reset(seed=0).shape == (2, 16)
    env.close()


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.DISABLED])
def test_a_vector_env_that_does_not_reset_in_the_same_step_is_refused(mode: gym.vector.AutoresetMode) -> None:
    """Gymnasium's default next-step autoreset answers the step after an episode's end with the reset observation,
    a reward of 0 and the action ignored: a transition that is none, so such an env is refused, as GymnasiumVecEnv
    refuses it."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=mode)
    with pytest.raises(EnvError, match=rf"^the vector env auto-resets in mode {mode}; build it with "
                                       r"autoreset_mode=gym\.vector\.AutoresetMode\.SAME_STEP \(finished sub-envs"):
        TorchVectorEnv(NumpyToTorch(vec))
    vec.close()


def test_rescaled_actions_never_leave_the_bounds_by_a_rounding_error() -> None:
    """low + (a + 1) * (high - low) / 2 in float32 can land an ulp above ``high`` (here at a = 1): the simulator must
    get actions its Box contains."""
    sim = IsaacLike(2)
    low, high = np.float32(-11.71002197265625), np.float32(1.1712032556533813)
    sim.single_action_space = gym.spaces.Box(low, high, (1,), np.float32)
    env = TorchVectorEnv(sim)
    env.reset()
    env.step(torch.tensor([[1.0], [-1.0]]))
    sent = sim.actions[-1]
    assert sent.dtype == torch.float32
    assert sent.tolist() == [[float(high)], [float(low)]]
    assert all(sim.single_action_space.contains(row.numpy()) for row in sent)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_lists_and_numpy_actions_are_read_and_non_integral_discrete_ones_refused(env_id: str) -> None:
    """A list or NumPy array of actions steps as the same tensor (the simulator still gets a tensor); a float discrete
    action that is not a whole number is refused in one sentence (not truncated to an int) and one that is (1.0) is
    taken; NaN discrete actions are refused as the agent's divergence; what is not numbers is refused in one sentence
    naming what the env takes. The simulator is not stepped by a refused action."""
    spy = torch_env(env_id, 2)
    env = TorchVectorEnv(spy)
    values = [0, 1] if env.is_discrete else [[0.5], [-0.25]]
    non_integral = [torch.tensor([0.7, 1.5]), [1.0, 0.5], np.array([0.0, 1.5])] if env.is_discrete else []
    check_list_actions(env, values, lambda: env.reset(seed=3))
    assert set(spy.types) == {torch.Tensor}
    steps = len(spy.types)
    check_refused_actions(env, non_integral=non_integral)
    if env.is_discrete:
        with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite"):
            env.step(torch.tensor([0.0, float("nan")]))
    assert len(spy.types) == steps
    env.close()

class TinyImages(gym.Env):
    """uint8 image observations (1, 8, 8) whose pixels count the steps; episodes of 3 steps."""

    observation_space = gym.spaces.Box(0, 255, (1, 8, 8), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.full((1, 8, 8), 200, np.uint8), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.full((1, 8, 8), 200 + self.t, np.uint8), 1.0, self.t == 3, False, {}


def test_uint8_images_are_described_as_uint8_like_the_numpy_adapter() -> None:
    """The spec says what the observations are: predict and exported policies scale uint8 images by 1/255, as the
    CNN did in training, only when the spec's obs_dtype is uint8."""
    vec = gym.vector.SyncVectorEnv([TinyImages] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    ours = TorchVectorEnv(NumpyToTorch(DenseFinalObs(vec)))
    reference = GymnasiumVecEnv(gym.vector.SyncVectorEnv([TinyImages] * 2,
                                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    assert ours.spec.obs_dtype == "uint8" and ours.spec == reference.spec
    obs = ours.reset(seed=0)
    assert obs.dtype == torch.uint8 and torch.equal(obs, reference.reset(seed=0))
    for _ in range(3):
        got, want = ours.step(torch.zeros(2, dtype=torch.long)), reference.step(torch.zeros(2, dtype=torch.long))
        assert got[0].dtype == got[4]["final_obs"].dtype == torch.uint8
        assert torch.equal(got[0], want[0]) and torch.equal(got[4]["final_obs"], want[4]["final_obs"])
    ours.close()
    reference.close()


def test_a_registered_simulator_trains_resumes_and_evaluates(tmp_path: Path) -> None:
    name = "test/torch-cartpole"
    register_env(name, lambda num_envs, device, seed: TorchVectorEnv(torch_env("CartPole-v1", num_envs), device))
    try:
        assert isinstance(make_env(name, 2), TorchVectorEnv)
        settings = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=1, hidden=[16, 16], eval_every=256,
                        checkpoint_every=256, eval_episodes=2, device="cpu", seed=0)
        result = jaderl.train("ppo", name, run_dir=str(tmp_path / "run"), total_steps=256, **settings)
        assert result.steps == 256 and np.isfinite(result.last_eval_return)
        assert jaderl.resume(tmp_path / "run", total_steps=512).steps == 512
        with pytest.raises(EnvError, match="cannot register"):
            register_env("jaderl/CartPole-v1", lambda num_envs, device, seed: make_env("CartPole-v1", num_envs))
    finally:
        REGISTERED_ENVS.pop(name, None)


class ReusedBuffers(IsaacLike):
    """Isaac Lab's habits: an unbounded action space, and every step's observations, rewards and episode ends written
    into the same tensors."""

    def __init__(self, num_envs: int) -> None:
        super().__init__(num_envs)
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.obs_buf, self.reward_buf = torch.zeros(num_envs, 2), torch.zeros(num_envs)
        self.terminated_buf, self.truncated_buf = torch.zeros(num_envs, dtype=torch.bool), torch.zeros(
            num_envs, dtype=torch.bool)

    def _obs(self) -> dict[str, torch.Tensor]:
        self.obs_buf.copy_(torch.stack([self.t.float(), torch.ones(self.num_envs)], -1))
        return {"policy": self.obs_buf, "critic": self.obs_buf}

    def step(self, action: torch.Tensor) -> tuple[Any, ...]:
        self.actions.append(action)
        self.t += 1
        self.reward_buf.copy_(self.t.float())
        self.truncated_buf.copy_(self.t >= self.max_episode_length)
        self.terminated_buf.copy_(self.t == 1)
        self.t[self.truncated_buf] = 0
        return self._obs(), self.reward_buf, self.terminated_buf, self.truncated_buf, {}


def test_an_env_that_reuses_its_buffers_leaves_every_step_its_own_values_and_action_bounds_take_unbounded_spaces(
        ) -> None:
    with pytest.raises(EnvError, match=r"is unbounded: jaderl rescales actions from \[-1, 1\]; pass "
                                       r"action_bounds=\(low, high\) to rescale them to, e.g. \(-1.0, 1.0\)"):
        TorchVectorEnv(ReusedBuffers(2))
    with pytest.raises(EnvError, match=r"action_bounds=\(1.0, -1.0\) are not two finite numbers, low < high"):
        TorchVectorEnv(ReusedBuffers(2), action_bounds=(1.0, -1.0))
    sim = ReusedBuffers(2)
    env = TorchVectorEnv(sim, action_bounds=(-0.5, 0.5))
    assert env.spec.action_low == (-0.5,) and env.spec.action_high == (0.5,)
    first = env.reset()
    steps = [env.step(torch.tensor([[-1.0], [1.0]])) for _ in range(3)]
    torch.testing.assert_close(sim.actions[-1], torch.tensor([[-0.5], [0.5]]))
    torch.testing.assert_close(first, torch.tensor([[0.0, 1.0]] * 2))  # the reset's, not the last step's
    assert [s[1].tolist() for s in steps] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert [s[2].tolist() for s in steps] == [[True, True], [False, False], [False, False]]
    assert [s[3].tolist() for s in steps] == [[False, False], [False, False], [True, True]]
    assert [s[0][:, 0].tolist() for s in steps] == [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]
