"""Tests of the ``jaderl`` command (jaderl.cli): JSON output, listings, one-line errors, and SIGKILL + resume."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import jaderl
from jaderl import api
from jaderl.algos import ALGOS
from jaderl.cli import main
from jaderl.core.checkpoint import CHECKPOINT_JSON
from jaderl.envs import TORCH_ENVS

ENV = "jaderl/CartPole-v1"
TINY = ["--device", "cpu", "--num-envs", "4", "--eval-episodes", "2", "--eval-every", "256", "--checkpoint-every",
        "256", "--seed", "3", "--set", "hidden=[32,32]", "--set", "horizon=32", "--set", "minibatch_size=64",
        "--set", "num_epochs=2"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Call ``main(argv)`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _subprocess(argv: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "jaderl.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _metric_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def _assert_one_line_error(code: int, err: str) -> None:
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaderl: error: "), err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A finished tiny PPO run made by ``jaderl train --json`` (in this process) and its JSON report."""
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    out, err = io.StringIO(), io.StringIO()  # capsys is function-scoped: capture by hand
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", "ppo", ENV, "--run-dir", str(run_dir), "--total-steps", "512", "--json", *TINY])
    assert code == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines, "train --json printed nothing"
    return run_dir, json.loads(lines[-1])


def test_train_json(trained_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, report = trained_run
    assert isinstance(report, dict)
    assert {"solved", "steps", "time_s", "best_eval_return", "run_dir"} <= set(report)
    assert report["solved"] is False and report["steps"] == 512 and report["run_dir"] == str(run_dir)
    assert isinstance(report["time_s"], float) and report["time_s"] > 0
    assert isinstance(report["best_eval_return"], float) and report["best_eval_return"] >= 1
    assert _metric_steps(run_dir) == [256, 512]


def test_json_holds_no_nan() -> None:
    """A score not known yet (NaN) is JSON's null in every --json report, never the invalid token NaN."""
    from jaderl.cli import _json_ready

    report = {"best_score": math.nan, "scores": [1.0, math.inf], "nested": {"x": -math.inf}, "steps": 3}
    assert json.dumps(_json_ready(report), allow_nan=False) == \
        '{"best_score": null, "scores": [1.0, null], "nested": {"x": null}, "steps": 3}'


def test_train_text_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "r"), "--total-steps", "256",
                           "--target-return", "100000", *TINY], capsys)
    assert code == 0, err
    assert out.startswith("total_steps: 256 steps") and str(tmp_path / "r") in out
    assert "steps" in err and "eval" in err  # progress lines go to stderr


