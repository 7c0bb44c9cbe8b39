"""Ray for populations: importing it (the optional extra), joining or starting it, and sizing members to it.

Ray is imported only inside ``jaderl.population``; without it, every entry point says in one sentence which extra to
install. With no address (and no ``RAY_ADDRESS``) a local Ray sized to this machine is started and shut down again
afterwards; with one, the population joins that cluster and leaves it running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import socket
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from jaderl.core.config import ConfigError

RAY_EXTRA = "pip install 'jaderl[ray]'"


class PopulationError(RuntimeError):
    """A population cannot go on (a member died more often than it may be restarted, the cluster went away); the
    population directory keeps everything saved so far."""


def require_ray() -> ModuleType:
    """The ``ray`` module, or one sentence naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"populations run on Ray, which is not installed; install it with {RAY_EXTRA}") from None
    return ray


@dataclasses.dataclass(frozen=True)
class Resources:
    """What each member holds while it lives: CPUs and GPUs, fractions allowed (four members at ``gpu=0.25`` share
    one GPU). ``cpu=None`` shares the cluster's CPUs evenly among the members, at most one each."""

    cpu: float | None = None
    gpu: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> Resources:
        """Read ``cpu=1,gpu=0.25`` (either part may be left out)."""
        if not text:
            return cls()
        values: dict[str, float] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in ("cpu", "gpu"):
                raise ConfigError(f"--resources-per-member {text!r} is invalid; write e.g. cpu=1,gpu=0.25")
            try:
                values[key] = float(value)
            except ValueError:
                raise ConfigError(f"--resources-per-member {text!r}: {key} must be a number, e.g. {key}=0.5") from None
            if not math.isfinite(values[key]):  # (NaN passed the checks below and reached Ray's actor options)
                raise ConfigError(f"--resources-per-member {text!r}: {key} must be a finite number, e.g. {key}=0.5")
            if values[key] < 0 or (key == "cpu" and values[key] == 0):
                raise ConfigError(f"--resources-per-member {text!r}: {key} must be positive")
        return cls(**values)

    def options(self, members: int, cluster: dict[str, float]) -> dict[str, float]:
        """Ray actor options for one of ``members`` on a cluster with ``cluster`` resources, refusing in one sentence
        a population that cannot be placed all at once (its members train side by side)."""
        cpus, gpus = float(cluster.get("CPU", 0)), float(cluster.get("GPU", 0))
        cpu = self.cpu if self.cpu is not None else min(1.0, cpus / members)
        if cpu * members > cpus + 1e-9 or self.gpu * members > gpus + 1e-9:
            need = f"{cpu * members:g} CPUs" + (f" and {self.gpu * members:g} GPUs" if self.gpu else "")
            raise ConfigError(f"{members} members at cpu={cpu:g}" + (f",gpu={self.gpu:g}" if self.gpu else "")
                              + f" need {need}, but the cluster has {cpus:g} CPUs and {gpus:g} GPUs; use fewer "
                              "members or smaller --resources-per-member")
        return {"num_cpus": cpu, "num_gpus": self.gpu}


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse in one sentence a cluster ``address`` (``host:port`` or ``ray://host:port``) that does not answer
    within ``timeout_s`` (Ray itself keeps retrying for minutes); ``auto`` and ``local`` are left to Ray."""
    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--address {address!r} is not host:port (the head node's GCS port, 6379 by default) or "
                          "ray://host:10001")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"the Ray cluster at {address} does not answer ({exc.strerror or exc}); start it with "
                          "`ray start --head` or check the address and the firewall") from None


def process_gone(ray: Any) -> tuple[type[BaseException], ...]:
    """The errors with which ``ray.get`` says that an actor's process is gone: it died or was killed
    (``RayActorError``), Ray's memory monitor killed it (``OutOfMemoryError``, which is not a ``RayActorError``), or
    its node died (``NodeDiedError``)."""
    names = ("RayActorError", "OutOfMemoryError", "NodeDiedError")
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


@contextlib.contextmanager
def connected(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray for the block: join ``address`` (or ``RAY_ADDRESS``), reuse a Ray this process already started, or start a
    local one with ``num_cpus`` (default: this machine's) that is shut down when the block ends."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(address)
    on_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if on_main else None
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    except ray.exceptions.AuthenticationError:
        raise ConfigError(f"the Ray cluster at {address} refused this driver: it has token authentication on; "
                          "give its token in RAY_AUTH_TOKEN (with RAY_AUTH_MODE=token), as `ray get-auth-token` "
                          "prints it on the head node") from None
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise ConfigError(f"could not connect to {where} ({first[:200]}); check the address (host:port of the head "
                          "node, or ray://host:10001) and that `ray status` answers there") from None
    if sigterm is not None:  # ray.init makes SIGTERM exit at once; the caller's handler (the jaderl command's: stop
        signal.signal(signal.SIGTERM, sigterm)  # like Ctrl-C, every actor killed, Ray shut down) stays
    try:
        yield ray
    finally:
        ray.shutdown()
