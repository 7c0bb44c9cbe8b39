"""Brax (JAX) simulators as jaderl envs: batched states stay in JAX, tensors cross to torch through DLPack.

``make_env("brax/ant", num_envs, device)`` builds Brax's ``ant`` (any name of ``brax.envs``; options after ``?`` go
to ``brax.envs.get_environment``, e.g. ``brax/ant?backend=positional``, except ``episode_length``, 1000 by default)
with ``num_envs`` sub-envs stepped by one jit-compiled function (``pip install 'jaderl[brax]'``). What the adapter
decides:

* **No copies.** Observations, rewards and flags are JAX arrays handed to torch with ``torch.from_dlpack`` (the same
  memory), and jaderl's actions are handed to JAX with ``jax.dlpack.from_dlpack``. That holds when JAX and torch
  use the same device (both on the CPU, or JAX's GPU and ``cuda``); otherwise the tensors are moved to ``device``.
* **Episode ends.** Brax's ``EpisodeWrapper`` truncates at ``episode_length`` steps; a sub-env that falls (``done``
  before the limit) is terminated. The step function resets the finished sub-envs itself, from fresh random keys,
  and only on steps where one finished (``jax.lax.cond``); the observation each reached before its reset is
  ``info["final_obs"]``, so a truncated episode bootstraps from its true last state. (Brax's own ``AutoResetWrapper``
  restarts every episode from the same first state and loses the last observation.)
* **Actions** are Brax's own: ``action_size`` values in ``[-1, 1]``, so jaderl's actions pass as they are.
* **Compiling.** The first ``reset`` and ``step`` compile (tens of seconds for ``ant`` on a CPU; Brax's ``fast`` test
  env compiles in about a second).
* **Seeds.** ``reset(seed)`` starts the JAX random key from ``seed``; without a seed it continues the env's key.
  The env cannot be copied into a checkpoint (a resumed run restarts its episodes from a reset).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from jaderl.envs.vec import NONFINITE_ACTIONS, EnvError, VecEnv

__all__ = ["BraxVecEnv", "make_brax_env"]

BRAX_EXTRA = "pip install 'jaderl[brax]' (Brax and JAX)"


class BraxVecEnv(VecEnv):
    """``num_envs`` sub-envs of the Brax env ``name`` (see the module docstring)."""

    def __init__(self, name: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                 episode_length: int = 1000, **kwargs: Any) -> None:
        if importlib.util.find_spec("brax") is None:
            raise EnvError(f"Brax envs need the brax package: {BRAX_EXTRA}")
        import jax
        import jax.numpy as jnp
        from brax import envs
        from brax.envs.wrappers import training

        name = name.removeprefix("brax/")
        try:
            base = envs.get_environment(name, **kwargs)
        except KeyError:
            raise EnvError(f"unknown Brax env {name!r}; choose one of: {', '.join(sorted(envs._envs))}") from None
        except TypeError as exc:
            raise EnvError(f"Brax env {name!r}: {exc}; see brax.envs for its options") from None
        self.jax, self.num_envs, self.device = jax, int(num_envs), torch.device(device)
        self.obs_shape, self.is_discrete, self.action_dim = (int(base.observation_size),), False, int(base.action_size)
        self.max_steps = int(episode_length)
        self._low = self._high = None  # Brax's actions are [-1, 1]: jaderl's own
        env = training.VmapWrapper(training.EpisodeWrapper(base, episode_length=self.max_steps, action_repeat=1))
        n = self.num_envs

        def reset(key: Any) -> Any:
            return env.reset(jax.random.split(key, n))

        def step(state: Any, action: Any, key: Any) -> tuple[Any, ...]:
            nxt = env.step(state, action)
            done = nxt.done > 0
            key, sub = jax.random.split(key)

            def restart(_: Any) -> Any:  # finished sub-envs from fresh keys, the others as they are
                fresh = env.reset(jax.random.split(sub, n))
                return jax.tree.map(lambda a, b: jnp.where(done.reshape(done.shape + (1,) * (b.ndim - 1)), a, b),
                                    fresh, nxt)

            following = jax.lax.cond(jnp.any(done), restart, lambda _: nxt, None)
            truncated = nxt.info["truncation"] > 0
            return following, nxt.obs, nxt.reward, done & ~truncated, truncated, key

        self._reset, self._step = jax.jit(reset), jax.jit(step)
        self._key = jax.random.PRNGKey(0 if seed is None else seed)
        self._state: Any = None

    def _torch(self, array: Any) -> torch.Tensor:
        """A JAX array as a tensor on ``device``: the same memory where the devices agree."""
        tensor = torch.from_dlpack(array)
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def _check(self, obs: torch.Tensor, reward: torch.Tensor) -> None:
        if self.device.type == "cpu" and not (bool(torch.isfinite(obs).all()) and bool(torch.isfinite(reward).all())):
            raise EnvError("the Brax env returned a non-finite observation or reward; its physics diverged (try "
                           "another backend, e.g. ?backend=positional, or smaller actions)")

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self._key = self.jax.random.PRNGKey(seed)
        self._key, sub = self.jax.random.split(self._key)
        self._state = self._reset(sub)
        obs = self._torch(self._state.obs)
        self._check(obs, torch.zeros(()))
        return obs

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        if self._state is None:
            self.reset()
        if action.numel() != self.num_envs * self.action_dim:
            raise EnvError(f"expected actions of shape {(self.num_envs, self.action_dim)}, got {tuple(action.shape)}")
        action = action.reshape(self.num_envs, self.action_dim).float().clamp(-1.0, 1.0).contiguous()
        if action.device.type == "cpu" and not bool(torch.isfinite(action).all()):
            raise EnvError(NONFINITE_ACTIONS)
        self._state, final_obs, reward, terminated, truncated, self._key = self._step(
            self._state, self.jax.dlpack.from_dlpack(action), self._key)
        obs, reward = self._torch(self._state.obs), self._torch(reward)
        self._check(obs, reward)
        return (obs, reward, self._torch(terminated), self._torch(truncated),
                {"final_obs": self._torch(final_obs)})


def make_brax_env(name: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                  **options: Any) -> VecEnv:
    """``num_envs`` sub-envs of the Brax env ``name`` (``ant`` or ``brax/ant``) on ``device``; ``options`` go to
    ``brax.envs.get_environment`` (``episode_length`` to the time limit). See the module docstring."""
    return BraxVecEnv(name, num_envs, device=device, seed=seed, **options)
