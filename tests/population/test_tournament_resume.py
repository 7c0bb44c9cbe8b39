"""`jaderl tournament --resume POP_DIR`: a tournament whose driver stopped finishes every round once, from what is
on disk. The driver runs in the test's process (``FakeRay``) with real members that train tiny PPO runs."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaderl.cli import main
from jaderl.core.config import ConfigError
from jaderl.population import resume_tournament, tournament
from jaderl.population.cluster import PopulationError
from jaderl.population.member import Standby
from jaderl.population.store import driven
from tests.population.fake_ray import FakeRay

ENV = "jaderl/CartPole-v1"
TINY: dict[str, Any] = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden=[16, 16],
                            eval_episodes=2, device="cpu")
PERIOD = 128  # one PPO iteration of TINY (4 sub-envs x 32 steps)
module = sys.modules["jaderl.population.tournament"]  # (the module, not the function the package exports)


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    """Ray as the tournament's driver sees it, in this process; members are :class:`Standby` processes' actors."""
    fake = FakeRay(Standby)

    @contextlib.contextmanager
    def connected(*args: Any) -> Iterator[FakeRay]:
        yield fake

    monkeypatch.setattr(module, "connected", connected)
    return fake


def _rows(pop_dir: Path) -> list[dict[str, str]]:
    with open(pop_dir / "tournament.csv", newline="") as f:
        return list(csv.DictReader(f))


def _board(pop_dir: Path) -> list[dict[str, Any]]:
    return json.loads((pop_dir / "leaderboard.json").read_text())["entries"]


def _start(pop_dir: Path, stop_after: int, rounds: int = 5, weights: tuple[float, float, float] = (1.0, 1.0, 0.0)
           ) -> None:
    """A tournament of ``rounds`` rounds whose driver stops (Ctrl-C) once ``stop_after`` members have finished;
    ``weights``: the generator's for best, fuse and fresh members."""
    def progress(info: dict[str, Any]) -> None:
        if info["finished"] == stop_after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tournament("ppo", ENV, pool=2, period=PERIOD, rounds=rounds, leaderboard_size=3, fuse_top=2,
                   strategy_weights=weights, seed=1, run_dir=str(pop_dir), space=["lr=loguniform:1e-4:1e-2"],
                   progress=progress, **TINY)


def _check_lineage(rows: list[dict[str, str]]) -> None:
    """A fresh member trained one period, and a continued one a period on top of its parent's steps."""
    by_name = {r["member"]: r for r in rows}
    for row in rows:
        if row["origin"] == "fresh":
            assert int(row["steps"]) == PERIOD
        elif row["origin"] == "best":
            assert int(row["steps"]) == int(by_name[row["parents"]]["steps"]) + PERIOD


