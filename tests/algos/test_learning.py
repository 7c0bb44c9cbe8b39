"""Learning tests: each algorithm reaches its task's target within a stated seed and budget (slow: `-m slow`).

"Solved" means one deterministic evaluation of 10 episodes (every ``eval_every`` steps) reached the target; the run
stops there. Budgets are upper bounds: a zoo entry's is its ``total_steps``, and its ``measured`` line says what it
reached when written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import jaderl
from jaderl import zoo
from jaderl.core.config import Config

pytestmark = pytest.mark.slow
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _settings(name: str) -> dict[str, Any]:
    """The settings of a ready-made config in configs/, less its target (each case states its own)."""
    settings = Config.read_yaml(CONFIGS / name)
    return {k: v for k, v in settings.items() if k != "target_return"}


ZOO_ENVS = {"cartpole": "jaderl/CartPole-v1", "pendulum": "jaderl/Pendulum-v1"}
GYMNASIUM_IDS = {("ppo", "cartpole"): "CartPole-v1", ("sac", "pendulum"): "Pendulum-v1",
                 ("td3", "pendulum"): "Pendulum-v1"}
"""Pairs trained on Gymnasium's own env instead of jaderl's torch twin, so both backends are exercised."""

CASES: dict[str, tuple[str, str, float, dict[str, Any]]] = {
    # id: (algo, env, target, settings). Every zoo entry of the classic demo tasks, as a new user runs it: the target
    # and the seed, nothing else, so the budget is the entry's total_steps (jaderl/zoo/*.yaml say what each reached)
    **{f"{e.algo}-{e.task}": (e.algo, GYMNASIUM_IDS.get((e.algo, e.task), ZOO_ENVS[e.task]), float(e.target or 0), {})
       for e in zoo.entries() if e.task in ZOO_ENVS},
    # the demo config file of configs/ (RL-Zoo's PPO settings for CartPole; ~20k steps, seeds 0-5: 20k-30k)
    "ppo-config-cartpole": ("ppo", "CartPole-v1", 475.0, _settings("ppo_cartpole.yaml")),
    # gSDE exploration with RL-Zoo's PPO settings for Pendulum (a config file with zoo: false; seeds 0-1: 12k-16k)
    "ppo-gsde-config-pendulum": ("ppo", "jaderl/Pendulum-v1", -200.0, _settings("ppo_pendulum_gsde.yaml")),
    # SAC's squashed gSDE on the zoo's SAC settings (seeds 0 and 21: 4k steps, as without it)
    "sac-gsde-pendulum": ("sac", "jaderl/Pendulum-v1", -200.0, {"use_sde": True}),
    # mixed precision (hidden layers in bfloat16) on the zoo's settings: about as many steps as float32 (PPO seeds
    # 0-4: 25k-41k; SAC seeds 0-2: 4k-5k)
    "ppo-bfloat16-pendulum": ("ppo", "jaderl/Pendulum-v1", -200.0, {"precision": "bfloat16"}),
    "sac-bfloat16-pendulum": ("sac", "jaderl/Pendulum-v1", -200.0, {"precision": "bfloat16"}),
    # prioritized replay with 3-step returns on the zoo's DQN settings
    "dqn-per-3step-cartpole": ("dqn", "jaderl/CartPole-v1", 475.0, {"use_per": True, "n_step": 3}),
}


SECONDS = {"modsac-pendulum": 65, "noisy_dqn-cartpole": 25, "td3-pendulum": 40, "sac-pendulum": 35,
           "a2c-pendulum": 35, "redq-pendulum": 35, "sac-bfloat16-pendulum": 80, "sac-gsde-pendulum": 35,
           "vpg-pendulum": 30, "dqn-cartpole": 15, "dqn-per-3step-cartpole": 20, "d3qn-cartpole": 30,
           "dueling_dqn-cartpole": 30, "ppo-gsde-config-pendulum": 30, "double_dqn-cartpole": 25,
           "ddpg-pendulum": 25, "vpg-cartpole": 25, "reinforce-cartpole": 20, "reinforce-pendulum": 65}
"""Measured seconds of the longer cases on a shared 2-core machine (run first: see tests/conftest.py)."""


SEEDS: dict[str, tuple[tuple[int, ...], int]] = {"reinforce-pendulum": ((0, 1, 2, 3, 4, 5, 6, 7), 3)}
"""Cases whose seeds succeed only some of the time: (seeds tried in order, how many must reach the target).
REINFORCE (no baseline) on Pendulum reaches -200 within its budget from about three seeds in four (18 of seeds 0-23
on an Intel Xeon with AVX-512), and which ones depends on the CPU's float paths. The test asks for 3 of seeds 0-7,
stopping once 3 have (at three in four, it fails about once in 250 runs)."""


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow(seconds=SECONDS.get(case, 0)))
                                  for case in CASES])
def test_reaches_target(case: str, tmp_path: Path) -> None:
    algo, env, target, settings = CASES[case]
    budget = jaderl.make_config(algo, env, **settings).total_steps
    seeds, needed = SEEDS.get(case, ((0,), 1))
    solved, missed = 0, []
    for seed in seeds:
        result = jaderl.train(algo, env, target_return=target, run_dir=str(tmp_path / f"{case}-{seed}"), device="cpu",
                              seed=seed, **settings)
        assert result.steps <= budget + 8_192  # one rollout past the budget at most
        if result.solved and result.best_eval_return >= target:
            solved += 1
            if solved == needed:
                break
        else:
            missed.append(f"seed {seed}: best evaluation {result.best_eval_return:.1f} in {result.steps} steps")
    assert solved >= needed, f"{case}: {solved} of {len(seeds)} seeds reached {target}, {needed} needed ({missed})"
