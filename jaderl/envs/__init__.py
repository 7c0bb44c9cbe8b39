"""Batched environments: the contract (:mod:`jaderl.envs.vec`), torch-native envs and :func:`make_env`."""

from __future__ import annotations

import torch

from jaderl.envs.classic import TORCH_ENVS
from jaderl.envs.vec import EnvError, GymnasiumVecEnv, VecEnv

__all__ = ["TORCH_ENVS", "EnvError", "GymnasiumVecEnv", "VecEnv", "make_env"]


def make_env(name: str, num_envs: int, device: torch.device | str = "cpu", seed: int | None = None) -> VecEnv:
    """Build ``num_envs`` copies of env ``name``: a built-in torch env (``jaderl/...``), an Atari game (``ALE/...``,
    preprocessed as in :mod:`jaderl.envs.atari`) or any Gymnasium id."""
    if name.startswith("ALE/"):
        from jaderl.envs.atari import make_atari_env

        return make_atari_env(name, num_envs, device)
    if name in TORCH_ENVS:
        return TORCH_ENVS[name](num_envs=num_envs, device=device, seed=seed)
    if name.startswith("jaderl/"):
        raise EnvError(f"unknown env {name!r}; the built-in torch envs are: {', '.join(sorted(TORCH_ENVS))}")
    return GymnasiumVecEnv(name, num_envs=num_envs, device=device)
