"""Populations on Ray: PBT against random search, jaderl's PBT against Ray Tune's, throughput against members.

Usage (from the repository root)::

    .venv/bin/python benchmarks/population.py                  # all three parts, about 10-15 minutes on 2 cores
    .venv/bin/python benchmarks/population.py --write          # ... and record them in benchmarks/RESULTS.md
    .venv/bin/python benchmarks/population.py --parts search --seeds 0,1,2,3,4,5,6,7,8,9 --members 8
    .venv/bin/python benchmarks/population.py --quick          # a smoke check of every part: tiny budgets

The task is PPO on ``jaderl/Pendulum-v1`` with ``configs/ppo_pendulum.yaml``'s settings (``SETTINGS``: 64 sub-envs,
rollouts of 32 steps, gamma 0.9, reward scale 0.1, minibatches of 256; 64 x 64 networks, one torch thread per
member, CPU), where the learning rate decides everything: 1e-3 reaches -200 in about 30k env steps, 1e-5 learns
nothing in this budget and 1e-1 falls apart. The search space is ``lr=loguniform:1e-5:1e-1``. Every member
evaluates 10 deterministic episodes at the end of each period; its score is that evaluation's mean return.

Parts (``--parts``, comma-separated; all by default). Each starts one local Ray (``--cpus`` CPUs, default all of
this machine's) and shuts it down at its end.

search
    PBT against random search, per seed (``--seeds``): ``jaderl.population.pbt`` with ``--members`` members,
    ``--generations`` periods of ``--period`` env steps each, exploitation quantile ``--quantile``; random search is
    the same members (the same ``PBTSettings.member_settings``, seeds and initial hyperparameters, drawn exactly as
    ``pbt`` draws them) in the same Ray actors (``jaderl.population.member.Member``), trained the same periods and
    evaluated the same way, with no exploit and no explore (``pbt`` cannot turn exploitation off: its quantile is
    at least one member). Reported: random search's best final score (the best member's last evaluation) and the
    env steps of the whole population until PBT's best member first scored at least that much (from
    population.csv), as a share of random search's total env steps. Target: median over seeds <= 50 %.
tune
    jaderl's PBT against Ray Tune's ``PopulationBasedTraining`` scheduler driving ``JaderlTrainable``, on the same
    warm Ray, one after the other (jaderl first), ``--tune-repeats`` times (3; Tune's asynchronous PBT exploits
    when its trials' timing lets it, so its wall time varies from run to run): the same members (Tune gets
    jaderl's initial hyperparameters and member seeds through a grid over the member index), CPUs per member,
    period (one Tune iteration), budget (``--generations`` iterations), search space, quantile, resample probability
    (0.25) and perturbation factors (0.8, 1.2). Tune runs its default asynchronous PBT (``--tune-synch`` for its
    synchronous one) with ``reuse_actors=True`` and keeps every checkpoint. Reported: wall time of ``pbt(...)`` and
    of ``Tuner.fit()`` (the Ray start excluded), the env steps each side trained (jaderl: from population.csv, each
    member's steps in each period; Tune: the trainables' steps in every iteration, counted inside the actors: an
    asynchronous exploit restores the checkpoint another trial saved when it last ranked high, which can be from an
    earlier iteration than the exploiting trial's, or a later one, so Tune's side can train more env steps than
    jaderl's, or fewer), the exploits, and the time spent per exploit. jaderl: the wall time
    of its exploit steps (the driver waits on them; each generation's copies run side by side) over the copies made.
    Tune: the time its trainables spent in ``save``, ``restore`` and ``reset_config`` (timed inside the actors) over
    the exploits ``PopulationBasedTraining`` made; what Tune's controller spends pausing and restarting trials is in
    its wall time only. Target: the median over the repeats of jaderl's wall time over Tune's <= 0.7x; the same
    ratio per env step trained is reported beside it.
throughput
    For each member count in ``--throughput-members``: first the same members trained independently, as that many
    plain processes side by side (``multiprocessing`` spawn, each ``jaderl.train`` with the member's settings),
    then (after those, on one Ray) a population of them (``pbt``; a single member, which ``pbt`` refuses, is one
    ``Member`` actor trained period by period). ``--throughput-period`` env steps per period (65,536: long enough
    that training dominates the start-up of processes and Ray workers, a few seconds, on a CPU that trains 10,000+
    env steps/s), ``--throughput-generations`` periods, learning rates from ``lr=loguniform:5e-4:2e-3``.
    Reported: the population's training throughput (env steps/s over generations 2.., from its progress clock)
    against linear (the single member's throughput times the members, at most the CPUs: members beyond the
    cores share them), and the overhead: the population's wall time (actors started to last copy made) over the
    independent processes' (processes started to all finished), minus 1. ``--throughput-repeats`` (3) alternating
    repeats of both, medians reported (a shared virtual machine's speed drifts by tens of percent within minutes).
    Targets: >= 0.8x linear up to the cores available; overhead <= 5 %.
tournament (not in the default ``--parts``)
    A tournament (``tournament``, ``--tournament-rounds`` rounds of ``--tournament-period`` env steps, a pool of
    ``--tournament-pool`` members, the search part's settings) as it runs, where the process of a member whose
    period ended becomes the next member, against the same tournament with a new process for every member (each
    finished member's process killed instead of kept), alternating, ``--tournament-repeats`` times on one warm Ray.
    Reported: wall times, their ratio, and whether both gave every round the same score (tournament.csv). No target.

``--write`` records the tables in the ``## population`` section of benchmarks/RESULTS.md (other sections kept).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_md import write_section

import jaderl  # after the path insert, so the checkout is what is measured
from jaderl.api import ALGOS
from jaderl.population import PBTSettings, pbt
from jaderl.population.cluster import Resources, connected
from jaderl.population.member import remote_member
from jaderl.population.space import Space, parse_space, sample

SECTION = "## population"
ALGO, ENV = "ppo", "jaderl/Pendulum-v1"
SETTINGS: dict[str, Any] = {"num_envs": 64, "horizon": 32, "gamma": 0.9, "reward_scale": 0.1,  # ppo_pendulum.yaml
                            "minibatch_size": 256, "hidden": [64, 64], "num_threads": 1, "device": "cpu"}
SPACE = "lr=loguniform:1e-5:1e-1"
THROUGHPUT_SPACE = "lr=loguniform:5e-4:2e-3"
RESAMPLE = 0.25


def cores() -> int:
    return os.cpu_count() or 1


def parsed_space(text: str) -> Space:
    return parse_space(ALGOS[ALGO].agent_cls, [text])


def initial_hyperparameters(space: Space, seed: int, members: int) -> list[dict[str, float]]:
    """The initial hyperparameters of a population's members, drawn as ``pbt`` draws them."""
    rng = random.Random(seed)
    return [sample(space, rng) for _ in range(members)]


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}" if math.isfinite(x) else str(x)


