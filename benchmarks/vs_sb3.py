"""jaderl vs Stable-Baselines3: wall time and env steps to reach a target return, side by side on one machine.

Usage (from the repository root)::

    .venv/bin/python benchmarks/vs_sb3.py                    # all tasks, 3 seeds each; writes benchmarks/RESULTS.md
    .venv/bin/python benchmarks/vs_sb3.py --tasks pendulum --seeds 5
    .venv/bin/python benchmarks/vs_sb3.py --tasks pendulum-td3,cartpole-dqn   # updates only these subsections
    .venv/bin/python benchmarks/vs_sb3.py --quick            # smoke check: 1 seed, small budgets, writes no file

Tasks (``--tasks``, comma-separated; all by default)
    cartpole      CartPole-v1 to 475. jaderl: PPO on its torch-native ``jaderl/CartPole-v1``. SB3: PPO with
                  RL-Zoo's CartPole-v1 hyperparameters on Gymnasium's CartPole-v1 (8-env DummyVecEnv).
    pendulum      Pendulum-v1 to -200. jaderl: PPO on ``jaderl/Pendulum-v1`` (the zoo's fastest algorithm for
                  this task: SAC needs ~3k gradient steps, which cost more than PPO's ~30k batched samples). SB3: SAC
                  with RL-Zoo's Pendulum-v1 hyperparameters on Gymnasium's Pendulum-v1.
    pendulum-td3  Pendulum-v1 to -200, the same algorithm on both sides. jaderl: TD3 on ``jaderl/Pendulum-v1``.
                  SB3: TD3 with RL-Zoo's Pendulum-v1 hyperparameters on Gymnasium's Pendulum-v1.
    cartpole-dqn  CartPole-v1 to 475, the same algorithm on both sides. jaderl: DQN on ``jaderl/CartPole-v1``.
                  SB3: DQN with RL-Zoo's CartPole-v1 hyperparameters on Gymnasium's CartPole-v1.
    jaderl runs as a new user would: the algorithm and env id, the target and the benchmark's budget, evaluation
    cadence and seed, and nothing else, so its settings are the zoo's (``jaderl/zoo/``, printed in the report);
    :data:`JADERL_SETTINGS` below can add settings to try against the zoo's (empty by default). The first two tasks
    have a target for the wall-time ratio jaderl / SB3; the same-algorithm tasks only report theirs.

Writing the report
    A run replaces the ``### <task>`` subsections of the tasks it ran inside the ``## vs_sb3`` section of the
    output file and keeps the other tasks' subsections there (marked as kept from an earlier run, with its date,
    command and machine), so ``--tasks`` can refresh some tasks without dropping the rest.

How it is measured
    * Each run (one library, one task, one seed) is a fresh subprocess of this script (``--worker``), so threads and
      imports do not leak between runs. Runs go one at a time, alternating which library goes first per seed.
    * jaderl runs with ``torch.set_num_threads(1)`` (its default); SB3 with torch's default thread count unless
      ``--sb3-threads`` says otherwise. Both run on the CPU.
    * The same evaluation for both: every ``eval_every`` env steps (all sub-envs counted) the deterministic policy
      plays 10 episodes on a separate env, seeded ``seed + 1 + 10 k`` at evaluation k (sub-env i: that + i); a run
      stops as soon as the mean return reaches the target. jaderl does this itself (10 parallel sub-envs of its
      torch env); for SB3 a callback runs ``evaluate_policy`` on a 10-env DummyVecEnv of Gymnasium envs (one
      episode per sub-env), which was about 5x faster than a 1-env loop on the development machine. Both libraries
      also evaluate once more when a run stops on its budget (jaderl's loop always does).
    * ``wall time`` is the training time to the end of the evaluation that reached the target, evaluations
      included: for jaderl from the start of its training loop (after env, agent and evaluator are built; the same
      clock as ``TrainResult.time_s``), for SB3 from the call
      of ``model.learn`` (after env and model are built). ``incl. setup`` also counts building the envs and the
      model/agent (not the imports).
    * A run that does not reach the target within its step budget or time cap is marked unsolved and counts with
      the steps and time it used (its budget); medians therefore treat unsolved runs as "at least this much".
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

# Extra jaderl settings per task (config fields passed to jaderl.api.train on top of the zoo's entry), for trying a
# change against the zoo; leave the evaluation schedule and budgets (FIXED_FIELDS) to the task table below so both
# libraries share them.
JADERL_SETTINGS: dict[str, dict[str, Any]] = {
    # empty: jaderl runs as a new user's `jaderl train ALGO ENV --target-return X` does, on the zoo's tuned settings
    # for the pair (jaderl/zoo/); put settings here only to try them against the zoo's
    "cartpole": {},
    "pendulum": {},
    "pendulum-td3": {},
    "cartpole-dqn": {},
}

EVAL_EPISODES = 10
FIXED_FIELDS = ("total_steps", "target_return", "time_limit", "eval_every", "eval_episodes", "seed", "run_dir")
RESULTS_PATH = Path(__file__).resolve().parent / "RESULTS.md"
SECTION = "## vs_sb3"

# RL-Zoo's hyperparameters for PPO on CartPole-v1 (rl-baselines3-zoo, hyperparams/ppo.yml); the ``lin_`` values
# are linear schedules that reach 0 at ``n_timesteps``.
ZOO_CARTPOLE_PPO: dict[str, Any] = {
    "n_envs": 8, "policy": "MlpPolicy", "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
    "n_epochs": 20, "ent_coef": 0.0, "learning_rate": "lin_1e-3", "clip_range": "lin_0.2", "n_timesteps": 100_000,
}

# RL-Zoo's hyperparameters for SAC on Pendulum-v1 (rl-baselines3-zoo, hyperparams/sac.yml): SB3's defaults otherwise
ZOO_PENDULUM_SAC: dict[str, Any] = {"policy": "MlpPolicy", "learning_rate": 1e-3, "n_timesteps": 20_000}

# RL-Zoo's hyperparameters for TD3 on Pendulum-v1 (rl-baselines3-zoo, hyperparams/td3.yml); noise_type=normal is
# NormalActionNoise(0, noise_std) on the [-1, 1]-scaled action. The zoo's Pendulum-v0 entry had
# train_freq=[1, "episode"], gradient_steps=-1 instead: the same one gradient step per env step, batched per episode.
ZOO_PENDULUM_TD3: dict[str, Any] = {
    "policy": "MlpPolicy", "gamma": 0.98, "buffer_size": 200_000, "learning_starts": 10_000, "noise_type": "normal",
    "noise_std": 0.1, "train_freq": 1, "gradient_steps": 1, "learning_rate": 1e-3, "net_arch": [400, 300],
    "n_timesteps": 20_000,
}

# RL-Zoo's hyperparameters for DQN on CartPole-v1 (rl-baselines3-zoo, hyperparams/dqn.yml). SB3 decays epsilon over
# exploration_fraction of *its* total_timesteps (our step budget); make_sb3_model rescales the fraction so that
# epsilon decays over the zoo's 0.16 x n_timesteps = 8,000 env steps, as in the zoo.
ZOO_CARTPOLE_DQN: dict[str, Any] = {
    "policy": "MlpPolicy", "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1_000,
    "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
    "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "net_arch": [256, 256], "n_timesteps": 50_000,
}


def zoo_text(zoo: dict[str, Any]) -> str:
    """An RL-Zoo hyperparameter dict as the settings column shows it."""
    return "RL-Zoo: " + ", ".join(f"{k}={v}" for k, v in zoo.items())


@dataclasses.dataclass(frozen=True)
class Task:
    """One benchmark task: what each library runs, the shared evaluation schedule and the budgets."""

    key: str
    title: str
    target: float
    target_ratio: float | None  # pass when median wall time jaderl / SB3 <= this; None: the ratio is only reported
    target_ratio_text: str
    eval_every: int
    steps: int  # step budget per run
    time_cap: float  # seconds of training per run
    quick_steps: int
    quick_time_cap: float
    jaderl_algo: str
    jaderl_env: str
    jaderl_fields: tuple[str, ...]  # effective config fields shown in the settings table
    sb3_algo: str
    sb3_env: str
    sb3_settings: str

    @property
    def heading(self) -> str:
        """The ``### `` heading of this task's subsection in the report (how a rewrite finds it again)."""
        return f"### {self.title} to {self.target:g}"


