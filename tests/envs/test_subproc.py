"""Tests of jaderl.envs.subproc.SubprocVecEnv: multi-process stepping through shared memory.

Every test checks (fixture ``no_leftover_processes``) that it leaves no process behind: after it, this process has
no descendant it did not have before, except multiprocessing's own forkserver and resource tracker (which live as
long as this process), and no zombie.
"""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import jaderl
from jaderl.api import make_config
from jaderl.core.config import ConfigError
from jaderl.envs import make_env
from jaderl.envs.subproc import SubprocVecEnv
from jaderl.envs.vec import EnvError, GymnasiumVecEnv
from tests.conftest import own_session

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

BOX_LOW, BOX_HIGH = np.array([-2.0, 0.0, 5.0], np.float32), np.array([2.0, 10.0, 6.0], np.float32)


class EchoEnv(gym.Env):
    """Observes the action it was last given (``[a, 0, 0]`` when discrete); never finishes.

    ``bad_seed``: raise in ``step`` when reset with that seed. ``sleep``: seconds each ``step`` takes. ``start``: the
    first action of the Discrete space."""

    def __init__(self, box: bool = True, bad_seed: int | None = None, sleep: float = 0.0, start: int = 0) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        discrete = gym.spaces.Discrete(4, start=start)
        self.action_space = gym.spaces.Box(BOX_LOW, BOX_HIGH, dtype=np.float32) if box else discrete
        self.bad_seed, self.sleep, self.seed_used, self.closed = bad_seed, sleep, None, False

    def close(self) -> None:
        self.closed = True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.seed_used = seed
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.bad_seed is not None and self.seed_used == self.bad_seed:
            raise RuntimeError(f"boom from the env seeded {self.seed_used}")
        if self.sleep:
            time.sleep(self.sleep)
        assert self.action_space.contains(action), f"{action!r} is not in {self.action_space}"
        if self.action_space.shape:
            assert action.dtype == np.float32
            return np.asarray(action, np.float32), 0.0, False, False, {}
        return np.array([action, 0, 0], np.float32), 0.0, False, False, {}


def _gone(pids: list[int], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("env_id", "start_method", "options"), [
    ("CartPole-v1", "forkserver", {}),  # this process steps 1 sub-env, the workers 1 and 2
    ("Pendulum-v1", "forkserver", {"num_workers": 1, "spin": False}),  # Box actions in this process's slice
    ("Pendulum-v1", "spawn", {"step_in_parent": False, "spin": True}),
])
def test_matches_gymnasium_adapter(env_id: str, start_method: str, options: dict[str, Any]) -> None:
    sub = SubprocVecEnv(env_id, num_envs=4, start_method=start_method, **{"num_workers": 2, **options})
    ref = GymnasiumVecEnv(env_id, num_envs=4)
    try:
        assert (sub.num_envs, sub.obs_shape, sub.is_discrete, sub.action_dim, sub.max_steps) == \
            (ref.num_envs, ref.obs_shape, ref.is_discrete, ref.action_dim, ref.max_steps)
        assert torch.equal(sub.reset(seed=7), ref.reset(seed=7))
        generator = torch.Generator().manual_seed(0)
        finished = 0
        for i in range(260):
            if sub.is_discrete:
                action = torch.randint(0, sub.action_dim, (4,), generator=generator)
            else:
                action = torch.rand(4, sub.action_dim, generator=generator) * 2.4 - 1.2  # some out of [-1, 1]
            *got, got_info = sub.step(action)
            *want, want_info = ref.step(action)
            for name, a, b in zip(["obs", "reward", "terminated", "truncated"], got, want, strict=True):
                assert a.dtype == b.dtype and a.device == b.device, name
                assert torch.equal(a, b), f"{name} differs at step {i}"
            assert torch.equal(got_info["final_obs"], want_info["final_obs"]), f"final_obs differs at step {i}"
            finished += int((want[2] | want[3]).sum())
        assert finished > 0  # CartPole terminates under random actions, Pendulum is truncated at 200 steps
    finally:
        sub.close()
        ref.close()