def run_pbt(args: argparse.Namespace, seed: int, run_dir: Path, space: str, members: int, period: int,
            generations: int) -> dict[str, Any]:
    """A jaderl population on the Ray this process holds; its wall time, progress clock and population.csv."""
    clock: list[float] = []
    exploits: list[tuple[float, int]] = []  # (seconds, copies) of each generation's exploit step

    def progress(info: dict[str, Any]) -> None:
        clock.append(info["time_s"])
        exploits.append((info["exploit_s"], info["copies"]))

    start = time.perf_counter()
    result = pbt(ALGO, ENV, members=members, period=period, generations=generations, seed=seed, run_dir=str(run_dir),
                 space=[space], quantile=args.quantile, resample_probability=RESAMPLE, progress=progress, **SETTINGS)
    wall = time.perf_counter() - start
    with open(run_dir / "population.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {"wall_s": wall, "clock": clock, "rows": rows, "best": result.best_score, "exploits": exploits,
            "steps": trained_steps(rows)}


def trained_steps(rows: list[dict[str, str]]) -> int:
    """The env steps a population trained, from population.csv: each row's member count at its generation's end less
    what it started that generation with (its parent's count at the end of the generation before; 0 at first)."""
    end = {(int(r["generation"]), int(r["member"])): int(r["steps"]) for r in rows}
    return sum(int(r["steps"]) - end.get((int(r["generation"]) - 1, int(r["parent"])), 0) for r in rows)