def test_a_resumed_tournament_starts_the_rounds_in_flight_again_and_finishes_each_round_once(
        fake_ray: FakeRay, tmp_path: Path) -> None:
    pop_dir = tmp_path / "t"
    _start(pop_dir, stop_after=2)
    before = _rows(pop_dir)
    assert sorted(int(r["round"]) for r in before) == [0, 1]
    assert (pop_dir / "members" / "t0002").exists()  # the round in flight: started, never finished
    orphans = [pop_dir / "leaderboard" / "t0009", pop_dir / "members" / "t0003.tmp"]  # copies the driver was making
    for orphan in orphans:
        orphan.mkdir()
    finished: list[dict[str, Any]] = []
    result = resume_tournament(pop_dir, progress=finished.append)
    rows = _rows(pop_dir)
    assert rows[:2] == before  # the finished rounds as they were: not trained again
    assert sorted(int(r["round"]) for r in rows) == list(range(5))
    assert [info["finished"] for info in finished] == [3, 4, 5] and finished[-1]["rounds"] == 5
    _check_lineage(rows)
    assert {r["origin"] for r in rows[2:]} <= {"best", "fuse"}  # the leaderboard of before seeds the new members
    board = _board(pop_dir)
    assert sorted(p.name for p in (pop_dir / "leaderboard").iterdir()) == sorted(e["name"] for e in board)
    assert not any(orphan.exists() for orphan in orphans)
    assert [e["score"] for e in board] == sorted((float(r["score"]) for r in rows), reverse=True)[:3]
    assert result.best_score == board[0]["score"] and Path(result.best_run_dir, "checkpoint.json").exists()
    with pytest.raises(ConfigError, match="already finished 5 rounds; resume with --rounds larger than 5"):
        resume_tournament(pop_dir)
    with pytest.raises(ConfigError, match="--rounds 4 is fewer than the tournament's 5; resume with --rounds 5 or "
                                          "more"):
        resume_tournament(pop_dir, rounds=4)
    shutil.rmtree(pop_dir / "best")  # as if the driver stopped after the last round, before copying the best entry
    again = resume_tournament(pop_dir)
    assert (again.best_score, again.rounds) == (result.best_score, 5)
    assert (pop_dir / "best" / "checkpoint.json").exists()
    more = resume_tournament(pop_dir, rounds=7)  # more rounds: a lineage may then train longer
    rows = _rows(pop_dir)
    assert sorted(int(r["round"]) for r in rows) == list(range(7)) and more.rounds == 7
    _check_lineage(rows)
    assert json.loads((pop_dir / "tournament.json").read_text())["rounds"] == 7


