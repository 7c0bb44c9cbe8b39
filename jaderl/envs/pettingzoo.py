"""PettingZoo parallel envs as one batched multi-agent env, stepped here or in worker processes.

``make_pettingzoo_env("mpe2.simple_spread_v3", num_envs, device)`` (the id ``pettingzoo/mpe2.simple_spread_v3``
imports ``mpe2.simple_spread_v3`` and calls its ``parallel_env(**kwargs)``; ``pettingzoo.butterfly.pistonball_v6``
works the same way) builds ``num_envs`` copies of a ``ParallelEnv`` and follows the multi-agent contract of
:class:`~jaderl.envs.vec.EnvSpec` for its ``A = len(possible_agents)`` agents, in ``possible_agents`` order:

    obs (N, A, obs_dim) float32, reward (N, A) float32, terminated (N,) bool, truncated (N,) bool, info

with discrete actions ``(N, A)`` in ``0 .. action_dim - 1`` (shifted to a ``Discrete`` space's ``start``; floats
that are not whole numbers, ``0.7``, are refused) or continuous ones ``(N, A, action_dim)`` in ``[-1, 1]``, clipped and
rescaled to each agent's ``Box`` bounds, as tensors or as lists or NumPy arrays of numbers.

What the adapter decides, since PettingZoo leaves it open:

* **Observations** become float32 vectors (a ``Box`` of any shape is flattened; images are not scaled). Agents whose
  observation sizes differ are zero-padded to the largest size, and when the agents are of several types an
  agent-type one-hot is appended to every row. The types are the teams (the name's prefix before its last ``_``:
  ``adversary_0`` is of team ``adversary``), told further apart by observation size where one team's agents
  observe different sizes; a single type appends nothing. So ``obs_dim = max size + number of types (when > 1)``.
* **Actions**: every agent must have the same kind of action space of the same size (``Discrete(n)`` with one
  ``n``, or 1-D ``Box`` es of one shape; the bounds may differ). A policy that gives every agent the same actions
  cannot serve agents with 5 and 20 actions, and padding the smaller spaces would hand some agents actions their
  env does not have, so other envs are refused with an :class:`~jaderl.envs.vec.EnvError`.
* **Agents that leave early** (no longer in ``env.agents`` within an episode): on the step they leave they still
  get their reward and last observation; after it they observe zeros (the one-hot too) and get reward 0 until their
  sub-env resets, also where the env goes on reporting them (PettingZoo allows it), and their actions are dropped.
  :meth:`PettingZooVecEnv.active_agents` ``(N, A)`` tells which agents are in each episode (``env.agents``), and
  ``info["final_active"]`` which are still in after a step (before any reset; at an episode's end, those of its
  last step that were truncated and not terminated, which bootstrap), so the
  multi-agent algorithms learn only from the agents present (``agents_leave`` of the env's spec): a leaving agent's
  last step ends its own returns, and the steps of agents that have left take no part in any loss.
* **Episodes**: a sub-env is done when all its agents have left (``env.agents`` is empty). It is ``truncated`` when
  any of the agents leaving on that step was truncated (PettingZoo's ``truncations``; MPE2's ``max_cycles``) and
  ``terminated`` when none of them was cut by the time limit (truncated and not terminated), so both can be true,
  as with Gymnasium's ``TimeLimit``. Where some agents terminate on the step that truncates the others, the sub-env
  is truncated, not terminated, and ``info["final_active"]`` holds the truncated agents only: each agent's
  bootstrap follows its own end (MAPPO's team value bootstraps, as at any truncation). Done sub-envs reset (without
  a seed: their random stream goes on) within the same step; ``info["final_obs"]`` ``(N, A, obs_dim)`` and
  ``info["final_state"]`` ``(N, state_dim)`` hold what they reached before the reset (equal to ``obs`` and the
  global state elsewhere). ``max_steps`` is the env's ``max_cycles`` (0 when it has none).
* **Global state** (:meth:`PettingZooVecEnv.global_state`, ``(N, state_dim)``): the env's ``state()``, flattened,
  when it has one; otherwise every agent's observation, flattened and concatenated in agent order (without padding
  or one-hot; zeros for agents that have left).
* **Seeds**: ``reset(seed)`` resets sub-env ``i`` with ``seed + i``; the constructor's ``seed`` does the same, so
  ``reset()`` without a seed then continues the seeded streams.

``workers > 0`` steps the sub-envs in that many worker processes (and this one) through shared memory with
:class:`~jaderl.envs.subproc.SubprocVecEnv`'s machinery: each sub-env is wrapped as a Gymnasium env whose
observation is one float32 row ``[every agent's padded observation | global state | every agent's reward]``, so the
shared buffers carry all of a step's results without pickling, and ``workers = 0`` steps the same wrapped sub-envs
with the same functions, which gives both the same trajectories for the same seed. The env factory must then be
picklable (an id, a module-level function or a ``functools.partial``).

The module also holds what every multi-agent adapter shares (:func:`agent_teams`, :class:`AgentObsLayout`,
:func:`agent_actions`); :mod:`jaderl.envs.vmas` uses them too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from jaderl.envs.subproc import SubprocVecEnv, _layout, _reset_slice, _step_slice, _views
from jaderl.envs.vec import (
    NONFINITE_ACTIONS,
    EnvError,
    GymnasiumSpaces,
    VecEnv,
    as_action_tensor,
    check_finite,
    discrete_action_error,
    error_line,
    non_integral_action_error,
)

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv

__all__ = ["AgentObsLayout", "PettingZooVecEnv", "agent_actions", "agent_teams", "make_pettingzoo_env"]

MARL_EXTRA = "pip install 'jaderl[marl]'"

# -- what every multi-agent adapter shares ----------------------------------------------------------------------------


def agent_teams(names: Sequence[str]) -> tuple[str, ...]:
    """Each agent's team, the prefix of its name before the last ``_`` (``adversary_0`` -> ``adversary``; a name
    without ``_`` is its own prefix), when the agents have several prefixes; ``()`` when they share one."""
    prefixes = tuple(name.rpartition("_")[0] or name for name in names)
    return prefixes if len(set(prefixes)) > 1 else ()


@dataclasses.dataclass(frozen=True)
class AgentObsLayout:
    """How the agents' observations of different sizes share one ``(obs_dim,)`` row (see the module docstring).

    Agent ``i``'s observation fills ``row[:sizes[i]]``, zeros follow up to ``width`` (the largest size), and when there
    are several agent types ``row[width + types[i]]`` is 1 (the type one-hot, ``num_types`` wide; 0 when absent).
    """

    sizes: tuple[int, ...]
    types: tuple[int, ...]
    num_types: int

    @classmethod
    def of(cls, sizes: Sequence[int], teams: Sequence[str]) -> AgentObsLayout:
        """The layout of agents with these observation sizes and teams (``()``: one team)."""
        keys = [(team, size) for team, size in zip(teams or [""] * len(sizes), sizes, strict=True)]
        kinds = list(dict.fromkeys(keys))  # types in order of first appearance
        types = tuple(kinds.index(key) for key in keys)
        return cls(tuple(int(s) for s in sizes), types, len(kinds) if len(kinds) > 1 else 0)

    @property
    def width(self) -> int:
        return max(self.sizes)

    @property
    def obs_dim(self) -> int:
        return self.width + self.num_types

    @property
    def is_plain(self) -> bool:
        """Every agent observes the same size and there is one type: rows are the observations themselves."""
        return self.num_types == 0 and len(set(self.sizes)) == 1

    def one_hot(self) -> np.ndarray:
        """``(A, num_types)`` float32: each agent's type one-hot."""
        if not self.num_types:
            return np.zeros((len(self.sizes), 0), np.float32)
        return np.eye(self.num_types, dtype=np.float32)[list(self.types)]


