"""``agent.predict``: a trained agent acts on what a plain Gymnasium env gives and returns what it takes."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import jaderl
from jaderl.core.evaluator import run_episodes
from jaderl.envs import make_env

SETTINGS = {"device": "cpu", "total_steps": 256, "eval_every": 256, "eval_episodes": 1, "hidden": [16]}


def _episode_return(agent: jaderl.core.agent.Agent, env_id: str, seed: int) -> float:
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        action = agent.predict(obs)  # one numpy observation in, one action of the env's space out
        assert env.action_space.contains(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        total, done = total + float(reward), terminated or truncated
    env.close()
    return total


@pytest.mark.parametrize(("algo", "env_id", "extra"), [
    ("ppo", "CartPole-v1", {"num_envs": 4, "horizon": 32, "minibatch_size": 64}),
    ("sac", "Pendulum-v1", {"warmup_steps": 64, "batch_size": 32}),
])
def test_predict_in_a_plain_gymnasium_env_earns_what_jaderl_measures(algo: str, env_id: str, extra: dict,
                                                                       tmp_path: Path) -> None:
    jaderl.train(algo, env_id, run_dir=str(tmp_path / "run"), **SETTINGS, **extra)
    agent = jaderl.load(tmp_path / "run")
    env = make_env(env_id, 1, "cpu")
    try:
        expected, _ = run_episodes(agent, env, seed=7)  # the training env's adapter, the same start
    finally:
        env.close()
    assert _episode_return(agent, env_id, seed=7) == pytest.approx(expected.item(), rel=1e-4, abs=1e-3)


def test_predict_takes_single_and_batched_numpy_or_torch_observations(tmp_path: Path) -> None:
    jaderl.train("sac", "Pendulum-v1", run_dir=str(tmp_path / "run"), warmup_steps=64, batch_size=32, **SETTINGS)
    agent = jaderl.load(tmp_path / "run")
    batch = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32)
    actions = agent.predict(batch)
    assert actions.shape == (5, 1) and actions.dtype == np.float32
    assert np.all(np.abs(actions) <= 2.0)  # Pendulum's torque bounds, not [-1, 1]
    np.testing.assert_array_equal(agent.predict(batch[2]), actions[2])
    np.testing.assert_array_equal(agent.predict(torch.from_numpy(batch)), actions)
    raw = agent.act(torch.from_numpy(batch), deterministic=True).numpy()
    np.testing.assert_allclose(actions, 2.0 * raw, rtol=1e-6)  # rescaled from [-1, 1] to [-2, 2]
    # a view with negative strides (np.flip, frame[..., ::-1]) is taken as it reads
    np.testing.assert_array_equal(agent.predict(batch[::-1]), actions[::-1])
    np.testing.assert_array_equal(agent.predict(batch[2, ::-1]), agent.predict(batch[2, ::-1].copy()))


def test_predict_for_several_agents_takes_and_returns_per_agent_arrays() -> None:
    from jaderl.api import ALGOS, make_config

    multi = [name for name, spec in ALGOS.items() if spec.agent_cls.accepts(make_env("jaderl/simple_spread", 1).spec)
             is None]
    assert multi, "no multi-agent algorithm is registered"
    env = make_env("jaderl/simple_spread", 2)
    agent = ALGOS[multi[0]].agent_cls(make_config(multi[0], "jaderl/simple_spread", device="cpu"), env.spec,
                                       torch.device("cpu"))
    obs = env.reset(seed=0).numpy()  # (2, 3, 18)
    assert agent.predict(obs).shape == (2, 3) and agent.predict(obs[0]).shape == (3,)
    with pytest.raises(ValueError, match=r"^this agent acts for 3 agents: predict takes observations of shape \(3, 18\)"
                                         r" \(one\) or \(N, 3, 18\) \(a batch\); got shape \(4, 18\)$"):
        agent.predict(np.zeros((4, 18)))


@pytest.mark.parametrize(("obs", "said"), [
    (np.zeros(5), r"predict takes observations of shape \(3,\) \(one\) or \(N, 3\) \(a batch\); got shape \(5,\)"),
    (torch.zeros(2, 7), r"of shape \(3,\) \(one\) or \(N, 3\) \(a batch\); got shape \(2, 7\)"),
    (1.0, r"got shape \(\)"),
    ("hello", r"predict takes numeric observations \(a numpy array or torch tensor\); got str"),
    (None, r"got NoneType"),
    (np.zeros(3, dtype=np.complex64), r"got ndarray of dtype complex64"),
    (np.array([0.0, np.nan, 1.0]), r"predict got NaN or infinite observations; check what the env returned"),
    ([[0.0, 1.0, 2.0], [1.0]], r"predict takes observations as a numpy array or torch tensor; could not read one"),
    (np.array([1e300, 0.0, 0.0]), r"^predict got observations beyond float32's range \(\+-3.403e\+38\), which the "
                                  r"agent computes in; check what the env returned$"),  # inf in float32: NaN actions
    (torch.tensor([[0.0, -1e39, 0.0]], dtype=torch.float64), r"beyond float32's range"),
])
def test_predict_refuses_what_the_agent_cannot_act_on_in_one_sentence(obs: object, said: str) -> None:
    from jaderl.api import ALGOS, make_config

    env = make_env("jaderl/Pendulum-v1", 1)
    agent = ALGOS["sac"].agent_cls(make_config("sac", "jaderl/Pendulum-v1", device="cpu"), env.spec,
                                   torch.device("cpu"))
    with pytest.raises(ValueError, match=said) as info:
        agent.predict(obs)
    assert "\n" not in str(info.value)
    assert agent.predict(torch.zeros(3, dtype=torch.bfloat16)).shape == (1,)  # what numpy cannot hold still goes


@pytest.mark.parametrize("deterministic", ["no", 0, None])
def test_predict_takes_deterministic_as_true_or_false_only(deterministic: object) -> None:
    """A string such as "no" would count as true: predict says so instead of acting deterministically."""
    from jaderl.api import ALGOS, make_config

    env = make_env("jaderl/Pendulum-v1", 1)
    agent = ALGOS["sac"].agent_cls(make_config("sac", "jaderl/Pendulum-v1", device="cpu"), env.spec,
                                   torch.device("cpu"))
    with pytest.raises(TypeError, match=rf"^deterministic must be True or False, not {deterministic!r}$"):
        agent.predict(np.zeros(3), deterministic=deterministic)  # type: ignore[arg-type]
    assert agent.predict(np.zeros(3), deterministic=np.bool_(False)).shape == (1,)


ACTION_DIM = 2


def _saturated(obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
    """A policy whose actions are the ends of [-1, 1]: the sign of the observations' first values (as many as the
    action has)."""
    return (obs[..., :ACTION_DIM] * 1e3).clamp(-1.0, 1.0)


def test_predict_keeps_rescaled_actions_inside_the_bounds() -> None:
    """An action at an end of [-1, 1] becomes the bound itself, never a float32 rounding beyond it (which a Box's
    ``contains`` refuses, and VMAS with it)."""
    from jaderl.api import ALGOS, make_config

    space = gym.spaces.Box(np.array([-1.5, 0.1], np.float32), np.array([0.2, 0.7], np.float32))
    spec = make_env("jaderl/MountainCarContinuous-v0", 1).spec.replace(
        obs_shape=(3,), action_dim=2, action_low=tuple(map(float, space.low)),
        action_high=tuple(map(float, space.high)))
    agent = ALGOS["sac"].agent_cls(make_config("sac", "jaderl/Pendulum-v1", device="cpu"), spec, torch.device("cpu"))
    agent.act = _saturated  # type: ignore[method-assign]
    actions = agent.predict(np.array([[5.0, 5.0, 0.0], [-5.0, -5.0, 0.0]]))
    np.testing.assert_array_equal(actions, np.stack([space.high, space.low]))
    assert all(space.contains(a) for a in actions)


def test_predict_rescales_every_agent_to_its_own_bounds() -> None:
    """Agents with bounds of their own (the spec holds every agent's, one after the other) get actions in theirs."""
    from jaderl.api import ALGOS, make_config

    low, high = np.array([[0.0, 0.0], [-4.0, -4.0], [-1.5, 0.1]]), np.array([[1.0, 1.0], [4.0, 4.0], [0.2, 0.7]])
    env = make_env("jaderl/simple_spread?continuous=true", 1)
    spec = env.spec.replace(action_low=tuple(low.ravel()), action_high=tuple(high.ravel()))
    agent = ALGOS["mappo"].agent_cls(make_config("mappo", "jaderl/simple_spread?continuous=true", device="cpu"), spec,
                                     torch.device("cpu"))
    agent.act = _saturated  # type: ignore[method-assign]
    obs = np.zeros((2, 3, 18), np.float32)
    obs[0, :, :2], obs[1, :, :2] = 5.0, -5.0
    actions = agent.predict(obs)
    assert actions.shape == (2, 3, 2)
    np.testing.assert_array_equal(actions[0], high.astype(np.float32))
    np.testing.assert_array_equal(actions[1], low.astype(np.float32))
    np.testing.assert_allclose(agent.predict(np.zeros((3, 18))), (low + high) / 2, rtol=0, atol=1e-6)  # one


class _BoxActions(gym.Env):
    """Three zero observations, and actions of the Box given."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def __init__(self, action_space: gym.spaces.Box) -> None:
        self.action_space = action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(3, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize(("space", "expected"), [
    (gym.spaces.Box(0, 10, (2,), np.int64), [[10, 10], [0, 0], [7, 2]]),  # rounded: 7.0 and 2.0, never 6 or 1
    (gym.spaces.Box(np.array([-0.1, 0.3]), np.array([0.7, 0.9]), dtype=np.float64),
     [[0.7, 0.9], [-0.1, 0.3], [0.46, 0.42]]),  # float32's -0.1 would fall below the float64 bound
])
def test_predict_returns_actions_in_the_box_dtype_that_its_contains_accepts(space: gym.spaces.Box,
                                                                           expected: list) -> None:
    from jaderl.api import ALGOS, make_config
    from jaderl.envs.vec import GymnasiumVecEnv
    from jaderl.population.ensemble import Ensemble

    env = GymnasiumVecEnv(_BoxActions(space))
    assert env.spec.action_dtype == str(space.dtype)
    agent = ALGOS["sac"].agent_cls(make_config("sac", "jaderl/Pendulum-v1", device="cpu"), env.spec,
                                   torch.device("cpu"))
    agent.act = _saturated  # type: ignore[method-assign]
    obs = np.array([[5.0, 5.0, 0.0], [-5.0, -5.0, 0.0], [4e-4, -6e-4, 0.0]])  # [-1, 1]: (1, 1), (-1, -1), (0.4, -0.6)
    actions = agent.predict(obs)
    assert actions.dtype == space.dtype and all(space.contains(a) for a in actions)
    np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-6)  # the observations are float32
    assert space.contains(agent.predict(obs[2]))
    ensemble = Ensemble([agent, agent])
    ensemble.act = lambda x, deterministic=True: _saturated(x)  # type: ignore[method-assign]
    np.testing.assert_array_equal(ensemble.predict(obs), actions)  # combined, then rescaled once
    env.close()
