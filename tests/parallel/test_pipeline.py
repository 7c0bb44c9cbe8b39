"""The explorer / learner / evaluator pipeline (``workers > 0``): both kinds of rounds, failures, stopping, resuming.

Every test checks that no process is left behind (fixture ``no_leftover_processes`` in conftest.py).
"""

from __future__ import annotations

import contextlib
import csv
import json
import multiprocessing as mp
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import jaderl
from jaderl.algos.sac import SAC
from jaderl.algos.td3 import TD3
from jaderl.api import make_config
from jaderl.cli import main as cli_main
from jaderl.core.checkpoint import load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.envs import make_env
from jaderl.envs.vec import VecEnv
from jaderl.parallel.pipeline import (
    POLL_S,
    WORKER_SEED_STRIDE,
    PipelineTrainer,
    WorkerError,
    _Pipeline,
    train_pipeline,
)
from tests.conftest import own_session

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


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_off_policy_pipeline_trains_evaluates_and_checkpoints(precision: str, tmp_path: Path) -> None:
    """Explorers that step their sub-envs in processes of their own (env_workers) too; and in mixed precision (the
    explorers and the evaluator convert their networks as the learner does where the CPU has bfloat16 units)."""
    result = jaderl.train("sac", "Pendulum-v1", total_steps=512, run_dir=tmp_path / "run", num_envs=2, env_workers=1,
                          precision=precision, **SMALL_SAC)
    assert result.stop_reason == "total_steps" and result.steps == 512  # 2 workers x 2 envs x 16 steps per round
    rows = _rows(tmp_path / "run")
    assert [int(r["step"]) for r in rows][-1] == 512 and len(rows) >= 2
    state = load_checkpoint(tmp_path / "run")
    assert state["agent"]["counters"]["steps"] == 512 and state["agent"]["counters"]["critic_updates"] > 0
    assert state["buffer"][1]["size"] == 512 // 4  # rows of (workers x num_envs) transitions
    assert (tmp_path / "run" / "best_policy.safetensors").exists()


@pytest.mark.slow
def test_on_policy_pipeline_learns_cartpole(tmp_path: Path) -> None:
    """Synchronised rounds: PPO with 2 explorer workers of 8 sub-envs solves CartPole as fast as in one process."""
    settings = SMALL_PPO | dict(num_envs=8, horizon=32, hidden=[64, 64], minibatch_size=128, num_epochs=4, lr=1e-3,
                                eval_every=2048, eval_episodes=5, total_steps=150_000, seed=1)
    result = jaderl.train("ppo", "jaderl/CartPole-v1", target_return=475, run_dir=tmp_path / "run", **settings)
    assert result.solved, result


@pytest.mark.alone  # (its assertions time processes)
def test_raising_worker_is_reported_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _faulty_env_module(tmp_path, monkeypatch, 'raise RuntimeError("boom")')
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"^explorer worker 1 failed: EnvError: env 'faulty_envs:Faulty-v0' \(stepped "
                                          r"in this process\) failed: RuntimeError: boom \(at faulty_envs.py:"):
        jaderl.train("sac", env, total_steps=100_000, run_dir=tmp_path / "run", seed=0, **SMALL_SAC)
    assert time.monotonic() - start < 30  # including the processes' start-up
    assert load_checkpoint(tmp_path / "run")["config"]["workers"] == 2  # the learner's state was saved


def test_failing_evaluator_stops_training_promptly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator's first evaluation resets its env with seed + 1 = 1: it raises there, while explorers go on."""
    env = _faulty_env_module(tmp_path, monkeypatch, 'raise RuntimeError("eval boom")', doomed_seed=1)
    with pytest.raises(WorkerError, match=r"^evaluator failed: EnvError: env 'faulty_envs:Faulty-v0' \(\w+ in this "
                                          r"process\) failed: RuntimeError: eval boom"):
        jaderl.train("sac", env, total_steps=10**9, run_dir=tmp_path / "run", seed=0, **SMALL_SAC)
    assert load_checkpoint(tmp_path / "run")["agent"]["counters"]["steps"] < 5_000  # noticed within a few rounds


