"""GPU simulators that speak Gymnasium's vector API in torch tensors (Isaac Lab, ManiSkill3): no numpy round trip.

Isaac Lab's tasks (``gym.make("Isaac-Cartpole-v0", cfg=...)``), ManiSkill3's ``ManiSkillVectorEnv`` and Gymnasium's own
``NumpyToTorch`` vector wrapper all step thousands of sub-envs in one call and return torch tensors on their device.
:class:`TorchVectorEnv` adapts any of them to jaderl's contract (:mod:`jaderl.envs.vec`) as they are: actions are
rescaled from ``[-1, 1]`` to the action space's bounds on the env's device and handed over as one tensor; the
observations, rewards and flags come back on the training device with no numpy round trip (a GPU simulator and the
learner share one device). A tensor that is the env's own memory is copied there, one copy on the device a step:
simulators write each step into the same buffers (Isaac Lab's rewards and episode ends), and a rollout keeps every
step's tensors.

What the adapter reads:

* **Observations**: a tensor ``(N, *obs_shape)``, or a dict of tensors from which ``obs_key`` is taken (Isaac Lab's
  ``{"policy": ...}``, the default key); uint8 where the observation space is uint8 (images), float32 otherwise.
* **Actions**: a ``Discrete`` space (jaderl's action ``i`` is the space's ``start + i``) or a bounded 1-D ``Box``
  (jaderl's ``[-1, 1]`` rescaled to its bounds, then clipped to them so that float32 rounding never leaves them; an
  unbounded one, such as Isaac Lab's, takes the bounds given as ``action_bounds``). A
  list or NumPy array of numbers is taken too (converted to a tensor on the env's device). On the CPU, NaN or infinite
  actions and discrete ones out of range or not whole numbers (``0.7``) raise :class:`~jaderl.envs.vec.EnvError`; on a
  GPU they are not checked.
* **Episode ends**: the env must reset finished sub-envs inside ``step`` (all three do; a Gymnasium vector env whose
  ``metadata["autoreset_mode"]`` names another mode, Gymnasium's default next-step one included, is refused). What
  each sub-env reached before its reset is read from ``info["final_obs"]`` (Gymnasium 1.x's name) or
  ``info["final_observation"]`` (ManiSkill3's): a tensor ``(N, *obs_shape)`` whose rows of finished sub-envs are used
  (``NumpyToTorch`` needs those rows stacked into one array first: Gymnasium's same-step autoreset stores them as an
  object array, which its converter cannot turn into a tensor; see ``tests/envs/test_torch_vector.py``). Isaac Lab
  gives no final observation: a sub-env truncated at its time limit then bootstraps from its reset observation, which
  Isaac Lab's own training scripts (rsl_rl, skrl) accept too; that is documented for it in docs/simulators.md.
* **Episode length**: ``max_steps`` from the env's ``spec.max_episode_steps``, a time-limit wrapper's
  ``_max_episode_steps`` (ManiSkill3's) or Isaac Lab's ``max_episode_length``.

:func:`make_maniskill_env` builds ManiSkill3's tasks this way for the ids ``maniskill/<Task>``
(``jaderl.envs.make_env``).

Observations and rewards are checked for NaN and infinities: on the CPU at every step, on a GPU every 64 steps and
before a checkpoint (:class:`~jaderl.envs.vec.FiniteWatch`: a check at every step would wait for the device), so bad
data stops the run and does not reach a checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from jaderl.envs.vec import (
    NONFINITE_ACTIONS,
    EnvError,
    FiniteWatch,
    VecEnv,
    as_action_tensor,
    discrete_action_error,
    refuse_non_integral,
)


def _owned(value: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a tensor of ``dtype`` on ``device`` that the env cannot change afterwards: a copy where the
    conversion would give back the env's own memory. Simulators write each step's results into the same buffers
    (Isaac Lab's rewards and episode ends, Isaac Gym's observations), while a rollout keeps every step's tensors."""
    tensor = torch.as_tensor(value, device=device).to(dtype)
    if isinstance(value, torch.Tensor) and tensor.numel() and tensor.data_ptr() == value.data_ptr():
        return tensor.clone()
    return tensor


