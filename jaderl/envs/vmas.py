"""VMAS scenarios (``vmas/navigation``, ``vmas/balance``, ``vmas/sampling`` ...) as batched multi-agent envs.

VMAS simulates all ``num_envs`` sub-envs as torch tensors on its device, so :class:`VmasVecEnv` hands them on as
they are: per-agent tensors are stacked into ``(N, A, ...)`` on the same device, with no numpy and no per-env Python
loop in ``step`` (except the one over sub-envs that finish at different times, below). It follows the multi-agent
contract of :class:`~jaderl.envs.vec.EnvSpec` for the scenario's ``A`` policy agents, in VMAS's order:

    obs (N, A, obs_dim) float32, reward (N, A) float32, terminated (N,) bool, truncated (N,) bool, info

* **Actions**: discrete ``(N, A)`` are VMAS's own discrete action indices (``continuous=False``: ``Discrete(n)`` per
  agent, the product of its movement choices and communication symbols); continuous ``(N, A, action_dim)`` in
  ``[-1, 1]`` are clipped and rescaled to each agent's bounds (``[-u_range, u_range]`` for movement, ``[0, 1]`` for
  communication). Every agent must have the same number of actions, or action vectors of one size; other
  scenarios are refused with an :class:`~jaderl.envs.vec.EnvError` (see :mod:`jaderl.envs.pettingzoo` for why).
  Actions may be tensors or lists or NumPy arrays of numbers (converted on VMAS's device); NaN, infinite or
  out-of-range actions and discrete ones given as floats that are not whole numbers (``0.7``) raise an
  :class:`~jaderl.envs.vec.EnvError` (checked in the step's first host synchronisation, below).
* **Observations**: agents of different observation sizes or teams are zero-padded and get an agent-type one-hot,
  as in :mod:`jaderl.envs.pettingzoo` (:class:`~jaderl.envs.pettingzoo.AgentObsLayout`); teams come from the agent
  names (``adversary_0`` -> ``adversary``). Scenarios that observe dicts are refused, and so are ``vmas.make_env``'s
  own options that change what it returns (``dict_spaces``, ``multidiscrete_actions``, ``wrapper`` ...: see
  :data:`VMAS_OWN_OPTIONS`); every other option goes to the scenario.
* **Global state** ``(N, state_dim)``: VMAS has no global state, so it is every agent's observation concatenated in
  agent order (without padding or one-hot).
* **Episodes**: ``terminated`` is the scenario's ``done()``; ``truncated`` comes from VMAS's own step counter
  (``max_steps``, at least 1), true on the step it reaches ``max_steps`` whether or not the sub-env also
  terminated, as with Gymnasium's ``TimeLimit``. Finished sub-envs reset inside ``step``: all at once with VMAS's
  batched ``reset()`` when all finished together (the time limit of sub-envs started together), otherwise with its
  ``reset_at(index)`` for each finished one, since VMAS scenarios reset one index or all of them, not a subset.
  ``info["final_obs"]`` and ``info["final_state"]`` hold what they reached before the reset. A step synchronises
  with the host twice: to check the actions, and to learn whether any sub-env finished (with the finiteness checks
  of observations and rewards).
* **Seeds**: ``seed`` seeds VMAS (``vmas.make_env(seed=...)``) and ``reset(seed)`` reseeds it; ``reset()`` draws
  new episodes from the stream. VMAS keeps one random state for all its envs of a process (a class attribute), so
  two VMAS envs in one process draw from the same stream. It keeps that state apart from the process's own CPU
  generator (and NumPy's and Python's), and the adapter does the same for the CUDA generators of every device
  (:data:`VMAS_CUDA_STATES`): seeding or stepping VMAS, which calls ``torch.manual_seed`` and draws on its device,
  leaves the process's CUDA random streams (the agent's exploration, dropout) as they were.
* **Copies**: no ``state_dict``: a scenario's state lives in attributes of its own (goals, shaping terms, sampled
  fields) besides the entities' positions and velocities, which VMAS offers no way to copy exactly, so resumed runs
  restart their episodes.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from jaderl.envs.pettingzoo import AgentObsLayout, agent_actions, agent_teams
from jaderl.envs.vec import EnvError, VecEnv, error_line

__all__ = ["VmasVecEnv", "make_vmas_env"]

VMAS_EXTRA = "pip install 'jaderl[vmas]'"

VMAS_OWN_OPTIONS = ("continuous_actions", "terminated_truncated", "dict_spaces", "multidiscrete_actions", "wrapper",
                    "wrapper_kwargs")
"""Keywords of ``vmas.make_env`` itself that decide what the adapter reads (lists of per-agent tensors, ``Discrete``
actions, separate terminated and truncated flags, VMAS's own env): jaderl sets them, so options of these names are
refused rather than passed on."""

VMAS_CUDA_STATES: list[torch.Tensor] = []
"""VMAS's own states of the CUDA generators, one per device (``torch.cuda.get_rng_state_all()``), shared by the VMAS
envs of a process as VMAS shares its CPU random state; empty until VMAS first runs where CUDA is available."""


@contextlib.contextmanager
def vmas_cuda_rng(device: torch.device | str) -> Iterator[None]:
    """Run VMAS on CUDA generators of its own: where the env is on a GPU or CUDA has started in this process, every
    device's generator holds VMAS's state (:data:`VMAS_CUDA_STATES`; the process's state the first time) inside the
    block, and the process's own again after it, also when the block raises. VMAS itself does this for the CPU
    generator only. A CPU env in a process where CUDA has not started leaves it unstarted (a forked worker process
    cannot start it)."""
    if not (torch.cuda.is_available() and (torch.device(device).type == "cuda" or torch.cuda.is_initialized())):
        yield
        return
    outer = torch.cuda.get_rng_state_all()
    if VMAS_CUDA_STATES:
        torch.cuda.set_rng_state_all(VMAS_CUDA_STATES)
    try:
        yield
    finally:
        VMAS_CUDA_STATES[:] = torch.cuda.get_rng_state_all()
        torch.cuda.set_rng_state_all(outer)


class VmasVecEnv(VecEnv):
    """``num_envs`` sub-envs of a VMAS scenario on ``device`` (see the module docstring); ``kwargs`` go to the
    scenario (e.g. ``n_agents=3``)."""

    def __init__(self, scenario: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                 continuous: bool = False, max_steps: int = 100, **kwargs: Any) -> None:
        try:
            import vmas
        except ImportError:
            raise EnvError(f"VMAS envs need the vmas package: {VMAS_EXTRA}") from None
        scenario = scenario.removeprefix("vmas/")
        known = sorted({*vmas.scenarios, *vmas.mpe_scenarios, *vmas.debug_scenarios})
        if scenario not in known:
            raise EnvError(f"unknown VMAS scenario {scenario!r}; choose one of: {', '.join(known)}")
        if num_envs < 1:
            raise EnvError(f"num_envs ({num_envs}) must be at least 1")
        own = [key for key in VMAS_OWN_OPTIONS if key in kwargs]
        if own:
            raise EnvError(f"VMAS option {own[0]} is jaderl's to set (it reads VMAS's lists of tensors and its "
                           "Discrete or Box actions); remove it, and give continuous=true for continuous actions")
        if max_steps < 1:  # (VMAS's "no limit" would let an evaluation of a scenario that never ends run 100,000 steps)
            raise EnvError(f"VMAS option max_steps={max_steps} must be at least 1 (the steps after which an episode "
                           "is truncated), e.g. ?max_steps=100")
        with vmas_cuda_rng(device), warnings.catch_warnings():  # VMAS only warns of options its scenario does not read:
            warnings.filterwarnings("error", message=".*passed but not used by the scenario")  # a typo would pass
            try:
                self.env = vmas.make_env(scenario, num_envs=num_envs, device=device, continuous_actions=continuous,
                                         max_steps=max_steps, seed=seed, terminated_truncated=True, **kwargs)
            except UserWarning as exc:
                unused = str(exc).partition("kwargs: ")[2].partition(" passed")[0]
                raise EnvError(f"VMAS scenario {scenario!r} reads no option {unused}; see the scenario's make_world "
                               "for the options it reads") from None
            except (AssertionError, ValueError, TypeError) as exc:
                if not kwargs:
                    raise
                given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
                raise EnvError(f"VMAS scenario {scenario!r} refused its options {given} ({error_line(exc)}); check "
                               "their values in the scenario's make_world") from exc
        self.device = self.env.device
        self.num_envs, self.max_steps, self.is_discrete = num_envs, max_steps, not continuous
        self.agents = tuple(agent.name for agent in self.env.agents)
        self.num_agents = len(self.agents)
        self.teams = agent_teams(self.agents)
        self._read_actions(scenario)
        with vmas_cuda_rng(self.device):
            obs = self._observe()
        for name, agent_obs in zip(self.agents, obs, strict=True):
            if not isinstance(agent_obs, torch.Tensor) or agent_obs.ndim != 2:
                raise EnvError(f"VMAS scenario {scenario!r} gives agent {name} observations of type "
                               f"{type(agent_obs).__name__}; jaderl needs one (num_envs, size) tensor per agent")
        self._obs_layout = AgentObsLayout.of([o.shape[1] for o in obs], self.teams)
        self.obs_shape = (self._obs_layout.obs_dim,)
        self.state_shape = (sum(self._obs_layout.sizes),)
        # (A, num_types) type one-hot, made once on the device
        self._one_hot = torch.from_numpy(self._obs_layout.one_hot()).to(self.device)
        self._obs = obs

    def _read_actions(self, scenario: str) -> None:
        """Set ``action_dim`` and, when continuous, every agent's bounds; refuse agents of different action sizes."""
        spaces = [self.env.get_agent_action_space(agent) for agent in self.env.agents]
        sizes = [int(space.n) if self.is_discrete else int(space.shape[0]) for space in spaces]
        if len(set(sizes)) > 1:
            what = "numbers of discrete actions" if self.is_discrete else "action sizes"
            raise EnvError(f"the agents of VMAS scenario {scenario!r} have different {what} "
                           f"({dict(zip(self.agents, sizes, strict=True))}); jaderl needs every agent to have the "
                           "same kind and size of action space")
        self.action_dim = sizes[0]
        if self.is_discrete:
            self._low = self._high = None
            return
        low = np.stack([np.asarray(space.low, np.float32) for space in spaces])  # (A, action_dim), read once
        high = np.stack([np.asarray(space.high, np.float32) for space in spaces])
        self._agent_low = torch.from_numpy(low).to(self.device)
        self._agent_high = torch.from_numpy(high).to(self.device)
        same = (low == low[0]).all() and (high == high[0]).all()
        # the spec's bounds: the shared ones, or every agent's, agent after agent
        self._low, self._high = (low[0], high[0]) if same else (low.reshape(-1), high.reshape(-1))

    # -- observations --------------------------------------------------------------------------------------------

    def _observe(self) -> list[torch.Tensor]:
        """Every agent's observation ``(N, size)`` now, without stepping or resetting."""
        return self.env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False,
                                          get_dones=False)[0]

    def _pack(self, obs: list[torch.Tensor]) -> torch.Tensor:
        """``(N, A, obs_dim)`` float32 from the agents' ``(N, size)`` observations (padded, with the one-hot)."""
        if self._obs_layout.is_plain:
            return torch.stack(obs, dim=1).to(torch.float32)
        width = self._obs_layout.width
        padded = torch.stack([torch.nn.functional.pad(o, (0, width - o.shape[1])) for o in obs], dim=1)
        one_hot = self._one_hot.expand(self.num_envs, -1, -1)
        return torch.cat([padded.to(torch.float32), one_hot], dim=2)

    @staticmethod
    def _state(obs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(obs, dim=1).to(torch.float32)

    # -- the contract --------------------------------------------------------------------------------------------

    def global_state(self) -> torch.Tensor:
        """Every agent's observation now, concatenated: ``(N, state_dim)`` (VMAS has no global state of its own)."""
        return self._state(self._obs)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        with vmas_cuda_rng(self.device):
            obs = self.env.reset(seed=seed)
        if not bool(torch.stack([torch.isfinite(o).all() for o in obs]).all()):
            raise EnvError("the env returned a non-finite observation; fix the scenario or wrap it to clip or reset")
        self._obs = obs
        return self._pack(obs)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        action = agent_actions(action, self.num_envs, self.num_agents, self.is_discrete, self.action_dim, self.device)
        action = action.to(self.device)
        if not self.is_discrete:  # rescale, then clamp: VMAS refuses values a rounding error beyond its bounds
            action = self._agent_low + (action + 1.0) * 0.5 * (self._agent_high - self._agent_low)
            action = torch.minimum(torch.maximum(action, self._agent_low), self._agent_high)
        with vmas_cuda_rng(self.device):
            obs, rewards, terminated, truncated, _ = self.env.step([action[:, i] for i in range(self.num_agents)])
        reward = torch.stack(rewards, dim=1).to(torch.float32)  # (N, A)
        final_obs, final_state = self._pack(obs), self._state(obs)
        done = terminated | truncated
        flags = torch.stack([done.any(), done.all(), torch.isfinite(final_state).all(), torch.isfinite(reward).all()])
        any_done, all_done, obs_finite, reward_finite = flags.tolist()  # the step's one host synchronisation
        if not (obs_finite and reward_finite):
            what = "reward" if obs_finite else "observation"
            raise EnvError(f"the env returned a non-finite {what}; fix the scenario or wrap it to clip or reset")
        if any_done:
            with vmas_cuda_rng(self.device):
                if all_done:
                    self.env.reset(return_observations=False)
                else:  # VMAS scenarios reset one index or every sub-env, not a subset
                    for index in done.nonzero().flatten().tolist():
                        self.env.reset_at(index, return_observations=False)
                fresh = self._observe()
            obs = [torch.where(done.unsqueeze(1), new, old) for new, old in zip(fresh, obs, strict=True)]
            if not bool(torch.isfinite(self._state(obs)).all()):
                raise EnvError("the env returned a non-finite observation; fix the scenario or wrap it to clip or "
                               "reset")
        self._obs = obs
        packed = self._pack(obs) if any_done else final_obs.clone()
        return packed, reward, terminated, truncated, {"final_obs": final_obs, "final_state": final_state}


def make_vmas_env(scenario: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None,
                  continuous: bool = False, max_steps: int = 100, **kwargs: Any) -> VecEnv:
    """``num_envs`` sub-envs of VMAS scenario ``scenario`` (``navigation`` or ``vmas/navigation``) on ``device``,
    truncated at ``max_steps`` (at least 1); ``kwargs`` go to the scenario. See the module docstring."""
    return VmasVecEnv(scenario, num_envs, device=device, seed=seed, continuous=continuous, max_steps=max_steps,
                      **kwargs)
