"""The ``jaderl`` command: train, resume, evaluate, and list algorithms and envs (a thin shell over jaderl.api).

Exit codes: 0 done; 1 training failed (a loss became NaN, out of memory, a full disk); 2 a usage, config, env or
run-directory problem, said in one line on stderr; 130 stopped by Ctrl-C (a run that saved its final checkpoint
still prints its summary); 141 stdout was closed early (``jaderl algos | head -n 1``): the rest of the output is
dropped without a message, and 141 = 128 + SIGPIPE is what a shell reports for a program a closed pipe ended.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import decimal
import errno
import inspect
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import yaml

import jaderl
from jaderl import api
from jaderl.core.checkpoint import CHECKPOINT_JSON
from jaderl.core.config import Config, ConfigError, parse_assignment
from jaderl.core.loop import TrainingError, TrainResult
from jaderl.envs.vec import EnvError
from jaderl.interrupts import sigterm_as_ctrl_c

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def whole_number(text: str) -> int:
    """An integer flag's value: digits, or any number that is whole, written as a float (``1e5``, ``6.4e1``)."""
    try:
        value = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        value = decimal.Decimal("NaN")
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; write one such as 100000 or 1e5")
    if value.adjusted() > 18 or abs(value) >= 2**63:  # (adjusted: the exponent, read before any arithmetic)
        raise argparse.ArgumentTypeError(f"{text} is out of range; write a whole number of at most 18 digits")
    return int(value)


# flag -> config field, for the flags that set one
TRAIN_FLAGS = {"seed": whole_number, "num_envs": whole_number, "total_steps": whole_number, "target_return": float,
               "time_limit": float, "device": str, "run_dir": str, "eval_every": whole_number,
               "eval_episodes": whole_number, "checkpoint_every": whole_number, "workers": whole_number,
               "learners": whole_number, "record_every": whole_number}


