"""Deterministic evaluation on a separate env; keeps the best policy and writes metrics.csv, TensorBoard, a curve."""

from __future__ import annotations

import contextlib
import csv
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open

from jaderl.core.checkpoint import save_tensors
from jaderl.envs.vec import VecEnv
from jaderl.plots import plot_learning_curve

if TYPE_CHECKING:
    from jaderl.core.agent import Agent

METRICS_COLUMNS = ["step", "time_s", "eval_return_mean", "eval_return_std", "eval_episode_length",
                   "train_episode_return"]
BEST_POLICY = "best_policy.safetensors"
PLOT_EVERY_S = 30.0
"""learning_curve.png is redrawn after an evaluation at most this often (and when the run closes): a drawing takes
0.3-1.5 s of a small CPU, more than an evaluation of a small network, and TensorBoard shows the curve live."""


@torch.no_grad()
def run_episodes(agent: Agent, env: VecEnv, seed: int, max_steps: int = 100_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one deterministic episode in every sub-env of ``env``; returns (returns, lengths) of shape (N,) (several
    agents: each agent's return, (N, agents); their sum is the team return)."""
    obs = env.reset(seed=seed)
    returns = torch.zeros(env.num_envs, *([env.num_agents] if env.num_agents > 1 else []), device=obs.device)
    lengths = torch.zeros(env.num_envs, device=obs.device)
    running = torch.ones(env.num_envs, dtype=torch.bool, device=obs.device)
    limit = env.max_steps or max_steps
    for t in range(limit):
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs, deterministic=True))
        returns += reward * running.view(-1, *[1] * (reward.dim() - 1))
        lengths += running
        running &= ~(terminated | truncated)
        if t % 32 == 31 and not running.any():  # an occasional host sync to stop early
            break
    return returns, lengths


class Evaluator:
    """Evaluates an agent on ``env`` (one episode per sub-env) and records every result in ``run_dir``.

    :meth:`request` starts an evaluation and :meth:`poll` returns its mean return; here the evaluation runs inside
    ``request``, while the pipeline's evaluator process answers later (``pending_step`` is the step of the one it is
    running). The rows of ``metrics.csv`` are the evaluator's state: loading them rewrites the file, dropping rows of
    evaluations newer than the state.
    """

    def __init__(self, env: VecEnv, run_dir: Path, seed: int) -> None:
        self.env, self.run_dir, self.seed = env, run_dir, seed
        self.csv_path = run_dir / "metrics.csv"
        self.teams = {team: [i for i, t in enumerate(env.teams) if t == team] for team in dict.fromkeys(env.teams)}
        multi = ["eval_return_per_agent", *(f"eval_return_{team}" for team in self.teams)] if env.num_agents > 1 else []
        self.columns = METRICS_COLUMNS + multi  # several agents: the team's return, and per agent and per team
        self.pending_step: int | None = None
        self.result: float | None = None
        self.tb: Any = None  # opened at the first evaluation, purging what a loaded state dropped
        self.rows: list[dict[str, float]] = []
        self.best_return, self.purge_step = -math.inf, None
        if not self.csv_path.exists():  # a resumed run's file stays as it is until its state is loaded
            self._write_csv()
        self.last_plot = time.perf_counter()  # short runs draw once, when they close

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # (a row without its result is refused here, before metrics.csv is rewritten)
        self.best_return = max((r["eval_return_mean"] for r in state["rows"]), default=-math.inf)
        self.rows = [dict(row) for row in state["rows"]]
        self._write_csv()
        if (self.run_dir / BEST_POLICY).exists():  # it may come from after the state was taken
            with (contextlib.suppress(OSError, ValueError, KeyError, TypeError, SafetensorError),
                  safe_open(str(self.run_dir / BEST_POLICY), framework="pt") as f):
                self.best_return = max(self.best_return, float((f.metadata() or {})["eval_return_mean"]))
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        self.purge_step = self.rows[-1]["step"] + 1 if self.rows else 0  # TensorBoard hides what came later

    def _write_csv(self) -> None:
        tmp = self.csv_path.with_name(self.csv_path.name + ".tmp")  # replaced at once: the history is never lost
        with open(tmp, "w", newline="") as f:
            (writer := csv.DictWriter(f, self.columns, extrasaction="ignore")).writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.csv_path)

    def request(self, agent: Agent, step: int, time_s: float, stats: dict[str, float]) -> None:
        """Evaluate ``agent`` (at ``step``, ``time_s`` of training) and log ``stats`` beside the result."""
        self.result = self.evaluate(agent, step, time_s, stats)["eval_return_mean"]

    def poll(self, wait: bool | float = False) -> float | None:
        """The mean return of the evaluation finished since the last call, if any (``wait``: for it to finish, or
        at most that many seconds; here evaluations finish inside ``request``)."""
        result, self.result = self.result, None
        return result

    def evaluate(self, agent: Agent, step: int, time_s: float, stats: dict[str, float]) -> dict[str, float]:
        """Evaluate, log ``stats`` and the result at ``step``, save the policy if it is the best so far."""
        from torch.utils.tensorboard import SummaryWriter

        # new start states per evaluation, reproducible and the same after a resume: evaluation k seeds with
        # seed + k * num_envs, as a Gymnasium vector env seeds sub-env i with seed + i (no start state is shared)
        returns, lengths = run_episodes(agent, self.env, self.seed + len(self.rows) * self.env.num_envs)
        team = returns.sum(-1) if returns.dim() > 1 else returns
        row = {"step": step, "time_s": round(time_s, 3), "eval_return_mean": team.mean().item(),
               "eval_return_std": team.std(unbiased=False).item(), "eval_episode_length": lengths.mean().item(),
               "train_episode_return": stats.get("train/episode_return", math.nan)}
        if returns.dim() > 1:
            row["eval_return_per_agent"] = returns.mean().item()
            row |= {f"eval_return_{team}": returns[:, idx].sum(-1).mean().item() for team, idx in self.teams.items()}
        if row["eval_return_mean"] > self.best_return:  # the file first: it may be ahead of the rows, never behind
            if len(self.teams) < 2:  # teams playing against each other: their summed return does not rank policies
                save_tensors(self.run_dir / BEST_POLICY, agent.policy_state_dict(),  # what it scored, and when
                             {"step": str(step), "eval_return_mean": repr(row["eval_return_mean"])})
            self.best_return = row["eval_return_mean"]
        self.rows.append(row)
        with open(self.csv_path, "a", newline="") as f:
            csv.DictWriter(f, self.columns, extrasaction="ignore").writerow(row)
        if self.tb is None:
            self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=self.purge_step)
        for key, value in {**stats, **{f"eval/{k.removeprefix('eval_')}": v for k, v in row.items()
                                       if k.startswith("eval_return")}}.items():
            self.tb.add_scalar(key, value, step)
        self.tb.flush()
        if time.perf_counter() - self.last_plot > PLOT_EVERY_S:
            self.plot()
        return row

    def plot(self) -> None:
        """Redraw learning_curve.png: evaluation mean +- std against env steps."""
        plot_learning_curve(self.rows, self.run_dir / "learning_curve.png", self.run_dir.name)
        self.last_plot = time.perf_counter()

    def close(self, plot: bool = True) -> None:
        if plot and self.rows:
            self.plot()
        if self.tb is not None:
            self.tb.close()
        self.env.close()
