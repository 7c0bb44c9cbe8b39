"""Every torch-native env gives its whole state (VecEnv.state_dict): a copy continues bit for bit, through
auto-resets, so a Trainer's copy or checkpoint continues the same episodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaderl.envs import TORCH_ENVS, EnvError, make_env


def _actions(env: object, generator: torch.Generator) -> torch.Tensor:
    spec = env.spec  # type: ignore[attr-defined]
    agents = (spec.num_agents,) if spec.num_agents > 1 else ()
    if spec.is_discrete:
        return torch.randint(spec.action_dim, (spec.num_envs, *agents), generator=generator)
    return torch.rand(spec.num_envs, *agents, spec.action_dim, generator=generator) * 2 - 1


@pytest.mark.parametrize("env_id", sorted(TORCH_ENVS))
def test_a_copy_of_a_torch_env_continues_bit_identically(env_id: str) -> None:
    original = make_env(env_id, 3, "cpu", seed=1)
    original.reset()
    generator = torch.Generator().manual_seed(0)
    for _ in range(7):
        original.step(_actions(original, generator))
    copy = make_env(env_id, 3, "cpu", seed=99)
    copy.reset()
    copy.load_state_dict(original.state_dict())
    for _ in range(400):  # past every built-in env's episode length: auto-resets draw from the copied stream
        actions = _actions(original, generator)
        for a, b in zip(original.step(actions)[:4], copy.step(actions)[:4], strict=True):
            assert torch.equal(a, b)


def test_gymnasium_envs_cannot_be_copied() -> None:
    env = make_env("CartPole-v1", 2, "cpu", seed=0)
    try:
        assert env.state_dict() is None  # their episodes restart after a load
    finally:
        env.close()


@pytest.mark.parametrize("env_id", sorted(TORCH_ENVS))
def test_a_state_dict_is_a_snapshot_that_later_steps_leave_alone(env_id: str) -> None:
    env = make_env(env_id, 3, "cpu", seed=1)
    env.reset()
    generator = torch.Generator().manual_seed(0)
    env.step(_actions(env, generator))
    saved = env.state_dict()
    kept = {k: v.clone() for k, v in saved.items()}
    for _ in range(3):
        env.step(_actions(env, generator))
    for name, value in saved.items():
        assert torch.equal(value, kept[name]), name


@pytest.mark.parametrize("env_id", sorted(TORCH_ENVS))
def test_a_state_of_another_number_of_sub_envs_is_refused_in_one_sentence(env_id: str) -> None:
    small, env = make_env(env_id, 1, "cpu", seed=1), make_env(env_id, 3, "cpu", seed=1)
    small.reset()
    with pytest.raises(EnvError, match=r"(must have shape|the state's \w+ has shape) .*") as info:
        env.load_state_dict(small.state_dict())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("env_id", sorted(TORCH_ENVS))
def test_an_action_that_carries_gradients_steps_the_env_and_stays_out_of_its_state(env_id: str) -> None:
    """A policy's output passed on without ``no_grad``: the env steps on its values, and nothing it returns (or
    keeps) joins the policy's graph."""
    env = make_env(env_id, 2, "cpu", seed=1)
    env.reset()
    action = _actions(env, torch.Generator().manual_seed(0))
    if action.is_floating_point():
        action = action.requires_grad_()
    obs, reward, *_ = env.step(action * 1.0 if action.requires_grad else action)
    assert not obs.requires_grad and not reward.requires_grad
    assert not any(v.requires_grad for v in env.state_dict().values())


@pytest.mark.parametrize(("settings", "said"), [
    ({"num_envs": 2.5}, r"^num_envs=2.5 is invalid: give a whole number >= 1"),
    ({"num_envs": 0}, r"^num_envs=0 is invalid"),
    ({"num_envs": True}, r"^num_envs=True is invalid"),
    ({"num_envs": 2, "seed": 3.7}, r"^seed=3.7 is invalid: give a whole number, or None for a random one$"),
    ({"num_envs": 2, "seed": "5"}, r"^seed='5' is invalid"),
])
def test_make_env_refuses_a_count_or_seed_that_is_not_a_whole_number(settings: dict, said: str) -> None:
    with pytest.raises(EnvError, match=said):
        make_env("jaderl/CartPole-v1", **settings)


@pytest.mark.parametrize("env_id", sorted(TORCH_ENVS))
@pytest.mark.parametrize("seed", [3.7, "5", True])
def test_a_torch_env_refuses_a_seed_that_is_not_a_whole_number(env_id: str, seed: object) -> None:
    env = make_env(env_id, 2, "cpu")
    with pytest.raises(EnvError, match=rf"^seed={seed!r} is invalid: give a whole number, or None for a random one$"):
        env.reset(seed=seed)  # type: ignore[arg-type]
    assert env.reset(seed=np.int64(4)).shape == env.reset(seed=4).shape  # numpy's integers are whole numbers