class _Parser(argparse.ArgumentParser):
    """jaderl's parsers: whole flags only (``--total`` is not taken for ``--total-steps``), errors in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})

    def error(self, message: str) -> NoReturn:
        _fail(f"{message} (see `{self.prog} --help`)")


def _fail(message: str) -> NoReturn:
    print(f"jaderl: error: {message}", file=sys.stderr)
    sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaderl", description="Massively parallel deep reinforcement learning.")
    parser.add_argument("--version", action="version", version=f"jaderl {jaderl.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train an agent (or resume a run with --resume RUN_DIR)")
    train.add_argument("algo", nargs="?", help="algorithm name (`jaderl algos`)")
    train.add_argument("env", nargs="?", help="env id (`jaderl envs`) or any Gymnasium id")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    for flag, kind in TRAIN_FLAGS.items():
        help_text = Config.__dataclass_fields__[flag].metadata["help"]
        train.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=kind, help=help_text)
    train.add_argument("--config", metavar="FILE.yaml", help="read config fields from a YAML file; a run's own "
                       "config.yaml starts a new run in a directory of its own (its run_dir says where that run is)")
    train.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                       help="set any config field, e.g. --set lr=0.001 --set hidden=[64,64]")
    train.add_argument("--no-zoo", dest="zoo", action="store_false", default=None,
                       help="train with the algorithm's defaults, not the zoo's tuned settings for this env")
    train.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line")
    evaluate = sub.add_parser("eval", help="evaluate the best policy of a run (its last state for a game between "
                              "teams, whose runs keep no best policy)")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--episodes", type=whole_number, default=10)
    evaluate.add_argument("--device", default="cpu")
    evaluate.add_argument("--last", action="store_true", help="evaluate the last checkpoint's policy, not the best")
    evaluate.add_argument("--json", action="store_true")
    backtest = sub.add_parser("backtest", help="backtest the best policy of a jaderl/StockTrading-v0 run against "
                              "buy-and-hold on the dates after its split")
    backtest.add_argument("run_dir")
    backtest.add_argument("--device", default="cpu")
    backtest.add_argument("--json", action="store_true", help="print the report, with the value on every date, as JSON")
    export = sub.add_parser("export", help="write the best policy of a run as one ONNX or TorchScript file that "
                            "maps raw observations to actions (docs/deploy.md)")
    export.add_argument("run_dir")
    export.add_argument("--format", required=True, choices=["onnx", "torchscript"])
    export.add_argument("--out", metavar="FILE", help="the file to write (default: RUN_DIR/policy.onnx or policy.pt)")
    export.add_argument("--last", action="store_true", help="export the policy of the last checkpoint, not the best")
    record = sub.add_parser("record", help="write MP4 videos of the best policy of a run acting deterministically")
    record.add_argument("run_dir")
    record.add_argument("--episodes", type=whole_number, default=3, help="videos to write, one per episode")
    record.add_argument("--out", metavar="DIR", help="the directory to write them to (default: RUN_DIR/videos)")
    record.add_argument("--seed", type=whole_number, default=0, help="episode i starts from reset(seed=SEED + i)")
    _add_population_parsers(sub)
    sub.add_parser("algos", help="list the algorithms")
    sub.add_parser("envs", help="list the built-in envs")
    return parser


def _add_shared_population_flags(parser: argparse.ArgumentParser) -> None:
    """The flags ``jaderl pbt`` and ``jaderl tournament`` share."""
    parser.add_argument("--seed", type=whole_number, default=0, help="member k trains with seed + k")
    parser.add_argument("--run-dir", metavar="POP_DIR", help="the population directory (default: under runs/)")
    parser.add_argument("--space", metavar="NAME=KIND:LOW:HIGH", action="append", default=[],
                        help="search this hyperparameter (loguniform, uniform or choice), e.g. "
                             "lr=loguniform:1e-4:1e-2; default: every mutable hyperparameter over its valid range")
    parser.add_argument("--address", help="join the Ray cluster at this address (default: RAY_ADDRESS, else a local "
                        "Ray sized to this machine)")
    parser.add_argument("--resources-per-member", dest="resources", metavar="cpu=1,gpu=0.25",
                        help="Ray resources each member holds (fractions allowed; default: the CPUs shared evenly)")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                        help="set a config field of every member, e.g. --set num_envs=8 --set hidden=[64,64]")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line")


def _add_population_parsers(sub: Any) -> None:
    """``jaderl pbt``, ``jaderl tournament`` and ``jaderl fuse`` (docs/population.md)."""
    pbt = sub.add_parser("pbt", help="population-based training on Ray (or continue one with --resume POP_DIR)")
    pbt.add_argument("algo", nargs="?", help="algorithm name (`jaderl algos`)")
    pbt.add_argument("env", nargs="?", help="env id (`jaderl envs`) or any Gymnasium id")
    pbt.add_argument("--resume", metavar="POP_DIR", help="continue the population in POP_DIR from its last generation")
    pbt.add_argument("--members", type=whole_number, help="members trained side by side (default 8)")
    pbt.add_argument("--period", type=whole_number,
                     help="env steps each member trains between rankings (default 20000)")
    pbt.add_argument("--period-seconds", dest="period_s", type=float,
                     help="a period is this many seconds of each member's training time instead of --period steps")
    pbt.add_argument("--generations", type=whole_number, help="periods in all (default 10)")
    pbt.add_argument("--quantile", type=float, help="the bottom fraction copies the top one (0.25)")
    pbt.add_argument("--resample-probability", type=float,
                     help="chance that a copied member's hyperparameter is drawn afresh instead of perturbed (0.25)")
    pbt.add_argument("--no-copy-buffer", dest="copy_buffer", action="store_const", const=False,
                     help="a copy keeps its own replay buffer instead of taking its parent's")
    _add_shared_population_flags(pbt)
    pbt.set_defaults(seed=None)  # unset flags: the defaults of a new population, refused with --resume
    tour = sub.add_parser("tournament", help="tournament-based ensemble training on Ray: an asynchronous pool of "
                          "members and a leaderboard (or continue one with --resume POP_DIR)")
    tour.add_argument("algo", nargs="?", help="algorithm name, or several joined by commas (ppo,a2c)")
    tour.add_argument("env", nargs="?", help="env id (`jaderl envs`) or any Gymnasium id")
    tour.add_argument("--resume", metavar="POP_DIR",
                      help="continue the tournament in POP_DIR: the rounds that had not finished start again")
    tour.add_argument("--pool", type=whole_number, help="members training at a time (default 4)")
    tour.add_argument("--period", type=whole_number,
                      help="env steps a member trains before the leaderboard judges it (default 20000)")
    tour.add_argument("--rounds", type=whole_number, help="member periods in all (default 40)")
    tour.add_argument("--leaderboard-size", type=whole_number, help="entries kept (default 5)")
    tour.add_argument("--fuse-top", type=whole_number,
                      help="entries a fused member averages, at most --leaderboard-size (default 3, or the leaderboard "
                      "size if smaller)")
    tour.add_argument("--strategy-weights", metavar="BEST,FUSE,FRESH",
                      help="how often a new member copies the best entry, fuses the top ones or starts afresh "
                      "(default 0.5,0.25,0.25)")
    _add_shared_population_flags(tour)
    tour.set_defaults(seed=None)  # unset flags: the defaults of a new tournament, refused with --resume
    fuse = sub.add_parser("fuse", help="fuse finished runs of one algorithm and env into one run by averaging their "
                          "parameters and optimizer states")
    fuse.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    fuse.add_argument("--out", required=True, metavar="DIR", help="the new run directory to write")
    fuse.add_argument("--json", action="store_true", help="print the result as one JSON object")


_FLAG_NAMES = {"algo": "ALGO", "algos": "ALGO", "env": "ENV", "period_s": "--period-seconds",
              "resources": "--resources-per-member", "copy_buffer": "--no-copy-buffer"}
"""The command-line names of the arguments whose flag is not ``--`` and their name with dashes."""


def _refuse_own_arguments(args: argparse.Namespace, function: Any, settings: dict[str, Any], source: str) -> None:
    """Refuse in one sentence a key of ``settings`` (config fields, passed on as keywords to ``function``) that names
    one of ``function``'s own arguments (``progress``, or ``seed`` and ``members`` of a population): those are the
    command's to set."""
    own = [name for name, p in inspect.signature(function).parameters.items()
           if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    clash = next((key for key in settings if key in own), None)
    if clash is None:
        return
    flag = _FLAG_NAMES.get(clash, f"--{clash.replace('_', '-')}")
    fix = f"give it as {flag}" if clash in vars(args) or clash == "algos" else "drop it"
    _fail(f"{clash}={settings[clash]!r} cannot be given with {source}: `jaderl {args.command}` sets {clash} itself; "
          f"{fix}")


def _member_settings(args: argparse.Namespace, function: Any) -> dict[str, Any]:
    """The config fields of ``--set`` that ``jaderl pbt`` or ``jaderl tournament`` gives every member."""
    settings = dict(parse_assignment(text) for text in args.overrides)
    _refuse_own_arguments(args, function, settings, "--set")
    return settings


def _or_default(value: Any, default: Any) -> Any:
    """A flag's value, or ``default`` when it was not given (flags that ``--resume`` refuses default to None)."""
    return default if value is None else value


def _pbt(args: argparse.Namespace) -> Any:
    from jaderl.population import pbt, resume_pbt

    def progress(info: dict[str, Any]) -> None:
        scores = " ".join(f"{s:.1f}" for s in info["scores"])
        copied = f" | {info['copies']} copied in {info['exploit_s']:.1f} s" if info["copies"] else ""
        print(f"generation {info['generation']}/{info['generations']} | best {info['best_score']:.2f} | "
              f"scores {scores}{copied} | {info['time_s']:.1f} s", file=sys.stderr, flush=True)

    if args.resume is not None:
        if args.algo or args.env or args.overrides or args.space:
            _fail("--resume takes the population's settings from POP_DIR; drop ALGO, ENV, --space and --set")
        fixed = {"--members": args.members, "--period": args.period, "--period-seconds": args.period_s,
                 "--quantile": args.quantile, "--resample-probability": args.resample_probability,
                 "--no-copy-buffer": args.copy_buffer, "--seed": args.seed, "--run-dir": args.run_dir}
        if given := [flag for flag, value in fixed.items() if value is not None]:
            _fail(f"--resume takes the population's settings from POP_DIR; drop {', '.join(given)} (only "
                  "--generations, --resources-per-member and --address may change)")
        return resume_pbt(args.resume, generations=args.generations, address=args.address,
                          resources=args.resources, progress=progress)
    if not (args.algo and args.env):
        _fail("pbt needs ALGO and ENV, e.g. `jaderl pbt ppo jaderl/CartPole-v1`, or --resume POP_DIR")
    settings = _member_settings(args, pbt)
    given = _or_default
    return pbt(args.algo, args.env, members=given(args.members, 8), period=given(args.period, 20_000),
               generations=given(args.generations, 10), seed=given(args.seed, 0), run_dir=args.run_dir,
               space=args.space, quantile=given(args.quantile, 0.25),
               resample_probability=given(args.resample_probability, 0.25), copy_buffer=given(args.copy_buffer, True),
               resources=given(args.resources, ""), address=args.address, period_s=args.period_s, progress=progress,
               **settings)


def _tournament(args: argparse.Namespace) -> Any:
    from jaderl.population import resume_tournament, tournament

    def progress(info: dict[str, Any]) -> None:
        print(f"{info['finished']}/{info['rounds']} | {info['member']} ({info['origin']}) scored {info['score']:.2f} "
              f"| {info['time_s']:.1f} s", file=sys.stderr, flush=True)

    if args.resume is not None:
        if args.algo or args.env or args.overrides or args.space:
            _fail("--resume takes the tournament's settings from POP_DIR; drop ALGO, ENV, --space and --set")
        fixed = {"--period": args.period, "--leaderboard-size": args.leaderboard_size, "--fuse-top": args.fuse_top,
                 "--strategy-weights": args.strategy_weights, "--seed": args.seed, "--run-dir": args.run_dir}
        if given := [flag for flag, value in fixed.items() if value is not None]:
            _fail(f"--resume takes the tournament's settings from POP_DIR; drop {', '.join(given)} (only --rounds, "
                  "--pool, --resources-per-member and --address may change)")
        return resume_tournament(args.resume, rounds=args.rounds, pool=args.pool, resources=args.resources,
                                 address=args.address, progress=progress)
    if not (args.algo and args.env):
        _fail("tournament needs ALGO and ENV, e.g. `jaderl tournament ppo,a2c jaderl/CartPole-v1`, or --resume "
              "POP_DIR")
    weights_text = _or_default(args.strategy_weights, "0.5,0.25,0.25")
    try:
        weights = tuple(float(w) for w in weights_text.split(","))
    except ValueError:
        _fail(f"--strategy-weights {weights_text!r} is not three numbers such as 0.5,0.25,0.25")
    settings = _member_settings(args, tournament)
    given = _or_default
    return tournament(args.algo.split(","), args.env, pool=given(args.pool, 4), period=given(args.period, 20_000),
                      rounds=given(args.rounds, 40), leaderboard_size=given(args.leaderboard_size, 5),
                      fuse_top=args.fuse_top, strategy_weights=weights, seed=given(args.seed, 0),
                      run_dir=args.run_dir, space=args.space, resources=given(args.resources, ""), address=args.address,
                      progress=progress, **settings)


class ProgressPrinter:
    """A live progress line on a terminal; one line per new evaluation otherwise (always on stderr)."""

    def __init__(self, header: str = "") -> None:
        self.live = sys.stderr.isatty()
        self.last_print, self.last_eval = 0.0, math.nan
        self.start, self.start_steps = time.perf_counter(), None
        self.header = header  # printed above the first progress line (so an error before it stays one line)
        self.held: list[str] = []  # warnings given while the header waits, printed below it

    @contextlib.contextmanager
    def warnings_below_header(self) -> Iterator[None]:
        """Hold the warnings the block gives before the header is printed (those about the config it describes)
        until the header is; whatever is still held prints when the block ends (before an error's line)."""
        show = warnings.showwarning

        def hold(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
            if self.header:
                self.held.append(warnings.formatwarning(message, category, filename, lineno, line))
            else:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = hold
        try:
            yield
        finally:
            warnings.showwarning = show
            self._print_held()

    def _print_held(self) -> None:
        """Print the warnings held so far, in the order they were given."""
        for text in self.held:
            print(text, end="", file=sys.stderr, flush=True)
        self.held.clear()

    def __call__(self, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if self.start_steps is None:  # the rate is the run's steps over its training time (resumed runs too)
            self.start, self.start_steps = now - info["time_s"], 0
        new_eval = info["eval_return"] != self.last_eval and not math.isnan(info["eval_return"])
        if not (new_eval or info["done"] or (self.live and now - self.last_print > 0.5)):
            return
        self.last_print, self.last_eval = now, info["eval_return"]
        rate = (info["steps"] - self.start_steps) / max(now - self.start, 1e-9)
        # an evaluator process finishes an evaluation after training went on: say which step it evaluated
        at = f" at step {info['eval_step']:,}" if info.get("eval_step") not in (None, info["steps"]) else ""
        line = (f"steps {info['steps']:>10,} | {rate:>10,.0f} steps/s | eval {info['eval_return']:9.2f}{at} "
                f"(best {info['best_eval_return']:9.2f}) | {info['time_s']:7.1f} s")
        if self.header:
            print(self.header, file=sys.stderr, flush=True)
            self.header = ""
            self._print_held()
        if self.live:
            print(f"\r{line}", end="\n" if info["done"] else "", file=sys.stderr, flush=True)
        elif new_eval or info["done"]:
            print(line, file=sys.stderr, flush=True)


def _config_file(path: str) -> dict[str, Any]:
    """The settings of ``--config path``; a field given twice is refused (YAML keeps the last value without a
    word). A run's own config.yaml (in the run directory it names, or beside a checkpoint) keeps the run's directory
    as ``run_dir``: where that run is, not a setting, so it is left out."""
    settings = Config.read_yaml(path)  # from here on the file is known to hold a mapping
    if (key := next((k for k in settings if not isinstance(k, str)), None)) is not None:  # (`1: 2`: field names only)
        _fail(f"cannot read config file {path}: its key {key!r} is not a field name; write each setting as "
              "field: value, e.g. lr: 0.001")
    lines: dict[str, int] = {}
    for key, _ in yaml.compose(Path(path).read_text(), yaml.SafeLoader).value:
        if key.tag != "tag:yaml.org,2002:merge" and key.value in lines:  # (`<<` merges may be overridden)
            _fail(f"cannot read config file {path}: {key.value!r} is given twice (lines {lines[key.value]} and "
                  f"{key.start_mark.line + 1}); keep one of them")
        lines[key.value] = key.start_mark.line + 1
    saved_in, here = settings.get("run_dir"), Path(path).resolve().parent
    if not isinstance(saved_in, str) or not saved_in:
        return settings
    in_its_run = Path(path).name == "config.yaml" and (here / CHECKPOINT_JSON).exists()
    with contextlib.suppress(OSError, ValueError):  # (a run_dir no path can have is refused later, as the config's)
        if in_its_run or Path(saved_in).resolve() == here:
            del settings["run_dir"]
    return settings


def _train(args: argparse.Namespace) -> TrainResult:
    settings: dict[str, Any] = {}
    if args.config:
        settings.update(_config_file(args.config))
    settings.update({k: getattr(args, k) for k in TRAIN_FLAGS if getattr(args, k) is not None})
    settings.update(dict(parse_assignment(text) for text in args.overrides))
    if args.zoo is False:
        settings["zoo"] = False
    if args.resume:
        if args.algo or args.env:
            _fail("--resume takes its algorithm and env from the run directory; drop ALGO and ENV")
        _refuse_own_arguments(args, api.resume, settings, "--config or --set")
        return api.resume(args.resume, progress=ProgressPrinter(), **settings)
    given = {"algo": args.algo, "env": args.env}
    for key in given:  # a run's own config.yaml names both: they may fill in ALGO and ENV, or must agree with them
        if key in settings:
            value = settings.pop(key)
            if given[key] is None:
                given[key] = value
            elif value != given[key]:
                _fail(f"{key}={value!r} from --config or --set differs from {key.upper()} {given[key]!r} on the "
                      "command line; drop one of them")
    if not (given["algo"] and given["env"]):
        _fail("train needs ALGO and ENV, e.g. `jaderl train ppo jaderl/CartPole-v1`, or --resume RUN_DIR")
    _refuse_own_arguments(args, api.train, settings, "--config or --set")
    named = isinstance(given["algo"], str) and isinstance(given["env"], str)  # (else make_config says what is wrong)
    entry = api.zoo_for(given["algo"], given["env"], settings) if named and given["algo"] in api.ALGOS else None
    left_out = [] if entry is None else entry.left_out(settings)
    used = "" if entry is None else entry.describe(skip=(*settings, *left_out))
    header = "" if entry is None else (
        f"zoo: tuned settings for {given['algo']} on {entry.envs[0]} ({entry.source}): {used}; settings you give win, "
        "--no-zoo leaves them out" if used else f"zoo: every tuned setting of {entry.source} for {given['algo']} on "
        f"{entry.envs[0]} is overridden by yours")
    if entry is not None and left_out:
        yours = [k for k in settings if set(entry.together.get(k, ())) & set(left_out)]
        header += (f"; its {', '.join(left_out)} left out too: {'it goes' if len(left_out) == 1 else 'they go'} with "
                   f"its {', '.join(yours)}, which you set")
    printer = ProgressPrinter(header)
    with printer.warnings_below_header():
        return api.train(given["algo"], given["env"], progress=printer, **settings)


def _json_ready(value: Any) -> Any:
    """``value`` with every non-finite float (no evaluation yet: NaN) as None, which JSON can hold."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


_PACKAGE = str(Path(__file__).resolve().parent)


def main(argv: list[str] | None = None) -> int:
    """The ``jaderl`` command; jaderl's own warnings print as one line (``jaderl: warning: ...``) while it runs."""
    python_format = warnings.formatwarning

    def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 line: str | None = None) -> str:
        if str(Path(filename).resolve()).startswith(_PACKAGE):
            return f"jaderl: warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    try:
        return _main(argv)
    finally:
        warnings.formatwarning = python_format


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from jaderl.parallel.ddp import launched_by_torchrun

    if launched_by_torchrun():  # torchrun ends its learners with SIGTERM (when one fails): they stop at once
        return _command(args)
    with sigterm_as_ctrl_c():  # `kill`, a job scheduler: stop like Ctrl-C, after a last checkpoint
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    code = 0
    try:
        if args.command == "train":
            result = _train(args)
            best = (f"best evaluation {result.best_eval_return:.2f}" if math.isfinite(result.best_eval_return) else
                    "no evaluation yet")  # (stopped before the first one: -inf)
            print(json.dumps(_json_ready(dataclasses.asdict(result))) if args.json else
                  f"{result.stop_reason}: {result.steps:,} steps in {result.time_s:.1f} s, {best}; run directory "
                  f"{result.run_dir}")
            if result.stop_reason == "interrupted":  # Ctrl-C or SIGTERM: the final checkpoint is saved, but the run
                # did not end
                code = EXIT_INTERRUPTED
        elif args.command in ("pbt", "tournament"):
            from jaderl.population import PopulationError

            try:
                result = _pbt(args) if args.command == "pbt" else _tournament(args)
            except PopulationError as exc:
                print(f"jaderl: error: {exc}", file=sys.stderr)
                return 1
            summary = (f"{result.generations} generations in {result.time_s:.1f} s; best member {result.best_member} "
                       f"({result.best_score:.2f}); best run directory {result.best_run_dir}"
                       if args.command == "pbt" else
                       f"{result.rounds} rounds in {result.time_s:.1f} s; best {result.best_score:.2f}; best run "
                       f"directory {result.best_run_dir}")
            print(json.dumps(_json_ready(dataclasses.asdict(result))) if args.json else summary)
        elif args.command == "fuse":
            from jaderl.population import fuse_runs

            report = fuse_runs(args.run_dirs, args.out)
            print(json.dumps(_json_ready(report)) if args.json else
                  f"fused {len(args.run_dirs)} runs into {report['run_dir']}: evaluation {report['eval_return']:.2f}")
        elif args.command == "eval":
            report = api.evaluate(args.run_dir, episodes=args.episodes, device=args.device, best=not args.last)
            teams = "".join(f"; {kind} {value:.2f}" for kind, value in report.get("teams", {}).items())
            agents = (f" (team return; {report['mean_per_agent']:.2f} per agent{teams})" if "mean_per_agent" in report
                      else "")
            print(json.dumps(_json_ready(report)) if args.json else
                  f"{report['mean']:.2f} +- {report['std']:.2f} over {report['episodes']} episodes{agents}, "
                  f"{report['policy']} policy")
        elif args.command == "backtest":
            from jaderl.envs.stock import backtest

            result = backtest(api.load(args.run_dir, device=args.device))
            print(json.dumps(result.to_dict()) if args.json else result.format())
        elif args.command == "export":
            from jaderl.integrations.export import FORMATS, export_policy

            agent = api.load(args.run_dir, best=not args.last)
            print(export_policy(agent, args.format, args.out or os.path.join(args.run_dir, FORMATS[args.format])))
        elif args.command == "record":
            from jaderl.integrations.video import record

            agent = api.load(args.run_dir)
            for path in record(agent, args.out or os.path.join(args.run_dir, "videos"), args.episodes, args.seed):
                print(path)
        elif args.command == "algos":
            from jaderl.algos import action_spaces

            for name, spec in api.ALGOS.items():
                cls = spec.agent_cls
                spaces = "/".join(action_spaces(cls))
                print(f"{name:<12} {spaces:<34} {spec.summary}")
        elif args.command == "envs":
            from jaderl.envs import TORCH_ENVS

            for name, cls in TORCH_ENVS.items():
                print(f"{name:<32} torch-native, batched on CPU or GPU ({(cls.__doc__ or '').splitlines()[0]})")
            print(f"{'any Gymnasium id':<32} e.g. CartPole-v1, Pendulum-v1, HalfCheetah-v5 (stepped in this process)")
            print(f"{'ALE/<Game>-v5':<32} Atari through ale-py, standard preprocessing (pip install jaderl[atari]);"
                  " also <Game>NoFrameskip-v4 and <Game>-v4")
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
    except BrokenPipeError:  # `jaderl algos | head -n 1`: the reader has all it wanted (the recipe of Python's docs)
        with contextlib.suppress(OSError, ValueError):  # (a stdout without a file descriptor has nothing to redirect)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the output still buffered goes nowhere at exit, without an error
            os.close(devnull)
        return EXIT_BROKEN_PIPE
    except (ConfigError, EnvError, FileNotFoundError) as exc:
        if isinstance(exc, FileNotFoundError) and exc.errno is not None:  # the system's, not a sentence of jaderl's
            return _os_error(args, exc)
        _fail(str(exc))
    except TrainingError as exc:
        print(f"jaderl: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a Ctrl-C or SIGTERM outside training's own handling (set-up, a second one while saving)
        trains = args.command in ("train", "pbt", "tournament")  # the others write no checkpoint
        print("jaderl: interrupted" + ("; the last complete checkpoint is kept" if trains else ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:  # a full disk, a lost mount: the checkpoint on disk is the last complete one
        return _os_error(args, exc)
    return code


PATH_ERRNOS = frozenset({errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENOENT, errno.EACCES, errno.EPERM,
                         errno.EROFS, errno.ENAMETOOLONG})
"""Errors of a path the user gave (a file where a directory must be, no permission): input errors, exit status 2."""


def _os_error(args: argparse.Namespace, exc: OSError) -> int:
    """Report an error of the file system in one sentence: what failed, where, and what can be done about it."""
    what = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST) and exc.filename:  # a file stands where a directory must be
        blocking = next((p for p in (Path(exc.filename), *Path(exc.filename).parents) if p.is_file()), None)
        if blocking is not None:
            what = f"{blocking} is a file, not a directory" + (
                "" if blocking == Path(exc.filename) else f", so {exc.filename} cannot be created")
    path_error = exc.errno in PATH_ERRNOS
    if args.command not in ("train", "pbt", "tournament"):  # nothing trained: there is nothing to resume
        fix = "choose another path" if path_error else "free space or fix the path"
        print(f"jaderl: error: {what}; {fix} and run the command again", file=sys.stderr)
        return 2 if path_error else 1
    places = [getattr(args, "resume", None), getattr(args, "run_dir", None),
              exc.filename and Path(exc.filename).parent]  # where a checkpoint may be kept
    if args.command == "train" and not any(p and (Path(p) / CHECKPOINT_JSON).exists() for p in places):
        if path_error:
            print(f"jaderl: error: {what}; choose another path and start the run again", file=sys.stderr)
            return 2
        print(f"jaderl: error: {what}; no checkpoint had been written yet, so there is nothing to resume: free space "
              "or fix the path and start the run again", file=sys.stderr)
        return 1
    print(f"jaderl: error: {what}; the last complete checkpoint is kept: free space or fix the path, then continue "
          "with --resume", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