TASKS: dict[str, Task] = {
    "cartpole": Task(
        key="cartpole", title="CartPole-v1", target=475.0, target_ratio=1 / 3, target_ratio_text="1/3",
        eval_every=10_000, steps=200_000, time_cap=600.0, quick_steps=60_000, quick_time_cap=120.0,
        jaderl_algo="ppo", jaderl_env="jaderl/CartPole-v1",
        jaderl_fields=("num_envs", "horizon", "lr", "hidden", "num_epochs", "minibatch_size", "gamma", "gae_lambda"),
        sb3_algo="PPO", sb3_env="CartPole-v1",
        sb3_settings=zoo_text(ZOO_CARTPOLE_PPO) + " (the schedules reach 0 at n_timesteps, then stay 0)",
    ),
    "pendulum": Task(
        key="pendulum", title="Pendulum-v1", target=-200.0, target_ratio=1 / 5, target_ratio_text="1/5",
        eval_every=1_000, steps=300_000, time_cap=900.0, quick_steps=50_000, quick_time_cap=120.0,
        jaderl_algo="ppo", jaderl_env="jaderl/Pendulum-v1",
        jaderl_fields=("num_envs", "horizon", "lr", "hidden", "num_epochs", "minibatch_size", "gamma", "gae_lambda",
                       "reward_scale"),
        sb3_algo="SAC", sb3_env="Pendulum-v1",
        sb3_settings=zoo_text(ZOO_PENDULUM_SAC) + " (SB3's SAC defaults otherwise: MlpPolicy [256, 256], "
        "batch_size=256, learning_starts=100, buffer_size=1e6, train_freq=1, gradient_steps=1, ent_coef=auto)",
    ),
    "pendulum-td3": Task(
        key="pendulum-td3", title="Pendulum-v1 (TD3)", target=-200.0, target_ratio=None, target_ratio_text="",
        eval_every=1_000, steps=50_000, time_cap=900.0, quick_steps=20_000, quick_time_cap=120.0,
        jaderl_algo="td3", jaderl_env="jaderl/Pendulum-v1",
        jaderl_fields=("hidden", "lr", "gamma", "batch_size", "buffer_size", "warmup_steps", "updates_per_step",
                       "exploration_noise", "policy_delay", "target_noise", "tau"),
        sb3_algo="TD3", sb3_env="Pendulum-v1",
        sb3_settings=zoo_text(ZOO_PENDULUM_TD3) + " (NormalActionNoise(0, 0.1); SB3's TD3 defaults otherwise: "
        "batch_size=256, tau=0.005, policy_delay=2, target_policy_noise=0.2)",
    ),
    "cartpole-dqn": Task(
        key="cartpole-dqn", title="CartPole-v1 (DQN)", target=475.0, target_ratio=None, target_ratio_text="",
        eval_every=2_000, steps=100_000, time_cap=600.0, quick_steps=50_000, quick_time_cap=120.0,
        jaderl_algo="dqn", jaderl_env="jaderl/CartPole-v1",
        jaderl_fields=("hidden", "lr", "gamma", "batch_size", "buffer_size", "warmup_steps", "updates_per_step",
                       "target_update_every", "tau", "epsilon_decay_steps", "epsilon_end", "n_step", "use_per"),
        sb3_algo="DQN", sb3_env="CartPole-v1",
        sb3_settings=zoo_text(ZOO_CARTPOLE_DQN) + " (exploration_fraction rescaled to the step budget so that "
        "epsilon decays over 8,000 env steps, as in the zoo)",
    ),
}
LIBRARIES = ("jaderl", "sb3")
LIBRARY_NAMES = {"jaderl": "jaderl", "sb3": "SB3"}


