"""The batched environment contract every jaderl trainer sees, and the Gymnasium adapter.

Every env is batched: ``reset`` returns ``(N, *obs_shape)`` and ``step`` takes ``(N,)`` integer actions (discrete)
or ``(N, action_dim)`` floats in ``[-1, 1]`` (continuous) and returns torch tensors on ``env.device``:

    obs (N, *obs_shape), reward (N,) float32, terminated (N,) bool, truncated (N,) bool, info

Finished sub-envs reset themselves within the same step; ``info["final_obs"]`` is ``(N, *obs_shape)`` and holds
the observation every sub-env reached with this step, *before* any auto-reset (equal to ``obs`` where nothing
finished), so a truncated episode can be bootstrapped from its real last state.

An env with a random stream of its own keeps it in ``generator`` (a ``torch.Generator``): checkpoints save its state
and :meth:`VecEnv.set_rng_state` restores it.

Bad actions are refused with an :class:`EnvError` where that costs no host-device synchronisation: NaN or infinite
actions, discrete actions outside ``0 .. action_dim - 1`` or given as floats that are not whole numbers (``0.7``),
and a number of actions other than one per sub-env. Continuous actions beyond ``[-1, 1]`` are clipped.

Every env jaderl builds or adapts also takes a list, tuple or NumPy array of numbers as actions, converted to a
tensor on the env's device (:func:`as_action_tensor`), and refuses anything else in one sentence: the torch-native
envs (:mod:`~jaderl.envs.classic`, :mod:`~jaderl.envs.chasing`, :mod:`~jaderl.envs.stock`, :mod:`~jaderl.envs.mpe`),
the adapters of Gymnasium envs (:class:`GymnasiumVecEnv`, Atari's, :class:`~jaderl.envs.subproc.SubprocVecEnv`), of
torch-tensor vector envs (:class:`~jaderl.envs.torch_vector.TorchVectorEnv`), of JAX simulators
(:mod:`~jaderl.envs.brax`) and of multi-agent ones (:mod:`~jaderl.envs.pettingzoo`, :mod:`~jaderl.envs.vmas`).
A tensor is used as it is and only float ones are checked for whole numbers, so the training loop's actions
(tensors of the right dtype) pay for no conversion and no extra check.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import numbers
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch


class EnvError(ValueError):
    """An environment that cannot be built or that misbehaves; the message says what to change."""


NONFINITE_ACTIONS = ("the agent's actions became NaN or infinite; lower the learning rate or check the env's rewards "
                     "(the last checkpoint is kept)")
"""What every env says when it is given a NaN or infinite action: the agent diverged, so do not blame the env."""


def error_line(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line (an env's own error, quoted in a one-sentence EnvError)."""
    kind, module = type(exc), type(exc).__module__
    name = kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    text = " ".join(str(exc).split())
    return f"{name}: {text}" if text else name


JADERL_EXTRAS = ("box2d", "mujoco")
"""Gymnasium's extras that jaderl's extras of the same name install (``pip install 'jaderl[mujoco]'``)."""


def missing_dependency(env_id: str, exc: gym.error.DependencyNotInstalled, module: str = "") -> EnvError:
    """The one-sentence error for a Gymnasium env whose package is not installed: which package, and the pip command
    (jaderl's extra where it has one, else Gymnasium's), read from Gymnasium's message or the env's module."""
    text = " ".join(str(exc).split())
    found = re.search(r"gymnasium\[([\w-]+)\]", text)
    extra = found.group(1) if found else next((e for e in JADERL_EXTRAS if f"envs.{e}" in module), None)
    install = (f"pip install 'jaderl[{extra}]'" if extra in JADERL_EXTRAS else
               f"pip install 'gymnasium[{extra}]'" if extra else "install it")
    package, sep, _ = text.partition(" is not installed")
    if sep and package and len(package.split()) <= 3:
        return EnvError(f"env {env_id!r} needs {package}, which is not installed; {install}")
    return EnvError(f"env {env_id!r} needs a package that is not installed ({text}); {install}")


