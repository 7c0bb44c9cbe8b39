"""Typed run settings: the fields every algorithm shares, validated on construction, saved to and loaded from YAML.

An algorithm adds its own fields by subclassing :class:`Config` (see ``jaderl/algos/``). Every field carries a
docstring-like ``help`` text and, where it has one, the accepted range; a bad value raises :class:`ConfigError`
with one sentence naming the field and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import typing
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config value that is missing, unknown or out of range; the message names the field and the fix."""


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, also reading YAML 1.2 floats without a dot (``1e-3``, ``2E5``) as floats, not strings."""


class _YamlDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting the strings that :class:`_YamlLoader` would read as floats (``run_dir: '1e5'``)."""


yaml.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                           list("-+0123456789"), Loader=_YamlLoader, Dumper=_YamlDumper)


def param(default: Any, help: str, low: float | None = None, high: float | None = None, open_low: bool = False) -> Any:
    """A config field with a help text and an optional accepted range ``[low, high]`` (``(low, high]`` if open_low)."""
    return dataclasses.field(default=default, metadata={"help": help, "low": low, "high": high, "open_low": open_low})


@dataclasses.dataclass
class Config:
    """Settings every algorithm shares."""

    algo: str = param("", "registry name of the algorithm; set by jaderl.api")
    env: str = param("jaderl/Pendulum-v1", "env id: a built-in torch env (`jaderl envs`) or any Gymnasium id")
    zoo: bool = param(True, "start from the zoo's tuned settings for this algorithm and env where it has them "
                      "(jaderl/zoo/; settings given explicitly win)")
    seed: int = param(0, "seed of torch, the envs and the evaluator", low=0)
    num_envs: int = param(1, "sub-envs stepped in one batch", low=1)
    env_workers: int = param(0, "worker processes stepping a Gymnasium env's sub-envs through shared memory "
                             "alongside this one (0: all in this process; torch-native envs ignore it)", low=0)
    horizon: int = param(1, "steps each sub-env takes per explore() call", low=1, high=100_000)
    total_steps: int = param(100_000, "stop after this many env steps (all sub-envs counted)", low=1)
    target_return: float | None = param(None, "stop once an evaluation's mean return reaches this")
    time_limit: float | None = param(None, "stop after this many seconds of training", low=0, open_low=True)
    device: str = param("auto", "auto, cpu, cuda or cuda:N; auto picks cuda when available")
    run_dir: str = param("", "where metrics and checkpoints go; empty picks runs/ALGO-ENV-SEED-TIME")
    gamma: float = param(0.99, "discount factor", low=0.0, high=1.0)
    lr: float = param(3e-4, "learning rate of every optimizer", low=0.0, open_low=True)
    hidden: list[int] = param((256, 256), "hidden layer sizes of every MLP")
    normalize_obs: bool = param(False, "normalise observations by running mean and variance")
    reward_scale: float = param(1.0, "multiply rewards by this before learning (returns are logged unscaled)",
                                low=0.0, open_low=True)
    clip_rewards: bool = param(False, "learn from sign(reward) (default for Atari ids); returns are logged unclipped")
    max_grad_norm: float = param(0.0, "clip gradient norm to this (0 disables)", low=0.0)
    eval_every: int = param(10_000, "evaluate every this many env steps", low=1)
    eval_episodes: int = param(10, "deterministic episodes per evaluation, run as parallel sub-envs", low=1)
    checkpoint_every: int = param(50_000, "checkpoint every this many env steps", low=1)
    record_every: int = param(0, "record an MP4 of the deterministic policy every this many env steps into "
                              "RUN_DIR/videos/step-N/ (0: never; needs the [video] extra)", low=0)
    num_threads: int = param(1, "torch CPU threads; 1 is fastest for small networks", low=1)
    workers: int = param(0, "explorer worker processes feeding one learner, with an evaluator process beside them "
                         "(0: explore, learn and evaluate in this process)", low=0)
    learners: int = param(1, "learner processes averaging their gradients with torch.distributed (DDP)", low=1)
    compile: bool = param(False, "torch.compile the act and update functions (CUDA graphs on GPU); falls back to "
                          "eager mode where compilation is unavailable")
    precision: str = param("float32", "float32, or bfloat16: hidden layers compute in bfloat16 (mixed precision; "
                           "parameters, optimizer state, output layers and losses stay float32)")

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            setattr(self, field.name, _coerce(field.name, value, hints[field.name]))
            _check_range(field, getattr(self, field.name))
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; subclasses extend it (call super)."""
        if self.env_workers > self.num_envs:
            raise ConfigError(f"env_workers={self.env_workers} is more than num_envs={self.num_envs}; "
                              "each worker needs at least one sub-env")
        if self.workers > 0 and self.learners > 1:
            raise ConfigError(f"workers={self.workers} and learners={self.learners} cannot be combined; "
                              "use explorer workers or several learners")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ConfigError(f"hidden={self.hidden} is invalid: give one or more positive layer sizes")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device={self.device!r} is invalid: use auto, cpu, cuda or cuda:N")
        if self.precision not in ("float32", "bfloat16"):
            raise ConfigError(f"precision={self.precision!r} is invalid: use float32 or bfloat16")

    # --- dict / YAML round trip ---
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        names = sorted(f.name for f in dataclasses.fields(cls))
        if unknown := sorted(set(data) - set(names)):
            raise ConfigError(f"unknown field {unknown[0]!r} for {cls.__name__}; accepted fields: {', '.join(names)}")
        return cls(**data)

    def replace(self, **changes: Any) -> Config:
        return self.from_dict({**self.to_dict(), **changes})

    def save_yaml(self, path: str | Path, history: list[dict[str, Any]] = ()) -> None:
        """Write the settings; ``history`` (hyperparameters changed during the run) follows as comments, so the file
        still starts a new run with the current values."""
        lines = [f"# step {h['step']}: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in h["changed"].items())
                 for h in history]
        notes = "# hyperparameters changed during the run:\n" + "\n".join(lines) + "\n" if lines else ""
        Path(path).write_text(yaml.dump(self.to_dict(), Dumper=_YamlDumper, sort_keys=False) + notes)

    @staticmethod
    def read_yaml(path: str | Path) -> dict[str, Any]:
        """Read a YAML mapping of field values (not yet validated: pass it to ``from_dict``)."""
        try:
            data = yaml.load(Path(path).read_text(), _YamlLoader)
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:  # (ValueError: 5,000 digits)
            why = f"{exc.problem} (line {exc.problem_mark.line + 1})" if getattr(exc, "problem_mark", 0) else f"{exc}"
            raise ConfigError(f"cannot read config file {path}: {why}".splitlines()[0]) from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of field: value")
        return data


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse a ``KEY=VALUE`` override; the value is read as YAML (so ``lr=1e-3``, ``hidden=[64,64]`` work)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {text!r} is malformed: write KEY=VALUE, e.g. --set lr=0.001")
    try:
        return key.strip(), yaml.load(raw, _YamlLoader)
    except (yaml.YAMLError, ValueError):  # (ValueError: an integer of more digits than Python reads)
        raise ConfigError(f"--set {text!r}: cannot read the value {raw!r}") from None


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the field's type, converting only where no information is lost."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is list:
        if isinstance(value, (list, tuple)) and all(type(v) is int and abs(v) < 2**63 for v in value):  # (int64)
            return list(value)
        raise ConfigError(f"{name}={value!r} is invalid: expected a list of integers, each below 2**63 in size")
    if hint in (bool, int) and type(value) is hint:  # not isinstance: True is an int
        return value
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not abs(value) <= sys.float_info.max:  # YAML reads .nan, .inf and 1e400 as floats; 10**400 is too large
            shown = value if isinstance(value, float) else f"{Decimal(value):.3e}"  # (a str of 10**5000 is refused)
            raise ConfigError(f"{name}={shown} is invalid: expected a finite number")
        return float(value)
    if hint is str and isinstance(value, (str, os.PathLike)):  # run_dir may be a Path
        return os.fspath(value)
    expected = getattr(hint, "__name__", str(hint))
    raise ConfigError(f"{name}={value!r} is invalid: expected {'a' if expected != 'int' else 'an'} {expected}")


def _check_range(field: dataclasses.Field, value: Any) -> None:
    low, high, open_low = field.metadata.get("low"), field.metadata.get("high"), field.metadata.get("open_low")
    if value is None or isinstance(value, (str, list, bool)):
        return
    shown = f"{value:.3g}" if isinstance(value, int) and abs(value) >= 10**20 else value  # 1e99: not 100 digits
    if (low is not None and (value <= low if open_low else value < low)) or (high is not None and value > high):
        lo, hi = "" if low is None else (f"> {low}" if open_low else f">= {low}"), "" if high is None else f"<= {high}"
        raise ConfigError(f"{field.name}={shown} is out of range: it must be {' and '.join(filter(None, [lo, hi]))}")
    if isinstance(value, int) and abs(value) >= 2**63:  # torch's and NumPy's integers are 64-bit
        raise ConfigError(f"{field.name}={shown} is invalid: expected an int below 2**63 in size (a 64-bit integer)")
