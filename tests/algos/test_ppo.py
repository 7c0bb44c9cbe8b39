"""PPO's update against a plain reference: per-env GAE loops, torch.distributions and a hand-written minibatch loop,
with each option (learning-rate annealing, value clipping, KL early stopping) on its own; explained variance by hand;
and an update that reads nothing back from the device unless ``target_kl`` asks it to."""

from __future__ import annotations

import copy
import statistics
from typing import Any

import pytest
import torch

from jaderl.algos.ppo import PPO, PPOConfig, explained_variance
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.config import ConfigError
from jaderl.envs import EnvSpec, make_env


def reference_gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor,
                  truncated: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Backwards over each env separately; an episode end cuts the sum, only a termination drops V(s')."""
    T, N = reward.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n] or truncated[t, n]:
                running = 0.0
            bootstrap = 0.0 if terminated[t, n] else gamma * float(next_value[t, n])
            delta = float(reward[t, n]) + bootstrap - float(value[t, n])
            running = delta + gamma * lam * running
            adv[t, n] = running
    return adv.float()


def reference_update(agent: PPO, rollout: dict[str, torch.Tensor], lr: float, clip_value: float = 0.0,
                     target_kl: float | None = None) -> dict[str, Any]:
    """One PPO update in plain torch on copies of ``agent``'s networks, normaliser and Adam state: SB3's value
    clipping (V_old + clip(V - V_old, -c, c) in the squared error) and SB3's KL stop (a minibatch whose approximate KL
    exceeds 1.5 target_kl ends the update before its step). Returns the trained parameters and what happened."""
    config = agent.config
    actor, critic, norm = copy.deepcopy(agent.actor), copy.deepcopy(agent.critic), copy.deepcopy(agent.obs_norm)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr, eps=1e-5)
    optimizer.load_state_dict(copy.deepcopy(agent.optimizer.state_dict()))
    for group in optimizer.param_groups:  # the loaded state holds the learning rate of the previous update
        group["lr"] = lr

    def policy(x: torch.Tensor) -> torch.distributions.Distribution:
        if agent.is_discrete:
            return torch.distributions.Categorical(logits=actor.net(x))
        return torch.distributions.Independent(torch.distributions.Normal(actor.net(x), actor.log_std.exp()), 1)

    def normalize(o: torch.Tensor) -> torch.Tensor:  # the statistics the rollout was collected with
        return ((o - norm.mean) / (norm.var + 1e-8).sqrt()).clamp(-10, 10)

    with torch.no_grad():
        obs, next_obs = normalize(rollout["obs"]), normalize(rollout["next_obs"])
        value, next_value = critic(obs).squeeze(-1), critic(next_obs).squeeze(-1)
        old_log_prob = policy(obs).log_prob(rollout["action"])
    advantage = reference_gae(rollout["reward"], value, next_value, rollout["terminated"], rollout["truncated"],
                              config.gamma, config.gae_lambda)
    target = advantage + value
    result = {"params": params, "advantage": advantage, "value": value, "target": target, "epochs": 0, "steps": 0,
              "values_clipped": 0, "values_free": 0}
    flat = [x.flatten(0, 1) for x in (obs, rollout["action"], old_log_prob, value, advantage, target)]
    size, batch = flat[0].shape[0], config.minibatch_size
    for _ in range(config.num_epochs):
        result["epochs"] += 1
        perm = torch.randperm(size)
        for start in range(0, size - batch + 1, batch):  # the remainder is left out
            o, a, old, old_value, adv, ret = (x[perm[start:start + batch]] for x in flat)
            dist = policy(o)
            log_ratio = dist.log_prob(a) - old
            ratio = log_ratio.exp()
            if target_kl is not None and ((ratio - 1) - log_ratio).mean() > 1.5 * target_kl:
                return result  # no step on this minibatch, and no more epochs
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
            new_value = critic(o).squeeze(-1)
            if clip_value > 0:
                clipped = old_value + (new_value - old_value).clamp(-clip_value, clip_value)
                moved_too_far = (new_value - old_value).abs() > clip_value
                result["values_clipped"] += int(moved_too_far.sum())
                result["values_free"] += int((~moved_too_far).sum())
                new_value = clipped
            value_loss = (new_value - ret).square().mean()
            loss = policy_loss + 0.5 * value_loss - config.ent_coef * dist.entropy().mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            optimizer.step()
            result["steps"] += 1
    return result


