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
    fuse_agents(sac_agents)
    after = [state_tensors(agent) for agent in sac_agents]
    checked = 0
    for i, tensor in enumerate(after[0]):
        if tensor.is_floating_point():
            expected = _mean_by_hand([b[i] for b in before])
            torch.testing.assert_close(tensor, expected)
            torch.testing.assert_close(after[1][i], expected)
            checked += 1
    assert checked > 20  # actor, critics, targets, obs-norm buffers, log_alpha, three Adams
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