def run_members(ray: Any, seed: int, run_dir: Path, space: Space, members: int, period: int,
                generations: int) -> dict[str, Any]:
    """The same members as ``pbt`` would start, in the same actors, trained period by period with no exploit and no
    explore (random search; with one member, a population of one). Returns scores[generation][member]."""
    from jaderl.core.loop import TrainingError

    config = PBTSettings(ALGO, ENV, max(members, 2), period, generations, seed,
                         {name: dim.describe() for name, dim in space.items()}, settings=SETTINGS)
    initial = initial_hyperparameters(space, seed, members)
    options = Resources().options(members, ray.cluster_resources())
    start = time.perf_counter()
    actor_cls = remote_member(ray, options)
    actors = [actor_cls.remote(config.member_settings(k, run_dir), initial[k]) for k in range(members)]
    scores: list[list[float]] = []
    clock: list[float] = []
    alive = [True] * members
    try:
        for g in range(generations):
            refs = {k: actors[k].train_until.remote(steps=(g + 1) * period) for k in range(members) if alive[k]}
            row = [-math.inf] * members
            for k, ref in refs.items():
                try:
                    row[k] = ray.get(ref)["score"]
                except ray.exceptions.RayTaskError as exc:  # diverged (NaN): it stays at -inf
                    if not isinstance(exc.cause, TrainingError):
                        raise
                    alive[k] = False
            scores.append(row)
            clock.append(time.perf_counter() - start)
        ray.get([actors[k].close.remote() for k in range(members) if alive[k]])
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    return {"wall_s": time.perf_counter() - start, "clock": clock, "scores": scores, "initial": initial}


# ---------------------------------------------------------------------------------------------------------- search