def discrete_action_error(env_name: str, num_actions: int, low: float, high: float) -> EnvError:
    """The one-sentence error for discrete actions outside ``0 .. num_actions - 1``."""
    return EnvError(f"{env_name} takes discrete actions 0 to {num_actions - 1}, got actions from {low:g} to {high:g}; "
                    f"give the agent {num_actions} actions (the env's action_dim)")


def non_integral_action_error(env_name: str, value: float) -> EnvError:
    """The one-sentence error for a discrete action that is not a whole number (``0.7``)."""
    return EnvError(f"{env_name} takes discrete actions as whole numbers, got {value:g}; pass integer actions (an "
                    "int64 tensor, as the agent's argmax or sample gives)")


def refuse_non_integral(action: torch.Tensor, env_name: str) -> None:
    """Raise :func:`non_integral_action_error` if discrete ``action`` holds floats that are not whole numbers (reads
    the tensor on the host: CPU paths only). Integer tensors, the agents' own, pass without a look."""
    if action.is_floating_point() and not bool((whole := action == action.trunc()).all()):
        raise non_integral_action_error(env_name, action[~whole][0].item())


def as_action_tensor(action: Any, device: torch.device, env_name: str) -> torch.Tensor:
    """``action`` as a tensor: a tensor as it is (detached: an env step is no part of a policy's graph), a list,
    tuple, NumPy array or number converted to one on ``device``; anything that is not numbers (text, ragged lists,
    complex numbers) raises a one-sentence :class:`EnvError` naming the types an env takes."""
    if isinstance(action, torch.Tensor):
        return action.detach()
    try:
        tensor = torch.as_tensor(action, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:
        problem = error_line(exc).partition(". ")[0]  # (NumPy's refusal goes on to list every dtype it takes)
    else:
        if not tensor.is_complex():
            return tensor
        problem = "complex numbers"
    raise EnvError(f"{env_name} cannot read actions from a {type(action).__name__} ({problem}); pass a torch.Tensor, "
                   "or a NumPy array or list of real numbers")


def seed_value(seed: Any) -> int:
    """``seed`` as an int for a ``torch.Generator``, or one sentence when it is not a whole number (3.7 or "5" would
    otherwise be read as another seed than the one meant)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise EnvError(f"seed={seed!r} is invalid: give a whole number, or None for a random one")
    return int(seed)


def state_tensors(state: dict[str, Any], shapes: dict[str, tuple[int, ...] | None]) -> list[torch.Tensor]:
    """The tensors ``shapes`` names in an env's ``state`` (from ``state_dict()``), each checked for its shape (None:
    any): a state of another number of sub-envs (or options) is one sentence, not an error at the next step."""
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise EnvError(f"the state lacks {', '.join(missing)}; pass what state_dict() returned")
    out = []
    for name, shape in shapes.items():
        value = torch.as_tensor(state[name])
        if shape is not None and tuple(value.shape) != shape:
            raise EnvError(f"the state's {name} has shape {tuple(value.shape)}, but this env's is {shape}: load the "
                           "state of an env with the same options and number of sub-envs")
        out.append(value)
    return out


class FiniteWatch:
    """Refuses NaN or infinite data from an env (an :class:`EnvError` with ``message``) without waiting for the device
    on every step.

    On the CPU, where a check costs no host-device synchronisation, every call checks at once. On an accelerator
    (``deferred``, by default when the data is not on the CPU) the calls' verdicts accumulate on the device and are
    read every ``every`` calls and at :meth:`flush`, which an env calls before a checkpoint saves its data: bad data
    stops the run within ``every`` steps and does not reach a checkpoint."""

    def __init__(self, message: str, every: int = 64, deferred: bool | None = None) -> None:
        self.message, self.every, self.deferred = message, every, deferred
        self._ok: torch.Tensor | None = None
        self._calls = 0

    def __call__(self, tensor: torch.Tensor) -> None:
        """Check ``tensor`` (now on the CPU, else within ``every`` calls)."""
        ok = torch.isfinite(tensor).all()
        if not (tensor.device.type != "cpu" if self.deferred is None else self.deferred):
            if not bool(ok):
                raise EnvError(self.message)
            return
        self._ok = ok if self._ok is None else self._ok & ok
        self._calls += 1
        if self._calls % self.every == 0:
            self.flush()

    def flush(self) -> None:
        """Read the verdicts gathered since the last read (one host-device synchronisation) and raise if one failed."""
        if self._ok is not None:
            ok, self._ok = bool(self._ok), None
            if not ok:
                raise EnvError(self.message)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know of a batched env, without the env: agents are built from a spec.

    A multi-agent env (``num_agents > 1``) observes ``(N, num_agents, *obs_shape)``, takes ``(N, num_agents)``
    discrete or ``(N, num_agents, action_dim)`` continuous actions, returns rewards ``(N, num_agents)`` and, when
    ``state_shape`` is set, a global state ``(N, *state_shape)`` from :meth:`VecEnv.global_state` (and the state each
    finished sub-env reached in ``info["final_state"]``). ``obs_shape`` is one agent's observation.
    """

    num_envs: int
    obs_shape: tuple[int, ...]
    is_discrete: bool
    action_dim: int
    """Number of actions when discrete, size of the action vector when continuous."""
    action_low: tuple[float, ...] | None = None
    """The env's own bounds of a continuous action (jaderl acts in [-1, 1] and the env rescales); None: [-1, 1].
    Several agents with bounds of their own: every agent's, agent after agent (``num_agents * action_dim`` values)."""
    action_high: tuple[float, ...] | None = None
    action_dtype: str = "float32"
    """The dtype of a continuous action as the env takes it (its Box's: ``float64``, ``int64`` ...), which
    :meth:`~jaderl.core.agent.Agent.predict` returns."""
    max_steps: int = 0
    """Episode length at which a sub-env is truncated (0 when it has none)."""
    obs_dtype: str = "float32"
    """``uint8`` for images, ``float32`` otherwise (the dtype observations arrive in)."""
    num_agents: int = 1
    state_shape: tuple[int, ...] | None = None
    """Shape of one sub-env's global state (multi-agent envs that have one), else None."""
    teams: tuple[str, ...] = ()
    """The team of every agent (``("adversary", "adversary", "agent")``) in mixed games; empty: one team."""
    agents_leave: bool = False
    """Whether agents may leave an episode before it ends (or join it late): the env then tells which agents act,
    :meth:`VecEnv.active_agents` ``(N, num_agents)`` bool, and which are still in after a step,
    ``info["final_active"]`` (before any auto-reset; at an episode's end, those of its last step that bootstrap: cut
    by a time limit, not terminated), and multi-agent algorithms learn from the agents present only."""

    @property
    def is_multi_agent(self) -> bool:
        return self.num_agents > 1

    def action_bounds(self, device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``action_low`` and ``action_high`` as tensors ``(agents or 1, action_dim)`` (float32 unless ``dtype``), which
        broadcast against actions ``(N, action_dim)`` and ``(N, agents, action_dim)``; None where actions are not
        rescaled."""
        if self.is_discrete or self.action_low is None or self.action_high is None:
            return None
        low, high = (torch.tensor(b, dtype=dtype, device=device).view(-1, self.action_dim)
                     for b in (self.action_low, self.action_high))
        return low, high

    def env_actions(self, action: torch.Tensor) -> np.ndarray:
        """An agent's actions as the env's own: discrete ones as int64 indices from 0, continuous ones rescaled from
        [-1, 1] to the bounds (in float64, so a float64 Box's bounds hold exactly), clipped to them, in
        :attr:`action_dtype` (rounded to the nearest integer for an integer Box)."""
        action = action.detach().cpu()
        if self.is_discrete:
            return action.numpy().astype(np.int64)
        if (bounds := self.action_bounds("cpu", torch.float64)) is not None:
            action = rescale_actions(action.double(), *bounds)
        dtype = np.dtype(self.action_dtype)
        return (action.round() if dtype.kind in "iu" else action).numpy().astype(dtype)

    def replace(self, **changes: Any) -> EnvSpec:
        return dataclasses.replace(self, **changes)


def rescale_actions(action: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Actions in [-1, 1] (clipped to it) as the env's own, ``low + (a + 1) / 2 * (high - low)`` as the env adapters
    rescale them, then clipped to ``[low, high]``: float32 rounding must not leave the bounds (a Box's ``contains``,
    and VMAS, refuse a value a rounding error outside)."""
    return torch.minimum(torch.maximum(low + (action.clamp(-1.0, 1.0) + 1.0) * 0.5 * (high - low), low), high)


class VecEnv:
    """Base class of the batched env contract (see the module docstring).

    Subclasses set the attributes below in ``__init__`` and implement ``reset`` and ``step``; multi-agent envs also
    set ``num_agents`` and ``state_shape`` and implement :meth:`global_state`.
    """

    num_envs: int
    obs_shape: tuple[int, ...]
    is_discrete: bool
    action_dim: int
    """Number of actions when discrete, size of the action vector when continuous."""
    max_steps: int
    """Episode length at which a sub-env is truncated (0 when it has none)."""
    device: torch.device
    num_agents: int = 1
    state_shape: tuple[int, ...] | None = None
    teams: tuple[str, ...] = ()
    agents_leave: bool = False

    @property
    def spec(self) -> EnvSpec:
        """The env's description (an agent is built from it)."""
        low, high = getattr(self, "_low", None), getattr(self, "_high", None)
        uint8 = getattr(self, "_obs_dtype", None) == torch.uint8
        return EnvSpec(num_envs=self.num_envs, obs_shape=tuple(self.obs_shape), is_discrete=self.is_discrete,
                       action_dim=self.action_dim, max_steps=self.max_steps, obs_dtype="uint8" if uint8 else "float32",
                       action_low=None if low is None else tuple(float(x) for x in low),
                       action_high=None if high is None else tuple(float(x) for x in high),
                       action_dtype=getattr(self, "_action_dtype", "float32"), num_agents=self.num_agents,
                       state_shape=self.state_shape, teams=tuple(self.teams), agents_leave=self.agents_leave)

    def global_state(self) -> torch.Tensor:
        """Multi-agent envs: the global state ``(N, *state_shape)`` of every sub-env now."""
        raise NotImplementedError(f"{type(self).__name__} has no global state")

    def active_agents(self) -> torch.Tensor:
        """Multi-agent envs whose agents may leave (``agents_leave``): ``(N, num_agents)`` bool, the agents in every
        sub-env's episode now, whose actions the next step uses."""
        raise NotImplementedError(f"{type(self).__name__} has no agents that leave")

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """Everything a copy needs to continue this env bit for bit (states, step counters, random stream), or None
        for envs that cannot be copied (Gymnasium's: their episodes restart from a reset)."""
        return None

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from :meth:`state_dict` (the next ``step`` continues the same episodes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore its state")

    def reset(self, seed: int | None = None) -> torch.Tensor:
        raise NotImplementedError

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        raise NotImplementedError

    def close(self) -> None:
        """Release processes or files held by the env (nothing for torch-native envs)."""

    _fresh = False
    """Torch envs: true until the first reset or step, while ``reset()`` without a seed keeps the constructor's draw."""

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Continue a checkpoint's random stream (``generator.get_state()``): the next ``reset()`` without a seed
        draws from it. Envs without a ``generator`` (Gymnasium ones are reseeded instead) ignore it.

        A state saved on the other kind of device (a CUDA generator's is a seed and an offset, a CPU generator's a
        Mersenne Twister) cannot be continued: the generator is seeded from a hash of it instead, so a run resumed on
        another device still gets the same episodes from the same checkpoint."""
        generator = getattr(self, "generator", None)
        if generator is not None:
            current = generator.get_state()
            state = state.to(device=current.device, dtype=current.dtype)
            if state.shape == current.shape:
                generator.set_state(state)
            else:
                digest = hashlib.blake2b(state.numpy().tobytes(), digest_size=8).digest()
                generator.manual_seed(int.from_bytes(digest, "little") >> 1)
            self._fresh = False


_NUMPY_DTYPES = {torch.float32: np.float32, torch.bool: np.bool_, torch.uint8: np.uint8}


FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_finite(name: str, array: np.ndarray) -> None:
    """One-sentence EnvError when an env returned NaN or infinity (uint8 images cannot hold either), or a float64
    number beyond float32's range, which would become infinity in jaderl's float32 tensors."""
    if array.dtype == np.uint8:
        return
    if not np.isfinite(array).all():
        raise EnvError(f"the env returned a non-finite {name}; fix the env or wrap it to clip or reset")
    if array.dtype.kind == "f" and array.dtype.itemsize > 4 and array.size and \
            (array.max() > FLOAT32_MAX or array.min() < -FLOAT32_MAX):
        raise EnvError(f"the env returned a {name} beyond float32's range (magnitude above 3.4e38), which jaderl's "
                       "float32 tensors cannot hold; fix the env or wrap it to clip or rescale")


def unsupported_observations(obs_space: gym.Space) -> EnvError:
    """The refusal of a non-Box observation space, with the wrapper that makes it a Box where Gymnasium has one."""
    try:
        flat = gym.spaces.flatten_space(obs_space)
    except Exception:  # a space Gymnasium cannot flatten (Text, Graph, Sequence, custom ones)
        flat = None
    fix = ""
    if isinstance(flat, gym.spaces.Box):
        fix = ("; wrap the env in gymnasium.wrappers.FlattenObservation (a Discrete becomes a one-hot Box) and pass "
               "the wrapped env to GymnasiumVecEnv, or register_env a factory that builds it")
    return EnvError(f"observation space {obs_space} is not supported: jaderl needs a Box observation space{fix}")


class GymnasiumSpaces(VecEnv):
    """What every adapter of Gymnasium envs shares: reading their spaces and turning jaderl actions into theirs."""

    _obs_dtype: torch.dtype
    _discrete_start: int
    _low: np.ndarray | None
    _high: np.ndarray | None

    def _read_spaces(self, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Set ``obs_shape``, ``is_discrete``, ``action_dim`` and the action bounds, or say what is unsupported."""
        if not isinstance(obs_space, gym.spaces.Box):
            raise unsupported_observations(obs_space)
        self.obs_shape = tuple(obs_space.shape)
        if obs_space.dtype == np.uint8 and len(self.obs_shape) > 3:  # e.g. RGB frames stacked as (4, 84, 84, 3)
            raise EnvError(f"observations of shape {self.obs_shape} are uint8 images with {len(self.obs_shape)} "
                           "dimensions, but jaderl's CNN reads one image, (C, H, W) or (H, W, C); stack the frames on "
                           "the channel axis (grayscale frames, or reshape to (frames * channels, H, W))")
        self._obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
        if isinstance(act_space, gym.spaces.Discrete):
            self.is_discrete, self.action_dim = True, int(act_space.n)
            self._low = self._high = None
            self._discrete_start = int(act_space.start)  # agent's action 0 is the space's first, e.g. start=-1
        elif isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
            if not (np.isfinite(act_space.low).all() and np.isfinite(act_space.high).all()):
                raise EnvError(f"action space {act_space} is unbounded: jaderl rescales actions from [-1, 1]")
            self.is_discrete, self.action_dim = False, int(act_space.shape[0])
            self._low, self._high = act_space.low.astype(np.float64), act_space.high.astype(np.float64)
            self._integer_box = np.issubdtype(act_space.dtype, np.integer)  # rescaled actions rounded, not truncated
            self._action_dtype = str(act_space.dtype)
        else:
            raise EnvError(f"action space {act_space} is not supported: use Discrete or a 1-D Box")

    def _tensor(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """A copy of ``array`` (a vector env made with ``copy=False``, or shared memory, returns the same array every
        step) as a tensor on the env's device. On CPU numpy copies and converts: a third of ``torch.tensor``'s cost,
        which adds up over a step's small arrays."""
        if self.device.type == "cpu" and dtype in _NUMPY_DTYPES:
            return torch.from_numpy(np.array(array, dtype=_NUMPY_DTYPES[dtype], order="C"))
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=self.device, dtype=dtype, copy=True)

    def _env_actions(self, action: torch.Tensor) -> np.ndarray:
        """Discrete actions ``0 .. action_dim - 1`` as the space's integers ``(N,)``; Box actions ``(N, action_dim)``
        clipped to [-1, 1] and rescaled to the space's bounds, never a rounding error outside them (a list or NumPy
        array is read as a tensor). Bad actions, non-integral discrete ones included, raise a one-sentence
        :class:`EnvError`."""
        act = as_action_tensor(action, torch.device("cpu"), "the env").detach().cpu().numpy()
        size = self.num_envs * (1 if self.is_discrete else self.action_dim)
        if act.size != size:
            each = "" if self.is_discrete else f" of {self.action_dim} values"
            raise EnvError(f"expected {self.num_envs} actions (one{each} per sub-env), got an array of shape "
                           f"{tuple(act.shape)}")
        if act.dtype != np.bool_ and not np.isfinite(act).all():  # the agent diverged: say so, not blame the env
            raise EnvError(NONFINITE_ACTIONS)
        if self.is_discrete:
            act = act.reshape(self.num_envs)
            if act.dtype.kind == "f" and not (whole := act == np.trunc(act)).all():  # 0.7 is no action
                raise non_integral_action_error("the env", float(act[~whole][0]))
            if act.min() < 0 or act.max() >= self.action_dim:
                raise discrete_action_error("the env", self.action_dim, act.min(), act.max())
            return act.astype(np.int64) + self._discrete_start
        act = act.reshape(self.num_envs, self.action_dim)
        scaled = self._low + (np.clip(act, -1.0, 1.0) + 1.0) * 0.5 * (self._high - self._low)
        if self._integer_box:  # the nearest integer (a cast would truncate: 9.995 to 9)
            scaled = np.rint(scaled)
        return np.minimum(np.maximum(scaled, self._low), self._high)  # rounding must not leave a float64 Box's bounds


class GymnasiumVecEnv(GymnasiumSpaces):
    """Adapts a Gymnasium env id, env instance, or vector env (sync or async) to the jaderl contract.

    An id makes ``num_envs`` sub-envs; an env instance is one sub-env (``num_envs`` 1: an instance cannot be copied
    into independent sub-envs), and a vector env keeps its own number of sub-envs (``num_envs`` left at 1, or that
    number).

    Box actions are rescaled from ``[-1, 1]`` to the env's bounds; observations and rewards become float32 tensors
    on ``device`` (uint8 image observations stay uint8). Vector envs must auto-reset in the same step
    (``autoreset_mode=gym.vector.AutoresetMode.SAME_STEP``), which is what this adapter builds from an id.
    """

    def __init__(
        self,
        env: str | gym.Env | gym.vector.VectorEnv,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        asynchronous: bool = False,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.device = torch.device(device)
        if num_envs < 1:
            raise EnvError(f"num_envs ({num_envs}) must be at least 1")
        if isinstance(env, gym.vector.VectorEnv) and num_envs not in (1, env.num_envs):
            raise EnvError(f"the vector env has {env.num_envs} sub-envs but num_envs={num_envs} was asked for; leave "
                           f"num_envs out, or build the vector env with {num_envs}")
        if isinstance(env, str):
            self._label = env
            self._where = "in this process" if not asynchronous or num_envs == 1 else "by AsyncVectorEnv"
            factory = _gym_factory(env, env_kwargs or {})
            vector_cls = gym.vector.AsyncVectorEnv if asynchronous and num_envs > 1 else gym.vector.SyncVectorEnv
            try:
                env = vector_cls([factory] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
            except EnvError:  # already one sentence (a missing package, a jaderl-aware env)
                raise
            except Exception as exc:
                raise self._env_failed("built", exc) from exc
        elif isinstance(env, gym.Env):
            if num_envs > 1:
                what = repr(env.spec.id) if env.spec is not None else type(env.unwrapped).__name__
                raise EnvError(f"an env instance ({what}) cannot be copied into {num_envs} independent sub-envs; pass "
                               f"the env id, or gym.vector.SyncVectorEnv([make_env] * {num_envs}, autoreset_mode="
                               "gym.vector.AutoresetMode.SAME_STEP) where make_env returns a new env")
            single = env
            env = gym.vector.SyncVectorEnv([lambda: single], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        elif not isinstance(env, gym.vector.VectorEnv):
            raise EnvError(f"cannot adapt {type(env).__name__}: pass a Gymnasium env id, env or vector env")
        mode = env.metadata.get("autoreset_mode")
        if mode is not None and mode != gym.vector.AutoresetMode.SAME_STEP:
            raise EnvError(
                f"the vector env auto-resets in mode {mode}; build it with "
                "autoreset_mode=gym.vector.AutoresetMode.SAME_STEP so final observations can be bootstrapped"
            )
        self.env = env
        self._where = "in this process" if isinstance(env, gym.vector.SyncVectorEnv) else f"by {type(env).__name__}"
        self.num_envs = env.num_envs
        obs_space, act_space = env.single_observation_space, env.single_action_space
        self._read_spaces(obs_space, act_space)
        base = env.unwrapped  # a vector env built directly has no spec of its own: use its first sub-env's
        spec = base.spec or (base.get_attr("spec")[0] if hasattr(base, "get_attr") else None)
        limit = getattr(spec, "max_episode_steps", None) if spec is not None else None
        self.max_steps = int(limit or 0)
        if not hasattr(self, "_label"):
            self._label = spec.id if spec is not None else type(base).__name__

    def _env_failed(self, done: str, exc: Exception) -> EnvError:
        """An exception of the env as one EnvError naming the env and what it was doing, as
        :class:`~jaderl.envs.subproc.SubprocVecEnv` reports its envs (raised ``from exc``: the env's traceback stays
        chained)."""
        return EnvError(f"env {self._label!r} ({done} {self._where}) failed: {error_line(exc)}")

    def reset(self, seed: int | None = None) -> torch.Tensor:
        try:
            obs, _ = self.env.reset(seed=seed)
        except EnvError:  # already one sentence
            raise
        except Exception as exc:
            raise self._env_failed("reset", exc) from exc
        check_finite("observation", obs)
        return self._tensor(obs, self._obs_dtype)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        act = self._env_actions(action).astype(self.env.single_action_space.dtype)
        try:
            obs, reward, terminated, truncated, info = self.env.step(act)
        except EnvError:  # already one sentence
            raise
        except Exception as exc:
            raise self._env_failed("stepped", exc) from exc
        check_finite("observation", obs)
        check_finite("reward", np.asarray(reward, dtype=np.float64))
        done = np.logical_or(terminated, truncated)
        obs_t = self._tensor(obs, self._obs_dtype)
        if done.any():
            if "final_obs" not in info:  # a vector env without autoreset_mode in its metadata, stepping next-step
                raise EnvError(f"env {self._label!r} ended sub-envs without info['final_obs']: it does not auto-reset "
                               "in the same step; build it with autoreset_mode=gym.vector.AutoresetMode.SAME_STEP")
            final_obs = np.array(obs, copy=True)
            final_obs[done] = np.stack(info["final_obs"][done])
            check_finite("observation", final_obs)
            info = {"final_obs": self._tensor(final_obs, self._obs_dtype)}
        else:
            info = {"final_obs": obs_t.clone()}
        return (
            obs_t,
            self._tensor(reward, torch.float32),
            self._tensor(terminated, torch.bool),
            self._tensor(truncated, torch.bool),
            info,
        )

    def close(self) -> None:
        self.env.close()


def _gym_factory(env_id: str, kwargs: dict[str, Any]) -> Callable[[], gym.Env]:
    """A picklable maker of ``env_id``; ``"module:EnvId"`` imports ``module`` first (so it can register the env), as
    ``gymnasium.make`` does. An unknown id, or an env whose package is missing, raises a one-sentence EnvError here."""
    label = env_id
    if ":" in env_id:
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(f"cannot import {module!r} for env {env_id!r} ({exc}); install it or fix the id") from None
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise EnvError(f"unknown env {env_id!r} ({exc}); run `jaderl envs` to list the built-in ones") from None
    if isinstance(spec.entry_point, str):  # import the env's module now: MuJoCo's and Box2D's check their packages
        try:
            gym.envs.registration.load_env_creator(spec.entry_point)
        except gym.error.DependencyNotInstalled as exc:
            raise missing_dependency(label, exc, spec.entry_point) from None
    return functools.partial(make_gym_env, label, **kwargs)


def make_gym_env(env_id: str, /, **kwargs: Any) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)`` (``"module:EnvId"`` imports ``module`` first, also in a worker process),
    with a missing package (Gymnasium's ``DependencyNotInstalled``) as one EnvError naming the env, the package and
    the pip command."""
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        spec = gym.envs.registry.get(env_id.rpartition(":")[2])
        module = spec.entry_point if spec is not None and isinstance(spec.entry_point, str) else ""
        raise missing_dependency(env_id, exc, module) from None
