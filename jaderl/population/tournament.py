"""Tournament-based ensemble training: an asynchronous pool of members, a leaderboard, a generator and an updater.

    leaderboard = Leaderboard actor (top-K entries with scores, persisted to POP_DIR/leaderboard.json)
    pool = `pool` members training side by side, each for one period of env steps
    whenever any member finishes its period (no member waits for another):
        updater:   the leaderboard inserts it by the score of the evaluation that ended its period (a copy of its
                   run directory is kept while it stays in the top K); record tournament.csv; end the member (its
                   process trains the next one)
        generator: start the next member from the leaderboard:
                   "best"  continue a copy of the best entry with explored hyperparameters,
                   "fuse"  the top k entries of one algorithm fused (parameters and optimizer states averaged,
                           normalisers merged); entries that cannot be fused give a warning and a copy of the best
                           one instead ("best" in tournament.csv),
                   "fresh" a new agent of one of the algorithms with hyperparameters sampled from the space
    when `rounds` members have finished: POP_DIR/best is a copy of the leaderboard's first entry

A driver that stops (Ctrl-C, a lost connection, SIGKILL) leaves POP_DIR/tournament.json (the settings),
tournament.csv (the members that finished) and the leaderboard: :func:`resume_tournament` (``jaderl tournament
--resume POP_DIR``) starts the rounds that had not finished again, losing at most the periods in flight.

Members may use different algorithms (``algos=["ppo", "a2c"]``); entries of one algorithm only are fused. Every
member and entry is an ordinary run directory; with several nodes, POP_DIR must be on storage every node shares. A
member's process, with torch and jaderl imported, becomes the next member when its period ends (a new process starts
only for a member whose process died or whose training failed), so a round costs no process start.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from jaderl.api import ALGOS, make_config
from jaderl.core.config import ConfigError
from jaderl.core.loop import TrainingError
from jaderl.parallel.ddp import checkpoint_step
from jaderl.population.cluster import PopulationError, Resources, connected, process_gone
from jaderl.population.ensemble import fuse_runs
from jaderl.population.member import remote_worker
from jaderl.population.pbt import check_fits
from jaderl.population.space import Space, check_not_fixed, explore, parse_space, sample, space_entries
from jaderl.population.store import (
    copy_run,
    driven,
    new_population_dir,
    population_dir,
    read_csv,
    write_csv,
    write_json,
)

STRATEGIES = ("best", "fuse", "fresh")
FORMAT = 1
"""The version of tournament.json's layout that this jaderl writes and resumes."""
STATE_JSON = "tournament.json"
LEADERBOARD_JSON = "leaderboard.json"
CSV_NAME = "tournament.csv"
CSV_COLUMNS = ["round", "member", "algo", "origin", "parents", "steps", "score", "rank", "hyperparameters"]


class Leaderboard:
    """The top ``size`` entries by score (higher first), each with a copy of its member's run directory under
    ``root/leaderboard/``; every change is written to ``root/leaderboard.json`` before it returns. Held by a Ray actor
    (:func:`leaderboard_actor`), so every driver and member of the cluster sees one board. An entry's ``run_dir`` is
    always that copy under ``root`` (a population directory that was moved or copied reads its own copies)."""

    def __init__(self, root: str, size: int) -> None:
        self.root, self.size = Path(root), size
        path = self.root / LEADERBOARD_JSON
        saved = json.loads(path.read_text())["entries"] if path.exists() else []
        self.entries: list[dict[str, Any]] = [{**e, "run_dir": str(self.snapshot(e["name"]))} for e in saved]

    def snapshot(self, name: str) -> Path:
        """Where the copy of entry ``name``'s run directory is kept."""
        return self.root / "leaderboard" / name

    def insert(self, entry: dict[str, Any], run_dir: str) -> int | None:
        """Insert ``entry`` (with ``name`` and ``score``) by its score; returns its rank (0 is best), or None when it
        does not make the top ``size``."""
        others = [e for e in self.entries if e["name"] != entry["name"]]  # (a call retried after a restart: once)
        ranked = sorted([*others, entry], key=lambda e: e["score"], reverse=True)
        if entry not in ranked[:self.size]:
            return None
        snapshot = self.snapshot(entry["name"])
        copy_run(Path(run_dir), snapshot)
        kept, dropped = ranked[:self.size], ranked[self.size:]
        self.entries = [{**e, "run_dir": str(snapshot)} if e is entry else e for e in kept]
        write_json(self.root / LEADERBOARD_JSON, {"size": self.size, "entries": self.entries})
        for old in dropped:
            shutil.rmtree(self.snapshot(old["name"]), ignore_errors=True)
        return kept.index(entry)

    def top(self, k: int | None = None) -> list[dict[str, Any]]:
        """The best ``k`` entries (all with None), best first."""
        return list(self.entries[:k])


