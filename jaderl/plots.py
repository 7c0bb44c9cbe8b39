"""Figures of a run: the learning curve that the evaluator redraws (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def plot_learning_curve(rows: Sequence[dict[str, float]], path: Path, title: str) -> None:
    """Draw the evaluations' mean return +- std against env steps into ``path`` (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = [r["step"] for r in rows]
    mean = np.array([r["eval_return_mean"] for r in rows])
    std = np.array([r["eval_return_std"] for r in rows])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, mean, label="evaluation return (mean)")
    ax.fill_between(steps, mean - std, mean + std, alpha=0.25, label="+- std")
    ax.set(xlabel="env steps", ylabel="episode return", title=title)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
