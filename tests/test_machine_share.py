"""The suite's own scheduling: under pytest-xdist, a test marked ``alone`` runs with no other test beside it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

INNER_TESTS = '''
import json, os, time
import pytest

def _record(name):
    start = time.monotonic()
    time.sleep(0.4)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([name, start, time.monotonic()]) + "\\n")

@pytest.mark.parametrize("k", range(6))
def test_shared(k):
    _record(f"shared{k}")

@pytest.mark.alone
@pytest.mark.parametrize("k", range(2))
def test_alone(k):
    _record(f"alone{k}")
'''


def test_an_alone_test_never_runs_beside_another(tmp_path: Path) -> None:
    """Two workers take eight tests of 0.4 s; the two marked ``alone`` overlap no other test, and the others do run
    side by side (so the check sees two workers at work)."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import machine_share  # noqa: F401\n")
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    (tmp_path / "pytest.ini").write_text(textwrap.dedent("""\
        [pytest]
        markers = alone: no other test beside it
        """))
    spans = tmp_path / "spans.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", str(tmp_path),
                           "--basetemp", str(tmp_path / "basetemp")], cwd=tmp_path, capture_output=True, text=True,
                          env={"SPANS": str(spans), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    assert len(rows) == 8

    def overlap(a: list, b: list) -> bool:
        return a[1] < b[2] and b[1] < a[2]

    alone = [r for r in rows if r[0].startswith("alone")]
    assert [(a[0], b[0]) for a in alone for b in rows if a is not b and overlap(a, b)] == []
    shared = [r for r in rows if r[0].startswith("shared")]
    assert any(overlap(a, b) for a in shared for b in shared if a is not b), "the workers never ran side by side"
