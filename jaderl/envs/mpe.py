"""Torch-native batched versions of MPE2's ``simple_spread_v3`` and ``simple_tag_v3`` (multi-agent particle envs).

Both envs follow the multi-agent side of the :class:`~jaderl.envs.vec.VecEnv` contract for ``N`` sub-envs of ``A``
agents: ``reset`` returns observations ``(N, A, obs_dim)``; ``step`` takes ``(N, A)`` integer actions (discrete) or
``(N, A, 2)`` floats in ``[-1, 1]`` (``continuous=True``) and returns observations ``(N, A, obs_dim)``, rewards
``(N, A)`` float32 and ``terminated`` / ``truncated`` ``(N,)`` bool (per sub-env: all its agents end together).
Finished sub-envs reset themselves inside ``step``; ``info["final_obs"]`` ``(N, A, obs_dim)`` and
``info["final_state"]`` ``(N, state_dim)`` hold what every sub-env reached with this step, before any auto-reset (equal
to the new observation and state where nothing finished). :meth:`global_state` gives the state ``(N, state_dim)``.
They run as pure tensor code: no Python loop over sub-envs, agents or pairs of entities (the contact forces and
collisions of all pairs are computed at once, on a fixed list of pairs gathered and scattered by index), everything on
``device``, no host synchronisation in ``step`` with ``sync_free`` (the default on a GPU; see
:class:`~jaderl.envs.classic.PendulumEnv`'s ``sync_free``, which this follows).

What matches MPE2 1.1.1 (``mpe2/_mpe_utils/core.py`` and ``simple_env.py``, ``simple_spread/simple_spread.py``,
``simple_tag/simple_tag.py``, stepped through ``parallel_env``), with MPE2's default arguments:

* the physics of ``World.step``: ``dt = 0.1``, damping ``0.25``, mass ``1``; the action force is the action's
  direction times the sensitivity (``5`` in simple_spread; ``accel``: ``3`` for adversaries, ``4`` for good agents in
  simple_tag), no motor noise; a contact force ``100 * delta / dist * 0.001 * logaddexp(0, (size_a + size_b - dist) /
  0.001)`` between every pair of colliding entities (simple_spread: agent-agent; simple_tag: agent-agent and
  agent-obstacle; obstacles never move), computed at the positions *before* the move; then, in MPE2's order,
  ``pos += vel * dt``, ``vel = vel * 0.75 + force * dt`` and, in simple_tag, the speed capped at ``max_speed``
  (``1.0`` adversaries, ``1.3`` good agents) by rescaling the velocity;
* the observations, in MPE2's order (see "Observations" below), the rewards (see "Rewards") and the global state
  (MPE2's ``state()``);
* time: never terminated (MPE2's default ``terminate_on_success=False``), truncated on the step at which the sub-env
  has taken ``max_steps`` steps since its reset (MPE2's ``max_cycles``, default 25);
* the initial-state distributions of ``reset_world``: agent positions ``U(-1, 1)`` per coordinate, velocities ``0``;
  landmark positions ``U(-1, 1)`` (simple_spread) or obstacle positions ``U(-0.9, 0.9)`` (simple_tag).

In float64, a sub-env started from an MPE2 world's positions and velocities (:meth:`set_world_state`) and given the
same actions agrees with MPE2 over whole episodes to rounding error (``tests/envs/test_mpe.py`` checks observations,
rewards, global state and flags to 1e-6, discrete and continuous; the observations agree to about 1e-15). The
arithmetic follows MPE2's order of operations, so most observations are bit for bit MPE2's.

What differs from MPE2: the random numbers come from a ``torch.Generator`` on the env's device, so seeds do not
reproduce MPE2's initial states (use :meth:`set_world_state` for that); continuous actions are 2-D force directions in
``[-1, 1]`` (see "Actions"); simple_tag's observations are zero-padded to one size and carry the agent type (see
"Observations"); observations are in the env's ``dtype`` (MPE2: float32) and rewards are float32 (MPE2: Python
floats); two entities more than 0.05 beyond contact push each other with the force they would at 0.05, under 2e-23
(MPE2's force is smaller still; see ``step``); finished sub-envs reset inside ``step``; NaN, infinite, out-of-range
or non-integral discrete (``0.7``) actions raise :class:`EnvError` (on the CPU; with ``sync_free`` they are not
checked); actions may also be a list or NumPy array of numbers, converted to a tensor on the env's device. MPE2's
options for curricula, partial observability (``num_*_neighbors``) and ``terminate_on_success`` are not reproduced;
simple_spread's ``local_ratio`` is.

Actions
    Discrete (the default): MPE2's five actions per agent, ``0`` no-op, ``1`` left (``-x``), ``2`` right (``+x``),
    ``3`` down (``-y``), ``4`` up (``+y``), each a unit push times the sensitivity. Continuous (``continuous=True``):
    a vector ``(fx, fy)`` per agent, clipped to ``[-1, 1]``, pushing with ``sensitivity * (fx, fy)``. MPE2's
    continuous action is a 5-vector ``a`` in ``[0, 1]`` whose push is ``sensitivity * (a[2] - a[1], a[4] - a[3])``
    (``a[0]`` is unused), so jaderl's ``(fx, fy)`` is MPE2's ``[0, max(-fx, 0), max(fx, 0), max(-fy, 0), max(fy,
    0)]``, and every MPE2 action ``a`` is jaderl's ``(a[2] - a[1], a[4] - a[3])``: the two action sets are the same.

Observations (``obs_dim`` = one agent's observation; ``L`` landmarks, ``A`` agents)
    simple_spread, MPE2's observation exactly, ``obs_dim = 6 * A``: ``[own velocity (2), own position (2), position of
    every landmark relative to the agent (2 L), position of every other agent relative to it, in agent order (2 (A -
    1)), the other agents' communication (2 (A - 1), always 0: MPE2's agents are silent)]``.
    simple_tag, agents ``0 .. n_adv - 1`` are adversaries (predators), the rest good agents (prey). Each row is the
    agent's MPE2 observation ``[own velocity (2), own position (2), every obstacle relative to the agent (2 L), every
    other agent relative to it, in agent order (2 (A - 1)), the velocity of every other *good* agent, in agent order]``
    (an adversary sees ``n_good`` velocities, a good agent ``n_good - 1``), then zeros up to ``obs_dim - 2`` (2 zeros
    for good agents, none for adversaries), then the agent type one-hot ``[1, 0]`` adversary / ``[0, 1]`` good agent:
    ``obs_dim = 4 + 2 L + 2 (A - 1) + 2 n_good + 2`` (18 with the defaults). Its first MPE2-size entries are MPE2's
    observation of that agent.

Global state
    :meth:`global_state` is MPE2's ``state()``: the concatenation, in agent order, of every agent's MPE2 observation
    (simple_spread: the ``A`` observations, ``state_dim = A * obs_dim``, 54 with 3 agents; simple_tag: without the
    padding and the one-hots, ``state_dim = n_adv * (obs_dim - 2) + n_good * (obs_dim - 4)``, 62 with the defaults).
    In simple_spread, ``info["final_state"]`` is a view of ``info["final_obs"]`` (the same numbers, not copied twice).

Rewards (per agent and step, MPE2's scale: no normalisation, no summing over agents)
    simple_spread: ``r_i = (1 - local_ratio) * global + local_ratio * local_i`` with ``local_ratio = 0.5``, ``global =
    -sum over landmarks of the distance from the landmark to its nearest agent`` (shared) and ``local_i = -(number of
    other agents overlapping agent i)`` (distance below the sum of the sizes, 0.3). A *team return* is the sum over the
    agents and the episode's steps of ``r_i``. With 3 agents and 25 steps a uniformly random policy scores about -80
    per episode: MPE2 -79.9 +- 0.5 (2,400 episodes), this env -79.3 +- 0.13 (32,768 episodes; the two agree within
    sampling error). That is the "about -81 team return in MPE2's scale" of the MARL issue. Per agent (the mean of the
    agents' returns) it is about -26.6; the global term alone, counted once and not halved, sums to about -52.8 per
    episode, and the team return is 1.5 times that plus half the agents' collision terms (about -2.6 in all).
    Libraries that report the per-agent return, or the global reward once, are on a 3x or 1.5x smaller scale.
    simple_tag: every adversary gets ``+10`` for every (adversary, good agent) pair that overlaps (the adversaries
    share one reward); a good agent gets ``-10`` for every adversary overlapping it, minus ``bound(|x|) + bound(|y|)``
    for its position, ``bound(v) = 0`` below 0.9, ``10 (v - 0.9)`` below 1, ``min(exp(2 v - 2), 10)`` beyond.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from jaderl.envs.vec import (
    NONFINITE_ACTIONS,
    EnvError,
    VecEnv,
    as_action_tensor,
    discrete_action_error,
    refuse_non_integral,
    seed_value,
)

__all__ = ["MPE_ENVS", "SimpleSpreadEnv", "SimpleTagEnv"]

StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]

# MPE2's World constants (mpe2/_mpe_utils/core.py)
DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 100.0
CONTACT_MARGIN = 1e-3
DEFAULT_SENSITIVITY = 5.0  # simple_env.py: used when an agent has no `accel`

_MOVES = ((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, -1.0), (0.0, 1.0))
"""The unit push of each of MPE2's discrete actions: no-op, left, right, down, up."""


