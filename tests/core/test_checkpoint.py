"""Tests of jaderl.core.checkpoint: the tensor/JSON split, atomic files, leftovers, and no pickle anywhere."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from jaderl.core.checkpoint import CHECKPOINT_JSON, flatten, load_checkpoint, save_checkpoint, save_tensors, unflatten


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "agent": {"net": {"0.weight": torch.randn(3, 2), "0.bias": torch.zeros(3)},
                  "optimizer": {"state": {0: {"step": torch.tensor(4.0), "exp_avg": torch.randn(3, 2)},
                                          1: {"step": torch.tensor(4.0), "exp_avg": torch.randn(3)}},
                                "param_groups": [{"lr": 3e-4, "betas": [0.9, 0.999], "params": [0, 1],
                                                  "foreach": None, "fused": True}]},
                  "steps": 4096, "update_debt": 0.25},
        "mixed": {1: "int key", "two": 2.5, 3.5: None, None: [1, 2], False: {"t": torch.ones(1)}},
        "buffer": [{"obs": torch.arange(6, dtype=torch.int64).view(3, 2), "done": torch.tensor([True, False])},
                   {"ptr": 1, "size": 3}],
        "empty": {}, "nothing": None, "ratio": 1 / 3, "big": 1e300, "name": "ppo", "flag": False,
        "half": torch.ones(2, dtype=torch.float16), "scalar": torch.tensor(7),
    }


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            assert type(key) is type(next(k for k in b if k == key))
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b


def test_flatten_round_trip() -> None:
    state = _state()
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten(state, tensors)
    text = json.dumps(skeleton)  # the skeleton holds no tensor, only JSON values
    assert all(isinstance(v, torch.Tensor) for v in tensors.values())
    assert len(tensors) == 11
    _assert_same(state, unflatten(json.loads(text), tensors))


def test_flatten_does_not_copy_cpu_tensors() -> None:
    """A checkpoint is written from the tensors' own memory: saving a replay buffer does not hold it twice."""
    weight = torch.zeros(2, requires_grad=True)
    data = torch.arange(12.0).view(4, 3)
    tensors: dict[str, torch.Tensor] = {}
    flatten({"w": weight, "buffer": data[:2]}, tensors)
    assert tensors["/buffer"].data_ptr() == data.data_ptr() and tensors["/w"].data_ptr() == weight.data_ptr()
    assert not tensors["/w"].requires_grad


def test_tensors_that_share_memory_are_saved(tmp_path: Path) -> None:
    data = torch.arange(12.0).view(4, 3)
    state = {"a": data, "again": data, "rows": data[1:3], "column": data[:, 1]}
    save_checkpoint(tmp_path, state, step=1)
    loaded = load_checkpoint(tmp_path)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_keys_that_look_like_paths_keep_their_own_tensors(tmp_path: Path) -> None:
    """A "/" inside a key (a metric name such as "loss/actor") does not make two entries share one tensor name, and
    neither do an int key and its string."""
    state = {"a/b": torch.tensor([1.0]), "a": {"b": torch.tensor([2.0]), "~1": torch.tensor([3.0])},
             "mixed": {1: torch.tensor([4.0]), "1": torch.tensor([5.0])}, "a~1b": torch.tensor([6.0])}
    save_checkpoint(tmp_path, state, step=1)
    _assert_same(state, load_checkpoint(tmp_path))


def test_flatten_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="cannot checkpoint a value of type object at /a/0"):
        flatten({"a": [object()]}, {})


def test_save_load_round_trip(tmp_path: Path) -> None:
    state = _state()
    path = save_checkpoint(tmp_path, state, step=4096)
    assert path == tmp_path / CHECKPOINT_JSON
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_JSON, "ckpt-4096.safetensors"]
    _assert_same(state, load_checkpoint(tmp_path))


