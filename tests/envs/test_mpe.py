"""Tests of jaderl.envs.mpe: step-for-step equivalence with MPE2 (float64), the batched multi-agent contract,
auto-reset, truncation, bad actions, state copies and the random-policy team return."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
import torch

from jaderl.envs import make_env
from jaderl.envs.mpe import MPE_ENVS, SimpleSpreadEnv, SimpleTagEnv
from jaderl.envs.vec import EnvError, VecEnv

TOL = 1e-6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CLASSES = {"simple_spread": SimpleSpreadEnv, "simple_tag": SimpleTagEnv}
MPE_ENV = type[SimpleSpreadEnv] | type[SimpleTagEnv]


# -- MPE2 helpers --------------------------------------------------------------------------------------------------


def _make_mpe2(name: str, n: int, continuous: bool) -> list[Any]:
    module = importlib.import_module(f"mpe2.{name}_v3")
    return [module.parallel_env(continuous_actions=continuous) for _ in range(n)]


def _world(env: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An MPE2 env's agent positions and velocities (A, 2) and landmark positions (L, 2)."""
    world = env.unwrapped.world
    return (np.stack([a.state.p_pos for a in world.agents]), np.stack([a.state.p_vel for a in world.agents]),
            np.stack([lm.state.p_pos for lm in world.landmarks]))


def _overlap(env: Any, name: str) -> None:
    """Put entities of an MPE2 world into contact, so the contact forces and collision rewards are exercised."""
    world = env.unwrapped.world
    agents, landmarks = world.agents, world.landmarks
    agents[1].state.p_pos = agents[0].state.p_pos + np.array([0.1, 0.05])  # spread: 0.3 apart touch; tag: 0.15
    if name == "simple_tag":
        agents[-1].state.p_pos = agents[0].state.p_pos + np.array([-0.04, 0.06])  # an adversary on the prey
        agents[2].state.p_pos = landmarks[0].state.p_pos + np.array([0.2, -0.05])  # an adversary on an obstacle


def _sync(torch_env: SimpleSpreadEnv | SimpleTagEnv, mpe_envs: list[Any], rows: np.ndarray) -> torch.Tensor:
    """Copy the worlds of the MPE2 envs ``rows`` into those rows of the torch env; returns its observations."""
    pos, vel, landmarks = torch_env.agent_pos, torch_env.agent_vel, torch_env.landmark_pos
    for i in rows:
        p, v, lm = _world(mpe_envs[i])
        pos[i], vel[i], landmarks[i] = torch.from_numpy(p), torch.from_numpy(v), torch.from_numpy(lm)
    return torch_env.set_world_state(pos, vel, landmarks)