def leaderboard_actor(ray: Any) -> Any:
    """:class:`Leaderboard` as a Ray actor class that holds no CPU. Ray restarts it up to 3 times where its process
    dies (it reloads leaderboard.json) and retries the call that was under way (each is safe to repeat)."""
    return ray.remote(num_cpus=0, max_restarts=3, max_task_retries=3)(Leaderboard)


@dataclasses.dataclass
class TournamentResult:
    """What a finished tournament reports (``jaderl tournament --json`` prints it)."""

    population_dir: str
    rounds: int
    best_score: float
    best_run_dir: str
    leaderboard: list[dict[str, Any]]
    time_s: float


def tournament(algos: list[str] | str, env: str, *, pool: int = 4, period: int = 20_000, rounds: int = 40,
               leaderboard_size: int = 5, fuse_top: int | None = None,
               strategy_weights: tuple[float, float, float] = (0.5, 0.25, 0.25), seed: int = 0,
               run_dir: str | None = None, space: list[str] | None = None, resources: str = "",
               address: str | None = None, num_cpus: int | None = None, progress: Any = None,
               **settings: Any) -> TournamentResult:
    """Run a tournament of ``rounds`` member periods with ``pool`` members at a time (see the module docstring).
    ``algos``: one algorithm or several; ``strategy_weights``: how often the generator copies the best entry, fuses
    the top ``fuse_top`` entries (2 to ``leaderboard_size``; default 3, or the leaderboard's size if smaller) or
    starts afresh (fresh members until the leaderboard has an entry); ``settings``: config fields, each given to every
    algorithm that has it. ``progress`` is called whenever a member's period ends, with ``finished``, ``rounds``,
    ``member``, ``score``, ``origin``, ``pid`` (the process it trained in; None if it died) and ``time_s``."""
    algos = [algos] if isinstance(algos, str) else list(algos)
    fuse_top = max(2, min(3, leaderboard_size)) if fuse_top is None else fuse_top
    spaces = _checked(algos, env, pool, period, rounds, leaderboard_size, fuse_top, strategy_weights, seed, space,
                      settings)
    per_member = Resources.parse(resources)
    pop_dir = population_dir(run_dir, "tournament", "+".join(algos), env, seed)  # a file or one in use: before Ray
    with connected(address, num_cpus) as ray:  # an address that does not answer, or too few resources: no directory
        options = per_member.options(pool, ray.cluster_resources())
        pop_dir = new_population_dir(str(pop_dir), "tournament", "+".join(algos), env, seed)  # (filled meanwhile?)
        with driven(pop_dir):
            write_json(pop_dir / STATE_JSON, {"format": FORMAT, "algos": algos, "env": env, "pool": pool,
                                              "period": period, "rounds": rounds, "leaderboard_size": leaderboard_size,
                                              "fuse_top": fuse_top, "strategy_weights": list(strategy_weights),
                                              "seed": seed, "space": space or [], "resources": resources,
                                              "settings": settings})
            runner = _Tournament(ray, options, pop_dir, algos, env, spaces, settings, period, fuse_top,
                                 strategy_weights, random.Random(seed), seed)
            return runner.run(pool, rounds, leaderboard_size, progress)


def resume_tournament(pop_dir: str | Path, *, rounds: int | None = None, pool: int | None = None,
                      resources: str | None = None, address: str | None = None, num_cpus: int | None = None,
                      progress: Any = None) -> TournamentResult:
    """Continue the tournament in ``pop_dir`` whose driver stopped: the leaderboard and tournament.csv as they are on
    disk, and every round that had not finished (its member was training when the driver stopped) started again from
    the leaderboard. ``rounds`` may raise the number of rounds, ``pool`` and ``resources`` change how many members
    train at a time and what each holds (another cluster). The generator's random choices continue from a stream of
    the tournament's seed and the rounds finished."""
    pop_dir = Path(pop_dir).absolute()  # (members' run directories, in processes with another working directory)
    _read_saved(pop_dir)  # (a directory that holds no tournament: refused before anything is written into it)
    with driven(pop_dir):  # (another driver of it: refused before Ray starts)
        return _resume_tournament(pop_dir, rounds, pool, resources, address, num_cpus, progress)


