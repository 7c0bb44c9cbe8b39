"""Tests of jaderl.envs.pettingzoo: PettingZoo parallel envs as batched multi-agent envs, in this process or in
worker processes (which must leave no process behind: fixture ``no_leftover_processes``)."""

from __future__ import annotations

import math
import sys
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

import gymnasium as gym
from action_checks import JUNK_ACTIONS, assert_same_step, check_list_actions, check_refused_actions
from mpe2 import simple_spread_v3, simple_tag_v3
from pettingzoo import ParallelEnv

from jaderl.envs.pettingzoo import PettingZooVecEnv, make_pettingzoo_env
from jaderl.envs.vec import EnvError

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


class LifetimeEnv(ParallelEnv):
    """Agents ``worker_0`` and ``worker_1`` that leave (terminate) after ``lifetimes`` steps each. An agent observes
    ``[t, its index, its last action]`` and gets reward ``10 t + index``; ``nan_at``: the reward is NaN at that
    step. It has no ``state()``."""

    metadata: ClassVar[dict[str, Any]] = {"name": "lifetime_v0"}

    def __init__(self, lifetimes: tuple[int, int] = (2, 4), start: int = 0, sizes: tuple[int, int] = (3, 3),
                 nan_at: int | None = None, raise_at: int | None = None) -> None:
        self.possible_agents = ["worker_0", "worker_1"]
        self.lifetimes, self.sizes, self.start, self.nan_at = lifetimes, sizes, start, nan_at
        self.raise_at = raise_at  # step at which the env fails with an error of its own
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Discrete:
        return gym.spaces.Discrete(self.sizes[self.possible_agents.index(agent)], start=self.start)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.array([0, i, 0], np.float32) for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), f"actions for {set(actions)}, but {self.agents} are alive"
        self.t += 1
        if self.t == self.raise_at:
            raise RuntimeError("simulator exploded")
        index = {a: self.possible_agents.index(a) for a in self.agents}
        obs = {a: np.array([self.t, index[a], actions[a]], np.float32) for a in self.agents}
        rewards = {a: math.nan if self.t == self.nan_at else 10.0 * self.t + index[a] for a in self.agents}
        terminations = {a: self.t >= self.lifetimes[index[a]] for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not terminations[a]]
        return obs, rewards, terminations, truncations, infos


def test_shapes_dtypes_and_spec() -> None:
    env = make_pettingzoo_env("pettingzoo/mpe2.simple_spread_v3", 2, "cpu", seed=0)
    try:
        spec = env.spec
        assert env.agents == ("agent_0", "agent_1", "agent_2") and spec.teams == ()
        assert (spec.num_envs, spec.num_agents, spec.obs_shape, spec.state_shape) == (2, 3, (18,), (54,))
        assert (spec.is_discrete, spec.action_dim, spec.max_steps) == (True, 5, 25)  # MPE2's max_cycles
        obs = env.reset(seed=1)
        assert obs.shape == (2, 3, 18) and obs.dtype == torch.float32
        obs, reward, terminated, truncated, info = env.step(torch.zeros(2, 3, dtype=torch.long))
        assert obs.shape == info["final_obs"].shape == (2, 3, 18) and obs.dtype == torch.float32
        assert reward.shape == (2, 3) and reward.dtype == torch.float32
        assert terminated.shape == truncated.shape == (2,) and terminated.dtype == truncated.dtype == torch.bool
        assert info["final_state"].shape == env.global_state().shape == (2, 54)
    finally:
        env.close()


def test_options_in_the_id_go_to_the_env() -> None:
    from jaderl.envs import make_env

    env = make_env("pettingzoo/mpe2.simple_spread_v3?N=2&continuous_actions=true", 2, "cpu", seed=0)
    try:
        assert env.spec.num_agents == 2 and not env.spec.is_discrete
    finally:
        env.close()
    with pytest.raises(EnvError, match="unexpected keyword argument 'bogus'"):
        make_env("pettingzoo/mpe2.simple_spread_v3?bogus=1", 1, "cpu")
    for cycles in (0, -3):  # MPE2 would truncate every step, or never
        with pytest.raises(EnvError, match=rf"^max_cycles={cycles} of PettingZoo env 'simple_spread_v3' must be at "
                                           r"least 1 \(the steps after which an episode is truncated\), e\.g\. "
                                           r"\?max_cycles=25$"):
            make_env(f"pettingzoo/mpe2.simple_spread_v3?max_cycles={cycles}", 1, "cpu")


