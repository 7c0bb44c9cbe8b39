"""The population directory on disk: its JSON state (written atomically), population.csv, the plot, the best run.

    POP_DIR/population.json     settings, generations done, each member's lineage, the controller's random state
                                (and, once it ends, the last generation's ranking, for a resume that trains on)
    POP_DIR/population.csv      one row per member and generation: generation, member, parent, steps, score,
                                hyperparameters (JSON), node
    POP_DIR/population.png      every member's score against env steps; dashed lines mark copies (exploits)
    POP_DIR/members/mNN/        each member's ordinary run directory (checkpoint, metrics.csv, TensorBoard)
    POP_DIR/best/               a copy of the best member's run directory (``jaderl eval``, ``jaderl.load``,
                                ``jaderl train --resume`` accept it)
    POP_DIR/driver.lock         there while a driver runs (:func:`driven`): its lock, naming its process and host
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import shutil
import socket
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from jaderl.core.checkpoint import CHECKPOINT_JSON
from jaderl.core.config import ConfigError

try:
    import fcntl
except ImportError:  # (Windows: populations run without the driver lock)
    fcntl = None  # type: ignore[assignment]

STATE_JSON = "population.json"
CSV_NAME = "population.csv"
PLOT_NAME = "population.png"
DRIVER_LOCK = "driver.lock"
CSV_COLUMNS = ["generation", "member", "parent", "steps", "score", "hyperparameters", "node"]


def population_dir(run_dir: str | None, kind: str, algo: str, env: str, seed: int) -> Path:
    """The path of a new population directory: ``run_dir``, or ``runs/KIND-ALGO-ENV-sSEED-TIME``; a file, or a
    directory that already holds files (a population, say), is refused in one sentence. Nothing is created, so the
    path is checked before Ray starts and made once the members are sure to fit (:func:`new_population_dir`)."""
    if not run_dir:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        name = re.sub(r"[^\w.-]+", "_", env)[:64]  # ids may hold paths and options
        run_dir = str(Path("runs") / f"{kind}-{algo}-{name}-s{seed}-{stamp}")
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"population directory {path} is a file; pick another --run-dir")
    if (blocking := next((p for p in path.parents if p.is_file()), None)) is not None:
        raise ConfigError(f"population directory {path} cannot be created: {blocking} is a file; pick another "
                          "--run-dir")
    if path.exists() and any(path.iterdir()):
        held = ("a population; continue it with `jaderl pbt --resume`" if (path / STATE_JSON).exists() else
                "a tournament; continue it with `jaderl tournament --resume`" if (path / "tournament.json").exists()
                else "files; delete them")
        raise ConfigError(f"population directory {path} already holds {held} or pick another --run-dir")
    return path


def new_population_dir(run_dir: str | None, kind: str, algo: str, env: str, seed: int) -> Path:
    """A new, empty population directory (checked as :func:`population_dir` checks it, then created), as an absolute
    path: members take their run directories from it, and a member's process need not share the driver's working
    directory (a cluster's workers start where ``ray start`` ran)."""
    path = population_dir(run_dir, kind, algo, env, seed)
    path.mkdir(parents=True, exist_ok=True)
    return path.absolute()


@contextlib.contextmanager
def driven(pop_dir: Path) -> Iterator[None]:
    """Hold ``pop_dir`` for this driver while the block runs: a second driver of the same population or tournament
    (a ``--resume`` while the first still runs, whose members and files the two would otherwise both change) is
    refused in one sentence naming the first. The lock is the kernel's (``flock`` on ``POP_DIR/driver.lock``), so it
    goes when the driver's process ends, however it ends; the file goes with a driver that ends normally."""
    if fcntl is None:
        yield
        return
    path = pop_dir / DRIVER_LOCK
    while True:
        f = open(path, "a+")  # noqa: SIM115  (closed below, which releases the lock)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise ConfigError(f"{pop_dir} is in use by another driver ({holder}); wait for it to end, or stop it "
                              "with Ctrl-C, before resuming") from None
        try:
            mine = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            mine = False
        if mine:
            break
        f.close()  # a driver that was ending removed the file after this one opened it: lock the next one
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # (while still locked: a driver waiting on it then opens a new file)
        f.close()


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(pop_dir: str | Path) -> dict[str, Any]:
    """The population's saved state, or one sentence saying that ``pop_dir`` holds none."""
    path = Path(pop_dir) / STATE_JSON
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or "settings" not in state:
            raise ValueError("no settings")
        return state
    except (OSError, ValueError):
        raise ConfigError(f"{pop_dir} holds no population ({path} is missing or damaged); pass the directory of a "
                          "population started with `jaderl pbt`") from None


