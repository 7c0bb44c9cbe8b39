"""A run's life on disk: its directory, resume rules, checkpoints that never hold a diverged agent, evaluations and
the best policy across a crash, damaged files."""

from __future__ import annotations

import csv
import math
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

import jaderl
from jaderl.algos import ALGOS
from jaderl.api import make_config
from jaderl.core import checkpoint as checkpoint_module
from jaderl.core import loop
from jaderl.core.checkpoint import CHECKPOINT_JSON, load_checkpoint, save_tensors
from jaderl.core.config import ConfigError
from jaderl.core.evaluator import BEST_POLICY, Evaluator
from jaderl.core.loop import Trainer, TrainingError, prepare_run_dir
from jaderl.envs import make_env
from jaderl.envs.classic import PendulumEnv
from jaderl.envs.vec import EnvError

ENV = "jaderl/CartPole-v1"
Settings = Any


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def run_dir(tmp_path: Path, tiny_ppo: Settings) -> Path:
    """A finished tiny PPO run (512 steps, checkpoints and evaluations at 256 and 512)."""
    jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **tiny_ppo())
    return tmp_path / "run"


# --- the run directory ---

def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> FrozenClock:
            return cls(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(loop, "datetime", FrozenClock)
    dirs = [prepare_run_dir(make_config("ppo", ENV), resume=False) for _ in range(3)]
    assert [d.name for d in dirs] == ["ppo-jaderl_CartPole-v1-s0-20260102-030405",
                                      "ppo-jaderl_CartPole-v1-s0-20260102-030405-2",
                                      "ppo-jaderl_CartPole-v1-s0-20260102-030405-3"]
    assert all(d.is_dir() for d in dirs)


def test_a_run_directory_that_is_a_file_or_holds_other_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"afile is a file; pick another --run-dir$"):
        prepare_run_dir(make_config("ppo", ENV, run_dir=str(tmp_path / "afile")), resume=False)
    (tmp_path / "failed" / "tb").mkdir(parents=True)  # what a run that failed before its first checkpoint leaves
    with pytest.raises(ConfigError, match=r"already holds files but no checkpoint; delete them"):
        prepare_run_dir(make_config("ppo", ENV, run_dir=str(tmp_path / "failed")), resume=False)
    assert (tmp_path / "afile").read_text() == "x" and (tmp_path / "failed" / "tb").is_dir()


# --- resume ---

@pytest.mark.parametrize(("settings", "match"), [
    ({"hidden": [16, 16]}, r"^hidden=\[16, 16\] cannot change when resuming .*a resume may change only total_steps"),
    ({"normalize_advantages": False}, r"^normalize_advantages=False cannot change when resuming"),
    ({"lr": 0.5}, r"^lr=0.5 is out of range: it must be a number in \[1e-06, 0.1\]"),  # mutable, within its range
    ({"minibatch_size": 32}, r"^minibatch_size=32 cannot change"),
    ({"run_dir": "elsewhere"}, r"^run_dir='elsewhere' cannot be given when resuming"),
    ({}, r"already reached its budget \(total_steps=512\) at step 512; resume with a larger --total-steps"),
    ({"total_steps": 1024, "time_limit": 0.001}, r"already reached its budget \(time_limit=0.001\) at step 512"),
])
def test_resume_refuses_what_the_checkpoint_cannot_take(run_dir: Path, settings: dict[str, Any], match: str) -> None:
    before = _snapshot(run_dir)
    with pytest.raises(ConfigError, match=match):
        jaderl.resume(run_dir, **settings)
    assert _snapshot(run_dir) == before


def test_resume_may_change_budgets_cadence_and_unchanged_settings(run_dir: Path, tiny_ppo: Settings) -> None:
    result = jaderl.resume(run_dir, total_steps=640, eval_every=128, hidden=tiny_ppo()["hidden"], seed=3)
    assert result.steps == 640


