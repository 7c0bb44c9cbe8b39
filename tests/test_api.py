"""Tests of the training loop (jaderl.core.loop) through the Python API (jaderl.api): run artefacts, stopping rules,
determinism, save/load, resume, and refusing to overwrite a run."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import jaderl
from jaderl import api
from jaderl.algos import PPO, PPOConfig
from jaderl.core.checkpoint import CHECKPOINT_JSON, load_checkpoint
from jaderl.core.config import Config, ConfigError
from jaderl.core.evaluator import run_episodes
from jaderl.core.loop import Trainer
from jaderl.core.loop import train as train_loop
from jaderl.envs import make_env

ENV = "jaderl/CartPole-v1"
Settings = Callable[..., dict[str, Any]]


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _steps(run_dir: Path) -> list[int]:
    return [int(r["step"]) for r in _rows(run_dir)]  # int(): steps are written as integers


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_short_run_writes_every_artefact(tmp_path: Path, tiny_ppo: Settings) -> None:
    run_dir = tmp_path / "run"
    result = jaderl.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo())
    assert (result.steps, result.stop_reason, result.solved) == (512, "total_steps", False)
    assert result.run_dir == str(run_dir)
    assert result.time_s > 0 and math.isfinite(result.best_eval_return)
    # metrics.csv: one row per evaluation
    rows = _rows(run_dir)
    assert {"step", "time_s", "eval_return_mean", "eval_return_std"} <= set(rows[0])
    assert _steps(run_dir) == [256, 512]
    assert all(float(r["eval_return_mean"]) >= 1 and float(r["eval_return_std"]) >= 0 for r in rows)
    assert result.best_eval_return == max(float(r["eval_return_mean"]) for r in rows)
    assert result.last_eval_return == float(rows[-1]["eval_return_mean"])
    # the curve, TensorBoard events, the config
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    saved = PPOConfig.from_dict(Config.read_yaml(run_dir / "config.yaml"))
    assert saved == api.make_config("ppo", ENV, run_dir=str(run_dir), **tiny_ppo())
    # one checkpoint, in strict JSON plus safetensors, and the best policy
    assert [p.name for p in run_dir.glob("ckpt-*")] == ["ckpt-512.safetensors"]
    meta = json.loads((run_dir / CHECKPOINT_JSON).read_text(),
                      parse_constant=lambda c: pytest.fail(f"checkpoint.json holds {c}, which is not JSON"))
    assert meta["tensor_file"] == "ckpt-512.safetensors"
    state = load_checkpoint(run_dir)
    assert state["agent"]["counters"]["steps"] == 512 and state["config"]["total_steps"] == 512
    policy = load_file(str(run_dir / "best_policy.safetensors"))
    assert any(k.startswith("actor.") for k in policy) and any(k.startswith("obs_norm.") for k in policy)
    assert not any(k.startswith("critic.") for k in policy)
    assert not list(run_dir.glob("*.tmp")) and not (run_dir / "stop").exists()


def test_stops_on_time_limit(tmp_path: Path, tiny_ppo: Settings) -> None:
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"),
                          **tiny_ppo(total_steps=10**8, time_limit=0.5, eval_every=10**8, checkpoint_every=10**8))
    assert result.stop_reason == "time_limit"
    assert 0.5 <= result.time_s < 30 and result.steps < 10**8
    assert _steps(tmp_path / "run") == [result.steps]  # evaluated and checkpointed once, at the end
    assert load_checkpoint(tmp_path / "run")["agent"]["counters"]["steps"] == result.steps


def test_stops_when_solved(tmp_path: Path, tiny_ppo: Settings) -> None:
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **tiny_ppo(total_steps=10**6, target_return=5))
    assert (result.stop_reason, result.solved, result.steps) == ("solved", True, 256)  # the first evaluation
    assert result.best_eval_return >= 5
    assert load_checkpoint(tmp_path / "run")["agent"]["counters"]["steps"] == 256


def test_not_solved_below_target(tmp_path: Path, tiny_ppo: Settings) -> None:
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **tiny_ppo(total_steps=256, target_return=1e4))
    assert (result.stop_reason, result.solved) == ("total_steps", False)


def test_stops_on_stop_file(tmp_path: Path, tiny_ppo: Settings) -> None:
    run_dir = tmp_path / "run"
    seen: list[dict[str, Any]] = []

    def progress(info: dict[str, Any]) -> None:
        seen.append(info)
        if info["steps"] == 256:
            (run_dir / "stop").touch()

    result = jaderl.train("ppo", ENV, run_dir=str(run_dir), progress=progress,
                          **tiny_ppo(total_steps=10**6, eval_every=10**6, checkpoint_every=10**6))
    assert result.stop_reason == "stop_file"
    assert result.steps == 256 + 4 * 32  # one more iteration (num_envs * horizon) sees the file
    assert not (run_dir / "stop").exists()  # consumed, so a resume does not stop at once
    assert [i["steps"] for i in seen] == [128, 256, 384] and [i["done"] for i in seen] == [False, False, True]
    assert _steps(run_dir) == [384] and load_checkpoint(run_dir)["agent"]["counters"]["steps"] == 384


def test_a_stop_file_seen_when_a_budget_ends_the_run_is_consumed(tmp_path: Path, tiny_ppo: Settings) -> None:
    """The step that sees the stop file also reaches a budget: the run ends for its budget and the file is gone, so
    a resume with a larger budget (or a population member's next period) trains on instead of stopping at once."""
    run_dir = tmp_path / "run"

    def progress(info: dict[str, Any]) -> None:
        if info["steps"] == 256:
            (run_dir / "stop").touch()

    result = jaderl.train("ppo", ENV, run_dir=str(run_dir), progress=progress,
                          **tiny_ppo(total_steps=384, eval_every=10**6, checkpoint_every=10**6))
    assert result.stop_reason == "total_steps" and not (run_dir / "stop").exists()
    resumed = jaderl.resume(run_dir, total_steps=512)
    assert (resumed.stop_reason, resumed.steps) == ("total_steps", 512)
    config = api.make_config("ppo", ENV, run_dir=str(tmp_path / "member"), **tiny_ppo(total_steps=10**6))
    with Trainer(config, PPO) as trainer:
        for budget, reason in (({"steps": 128}, "period"), ({"until_time_s": 1e-9}, "time_limit")):
            (trainer.run_dir / "stop").touch()
            assert trainer.run(**budget).stop_reason == reason
            assert not (trainer.run_dir / "stop").exists()


def test_same_seed_same_metrics(tmp_path: Path, tiny_ppo: Settings) -> None:
    columns = ("step", "eval_return_mean", "eval_return_std", "eval_episode_length", "train_episode_return")
    runs = []
    for name in ("a", "b"):
        jaderl.train("ppo", ENV, run_dir=str(tmp_path / name), **tiny_ppo(total_steps=768, normalize_obs=True))
        runs.append([tuple(r[c] for c in columns) for r in _rows(tmp_path / name)])
    assert len(runs[0]) == 3 and runs[0] == runs[1]
    a, b = load_checkpoint(tmp_path / "a")["agent"], load_checkpoint(tmp_path / "b")["agent"]
    for key, value in a["networks"]["actor"].items():
        assert torch.equal(value, b["networks"]["actor"][key])


def _actions(agent: Any, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(99)
    return agent.act(obs, deterministic=True), agent.act(obs, deterministic=False)


def test_load_reproduces_evaluations(tmp_path: Path, tiny_ppo: Settings) -> None:
    run_dir = tmp_path / "run"
    result = jaderl.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo(total_steps=768, normalize_obs=True))
    settings = api.make_config("ppo", ENV, **tiny_ppo())
    rows = _rows(run_dir)
    # the best policy replays the best evaluation exactly: evaluation k uses eval seed (seed + 1) + k * eval_episodes
    best_index = max(range(len(rows)), key=lambda i: float(rows[i]["eval_return_mean"]))
    best_seed = settings.seed + 1 + best_index * settings.eval_episodes
    report = api.evaluate(run_dir, episodes=settings.eval_episodes, seed=best_seed)
    assert report["mean"] == pytest.approx(result.best_eval_return, abs=1e-4)
    assert report["episodes"] == 2 and len(report["returns"]) == 2
    # the last state replays the last evaluation (the final checkpoint follows it)
    last = api.load(run_dir, best=False)
    env = make_env(ENV, settings.eval_episodes, "cpu", seed=settings.seed + 1)
    returns, _ = run_episodes(last, env, settings.seed + 1 + (len(rows) - 1) * settings.eval_episodes)
    assert returns.mean().item() == pytest.approx(float(rows[-1]["eval_return_mean"]), abs=1e-4)
    assert last.obs_norm.count.item() > 1  # normalisation statistics came back with the agent
    # loading twice gives identical actions, deterministic and sampled
    obs = make_env(ENV, 16, "cpu", seed=5).reset()
    for best in (True, False):
        first, second = _actions(api.load(run_dir, best=best), obs), _actions(api.load(run_dir, best=best), obs)
        assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_load_round_trips_a_known_agent(tmp_path: Path, tiny_ppo: Settings) -> None:
    """An agent trained here, checkpointed by the loop's own code path, comes back acting identically."""
    torch.manual_seed(0)
    config = api.make_config("ppo", "jaderl/Pendulum-v1", **tiny_ppo(total_steps=256, normalize_obs=True),
                             run_dir=str(tmp_path / "run"))
    seen: list[PPO] = []

    class Spy(PPO):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen.append(self)

    train_loop(config, Spy)
    trained = seen[0]
    obs = make_env("jaderl/Pendulum-v1", 8, "cpu", seed=1).reset()
    loaded = api.load(tmp_path / "run", best=False)
    assert type(loaded) is PPO and loaded.steps == trained.steps == 256
    expected, got = _actions(trained, obs), _actions(loaded, obs)
    assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])
    assert expected[0].shape == (8, 1)


