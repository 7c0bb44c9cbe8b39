"""Stand-ins for Ray and for a population member, so that a tournament's driver runs in the test's process."""

from __future__ import annotations

from typing import Any


class FakeRay:
    """The few Ray calls a tournament makes, in this process: actors are plain objects, a call runs when its result
    is read, an exception inside a member is a task error (but for the errors that say its process is gone, which a
    member raises to play that); ``killed`` lists the actors killed."""

    class _TaskError(Exception):
        def __init__(self, cause: BaseException) -> None:
            super().__init__(str(cause))
            self.cause = cause

    exceptions = type("exceptions", (), {"RayTaskError": _TaskError,
                                         "RayActorError": type("ActorError", (Exception,), {}),
                                         "OutOfMemoryError": type("OutOfMemoryError", (Exception,), {})})

    def __init__(self, member_cls: type) -> None:
        self.member_cls, self.killed, self.actors = member_cls, [], []

    def remote(self, **options: Any) -> Any:
        def actor_class(cls: type) -> Any:
            def start(*args: Any) -> Any:
                obj = cls(*args) if cls.__name__ == "Leaderboard" else self.member_cls()
                handle = type("Handle", (), {"__getattr__": lambda _, name: type("Method", (), {
                    "remote": staticmethod(lambda *a: lambda: getattr(obj, name)(*a))})()})()
                self.actors.append(handle)
                return handle
            return type("ActorClass", (), {"remote": staticmethod(start)})()
        return actor_class

    def get(self, refs: Any) -> Any:
        if isinstance(refs, list):
            return [self.get(r) for r in refs]
        try:
            return refs()
        except (self.exceptions.RayActorError, self.exceptions.OutOfMemoryError):
            raise
        except Exception as exc:
            raise self._TaskError(exc) from None

    def wait(self, refs: list[Any], num_returns: int) -> tuple[list[Any], list[Any]]:
        return refs[:num_returns], refs[num_returns:]

    def kill(self, actor: Any, no_restart: bool) -> None:
        self.killed.append(actor)

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0}


class Continuing:
    """A stand-in member whose period always ends with score 0.5 after 128 env steps."""

    def start(self, settings: dict[str, Any], values: dict[str, float]) -> int:
        return 1

    def reseed(self, seed: int) -> None:
        return None

    def set_hyperparameters(self, values: dict[str, float]) -> None:
        return None

    def train_for(self, steps: int) -> dict[str, Any]:
        return {"score": 0.5, "steps": 128}

    def describe(self) -> dict[str, Any]:
        return {"hyperparameters": {}, "pid": 1}

    def close(self) -> None:
        return None