def test_train_with_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("total_steps: 128\neval_every: 128\nlr: 1e-3\nhidden: [16]\n")
    code, out, err = _run(["train", "ppo", ENV, "--config", str(config), "--run-dir", str(tmp_path / "r"),
                           "--device", "cpu", "--num-envs", "4", "--eval-episodes", "1", "--set", "horizon=32",
                           "--set", "minibatch_size=32", "--set", "num_epochs=1", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["steps"] == 128
    saved = (tmp_path / "r" / "config.yaml").read_text()
    assert "lr: 0.001" in saved and "hidden:\n- 16\n" in saved


def test_eval_json(trained_run: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = trained_run
    code, out, err = _run(["eval", str(run_dir), "--episodes", "3", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out.splitlines()[-1])
    assert {"mean", "std", "episodes"} <= set(report)
    assert report["episodes"] == 3 and len(report["returns"]) == 3
    assert report["mean"] >= 1 and report["std"] >= 0 and report["policy"] == "best"
    code, out, _ = _run(["eval", str(run_dir), "--episodes", "3"], capsys)
    assert code == 0 and "over 3 episodes" in out and f"{report['mean']:.2f}" in out and "best policy" in out
    code, out, _ = _run(["eval", str(run_dir), "--episodes", "3", "--last"], capsys)  # the last checkpoint's
    assert code == 0 and out.strip().endswith("last policy")


def test_algos_and_envs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["algos"], capsys)
    assert code == 0
    listed = {line.split()[0]: line for line in out.splitlines()}
    assert set(listed) == set(api.ALGOS) and set(ALGOS) < set(api.ALGOS)  # single- and multi-agent
    assert "discrete/continuous" in listed["ppo"] and "continuous" in listed["sac"] and "discrete" in listed["dqn"]
    assert "continuous" not in listed["dqn"] and "discrete" not in listed["sac"]
    assert all("multi-agent" in listed[name] for name in set(api.ALGOS) - set(ALGOS))
    code, out, _ = _run(["envs"], capsys)
    assert code == 0
    assert all(name in out for name in TORCH_ENVS) and "Gymnasium" in out


@pytest.mark.parametrize("argv", [
    ["train", "nope", ENV],
    ["train", "ppo", "NoSuchEnv-v0"],
    ["train", "ppo", "jaderl/Nope-v0"],
    ["train", "dqn", "Pendulum-v1"],
    ["train", "double_dqn", "jaderl/Pendulum-v1"],
    ["train", "sac", ENV],
    ["train", "ppo", ENV, "--set", "lr"],
    ["train", "ppo", ENV, "--set", "hidden=[64,"],
    ["train", "ppo", ENV, "--set", "nope=1"],
    ["train", "ppo", ENV, "--set", "lr=-1"],
    ["train", "ppo", ENV, "--set", "lr=nan"],
    ["train", "ppo", ENV, "--set", "gamma=.nan"],
    ["train", "ppo", ENV, "--set", "lr=1e400"],                 # infinite as a float
    ["train", "ppo", ENV, "--set", "lr=1" + "0" * 400],         # an integer no float holds
    ["train", "ppo", ENV, "--set", "lr=1" + "0" * 5000],        # more digits than Python reads
    ["train", "ppo", ENV, "--set", "hidden=[0]"],
    ["train", "ppo", ENV, "--set", "minibatch_size=100000"],
    ["train", "ppo", ENV, "--total-steps", "0"],
    ["train", "ppo", ENV, "--seed", "abc"],
    ["train", "ppo"],
    ["train"],
    ["nope"],
    [],
])
def test_errors_are_one_line(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    if argv[:1] == ["train"] and len(argv) > 1:
        argv = [*argv, "--run-dir", str(run_dir), "--device", "cpu"]
    code, out, err = _run(argv, capsys)
    _assert_one_line_error(code, err)
    assert out == "" and not run_dir.exists()


def test_config_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "list.yaml").write_text("- lr: 0.1\n")
    (tmp_path / "scalar.yaml").write_text("3\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "broken.yaml").write_text("lr: [0.1\nseed: {\n")
    (tmp_path / "badvalue.yaml").write_text("lr: -0.5\n")
    (tmp_path / "unknown.yaml").write_text("learning_rate: 0.1\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "twice.yaml").write_text("lr: 0.1\nlr: 0.2\n")
    for name in ("missing.yaml", "list.yaml", "scalar.yaml", "empty.yaml", "broken.yaml", "badvalue.yaml",
                 "unknown.yaml", "binary.yaml", "twice.yaml", "."):
        code, _, err = _run(["train", "ppo", ENV, "--config", str(tmp_path / name), "--device", "cpu",
                             "--run-dir", str(tmp_path / "run")], capsys)
        _assert_one_line_error(code, err)
        if name not in ("badvalue.yaml", "unknown.yaml"):
            assert str(tmp_path / name) in err
    assert not (tmp_path / "run").exists()


def test_names_and_keys_that_are_not_strings_are_one_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """An algorithm, env or config-file key that YAML reads as a number or a list is refused in one sentence."""
    (tmp_path / "numberkey.yaml").write_text("1: 2\n")
    (tmp_path / "listalgo.yaml").write_text(f"algo: [ppo]\nenv: {ENV}\n")
    (tmp_path / "numberenv.yaml").write_text("algo: ppo\nenv: 12\n")
    for argv in (["train", "ppo", ENV, "--config", str(tmp_path / "numberkey.yaml")],
                 ["train", "--config", str(tmp_path / "listalgo.yaml")],
                 ["train", "--config", str(tmp_path / "numberenv.yaml")],
                 ["train", "ppo", "--set", "env=5"],
                 ["train", "--set", "algo=[1]", "--set", f"env={ENV}"]):
        code, out, err = _run([*argv, "--run-dir", str(tmp_path / "run"), "--device", "cpu"], capsys)
        _assert_one_line_error(code, err)
        assert out == "" and not (tmp_path / "run").exists()
    assert "numberkey.yaml: its key 1 is not a field name" in _run(
        ["train", "ppo", ENV, "--config", str(tmp_path / "numberkey.yaml")], capsys)[2]


def test_resuming_with_a_run_dir_that_is_not_a_path_is_one_line(trained_run: tuple[Path, dict[str, Any]],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = trained_run
    before = _snapshot(run_dir)
    for value in ("5", "null"):
        code, _, err = _run(["train", "--resume", str(run_dir), "--set", f"run_dir={value}"], capsys)
        _assert_one_line_error(code, err)
        assert "run_dir must be a run directory's path" in err
    assert _snapshot(run_dir) == before


@pytest.mark.parametrize(("argv", "error"), [
    (["train", "ppo", ENV, "--set", "progress=1"], "progress=1 cannot be given with --config or --set: `jaderl train` "
                                                   "sets progress itself; drop it"),
    (["train", "--resume", "RUN", "--set", "progress=1"], "progress=1 cannot be given with --config or --set"),
    (["pbt", "ppo", ENV, "--set", "members=3"], "`jaderl pbt` sets members itself; give it as --members"),
    (["pbt", "ppo", ENV, "--set", "env=jaderl/Pendulum-v1"], "`jaderl pbt` sets env itself; give it as ENV"),
    (["pbt", "ppo", ENV, "--set", "period_s=5"], "give it as --period-seconds"),
    (["tournament", "ppo", ENV, "--set", "seed=3"], "`jaderl tournament` sets seed itself; give it as --seed"),
    (["tournament", "ppo", ENV, "--set", "algos=[a2c]"], "give it as ALGO"),
])
def test_a_setting_that_names_an_argument_of_the_command_is_one_line(argv: list[str], error: str, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--set (or --config) passes config fields on as keywords: one that names the command's own argument (the
    progress callback, a population's seed or size) is refused, not a TypeError of a keyword given twice."""
    argv = [str(tmp_path / "run") if a == "RUN" else a for a in argv]
    code, out, err = _run([*argv, "--run-dir", str(tmp_path / "out")] if "--resume" not in argv else argv, capsys)
    _assert_one_line_error(code, err)
    assert error in err and out == ""
    assert not (tmp_path / "out").exists()


def test_a_config_file_that_gives_a_field_twice_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "twice.yaml"
    config.write_text("lr: 0.1\nseed: 3\n'lr': 0.2\n")
    code, _, err = _run(["train", "ppo", ENV, "--config", str(config), "--run-dir", str(tmp_path / "run")], capsys)
    _assert_one_line_error(code, err)
    assert err.strip() == (f"jaderl: error: cannot read config file {config}: 'lr' is given twice (lines 1 and 3); "
                           "keep one of them")
    assert not (tmp_path / "run").exists()
    config.write_text("base: &base {lr: 0.1}\n<<: *base\nlr: 0.2\n")  # overriding a merged key is what merging is for
    code, _, err = _run(["train", "ppo", ENV, "--config", str(config), "--run-dir", str(tmp_path / "run")], capsys)
    assert "given twice" not in err and "unknown field 'base'" in err


def test_resume_and_eval_without_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    for argv in (["train", "--resume", str(tmp_path)], ["train", "--resume", str(tmp_path / "missing")],
                 ["eval", str(tmp_path)], ["eval", str(tmp_path / "missing"), "--json"]):
        code, out, err = _run(argv, capsys)
        _assert_one_line_error(code, err)
        assert out == ""
    assert _snapshot(tmp_path) == {"notes.txt": b"keep me"}


def test_failing_commands_leave_run_dir_intact(trained_run: tuple[Path, dict[str, Any]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = trained_run
    before = _snapshot(run_dir)
    assert {"checkpoint.json", "metrics.csv", "config.yaml", "best_policy.safetensors"} <= set(before)
    d = str(run_dir)
    for argv in (["train", "ppo", ENV, "--run-dir", d, "--device", "cpu"],   # exists: needs --resume
                 ["train", "dqn", "Pendulum-v1", "--run-dir", d, "--device", "cpu"],
                 ["train", "ppo", ENV, "--resume", d],
                 ["train", "--resume", d, "--set", "lr=-1"],
                 ["train", "--resume", d, "--set", "nope=1"],
                 ["train", "--resume", d, "--set", "total_steps=abc"],
                 ["train", "--resume", d, "--set", "env=jaderl/Pendulum-v1"],
                 ["train", "--resume", d, "--set", "algo=dqn"],
                 ["train", "--resume", d, "--config", d + "/missing.yaml"],
                 ["train", "--resume", d, "--eval-episodes", "0"],
                 ["train", "--resume", d, "--no-zoo"],  # started with the zoo's settings: a setting like --seed
                 ["eval", d, "--episodes", "0"]):
        code, _, err = _run(argv, capsys)
        _assert_one_line_error(code, err)
        assert _snapshot(run_dir) == before, f"{argv} changed the run directory"


@pytest.mark.parametrize("argv", [["train", "ppo", "NoSuchEnv-v0"], ["train", "dqn", "Pendulum-v1"],
                                  ["train", "ppo", ENV, "--set", "lr=-1"]])
def test_errors_in_a_real_process(argv: list[str], tmp_path: Path) -> None:
    """No warning, log line or traceback slips onto stderr besides the error itself."""
    proc = _subprocess([*argv, "--run-dir", str(tmp_path / "run"), "--device", "cpu"], cwd=tmp_path)
    _assert_one_line_error(proc.returncode, proc.stderr)
    assert proc.stdout == "" and not (tmp_path / "run").exists()


def _checkpoint_file(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / CHECKPOINT_JSON).read_text())["tensor_file"]
    except (OSError, ValueError, KeyError):
        return None


def test_sigkill_then_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", ENV, "--run-dir", str(run_dir), "--checkpoint-every", "2048", "--eval-every", "2048",
            "--total-steps", "100000000", "--device", "cpu", "--eval-episodes", "2", "--set", "hidden=[32,32]",
            "--set", "num_epochs=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "jaderl.cli", *argv], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"training exited early: {proc.stderr.read() if proc.stderr else ''}"
            current = _checkpoint_file(run_dir)
            if first is None:
                first = current
            elif current is not None and current != first:
                break  # a later checkpoint replaced the first one
            time.sleep(0.02)
        else:
            pytest.fail("no second checkpoint within 60 s")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    meta = json.loads((run_dir / CHECKPOINT_JSON).read_text())
    saved_steps = meta["state"]["agent"]["counters"]["steps"]
    assert meta["tensor_file"] == f"ckpt-{saved_steps}.safetensors" and saved_steps >= 4096
    assert saved_steps % 2048 == 0
    target = saved_steps + 2 * 2048
    done = _subprocess(["train", "--resume", str(run_dir), "--total-steps", str(target), "--json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["steps"] == target and report["run_dir"] == str(run_dir)
    assert report["time_s"] >= meta["state"]["counters"]["time_s"]
    steps = _metric_steps(run_dir)
    assert len(steps) == len(set(steps)), f"duplicate steps in metrics.csv: {steps}"
    assert steps == sorted(steps) and steps[-2:] == [saved_steps + 2048, target]
    assert steps == list(range(2048, target + 1, 2048))  # every evaluation exactly once, none lost
    assert _checkpoint_file(run_dir) == f"ckpt-{target}.safetensors"
    assert [p.name for p in run_dir.glob("ckpt-*.safetensors")] == [f"ckpt-{target}.safetensors"]


def test_resume_with_the_runs_own_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(run_dir), "--total-steps", "256", *TINY], capsys)
    assert code == 0, err
    code, out, err = _run(["train", "--resume", str(run_dir), "--config", str(run_dir / "config.yaml"),
                           "--total-steps", "384", "--json"], capsys)  # its algo, env and run_dir are unchanged
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["steps"] == 384
    assert _metric_steps(run_dir) == [256, 384]


def test_a_new_run_from_another_runs_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run's config.yaml names its algo and env: they fill in ALGO and ENV, or must agree with them."""
    first = tmp_path / "first"
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(first), "--total-steps", "128", *TINY], capsys)
    assert code == 0, err
    config = str(first / "config.yaml")
    for i, argv in enumerate((["train", "--config", config], ["train", "ppo", ENV, "--config", config])):
        code, out, err = _run([*argv, "--run-dir", str(tmp_path / f"again{i}"), "--total-steps", "128", "--json"],
                              capsys)
        assert code == 0, err
        assert json.loads(out.splitlines()[-1])["steps"] == 128
    before = _snapshot(tmp_path)
    for argv, message in ((["train", "sac", "Pendulum-v1", "--config", config], "algo='ppo' from --config or --set "
                           "differs from ALGO 'sac' on the command line; drop one of them"),
                          (["train", "ppo", ENV, "--set", "env=Pendulum-v1"], "env='Pendulum-v1' from --config or "
                           f"--set differs from ENV '{ENV}' on the command line; drop one of them")):
        code, _, err = _run([*argv, "--run-dir", str(tmp_path / "refused")], capsys)
        _assert_one_line_error(code, err)
        assert err.strip() == f"jaderl: error: {message}"
    assert _snapshot(tmp_path) == before


def test_a_runs_own_config_file_starts_a_new_run_in_a_new_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The run_dir a run's config.yaml names is where that run is: a new run from the file gets a directory of its
    own; a copy of the file elsewhere still names that run's directory, which is refused, and no run's file changes."""
    monkeypatch.chdir(tmp_path)
    first = Path("runs") / "first"
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(first), "--total-steps", "128", *TINY], capsys)
    assert code == 0, err
    before = _snapshot(first)
    code, out, err = _run(["train", "--config", str(first / "config.yaml"), "--json"], capsys)
    assert code == 0, err
    again = Path(json.loads(out.splitlines()[-1])["run_dir"])
    assert again.parent == Path("runs") and again != first and (again / CHECKPOINT_JSON).exists()
    assert _snapshot(first) == before
    copy = tmp_path / "copy.yaml"
    copy.write_text((first / "config.yaml").read_text())
    code, _, err = _run(["train", "--config", str(copy)], capsys)
    _assert_one_line_error(code, err)
    assert f"run directory {first} already holds a run" in err
    assert _snapshot(first) == before


def test_a_damaged_best_policy_is_one_line(trained_run: tuple[Path, dict[str, Any]], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run[0], run_dir)
    best = run_dir / "best_policy.safetensors"
    best.write_bytes(best.read_bytes()[:100])
    code, out, err = _run(["eval", str(run_dir)], capsys)
    _assert_one_line_error(code, err)
    assert f"{best} is damaged" in err and "delete it to use the run's last checkpoint instead" in err
    best.unlink()
    code, out, err = _run(["eval", str(run_dir), "--episodes", "2"], capsys)
    assert code == 0 and "over 2 episodes" in out, err


def test_an_error_before_the_first_checkpoint_does_not_claim_one(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A loss that becomes NaN at the first evaluation, before any checkpoint: nothing is kept, so it says so."""
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "run"), "--total-steps", "512",
                         "--checkpoint-every", "100000", *TINY, "--set", "lr=1e30"], capsys)
    assert code == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "became nan by step 256" in err
    assert "no checkpoint had been written yet, so there is nothing to resume" in err
    assert not (tmp_path / "run" / CHECKPOINT_JSON).exists()


def test_a_full_disk_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device", str(tmp_path / "ckpt-256.safetensors.tmp"))

    monkeypatch.setattr("jaderl.api.train", disk_full)
    (tmp_path / CHECKPOINT_JSON).write_text("{}")  # the run's checkpoint of step 128, say
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 1 and err.splitlines() == [
        f"jaderl: error: No space left on device ({tmp_path / 'ckpt-256.safetensors.tmp'}); the last complete "
        "checkpoint is kept: free space or fix the path, then continue with --resume"]
    (tmp_path / CHECKPOINT_JSON).unlink()  # before the first checkpoint: nothing is kept, nothing to resume
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 1 and err.splitlines() == [
        f"jaderl: error: No space left on device ({tmp_path / 'ckpt-256.safetensors.tmp'}); no checkpoint had been "
        "written yet, so there is nothing to resume: free space or fix the path and start the run again"]


def test_a_run_dir_that_cannot_be_created_is_one_line_and_exit_2(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A --run-dir whose parent does not exist and cannot be made (under /proc), or under a file: the path is the
    user's input, so the system's reason and the path are an input error (exit status 2); --out of the other
    commands likewise."""
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", "/proc/jaderl-run", "--total-steps", "256", *TINY],
                        capsys)
    assert code == 2 and err.splitlines() == [
        "jaderl: error: No such file or directory (/proc/jaderl-run); choose another path and start the run again"]
    (tmp_path / "afile").write_text("")
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "afile" / "sub"), "--total-steps", "256",
                         *TINY], capsys)
    assert code == 2 and err.splitlines() == [
        f"jaderl: error: {tmp_path / 'afile'} is a file, not a directory, so {tmp_path / 'afile' / 'sub'} cannot be "
        "created; choose another path and start the run again"]
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "run"), "--total-steps", "256", *TINY],
                        capsys)
    assert code == 0, err
    code, _, err = _run(["record", str(tmp_path / "run"), "--episodes", "1", "--out", str(tmp_path / "afile" / "v")],
                        capsys)
    assert code == 2 and err.splitlines() == [
        f"jaderl: error: {tmp_path / 'afile'} is a file, not a directory, so {tmp_path / 'afile' / 'v'} cannot be "
        "created; choose another path and run the command again"], err


def test_version_and_the_zoo_line_when_every_tuned_setting_is_overridden(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--version"], capsys)
    assert code == 0 and out.strip() == f"jaderl {jaderl.__version__}"
    code, out, err = _run(["train", "mappo", "jaderl/simple_spread", "--total-steps", "64", "--eval-every", "64",
                           "--eval-episodes", "1", "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert err.splitlines()[0] == ("zoo: every tuned setting of jaderl/zoo/simple_spread.yaml for mappo on "
                                   "jaderl/simple_spread is overridden by yours")


def test_a_ctrl_c_outside_the_loop_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # e.g. a second Ctrl-C while the loop writes its last checkpoint

    monkeypatch.setattr("jaderl.api.train", interrupted)
    code, _, err = _run(["train", "ppo", ENV], capsys)
    assert code == 130 and err.splitlines() == ["jaderl: interrupted; the last complete checkpoint is kept"]


@pytest.mark.parametrize(("algo", "error", "advice"), [
    ("dqn", "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
     "allocate 28224000000 bytes. Error code 12 (Cannot allocate memory)",
     "28.2 GB could not be allocated on cpu; start a new run with a lower buffer_size (the replay buffer keeps"),
    ("ppo", "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB",
     "20.00 GiB could not be allocated on cpu; start a new run with a lower num_envs or horizon"),
])
def test_running_out_of_memory_is_one_line_and_exit_1(algo: str, error: str, advice: str,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An allocation failure (an Atari replay buffer of a million transitions takes 56 GB) names the setting."""
    def allocation_fails(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(error) if algo == "dqn" else torch.OutOfMemoryError(error)

    monkeypatch.setattr("jaderl.api.train_loop", allocation_fails)
    code, _, err = _run(["train", algo, ENV, "--device", "cpu", "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith(f"jaderl: error: out of memory: {advice}")


@pytest.mark.parametrize("where", ["building", "stepping"])
def test_running_out_of_memory_in_evaluation_names_eval_episodes(where: str, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    """The evaluation env has eval_episodes sub-envs: running out of memory building or stepping it names that."""
    from jaderl.core import loop

    real = loop.make_env

    def make_env(name: str, num_envs: int, *args: Any, **kwargs: Any) -> Any:
        if num_envs != 7:  # the training env
            return real(name, num_envs, *args, **kwargs)
        if where == "building":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity")
        env = real(name, num_envs, *args, **kwargs)

        def step(action: torch.Tensor) -> None:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 3000000000 bytes")

        env.step = step
        return env

    monkeypatch.setattr(loop, "make_env", make_env)
    code, _, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "run"), "--total-steps", "256", *TINY,
                         "--eval-episodes", "7"], capsys)
    amount = "3.00 GiB" if where == "building" else "3.0 GB"
    assert code == 1 and err.splitlines() == [
        f"jaderl: error: out of memory: {amount} could not be allocated on cpu while evaluating eval_episodes=7 "
        "episodes side by side (one sub-env each); lower eval_episodes (--eval-episodes, which a resumed run may "
        "change too)"]


def test_running_out_of_memory_names_the_env_ids_agent_count(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    def allocation_fails(*args: Any, **kwargs: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB.")

    monkeypatch.setattr("jaderl.api.train_loop", allocation_fails)
    code, _, err = _run(["train", "mappo", "jaderl/simple_spread?num_agents=4000&continuous=true", "--device", "cpu",
                         "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 1 and err.splitlines() == [
        "jaderl: error: out of memory: 20.00 GiB could not be allocated on cpu; start a new run with a lower num_envs "
        "or horizon (the rollout), or minibatch_size, or lower num_agents=4000 in the env id (each sub-env holds that "
        "many entities)"]


def test_eval_running_out_of_memory_is_one_line(trained_run: tuple[Path, dict[str, Any]],
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = trained_run
    before = _snapshot(run_dir)

    def allocation_fails(*args: Any, **kwargs: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB.")

    monkeypatch.setattr("jaderl.api.run_episodes", allocation_fails)
    code, out, err = _run(["eval", str(run_dir), "--episodes", "1000"], capsys)
    _assert_one_line_error(code, err)
    assert out == "" and err.strip() == ("jaderl: error: out of memory: 9.00 GiB could not be allocated on cpu while "
                                         "evaluating 1000 episodes side by side (one sub-env each); evaluate "
                                         "fewer episodes")
    assert _snapshot(run_dir) == before


def test_the_first_progress_line_of_a_resumed_run_shows_its_rate(capsys: pytest.CaptureFixture[str]) -> None:
    from jaderl.cli import ProgressPrinter

    printer = ProgressPrinter()
    printer({"steps": 20_480, "time_s": 2.0, "eval_return": 10.0, "best_eval_return": 10.0, "done": False})
    line = capsys.readouterr().err
    rate = int(line.split("|")[1].split()[0].replace(",", ""))
    assert 9_000 < rate <= 10_240, line  # 20,480 steps in 2 s of training, not 0 steps/s


# --- an honest run lifecycle: Ctrl-C, closed pipes, damaged or diverged checkpoints, 1e5-style counts ---

def _copy_run(trained_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished run and the path of its checkpoint's tensor file."""
    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run[0], run_dir)
    tensor_file = _checkpoint_file(run_dir)
    assert tensor_file is not None
    return run_dir, run_dir / tensor_file


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_after_the_final_checkpoint_exits_130(tmp_path: Path, stop: str) -> None:
    """SIGINT (Ctrl-C) in the middle of a run, or SIGTERM (`kill`, a job scheduler) to a background job, whose SIGINT
    the shell ignores: the loop saves its last checkpoint and reports, and the exit code says that the run was
    interrupted (130), not that it finished (0)."""
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "jaderl/Pendulum-v1", "--run-dir", str(run_dir), "--total-steps", "1e9", "--num-envs",
            "4", "--eval-every", "128", "--checkpoint-every", "1e9", "--eval-episodes", "1", "--device", "cpu",
            "--set", "hidden=[16]", "--set", "horizon=32", "--set", "minibatch_size=64", "--set", "num_epochs=1",
            "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # `python -m jaderl.cli`, with Ctrl-C raising KeyboardInterrupt even where this test runs with SIGINT ignored
    # (a background job of a script), which a child would inherit; for SIGTERM, ignored as in a background job
    sigint = "signal.default_int_handler" if stop == "SIGINT" else "signal.SIG_IGN"
    start = (f"import runpy, signal; signal.signal(signal.SIGINT, {sigint}); "
             "runpy.run_module('jaderl.cli', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", start, *argv], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    lines: queue.Queue[str] = queue.Queue()

    def read_stderr(stream: Any) -> None:
        for line in stream:
            lines.put(line)

    reader = threading.Thread(target=read_stderr, args=(proc.stderr,), daemon=True)
    reader.start()
    try:
        first = lines.get(timeout=120)  # the zoo's line, then the first progress line: the first evaluation is done
        if first.startswith("zoo: "):
            first = lines.get(timeout=120)
        assert first.startswith("steps "), first
        proc.send_signal(getattr(signal, stop))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out = proc.stdout.read()  # one line: the pipe never fills
        proc.stdout.close()
        reader.join(timeout=10)
        proc.stderr.close()
    err = "".join(lines.queue)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "error" not in err, err
    report = json.loads(out.splitlines()[-1])
    assert report["stop_reason"] == "interrupted" and report["run_dir"] == str(run_dir)
    meta = json.loads((run_dir / CHECKPOINT_JSON).read_text())
    assert report["steps"] >= 128 and meta["tensor_file"] == f"ckpt-{report['steps']}.safetensors"  # the final one


@pytest.mark.parametrize("torchrun", [False, True])
def test_sigterm_stops_like_ctrl_c_except_in_torchrun_learners(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], torchrun: bool) -> None:
    """The jaderl command turns SIGTERM into a Ctrl-C, except in a learner that torchrun started: torchrun ends its
    learners with SIGTERM when one of them fails, and they must stop at once rather than after a step that waits on
    the failed one."""
    from jaderl.interrupts import _terminate

    for name, value in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        if torchrun:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    seen = []
    monkeypatch.setattr("jaderl.cli._command", lambda args: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    before = signal.getsignal(signal.SIGTERM)
    assert _run(["algos"], capsys)[0] == 0
    assert (seen[0] is _terminate) is not torchrun and signal.getsignal(signal.SIGTERM) is before


def test_the_text_summary_of_an_interrupted_run_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from jaderl.core.loop import TrainResult

    def interrupted(*args: Any, **kwargs: Any) -> TrainResult:
        return TrainResult(solved=False, steps=384, time_s=1.5, best_eval_return=20.0, last_eval_return=18.0,
                           stop_reason="interrupted", run_dir="runs/x")

    monkeypatch.setattr("jaderl.api.train", interrupted)
    code, out, err = _run(["train", "ppo", ENV], capsys)
    assert code == 130 and err == ""
    assert out == "interrupted: 384 steps in 1.5 s, best evaluation 20.00; run directory runs/x\n"


def test_the_text_summary_of_a_run_stopped_before_its_first_evaluation(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from jaderl.core.loop import TrainResult

    def interrupted(*args: Any, **kwargs: Any) -> TrainResult:
        return TrainResult(solved=False, steps=384, time_s=1.5, best_eval_return=-math.inf,
                           last_eval_return=math.nan, stop_reason="interrupted", run_dir="runs/x")

    monkeypatch.setattr("jaderl.api.train", interrupted)
    code, out, err = _run(["train", "ppo", ENV], capsys)
    assert code == 130 and err == ""
    assert out == "interrupted: 384 steps in 1.5 s, no evaluation yet; run directory runs/x\n"


@pytest.mark.parametrize("argv", [["algos"], ["envs"], ["eval", "RUN", "--episodes", "2", "--json"]])
def test_a_closed_pipe_on_stdout_exits_quietly_with_141(argv: list[str], trained_run: tuple[Path, dict[str, Any]],
                                                        tmp_path: Path) -> None:
    """`jaderl algos | head -n 1`: the reader closed the pipe before the output came; no checkpoint is blamed."""
    argv = [str(trained_run[0]) if a == "RUN" else a for a in argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "jaderl.cli", *argv], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone long before the command prints: every write meets a closed pipe
    try:
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert err == ""  # no traceback, no "Exception ignored", no word about checkpoints


def test_a_closed_pipe_in_a_shell_pipeline(trained_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The same through a shell: `jaderl eval RUN | head -c 0`, a reader that is gone before the output comes."""
    shell = shutil.which("bash")
    if shell is None:
        pytest.skip("needs bash")
    command = (f"{sys.executable} -m jaderl.cli eval {trained_run[0]} --episodes 2 --json | head -c 0; "
               'echo " ${PIPESTATUS[0]}"')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([shell, "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["141"] and done.stderr == "", done.stderr


def test_eval_uses_the_best_policy_when_the_checkpoint_tensors_are_damaged(
        trained_run: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import jaderl

    run_dir, tensor_path = _copy_run(trained_run, tmp_path)
    intact = _run(["eval", str(run_dir), "--episodes", "2", "--json"], capsys)
    assert intact[0] == 0, intact[2]
    original = tensor_path.read_bytes()
    for damaged in (original[:100], b"\x00garbage" * 64, original[:8] + b"{not json" + original[17:]):
        tensor_path.write_bytes(damaged)  # cut short, overwritten, a broken header
        code, out, err = _run(["eval", str(run_dir), "--episodes", "2", "--json"], capsys)
        assert code == 0 and err == "", err
        assert json.loads(out.splitlines()[-1]) == json.loads(intact[1].splitlines()[-1])  # the same best policy
        assert jaderl.load(run_dir).steps == 512  # the counters come from the checkpoint's JSON
        with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(run_dir))} holds no readable checkpoint: "
                                                    rf"{re.escape(str(tensor_path))} is missing or damaged \(.+\); "
                                                    "load its best policy instead"):
            jaderl.load(run_dir, best=False)
    (run_dir / CHECKPOINT_JSON).write_text("{")  # and a damaged checkpoint.json: the config comes from config.yaml
    code, out, err = _run(["eval", str(run_dir), "--episodes", "2", "--json"], capsys)
    assert code == 0 and json.loads(out.splitlines()[-1]) == json.loads(intact[1].splitlines()[-1]), err


def test_eval_with_the_checkpoint_and_the_best_policy_damaged_is_one_line(
        trained_run: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, tensor_path = _copy_run(trained_run, tmp_path)
    best = run_dir / "best_policy.safetensors"
    tensor_path.write_bytes(tensor_path.read_bytes()[:100])
    best.write_bytes(b"garbage")
    code, out, err = _run(["eval", str(run_dir)], capsys)
    _assert_one_line_error(code, err)
    assert out == "" and f"{best} is damaged" in err and "delete it to use the run's last checkpoint instead" in err
    best.unlink()  # as it says: then the last checkpoint is needed, and it is damaged too
    code, out, err = _run(["eval", str(run_dir), "--json"], capsys)
    _assert_one_line_error(code, err)
    assert out == "" and f"{tensor_path} is missing or damaged" in err
    assert err.rstrip().endswith("restore the run directory from a copy or start a new run")
    (run_dir / CHECKPOINT_JSON).unlink()
    code, out, err = _run(["eval", str(run_dir)], capsys)
    _assert_one_line_error(code, err)
    assert f"{run_dir / CHECKPOINT_JSON} is missing or damaged); pass the run directory of a run that" in err
    code, out, err = _run(["train", "--resume", str(run_dir)], capsys)
    _assert_one_line_error(code, err)
    assert err.rstrip().endswith("pass the run directory of a run that has saved one, or start a new run")


def _poison(tensor_path: Path, prefix: str = "/agent/") -> str:
    """Write NaN into the first floating-point tensor under ``prefix`` of a checkpoint file; returns its key."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(tensor_path), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(tensor_path))
    key = next(k for k, v in sorted(tensors.items()) if k.startswith(prefix) and v.is_floating_point() and v.numel())
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = math.nan
    save_file(tensors, str(tensor_path), metadata=metadata)
    return key


def test_nan_parameters_in_a_checkpoint_are_refused(trained_run: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import jaderl
    from jaderl.core.config import ConfigError

    run_dir, tensor_path = _copy_run(trained_run, tmp_path)
    key = _poison(tensor_path)
    name = key.strip("/").replace("/", ".")  # e.g. agent.actor.net.0.weight
    code, out, err = _run(["eval", str(run_dir), "--episodes", "2"], capsys)
    assert code == 0 and "over 2 episodes" in out, err  # the best policy is intact and needs no checkpoint tensors
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tensor_path))} holds NaN or infinite values "
                                          rf"\({re.escape(name)}\); resume from an earlier copy or start a new run$"):
        jaderl.load(run_dir, best=False)
    (run_dir / "best_policy.safetensors").unlink()
    code, out, err = _run(["eval", str(run_dir), "--json"], capsys)
    _assert_one_line_error(code, err)
    assert out == "" and err.strip() == (f"jaderl: error: {tensor_path} holds NaN or infinite values ({name}); "
                                         "resume from an earlier copy or start a new run")


def test_finite_or_raise_names_the_first_bad_tensor() -> None:
    from jaderl.core.checkpoint import finite_or_raise
    from jaderl.core.config import ConfigError

    ok = {"agent": {"actor": {"w": torch.ones(2)}, "steps": 5, "rng": torch.zeros(3, dtype=torch.uint8)},
          "best": -math.inf}
    finite_or_raise(ok, "f")  # counters may be infinite (no evaluation yet): only tensors are parameters
    bad = {"agent": {"actor": {"w": torch.tensor([1.0, math.inf])}, "opt": [{"m": torch.tensor(math.nan)}]}}
    with pytest.raises(ConfigError, match=r"^f holds NaN or infinite values \(agent\.actor\.w and 1 more\); "):
        finite_or_raise(bad, "f")


def test_counts_may_be_written_like_1e5(tmp_path: Path, trained_run: tuple[Path, dict[str, Any]],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from jaderl.cli import build_parser

    args = build_parser().parse_args(["train", "ppo", ENV, "--total-steps", "1e5", "--num-envs", "6.4e1",
                                      "--eval-every", "2e4", "--checkpoint-every", "1_000", "--seed", "7"])
    assert (args.total_steps, args.num_envs, args.eval_every, args.checkpoint_every, args.seed) == \
        (100_000, 64, 20_000, 1000, 7)
    assert all(type(v) is int for v in (args.total_steps, args.num_envs, args.eval_every))
    assert build_parser().parse_args(["eval", "RUN", "--episodes", "3e0"]).episodes == 3
    code, out, err = _run(["train", "ppo", ENV, "--run-dir", str(tmp_path / "r"), *TINY, "--total-steps", "2.56e2",
                           "--eval-every", "2.56E2", "--num-envs", "4e0", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["steps"] == 256
    code, out, err = _run(["eval", str(trained_run[0]), "--episodes", "2e0", "--json"], capsys)
    assert code == 0 and json.loads(out.splitlines()[-1])["episodes"] == 2, err


@pytest.mark.parametrize(("flag", "value"), [("--total-steps", "1.5e3.7"), ("--num-envs", "1.5"),
                                             ("--eval-every", "abc"), ("--total-steps", "nan"),
                                             ("--checkpoint-every", "inf"), ("--seed", "2.5e-1"),
                                             ("--total-steps", "1e30"), ("--episodes", "2.5")])
def test_counts_that_are_not_whole_numbers_are_refused(flag: str, value: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    argv = ["eval", str(run_dir)] if flag == "--episodes" else ["train", "ppo", ENV, "--run-dir", str(run_dir)]
    code, out, err = _run([*argv, flag, value], capsys)
    _assert_one_line_error(code, err)
    assert out == "" and f"argument {flag}: " in err and value in err and not run_dir.exists()
    assert "is not a whole number; write one such as 100000 or 1e5" in err or "is out of range" in err


def test_flags_are_whole_words_not_prefixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse would take ``--total`` for ``--total-steps``: every command takes only whole flags."""
    run_dir = tmp_path / "run"
    for argv in (["train", "ppo", ENV, "--total", "256", "--run-dir", str(run_dir), "--device", "cpu"],
                 ["train", "--resume", str(run_dir), "--no-z"],
                 ["eval", str(run_dir), "--epi", "2"],
                 ["pbt", "ppo", ENV, "--member", "3"],
                 ["tournament", "ppo", ENV, "--leaderboard", "3"]):
        code, out, err = _run(argv, capsys)
        _assert_one_line_error(code, err)
        assert "unrecognized arguments: --" in err and out == ""
    assert not run_dir.exists()


def test_the_zoo_line_comes_before_warnings_about_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warning given while the run is set up follows the line that says which zoo entry made its config."""
    monkeypatch.setenv("JADERL_BLOCK_BYTES", "1M")
    proc = _subprocess(["train", "ppo", ENV, "--run-dir", str(tmp_path / "run"), "--total-steps", "256", *TINY],
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("zoo: tuned settings for ppo on CartPole-v1"), proc.stderr
    assert lines[1].startswith("jaderl: warning: JADERL_BLOCK_BYTES='1M'"), proc.stderr
    assert lines[2].startswith("steps "), proc.stderr


def test_a_block_size_that_is_not_a_number_is_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JADERL_BLOCK_BYTES=1M (not a number of bytes) is ignored with one warning line, not a traceback in training."""
    monkeypatch.setenv("JADERL_BLOCK_BYTES", "1M")
    proc = _subprocess(["train", "ppo", ENV, "--run-dir", str(tmp_path / "run"), "--total-steps", "256", *TINY],
                       cwd=tmp_path)
    assert proc.returncode == 0 and "total_steps" in proc.stdout, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "JADERL_BLOCK_BYTES" in line]
    assert warned == ["jaderl: warning: JADERL_BLOCK_BYTES='1M' is not a whole number of bytes, so it is ignored; set "
                      "it to one such as 262144 (0: no blocking) or unset it"]
    assert "Traceback" not in proc.stderr