def test_files_are_json_and_safetensors_without_pickle(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(), step=10)
    meta = json.loads((tmp_path / CHECKPOINT_JSON).read_text(),
                      parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert meta["tensor_file"] == "ckpt-10.safetensors"
    raw = (tmp_path / meta["tensor_file"]).read_bytes()
    # safetensors layout: u64 header length, a JSON header, then raw tensor bytes
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    assert all(set(v) == {"dtype", "shape", "data_offsets"} for k, v in header.items() if k != "__metadata__")
    assert len(load_file(str(tmp_path / meta["tensor_file"]))) == len(header) - ("__metadata__" in header)
    for file in tmp_path.iterdir():
        data = file.read_bytes()
        assert not data.startswith(b"\x80") and b"PK\x03\x04" not in data[:4]  # no pickle, no torch.save zip


def test_no_pickle_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("pickle was used")

    for name in ("dump", "dumps", "load", "loads"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "save", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    save_checkpoint(tmp_path, _state(), step=1)
    _assert_same(_state(), load_checkpoint(tmp_path))


def test_newer_checkpoint_replaces_older(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {"x": torch.zeros(2), "step": 1}, step=1)
    save_checkpoint(tmp_path, {"x": torch.ones(2), "step": 2}, step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_JSON, "ckpt-2.safetensors"]
    state = load_checkpoint(tmp_path)
    assert state["step"] == 2 and torch.equal(state["x"], torch.ones(2))


def test_leftovers_do_not_break_loading(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {"x": torch.ones(2), "step": 5}, step=5)
    # a run killed mid-write: half-written temporary files and a stale (older or newer) tensor file
    (tmp_path / (CHECKPOINT_JSON + ".tmp")).write_text('{"tensor_file": "ckpt-9.safeten')
    (tmp_path / "ckpt-9.safetensors.tmp").write_bytes(b"\x00\x01garbage")
    save_tensors(tmp_path / "ckpt-3.safetensors", {"x": torch.zeros(2)})
    save_tensors(tmp_path / "ckpt-9.safetensors", {"x": torch.full((2,), 9.0)})
    state = load_checkpoint(tmp_path)
    assert state["step"] == 5 and torch.equal(state["x"], torch.ones(2))
    # the next save cleans the stale tensor files up
    save_checkpoint(tmp_path, {"x": torch.zeros(1), "step": 6}, step=6)
    assert not (tmp_path / "ckpt-3.safetensors").exists() and not (tmp_path / "ckpt-9.safetensors").exists()
    assert load_checkpoint(tmp_path)["step"] == 6


def test_missing_or_damaged_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holds no readable checkpoint"):
        load_checkpoint(tmp_path)
    save_checkpoint(tmp_path, {"x": torch.ones(2)}, step=1)
    (tmp_path / "ckpt-1.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="holds no readable checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_JSON).write_text("{not json")
    with pytest.raises(FileNotFoundError, match="holds no readable checkpoint") as info:
        load_checkpoint(tmp_path)
    assert "\n" not in str(info.value)


def test_save_tensors_is_atomic_and_loadable(tmp_path: Path) -> None:
    tensors = {"a.weight": torch.randn(3, 3).t(), "b": torch.tensor([1.5])}  # non-contiguous input
    save_tensors(tmp_path / "policy.safetensors", tensors)
    assert [p.name for p in tmp_path.iterdir()] == ["policy.safetensors"]
    loaded = load_file(str(tmp_path / "policy.safetensors"))
    assert torch.equal(loaded["a.weight"], tensors["a.weight"]) and torch.equal(loaded["b"], tensors["b"])


def test_floats_survive_exactly(tmp_path: Path) -> None:
    values = [0.1, 1 / 3, 2.0**-1074, 1.7976931348623157e308, -0.0]
    save_checkpoint(tmp_path, {"v": values}, step=0)
    loaded = load_checkpoint(tmp_path)["v"]
    assert loaded == values and math.copysign(1, loaded[-1]) == -1


def test_a_checkpoint_of_the_same_step_never_overwrites_the_live_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A second checkpoint at the same step (a population member's copy, a hyperparameter change) writes its tensors
    to another file: a process killed before the JSON commit leaves the last complete checkpoint as it was."""
    import jaderl.core.checkpoint as checkpoint

    save_checkpoint(tmp_path, {"w": torch.zeros(3)}, step=5)
    real = checkpoint.atomic_write

    def dies_before_the_json(path: Path, write: Any) -> None:
        if path.name == CHECKPOINT_JSON:
            raise KeyboardInterrupt
        real(path, write)

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "atomic_write", dies_before_the_json)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(tmp_path, {"w": torch.ones(3)}, step=5)
    assert torch.equal(load_checkpoint(tmp_path)["w"], torch.zeros(3))
    save_checkpoint(tmp_path, {"w": torch.ones(3)}, step=5)
    assert torch.equal(load_checkpoint(tmp_path)["w"], torch.ones(3))
    assert len(list(tmp_path.glob("ckpt-*.safetensors"))) == 1  # the unfinished one and the old one are gone


@pytest.mark.parametrize("text", [
    "[]", "null", '"checkpoint"',  # JSON, but not an object
    '{"format": 2, "tensor_file": "ckpt-1.safetensors", "state": {"x": {"__tensor__": "/gone"}}}',
    '{"format": 2, "tensor_file": "ckpt-1.safetensors", "state": {"__items__": [1]}}',
])
def test_a_damaged_checkpoint_json_is_one_sentence(tmp_path: Path, text: str) -> None:
    save_checkpoint(tmp_path, {"x": torch.ones(2)}, step=1)
    (tmp_path / CHECKPOINT_JSON).write_text(text)
    with pytest.raises(FileNotFoundError, match="holds no readable checkpoint") as info:
        load_checkpoint(tmp_path)
    assert "\n" not in str(info.value)


def test_the_next_save_removes_a_tensor_file_a_killed_write_left(tmp_path: Path) -> None:
    """A process killed while writing its tensors (a replay buffer can be gigabytes) leaves ckpt-N.safetensors.tmp."""
    save_checkpoint(tmp_path, {"x": torch.ones(2)}, step=1)
    (tmp_path / "ckpt-2.safetensors.tmp").write_bytes(b"\x00" * 64)
    save_checkpoint(tmp_path, {"x": torch.zeros(2)}, step=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_JSON, "ckpt-3.safetensors"]
