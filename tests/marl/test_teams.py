"""Games between teams: the algorithms that learn the team reward (every agent's summed) warn when an env's agents
are of several kinds; those that learn each agent's own reward train on it quietly."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from jaderl.api import ALGOS, make_config
from jaderl.envs import make_env
from tests.test_cli import _run, _subprocess

TEAM_REWARD = ["mappo", "qmix", "vdn"]
OWN_REWARD = ["ippo", "iql", "maddpg", "matd3"]


def build(algo: str, env: str) -> list[str]:
    """The warnings ``algo``'s agent gives when it is built for ``env``."""
    rollout = {"horizon": 4, "minibatch_size": 8} if "ppo" in algo else {}
    config = make_config(algo, env, device="cpu", num_envs=2, hidden=[8, 8], **rollout)
    spec = make_env(env, 1, "cpu", seed=0).spec
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ALGOS[algo].agent_cls(config, spec, torch.device("cpu"))
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("algo", TEAM_REWARD + OWN_REWARD)
def test_team_reward_learners_warn_on_a_game_between_teams(algo: str) -> None:
    said = build(algo, "jaderl/simple_tag")
    if algo in TEAM_REWARD:
        assert said == [f"{algo} learns the sum of every agent's reward, and jaderl/simple_tag has agents of 2 kinds "
                        "(adversary, agent): in a game between teams that sum is no team's goal, so use ippo, iql, "
                        "maddpg or matd3, which learn each agent's own reward"]
    else:
        assert said == []
    assert build(algo, "jaderl/simple_spread") == []  # one team


def test_the_command_prints_the_warning_as_one_line(tmp_path: Path) -> None:
    proc = _subprocess(["train", "vdn", "jaderl/simple_tag", "--total-steps", "32", "--eval-episodes", "1",
                        "--set", "warmup_steps=16", "--run-dir", str(tmp_path / "run"), "--device", "cpu"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "warning" in line.lower()]
    assert lines == [line for line in lines if line.startswith("jaderl: warning: vdn learns the sum")] and lines


def test_loading_a_run_does_not_repeat_the_warning_training_gave(tmp_path: Path) -> None:
    from jaderl.api import evaluate, load, train

    run_dir = tmp_path / "vdn"
    with pytest.warns(UserWarning, match="vdn learns the sum of every agent's reward"):
        train("vdn", "jaderl/simple_tag", run_dir=str(run_dir), device="cpu", num_envs=2, hidden=[8, 8],
              total_steps=32, warmup_steps=16, eval_every=32, eval_episodes=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(run_dir)
        load(run_dir, best=False)
        evaluate(run_dir, episodes=1)
    assert [str(w.message) for w in caught] == []


def test_a_game_between_teams_keeps_no_best_policy_and_eval_reports_each_team(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The summed return of predators and prey ranks nothing (a catch adds 30 for the predators and takes 10 from
    the prey), so such a run keeps no best policy: `jaderl eval` and `jaderl.load` take its last state, and the
    evaluation reports each team's return beside the sum."""
    from jaderl.api import evaluate, train
    from jaderl.core.evaluator import BEST_POLICY

    run_dir = tmp_path / "tag"
    train("ippo", "jaderl/simple_tag", run_dir=str(run_dir), device="cpu", num_envs=4, horizon=25,
          minibatch_size=50, hidden=[8, 8], total_steps=200, eval_every=100, eval_episodes=2)
    assert not (run_dir / BEST_POLICY).exists()
    report = evaluate(run_dir, episodes=3)
    assert report["policy"] == "last" and set(report["teams"]) == {"adversary", "agent"}
    assert sum(report["teams"].values()) == pytest.approx(report["mean"], abs=1e-3)
    code, out, err = _run(["eval", str(run_dir), "--episodes", "2"], capsys)
    assert code == 0 and "; adversary " in out and "; agent " in out and out.strip().endswith("last policy"), err