# --- one run ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class RunSpec:
    """What a worker subprocess runs."""

    library: str
    task: str
    seed: int
    steps: int
    time_cap: float
    sb3_threads: int | None
    result_path: str


@dataclasses.dataclass
class RunResult:
    """What a worker reports: ``steps``, ``time_s`` and ``setup_time_s`` up to the target, or at the budget."""

    library: str
    task: str
    seed: int
    solved: bool
    steps: int
    time_s: float
    setup_time_s: float
    best_eval_return: float
    evaluations: int
    stop_reason: str
    threads: int
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str = ""


@dataclasses.dataclass
class Evaluation:
    """One evaluation: env steps, seconds since the training loop started, absolute clock at its end, mean return."""

    step: int
    elapsed: float
    clock: float
    mean_return: float


def summarize(spec: RunSpec, target: float, evals: list[Evaluation], stop_clock: float, stop_elapsed: float,
              stop_steps: int, setup_clock: float, stop_reason: str, threads: int,
              info: dict[str, Any]) -> RunResult:
    """The run's result: at the first evaluation that reached ``target``, else at the stop."""
    hit = next((e for e in evals if e.mean_return >= target), None)
    if hit is not None:
        steps, elapsed, clock, reason = hit.step, hit.elapsed, hit.clock, "solved"
    else:  # counted at its step budget, whether it stopped there, a little past it or at the time cap
        steps, elapsed, clock, reason = spec.steps, stop_elapsed, stop_clock, stop_reason
    best = max((e.mean_return for e in evals), default=float("-inf"))
    info = {**info, "steps_run": stop_steps}
    return RunResult(library=spec.library, task=spec.task, seed=spec.seed, solved=hit is not None, steps=steps,
                     time_s=round(elapsed, 3), setup_time_s=round(clock - setup_clock, 3), best_eval_return=best,
                     evaluations=len(evals), stop_reason=reason, threads=threads, info=info)