def test_box_rescaling_discrete_actions_and_uneven_slices() -> None:
    box = SubprocVecEnv(EchoEnv, num_envs=3, num_workers=2, step_in_parent=False)  # slices of 1 and 2 envs
    discrete = SubprocVecEnv(EchoEnv, num_envs=3, num_workers=2, env_kwargs={"box": False})
    try:
        assert (box.is_discrete, box.action_dim, box.max_steps) == (False, 3, 0)
        assert (discrete.is_discrete, discrete.action_dim) == (True, 4)
        box.reset()
        action = torch.tensor([[-1.0, -1.0, -1.0], [0.0, 0.5, -0.5], [-7.0, 3.0, 1.5]])
        obs, *_ = box.step(action)
        expected = torch.tensor([[-2.0, 0.0, 5.0], [0.0, 7.5, 5.25], [-2.0, 10.0, 6.0]])
        torch.testing.assert_close(obs, expected, rtol=1e-6, atol=0)
        discrete.reset()
        obs, *_ = discrete.step(torch.tensor([3, 0, 2]))
        assert obs[:, 0].tolist() == [3.0, 0.0, 2.0]
    finally:
        box.close()
        discrete.close()


def test_discrete_actions_count_from_the_space_s_start() -> None:
    """The agent's actions are 0 .. n-1 whatever the space's ``start``: Discrete(4, start=-2) gets -2 .. 1."""
    sub = SubprocVecEnv(EchoEnv, num_envs=4, num_workers=1, env_kwargs={"box": False, "start": -2})
    ref = GymnasiumVecEnv(EchoEnv(box=False, start=-2))
    try:
        assert sub.action_dim == ref.action_dim == 4
        sub.reset(seed=0)
        ref.reset(seed=0)
        obs, *_ = sub.step(torch.tensor([0, 1, 2, 3]))
        assert obs[:, 0].tolist() == [-2.0, -1.0, 0.0, 1.0]
        obs, *_ = ref.step(torch.tensor([3]))
        assert obs[:, 0].tolist() == [1.0]
    finally:
        sub.close()
        ref.close()


def test_bad_actions_are_refused_in_one_sentence_and_the_env_goes_on() -> None:
    sub = SubprocVecEnv(EchoEnv, num_envs=3, num_workers=1, env_kwargs={"box": False})
    box = SubprocVecEnv("Pendulum-v1", num_envs=2, num_workers=1)
    ref = GymnasiumVecEnv("Pendulum-v1", num_envs=2)
    try:
        sub.reset(seed=0)
        with pytest.raises(EnvError, match=r"^the env takes discrete actions 0 to 3, got actions from 0 to 4; give the "
                                           r"agent 4 actions"):
            sub.step(torch.tensor([0, 4, 1]))
        with pytest.raises(EnvError, match=r"^the env takes discrete actions 0 to 3, got actions from -1 to 1"):
            sub.step(torch.tensor([0, -1, 1]))
        with pytest.raises(EnvError, match=r"^the agent's actions became NaN or infinite"):
            sub.step(torch.tensor([0.0, math.nan, 1.0]))
        with pytest.raises(EnvError, match=r"^expected 3 actions \(one per sub-env\), got an array of shape \(2,\)$"):
            sub.step(torch.tensor([0, 1]))
        obs, *_ = sub.step(torch.tensor([3, 0, 2]))  # nothing was sent to the workers: they are still in step
        assert obs[:, 0].tolist() == [3.0, 0.0, 2.0]
        for env in (box, ref):  # one value per sub-env is (N,) or (N, 1), as for the torch envs
            env.reset(seed=1)
            with pytest.raises(EnvError, match=r"^expected 2 actions \(one of 1 values per sub-env\), got an array"):
                env.step(torch.zeros(2, 2))
        for shape in [(2,), (2, 1)]:
            *got, _ = box.step(torch.full(shape, 0.5))
            *want, _ = ref.step(torch.full(shape, 0.5))
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    finally:
        for env in (sub, box, ref):
            env.close()


def test_lists_and_numpy_actions_are_read_and_non_integral_discrete_ones_refused() -> None:
    """The workers' envs get a list or NumPy array of actions as the same tensor (through the Gymnasium adapters'
    shared reading); a float discrete action that is not a whole number is refused in one sentence before any worker
    steps, one that is (1.0) is taken."""
    sub = SubprocVecEnv(EchoEnv, num_envs=3, num_workers=1, env_kwargs={"box": False})
    try:
        sub.reset(seed=0)
        for action in ([3, 0, 2], (3, 0, 2), np.array([3, 0, 2]), torch.tensor([3.0, 0.0, 2.0])):
            obs, *_ = sub.step(action)
            assert obs[:, 0].tolist() == [3.0, 0.0, 2.0], action
        for action in (torch.tensor([0.7, 1.0, 2.0]), [1.0, 0.5, 0.0]):
            with pytest.raises(EnvError, match=r"^the env takes discrete actions as whole numbers, got 0\.[57]; pass "
                                               r"integer actions \(an int64 tensor"):
                sub.step(action)
        obs, *_ = sub.step([1, 2, 3])  # nothing was sent to the workers: they are still in step
        assert obs[:, 0].tolist() == [1.0, 2.0, 3.0]
    finally:
        sub.close()

