"""Every `jaderl train` command shown in the README and in docs/ runs, at a small budget (the ones that promise a
result are trained to it by the slow learning tests: the zoo's entries, tests/algos/test_learning.py)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from jaderl.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDERS = ("ALGO", "RUN_DIR", "runs/RUN", "runs/X", "FILE.yaml", "...", "$PWD", "POP_DIR")
"""Commands that show a form rather than a command to type are left out."""
NEEDS = {"HalfCheetah-v5": "mujoco", "ALE/": "ale_py", "brax/": "brax", "playground/": "mujoco_playground",
         "maniskill/": "mani_skill"}


def _commands() -> list[tuple[str, str]]:
    """(where, command) of every `jaderl train ALGO ENV ...` in a code block or an inline code span."""
    found = []
    for page in PAGES:
        text = page.read_text().replace("\\\n", " ")  # continued shell lines
        spans = re.findall(r"^\$? ?(jaderl train [^\n#]*)", text, flags=re.M) + re.findall(r"`(jaderl train [^`]*)`",
                                                                                        text)
        for command in spans:
            command = " ".join(command.split())
            if command.startswith("jaderl train --resume") or any(p in command for p in PLACEHOLDERS):
                continue
            words = shlex.split(command)
            if len(words) < 4 or words[2].startswith("-") or words[3].startswith("-"):
                continue  # fragments such as `jaderl train --learners N`
            if command not in {c for _, c in found}:  # a command shown on several pages runs once
                found.append((page.name, command))
    return found


COMMANDS = _commands()


def test_the_pages_show_train_commands() -> None:
    assert len(COMMANDS) >= 20, COMMANDS


SLOW = {"brax/": 80, "playground/": 120}
"""Commands whose env compiles for a long time (JAX: once for training, once for the evaluator) run as slow tests."""


@pytest.mark.parametrize(("page", "command"), [
    pytest.param(page, command, id=f"{page}:{command[13:60]}",
                 marks=[pytest.mark.slow(seconds=s) for marker, s in SLOW.items() if marker in command])
    for page, command in COMMANDS])
def test_train_command_runs_at_a_small_budget(page: str, command: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for marker, module in NEEDS.items():
        if marker in command and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}")
    argv = shlex.split(command)[1:]
    small = ["--total-steps", "64", "--eval-every", "64", "--eval-episodes", "1", "--checkpoint-every", "64",
             "--run-dir", str(tmp_path / "run"), "--device", "cpu"]
    drop = {"--total-steps", "--eval-every", "--eval-episodes", "--checkpoint-every", "--run-dir", "--device",
            "--time-limit"}
    kept: list[str] = []
    skip_next = False
    for arg in argv:
        if skip_next:
            skip_next = False
        elif arg in drop:
            skip_next = True
        else:
            kept.append(arg)
    extra = ["--set", "buffer_size=2000", "--set", "warmup_steps=32"] if "buffer_size" in command else []
    code = main([*kept, *small, *extra])
    assert code == 0, f"{page}: `{command}` exited {code}: {capsys.readouterr().err[-2000:]}"
