"""A real two-node Ray cluster on this machine (``ray start --head`` plus a second ``ray start --address``), token
authentication on as Ray 2.60 has it for ``ray start --head``, and a small population whose members run on both
nodes, driven by ``jaderl pbt --address``.

Budget: about 60 s (two Ray nodes start in 15-25 s here). The nodes run in their own process groups with their own
temporary directory and are stopped by SIGKILL to those groups, not with ``ray stop --force``, which would stop every
Ray on the machine (other people's included); the test then checks that no process of theirs is left.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port

pytest.importorskip("ray")

BIN = Path(sys.executable).parent


def _processes_in(sessions: list[int], marker: str) -> list[str]:
    """Live processes in one of ``sessions`` or whose command line names ``marker`` (the cluster's temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            state, _, _, session = stat[stat.rindex(")") + 2:].split()[:4]
            if state != "Z" and (int(session) in sessions or marker in cmd):
                found.append(f"{entry.name} {cmd[:120]}")
    return found


@pytest.fixture
def two_node_cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """(address, env with the cluster's token) of a head node and one worker node, 1 CPU each."""
    temp_dir = tempfile.mkdtemp(prefix="rayj")  # short: Ray's socket paths must stay under 107 characters
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    port = free_port()
    # worker ports chosen by the system: two nodes on one machine would otherwise draw them from one range
    common = ["--block", "--num-cpus", "1", "--temp-dir", temp_dir, "--disable-usage-stats", "--min-worker-port", "0",
              "--max-worker-port", "0"]
    nodes: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> None:
        nodes.append(subprocess.Popen([str(BIN / "ray"), "start", *args, *common], env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    try:
        start("--head", "--port", str(port), "--ray-client-server-port", str(free_port()),
              "--include-dashboard", "false")
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        start("--address", address)
        while time.monotonic() < deadline:  # both nodes registered
            status = subprocess.run([str(BIN / "ray"), "status", "--address", address], env=env, capture_output=True,
                                    text=True).stdout
            if status.count(" node_") >= 2:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the two-node cluster did not come up: {status[-500:]}")
        yield address, env
    finally:
        sessions = [node.pid for node in nodes]
        for node in nodes:  # every process a node started (GCS, raylet, workers) is in its session
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        deadline = time.monotonic() + 15
        while (left := _processes_in(sessions, temp_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"Ray processes left behind: {left}"


@pytest.mark.slow
def test_population_runs_across_two_nodes(two_node_cluster: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    address, env = two_node_cluster
    pop_dir = tmp_path / "pop"
    argv = [str(BIN / "jaderl"), "pbt", "ppo", "jaderl/CartPole-v1", "--members", "2", "--period", "128",
            "--generations", "2", "--address", address, "--resources-per-member", "cpu=1",
            "--space", "lr=loguniform:1e-4:1e-2", "--json"]
    for key, value in dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden="[16,16]",
                           eval_episodes=2, device="cpu").items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run([*argv, "--run-dir", str(pop_dir)], env=env, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert Path(result["best_run_dir"], "checkpoint.json").exists()
    with open(pop_dir / "population.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert len({r["node"] for r in rows if r["generation"] == "0"}) == 2  # one member on each node (1 CPU each)
    # without the token the cluster refuses a driver (Ray 2.60 token auth)
    no_token = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN"} | {"HOME": str(tmp_path)}
    refused = subprocess.run([*argv, "--run-dir", str(tmp_path / "other")], env=no_token, capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "other").exists()
    errors = [line for line in refused.stderr.splitlines() if line.startswith("jaderl: error:")]
    assert len(errors) == 1 and "token authentication" in errors[0], refused.stderr


def _descendants_of(root: int) -> dict[int, str]:
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = commands[pid]
                frontier.append(pid)
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_every_member_and_the_local_ray(tmp_path: Path, stop: str) -> None:
    """SIGINT (Ctrl-C) or SIGTERM (`kill`, a job scheduler) to `jaderl pbt` while its members train: exit code 130,
    every process it started (the local Ray, the members) is gone, and the members' checkpoints stay. Budget: about
    40 s each."""
    argv = [str(BIN / "jaderl"), "pbt", "ppo", "jaderl/CartPole-v1", "--members", "2", "--period", "100000",
            "--generations", "2", "--run-dir", str(tmp_path / "pop"), "--space", "lr=loguniform:1e-4:1e-2"]
    for key, value in dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden="[16,16]",
                           eval_episodes=2, device="cpu", checkpoint_every=256).items():
        argv += ["--set", f"{key}={value}"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and driver.poll() is None:
            started = _descendants_of(driver.pid)
            if sum(cmd.startswith("ray::Member.train_until") for cmd in started.values()) == 2 and \
                    len(list((tmp_path / "pop" / "members").glob("m*/checkpoint.json"))) == 2:
                break
            time.sleep(0.2)
        assert driver.poll() is None, driver.communicate()[1][-2000:]
        driver.send_signal(getattr(signal, stop))
        _, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 130, err[-2000:]
    deadline = time.monotonic() + 15
    while (left := [pid for pid in started if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {[started[p] for p in left]}"
    assert len(list((tmp_path / "pop" / "members").glob("m*/checkpoint.json"))) == 2
