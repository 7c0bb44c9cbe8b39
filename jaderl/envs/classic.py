"""Torch-native batched versions of Gymnasium's classic-control ``Pendulum-v1`` and ``CartPole-v1``.

(``Acrobot-v1``, ``MountainCar-v0`` and ``MountainCarContinuous-v0`` follow at the end of the module, with the same
machinery and the same promises; their class docstrings say what matches Gymnasium. They are registered in
``MORE_TORCH_ENVS``, which :mod:`jaderl.envs` merges into its ``TORCH_ENVS``.)

Both envs follow the :class:`~jaderl.envs.vec.VecEnv` contract and run as pure tensor code (no per-env Python loop,
no host synchronisation in ``step`` on a GPU; see ``sync_free``), on CPU or CUDA, for any number of sub-envs.

What matches Gymnasium 1.4 (``gymnasium/envs/classic_control/pendulum.py`` and ``cartpole.py``, plus the
``TimeLimit`` wrapper that ``gym.make`` adds):

* the dynamics: constants, clipping and order of operations of ``step`` (Pendulum: ``thdot`` is updated and clipped
  to ``[-8, 8]`` first, then ``th`` with the new ``thdot``; CartPole: the ``"euler"`` integrator, positions updated
  with the old velocities). In float64, a trajectory started from a Gymnasium env's ``unwrapped.state`` with the same
  actions agrees with Gymnasium to rounding error;
* the observations (Pendulum ``[cos th, sin th, thdot]``, CartPole ``[x, x_dot, theta, theta_dot]``);
* the rewards: Pendulum ``-(angle_normalize(th)**2 + .1 * thdot**2 + .001 * u**2)`` computed from the state
  *before* the step and the clipped torque ``u``; CartPole ``1.0`` on every step, the terminating one included
  (Gymnasium 1.x default ``sutton_barto_reward=False``);
* termination: CartPole terminates when, after the update, ``|x| > 2.4`` or ``|theta| > 12 degrees``; Pendulum never
  terminates;
* truncation exactly as ``TimeLimit``: a per-sub-env counter of steps since the last reset, and ``truncated`` is
  ``True`` on the step where it reaches ``max_steps`` (Pendulum 200, CartPole 500) *whether or not* the sub-env also
  terminated on that step, so both flags can be ``True`` together;
* the initial-state distributions: Pendulum ``th ~ U(-pi, pi)``, ``thdot ~ U(-1, 1)``; CartPole ``U(-0.05, 0.05)``
  for each of the four state variables.

What differs from Gymnasium: the random numbers come from a ``torch.Generator`` on the env's device (not NumPy's),
so seeds do not reproduce Gymnasium's initial states (use :meth:`set_state` for that); Pendulum's action is in
``[-1, 1]`` and becomes the torque ``2 * clip(action, -1, 1)``, which equals Gymnasium's ``clip(torque, -2, 2)``;
observations are in the env's ``dtype`` (Gymnasium: float32) while rewards are float32; finished sub-envs reset
themselves inside ``step`` with ``info["final_obs"]`` holding the observation they reached (see
:mod:`jaderl.envs.vec`); NaN, infinite, out-of-range or non-integral (``0.7``) discrete actions raise
:class:`EnvError` (on the CPU; with ``sync_free`` they are not checked, see there); and actions may also be a list or
NumPy array of numbers, converted to a tensor on the env's device (anything else is refused in one sentence).
"""

from __future__ import annotations

import math

import torch

from jaderl.envs.vec import (
    NONFINITE_ACTIONS,
    EnvError,
    VecEnv,
    as_action_tensor,
    discrete_action_error,
    refuse_non_integral,
    seed_value,
    state_tensors,
)

__all__ = [
    "MORE_TORCH_ENVS",
    "TORCH_ENVS",
    "AcrobotEnv",
    "CartPoleEnv",
    "MountainCarContinuousEnv",
    "MountainCarEnv",
    "PendulumEnv",
]

StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]


