"""Smoke test of every registered algorithm on every action type it supports: train briefly with real gradient
updates, then load the run with jaderl.api.load and act on a batch of observations."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from jaderl.algos import ALGOS, action_spaces
from jaderl.api import load, train
from jaderl.core.checkpoint import load_checkpoint
from jaderl.envs import make_env

ENVS = {"discrete": "jaderl/CartPole-v1", "continuous": "jaderl/Pendulum-v1"}
CASES = [(name, kind) for name, spec in ALGOS.items() for kind in ENVS if kind in action_spaces(spec.agent_cls)]
TOTAL_STEPS = 256

SETTINGS: dict[str, Any] = {
    "num_envs": 4, "hidden": [32, 32], "total_steps": TOTAL_STEPS, "eval_every": TOTAL_STEPS,
    "checkpoint_every": TOTAL_STEPS, "eval_episodes": 2, "device": "cpu", "seed": 1,
    # off-policy: learn after a short warm-up, from a small buffer
    "warmup_steps": 64, "batch_size": 32, "buffer_size": 1_000, "epsilon_decay_steps": 128,
    "updates_per_step": 1.0,  # presets such as REDQ's 20 would only make the smoke test slow
    # on-policy: two rollouts of 4 x 32 steps
    "horizon": 32, "minibatch_size": 64, "num_epochs": 2,
}


def test_every_algorithm_supports_something() -> None:
    assert {name for name, _ in CASES} == set(ALGOS)
    assert ("ppo", "discrete") in CASES and ("ppo", "continuous") in CASES and ("sac", "continuous") in CASES


@pytest.mark.parametrize(("algo", "kind"), CASES, ids=[f"{a}-{k}" for a, k in CASES])
def test_train_load_act(algo: str, kind: str, tmp_path: Path) -> None:
    env_id = ENVS[kind]
    fields = {f.name for f in dataclasses.fields(ALGOS[algo].agent_cls.config_cls)}
    settings = {k: v for k, v in SETTINGS.items() if k in fields}
    if not ALGOS[algo].agent_cls.on_policy:  # off-policy: one step per explore call, as their defaults do
        settings["horizon"] = 1
    run_dir = tmp_path / "run"
    result = train(algo, env_id, run_dir=str(run_dir), **settings)
    assert result.steps == TOTAL_STEPS and result.stop_reason == "total_steps"
    assert (run_dir / "best_policy.safetensors").exists()
    # gradient updates really happened: every optimizer took steps
    state = load_checkpoint(run_dir)["agent"]
    optimizers = list(state["optimizers"].values())
    assert optimizers
    for optimizer in optimizers:
        assert optimizer["state"], f"an optimizer of {algo} never stepped"
        assert all(float(s["step"]) > 0 for s in optimizer["state"].values())

    for best in (True, False):
        agent = load(run_dir, best=best)
        assert type(agent) is ALGOS[algo].agent_cls and agent.steps == TOTAL_STEPS
        env = make_env(env_id, 7, "cpu", seed=5)
        obs = env.reset()
        for deterministic in (True, False):
            action = agent.act(obs, deterministic=deterministic)  # no gradients: ready for .numpy() as it is
            assert not action.requires_grad
            if kind == "discrete":
                assert action.shape == (7,) and not action.dtype.is_floating_point
                assert int(action.min()) >= 0 and int(action.max()) < env.action_dim
            else:
                assert action.shape == (7, env.action_dim) and action.dtype == torch.float32
                assert torch.isfinite(action).all() and action.abs().max() <= 1.0
            env.step(action)  # the env accepts what the agent produces
        assert torch.equal(agent.act(obs, deterministic=True), agent.act(obs, deterministic=True))
        env.close()
