"""Brax envs through DLPack (jaderl.envs.brax) on Brax's `fast` test env, which compiles in seconds. A real physics
env (`brax/inverted_pendulum`, whose pole falls and ends episodes) trains in the slow test of docs/simulators.md's
command (tests/test_docs_commands.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import jaderl
from jaderl.envs import EnvError, make_env

# found without importing it: JAX takes seconds to import, paid only by the test process that runs these tests
if importlib.util.find_spec("brax") is None:
    pytest.skip("needs brax", allow_module_level=True)


def test_spec_steps_and_truncation_with_the_final_observation() -> None:
    env = make_env("brax/fast?episode_length=5", 4, "cpu", seed=0)
    spec = env.spec
    assert (spec.num_envs, spec.obs_shape, spec.is_discrete, spec.action_dim, spec.max_steps) == (4, (2,), False, 1, 5)
    obs = env.reset(seed=0)
    assert obs.shape == (4, 2) and obs.dtype == torch.float32
    for t in range(5):
        obs, reward, terminated, truncated, info = env.step(torch.ones(4, 1))
        assert reward.shape == (4,) and terminated.dtype == truncated.dtype == torch.bool
        assert not terminated.any()
        assert bool(truncated.all()) == (t == 4)
    # the last step's observation before the reset is kept; the new episode starts where `fast` starts
    assert not torch.equal(info["final_obs"], obs)
    assert torch.equal(obs, env.reset(seed=0))


def test_tensors_cross_without_copies() -> None:
    env = make_env("brax/fast", 3, "cpu", seed=0)
    obs = env.reset(seed=1)
    assert obs.data_ptr() == env._state.obs.unsafe_buffer_pointer()  # torch reads JAX's memory
    action = torch.rand(3, 1)
    assert env.jax.dlpack.from_dlpack(action).unsafe_buffer_pointer() == action.data_ptr()  # and JAX reads torch's


def test_a_seed_gives_the_same_episodes() -> None:
    def rollout(seed: int) -> torch.Tensor:
        env = make_env("brax/fast", 2, "cpu")
        out = [env.reset(seed=seed)]
        gen = torch.Generator().manual_seed(0)
        out += [env.step(torch.rand(2, 1, generator=gen) * 2 - 1)[0] for _ in range(3)]
        return torch.stack(out)

    assert torch.equal(rollout(3), rollout(3))


def test_unseeded_envs_start_from_different_keys() -> None:
    keys = [make_env("brax/fast", 2, "cpu")._key for _ in range(2)]  # type: ignore[attr-defined]
    seeded = [make_env("brax/fast", 2, "cpu", seed=5)._key for _ in range(2)]  # type: ignore[attr-defined]
    assert not bool((keys[0] == keys[1]).all())
    assert bool((seeded[0] == seeded[1]).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_actions_are_refused(bad: float) -> None:
    env = make_env("brax/fast", 2, "cpu", seed=0)
    env.reset(seed=0)
    with pytest.raises(EnvError, match="NaN or infinite"):
        env.step(torch.tensor([[bad], [0.0]]))


def test_lists_and_numpy_actions_step_as_the_same_tensor() -> None:
    """A list, tuple or NumPy array of actions steps as the same tensor would; what is not numbers is refused in one
    sentence naming what the env takes."""
    env = make_env("brax/fast", 2, "cpu", seed=0)
    values = [[0.5], [-0.25]]
    env.reset(seed=0)
    want = env.step(torch.tensor(values))
    for action in (values, tuple(values), np.array(values), np.array(values, dtype=np.float32)):
        env.reset(seed=0)
        got = env.step(action)
        assert all(torch.equal(a, b) for a, b in zip(got[:4], want[:4], strict=True)), action
    for junk in (["left", "right"], [[0.5], [0.5, 0.5]], None):
        with pytest.raises(EnvError, match=r"^the Brax env cannot read actions from a \w+ \([^)]*\)+; pass a "
                                           r"torch\.Tensor, or a NumPy array or list of real numbers$"):
            env.step(junk)

def test_ppo_trains_and_the_agent_predicts(tmp_path: Path) -> None:
    result = jaderl.train("ppo", "brax/fast?episode_length=20", total_steps=512, num_envs=4, horizon=64,
                          minibatch_size=128, eval_every=256, eval_episodes=2, run_dir=str(tmp_path / "run"),
                          device="cpu")
    assert result.steps == 512
    action = jaderl.load(tmp_path / "run").predict([0.0, 0.0])
    assert action.shape == (1,)


def test_bad_ids_and_a_missing_brax_are_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EnvError, match=r"^unknown Brax env 'no_such_env'; choose one of: .*\bant\b"):
        make_env("brax/no_such_env", 2)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "brax" else real(name, *a))
    with pytest.raises(EnvError, match=r"pip install 'jaderl\[brax\]'"):
        make_env("brax/ant", 2)

