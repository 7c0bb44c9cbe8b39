"""MuJoCo Playground envs through DLPack (jaderl.envs.brax): Playground's CartpoleBalance on MuJoCo Warp, a few
sub-envs on the CPU, and dict observations through a wrapped Brax test env. (PPO trains on it in the slow test of
docs/simulators.md's command, tests/test_docs_commands.py.)"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from jaderl.envs import EnvError, make_env
from jaderl.envs.brax import JaxVecEnv

# found without importing it: JAX takes seconds to import, paid only by the test process that runs these tests
if importlib.util.find_spec("mujoco_playground") is None:
    pytest.skip("needs mujoco_playground", allow_module_level=True)


@pytest.fixture(scope="module")
def cartpole() -> Any:
    """One env for the module: building and compiling it takes about 10 s here."""
    return make_env("playground/CartpoleBalance?episode_length=5", 3, "cpu", seed=0)


def test_spec_steps_truncation_and_no_copies(cartpole: Any) -> None:
    env = cartpole
    spec = env.spec
    assert (spec.num_envs, spec.obs_shape, spec.is_discrete, spec.action_dim, spec.max_steps) == (3, (5,), False, 1, 5)
    obs = env.reset(seed=0)
    assert obs.shape == (3, 5) and obs.dtype == torch.float32
    assert obs.data_ptr() == env._state.obs.unsafe_buffer_pointer()  # torch reads JAX's memory
    for t in range(5):
        obs, reward, terminated, truncated, info = env.step(torch.ones(3, 1))
        assert reward.shape == (3,) and 0.0 < float(reward.min()) <= float(reward.max()) <= 1.0  # suite rewards
        assert not terminated.any() and bool(truncated.all()) == (t == 4)
        if t < 4:
            assert torch.equal(info["final_obs"], obs)
    # the cart moved for 5 steps; the new episodes start near the middle again, from fresh random states
    assert (info["final_obs"][:, 0] - obs[:, 0]).abs().min() > 1e-3
    first = env.reset(seed=3)
    assert torch.equal(first.clone(), env.reset(seed=3))  # a seed gives the same episodes


def test_bad_ids_options_and_a_missing_package_are_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EnvError, match=r"^unknown MuJoCo Playground env 'NoSuchEnv'; choose one of: .*CheetahRun"):
        make_env("playground/NoSuchEnv", 2)
    with pytest.raises(EnvError, match=r"^MuJoCo Playground env 'CartpoleBalance' has no option 'nope'; its options "
                                       r"are .*episode_length.*impl"):
        make_env("playground/CartpoleBalance?nope=1", 2)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mujoco_playground" else real(name, *a))
    with pytest.raises(EnvError, match=r"pip install 'jaderl\[playground\]'"):
        make_env("playground/CartpoleBalance", 2)


def test_a_dict_observation_gives_the_entry_named() -> None:
    """Playground's locomotion envs observe {"state": ..., "privileged_state": ...}: Brax's `fast` env dressed so."""
    import jax.numpy as jnp
    from brax.envs import get_environment
    from brax.envs.wrappers.training import Wrapper

    class DictObs(Wrapper):
        @property
        def observation_size(self) -> dict[str, tuple[int, ...]]:
            return {"state": (2,), "privileged_state": (4,)}

        def reset(self, rng: Any) -> Any:
            return self._dress(self.env.reset(rng))

        def step(self, state: Any, action: Any) -> Any:
            return self._dress(self.env.step(state.replace(obs=state.obs["state"]), action))

        @staticmethod
        def _dress(state: Any) -> Any:
            return state.replace(obs={"state": state.obs, "privileged_state": jnp.concatenate([state.obs] * 2, -1)})

    env = JaxVecEnv(DictObs(get_environment("fast")), 2, episode_length=3, obs_key="privileged_state", label="test")
    obs = env.reset(seed=0)
    assert env.obs_shape == (4,) and obs.shape == (2, 4) and torch.equal(obs[:, :2], obs[:, 2:])
    for _ in range(3):
        obs, _, _, truncated, info = env.step(torch.zeros(2, 1))
    assert truncated.all() and info["final_obs"].shape == (2, 4)
    with pytest.raises(EnvError, match=r"^the test env's observation has no 'pixels' entry; pass \?obs_key= one of: "
                                       r"state, privileged_state$"):
        JaxVecEnv(DictObs(get_environment("fast")), 2, obs_key="pixels", label="test")


def test_diverged_physics_is_one_sentence_with_a_hint() -> None:
    from brax.envs import get_environment
    from brax.envs.wrappers.training import Wrapper

    class Diverges(Wrapper):
        def step(self, state: Any, action: Any) -> Any:
            state = self.env.step(state, action)
            return state.replace(reward=state.reward * float("nan"))

    env = JaxVecEnv(Diverges(get_environment("fast")), 2, label="test")
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"^the test env returned a non-finite observation or reward; its physics "
                                       r"diverged \(try other physics options after '\?', or smaller actions\)$"):
        env.step(torch.zeros(2, 1))