def test_killed_worker_is_detected_within_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _faulty_env_module(tmp_path, monkeypatch, "os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(WorkerError, match=r"^explorer worker 1 was killed by SIGKILL") as info:
        jaderl.train("sac", env, total_steps=100_000, run_dir=tmp_path / "run", seed=0, **SMALL_SAC)
    step = load_checkpoint(tmp_path / "run")["agent"]["counters"]["steps"]  # what it says to do works from there
    assert str(info.value).endswith(f"; the run was checkpointed at step {step}: continue it with `jaderl train "
                                    f"--resume {tmp_path / 'run'}`")


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


def test_cli_ctrl_c_checkpoints_and_leaves_no_process(tmp_path: Path, session_ended: Callable[[int], None]) -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it: workers ignore it, the learner stops."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "jaderl.cli", "train", "sac", "Pendulum-v1", "--workers", "2",
               "--total-steps", "1000000000", "--run-dir", str(run_dir), "--eval-every", "128", "--json",
               "--set", "horizon=16", "--set", "warmup_steps=64", "--set", "hidden=[16,16]", "--device", "cpu"]
    with own_session(command, cwd=REPO) as proc:
        deadline = time.monotonic() + 60
        while not ((run_dir / "metrics.csv").exists() and _rows(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # stopped by Ctrl-C, after its last checkpoint
    assert json.loads(out.splitlines()[-1])["stop_reason"] == "interrupted"
    assert load_checkpoint(run_dir)["agent"]["counters"]["steps"] > 0
    session_ended(proc.pid)


@pytest.mark.parametrize("to", ["group", "children"])
def test_cli_sigterm_stops_the_run_after_a_last_checkpoint(to: str, tmp_path: Path,
                                                           session_pids: Callable[[int], list[int]],
                                                           session_ended: Callable[[int], None]) -> None:
    """SIGTERM to the whole process group, as `kill -- -PGID` or a job scheduler sends it: the learner stops as on
    Ctrl-C (exit code 130), and the children, which only ask for a stop through the run's stop file, stop with it
    (the fork server they came from ignores SIGTERM). ``children``: SIGTERM to every process but the learner, which
    then stops because of the stop file they wrote. Either way after a last checkpoint at the step where the run
    stopped, with no stop file and no process left behind."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "jaderl.cli", "train", "sac", "Pendulum-v1", "--workers", "2",
               "--total-steps", "1000000000", "--run-dir", str(run_dir), "--eval-every", "128", "--json",
               "--set", "horizon=16", "--set", "warmup_steps=64", "--set", "hidden=[16,16]", "--device", "cpu"]
    with own_session(command, cwd=REPO) as proc:
        deadline = time.monotonic() + 60
        while not ((run_dir / "metrics.csv").exists() and _rows(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if to == "group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            for pid in session_pids(proc.pid):
                if pid != proc.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if to == "group" else 0), err
    result = json.loads(out.splitlines()[-1])
    assert result["stop_reason"] == ("interrupted" if to == "group" else "stop_file")
    assert load_checkpoint(run_dir)["agent"]["counters"]["steps"] == result["steps"] > 0
    assert not (run_dir / "stop").exists()
    session_ended(proc.pid)


def test_ctrl_c_while_the_children_start_stops_the_run_as_usual(tmp_path: Path) -> None:
    """A Ctrl-C to the process group while the children start (here: while they import the script that started the
    run, before any jaderl code runs in them) ends none of them: they, and the fork server they come from, ignore
    SIGINT from their first instruction, and the learner stops as on any other Ctrl-C, after a last checkpoint."""
    script = tmp_path / "run_pipeline.py"
    marker = tmp_path / "preloading"
    script.write_text(textwrap.dedent(f"""
        import time
        from pathlib import Path

        if __name__ == "__mp_main__":  # every child imports this script as it starts
            Path({str(marker)!r}).touch()
            time.sleep(3)

        if __name__ == "__main__":
            import jaderl

            result = jaderl.train("sac", "Pendulum-v1", total_steps=10**9, run_dir={str(tmp_path / "run")!r},
                                  **{SMALL_SAC!r})
            print(result.stop_reason)
    """))
    with own_session([sys.executable, str(script)], cwd=REPO) as proc:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process of the group
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "interrupted"
    assert (tmp_path / "run" / "checkpoint.json").exists()


def test_sigterm_to_a_child_while_it_starts_stops_the_run_once_it_can(
        tmp_path: Path, session_ended: Callable[[int], None]) -> None:
    """SIGTERM to one child (explorer worker 1; the evaluator starts the same way) while it starts (here: while it
    imports the script that started the run, before any jaderl code runs in it) neither ends it nor is lost: the
    child asks for the stop as soon as it answers SIGTERM, so the run stops at the first step the learner reads the
    stop file, after a last checkpoint, leaving no stop file and no process behind."""
    run_dir, starting, sent = tmp_path / "run", tmp_path / "starting", tmp_path / "sent"
    starting.mkdir()
    script = tmp_path / "run_pipeline.py"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing
        import os
        import time
        from pathlib import Path

        if __name__ == "__mp_main__":  # every child imports this script as it starts, named already
            (Path({str(starting)!r}) / f"{{multiprocessing.current_process().name}}-{{os.getpid()}}").touch()
            deadline = time.monotonic() + 60
            while not Path({str(sent)!r}).exists() and time.monotonic() < deadline:
                time.sleep(0.01)

        if __name__ == "__main__":
            import jaderl

            result = jaderl.train("sac", "Pendulum-v1", total_steps=1024, run_dir={str(run_dir)!r}, **{SMALL_SAC!r})
            print(result.stop_reason, result.steps)
    """))
    with own_session([sys.executable, str(script)], cwd=REPO) as proc:
        deadline = time.monotonic() + 60
        while len(children := dict(p.name.rsplit("-", 1) for p in starting.iterdir())) < 3 and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(children) == ["jaderl-evaluator", "jaderl-explorer0", "jaderl-explorer1"], "not started"
        os.kill(int(children["jaderl-explorer1"]), signal.SIGTERM)  # to one child only; all wait for `sent` to go on
        sent.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stop_reason, steps = out.splitlines()[-1].split()
    assert stop_reason == "stop_file", f"the SIGTERM was lost\n{err}"
    assert load_checkpoint(run_dir)["agent"]["counters"]["steps"] == int(steps) < 1024
    assert not (run_dir / "stop").exists()
    session_ended(proc.pid)


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