def part_search(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    space = parsed_space(SPACE)
    per_seed = []
    with connected(None, args.cpus) as ray:
        for seed in args.seeds:
            p = run_pbt(args, seed, tmp / f"pbt-s{seed}", SPACE, args.members, args.period, args.generations)
            r = run_members(ray, seed, tmp / f"random-s{seed}", space, args.members, args.period, args.generations)
            first = {int(row["member"]): json.loads(row["hyperparameters"]) for row in p["rows"]
                     if row["generation"] == "0"}
            for k, values in enumerate(r["initial"]):  # both started from the same hyperparameters
                assert all(math.isclose(first[k][n], v, rel_tol=1e-5) for n, v in values.items()), (first[k], values)
            final = r["scores"][-1]
            rs_best = max(final)
            rs_member = max(range(args.members), key=lambda k: final[k])
            best_by_gen = [max(float(row["score"]) for row in p["rows"] if int(row["generation"]) == g)
                           for g in range(args.generations)]
            reached = next((g for g, s in enumerate(best_by_gen) if s >= rs_best), None)
            total = args.members * args.period * args.generations
            steps = None if reached is None else args.members * args.period * (reached + 1)
            rs_first = next(g for g, row in enumerate(r["scores"]) if max(row) >= rs_best)
            per_seed.append({
                "seed": seed, "initial": [v["lr"] for v in r["initial"]], "rs_best": rs_best,
                "rs_lr": r["initial"][rs_member]["lr"], "rs_first": args.members * args.period * (rs_first + 1),
                "pbt_final": best_by_gen[-1], "pbt_steps": steps, "total": total,
                "share": math.inf if steps is None else steps / total, "pbt_wall": p["wall_s"],
                "rs_wall": r["wall_s"],
                "copies": sum(1 for row in p["rows"] if row["parent"] != row["member"])})
            s = per_seed[-1]
            print(f"search seed {seed}: random search best final {rs_best:.1f} (lr {s['rs_lr']:.2g}); PBT best final "
                  f"{s['pbt_final']:.1f}, reached {rs_best:.1f} at "
                  f"{'never' if steps is None else format(steps, ',')} of {total:,} env steps; walls "
                  f"{p['wall_s']:.0f} s / {r['wall_s']:.0f} s", flush=True)
    return {"per_seed": per_seed, "median_share": statistics.median(s["share"] for s in per_seed)}


def section_search(args: argparse.Namespace, res: dict[str, Any]) -> list[str]:
    rows = []
    for s in res["per_seed"]:
        at = "not reached" if s["pbt_steps"] is None else f"{s['pbt_steps']:,} ({s['share']:.0%})"
        lrs = ", ".join(f"{lr:.1e}" for lr in s["initial"])
        rows.append(f"| {s['seed']} | {lrs} | {s['rs_best']:.1f} (lr {s['rs_lr']:.1e}) | {s['rs_first']:,} "
                    f"| {s['pbt_final']:.1f} | {at} | {s['copies']} | {s['pbt_wall']:.0f} / {s['rs_wall']:.0f} |")
    median = res["median_share"]
    verdict = "met" if median <= 0.5 else "**not met**"
    median_text = "never (PBT did not reach it on most seeds)" if not math.isfinite(median) else f"{median:.0%}"
    total = args.members * args.period * args.generations
    rs_median = statistics.median(s["rs_first"] / total for s in res["per_seed"])
    above = sum(s["pbt_final"] > s["rs_best"] for s in res["per_seed"])
    return [
        "### PBT against random search", "",
        f"{args.members} members, {args.generations} periods of {args.period:,} env steps each ({total:,} env steps "
        f"per population), space `{SPACE}`, quantile {args.quantile}, resample probability {RESAMPLE}; random search "
        "is the same members (seeds, initial learning rates, actors, evaluations) with no exploit or explore. "
        "*Env steps* count the whole population's steps.", "",
        "| seed | initial learning rates | random search: best final score | random search: first at it (env steps) "
        "| PBT: best final score | PBT: first at random search's best (share of its steps) | PBT copies "
        "| wall time PBT / random (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *rows, "",
        f"Median over {len(res['per_seed'])} seeds: PBT reached random search's best final score after "
        f"{median_text} of random search's env steps (target <= 50 %: {verdict}).",
        "",
        f"Random search itself first scored that much after a median {rs_median:.0%} of its env steps, and PBT's best "
        f"final score was above random search's on {above} of {len(res['per_seed'])} seeds: the target compares "
        "PBT's first time at that score with random search's whole budget, not with random search's own first time "
        "at it.",
    ]


# ------------------------------------------------------------------------------------------------------------ tune


def timed_trainable(log_path: str, base_seed: int) -> Any:
    """``JaderlTrainable`` with member seeds (``member`` in the trial's config: seed = base_seed + member, kept by a
    copy, as in jaderl's PBT), and the time it spends in save, restore and reset_config and the env steps each
    iteration trains appended to ``log_path``."""
    from jaderl.population.tune import JaderlTrainable

    def log(event: str, seconds: float, steps: int = 0) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps({"event": event, "s": seconds, "steps": steps}) + "\n")

    class TimedTrainable(JaderlTrainable):  # type: ignore[misc]
        def setup(self, config: dict[str, Any]) -> None:
            config = dict(config)
            if "member" in config:  # (a Trainer rebuilt by reset_config, for another trial, keeps the actor's)
                self.member = int(config.pop("member"))
            super().setup({**config, "seed": base_seed + self.member})

        def step(self) -> dict[str, Any]:
            before, start = self.trainer.agent.steps, time.perf_counter()
            out = super().step()
            log("step", time.perf_counter() - start, self.trainer.agent.steps - before)
            return out

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            start = time.perf_counter()
            fields = {k: v for k, v in new_config.items() if k != "member"}
            ok = bool(super().reset_config({**fields, "seed": base_seed + self.member}))
            log("reset_config", time.perf_counter() - start)
            return ok

        def save(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = super().save(*args, **kwargs)
            log("save", time.perf_counter() - start)
            return out

        def restore(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = super().restore(*args, **kwargs)
            log("restore", time.perf_counter() - start)
            return out

    return TimedTrainable


def tune_domain(dim: Any) -> Any:
    from ray import tune

    if dim.kind == "choice":
        return tune.choice(list(dim.values))
    return (tune.loguniform if dim.kind == "loguniform" else tune.uniform)(dim.low, dim.high)


def run_tune(args: argparse.Namespace, seed: int, tmp: Path) -> dict[str, Any]:
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    space = parsed_space(SPACE)
    initial = initial_hyperparameters(space, seed, args.members)
    tmp.mkdir(parents=True, exist_ok=True)
    log_path = tmp / "tune-timings.jsonl"
    trainable = timed_trainable(str(log_path), seed)
    class CountedPBT(PopulationBasedTraining):  # the Tuner runs a copy of its scheduler: count exploits in the log
        def _exploit(self, *args: Any, **kwargs: Any) -> None:
            super()._exploit(*args, **kwargs)
            with open(log_path, "a") as f:
                f.write(json.dumps({"event": "exploit", "s": 0.0}) + "\n")

    scheduler = CountedPBT(
        time_attr="training_iteration", perturbation_interval=1,
        hyperparam_mutations={name: tune_domain(dim) for name, dim in space.items()},
        quantile_fraction=args.quantile, resample_probability=RESAMPLE, perturbation_factors=(1.2, 0.8),
        synch=args.tune_synch)
    param_space: dict[str, Any] = {"algo": ALGO, "env": ENV, "period": args.period,
                                   "total_steps": args.period * args.generations, **SETTINGS,
                                   "member": tune.grid_search(list(range(args.members)))}
    for name in space:
        param_space[name] = tune.sample_from(lambda config, name=name: initial[config["member"]][name])
    cpu = min(1.0, args.cpus / args.members)  # as pbt shares the CPUs
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": cpu}), param_space=param_space,
        tune_config=tune.TuneConfig(metric="eval_return", mode="max", scheduler=scheduler, num_samples=1,
                                    reuse_actors=True),
        run_config=tune.RunConfig(name="tune-pbt", storage_path=str(tmp / "tune"), verbose=0,
                                  stop={"training_iteration": args.generations}))
    random.seed(seed)  # Tune's PBT draws from the random module
    start = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - start
    for error in grid.errors:  # a trial that diverged (NaN) stops with an error under Tune
        print(f"tune part: a trial failed: {str(error).strip().splitlines()[-1][:200]}", flush=True)
    events = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    work = {e: sum(x["s"] for x in events if x["event"] == e) for e in ("save", "restore", "reset_config")}
    counts = {e: sum(1 for x in events if x["event"] == e) for e in work}
    finals = [(r.metrics or {}).get("eval_return", -math.inf) for r in grid]
    exploits = sum(1 for x in events if x["event"] == "exploit")
    steps = sum(x["steps"] for x in events if x["event"] == "step")
    return {"wall_s": wall, "exploits": exploits, "work": work, "counts": counts, "steps": steps,
            "best": max(finals), "failed": len(grid.errors)}


def part_tune(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    seed = args.seeds[0]
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    runs = []
    with connected(None, args.cpus):
        for i in range(args.tune_repeats):  # jaderl, then Tune, on the same warm Ray; again for each repeat
            j = run_pbt(args, seed, tmp / f"jaderl-pbt-{i}", SPACE, args.members, args.period, args.generations)
            print(f"tune part, run {i + 1}: jaderl {j['wall_s']:.1f} s", flush=True)
            t = run_tune(args, seed, tmp / f"tune-{i}")
            print(f"tune part, run {i + 1}: Tune {t['wall_s']:.1f} s", flush=True)
            copies = sum(c for _, c in j["exploits"])
            j["copies"] = copies
            j["per_exploit"] = sum(s for s, _ in j["exploits"]) / copies if copies else math.nan
            t["per_exploit"] = sum(t["work"].values()) / t["exploits"] if t["exploits"] else math.nan
            per_step = math.nan if not (j["steps"] and t["steps"]) else \
                (j["wall_s"] / j["steps"]) / (t["wall_s"] / t["steps"])
            runs.append({"jaderl": j, "tune": t, "ratio": j["wall_s"] / t["wall_s"], "per_step": per_step})
    return {"seed": seed, "runs": runs, "ratio": statistics.median(r["ratio"] for r in runs),
            "per_step": statistics.median(r["per_step"] for r in runs)}


def section_tune(args: argparse.Namespace, res: dict[str, Any]) -> list[str]:
    import ray

    mode = "synchronous" if args.tune_synch else "asynchronous (its default)"
    verdict = "met" if res["ratio"] <= 0.7 else "**not met**"
    rows, notes = [], []
    for i, run in enumerate(res["runs"], 1):
        j, t = run["jaderl"], run["tune"]
        rows += [f"| {i} | jaderl `pbt` | {j['wall_s']:.1f} | {j['steps']:,} | {j['steps'] / j['wall_s']:,.0f} | "
                 f"{j['copies']} | {j['per_exploit']:.3f} | {j['best']:.1f} | |",
                 f"| {i} | Ray Tune `PopulationBasedTraining` | {t['wall_s']:.1f} | {t['steps']:,} | "
                 f"{t['steps'] / t['wall_s']:,.0f} | {t['exploits']} | {t['per_exploit']:.3f} | {t['best']:.1f} | "
                 f"{run['ratio']:.2f}x |"]
        work = ", ".join(f"{t['counts'][e]} x {e} {t['work'][e]:.2f} s" for e in t["work"])
        notes.append(f"Run {i}: jaderl {len(j['exploits'])} exploit steps, {sum(s for s, _ in j['exploits']):.2f} s "
                     f"in all; Tune's trainables {work}."
                     + (f" {t['failed']} Tune trial(s) stopped with an error (a NaN loss)." if t["failed"] else ""))
    return [
        "### jaderl's PBT against Ray Tune's PopulationBasedTraining", "",
        f"The search part's task and settings, seed {res['seed']}: {args.members} members at "
        f"{min(1.0, args.cpus / args.members):g} CPU each, {args.generations} periods (Tune: iterations) of "
        f"{args.period:,} env steps, space `{SPACE}`, quantile {args.quantile}, resample probability {RESAMPLE}, the "
        f"same initial learning rates and member seeds. Ray {ray.__version__}; Tune's PBT {mode}, "
        "`reuse_actors=True`, every checkpoint kept, its default loggers; driving `JaderlTrainable`. "
        f"{len(res['runs'])} run(s) each, alternating on the same warm Ray, jaderl first; wall times exclude the Ray "
        "start. jaderl's copies of a generation run side by side (the driver waits on them); Tune's controller's "
        "pausing and restarting of trials is only in its wall time.", "",
        "| run | | wall time (s) | env steps trained | env steps / wall s | exploits | time per exploit (s) "
        "| best final score | jaderl / Tune (wall) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|", *rows, "", " ".join(notes), "",
        f"jaderl / Tune wall time, median of {len(res['runs'])}: {res['ratio']:.2f}x (target <= 0.7x: {verdict}). "
        f"Per env step trained (each side's wall time over its env steps), median: {res['per_step']:.2f}x.",
    ]


# ------------------------------------------------------------------------------------------------------ throughput


def independent(settings: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        settings = dict(settings)
        return jaderl.train(settings.pop("algo"), settings.pop("env"), **settings).steps


def run_independent(args: argparse.Namespace, members: int, tmp: Path) -> dict[str, Any]:
    space = parsed_space(THROUGHPUT_SPACE)
    config = PBTSettings(ALGO, ENV, max(members, 2), args.throughput_period, args.throughput_generations,
                         args.seeds[0], settings=SETTINGS)
    initial = initial_hyperparameters(space, args.seeds[0], members)
    jobs = [{**config.member_settings(k, tmp / f"independent-{members}"), **initial[k]} for k in range(members)]
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(members) as pool:
        steps = pool.map(independent, jobs)
    return {"wall_s": time.perf_counter() - start, "steps": sum(steps)}


def part_throughput(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    period, generations = args.throughput_period, args.throughput_generations
    indep: dict[int, list[dict[str, Any]]] = {n: [] for n in args.throughput_members}
    pops: dict[int, list[dict[str, Any]]] = {n: [] for n in args.throughput_members}
    for repeat in range(args.throughput_repeats):  # alternating, so that a slow spell of the machine hits both sides
        for n in args.throughput_members:  # before Ray starts: these processes share the machine with nothing of it
            indep[n].append(run_independent(args, n, tmp / f"r{repeat}"))
            print(f"throughput {repeat + 1}: {n} independent processes {indep[n][-1]['wall_s']:.1f} s", flush=True)
        with connected(None, args.cpus) as ray:
            for n in args.throughput_members:
                run_dir = tmp / f"r{repeat}" / f"pop-{n}"
                if n == 1:
                    pop = run_members(ray, args.seeds[0], run_dir, parsed_space(THROUGHPUT_SPACE), 1, period,
                                      generations)
                else:
                    pop = run_pbt(args, args.seeds[0], run_dir, THROUGHPUT_SPACE, n, period, generations)
                clock = pop["clock"]
                pop["rate"] = n * period * (len(clock) - 1) / (clock[-1] - clock[0]) if len(clock) > 1 else math.nan
                pops[n].append(pop)
                print(f"throughput {repeat + 1}: population of {n} {pop['wall_s']:.1f} s, {pop['rate']:,.0f} env "
                      "steps/s", flush=True)
    rate = {n: statistics.median(p["rate"] for p in pops[n]) for n in pops}
    one = rate[1] if 1 in rate else rate[min(rate)] / min(rate)
    rows = []
    for n in args.throughput_members:
        linear = one * min(n, args.cpus)
        pop_wall = statistics.median(p["wall_s"] for p in pops[n])
        ind_wall = statistics.median(r["wall_s"] for r in indep[n])
        rows.append({"members": n, "cpu": min(1.0, args.cpus / n), "pop_wall": pop_wall, "ind_wall": ind_wall,
                     "overhead": pop_wall / ind_wall - 1, "rate": rate[n], "linear": linear,
                     "scaling": rate[n] / linear,
                     "pairs": [(p["wall_s"], r["wall_s"]) for p, r in zip(pops[n], indep[n], strict=True)]})
    return {"rows": rows}


def section_throughput(args: argparse.Namespace, res: dict[str, Any]) -> list[str]:
    lines, within = [], []
    for r in res["rows"]:
        members = f"{r['members']}" + (" (one `Member` actor)" if r["members"] == 1 else "")
        lines.append(f"| {members} | {r['cpu']:g} | {fmt(r['rate'])} | {fmt(r['linear'])} | {r['scaling']:.2f}x "
                     f"| {r['pop_wall']:.1f} | {r['ind_wall']:.1f} | {r['overhead']:+.1%} |")
        within.append(r)
    scaled = [r for r in within if r["members"] <= args.cpus]
    scaling_ok = all(r["scaling"] >= 0.8 for r in scaled)
    scaling = ", ".join(f"{r['members']}: {r['scaling']:.2f}x" for r in scaled)
    worst = max(r["overhead"] for r in within)
    per_member = args.throughput_period * args.throughput_generations
    pairs = "; ".join(f"{r['members']} member(s): " + ", ".join(f"{p:.1f} / {i:.1f}" for p, i in r["pairs"])
                      for r in within)
    repeats = args.throughput_repeats
    return [
        "### Throughput against members", "",
        f"{args.throughput_generations} periods of {args.throughput_period:,} env steps per member "
        f"({per_member:,} env steps each), space `{THROUGHPUT_SPACE}`, the search part's other settings. *Linear*: "
        f"the single member's env steps/s times the members, at most {args.cpus} (the CPUs). *Overhead*: the "
        "population's wall time over that of the same members as independent `jaderl.train` processes side by side, "
        "minus 1 (both include starting the processes and importing torch and jaderl). "
        f"{repeats} repeat(s), alternating: the independent processes of every member count, then (on one Ray, "
        "started for the repeat and excluded) the populations; the table gives the medians.", "",
        "| members | CPU each | population env steps/s (periods 2..) | linear | vs linear | population wall (s) "
        "| independent wall (s) | overhead |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *lines, "",
        f">= 0.8x linear up to {args.cpus} members: {'met' if scaling_ok else '**not met**'}"
        f" ({scaling}); overhead <= 5 %: "
        f"{'met' if worst <= 0.05 else '**not met**'} (largest {worst:+.1%}).", "",
        f"Population / independent wall time (s) of each repeat: {pairs}.",
    ]


# ------------------------------------------------------------------------------------------------------ tournament


class _KillOnAppend(list):  # type: ignore[type-arg]
    """A tournament's list of idle member processes that keeps none: each one is killed instead."""

    def __init__(self, ray: Any) -> None:
        super().__init__()
        self.ray = ray

    def append(self, actor: Any) -> None:
        self.ray.kill(actor, no_restart=True)


def run_tournament(args: argparse.Namespace, seed: int, run_dir: Path, reuse: bool) -> dict[str, Any]:
    """One tournament on the Ray this process holds; ``reuse=False`` starts a new process for every member."""
    import importlib

    import ray

    module = importlib.import_module("jaderl.population.tournament")  # (the package's `tournament` is the function)
    original = module._Tournament

    class NewProcessEach(original):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.idle = _KillOnAppend(ray)

    if not reuse:
        module._Tournament = NewProcessEach
    try:
        start = time.perf_counter()
        result = module.tournament(ALGO, ENV, pool=args.tournament_pool, period=args.tournament_period,
                                   rounds=args.tournament_rounds, seed=seed, run_dir=str(run_dir), **SETTINGS)
        wall = time.perf_counter() - start
    finally:
        module._Tournament = original
    with open(run_dir / module.CSV_NAME, newline="") as f:
        scores = {int(r["round"]): r["score"] for r in csv.DictReader(f)}
    return {"wall_s": wall, "best": result.best_score, "scores": scores}


def part_tournament(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    seed, runs = args.seeds[0], []
    with connected(None, args.cpus):
        for i in range(args.tournament_repeats):  # kept processes first, then new ones, on the same warm Ray
            kept = run_tournament(args, seed, tmp / f"kept-{i}", reuse=True)
            new = run_tournament(args, seed, tmp / f"new-{i}", reuse=False)
            print(f"tournament part, run {i + 1}: {kept['wall_s']:.1f} s kept, {new['wall_s']:.1f} s new", flush=True)
            runs.append({"kept": kept, "new": new, "ratio": kept["wall_s"] / new["wall_s"],
                         "same": kept["scores"] == new["scores"]})
    return {"seed": seed, "runs": runs, "ratio": statistics.median(r["ratio"] for r in runs)}


def section_tournament(args: argparse.Namespace, res: dict[str, Any]) -> list[str]:
    rows = [f"| {i} | {r['kept']['wall_s']:.1f} | {r['new']['wall_s']:.1f} | {r['ratio']:.2f}x | "
            f"{'yes' if r['same'] else 'no'} | {r['kept']['best']:.1f} |" for i, r in enumerate(res["runs"], 1)]
    return [
        "### A tournament's members in kept processes against a new process each", "",
        f"PPO on `{ENV}` with the search part's settings, seed {res['seed']}: {args.tournament_rounds} rounds of "
        f"{args.tournament_period:,} env steps, a pool of {args.tournament_pool} members at "
        f"{min(1.0, args.cpus / args.tournament_pool):g} CPU each. *Kept*: as `tournament` runs, the process of a "
        "member whose period ended becomes the next member; *new*: every finished member's process is killed and "
        "the next member starts in a new one (importing torch and jaderl). Alternating on one warm Ray, wall times "
        "exclude its start.", "",
        "| run | kept processes (s) | a new process each (s) | kept / new | same score every round | best score |",
        "|---:|---:|---:|---:|---|---:|", *rows, "",
        f"Kept / new wall time, median of {len(res['runs'])}: {res['ratio']:.2f}x.",
    ]


# ------------------------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="search,tune,throughput")
    parser.add_argument("--seeds", default="0,1,2", help="search part: one population pair per seed; the other "
                                                              "parts use the first")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--period", type=int, default=4096, help="env steps per member and period")
    parser.add_argument("--generations", type=int, default=12)
    parser.add_argument("--quantile", type=float, default=0.25)
    parser.add_argument("--tune-synch", action="store_true", help="Tune's synchronous PBT instead of its default")
    parser.add_argument("--tune-repeats", type=int, default=3, help="tune part: jaderl and Tune runs, alternating")
    parser.add_argument("--throughput-members", default="1,2,4")
    parser.add_argument("--throughput-period", type=int, default=65_536)
    parser.add_argument("--throughput-generations", type=int, default=4)
    parser.add_argument("--throughput-repeats", type=int, default=3, help="throughput part: alternating repeats, "
                                                                              "medians reported")
    parser.add_argument("--tournament-pool", type=int, default=2)
    parser.add_argument("--tournament-period", type=int, default=32_768)
    parser.add_argument("--tournament-rounds", type=int, default=8)
    parser.add_argument("--tournament-repeats", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=cores(), help="CPUs of the local Ray (default: this machine's)")
    parser.add_argument("--quick", action="store_true", help="smoke check: tiny budgets, 1 seed, writes nothing")
    parser.add_argument("--write", action="store_true", help="record the tables in benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.period, args.generations, args.tune_repeats = "0", 2048, 3, 1
        args.throughput_members, args.throughput_period, args.throughput_generations = "1,2", 4096, 2
        args.throughput_repeats = 1
        args.tournament_period, args.tournament_rounds, args.tournament_repeats = 4096, 3, 1
        args.write = False
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.throughput_members = [int(n) for n in args.throughput_members.split(",") if n]
    parts = [p for p in args.parts.split(",") if p]
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()
    body: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for part, run, write in (("search", part_search, section_search), ("tune", part_tune, section_tune),
                                 ("throughput", part_throughput, section_throughput),
                                 ("tournament", part_tournament, section_tournament)):
            if part in parts:
                (Path(tmp) / part).mkdir()
                body += [*write(args, run(args, Path(tmp) / part)), ""]
    import ray

    command = " ".join(["python", "benchmarks/population.py", *sys.argv[1:]])
    section = "\n".join([
        SECTION, "",
        f"Command: `{command}`  ",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {platform.machine()}, {cores()} cores (load average 1/5/15 min before the runs: {load}); a local "
        f"Ray of {args.cpus} CPUs per part; Python {platform.python_version()}, torch {torch.__version__}, ray "
        f"{ray.__version__}; one torch thread per member; {time.perf_counter() - started:.0f} s in all", "",
        f"PPO on `{ENV}` with `configs/ppo_pendulum.yaml`'s settings ({SETTINGS}); every member evaluates 10 "
        "deterministic episodes at the end of each period, its score being their mean return. How each number is "
        "measured: the script's docstring.", "",
        *body,
    ])
    print("\n" + section)
    if args.write:
        write_section(SECTION, section)


if __name__ == "__main__":
    main()
