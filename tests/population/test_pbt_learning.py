"""PBT learns: PPO on jaderl/CartPole-v1, learning rates drawn from 1e-5 to 1e-2.

Target: the best member's evaluation at the end reaches 400 (of 500), and every member that started with a learning
rate below 1e-4 (too small to learn in this budget) has been replaced by a copy of a better one.
Budget: 4 members x 6 periods of 4,096 env steps (24,576 steps each), seed 0; about 60 s on two CPU cores.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytest.importorskip("ray")


@pytest.mark.slow
def test_pbt_rescues_members_with_a_bad_learning_rate(tmp_path: Path) -> None:
    import ray

    from jaderl.population import pbt

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = pbt("ppo", "jaderl/CartPole-v1", members=4, period=4096, generations=6, seed=0,
                     run_dir=str(tmp_path / "pop"), space=["lr=loguniform:1e-5:1e-2"], resample_probability=0.0,
                     num_envs=8, hidden=[32, 32], horizon=64, minibatch_size=128, num_epochs=4, eval_episodes=4,
                     device="cpu")
    finally:
        ray.shutdown()
    with open(tmp_path / "pop" / "population.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    lr = {(int(r["generation"]), int(r["member"])): json.loads(r["hyperparameters"])["lr"] for r in rows}
    slow_starters = [m for m in range(4) if lr[(0, m)] < 1e-4]
    assert slow_starters, "seed 0 no longer draws a learning rate below 1e-4; pick a seed that does"
    for m in slow_starters:
        assert any(r["parent"] != r["member"] for r in rows if int(r["member"]) == m), f"member {m} was never replaced"
    assert all(lr[(5, m)] >= 1e-4 for m in range(4))
    assert result.best_score >= 400
