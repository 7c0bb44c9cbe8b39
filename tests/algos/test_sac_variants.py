"""SAC options checked against plain reference code: the REDQ target, ensemble reduction and ModSAC's schedule."""

from __future__ import annotations

import math

import pytest
import torch

from jaderl.algos import SAC
from jaderl.api import make_config
from jaderl.core.config import ConfigError
from jaderl.envs import make_env


def _agent(algo: str, **settings: object) -> tuple[SAC, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = make_config(algo, "jaderl/Pendulum-v1", hidden=[16, 16], warmup_steps=0, batch_size=8, buffer_size=64,
                         zoo=False, **settings)  # the presets as registered, not the zoo's settings
    env = make_env(config.env, 4, "cpu", seed=0)
    agent = SAC(config, env, torch.device("cpu"))
    with torch.no_grad():  # target critics that differ from each other and from the online ones
        for p in agent.critic_target.parameters():
            p.add_(0.5 * torch.randn_like(p))
    buffer = agent.make_buffer()
    buffer.add(agent.explore(env, 8))
    return agent, buffer.sample(8, 1, config.gamma)


def test_redq_target_is_min_over_a_random_pair_of_target_critics() -> None:
    agent, batch = _agent("redq")
    assert agent.critic.num == 10
    alpha = torch.tensor(0.3)
    torch.manual_seed(7)
    target = agent.td_target(batch, alpha)
    torch.manual_seed(7)  # the reference draws the same noise and subset, in the same order, with plain code
    with torch.no_grad():
        next_action, next_log_prob = agent.actor.sample(batch["next_obs"])
        subset = torch.randperm(10)[:2].tolist()
        x = torch.cat([batch["next_obs"], next_action], -1)
        per_member = []
        for i in range(10):
            h = x
            for j, layer in enumerate(agent.critic_target.layers):
                h = h @ layer.weight[i] + layer.bias[i, 0]
                if j < len(agent.critic_target.layers) - 1:
                    h = torch.relu(h)
            per_member.append(h.squeeze(-1))
    for b in range(8):
        soft = min(float(per_member[i][b]) for i in subset) - 0.3 * float(next_log_prob[b])
        expected = float(batch["reward"][b]) + agent.config.gamma * (not bool(batch["terminated"][b])) * soft
        assert float(target[b]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("reduce", ["min", "mean"])
def test_actor_objective_reduces_the_ensemble_as_configured(reduce: str, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, batch = _agent("sac", num_critics=3, actor_reduce=reduce)
    seen: list[torch.Tensor] = []
    original = agent.optimize

    def spy(optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: object = None) -> None:
        if optimizer is agent.actor_optimizer:
            seen.append(loss.detach())
        original(optimizer, loss, params)

    monkeypatch.setattr(agent, "optimize", spy)
    torch.manual_seed(3)
    agent.update_once(batch)
    # recompute the actor loss with the networks as they were: the critic has stepped, the actor not yet
    torch.manual_seed(3)
    agent2, _ = _agent("sac", num_critics=3, actor_reduce=reduce)
    agent2.critic.load_state_dict(agent.critic.state_dict())
    torch.manual_seed(3)
    agent2.td_target(batch, agent2.alpha())  # consume the same random numbers as update_once did
    action, log_prob = agent2.actor.sample(batch["obs"])
    q = agent2.critic(batch["obs"], action)
    value = q.min(0).values if reduce == "min" else q.mean(0)
    expected = (agent2.alpha() * log_prob - value).mean()
    assert seen and seen[0].item() == pytest.approx(expected.item(), rel=1e-4)


def test_modsac_updates_the_actor_every_step_when_critics_fit_and_every_other_when_not() -> None:
    agent, batch = _agent("modsac")
    agent.critic_loss_avg = 0.0  # lambda = 1: threshold 1 / (2 - 1) = 1
    for _ in range(6):
        agent.update_once(batch)
    assert (agent.critic_updates, agent.actor_updates) == (6, 6)
    agent, batch = _agent("modsac")
    agent.critic_loss_avg = 100.0  # lambda ~ 0: threshold 1 / 2
    for _ in range(6):
        agent.update_once(batch)
    assert (agent.critic_updates, agent.actor_updates) == (6, 3)


def test_modsac_starts_with_the_actor_on_two_of_three_critic_steps() -> None:
    """Before any critic loss is known, c = sqrt(ln 2): lambda = 1/2 and a threshold of 1 / (2 - 1/2) = 2/3."""
    agent, batch = _agent("modsac")
    c = agent.state_dict()["running_stats"]["critic_loss_ema"]
    assert c.item() == pytest.approx(math.sqrt(math.log(2.0)))
    agent.critic_loss_avg = c.item()  # what update() takes before its gradient steps
    for _ in range(6):
        agent.update_once(batch)
    assert (agent.critic_updates, agent.actor_updates) == (6, 4)


def test_plain_sac_updates_the_actor_every_step() -> None:
    agent, batch = _agent("sac")
    agent.critic_loss_avg = 100.0
    for _ in range(4):
        agent.update_once(batch)
    assert (agent.critic_updates, agent.actor_updates) == (4, 4)


def test_redq_steps_the_actor_once_per_env_step() -> None:
    """REDQ's Algorithm 1: G = 20 critic steps, then one actor (and alpha) step, per env step."""
    agent, _ = _agent("redq")
    assert (agent.config.updates_per_step, agent.config.actor_every) == (20.0, 20)
    buffer = agent.make_buffer()
    env = make_env(agent.config.env, 4, "cpu", seed=1)
    buffer.add(agent.explore(env, 2))  # a batch's worth of transitions
    buffer.add(agent.explore(env, agent.config.horizon))  # 4 env steps: 80 critic steps owed
    actor_before = [p.detach().clone() for p in agent.actor.parameters()]
    agent.update(buffer)
    assert (agent.critic_updates, agent.actor_updates) == (80, 4)
    assert all(not torch.equal(p, q) for p, q in zip(agent.actor.parameters(), actor_before, strict=True))


def test_actor_every_skips_the_actor_and_alpha_in_between() -> None:
    agent, batch = _agent("sac", actor_every=3)
    snapshots = []
    for _ in range(6):
        agent.update_once(batch)
        snapshots.append(([p.detach().clone() for p in agent.actor.parameters()],
                          agent.alpha.log_alpha.detach().clone()))
    assert (agent.critic_updates, agent.actor_updates) == (6, 2)
    changed = [not torch.equal(snapshots[k][1], snapshots[k - 1][1]) for k in range(1, 6)]
    assert changed == [False, True, False, False, True]  # alpha moves on critic steps 3 and 6 only
    assert all(torch.equal(p, q) for p, q in zip(snapshots[3][0], snapshots[4][0], strict=True))
    with pytest.raises(ConfigError, match="modsac=true schedules the actor"):
        make_config("modsac", "jaderl/Pendulum-v1", actor_every=2)


@pytest.mark.parametrize(("settings", "field"), [({"actor_reduce": "max"}, "actor_reduce"),
                                                 ({"num_critics": 2, "num_target_critics": 3}, "num_target_critics")])
def test_invalid_ensemble_settings_are_rejected(settings: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        make_config("sac", "jaderl/Pendulum-v1", **settings)


def test_modsac_running_critic_loss_survives_a_checkpoint(tmp_path) -> None:
    import jaderl
    from jaderl.core.checkpoint import load_checkpoint

    jaderl.train("modsac", "jaderl/Pendulum-v1", total_steps=400, warmup_steps=200, hidden=[16, 16], eval_every=400,
                 eval_episodes=1, run_dir=str(tmp_path / "run"), device="cpu")
    saved = load_checkpoint(tmp_path / "run")["agent"]["running_stats"]["critic_loss_ema"]
    resumed = jaderl.load(tmp_path / "run", best=False)
    assert saved > 0 and torch.equal(resumed._critic_loss_ema, saved)