def _resume_tournament(pop_dir: Path, rounds: int | None, pool: int | None, resources: str | None,
                       address: str | None, num_cpus: int | None, progress: Any) -> TournamentResult:
    saved = _read_saved(pop_dir)
    if rounds is not None and rounds < saved["rounds"]:
        raise ConfigError(f"--rounds {rounds} is fewer than the tournament's {saved['rounds']}; resume with --rounds "
                          f"{saved['rounds']} or more")
    rounds = saved["rounds"] if rounds is None else rounds
    pool = saved["pool"] if pool is None else pool
    resources = saved["resources"] if resources is None else resources
    algos, env, settings, seed = saved["algos"], saved["env"], saved["settings"], saved["seed"]
    size, weights = saved["leaderboard_size"], tuple(saved["strategy_weights"])
    spaces = _checked(algos, env, pool, saved["period"], rounds, size, saved["fuse_top"], weights, seed,
                      saved["space"] or None, settings)
    per_member = Resources.parse(resources)
    entries = Leaderboard(str(pop_dir), size).top()
    rows: list[dict[str, Any]] = list(read_csv(pop_dir / CSV_NAME))
    have = {r["member"] for r in rows}  # a member in the leaderboard but not in tournament.csv: the driver stopped
    rows += [_row(e, rank) for rank, e in enumerate(entries) if e["name"] not in have]  # between the two
    done = {int(r["round"]) for r in rows}
    kept = {e["name"] for e in entries}  # copies the driver was making (a member's, an entry's) when it stopped
    leftovers = [p for p in (pop_dir / "leaderboard").glob("*") if p.name not in kept]
    leftovers += [p for p in (pop_dir / "members").glob("*") if p.suffix in (".tmp", ".old")]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    if len(done) >= rounds:
        if entries and (saved.get("best") != entries[0]["name"] or not (pop_dir / "best").exists()):
            # it stopped before (or while) copying the best entry
            write_csv(pop_dir / CSV_NAME, CSV_COLUMNS, rows)
            return _copy_best(pop_dir, entries, rounds, 0.0)
        raise ConfigError(f"{pop_dir} already finished {len(done)} rounds; resume with --rounds larger than "
                          f"{len(done)} to train on")
    with connected(address, num_cpus) as ray:
        options = per_member.options(pool, ray.cluster_resources())
        write_json(pop_dir / STATE_JSON, {**saved, "rounds": rounds, "pool": pool, "resources": resources})
        write_csv(pop_dir / CSV_NAME, CSV_COLUMNS, rows)
        runner = _Tournament(ray, options, pop_dir, algos, env, spaces, settings, saved["period"], saved["fuse_top"],
                             weights, random.Random(f"tournament {seed} resumed after {len(done)} rounds"), seed,
                             rows=rows)
        return runner.run(pool, rounds, size, progress)


def _copy_best(pop_dir: Path, entries: list[dict[str, Any]], rounds: int, time_s: float) -> TournamentResult:
    """Copy the leaderboard's first entry to POP_DIR/best and record which entry it is (a resume of a tournament that
    stopped before the record copies it again)."""
    copy_run(Path(entries[0]["run_dir"]), pop_dir / "best")
    if (pop_dir / STATE_JSON).exists():  # (tournament() writes it; a _Tournament driven by itself has none)
        write_json(pop_dir / STATE_JSON, {**_read_saved(pop_dir), "best": entries[0]["name"]})
    return TournamentResult(str(pop_dir), rounds, entries[0]["score"], str(pop_dir / "best"), entries, time_s)


def _read_saved(pop_dir: Path) -> dict[str, Any]:
    """tournament.json's settings, or one sentence saying that ``pop_dir`` holds no tournament this jaderl resumes."""
    path = pop_dir / STATE_JSON
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or "settings" not in saved:
            raise ValueError("no settings")
    except (OSError, ValueError):
        raise ConfigError(f"{pop_dir} holds no tournament ({path} is missing or damaged); pass the directory of a "
                          "tournament started with `jaderl tournament`") from None
    if saved.get("format") != FORMAT:
        made = "an older jaderl" if saved.get("format") is None else f"a jaderl of format {saved['format']}"
        raise ConfigError(f"{pop_dir} holds a tournament that {made} started, which this jaderl (format {FORMAT}) "
                          "cannot resume; start a new tournament")
    return saved