@pytest.mark.parametrize("continuous", [False, True])
def test_matches_the_env_stepped_by_hand(continuous: bool) -> None:
    """Observations, rewards, states and flags equal those of ``simple_spread_v3`` envs reset with ``seed + i`` and
    given the same actions, through three auto-resets (``max_cycles=10``)."""
    num_envs, seed = 2, 5
    env = make_pettingzoo_env("mpe2.simple_spread_v3", num_envs, seed=seed, max_cycles=10,
                              continuous_actions=continuous)
    refs = [simple_spread_v3.parallel_env(max_cycles=10, continuous_actions=continuous) for _ in range(num_envs)]
    try:
        want = [ref.reset(seed=seed + i)[0] for i, ref in enumerate(refs)]
        obs = env.reset(seed=seed)
        generator = torch.Generator().manual_seed(0)
        truncations = 0
        for step in range(30):
            for i, ref in enumerate(refs):
                assert np.array_equal(obs[i].numpy(), np.stack([want[i][a] for a in ref.possible_agents])), step
                assert np.array_equal(env.global_state()[i].numpy(), ref.state())
            if continuous:  # [-1, 1] -> MPE2's Box(0, 1, (5,))
                action = torch.rand(num_envs, 3, 5, generator=generator) * 2 - 1
            else:
                action = torch.randint(0, 5, (num_envs, 3), generator=generator)
            obs, reward, terminated, truncated, info = env.step(action)
            for i, ref in enumerate(refs):
                if continuous:
                    acts = {a: ((action[i, j].double() + 1) * 0.5).numpy().astype(np.float32)
                            for j, a in enumerate(ref.agents)}
                else:
                    acts = {a: int(action[i, j]) for j, a in enumerate(ref.agents)}
                want[i], rewards, _, ref_truncations, _ = ref.step(acts)
                assert reward[i].tolist() == [np.float32(rewards[a]) for a in ref.possible_agents], step
                reached = np.stack([want[i][a] for a in ref.possible_agents])
                assert np.array_equal(info["final_obs"][i].numpy(), reached)
                assert np.array_equal(info["final_state"][i].numpy(), ref.state())
                assert bool(truncated[i]) == (not ref.agents) == all(ref_truncations.values())
                assert not terminated[i]
                if not ref.agents:
                    want[i] = ref.reset()[0]
            truncations += int(truncated.sum())
        assert truncations == 3 * num_envs
    finally:
        env.close()


def test_agents_of_different_sizes_are_padded_with_a_team_one_hot() -> None:
    env = make_pettingzoo_env(simple_tag_v3.parallel_env, 2, seed=3)  # a factory
    ref = simple_tag_v3.parallel_env()
    try:
        assert env.teams == ("adversary", "adversary", "adversary", "agent")
        assert env.obs_shape == (18,) and env.state_shape == (62,)  # 16 + a one-hot of 2 teams
        obs = env.reset(seed=3)
        raw, _ = ref.reset(seed=3)
        for j, agent in enumerate(ref.agents):
            size = raw[agent].size
            assert np.array_equal(obs[0, j, :size].numpy(), raw[agent])
            assert (obs[0, j, size:16] == 0).all()
            assert obs[0, j, 16:].tolist() == ([0.0, 1.0] if agent == "agent_0" else [1.0, 0.0])
    finally:
        env.close()
        ref.close()


def test_workers_give_the_same_trajectories_as_this_process() -> None:
    here = make_pettingzoo_env("mpe2.simple_tag_v3", 3, seed=2, max_cycles=10)
    there = make_pettingzoo_env("mpe2.simple_tag_v3", 3, seed=2, workers=2, max_cycles=10)
    pids = there.worker_pids
    assert len(pids) == 2
    try:
        assert here.spec == there.spec
        assert torch.equal(here.reset(seed=4), there.reset(seed=4))
        generator = torch.Generator().manual_seed(0)
        for step in range(25):
            action = torch.randint(0, 5, (3, 4), generator=generator)
            *got, got_info = there.step(action)
            *want, want_info = here.step(action)
            for a, b in zip([*got, *got_info.values()], [*want, *want_info.values()], strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b), step
            assert torch.equal(here.global_state(), there.global_state())
    finally:
        here.close()
        there.close()
    assert there.worker_pids == []


