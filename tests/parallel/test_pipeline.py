"""The explorer / learner / evaluator pipeline (``workers > 0``): both kinds of rounds, failures, stopping, resuming.

Every test checks that no process is left behind (fixture ``no_leftover_processes`` in conftest.py).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import jaderl
from jaderl.cli import main as cli_main
from jaderl.core.checkpoint import load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.parallel.pipeline import WORKER_SEED_STRIDE, WorkerError

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

REPO = Path(__file__).resolve().parents[2]
SMALL_SAC = dict(workers=2, horizon=16, warmup_steps=64, batch_size=32, hidden=[16, 16], eval_every=128,
                 eval_episodes=2, checkpoint_every=256, device="cpu")
SMALL_PPO = dict(workers=2, num_envs=4, horizon=16, minibatch_size=64, num_epochs=2, hidden=[16, 16], eval_every=128,
                 eval_episodes=2, checkpoint_every=256, device="cpu")


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _faulty_env_module(directory: Path, monkeypatch: pytest.MonkeyPatch, action: str,
                       doomed_seed: int = 2 * WORKER_SEED_STRIDE) -> str:
    """A Gymnasium env (``faulty_envs:Faulty-v0``) that ``action``s on its 5th step when reset with ``doomed_seed``
    (by default explorer worker 1's with seed 0); importable by the child processes, which inherit this process's
    ``sys.path``."""
    (directory / "faulty_envs.py").write_text(textwrap.dedent(f"""
        import os, signal
        import gymnasium as gym
        from gymnasium.envs.classic_control.pendulum import PendulumEnv

        class Faulty(PendulumEnv):
            def reset(self, *, seed=None, options=None):
                self.doomed, self.count = seed == {doomed_seed}, 0
                return super().reset(seed=seed, options=options)

            def step(self, action):
                self.count += 1
                if self.doomed and self.count == 5:
                    {action}
                return super().step(action)

        gym.register("Faulty-v0", entry_point=Faulty, max_episode_steps=200)
    """))
    monkeypatch.syspath_prepend(str(directory))
    return "faulty_envs:Faulty-v0"


def test_off_policy_pipeline_trains_evaluates_and_checkpoints(tmp_path: Path) -> None:
    """Explorers that step their sub-envs in processes of their own (env_workers) too."""
    result = jaderl.train("sac", "Pendulum-v1", total_steps=512, run_dir=tmp_path / "run", num_envs=2, env_workers=1,
                          **SMALL_SAC)
    assert result.stop_reason == "total_steps" and result.steps == 512  # 2 workers x 2 envs x 16 steps per round
    rows = _rows(tmp_path / "run")
    assert [int(r["step"]) for r in rows][-1] == 512 and len(rows) >= 2
    state = load_checkpoint(tmp_path / "run")
    assert state["agent"]["steps"] == 512 and state["agent"]["critic_updates"] > 0
    assert state["buffer"][1]["size"] == 512 // 4  # rows of (workers x num_envs) transitions
    assert (tmp_path / "run" / "best_policy.safetensors").exists()


@pytest.mark.slow
def test_on_policy_pipeline_learns_cartpole(tmp_path: Path) -> None:
    """Synchronised rounds: PPO with 2 explorer workers of 8 sub-envs solves CartPole as fast as in one process."""
    settings = SMALL_PPO | dict(num_envs=8, horizon=32, hidden=[64, 64], minibatch_size=128, num_epochs=4, lr=1e-3,
                                eval_every=2048, eval_episodes=5, total_steps=150_000, seed=1)
    result = jaderl.train("ppo", "jaderl/CartPole-v1", target_return=475, run_dir=tmp_path / "run", **settings)
    assert result.solved, result


def test_raising_worker_is_reported_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _faulty_env_module(tmp_path, monkeypatch, 'raise RuntimeError("boom")')
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"^explorer worker 1 failed: RuntimeError: boom \(at faulty_envs.py:"):
        jaderl.train("sac", env, total_steps=100_000, run_dir=tmp_path / "run", seed=0, **SMALL_SAC)
    assert time.monotonic() - start < 30  # including the processes' start-up
    assert load_checkpoint(tmp_path / "run")["config"]["workers"] == 2  # the learner's state was saved


def test_failing_evaluator_stops_training_promptly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator's first evaluation resets its env with seed + 1 = 1: it raises there, while explorers go on."""
    env = _faulty_env_module(tmp_path, monkeypatch, 'raise RuntimeError("eval boom")', doomed_seed=1)
    with pytest.raises(WorkerError, match=r"^evaluator failed: RuntimeError: eval boom"):
        jaderl.train("sac", env, total_steps=10**9, run_dir=tmp_path / "run", seed=0, **SMALL_SAC)
    assert load_checkpoint(tmp_path / "run")["agent"]["steps"] < 5_000  # noticed within a few rounds


def test_killed_worker_is_detected_within_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _faulty_env_module(tmp_path, monkeypatch, "os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(WorkerError, match=r"^explorer worker 1 was killed by signal 9"):
        jaderl.train("sac", env, total_steps=100_000, run_dir=tmp_path / "run", seed=0, **SMALL_SAC)


def test_stop_file_ends_every_process_and_resume_continues(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    def stop_soon() -> None:
        while not (run_dir / "metrics.csv").exists() or not _rows(run_dir):
            time.sleep(0.1)
        (run_dir / "stop").touch()

    stopper = threading.Thread(target=stop_soon, daemon=True)
    stopper.start()
    first = jaderl.train("sac", "Pendulum-v1", total_steps=10**9, run_dir=run_dir, **SMALL_SAC)
    stopper.join()
    assert first.stop_reason == "stop_file" and not (run_dir / "stop").exists()
    second = jaderl.resume(run_dir, total_steps=first.steps + 256)
    assert second.stop_reason == "total_steps" and second.steps == first.steps + 256
    steps = [int(r["step"]) for r in _rows(run_dir)]
    assert steps == sorted(steps) and steps[-1] == second.steps
    with pytest.raises(ConfigError, match="workers=3 cannot change when resuming"):
        jaderl.resume(run_dir, workers=3)


def test_cli_ctrl_c_checkpoints_and_leaves_no_process(tmp_path: Path) -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it: workers ignore it, the learner stops."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "jaderl.cli", "train", "sac", "Pendulum-v1", "--workers", "2",
               "--total-steps", "1000000000", "--run-dir", str(run_dir), "--eval-every", "128", "--json",
               "--set", "horizon=16", "--set", "warmup_steps=64", "--set", "hidden=[16,16]", "--device", "cpu"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ((run_dir / "metrics.csv").exists() and _rows(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["stop_reason"] == "interrupted"
    assert load_checkpoint(run_dir)["agent"]["steps"] > 0
    deadline = time.monotonic() + 5.0  # multiprocessing's resource tracker exits once it sees its parent gone
    while (survivors := subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not survivors, f"processes of the run's session still alive: {survivors}"


def test_cli_workers_flag_and_bad_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["train", "ppo", "jaderl/CartPole-v1", "--workers", "2", "--total-steps", "256", "--json",
                     "--run-dir", str(tmp_path / "run"), "--device", "cpu", "--set", "horizon=16",
                     "--set", "num_envs=4", "--set", "minibatch_size=64"])
    assert code == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["steps"] == 256
    with pytest.raises(SystemExit) as info:  # the env is checked before any process starts
        cli_main(["train", "ppo", "NoSuchEnv-v0", "--workers", "2", "--run-dir", str(tmp_path / "bad")])
    assert info.value.code == 2
    assert "NoSuchEnv-v0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["train", "ppo", "jaderl/CartPole-v1", "--workers", "2", "--learners", "2"])
    assert "cannot be combined" in capsys.readouterr().err