# --- a peer that dies at the worst moment ---

def _pipeline(run_dir: Path, agent_cls: type[SAC] = SAC) -> _Pipeline:
    """The learner's side of a SAC pipeline on jaderl/Pendulum-v1 (SMALL_SAC), its children not started yet."""
    config = make_config("sac", "jaderl/Pendulum-v1", run_dir=str(run_dir), seed=0, **SMALL_SAC)
    run_dir.mkdir()
    env = make_env(config.env, config.num_envs * config.workers, "cpu")
    agent = agent_cls(config, env, torch.device("cpu"))
    env.close()
    return _Pipeline(config, agent_cls, agent)


def _family(root: int) -> set[int]:
    """The pids of ``root``'s descendants, read from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def _running(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (neither gone nor a zombie waiting to be reaped)."""
    running = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat[stat.rindex(")") + 2] != "Z":
                running.add(pid)
    return running


def _hold_lock(lock: Any, held: Any) -> None:
    """A child that takes the policy lock and keeps it until it is killed."""
    lock.acquire()
    held.set()
    time.sleep(120)


@pytest.mark.alone  # (its assertions time processes)
@pytest.mark.timeout(60)
def test_learner_waiting_for_the_lock_of_a_killed_worker_names_it(tmp_path: Path) -> None:
    """A process killed while it holds the policy lock never releases it: the learner's publish must not wait for
    ever but report the dead worker by name, and an explorer waiting for the lock must leave when told to stop."""
    pipeline = _pipeline(tmp_path / "run")
    ctx = mp.get_context("forkserver")
    held = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(pipeline.shared.lock, held), name="jaderl-lock-holder", daemon=True)
    pipeline.processes["explorer worker 1"] = holder  # in place of the real worker 1, which is not started
    explorer = pipeline.processes["explorer worker 0"]
    killer = threading.Timer(2 * POLL_S, lambda: os.kill(holder.pid, signal.SIGKILL))
    try:
        holder.start()
        assert held.wait(30)
        explorer.start()  # its first round waits for the lock
        time.sleep(2 * POLL_S)
        killer.start()  # while the learner waits for the lock too
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"^explorer worker 1 was killed by SIGKILL"):
            pipeline.publish()
        assert time.monotonic() - start < 2 * POLL_S + 3
    finally:
        killer.cancel()
        pipeline.close()
    assert explorer.exitcode == 0  # it left its wait when told to stop (terminating it would give exit code 1)


def _learner_killed_holding_the_lock(run_dir: str, pids: Any) -> None:
    """A learner that takes the policy lock before it starts its explorers and evaluator, as if it were killed while
    publishing: every explorer waits for the lock from its first round. Sends their pids, then waits to be killed."""
    pipeline = _pipeline(Path(run_dir))
    pipeline.shared.lock.acquire()
    pipeline.start()
    pids.put(sorted(p.pid for p in pipeline.processes.values()))
    time.sleep(120)


