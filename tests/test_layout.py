"""The README's promise about the package's shape: a core small enough to read in an evening."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import jaderl

CORE_BUDGET = 1000  # lines of code in jaderl/core/*.py (README, "Layout")


def lines_of_code(source: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring."""
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstring_lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code_lines: set[int] = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            code_lines.update(range(token.start[0], token.end[0] + 1))
    return len(code_lines - docstring_lines)


def test_lines_of_code_counts_only_code() -> None:
    source = ('"""Module\ndocstring."""\n\n# a comment\nx = 1  # trailing\n\n\n'
              'def f():\n    """Doc."""\n    return (x +\n            2)\n')
    assert lines_of_code(source) == 4  # x = 1, def f, and the two lines of the return


def test_the_core_stays_under_its_budget() -> None:
    core = Path(jaderl.__file__).parent / "core"
    counts = {path.name: lines_of_code(path.read_text()) for path in sorted(core.glob("*.py"))}
    total = sum(counts.values())
    assert total < CORE_BUDGET, f"jaderl/core has {total} lines of code ({counts}); the README promises under 1,000"
