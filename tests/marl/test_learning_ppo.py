"""Learning tests of MAPPO and IPPO with their default settings (slow: `-m slow`).

jaderl/simple_spread, the MARL issue's targets: a team return (the sum of the 3 agents' rewards over a 25-step
episode) at least 30 % better than a uniformly random policy's (about -81), i.e. >= -57, within 10 minutes of one CPU
core, for both; and >= -50 within 2M env steps for MAPPO. Each run uses the algorithm's defaults (tuned for this), one
torch thread and seed 0, evaluates 100 deterministic episodes (so that a lucky 10-episode evaluation cannot pass)
every rollout (25,600 steps), and stops at the first evaluation that reaches the target; ``time_limit`` guards the
run. MAPPO's two targets share one run. Measured when written (first evaluation at the target; trainer seconds on a
2-core machine, the other core idle):

    mappo >= -57: seed 0 358k steps, 8 s;  seed 1 384k, 8 s;   seed 2 230k, 5 s
    ippo  >= -57: seed 0 358k steps, 10 s; seed 1 358k, 10 s;  seed 2 358k, 10 s
    mappo >= -50: seed 0 563k steps, 12 s; seed 1 870k, 18 s;  seed 2 614k, 13 s

With no target (200-episode evaluations), MAPPO's team return at 2M steps: seeds 1 and 2 -39.8 and -37.9; IPPO seed
0 -46.9 at 1M. Both start from the MAPPO code's orthogonal initialisation (``ortho_init``); with PyTorch's default
one MAPPO took 358k-435k env steps to -57 and 922k-1.2M to -50 and reached -44 to -46 by 2M, IPPO 205k-435k to -57
and -51 by 1M (the same seeds). The whole file takes about 2 minutes of CPU (the navigation test 1.1 of them).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

import jaderl
from jaderl.core.agent import Agent
from jaderl.envs import make_env

pytestmark = pytest.mark.slow
ENV = "jaderl/simple_spread"


@pytest.mark.slow(seconds=45)
def test_ippo_reaches_30_percent_better_than_random_within_10_minutes(tmp_path: Path) -> None:
    target, budget_s = -57.0, 600.0
    torch.set_num_threads(1)
    result = jaderl.train("ippo", ENV, run_dir=str(tmp_path / "ippo"), device="cpu", seed=0, num_threads=1,
                          target_return=target, time_limit=budget_s, eval_every=25_600, eval_episodes=100)
    assert result.solved, (f"best evaluation {result.best_eval_return:.1f} < {target} in {result.steps} steps, "
                           f"{result.time_s:.0f} s ({result.stop_reason})")
    assert result.time_s <= budget_s + 60  # the evaluation that stops it may end past the limit


@pytest.mark.slow(seconds=85)
def test_mappo_reaches_30_percent_better_than_random_within_10_minutes_and_minus_50_within_2m_steps(
        tmp_path: Path) -> None:
    """One run for both MAPPO targets: it trains to -50 and the metrics say when it first passed -57."""
    (target, budget_steps), (first_target, budget_s) = (-50.0, 2_000_000), (-57.0, 600.0)
    torch.set_num_threads(1)
    result = jaderl.train("mappo", ENV, run_dir=str(tmp_path / "mappo"), device="cpu", seed=0, num_threads=1,
                          target_return=target, total_steps=budget_steps, time_limit=1_800, eval_every=25_600,
                          eval_episodes=100)
    assert result.solved, (f"best evaluation {result.best_eval_return:.1f} < {target} in {result.steps} steps, "
                           f"{result.time_s:.0f} s ({result.stop_reason})")
    assert result.steps <= budget_steps
    with open(tmp_path / "mappo" / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row["eval_return_mean"]]
    first = next(row for row in rows if float(row["eval_return_mean"]) >= first_target)
    assert float(first["time_s"]) <= budget_s, f"{first_target} first reached after {first['time_s']} s"


def goal_fraction(agent: Agent, episodes: int = 200) -> float:
    """The fraction of agents within their radius (0.1) of their goal when a deterministic episode of
    vmas/navigation ends (it terminates once every agent is; truncated after 100 steps). An observation is
    [position (2), velocity (2), position - goal (2), lidar (12)]."""
    env = make_env("vmas/navigation", episodes, "cpu", seed=123)
    obs, finished = env.reset(seed=123), torch.zeros(episodes, dtype=torch.bool)
    on_goal = torch.zeros(episodes, env.num_agents)
    while not bool(finished.all()):
        obs, _, terminated, truncated, info = env.step(agent.act(obs, deterministic=True))
        ending = (terminated | truncated) & ~finished
        on_goal[ending] = (info["final_obs"][ending][..., 4:6].norm(dim=-1) < 0.1).float()
        finished |= terminated | truncated
    env.close()
    return float(on_goal.mean())


@pytest.mark.slow(seconds=100)
def test_mappo_brings_the_agents_of_vmas_navigation_to_their_goals(tmp_path: Path) -> None:
    """4 agents, each to its own goal (VMAS's defaults: discrete actions, shared distance-shaping reward, 100-step
    episodes that end once every agent is on its goal). The team return reaches about 16 within 200k-400k steps, while
    the agents still hover around their goals; then the fraction on their goals climbs, not monotonically (these runs
    with PyTorch's default initialisation, ``ortho_init=false``): seed 0 0.29, 0.88, 0.93, 0.86, 0.62, 0.94, 0.98, 0.98
    at 128k, 256k ... 1,024k steps; seed 1 0.10, 0.62, 0.84, 0.91, 0.66, 0.94, 0.89, 0.99 (runs measured every 128k
    steps: measuring resets VMAS envs, which draws random numbers, so these runs are not the test's). The team return
    stays near 16 from 256k steps on whatever the fraction (15.1-16.1 over 100 episodes), so the best checkpoint by
    return is no better than any late one: the test takes the policy at the end of 1,024k steps (40 rollouts of the
    defaults' 1024 x 25 steps), where seeds 0 and 1 had 0.99 and 0.99 (evaluated only there; 0.94 and 0.98 with the
    default initialisation), and asks for 0.8. Random policy: 0.005 of the agents, team return about -5."""
    pytest.importorskip("vmas")
    budget_steps = 1_024_000
    torch.set_num_threads(1)
    result = jaderl.train("mappo", "vmas/navigation", run_dir=str(tmp_path / "nav"), device="cpu", seed=0,
                          num_threads=1, total_steps=budget_steps, eval_every=budget_steps, eval_episodes=10,
                          time_limit=600)
    assert result.steps == budget_steps, result.stop_reason
    fraction = goal_fraction(jaderl.load(tmp_path / "nav", best=False))
    assert fraction >= 0.8, f"{fraction:.2f} of the agents on their goals after {result.steps} steps"