def run_jaderl(spec: RunSpec) -> RunResult:
    """Train jaderl in this process; evaluation times are read by wrapping ``Evaluator.evaluate``."""
    import torch

    torch.set_num_threads(1)
    import jaderl.api
    from jaderl.core.evaluator import Evaluator

    task = TASKS[spec.task]
    evals: list[Evaluation] = []
    original = Evaluator.evaluate

    def timed_evaluate(self: Evaluator, agent: Any, step: int, time_s: float, stats: dict[str, float]) -> Any:
        # the loop passes its clock (seconds since it started) as time_s, read just before this call
        loop_start = time.perf_counter() - time_s
        row = original(self, agent, step, time_s, stats)
        now = time.perf_counter()
        evals.append(Evaluation(step, now - loop_start, now, row["eval_return_mean"]))
        return row

    Evaluator.evaluate = timed_evaluate  # type: ignore[method-assign]
    settings = {"device": "cpu", **JADERL_SETTINGS[spec.task], "total_steps": spec.steps,
                "target_return": task.target, "time_limit": spec.time_cap, "eval_every": task.eval_every,
                "eval_episodes": EVAL_EPISODES, "seed": spec.seed}
    config = jaderl.api.make_config(task.jaderl_algo, task.jaderl_env, **settings).to_dict()
    with tempfile.TemporaryDirectory(prefix="vs_sb3-jaderl-") as tmp:
        setup_clock = time.perf_counter()
        result = jaderl.api.train(task.jaderl_algo, task.jaderl_env, run_dir=str(Path(tmp) / "run"), **settings)
        stop_clock = time.perf_counter()
    stop_elapsed = max([result.time_s, *(e.elapsed for e in evals)])
    info = {"config": {k: config[k] for k in task.jaderl_fields}, "time_s": result.time_s,
            "jaderl": importlib.metadata.version("jaderl")}
    return summarize(spec, task.target, evals, stop_clock, stop_elapsed, result.steps, setup_clock,
                     result.stop_reason, torch.get_num_threads(), info)


def zoo_linear(initial: float, zoo_timesteps: int, budget: int) -> Callable[[float], float]:
    """RL-Zoo's ``lin_X`` schedule, X * (1 - t / n_timesteps) clipped at 0, for a ``learn`` call of ``budget`` steps.

    SB3 passes schedules the remaining fraction of *its* ``total_timesteps`` (our step budget); this converts it back
    to env steps so the schedule decays over RL-Zoo's ``n_timesteps`` as in the zoo.
    """

    def schedule(progress_remaining: float) -> float:
        t = (1.0 - progress_remaining) * budget
        return initial * max(0.0, 1.0 - t / zoo_timesteps)

    return schedule


def make_sb3_model(task: Task, spec: RunSpec) -> BaseAlgorithm:
    """The SB3 model of ``task`` with its training env, seeded with ``spec.seed``, on the CPU."""
    import numpy as np
    from stable_baselines3 import DQN, PPO, SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    common: dict[str, Any] = {"seed": spec.seed, "device": "cpu"}
    if task.key == "cartpole":
        zoo = ZOO_CARTPOLE_PPO
        env = make_vec_env(task.sb3_env, n_envs=zoo["n_envs"], seed=spec.seed)
        return PPO(zoo["policy"], env, n_steps=zoo["n_steps"], batch_size=zoo["batch_size"],
                   gae_lambda=zoo["gae_lambda"], gamma=zoo["gamma"], n_epochs=zoo["n_epochs"],
                   ent_coef=zoo["ent_coef"], learning_rate=zoo_linear(1e-3, zoo["n_timesteps"], spec.steps),
                   clip_range=zoo_linear(0.2, zoo["n_timesteps"], spec.steps), **common)
    env = make_vec_env(task.sb3_env, n_envs=1, seed=spec.seed)
    if task.key == "pendulum":
        return SAC(ZOO_PENDULUM_SAC["policy"], env, learning_rate=ZOO_PENDULUM_SAC["learning_rate"], **common)
    if task.key == "pendulum-td3":
        zoo = ZOO_PENDULUM_TD3
        shape = env.action_space.shape or (1,)
        noise = NormalActionNoise(mean=np.zeros(shape), sigma=np.full(shape, zoo["noise_std"]))
        return TD3(zoo["policy"], env, gamma=zoo["gamma"], buffer_size=zoo["buffer_size"],
                   learning_starts=zoo["learning_starts"], action_noise=noise, train_freq=zoo["train_freq"],
                   gradient_steps=zoo["gradient_steps"], learning_rate=zoo["learning_rate"],
                   policy_kwargs={"net_arch": zoo["net_arch"]}, **common)
    if task.key == "cartpole-dqn":
        zoo = ZOO_CARTPOLE_DQN
        # SB3 counts exploration_fraction of total_timesteps (our budget): rescale it to the zoo's n_timesteps
        fraction = min(1.0, zoo["exploration_fraction"] * zoo["n_timesteps"] / spec.steps)
        return DQN(zoo["policy"], env, learning_rate=zoo["learning_rate"], batch_size=zoo["batch_size"],
                   buffer_size=zoo["buffer_size"], learning_starts=zoo["learning_starts"], gamma=zoo["gamma"],
                   target_update_interval=zoo["target_update_interval"], train_freq=zoo["train_freq"],
                   gradient_steps=zoo["gradient_steps"], exploration_fraction=fraction,
                   exploration_final_eps=zoo["exploration_final_eps"], policy_kwargs={"net_arch": zoo["net_arch"]},
                   **common)
    raise ValueError(f"no SB3 model for task {task.key!r}")