def _draw_actions(rng: np.random.Generator, n: int, a: int, continuous: bool, t: int) -> tuple[np.ndarray, Any]:
    """Random actions for both sides: (MPE2's per sub-env and agent, jaderl's tensor).

    Continuous: on even steps MPE2's 5-vectors in [0, 1] drawn first (jaderl gets ``(a[2] - a[1], a[4] - a[3])``),
    on odd steps jaderl's 2-vectors in [-1, 1] (MPE2 gets ``[0, max(-fx, 0), max(fx, 0), max(-fy, 0), max(fy, 0)]``):
    the two directions of the mapping in the module docstring. Both in float32, MPE2's action dtype: the differences
    are then MPE2's float32 differences exactly.
    """
    if not continuous:
        actions = rng.integers(0, 5, size=(n, a))
        return actions, torch.from_numpy(actions)
    if t % 2 == 0:
        mpe = rng.uniform(0.0, 1.0, size=(n, a, 5)).astype(np.float32)
        force = np.stack((mpe[..., 2] - mpe[..., 1], mpe[..., 4] - mpe[..., 3]), axis=-1)
    else:
        force = rng.uniform(-1.0, 1.0, size=(n, a, 2)).astype(np.float32)
        zero = np.zeros_like(force[..., 0])
        fx, fy = force[..., 0], force[..., 1]
        mpe = np.stack((zero, np.maximum(-fx, 0), np.maximum(fx, 0), np.maximum(-fy, 0), np.maximum(fy, 0)), axis=-1)
    return mpe, torch.from_numpy(force.astype(np.float64))


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("name", ["simple_spread", "simple_tag"])
def test_matches_mpe2_step_for_step(name: str, continuous: bool) -> None:
    """Same worlds, same actions: every observation, reward, global state and flag agrees with MPE2's over two
    episodes per sub-env (staggered, so sub-envs truncate and restart on different steps)."""
    pytest.importorskip("mpe2")
    n, steps = 4, 40
    offsets = np.array([0, 7, 13, 24])  # MPE2's step counters at the start: truncations at steps 25, 18, 12 and 1
    mpe_envs = _make_mpe2(name, n, continuous)
    for i, env in enumerate(mpe_envs):
        env.reset(seed=i)
        env.unwrapped.steps = int(offsets[i])
    _overlap(mpe_envs[0], name)
    torch_env = CLASSES[name](n, dtype=torch.float64, seed=0, continuous=continuous)
    worlds = [_world(env) for env in mpe_envs]
    pos, vel, landmarks = (torch.from_numpy(np.stack([w[j] for w in worlds])) for j in range(3))
    torch_env.set_world_state(pos, vel, landmarks, elapsed_steps=torch.from_numpy(offsets))
    agents = mpe_envs[0].possible_agents
    a, d = len(agents), torch_env.obs_shape[0]
    rng = np.random.default_rng(0)
    truncations = contacts = 0
    for t in range(steps):
        mpe_actions, action = _draw_actions(rng, n, a, continuous, t)
        obs, reward, terminated, truncated, info = torch_env.step(action)
        final_obs, final_state = info["final_obs"], info["final_state"]
        assert final_obs.dtype == torch.float64 and final_state.shape == (n, *torch_env.state_shape)
        for i, env in enumerate(mpe_envs):
            g_obs, g_reward, g_term, g_trunc, _ = env.step(dict(zip(agents, mpe_actions[i], strict=True)))
            scenario, world = env.unwrapped.scenario, env.unwrapped.world
            for k, agent in enumerate(agents):
                exact = scenario.observation(world.agents[k], world)  # float64, before MPE2's cast to float32
                size = len(exact)
                mine = final_obs[i, k].numpy()
                assert np.abs(mine[:size] - exact).max() <= TOL, f"step {t}, env {i}: {agent}'s observation"
                assert np.abs(mine[:size] - g_obs[agent]).max() <= TOL, f"step {t}, env {i}: {agent}'s float32 obs"
                if name == "simple_tag":  # zero padding, then the type one-hot
                    assert (mine[size:d - 2] == 0).all() and list(mine[d - 2:]) == ([1, 0] if k < 3 else [0, 1])
                # rewards are float32: MPE2's, within 1e-6 and their rounding to float32
                g = g_reward[agent]
                assert abs(reward[i, k].item() - g) <= TOL + np.spacing(np.float32(abs(g))), f"step {t}: reward"
                assert not g_term[agent] and g_trunc[agent] == bool(truncated[i]), f"step {t}: flags"
            contacts += sum(scenario.is_collision(x, y) for x in world.agents for y in world.agents if x is not y)
            assert np.abs(final_state[i].numpy() - env.state()).max() <= TOL, f"step {t}, env {i}: global state"
        assert not terminated.any()
        done = truncated.numpy()
        assert torch.equal(obs[~truncated], final_obs[~truncated]), "obs must equal final_obs where nothing finished"
        if done.any():  # the torch env reset those rows already; give them MPE2's fresh worlds
            truncations += int(done.sum())
            for i in np.flatnonzero(done):
                mpe_envs[i].reset(seed=100 + 10 * t + int(i))
            obs = _sync(torch_env, mpe_envs, np.flatnonzero(done))
            for i in np.flatnonzero(done):
                for k, agent in enumerate(agents):
                    expected = mpe_envs[i].unwrapped.observe(agent)
                    assert np.abs(obs[i, k, :len(expected)].numpy() - expected).max() <= TOL
        counters = np.array([env.unwrapped.steps for env in mpe_envs])
        np.testing.assert_array_equal(torch_env.elapsed_steps.numpy(), counters, err_msg=f"step {t}: counters")
    assert truncations == 6  # rows 0 to 3 truncate at steps 25; 18; 12 and 37; 1 and 26
    assert contacts > 0, "no collision happened: the contact forces were not compared"