@pytest.mark.parametrize(("every", "due"), [(64, 576), (1024, 1024)])
def test_a_resume_that_changes_the_cadence_evaluates_and_checkpoints_at_the_new_one(run_dir: Path, every: int,
                                                                                     due: int) -> None:
    config = jaderl.load(run_dir, best=False).config.replace(run_dir=str(run_dir), total_steps=2048,
                                                             eval_every=every, checkpoint_every=every)
    with Trainer(config, ALGOS[config.algo].agent_cls, resume=True) as trainer:
        assert (trainer.agent.steps, trainer.next_eval, trainer.next_checkpoint) == (512, due, due)


# --- checkpoints ---

def test_a_diverged_agent_never_replaces_the_last_checkpoint(run_dir: Path) -> None:
    before = _snapshot(run_dir)
    config = jaderl.load(run_dir, best=False).config.replace(run_dir=str(run_dir))
    with Trainer(config, ALGOS[config.algo].agent_cls, resume=True) as trainer:
        with torch.no_grad():
            next(trainer.agent.critic.parameters())[0, 0] = math.nan
        with pytest.raises(TrainingError, match=r"^the agent's parameters became NaN or infinite by step 512; lower "
                                                r"the learning rate"):
            trainer.checkpoint()
    assert _snapshot(run_dir) == before


def test_a_failed_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(tensors: dict, path: str, metadata: Any = None) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_tensors(tmp_path / "policy.safetensors", {"w": torch.zeros(2)})
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_checkpoint_is_one_sentence(run_dir: Path) -> None:
    tensor_file = next(run_dir.glob("ckpt-*.safetensors"))
    tensor_file.write_bytes(tensor_file.read_bytes()[:100])
    with pytest.raises(FileNotFoundError, match="holds no readable checkpoint"):
        jaderl.load(run_dir, best=False)
    assert jaderl.load(run_dir).steps == 512  # the best policy is intact: evaluating it needs no tensor file
    (run_dir / CHECKPOINT_JSON).write_text('{"state": {"config": {"algo": "ppo"}, "counters": {"time_s": 1}, '
                                           '"agent": {"steps": 5}}}')
    with pytest.raises(ConfigError, match="holds no readable checkpoint"):
        jaderl.resume(run_dir, total_steps=1024)


def test_loading_an_agent_reads_no_replay_buffer(tmp_path: Path) -> None:
    jaderl.train("dqn", ENV, run_dir=str(tmp_path / "run"), total_steps=300, warmup_steps=100, hidden=[16],
                 eval_every=300, eval_episodes=1, device="cpu", zoo=False)  # one sub-env: 300 transitions
    full = load_checkpoint(tmp_path / "run")
    agent_only = load_checkpoint(tmp_path / "run", part="agent")
    assert full["buffer"][0]["obs"].shape[0] == 300
    assert agent_only.keys() == full["agent"].keys()
    q_net = full["agent"]["networks"]["q_net"]
    assert all(torch.equal(agent_only["networks"]["q_net"][k], v) for k, v in q_net.items())


# --- evaluations and the best policy ---