@pytest.mark.parametrize("workers", [0, 1])
def test_agents_that_leave_early_observe_zeros(workers: int) -> None:
    """worker_0 leaves after 2 steps, worker_1 after 4, which ends the episode; the state is the observations side by
    side (the env has no ``state()``); Discrete(3, start=-1) takes -1, 0, 1 for the agent's 0, 1, 2."""
    env = make_pettingzoo_env(LifetimeEnv, 2, workers=workers, start=-1)
    try:
        assert (env.obs_shape, env.state_shape, env.action_dim, env.max_steps) == ((3,), (6,), 3, 0)
        env.reset(seed=0)
        action = torch.tensor([[2, 0], [1, 2]])
        rows = []
        for step in range(1, 6):
            obs, reward, terminated, truncated, info = env.step(action)
            rows.append((obs, reward, terminated, info))
            assert not truncated.any()
            assert torch.equal(info["final_state"], info["final_obs"].flatten(1)), step
            assert torch.equal(env.global_state(), obs.flatten(1)), step
        for step, (obs, reward, terminated, info) in enumerate(rows, 1):
            t = torch.tensor(float(step))
            if step <= 2:  # both alive; worker_0 still observes and is rewarded on the step it leaves
                assert torch.equal(obs[:, 0], torch.tensor([[t, 0, 1], [t, 0, 0]])), step
            elif step <= 4:
                assert (obs[:, 0] == 0).all() and (reward[:, 0] == 0).all(), step
            if step <= 4:
                assert torch.equal(info["final_obs"][:, 1], torch.tensor([[t, 1, -1], [t, 1, 1]])), step
                assert torch.equal(reward[:, 1], torch.full((2,), 10 * t + 1)), step
            assert bool(terminated.all()) == (step == 4) and bool(terminated.any()) == (step == 4), step
        obs, _, terminated, info = rows[3]  # the episode's end: reset, with what it reached kept
        assert torch.equal(obs[:, 1], torch.tensor([[0.0, 1, 0]] * 2)) and (info["final_obs"][:, 0] == 0).all()
        assert torch.equal(rows[4][0][:, 0], torch.tensor([[1.0, 0, 1], [1.0, 0, 0]]))  # a new episode
    finally:
        env.close()


class GhostEnv(LifetimeEnv):
    """:class:`LifetimeEnv` that goes on reporting worker_0 after it left (observation 99s, reward 55, terminated), as
    PettingZoo's API allows (with a warning), and whose worker_1 is truncated, not terminated, when it leaves."""

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        alive = list(self.agents)
        obs, rewards, terminations, truncations, infos = super().step(actions)
        if "worker_1" in alive and "worker_1" not in self.agents:
            terminations["worker_1"], truncations["worker_1"] = False, True
        if "worker_0" not in alive:
            obs["worker_0"], rewards["worker_0"], infos["worker_0"] = np.full(3, 99.0, np.float32), 55.0, {}
            terminations["worker_0"], truncations["worker_0"] = True, False
        return obs, rewards, terminations, truncations, infos