def test_random_policy_team_return_is_mpe2s() -> None:
    """The team return (sum over the 3 agents and 25 steps of every agent's reward) of a uniformly random policy on
    simple_spread: MPE2 scores -79.9 +- 0.5 per episode (2,400 episodes of ``simple_spread_v3.parallel_env()``,
    measured once, see the module docstring of jaderl.envs.mpe); 4,096 episodes here have a standard error of 0.37."""
    n = 4096
    env = SimpleSpreadEnv(n, seed=0)
    env.reset()
    gen = torch.Generator().manual_seed(0)
    team_return = torch.zeros(n, dtype=torch.float64)
    for t in range(25):
        _, reward, _, truncated, _ = env.step(torch.randint(0, 5, (n, 3), generator=gen))
        team_return += reward.double().sum(1)
        assert truncated.all() == (t == 24)
    assert -79.9 - 2.0 < team_return.mean().item() < -79.9 + 2.0


# -- the contract ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_shapes_dtypes_devices(cls: MPE_ENV, continuous: bool, dtype: torch.dtype, device: str) -> None:
    n = 1024
    env = cls(n, device=device, dtype=dtype, seed=0, continuous=continuous)
    assert isinstance(env, VecEnv) and env.num_envs == n and env.device == torch.device(device)
    a = env.num_agents
    if cls is SimpleSpreadEnv:
        assert a == 3 and env.obs_shape == (18,) and env.state_shape == (54,) and env.teams == ()
    else:
        assert a == 4 and env.obs_shape == (18,) and env.state_shape == (62,)
        assert env.teams == ("adversary", "adversary", "adversary", "agent")
    spec = env.spec
    assert spec.num_agents == a and spec.is_multi_agent and spec.state_shape == env.state_shape
    assert spec.is_discrete != continuous and spec.action_dim == (2 if continuous else 5) and spec.max_steps == 25
    assert spec.teams == env.teams and spec.action_low is None and spec.obs_dtype == "float32"
    obs = env.reset()
    assert obs.shape == (n, a, *env.obs_shape) and obs.dtype == dtype and obs.device.type == env.device.type
    for _ in range(3):
        if continuous:
            action = torch.rand(n, a, 2, device=device) * 2 - 1
        else:
            action = torch.randint(0, 5, (n, a), device=device)
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.shape == (n, a, *env.obs_shape) and obs.dtype == dtype and obs.is_contiguous()
        assert reward.shape == (n, a) and reward.dtype == torch.float32 and reward.is_contiguous()
        assert terminated.shape == truncated.shape == (n,) and terminated.dtype == truncated.dtype == torch.bool
        assert info["final_obs"].shape == obs.shape and info["final_state"].shape == (n, *env.state_shape)
        state = env.global_state()
        assert state.shape == (n, *env.state_shape) and state.dtype == dtype
        for x in (obs, reward, terminated, truncated, info["final_obs"], info["final_state"], state):
            assert x.device.type == env.device.type and bool(torch.isfinite(x.float()).all())
    assert (env.elapsed_steps == 3).all()


def test_global_state_is_mpe2s_state_layout() -> None:
    """simple_spread: the observations end to end; simple_tag: the same without padding and one-hots."""
    spread = SimpleSpreadEnv(8, seed=1)
    obs = spread.reset()
    assert torch.equal(spread.global_state(), obs.reshape(8, -1))
    tag = SimpleTagEnv(8, seed=1)
    obs = tag.reset()
    pieces = [obs[:, k, :16] for k in range(3)] + [obs[:, 3, :14]]  # adversaries see 16 numbers, the prey 14
    assert torch.equal(tag.global_state(), torch.cat(pieces, dim=1))
    assert (obs[:, 3, 14:16] == 0).all() and (obs[:, :3, 16] == 1).all() and (obs[:, 3, 17] == 1).all()


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_truncates_at_max_steps_and_auto_resets(cls: MPE_ENV, sync_free: bool) -> None:
    n, max_steps = 64, 10
    env = cls(n, dtype=torch.float64, seed=3, max_steps=max_steps)
    env.sync_free = sync_free
    env.reset()
    late = torch.arange(n) % 2 == 1
    env.set_world_state(env.agent_pos, env.agent_vel, env.landmark_pos, elapsed_steps=torch.where(late, 6, 0))
    gen = torch.Generator().manual_seed(0)
    for t in range(1, max_steps + 1):
        before = env.landmark_pos
        obs, _, terminated, truncated, info = env.step(torch.randint(0, 5, (n, env.num_agents), generator=gen))
        expected = late if t == 4 else (~late if t == max_steps else torch.zeros(n, dtype=torch.bool))
        assert torch.equal(truncated, expected) and not terminated.any(), f"step {t}"
        final_obs, final_state = info["final_obs"], info["final_state"]
        assert torch.equal(final_obs[~expected], obs[~expected])
        assert torch.equal(final_state, env._state_of(final_obs))  # the state the finished sub-envs reached
        assert torch.equal(env.global_state(), env._state_of(obs))
        assert torch.equal(env.elapsed_steps, torch.where(late, (6 + t) % max_steps, t % max_steps))
        if expected.any():  # fresh worlds: new landmarks, agents at rest in [-1, 1]^2
            assert (env.agent_vel[expected] == 0).all() and (env.agent_pos[expected].abs() <= 1).all()
            assert (before[expected] != env.landmark_pos[expected]).all()
            assert torch.equal(before[~expected], env.landmark_pos[~expected])
            assert (final_obs[expected] != obs[expected]).any(dim=(1, 2)).all()
    assert torch.equal(env.elapsed_steps, torch.where(late, 6, 0))


