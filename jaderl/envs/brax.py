"""JAX simulators as jaderl envs, Brax and MuJoCo Playground: batched states stay in JAX, tensors cross to torch
through DLPack.

``make_env("brax/ant", num_envs, device)`` builds Brax's ``ant`` (any name of ``brax.envs``; options after ``?`` go
to ``brax.envs.get_environment``, e.g. ``brax/ant?backend=positional``, except ``episode_length``, 1000 by default;
``pip install 'jaderl[brax]'``). ``make_env("playground/CartpoleBalance", num_envs, device)`` builds a MuJoCo
Playground env (MJX or MuJoCo Warp physics; any name of ``mujoco_playground.registry``; options after ``?`` override
the env's default config, e.g. ``playground/CheetahRun?impl=jax``, and ``episode_length`` and ``action_repeat``
default to the config's; ``pip install 'jaderl[playground]'``). Both have Brax's interface (``reset(key)``,
``step(state, action)``) and are stepped by one jit-compiled function over all ``num_envs`` sub-envs. What the
adapter decides:

* **No copies.** Observations, rewards and flags are JAX arrays handed to torch with ``torch.from_dlpack`` (the same
  memory), and jaderl's actions are handed to JAX with ``jax.dlpack.from_dlpack``. That holds when JAX and torch
  use the same device (both on the CPU, or JAX's GPU and ``cuda``); otherwise the tensors are moved to ``device``.
* **Observations.** An env whose observation is a dict (Playground's locomotion and manipulation envs: the policy's
  ``state`` beside a critic's ``privileged_state``) gives the entry ``obs_key`` names (``?obs_key=...``; ``state``
  by default).
* **Episode ends.** Brax's ``EpisodeWrapper`` truncates after ``episode_length`` physics steps (``action_repeat``
  of them per jaderl step); a sub-env that ends earlier (``done``: fell, or a task's failure) is terminated. The step
  function resets the finished sub-envs itself, from fresh random keys, and only on steps where one finished
  (``jax.lax.cond``); the observation each reached before its reset is ``info["final_obs"]``, so a truncated episode
  bootstraps from its true last state. (Brax's own ``AutoResetWrapper`` restarts every episode from the same first
  state and loses the last observation.)
* **Actions** are the env's own: ``action_size`` values in ``[-1, 1]``, so jaderl's actions pass as they are (a
  list or NumPy array of numbers is converted to a tensor on ``device`` first).
* **Compiling.** The first ``reset`` and ``step`` compile: tens of seconds for ``brax/ant`` on a CPU (Brax's ``fast``
  test env, about a second), 4-18 s for Playground's ``CartpoleBalance``. These are GPU simulators: on a CPU they
  step slowly (Playground's ``CheetahRun``, 16 sub-envs: about 60 ms a step with MuJoCo Warp, 200 ms with MJX).
* **Seeds.** ``reset(seed)`` starts the JAX random key from ``seed``; without a seed it continues the env's key. An
  env made without a seed starts from a random key.
  The env cannot be copied into a checkpoint (a resumed run restarts its episodes from a reset).
* **NaN.** Observations and rewards are checked for NaN and infinities: on the CPU at every step, on a GPU every 64
  steps and before a checkpoint (:class:`~jaderl.envs.vec.FiniteWatch`), so diverged physics stops the run and does
  not reach a checkpoint.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import torch

from jaderl.envs.vec import NONFINITE_ACTIONS, EnvError, FiniteWatch, VecEnv, as_action_tensor

__all__ = ["BraxVecEnv", "JaxVecEnv", "PlaygroundVecEnv", "make_brax_env", "make_playground_env"]

BRAX_EXTRA = "pip install 'jaderl[brax]' (Brax and JAX)"
PLAYGROUND_EXTRA = "pip install 'jaderl[playground]' (MuJoCo Playground, MJX, MuJoCo Warp and JAX)"


class JaxVecEnv(VecEnv):
    """``num_envs`` sub-envs of ``base``, a JAX env with Brax's interface (see the module docstring); ``label`` names
    the simulator in error messages."""

    physics_hint: str = "other physics options after '?'"
    """What to try when the physics diverges, in the error that says so."""

    def __init__(self, base: Any, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                 episode_length: int = 1000, action_repeat: int = 1, obs_key: str = "state",
                 label: str = "JAX") -> None:
        import jax
        import jax.numpy as jnp
        from brax.envs.wrappers import training

        size = base.observation_size
        if isinstance(size, Mapping):  # several observations: the policy's is obs_key's
            if obs_key not in size:
                raise EnvError(f"the {label} env's observation has no {obs_key!r} entry; pass ?obs_key= one of: "
                               f"{', '.join(size)}")
            self.obs_shape: tuple[int, ...] = tuple(int(n) for n in size[obs_key])
            self._observe = lambda state: state.obs[obs_key]
        else:
            self.obs_shape = (int(size),)
            self._observe = lambda state: state.obs
        if episode_length < 1 or action_repeat < 1:
            raise EnvError(f"episode_length={episode_length} and action_repeat={action_repeat} must be at least 1")
        self.jax, self.label, self.num_envs, self.device = jax, label, int(num_envs), torch.device(device)
        self.is_discrete, self.action_dim = False, int(base.action_size)
        self.max_steps = -(-int(episode_length) // int(action_repeat))  # jaderl steps: action_repeat physics steps
        self._low = self._high = None  # the env's actions are [-1, 1]: jaderl's own
        env = training.VmapWrapper(training.EpisodeWrapper(base, episode_length=int(episode_length),
                                                           action_repeat=int(action_repeat)))
        n, observe = self.num_envs, self._observe

        def reset(key: Any) -> Any:
            return env.reset(jax.random.split(key, n))

        def step(state: Any, action: Any, key: Any) -> tuple[Any, ...]:
            nxt = env.step(state, action)
            done = nxt.done > 0
            key, sub = jax.random.split(key)

            def pick(fresh: Any, stepped: Any) -> Any:  # a leaf not batched by sub-env (MuJoCo Warp has some) stays
                if stepped.ndim == 0 or stepped.shape[0] != n:
                    return stepped
                return jnp.where(done.reshape(done.shape + (1,) * (stepped.ndim - 1)), fresh, stepped)

            def restart(_: Any) -> Any:  # finished sub-envs from fresh keys, the others as they are
                return jax.tree.map(pick, env.reset(jax.random.split(sub, n)), nxt)

            following = jax.lax.cond(jnp.any(done), restart, lambda _: nxt, None)
            truncated = nxt.info["truncation"] > 0
            return following, observe(nxt), nxt.reward, done & ~truncated, truncated, key

        self._reset, self._step = jax.jit(reset), jax.jit(step)
        # unseeded: a random key, as the torch-native envs draw a random seed
        self._key = jax.random.PRNGKey(torch.Generator().seed() % 2**31 if seed is None else seed)
        self._state: Any = None
        self._watch = FiniteWatch(f"the {label} env returned a non-finite observation or reward; its physics diverged "
                                  f"(try {self.physics_hint}, or smaller actions)")

    def _torch(self, array: Any) -> torch.Tensor:
        """A JAX array as a tensor on ``device``: the same memory where the devices agree."""
        tensor = torch.from_dlpack(array)
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def _check(self, obs: torch.Tensor, reward: torch.Tensor) -> None:
        self._watch(obs)
        self._watch(reward)

    def state_dict(self) -> None:
        """None (the env cannot be copied), after the checks a checkpoint waits for (see the module docstring)."""
        self._watch.flush()
        return None

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self._key = self.jax.random.PRNGKey(seed)
        self._key, sub = self.jax.random.split(self._key)
        self._state = self._reset(sub)
        obs = self._torch(self._observe(self._state))
        self._check(obs, torch.zeros(()))
        return obs

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        action = as_action_tensor(action, self.device, f"the {self.label} env")  # (a tensor: detached)
        if self._state is None:
            self.reset()
        if action.numel() != self.num_envs * self.action_dim:
            raise EnvError(f"expected actions of shape {(self.num_envs, self.action_dim)}, got {tuple(action.shape)}")
        if action.device.type == "cpu" and not bool(torch.isfinite(action).all()):  # before clamping turns inf into 1
            raise EnvError(NONFINITE_ACTIONS)
        action = action.reshape(self.num_envs, self.action_dim).float().clamp(-1.0, 1.0).contiguous()
        self._state, final_obs, reward, terminated, truncated, self._key = self._step(
            self._state, self.jax.dlpack.from_dlpack(action), self._key)
        obs, reward = self._torch(self._observe(self._state)), self._torch(reward)
        self._check(obs, reward)
        return (obs, reward, self._torch(terminated), self._torch(truncated),
                {"final_obs": self._torch(final_obs)})


class BraxVecEnv(JaxVecEnv):
    """``num_envs`` sub-envs of the Brax env ``name`` (see the module docstring)."""

    physics_hint = "another backend, e.g. ?backend=positional"

    def __init__(self, name: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                 episode_length: int = 1000, **kwargs: Any) -> None:
        if importlib.util.find_spec("brax") is None:
            raise EnvError(f"Brax envs need the brax package: {BRAX_EXTRA}")
        from brax import envs

        name = name.removeprefix("brax/")
        try:
            base = envs.get_environment(name, **kwargs)
        except KeyError:
            raise EnvError(f"unknown Brax env {name!r}; choose one of: {', '.join(sorted(envs._envs))}") from None
        except TypeError as exc:
            raise EnvError(f"Brax env {name!r}: {exc}; see brax.envs for its options") from None
        super().__init__(base, num_envs, device, seed, episode_length, label="Brax")


class PlaygroundVecEnv(JaxVecEnv):
    """``num_envs`` sub-envs of the MuJoCo Playground env ``name``; ``overrides`` change its default config (see the
    module docstring)."""

    physics_hint = "the other physics, ?impl=jax or ?impl=warp"

    def __init__(self, name: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                 episode_length: int | None = None, action_repeat: int | None = None, obs_key: str = "state",
                 **overrides: Any) -> None:
        if importlib.util.find_spec("mujoco_playground") is None or importlib.util.find_spec("brax") is None:
            raise EnvError(f"MuJoCo Playground envs need the playground package: {PLAYGROUND_EXTRA}")
        if importlib.util.find_spec("warp") is not None:
            import warp

            warp.config.log_level = max(warp.config.log_level, warp.LOG_WARNING)  # no line per kernel module loaded
        from mujoco_playground import registry

        name = name.removeprefix("playground/")
        if name not in registry.ALL_ENVS:
            raise EnvError(f"unknown MuJoCo Playground env {name!r}; choose one of: "
                           f"{', '.join(sorted(registry.ALL_ENVS))}")
        config = registry.get_default_config(name)
        unknown = [key for key in overrides if key not in config]
        if unknown:
            raise EnvError(f"MuJoCo Playground env {name!r} has no option {unknown[0]!r}; its options are "
                           f"{', '.join(sorted([*config.keys(), 'obs_key']))}")
        base = registry.load(name, config_overrides=overrides or None)
        super().__init__(base, num_envs, device, seed,
                         int(config.get("episode_length", 1000) if episode_length is None else episode_length),
                         int(config.get("action_repeat", 1) if action_repeat is None else action_repeat),
                         obs_key, label="MuJoCo Playground")


def make_brax_env(name: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                  **options: Any) -> VecEnv:
    """``num_envs`` sub-envs of the Brax env ``name`` (``ant`` or ``brax/ant``) on ``device``; ``options`` go to
    ``brax.envs.get_environment`` (``episode_length`` to the time limit). See the module docstring."""
    return BraxVecEnv(name, num_envs, device=device, seed=seed, **options)


def make_playground_env(name: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                        **options: Any) -> VecEnv:
    """``num_envs`` sub-envs of the MuJoCo Playground env ``name`` (``CartpoleBalance`` or
    ``playground/CartpoleBalance``) on ``device``; ``options`` override the env's config (``episode_length``,
    ``action_repeat`` and ``obs_key`` go to the adapter). See the module docstring."""
    return PlaygroundVecEnv(name, num_envs, device=device, seed=seed, **options)