def test_agents_an_env_goes_on_reporting_after_they_left_observe_zeros() -> None:
    """worker_0 leaves after 2 steps but the env still reports it: it observes zeros and gets reward 0 all the same,
    and its old termination does not make the episode's end, worker_1's truncation at step 4, a termination."""
    env = make_pettingzoo_env(GhostEnv, 2)
    try:
        env.reset(seed=0)
        for step in range(1, 5):
            obs, reward, terminated, truncated, info = env.step(torch.zeros(2, 2, dtype=torch.long))
            if step >= 3:
                assert (info["final_obs"][:, 0] == 0).all() and (reward[:, 0] == 0).all(), step
                assert (info["final_state"][:, :3] == 0).all(), step  # no state(): the observations side by side
            if step == 3:  # (step 4 ends the episode: obs is the next one's first)
                assert (obs[:, 0] == 0).all() and (env.global_state()[:, :3] == 0).all()
            assert torch.equal(reward[:, 1], torch.full((2,), 10.0 * step + 1)), step
            assert truncated.all() == (step == 4) and truncated.any() == (step == 4), step
            assert not terminated.any(), step
    finally:
        env.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_bad_actions_are_refused_in_one_sentence_and_the_env_goes_on(workers: int) -> None:
    env = make_pettingzoo_env("mpe2.simple_spread_v3", 2, seed=0, workers=workers)
    box = make_pettingzoo_env("mpe2.simple_spread_v3", 2, seed=0, continuous_actions=True)
    try:
        with pytest.raises(EnvError, match=r"^the env takes discrete actions 0 to 4, got actions from -1 to 3; give "
                                           r"the agent 5 actions \(the env's action_dim\)$"):
            env.step(torch.tensor([[0, 3, 1], [0, -1, 0]]))
        with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite"):
            env.step(torch.tensor([[0.0, 1.0, 1.0], [math.nan, 0.0, 0.0]]))
        with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite"):
            box.step(torch.full((2, 3, 5), math.nan))
        with pytest.raises(EnvError, match=r"^expected actions of shape \(2, 3\) \(one per agent of each sub-env\), "
                                           r"got a tensor of shape \(6,\)$"):
            env.step(torch.zeros(6, dtype=torch.long))
        with pytest.raises(EnvError, match=r"^expected actions of shape \(2, 3, 5\) \(5 values per agent of each "
                                           r"sub-env\), got a tensor of shape \(2, 3\)$"):
            box.step(torch.zeros(2, 3))
        obs, *_ = env.step(torch.zeros(2, 3, dtype=torch.long))  # nothing reached the sub-envs
        assert obs.shape == (2, 3, 18)
    finally:
        env.close()
        box.close()


@pytest.mark.parametrize(("continuous", "workers"), [(False, 0), (True, 0), (False, 1)])
def test_lists_and_numpy_actions_are_read_and_non_integral_discrete_ones_refused(continuous: bool,
                                                                                 workers: int) -> None:
    """A list, tuple or NumPy array of (N, agents) or (N, agents, action_dim) actions steps as the same tensor would;
    a float discrete action that is not a whole number (0.7) is refused in one sentence (not truncated to an int),
    one that is (1.0) is taken; what is not numbers is refused in one sentence naming what the env takes. Refused
    actions reach no sub-env."""
    env = make_pettingzoo_env("mpe2.simple_spread_v3", 2, seed=0, workers=workers, continuous_actions=continuous)
    try:
        values = [[[0.5] * 5, [-0.25] * 5, [1.0] * 5], [[0.0] * 5] * 3] if continuous else [[0, 3, 1], [4, 2, 0]]
        want = check_list_actions(env, values, lambda: env.reset(seed=3))
        env.reset(seed=3)
        bad: list[Any] = [] if continuous else [torch.full((2, 3), 0.7), [[1.0, 0.5, 0.0], [0.0] * 3],
                                                np.full((2, 3), 0.7)]
        check_refused_actions(env, non_integral=bad, junk=(*JUNK_ACTIONS, [[0], [1, 0]]))
        got = env.step(values)  # the first step after the reset: nothing refused reached a sub-env
        assert_same_step(got, want)
    finally:
        env.close()

def test_non_finite_rewards_are_reported() -> None:
    env = make_pettingzoo_env(LifetimeEnv, 1, nan_at=2)
    try:
        env.step(torch.zeros(1, 2, dtype=torch.long))
        with pytest.raises(EnvError, match=r"^the env returned a non-finite reward; fix the env"):
            env.step(torch.zeros(1, 2, dtype=torch.long))
    finally:
        env.close()