def run_sb3(spec: RunSpec) -> RunResult:
    """Train SB3 in this process with an evaluate-until-target callback."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecEnv

    if spec.sb3_threads is not None:
        torch.set_num_threads(spec.sb3_threads)
    task = TASKS[spec.task]
    evals: list[Evaluation] = []

    class EvalUntilTarget(BaseCallback):
        """Evaluate every ``eval_every`` env steps (and at the end), stop at the target or the time cap."""

        def __init__(self, eval_env: VecEnv) -> None:
            super().__init__()
            self.eval_env, self.next_eval, self.start, self.stop_reason = eval_env, task.eval_every, 0.0, "total_steps"

        def evaluate(self) -> float:
            # evaluation k seeds its sub-envs from seed + 1 + k * EVAL_EPISODES, as jaderl's evaluator does
            self.eval_env.seed(spec.seed + 1 + len(evals) * EVAL_EPISODES)
            mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
            now = time.perf_counter()
            evals.append(Evaluation(self.num_timesteps, now - self.start, now, float(mean)))
            return float(mean)

        def _on_step(self) -> bool:
            if time.perf_counter() - self.start >= spec.time_cap:
                self.stop_reason = "time_limit"
                return False
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval = (self.num_timesteps // task.eval_every + 1) * task.eval_every
            if self.evaluate() >= task.target:
                self.stop_reason = "solved"
                return False
            return True

        def _on_training_end(self) -> None:
            if self.stop_reason != "solved" and (not evals or evals[-1].step != self.num_timesteps):
                self.evaluate()

    setup_clock = time.perf_counter()
    eval_env = make_vec_env(task.sb3_env, n_envs=EVAL_EPISODES, seed=spec.seed + 1)
    model = make_sb3_model(task, spec)
    model.set_logger(Logger(None, []))  # no output (SB3's default logger also leaves an empty folder in /tmp)
    callback = EvalUntilTarget(eval_env)
    callback.start = time.perf_counter()
    model.learn(total_timesteps=spec.steps, callback=callback)
    stop_clock = time.perf_counter()
    info = {"sb3": importlib.metadata.version("stable-baselines3")}
    return summarize(spec, task.target, evals, stop_clock, stop_clock - callback.start, model.num_timesteps,
                     setup_clock, callback.stop_reason, torch.get_num_threads(), info)


def worker_main(spec_json: str) -> None:
    """``--worker`` mode: run one spec and write its RunResult as JSON to ``spec.result_path``."""
    spec = RunSpec(**json.loads(spec_json))
    result = run_jaderl(spec) if spec.library == "jaderl" else run_sb3(spec)
    Path(spec.result_path).write_text(json.dumps(dataclasses.asdict(result)))


def run_in_subprocess(spec: RunSpec) -> RunResult:
    """Run ``spec`` in a fresh interpreter; a crash or hang becomes an unsolved result at its budget."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(dataclasses.asdict(spec))]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=spec.time_cap + 300)
        error = "" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"
    except subprocess.TimeoutExpired:
        error = f"killed after {spec.time_cap + 300:.0f} s"
    if not error:
        return RunResult(**json.loads(Path(spec.result_path).read_text()))
    return RunResult(library=spec.library, task=spec.task, seed=spec.seed, solved=False, steps=spec.steps,
                     time_s=spec.time_cap, setup_time_s=spec.time_cap, best_eval_return=float("nan"), evaluations=0,
                     stop_reason="error", threads=0, error=error)