def _pairs(num_agents: int, num_entities: int) -> list[tuple[int, int]]:
    """Every pair ``(i, j)``, ``i < j``, of colliding entities with an agent ``i`` in it, in MPE2's loop order."""
    return [(i, j) for i in range(num_agents) for j in range(i + 1, num_entities)]


class _MPEEnv(VecEnv):
    """Shared machinery: random stream, world state, physics, action checks, auto-reset, state copies.

    Every tensor keeps the sub-env index last, so that each operation runs over contiguous rows of ``N`` values
    (vectorised) however few agents and landmarks there are: the entities' positions ``(A + L, 2, N)`` (agents, then
    landmarks; landmarks never move), the agents' velocities ``(A, 2, N)``, the observations ``(A, obs_dim, N)``
    until one blocked 2-D transpose turns them into the contract's ``(N, A, obs_dim)``. Subclasses call
    :meth:`_build` in ``__init__`` and define ``_features`` and ``_reward``.
    """

    _landmark_low: float
    _landmarks_collide: bool
    _state_index: torch.Tensor | None
    """Columns of the flattened ``(N, A * obs_dim)`` observations that form the global state; None: all of them."""

    def _build(
        self,
        num_envs: int,
        device: str | torch.device,
        dtype: torch.dtype,
        seed: int | None,
        num_landmarks: int,
        sizes: list[float],
        sensitivity: list[float],
        max_speed: list[float] | None,
        continuous: bool,
        max_steps: int,
    ) -> None:
        """Set the attributes every MPE env has; ``sizes`` lists the agents' sizes, then the landmarks' where they
        collide with agents."""
        if int(num_envs) < 1:
            raise EnvError(f"num_envs must be at least 1, got {num_envs}")
        if not dtype.is_floating_point:
            raise EnvError(f"dtype must be a floating-point dtype (float32 or float64), got {dtype}")
        if int(max_steps) < 1:
            raise EnvError(f"max_steps must be at least 1, got {max_steps}")
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_agents = len(sensitivity)
        self.num_landmarks = int(num_landmarks)
        self.is_discrete = not continuous
        self.action_dim = 5 if self.is_discrete else 2
        self.max_steps = int(max_steps)
        a = self.num_agents

        def const(values: Any, dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        # discrete pushes, a flat (A, 2, 5) table: entry (i, c, k) is coordinate c of agent i's push for action k,
        # the unit move times the sensitivity (exactly MPE2's product); _push_index points at (i, c, 0)
        moves = const(_MOVES).T  # (2, 5)
        self._push_table = (moves.unsqueeze(0) * const(sensitivity).view(a, 1, 1)).flatten()
        self._push_index = torch.arange(0, 10 * a, 5, device=self.device).view(a, 2, 1)
        self._sensitivity = const(sensitivity).view(a, 1, 1)
        self._max_speed = None if max_speed is None else const(max_speed).view(a, 1, 1)
        # every pair of colliding entities with at least one agent in it (the entities are the agents, then the
        # landmarks where they collide: simple_tag's obstacles), in MPE2's loop order: (i, j), i < j, i an agent
        pairs = _pairs(a, len(sizes))
        self._pair_first = torch.tensor([i for i, _ in pairs], device=self.device)  # (P,)
        self._pair_second = torch.tensor([j for _, j in pairs], device=self.device)  # (P,)
        self._pair_min = const([sizes[i] + sizes[j] for i, j in pairs]).unsqueeze(1)  # (P, 1): contact distance
        self._zero = const(0.0)
        others = [[j for j in range(a) if j != i] for i in range(a)]
        self._others = const(others, torch.int64)  # (A, A - 1): every agent's others, in agent order

        self.generator = torch.Generator(device=self.device)
        """The env's random stream (initial states); its state is saved in checkpoints and :meth:`state_dict`."""
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed_value(seed))
        self._entities, self._vel = self._sample_initial()
        self._pos, self._landmarks = self._entities[:a], self._entities[a:]  # views: updated in place
        self.elapsed_steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        """Steps each sub-env has taken since its last reset, ``(num_envs,)`` int64 (MPE2's ``steps``)."""
        self.sync_free = self.device.type != "cpu"
        """``True`` (the default on a GPU): ``step`` never reads a tensor's value on the host, so it resets finished
        sub-envs by masking, drawing initial states for all of them every step, and does not check the actions (a NaN
        action makes that sub-env's state NaN until it resets; an out-of-range discrete action is clamped to 0 .. 4,
        a non-integral one truncated). ``False`` (the default on the CPU): steps in which no sub-env finished skip the
        reset work, and NaN, infinite, out-of-range or non-integral discrete (``0.7``) actions raise
        :class:`EnvError` before anything moves. The two draw from the generator at different times, so the same
        seed gives different initial states after the first auto-reset."""
        self._fresh = True  # the first reset() without a seed keeps the states drawn here (see classic.py)
        # scratch for the observations, (A, obs_dim, N): rewritten by every _features call and only ever copied out
        # (a new 1 MB buffer every step cost page faults); rows that never change are written here once
        self._features_buffer = torch.zeros(a, self.obs_shape[0], self.num_envs, dtype=dtype, device=self.device)
        self._geometry()

    # --------------------------------------------------------------------------------------------------- state
    def _sample_initial(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh worlds for every sub-env (MPE2's ``reset_world`` distributions): entity positions ``(A + L, 2, N)``
        and agent velocities ``(A, 2, N)``."""
        a = self.num_agents
        entities = torch.empty(a + self.num_landmarks, 2, self.num_envs, dtype=self.dtype, device=self.device)
        entities[:a].uniform_(-1.0, 1.0, generator=self.generator)
        entities[a:].uniform_(-self._landmark_low, self._landmark_low, generator=self.generator)
        return entities, torch.zeros(a, 2, self.num_envs, dtype=self.dtype, device=self.device)

    def _geometry(self) -> None:
        """Offsets ``pos_i - pos_j`` ``(P, 2, N)`` and distances ``(P, N)`` of every pair of colliding entities at the
        current positions: the collisions of this step and the contact forces of the next one use them."""
        first = self._entities.index_select(0, self._pair_first)
        self._delta = first.sub_(self._entities.index_select(0, self._pair_second))
        self._dist = self._delta.square().sum(1).sqrt_()

    @property
    def agent_pos(self) -> torch.Tensor:
        """A copy of the agents' positions, ``(N, A, 2)`` (MPE2's ``world.agents[i].state.p_pos``)."""
        return self._pos.permute(2, 0, 1).clone(memory_format=torch.contiguous_format)

    @property
    def agent_vel(self) -> torch.Tensor:
        """A copy of the agents' velocities, ``(N, A, 2)`` (MPE2's ``p_vel``)."""
        return self._vel.permute(2, 0, 1).clone(memory_format=torch.contiguous_format)

    @property
    def landmark_pos(self) -> torch.Tensor:
        """A copy of the landmarks' positions, ``(N, L, 2)`` (MPE2's ``world.landmarks[l].state.p_pos``)."""
        return self._landmarks.permute(2, 0, 1).clone(memory_format=torch.contiguous_format)

    def set_world_state(
        self,
        agent_pos: Any,
        agent_vel: Any,
        landmark_pos: Any,
        elapsed_steps: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """Overwrite the world of every sub-env and return the matching observation ``(N, A, obs_dim)``.

        Args:
            agent_pos: ``(N, A, 2)``, MPE2's ``world.agents[i].state.p_pos`` of every sub-env, in agent order.
            agent_vel: ``(N, A, 2)``, MPE2's ``p_vel`` of the agents.
            landmark_pos: ``(N, L, 2)``, MPE2's ``world.landmarks[l].state.p_pos``.
            elapsed_steps: new step counters (an int or a ``(N,)`` tensor; MPE2's ``steps``); ``None`` keeps them.

        Any array-like is accepted and converted to the env's dtype and device.
        """
        n, a, lm = self.num_envs, self.num_agents, self.num_landmarks
        for name, value, shape, target in (("agent_pos", agent_pos, (n, a, 2), self._pos),
                                           ("agent_vel", agent_vel, (n, a, 2), self._vel),
                                           ("landmark_pos", landmark_pos, (n, lm, 2), self._landmarks)):
            value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
            if tuple(value.shape) != shape:
                raise EnvError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
            target.copy_(value.permute(1, 2, 0))
        if elapsed_steps is not None:
            steps = torch.as_tensor(elapsed_steps, dtype=torch.int64, device=self.device)
            self.elapsed_steps.copy_(steps.expand(self.num_envs))
        self._fresh = False
        self._geometry()
        return self._to_obs(self._features())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of everything a copy of this env needs to continue bit for bit: the worlds (``agent_pos``,
        ``agent_vel``, ``landmark_pos`` as :meth:`set_world_state` takes them), the step counters and the
        generator's state."""
        return {"agent_pos": self.agent_pos, "agent_vel": self.agent_vel, "landmark_pos": self.landmark_pos,
                "elapsed_steps": self.elapsed_steps.clone(), "rng_state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from :meth:`state_dict` of an env with the same options and number of sub-envs."""
        missing = {"agent_pos", "agent_vel", "landmark_pos", "elapsed_steps", "rng_state"} - set(state)
        if missing:
            raise EnvError(f"the state lacks {', '.join(sorted(missing))}; pass what state_dict() returned")
        self.set_world_state(state["agent_pos"], state["agent_vel"], state["landmark_pos"], state["elapsed_steps"])
        self.set_rng_state(state["rng_state"])

    def global_state(self) -> torch.Tensor:
        """MPE2's ``state()`` of every sub-env now, ``(N, state_dim)`` (see "Global state" in the module docstring);
        it builds the observations anew."""
        return self._state_of(self._to_obs(self._features()))

    def _state_of(self, obs: torch.Tensor) -> torch.Tensor:
        """The global state of observations ``obs``: a view of them where it is all of them (simple_spread)."""
        flat = obs.view(self.num_envs, -1)
        return flat if self._state_index is None else flat.index_select(1, self._state_index)

    def _to_obs(self, features: torch.Tensor) -> torch.Tensor:
        """``(A, obs_dim, N)`` features as new ``(N, A, obs_dim)`` observations: a 2-D transpose, which PyTorch
        copies block by block (a 3-D permuted copy is about 10x slower on the CPU)."""
        obs = torch.empty(self.num_envs, features[:, :, 0].numel(), dtype=self.dtype, device=self.device)
        obs.copy_(features.view(-1, self.num_envs).T)
        return obs.view(self.num_envs, self.num_agents, -1)

    # --------------------------------------------------------------------------------------------- reset / step
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every sub-env to a fresh random world and zero the step counters; returns ``(N, A, obs_dim)``.

        ``seed`` re-seeds the env's generator first; without it the stream continues, except that the first
        ``reset()`` after construction returns the worlds the constructor drew from its ``seed``.
        """
        if seed is not None:
            self.generator.manual_seed(seed_value(seed))
        elif self._fresh:
            self._fresh = False
            return self._to_obs(self._features())
        self._fresh = False
        entities, vel = self._sample_initial()
        self._entities.copy_(entities)
        self._vel.copy_(vel)
        self.elapsed_steps.zero_()
        self._geometry()
        return self._to_obs(self._features())

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every sub-env one MPE2 world step (see the module docstring for what matches MPE2)."""
        push = self._push(action)  # (A, 2, N)
        # 1. contact forces at the positions before the move (MPE2's apply_environment_force), every pair at once:
        # 100 * delta / dist * k * logaddexp(0, (size_a + size_b - dist) / k) (torch's logaddexp is numpy's formula).
        # Pairs further than 50 margins (0.05) beyond contact get the force at 50 margins, below 2e-23 (MPE2's is
        # smaller still): the exp of the real, far more negative, values falls into subnormal numbers, and that made
        # the whole step 3x slower on the CPU.
        v = (self._pair_min - self._dist).div_(CONTACT_MARGIN).clamp_min_(-50.0)  # (P, N)
        penetration = torch.logaddexp(v, self._zero).mul_(CONTACT_MARGIN)
        contact = self._delta.mul(CONTACT_FORCE).div_(self._dist.unsqueeze(1)).mul_(penetration.unsqueeze(1))
        # +contact on the pair's first entity, -contact on its second (an obstacle's is dropped: it never moves)
        forces = torch.zeros_like(self._entities)
        forces.index_add_(0, self._pair_first, contact).index_add_(0, self._pair_second, contact, alpha=-1)
        force = forces[:self.num_agents].add_(push)
        # 2. integrate (MPE2's integrate_state): positions move with the old velocities; mass 1
        self._pos.add_(self._vel * DT)
        self._vel.mul_(1.0 - DAMPING).add_(force.mul_(DT))
        if self._max_speed is not None:
            speed = self._vel.square().sum(1, keepdim=True).sqrt_()  # (A, 1, N)
            capped = self._vel.div(speed).mul_(self._max_speed)
            torch.where(speed > self._max_speed, capped, self._vel, out=self._vel)
        self._geometry()
        features = self._features()
        reward = self._reward(features)
        final_obs = self._to_obs(features)
        self._fresh = False

        # 3. count the step, truncate at max_steps (MPE2's max_cycles), reset finished sub-envs
        steps = self.elapsed_steps.add_(1)
        truncated = steps >= self.max_steps
        terminated = torch.zeros_like(truncated)
        info = {"final_obs": final_obs, "final_state": self._state_of(final_obs)}
        if not self.sync_free and not truncated.any():  # 24 of 25 steps: see sync_free
            return final_obs.clone(), reward, terminated, truncated, info
        entities, vel = self._sample_initial()
        torch.where(truncated, entities, self._entities, out=self._entities)
        torch.where(truncated, vel, self._vel, out=self._vel)
        steps.masked_fill_(truncated, 0)
        self._geometry()
        return self._to_obs(self._features()), reward, terminated, truncated, info

    def _push(self, action: torch.Tensor) -> torch.Tensor:
        """The action forces ``(A, 2, N)``: checked actions (a list or NumPy array is read as a tensor) times the
        agents' sensitivities."""
        action = as_action_tensor(action, self.device, type(self).__name__)  # (a tensor: detached)
        n, a = self.num_envs, self.num_agents
        expected = (n, a) if self.is_discrete else (n, a, self.action_dim)
        if tuple(action.shape[:2]) != (n, a) or action.numel() != math.prod(expected):
            what = "one integer" if self.is_discrete else f"{self.action_dim} floats"
            raise EnvError(f"expected actions of shape {expected} ({what} per agent of every sub-env), got a tensor "
                           f"of shape {tuple(action.shape)}")
        if not self.sync_free:
            low, high = (x.item() for x in torch.aminmax(action.detach()))
            if not (math.isfinite(low) and math.isfinite(high)):
                raise EnvError(NONFINITE_ACTIONS)
            if self.is_discrete:
                refuse_non_integral(action, type(self).__name__)
            if self.is_discrete and (low < 0 or high >= self.action_dim):
                raise discrete_action_error(type(self).__name__, self.action_dim, low, high)
        action = action.detach().to(self.device).reshape(expected)
        if self.is_discrete:
            index = action.T.long()  # (A, N), may be the caller's tensor: not written to
            if self.sync_free:
                index = index.clamp(0, self.action_dim - 1)
            return self._push_table.take(index.unsqueeze(1) + self._push_index)  # (A, 2, N)
        return action.permute(1, 2, 0).to(self.dtype).clamp(-1.0, 1.0).mul_(self._sensitivity)

    def _features(self) -> torch.Tensor:
        """The observations of the current worlds as ``(A, obs_dim, N)`` (uses :meth:`_geometry`)."""
        raise NotImplementedError

    def _reward(self, features: torch.Tensor) -> torch.Tensor:
        """The rewards ``(N, A)`` float32 of the current worlds, whose observations are ``features``."""
        raise NotImplementedError

    def _common_features(self) -> torch.Tensor:
        """The features buffer ``(A, obs_dim, N)`` whose first ``4 + 2 L + 2 (A - 1)`` rows now hold each agent's
        own velocity and position, then the landmarks and the other agents relative to it, as MPE2 computes them
        (``other - own``); the rest is for the subclass to fill."""
        a, lm = self.num_agents, self.num_landmarks
        features = self._features_buffer
        features[:, 0:2] = self._vel
        features[:, 2:4] = self._pos
        end = 4 + 2 * lm
        torch.sub(self._landmarks.unsqueeze(0), self._pos.unsqueeze(1), out=features[:, 4:end].unflatten(1, (lm, 2)))
        others = features[:, end:end + 2 * (a - 1)].unflatten(1, (a - 1, 2))
        torch.sub(self._pos[self._others], self._pos.unsqueeze(1), out=others)
        return features

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_envs={self.num_envs}, device={str(self.device)!r}, dtype={self.dtype}, "
                f"num_agents={self.num_agents}, continuous={not self.is_discrete})")


class SimpleSpreadEnv(_MPEEnv):
    """Batched torch ``simple_spread_v3``: ``num_agents`` agents cover as many landmarks and avoid each other.

    Observation ``(N, A, 6 A)``, global state ``(N, 6 A^2)``, reward ``(N, A)``; see :mod:`jaderl.envs.mpe`.
    """

    _landmark_low = 1.0
    _landmarks_collide = False  # landmarks are only targets
    agent_size = 0.15

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        num_agents: int = 3,
        continuous: bool = False,
        max_steps: int = 25,
        local_ratio: float = 0.5,
    ) -> None:
        """Build ``num_envs`` worlds of ``num_agents`` agents and as many landmarks (MPE2's ``N``) on ``device``.

        ``continuous`` switches to 2-D force actions in ``[-1, 1]``; ``max_steps`` is MPE2's ``max_cycles``;
        ``local_ratio`` weighs each agent's collision penalty against the shared coverage reward, as in MPE2.
        ``seed`` seeds the env's ``torch.Generator`` (a random seed when ``None``).
        """
        if int(num_agents) < 2:
            raise EnvError(f"num_agents must be at least 2, got {num_agents}")
        if not 0.0 <= local_ratio <= 1.0:
            raise EnvError(f"local_ratio must be between 0 and 1, got {local_ratio}")
        a = int(num_agents)
        self.local_ratio = float(local_ratio)
        self.obs_shape = (6 * a,)
        self.state_shape = (6 * a * a,)
        self.teams = ()
        self._state_index = None
        self._build(num_envs, device, dtype, seed, num_landmarks=a, sizes=[self.agent_size] * a,
                    sensitivity=[DEFAULT_SENSITIVITY] * a, max_speed=None, continuous=continuous, max_steps=max_steps)

    def _features(self) -> torch.Tensor:
        return self._common_features()  # the silent agents' communication rows stay 0

    def _reward(self, features: torch.Tensor) -> torch.Tensor:
        lm = self.num_landmarks
        # global: -(sum over landmarks of the distance to the nearest agent), from the landmark offsets observed
        distance = features[:, 4:4 + 2 * lm].unflatten(1, (lm, 2)).square().sum(2).sqrt_()  # (A, L, N)
        coverage = distance.amin(0).sum(0).mul_(-(1.0 - self.local_ratio))  # (N,)
        # local: -(number of other agents overlapping the agent), counted on both agents of every pair
        hits = (self._dist < self._pair_min).to(self.dtype)  # (P, N)
        collisions = torch.zeros_like(self._pos[:, 0])  # (A, N)
        collisions.index_add_(0, self._pair_first, hits).index_add_(0, self._pair_second, hits)
        # (1 - local_ratio) * global + local_ratio * local
        reward = collisions.mul_(-self.local_ratio).add_(coverage)
        return torch.empty(self.num_envs, self.num_agents, dtype=torch.float32, device=self.device).copy_(reward.T)


