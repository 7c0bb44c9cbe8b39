"""Multi-agent learning where agents leave an episode before it ends (PettingZoo): the env tells which agents are in
the episode, ``explore`` records it, and every algorithm learns from the agents present only."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

import gymnasium as gym
from pettingzoo import ParallelEnv

from jaderl.algos.ppo import explained_variance
from jaderl.api import ALGOS, make_config, train
from jaderl.core.buffers import ReplayBuffer, RolloutBuffer
from jaderl.envs import REGISTERED_ENVS, make_env
from jaderl.envs.pettingzoo import make_pettingzoo_env

ENV = "test/leaving"
LEAVE, LENGTH = 2, 4  # agent_1 leaves after 2 steps; the episode is truncated after 4


class LeavingEnv(ParallelEnv):
    """Agents ``agent_0 .. agent_2`` observing ``[t, index, last action]``; with ``leave``, ``agent_1`` leaves
    (terminated) after ``LEAVE`` steps; every agent still in is truncated after ``LENGTH`` (a time limit, as MPE2's
    ``max_cycles``). Each agent present gets reward ``index + 1 + action`` a step."""

    metadata: ClassVar[dict[str, Any]] = {"name": "leaving_v0"}

    def __init__(self, leave: bool = True, continuous: bool = False, leave_at: int = LEAVE) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(3)]
        self.leave, self.continuous, self.leave_at = leave, continuous, leave_at
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if self.continuous else gym.spaces.Discrete(3)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.array([0, i, 0], np.float32) for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), f"actions for {set(actions)}, but {self.agents} are in"
        self.t += 1
        index = {a: self.possible_agents.index(a) for a in self.agents}
        act = {a: float(np.asarray(actions[a]).reshape(-1)[0]) for a in self.agents}
        obs = {a: np.array([self.t, index[a], act[a]], np.float32) for a in self.agents}
        rewards = {a: index[a] + 1.0 + act[a] for a in self.agents}
        terminations = {a: self.leave and a == "agent_1" and self.t >= self.leave_at for a in self.agents}
        truncations = {a: self.t >= LENGTH for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return obs, rewards, terminations, truncations, {a: {} for a in obs}


@pytest.fixture
def leaving_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """The id ``test/leaving`` (``?continuous`` is not an option of registered ids: ``test/leaving_continuous``)."""
    for name, continuous in ((ENV, False), (ENV + "_continuous", True)):
        monkeypatch.setitem(REGISTERED_ENVS, name, lambda n, device, seed, c=continuous: make_pettingzoo_env(
            LeavingEnv, n, device, seed=seed, continuous=c))
    return ENV


def present(step: int) -> list[bool]:
    """The agents in the episode after ``step`` steps of it (before a reset)."""
    if step >= LENGTH:
        return [False] * 3
    return [True, step < LEAVE, True]


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("workers", [0, 1])
def test_the_env_tells_which_agents_are_in_the_episode(workers: int) -> None:
    env = make_pettingzoo_env(LeavingEnv, 2, workers=workers)
    try:
        assert env.spec.agents_leave and not make_env("jaderl/simple_spread", 1).spec.agents_leave
        env.reset(seed=0)
        assert env.active_agents().dtype == torch.bool and env.active_agents().all()
        for step in range(1, 2 * LENGTH + 1):
            _, _, _, _, info = env.step(torch.zeros(2, 3, dtype=torch.long))
            in_episode = (step - 1) % LENGTH + 1
            last = present(in_episode if in_episode < LENGTH else in_episode - 1)  # an end: its last step's agents
            assert info["final_active"].tolist() == [last] * 2, step
            now = present(in_episode) if in_episode < LENGTH else [True] * 3  # a new episode has every agent
            assert env.active_agents().tolist() == [now] * 2, step
    finally:
        env.close()


def make_agent(algo: str, env: str, **settings: Any) -> Any:
    small = {"hidden": [16, 16], "device": "cpu", "num_envs": 2, "seed": 0}
    if algo in ("mappo", "ippo"):
        small |= {"horizon": 6, "minibatch_size": 4}
    config = make_config(algo, env, **(small | settings))
    torch.manual_seed(0)
    return ALGOS[algo].agent_cls(config, make_env(env, 2, "cpu", seed=0).spec, torch.device("cpu"))


def explored(agent: Any, env_id: str, steps: int) -> dict[str, torch.Tensor]:
    """What ``agent`` records exploring 2 sub-envs of ``env_id`` (seed 0) for ``steps`` steps."""
    env = make_env(env_id, 2, "cpu", seed=0)
    try:
        return agent.explore(env, steps)
    finally:
        env.close()


def test_explore_records_the_agents_present(leaving_env: str) -> None:
    agent = make_agent("ippo", leaving_env)
    traj = explored(agent, leaving_env, 2 * LENGTH)
    assert traj["active"].shape == traj["next_active"].shape == (2 * LENGTH, 2, 3)
    for t in range(2 * LENGTH):
        step = t % LENGTH + 1  # the step of the episode that t takes
        assert traj["active"][t].tolist() == [present(step - 1)] * 2, t
        # at the episode's end (a time limit) the agents of its last step: the truncation decides their bootstrap
        assert traj["next_active"][t].tolist() == [present(step if step < LENGTH else step - 1)] * 2, t
    spread = make_env("jaderl/simple_spread", 2, "cpu", seed=0)
    assert "active" not in make_agent("mappo", "jaderl/simple_spread").explore(spread, 2)  # no agent ever leaves


def test_ippo_ends_the_returns_of_an_agent_that_leaves(leaving_env: str) -> None:
    """agent_1's last step (the 2nd of each episode) does not bootstrap from the zeros it observes after it: its value
    target there is its reward; the agents that stay bootstrap (gamma > 0, values != 0)."""
    agent = make_agent("ippo", leaving_env, gamma=0.9, gae_lambda=1.0)
    data = explored(agent, leaving_env, LENGTH)
    with torch.no_grad():
        _, target, _ = agent.returns(data)
    assert torch.allclose(target[LEAVE - 1, :, 1], data["reward"][LEAVE - 1, :, 1])
    assert not torch.allclose(target[LEAVE - 1, :, 0], data["reward"][LEAVE - 1, :, 0])


@pytest.mark.parametrize("algo", ["ippo", "qmix", "maddpg"])
def test_an_agent_that_terminates_as_the_others_are_truncated_ends_its_returns_alone(leaving_env: str,
                                                                                     algo: str) -> None:
    """agent_1 terminates on the step that truncates the others: the sub-env is truncated, not terminated, and only
    agent_1 is out of ``final_active``, so the others bootstrap past the time limit and agent_1 does not."""
    continuous = algo == "maddpg"
    env = make_pettingzoo_env(LeavingEnv, 2, seed=0, continuous=continuous, leave_at=LENGTH)
    agent = make_agent(algo, leaving_env + ("_continuous" if continuous else ""), gamma=0.9,
                       **({"gae_lambda": 1.0, "bootstrap_truncated": True} if algo == "ippo" else {}))
    try:
        data = agent.explore(env, LENGTH)
    finally:
        env.close()
    last = LENGTH - 1
    assert not data["terminated"][last].any() and data["truncated"][last].all()
    assert data["next_active"][last].tolist() == [[True, False, True]] * 2
    batch = {k: v[last] for k, v in data.items()} | {"discount": torch.full((2,), 0.9)}  # the last step's
    if algo == "qmix":  # a next value of 0 mixed for agent_1 only: the target moves with the others' next values
        with torch.no_grad():
            base = agent.q_loss(batch)[0]
            for index, moves in ((1, False), (0, True)):
                next_obs = batch["next_obs"].clone()
                next_obs[:, index] += 3.0
                assert (not torch.allclose(base, agent.q_loss(batch | {"next_obs": next_obs})[0])) == moves, index
        return
    with torch.no_grad():  # each agent's own value target at the last step (N, agents)
        target = agent.returns(data)[1][last] if algo == "ippo" else agent.td_target(batch)
    assert torch.allclose(target[:, 1], data["reward"][last, :, 1])  # agent_1: its reward, no more
    assert not torch.allclose(target[:, 0], data["reward"][last, :, 0])  # agent_0 bootstraps


def test_ippos_explained_variance_counts_the_agents_present_only(leaving_env: str) -> None:
    """The critic's explained variance (a reported statistic) is that of the agents in the episode: the zero
    observations of an agent that has left are no part of it."""
    agent = make_agent("ippo", leaving_env)
    data = explored(agent, leaving_env, 2 * LENGTH)
    with torch.no_grad():
        _, target, value = agent.returns(data)
    active = data["active"]
    assert not active.all()
    buffer = RolloutBuffer()
    buffer.add(data)
    stats = agent.update(buffer)
    expected = explained_variance(value[active], target[active])
    torch.testing.assert_close(stats["policy/explained_variance"], expected)
    assert not torch.allclose(expected, explained_variance(value, target))


def perturb_absent(batch: dict[str, torch.Tensor], continuous: bool) -> dict[str, torch.Tensor]:
    """``batch`` with what the agents absent do changed: their observations, actions, old log-probabilities,
    advantages and value targets at ``obs`` (``active`` false) and their next observations where they have left
    (``next_active`` false). (Their rewards are 0, as the env gives them.)"""
    out = dict(batch)
    gone, next_gone = ~batch["active"], ~batch["next_active"]
    g = torch.Generator().manual_seed(1)

    def noise(x: torch.Tensor) -> torch.Tensor:
        return torch.randn(x.shape, generator=g) * 5

    out["obs"] = torch.where(gone[..., None], noise(batch["obs"]), batch["obs"])
    out["next_obs"] = torch.where(next_gone[..., None], noise(batch["next_obs"]), batch["next_obs"])
    if continuous:
        out["action"] = torch.where(gone[..., None], noise(batch["action"]).clamp(-1, 1), batch["action"])
    else:
        out["action"] = torch.where(gone, (batch["action"] + 1) % 3, batch["action"])
    if "log_prob" in batch:
        out["log_prob"] = torch.where(gone, noise(batch["log_prob"]), batch["log_prob"])
    for key in ("advantage", "value_target"):
        if key in batch and batch[key].shape[-1] == 3:  # IPPO's per agent ones
            out[key] = torch.where(gone, noise(batch[key]), batch[key])
    return out


def losses(agent: Any, batch: dict[str, torch.Tensor], algo: str) -> list[torch.Tensor]:
    """The algorithm's losses on ``batch`` and their gradients, the random draws the same each call."""
    torch.manual_seed(3)
    if algo in ("mappo", "ippo"):
        out = [agent.minibatch_loss(batch)[0]]
        params = [*agent.actor.parameters(), *agent.critic.parameters()]
    elif algo in ("qmix", "vdn", "iql"):
        out = [agent.q_loss(batch)[0]]
        params = list(agent.q_net.parameters())
    else:
        agent.replayed = batch
        out = [agent.critic_loss(agent.features(batch["obs"]), batch)[0],
               agent.actor_loss(agent.features(batch["obs"]))]
        params = [*agent.actor.parameters(), *agent.critic.parameters()]
    grads = torch.autograd.grad(sum(out), params, allow_unused=True)
    return out + [g for g in grads if g is not None]