class _TorchClassicEnv(VecEnv):
    """Shared machinery: RNG, state storage, step counters, reset, ``set_state``/``state``.

    The state is stored as a ``(state_dim, num_envs)`` tensor so every state variable is a contiguous row.
    Subclasses define ``state_dim``, ``max_steps``, ``_init_high`` (half-width of the uniform initial state),
    ``_observe`` and ``step``.
    """

    state_dim: int
    _init_high: tuple[float, ...]

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
    ) -> None:
        if int(num_envs) < 1:
            raise EnvError(f"num_envs must be at least 1, got {num_envs}")
        if not dtype.is_floating_point:
            raise EnvError(f"dtype must be a floating-point dtype (float32 or float64), got {dtype}")
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.generator = torch.Generator(device=self.device)
        """The env's random stream (initial states); its state is saved in checkpoints."""
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed_value(seed))
        self._state = self._sample_initial()
        self.elapsed_steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        """Steps each sub-env has taken since its last reset, ``(num_envs,)`` int64 (the ``TimeLimit`` counter)."""
        self.sync_free = self.device.type != "cpu"
        """``True`` (the default on a GPU): ``step`` never reads a tensor's value on the host, so it resets finished
        sub-envs by masking, drawing initial states for all of them every step, and does not check the actions (a NaN
        action makes that sub-env's state NaN until it resets; an out-of-range discrete action is clamped, a
        non-integral one is used as it is, and CartPole pushes left for anything but 1). ``False`` (the default on
        the CPU, where such a read costs nothing): a step in which no sub-env finished skips the draw, the mask and
        the second observation, 1.5x to 2x faster for Pendulum at 4,096 envs, and NaN, infinite, out-of-range or
        non-integral discrete actions raise :class:`EnvError` before anything moves. The two draw from the generator
        at different times, so the same seed gives different initial states after the first auto-reset."""
        # True until the first step/reset/set_state: the first reset() without a seed then keeps the initial state
        # drawn here, so ``Env(seed=s).reset()`` and ``Env().reset(seed=s)`` give the same states.
        self._fresh = True

    # ----------------------------------------------------------------------------------------------- state access
    def _sample_initial(self) -> torch.Tensor:
        """A fresh initial state for every sub-env, ``(state_dim, num_envs)``, uniform in ``[-high, high]``."""
        # uniform_(low, high) draws low + (high - low) * U, Gymnasium's formula; one call when all bounds are equal
        out = torch.empty(self.state_dim, self.num_envs, device=self.device, dtype=self.dtype)
        if len(set(self._init_high)) == 1:
            return out.uniform_(-self._init_high[0], self._init_high[0], generator=self.generator)
        for row, high in zip(out, self._init_high, strict=True):
            row.uniform_(-high, high, generator=self.generator)
        return out

    def _observe(self) -> torch.Tensor:
        """The observation of the current state, a new ``(num_envs, *obs_shape)`` tensor."""
        raise NotImplementedError

    @property
    def state(self) -> torch.Tensor:
        """A copy of the current state, ``(num_envs, state_dim)`` in ``dtype`` (same layout as Gymnasium's
        ``unwrapped.state``, one row per sub-env)."""
        return self._state.T.clone(memory_format=torch.contiguous_format)

    def set_state(self, state: torch.Tensor, elapsed_steps: torch.Tensor | int | None = None) -> torch.Tensor:
        """Overwrite the state of every sub-env and return the matching observation.

        Args:
            state: ``(num_envs, state_dim)``, one row per sub-env, in Gymnasium's ``unwrapped.state`` layout
                (Pendulum ``[th, thdot]``, CartPole ``[x, x_dot, theta, theta_dot]``); any array-like is accepted and
                converted to the env's dtype and device.
            elapsed_steps: new value of the per-sub-env step counters (an int or a ``(num_envs,)`` tensor); ``None``
                (the default) leaves the counters as they are, so rewriting the whole state after one sub-env
                finished does not disturb the others' time limits.

        Returns:
            The observation ``(num_envs, *obs_shape)`` of the new state.
        """
        state = torch.as_tensor(state, dtype=self.dtype, device=self.device)
        if tuple(state.shape) != (self.num_envs, self.state_dim):
            raise EnvError(f"state must have shape {(self.num_envs, self.state_dim)}, got {tuple(state.shape)}")
        self._state.copy_(state.T)
        if elapsed_steps is not None:
            steps = torch.as_tensor(elapsed_steps, dtype=torch.int64, device=self.device)
            self.elapsed_steps.copy_(steps.expand(self.num_envs))
        self._fresh = False
        return self._observe()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state, step counters and random stream: a copy continues the same episodes bit for bit."""
        return {"state": self._state.clone(), "elapsed_steps": self.elapsed_steps.clone(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from :meth:`state_dict` of an env with the same options and number of sub-envs."""
        values, steps, generator = state_tensors(state, {"state": tuple(self._state.shape),
                                                         "elapsed_steps": (self.num_envs,), "generator": None})
        self._state = values.to(self.device, self.dtype, copy=True)
        self.elapsed_steps.copy_(steps)
        self.set_rng_state(generator)

    # ---------------------------------------------------------------------------------------------- reset / step
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every sub-env to a fresh random initial state and zero the step counters.

        ``seed`` re-seeds the env's generator first (same seed, same initial states and, with the same actions, the
        same trajectory); without it the generator stream continues, except that the first ``reset()`` after
        construction returns the initial states the constructor already drew from its ``seed``.
        """
        if seed is not None:
            self.generator.manual_seed(seed_value(seed))
        elif self._fresh:
            self._fresh = False
            return self._observe()
        self._fresh = False
        self._state = self._sample_initial()
        self.elapsed_steps.zero_()
        return self._observe()

    def _finish_step(self, terminated: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Count the step, truncate like ``TimeLimit``, auto-reset finished sub-envs (masked; see ``sync_free``).

        Returns ``obs``, ``terminated``, ``truncated`` and ``info``.
        """
        steps = self.elapsed_steps.add_(1)
        truncated = steps >= self.max_steps
        if terminated is None:
            terminated = torch.zeros_like(truncated)
            done = truncated
        else:
            done = terminated | truncated
        final_obs = self._observe()
        self._fresh = False
        if not self.sync_free and not done.any():  # nothing to reset (199 of Pendulum's 200 steps): see sync_free
            return final_obs.clone(), terminated, truncated, {"final_obs": final_obs}
        torch.where(done, self._sample_initial(), self._state, out=self._state)
        steps.masked_fill_(done, 0)
        return self._observe(), terminated, truncated, {"final_obs": final_obs}

    def _action(self, action: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        """``action`` as a ``(num_envs,)`` tensor on the env's device (no copy when it already is one; a list or NumPy
        array is converted)."""
        action = as_action_tensor(action, self.device, type(self).__name__)  # (a tensor: detached)
        if action.numel() != self.num_envs:
            raise EnvError(
                f"expected {self.num_envs} actions (one per sub-env), got a tensor of shape {tuple(action.shape)}"
            )
        if not self.sync_free:
            self._check_action(action)
        return action.reshape(self.num_envs).to(device=self.device, dtype=dtype)

    def _check_action(self, action: torch.Tensor) -> None:
        """Refuse NaN or infinite actions, and discrete ones outside ``0 .. action_dim - 1`` or not whole numbers
        (float actions such as ``0.7``), in one sentence.

        It reads the actions' extremes on the host, so ``step`` calls it only without ``sync_free``.
        """
        low, high = (x.item() for x in torch.aminmax(action))
        if not (math.isfinite(low) and math.isfinite(high)):
            raise EnvError(NONFINITE_ACTIONS)
        if not self.is_discrete:
            return
        refuse_non_integral(action, type(self).__name__)
        if low < 0 or high >= self.action_dim:
            raise discrete_action_error(type(self).__name__, self.action_dim, low, high)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs}, device={str(self.device)!r}, dtype={self.dtype})"