def test_an_env_instance_makes_one_sub_env() -> None:
    instance = simple_spread_v3.parallel_env(N=2)
    env = make_pettingzoo_env(instance, 1, seed=0)
    try:
        assert env.num_agents == 2 and env.reset(seed=0).shape == (1, 2, 12)
    finally:
        env.close()
    with pytest.raises(EnvError, match=r"^one ParallelEnv instance makes one sub-env in this process"):
        make_pettingzoo_env(simple_spread_v3.parallel_env(), 2)


def test_bad_envs_are_refused_in_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EnvError, match=r"^unknown PettingZoo env 'pettingzoo/mpe2.no_such_env_v0': there is no "
                                       r"module 'mpe2.no_such_env_v0'; give the module of a parallel env"):
        make_pettingzoo_env("pettingzoo/mpe2.no_such_env_v0", 2)
    with pytest.raises(EnvError, match=r"^module 'mpe2' has no parallel_env\(\)"):
        make_pettingzoo_env("mpe2", 2)
    with pytest.raises(EnvError, match=r"^cannot build the PettingZoo env 'simple_spread_v3' \(.*'colour'.*\); check "
                                       r"its keyword arguments$"):
        make_pettingzoo_env("mpe2.simple_spread_v3", 2, colour="red")
    with pytest.raises(EnvError, match=r"^agents worker_0 and worker_1 have different action spaces \(Discrete\(3\) "
                                       r"and Discrete\(5\)\); jaderl needs every agent to have the same kind and size"):
        make_pettingzoo_env(LifetimeEnv, 2, sizes=(3, 5))
    with pytest.raises(EnvError, match=r"^agents leadadversary_0 and adversary_0 have different action spaces"):
        make_pettingzoo_env("mpe2.simple_world_comm_v3", 1)
    with pytest.raises(EnvError, match=r"^cannot build the PettingZoo env 'simple_spread_v3' \(AssertionError: "
                                       r"local_ratio is a proportion.*\); check its keyword arguments$"):
        make_pettingzoo_env("mpe2.simple_spread_v3", 1, local_ratio=5)  # the env's own check of a value
    with pytest.raises(EnvError, match=r"^env id 'pettingzoo/' names no module; give the module of a parallel env"):
        make_pettingzoo_env("pettingzoo/", 1)
    env = make_pettingzoo_env(LifetimeEnv, 2, raise_at=1)
    with pytest.raises(EnvError, match=r"^env 'LifetimeEnv' \(stepped in this process\) failed: RuntimeError: "
                                       r"simulator exploded$"):  # as a worker process reports it
        env.step(torch.zeros(2, 2, dtype=torch.long))
    env.close()
    monkeypatch.delitem(sys.modules, "mpe2.simple_adversary_v3", raising=False)
    monkeypatch.setitem(sys.modules, "mpe2", None)  # as if it were not installed
    with pytest.raises(EnvError, match=r"^env 'mpe2.simple_adversary_v3' needs the mpe2 package: "
                                       r"pip install 'jaderl\[marl\]'$"):
        make_pettingzoo_env("mpe2.simple_adversary_v3", 2)
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(EnvError, match=r"^PettingZoo envs need the pettingzoo package: pip install 'jaderl\[marl\]'$"):
        make_pettingzoo_env(LifetimeEnv, 2)


def test_sub_envs_built_before_one_that_fails_are_closed() -> None:
    closed: list[int] = []
    built = [0]

    class Closing(LifetimeEnv):
        def __init__(self) -> None:
            super().__init__()
            built[0] += 1
            self.number = built[0]
            if self.number == 3:
                raise ValueError("no licence for a third simulator")

        def close(self) -> None:
            closed.append(self.number)

    with pytest.raises(ValueError, match="no licence for a third simulator"):
        PettingZooVecEnv(Closing, 4, "cpu")
    assert sorted(closed) == [1, 2]


def test_a_sub_env_of_other_agents_is_closed_too() -> None:
    closed: list[str] = []
    built: list[int] = []

    class Renamed(LifetimeEnv):
        def __init__(self) -> None:
            super().__init__()
            built.append(len(built))
            if len(built) == 3:  # the third sub-env has agents of other names
                self.possible_agents = ["worker_0", "boss_1"]

        def close(self) -> None:
            closed.append(",".join(self.possible_agents))

    with pytest.raises(EnvError, match=r"a sub-env has agents \['worker_0', 'boss_1'\] but the first has "):
        PettingZooVecEnv(Renamed, 4, "cpu")
    assert sorted(closed) == ["worker_0,boss_1", "worker_0,worker_1", "worker_0,worker_1"]