# --- the benchmark ---------------------------------------------------------------------------------------------------

def run_benchmark(tasks: list[Task], seeds: int, quick: bool, sb3_threads: int | None,
                  first_seed: int = 0) -> dict[str, list[RunResult]]:
    """Every (task, seed, library) run, one at a time, for seeds ``first_seed`` to ``first_seed + seeds - 1``; the
    library that goes first alternates per seed."""
    results: dict[str, list[RunResult]] = {t.key: [] for t in tasks}
    total, done = len(tasks) * seeds * len(LIBRARIES), 0
    with tempfile.TemporaryDirectory(prefix="vs_sb3-") as tmp:
        for task in tasks:
            for seed in range(first_seed, first_seed + seeds):
                order = LIBRARIES if (seed - first_seed) % 2 == 0 else LIBRARIES[::-1]
                for library in order:
                    done += 1
                    spec = RunSpec(library=library, task=task.key, seed=seed,
                                   steps=task.quick_steps if quick else task.steps,
                                   time_cap=task.quick_time_cap if quick else task.time_cap,
                                   sb3_threads=sb3_threads, result_path=str(Path(tmp) / f"{done}.json"))
                    print(f"[{done}/{total}] {task.title} seed {seed} {LIBRARY_NAMES[library]} ...", end=" ",
                          flush=True)
                    result = run_in_subprocess(spec)
                    results[task.key].append(result)
                    outcome = "solved" if result.solved else f"UNSOLVED ({result.stop_reason})"
                    print(f"{outcome} at {result.steps:,} steps, {result.time_s:.1f} s "
                          f"(best eval {result.best_eval_return:.1f})", flush=True)
                    if result.error:
                        print(f"    error: {result.error}", file=sys.stderr)
    return results


# --- the report ------------------------------------------------------------------------------------------------------

def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def _settings_source(task: Task) -> str:
    """Where jaderl's settings come from: the zoo's entry (what a new user gets), plus any JADERL_SETTINGS."""
    import jaderl.api

    entry = jaderl.api.zoo_for(task.jaderl_algo, task.jaderl_env, {})
    source = f"the zoo's ({entry.source})" if entry else "the algorithm's defaults (no zoo entry)"
    given = JADERL_SETTINGS[task.key]
    return source + (f" and JADERL_SETTINGS = `{json.dumps(given)}`" if given else ", nothing else given")


def task_report(task: Task, runs: list[RunResult], quick: bool) -> str:
    """The markdown subsection of one task: settings, per-seed rows, medians and the ratio (against its target)."""
    budget = task.quick_steps if quick else task.steps
    cap = task.quick_time_cap if quick else task.time_cap
    by_lib = {lib: [r for r in runs if r.library == lib] for lib in LIBRARIES}
    jaderl_info = next((r.info for r in by_lib["jaderl"] if r.info), {})
    threads = {lib: sorted({r.threads for r in by_lib[lib] if r.threads}) for lib in LIBRARIES}
    effective = ", ".join(f"{k}={v}" for k, v in jaderl_info.get("config", {}).items())
    setup = table(["library", "algorithm", "env backend", "torch threads", "settings"], [
        [f"jaderl {jaderl_info.get('jaderl', '')}".strip(), task.jaderl_algo.upper(),
         f"`{task.jaderl_env}` (torch-native, CPU)", _join(threads["jaderl"]),
         f"{_settings_source(task)}; effective: {effective}"],
        [f"SB3 {importlib.metadata.version('stable-baselines3')}", task.sb3_algo,
         f"Gymnasium `{task.sb3_env}` (DummyVecEnv, CPU)", _join(threads["sb3"]), task.sb3_settings],
    ])
    rows = []
    for r in runs:
        solved = "yes" if r.solved else ("ERROR" if r.error else f"no ({r.stop_reason})")
        steps_run = r.info.get("steps_run", r.steps)
        counted = f"{r.steps:,}" if r.solved or steps_run == r.steps else f"{r.steps:,} (ran {steps_run:,})"
        rows.append([str(r.seed), LIBRARY_NAMES[r.library], solved, counted, f"{r.time_s:.1f}",
                     f"{r.setup_time_s:.1f}", f"{r.best_eval_return:.1f}", str(r.evaluations)])
    per_seed = table(["seed", "library", "solved", "env steps", "wall time (s)", "incl. setup (s)",
                      "best eval return", "evals"], rows)
    medians = {lib: (statistics.median(r.time_s for r in rs), statistics.median(r.steps for r in rs))
               for lib, rs in by_lib.items() if rs}
    summary_rows = [[LIBRARY_NAMES[lib], f"{sum(r.solved for r in by_lib[lib])}/{len(by_lib[lib])}",
                     f"{t:.1f}", f"{s:,.0f}"] for lib, (t, s) in medians.items()]
    summary = table(["library", "solved", "median wall time (s)", "median env steps"], summary_rows)
    if len(medians) == 2 and medians["sb3"][0] > 0:
        ratio = medians["jaderl"][0] / medians["sb3"][0]
        if task.target_ratio is None:
            verdict = "(target: none (reported))"
        else:
            passed = "PASS" if ratio <= task.target_ratio else "FAIL"
            verdict = f"(target <= {task.target_ratio_text} = {task.target_ratio:.3f}): {passed}"
        steps_ratio = medians["jaderl"][1] / medians["sb3"][1]
        unsolved = sum(not r.solved for r in runs)
        caveat = f" ({unsolved} unsolved run(s) counted at their budget)" if unsolved else ""
        verdict_line = (f"**jaderl / SB3 median wall time: {ratio:.3f} {verdict}**{caveat}. "
                        f"Env steps ratio: {steps_ratio:.2f}.")
    else:
        verdict_line = "**jaderl / SB3 ratio: n/a** (a library has no runs)."
    return "\n\n".join([
        task.heading,
        f"Evaluation: {EVAL_EPISODES} deterministic episodes every {task.eval_every:,} env steps (both libraries). "
        f"Budget per run: {budget:,} env steps or {cap:.0f} s of training.",
        setup, per_seed, summary, verdict_line,
    ])