def read_rows(pop_dir: Path) -> list[dict[str, str]]:
    """population.csv's rows (none if it does not exist yet)."""
    return read_csv(pop_dir / CSV_NAME)


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of the CSV file ``path`` as dicts (none if it does not exist yet)."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def write_rows(pop_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Rewrite population.csv with ``rows`` (atomically)."""
    write_csv(pop_dir / CSV_NAME, CSV_COLUMNS, rows)


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Rewrite the CSV file ``path`` with a header of ``columns`` and ``rows``, atomically: a temporary file, flushed
    and synced to disk, renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
        f.flush()
        os.fsync(f.fileno())  # on disk before it replaces the file (and before population.json records the rows)
    os.replace(tmp, path)


def csv_row(generation: int, member: int, parent: int, steps: int, score: float, hyperparameters: dict[str, float],
            node: str) -> dict[str, Any]:
    return {"generation": generation, "member": member, "parent": parent, "steps": steps,
            "score": f"{score:.6g}" if math.isfinite(score) else str(score),
            "hyperparameters": json.dumps({k: float(f"{v:.6g}") for k, v in hyperparameters.items()}), "node": node}


def copy_run(source: Path, target: Path) -> None:
    """Replace ``target`` with a copy of the run directory ``source`` (copied beside it first, then renamed)."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("*.tmp", "stop"))
    old = target.with_name(target.name + ".old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def damaged_checkpoint(run_dir: Path) -> tuple[Path, str] | None:
    """The file of ``run_dir``'s checkpoint that cannot be read and why, or None when the run has no checkpoint or
    one that reads (its JSON parses and its tensor file's header matches the file's size; no tensor is read).
    Checkpoints are written atomically, so a process that dies leaves none damaged: a damaged one fails every load."""
    json_path = run_dir / CHECKPOINT_JSON
    if not json_path.exists():
        return None
    try:
        meta = json.loads(json_path.read_text())
        tensor_path = run_dir / meta["tensor_file"]
        if not isinstance(meta["state"], dict):
            raise TypeError("its state is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return json_path, _first_line(exc)
    try:
        with safe_open(str(tensor_path), framework="pt") as f:
            f.keys()
    except (OSError, SafetensorError) as exc:
        return tensor_path, _first_line(exc)
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def plot_population(pop_dir: Path, title: str) -> Path | None:
    """Draw population.png: each member's scores against env steps; a dashed line from the parent's point marks a
    member that started the generation from a copy of another. Returns the path (None without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(pop_dir)
    points = {(int(r["generation"]), int(r["member"])): (int(r["steps"]), float(r["score"])) for r in rows}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    members = sorted({int(r["member"]) for r in rows})
    colours = plt.cm.tab10.colors  # type: ignore[attr-defined]
    marked = False
    for m in members:
        colour = colours[m % len(colours)]
        mine = sorted((int(r["generation"]), int(r["parent"])) for r in rows if int(r["member"]) == m)
        for g, parent in mine:
            x, y = points[(g, m)]
            before = points.get((g - 1, parent))
            if before is None or not all(map(math.isfinite, (*before, y))):
                continue
            exploited = parent != m
            ax.plot([before[0], x], [before[1], y], color=colour, linestyle="--" if exploited else "-", lw=1.2)
            if exploited:
                ax.plot(*before, marker="x", color=colour, ms=7, label=None if marked else "copied from (exploit)")
                marked = True
        xs = [points[(g, m)] for g, _ in mine if math.isfinite(points[(g, m)][1])]
        if xs:
            ax.scatter(*zip(*xs, strict=True), color=colour, s=12, label=f"member {m}")
    ax.set(xlabel="env steps", ylabel="evaluation return (end of period)", title=title)
    ax.grid(alpha=0.3)
    if members:
        ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    path = pop_dir / PLOT_NAME
    with contextlib.suppress(OSError):
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