class TorchVectorEnv(VecEnv):
    """Adapts a Gymnasium-API vector env that returns torch tensors to the jaderl contract (see the module docstring).

    ``device``: the training device the tensors are moved to (default: the env's own ``device`` attribute, else the
    device of the first observation); ``obs_key``: the entry of a dict observation the agent reads;
    ``action_bounds``: ``(low, high)`` that jaderl's ``[-1, 1]`` is rescaled to in place of a ``Box`` action space's
    own bounds, which is how an unbounded space is taken (Isaac Lab declares ``Box(-inf, inf)`` and its own training
    scripts clip actions, e.g. to ``(-1, 1)``)."""

    def __init__(self, env: Any, device: str | torch.device | None = None, obs_key: str = "policy",
                 action_bounds: tuple[float, float] | None = None) -> None:
        if not hasattr(env, "num_envs") or not hasattr(env, "single_action_space"):
            raise EnvError(f"cannot adapt {type(env).__name__}: TorchVectorEnv takes a Gymnasium-API vector env "
                           "(num_envs, single_observation_space, single_action_space)")
        self.env, self.obs_key, self.num_envs = env, obs_key, int(env.num_envs)
        env_device = getattr(env.unwrapped, "device", None) or getattr(env, "device", None)
        self.device = torch.device(device if device is not None else env_device if env_device is not None else "cpu")
        self.env_device = torch.device(env_device) if env_device is not None else self.device
        obs_space = env.single_observation_space
        if isinstance(obs_space, gym.spaces.Dict):
            if obs_key not in obs_space.spaces:
                raise EnvError(f"the env observes a dict with keys {sorted(obs_space.spaces)}; pass obs_key= one of "
                               "them (the one the policy reads)")
            obs_space = obs_space[obs_key]
        if not isinstance(obs_space, gym.spaces.Box):
            raise EnvError(f"observation space {obs_space} is not supported: jaderl needs a Box observation space; "
                           "wrap each sub-env in gymnasium.wrappers.FlattenObservation before vectorising (a Discrete "
                           "becomes a one-hot Box), or have the simulator give a Box")
        self.obs_shape = tuple(obs_space.shape)
        # uint8 images stay uint8 (the spec says so: predict and exported policies scale them as the CNN did)
        self._obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
        act_space = env.single_action_space
        if isinstance(act_space, gym.spaces.Discrete):
            self.is_discrete, self.action_dim, self._start = True, int(act_space.n), int(act_space.start)
            self._low = self._high = None
        elif isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
            low, high = torch.as_tensor(act_space.low, dtype=torch.float64), torch.as_tensor(act_space.high,
                                                                                             dtype=torch.float64)
            if action_bounds is not None:
                bound_low, bound_high = (float(b) for b in action_bounds)
                if not (math.isfinite(bound_low) and math.isfinite(bound_high) and bound_low < bound_high):
                    raise EnvError(f"action_bounds={action_bounds} are not two finite numbers, low < high")
                low, high = torch.full_like(low, bound_low), torch.full_like(high, bound_high)
            if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
                raise EnvError(f"action space {act_space} is unbounded: jaderl rescales actions from [-1, 1]; pass "
                               "action_bounds=(low, high) to rescale them to, e.g. (-1.0, 1.0)")
            self.is_discrete, self.action_dim, self._start = False, int(act_space.shape[0]), 0
            self._low, self._high = low.numpy(), high.numpy()  # the spec's bounds
            self._scale_low = low.to(self.env_device, torch.float32)
            self._scale = ((high - low) * 0.5).to(self.env_device, torch.float32)
            self._act_low, self._act_high = low.to(self.env_device, torch.float32), high.to(self.env_device,
                                                                                             torch.float32)
        else:
            raise EnvError(f"action space {act_space} is not supported: use Discrete or a 1-D Box")
        self.max_steps = _episode_limit(env)
        metadata = getattr(env, "metadata", None)
        mode = metadata.get("autoreset_mode") if isinstance(metadata, dict) else None
        same_step = gym.vector.AutoresetMode.SAME_STEP
        if mode is not None and mode not in (same_step, same_step.value):
            raise EnvError(f"the vector env auto-resets in mode {mode}; build it with "
                           "autoreset_mode=gym.vector.AutoresetMode.SAME_STEP (finished sub-envs reset inside step, "
                           "their final observations in info['final_obs'])")
        fix = "fix the env or wrap it to clip or reset"
        self._obs_watch = FiniteWatch(f"the env returned a non-finite observation; {fix}")
        self._reward_watch = FiniteWatch(f"the env returned a non-finite reward; {fix}")

    def _obs(self, obs: Any) -> torch.Tensor:
        if isinstance(obs, dict):
            obs = obs[self.obs_key]
        obs = _owned(obs, self.device, self._obs_dtype)
        if obs.dtype != torch.uint8:
            self._obs_watch(obs)
        return obs.reshape(self.num_envs, *self.obs_shape)

    def _actions(self, action: torch.Tensor) -> torch.Tensor:
        """jaderl's actions as the env's: ``(N,)`` integers from the space's start, or ``(N, action_dim)`` rescaled
        from ``[-1, 1]`` to the bounds; on the env's device. A list or NumPy array of numbers is read as a tensor.

        On the CPU, NaN or infinite actions and discrete ones out of range or not whole numbers (float actions such as
        ``0.7``) raise a one-sentence :class:`EnvError`; on an accelerator they are not checked (that would wait for
        the device every step), and a non-integral discrete action is truncated."""
        action = as_action_tensor(action, self.env_device, "the env")  # (a tensor: detached)
        expected = (self.num_envs,) if self.is_discrete else (self.num_envs, self.action_dim)
        if action.numel() != self.num_envs * (1 if self.is_discrete else self.action_dim):
            raise EnvError(f"expected actions of shape {expected}, got {tuple(action.shape)}")
        action = action.reshape(expected).to(self.env_device)
        if self.is_discrete:
            if action.device.type == "cpu" and self.num_envs:
                if action.is_floating_point():  # NaN, inf and 0.7 are no actions (an int tensor skips this)
                    if not bool(torch.isfinite(action).all()):
                        raise EnvError(NONFINITE_ACTIONS)
                    refuse_non_integral(action, "the env")
                low, high = int(action.min()), int(action.max())
                if low < 0 or high >= self.action_dim:
                    raise discrete_action_error("the env", self.action_dim, low, high)
            return action.long() + self._start
        if action.device.type == "cpu" and not bool(torch.isfinite(action).all()):
            raise EnvError(NONFINITE_ACTIONS)
        scaled = torch.addcmul(self._scale_low, action.float().clamp(-1.0, 1.0) + 1.0, self._scale)
        return scaled.clamp(self._act_low, self._act_high)  # float32 rounding must not leave the bounds

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.env.reset(seed=seed)
        return self._obs(obs)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        obs, reward, terminated, truncated, info = self.env.step(self._actions(action))
        obs = self._obs(obs)
        reward = _owned(reward, self.device, torch.float32).reshape(self.num_envs)
        self._reward_watch(reward)
        terminated = _owned(terminated, self.device, torch.bool).reshape(self.num_envs)
        truncated = _owned(truncated, self.device, torch.bool).reshape(self.num_envs)
        final = info.get("final_obs", info.get("final_observation")) if isinstance(info, dict) else None
        if final is None:
            final_obs = obs
        else:
            done = (terminated | truncated).view(-1, *([1] * len(self.obs_shape)))
            final_obs = torch.where(done, self._obs(final), obs)
        return obs, reward, terminated, truncated, {"final_obs": final_obs}

    def state_dict(self) -> None:
        """None (the env cannot be copied), after the checks a checkpoint waits for (see the module docstring)."""
        self._obs_watch.flush()
        self._reward_watch.flush()
        return None

    def close(self) -> None:
        self.env.close()


