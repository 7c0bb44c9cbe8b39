"""``jaderl/Chasing-v0``: an agent chases a randomly moving target, as a batched torch env (no per-env Python loop).

ElegantRL's ``ChasingVecEnv`` example (its "How to create a VecEnv on GPUs" tutorial), written anew on the
:class:`~jaderl.envs.vec.VecEnv` contract with the shared machinery of :mod:`jaderl.envs.classic` (masked auto-resets
inside ``step``, ``TimeLimit`` truncation, ``set_state``, a ``torch.Generator`` for every random number).

Dynamics, per sub-env, in an unbounded ``dim``-dimensional space (no walls, as in ElegantRL's example):

* the target (point 0) draws a random acceleration ``u ~ U[0, 1)^dim`` every step (ElegantRL's ``torch.rand``: the
  target drifts on average towards ``+1`` in every coordinate, away from where the agent starts), scaled down to norm
  at most 1; ``v0 <- 0.5 v0 + u``; ``p0 <- p0 + 0.01 v0``;
* the agent (point 1) is driven by the action ``a`` (clipped to ``[-1, 1]^dim``, then scaled down to norm at most 1):
  ``v1 <- 0.75 v1 + a``; ``p1 <- p1 + 0.01 v1``;
* reward ``= d_before - d_after - 0.02 * ||a||`` (``d`` the agent-target distance, ``||a||`` the norm of the clipped
  action before scaling), plus ``init_distance`` (8) on the step that catches the target. This is ElegantRL's reward:
  a shaped ``-distance`` (the sum of ``d_before - d_after`` over an episode is ``d_start - d_end``);
* terminated when ``d_after < catch_distance`` (1.0); truncated after ``max_steps`` (1024) steps;
* initial state: ``p0 ~ N(0, 1)`` and ``p1 ~ N(-init_distance, 1)`` per coordinate, both velocities ``0``.

Observation and state, ``(num_envs, 4 * dim)``: ``[p0 (target position), v0 (target velocity), p1 (agent position),
v1 (agent velocity)]``, each block ``dim`` wide.

Differences from ElegantRL's code: resets are masked tensor operations, not a Python loop over sub-envs; the distance a
reward starts from is that of the current state, so the first reward of a fresh episode does not use the distance at
the end of the previous one (in ElegantRL's it did, a spurious ``-d_start`` jump); the action is clipped to the
contract's ``[-1, 1]^dim`` before the norm is taken; both ``terminated`` and ``truncated`` are returned
(ElegantRL's had one ``done``).

The target's accelerations come from the same ``generator`` as the initial states, so the two ``sync_free`` settings
(which draw initial states at different times, see :mod:`jaderl.envs.classic`) give the same trajectories only until
the first auto-reset; after it every sub-env's target moves differently (from the same distribution).
"""

from __future__ import annotations

import torch

from jaderl.envs.classic import StepResult, _TorchClassicEnv
from jaderl.envs.vec import EnvError, as_action_tensor

__all__ = ["CHASING_ENVS", "ChasingEnv"]