def test_resume_continues_step_counts(tmp_path: Path, tiny_ppo: Settings) -> None:
    run_dir = tmp_path / "run"
    first = jaderl.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo())
    seen: list[int] = []
    result = jaderl.resume(run_dir, progress=lambda info: seen.append(info["steps"]), total_steps=1024,
                           algo="ppo", env=ENV, run_dir=str(run_dir))  # unchanged values, as in its config.yaml
    assert (result.steps, result.stop_reason) == (1024, "total_steps")
    assert seen == [640, 768, 896, 1024]  # continued from the checkpoint at 512, not from 0
    steps = _steps(run_dir)
    assert steps == [256, 512, 768, 1024] and len(set(steps)) == len(steps)
    assert load_checkpoint(run_dir)["agent"]["counters"]["steps"] == 1024
    assert [p.name for p in run_dir.glob("ckpt-*")] == ["ckpt-1024.safetensors"]
    assert Config.read_yaml(run_dir / "config.yaml")["total_steps"] == 1024
    assert result.time_s > first.time_s  # the clock carries on from the checkpoint too


def test_resume_cannot_change_algo_or_env(tmp_path: Path, tiny_ppo: Settings) -> None:
    run_dir = tmp_path / "run"
    jaderl.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo(total_steps=128, eval_every=128))
    before = _snapshot(run_dir)
    with pytest.raises(ConfigError, match="env='jaderl/Pendulum-v1' cannot change when resuming"):
        jaderl.resume(run_dir, env="jaderl/Pendulum-v1")
    with pytest.raises(ConfigError, match="algo='dqn' cannot change when resuming"):
        jaderl.resume(run_dir, algo="dqn")
    assert _snapshot(run_dir) == before