def _join(values: list[int]) -> str:
    return ", ".join(map(str, values)) or "?"


def load_average() -> str:
    """The 1/5/15-minute load averages: how busy the machine was (before the benchmark adds its own load of ~1)."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def machine_info(load_before: str) -> str:
    """CPU model, core count, load and library versions, for the report header."""
    cpu = platform.processor() or "unknown CPU"
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}"
                         for name in ("torch", "jaderl", "stable-baselines3", "gymnasium"))
    return (f"{cpu}, {cores} cores (load average 1/5/15 min before the runs: {load_before}); "
            f"Python {platform.python_version()}, {versions}")


def command_line() -> str:
    """The command that produced this report, with paths relative to the working directory where inside it."""

    def relative(path: Path) -> str:
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    return shlex.join([relative(Path(sys.executable)), relative(Path(sys.argv[0]).resolve()), *sys.argv[1:]])


def report(tasks: list[Task], results: dict[str, list[RunResult]], quick: bool, load_before: str) -> str:
    """The whole ``## vs_sb3`` section."""
    header = [
        SECTION,
        f"Command: `{command_line()}`  \nDate: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  \n"
        f"Machine: {machine_info(load_before)}",
        "Wall time: training time to the end of the evaluation that reached the target, evaluations included "
        "(jaderl: from the start of its training loop; SB3: from `model.learn`); *incl. setup* adds building envs "
        "and model. Unsolved runs count with the steps and time they used. Each run is a fresh subprocess; runs "
        "are sequential, alternating libraries per seed. SB3 evaluates with `evaluate_policy` on a 10-env "
        "DummyVecEnv (one episode per sub-env), seeded with seed + 1 + 10 k at evaluation k, as jaderl seeds "
        "its evaluations.",
    ]
    if quick:
        header.append("**--quick smoke check: 1 seed and small budgets; not a benchmark result.**")
    return "\n\n".join([*header, *(task_report(t, results[t.key], quick) for t in tasks)]) + "\n"


KEPT_NOTE = "*Kept from an earlier run"


def split_subsections(section: str) -> tuple[str, dict[str, str]]:
    """Split a ``## vs_sb3`` section into its header (the text before the first ``### `` heading) and subsections.

    Subsections are keyed by their heading line and run to the next ``### `` heading or the end of the section;
    headings inside fenced code blocks do not count. Should a heading occur twice, both blocks stay, joined.
    """
    header: list[str] = []
    blocks: dict[str, list[str]] = {}
    current, fenced = header, False
    for line in section.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("### "):
            current = blocks.setdefault(line.strip(), [])
        current.append(line)
    return "".join(header), {heading: "".join(block) for heading, block in blocks.items()}


def header_field(header: str, name: str) -> str:
    """The value of a ``<name>: <value>`` line of a section header (without its Markdown line break), or unknown."""
    match = re.search(rf"^{name}: (.*?)\s*$", header, re.MULTILINE)
    return match.group(1) if match else "unknown"


