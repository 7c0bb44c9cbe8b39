"""Tests of jaderl.envs.vmas: VMAS scenarios as batched multi-agent envs (shapes, auto-reset, padding, errors)."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("vmas")

from action_checks import JUNK_ACTIONS, assert_same_step, check_list_actions, check_refused_actions

import jaderl.envs.vmas
from jaderl.envs.vec import EnvError
from jaderl.envs.vmas import VmasVecEnv, make_vmas_env


def _random_actions(env: VmasVecEnv, generator: torch.Generator) -> torch.Tensor:
    if env.is_discrete:
        return torch.randint(0, env.action_dim, (env.num_envs, env.num_agents), generator=generator)
    return torch.rand(env.num_envs, env.num_agents, env.action_dim, generator=generator) * 2.4 - 1.2


@pytest.mark.parametrize("continuous", [False, True])
def test_shapes_dtypes_and_spec(continuous: bool) -> None:
    env = make_vmas_env("vmas/navigation", 3, "cpu", seed=0, continuous=continuous, max_steps=7)
    spec = env.spec
    assert (spec.num_envs, spec.num_agents, spec.obs_shape, spec.state_shape, spec.max_steps) == (3, 4, (18,), (72,), 7)
    assert env.agents == ("agent_0", "agent_1", "agent_2", "agent_3") and spec.teams == ()
    assert (spec.is_discrete, spec.action_dim) == ((False, 2) if continuous else (True, 9))
    if continuous:
        assert spec.action_low == (-1.0, -1.0) and spec.action_high == (1.0, 1.0)
    assert env.state_dict() is None  # VMAS's scenario state cannot be copied exactly: episodes restart
    obs = env.reset(seed=1)
    assert obs.shape == (3, 4, 18) and obs.dtype == torch.float32
    obs, reward, terminated, truncated, info = env.step(_random_actions(env, torch.Generator().manual_seed(0)))
    assert obs.shape == info["final_obs"].shape == (3, 4, 18) and obs.dtype == info["final_obs"].dtype == torch.float32
    assert reward.shape == (3, 4) and reward.dtype == torch.float32
    assert terminated.shape == truncated.shape == (3,) and terminated.dtype == truncated.dtype == torch.bool
    assert info["final_state"].shape == env.global_state().shape == (3, 72)
    # equal-sized agents of one team: the state is the observations side by side, with no padding
    assert torch.equal(env.global_state(), obs.flatten(1))


def test_options_in_the_id_go_to_the_scenario() -> None:
    from jaderl.envs import make_env

    assert make_env("vmas/navigation?n_agents=2&continuous=true", 2, "cpu", seed=0).spec.num_agents == 2
    with pytest.raises(EnvError, match=r"^VMAS scenario 'navigation' reads no option \{'n_agnets': 2\}; see the "
                                       "scenario's make_world for the options it reads$"):
        make_env("vmas/navigation?n_agnets=2", 2, "cpu", seed=0)  # VMAS itself only warns, and trains 4 agents
    with pytest.raises(EnvError, match=r"^VMAS scenario 'navigation' refused its options n_agents=0 "
                                       r"\(AssertionError.*\); check their values in the scenario's make_world$"):
        make_env("vmas/navigation?n_agents=0", 2, "cpu")
    with pytest.raises(EnvError, match=r"^env option continuous='maybe' in 'vmas/navigation\?continuous=maybe' must "
                                       r"be true or false$"):
        make_env("vmas/navigation?continuous=maybe", 2, "cpu")
    with pytest.raises(EnvError, match=r"^env option 'num_envs' in 'vmas/navigation\?num_envs=5' is jaderl's to set"):
        make_env("vmas/navigation?num_envs=5", 2, "cpu")
    for steps in (0, -1):  # an episode must end: evaluations run every sub-env's episode to its end
        with pytest.raises(EnvError, match=rf"^VMAS option max_steps={steps} must be at least 1 \(the steps after "
                                           r"which an episode is truncated\), e.g. \?max_steps=100$"):
            make_env(f"vmas/navigation?max_steps={steps}", 2, "cpu")


@pytest.mark.parametrize(("scenario", "continuous"), [("navigation", False), ("balance", True)])
def test_runs_hundreds_of_steps_with_auto_reset(scenario: str, continuous: bool) -> None:
    max_steps = 40
    env = make_vmas_env(scenario, 2, seed=0, continuous=continuous, max_steps=max_steps)
    generator = torch.Generator().manual_seed(0)
    obs = env.reset(seed=3)
    since_reset = torch.zeros(2, dtype=torch.long)
    truncations = 0
    for _ in range(200):
        previous = obs
        obs, reward, terminated, truncated, info = env.step(_random_actions(env, generator))
        since_reset += 1
        done = terminated | truncated
        assert torch.equal(truncated, since_reset == max_steps)  # VMAS's counter restarts at every reset
        assert torch.isfinite(obs).all() and torch.isfinite(reward).all()
        assert torch.equal(obs[~done], info["final_obs"][~done])  # the sub-envs that go on are not reset
        assert not torch.equal(obs[done], info["final_obs"][done]) or not done.any()
        assert torch.equal(info["final_state"], info["final_obs"].flatten(1))
        assert not torch.equal(obs, previous)
        truncations += int(truncated.sum())
        since_reset[done] = 0
    assert truncations >= 2 * (200 // max_steps) - 2  # terminations (balance) may restart a counter early


def test_sub_envs_that_finish_alone_reset_alone() -> None:
    """Sub-envs 1 and 3 terminate at step 3: only they reset (one at a time, with VMAS's reset_at), and their
    truncation comes ``max_steps`` later than the others'. A twin env, seeded alike and never terminated, shows
    what every sub-env reached (navigation's physics is deterministic; only resets draw random numbers)."""
    env = make_vmas_env("navigation", 4, seed=0, max_steps=6)
    twin = make_vmas_env("navigation", 4, seed=0, max_steps=100)  # no time limit within these steps
    assert torch.equal(env.global_state(), twin.global_state())
    ends = torch.tensor([False, True, False, True])
    generator = torch.Generator().manual_seed(1)
    for step in range(1, 10):
        if step == 3:
            env.env.scenario.done = lambda: ends.clone()  # what VMAS asks the scenario after each step
        action = _random_actions(env, generator)
        obs, _, terminated, truncated, info = env.step(action)
        twin_obs, *_ = twin.step(action)
        if step == 3:
            env.env.scenario.done = lambda: torch.zeros(4, dtype=torch.bool)
            assert torch.equal(terminated, ends) and not truncated.any()
            assert torch.equal(info["final_obs"], twin_obs)  # what they reached, before the reset
            assert torch.equal(info["final_state"], twin.global_state())
            assert torch.equal(obs[~ends], twin_obs[~ends]) and not torch.equal(obs[ends], twin_obs[ends])
            assert torch.equal(env.global_state(), obs.flatten(1))
        else:
            assert not terminated.any()
        expected = {6: ~ends, 9: ends}.get(step, torch.zeros(4, dtype=torch.bool))
        assert torch.equal(truncated, expected), step


def test_agents_of_different_sizes_are_padded_with_a_team_one_hot() -> None:
    env = make_vmas_env("simple_tag", 2, seed=0)  # 3 adversaries observe 16 values, the agent 14
    assert env.agents == ("adversary_0", "adversary_1", "adversary_2", "agent_0")
    assert env.teams == ("adversary", "adversary", "adversary", "agent")
    assert env.obs_shape == (18,) and env.state_shape == (62,)
    obs, *_ = env.step(torch.zeros(2, 4, dtype=torch.long))
    raw = env.global_state()
    assert torch.equal(obs[:, :3, :16].flatten(1), raw[:, :48]) and torch.equal(obs[:, 3, :14], raw[:, 48:])
    assert (obs[:, 3, 14:16] == 0).all()
    assert (obs[:, :3, 16:] == torch.tensor([1.0, 0.0])).all() and (obs[:, 3, 16:] == torch.tensor([0.0, 1.0])).all()


def test_tensors_stay_on_the_vmas_device_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_vmas_env("simple_reference", 3, seed=0, continuous=True)  # movement in [-1, 1], words in [0, 1]
    assert env.action_dim == 12 and env.spec.action_low == (-1.0,) * 2 + (0.0,) * 10

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tensor went through numpy")

    for owner, name in [(torch.Tensor, "numpy"), (torch.Tensor, "__array__"), (torch, "from_numpy")]:
        monkeypatch.setattr(owner, name, refuse)
    action = torch.zeros(3, 2, 12)
    action[:, :, :2] = torch.tensor([-1.5, 0.25])  # clipped to -1
    obs, reward, terminated, truncated, info = env.step(action)
    for tensor in (obs, reward, terminated, truncated, info["final_obs"], info["final_state"], env.global_state()):
        assert tensor.device == env.env.device == env.device
    for agent in env.env.agents:
        assert torch.equal(agent.action.u, torch.tensor([[-1.0, 0.25]] * 3) * agent.action.u_multiplier)
        assert (agent.action.c == 0.5).all()  # 0 in [-1, 1] is the middle of [0, 1]
    env.reset()
    env.step(torch.zeros(3, 2, 12))


def test_bad_actions_are_refused_in_one_sentence_and_the_env_goes_on() -> None:
    env = make_vmas_env("balance", 2, seed=0)
    box = make_vmas_env("balance", 2, seed=0, continuous=True)
    with pytest.raises(EnvError, match=r"^the env takes discrete actions 0 to 8, got actions from 0 to 9; give the "
                                       r"agent 9 actions \(the env's action_dim\)$"):
        env.step(torch.tensor([[0, 9, 1], [0, 0, 0]]))
    with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite"):
        env.step(torch.tensor([[0.0, math.nan, 1.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite"):
        box.step(torch.full((2, 3, 2), math.inf))
    with pytest.raises(EnvError, match=r"^expected actions of shape \(2, 3\) \(one per agent of each sub-env\), got a "
                                       r"tensor of shape \(3, 2\)$"):
        env.step(torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(EnvError, match=r"^expected actions of shape \(2, 3, 2\) \(2 values per agent"):
        box.step(torch.zeros(2, 3))
    obs, *_ = env.step(torch.zeros(2, 3, dtype=torch.long))
    assert obs.shape == (2, 3, 16)


@pytest.mark.parametrize("continuous", [False, True])
def test_lists_and_numpy_actions_are_read_and_non_integral_discrete_ones_refused(continuous: bool) -> None:
    """A list, tuple or NumPy array of (N, agents) or (N, agents, action_dim) actions steps as the same tensor would;
    a float discrete action that is not a whole number (0.7) is refused in one sentence (not truncated to an int),
    one that is (1.0) is taken; what is not numbers is refused in one sentence naming what the env takes. Refused
    actions reach no sub-env."""
    env = make_vmas_env("balance", 2, seed=0, continuous=continuous)
    values = [[[0.5, -0.25], [1.0, 0.0], [-1.0, 0.75]], [[0.0, 0.0]] * 3] if continuous else [[0, 3, 8], [4, 2, 0]]
    want = check_list_actions(env, values, lambda: env.reset(seed=3))
    env.reset(seed=3)
    bad: list[Any] = [] if continuous else [torch.full((2, 3), 0.7), [[1.0, 0.5, 0.0], [0.0] * 3],
                                            np.full((2, 3), 0.7)]
    check_refused_actions(env, non_integral=bad, junk=(*JUNK_ACTIONS, [[0], [1, 0]]))
    got = env.step(values)  # the first step after the reset: nothing refused reached a sub-env
    assert_same_step(got, want)


def test_non_finite_rewards_from_the_scenario_are_reported() -> None:
    env = make_vmas_env("navigation", 2, seed=0)
    env.env.scenario.reward = lambda agent: torch.full((2,), math.nan)
    with pytest.raises(EnvError, match=r"^the env returned a non-finite reward; fix the scenario"):
        env.step(torch.zeros(2, 4, dtype=torch.long))


def test_unknown_scenarios_and_unequal_actions_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EnvError, match=r"^unknown VMAS scenario 'no_such_scenario'; choose one of: .*navigation"):
        make_vmas_env("vmas/no_such_scenario", 2)
    with pytest.raises(EnvError, match=r"^the agents of VMAS scenario 'simple_speaker_listener' have different "
                                       r"numbers of discrete actions \(\{'speaker_0': 27, 'listener_0': 9\}\)"):
        make_vmas_env("simple_speaker_listener", 2)
    monkeypatch.setitem(sys.modules, "vmas", None)  # as if it were not installed
    with pytest.raises(EnvError, match=r"^VMAS envs need the vmas package: pip install 'jaderl\[vmas\]'$"):
        make_vmas_env("navigation", 2)


@pytest.mark.parametrize("option", [{"dict_spaces": True}, {"multidiscrete_actions": True},
                                    {"continuous_actions": True}, {"wrapper": "gymnasium"}])
def test_options_of_vmas_make_env_itself_are_refused(option: dict[str, Any]) -> None:
    """Options that would change what VMAS returns (dicts, MultiDiscrete actions, a wrapper) are not the scenario's:
    they are refused in one sentence, not passed on to fail later (or to crash on a MultiDiscrete space)."""
    key = next(iter(option))
    with pytest.raises(EnvError, match=rf"^VMAS option {key} is jaderl's to set \(it reads VMAS's lists of tensors "
                                       r"and its Discrete or Box actions\); remove it, and give continuous=true"):
        make_vmas_env("navigation", 2, **option)


class FakeCudaGenerators:
    """The CUDA generators of two devices as ``torch.cuda`` keeps them (a state per device), without a GPU; the
    ``seeds`` ``torch.manual_seed`` gave them through ``torch.cuda.manual_seed_all``."""

    def __init__(self, value: int) -> None:
        self.states = [torch.tensor([value], dtype=torch.uint8)] * 2
        self.seeds: list[int] = []

    def manual_seed_all(self, seed: int) -> None:
        self.seeds.append(seed)
        self.set_rng_state_all([torch.tensor([seed], dtype=torch.uint8)] * 2)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [state.clone() for state in self.states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self.states = [state.clone() for state in states]

    def values(self) -> list[int]:
        return [int(state.item()) for state in self.states]


def test_seeding_vmas_leaves_the_process_cuda_generators_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """VMAS's seeding calls torch.manual_seed, which reseeds the CUDA generator of every device: once CUDA has
    started (or on a GPU), a seeded VMAS env or reset leaves the process's CUDA generators as they were (also when
    VMAS raises), and VMAS goes on from its own CUDA state, not the process's."""
    cuda = FakeCudaGenerators(7)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("CUDA started for a CPU env"))
    make_vmas_env("navigation", 2, seed=5).close()  # on the CPU, before CUDA started: CUDA is left unstarted
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # CUDA started in this process
    for name in ("manual_seed_all", "get_rng_state_all", "set_rng_state_all"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setattr(jaderl.envs.vmas, "VMAS_CUDA_STATES", [])
    env = make_vmas_env("navigation", 2, seed=5)
    assert cuda.seeds == [5] and cuda.values() == [7, 7]  # VMAS reseeded the CUDA generators; they are back
    env.reset(seed=3)
    assert cuda.seeds == [5, 3] and cuda.values() == [7, 7]
    seen: list[list[int]] = []
    vmas_step = env.env.step

    def step(actions: list[torch.Tensor]) -> Any:
        seen.append(cuda.values())
        return vmas_step(actions)

    monkeypatch.setattr(env.env, "step", step)
    cuda.set_rng_state_all([torch.tensor([9], dtype=torch.uint8)] * 2)  # the process draws from its own streams
    env.step(torch.zeros(2, 4, dtype=torch.long))
    assert seen == [[3, 3]] and cuda.values() == [9, 9]  # VMAS steps from the state its seeded reset left

    def failing_reset(**kwargs: Any) -> Any:
        torch.manual_seed(11)
        raise RuntimeError("the scenario failed")

    monkeypatch.setattr(env.env, "reset", failing_reset)
    with pytest.raises(RuntimeError, match="the scenario failed"):
        env.reset(seed=11)
    assert cuda.seeds[-1] == 11 and cuda.values() == [9, 9]
