"""Learning tests: each algorithm reaches its task's target within a stated seed and budget (slow: `-m slow`).

"Solved" means one deterministic evaluation of 10 episodes (every ``eval_every`` steps) reached the target; the run
stops there. Budgets are upper bounds; the measured step counts at the time of writing are in the comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import jaderl

pytestmark = pytest.mark.slow

CASES: dict[str, tuple[str, str, float, dict[str, Any]]] = {
    # id: (algo, env, target, settings). Gymnasium's own envs and jaderl's torch envs are both exercised.
    "ppo-gym-cartpole": ("ppo", "CartPole-v1", 475.0,  # ~50k steps
                         {"seed": 0, "total_steps": 200_000, "eval_every": 10_000}),
    "ppo-torch-pendulum": ("ppo", "jaderl/Pendulum-v1", -200.0,  # ~150k steps
                           {"seed": 0, "total_steps": 1_000_000, "eval_every": 8_192, "num_envs": 256, "horizon": 32,
                            "gamma": 0.95, "lr": 1e-3, "reward_scale": 0.1, "minibatch_size": 2048}),
    "sac-gym-pendulum": ("sac", "Pendulum-v1", -200.0,  # ~4k steps
                         {"seed": 0, "total_steps": 20_000, "eval_every": 1_000, "hidden": [64, 64], "lr": 1e-3}),
    "dqn-torch-cartpole": ("dqn", "jaderl/CartPole-v1", 475.0,  # ~30k steps (RL-Zoo's budget: 50k)
                           {"seed": 0, "total_steps": 50_000, "eval_every": 2_000}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reaches_target(case: str, tmp_path: Path) -> None:
    algo, env, target, settings = CASES[case]
    result = jaderl.train(algo, env, target_return=target, run_dir=str(tmp_path / case), device="cpu", **settings)
    assert result.solved, f"{case}: best evaluation {result.best_eval_return:.1f} < {target} in {result.steps} steps"
    assert result.best_eval_return >= target
    assert result.steps <= settings["total_steps"] + 8_192  # one rollout past the budget at most