def mark_kept(block: str, old_header: str) -> str:
    """``block`` with a note under its heading naming the run it comes from, from ``old_header`` (the section header
    it was written under); a block kept before already has its note, which stays as it is."""
    if KEPT_NOTE in block:
        return block
    heading, _, body = block.partition("\n")
    note = (f"{KEPT_NOTE}: {header_field(old_header, 'Date')}, command {header_field(old_header, 'Command')}; "
            f"machine: {header_field(old_header, 'Machine')}.*")
    return f"{heading}\n\n{note}\n{body}"


def merge_section(old: str, new: str) -> str:
    """The ``new`` section plus the subsections of the ``old`` one that ``new`` lacks (tasks this run skipped).

    Subsections are matched by heading (:attr:`Task.heading`) and ordered as :data:`TASKS`; a kept one gets a note
    naming the run it comes from, and the new header lists the kept ones. Subsections with a heading that no task
    has (a renamed or retired task) are kept too, after the others: dropping results is an edit to make on purpose.
    """
    new_header, new_blocks = split_subsections(new)
    old_header, old_blocks = split_subsections(old)
    kept = {heading: mark_kept(block, old_header) for heading, block in old_blocks.items()
            if heading not in new_blocks}
    if not kept:
        return new
    order = [task.heading for task in TASKS.values()]
    blocks = {**new_blocks, **kept}
    headings = sorted(blocks, key=lambda h: order.index(h) if h in order else len(order))  # stable: rest in place
    note = ("Not run by this command, kept from the report it replaced: "
            + ", ".join(h.removeprefix("### ") for h in headings if h in kept) + " (each names the run it is from).")
    return "\n\n".join([new_header.strip(), note, *(blocks[h].strip() for h in headings)]) + "\n"


def write_section(path: Path, section: str) -> None:
    """Put ``section`` (starting with ``## vs_sb3``) into ``path``, replacing only an existing ``## vs_sb3`` section
    and keeping the subsections of its tasks that ``section`` lacks (:func:`merge_section`)."""
    if not path.exists():
        path.write_text("# Benchmark results\n\n" + section)
        return
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is None:
        text = "".join(lines)
        path.write_text(text + ("\n" if text.endswith("\n") else "\n\n") + section)
        return
    end, fenced = len(lines), False
    for i in range(start + 1, len(lines)):
        if lines[i].lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,2} ", lines[i]):
            end = i
            break
    section = merge_section("".join(lines[start:end]), section)
    tail = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + section + ("\n" + tail if tail else ""))


# --- command line ----------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="jaderl vs Stable-Baselines3: wall time and env steps to a target.")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help=f"comma-separated, from: {', '.join(TASKS)} (default: all)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per library and task (default 3)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the first seed (default 0); e.g. 100 for seeds that no zoo entry was chosen on")
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: 1 seed, small budgets; writes no file unless --out names one "
                             "(never the default RESULTS.md)")
    parser.add_argument("--out", type=Path, default=None, help=f"markdown file to update (default {RESULTS_PATH})")
    parser.add_argument("--sb3-threads", type=int, default=None,
                        help="torch threads for SB3 runs (default: torch's default, i.e. SB3's own behaviour)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in args.task_list if t not in TASKS]
    if unknown or not args.task_list:
        parser.error(f"--tasks: unknown task {unknown[0] if unknown else '(none)'!r}; choose from {', '.join(TASKS)}")
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.sb3_threads is not None and args.sb3_threads < 1:
        parser.error("--sb3-threads must be >= 1")
    if args.quick:
        args.seeds = 1
        if args.out is not None and args.out.resolve() == RESULTS_PATH:
            parser.error(f"--quick results are a smoke check and must not go into {RESULTS_PATH}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return
    for key, settings in JADERL_SETTINGS.items():
        clash = sorted(set(settings) & set(FIXED_FIELDS))
        if clash:
            raise SystemExit(f"JADERL_SETTINGS[{key!r}] sets {clash}: the benchmark fixes those for both libraries")
    tasks = [TASKS[key] for key in args.task_list]
    load_before = load_average()
    results = run_benchmark(tasks, args.seeds, args.quick, args.sb3_threads, args.first_seed)
    section = report(tasks, results, args.quick, load_before)
    print("\n" + section)
    out = args.out if args.quick else (args.out or RESULTS_PATH)
    if out is not None:
        write_section(out, section)
        print(f"wrote the {SECTION} section of {out}")


if __name__ == "__main__":
    main()
