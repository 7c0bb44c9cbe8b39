"""Every torch-native env gives its whole state (VecEnv.state_dict): a copy continues bit for bit, through
auto-resets, so a Trainer's copy or checkpoint continues the same episodes."""

from __future__ import annotations

import pytest
import torch

from jaderl.envs import TORCH_ENVS, make_env


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
