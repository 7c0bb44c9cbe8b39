"""A population's search space: where each mutable hyperparameter is sampled from and how it is perturbed.

A space maps hyperparameter names to a :class:`Dimension` each. By default it is the algorithm's own
``Agent.hyperparameters`` that change training in the members' configuration (:func:`live_hyperparameters`: not
REINFORCE's ``vf_coef`` without a baseline, say) and that ``--set`` does not give every member, each over its whole
valid range; a user narrows it with strings such as

    lr=loguniform:1e-4:1e-2      gamma=uniform:0.95:0.999      clip_ratio=choice:0.1:0.2:0.3

Every name must be one of the algorithm's mutable hyperparameters and every range must lie inside its valid range,
so a bad space is refused in one sentence before any member starts.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Collection
from typing import Any

from jaderl.core.agent import Agent, Hyperparameter
from jaderl.core.config import Config, ConfigError
from jaderl.envs.vec import EnvSpec

KINDS = ("loguniform", "uniform", "choice")


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One hyperparameter's search range: ``uniform`` or ``loguniform`` in ``[low, high]``, or a ``choice`` among
    ``values``."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    values: tuple[float, ...] = ()

    def sample(self, rng: random.Random) -> float:
        """A value drawn from the whole range."""
        if self.kind == "choice":
            return rng.choice(self.values)
        if self.kind == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

    def perturb(self, value: float, rng: random.Random, factors: tuple[float, float] = (0.8, 1.2)) -> float:
        """``value`` nudged: multiplied by one of ``factors`` and kept inside the range (a choice moves to a
        neighbouring value)."""
        if self.kind == "choice":
            i = min(range(len(self.values)), key=lambda k: abs(self.values[k] - value))
            return self.values[min(max(i + rng.choice((-1, 1)), 0), len(self.values) - 1)]
        return min(max(value * rng.choice(factors), self.low), self.high)

    def describe(self) -> str:
        """The dimension as the string :func:`parse_dimension` reads."""
        bounds = self.values if self.kind == "choice" else (self.low, self.high)
        return ":".join([self.kind, *(f"{v:g}" for v in bounds)])


Space = dict[str, Dimension]


def live_hyperparameters(agent_cls: type[Agent], config: Config, spec: EnvSpec) -> dict[str, Hyperparameter]:
    """The mutable hyperparameters of ``agent_cls`` that change its training under ``config`` on an env described by
    ``spec``: what the algorithm's ``live_hyperparameters(config, spec)`` returns where it defines one (REINFORCE
    leaves out ``vf_coef`` without a baseline), otherwise all of them."""
    live = getattr(agent_cls, "live_hyperparameters", None)
    return dict(agent_cls.hyperparameters) if live is None else dict(live(config, spec))


def default_space(agent_cls: type[Agent], config: Config | None = None, spec: EnvSpec | None = None) -> Space:
    """Every mutable hyperparameter of ``agent_cls`` over its valid range (log-uniform where it is marked log); with
    the members' ``config`` and the env's ``spec``, only those that change training there
    (:func:`live_hyperparameters`)."""
    hyperparameters = agent_cls.hyperparameters if config is None or spec is None else \
        live_hyperparameters(agent_cls, config, spec)
    return {name: Dimension("loguniform" if h.log else "uniform", h.low, h.high)
            for name, h in hyperparameters.items()}


def parse_dimension(name: str, text: str, allowed: Hyperparameter | None) -> Dimension:
    """Read ``KIND:A:B[:C...]`` for hyperparameter ``name``, checked against its valid range ``allowed``."""
    kind, *parts = text.split(":")
    if kind not in KINDS:
        raise ConfigError(f"{name}={text!r}: unknown distribution {kind!r}; write one of "
                          f"{', '.join(k + ':...' for k in KINDS)}, e.g. lr=loguniform:1e-4:1e-2")
    try:
        numbers = tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: the bounds must be numbers, e.g. {name}={kind}:0.1:0.5") from None
    if not all(map(math.isfinite, numbers)):  # (a NaN among a choice's values passed the range check below)
        raise ConfigError(f"{name}={text!r}: the bounds must be finite numbers, not NaN or infinity")
    if kind == "choice":
        if not numbers:
            raise ConfigError(f"{name}={text!r} is an empty choice; list values, e.g. {name}=choice:0.1:0.2")
        dim = Dimension(kind, min(numbers), max(numbers), tuple(sorted(set(numbers))))
    else:
        if len(numbers) != 2:
            raise ConfigError(f"{name}={text!r}: {kind} takes two bounds, e.g. {name}={kind}:0.1:0.5")
        if not numbers[0] < numbers[1]:
            raise ConfigError(f"{name}={text!r} is an empty range: the low bound must be below the high one")
        if kind == "loguniform" and numbers[0] <= 0:
            raise ConfigError(f"{name}={text!r}: loguniform needs positive bounds; use uniform for ranges that "
                              "reach zero")
        dim = Dimension(kind, *numbers)
    if allowed is not None and not allowed.low <= dim.low <= dim.high <= allowed.high:
        raise ConfigError(f"{name}={text!r} reaches outside the valid range of {name}, "
                          f"[{allowed.low:g}, {allowed.high:g}]")
    return dim


def space_entries(entries: list[str] | dict[str, str] | None) -> dict[str, str]:
    """``["lr=loguniform:1e-4:1e-2", ...]`` (or such a dict already) as a dict name -> ``"loguniform:1e-4:1e-2"``."""
    if isinstance(entries, dict) or not entries:
        return dict(entries or {})
    pairs: dict[str, str] = {}
    for entry in entries:
        name, sep, text = entry.partition("=")
        if not sep:
            raise ConfigError(f"--space {entry!r} is not NAME=KIND:LOW:HIGH; write e.g. lr=loguniform:1e-4:1e-2")
        if name.strip() in pairs:  # (the last one silently replaced the others)
            raise ConfigError(f"--space names {name.strip()} twice; give each hyperparameter one range")
        pairs[name.strip()] = text.strip()
    return pairs


def parse_space(agent_cls: type[Agent], entries: list[str] | dict[str, str] | None,
                fixed: Collection[str] = (), config: Config | None = None, spec: EnvSpec | None = None) -> Space:
    """The search space for ``agent_cls``: ``entries`` (``["lr=loguniform:1e-4:1e-2", ...]`` or a dict name ->
    ``"loguniform:1e-4:1e-2"``), or the algorithm's own :func:`default_space` when there are none (with the members'
    ``config`` and the env's ``spec``: only the hyperparameters that change training there), less the
    hyperparameters that every member is given (``fixed``: the names of ``--set``)."""
    pairs = space_entries(entries)
    if not pairs:
        return {name: dim for name, dim in default_space(agent_cls, config, spec).items() if name not in fixed}
    mutable = agent_cls.hyperparameters
    for name in pairs:
        if name not in mutable:
            raise ConfigError(f"{name} is not a hyperparameter {agent_cls.__name__} can change while it trains, so a "
                              f"population cannot search it; searchable: {', '.join(mutable)}")
    return {name: parse_dimension(name, text, mutable[name]) for name, text in pairs.items()}


def check_not_fixed(entries: list[str] | dict[str, str] | None, fixed: Collection[str]) -> None:
    """Refuse in one sentence a hyperparameter that ``entries`` search and ``fixed`` (``--set``) give every member:
    the member would take the searched value and the set one would be lost."""
    if both := [name for name in space_entries(entries) if name in fixed]:
        raise ConfigError(f"{both[0]} is both searched (--space {both[0]}=...) and given to every member (--set "
                          f"{both[0]}=...); drop one of them")


def sample(space: Space, rng: random.Random) -> dict[str, float]:
    """One value per dimension, drawn from its whole range."""
    return {name: dim.sample(rng) for name, dim in space.items()}


def explore(space: Space, values: dict[str, Any], rng: random.Random, resample_probability: float) -> dict[str, float]:
    """PBT's explore step: each hyperparameter of ``values`` is resampled with ``resample_probability``, otherwise
    perturbed by a factor of 0.8 or 1.2 (kept inside its range)."""
    return {name: dim.sample(rng) if rng.random() < resample_probability else dim.perturb(float(values[name]), rng)
            for name, dim in space.items()}
