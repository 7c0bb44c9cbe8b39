"""Data-parallel learners started by torchrun: two "nodes" on this machine (two torchrun launchers, static
rendezvous, one learner each) train one agent with identical parameters on both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel.test_ddp import _assert_learners_identical
from tests.ports import free_port


def _node(rank: int, port: int, run_dir: Path, *extra: str) -> subprocess.Popen:
    """One torchrun launcher acting as node ``rank`` of 2, running ``python -m jaderl train`` as its one learner."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "jaderl", "train", "ppo", "jaderl/CartPole-v1", "--learners", "2", "--run-dir", str(run_dir),
               "--total-steps", "256", "--num-envs", "4", "--eval-every", "128", "--eval-episodes", "2",
               "--checkpoint-every", "128", "--device", "cpu", "--seed", "0", "--set", "horizon=16",
               "--set", "minibatch_size=32", "--set", "hidden=[16]", "--json", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(nodes: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    results = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=180)
            results.append((node.returncode, out, err))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    return results


@pytest.mark.usefixtures("no_leftover_processes")
def test_two_torchrun_nodes_train_with_identical_parameters(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    (code0, out0, err0), (code1, _, err1) = _finish([_node(0, port, run_dir), _node(1, port, run_dir)])
    assert code0 == 0, err0[-3000:]
    assert code1 == 0, err1[-3000:]
    report = json.loads(out0.splitlines()[-1])
    # 2 learners x 4 envs x 16 steps = 128 env steps per iteration, all counted
    assert report["steps"] == 256 and report["stop_reason"] == "total_steps"
    assert _assert_learners_identical(run_dir) == 256  # networks, Adam states, normalisers, counters
    assert [line.split(",")[0] for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]] == ["128", "256"]


def test_a_group_of_another_size_than_learners_is_one_sentence(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "jaderl", "train", "ppo",
               "jaderl/CartPole-v1", "--learners", "2", "--run-dir", str(run_dir), "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "torchrun started 1 learner process but learners=2; pass --learners 1" in done.stderr