class PendulumEnv(_TorchClassicEnv):
    """Batched torch ``Pendulum-v1`` (Gymnasium 1.4 dynamics, ``g = 10``, truncated at 200 steps).

    Action: ``(num_envs, 1)`` (or ``(num_envs,)``) floats in ``[-1, 1]``, clipped, torque ``= 2 * action``.
    Observation: ``(num_envs, 3)`` = ``[cos th, sin th, thdot]``. State: ``[th, thdot]``.
    """

    state_dim = 2
    _init_high = (math.pi, 1.0)

    g = 10.0
    m = 1.0
    length = 1.0  # Gymnasium's `l`
    dt = 0.05
    max_speed = 8.0
    max_torque = 2.0

    obs_shape = (3,)
    is_discrete = False
    action_dim = 1
    max_steps = 200

    def _observe(self) -> torch.Tensor:
        th, thdot = self._state
        obs = torch.empty(self.num_envs, 3, dtype=self.dtype, device=self.device)
        torch.cos(th, out=obs[:, 0])  # writing columns in place beats torch.stack(..., dim=1) about 1.5x on CPU
        torch.sin(th, out=obs[:, 1])
        obs[:, 2].copy_(thdot)
        return obs

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every pendulum one step of ``dt = 0.05`` s (see the module docstring for what matches Gymnasium)."""
        u = self._action(action, self.dtype).clamp(-1.0, 1.0).mul_(self.max_torque)
        th, thdot = self._state  # views (rows) updated in place

        # cost = angle_normalize(th)**2 + .1 * thdot**2 + .001 * u**2, from the state before the step
        cost = th.add(math.pi).remainder_(2 * math.pi).sub_(math.pi)
        cost.mul_(cost).addcmul_(thdot, thdot, value=0.1).addcmul_(u, u, value=0.001)
        reward = cost.neg_().to(torch.float32)

        # newthdot = clip(thdot + (3g/(2l) sin th + 3/(m l^2) u) dt, -8, 8); newth = th + newthdot dt
        acc = th.sin().mul_(3 * self.g / (2 * self.length)).add_(u, alpha=3.0 / (self.m * self.length**2))
        thdot.add_(acc, alpha=self.dt).clamp_(-self.max_speed, self.max_speed)
        th.add_(thdot, alpha=self.dt)

        obs, terminated, truncated, info = self._finish_step(None)
        return obs, reward, terminated, truncated, info


class CartPoleEnv(_TorchClassicEnv):
    """Batched torch ``CartPole-v1`` (Gymnasium 1.4 dynamics, Euler integrator, truncated at 500 steps).

    Action: ``(num_envs,)`` integers, ``0`` pushes left (force ``-10``), ``1`` right (``+10``). Observation and
    state: ``(num_envs, 4)`` = ``[x, x_dot, theta, theta_dot]``. Reward ``1.0`` per step.
    """

    state_dim = 4
    _init_high = (0.05, 0.05, 0.05, 0.05)

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    obs_shape = (4,)
    is_discrete = True
    action_dim = 2
    max_steps = 500

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
    ) -> None:
        """Build ``num_envs`` cart-poles on ``device``; the state and observations use ``dtype``.

        ``seed`` seeds the env's ``torch.Generator`` (a random seed when ``None``).
        """
        super().__init__(num_envs, device, dtype, seed)
        self._force_pos = torch.tensor(self.force_mag, dtype=dtype, device=self.device)
        self._force_neg = torch.tensor(-self.force_mag, dtype=dtype, device=self.device)
        # |x| > 2.4 or |theta| > 12 deg, checked on the rows [x, theta] of the state at once
        self._thresholds = torch.tensor(
            [[self.x_threshold], [self.theta_threshold_radians]], dtype=dtype, device=self.device
        )

    def _observe(self) -> torch.Tensor:
        obs = torch.empty(self.num_envs, 4, dtype=self.dtype, device=self.device)
        obs.T.copy_(self._state)  # faster than self._state.T.clone() on CPU
        return obs

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every cart-pole one Euler step of ``tau = 0.02`` s (see the module docstring)."""
        force = torch.where(self._action(action, None) == 1, self._force_pos, self._force_neg)
        x, x_dot, theta, theta_dot = self._state  # views (rows) updated in place
        costheta = theta.cos()
        sintheta = theta.sin()

        # temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        temp = force.addcmul_(theta_dot * theta_dot, sintheta, value=self.polemass_length).div_(self.total_mass)
        # thetaacc = (g sin - cos temp) / (length (4/3 - masspole cos^2 / total_mass))
        thetaacc = sintheta.mul_(self.gravity).addcmul_(costheta, temp, value=-1.0)
        denom = costheta * costheta
        denom.mul_(-self.masspole / self.total_mass).add_(4.0 / 3.0).mul_(self.length)
        thetaacc.div_(denom)
        # xacc = temp - polemass_length * thetaacc * cos / total_mass
        xacc = temp.addcmul_(thetaacc, costheta, value=-self.polemass_length / self.total_mass)

        # Euler: positions move with the old velocities
        x.add_(x_dot, alpha=self.tau)
        x_dot.add_(xacc, alpha=self.tau)
        theta.add_(theta_dot, alpha=self.tau)
        theta_dot.add_(thetaacc, alpha=self.tau)

        terminated = (self._state[0::2].abs() > self._thresholds).any(dim=0)
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        obs, terminated, truncated, info = self._finish_step(terminated)
        return obs, reward, terminated, truncated, info