MANISKILL_EXTRA = "pip install 'jaderl[maniskill]' (ManiSkill3 and SAPIEN; its GPU simulation needs a CUDA GPU)"


def make_maniskill_env(name: str, num_envs: int, device: str | torch.device = "cuda", seed: int | None = None,
                       obs_mode: str = "state", control_mode: str = "pd_joint_delta_pos", **options: Any) -> VecEnv:
    """``num_envs`` sub-envs of the ManiSkill3 task ``name`` (``PushCube-v1`` or ``maniskill/PushCube-v1``) in a
    :class:`TorchVectorEnv`: ManiSkill3's GPU simulation on a CUDA ``device``, its CPU simulation (one sub-env per
    process) otherwise; auto-reset inside ``step``, terminations kept (a task's success ends its episode), final
    observations read. ``obs_mode`` must give a tensor (``state``); ``options`` go to the task's ``gym.make``. The
    env is seeded by its first ``reset(seed)``, as the Trainer and evaluator call it (``seed`` is not used here)."""
    device = torch.device(device)
    if device.type != "cuda" and num_envs != 1:
        raise EnvError(f"ManiSkill3 simulates one sub-env per process on the CPU, and {num_envs} were asked for; pass "
                       "--device cuda for its GPU simulation, or num_envs=1 and eval_episodes=1")
    try:
        import mani_skill.envs  # noqa: F401  (registers ManiSkill3's tasks with Gymnasium)
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv
    except ImportError:
        raise EnvError(f"ManiSkill3 envs need the mani_skill package: {MANISKILL_EXTRA}") from None
    task = name.removeprefix("maniskill/")
    if task not in gym.registry:
        raise EnvError(f"unknown ManiSkill3 task {task!r}; see ManiSkill3's task list (e.g. PushCube-v1, PickCube-v1)")
    steps = options.get("max_episode_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise EnvError(f"option max_episode_steps={steps!r} of ManiSkill3 task {task!r} must be a whole number of at "
                       "least 1 (the steps after which an episode is truncated), e.g. ?max_episode_steps=100")
    env = gym.make(task, num_envs=num_envs, obs_mode=obs_mode, control_mode=control_mode, render_mode=None,
                   sim_backend="physx_cuda" if device.type == "cuda" else "physx_cpu", **options)
    return TorchVectorEnv(ManiSkillVectorEnv(env, auto_reset=True, ignore_terminations=False), device)