def test_raising_worker_is_reported_by_name() -> None:
    env = SubprocVecEnv(EchoEnv, num_envs=4, num_workers=2, env_kwargs={"bad_seed": 13})
    pids = env.worker_pids
    env.reset(seed=10)  # sub-env 3 (in worker 1) gets seed 13
    start = time.monotonic()
    with pytest.raises(EnvError) as info:
        env.step(torch.zeros(4, 3))
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert message == "worker jaderl-EchoEnv-worker1 failed: env 3: RuntimeError: boom from the env seeded 13"
    assert _gone(pids) and env.worker_pids == []  # a failure closes the env
    with pytest.raises(EnvError, match="closed"):
        env.step(torch.zeros(4, 3))


def test_error_in_this_process_slice_is_reported_and_stops_the_workers() -> None:
    env = SubprocVecEnv(EchoEnv, num_envs=3, num_workers=2, env_kwargs={"bad_seed": 5})
    pids, local = env.worker_pids, list(env._workers.local)
    assert len(pids) == 2 and len(local) == 1 and not local[0].closed
    env.reset(seed=5)  # sub-env 0, stepped in this process, gets seed 5
    with pytest.raises(EnvError) as info:
        env.step(torch.zeros(3, 3))
    assert str(info.value) == "env 0 (stepped in this process) failed: RuntimeError: boom from the env seeded 5"
    assert isinstance(info.value.__cause__, RuntimeError)  # the env's own traceback is kept
    assert _gone(pids) and env.worker_pids == [] and local[0].closed
    with pytest.raises(EnvError, match="closed"):
        env.reset()


@pytest.mark.parametrize("when", ["while stepping", "between steps"])
def test_killed_worker_is_detected(when: str) -> None:
    sleep = 30.0 if when == "while stepping" else 0.0
    # a death is noticed once this process has stepped its own slice, so the slow envs run in workers only
    env = SubprocVecEnv(EchoEnv, num_envs=4, num_workers=2, env_kwargs={"sleep": sleep}, step_in_parent=False)
    pids = env.worker_pids
    env.reset()
    if when == "while stepping":
        killer = threading.Timer(0.5, os.kill, (pids[0], signal.SIGKILL))
        killer.start()
    else:
        os.kill(pids[0], signal.SIGKILL)
        assert _gone(pids[:1])
    start = time.monotonic()
    try:
        with pytest.raises(EnvError, match=r"^worker jaderl-EchoEnv-worker0 failed: ") as info:
            env.step(torch.zeros(4, 3))
    finally:
        if when == "while stepping":
            killer.join()
    assert time.monotonic() - start < 10
    assert "killed by signal 9" in str(info.value)
    assert _gone(pids)


class SlowWhenSeeded(EchoEnv):
    """Each ``step`` takes 30 s in the sub-env reset with ``slow_seed``, no time in the others."""

    def __init__(self, slow_seed: int) -> None:
        super().__init__()
        self.slow_seed = slow_seed

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.seed_used == self.slow_seed:
            time.sleep(30.0)
        return super().step(action)


def test_worker_dying_after_it_answered_is_detected_while_another_still_steps() -> None:
    # worker 0 answers the step at once and is then killed; worker 1 is still in its 30 s step. The hang-up is
    # reported at once (before, the wait spun on it until worker 1 answered and the step seemed to succeed).
    env = SubprocVecEnv(SlowWhenSeeded, num_envs=4, num_workers=2, env_kwargs={"slow_seed": 13},
                        step_in_parent=False)
    pids = env.worker_pids
    env.reset(seed=10)  # sub-env 3 (in worker 1) gets seed 13
    killer = threading.Timer(0.5, os.kill, (pids[0], signal.SIGKILL))
    killer.start()
    start = time.monotonic()
    try:
        with pytest.raises(EnvError, match=r"^worker jaderl-SlowWhenSeeded-worker0 failed: it died \(was killed by "
                                           r"signal 9\)"):
            env.step(torch.zeros(4, 3))
    finally:
        killer.join()
    assert time.monotonic() - start < 10
    assert _gone(pids)


