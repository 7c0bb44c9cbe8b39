"""The tuned-settings zoo: settings per (algorithm, env) that reach the task's target, shipped with jaderl.

Each YAML file in this package is one task:

* ``envs``: the env ids it serves, e.g. Gymnasium's ``CartPole-v1`` and jaderl's torch-native twin
  ``jaderl/CartPole-v1`` (the two match step for step, so one entry serves both);
* ``target``: the evaluation return that counts as solved (what ``--target-return`` is usually given);
* one entry per algorithm registry name (``ppo``, ``double_dqn``, ...) with ``settings`` (config fields, including
  ``total_steps``: the budget within which the entry reaches the target) and ``measured`` (what the entry reached,
  with which seeds and where; entries taken from RL Zoo's hyperparameter files and not yet run to the target here
  say so);
* optionally ``together``: settings of the entry that only make sense with another one's value, by the setting that
  decides them (``{target_update_every: [tau]}``: a target network Polyak-averaged after every gradient step; a user
  who gives ``target_update_every`` asks for copies every that many steps, so ``tau`` stays at its default).

:func:`jaderl.make_config` (and so ``jaderl train``, :func:`jaderl.train`, the Lightning adapter and population
members) applies an entry on top of the algorithm's defaults and preset, and below every setting given explicitly;
``zoo=False`` (``jaderl train --no-zoo``) leaves it out. A setting given explicitly also leaves out the entry's
settings that go ``together`` with it. A run's ``config.yaml`` holds the resolved settings, so resuming never consults
the zoo again.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

__all__ = ["ZooEntry", "entries", "lookup", "tasks"]

META_KEYS = ("envs", "target")


@dataclass(frozen=True)
class ZooEntry:
    """The tuned settings of one algorithm on one task."""

    algo: str
    task: str  # the file's stem, e.g. "cartpole"
    envs: tuple[str, ...]
    target: float | None
    settings: dict[str, Any] = field(hash=False)
    measured: str
    together: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    @property
    def source(self) -> str:
        """Where the entry lives, e.g. ``jaderl/zoo/cartpole.yaml``."""
        return f"jaderl/zoo/{self.task}.yaml"

    def left_out(self, given: Iterable[str]) -> list[str]:
        """The entry's settings that the settings ``given`` leave out (``together``), besides those given."""
        given = set(given)
        return [k for k in self.settings if k not in given and any(k in self.together.get(g, ()) for g in given)]

    def applied(self, given: Iterable[str]) -> dict[str, Any]:
        """The settings applied below the settings ``given``: all but those that ``given`` leaves out."""
        out = set(self.left_out(given))
        return {k: v for k, v in self.settings.items() if k not in out}

    def describe(self, skip: tuple[str, ...] = ()) -> str:
        """``key=value`` of every setting but those in ``skip``, comma-separated."""
        return ", ".join(f"{k}={v}" for k, v in self.settings.items() if k not in skip)


@functools.cache
def tasks() -> dict[str, dict[str, Any]]:
    """Every task file of the zoo, parsed, by stem."""
    out = {}
    for path in sorted(resources.files(__package__).iterdir(), key=lambda p: p.name):
        if path.name.endswith(".yaml"):
            out[path.name.removesuffix(".yaml")] = yaml.safe_load(path.read_text())
    return out


@functools.cache
def entries() -> tuple[ZooEntry, ...]:
    """Every entry of the zoo, task by task."""
    out = []
    for task, data in tasks().items():
        envs, target = tuple(data["envs"]), data.get("target")
        for algo, entry in data.items():
            if algo in META_KEYS:
                continue
            out.append(ZooEntry(algo=algo, task=task, envs=envs, target=None if target is None else float(target),
                                settings=dict(entry["settings"]), measured=str(entry["measured"]).strip(),
                                together={k: tuple(v) for k, v in (entry.get("together") or {}).items()}))
    return tuple(out)


def lookup(algo: str, env: str) -> ZooEntry | None:
    """The entry for ``algo`` on the env id ``env`` (its options after ``?`` ignored), or None."""
    base = env.split("?")[0]
    for entry in entries():
        if entry.algo == algo and base in entry.envs:
            return entry
    return None