@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_sync_free_steps_agree_until_the_first_reset(cls: MPE_ENV) -> None:
    """The GPU's way of stepping (masked resets every step, no checks) gives the same episodes as the CPU's until
    the generators part (the first auto-reset); unchecked out-of-range discrete actions are clamped."""
    envs = [cls(16, dtype=torch.float64, seed=2) for _ in range(2)]
    envs[1].sync_free = True
    gen = torch.Generator().manual_seed(0)
    for t in range(1, 26):
        action = torch.randint(0, 5, (16, envs[0].num_agents), generator=gen)
        (obs, reward, _, truncated, info), (obs1, reward1, _, truncated1, info1) = (env.step(action) for env in envs)
        assert torch.equal(info["final_obs"], info1["final_obs"]) and torch.equal(reward, reward1), f"step {t}"
        assert torch.equal(truncated, truncated1) and truncated.all() == (t == 25)
        if t < 25:
            assert torch.equal(obs, obs1)
    twin = cls(16, dtype=torch.float64)
    twin.load_state_dict(envs[1].state_dict())
    out_of_range, up = (torch.full((16, twin.num_agents), k) for k in (7, 4))
    assert torch.equal(envs[1].step(out_of_range)[0], twin.step(up)[0])  # clamped to 4


def test_initial_state_distribution() -> None:
    """MPE2's reset_world: agents U(-1, 1)^2 at rest; landmarks U(-1, 1)^2 (spread), obstacles U(-0.9, 0.9)^2."""
    for cls, high in ((SimpleSpreadEnv, 1.0), (SimpleTagEnv, 0.9)):
        env = cls(20_000, dtype=torch.float64, seed=5)
        pos, landmarks = env.agent_pos, env.landmark_pos
        assert (env.agent_vel == 0).all()
        for x, bound in ((pos, 1.0), (landmarks, high)):
            assert x.abs().max() <= bound and x.abs().max() > 0.999 * bound
            assert x.mean().abs() < 0.01 and abs(x.var().item() - bound**2 / 3) < 0.01


def test_actions_push_as_in_mpe2() -> None:
    """From rest, far from everything, one step moves each agent by its push: discrete 0 no-op, 1 left, 2 right,
    3 down, 4 up, times the sensitivity (spread 5; tag adversaries 3, good agents 4) times dt = 0.1; continuous
    actions are the push itself, clipped to [-1, 1]."""
    spread = SimpleSpreadEnv(5, dtype=torch.float64, seed=0)
    far = torch.tensor([[-3.0, -3.0], [0.0, 3.0], [3.0, -3.0]], dtype=torch.float64).expand(5, 3, 2)
    zero = torch.zeros(5, 3, 2, dtype=torch.float64)
    spread.set_world_state(far, zero, spread.landmark_pos)
    spread.step(torch.arange(5).view(5, 1).expand(5, 3))
    directions = torch.tensor([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], dtype=torch.float64)
    assert torch.allclose(spread.agent_vel, (directions * 0.5).view(5, 1, 2).expand(5, 3, 2), atol=1e-15, rtol=0)
    assert torch.allclose(spread.agent_pos, far, atol=1e-15, rtol=0)  # positions move with the old velocities

    tag = SimpleTagEnv(1, dtype=torch.float64, seed=0, continuous=True)
    far = torch.tensor([[[-5.0, -5.0], [-5.0, 5.0], [5.0, -5.0], [5.0, 5.0]]], dtype=torch.float64)
    tag.set_world_state(far, torch.zeros(1, 4, 2, dtype=torch.float64), torch.zeros(1, 2, 2, dtype=torch.float64))
    tag.step(torch.tensor([[[1.0, -0.5], [2.0, 0.0], [-0.25, -3.0], [0.5, 0.5]]], dtype=torch.float64))
    expected = torch.tensor([[[0.3, -0.15], [0.3, 0.0], [-0.075, -0.3], [0.2, 0.2]]], dtype=torch.float64)
    assert torch.allclose(tag.agent_vel, expected, atol=1e-15, rtol=0)


