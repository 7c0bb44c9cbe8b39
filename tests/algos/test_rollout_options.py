"""Options every rollout algorithm shares. gSDE (``use_sde``): the distribution its log-probabilities score is the one
its actions are drawn from, the noise weights are drawn when the schedule says (SAC's too, whose schedule is the
same), and the rollout algorithms train and resume with it. ``anneal_lr``: the learning rate of each update."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import jaderl
from jaderl.algos.nets import SDEGaussianActor, TanhSDEActor
from jaderl.api import ALGOS, make_config
from jaderl.core.config import ConfigError


def _actor(seed: int = 0) -> SDEGaussianActor:
    torch.manual_seed(seed)
    actor = SDEGaussianActor(3, 2, [8, 5])
    with torch.no_grad():
        actor.log_std.copy_(torch.randn(5, 2) * 0.3 - 1.0)
        actor.net[-1].weight.normal_()  # a mean that is not ~0, so a wrong mean would show
    return actor


def test_log_prob_and_entropy_are_those_of_the_gaussian_of_each_state() -> None:
    actor, obs, action = _actor(), torch.randn(7, 3), torch.randn(7, 2)
    latent = actor.net[:-1](obs)
    mean = actor.net[-1](latent)
    std = ((latent.square() @ actor.log_std.exp().square()) + 1e-6).sqrt()  # (7, 2): sum_j z_j^2 sigma_jk^2
    normal = torch.distributions.Normal(mean, std)
    log_prob, entropy = actor.evaluate(obs, action)
    torch.testing.assert_close(log_prob, normal.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))
    torch.testing.assert_close(actor(obs), mean.clamp(-1, 1))  # deterministic: the mean


def test_actions_are_drawn_from_the_distribution_that_is_scored() -> None:
    """For one state, the actions of many independent noise draws have the mean and std evaluate() scores."""
    actor, obs = _actor(1), torch.randn(1, 3)
    draws = 40_000
    actor.resample((draws,))
    with torch.no_grad():
        actions = actor.sample(obs.expand(draws, 3))  # one state, 40k sub-envs with their own weights
        latent = actor.net[:-1](obs)
        mean = actor.net[-1](latent)[0]
        std = ((latent.square() @ actor.log_std.exp().square()) + 1e-6).sqrt()[0]
    torch.testing.assert_close(actions.mean(0), mean, atol=4 * float(std.max()) / math.sqrt(draws), rtol=0)
    torch.testing.assert_close(actions.std(0), std, rtol=0.03, atol=0)


def test_a_sub_env_keeps_its_noise_weights_until_they_are_drawn_again() -> None:
    actor = _actor(2)
    actor.resample((4,))
    obs = torch.randn(4, 3)
    with torch.no_grad():
        first, again = actor.sample(obs), actor.sample(obs)
        assert torch.equal(first, again)  # same weights, same state: the same action (noise smooth in the state)
        assert not torch.equal(actor.noise[0], actor.noise[1])  # each sub-env has weights of its own
        actor.resample((4,))
        assert not torch.equal(actor.sample(obs), first)
        # a batch of another shape (an evaluation, predict) gets weights of its own and leaves the stored ones
        stored = actor.noise.clone()
        assert actor.sample(torch.randn(9, 3)).shape == (9, 2)
        assert torch.equal(actor.noise, stored)


@pytest.mark.parametrize(("algo", "settings", "actor_cls", "latent"), [
    ("ppo", {"minibatch_size": 8}, SDEGaussianActor, 64),
    ("sac", {"hidden": [16, 16], "warmup_steps": 0}, TanhSDEActor, 16),  # off-policy: every explore() call
])
@pytest.mark.parametrize(("freq", "draws_per_rollout"), [(-1, 1), (3, 3), (8, 1)])
def test_noise_is_drawn_at_each_rollout_start_and_every_sde_sample_freq_steps(
        algo: str, settings: dict[str, object], actor_cls: type, latent: int, freq: int, draws_per_rollout: int,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = make_config(algo, "jaderl/Pendulum-v1", use_sde=True, sde_sample_freq=freq, num_envs=3, horizon=8,
                         device="cpu", zoo=False, run_dir=str(tmp_path), **settings)
    with jaderl.Trainer(config, ALGOS[algo].agent_cls) as trainer:
        agent = trainer.agent
        assert isinstance(agent.actor, actor_cls)
        drawn: list[tuple[int, ...]] = []
        resample = agent.actor.resample
        monkeypatch.setattr(agent.actor, "resample", lambda shape: (drawn.append(tuple(shape)), resample(shape)))
        batch = agent.explore(trainer.env, 8)
        agent.explore(trainer.env, 8)
        assert drawn == [(3,)] * 2 * draws_per_rollout
        assert agent.actor.noise.shape == (3, latent, 1)  # one weight matrix per sub-env
        if algo == "sac":  # squashed
            assert batch["action"].abs().max() <= 1.0


def test_bad_settings_are_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^sde_sample_freq=0 is invalid"):
        make_config("ppo", "jaderl/Pendulum-v1", use_sde=True, sde_sample_freq=0, zoo=False)
    config = make_config("ppo", "jaderl/CartPole-v1", use_sde=True, zoo=False, device="cpu", run_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"^use_sde=true needs continuous actions and this env's are discrete"):
        jaderl.Trainer(config, ALGOS["ppo"].agent_cls)


@pytest.mark.parametrize(("algo", "env", "settings"), [
    ("ppo", "jaderl/Pendulum-v1", {"num_envs": 4, "horizon": 16, "minibatch_size": 32, "num_epochs": 2}),
    pytest.param("ppo", "jaderl/Pendulum-v1", {"num_envs": 4, "horizon": 16, "minibatch_size": 32,
                                               "precision": "bfloat16"},
                 marks=pytest.mark.filterwarnings("ignore:precision=bfloat16"), id="ppo-bfloat16"),
    ("a2c", "jaderl/Pendulum-v1", {"num_envs": 4, "horizon": 8}),
    ("reinforce", "jaderl/Pendulum-v1", {"num_envs": 4, "horizon": 200}),
    ("mappo", "jaderl/simple_spread?continuous=true", {"num_envs": 8, "horizon": 25, "minibatch_size": 100}),
])
def test_rollout_algorithms_resume_bit_identically_with_it(algo: str, env: str, settings: dict[str, object],
                                                          tmp_path: Path) -> None:
    """Trained, copied through its state dict mid-run, and continued: both copies take the same steps (the noise
    weights are drawn again at each rollout start from the restored random state, so they are not saved)."""
    torch.set_num_threads(1)

    def config(name: str, total: int) -> jaderl.core.config.Config:
        return make_config(algo, env, run_dir=str(tmp_path / name), seed=5, device="cpu", zoo=False, use_sde=True,
                           sde_sample_freq=3, log_std_init=-2.0, hidden=[16, 16], total_steps=total,
                           eval_every=10**9, eval_episodes=1, checkpoint_every=10**9, **settings)

    rollout = settings["num_envs"] * settings["horizon"]  # type: ignore[operator]
    with jaderl.Trainer(config("a", 2 * rollout), ALGOS[algo].agent_cls) as first:
        first.run()
        with jaderl.Trainer(config("b", 4 * rollout), ALGOS[algo].agent_cls) as second:
            second.load_state_dict(first.state_dict())
            first.config.total_steps = 4 * rollout
            first.run(), second.run()
            for p, q in zip(first.agent.parameters(), second.agent.parameters(), strict=True):
                assert torch.equal(p, q)
            assert torch.isfinite(first.agent.actor.log_std).all()


@pytest.mark.parametrize(("algo", "env", "settings"), [
    ("a2c", "jaderl/Pendulum-v1", {"num_envs": 4, "horizon": 5}),
    ("vpg", "jaderl/CartPole-v1", {"num_envs": 4, "horizon": 5}),
    ("mappo", "jaderl/simple_spread", {"num_envs": 4, "horizon": 5, "minibatch_size": 10}),
])
def test_every_rollout_algorithm_anneals_its_learning_rate(algo: str, env: str, settings: dict[str, int],
                                                          tmp_path: Path) -> None:
    """anneal_lr (shared with PPO, whose maths tests/algos/test_ppo.py checks): the k-th update (k = 0, 1, ...) uses
    lr * (1 - k * rollout / total_steps) and reports it."""
    config = make_config(algo, env, anneal_lr=True, lr=0.01, total_steps=100, device="cpu", zoo=False,
                         run_dir=str(tmp_path), hidden=[8], **settings)
    with jaderl.Trainer(config, ALGOS[algo].agent_cls) as trainer:
        agent = trainer.agent
        for k in range(3):
            buffer = agent.make_buffer()
            buffer.add(agent.explore(trainer.env, 5))
            stats = agent.update(buffer)
            assert float(stats["train/lr"]) == pytest.approx(0.01 * (1 - k * 20 / 100))
            assert [g["lr"] for g in agent.optimizer.param_groups] == pytest.approx([0.01 * (1 - k * 20 / 100)]
                                                                                    * len(agent.optimizer.param_groups))