@pytest.mark.parametrize("algo", ["mappo", "ippo", "qmix", "vdn", "iql", "maddpg", "matd3"])
def test_the_agents_absent_take_no_part_in_learning(leaving_env: str, algo: str) -> None:
    """Changing what an agent that is not in the episode does (what it observes, its action) changes no loss and no
    gradient; counted as present, the same change does."""
    continuous = algo in ("maddpg", "matd3")
    env_id = leaving_env + ("_continuous" if continuous else "")
    agent = make_agent(algo, env_id)
    traj = explored(agent, env_id, 2 * LENGTH)
    batch = {k: v.flatten(0, 1) for k, v in traj.items()}  # (T * N, ...)
    if algo in ("mappo", "ippo"):
        batch["log_prob"] = torch.randn(batch["reward"].shape)
        width = 1 if algo == "mappo" else 3
        batch["advantage"], batch["value_target"] = torch.randn(2, batch["reward"].shape[0], width)
    else:
        batch["discount"] = torch.full(batch["terminated"].shape, 0.9)
    assert not batch["active"].all() and batch["active"].any()
    before = losses(agent, batch, algo)
    after = losses(agent, perturb_absent(batch, continuous), algo)
    for x, y in zip(before, after, strict=True):
        assert torch.allclose(x, y, atol=1e-6), algo
    everyone = {"active": torch.ones_like(batch["active"]), "next_active": torch.ones_like(batch["next_active"])}
    before = losses(agent, batch | everyone, algo)  # the same change, every agent counted as present
    after = losses(agent, perturb_absent(batch, continuous) | everyone, algo)
    assert any(not torch.allclose(x, y, atol=1e-6) for x, y in zip(before, after, strict=True)), algo


def test_n_step_transitions_take_next_active_from_their_last_step() -> None:
    buffer = ReplayBuffer(capacity=8, num_envs=1, device="cpu")
    active = torch.tensor([[[True, True]], [[True, True]], [[True, False]]])  # the second agent leaves at step 1
    buffer.add({"obs": torch.zeros(3, 1, 2), "next_obs": torch.arange(3.0).view(3, 1, 1).expand(3, 1, 2),
                "reward": torch.ones(3, 1, 2), "terminated": torch.zeros(3, 1, dtype=torch.bool),
                "truncated": torch.zeros(3, 1, dtype=torch.bool), "active": active,
                "next_active": torch.cat([active[1:], active[-1:]])})
    batch = buffer.gather(torch.tensor([0]), n_step=2, gamma=0.5)
    assert batch["next_active"].tolist() == [[True, False]]  # that of step 1, the transition's last
    assert batch["next_obs"].tolist() == [[1.0, 1.0]]


@pytest.mark.parametrize("algo", ["ippo", "mappo", "qmix", "iql", "maddpg", "matd3"])
def test_every_algorithm_trains_where_agents_leave(leaving_env: str, algo: str, tmp_path: Any) -> None:
    """A short run of each algorithm trains, evaluates and reports finite returns."""
    env_id = leaving_env + ("_continuous" if algo in ("maddpg", "matd3") else "")
    settings: dict[str, Any] = {"hidden": [16, 16], "num_envs": 4, "total_steps": 400, "eval_every": 200,
                                "eval_episodes": 2, "run_dir": str(tmp_path / algo), "seed": 0, "num_threads": 1}
    if algo in ("ippo", "mappo"):
        settings |= {"horizon": 8, "minibatch_size": 8}
    else:
        settings |= {"warmup_steps": 40, "batch_size": 16}
    result = train(algo, env_id, **settings)
    assert math.isfinite(result.best_eval_return) and result.steps >= 400


def test_a_replay_buffer_restored_without_active_counts_every_agent_present_there() -> None:
    """Rows restored from a checkpoint written before ``active`` was recorded take the new fields when they first
    come: flags true in the old rows (every agent present, as those rows were learned from), the new rows as given."""
    old = ReplayBuffer(capacity=8, num_envs=1, device="cpu")
    flags = torch.zeros(2, 1, dtype=torch.bool)
    step = {"obs": torch.zeros(2, 1, 2), "reward": torch.ones(2, 1, 2), "terminated": flags, "truncated": flags}
    old.add(step)
    buffer = ReplayBuffer(capacity=8, num_envs=1, device="cpu")
    buffer.load_state_dict(*old.state_dict())
    gone = torch.tensor([[[True, False]]] * 2)
    buffer.add(step | {"active": gone, "next_active": gone, "log_prob": torch.ones(2, 1, 2)})
    assert buffer.data["active"][:4, 0].tolist() == [[True, True]] * 2 + [[True, False]] * 2
    assert buffer.data["next_active"][:2].all() and buffer.data["log_prob"][:2].eq(0).all()  # numbers: zeros
    assert not buffer.data["terminated"][:4].any()  # fields they had are as they were