def agent_actions(action: torch.Tensor, num_envs: int, num_agents: int, is_discrete: bool,
                  action_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Check a multi-agent action and shape it: ``(N, A)`` int64 actions ``0 .. action_dim - 1`` when discrete,
    ``(N, A, action_dim)`` clipped to ``[-1, 1]`` when continuous (on ``action``'s device, one host sync).

    Accepted shapes: ``(N, A)`` or ``(N, A, 1)`` when discrete, ``(N, A, action_dim)`` when continuous (or ``(N, A)``
    when ``action_dim`` is 1); a list or NumPy array of numbers is converted to a tensor on ``device``. Bad actions,
    discrete ones given as floats that are not whole numbers (``0.7``) included, raise a one-sentence
    :class:`EnvError` (the checks share the one host sync)."""
    if not isinstance(action, torch.Tensor):
        action = as_action_tensor(action, torch.device(device), "the env")
    shape = tuple(action.shape)
    if is_discrete:
        expected = (num_envs, num_agents)
        ok = shape in (expected, (*expected, 1))
    else:
        expected = (num_envs, num_agents, action_dim)
        ok = shape == expected or (action_dim == 1 and shape == expected[:2])
    if not ok:
        each = "one" if is_discrete else f"{action_dim} values"
        raise EnvError(f"expected actions of shape {expected} ({each} per agent of each sub-env), got a tensor of "
                       f"shape {shape}")
    if action.dtype == torch.bool:
        action = action.long()
    if not is_discrete:
        if not bool(torch.isfinite(action).all()):  # the agent diverged: say so rather than blame the env
            raise EnvError(NONFINITE_ACTIONS)
        return action.reshape(expected).clamp(-1.0, 1.0)
    action = action.reshape(expected)
    checks = [action.min().double(), action.max().double(), torch.isfinite(action).all().double()]
    if action.is_floating_point():  # 0.7 is no action (an int tensor, the agent's, skips this)
        checks.append((action == action.trunc()).all().double())
    low, high, finite, *whole = torch.stack(checks).tolist()
    if not finite:
        raise EnvError(NONFINITE_ACTIONS)
    if whole and not whole[0]:
        raise non_integral_action_error("the env", action[action != action.trunc()][0].item())
    if low < 0 or high >= action_dim:
        raise discrete_action_error("the env", action_dim, low, high)
    return action.long()


# -- one PettingZoo env as a Gymnasium env of packed rows ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _PackedLayout:
    """Where everything lives in a packed row ``[A * obs_dim observations | state_dim state | A rewards | A flags]``,
    the flags 1 for the agents in the episode (``env.agents``)."""

    agents: tuple[str, ...]
    obs: AgentObsLayout
    state_dim: int
    has_state: bool
    """Whether the state is the env's ``state()``; otherwise it is the agents' raw observations, concatenated."""
    discrete: bool
    """Whether every agent's action is one ``Discrete`` integer (else a ``Box`` vector, of any dtype)."""

    @property
    def obs_size(self) -> int:
        return len(self.agents) * self.obs.obs_dim

    @property
    def row_size(self) -> int:
        return self.obs_size + self.state_dim + 2 * len(self.agents)


class _PackedParallelEnv(gym.Env):
    """One ``ParallelEnv`` as a Gymnasium env for :mod:`jaderl.envs.subproc`'s machinery: it observes one float32
    row (see :class:`_PackedLayout`) and takes one row of every agent's action, already in the env's own units
    (integers from the space's ``start``, or values within the ``Box`` bounds); the episode ends when every agent
    has left."""

    def __init__(self, env: ParallelEnv, layout: _PackedLayout, action_space: gym.spaces.Box) -> None:
        if tuple(env.possible_agents) != layout.agents:
            raise EnvError(f"a sub-env has agents {list(env.possible_agents)} but the first has "
                           f"{list(layout.agents)}; every sub-env must have the same agents")
        self.env, self.layout = env, layout
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (layout.row_size,), np.float32)
        self.action_space = action_space
        self._one_hot = layout.obs.one_hot()
        self._discrete = layout.discrete
        self._action_size = action_space.shape[0] // len(layout.agents)
        offsets = np.cumsum((0, *layout.obs.sizes))
        self._raw_slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(offsets)]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, _ = self.env.reset(seed=seed)
        return self._pack(obs, {}, set(self.env.agents), set(self.env.agents)), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        per_agent = action if self._discrete else action.reshape(len(self.layout.agents), self._action_size)
        alive = set(self.env.agents)
        actions = {name: (int(per_agent[i]) if self._discrete else per_agent[i])
                   for i, name in enumerate(self.layout.agents) if name in alive}
        obs, rewards, terminations, truncations, _ = self.env.step(actions)
        # the agents of this step: those that acted (the ones leaving on it among them) and any that joined on it;
        # PettingZoo lets an env go on reporting agents that left earlier, which observe zeros and get 0 here
        present = alive | set(self.env.agents)
        done = not self.env.agents
        # at an end, the agents cut by a time limit (truncated, not terminated) bootstrap and those that terminated
        # do not: the cut ones count as still in, and the sub-env is terminated only where none was cut
        cut = {name for name in present if truncations.get(name, False) and not terminations.get(name, False)}
        truncated = done and any(bool(truncations.get(name, False)) for name in present)
        terminated = done and not cut
        return self._pack(obs, rewards, present, cut if done else set(self.env.agents)), 0.0, terminated, truncated, {}

    def _pack(self, obs: dict[str, Any], rewards: dict[str, float], present: set[str], still_in: set[str]
              ) -> np.ndarray:
        """One packed row of the observations and rewards of the ``present`` agents (the others get zeros), and
        which agents are ``still_in`` after the step."""
        layout = self.layout
        row = np.zeros(layout.row_size, np.float32)
        agent_rows = row[:layout.obs_size].reshape(len(layout.agents), layout.obs.obs_dim)
        state = row[layout.obs_size:layout.obs_size + layout.state_dim]
        for i, name in enumerate(layout.agents):
            if name not in present or name not in obs:  # it has left this episode (or not joined yet): zeros
                continue
            flat = np.asarray(obs[name], dtype=np.float32).reshape(-1)
            agent_rows[i, :flat.size] = flat
            agent_rows[i, layout.obs.width:] = self._one_hot[i]
            if not layout.has_state:
                state[self._raw_slices[i]] = flat
        if layout.has_state:
            state[:] = np.asarray(self.env.state(), dtype=np.float32).reshape(-1)
        end, num_agents = layout.obs_size + layout.state_dim, len(layout.agents)
        row[end:end + num_agents] = [float(rewards.get(name, 0.0)) if name in present else 0.0
                                     for name in layout.agents]
        row[end + num_agents:] = [name in still_in for name in layout.agents]
        check_finite("observation", agent_rows)
        check_finite("global state", state)
        check_finite("reward", row[end:end + num_agents])
        return row

    def close(self) -> None:
        self.env.close()