def test_a_member_on_the_leaderboard_but_not_in_tournament_csv_is_not_trained_again(
        fake_ray: FakeRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver stopped after the leaderboard took a member and before tournament.csv recorded it: the resume
    records its row from the leaderboard, and its round is not started again (its name would be on the board
    twice)."""
    write_csv = module.write_csv
    calls: list[int] = []

    def stops_at_the_third(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        write_csv(*args)

    monkeypatch.setattr(module, "write_csv", stops_at_the_third)
    pop_dir = tmp_path / "t"
    _start(pop_dir, stop_after=99, rounds=4)
    assert len(_rows(pop_dir)) == 2 and len(_board(pop_dir)) == 3
    [lost] = [e for e in _board(pop_dir) if e["name"] not in {r["member"] for r in _rows(pop_dir)}]
    monkeypatch.setattr(module, "write_csv", write_csv)
    resume_tournament(pop_dir)
    rows = _rows(pop_dir)
    assert sorted(int(r["round"]) for r in rows) == [0, 1, 2, 3]
    [row] = [r for r in rows if r["member"] == lost["name"]]
    assert (float(row["score"]), int(row["steps"]), row["origin"]) == \
        (pytest.approx(lost["score"], rel=1e-5), lost["steps"], lost["origin"])
    names = [e["name"] for e in _board(pop_dir)]
    assert len(names) == len(set(names))
    _check_lineage(rows)


def test_a_round_started_again_does_not_continue_what_its_member_left(fake_ray: FakeRay, tmp_path: Path) -> None:
    """The member of a round in flight may have checkpointed before the driver stopped: the round started again
    begins afresh, not from that checkpoint (a fresh member would otherwise train two periods, and a fused one find
    its directory taken)."""
    pop_dir = tmp_path / "t"
    _start(pop_dir, stop_after=1, rounds=3, weights=(0.0, 0.0, 1.0))
    assert [r["member"] for r in _rows(pop_dir)] == ["t0000"]
    shutil.copytree(pop_dir / "members" / "t0000", pop_dir / "members" / "t0001")  # its period trained, unrecorded
    resume_tournament(pop_dir)
    rows = _rows(pop_dir)
    assert [(r["member"], r["origin"], int(r["steps"])) for r in rows] == [(f"t000{k}", "fresh", PERIOD)
                                                                          for k in range(3)]


def test_a_moved_tournament_resumes_from_its_own_copies(fake_ray: FakeRay, tmp_path: Path) -> None:
    """leaderboard.json names where each entry's copy was; a moved (or copied) population directory reads and drops
    the copies inside itself, never those at the old place."""
    _start(tmp_path / "t", stop_after=2)
    copied = tmp_path / "copied"
    shutil.copytree(tmp_path / "t", copied)
    (tmp_path / "t").rename(tmp_path / "moved")
    resume_tournament(tmp_path / "moved", rounds=6)
    board = _board(tmp_path / "moved")
    assert all(Path(e["run_dir"]).parent == tmp_path / "moved" / "leaderboard" for e in board)
    assert sorted(p.name for p in (tmp_path / "moved" / "leaderboard").iterdir()) == sorted(e["name"] for e in board)
    assert sorted(int(r["round"]) for r in _rows(tmp_path / "moved")) == list(range(6))
    before = sorted(p.name for p in (copied / "leaderboard").iterdir())
    resume_tournament(copied)  # the copy's entries are its own: the moved one's are not touched
    assert sorted(p.name for p in (tmp_path / "moved" / "leaderboard").iterdir()) == sorted(e["name"] for e in board)
    assert before and sorted(p.name for p in (copied / "leaderboard").iterdir()) == \
        sorted(e["name"] for e in _board(copied))


def test_best_is_copied_again_when_the_driver_stopped_before_it(fake_ray: FakeRay, tmp_path: Path) -> None:
    """A resume with more rounds that stops after its last round, before POP_DIR/best is replaced: the next resume
    copies the leaderboard's first entry there instead of calling the tournament finished."""
    pop_dir = tmp_path / "t"
    tournament("ppo", ENV, pool=2, period=PERIOD, rounds=3, leaderboard_size=3, fuse_top=2,
               strategy_weights=(1.0, 1.0, 0.0), seed=1, run_dir=str(pop_dir), **TINY)

    def progress(info: dict[str, Any]) -> None:
        if info["finished"] == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        resume_tournament(pop_dir, rounds=5, progress=progress)
    result = resume_tournament(pop_dir)
    top = _board(pop_dir)[0]
    assert (result.best_score, result.rounds) == (top["score"], 5)
    assert (pop_dir / "best" / "metrics.csv").read_text() == (Path(top["run_dir"]) / "metrics.csv").read_text()
    assert json.loads((pop_dir / "tournament.json").read_text())["best"] == top["name"]
    with pytest.raises(ConfigError, match="already finished 5 rounds"):
        resume_tournament(pop_dir)


def test_a_tournament_in_use_by_another_driver_is_refused(fake_ray: FakeRay, tmp_path: Path) -> None:
    pop_dir = tmp_path / "t"
    _start(pop_dir, stop_after=1, rounds=2)
    in_use = (rf"{pop_dir} is in use by another driver \(pid {os.getpid()} on \S+\); wait for it to end, or stop it "
              "with Ctrl-C, before resuming")
    with driven(pop_dir), pytest.raises(ConfigError, match=in_use):  # as a driver still running would hold it
        resume_tournament(pop_dir)
    assert len(_rows(pop_dir)) == 1 and not (pop_dir / "driver.lock").exists()
    (pop_dir / "driver.lock").write_text("pid 1 on elsewhere\n")  # a driver killed with SIGKILL leaves the file
    resume_tournament(pop_dir)  # ... but not its lock, which went with its process
    assert len(_rows(pop_dir)) == 2 and not (pop_dir / "driver.lock").exists()


def test_resume_refuses_what_it_cannot_continue(fake_ray: FakeRay, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=f"{tmp_path} holds no tournament .*tournament.json is missing or damaged"):
        resume_tournament(tmp_path)
    (tmp_path / "tournament.json").write_text(json.dumps({"algos": ["ppo"], "settings": {}}))
    with pytest.raises(ConfigError, match="holds a tournament that an older jaderl started, which this jaderl "
                                          r"\(format 1\) cannot resume; start a new tournament"):
        resume_tournament(tmp_path)

    def refused(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        return capsys.readouterr().err.strip()

    assert refused(["tournament", "ppo", ENV, "--resume", str(tmp_path)]) == (
        "jaderl: error: --resume takes the tournament's settings from POP_DIR; drop ALGO, ENV, --space and --set")
    assert refused(["tournament", "--resume", str(tmp_path), "--period", "10", "--seed", "3"]) == (
        "jaderl: error: --resume takes the tournament's settings from POP_DIR; drop --period, --seed (only --rounds, "
        "--pool, --resources-per-member and --address may change)")
    assert refused(["tournament"]) == ("jaderl: error: tournament needs ALGO and ENV, e.g. `jaderl tournament "
                                       "ppo,a2c jaderl/CartPole-v1`, or --resume POP_DIR")


def test_the_command_resumes_a_tournament(fake_ray: FakeRay, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    pop_dir = tmp_path / "t"
    _start(pop_dir, stop_after=1, rounds=3)
    assert main(["tournament", "--resume", str(pop_dir), "--rounds", "4", "--pool", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rounds"] == 4 and out["population_dir"] == str(pop_dir)
    assert sorted(int(r["round"]) for r in _rows(pop_dir)) == [0, 1, 2, 3]
    assert json.loads((pop_dir / "tournament.json").read_text())["pool"] == 1
    # resources: kept when not given, set by the flag, and back to the default (CPUs shared evenly) by an empty one
    for flags, resources in (([], ""), (["--resources-per-member", "cpu=0.5"], "cpu=0.5"), ([], "cpu=0.5"),
                             (["--resources-per-member", ""], "")):
        rounds = len(_rows(pop_dir)) + 1
        assert main(["tournament", "--resume", str(pop_dir), "--rounds", str(rounds), *flags]) == 0
        assert json.loads((pop_dir / "tournament.json").read_text())["resources"] == resources


def test_a_member_killed_by_rays_memory_monitor_leaves_the_tournament_like_one_that_died(
        fake_ray: FakeRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's memory monitor kills a member's process mid-period: ``ray.get`` raises ``OutOfMemoryError``, which is
    not a ``RayActorError``. The member leaves the tournament with no score, its actor killed, and the other rounds
    go on in a new process."""
    train_for, calls = Standby.train_for, []

    def killed_in_the_second(self: Standby, steps: int) -> dict[str, Any]:
        calls.append(self)
        if len(calls) == 2:
            raise FakeRay.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.")
        return train_for(self, steps)

    monkeypatch.setattr(Standby, "train_for", killed_in_the_second)
    pop_dir = tmp_path / "t"
    result = tournament("ppo", ENV, pool=1, period=PERIOD, rounds=3, leaderboard_size=3, strategy_weights=(0, 0, 1),
                        seed=1, run_dir=str(pop_dir), space=["lr=loguniform:1e-4:1e-2"], **TINY)
    rows = _rows(pop_dir)
    assert [(r["member"], float(r["score"]) == float("-inf")) for r in rows] == \
        [("t0000", False), ("t0001", True), ("t0002", False)]
    assert len(_board(pop_dir)) == 2 and result.best_score == max(e["score"] for e in _board(pop_dir))
    assert len({id(member) for member in calls}) == 2  # round 2 in a new process: the killed one is not reused


def test_a_member_that_dies_records_the_steps_of_its_last_checkpoint(fake_ray: FakeRay, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A member whose process dies after it checkpointed (before its result came back) has no score, and its row
    records the env steps it trained to, not 0."""
    train_for, calls = Standby.train_for, []

    def dies_after_training(self: Standby, steps: int) -> dict[str, Any]:
        calls.append(self)
        result = train_for(self, steps)
        if len(calls) == 2:
            raise FakeRay.exceptions.RayActorError("The actor died unexpectedly before finishing this task.")
        return result

    monkeypatch.setattr(Standby, "train_for", dies_after_training)
    pop_dir = tmp_path / "t"
    tournament("ppo", ENV, pool=1, period=PERIOD, rounds=2, leaderboard_size=3, strategy_weights=(0, 0, 1),
               seed=1, run_dir=str(pop_dir), **TINY)
    assert [(r["member"], float(r["score"]) == float("-inf"), int(r["steps"])) for r in _rows(pop_dir)] == \
        [("t0000", False, PERIOD), ("t0001", True, PERIOD)]


def test_a_member_that_dies_after_its_period_keeps_its_score(fake_ray: FakeRay, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A member's process dies after its period ended (checkpointed, scored) while it describes itself: its period
    counts, with the hyperparameters it was given, and the next round runs in a new process. A member whose closing
    fails (say, drawing its curve) is not reused either, and the tournament goes on."""
    describe, close, calls = Standby.describe, Standby.close, []

    def dies_in_the_second(self: Standby) -> dict[str, Any]:
        calls.append(self)
        if len(calls) == 2:
            raise FakeRay.exceptions.RayActorError("The actor died unexpectedly before finishing this task.")
        return describe(self)

    def fails_in_the_third(self: Standby) -> None:
        close(self)
        if len(calls) == 3:
            raise OSError("No space left on device: 'learning_curve.png'")

    monkeypatch.setattr(Standby, "describe", dies_in_the_second)
    monkeypatch.setattr(Standby, "close", fails_in_the_third)
    pop_dir = tmp_path / "t"
    tournament("ppo", ENV, pool=1, period=PERIOD, rounds=4, leaderboard_size=4, strategy_weights=(0, 0, 1), seed=1,
               run_dir=str(pop_dir), space=["lr=loguniform:1e-4:1e-2"], **TINY)
    rows = _rows(pop_dir)
    assert [r["member"] for r in rows] == [f"t000{k}" for k in range(4)]
    assert all(math.isfinite(float(r["score"])) and int(r["steps"]) == PERIOD for r in rows)
    assert sorted(e["name"] for e in _board(pop_dir)) == [f"t000{k}" for k in range(4)]
    assert all(set(json.loads(r["hyperparameters"])) == {"lr"} for r in rows)
    assert len({id(member) for member in calls}) == 3  # rounds 2 and 3 each in a new process


def test_the_leaderboard_takes_a_retried_insert_once_and_its_actors_death_is_one_sentence(
        fake_ray: FakeRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray restarts the leaderboard's actor (it reloads leaderboard.json) and retries the call under way, so an
    insert may run twice: the entry is there once. An actor that dies more often than Ray restarts it stops the
    tournament with one sentence that gives the resume, and the resume finishes it."""
    from jaderl.population.tournament import Leaderboard

    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.json").write_text("{}")
    board = Leaderboard(str(tmp_path / "b"), 3)
    entry = {"name": "t0000", "score": 1.0}
    assert board.insert(dict(entry), str(run)) == 0
    again = Leaderboard(str(tmp_path / "b"), 3)  # restarted: what it wrote before it died
    assert again.insert(dict(entry), str(run)) == 0 and [e["name"] for e in again.top()] == ["t0000"]

    insert, calls = Leaderboard.insert, []

    def dies_at_the_second(self: Leaderboard, entry: dict[str, Any], run_dir: str) -> int | None:
        calls.append(entry["name"])
        if len(calls) == 2:
            raise FakeRay.exceptions.RayActorError("The actor died unexpectedly before finishing this task.")
        return insert(self, entry, run_dir)

    monkeypatch.setattr(Leaderboard, "insert", dies_at_the_second)
    pop_dir = tmp_path / "t"
    with pytest.raises(PopulationError, match=r"the leaderboard's actor died more often than Ray restarts it "
                                              r"\(The actor died unexpectedly before finishing this task\.\); "
                                              r"leaderboard\.json keeps it: continue with `jaderl tournament --resume"):
        tournament("ppo", ENV, pool=1, period=PERIOD, rounds=3, leaderboard_size=3, strategy_weights=(1, 0, 0),
                   seed=1, run_dir=str(pop_dir), space=["lr=loguniform:1e-4:1e-2"], **TINY)
    monkeypatch.setattr(Leaderboard, "insert", insert)
    resume_tournament(pop_dir)
    assert sorted(int(r["round"]) for r in _rows(pop_dir)) == [0, 1, 2]