def test_bad_actions_raise_one_sentence() -> None:
    env = SimpleSpreadEnv(4, seed=0)
    cont = SimpleTagEnv(4, seed=0, continuous=True)
    bad: list[tuple[VecEnv, torch.Tensor, str]] = [
        (env, torch.full((4, 3), 5), "takes discrete actions 0 to 4"),
        (env, torch.full((4, 3), -1), "takes discrete actions 0 to 4"),
        (env, torch.zeros(4, 2, dtype=torch.int64), "expected actions of shape (4, 3)"),
        (env, torch.zeros(12, dtype=torch.int64), "expected actions of shape (4, 3)"),
        (env, torch.full((4, 3), float("nan")), "NaN"),
        (cont, torch.full((4, 4, 2), float("inf")), "NaN or infinite"),
        (cont, torch.zeros(4, 4, 5), "expected actions of shape (4, 4, 2)"),
    ]
    for target, action, words in bad:
        before = target.state_dict()
        with pytest.raises(EnvError) as err:
            target.step(action)
        message = str(err.value)
        assert words in message and "\n" not in message and message.count(". ") == 0, message
        after = target.state_dict()  # nothing moved
        assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_lists_and_numpy_actions_are_read_and_non_integral_discrete_ones_refused(cls: MPE_ENV,
                                                                                 continuous: bool) -> None:
    """A list, tuple or NumPy array of (N, agents) or (N, agents, 2) actions steps as the same tensor would; a float
    discrete action that is not a whole number (0.7) is refused in one sentence before anything moves (not
    truncated), one that is (1.0) is taken; what is not numbers is refused in one sentence naming what the env
    takes."""
    env = cls(2, seed=0, continuous=continuous)
    before = {k: v.clone() for k, v in env.state_dict().items()}
    a = env.num_agents
    values = [[[0.5, -0.25]] * a, [[-1.0, 0.75]] * a] if continuous else [list(range(a)), [4 - i for i in range(a)]]
    want = env.step(torch.tensor(values))
    actions: list[Any] = [values, tuple(values), np.array(values)]
    if not continuous:
        actions.append(torch.tensor(values, dtype=torch.float32))
    for action in actions:
        env.load_state_dict(before)
        got = env.step(action)
        assert all(torch.equal(x, y) for x, y in zip(got[:4], want[:4], strict=True)), action
    env.load_state_dict(before)
    bad: list[Any] = [] if continuous else [torch.full((2, a), 0.7), [[1.0] * a, [0.5] * a], np.full((2, a), 0.7)]
    for action in bad:
        with pytest.raises(EnvError, match=rf"^{cls.__name__} takes discrete actions as whole numbers, got 0\.[57]; "
                                           r"pass integer actions \(an int64 tensor"):
            env.step(action)
    for junk in (["left", "right"], [[0], [1, 0]], None, np.array(["a", "b"])):
        with pytest.raises(EnvError, match=rf"^{cls.__name__} cannot read actions from a \w+ \([^)]*\)+; pass a "
                                           r"torch\.Tensor, or a NumPy array or list of real numbers$"):
            env.step(junk)
    after = env.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing moved

