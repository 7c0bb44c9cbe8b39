"""Tests of model fusion (jaderl.parallel.fusion) against means computed by hand, element by element."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from jaderl.algos.sac import SAC
from jaderl.api import make_config
from jaderl.core.nets import ObsNorm
from jaderl.envs import make_env
from jaderl.parallel.fusion import (
    all_reduce_average,
    average_optimizer_states,
    average_parameters,
    fuse_agents,
    state_tensors,
)


def _nets(count: int) -> list[nn.Module]:
    """``count`` differently initialised copies of one small network."""
    nets = []
    for seed in range(count):
        torch.manual_seed(seed)
        nets.append(nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)))
    return nets


def _trained_adams(nets: list[nn.Module], steps: int = 3) -> list[torch.optim.Adam]:
    """An Adam optimizer per net after ``steps`` steps on random regression data of its own."""
    optimizers = []
    for i, net in enumerate(nets):
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(100 + i)
        for _ in range(steps + i):  # different step counts, so that ``step`` is averaged too
            x, y = torch.randn(8, 3, generator=gen), torch.randn(8, 2, generator=gen)
            opt.zero_grad()
            (net(x) - y).square().mean().backward()
            opt.step()
        optimizers.append(opt)
    return optimizers


def _mean_by_hand(values: list[torch.Tensor]) -> torch.Tensor:
    """The element-wise mean of equally shaped tensors, with explicit loops."""
    flat = [v.detach().reshape(-1).tolist() for v in values]
    out = [sum(column) / len(column) for column in zip(*flat, strict=True)]
    return torch.tensor(out, dtype=values[0].dtype).reshape(values[0].shape)


def _merged_by_hand(stats: list[tuple[float, list[float], list[float]]]) -> tuple[float, list[float], list[float]]:
    """The mean count n / k, and the mean and (population) variance of the union of k groups of samples, each given by
    its count, mean and variance, element by element: n = sum n_i, m = sum n_i m_i / n,
    v = sum n_i (v_i + (m_i - m)^2) / n."""
    count = sum(n for n, _, _ in stats)
    mean = [sum(n * m[j] for n, m, _ in stats) / count for j in range(len(stats[0][1]))]
    var = [sum(n * (v[j] + (m[j] - mean[j]) ** 2) for n, m, v in stats) / count for j in range(len(mean))]
    return count / len(stats), mean, var


def _norm_stats(norm: ObsNorm) -> tuple[float, list[float], list[float]]:
    return norm.count.item(), norm.mean.reshape(-1).tolist(), norm.var.reshape(-1).tolist()


def _assert_norm(norm: ObsNorm, count: float, mean: list[float], var: list[float]) -> None:
    assert norm.count.item() == pytest.approx(count, rel=1e-6)
    torch.testing.assert_close(norm.mean.reshape(-1), torch.tensor(mean, dtype=norm.mean.dtype))
    torch.testing.assert_close(norm.var.reshape(-1), torch.tensor(var, dtype=norm.var.dtype))


def _fed_norms(sizes: list[int], dim: int = 3) -> tuple[list[ObsNorm], torch.Tensor]:
    """One observation normaliser per size, each updated with that many samples of its own (with their own offset
    and scale), and all the samples together."""
    gen = torch.Generator().manual_seed(7)
    norms, samples = [], []
    for i, size in enumerate(sizes):
        x = torch.randn(size, dim, generator=gen) * (1.0 + i) + 2.0 * i
        norm = ObsNorm((dim,), enabled=True)
        norm.update(x)
        norms.append(norm)
        samples.append(x)
    return norms, torch.cat(samples)


def test_fusion_merges_normalisers_of_unequal_counts_as_the_union_of_their_samples() -> None:
    """Normalisers that saw 5, 40 and 200 samples are merged into the mean and variance of all 245: the mean weighted
    by the counts, the variance with the spread of the means (a plain average would weight the 5 samples as much as
    the 200), and the mean count."""
    norms, samples = _fed_norms([5, 40, 200])
    expected = _merged_by_hand([_norm_stats(n) for n in norms])
    average_parameters(norms)
    for norm in norms:
        _assert_norm(norm, *expected)
    # the statistics of the union of the samples (each normaliser's prior count of 1e-4 aside)
    assert norms[0].count.item() == pytest.approx(245 / 3, abs=1e-3)
    torch.testing.assert_close(norms[0].mean, samples.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norms[0].var, samples.var(0, unbiased=False), rtol=1e-5, atol=1e-5)


def test_all_reduce_average_merges_normalisers_of_unequal_counts(in_threads: Callable[..., list[Any]]) -> None:
    nets = [nn.Sequential(norm, nn.Linear(3, 2)) for norm in _fed_norms([3, 30, 90])[0]]
    expected = _merged_by_hand([_norm_stats(net[0]) for net in nets])
    expected_weight = _mean_by_hand([net[1].weight for net in nets])

    def fuse(rank: int, group: dist.ProcessGroup) -> None:
        all_reduce_average(nets[rank], group)

    in_threads(3, fuse)
    for net in nets:
        _assert_norm(net[0], *expected)
        torch.testing.assert_close(net[1].weight.detach(), expected_weight)


def test_average_parameters_sets_every_copy_to_the_mean() -> None:
    nets = _nets(3)
    before = [[p.detach().clone() for p in net.parameters()] for net in nets]
    average_parameters(nets)
    for i, _ in enumerate(before[0]):
        expected = _mean_by_hand([b[i] for b in before])
        for net in nets:
            torch.testing.assert_close(list(net.parameters())[i].detach(), expected)
    assert not torch.equal(before[0][0], next(iter(nets[0].parameters())))


def test_average_optimizer_states_matches_adam_statistics_by_hand() -> None:
    nets = _nets(2)
    optimizers = _trained_adams(nets)
    before = [copy.deepcopy(opt.state_dict()["state"]) for opt in optimizers]
    assert before[0][0]["step"] != before[1][0]["step"]
    average_optimizer_states(optimizers)
    for index in before[0]:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            expected = _mean_by_hand([b[index][key] for b in before])
            for opt in optimizers:
                torch.testing.assert_close(opt.state_dict()["state"][index][key], expected)
    # the parameters are untouched and the fused optimizers keep working
    x = torch.randn(4, 3)
    for net, opt in zip(nets, optimizers, strict=True):
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()


def test_average_optimizer_states_rejects_different_architectures() -> None:
    optimizers = _trained_adams([nn.Linear(3, 2)]) + _trained_adams([nn.Linear(3, 2, bias=False)])
    with pytest.raises(ValueError, match="different architectures"):
        average_optimizer_states(optimizers)


@pytest.fixture
def sac_agents() -> list[SAC]:
    """Two SAC agents on Pendulum with different networks and a few gradient steps of their own."""
    agents = []
    env = make_env("jaderl/Pendulum-v1", 2, torch.device("cpu"), seed=0)
    for seed in range(2):
        torch.manual_seed(seed)
        config = make_config("sac", "jaderl/Pendulum-v1", num_envs=2, hidden=[16], device="cpu", batch_size=8,
                             warmup_steps=0, normalize_obs=True, seed=seed)
        agent = SAC(config, env, torch.device("cpu"))
        buffer = agent.make_buffer()
        buffer.add(agent.explore(env, 8))
        agent.update(buffer)
        agents.append(agent)
    env.close()
    return agents


def test_fuse_agents_averages_networks_free_parameters_and_optimizers(sac_agents: list[SAC]) -> None:
    before = [[t.clone() for t in state_tensors(agent)] for agent in sac_agents]
    steps = [agent.steps for agent in sac_agents]
    norm_buffers = {sac_agents[0].obs_norm.count.data_ptr(): "count", sac_agents[0].obs_norm.mean.data_ptr(): "mean",
                    sac_agents[0].obs_norm.var.data_ptr(): "var"}
    count, mean, var = _merged_by_hand([_norm_stats(agent.obs_norm) for agent in sac_agents])
    merged = {"count": torch.tensor(count), "mean": torch.tensor(mean), "var": torch.tensor(var)}
    fuse_agents(sac_agents)
    after = [state_tensors(agent) for agent in sac_agents]
    checked, norms_checked = 0, 0
    for i, tensor in enumerate(after[0]):
        if tensor.is_floating_point():
            if (name := norm_buffers.get(tensor.data_ptr())) is not None:  # merged as the union of the samples
                expected = merged[name].to(tensor.dtype).reshape(tensor.shape)
                norms_checked += 1
            else:
                expected = _mean_by_hand([b[i] for b in before])
            torch.testing.assert_close(tensor, expected)
            torch.testing.assert_close(after[1][i], expected)
            checked += 1
    assert checked > 20  # actor, critics, targets, obs-norm buffers, log_alpha, three Adams
    assert norms_checked == 3
    torch.testing.assert_close(sac_agents[0].alpha.log_alpha.detach(),
                               _mean_by_hand([b.alpha.log_alpha for b in sac_agents]))
    assert [agent.steps for agent in sac_agents] == steps


def test_average_parameters_of_agents_leaves_optimizers_alone(sac_agents: list[SAC]) -> None:
    adam_before = copy.deepcopy(sac_agents[0].critic_optimizer.state_dict()["state"])
    alpha = _mean_by_hand([agent.alpha.log_alpha for agent in sac_agents])
    average_parameters(sac_agents)
    torch.testing.assert_close(sac_agents[1].alpha.log_alpha.detach(), alpha)
    for p, q in zip(sac_agents[0].actor.parameters(), sac_agents[1].actor.parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(sac_agents[0].critic_optimizer.state_dict()["state"][0]["exp_avg"], adam_before[0]["exp_avg"])


def test_all_reduce_average_over_a_process_group(in_threads: Callable[..., list[Any]]) -> None:
    nets = _nets(3)
    optimizers = _trained_adams(nets)
    expected_params = [_mean_by_hand(list(ps)) for ps in zip(*(n.parameters() for n in nets), strict=True)]
    expected_adam = _mean_by_hand([opt.state_dict()["state"][0]["exp_avg_sq"] for opt in optimizers])
    expected_step = _mean_by_hand([opt.state_dict()["state"][0]["step"] for opt in optimizers])

    def fuse(rank: int, group: dist.ProcessGroup) -> None:
        all_reduce_average(nets[rank], group)
        all_reduce_average(optimizers[rank], group)

    in_threads(3, fuse)
    for net, opt in zip(nets, optimizers, strict=True):
        for p, expected in zip(net.parameters(), expected_params, strict=True):
            torch.testing.assert_close(p.detach(), expected)
        torch.testing.assert_close(opt.state_dict()["state"][0]["exp_avg_sq"], expected_adam)
        torch.testing.assert_close(opt.state_dict()["state"][0]["step"], expected_step)