class DiesAfterHandshake(EchoEnv):
    """Built in a worker, it has the worker killed 0.5 s later, once the worker has sent its spaces; built in this
    process (the caller's slice, after the workers were started), it waits until that worker is dead. So the worker
    dies between the two steps of the set-up: sending its spaces and receiving the shared memory's name."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        if mp.parent_process() is not None:
            Path(marker + ".tmp").write_text(str(os.getpid()))
            Path(marker + ".tmp").rename(marker)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
            return
        deadline = time.monotonic() + 30
        while not Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        stat = Path(f"/proc/{Path(marker).read_text()}/stat")
        while time.monotonic() < deadline:  # until it is gone (its parent, the forkserver, reaps it) or a zombie
            try:
                if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.01)


def test_worker_dying_during_set_up_is_reported_by_name(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match=r"^worker jaderl-DiesAfterHandshake-worker0 failed: it died \(was killed by "
                                       r"signal 9\)"):
        SubprocVecEnv(DiesAfterHandshake, num_envs=2, num_workers=1, env_kwargs={"marker": str(tmp_path / "pid")})


@pytest.mark.parametrize("how", ["close", "garbage collection"])
def test_no_process_left_behind(how: str, descendants: Callable[[], dict[int, tuple[str, str]]]) -> None:
    env = SubprocVecEnv("CartPole-v1", num_envs=2, num_workers=2)
    pids = env.worker_pids
    assert len(pids) == 2 and all(pid in descendants() for pid in pids)
    env.reset(seed=0)
    env.step(torch.zeros(2, dtype=torch.int64))
    if how == "close":
        env.close()
        env.close()  # closing twice is fine
        with pytest.raises(EnvError, match="closed"):
            env.reset()
    else:
        del env
        gc.collect()
    assert not [p for p in mp.active_children() if p.pid in pids]
    assert _gone(pids, timeout=1.0)
    assert not set(pids) & set(descendants())


def test_this_process_takes_the_smallest_slice() -> None:
    env = SubprocVecEnv(EchoEnv, num_envs=8, num_workers=2)
    try:
        assert (env._local_slice, env._slices) == ((0, 2), [(2, 5), (5, 8)])
        env.reset()
        action = torch.linspace(-1.0, 1.0, 8).unsqueeze(1).expand(8, 3)
        obs, *_ = env.step(action)  # every sub-env, wherever it is stepped, sees its own action
        torch.testing.assert_close(obs[:, 0], torch.linspace(-2.0, 2.0, 8), rtol=1e-6, atol=1e-6)
    finally:
        env.close()


def test_spinning_is_on_only_where_every_waiting_process_has_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import jaderl.envs.subproc as subproc

    for cpus, workers, child, spins in [(2, 1, False, True), (2, 2, False, False), (8, 3, False, True),
                                        (8, 1, True, False)]:  # a child (pipeline explorer, learner) never spins
        monkeypatch.setattr(subproc, "_usable_cpus", lambda cpus=cpus: cpus)
        monkeypatch.setattr(subproc.mp, "parent_process", lambda child=child: object() if child else None)
        env = SubprocVecEnv("CartPole-v1", num_envs=4, num_workers=workers)
        try:
            assert (env._spin_s > 0) == spins, (cpus, workers, child)
            env.reset(seed=0)
            env.step(torch.zeros(4, dtype=torch.int64))
        finally:
            env.close()
    monkeypatch.setattr(subproc.mp, "parent_process", lambda: None)  # with 8 CPUs it would spin, but
    monkeypatch.setenv("JADERL_SPIN", "0")  # several runs on one machine: the user turns it off
    env = SubprocVecEnv("CartPole-v1", num_envs=4, num_workers=1)
    env.close()
    assert env._spin_s == 0


def test_make_env_with_workers() -> None:
    env = make_env("CartPole-v1", 3, workers=2)
    try:
        assert isinstance(env, SubprocVecEnv) and env.max_steps == 500
        obs = env.reset(seed=0)
        assert obs.shape == (3, 4) and obs.dtype == torch.float32
        obs, reward, terminated, truncated, info = env.step(torch.zeros(3, dtype=torch.int64))
        assert obs.shape == info["final_obs"].shape == (3, 4)
        assert reward.shape == terminated.shape == truncated.shape == (3,)
        assert reward.dtype == torch.float32 and terminated.dtype == truncated.dtype == torch.bool
    finally:
        env.close()


def test_bad_arguments_start_no_process() -> None:
    with pytest.raises(EnvError, match="unknown env 'NoSuchEnv-v0'"):
        SubprocVecEnv("NoSuchEnv-v0", 2, 2)
    with pytest.raises(EnvError, match="picklable"):
        SubprocVecEnv(lambda: EchoEnv(), 2, 2)
    with pytest.raises(EnvError, match=r"^worker jaderl-EchoEnv-worker0 failed: env 0: TypeError: .*'colour'"):
        SubprocVecEnv(EchoEnv, 2, 1, env_kwargs={"colour": "red"}, step_in_parent=False)  # cannot be built
    with pytest.raises(EnvError, match=r"^env 0 \(built in this process\) failed: TypeError: .*'colour'"):
        SubprocVecEnv(EchoEnv, 2, 1, env_kwargs={"colour": "red"})
    with pytest.raises(EnvError, match="fork"):
        SubprocVecEnv("CartPole-v1", 2, 2, start_method="fork")


def test_training_steps_a_gymnasium_env_in_worker_processes(tmp_path) -> None:
    result = jaderl.train("ppo", "CartPole-v1", env_workers=2, num_envs=4, horizon=32, minibatch_size=64,
                          num_epochs=1, hidden=[16], total_steps=256, eval_every=256, eval_episodes=2,
                          run_dir=str(tmp_path / "run"), device="cpu")
    assert result.steps == 256
    assert not mp.active_children()  # the loop closed the env and its workers


def test_more_workers_than_envs_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="env_workers=3 is more than num_envs=2"):
        make_config("ppo", "CartPole-v1", env_workers=3, num_envs=2)


def test_a_failing_set_up_closes_the_workers_at_once(tmp_path) -> None:
    """The loop builds the env first; when the set-up after it fails (here: a run directory that already holds a
    run), the error must not leave the env's workers running until the env happens to be garbage collected."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("algo: ppo\n")
    with pytest.raises(ConfigError, match="already holds files") as failure:
        jaderl.train("ppo", "CartPole-v1", env_workers=1, num_envs=2, horizon=8, minibatch_size=16,
                     run_dir=str(tmp_path / "run"), device="cpu")
    assert failure.traceback  # the traceback, and with it the env, is still alive here
    assert not [p for p in mp.active_children() if p.name.startswith("jaderl-")]