def test_resume_without_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a run")
    with pytest.raises(ConfigError, match="no readable checkpoint"):
        jaderl.resume(tmp_path, total_steps=10)
    assert _snapshot(tmp_path) == {"notes.txt": b"not a run"}


def test_existing_run_dir_is_refused_and_intact(tmp_path: Path, tiny_ppo: Settings) -> None:
    run_dir = tmp_path / "run"
    jaderl.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo(total_steps=256))
    before = _snapshot(run_dir)
    with pytest.raises(ConfigError, match=r"already holds a run.*--resume"):
        jaderl.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo(total_steps=256))
    assert _snapshot(run_dir) == before
    other = tmp_path / "other"
    (other / "sub").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"already holds files but no checkpoint"):
        jaderl.train("ppo", ENV, run_dir=str(other), **tiny_ppo(total_steps=256))
    assert [p.name for p in other.iterdir()] == ["sub"]


def test_empty_existing_run_dir_is_used(tmp_path: Path, tiny_ppo: Settings) -> None:
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path), **tiny_ppo(total_steps=128, eval_every=128))
    assert result.steps == 128 and (tmp_path / CHECKPOINT_JSON).exists()


def test_api_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown algorithm 'nope'; choose one of: ppo"):
        api.make_config("nope", ENV)
    with pytest.raises(ConfigError, match="cannot train on jaderl/Pendulum-v1: its actions are continuous"):
        jaderl.train("dqn", "jaderl/Pendulum-v1", run_dir=str(tmp_path / "run"), device="cpu")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="episodes=0"):
        api.evaluate(tmp_path, episodes=0)
    for episodes in ("3", 2.5, True):
        with pytest.raises(ConfigError, match=rf"^episodes={episodes!r} is out of range: it must be a whole number "
                                              r">= 1 \(how many episodes to run\)$"):
            api.evaluate(tmp_path, episodes=episodes)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^best='no' must be True \(the best evaluated policy\) or False"):
        api.load(tmp_path, best="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"env must be an env id \(a str such as 'jaderl/CartPole-v1'\), not 5"):
        jaderl.train("ppo", 5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown algorithm 3; choose one of: ppo"):
        jaderl.train(3, ENV)  # type: ignore[arg-type]
    for call in (jaderl.load, jaderl.resume, api.evaluate):
        with pytest.raises(ConfigError, match=r"run_dir must be a run directory's path \(a str or pathlib.Path\), "
                                              "not None"):
            call(None)  # type: ignore[operator]


def test_a_resume_may_repeat_a_setting_outside_the_hyperparameter_ranges(tmp_path: Path, tiny_ppo: Settings) -> None:
    """gamma=0.8 is a valid config (in [0, 1]) but outside the range a search may move gamma in ([0.9, 0.9999]): the
    run's own value passes on resume; a change is still checked against the range."""
    run_dir = tmp_path / "run"
    api.train("ppo", "jaderl/CartPole-v1", run_dir=str(run_dir), **tiny_ppo(gamma=0.8, total_steps=128))
    assert api.resume(run_dir, gamma=0.8, total_steps=256).steps == 256
    with pytest.raises(ConfigError, match=r"gamma=0.5 is out of range"):
        api.resume(run_dir, gamma=0.5, total_steps=512)


def test_a_resume_may_repeat_a_setting_in_another_form(tmp_path: Path, tiny_ppo: Settings) -> None:
    """A setting given again as the run has it, in a form the config accepts (a tuple for a list, 4.0 for 4), is not
    a change; a field that is not a setting is refused as unknown."""
    run_dir = tmp_path / "run"
    api.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo(total_steps=128, eval_every=128))
    hidden, num_envs = api.load(run_dir).config.hidden, api.load(run_dir).config.num_envs
    result = api.resume(run_dir, hidden=tuple(hidden), num_envs=float(num_envs), total_steps=256)
    assert result.steps == 256
    before = _snapshot(run_dir)
    with pytest.raises(ConfigError, match=r"^hidden=\(8,\) cannot change when resuming"):
        api.resume(run_dir, hidden=(8,), total_steps=512)
    with pytest.raises(ConfigError, match=r"^unknown field 'validate' for PPOConfig"):
        api.resume(run_dir, validate=1, total_steps=512)
    assert _snapshot(run_dir) == before


def test_evaluate_refuses_a_seed_that_is_not_a_whole_number(tmp_path: Path) -> None:
    for seed in ("x", 1.5, -1, True):
        with pytest.raises(ConfigError, match=rf"^seed={seed!r} is out of range: it must be a whole number >= 0"):
            api.evaluate(tmp_path, episodes=2, seed=seed)  # type: ignore[arg-type]


def test_load_of_a_file_names_the_run_directory_that_holds_it(tmp_path: Path, tiny_ppo: Settings) -> None:
    """``jaderl.load`` takes the run directory; its best-policy file alone is refused in one sentence naming the
    directory to pass instead."""
    run_dir = tmp_path / "run"
    jaderl.train("ppo", ENV, run_dir=str(run_dir), **tiny_ppo(total_steps=128, eval_every=128))
    for call in (jaderl.load, api.evaluate):
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(run_dir / 'best_policy.safetensors'))} is a file, "
                                              rf"not a run directory; pass the run directory that holds it "
                                              rf"\({re.escape(str(run_dir))}\)$"):
            call(run_dir / "best_policy.safetensors")
    assert jaderl.load(run_dir).steps == 128
