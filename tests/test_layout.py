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


LAYERS = ["envs", "accel", "interrupts", "plots", "zoo", "core", "algos", "marl", "parallel", "api", "population",
          "integrations", "cli"]
"""Lower first: a module may import only from its own layer or lower ones (docs/architecture.md)."""


def _imports() -> dict[str, set[str]]:
    """Every jaderl module and the jaderl modules it imports, at module level or inside functions (a lazy import
    that dodges a cycle is still a dependency); imports under ``if TYPE_CHECKING:`` are not."""
    root = Path(jaderl.__file__).parent
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        # a package's __init__ importing its own submodules is how a package is assembled, not a dependency
        # (``from jaderl import api`` names the package only to reach its submodule)
        graph[name] = {d for d in found if d in names and d not in (name, "jaderl") and not d.startswith(name + ".")}
    return graph


def test_no_import_cycles() -> None:
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles inside jaderl/: {[' -> '.join(c) for c in cycles]}"


def test_a_test_of_cycles_finds_one() -> None:
    """The cycle test's own check: the graph builder sees a function-level import."""
    graph = _imports()
    assert "jaderl.core.agent" in graph["jaderl.core.loop"]
    assert "jaderl.api" in graph["jaderl.cli"]


def test_arrows_point_down() -> None:
    def layer(module: str) -> int:
        part = module.split(".")[1] if module.count(".") else ""
        return LAYERS.index(part) if part in LAYERS else len(LAYERS)  # jaderl/__init__ sits on top

    upward = [f"{m} -> {d}" for m, deps in _imports().items() for d in deps if layer(d) > layer(m)]
    assert not upward, f"imports that point up the layers {LAYERS}: {upward}"


def test_test_modules_have_unique_names() -> None:
    """Test directories are not packages, so pytest imports each test module by its file name: two files of one
    name in different directories fail collection."""
    names: dict[str, list[str]] = {}
    for path in Path(__file__).parent.rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(Path(__file__).parent)))
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not shared, f"test modules sharing a file name (rename one): {shared}"