def test_sigterm_to_every_process_of_a_run_stops_it_after_a_last_checkpoint(
        tmp_path: Path, session_pids: Callable[[int], list[int]], session_ended: Callable[[int], None]) -> None:
    """SIGTERM to the whole process group (`kill -- -PGID`, a job scheduler) of a run whose sub-envs step in worker
    processes: the workers ignore it (here it reaches them a second before their parent, which steps them meanwhile),
    so the run stops as on Ctrl-C, after its step, with a last checkpoint at the step where it stopped, and closes the
    workers; no process of the run is left."""
    import contextlib
    import json
    import sys

    from jaderl.core.checkpoint import load_checkpoint

    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "jaderl.cli", "train", "ppo", "CartPole-v1", "--num-envs", "4", "--set",
               "env_workers=2", "--set", "minibatch_size=64", "--total-steps", "1000000000", "--eval-every", "512",
               "--run-dir", str(run_dir),
               "--json", "--device", "cpu", "--no-zoo"]
    with own_session(command, cwd=Path(__file__).resolve().parents[2]) as proc:
        deadline = time.monotonic() + 60
        while not (run_dir / "metrics.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        assert len(session_pids(proc.pid)) >= 3, "the run and its two env workers"
        # the workers' SIGTERM first, as when it reaches them before it reaches their parent
        for pid in session_pids(proc.pid):
            if pid != proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        time.sleep(1.0)  # the run steps its workers meanwhile
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # stopped as on Ctrl-C, not failed
    result = json.loads(out.splitlines()[-1])
    assert result["stop_reason"] == "interrupted"
    assert load_checkpoint(run_dir)["agent"]["counters"]["steps"] == result["steps"] > 0
    session_ended(proc.pid)
