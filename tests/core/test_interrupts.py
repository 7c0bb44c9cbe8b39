"""Ctrl-C in the middle of a training step: the step finishes before the last checkpoint; a second Ctrl-C stops at
once and saves nothing."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import jaderl
from jaderl.algos.ppo import PPO
from jaderl.core.buffers import ReplayBuffer
from jaderl.core.checkpoint import load_checkpoint
from jaderl.interrupts import ForcedInterrupt, Terminated, deferred_interrupt, sigterm_as_ctrl_c

ENV = "jaderl/CartPole-v1"
Settings = Any


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_inside_the_block_is_raised_when_the_block_ends() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt) as caught, deferred_interrupt():
        ctrl_c()
        done.append("rest of the block")
    assert done == ["rest of the block"] and not isinstance(caught.value, ForcedInterrupt)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_second_ctrl_c_inside_the_block_interrupts_it_at_once() -> None:
    done = []
    with pytest.raises(ForcedInterrupt), deferred_interrupt():
        ctrl_c()
        ctrl_c()
        done.append("rest of the block")
    assert done == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_block_runs_as_is_where_sigint_is_ignored_or_off_the_main_thread() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with deferred_interrupt():
            ctrl_c()  # ignored, as in a pipeline child
    finally:
        signal.signal(signal.SIGINT, previous)
    seen: list[Any] = []

    def body() -> None:
        with deferred_interrupt():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_stops_like_a_ctrl_c_under_sigterm_as_ctrl_c() -> None:
    """`kill`, a job scheduler: SIGTERM raises a KeyboardInterrupt, held to the end of a step like the first Ctrl-C;
    SIGTERM's own handler is back after the block."""
    before = signal.getsignal(signal.SIGTERM)
    done = []
    with sigterm_as_ctrl_c():
        with pytest.raises(Terminated):
            sigterm()
        with pytest.raises(Terminated) as caught, deferred_interrupt():
            sigterm()
            done.append("rest of the block")
        assert done == ["rest of the block"] and isinstance(caught.value, KeyboardInterrupt)
        with pytest.raises(ForcedInterrupt), deferred_interrupt():  # then a Ctrl-C: the second stop request
            sigterm()
            ctrl_c()
            done.append("cut short")
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's SIGINT: SIGTERM still held
        try:
            with pytest.raises(Terminated), deferred_interrupt():
                sigterm()
                done.append("rest of the background job's block")
        finally:
            signal.signal(signal.SIGINT, previous)
    assert done == ["rest of the block", "rest of the background job's block"]
    assert signal.getsignal(signal.SIGTERM) is before and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_an_update_checkpoints_the_finished_update(tmp_path: Path, tiny_ppo: Settings,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    update = PPO.update
    after: dict[str, torch.Tensor] = {}

    def update_with_ctrl_c(self: PPO, buffer: Any) -> dict[str, torch.Tensor]:
        if self.steps != 384:
            return update(self, buffer)
        ctrl_c()  # before the update's work: the update must still run to its end
        stats = update(self, buffer)
        after.update({k: v.clone() for k, v in self.actor.state_dict().items()})
        return stats

    monkeypatch.setattr(PPO, "update", update_with_ctrl_c)
    result = jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **tiny_ppo())
    assert (result.stop_reason, result.steps) == ("interrupted", 384)
    saved = load_checkpoint(tmp_path / "run")
    assert saved["agent"]["counters"]["steps"] == 384
    actor = saved["agent"]["networks"]["actor"]
    assert after and all(torch.equal(actor[k], v) for k, v in after.items())  # the updated actor


def test_ctrl_c_while_a_trajectory_is_stored_checkpoints_all_of_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    add = ReplayBuffer.add
    stored: dict[str, torch.Tensor] = {}

    def add_with_ctrl_c(self: ReplayBuffer, traj: dict[str, torch.Tensor]) -> None:
        if self.size == self.rows:  # full: an add cut short would leave rows mixing new and old fields
            ctrl_c()
            stored.update(traj)
        add(self, traj)

    monkeypatch.setattr(ReplayBuffer, "add", add_with_ctrl_c)
    result = jaderl.train("dqn", ENV, run_dir=str(tmp_path / "run"), num_envs=2, buffer_size=100, warmup_steps=50,
                          batch_size=16, hidden=[16], total_steps=10_000, eval_every=10_000, device="cpu")
    assert (result.stop_reason, result.steps) == ("interrupted", 102)
    tensors, meta = load_checkpoint(tmp_path / "run")["buffer"]
    assert (meta["size"], meta["ptr"]) == (50, 1)  # the oldest row was replaced by the interrupted step's
    assert stored and all(torch.equal(tensors[k][0], v[-1]) for k, v in stored.items())  # every field of it


def test_a_second_ctrl_c_during_an_update_keeps_the_last_checkpoint(tmp_path: Path, tiny_ppo: Settings,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    update = PPO.update

    def update_with_two_ctrl_c(self: PPO, buffer: Any) -> dict[str, torch.Tensor]:
        if self.steps == 384:
            ctrl_c()
            ctrl_c()
        return update(self, buffer)

    monkeypatch.setattr(PPO, "update", update_with_two_ctrl_c)
    with pytest.raises(ForcedInterrupt):
        jaderl.train("ppo", ENV, run_dir=str(tmp_path / "run"), **tiny_ppo())
    assert load_checkpoint(tmp_path / "run")["agent"]["counters"]["steps"] == 256  # the checkpoint before the cut step
    monkeypatch.setattr(PPO, "update", update)
    jaderl.resume(tmp_path / "run")  # and the run goes on from it
    assert load_checkpoint(tmp_path / "run")["agent"]["counters"]["steps"] == 512