@pytest.mark.timeout(120)
def test_children_of_a_learner_killed_while_holding_the_lock_exit(tmp_path: Path) -> None:
    """Explorers waiting for the lock of a learner killed while it held it, and the evaluator, see that they are
    orphaned and exit within seconds (and with them the learner's forkserver): they are no longer this process's
    descendants then, so the test follows them by pid."""
    ctx = mp.get_context("forkserver")
    pids = ctx.Queue()
    learner = ctx.Process(target=_learner_killed_holding_the_lock, args=(str(tmp_path / "run"), pids),
                          name="jaderl-test-learner")
    learner.start()
    family: set[int] = set()
    try:
        children = set(pids.get(timeout=60))  # 2 explorers and the evaluator
        time.sleep(2 * POLL_S)
        family = _family(learner.pid)  # with the learner's forkserver
        assert len(children) == 3 and children <= _running(family)  # waiting, not gone for another reason
        os.kill(learner.pid, signal.SIGKILL)
        learner.join()
        deadline = time.monotonic() + 10
        while _running(family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(family), "children of the killed learner still run"
    finally:
        for pid in _running(family):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if learner.is_alive():
            learner.kill()
            learner.join()
        pids.close()


class SACFailingAfterSending(SAC):
    """SAC whose explorer worker 1 sends its first trajectory, then, at the start of its second round, waits for the
    file ``fail`` in the run directory and fails as it says: ``kill`` (SIGKILL), ``term`` (SIGTERM twice: the first
    asks for a stop, the second ends it) or ``raise``."""

    rounds = 0

    def explore(self, env: VecEnv, horizon: int) -> dict[str, torch.Tensor]:
        self.rounds += 1
        if mp.current_process().name == "jaderl-explorer1" and self.rounds == 2:
            fail, deadline = Path(self.config.run_dir) / "fail", time.monotonic() + 60
            while not fail.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            how = fail.read_text()
            if how in ("kill", "term"):
                for _ in range(1 if how == "kill" else 2):
                    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGTERM)
                time.sleep(30)  # the second SIGTERM raises SystemExit here
            raise RuntimeError("injected")
        return super().explore(env, horizon)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("how", "expected"), [("kill", r"^explorer worker 1 was killed by SIGKILL \(out of memory, "
                                                                r"or killed from outside\)$"),
                                               ("term", r"^explorer worker 1 was stopped by SIGTERM \(sent from "),
                                               ("raise", r"^explorer worker 1 failed: RuntimeError: injected")])