def _row(entry: dict[str, Any], rank: int | None) -> dict[str, Any]:
    """tournament.csv's row of a member that finished (``entry``: what the leaderboard holds of it)."""
    score = entry["score"]
    return {"round": entry["round"], "member": entry["name"], "algo": entry["algo"], "origin": entry["origin"],
            "parents": " ".join(entry["parents"]), "steps": entry["steps"],
            "score": f"{score:.6g}", "rank": "" if rank is None else rank,
            "hyperparameters": json.dumps(entry["hyperparameters"])}


def _checked(algos: list[str], env: str, pool: int, period: int, rounds: int, leaderboard_size: int, fuse_top: int,
             strategy_weights: tuple[float, ...], seed: int, space: list[str] | None,
             settings: dict[str, Any]) -> dict[str, Space]:
    """Each algorithm's search space, once every argument is checked (one sentence for the first that is wrong) and
    the env is known to exist and to fit every algorithm, before anything starts."""
    if not algos or (unknown := [a for a in algos if a not in ALGOS]):
        raise ConfigError(f"unknown algorithm {(unknown or [''])[0]!r}; choose from: {', '.join(ALGOS)}")
    for name, value, low in (("pool", pool, 1), ("period", period, 1), ("rounds", rounds, 1),
                             ("leaderboard_size", leaderboard_size, 1), ("fuse_top", fuse_top, 2)):
        if value < low:
            raise ConfigError(f"{name}={value} is out of range: it must be >= {low}")
    if len(strategy_weights) != 3 or min(strategy_weights) < 0 or sum(strategy_weights) <= 0:
        raise ConfigError(f"strategy_weights={strategy_weights} must be three weights >= 0 (best, fuse, fresh) with a "
                          "positive sum")
    if not all(math.isfinite(w) for w in strategy_weights):  # (NaN passes both checks above; inf the first)
        raise ConfigError(f"strategy_weights={strategy_weights} must be three finite weights (best, fuse, fresh), not "
                          "NaN or infinity; give each strategy's share, e.g. 0.5,0.25,0.25")
    if strategy_weights[1] > 0 and fuse_top > leaderboard_size:  # (no fused member: fuse_top is never used)
        fix = ("lower --fuse-top or raise --leaderboard-size" if leaderboard_size >= 2 else
               "raise --leaderboard-size to 2 or more, or give fusing no weight in --strategy-weights")
        raise ConfigError(f"fuse_top={fuse_top} is out of range: it must be <= leaderboard_size={leaderboard_size}, "
                          f"since a fused member averages entries of the leaderboard; {fix}")
    if "total_steps" in settings:  # (member_settings would replace it without a word)
        raise ConfigError(f"total_steps={settings['total_steps']!r} cannot be given to a tournament: a lineage trains "
                          f"at most period * rounds = {period * rounds} env steps, one period a round; drop it, or "
                          "set --period and --rounds")
    check_not_fixed(space, settings)
    check_space_fits_every_algorithm(space, algos)
    for a in algos:  # (a bad space is refused before the env is built)
        parse_space(ALGOS[a].agent_cls, space, fixed=settings)
    fields = {f.name for a in algos for f in dataclasses.fields(ALGOS[a].agent_cls.config_cls)}
    if bad := sorted(set(settings) - fields):
        raise ConfigError(f"unknown setting {bad[0]!r}: none of {', '.join(algos)} has it")
    # the env exists, and every algorithm fits it and takes its settings, before any member starts
    configs = {a: make_config(**member_settings(a, env, settings, period, rounds, seed, Path("."))) for a in algos}
    spec = check_fits(list(configs.values()))
    return {a: parse_space(ALGOS[a].agent_cls, space, fixed=settings, config=configs[a], spec=spec) for a in algos}


def check_space_fits_every_algorithm(space: list[str] | dict[str, str] | None, algos: list[str]) -> None:
    """Refuse in one sentence a ``space`` entry that one of several ``algos`` can change while it trains and another
    cannot: every member of a tournament, of whichever algorithm, is searched over the whole space."""
    mutable = {algo: ALGOS[algo].agent_cls.hyperparameters for algo in algos}
    for name in space_entries(space):
        having = [algo for algo in algos if name in mutable[algo]]
        if having and (lacking := [algo for algo in algos if name not in mutable[algo]]):
            one = len(having) == 1
            raise ConfigError(f"--space {name}=... cannot be searched in this tournament: {lacking[0]} has no mutable "
                              f"hyperparameter {name} (only {', '.join(having)} {'has' if one else 'have'} it), and "
                              f"members of every algorithm are searched over the whole space; drop {name} from "
                              f"--space, or run {' and '.join(having)} in a tournament of {'its' if one else 'their'} "
                              "own")


