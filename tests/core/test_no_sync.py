"""The hot loop (``explore`` on a torch env, ``buffer.add``, ``update``) reads nothing back from the device.

On a GPU a host sync stalls the pipeline; ``torch.cuda.set_sync_debug_mode`` would find one, but only on CUDA. Here
every Python-level way of reading a tensor's value (``.item()``, ``bool()``, ``float()``, ``int()``, ``.tolist()``,
``.numpy()``, ``.cpu()``, ``nonzero``, ``torch.equal``) is made to raise while a few training iterations run on the
CPU, after a warm-up that fills the buffers and passes the algorithms' random warm-up. Logging and evaluation (the
loop's step 3) may sync and are not part of it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from jaderl.algos import ALGOS
from jaderl.api import make_config
from jaderl.envs import make_env

CASES = {  # algorithm: (env, settings)
    "ppo": ("jaderl/Pendulum-v1", {"horizon": 8, "minibatch_size": 16, "num_epochs": 2}),
    "ppo-discrete": ("jaderl/CartPole-v1", {"horizon": 8, "minibatch_size": 16, "num_epochs": 2}),
    "a2c": ("jaderl/CartPole-v1", {"horizon": 8}),
    "reinforce": ("jaderl/Pendulum-v1", {"horizon": 8}),
    "sac": ("jaderl/Pendulum-v1", {}),
    "modsac": ("jaderl/Pendulum-v1", {}),
    "redq": ("jaderl/Pendulum-v1", {"updates_per_step": 2.0}),
    "td3": ("jaderl/Pendulum-v1", {}),
    "ddpg": ("jaderl/Pendulum-v1", {"noise": "ou"}),
    "dqn": ("jaderl/CartPole-v1", {"double": True, "dueling": True}),
    "noisy_dqn": ("jaderl/CartPole-v1", {"n_step": 3, "use_per": True}),
    "sac_discrete": ("jaderl/CartPole-v1", {}),
}
OFF_POLICY = {"warmup_steps": 16, "batch_size": 8, "buffer_size": 256, "horizon": 1, "updates_per_step": 1.0}


def _setup(algo: str) -> tuple[Any, Any, Any]:
    env_id, settings = CASES[algo]
    name = algo.removesuffix("-discrete")
    agent_cls = ALGOS[name].agent_cls
    fields = {"hidden": [16, 16], "num_envs": 4, "device": "cpu", "seed": 0, **settings}
    if not agent_cls.on_policy:
        fields = {**OFF_POLICY, **fields}
    config = make_config(name, env_id, **fields)
    env = make_env(env_id, config.num_envs, "cpu", seed=0)
    env.sync_free = True  # the torch envs' GPU behaviour: on the CPU they read `done` to skip idle resets
    torch.manual_seed(0)
    agent = agent_cls(config, env, torch.device("cpu"))
    return agent, env, agent.make_buffer()


def _iterate(agent: Any, env: Any, buffer: Any) -> dict[str, torch.Tensor]:
    buffer.add(agent.explore(env, agent.config.horizon))
    return agent.update(buffer)


@pytest.mark.parametrize("algo", list(CASES))
def test_hot_loop_does_not_sync(algo: str, monkeypatch: pytest.MonkeyPatch, no_host_syncs: Any) -> None:
    agent, env, buffer = _setup(algo)
    for _ in range(8):  # warm-up: past the random actions, buffers filled, optimizer states created
        _iterate(agent, env, buffer)
    with no_host_syncs():
        stats = [_iterate(agent, env, buffer) for _ in range(4)]
    assert all(stats), "no gradient step ran: the test would prove nothing"
    assert all(torch.isfinite(v).all() for v in stats[-1].values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("algo", ["ppo", "sac", "modsac", "td3", "dqn"])
def test_hot_loop_does_not_sync_on_cuda(algo: str) -> None:
    """The same on a GPU, where CUDA itself reports every synchronising call."""
    env_id, settings = CASES[algo]
    agent_cls = ALGOS[algo].agent_cls
    fields = {"hidden": [16, 16], "num_envs": 4, "device": "cuda", "seed": 0, **settings}
    if not agent_cls.on_policy:
        fields = {**OFF_POLICY, **fields}
    config = make_config(algo, env_id, **fields)
    device = torch.device("cuda")
    env = make_env(env_id, config.num_envs, device, seed=0)
    agent = agent_cls(config, env, device)
    buffer = agent.make_buffer()
    for _ in range(8):
        _iterate(agent, env, buffer)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            _iterate(agent, env, buffer)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_guard_catches_an_injected_sync(monkeypatch: pytest.MonkeyPatch, no_host_syncs: Any) -> None:
    x = torch.ones(3)
    with no_host_syncs():
        for read in (lambda: x.sum().item(), lambda: bool(x.sum()), lambda: float(x.sum()), lambda: x.tolist(),
                     lambda: int(x[0]), lambda: x.nonzero(), lambda: torch.equal(x, x)):
            with pytest.raises(AssertionError):
                read()
    agent, env, buffer = _setup("sac")
    for _ in range(8):
        _iterate(agent, env, buffer)
    update_once = agent.update_once

    def syncing_update_once(batch: dict[str, torch.Tensor]) -> Any:
        stats, td_error = update_once(batch)
        if stats["loss/critic"] > 1e9:  # what a host-side check of a loss looks like
            raise RuntimeError("diverged")
        return stats, td_error

    monkeypatch.setattr(agent, "update_once", syncing_update_once)
    _iterate(agent, env, buffer)  # fine outside the guard
    with no_host_syncs(), pytest.raises(AssertionError, match="__bool__"):
        _iterate(agent, env, buffer)
    assert float(torch.ones(())) == 1.0  # and restored afterwards
