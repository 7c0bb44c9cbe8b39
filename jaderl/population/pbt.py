"""Population-based training (Jaderberg et al. 2017, arXiv:1711.09846), generational, with Trainers in Ray actors.

    members = [Member(settings with seed + k, hyperparameters sampled from the space) as Ray actors]
    for generation g:
        every member trains to (g + 1) * period env steps side by side, evaluates, checkpoints
        rank by the evaluation's mean return; record population.csv
        plan who copies whom and the explored values; save the plan in population.json
        each member of the bottom quantile takes the whole state of a random member of the top quantile (networks,
        optimizers, normalisers, env state, optionally its replay buffer: in memory, through the object store) and
        explores: each hyperparameter perturbed by x0.8 / x1.2 or, with ``resample_probability``, resampled
        write population.json (the commit point of the generation); redraw population.png every 30 s
    draw population.png; copy the best member's run directory to POP_DIR/best

A member whose process dies is restarted from its last checkpoint and trains its period again: on a standby process
that has jaderl imported already (CPU-only members on a cluster with a CPU that no member holds; a new standby starts
behind it), or else in a new process on any node with room; one that diverges (NaN) scores -inf and is replaced by a
copy of a top member. After the driver dies, :func:`resume_pbt` continues from the last generation committed, losing
at most one period of training, or makes the saved plan's copies again when the driver died during them.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaderl.api import ALGOS, make_config
from jaderl.core.config import Config, ConfigError
from jaderl.core.loop import TrainingError, check_spec
from jaderl.envs import make_env
from jaderl.envs.vec import EnvSpec
from jaderl.population.cluster import PopulationError, Resources, connected, process_gone
from jaderl.population.member import remote_member, remote_standby
from jaderl.population.space import Space, check_not_fixed, explore, parse_space, sample, space_entries
from jaderl.population.store import (
    STATE_JSON,
    copy_run,
    csv_row,
    damaged_checkpoint,
    driven,
    new_population_dir,
    plot_population,
    population_dir,
    read_rows,
    read_state,
    write_json,
    write_rows,
)

FORMAT = 1
"""The layout of population.json."""
UNBOUNDED = 10**15
"""Env steps that a run with periods in seconds never reaches (its evaluation and checkpoint cadence, its budget)."""
PLOT_EVERY_S = 30.0
"""population.png is drawn after the first generation that ends this long after the start, then at most this often,
and after the last generation: every member waits for the driver between generations, and a drawing takes 0.4-1.5 s
of a small CPU."""


@dataclasses.dataclass
class PBTResult:
    """What a finished population reports (``jaderl pbt --json`` prints it)."""

    population_dir: str
    generations: int
    best_member: int
    best_score: float
    best_run_dir: str
    time_s: float


@dataclasses.dataclass
class PBTSettings:
    """Everything that defines a population; saved in population.json, so ``--resume`` needs only the directory."""

    algo: str
    env: str
    members: int = 8
    """members trained side by side"""
    period: int = 20_000
    """env steps each member trains between two rankings"""
    generations: int = 10
    """periods in all; the last one ends with a ranking and no copies"""
    seed: int = 0
    """member k trains with seed + k; the controller's choices use seed"""
    space: dict[str, str] = dataclasses.field(default_factory=dict)
    """hyperparameter -> ``KIND:LOW:HIGH`` (empty: every mutable hyperparameter of the algorithm that changes training
    in the members' configuration, whole range)"""
    quantile: float = 0.25
    """the bottom fraction copies the top fraction (at least one member each)"""
    resample_probability: float = 0.25
    """chance that an explored hyperparameter is drawn afresh instead of perturbed"""
    copy_buffer: bool = True
    """whether a copy takes its parent's replay buffer too (off-policy algorithms; a large buffer costs memory)"""
    resources: str = ""
    """each member's Ray resources, ``cpu=1,gpu=0.25`` (empty: the cluster's CPUs shared evenly, at most one each)"""
    max_restarts: int = 3
    """times a member whose process died is restarted from its checkpoint before the population gives up"""
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """config fields every member trains with (``num_envs``, ``hidden`` ...)"""
    period_s: float | None = None
    """seconds of its own training time each member trains between two rankings, instead of ``period`` env steps"""

    def validate(self) -> Space:
        """Refuse bad settings in one sentence, before any member starts; returns the parsed search space."""
        for name, low in (("members", 2), ("period", 1), ("generations", 1), ("max_restarts", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"{name}={getattr(self, name)} is out of range: it must be >= {low}")
        if self.period_s is not None and not 0 < self.period_s < math.inf:  # (inf: a period that never ends)
            raise ConfigError(f"period_s={self.period_s} is out of range: it must be a finite number of seconds > 0")
        if not 0 < self.quantile <= 0.5:
            raise ConfigError(f"quantile={self.quantile} is out of range: it must be in (0, 0.5]")
        if not 0 <= self.resample_probability <= 1:
            raise ConfigError(f"resample_probability={self.resample_probability} is out of range: it must be in [0, 1]")
        Resources.parse(self.resources)
        config = make_config(**self.member_settings(0, Path(".")))
        spec = check_fits([config])
        return parse_space(ALGOS[self.algo].agent_cls, self.space, fixed=self.settings, config=config, spec=spec)

    def member_settings(self, k: int, pop_dir: Path) -> dict[str, Any]:
        """Config fields of member ``k``: its seed and run directory, evaluations at period ends (a run evaluates and
        checkpoints whenever it stops)."""
        every = self.period if self.period_s is None else UNBOUNDED
        total = self.period * self.generations if self.period_s is None else self.settings.get("total_steps", UNBOUNDED)
        settings = {"eval_every": every, "checkpoint_every": every, **self.settings}
        return {**settings, "algo": self.algo, "env": self.env, "seed": self.seed + k, "total_steps": total,
                "run_dir": str(member_dir(pop_dir, k))}

    def target(self, generation: int) -> tuple[str, float]:
        """What members train to by the end of ``generation``: ``("steps", env steps)`` or ``("time_s", seconds)``."""
        if self.period_s is None:
            return "steps", (generation + 1) * self.period
        return "time_s", (generation + 1) * self.period_s


def check_fits(configs: Sequence[Config]) -> EnvSpec:
    """Refuse in one sentence, before any member starts, an env that does not exist, an algorithm of ``configs``
    (members' configs of one env) that cannot train on it, or a game of opposing teams (simple_tag's predators and
    prey), whose summed return, which ranks the members, does not rank policies; returns the env's description."""
    env = make_env(configs[0].env, 1, "cpu")
    try:
        teams = ", ".join(dict.fromkeys(env.spec.teams))
        if len(set(env.spec.teams)) > 1:
            raise ConfigError(f"{configs[0].env} is a game of opposing teams ({teams}), whose summed return does not "
                              "rank policies, and a population ranks its members by it; train such a game with "
                              "`jaderl train`")
        for config in configs:
            check_spec(config, ALGOS[config.algo].agent_cls, env.spec)
        return env.spec
    finally:
        env.close()


Progress = Callable[[dict[str, Any]], None]


def pbt(algo: str, env: str, *, members: int = 8, period: int = 20_000, generations: int = 10, seed: int = 0,
        run_dir: str | None = None, space: list[str] | dict[str, str] | None = None, quantile: float = 0.25,
        resample_probability: float = 0.25, copy_buffer: bool = True, resources: str = "",
        address: str | None = None, num_cpus: int | None = None, max_restarts: int = 3, period_s: float | None = None,
        progress: Progress | None = None, **settings: Any) -> PBTResult:
    """Train a population of ``members`` agents of ``algo`` on ``env`` with PBT (see the module docstring) in a new
    population directory ``run_dir``; ``settings`` are config fields for every member. With no ``address`` (and
    no ``RAY_ADDRESS``) a local Ray with ``num_cpus`` (default: this machine's) runs it. With ``period_s``, a period is
    that many seconds of each member's own training time instead of ``period`` env steps. ``progress`` is called
    after every generation with ``generation``, ``generations``, the members' ``scores``, ``best_score``, each
    member's ``parents`` for the next generation, ``copies`` (members that copied another), ``exploit_s`` (seconds
    the driver spent on those copies; they run side by side) and ``time_s`` (since the start)."""
    config = PBTSettings(algo, env, members, period, generations, seed, space_entries(space), quantile,
                         resample_probability, copy_buffer, resources, max_restarts, settings, period_s)
    check_not_fixed(config.space, settings)
    if period_s is None and "total_steps" in settings:  # (member_settings would replace it without a word)
        raise ConfigError(f"total_steps={settings['total_steps']!r} cannot be given to a population: each member "
                          f"trains period * generations = {period * generations} env steps; drop it, or set --period "
                          "and --generations")
    parsed = config.validate()
    pop_dir = population_dir(run_dir, "pbt", algo, env, seed)  # a file or a directory in use: refused before Ray
    with connected(address, num_cpus) as ray:  # an address that does not answer, or too few resources: no directory
        options = Resources.parse(resources).options(members, ray.cluster_resources())
        pop_dir = new_population_dir(str(pop_dir), "pbt", algo, env, seed)  # (checked again: filled meanwhile?)
        rng = random.Random(seed)
        state = {"format": FORMAT, "settings": dataclasses.asdict(config), "generation": 0,
                 "members": [{"parent": k, "hyperparameters": sample(parsed, rng)} for k in range(members)]}
        state["rng"] = _rng_to_json(rng)
        with driven(pop_dir):
            write_json(pop_dir / STATE_JSON, state)
            return _Controller(pop_dir, config, parsed, state).run(ray, options, progress)


def resume_pbt(pop_dir: str | Path, *, generations: int | None = None, address: str | None = None,
               num_cpus: int | None = None, resources: str | None = None,
               progress: Progress | None = None) -> PBTResult:
    """Continue the population in ``pop_dir`` from its last committed generation (members from their checkpoints);
    ``generations`` may raise the number of generations, ``resources`` give members other resources (another
    cluster)."""
    pop_dir = Path(pop_dir).absolute()  # (members' run directories, in processes with another working directory)
    read_state(pop_dir)  # (a directory that holds no population: refused before anything is written into it)
    with driven(pop_dir):  # (another driver of it: refused before Ray starts)
        return _resume_pbt(pop_dir, generations, address, num_cpus, resources, progress)


def _resume_pbt(pop_dir: Path, generations: int | None, address: str | None, num_cpus: int | None,
                resources: str | None, progress: Progress | None) -> PBTResult:
    state = read_state(pop_dir)
    if state.get("format") != FORMAT:
        raise ConfigError(f"{pop_dir} holds a population of format {state.get('format')}; this jaderl reads format "
                          f"{FORMAT}")
    config = PBTSettings(**state["settings"])
    if generations is not None:
        config.generations = generations
        state["settings"]["generations"] = generations
    if resources is not None:
        config.resources = resources
        state["settings"]["resources"] = resources
    parsed = config.validate()
    ranked = state.get("ranked")
    if (state["generation"] == config.generations and state.get("best_generation") != state["generation"]
            and ranked is not None and ranked["generation"] == state["generation"] - 1):
        # the driver stopped after committing the last generation, before copying its best member: copy it now
        return _copy_best(pop_dir, state, ranked["scores"], 0.0)
    if state["generation"] >= config.generations:
        raise ConfigError(f"{pop_dir} already finished {state['generation']} generations; resume with --generations "
                          f"larger than {state['generation']} to train on")
    for k in range(config.members):  # a checkpoint that cannot be read fails every start: refused before any
        if damage := damaged_checkpoint(member_dir(pop_dir, k)):
            raise ConfigError(damaged_message(pop_dir, k, *damage))
    with connected(address, num_cpus) as ray:
        options = Resources.parse(config.resources).options(config.members, ray.cluster_resources())
        return _Controller(pop_dir, config, parsed, state).run(ray, options, progress)


def _copy_best(pop_dir: Path, state: dict[str, Any], scores: list[float], time_s: float) -> PBTResult:
    """Copy the best-scoring member of the last generation to POP_DIR/best and record in the saved state that the
    copy is that of this generation (a resume of a finished population whose copy is missing or older makes it)."""
    best = max(range(len(scores)), key=lambda k: scores[k])
    best_dir = pop_dir / "best"
    copy_run(member_dir(pop_dir, best), best_dir)
    write_json(pop_dir / STATE_JSON, {**state, "best_generation": state["generation"]})
    return PBTResult(str(pop_dir), state["generation"], best, scores[best], str(best_dir), time_s)


class _Controller:
    """Drives the members of one population through its generations (see the module docstring)."""

    def __init__(self, pop_dir: Path, config: PBTSettings, space: Space, state: dict[str, Any]) -> None:
        self.pop_dir, self.config, self.space, self.state = pop_dir, config, space, state
        self.rng = _rng_from_json(state["rng"])
        self.actors: list[Any] = []
        self.standby_cls: Any = None
        self.standby: Any = None
        self.restarts = [0] * config.members
        self.plotted_at = time.perf_counter()  # the first drawing 30 s in (a short population draws only at its end)

    def run(self, ray: Any, options: dict[str, float], progress: Progress | None) -> PBTResult:
        """Train the remaining generations on ``ray`` with members holding ``options``; copy the best member."""
        start = time.perf_counter()
        self.ray, self.actor_cls = ray, remote_member(ray, options)
        try:
            self.actors = [self._start(k) for k in range(self.config.members)]
            for k in range(self.config.members):  # every member is up before the standby takes a worker and CPU
                self._describe(k)
            if not options.get("num_gpus") and self._spare_cpus(options) >= 1:
                self.standby_cls = remote_standby(ray)
            self._new_standby()
            scores = self._generations(progress, start)
            closing = [actor.close.remote() for actor in self.actors]  # each draws its curve while this draws theirs
            plot_population(self.pop_dir, f"PBT: {self.config.algo} on {self.config.env}, {self.config.members} "
                                          "members")
            ray.get(closing)
        finally:  # Ctrl-C or an error: no actor outlives the population; the checkpoints stay
            for actor in [*self.actors, self.standby]:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
        return _copy_best(self.pop_dir, self.state, scores, round(time.perf_counter() - start, 3))

    def _start(self, k: int) -> Any:
        """Member ``k`` from its checkpoint, or afresh with its sampled hyperparameters when it has none yet."""
        settings = self.config.member_settings(k, self.pop_dir)
        return self.actor_cls.remote(settings, self.state["members"][k]["hyperparameters"])

    def _describe(self, k: int) -> dict[str, Any]:
        """Member ``k``'s description, restarting it if its process is gone."""
        while True:
            try:
                return dict(self.ray.get(self.actors[k].describe.remote()))
            except process_gone(self.ray) as exc:
                self._restart(k, exc)

    def _restart(self, k: int, exc: BaseException) -> None:
        """Start member ``k`` again from its last checkpoint, or give up in one sentence after ``max_restarts``."""
        if damage := damaged_checkpoint(member_dir(self.pop_dir, k)):  # (not its process) every start would fail
            raise PopulationError(damaged_message(self.pop_dir, k, *damage))
        self.restarts[k] += 1
        if self.restarts[k] > self.config.max_restarts:
            cause = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
            raise PopulationError(f"member {k} died {self.restarts[k]} times (last: {cause}); its run directory "
                                  f"{member_dir(self.pop_dir, k)} keeps its last checkpoint, and "
                                  f"`jaderl pbt --resume {self.pop_dir}` continues the population")
        self.ray.kill(self.actors[k], no_restart=True)
        self.actors[k] = self._take_standby(k) or self._start(k)

    def _spare_cpus(self, options: dict[str, float]) -> float:
        """CPUs of the cluster that no member holds (nor anything else, as far as Ray has reported). A standby
        starts only on a whole spare CPU: importing torch takes it a few CPU-seconds, which would otherwise come out
        of the members' training; on a cluster that members fill, a dead member restarts in a new process on the
        CPUs it held."""
        ray = self.ray
        unheld = ray.cluster_resources().get("CPU", 0.0) - self.config.members * options.get("num_cpus", 1.0)
        return min(unheld, ray.available_resources().get("CPU", 0.0))

    def _new_standby(self) -> None:
        """Start a standby process in the background (CPU-only members), for the next member that dies."""
        self.standby = None if self.standby_cls is None else self.standby_cls.remote()

    def _take_standby(self, k: int) -> Any:
        """The standby turned into member ``k`` (from its checkpoint), or None when there is none or it failed to
        become the member (the member then starts in a new process, which reports why if it fails too)."""
        standby = self.standby
        if standby is None:
            return None
        self._new_standby()
        settings = self.config.member_settings(k, self.pop_dir)
        try:
            self.ray.get(standby.start.remote(settings, self.state["members"][k]["hyperparameters"]))
        except (*process_gone(self.ray), self.ray.exceptions.RayTaskError):
            self.ray.kill(standby, no_restart=True)
            return None
        return standby

    def _train_all(self, generation: int) -> list[dict[str, Any]]:
        """Every member trains to the end of ``generation`` side by side; dead members are restarted and train
        again."""
        ray = self.ray
        kind, target = self.config.target(generation)
        pending = {self.actors[k].train_until.remote(**{kind: target}): k for k in range(self.config.members)}
        results: list[dict[str, Any]] = [{}] * self.config.members
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(ref)
            try:
                results[k] = ray.get(ref)
            except process_gone(ray) as exc:  # its process died: continue from its last checkpoint
                self._restart(k, exc)
                pending[self.actors[k].train_until.remote(**{kind: target})] = k
            except ray.exceptions.RayTaskError as exc:
                if not isinstance(exc.cause, TrainingError):  # NaN: a copy of a top member replaces it
                    first = (str(exc.cause).strip().splitlines() or [type(exc.cause).__name__])[0]
                    raise PopulationError(f"member {k} failed: {first}") from None
                results[k] = {"steps": self._describe(k)["steps"], "score": -math.inf, "stop_reason": "diverged"}
        return results

    def _generations(self, progress: Progress | None, start: float) -> list[float]:
        config, state = self.config, self.state
        first = state["generation"]
        pending = state.pop("pending", None)  # the copies of generation `first`, if the driver died during them
        ranked = state.pop("ranked", None)
        if ranked is not None and ranked["generation"] == first - 1 and pending is None:
            # a population that had ended, trained on (--generations): its last generation, ranked and not copied
            # then, makes the copies that a population of this many generations made there (the same random state)
            first -= 1
            parents, explored = self._plan(ranked["scores"], ranked["hyperparameters"])
            pending = {"scores": ranked["scores"], "parents": parents, "explored": explored,
                       "hyperparameters": ranked["hyperparameters"], "rng": _rng_to_json(self.rng)}
        rows = [r for r in read_rows(self.pop_dir)
                if int(r["generation"]) < first or (pending is not None and int(r["generation"]) == first)]
        write_rows(self.pop_dir, rows)  # rows of a generation the driver did not commit are trained again
        scores: list[float] = []
        for g in range(first, config.generations):
            if pending is not None:  # ranked and planned already: the same copies again (copying is idempotent)
                scores, parents, values = pending["scores"], pending["parents"], pending["hyperparameters"]
                explored = {int(k): v for k, v in pending["explored"].items()}
                self.rng, pending = _rng_from_json(pending["rng"]), None
            else:
                results = self._train_all(g)
                scores = [r["score"] for r in results]
                infos = [self._describe(k) for k in range(config.members)]
                values = [{n: info["hyperparameters"][n] for n in self.space} for info in infos]
                for k in range(config.members):
                    rows.append(csv_row(g, k, state["members"][k]["parent"], results[k]["steps"], scores[k],
                                        values[k], infos[k]["node"]))
                write_rows(self.pop_dir, rows)
                parents, explored = list(range(config.members)), {}
                if g + 1 < config.generations:
                    parents, explored = self._plan(scores, [info["hyperparameters"] for info in infos])
                    # the plan is saved before any copy: a driver that dies during them redoes these copies
                    write_json(self.pop_dir / STATE_JSON, {**state, "pending": {
                        "scores": scores, "parents": parents, "explored": explored, "hyperparameters": values,
                        "rng": _rng_to_json(self.rng)}})
            exploit_start = time.perf_counter()
            self._copy(parents, explored)
            exploit_s = time.perf_counter() - exploit_start
            state["members"] = [{"parent": parents[k], "hyperparameters": explored.get(k, values[k])}
                                for k in range(config.members)]
            state["generation"], state["rng"] = g + 1, _rng_to_json(self.rng)
            if not explored:  # the last generation: ranked, not copied (a resume with more generations copies it)
                state["ranked"] = {"generation": g, "scores": scores, "hyperparameters": values}
            write_json(self.pop_dir / STATE_JSON, state)  # the generation is committed
            if g + 1 < config.generations and time.perf_counter() - self.plotted_at >= PLOT_EVERY_S:
                plot_population(self.pop_dir, f"PBT: {config.algo} on {config.env}, {config.members} members")
                self.plotted_at = time.perf_counter()
            if progress is not None:
                progress({"generation": g + 1, "generations": config.generations, "scores": scores,
                          "best_score": max(scores), "parents": parents, "copies": len(explored),
                          "exploit_s": exploit_s, "time_s": time.perf_counter() - start})
        if not scores:  # nothing left to train: the last generation's scores
            scores = [float(r["score"]) for r in rows if int(r["generation"]) == config.generations - 1]
        return scores

    def _plan(self, scores: list[float], hyperparameters: list[dict[str, float]]
              ) -> tuple[list[int], dict[int, dict[str, float]]]:
        """Who copies whom: each member's parent for the next generation (itself if it does not copy) and the
        explored hyperparameters of the members that copy (the bottom quantile, a random member of the top each)."""
        config = self.config
        top, bottom = split_by_score(scores, config.quantile)
        parents = list(range(config.members))
        explored: dict[int, dict[str, float]] = {}
        for k in bottom:
            parents[k] = self.rng.choice(top)
            explored[k] = explore(self.space, hyperparameters[parents[k]], self.rng, config.resample_probability)
        return parents, explored

    def _copy(self, parents: list[int], explored: dict[int, dict[str, float]]) -> None:
        """Each member in ``explored`` takes its parent's state (through the object store) and its new
        hyperparameters, side by side; a child or parent that dies meanwhile is restarted and the copy made again.
        A parent's state goes into the object store once, for all of its children (again only after the parent's
        process died and it was restarted)."""
        config, ray = self.config, self.ray
        states: dict[int, tuple[Any, Any]] = {}  # parent -> (the actor that gave its state, the state's ref)

        def state_of(parent: int) -> Any:
            actor = self.actors[parent]
            if parent not in states or states[parent][0] is not actor:  # (a restarted parent gives its state anew)
                states[parent] = actor, actor.state.remote(config.copy_buffer)  # stays in the object store
            return states[parent][1]

        pending = {self.actors[k].exploit.remote(state_of(parents[k]), values): k for k, values in explored.items()}
        for ref, k in pending.items():
            while True:
                try:
                    ray.get(ref)
                    break
                except process_gone(ray):  # the child or its parent died: restart whichever did, copy again
                    self._describe(parents[k])  # (a parent restarts from the checkpoint it ended its period with)
                    self._describe(k)
                    ref = self.actors[k].exploit.remote(state_of(parents[k]), explored[k])


def member_dir(pop_dir: Path, k: int) -> Path:
    """Member ``k``'s run directory."""
    return pop_dir / "members" / f"m{k:02d}"


def damaged_message(pop_dir: Path, k: int, path: Path, reason: str) -> str:
    """One sentence for member ``k`` whose checkpoint file ``path`` cannot be read: what the user can do about it (a
    member without a checkpoint starts afresh, with the hyperparameters population.json records for it)."""
    return (f"member {k}'s checkpoint {path} is damaged ({reason}), so member {k} cannot continue from it; restore "
            f"{member_dir(pop_dir, k)} from a copy, or delete that directory to start member {k} again from step 0 "
            f"with its recorded hyperparameters, then run `jaderl pbt --resume {pop_dir}`")


def split_by_score(scores: list[float], quantile: float) -> tuple[list[int], list[int]]:
    """The members that may be copied (the top ``quantile`` by score, best first, diverged members left out) and the
    members that copy one of them (the bottom ``quantile`` and every diverged member, whose score is -inf or NaN)."""
    ranked = sorted(range(len(scores)), key=lambda k: -math.inf if math.isnan(scores[k]) else scores[k],
                    reverse=True)
    cut = max(1, int(len(scores) * quantile))
    top = [k for k in ranked if math.isfinite(scores[k])][:cut]
    if not top:
        raise PopulationError("every member diverged (NaN or infinite parameters) in the same generation; narrow the "
                              "search space towards smaller learning rates")
    return top, [k for k in ranked if k not in top and (k in ranked[-cut:] or not math.isfinite(scores[k]))]


def _rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_json(data: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng
