"""Learning from the agents present where agents may leave (PettingZoo), against the same learning without the flags:
time limits still bootstrap, and every statistic and penalty takes the agents present as it takes all of them
where no agent leaves."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("pettingzoo")

from jaderl.api import ALGOS, make_config
from jaderl.envs import REGISTERED_ENVS, make_env
from jaderl.envs.pettingzoo import make_pettingzoo_env
from tests.marl.test_leaving_agents import LENGTH, LeavingEnv

FLAGS = ("active", "next_active")


@pytest.fixture(autouse=True)
def presence_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``presence/leaving`` (agent_1 leaves early) and ``presence/staying`` (no agent leaves before the time limit),
    each also ``_continuous``."""
    for leave in (True, False):
        for continuous in (False, True):
            name = f"presence/{'leaving' if leave else 'staying'}{'_continuous' if continuous else ''}"
            monkeypatch.setitem(REGISTERED_ENVS, name, lambda n, device, seed, lv=leave, c=continuous:
                                make_pettingzoo_env(LeavingEnv, n, device, seed=seed, leave=lv, continuous=c))


def make_agent(algo: str, env: str, **settings: Any) -> Any:
    small = {"hidden": [16, 16], "device": "cpu", "num_envs": 2, "seed": 0, "normalize_obs": False}
    if algo in ("mappo", "ippo"):
        small |= {"horizon": 6, "minibatch_size": 4}
    config = make_config(algo, env, **(small | settings))
    torch.manual_seed(0)
    agent = ALGOS[algo].agent_cls(config, make_env(env, 2, "cpu", seed=0).spec, torch.device("cpu"))
    with torch.no_grad():  # targets unlike the online networks, so that every part of the target shows
        for net in [getattr(agent, n) for n in ("q_target", "critic_target", "actor_target") if hasattr(agent, n)]:
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    return agent


def explore(agent: Any, env_id: str, steps: int) -> dict[str, torch.Tensor]:
    env = make_env(env_id, 2, "cpu", seed=0)
    try:
        return agent.explore(env, steps)
    finally:
        env.close()


