"""Learning tests of QMIX, VDN and IQL on jaderl/simple_spread with their default settings (slow: `-m slow`).

The MARL issue's target: a team return (the sum of the 3 agents' rewards over a 25-step episode) at least 30 % better
than a uniformly random policy's (about -81), i.e. >= -57, within 10 minutes of one CPU core. IQL is only named as a
preset by the issue; it is held to the same target here. Each run uses the algorithm's defaults (tuned for this), one
torch thread and seed 0, evaluates 100 deterministic episodes every 10k env steps (so that a lucky 10-episode
evaluation cannot pass) and stops at the first evaluation that reaches the target; ``time_limit`` (600 s, the
issue's budget) guards the run. Measured when written (first evaluation >= -57; trainer seconds on a 2-core machine
shared with other jobs, CPU seconds of the process in brackets):

    seed 0: qmix 50k steps, 68 s (49 s);  vdn 80k, 52 s (47 s);  iql 90k, 60 s (53 s)
    seed 1: qmix 50k steps, 78 s (55 s);  vdn 50k, 51 s (34 s);  iql 70k, 72 s (48 s)
    seed 2: qmix 40k steps, 59 s (42 s);  vdn 50k, 51 s (30 s);  iql 50k, 61 s (32 s)

With no target the defaults train on (400k steps): qmix seed 0 reached -40 by 250k steps (255 CPU s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import jaderl

pytestmark = pytest.mark.slow
TARGET = -57.0  # 30 % better than random (-81)
BUDGET_S = 600.0  # 10 minutes of one CPU core


@pytest.mark.slow(seconds=60)
@pytest.mark.parametrize("algo", ["qmix", "vdn", "iql"])
def test_reaches_30_percent_better_than_random_on_simple_spread(algo: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    result = jaderl.train(algo, "jaderl/simple_spread", run_dir=str(tmp_path / algo), device="cpu", seed=0,
                          num_threads=1, target_return=TARGET, time_limit=BUDGET_S, eval_every=10_000,
                          eval_episodes=100)
    assert result.solved, (f"{algo}: best evaluation {result.best_eval_return:.1f} < {TARGET} in {result.steps} "
                           f"steps, {result.time_s:.0f} s ({result.stop_reason})")
    assert result.time_s <= BUDGET_S + 60  # the evaluation that stops it may end past the limit
