"""Checkpoints: every tensor in safetensors, everything else in JSON, written atomically; nothing is unpickled.

A checkpoint is a nested dict (config, counters, agent state, buffer, RNG states). :func:`save_checkpoint` splits
it into ``ckpt-STEP.safetensors`` (tensors) and ``checkpoint.json`` (the rest, with references to the tensors).
Each file is written to a temporary name, flushed to disk and renamed into place; the JSON rename is the commit
point, so a process killed at any moment leaves the previous complete checkpoint readable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from jaderl.core.config import ConfigError

CHECKPOINT_JSON = "checkpoint.json"
FORMAT = 2
"""The layout of a checkpoint's state (2: a Trainer's state_dict); one of another format is refused on load."""


class CheckpointFormatError(ConfigError):
    """A checkpoint written in another format (by another jaderl version)."""


def flatten(obj: Any, tensors: dict[str, torch.Tensor], prefix: str = "") -> Any:
    """Move every tensor of ``obj`` into ``tensors`` (keyed by its path) and return a JSON-able skeleton."""
    if isinstance(obj, torch.Tensor):  # written from its own memory: a replay buffer is not held twice while saving
        tensor = obj.detach().to("cpu").contiguous()
        shared = any(t.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr() for t in tensors.values())
        tensors[prefix] = tensor.clone() if shared else tensor  # safetensors refuses tensors that share memory
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            # a key's "~" and "/" escaped as in a JSON pointer: {"a/b": x} and {"a": {"b": y}} get two tensor names
            return {k: flatten(v, tensors, f"{prefix}/{k.replace('~', '~0').replace('/', '~1')}")
                    for k, v in obj.items()}
        return {"__items__": [[k, flatten(v, tensors, f"{prefix}/~{i}")] for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        return [flatten(v, tensors, f"{prefix}/{i}") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a value of type {type(obj).__name__} at {prefix}")


def unflatten(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten`."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__items__" in skeleton:
            return {k: unflatten(v, tensors) for k, v in skeleton["__items__"]}
        return {k: unflatten(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    return skeleton


def atomic_write(path: Path, write: Any) -> None:
    """Write ``path`` through ``write(tmp)`` and a rename: a reader sees the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no partial file stays behind
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Atomically write a flat dict of tensors (and string ``metadata``) as safetensors."""
    flat = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}  # small; may share memory
    atomic_write(Path(path), lambda p: save_file(flat, str(p), metadata=metadata))


def save_checkpoint(run_dir: str | Path, state: dict[str, Any], step: int) -> Path:
    """Write ``state`` as a checkpoint of ``run_dir`` and drop older tensor files; returns the JSON path."""
    run_dir = Path(run_dir)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten(state, tensors)
    tensor_file = f"ckpt-{step}.safetensors"
    if (run_dir / tensor_file).exists():  # the live checkpoint's, of the same step: it stays until the JSON moves on
        tensor_file = f"ckpt-{step}-{os.urandom(4).hex()}.safetensors"
    atomic_write(run_dir / tensor_file, lambda p: save_file(tensors, str(p)))
    text = json.dumps({"format": FORMAT, "tensor_file": tensor_file, "state": skeleton}, indent=1)
    atomic_write(run_dir / CHECKPOINT_JSON, lambda p: p.write_text(text))
    for old in run_dir.glob("ckpt-*.safetensors*"):  # with what a killed write left (.tmp)
        if old.name != tensor_file:
            old.unlink()
    return run_dir / CHECKPOINT_JSON


def load_checkpoint(run_dir: str | Path, device: torch.device | str = "cpu", part: str | None = None) -> dict[str, Any]:
    """Read the latest complete checkpoint of ``run_dir`` with its tensors on ``device``; with ``part`` (such as
    ``"agent"``), only that entry of it, reading none of the other tensors (a replay buffer can be gigabytes)."""
    run_dir = Path(run_dir)
    try:
        meta = json.loads((run_dir / CHECKPOINT_JSON).read_text())
        if meta.get("format", 1) != FORMAT:
            raise CheckpointFormatError(f"{run_dir} holds a checkpoint of format {meta.get('format', 1)}, written by "
                                        f"another jaderl version (this one reads format {FORMAT}); resume it with "
                                        "that version or start a new run")
        skeleton = meta["state"] if part is None else meta["state"][part]
        with safe_open(str(run_dir / meta["tensor_file"]), framework="pt", device=str(device)) as f:
            prefix = "" if part is None else f"/{part}/"
            tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}  # noqa: SIM118
        return unflatten(skeleton, tensors)  # a skeleton naming a tensor the file lacks is damaged too
    except CheckpointFormatError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError) as exc:
        raise FileNotFoundError(f"{run_dir} holds no readable checkpoint ({exc}); "
                                "pass the run directory of a run that has saved one") from None


def finite_or_raise(state: Any, where: str, *, fix: str = "resume from an earlier copy or start a new run") -> None:
    """Refuse ``state`` (a checkpoint, or a part of it such as ``{"agent": ...}``) if any of its floating-point
    tensors holds a NaN or an infinity: a :class:`~jaderl.core.config.ConfigError` of one sentence naming ``where``
    (the file it came from), the first such tensor by its dotted path (``agent.actor.net.0.weight``) and ``fix``."""
    bad: list[str] = []

    def visit(obj: Any, name: str) -> None:
        if isinstance(obj, torch.Tensor):
            if (obj.is_floating_point() or obj.is_complex()) and not bool(torch.isfinite(obj).all()):
                bad.append(name or "a tensor")
        elif isinstance(obj, (dict, list, tuple)):
            for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
                visit(value, f"{name}.{key}" if name else str(key))

    visit(state, "")
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise ConfigError(f"{where} holds NaN or infinite values ({bad[0]}{more}); {fix}")