def warmed_up_agent(env_id: str, **options: Any) -> tuple[PPO, Any, RolloutBuffer]:
    """A PPO agent after two iterations on 4 sub-envs (observation statistics and Adam moments that are not at their
    initial values), its env and its buffer; rollouts are 4 x 50 = 200 steps."""
    n, horizon = 4, 50
    env = make_env(env_id, n, "cpu", seed=0)
    config = PPOConfig(env=env_id, num_envs=n, horizon=horizon, minibatch_size=64, num_epochs=3, hidden=[16],
                       normalize_obs=True, device="cpu", ent_coef=0.01, gamma=0.9, gae_lambda=0.8, reward_scale=0.5,
                       lr=0.01, **options)  # large steps, so that the clipping matters
    torch.manual_seed(0)
    agent = PPO(config, env, torch.device("cpu"))
    buffer = RolloutBuffer()
    for _ in range(2):
        buffer.add(agent.explore(env, horizon))
        agent.update(buffer)
    return agent, env, buffer


OPTIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "anneal_lr": {"anneal_lr": True, "total_steps": 1000},
    "clip_value_loss": {"clip_value_loss": 0.05},
    "target_kl": {"target_kl": 0.0055},  # stops at the second minibatch of the second epoch
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("env_id", ["jaderl/Pendulum-v1", "jaderl/CartPole-v1"])
def test_ppo_update_matches_a_reference_loop(env_id: str, option: str) -> None:
    agent, env, buffer = warmed_up_agent(env_id, **OPTIONS[option])
    config = agent.config
    rollout = agent.explore(env, config.horizon)
    # anneal_lr: 400 steps were done before this third rollout, of total_steps = 1000 (CleanRL's frac)
    lr = 0.01 * (1 - 400 / 1000) if config.anneal_lr else 0.01
    torch.manual_seed(123)
    reference = reference_update(agent, rollout, lr, config.clip_value_loss, config.target_kl)
    torch.manual_seed(123)  # the same minibatch permutations, drawn in the same order
    buffer.add(dict(rollout))
    stats = agent.update(buffer)
    assert stats["policy/clip_fraction"] > 0.01, "no ratio left the clipping range: the clip would go untested"
    assert torch.allclose(buffer.data["advantage"], reference["advantage"], atol=1e-5)
    if config.target_kl is None:
        assert reference["steps"] == 3 * (200 // 64)
        assert "policy/epochs" not in stats
    else:
        assert 1 < reference["epochs"] < config.num_epochs, "pick a target_kl that stops in the middle of the update"
        assert stats["policy/epochs"] == reference["epochs"]
        assert reference["steps"] < 3 * (200 // 64)
    if config.clip_value_loss:
        assert reference["values_clipped"] > 0 and reference["values_free"] > 0, "both sides of the clip must occur"
    if config.anneal_lr:
        assert stats["train/lr"] == pytest.approx(lr) and agent.optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    else:
        assert "train/lr" not in stats
    for mine, theirs in zip([*agent.actor.parameters(), *agent.critic.parameters()], reference["params"], strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)
    # over the whole rollout, with the rollout critic's values (SB3's train/explained_variance)
    target, value = reference["target"].flatten().tolist(), reference["value"].flatten().tolist()
    residual = [t - v for t, v in zip(target, value, strict=True)]
    by_hand = 1 - statistics.pvariance(residual) / statistics.pvariance(target)
    assert float(stats["policy/explained_variance"]) == pytest.approx(by_hand, abs=1e-5)


@pytest.mark.parametrize(("env_id", "options"), [("jaderl/CartPole-v1", {}), ("jaderl/Pendulum-v1", {}),
                                                 ("jaderl/Pendulum-v1", {"use_sde": True, "sde_sample_freq": 4})])
def test_rollouts_record_the_log_probability_of_every_action(env_id: str, options: dict[str, Any]) -> None:
    """The rollout policy's log-probabilities come with the trajectory, equal to what the actor gives its actions
    afterwards (what the update computed for itself before), and the update takes them as they are."""
    agent, env, _ = warmed_up_agent(env_id, **options)
    rollout = agent.explore(env, agent.config.horizon)
    recorded = rollout.pop("log_prob")
    assert recorded.shape == rollout["reward"].shape == (50, 4)
    with torch.no_grad():
        computed = agent.old_log_prob(rollout)  # no recorded ones: the actor's, for the rollout's actions
    torch.testing.assert_close(recorded, computed, atol=1e-5, rtol=1e-5)
    assert recorded.std() > 0.1  # not one constant
    rollout["log_prob"] = recorded
    assert agent.old_log_prob(rollout) is recorded


def test_explained_variance_matches_a_hand_computation() -> None:
    value = torch.tensor([[1.0, 2.0], [3.0, 5.0]])  # (T, N): the whole rollout counts
    target = torch.tensor([[2.0, 2.0], [4.0, 4.0]])
    # Var[target] = 1; target - value = [1, 0, 1, -1] has mean 1/4 and variance 11/16
    assert float(explained_variance(value, target)) == pytest.approx(1 - 11 / 16)
    assert float(explained_variance(target, target)) == 1.0
    assert float(explained_variance(torch.full_like(target, 3.0), target)) == 0.0  # the mean explains nothing
    constant = torch.ones(2, 2)  # SB3 says NaN; a finite 0 keeps the run's non-finite check quiet
    assert float(explained_variance(value, constant)) == 0.0


SPEC = EnvSpec(num_envs=4, obs_shape=(3,), is_discrete=False, action_dim=1)


def hand_rollout(horizon: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A (T, N) rollout of SPEC's shapes with random observations, actions and rewards, and a few episode ends."""
    shape = (horizon, SPEC.num_envs)
    return {"obs": torch.randn(*shape, 3, generator=generator), "action": torch.randn(*shape, 1, generator=generator),
            "reward": torch.randn(*shape, generator=generator),
            "terminated": torch.rand(*shape, generator=generator) < 0.05,
            "truncated": torch.rand(*shape, generator=generator) < 0.05,
            "next_obs": torch.randn(*shape, 3, generator=generator)}


def spec_agent(**options: Any) -> PPO:
    config = PPOConfig(num_envs=SPEC.num_envs, horizon=8, minibatch_size=16, num_epochs=2, hidden=[16],
                       device="cpu", **options)
    return PPO(config, SPEC, torch.device("cpu"))


def learn(agent: PPO, rollout: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """What an iteration does to the agent, with a rollout given by hand: count its steps, then update."""
    agent.steps += rollout["reward"].numel()
    buffer = RolloutBuffer()
    buffer.add(rollout)
    torch.manual_seed(seed)
    return agent.update(buffer)


def test_value_clipping_is_sb3s_clipped_prediction() -> None:
    """A critic that moved 1 up since the rollout, away from targets 2 below its new values: SB3's loss sees the
    prediction clipped to V_old + 0.1, an error of 1.1, and sends the critic no gradient; CleanRL's max would take the
    unclipped error, 2, and pull the critic back."""
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    agent = spec_agent(clip_value_loss=0.1)
    obs, action = torch.randn(16, 3, generator=generator), torch.randn(16, 1, generator=generator)
    with torch.no_grad():
        features = agent.features(obs)
        value = agent.critic(features).squeeze(-1)
        log_prob = agent.actor.evaluate(features, action)[0]
    mb = {"obs": obs, "action": action, "log_prob": log_prob, "advantage": torch.randn(16, generator=generator),
          "value": value - 1.0, "value_target": value - 2.0}
    loss, stats = agent.minibatch_loss(mb)
    assert float(stats["loss/value"]) == pytest.approx(1.1**2, rel=1e-5)
    loss.backward()
    assert all(torch.count_nonzero(p.grad) == 0 for p in agent.critic.parameters())
    assert any(torch.count_nonzero(p.grad) > 0 for p in agent.actor.parameters())


def test_annealed_lr_follows_a_changed_lr_and_is_exact_after_a_resume() -> None:
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    agent = spec_agent(anneal_lr=True, lr=1e-3, total_steps=320)  # rollouts of 32 steps: 10 iterations
    assert float(learn(agent, hand_rollout(8, generator))["train/lr"]) == pytest.approx(1e-3)  # the first: lr itself
    agent.set_hyperparameters(lr=2e-3)  # as a population's exploit step does
    assert float(learn(agent, hand_rollout(8, generator))["train/lr"]) == pytest.approx(2e-3 * (1 - 32 / 320))
    assert agent.optimizer.param_groups[0]["lr"] == pytest.approx(2e-3 * 0.9)

    resumed = spec_agent(anneal_lr=True, lr=2e-3, total_steps=320)
    resumed.load_state_dict(copy.deepcopy(agent.state_dict()))
    resumed.apply_hyperparameters()  # as the trainer's load does: back to the un-annealed lr until the next update
    rollout = hand_rollout(8, generator)
    stats, resumed_stats = learn(agent, dict(rollout), seed=5), learn(resumed, dict(rollout), seed=5)
    assert float(stats["train/lr"]) == float(resumed_stats["train/lr"]) == pytest.approx(2e-3 * (1 - 64 / 320))
    for mine, theirs in zip(agent.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(mine, theirs)

    agent.steps = 10_000  # past total_steps (a run resumed with a smaller budget): 0, never negative
    assert float(learn(agent, hand_rollout(8, generator))["train/lr"]) == 0.0


@pytest.mark.parametrize("options", [{}, {"anneal_lr": True, "clip_value_loss": 0.1}, {"target_kl": 1e-6}],
                         ids=["defaults", "anneal_and_clip_value", "target_kl"])
def test_update_reads_nothing_back_unless_target_kl_is_set(options: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                            no_host_syncs: Any) -> None:
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    agent = spec_agent(**options)
    learn(agent, hand_rollout(8, generator))  # optimizer states created outside the guard
    rollout = hand_rollout(8, generator)
    with no_host_syncs():
        if "target_kl" in options:  # one read of the approximate KL per minibatch
            with pytest.raises(AssertionError, match="__float__"):
                learn(agent, rollout)
        else:
            stats = learn(agent, rollout)
    if "target_kl" not in options:
        assert all(torch.isfinite(v) for v in stats.values())


def test_new_options_are_checked_and_clip_value_loss_changes_live() -> None:
    with pytest.raises(ConfigError, match="target_kl"):
        spec_agent(target_kl=0.0)
    with pytest.raises(ConfigError, match=r"target_kl=0\.01 cannot be combined with learners=2"):
        spec_agent(target_kl=0.01, learners=2)
    with pytest.raises(ConfigError, match="clip_value_loss"):
        spec_agent(clip_value_loss=-0.1)
    agent = spec_agent()
    agent.set_hyperparameters(clip_value_loss=0.2)
    assert agent.config.clip_value_loss == 0.2
    with pytest.raises(ConfigError, match="clip_value_loss"):
        agent.set_hyperparameters(clip_value_loss=5.0)
    with pytest.raises(ConfigError, match="target_kl is not a hyperparameter"):
        agent.set_hyperparameters(target_kl=0.01)


def test_log_std_init_sets_the_gaussian_policys_starting_spread() -> None:
    env = make_env("jaderl/Pendulum-v1", 2, "cpu", seed=0)
    for value in (-0.5, -2.0):
        agent = PPO(PPOConfig(env="jaderl/Pendulum-v1", num_envs=2, horizon=8, minibatch_size=8, log_std_init=value,
                              device="cpu"), env, torch.device("cpu"))
        assert torch.equal(agent.actor.log_std.detach(), torch.full((1,), value))