class SimpleTagEnv(_MPEEnv):
    """Batched torch ``simple_tag_v3``: slower adversaries chase faster good agents among obstacles.

    Agents ``0 .. num_adversaries - 1`` are adversaries, the rest good agents (``teams`` says which). Observations
    are zero-padded to one size with a type one-hot; see :mod:`jaderl.envs.mpe`.
    """

    _landmark_low = 0.9
    _landmarks_collide = True  # obstacles push agents away
    adversary_size, good_size, obstacle_size = 0.075, 0.05, 0.2
    adversary_accel, good_accel = 3.0, 4.0
    adversary_max_speed, good_max_speed = 1.0, 1.3

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        num_adversaries: int = 3,
        num_good: int = 1,
        num_obstacles: int = 2,
        continuous: bool = False,
        max_steps: int = 25,
    ) -> None:
        """Build ``num_envs`` worlds of ``num_adversaries`` adversaries, ``num_good`` good agents and
        ``num_obstacles`` obstacles (MPE2's defaults 3, 1, 2) on ``device``.

        ``continuous`` switches to 2-D force actions in ``[-1, 1]``; ``max_steps`` is MPE2's ``max_cycles``;
        ``seed`` seeds the env's ``torch.Generator`` (a random seed when ``None``).
        """
        if int(num_adversaries) < 1 or int(num_good) < 1 or int(num_obstacles) < 0:
            raise EnvError(f"simple_tag needs at least 1 adversary and 1 good agent and no negative number of "
                           f"obstacles, got {num_adversaries}, {num_good} and {num_obstacles}")
        n_adv, n_good, n_obs = int(num_adversaries), int(num_good), int(num_obstacles)
        a = n_adv + n_good
        self.num_adversaries, self.num_good = n_adv, n_good
        adversary_len = 4 + 2 * n_obs + 2 * (a - 1) + 2 * n_good  # a good agent's MPE2 observation is 2 shorter
        d = adversary_len + 2
        self.obs_shape = (d,)
        self.state_shape = (n_adv * adversary_len + n_good * (adversary_len - 2),)
        self.teams = ("adversary",) * n_adv + ("agent",) * n_good
        lengths = [adversary_len] * n_adv + [adversary_len - 2] * n_good
        self._state_index = torch.tensor([i * d + k for i in range(a) for k in range(lengths[i])], device=device)
        # the other good agents whose velocities each agent sees, in order; a good agent's missing last one reads
        # agent 0's velocity, masked to 0 (the padding)
        good_others = [[j for j in range(n_adv, a) if j != i] for i in range(a)]
        self._vel_index = torch.tensor([g + [0] * (n_good - len(g)) for g in good_others], device=device)
        valid = [[k < len(g) for k in range(n_good)] for g in good_others]
        self._vel_valid = torch.tensor(valid, device=device).view(a, n_good, 1, 1)
        one_hot = [[1.0, 0.0]] * n_adv + [[0.0, 1.0]] * n_good
        self._one_hot = torch.tensor(one_hot, dtype=dtype, device=device).unsqueeze(-1)  # (A, 2, 1)
        # where the (adversary, good agent) pairs are in the list of pairs of _build, in (adversary, good) order
        pairs = _pairs(a, a + n_obs)
        self._hit_pairs = torch.tensor([pairs.index((i, j)) for i in range(n_adv) for j in range(n_adv, a)],
                                       device=device)
        self._build(num_envs, device, dtype, seed, num_landmarks=n_obs,
                    sizes=[self.adversary_size] * n_adv + [self.good_size] * n_good + [self.obstacle_size] * n_obs,
                    sensitivity=[self.adversary_accel] * n_adv + [self.good_accel] * n_good,
                    max_speed=[self.adversary_max_speed] * n_adv + [self.good_max_speed] * n_good,
                    continuous=continuous, max_steps=max_steps)
        self._features_buffer[:, d - 2:] = self._one_hot

    def _features(self) -> torch.Tensor:
        features = self._common_features()
        d = self.obs_shape[0]
        start = 4 + 2 * self.num_landmarks + 2 * (self.num_agents - 1)
        torch.where(self._vel_valid, self._vel[self._vel_index], self._zero,
                    out=features[:, start:d - 2].unflatten(1, (self.num_good, 2)))
        return features  # the one-hots were written by __init__

    def _reward(self, features: torch.Tensor) -> torch.Tensor:
        n_adv, a = self.num_adversaries, self.num_agents
        # overlapping (adversary, good agent) pairs, (n_adv, n_good, N)
        pairs = self._hit_pairs
        hits = (self._dist[pairs] < self._pair_min[pairs]).view(n_adv, self.num_good, self.num_envs)
        reward = torch.empty(self.num_envs, a, dtype=torch.float32, device=self.device)
        reward[:, :n_adv] = hits.sum((0, 1)).to(self.dtype).mul_(10.0).unsqueeze(1)
        # good agents: -10 per adversary on them, then the boundary penalty of each coordinate, in MPE2's order
        x = self._pos[n_adv:].abs()  # (n_good, 2, N)
        ramp = (x - 0.9).mul_(10.0)
        wall = x.mul(2.0).sub_(2.0).exp_().clamp_max_(10.0)
        bound = torch.where(x < 0.9, self._zero, torch.where(x < 1.0, ramp, wall))
        good = hits.sum(0).to(self.dtype).mul_(-10.0).sub_(bound[:, 0]).sub_(bound[:, 1])  # (n_good, N)
        reward[:, n_adv:] = good.T
        return reward


MPE_ENVS: dict[str, type[VecEnv]] = {
    "jaderl/simple_spread": SimpleSpreadEnv,
    "jaderl/simple_tag": SimpleTagEnv,
}
"""The torch-native MPE envs; each class takes ``(num_envs, device, dtype, seed, **options)``."""
