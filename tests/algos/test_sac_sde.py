"""SAC with gSDE (``use_sde``): the squashed state-dependent policy scores the actions it draws, explores along its
noise weights, learns its features through the noise's variance, and SAC trains and resumes with it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

import jaderl
from jaderl.algos.nets import TanhSDEActor
from jaderl.api import ALGOS, make_config
from jaderl.core.config import ConfigError


def _actor(seed: int = 0) -> TanhSDEActor:
    torch.manual_seed(seed)
    actor = TanhSDEActor(3, 2, [8, 5], log_std_init=-1.0)
    with torch.no_grad():
        actor.log_std.add_(torch.randn(5, 2) * 0.3)
        actor.net[-1].weight.normal_()  # a mean that is not ~0, so a wrong mean would show
    return actor


def _per_state(actor: TanhSDEActor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean (clipped to [-2, 2]) and std of u = atanh(a) in each state, written out."""
    latent = actor.net[:-1](obs)
    mean = actor.net[-1](latent).clamp(-2.0, 2.0)
    return mean, ((latent.square() @ actor.log_std.exp().square()) + 1e-6).sqrt()


def test_sampled_actions_are_scored_by_the_squashed_gaussian_of_each_state() -> None:
    actor, obs = _actor(), torch.randn(64, 3)
    action, log_prob = actor.sample(obs)
    mean, std = _per_state(actor, obs)
    reference = TransformedDistribution(Normal(mean, std), [TanhTransform()])
    inside = action.abs().amax(-1) < 0.99  # torch's TanhTransform loses precision near +-1
    assert inside.sum() > 40
    torch.testing.assert_close(log_prob[inside], reference.log_prob(action).sum(-1)[inside], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(actor.log_prob(obs, action)[inside], log_prob[inside], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(actor(obs), torch.tanh(mean))  # deterministic: the squashed, clipped mean


def test_exploring_actions_follow_the_distribution_the_losses_read() -> None:
    """For one state, 40k sub-envs with noise weights of their own explore with the mean and std of u that
    sample() draws from and scores."""
    actor, obs = _actor(1), torch.randn(1, 3)
    draws = 40_000
    actor.resample((draws,))
    with torch.no_grad():
        u = torch.atanh(actor.explore(obs.expand(draws, 3)).clamp(-1 + 1e-6, 1 - 1e-6))
        mean, std = (x[0] for x in _per_state(actor, obs))
    torch.testing.assert_close(u.mean(0), mean, atol=4 * float(std.max()) / math.sqrt(draws), rtol=0)
    torch.testing.assert_close(u.std(0), std, rtol=0.03, atol=0)
    first = actor.explore(obs.expand(draws, 3))
    assert torch.equal(actor.explore(obs.expand(draws, 3)), first)  # the same weights until drawn again


def test_features_learn_through_the_noise_variance() -> None:
    """SB3's learn_features=True: with the mean layer's weights zero (no gradient through the mean), the
    log-probability still reaches the hidden layers, through the state-dependent std."""
    actor = _actor(2)
    with torch.no_grad():
        actor.net[-1].weight.zero_()
    _, log_prob = actor.sample(torch.randn(16, 3))
    log_prob.sum().backward()
    assert actor.net[0].weight.grad is not None and actor.net[0].weight.grad.abs().sum() > 0
    assert actor.log_std.grad is not None and actor.log_std.grad.abs().sum() > 0


@pytest.mark.parametrize("algo", ["sac", "ppo"])
def test_a_draw_every_zero_steps_is_refused_in_one_sentence(algo: str) -> None:
    with pytest.raises(ConfigError, match=r"^sde_sample_freq=0 is invalid: give a number of steps, or -1"):
        make_config(algo, "jaderl/Pendulum-v1", use_sde=True, sde_sample_freq=0, zoo=False)


@pytest.mark.parametrize("settings", [{}, {"use_hterm": True, "hterm_trajectories": 4, "hterm_length": 4,
                                           "hterm_every": 1, "hterm_window": 64}], ids=["sac", "sac-hterm"])
def test_sac_trains_and_resumes_bit_identically_with_it(settings: dict[str, object], tmp_path: Path) -> None:
    """Trained, copied through its state dict mid-run, and continued: both copies take the same steps (the noise
    weights are drawn again at each explore call from the restored random state, so they are not saved)."""
    torch.set_num_threads(1)

    def config(name: str, total: int) -> jaderl.core.config.Config:
        return make_config("sac", "jaderl/Pendulum-v1", run_dir=str(tmp_path / name), seed=5, device="cpu",
                           zoo=False, use_sde=True, sde_sample_freq=2, num_envs=2, horizon=4, hidden=[16, 16],
                           warmup_steps=16, batch_size=16, total_steps=total, eval_every=10**9, eval_episodes=1,
                           checkpoint_every=10**9, **settings)

    with jaderl.Trainer(config("a", 64), ALGOS["sac"].agent_cls) as first:
        first.run()
        with jaderl.Trainer(config("b", 128), ALGOS["sac"].agent_cls) as second:
            second.load_state_dict(first.state_dict())
            first.config.total_steps = 128
            first.run(), second.run()
            for p, q in zip(first.agent.parameters(), second.agent.parameters(), strict=True):
                assert torch.equal(p, q)
            before = torch.full_like(first.agent.actor.log_std, -3.0)
            assert not torch.equal(first.agent.actor.log_std, before)  # learned, from SB3's -3
            assert torch.isfinite(first.agent.actor.log_std).all()