def test_worker_that_dies_after_sending_a_trajectory_is_named(how: str, expected: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensors of a trajectory are handed over by their sender when the learner reads them: a worker that dies
    between the learner's check on its children and that read is reported by name, as any other failure."""
    run_dir = tmp_path / "run"
    pipeline = _pipeline(run_dir, SACFailingAfterSending)
    checked = pipeline.check

    def check_then_fail() -> None:  # worker 1 fails right after the learner found every child well
        checked()
        if not (run_dir / "fail").exists():
            pipeline.go[1].release()  # let it start its second round, as if its first trajectory had been taken
            (run_dir / "fail.tmp").write_text(how)
            (run_dir / "fail.tmp").rename(run_dir / "fail")
            pipeline.processes["explorer worker 1"].join(30)

    try:
        pipeline.start()
        deadline = time.monotonic() + 60
        while any(q.empty() for q in pipeline.trajectories) and time.monotonic() < deadline:
            time.sleep(0.05)
        monkeypatch.setattr(pipeline, "check", check_then_fail)
        with pytest.raises(WorkerError, match=expected):
            pipeline.collect()
    finally:
        pipeline.close()


def test_off_policy_data_is_at_most_one_publication_old(tmp_path: Path) -> None:
    """Explorers explore while the learner updates, with the newest policy, and hold at most one finished trajectory:
    a round's data comes from the policy published just before the previous round's update (lag 1), not older."""
    pipeline = _pipeline(tmp_path / "run")
    lags = []
    try:
        pipeline.start()
        for _ in range(8):
            pipeline.collect()
            lags.append(pipeline.policy_lag)
            time.sleep(0.3)  # an update far longer than an explorer's round: explorers wait for the learner
            pipeline.publish()
    finally:
        pipeline.close()
    assert max(lags[2:]) <= 1.0, lags



class SlowEvaluationSAC(SAC):
    """SAC whose first evaluation in the evaluator process takes ``delay`` seconds more."""

    delay = 60.0

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic and mp.current_process().name == "jaderl-evaluator" and self.delay:
            time.sleep(self.delay)
            self.delay = 0.0
        return super().act(obs, deterministic)


class SlightlySlowEvaluationSAC(SlowEvaluationSAC):
    delay = 1.0


@pytest.mark.parametrize(("agent_cls", "expected"), [(SlowEvaluationSAC, [192, 224]),
                                                     (SlightlySlowEvaluationSAC, [128, 224])])
def test_an_evaluation_running_at_ctrl_c_is_recorded_once(agent_cls: type[SAC], expected: list[int],
                                                          tmp_path: Path) -> None:
    """Ctrl-C while the evaluator is busy: an evaluation it could not finish before it was stopped is done again after
    a resume, as in one process (not skipped because it was requested before the checkpoint); one that it finished
    while the run stopped is not done twice."""
    run_dir = tmp_path / "run"
    config = make_config("sac", "jaderl/Pendulum-v1", run_dir=str(run_dir), seed=0, total_steps=10**9, **SMALL_SAC)

    def interrupt(info: dict[str, Any]) -> None:
        if info["steps"] >= 160:  # rounds of 32 steps: the evaluation of step 128 is still running
            raise KeyboardInterrupt

    first = train_pipeline(config, agent_cls, progress=interrupt)
    assert first.stop_reason == "interrupted" and first.steps == 160
    second = jaderl.resume(run_dir, total_steps=224)  # 2 rounds; evaluations are due every 128 steps
    assert second.stop_reason == "total_steps"
    assert [int(r["step"]) for r in _rows(run_dir)] == expected


def test_an_evaluation_asked_for_while_one_runs_waits_for_it(tmp_path: Path) -> None:
    """Trainer.evaluate between training steps can ask while the periodic evaluation still runs: that one finishes
    and is recorded first (its policy is not overwritten), and the answer is the new evaluation's."""
    pipeline = _pipeline(tmp_path / "run", SlightlySlowEvaluationSAC)
    try:
        pipeline.start()
        pipeline.request(pipeline.agent, 100, 1.0, {})
        pipeline.request(pipeline.agent, 200, 2.0, {})  # the first takes a second more
        assert pipeline.poll(wait=True) is not None and pipeline.pending_step is None
    finally:
        pipeline.close()
    assert [int(row["step"]) for row in pipeline.rows] == [100, 200]


class NoiseRecordingTD3(TD3):
    """TD3 whose explorer processes append the exploration noise of each rollout to RUN_DIR/noise-PID."""

    def explore(self, env: VecEnv, horizon: int) -> dict[str, torch.Tensor]:
        with open(Path(self.config.run_dir) / f"noise-{os.getpid()}", "a") as f:
            f.write(f"{self.config.exploration_noise}\n")
        return super().explore(env, horizon)


def test_hyperparameters_set_in_the_learner_reach_the_explorers(tmp_path: Path) -> None:
    """A hyperparameter that only exploring uses (TD3's exploration noise), set on the learner while it trains (as a
    PBT exploit does), goes to the explorer processes with the next policy."""
    config = make_config("td3", "jaderl/Pendulum-v1", run_dir=str(tmp_path / "run"), seed=0, exploration_noise=0.1,
                         **SMALL_SAC)
    with PipelineTrainer(config, NoiseRecordingTD3) as trainer:
        for _ in range(6):
            trainer.step()
        trainer.set_hyperparameters(exploration_noise=0.37)
        for _ in range(4):
            trainer.step()
    files = sorted((tmp_path / "run").glob("noise-*"))
    noises = [[float(x) for x in f.read_text().split()] for f in files]
    assert len(files) == 2 and all(n[0] == 0.1 and n[-1] == 0.37 for n in noises), noises


def test_an_evaluation_asked_for_before_the_first_step_starts_the_processes(tmp_path: Path) -> None:
    """Trainer.evaluate before any training step (the children not started yet) starts them and gets its answer,
    instead of waiting for ever for an evaluator that was never started."""
    pipeline = _pipeline(tmp_path / "run")
    try:
        pipeline.request(pipeline.agent, 0, 0.0, {})
        assert pipeline.started and pipeline.poll(wait=True) is not None
    finally:
        pipeline.close()
    assert [int(row["step"]) for row in pipeline.rows] == [0]


def test_more_workers_than_the_cpus_can_serve_are_refused_before_any_starts(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand explorer processes, each importing torch, used to exhaust the machine and hang the start."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^workers=9 explorer processes are more than this machine's 2 CPUs can "
                                          r"serve \(at most 4 per CPU\); use --workers 2 or fewer$"):
        jaderl.train("ppo", "jaderl/CartPole-v1", workers=9, run_dir=str(tmp_path / "run"), device="cpu")
    assert not (tmp_path / "run").exists()