@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_state_dict_copy_continues_identically(cls: MPE_ENV) -> None:
    n = 32
    source = cls(n, seed=1)
    gen = torch.Generator().manual_seed(0)
    actions = [torch.randint(0, 5, (n, source.num_agents), generator=gen) for _ in range(70)]
    for action in actions[:10]:
        source.step(action)
    state = source.state_dict()
    copy = cls(n, seed=2)
    copy.load_state_dict(state)
    source.step(actions[10])  # the saved dict is a copy: stepping the source leaves it alone
    assert not torch.equal(state["agent_pos"], source.agent_pos)
    copy.step(actions[10])
    for action in actions[11:]:  # across two auto-resets, which draw from the restored generators
        a, b = source.step(action), copy.step(action)
        for x, y in zip(a[:4], b[:4], strict=True):
            assert torch.equal(x, y)
        assert torch.equal(a[4]["final_obs"], b[4]["final_obs"]) and torch.equal(a[4]["final_state"],
                                                                                    b[4]["final_state"])
    assert torch.equal(source.global_state(), copy.global_state())
    with pytest.raises(EnvError, match="lacks rng_state"):
        copy.load_state_dict({k: v for k, v in state.items() if k != "rng_state"})


@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_one_sub_env_s_state_dict_and_world_are_copies(cls: MPE_ENV) -> None:
    env = cls(1, seed=1)  # one sub-env: a permuted view of its world is already contiguous
    state = env.state_dict()
    saved = {k: v.clone() for k, v in state.items()}
    views = (env.agent_pos, env.agent_vel, env.landmark_pos)
    env.step(torch.full((1, env.num_agents), 2))
    env.step(torch.full((1, env.num_agents), 4))
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    for view, now in zip(views, (env.agent_pos, env.agent_vel, env.landmark_pos), strict=True):
        view.add_(1.0)  # writing to a copy leaves the world alone
        assert not torch.equal(view, now)