def test_ctrl_c_during_an_evaluation_has_it_done_again_after_resume(tmp_path: Path, tiny_ppo: Settings,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    evaluate = Evaluator.evaluate

    def interrupted(self: Evaluator, *args: Any) -> dict[str, float]:
        raise KeyboardInterrupt

    monkeypatch.setattr(Evaluator, "evaluate", interrupted)
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **tiny_ppo())
    assert (result.stop_reason, result.steps) == ("interrupted", 256)
    assert load_checkpoint(tmp_path / "run")["counters"]["next_eval"] == 256  # still due
    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    jaderl.resume(tmp_path / "run")
    steps = [line.split(",")[0] for line in (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == ["384", "512"]  # the evaluation due at 256 runs after the resumed run's first rollout


def test_resume_keeps_a_newer_best_policy_and_skips_a_cut_metrics_line(run_dir: Path) -> None:
    with safe_open(str(run_dir / BEST_POLICY), framework="pt") as f:
        meta = f.metadata()
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    best = max(float(r.split(",")[2]) for r in rows[1:])
    assert float(meta["eval_return_mean"]) == best and int(meta["step"]) in (256, 512)
    # a crash after an evaluation that was better than anything before the checkpoint at step 256 ...
    save_tensors(run_dir / BEST_POLICY, {}, {"step": "300", "eval_return_mean": "1000.0"})
    with open(run_dir / "metrics.csv", "a") as f:
        f.write("45")  # ... and a line cut short
    env = make_env(ENV, 1, "cpu")
    evaluator = Evaluator(env, run_dir, seed=4)
    try:  # the state of a checkpoint at step 256: its rows replace the file's
        evaluator.load_state_dict({"rows": [r for r in load_checkpoint(run_dir)["evaluator"]["rows"]
                                            if r["step"] <= 256]})
        assert [int(r["step"]) for r in evaluator.rows] == [256]
        assert len((run_dir / "metrics.csv").read_text().splitlines()) == 2  # the header and step 256
        assert evaluator.best_return == 1000.0  # a worse later policy does not overwrite the best file
    finally:
        evaluator.close()


def test_a_ctrl_c_while_the_best_policy_is_written_records_no_evaluation_it_lacks(
        run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The best-policy file may be ahead of the recorded evaluations (a resume keeps it), never behind them: an
    evaluation whose policy was not saved is not recorded, so it is done again instead of claiming a better return
    than the file holds."""
    import jaderl.core.evaluator as evaluator_module

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    (tmp_path / "new").mkdir()
    evaluator = Evaluator(make_env(ENV, 1, "cpu"), tmp_path / "new", seed=4)
    monkeypatch.setattr(evaluator_module, "save_tensors", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            evaluator.evaluate(jaderl.load(run_dir), 128, 1.0, {})
        assert evaluator.rows == [] and evaluator.best_return == -math.inf
    finally:
        evaluator.close()


def test_consecutive_evaluations_share_no_start_state(tmp_path: Path) -> None:
    """A Gymnasium vector env seeds sub-env i with seed + i: evaluation k must not reuse evaluation k-1's seeds."""
    env = make_env("CartPole-v1", 4, "cpu")
    starts: list[torch.Tensor] = []
    reset = env.reset

    def recording_reset(seed: int | None = None) -> torch.Tensor:
        starts.append(obs := reset(seed=seed))
        return obs

    env.reset = recording_reset  # type: ignore[method-assign]
    agent = ALGOS["dqn"].agent_cls(make_config("dqn", "CartPole-v1", hidden=[8], device="cpu"), env,
                                          torch.device("cpu"))
    evaluator = Evaluator(env, tmp_path, seed=7)
    try:
        for step in range(3):
            evaluator.evaluate(agent, step, 0.0, {})
    finally:
        evaluator.close()
        env.close()
    rows = torch.cat(starts)
    assert len(starts) == 3 and len(torch.unique(rows, dim=0)) == 12, "12 evaluation episodes, 12 different starts"


def test_nan_actions_are_named_as_the_agents() -> None:
    env = make_env("Pendulum-v1", 2, "cpu", seed=0)
    try:
        env.reset(seed=0)
        with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite; lower the learning rate"):
            env.step(torch.full((2, 1), math.nan))
    finally:
        env.close()


def test_a_resumed_gymnasium_run_is_reproducible(tmp_path: Path) -> None:
    """Gymnasium envs have no generator to checkpoint: a resumed run reseeds them from its seed and step."""
    jaderl.train("dqn", "CartPole-v1", run_dir=str(tmp_path / "run"), total_steps=200, warmup_steps=100,
                 hidden=[16], eval_every=200, eval_episodes=1, device="cpu")
    for copy in ("a", "b"):
        shutil.copytree(tmp_path / "run", tmp_path / copy)
        jaderl.resume(tmp_path / copy, total_steps=400)
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert torch.equal(a["buffer"][0]["obs"], b["buffer"][0]["obs"])
    assert all(torch.equal(v, b["agent"]["networks"]["q_net"][k]) for k, v in a["agent"]["networks"]["q_net"].items())


def test_a_ctrl_c_after_an_evaluations_row_is_written_does_not_repeat_it(
        tmp_path: Path, tiny_ppo: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while an evaluation's results are being written (here: its curve drawn, after its row): the resumed
    run does not evaluate again before the next evaluation is due."""
    from jaderl.core import evaluator as evaluator_module

    calls: list[int] = []

    def interrupted(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:  # the first evaluation's curve; the one drawn when the run closes goes through
            raise KeyboardInterrupt

    monkeypatch.setattr(evaluator_module, "PLOT_EVERY_S", -1.0)  # every evaluation draws the curve
    monkeypatch.setattr(evaluator_module, "plot_learning_curve", interrupted)
    settings = tiny_ppo(total_steps=1024, eval_every=256)
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **settings)
    assert result.stop_reason == "interrupted" and result.steps == 256
    monkeypatch.undo()
    jaderl.resume(tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert steps == [256, 512, 768, 1024], steps  # not also 384, the resumed run's first rollout


def test_a_resume_that_restarts_the_episodes_forgets_their_running_returns(tmp_path: Path) -> None:
    """A Gymnasium env's episodes start anew on a resume: the discounted returns that scale the rewards
    (``normalize_reward``) and the episode returns being summed restart from 0 with them."""
    settings: dict[str, Any] = {"num_envs": 2, "horizon": 16, "hidden": [8], "minibatch_size": 16,
                                "normalize_reward": True, "total_steps": 64, "eval_every": 10**6, "device": "cpu"}
    jaderl.train("ppo", "CartPole-v1", run_dir=str(tmp_path / "run"), **settings)
    saved = load_checkpoint(tmp_path / "run")["agent"]["running_stats"]["reward_norm"]["running"]
    assert saved.abs().sum() > 0  # episodes were under way when it stopped
    with Trainer(make_config("ppo", "CartPole-v1", run_dir=str(tmp_path / "run"), **{**settings, "total_steps": 128}),
                 ALGOS["ppo"].agent_cls, resume=True) as trainer:
        assert torch.equal(trainer.agent.reward_norm.running, torch.zeros(2))
        assert torch.equal(trainer.agent.episodes.running, torch.zeros_like(trainer.agent.episodes.running))
        assert trainer.agent.reward_norm.count.item() > 1  # the statistics themselves carry on


def test_a_resumed_torch_env_run_continues_its_random_stream(tmp_path: Path, tiny_ppo: Settings,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The env is rebuilt from the run's seed, then given the checkpoint's state (its sub-envs, step counters and
    generator): the resumed run continues the episodes it was in, without a reset, and later episodes start from the
    checkpoint's stream, not where the first run's did."""
    jaderl.train("ppo", "jaderl/Pendulum-v1", run_dir=str(tmp_path / "run"), **tiny_ppo())
    config = make_config("ppo", "jaderl/Pendulum-v1", **tiny_ppo())
    starts: list[torch.Tensor] = []
    reset = PendulumEnv.reset

    def recording_reset(self: PendulumEnv, seed: int | None = None) -> torch.Tensor:
        obs = reset(self, seed)
        if self.num_envs == config.num_envs:  # the training env's (the evaluator's has eval_episodes sub-envs)
            starts.append(obs)
        return obs

    monkeypatch.setattr(PendulumEnv, "reset", recording_reset)
    jaderl.resume(tmp_path / "run", total_steps=768)
    monkeypatch.undo()
    first_run = PendulumEnv(config.num_envs, seed=config.seed).reset()
    assert starts == [] and first_run.shape[0] == config.num_envs  # no reset: the episodes went on


def test_tensorboard_hides_what_a_resume_redoes(run_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    first = set((run_dir / "tb").iterdir())
    evaluator = Evaluator(make_env(ENV, 1, "cpu"), run_dir, seed=4)
    evaluator.load_state_dict({"rows": [r for r in load_checkpoint(run_dir)["evaluator"]["rows"] if r["step"] <= 256]})
    evaluator.evaluate(jaderl.load(run_dir), 384, 1.0, {})
    evaluator.close()
    (new,) = set((run_dir / "tb").iterdir()) - first
    starts = [e.step for e in EventFileLoader(str(new)).Load() if e.HasField("session_log")]
    assert starts == [257]  # TensorBoard purges the points at steps >= 257 of the earlier files


def test_tensorboard_hides_what_a_resume_redoes_from_a_state_before_the_first_evaluation(run_dir: Path) -> None:
    """A checkpoint taken before any evaluation (checkpoint_every below eval_every) and a crash after one: the
    rewritten metrics.csv holds no row, and TensorBoard shows none of the crashed run's points either."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    first = set((run_dir / "tb").iterdir())
    evaluator = Evaluator(make_env(ENV, 1, "cpu"), run_dir, seed=4)
    evaluator.load_state_dict({"rows": []})
    evaluator.evaluate(jaderl.load(run_dir), 128, 1.0, {})
    evaluator.close()
    (new,) = set((run_dir / "tb").iterdir()) - first
    starts = [e.step for e in EventFileLoader(str(new)).Load() if e.HasField("session_log")]
    assert starts == [0]  # TensorBoard purges every point of the earlier files
    assert [line.split(",")[0] for line in (run_dir / "metrics.csv").read_text().splitlines()] == ["step", "128"]


def test_device_names_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"^device='cuda:x' is invalid"):
        make_config("ppo", ENV, device="cuda:x")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"^device='cuda:3': only 1 GPUs are visible; use a lower index$"):
        loop.resolve_device("cuda:3")


def test_a_resume_from_damaged_tensors_loses_no_saved_file(run_dir: Path) -> None:
    tensor_file = next(run_dir.glob("ckpt-*.safetensors"))
    tensor_file.write_bytes(tensor_file.read_bytes()[:100])
    before = _snapshot(run_dir)
    with pytest.raises(FileNotFoundError, match="holds no readable checkpoint"):
        jaderl.resume(run_dir, total_steps=1024)
    assert _snapshot(run_dir) == before  # metrics.csv, config.yaml, the best policy: as they were


def _edit_checkpoint(run_dir: Path, edit: Any) -> None:
    """Change the JSON part of ``run_dir``'s checkpoint (its tensors stay as they were)."""
    import json

    path = run_dir / CHECKPOINT_JSON
    meta = json.loads(path.read_text())
    edit(meta["state"])
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(("edit", "said"), [
    (lambda state: state["config"].update(hidden=[16, 16]), r"size mismatch"),  # networks of other sizes
    (lambda state: state["config"].update(num_envs=3), r"must match|size"),  # episodes of other sub-envs
    (lambda state: state.pop("rng"), r"'rng'"),
    (lambda state: state["evaluator"].update(rows=[{"step": 1}]), r"'eval_return_mean'"),
])
def test_a_resume_from_a_checkpoint_at_odds_with_itself_is_one_sentence_and_loses_no_saved_file(
        run_dir: Path, edit: Any, said: str) -> None:
    """A checkpoint whose JSON does not fit its tensors (edited, or half of it from another run): one sentence naming
    the directory, before anything on disk changes (metrics.csv keeps its history), from ``jaderl.resume`` and from a
    Trainer built on the directory."""
    _edit_checkpoint(run_dir, edit)
    before = _snapshot(run_dir)
    damaged = (rf"^{run_dir} holds a damaged checkpoint \(.*({said}).*\); restore the run directory from a copy or "
               r"start a new run$")
    unreadable = rf"^{run_dir} holds no readable checkpoint \({run_dir / CHECKPOINT_JSON} is missing or damaged\)"
    rows = "eval_return_mean" in said  # (resume reads the evaluations' results before it builds anything)
    with pytest.raises(ConfigError, match=unreadable if rows else damaged) as info:
        jaderl.resume(run_dir, total_steps=1024)
    assert "\n" not in str(info.value)
    assert _snapshot(run_dir) == before
    saved = load_checkpoint(run_dir)["config"]
    config = make_config(**{**saved, "total_steps": 1024})
    with pytest.raises(ConfigError, match=damaged):
        Trainer(config, ALGOS[config.algo].agent_cls, resume=True)
    assert _snapshot(run_dir) == before


def test_a_resume_keeps_a_best_policy_saved_after_a_checkpoint_without_evaluations(run_dir: Path) -> None:
    """A run killed between its first evaluation and the next checkpoint: the checkpoint has no evaluation, and the
    best-policy file on disk is better than anything the resumed run evaluates, so it stays."""
    _edit_checkpoint(run_dir, lambda state: state["evaluator"].update(rows=[]))
    save_tensors(run_dir / BEST_POLICY, {}, {"step": "300", "eval_return_mean": "1000.0"})
    result = jaderl.resume(run_dir, total_steps=1024)
    assert result.best_eval_return == 1000.0
    with safe_open(str(run_dir / BEST_POLICY), framework="pt") as f:
        assert f.metadata()["eval_return_mean"] == "1000.0"


def test_an_env_that_fails_after_a_checkpoint_says_which_is_kept_and_how_to_continue(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An env error in the middle of a run (a worker that died, NaN from the env): the sentence ends with the step of
    the checkpoint that is kept and the command that continues the run; the files stay as they were."""
    from jaderl.envs.classic import CartPoleEnv

    def dead(self: CartPoleEnv, action: torch.Tensor) -> Any:
        raise EnvError("worker 0 of the env failed: it died (was killed by signal 9) without reporting an error")

    monkeypatch.setattr(CartPoleEnv, "step", dead)
    before = _snapshot(run_dir)
    with pytest.raises(EnvError, match=rf"^worker 0 of the env failed: it died \(was killed by signal 9\) without "
                                       rf"reporting an error; the run's last checkpoint \(step 512\) is kept: continue "
                                       rf"it with `jaderl train --resume {run_dir}` once the env is fixed$"):
        jaderl.resume(run_dir, total_steps=1024)
    after = _snapshot(run_dir)
    assert b"total_steps: 1024" in after.pop("config.yaml")  # (the resumed budget)
    before.pop("config.yaml")
    assert after == before  # the checkpoint, metrics.csv and the best policy


def test_a_run_that_reached_its_target_is_resumed_only_with_a_higher_one(tmp_path: Path, tiny_ppo: Settings) -> None:
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **tiny_ppo(target_return=5.0))
    assert result.stop_reason == "solved" and result.steps == 256
    before = _snapshot(tmp_path / "run")
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'run'} already reached its target \(target_return=5; its "
                                          r"best evaluation returned [\d.]+\); resume with a higher --target-return "
                                          r"to train on$"):
        jaderl.resume(tmp_path / "run")
    assert _snapshot(tmp_path / "run") == before
    assert jaderl.resume(tmp_path / "run", target_return=1e6).steps == 512  # a higher one: on to total_steps


def test_resume_of_a_file_of_the_run_names_its_directory(run_dir: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^{run_dir / CHECKPOINT_JSON} is a file, not a run directory; pass the run "
                                          rf"directory that holds it \({run_dir}\)$"):
        jaderl.resume(run_dir / CHECKPOINT_JSON)


def test_a_new_run_that_saved_nothing_leaves_no_directory_behind(tmp_path: Path, tiny_ppo: Settings) -> None:
    """A run that diverges before its first checkpoint and evaluation: its directory (a config.yaml and an empty
    metrics.csv) goes, so the same command runs again instead of being refused; a directory given empty stays."""
    settings = tiny_ppo(lr=1e30, eval_every=100_000, checkpoint_every=100_000)
    for _ in range(2):  # the second time is not refused for the first one's leftovers
        with pytest.raises(TrainingError, match="no checkpoint had been written yet"):
            jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **settings)
        assert not (tmp_path / "run").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainingError):
        jaderl.train("ppo", ENV, run_dir=str(tmp_path / "empty"), **settings)
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    (tmp_path / "held" / "notes.txt").parent.mkdir()
    (tmp_path / "held" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already holds files"):
        jaderl.train("ppo", ENV, run_dir=str(tmp_path / "held"), **settings)
    assert (tmp_path / "held" / "notes.txt").read_text() == "mine"


def test_a_checkpoint_too_large_for_the_device_is_not_called_damaged(run_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Running out of memory while a resume loads its state (a replay buffer larger than the device holds) is said as
    such, not as a damaged checkpoint."""
    def too_large(self: Trainer, state: dict[str, Any]) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(Trainer, "load_state_dict", too_large)
    with pytest.raises(TrainingError, match="memory") as info:
        jaderl.resume(run_dir, total_steps=1024)
    assert "damaged" not in str(info.value)