def off_policy_losses(agent: Any, algo: str, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The algorithm's losses (and TD errors) on ``batch``, the random draws the same each call."""
    torch.manual_seed(3)
    if algo in ("qmix", "vdn", "iql"):
        loss, _, td_error = agent.q_loss(batch)
        return [loss, td_error]
    agent.replayed = batch
    loss, _, td_error = agent.critic_loss(agent.features(batch["obs"]), batch)
    return [loss, td_error, agent.actor_loss(agent.features(batch["obs"]))]


# -- 1. a time limit no longer bootstraps in the off-policy algorithms ----------------------------------------------


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("algo", ["qmix", "vdn", "iql", "maddpg", "matd3"])
def test_a_pettingzoo_env_whose_agents_never_leave_learns_as_without_the_flags(algo: str, n_step: int) -> None:
    """On a PettingZoo env where every agent stays until the time limit, recording ``active`` / ``next_active``
    must change nothing: every agent is present at every step. It does change the targets of the steps that the
    time limit truncates: ``info["final_active"]`` is all false when the episode ended, so ``next_q * next_active``
    drops the bootstrap of every agent there, which only ``terminated`` may do (module docstrings: "only
    ``terminated`` stops the bootstrap"). Every PettingZoo episode that ends at ``max_cycles`` is hit."""
    continuous = algo in ("maddpg", "matd3")
    env_id = "presence/staying" + ("_continuous" if continuous else "")
    agent = make_agent(algo, env_id, n_step=n_step)
    traj = explore(agent, env_id, 2 * LENGTH)
    assert traj["active"].all() and traj["truncated"].any() and not traj["terminated"].any()
    buffer = agent.make_buffer()
    buffer.add(traj)
    batch = buffer.gather(torch.arange(len(buffer)), n_step, agent.config.gamma)
    with_flags = off_policy_losses(agent, algo, batch)
    without = off_policy_losses(agent, algo, {k: v for k, v in batch.items() if k not in FLAGS})
    for x, y in zip(with_flags, without, strict=True):
        torch.testing.assert_close(x, y, msg=f"{algo}: the flags of agents that are all present change the losses")


@pytest.mark.parametrize("algo", ["vdn", "iql"])
def test_the_agents_present_at_a_time_limit_bootstrap(algo: str) -> None:
    """Where agent_1 has left earlier, the agents still in at the time limit (agent_0, agent_2) must still bootstrap
    there: their targets are r + gamma * Q_target(next), not r."""
    agent = make_agent(algo, "presence/leaving")
    traj = explore(agent, "presence/leaving", LENGTH)
    last = {k: v[LENGTH - 1] for k, v in traj.items()}  # the truncated step of both sub-envs, (N, ...)
    assert last["truncated"].all() and not last["terminated"].any()
    assert last["active"].tolist() == [[True, False, True]] * 2
    batch = last | {"discount": torch.full((2,), agent.config.gamma)}
    with torch.no_grad():
        next_obs = agent.features(batch["next_obs"])
        next_q = agent.q_target(next_obs).gather(-1, agent.q_net(next_obs).argmax(-1, keepdim=True)).squeeze(-1)
        next_q = next_q * batch["active"]  # agent_1 has left: no value; agent_0 and agent_2 are cut by the time limit
        q = agent.q_net(agent.features(batch["obs"])).gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
        q = q * batch["active"]
        if algo == "vdn":
            expected = (q.sum(-1) - (batch["reward"].sum(-1) + agent.config.gamma * next_q.sum(-1))).abs()
        else:  # IQL's TD error: |q - y| averaged over the agents present
            expected = ((q - (batch["reward"] + agent.config.gamma * next_q)).abs() * batch["active"]).sum(-1) / 2
        _, _, td_error = agent.q_loss(batch)
    torch.testing.assert_close(td_error.abs(), expected)


# -- 2. MADDPG's logit penalty (discrete actions) reads the agents that have left ------------------------------------


def test_maddpg_logit_penalty_leaves_out_the_agents_absent() -> None:
    """The docs: the values and actor objective of agents that have left are left out of the losses. With discrete
    actions the actor's loss adds ``actor_reg * mean(logits^2)`` over every agent, so the logits of an agent that has
    left (read from the zeros it observes) still enter the actor's loss and gradient."""
    agent = make_agent("maddpg", "presence/leaving", actor_reg=1.0)
    traj = explore(agent, "presence/leaving", 2 * LENGTH)
    batch = {k: v.flatten(0, 1) for k, v in traj.items()}
    assert not batch["active"].all()
    gone = ~batch["active"]
    moved = dict(batch, obs=torch.where(gone[..., None], batch["obs"] + 5.0, batch["obs"]))

    def actor_loss(b: dict[str, torch.Tensor]) -> torch.Tensor:
        torch.manual_seed(3)
        agent.replayed = b
        return agent.actor_loss(agent.features(b["obs"]))

    torch.testing.assert_close(actor_loss(batch), actor_loss(moved))


# -- 3. IPPO's advantages are standardised differently once the flags are recorded -----------------------------------


def test_ippo_standardises_advantages_as_without_the_flags_when_every_agent_is_present() -> None:
    """With every agent present, ``active`` all true must not change IPPO's loss; but the masked standardisation
    divides by the population standard deviation (a mean of squares over n) where the unmasked one divides by
    ``adv.std()`` (n - 1): the advantages of a PettingZoo env are scaled by sqrt((n - 1) / n) more than elsewhere."""
    agent = make_agent("ippo", "presence/staying")
    traj = explore(agent, "presence/staying", 2 * LENGTH)
    batch = {k: v.flatten(0, 1)[:4] for k, v in traj.items()}
    g = torch.Generator().manual_seed(0)
    batch["log_prob"] = torch.randn(batch["reward"].shape, generator=g)
    batch["advantage"], batch["value_target"] = torch.randn(2, 4, 3, generator=g)
    assert batch["active"].all()
    with_flags = agent.minibatch_loss(batch)[0]
    without = agent.minibatch_loss({k: v for k, v in batch.items() if k not in FLAGS})[0]
    torch.testing.assert_close(with_flags, without)


# -- 4. the reward normaliser still counts the agents that have left -------------------------------------------------


@pytest.mark.parametrize("algo", ["ippo", "mappo"])
def test_the_reward_normaliser_takes_the_returns_of_the_agents_present_only(algo: str) -> None:
    """``normalize_reward``: the running returns of an agent that has left (decaying by gamma with the 0 rewards it
    gets) enter the return statistics as the present agents' do, so the more agents leave, the smaller the variance
    and the larger every reward is scaled; the observation and value normalisers already take the agents present only
    (``present_obs``, ``target[active]``)."""
    agent = make_agent(algo, "presence/leaving", normalize_reward=True)
    data = explore(agent, "presence/leaving", 2 * LENGTH)
    assert not data["active"].all()
    agent.begin_update(data)
    assert int(agent.reward_norm.count) == int(data["active"].sum())