def _episode_limit(env: Any) -> int:
    """The steps after which a sub-env is truncated, 0 when unknown: the env's spec (Gymnasium; a vector env built
    from sub-envs gives theirs), a time-limit wrapper's ``_max_episode_steps`` found down the wrapper chain (ManiSkill3
    keeps its limit there: Gymnasium 1.x leaves ``max_episode_steps`` of the unwrapped env's spec empty), or Isaac
    Lab's ``max_episode_length``."""
    base = env.unwrapped
    specs = [getattr(base, "spec", None), getattr(env, "spec", None)]
    if hasattr(base, "get_attr"):
        with contextlib.suppress(AttributeError, IndexError, TypeError):
            specs.append(base.get_attr("spec")[0])
    limits = [getattr(spec, "max_episode_steps", None) for spec in specs]
    layer, seen = env, set()
    while layer is not None and id(layer) not in seen:  # the wrappers, outermost first
        seen.add(id(layer))
        limits += [getattr(layer, "_max_episode_steps", None), getattr(layer, "max_episode_steps", None)]
        inner = getattr(layer, "_env", None)
        layer = inner if inner is not None else getattr(layer, "env", None)
    limits.append(getattr(base, "max_episode_length", None))
    return next((limit for limit in limits if isinstance(limit, int) and limit > 0), 0)