def test_close_closes_every_sub_env_when_one_fails_to() -> None:
    closed: list[int] = []
    built = [0]

    class Failing(LifetimeEnv):
        def __init__(self) -> None:
            super().__init__()
            built[0] += 1
            self.number = built[0]

        def close(self) -> None:
            closed.append(self.number)
            if self.number == 1:
                raise RuntimeError("the simulator's licence server is gone")

    env = PettingZooVecEnv(Failing, 3, "cpu")
    env.close()  # as the worker processes ignore the errors of their sub-envs' close
    assert sorted(closed) == [1, 2, 3]
    env.close()  # once closed, nothing is closed twice
    assert sorted(closed) == [1, 2, 3]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_closed_env_says_so(workers: int) -> None:
    env = make_pettingzoo_env(LifetimeEnv, 2, workers=workers)
    assert isinstance(env, PettingZooVecEnv) and env.state_dict() is None  # PettingZoo envs cannot be copied
    env.close()
    env.close()  # closing twice is fine
    assert env.worker_pids == []
    with pytest.raises(EnvError, match="closed"):
        env.step(torch.zeros(2, 2, dtype=torch.long))


class EchoEnv(ParallelEnv):
    """Two agents with bounds of their own (``Box(0, 1)`` and ``Box(-4, 4)``, two values each) that observe the
    action the env was given."""

    metadata: ClassVar[dict[str, Any]] = {"name": "echo_v0"}
    BOUNDS: ClassVar[list[tuple[float, float]]] = [(0.0, 1.0), (-4.0, 4.0)]

    def __init__(self) -> None:
        self.possible_agents, self.agents = ["a_0", "a_1"], []

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Box:
        return gym.spaces.Box(*self.BOUNDS[self.possible_agents.index(agent)], (2,), np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs = {a: np.asarray(actions[a], np.float32) for a in self.agents}
        return obs, {a: 0.0 for a in self.agents}, {a: False for a in self.agents}, \
            {a: False for a in self.agents}, {a: {} for a in self.agents}


def test_agents_with_bounds_of_their_own_get_them_from_predict() -> None:
    """The spec holds every agent's bounds when they differ, so ``predict`` gives what the env is given."""
    from jaderl.api import ALGOS, make_config

    env = make_pettingzoo_env(EchoEnv(), 1, seed=0)
    try:
        assert env.spec.action_low == (0.0, 0.0, -4.0, -4.0) and env.spec.action_high == (1.0, 1.0, 4.0, 4.0)
        agent = ALGOS["mappo"].agent_cls(make_config("mappo", "jaderl/simple_spread?continuous=true", device="cpu"),
                                         env.spec, torch.device("cpu"))
        obs = env.reset(seed=0) + 1.0
        given, *_ = env.step(agent.act(obs, deterministic=True))
        np.testing.assert_allclose(agent.predict(obs[0].numpy()), given[0, :, :2].numpy(), rtol=0, atol=1e-6)
    finally:
        env.close()


class IntegerEchoEnv(EchoEnv):
    """:class:`EchoEnv` whose agents act with integer ``Box(0, 10, (2,))`` vectors."""

    def action_space(self, agent: str) -> gym.spaces.Box:
        return gym.spaces.Box(0, 10, (2,), np.int64)


def test_integer_box_actions_are_vectors_of_each_agent() -> None:
    """A Box of integers is a continuous space to jaderl: every agent gets its own vector, rescaled from [-1, 1],
    not one integer of the packed actions (which an integer dtype must not be mistaken for Discrete)."""
    env = make_pettingzoo_env(IntegerEchoEnv(), 1, seed=0)
    try:
        assert not env.is_discrete and env.action_dim == 2
        given, *_ = env.step(torch.tensor([[[-1.0, 1.0], [1.0, 0.0]]]))
        assert given.tolist() == [[[0.0, 10.0], [10.0, 5.0]]]
    finally:
        env.close()
