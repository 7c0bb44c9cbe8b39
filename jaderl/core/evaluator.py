"""Deterministic evaluation on a separate env; keeps the best policy and writes metrics.csv, TensorBoard, a curve."""

from __future__ import annotations

import contextlib
import csv
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open

from jaderl.core.checkpoint import save_tensors
from jaderl.envs.vec import VecEnv

if TYPE_CHECKING:
    from jaderl.core.agent import Agent

METRICS_COLUMNS = ["step", "time_s", "eval_return_mean", "eval_return_std", "eval_episode_length",
                   "train_episode_return"]
BEST_POLICY = "best_policy.safetensors"


@torch.no_grad()
def run_episodes(agent: Agent, env: VecEnv, seed: int, max_steps: int = 100_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one deterministic episode in every sub-env of ``env``; returns (returns, lengths) of shape (N,)."""
    obs = env.reset(seed=seed)
    returns, lengths = torch.zeros(2, env.num_envs, device=obs.device)  # two views of one allocation
    running = torch.ones(env.num_envs, dtype=torch.bool, device=obs.device)
    limit = env.max_steps or max_steps
    for t in range(limit):
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs, deterministic=True))
        returns += reward * running
        lengths += running
        running &= ~(terminated | truncated)
        if t % 32 == 31 and not running.any():  # an occasional host sync to stop early
            break
    return returns, lengths


class Evaluator:
    """Evaluates ``agent`` on ``env`` (one episode per sub-env) and records every result in ``run_dir``."""

    def __init__(self, env: VecEnv, run_dir: Path, seed: int, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.env, self.run_dir, self.seed = env, run_dir, seed
        self.csv_path = run_dir / "metrics.csv"
        self.rows: list[dict[str, float]] = []
        if resume_step is not None and self.csv_path.exists():  # drop evaluations newer than the checkpoint
            with open(self.csv_path, newline="") as f:
                for r in csv.DictReader(f):
                    with contextlib.suppress(TypeError, ValueError, KeyError):  # a line cut short by a crash
                        row = {k: float(r[k]) for k in METRICS_COLUMNS} | {"step": int(float(r["step"]))}
                        if row["step"] <= resume_step:
                            self.rows.append(row)
        tmp = self.csv_path.with_name(self.csv_path.name + ".tmp")  # replaced at once: the history is never lost
        with open(tmp, "w", newline="") as f:
            (writer := csv.DictWriter(f, METRICS_COLUMNS)).writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.csv_path)
        self.best_return = max((r["eval_return_mean"] for r in self.rows), default=-math.inf)
        if resume_step is not None and (run_dir / BEST_POLICY).exists():  # it may come from after the checkpoint
            with (contextlib.suppress(OSError, ValueError, KeyError, TypeError, SafetensorError),
                  safe_open(str(run_dir / BEST_POLICY), framework="pt") as f):
                self.best_return = max(self.best_return, float((f.metadata() or {})["eval_return_mean"]))
        # after a resume, TensorBoard hides the points logged after the checkpoint, as metrics.csv drops them
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=None if resume_step is None else resume_step + 1)
        self.last_plot = time.perf_counter()  # short runs draw once, when they close

    def evaluate(self, agent: Agent, step: int, time_s: float, stats: dict[str, float]) -> dict[str, float]:
        """Evaluate, log ``stats`` and the result at ``step``, save the policy if it is the best so far."""
        # new start states per evaluation, reproducible and the same after a resume: evaluation k seeds with
        # seed + k * num_envs, as a Gymnasium vector env seeds sub-env i with seed + i (no start state is shared)
        returns, lengths = run_episodes(agent, self.env, self.seed + len(self.rows) * self.env.num_envs)
        row = {"step": step, "time_s": round(time_s, 3), "eval_return_mean": returns.mean().item(),
               "eval_return_std": returns.std(unbiased=False).item(), "eval_episode_length": lengths.mean().item(),
               "train_episode_return": stats.get("train/episode_return", math.nan)}
        self.rows.append(row)
        with open(self.csv_path, "a", newline="") as f:
            csv.DictWriter(f, METRICS_COLUMNS).writerow(row)
        for key, value in {**stats, "eval/return_mean": row["eval_return_mean"],
                           "eval/return_std": row["eval_return_std"]}.items():
            self.tb.add_scalar(key, value, step)
        self.tb.flush()
        if row["eval_return_mean"] > self.best_return:
            self.best_return = row["eval_return_mean"]
            save_tensors(self.run_dir / BEST_POLICY, agent.policy_state_dict(),  # what it scored, and when
                         {"step": str(step), "eval_return_mean": repr(self.best_return)})
        if time.perf_counter() - self.last_plot > 5.0:  # drawing costs more than an evaluation of a small net
            self.plot()
        return row

    def plot(self) -> None:
        """Redraw learning_curve.png: evaluation mean +- std against env steps."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = [r["step"] for r in self.rows]
        mean = torch.tensor([r["eval_return_mean"] for r in self.rows])
        std = torch.tensor([r["eval_return_std"] for r in self.rows])
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(steps, mean, label="evaluation return (mean)")
        ax.fill_between(steps, mean - std, mean + std, alpha=0.25, label="+- std")
        ax.set(xlabel="env steps", ylabel="episode return", title=self.run_dir.name)
        ax.legend(loc="lower right")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.run_dir / "learning_curve.png", dpi=100)
        plt.close(fig)
        self.last_plot = time.perf_counter()

    def close(self) -> None:
        if self.rows:
            self.plot()
        self.tb.close()
        self.env.close()