class ChasingEnv(_TorchClassicEnv):
    """Batched torch chasing env (after ElegantRL's ChasingVecEnv): an agent accelerates towards a moving target.

    Action: ``(num_envs, dim)`` floats in ``[-1, 1]`` (the agent's acceleration; a tensor, or a list or NumPy array
    of numbers). Observation and state: ``(num_envs, 4 * dim)`` = ``[target pos, target vel, agent pos, agent vel]``.
    See :mod:`jaderl.envs.chasing`.
    """

    _init_high = ()  # unused: _sample_initial is overridden

    target_damping = 0.5
    agent_damping = 0.75
    dt = 0.01
    action_cost = 0.02

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        dim: int = 2,
        max_steps: int = 1024,
        init_distance: float = 8.0,
        catch_distance: float = 1.0,
    ) -> None:
        """Build ``num_envs`` chases in ``dim`` dimensions on ``device``; the state and observations use ``dtype``.

        ``seed`` seeds the env's ``torch.Generator`` (a random seed when ``None``); it draws the initial states and the
        target's accelerations. ``init_distance`` is the agent's mean initial offset per coordinate and the bonus for
        a catch; a catch is a distance below ``catch_distance``.
        """
        if int(dim) < 1 or int(max_steps) < 1:
            raise EnvError(f"dim and max_steps must be at least 1, got dim={dim}, max_steps={max_steps}")
        if not catch_distance > 0:
            raise EnvError(f"catch_distance must be positive, got {catch_distance}")
        self.dim = int(dim)
        self.state_dim = 4 * self.dim
        self.obs_shape = (self.state_dim,)
        self.is_discrete = False
        self.action_dim = self.dim
        self.max_steps = int(max_steps)
        self.init_distance = float(init_distance)
        self.catch_distance = float(catch_distance)
        super().__init__(num_envs, device, dtype, seed)

    def _sample_initial(self) -> torch.Tensor:
        d = self.dim
        out = torch.zeros(self.state_dim, self.num_envs, device=self.device, dtype=self.dtype)
        out[:d].normal_(0.0, 1.0, generator=self.generator)  # target position
        out[2 * d : 3 * d].normal_(-self.init_distance, 1.0, generator=self.generator)  # agent position
        return out

    def _observe(self) -> torch.Tensor:
        obs = torch.empty(self.num_envs, self.state_dim, dtype=self.dtype, device=self.device)
        obs.T.copy_(self._state)
        return obs

    def _distance(self) -> torch.Tensor:
        d = self.dim
        return _norm(self._state[:d] - self._state[2 * d : 3 * d])

    def step(self, action: torch.Tensor) -> StepResult:
        """Move target and agent one step, reward the approach, catch, truncate and auto-reset (module docstring).

        ``action`` may also be a list or NumPy array of numbers, converted to a tensor on the env's device."""
        action = as_action_tensor(action, self.device, type(self).__name__)  # (a tensor: detached)
        if action.numel() != self.num_envs * self.dim:
            raise EnvError(
                f"expected ({self.num_envs}, {self.dim}) actions (one {self.dim}-vector per sub-env), "
                f"got a tensor of shape {tuple(action.shape)}"
            )
        if not self.sync_free:  # NaN or infinite actions: one sentence, before anything moves (sync_free)
            self._check_action(action)
        d = self.dim
        a = action.reshape(self.num_envs, d).to(device=self.device, dtype=self.dtype).clamp(-1.0, 1.0).T
        a_norm = _norm(a)
        a = a / a_norm.clamp_min(1.0)
        u = torch.rand(d, self.num_envs, device=self.device, dtype=self.dtype, generator=self.generator)
        u.div_(_norm(u).clamp_min_(1.0))

        before = self._distance()
        p0, v0, p1, v1 = self._state.view(4, d, self.num_envs)  # views (blocks) updated in place
        v0.mul_(self.target_damping).add_(u)
        p0.add_(v0 * self.dt)
        v1.mul_(self.agent_damping).add_(a)
        p1.add_(v1 * self.dt)
        after = self._distance()

        caught = after < self.catch_distance
        reward = before.sub_(after).sub_(a_norm.mul_(self.action_cost))
        reward.add_(caught.to(self.dtype).mul_(self.init_distance))
        obs, terminated, truncated, info = self._finish_step(caught)
        return obs, reward.to(torch.float32), terminated, truncated, info

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, dim={self.dim}, device={str(self.device)!r}, "
            f"dtype={self.dtype})"
        )


def _norm(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm of the columns of a ``(dim, num_envs)`` tensor (100x faster on CPU than
    ``torch.linalg.vector_norm(x, dim=0)``, which reduces along the strided dimension)."""
    return x.square().sum(0).sqrt_()


CHASING_ENVS: dict[str, type[ChasingEnv]] = {"jaderl/Chasing-v0": ChasingEnv}
"""The chasing env's id; :mod:`jaderl.envs` merges it into ``TORCH_ENVS``."""