def member_settings(algo: str, env: str, settings: dict[str, Any], period: int, rounds: int, seed: int,
                    run_dir: Path) -> dict[str, Any]:
    """Config fields of a member of ``algo`` (the ``settings`` it has); a lineage trains at most one period a
    round."""
    fields = {f.name for f in dataclasses.fields(ALGOS[algo].agent_cls.config_cls)}
    mine = {k: v for k, v in settings.items() if k in fields}
    return {"eval_every": period, "checkpoint_every": period, **mine, "algo": algo, "env": env, "seed": seed,
            "total_steps": period * rounds, "run_dir": str(run_dir)}


class _Tournament:
    def __init__(self, ray: Any, options: dict[str, float], pop_dir: Path, algos: list[str], env: str,
                 spaces: dict[str, Space], settings: dict[str, Any], period: int, fuse_top: int,
                 weights: tuple[float, ...], rng: random.Random, seed: int,
                 rows: list[dict[str, Any]] | None = None) -> None:
        self.ray, self.pop_dir, self.algos, self.env, self.spaces = ray, pop_dir, algos, env, spaces
        self.settings, self.period, self.fuse_top, self.weights, self.rng = settings, period, fuse_top, weights, rng
        self.seed, self.rounds = seed, 0
        self.worker_cls = remote_worker(ray, options)
        self.idle: list[Any] = []  # processes of members that finished, each the next member's
        self.rows: list[dict[str, Any]] = list(rows or [])  # tournament.csv's (a resumed tournament's finished ones)

    def member_settings(self, algo: str, name: str, round_: int) -> dict[str, Any]:
        return member_settings(algo, self.env, self.settings, self.period, self.rounds, self.seed + round_,
                               self.pop_dir / "members" / name)

    def generate(self, round_: int, board: Any) -> tuple[Any, dict[str, Any], list[Any]]:
        """The next member (a started actor), what it came from, and the refs of the calls that set it up (read when
        its period ends, so that the driver does not wait for the new process meanwhile)."""
        name = f"t{round_:04d}"
        entries = self.ray.get(board.top.remote())
        strategy = self.rng.choices(STRATEGIES, weights=self.weights)[0] if entries else "fresh"
        if strategy == "fuse":
            algo = entries[0]["algo"]
            same = [e for e in entries if e["algo"] == algo][:self.fuse_top]
            strategy = "fuse" if len(same) >= 2 else "best"
        target = self.pop_dir / "members" / name
        shutil.rmtree(target, ignore_errors=True)  # a round started again: what its member left when the driver stopped
        if strategy == "fresh":
            algo = self.rng.choice(self.algos)
            values, parents = sample(self.spaces[algo], self.rng), []
        elif strategy == "best":
            algo, parents = entries[0]["algo"], [entries[0]["name"]]
            copy_run(Path(entries[0]["run_dir"]), target)
            values = explore(self.spaces[algo], entries[0]["hyperparameters"], self.rng, 0.25)
        else:
            parents = [e["name"] for e in same]
            try:
                fuse_runs([e["run_dir"] for e in same], target)
            except ConfigError as exc:
                warnings.warn(f"member {name} copies the best entry {entries[0]['name']} instead of fusing "
                              f"{', '.join(parents)}, which cannot be fused: {exc}", stacklevel=2)
                strategy, parents = "best", [entries[0]["name"]]
                copy_run(Path(entries[0]["run_dir"]), target)
            values = explore(self.spaces[algo], entries[0]["hyperparameters"], self.rng, 0.25)
        actor = self.idle.pop() if self.idle else self.worker_cls.remote()
        setup = [actor.start.remote(self.member_settings(algo, name, round_), values)]
        if strategy != "fresh":  # a continued member draws from its own random streams (two copies of one entry
            # would otherwise retrace each other) and checkpoints them with the explored hyperparameters
            setup += [actor.reseed.remote(self.seed + round_), actor.set_hyperparameters.remote(values)]
        return actor, {"round": round_, "member": name, "algo": algo, "origin": strategy, "parents": parents,
                       "values": values}, setup

    def run(self, pool: int, rounds: int, size: int, progress: Any) -> TournamentResult:
        ray, start = self.ray, time.perf_counter()
        self.rounds = rounds  # a lineage trains at most one period a round
        board = leaderboard_actor(ray).remote(str(self.pop_dir), size)
        running: dict[Any, tuple[Any, dict[str, Any], list[Any]]] = {}
        done = {int(row["round"]) for row in self.rows}
        todo, finished = [r for r in range(rounds) if r not in done], len(done)
        ending: list[Any] = []  # the member whose period ended, until it is idle or killed
        try:
            while finished < rounds:
                while todo and len(running) < pool:
                    actor, info, setup = self.generate(todo.pop(0), board)
                    running[actor.train_for.remote(self.period)] = (actor, info, setup)
                [ref], _ = ray.wait(list(running), num_returns=1)
                actor, info, setup = running.pop(ref)
                ending = [actor]
                unknown = {"hyperparameters": info["values"]}  # (what the member was given, when it cannot tell)
                try:
                    ray.get(setup)  # (a failure there is the member's)
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    if not isinstance(exc.cause, TrainingError):
                        first = (str(exc.cause).strip().splitlines() or [type(exc.cause).__name__])[0]
                        raise PopulationError(f"member {info['member']} failed: {first}") from None
                    result, described = self.failed(info), unknown
                    ray.kill(actor, no_restart=True)  # (its Trainer diverged: the next member gets a new process)
                except process_gone(ray):  # its process died: it simply leaves the tournament
                    result, described = self.failed(info), unknown
                    ray.kill(actor, no_restart=True)
                else:  # its period ended with a checkpoint and a score, which stand whatever happens to it now
                    try:
                        described = ray.get(actor.describe.remote())
                        ray.get(actor.close.remote())
                        self.idle.append(actor)
                    except (ray.exceptions.RayTaskError, *process_gone(ray)):  # (its process is not reused)
                        described = unknown
                        ray.kill(actor, no_restart=True)
                ending = []
                finished += 1
                self.update(board, info, result, described)
                if progress is not None:
                    progress({"finished": finished, "rounds": rounds, "member": info["member"],
                              "score": result["score"], "origin": info["origin"], "pid": described.get("pid"),
                              "time_s": time.perf_counter() - start})
            entries = ray.get(board.top.remote())
        except process_gone(ray) as exc:  # (a member's death is handled above: this is the leaderboard's actor)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise PopulationError(f"the leaderboard's actor died more often than Ray restarts it ({first}); "
                                  f"leaderboard.json keeps it: continue with `jaderl tournament --resume "
                                  f"{self.pop_dir}`") from None
        finally:  # Ctrl-C or an error: no member outlives the tournament
            for actor in [*(a for a, _, _ in running.values()), *self.idle, *ending]:
                ray.kill(actor, no_restart=True)
            ray.kill(board, no_restart=True)
        if not entries:
            raise PopulationError("no member finished a period with a score; see the members' run directories")
        return _copy_best(self.pop_dir, entries, rounds, round(time.perf_counter() - start, 3))

    def failed(self, info: dict[str, Any]) -> dict[str, Any]:
        """The result of a member that failed: no score, and the env steps of its last checkpoint (0 where it has
        none, or where its run directory is on another node's disk)."""
        return {"score": -math.inf, "steps": checkpoint_step(self.pop_dir / "members" / info["member"]) or 0}

    def update(self, board: Any, info: dict[str, Any], result: dict[str, Any], described: dict[str, Any]) -> None:
        """The updater: insert a finished member into the leaderboard by its score; record tournament.csv."""
        name = info["member"]
        values = {k: v for k, v in described["hyperparameters"].items() if k in self.spaces[info["algo"]]}
        entry = {"name": name, "round": info["round"], "algo": info["algo"], "score": result["score"],
                 "steps": result["steps"], "hyperparameters": values, "origin": info["origin"],
                 "parents": info["parents"]}
        rank = None
        if math.isfinite(result["score"]):
            rank = self.ray.get(board.insert.remote(entry, str(self.pop_dir / "members" / name)))
        self.rows.append(_row(entry, rank))
        write_csv(self.pop_dir / CSV_NAME, CSV_COLUMNS, self.rows)