class _PackedFactory:
    """Builds one packed sub-env from a ``ParallelEnv`` factory; picklable, so worker processes build their own
    (``__name__`` names the workers in error messages)."""

    def __init__(self, make: Callable[[], ParallelEnv], layout: _PackedLayout, action_space: gym.spaces.Box,
                 name: str) -> None:
        self.make, self.layout, self.action_space, self.__name__ = make, layout, action_space, name

    def __call__(self) -> _PackedParallelEnv:
        env = self.make()
        try:
            return _PackedParallelEnv(env, self.layout, self.action_space)
        except BaseException:  # a sub-env of other agents: it is closed, not left open
            with contextlib.suppress(Exception):
                env.close()
            raise


class _PackedSubprocVecEnv(SubprocVecEnv):
    """:class:`SubprocVecEnv` of packed sub-envs: :class:`PettingZooVecEnv` checks and converts the actions, so they
    go to the shared buffer as they are."""

    def _env_actions(self, action: torch.Tensor) -> np.ndarray:
        return action.numpy()


# -- the adapter ------------------------------------------------------------------------------------------------------


class PettingZooVecEnv(VecEnv):
    """``num_envs`` copies of a PettingZoo ``ParallelEnv`` as one batched multi-agent env (see the module docstring).

    ``make`` builds one sub-env; ``first``, a sub-env already built, is reused as sub-env 0 when ``workers == 0``.
    """

    agents_leave = True  # PettingZoo's agents may leave an episode early: the algorithms learn from those present

    def __init__(self, make: Callable[[], ParallelEnv], num_envs: int, device: str | torch.device = "cpu",
                 seed: int | None = None, workers: int = 0, first: ParallelEnv | None = None,
                 name: str = "pettingzoo") -> None:
        if num_envs < 1 or workers < 0:
            raise EnvError(f"num_envs ({num_envs}) must be at least 1 and workers ({workers}) at least 0")
        self.device = torch.device(device)
        self.num_envs = num_envs
        self._name = name
        try:
            probe = first if first is not None else make()
        except EnvError:
            raise
        except (TypeError, ValueError, AssertionError) as exc:  # a keyword it does not take, a value it refuses
            raise EnvError(f"cannot build the PettingZoo env {name!r} ({error_line(exc)}); check its keyword "
                           "arguments") from exc
        try:
            with self._in_process("reset"):
                layout, action_space = self._read_env(probe, seed)
        except BaseException:
            probe.close()
            raise
        self._layout = layout
        factory = _PackedFactory(make, layout, action_space, name)
        self._subproc: _PackedSubprocVecEnv | None = None
        self._envs: list[_PackedParallelEnv] = []
        try:  # a sub-env that fails to build (or to reset): the ones built so far are closed
            if workers > 0:
                probe.close()
                self._subproc = _PackedSubprocVecEnv(factory, num_envs, num_workers=workers, device=self.device)
            else:
                self._envs = [_PackedParallelEnv(probe, layout, action_space)]
                for _ in range(num_envs - 1):
                    self._envs.append(factory())
                act_shape = tuple(action_space.shape)
                buffers, size = _layout(num_envs, (layout.row_size,), np.dtype(np.float32), act_shape,
                                        action_space.dtype)
                self._views = _views(bytearray(size), buffers)
            self.reset(seed=seed)
        except BaseException:
            self.close()
            raise

    def _read_env(self, env: ParallelEnv, seed: int | None) -> tuple[_PackedLayout, gym.spaces.Box]:
        """Read the agents, spaces, state and time limit of one sub-env; return its packed layout and the packed
        action space (every agent's action in the env's units, one after the other)."""
        agents = tuple(env.possible_agents)
        self.agents = agents
        self.num_agents = len(agents)
        self.teams = agent_teams(agents)
        spaces = []
        for name in agents:
            agent = GymnasiumSpaces()  # reads one agent's spaces the way every Gymnasium adapter does
            agent._read_spaces(env.observation_space(name), env.action_space(name))
            spaces.append(agent)
        first = spaces[0]
        for name, agent in zip(agents[1:], spaces[1:], strict=True):
            if (agent.is_discrete, agent.action_dim) != (first.is_discrete, first.action_dim):
                raise EnvError(f"agents {agents[0]} and {name} have different action spaces "
                               f"({env.action_space(agents[0])} and {env.action_space(name)}); jaderl needs every "
                               "agent to have the same kind and size of action space (Discrete(n) with one n, or "
                               "Boxes of one shape)")
        self.is_discrete, self.action_dim = first.is_discrete, first.action_dim
        sizes = [int(np.prod(agent.obs_shape)) for agent in spaces]
        obs_layout = AgentObsLayout.of(sizes, self.teams)
        self.obs_shape = (obs_layout.obs_dim,)
        env.reset(seed=seed)  # the state exists only once the env is reset
        try:
            state_dim, has_state = int(np.asarray(env.state()).size), True
        except NotImplementedError:
            state_dim, has_state = sum(sizes), False
        self.state_shape = (state_dim,)
        cycles = getattr(env.unwrapped, "max_cycles", None)
        if isinstance(cycles, int) and cycles < 1:  # MPE2 would truncate every step (0) or never end an episode
            raise EnvError(f"max_cycles={cycles} of PettingZoo env {self._name!r} must be at least 1 (the steps after "
                           "which an episode is truncated), e.g. ?max_cycles=25")
        self.max_steps = int(cycles or 0)
        if self.is_discrete:
            starts = np.array([agent._discrete_start for agent in spaces], np.int64)
            self._starts = torch.from_numpy(starts)
            action_space = gym.spaces.Box(starts, starts + self.action_dim - 1, dtype=np.int64)
            self._low = self._high = None
        else:
            dtype = np.result_type(*[env.action_space(name).dtype for name in agents])
            low, high = np.stack([agent._low for agent in spaces]), np.stack([agent._high for agent in spaces])
            self._agent_low, self._agent_high = torch.from_numpy(low), torch.from_numpy(high)  # (A, action_dim)
            same = (low == low[0]).all() and (high == high[0]).all()
            # the spec's bounds: the shared ones, or every agent's, agent after agent
            self._low, self._high = (low[0], high[0]) if same else (low.reshape(-1), high.reshape(-1))
            action_space = gym.spaces.Box(low.reshape(-1).astype(dtype), high.reshape(-1).astype(dtype), dtype=dtype)
            self._integer_box = np.issubdtype(dtype, np.integer)  # rescaled actions rounded, not truncated
            self._action_dtype = str(dtype)
        return _PackedLayout(agents, obs_layout, state_dim, has_state, self.is_discrete), action_space

    # -- the contract --------------------------------------------------------------------------------------------

    def _unpack(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Observations ``(N, A, obs_dim)``, global state ``(N, state_dim)``, rewards ``(N, A)`` and the agents in
        the episode ``(N, A)`` (bool) of packed rows."""
        layout = self._layout
        end, flags = layout.obs_size + layout.state_dim, layout.obs_size + layout.state_dim + self.num_agents
        obs = rows[:, :layout.obs_size].reshape(self.num_envs, self.num_agents, layout.obs.obs_dim).contiguous()
        return obs, rows[:, layout.obs_size:end].contiguous(), rows[:, end:flags].contiguous(), rows[:, flags:] > 0

    def _rows(self, array: np.ndarray) -> torch.Tensor:
        return torch.tensor(array, dtype=torch.float32, device=self.device)  # a copy: the buffers are reused

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if self._subproc is not None:
            rows = self._subproc.reset(seed=seed)
        else:
            self._check_open()
            with self._in_process("reset"):
                _reset_slice(self._envs, self._views, 0, seed, [0])
            rows = self._rows(self._views["obs"])
        obs, self._state, _, self._active = self._unpack(rows)
        return obs

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        action = agent_actions(action, self.num_envs, self.num_agents, self.is_discrete, self.action_dim).cpu()
        if self.is_discrete:
            env_action = action + self._starts
        else:  # in float64, as the single-agent Gymnasium adapter rescales
            scale = (self._agent_high - self._agent_low) * 0.5
            env_action = (self._agent_low + (action.double() + 1.0) * scale).reshape(self.num_envs, -1)
            if self._integer_box:  # the nearest integer (a cast would truncate: 9.995 to 9)
                env_action = env_action.round()
        if self._subproc is not None:
            rows, _, terminated, truncated, info = self._subproc.step(env_action)
            final_rows = info["final_obs"]
        else:
            self._check_open()
            views = self._views
            views["action"][:] = env_action.numpy()
            with self._in_process("stepped"):
                _step_slice(self._envs, views, 0, [0])
            rows, final_rows = self._rows(views["obs"]), self._rows(views["final_obs"])
            terminated = torch.tensor(views["terminated"], device=self.device)
            truncated = torch.tensor(views["truncated"], device=self.device)
        obs, self._state, _, self._active = self._unpack(rows)
        # a reset's row has no reward: read the final one (at an episode's end, its agents cut by the time limit)
        final_obs, final_state, reward, final_active = self._unpack(final_rows)
        return obs, reward, terminated, truncated, {"final_obs": final_obs, "final_state": final_state,
                                                    "final_active": final_active}

    def global_state(self) -> torch.Tensor:
        """The global state ``(N, state_dim)`` of every sub-env now (see the module docstring)."""
        return self._state

    def active_agents(self) -> torch.Tensor:
        """``(N, A)`` bool: the agents in every sub-env's episode now (``env.agents``), those whose actions the next
        step uses; the others have left it (or not joined it yet)."""
        return self._active

    @contextlib.contextmanager
    def _in_process(self, done: str) -> Iterator[None]:
        """An exception of a sub-env stepped in this process as one EnvError naming the env, as worker processes
        report theirs (chained: the env's traceback stays reachable)."""
        try:
            yield
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"env {self._name!r} ({done} in this process) failed: {error_line(exc)}") from exc

    def _check_open(self) -> None:
        if not self._envs:
            raise EnvError("the env is closed")

    def close(self) -> None:
        """Close every sub-env (and stop the worker processes). An error of one sub-env's ``close`` is ignored, as
        the worker processes ignore theirs, so every other sub-env is still closed."""
        if self._subproc is not None:
            self._subproc.close()
        envs, self._envs = self._envs, []
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (empty without workers or once closed)."""
        return self._subproc.worker_pids if self._subproc is not None else []


def _parallel_env_from_id(module_name: str, kwargs: dict[str, Any]) -> ParallelEnv:
    """``module_name.parallel_env(**kwargs)`` (module-level, so worker processes can unpickle it)."""
    return importlib.import_module(module_name).parallel_env(**kwargs)


def _check_module(env_id: str) -> str:
    """The module of a ``<module>.<env_name>`` id, once it is known to import and to have ``parallel_env``."""
    module_name = env_id.removeprefix("pettingzoo/")
    if not module_name or module_name.startswith(".") or module_name.endswith("."):
        raise EnvError(f"env id {env_id!r} names no module; give the module of a parallel env, e.g. "
                       "pettingzoo/mpe2.simple_spread_v3")
    package = module_name.partition(".")[0]
    if package in ("pettingzoo", "mpe2") and importlib.util.find_spec(package) is None:
        raise EnvError(f"env {env_id!r} needs the {package} package: {MARL_EXTRA}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise EnvError(f"unknown PettingZoo env {env_id!r}: there is no module {exc.name!r}; give the module "
                           "of a parallel env, e.g. pettingzoo/mpe2.simple_spread_v3") from None
        raise EnvError(f"cannot import {module_name!r} ({exc}); install what the env needs") from None
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        raise EnvError(f"cannot import {module_name!r} ({exc}); install what the env needs") from None
    if not callable(getattr(module, "parallel_env", None)):
        raise EnvError(f"module {module_name!r} has no parallel_env(); give the module of a PettingZoo env, e.g. "
                       "pettingzoo/mpe2.simple_spread_v3")
    return module_name


def make_pettingzoo_env(env: str | Callable[..., ParallelEnv] | ParallelEnv, num_envs: int,
                        device: str | torch.device = "cpu", seed: int | None = None, workers: int = 0,
                        **kwargs: Any) -> VecEnv:
    """``num_envs`` copies of a PettingZoo parallel env as one batched multi-agent env (see the module docstring).

    ``env``: an id ``[pettingzoo/]<module>.<env_name>`` (``mpe2.simple_spread_v3``: ``parallel_env(**kwargs)`` of
    that module), a factory called with ``**kwargs``, or one ``ParallelEnv`` (then ``num_envs`` must be 1 and
    ``workers`` 0). ``workers > 0`` steps the sub-envs in that many worker processes (and this one).
    """
    try:
        from pettingzoo import ParallelEnv
    except ImportError:
        raise EnvError(f"PettingZoo envs need the pettingzoo package: {MARL_EXTRA}") from None
    first = None
    if isinstance(env, str):
        module_name = _check_module(env)
        make: Callable[[], ParallelEnv] = functools.partial(_parallel_env_from_id, module_name, kwargs)
        name = module_name.rpartition(".")[2]
    elif isinstance(env, ParallelEnv):
        if num_envs != 1 or workers or kwargs:
            raise EnvError("one ParallelEnv instance makes one sub-env in this process, without kwargs; pass a "
                           "factory (e.g. the env module's parallel_env) for num_envs > 1 or workers > 0")
        first = env
        make = _refuse_copies
        name = type(env.unwrapped).__module__.rpartition(".")[2]
    elif callable(env):
        make = functools.partial(env, **kwargs)
        name = getattr(env, "__name__", type(env).__name__)
    else:
        raise EnvError(f"cannot build PettingZoo envs from {type(env).__name__}: pass an id such as "
                       "'mpe2.simple_spread_v3', a factory of ParallelEnvs, or a ParallelEnv")
    return PettingZooVecEnv(make, num_envs, device=device, seed=seed, workers=workers, first=first, name=name)


def _refuse_copies() -> ParallelEnv:
    raise EnvError("a ParallelEnv instance cannot be copied; pass a factory for several sub-envs")