@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_same_seed_same_rollout(cls: MPE_ENV) -> None:
    def rollout(env: VecEnv, first: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(9)
        out = [first]
        for _ in range(30):  # past the 25-step limit: the auto-reset draws are compared too
            obs, _, _, _, info = env.step(torch.randint(0, 5, (8, env.num_agents), generator=gen))
            out += [obs, info["final_obs"]]
        return torch.stack(out)

    seeded, unseeded, other = cls(8, seed=7), cls(8), cls(8, seed=8)
    a = rollout(seeded, seeded.reset())
    assert torch.equal(a, rollout(unseeded, unseeded.reset(seed=7)))  # Env(seed=s).reset() == Env().reset(seed=s)
    assert not torch.equal(a[0], rollout(other, other.reset())[0])
    env = cls(8, seed=1)
    first = env.reset(seed=5)
    assert not torch.equal(env.reset(), first) and torch.equal(env.reset(seed=5), first)


def test_bad_options_raise() -> None:
    for build in (lambda: SimpleSpreadEnv(num_agents=1), lambda: SimpleSpreadEnv(local_ratio=1.5),
                  lambda: SimpleSpreadEnv(0), lambda: SimpleSpreadEnv(max_steps=0),
                  lambda: SimpleTagEnv(num_good=0), lambda: SimpleTagEnv(dtype=torch.int32)):
        with pytest.raises(EnvError):
            build()
    env = SimpleTagEnv(2, seed=0)
    with pytest.raises(EnvError, match=r"landmark_pos must have shape \(2, 2, 2\)"):
        env.set_world_state(env.agent_pos, env.agent_vel, torch.zeros(2, 3, 2))


def test_options_change_the_world() -> None:
    spread = SimpleSpreadEnv(2, num_agents=5, seed=0)
    assert spread.reset().shape == (2, 5, 30) and spread.global_state().shape == (2, 150)
    tag = SimpleTagEnv(2, num_adversaries=2, num_good=3, num_obstacles=1, seed=0)
    # adversaries: 4 + 2 + 8 + 6 = 20 numbers, good agents 18; padded to 20, plus the one-hot
    assert tag.reset().shape == (2, 5, 22) and tag.global_state().shape == (2, 2 * 20 + 3 * 18)
    assert tag.teams == ("adversary", "adversary", "agent", "agent", "agent")
    _, reward, _, _, _ = tag.step(torch.zeros(2, 5, dtype=torch.int64))
    assert torch.equal(reward[:, 0], reward[:, 1])  # the adversaries share their reward


@pytest.mark.parametrize(("env_id", "message"), [
    ("jaderl/simple_spread?num_agents=abc",
     "env option num_agents='abc' in 'jaderl/simple_spread?num_agents=abc' must be a whole number, e.g. ?num_agents=3"),
    ("jaderl/simple_tag?num_adversaries=abc", "env option num_adversaries='abc' in 'jaderl/simple_tag?num_adversaries="
     "abc' must be a whole number, e.g. ?num_adversaries=3"),
    ("jaderl/simple_spread?num_agents=4.5",
     "env option num_agents='4.5' in 'jaderl/simple_spread?num_agents=4.5' must be a whole number, e.g. ?num_agents=3"),
    ("jaderl/simple_spread?num_agents=true",
     "env option num_agents='true' in 'jaderl/simple_spread?num_agents=true' must be a whole number, e.g. "
     "?num_agents=3"),
    ("jaderl/simple_spread?continuous=maybe",
     "env option continuous='maybe' in 'jaderl/simple_spread?continuous=maybe' must be true or false"),
    ("jaderl/simple_spread?continuous=no",
     "env option continuous='no' in 'jaderl/simple_spread?continuous=no' must be true or false"),
    ("jaderl/simple_spread?local_ratio=half",
     "env option local_ratio='half' in 'jaderl/simple_spread?local_ratio=half' must be a number, e.g. "
     "?local_ratio=0.5"),
    ("jaderl/simple_spread?num_agents=3&num_agents=4",
     "env option 'num_agents' appears twice in 'jaderl/simple_spread?num_agents=3&num_agents=4'; give it once"),
    ("jaderl/simple_spread?colour=red",
     "env 'jaderl/simple_spread' has no option 'colour'; its options are: num_agents, continuous, max_steps, "
     "local_ratio"),
    ("jaderl/simple_tag?seed=3", "env option 'seed' in 'jaderl/simple_tag?seed=3' is jaderl's to set, not the id's; "
     "remove it and set seed in the config (or pass it to make_env)"),
    ("jaderl/simple_tag?dtype=float64",
     "env option 'dtype' in 'jaderl/simple_tag?dtype=float64' is jaderl's to set, not the id's; remove it"),
])
def test_bad_options_in_the_id_are_one_sentence(env_id: str, message: str) -> None:
    """Each option is read as its constructor parameter's type: no int() traceback, no 'maybe' taken as true, no
    4.5 taken as 4, no repeated key silently taking the last."""
    with pytest.raises(EnvError) as info:
        make_env(env_id, 2, seed=0)
    assert str(info.value) == message


def test_every_form_of_a_good_option_in_the_id_still_works() -> None:
    env = make_env("jaderl/simple_spread?continuous=TRUE&num_agents=4.0&max_steps=1e2&local_ratio=1", 2, seed=0)
    assert isinstance(env, SimpleSpreadEnv) and not env.is_discrete and env.num_agents == 4
    assert env.max_steps == 100 and env.local_ratio == 1.0
    assert make_env("jaderl/simple_spread?continuous=1", 2, seed=0).is_discrete is False
    assert make_env("jaderl/simple_spread?continuous=false", 2, seed=0).is_discrete is True
    tag = make_env("jaderl/simple_tag?num_adversaries=2&num_good=2&num_obstacles=0", 2, seed=0)
    assert tag.teams == ("adversary", "adversary", "agent", "agent")


def test_simple_spread_local_ratio() -> None:
    """The reward is (1 - local_ratio) * global + local_ratio * local, as in MPE2."""
    envs = [SimpleSpreadEnv(16, dtype=torch.float64, seed=4, local_ratio=r) for r in (0.0, 1.0, 0.25)]
    action = torch.randint(0, 5, (16, 3), generator=torch.Generator().manual_seed(1))
    (_, coverage, *_), (_, local, *_), (_, mixed, *_) = (env.step(action) for env in envs)
    assert (coverage[:, :1] == coverage).all() and (local <= 0).all() and (local == local.round()).all()
    assert torch.allclose(mixed, 0.75 * coverage + 0.25 * local, atol=1e-6, rtol=0)


def test_registry() -> None:
    assert set(MPE_ENVS) == {"jaderl/simple_spread", "jaderl/simple_tag"}
    assert MPE_ENVS["jaderl/simple_spread"] is SimpleSpreadEnv and MPE_ENVS["jaderl/simple_tag"] is SimpleTagEnv


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls", [SimpleSpreadEnv, SimpleTagEnv])
def test_step_does_not_synchronize_on_cuda(cls: MPE_ENV) -> None:
    env = cls(4096, device="cuda", seed=0)
    action = torch.zeros(4096, env.num_agents, dtype=torch.int64, device="cuda")
    env.step(action)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(30):  # an auto-reset included
            env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")
