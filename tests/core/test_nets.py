"""Tests of jaderl.core.nets against computations written out by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from jaderl.accel import Tanh
from jaderl.algos.nets import CategoricalActor, EnsembleLinear, EnsembleQ, GaussianActor, QNet, TanhGaussianActor
from jaderl.core.nets import ObsNorm, mlp


def test_mlp_layout() -> None:
    net = mlp([3, 8, 8, 2], nn.Tanh, out_gain=0.5)
    kinds = [type(m) for m in net]
    assert kinds == [nn.Linear, Tanh, nn.Linear, Tanh, nn.Linear]  # nn.Tanh's function, faster on the CPU
    assert net(torch.zeros(5, 3)).shape == (5, 2)
    assert torch.count_nonzero(net[-1].bias) == 0


@pytest.mark.parametrize("num", [1, 2, 5])
def test_ensemble_q_equals_each_member(num: int) -> None:
    torch.manual_seed(num)
    obs_dim, act_dim, hidden, batch = 4, 2, [16, 8], 7
    critic = EnsembleQ(obs_dim, act_dim, hidden, num).double()
    obs = torch.randn(batch, obs_dim, dtype=torch.float64)
    action = torch.randn(batch, act_dim, dtype=torch.float64)
    out = critic(obs, action)
    assert out.shape == (num, batch)
    for i in range(num):
        x = torch.cat([obs, action], -1)
        for j, layer in enumerate(critic.layers):
            x = x @ layer.weight[i] + layer.bias[i, 0]  # one member as a plain linear layer
            if j < len(critic.layers) - 1:
                x = torch.relu(x)
        torch.testing.assert_close(out[i], x.squeeze(-1))
    # members are independent: perturbing member 0 leaves the others alone
    with torch.no_grad():
        critic.layers[0].weight[0] += 1.0
    changed = critic(obs, action)
    assert not torch.allclose(changed[0], out[0])
    torch.testing.assert_close(changed[1:], out[1:])


def test_ensemble_members_differ_and_get_gradients() -> None:
    torch.manual_seed(0)
    critic = EnsembleQ(3, 1, [8], num=2)
    out = critic(torch.randn(4, 3), torch.randn(4, 1))
    assert not torch.allclose(out[0], out[1])
    out[1].sum().backward()
    assert critic.layers[0].weight.grad[0].abs().sum() == 0  # member 0 did not take part
    assert critic.layers[0].weight.grad[1].abs().sum() > 0


def test_ensemble_linear_init_bound() -> None:
    layer = EnsembleLinear(3, 64, 5)
    assert layer.weight.abs().max() <= 1 / 8 and layer.bias.shape == (3, 1, 5)


@pytest.mark.parametrize("dueling", [False, True])
def test_qnet_aggregation_by_hand(dueling: bool) -> None:
    torch.manual_seed(0)
    net = QNet(5, 4, [16, 16], dueling=dueling).double()
    obs = torch.randn(6, 5, dtype=torch.float64)
    linears = [m for m in net.body.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2
    h = obs
    for layer in linears:
        h = torch.relu(h @ layer.weight.T + layer.bias)
    adv = h @ net.advantage.weight.T + net.advantage.bias  # (B, A)
    if dueling:
        value = h @ net.value.weight.T + net.value.bias  # (B, 1)
        expected = value + adv - adv.mean(-1, keepdim=True)
        # the dueling property: the mean over actions of Q is V
        torch.testing.assert_close(net(obs).mean(-1, keepdim=True), value)
    else:
        assert net.value is None
        expected = adv
    q = net(obs)
    assert q.shape == (6, 4)
    torch.testing.assert_close(q, expected)


def test_tanh_gaussian_log_prob_is_change_of_variables() -> None:
    torch.manual_seed(0)
    actor = TanhGaussianActor(3, 2, [16, 16]).double()
    with torch.no_grad():  # spread the log-stds over the clamp range so both clamps are exercised
        actor.net[-1].bias[2:] = torch.tensor([-7.0, 1.5], dtype=torch.float64)
    obs = torch.randn(64, 3, dtype=torch.float64)
    torch.manual_seed(123)
    action, log_prob = actor.sample(obs)
    # reproduce the same noise and evaluate with torch.distributions
    mean, log_std = actor.net(obs).chunk(2, -1)
    std = log_std.clamp(-5.0, 2.0).exp()
    torch.manual_seed(123)
    u = mean + std * torch.randn_like(mean)
    torch.testing.assert_close(action, torch.tanh(u))
    expected = (torch.distributions.Normal(mean, std).log_prob(u) - torch.log(1 - torch.tanh(u).square())).sum(-1)
    assert log_prob.shape == (64,) and action.shape == (64, 2)
    torch.testing.assert_close(log_prob, expected, rtol=1e-6, atol=1e-6)
    assert action.abs().max() < 1
    torch.testing.assert_close(actor(obs), torch.tanh(mean))


def test_tanh_gaussian_log_prob_is_finite_when_saturated() -> None:
    actor = TanhGaussianActor(2, 1, [8])
    with torch.no_grad():
        actor.net[-1].bias.copy_(torch.tensor([30.0, -20.0]))  # mean 30: tanh(u) rounds to 1 in float32
    _, log_prob = actor.sample(torch.zeros(10, 2))
    assert torch.isfinite(log_prob).all()


def test_tanh_gaussian_reparameterised() -> None:
    actor = TanhGaussianActor(3, 2, [8])
    action, log_prob = actor.sample(torch.randn(5, 3))
    (action.sum() + log_prob.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


def test_gaussian_actor_log_prob_and_entropy() -> None:
    torch.manual_seed(0)
    actor = GaussianActor(3, 2, [8])
    with torch.no_grad():
        actor.log_std.copy_(torch.tensor([-0.3, 0.4]))
    obs, action = torch.randn(9, 3), torch.randn(9, 2)
    log_prob, entropy = actor.evaluate(obs, action)
    dist = torch.distributions.Normal(actor.net(obs), actor.log_std.exp())
    torch.testing.assert_close(log_prob, dist.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))


@pytest.mark.parametrize("num_actions", [4, 18])  # the CPU's (actions, batch) layout below 16 actions, and the usual
@pytest.mark.parametrize("batch", [(20,), (5, 2, 3)])
def test_categorical_actor_log_prob_and_entropy(num_actions: int, batch: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    actor = CategoricalActor(3, num_actions, [8])
    with torch.no_grad():
        actor.net[-1].weight.mul_(300)  # spread the logits away from uniform
    obs = torch.randn(*batch, 3)
    action = actor.sample(obs)
    assert action.shape == batch and action.min() >= 0 and action.max() < num_actions
    log_prob, entropy = actor.evaluate(obs, action)
    dist = torch.distributions.Categorical(logits=actor.net(obs))
    torch.testing.assert_close(log_prob, dist.log_prob(action))
    torch.testing.assert_close(entropy, dist.entropy())
    torch.testing.assert_close(actor(obs), dist.probs.argmax(-1))
    grads = torch.autograd.grad((log_prob + 0.1 * entropy).sum(), list(actor.parameters()))
    expected = torch.autograd.grad((dist.log_prob(action) + 0.1 * dist.entropy()).sum(), list(actor.parameters()))
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_categorical_sampling_follows_probabilities() -> None:
    torch.manual_seed(0)
    actor = CategoricalActor(1, 3, [4])
    with torch.no_grad():
        for p in actor.net.parameters():
            p.zero_()
        actor.net[-1].bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
    counts = torch.bincount(actor.sample(torch.zeros(20_000, 1)), minlength=3).float() / 20_000
    torch.testing.assert_close(counts, F.softmax(torch.tensor([0.0, 1.0, 2.0]), -1), atol=0.015, rtol=0)


def test_obs_norm_matches_all_data() -> None:
    torch.manual_seed(0)
    norm = ObsNorm((3,), enabled=True)
    batches = [torch.randn(n, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -3.0, 10.0])
               for n in (7, 50, 1, 130)]
    for batch in batches:
        norm.update(batch)
    data = torch.cat(batches).double()
    mean, var = data.mean(0), data.var(0, unbiased=False)
    torch.testing.assert_close(norm.mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var.double(), var, rtol=0.01, atol=1e-4)
    # exactly: the statistics of the data plus the prior, a pseudo-sample of weight 1e-4 with mean 0 and variance 1
    eps, n = 1e-4, len(data)
    prior_mean = data.sum(0) / (n + eps)
    prior_var = (eps * (1 + prior_mean.square()) + (data - prior_mean).square().sum(0)) / (n + eps)
    torch.testing.assert_close(norm.mean.double(), prior_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.var.double(), prior_var, rtol=1e-4, atol=1e-7)
    assert norm.count.item() == pytest.approx(n, abs=1e-3)
    x = torch.randn(4, 3)
    expected = ((x - mean.float()) / var.float().sqrt()).clamp(-10, 10)
    torch.testing.assert_close(norm(x), expected, rtol=0.01, atol=0.01)
    wide = torch.randn(1000, 3) * 30  # many clipped; the input itself is left as it is
    before = wide.clone()
    own = ((wide - norm.mean) / (norm.var + 1e-8).sqrt()).clamp(-10, 10)
    torch.testing.assert_close(norm(wide), own, rtol=1e-6, atol=1e-5)
    assert torch.equal(wide, before)


def test_obs_norm_multi_dim_and_disabled() -> None:
    norm = ObsNorm((2, 2), enabled=True)
    data = torch.randn(5, 6, 2, 2)  # (T, N, *obs_shape)
    norm.update(data)
    torch.testing.assert_close(norm.mean, data.reshape(-1, 2, 2).mean(0), rtol=1e-4, atol=1e-4)
    off = ObsNorm((3,), enabled=False)
    off.update(torch.randn(10, 3) + 5)
    x = torch.randn(2, 3)
    assert torch.equal(off.mean, torch.zeros(3)) and torch.equal(off(x), x)
    assert set(off.state_dict()) == {"mean", "var", "count"}