TORCH_ENVS: dict[str, type[VecEnv]] = {
    "jaderl/Pendulum-v1": PendulumEnv,
    "jaderl/CartPole-v1": CartPoleEnv,
}
"""Torch-native env ids and their classes; each class takes ``(num_envs, device, dtype, seed)``."""


# ---------------------------------------------------------------------------------------------------------------------
# Acrobot-v1, MountainCar-v0 and MountainCarContinuous-v0 (Gymnasium 1.4 ``acrobot.py``, ``mountain_car.py`` and
# ``continuous_mountain_car.py``). Same machinery and the same promises as above: pure tensor code, masked auto-resets,
# ``TimeLimit`` truncation, ``set_state`` in Gymnasium's ``unwrapped.state`` layout; the float arithmetic follows
# Gymnasium's order of operations so that float64 trajectories agree with it to rounding error.
# ---------------------------------------------------------------------------------------------------------------------


def _discrete_offset(action: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 3-way discrete action ``{0, 1, 2}`` as ``action - 1`` in ``{-1, 0, 1}`` (with ``sync_free``, where actions
    are not checked, out-of-range ones are clamped)."""
    return action.clamp(0, 2).sub_(1).to(dtype)


class AcrobotEnv(_TorchClassicEnv):
    """Batched torch ``Acrobot-v1`` (Gymnasium 1.4 "book" dynamics, RK4 over ``dt = 0.2`` s, truncated at 500 steps).

    Action: ``(num_envs,)`` integers ``0, 1, 2`` = torque ``-1, 0, +1`` on the joint between the links.
    Observation: ``(num_envs, 6)`` = ``[cos th1, sin th1, cos th2, sin th2, dth1, dth2]``. State: ``[th1, th2, dth1,
    dth2]``, initially ``U(-0.1, 0.1)`` each. Reward ``-1`` per step and ``0`` on the step that terminates, which is
    when ``-cos th1 - cos(th2 + th1) > 1`` after the step. After each RK4 step the angles are wrapped into
    ``[-pi, pi]`` and the velocities clipped to ``[-4 pi, 4 pi]`` and ``[-9 pi, 9 pi]``, as Gymnasium does
    (``torque_noise_max = 0``, no noise).
    """

    state_dim = 4
    _init_high = (0.1, 0.1, 0.1, 0.1)

    dt = 0.2
    link_length_1 = 1.0
    link_mass_1 = 1.0
    link_mass_2 = 1.0
    link_com_pos_1 = 0.5
    link_com_pos_2 = 0.5
    link_moi = 1.0
    max_vel_1 = 4 * math.pi
    max_vel_2 = 9 * math.pi
    g = 9.8

    obs_shape = (6,)
    is_discrete = True
    action_dim = 3
    max_steps = 500

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
    ) -> None:
        """Build ``num_envs`` acrobots on ``device``; the state and observations use ``dtype``.

        ``seed`` seeds the env's ``torch.Generator`` (a random seed when ``None``).
        """
        super().__init__(num_envs, device, dtype, seed)
        # Gymnasium's constant sub-expressions of _dsdt, evaluated in its order (Python floats, left to right)
        m1, m2, l1 = self.link_mass_1, self.link_mass_2, self.link_length_1
        lc1, lc2, i1, i2, g = self.link_com_pos_1, self.link_com_pos_2, self.link_moi, self.link_moi, self.g
        self._m2, self._i1, self._i2 = m2, i1, i2
        self._d1_a = m1 * lc1**2
        self._d1_b = l1**2 + lc2**2
        self._d1_c = 2 * l1 * lc2
        self._d2_a = lc2**2
        self._d2_b = l1 * lc2
        self._phi2_c = m2 * lc2 * g
        self._phi1_a = -m2 * l1 * lc2
        self._phi1_b = 2 * m2 * l1 * lc2
        self._phi1_c = (m1 * lc1 + m2 * l1) * g
        self._dd2_a = m2 * l1 * lc2
        self._dd2_den = m2 * lc2**2 + i2

    def _observe(self) -> torch.Tensor:
        th1, th2 = self._state[:2]
        obs = torch.empty(self.num_envs, 6, dtype=self.dtype, device=self.device)
        torch.cos(th1, out=obs[:, 0])
        torch.sin(th1, out=obs[:, 1])
        torch.cos(th2, out=obs[:, 2])
        torch.sin(th2, out=obs[:, 3])
        obs[:, 4:].T.copy_(self._state[2:])
        return obs

    def _dsdt(
        self, th1: torch.Tensor, th2: torch.Tensor, dth1: torch.Tensor, dth2: torch.Tensor, a: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gymnasium's ``_dsdt`` ("book" equations), operation for operation: ``(dth1, dth2, ddth1, ddth2)``."""
        cos2, sin2 = th2.cos(), th2.sin()
        # d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos th2) + I1 + I2
        d1 = cos2.mul(self._d1_c).add_(self._d1_b).mul_(self._m2).add_(self._d1_a).add_(self._i1).add_(self._i2)
        # d2 = m2 (lc2^2 + l1 lc2 cos th2) + I2
        d2 = cos2.mul(self._d2_b).add_(self._d2_a).mul_(self._m2).add_(self._i2)
        # phi2 = m2 lc2 g cos(th1 + th2 - pi/2)
        phi2 = th1.add(th2).sub_(math.pi / 2.0).cos_().mul_(self._phi2_c)
        # phi1 = -m2 l1 lc2 dth2^2 sin th2 - 2 m2 l1 lc2 dth2 dth1 sin th2 + (m1 lc1 + m2 l1) g cos(th1 - pi/2) + phi2
        phi1 = dth2.mul(dth2).mul_(self._phi1_a).mul_(sin2)
        phi1.sub_(dth2.mul(self._phi1_b).mul_(dth1).mul_(sin2))
        phi1.add_(th1.sub(math.pi / 2).cos_().mul_(self._phi1_c)).add_(phi2)
        # ddth2 = (a + d2/d1 phi1 - m2 l1 lc2 dth1^2 sin th2 - phi2) / (m2 lc2^2 + I2 - d2^2/d1)
        num = d2.div(d1).mul_(phi1).add_(a)  # a + x == x + a exactly
        num.sub_(dth1.mul(dth1).mul_(self._dd2_a).mul_(sin2)).sub_(phi2)
        den = d2.mul(d2).div_(d1).neg_().add_(self._dd2_den)  # c - x == (-x) + c exactly
        ddth2 = num.div_(den)
        # ddth1 = -(d2 ddth2 + phi1) / d1
        ddth1 = d2.mul(ddth2).add_(phi1).neg_().div_(d1)
        return dth1, dth2, ddth1, ddth2

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every acrobot one RK4 step of ``dt = 0.2`` s (see the class docstring for what matches Gymnasium)."""
        a = _discrete_offset(self._action(action, None), self.dtype)  # torque -1, 0, +1
        y0 = tuple(self._state)
        dt = self.dt  # Gymnasium integrates over t = [0, dt] with one RK4 step
        dt2 = dt / 2.0
        k1 = self._dsdt(*y0, a)
        k2 = self._dsdt(*(y + dt2 * k for y, k in zip(y0, k1, strict=True)), a)
        k3 = self._dsdt(*(y + dt2 * k for y, k in zip(y0, k2, strict=True)), a)
        k4 = self._dsdt(*(y + dt * k for y, k in zip(y0, k3, strict=True)), a)
        # y0 + dt/6 (k1 + 2 k2 + 2 k3 + k4), row by row, written into the state in place. k1[0] and k1[1] are the
        # velocity rows themselves: the angle rows (0, 1) are updated before the velocity rows (2, 3) change.
        for y, c1, c2, c3, c4 in zip(y0, k1, k2, k3, k4, strict=True):
            inc = c2.mul(2).add_(c1).add_(c3.mul(2)).add_(c4)
            y.add_(inc.mul_(dt / 6.0))
        th, vel = self._state[:2], self._state[2:]
        _wrap_(th, -math.pi, math.pi)
        vel[0].clamp_(-self.max_vel_1, self.max_vel_1)
        vel[1].clamp_(-self.max_vel_2, self.max_vel_2)

        th1, th2 = th
        terminated = th1.cos().neg_().sub_(th2.add(th1).cos_()) > 1.0
        reward = terminated.to(torch.float32).sub_(1.0)  # -1, or 0 on the terminating step
        obs, terminated, truncated, info = self._finish_step(terminated)
        return obs, reward, terminated, truncated, info


def _wrap_(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Gymnasium's ``wrap`` in place: subtract (add) ``high - low`` until ``low <= x <= high``.

    One subtraction (addition) covers every value Acrobot produces and is then bit-identical to Gymnasium's loop; a
    value further out is moved by the needed whole number of periods in one go.
    """
    diff = high - low
    over = x.sub(high).div_(diff).ceil_().clamp_min_(0.0)
    x.sub_(over.mul_(diff))
    under = x.neg().add_(low).div_(diff).ceil_().clamp_min_(0.0)
    return x.add_(under.mul_(diff))


class _MountainCarBase(_TorchClassicEnv):
    """State ``[position, velocity]``; initial position ``U(-0.6, -0.4)``, velocity ``0`` (Gymnasium's reset)."""

    state_dim = 2
    _init_high = (0.0, 0.0)  # unused: _sample_initial is overridden

    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_velocity = 0.0
    goal_position: float

    def _sample_initial(self) -> torch.Tensor:
        out = torch.zeros(2, self.num_envs, device=self.device, dtype=self.dtype)
        out[0].uniform_(-0.6, -0.4, generator=self.generator)
        return out

    def _observe(self) -> torch.Tensor:
        obs = torch.empty(self.num_envs, 2, dtype=self.dtype, device=self.device)
        obs.T.copy_(self._state)
        return obs

    def _move(self, acc: torch.Tensor) -> torch.Tensor:
        """``velocity += acc``, then Gymnasium's clipping and wall; returns ``terminated`` (state updated in place)."""
        position, velocity = self._state
        velocity.add_(acc).clamp_(-self.max_speed, self.max_speed)
        position.add_(velocity).clamp_(self.min_position, self.max_position)
        velocity.masked_fill_((position == self.min_position) & (velocity < 0), 0.0)
        return (position >= self.goal_position) & (velocity >= self.goal_velocity)


class MountainCarEnv(_MountainCarBase):
    """Batched torch ``MountainCar-v0`` (Gymnasium 1.4 dynamics, truncated at 200 steps).

    Action: ``(num_envs,)`` integers ``0, 1, 2`` = push left, no push, push right (force ``(action - 1) * 0.001``).
    Observation and state: ``(num_envs, 2)`` = ``[position, velocity]``. Reward ``-1`` per step, the terminating one
    included; terminated when, after the step, ``position >= 0.5`` and ``velocity >= 0``.
    """

    goal_position = 0.5
    force = 0.001
    gravity = 0.0025

    obs_shape = (2,)
    is_discrete = True
    action_dim = 3
    max_steps = 200

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every car one step (see the class docstring for what matches Gymnasium)."""
        push = _discrete_offset(self._action(action, None), self.dtype).mul_(self.force)
        # velocity += (action - 1) * force + cos(3 * position) * (-gravity)
        acc = self._state[0].mul(3).cos_().mul_(-self.gravity).add_(push)
        terminated = self._move(acc)
        reward = torch.full((self.num_envs,), -1.0, dtype=torch.float32, device=self.device)
        obs, terminated, truncated, info = self._finish_step(terminated)
        return obs, reward, terminated, truncated, info


class MountainCarContinuousEnv(_MountainCarBase):
    """Batched torch ``MountainCarContinuous-v0`` (Gymnasium 1.4 dynamics, truncated at 999 steps).

    Action: ``(num_envs, 1)`` (or ``(num_envs,)``) floats, clipped to ``[-1, 1]``: the force itself (power
    ``0.0015``). Observation and state: ``(num_envs, 2)`` = ``[position, velocity]``. Reward ``-0.1 * force**2`` per
    step, plus ``100`` on the step that terminates, which is when, after the step, ``position >= 0.45`` and
    ``velocity >= 0``. The penalty uses the clipped action (Gymnasium squares the raw one; jaderl's Gymnasium adapter
    clips before stepping, so both agree for every action).

    Gymnasium's precision is reproduced as well, which matters with a float64 ``dtype`` only: its state is a float64
    array after ``reset`` but a float32 array after every ``step``. So the state is rounded to float32 at the end of
    every step (after termination was decided on the unrounded values), and ``3 * position`` is rounded to float32
    (Gymnasium's float32 product) where the position is a float32 value, i.e. on every step but the first of an
    episode (Gymnasium's fresh positions are float64 draws). Near the hilltop the dynamics amplify a one-ulp float32
    difference about 1e4-fold within 150 steps, so without this float64 trajectories drift 1e-6 away from
    Gymnasium's.
    """

    goal_position = 0.45
    power = 0.0015

    obs_shape = (2,)
    is_discrete = False
    action_dim = 1
    max_steps = 999

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every car one step (see the class docstring for what matches Gymnasium)."""
        force = self._action(action, self.dtype).clamp(-1.0, 1.0)
        # velocity += force * power - 0.0025 * cos(3 * position)
        # (no `alpha=`/`addcmul`: they may be fused into one FMA rounding, Gymnasium rounds every product). Once the
        # state is float32, Gymnasium's `3 * position` is a float32 product: 3 * p is exact in float64 for a float32
        # p, so rounding it to float32 reproduces that product.
        position = self._state[0]
        angle = position.mul(3)
        exact = self.dtype != torch.float32
        if exact:
            is_f32 = position.to(torch.float32).to(self.dtype) == position
            angle = torch.where(is_f32, angle.to(torch.float32).to(self.dtype), angle)
        acc = angle.cos_().mul_(-0.0025).add_(force * self.power)
        terminated = self._move(acc)
        if exact:
            self._state.copy_(self._state.to(torch.float32))
        reward = terminated.to(self.dtype).mul_(100.0).sub_(force.mul(force).mul_(0.1)).to(torch.float32)
        obs, terminated, truncated, info = self._finish_step(terminated)
        return obs, reward, terminated, truncated, info


MORE_TORCH_ENVS: dict[str, type[VecEnv]] = {
    "jaderl/Acrobot-v1": AcrobotEnv,
    "jaderl/MountainCar-v0": MountainCarEnv,
    "jaderl/MountainCarContinuous-v0": MountainCarContinuousEnv,
}
"""The classic-control envs added after Pendulum and CartPole; :mod:`jaderl.envs` merges them into its
``TORCH_ENVS`` (this module's ``TORCH_ENVS`` keeps only the first two)."""
