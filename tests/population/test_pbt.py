"""PBT on Ray (jaderl.population.pbt): exploit copies through the object store, population.csv and lineage, restarts
of a member killed mid-period, resume after the driver stops, Ctrl-C-free clean-up, one-sentence refusals.

One local Ray (2 CPUs, no dashboard) serves the whole module; it is shut down at the end and no process stays.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from jaderl import api
from jaderl.cli import main
from jaderl.core.config import ConfigError
from jaderl.core.evaluator import BEST_POLICY
from jaderl.population import pbt, resume_pbt, resume_tournament
from jaderl.population.cluster import PopulationError
from jaderl.population.member import Member, Standby
from jaderl.population.pbt import PBTSettings, split_by_score
from jaderl.population.store import driven
from tests.population.fake_ray import Continuing, FakeRay

ray = pytest.importorskip("ray")

ENV = "jaderl/CartPole-v1"
TINY: dict[str, Any] = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden=[16, 16],
                            eval_episodes=2, device="cpu")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray for the module (starting one takes about 10 s); afterwards no Ray process is left."""
    from tests.conftest import _descendants

    before = set(_descendants())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    deadline = time.monotonic() + 15
    while (left := {p: c for p, (_, c) in _descendants().items() if p not in before and "ray" in c}) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"Ray processes left behind: {left}"


def _rows(pop_dir: Path) -> list[dict[str, str]]:
    with open(pop_dir / "population.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_exploit_copies_the_whole_state_and_sets_the_new_hyperparameters(tmp_path: Path) -> None:
    """A Member (no Ray): after exploit it holds its parent's networks, optimizer states and counters, its own random
    streams, and the explored learning rate in its optimizer and config.yaml."""
    settings = dict(TINY, algo="ppo", env=ENV, total_steps=10_000)
    parent = Member({**settings, "seed": 1, "run_dir": str(tmp_path / "a")}, hyperparameters={"lr": 1e-3})
    child = Member({**settings, "seed": 2, "run_dir": str(tmp_path / "b")}, hyperparameters={"lr": 3e-3})
    parent.train_until(256)
    child.train_until(256)
    child_rng, child_env_rng = child.trainer.rng[0].clone(), child.trainer.env.generator.get_state()
    assert not torch.equal(child_env_rng, parent.trainer.env.generator.get_state())
    child.exploit(parent.state(), {"lr": 1.2e-3})
    for name, tensor in parent.trainer.agent.actor.state_dict().items():
        assert torch.equal(tensor, child.trainer.agent.actor.state_dict()[name])
    adam_p = parent.trainer.agent.optimizers()["optimizer"].state_dict()["state"][0]["exp_avg"]
    adam_c = child.trainer.agent.optimizers()["optimizer"].state_dict()["state"][0]["exp_avg"]
    assert torch.equal(adam_p, adam_c)
    assert [g["lr"] for g in child.trainer.agent.optimizers()["optimizer"].param_groups] == [1.2e-3]
    assert torch.equal(child.trainer.rng[0], child_rng)  # its own streams: it does not retrace its parent
    assert torch.equal(child.trainer.env.generator.get_state(), child_env_rng)
    assert "lr 0.001 -> 0.0012" in (tmp_path / "b" / "config.yaml").read_text()
    assert api.load(tmp_path / "b", best=False).config.lr == pytest.approx(1.2e-3)  # checkpointed at once
    assert child.describe()["steps"] == parent.describe()["steps"] == 256
    # the parent's best policy comes with its evaluation history: jaderl.load(child) is the parent's best
    with safe_open(str(tmp_path / "a" / BEST_POLICY), "pt") as best_a, \
            safe_open(str(tmp_path / "b" / BEST_POLICY), "pt") as best_b:
        assert best_a.metadata() == best_b.metadata()
        assert all(torch.equal(best_a.get_tensor(k), best_b.get_tensor(k)) for k in best_a.keys())  # noqa: SIM118
    assert child.trainer.evaluator.best_return == parent.trainer.evaluator.best_return
    parent.close()
    child.close()


def test_a_restarted_member_keeps_its_hyperparameters(tmp_path: Path) -> None:
    """A member restarted from its checkpoint (its process died, or the population resumed) trains on with the
    hyperparameters it had, not the config's defaults."""
    settings = dict(TINY, algo="ppo", env=ENV, total_steps=10_000, seed=0, run_dir=str(tmp_path / "m"))
    values = {"lr": 2e-3, "gamma": 0.95, "ent_coef": 0.05}
    member = Member(settings, values)
    member.train_until(128)
    member.close()
    again = Member(settings, values)
    assert again.describe()["steps"] == 128
    assert {k: again.describe()["hyperparameters"][k] for k in values} == values
    assert again.trainer.agent.optimizer.param_groups[0]["lr"] == 2e-3
    again.close()


def test_a_member_whose_actions_become_nan_has_diverged(tmp_path: Path) -> None:
    """Continuous actions of NaN parameters reach the env before any checkpoint sees them: the member reports a
    divergence (which PBT answers with a copy), not an env error (which would stop the population)."""
    from jaderl.core.loop import TrainingError

    member = Member(dict(TINY, algo="ppo", env="jaderl/Pendulum-v1", seed=0, run_dir=str(tmp_path / "m")))
    with torch.no_grad():
        for p in member.trainer.agent.actor.parameters():
            p.fill_(math.nan)
    with pytest.raises(TrainingError, match="diverged"):
        member.train_until(64)
    member.close()


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The stderr of ``jaderl ARGV``, which must refuse its input (exit status 2)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_resume_refuses_settings_it_would_ignore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["pbt", "--resume", str(tmp_path), "--members", "4", "--seed", "0", "--generations", "9"], capsys)
    assert err.strip() == ("jaderl: error: --resume takes the population's settings from POP_DIR; drop --members, "
                           "--seed (only --generations, --resources-per-member and --address may change)")


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of a refusal that must come before Ray starts: starting it fails the test."""
    def connected(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started before the input was checked")

    for module in ("jaderl.population.pbt", "jaderl.population.tournament"):  # (modules, not the functions they export)
        monkeypatch.setattr(sys.modules[module], "connected", connected)


def test_tournament_refuses_an_algorithm_that_cannot_train_on_the_env(no_ray: None, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Every algorithm of a tournament is checked against the env as `jaderl pbt` checks its one, before any member
    starts (a DQN member on continuous actions used to score -inf after 0 steps, round after round)."""
    err = _refused(["tournament", "ppo,dqn", "jaderl/Pendulum-v1", "--rounds", "3", "--pool", "2", "--period", "1000",
                    "--run-dir", str(tmp_path / "t")], capsys)
    assert err.strip() == ("jaderl: error: dqn cannot train on jaderl/Pendulum-v1: its actions are continuous; use "
                           "sac, td3 or ppo; run `jaderl algos` to see which algorithms fit")
    assert not (tmp_path / "t").exists()


def test_tournament_refuses_a_space_key_that_one_of_its_algorithms_lacks(no_ray: None, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Members of every algorithm of a tournament are searched over the one --space: a key that ppo has and a2c (or
    vpg, a preset of REINFORCE) lacks is refused before any member starts, naming the key and the algorithm as the
    user wrote it."""
    for algos, lacking in (("ppo,a2c", "a2c"), ("vpg,ppo", "vpg")):
        err = _refused(["tournament", algos, ENV, "--space", "lr=loguniform:1e-4:1e-2", "--space",
                        "clip_ratio=uniform:0.1:0.3", "--run-dir", str(tmp_path / "t")], capsys)
        assert err.strip() == (f"jaderl: error: --space clip_ratio=... cannot be searched in this tournament: "
                               f"{lacking} has no mutable hyperparameter clip_ratio (only ppo has it), and members of "
                               "every algorithm are searched over the whole space; drop clip_ratio from --space, or "
                               "run ppo in a tournament of its own")
        assert not (tmp_path / "t").exists()
    from jaderl.population import tournament

    with pytest.raises(AssertionError, match="Ray was started"):  # a key every algorithm has is searched in each
        tournament(["ppo", "a2c"], ENV, space=["ent_coef=uniform:0:0.05"], run_dir=str(tmp_path / "t"))


def test_populations_refuse_a_game_of_opposing_teams(no_ray: None, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Members are ranked by their summed team return, which in simple_tag (predators against prey) does not rank
    policies: `jaderl pbt` and `jaderl tournament` refuse it before any member starts."""
    expected = ("jaderl: error: jaderl/simple_tag is a game of opposing teams (adversary, agent), whose summed return "
                "does not rank policies, and a population ranks its members by it; train such a game with "
                "`jaderl train`")
    for argv in (["pbt", "maddpg", "jaderl/simple_tag", "--members", "2"], ["tournament", "maddpg,matd3",
                                                                            "jaderl/simple_tag", "--pool", "2"]):
        assert _refused([*argv, "--run-dir", str(tmp_path / "p")], capsys).strip() == expected
        assert not (tmp_path / "p").exists()


def test_tournament_refuses_fusing_more_entries_than_the_leaderboard_holds(no_ray: None, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["tournament", "ppo", ENV, "--fuse-top", "10", "--leaderboard-size", "5", "--run-dir",
                    str(tmp_path / "t")], capsys)
    assert err.strip() == (
        "jaderl: error: fuse_top=10 is out of range: it must be <= leaderboard_size=5, since a fused member averages "
        "entries of the leaderboard; lower --fuse-top or raise --leaderboard-size")
    assert not (tmp_path / "t").exists()
    from jaderl.population import tournament

    with pytest.raises(ConfigError, match=r"leaderboard_size=1, .*; raise --leaderboard-size to 2 or more, or give "):
        tournament("ppo", ENV, leaderboard_size=1, run_dir=str(tmp_path / "t"))
    for ok in (dict(leaderboard_size=2), dict(leaderboard_size=1, strategy_weights=(1.0, 0.0, 1.0))):
        with pytest.raises(AssertionError, match="Ray was started"):  # accepted (fuse_top: 3 or the board's size)
            tournament("ppo", ENV, run_dir=str(tmp_path / "t"), **ok)


def test_tournament_refuses_weights_that_are_not_finite(no_ray: None, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """NaN passed both `min() < 0` and `sum() <= 0`, and inf the first: a round trained before `rng.choices` failed
    with a traceback; now refused before Ray starts."""
    for weights, shown in (("nan,1,1", "(nan, 1.0, 1.0)"), ("1,inf,1", "(1.0, inf, 1.0)")):
        err = _refused(["tournament", "ppo", ENV, "--strategy-weights", weights, "--run-dir", str(tmp_path / "t")],
                       capsys)
        assert err.strip() == (f"jaderl: error: strategy_weights={shown} must be three finite weights (best, fuse, "
                               "fresh), not NaN or infinity; give each strategy's share, e.g. 0.5,0.25,0.25")
        assert not (tmp_path / "t").exists()


def test_populations_refuse_a_run_dir_that_is_a_file_or_in_use_before_ray_starts(
        no_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --run-dir that is a file, or a directory that already holds files, is refused before a local Ray starts
    (it used to start first, about 3 s and Ray's warnings), and nothing in it is touched."""
    afile, used, pop = tmp_path / "afile", tmp_path / "used", tmp_path / "pop"
    afile.write_text("kept")
    used.mkdir()
    (used / "notes.txt").write_text("kept")
    pop.mkdir()  # a population's state, as population.json holds it (no member has trained: nothing to check)
    settings = dataclasses.asdict(PBTSettings("ppo", ENV, members=2, period=128, generations=2, settings=dict(TINY)))
    state = json.dumps({"format": 1, "settings": settings, "generation": 1, "members": [], "rng": None})
    (pop / "population.json").write_text(state)
    tour = tmp_path / "tour"
    tour.mkdir()
    (tour / "tournament.json").write_text("{}")
    for command in (["pbt", "ppo", ENV, "--members", "2"], ["tournament", "ppo", ENV, "--pool", "2"]):
        err = _refused([*command, "--run-dir", str(afile)], capsys).strip()
        assert err == f"jaderl: error: population directory {afile} is a file; pick another --run-dir"
        err = _refused([*command, "--run-dir", str(afile / "sub")], capsys).strip()
        assert err == (f"jaderl: error: population directory {afile / 'sub'} cannot be created: {afile} is a file; "
                       "pick another --run-dir")
        err = _refused([*command, "--run-dir", str(used)], capsys).strip()
        assert err == (f"jaderl: error: population directory {used} already holds files; delete them or pick "
                       "another --run-dir")
        err = _refused([*command, "--run-dir", str(pop)], capsys).strip()
        assert err == (f"jaderl: error: population directory {pop} already holds a population; continue it with "
                       "`jaderl pbt --resume` or pick another --run-dir")
        err = _refused([*command, "--run-dir", str(tour)], capsys).strip()
        assert err == (f"jaderl: error: population directory {tour} already holds a tournament; continue it with "
                       "`jaderl tournament --resume` or pick another --run-dir")
    assert afile.read_text() == "kept" and (used / "notes.txt").read_text() == "kept"
    assert sorted(p.name for p in used.iterdir()) == ["notes.txt"]
    assert (pop / "population.json").read_text() == state
    (tmp_path / "empty").mkdir()
    with pytest.raises(AssertionError, match="Ray was started"):  # an empty directory is accepted (and still empty)
        pbt("ppo", ENV, members=2, run_dir=str(tmp_path / "empty"), **TINY)
    assert not any((tmp_path / "empty").iterdir())
    with pytest.raises(AssertionError, match="Ray was started"):  # --resume takes a directory in use, as before
        resume_pbt(pop, generations=3)


def test_a_hyperparameter_given_with_set_is_not_searched(no_ray: None, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--set gamma=0.99` gives every member that discount: the default space (every mutable hyperparameter) leaves
    it out, where members used to draw their own and drop the one set; a hyperparameter both searched with --space
    and set with --set is refused in one sentence before Ray starts."""
    space = PBTSettings("ppo", ENV, members=2, settings={**TINY, "gamma": 0.99}).validate()
    assert "gamma" not in space and "lr" in space
    from jaderl.population.space import sample

    assert "gamma" not in sample(space, random.Random(0))
    expected = ("jaderl: error: lr is both searched (--space lr=...) and given to every member (--set lr=...); drop "
                "one of them")
    for command in (["pbt", "ppo", ENV, "--members", "2"], ["tournament", "ppo", ENV, "--pool", "2"]):
        err = _refused([*command, "--space", "lr=loguniform:1e-4:1e-2", "--set", "lr=0.001", "--run-dir",
                        str(tmp_path / "p")], capsys)
        assert err.strip() == expected
        assert not (tmp_path / "p").exists()


def test_members_run_in_the_population_directory_whatever_their_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative --run-dir (the default runs/... too) names the population directory from the driver's working
    directory; a member's process on a cluster starts where `ray start` ran, so members are given absolute run
    directories (with a relative one, each wrote its own directory elsewhere and the driver found none)."""
    pbt_module, tournament_module = (sys.modules[f"jaderl.population.{name}"] for name in ("pbt", "tournament"))
    seen: dict[str, Path] = {}

    @contextlib.contextmanager
    def connected(*args: Any) -> Iterator[Any]:
        yield type("Ray", (), {"cluster_resources": staticmethod(lambda: {"CPU": 2.0})})()

    def controller_run(self: Any, *args: Any) -> None:
        seen["pbt"] = Path(self.config.member_settings(0, self.pop_dir)["run_dir"])

    def tournament_run(self: Any, *args: Any) -> None:  # (its members' run directories: POP_DIR/members/NAME)
        seen["tournament"] = self.pop_dir

    monkeypatch.setattr(pbt_module, "connected", connected)
    monkeypatch.setattr(tournament_module, "connected", connected)
    monkeypatch.setattr(pbt_module._Controller, "run", controller_run)
    monkeypatch.setattr(tournament_module._Tournament, "__init__",
                        lambda self, *a, **k: setattr(self, "pop_dir", a[2]))
    monkeypatch.setattr(tournament_module._Tournament, "run", tournament_run)
    monkeypatch.chdir(tmp_path)
    pbt("ppo", ENV, members=2, run_dir="pops/p", **TINY)
    assert seen["pbt"] == tmp_path / "pops" / "p" / "members" / "m00"
    del seen["pbt"]
    resume_pbt("pops/p", generations=3)
    assert seen["pbt"] == tmp_path / "pops" / "p" / "members" / "m00"
    tournament_module.tournament("ppo", ENV, pool=2, run_dir="pops/t", **TINY)
    assert seen["tournament"] == tmp_path / "pops" / "t"
    del seen["tournament"]
    tournament_module.resume_tournament("pops/t", rounds=41)
    assert seen["tournament"] == tmp_path / "pops" / "t"


def test_tournament_refuses_bad_resources_before_ray_starts(no_ray: None, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["tournament", "ppo", ENV, "--resources-per-member", "cpu=x", "--run-dir", str(tmp_path / "t")],
                   capsys)
    assert err.strip() == "jaderl: error: --resources-per-member 'cpu=x': cpu must be a number, e.g. cpu=0.5"
    assert not (tmp_path / "t").exists()


def _trained_population(pop_dir: Path, members: int = 2, period: int = 128) -> dict[str, Any]:
    """A population directory as `jaderl pbt` leaves it after its first generation, made without Ray: population.json
    and each member's run directory with its checkpoint at the period's end. Returns the state."""
    from jaderl.population.pbt import FORMAT, PBTSettings, _rng_to_json
    from jaderl.population.space import sample
    from jaderl.population.store import write_json

    config = PBTSettings("ppo", ENV, members=members, period=period, generations=2,
                         space={"lr": "loguniform:1e-4:1e-2"}, settings=dict(TINY))
    space = config.validate()
    rng = random.Random(0)
    state = {"format": FORMAT, "settings": dataclasses.asdict(config), "generation": 1,
             "members": [{"parent": k, "hyperparameters": sample(space, rng)} for k in range(members)]}
    state["rng"] = _rng_to_json(rng)
    for k in range(members):
        member = Member(config.member_settings(k, pop_dir), state["members"][k]["hyperparameters"])
        member.train_until(period)
        member.close()
    write_json(pop_dir / "population.json", state)
    return state


def test_resume_refuses_a_member_whose_checkpoint_is_damaged(no_ray: None, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged checkpoint fails every load: `--resume` names the member and the file and how to go on, before Ray
    starts (it used to restart the member 4 times, then advise the same --resume), and changes nothing on disk."""
    pop_dir = tmp_path / "pop"
    _trained_population(pop_dir)
    [tensor_file] = (pop_dir / "members" / "m01").glob("ckpt-*.safetensors")
    tensor_file.write_bytes(tensor_file.read_bytes()[:tensor_file.stat().st_size // 2])  # truncated
    files = {p: p.read_bytes() for p in pop_dir.rglob("*") if p.is_file()}
    err = _refused(["pbt", "--resume", str(pop_dir), "--generations", "3"], capsys).strip()
    assert err == (f"jaderl: error: member 1's checkpoint {tensor_file} is damaged (Error while deserializing header: "
                   "incomplete metadata, file not fully covered), so member 1 cannot continue from it; restore "
                   f"{pop_dir / 'members' / 'm01'} from a copy, or delete that directory to start member 1 again from "
                   f"step 0 with its recorded hyperparameters, then run `jaderl pbt --resume {pop_dir}`")
    assert {p: p.read_bytes() for p in pop_dir.rglob("*") if p.is_file()} == files  # nothing saved is lost
    (pop_dir / "members" / "m00" / "checkpoint.json").write_text("{")  # a damaged JSON is named the same way
    with pytest.raises(ConfigError, match=r"member 0's checkpoint .*m00/checkpoint.json is damaged \(Expecting"):
        resume_pbt(pop_dir, generations=3)


def test_a_member_whose_checkpoint_is_damaged_is_not_restarted(tmp_path: Path) -> None:
    """A member that dies during the population is restarted from its checkpoint (its process died: the checkpoint,
    written atomically, reads); if that checkpoint cannot be read, the population stops at once and says why."""
    from jaderl.population.pbt import _Controller

    pop_dir = tmp_path / "pop"
    state = _trained_population(pop_dir)
    config = PBTSettings(**state["settings"])
    started: list[int] = []
    controller = _Controller(pop_dir, config, config.validate(), state)
    controller.ray = type("FakeRay", (), {"kill": staticmethod(lambda actor, no_restart: None)})()
    controller.actor_cls = type("FakeActor", (), {"remote": staticmethod(lambda s, h: started.append(s["seed"]))})()
    controller.actors = [None, None]
    controller._restart(1, RuntimeError("its process died"))  # a readable checkpoint: restarted
    assert started == [1] and controller.restarts == [0, 1]
    [tensor_file] = (pop_dir / "members" / "m01").glob("ckpt-*.safetensors")
    tensor_file.write_bytes(b"")
    with pytest.raises(PopulationError, match=rf"^member 1's checkpoint {re.escape(str(tensor_file))} is damaged "
                                              r"\(Error while deserializing header: header too small\)"):
        controller._restart(1, RuntimeError("its creation task failed"))
    assert started == [1] and controller.restarts == [0, 1]  # not retried


def test_diverged_members_copy_and_are_never_copied() -> None:
    inf = -math.inf
    assert split_by_score([3.0, 1.0, 2.0, 0.0], 0.25) == ([0], [3])
    assert split_by_score([inf, 1.0, inf, 2.0, inf, 0.7, 0.8, 0.9], 0.25) == ([3, 1], [0, 2, 4])  # 3 diverged
    assert split_by_score([inf, inf, 5.0], 0.5) == ([2], [0, 1])
    # a NaN score ranks as a diverged one: it used to break the sort, and the best member copied a worse one
    assert split_by_score([2.0, 1.0, math.nan, 3.0], 0.25) == ([3], [2])
    with pytest.raises(PopulationError, match="every member diverged"):
        split_by_score([inf, inf], 0.5)


def _simulated_generations(pop_dir: Path, generations: int) -> list[dict[str, str]]:
    """Run (or resume) the population in ``pop_dir`` to ``generations`` with the controller's member calls simulated
    (no Ray): a member scores by how close its learning rate is to 1e-3, and a copy takes the explored one. Returns
    population.csv's rows."""
    from jaderl.population.pbt import FORMAT, _Controller, _rng_to_json
    from jaderl.population.space import sample
    from jaderl.population.store import read_state, write_json

    class Simulated(_Controller):
        def _train_all(self, generation: int) -> list[dict[str, Any]]:
            return [{"steps": (generation + 1) * 64, "score": -abs(math.log(lr / 1e-3)), "stop_reason": "period"}
                    for lr in self.lrs]

        def _describe(self, k: int) -> dict[str, Any]:
            return {"steps": 0, "hyperparameters": {"lr": self.lrs[k]}, "node": "local"}

        def _copy(self, parents: list[int], explored: dict[int, dict[str, float]]) -> None:
            for k, values in explored.items():
                self.lrs[k] = values["lr"]

    if (pop_dir / "population.json").exists():  # as resume_pbt reads it
        state = read_state(pop_dir)
        state["settings"]["generations"] = generations
        config = PBTSettings(**state["settings"])
    else:  # as pbt starts it
        pop_dir.mkdir()
        config = PBTSettings("ppo", ENV, members=4, period=64, generations=generations, seed=3,
                             space={"lr": "loguniform:1e-5:1e-1"}, settings=dict(TINY))
        rng = random.Random(config.seed)
        state = {"format": FORMAT, "settings": dataclasses.asdict(config), "generation": 0,
                 "members": [{"parent": k, "hyperparameters": sample(config.validate(), rng)} for k in range(4)]}
        state["rng"] = _rng_to_json(rng)
        write_json(pop_dir / "population.json", state)
    controller = Simulated(pop_dir, config, config.validate(), state)
    controller.lrs = [m["hyperparameters"]["lr"] for m in state["members"]]
    controller._generations(None, time.perf_counter())
    return _rows(pop_dir)


def test_a_parent_of_several_children_puts_its_state_in_the_object_store_once() -> None:
    """Two bottom members copy one top member: the parent's state is taken (and put in the object store) once and
    both children get that one reference. A child whose process died copies the same reference again; a parent whose
    process died gives its state anew once restarted, and its children copy that."""
    from jaderl.population.pbt import _Controller

    ActorError = type("ActorError", (Exception,), {})
    states: list[tuple[int, bool]] = []  # (member, copy_buffer) of every state() call
    taken: list[tuple[int, object]] = []  # (child, state reference) of every exploit that completed
    dying: set[int] = set()  # members whose next exploit finds a process gone

    class Method:
        def __init__(self, remote: Callable[..., Any]) -> None:
            self.remote = remote

    class Actor:
        def __init__(self, k: int) -> None:
            def state(copy_buffer: bool) -> object:
                states.append((k, copy_buffer))
                return object()  # the reference

            def exploit(ref: object, values: dict[str, float]) -> Callable[[], None]:
                def run() -> None:
                    if k in dying:
                        dying.discard(k)
                        raise ActorError
                    taken.append((k, ref))
                return run

            self.state, self.exploit = Method(state), Method(exploit)

    fake_ray = type("Ray", (), {"exceptions": type("exceptions", (), {"RayActorError": ActorError}),
                                "get": staticmethod(lambda ref: ref())})()
    controller = _Controller.__new__(_Controller)
    controller.config, controller.ray = PBTSettings("ppo", ENV, members=5, copy_buffer=False), fake_ray
    controller.actors = [Actor(k) for k in range(5)]
    controller._describe = lambda k: {}  # type: ignore[method-assign]  # (every process alive)
    explored = {2: {"lr": 1e-3}, 3: {"lr": 2e-3}, 4: {"lr": 3e-3}}
    controller._copy([0, 1, 0, 0, 1], explored)
    assert sorted(states) == [(0, False), (1, False)]  # once per parent, not once per child
    refs = dict(taken)
    assert refs[2] is refs[3] and refs[4] is not refs[2]

    states.clear()
    taken.clear()
    dying.add(3)  # child 3's process dies: it copies the same reference again
    controller._copy([0, 1, 0, 0, 1], explored)
    assert sorted(states) == [(0, False), (1, False)] and len(taken) == 3 and dict(taken)[3] is dict(taken)[2]

    states.clear()
    taken.clear()
    dying.add(2)  # parent 0's process died (it is restarted in a new actor): its state is taken from that one

    def restarted(k: int) -> dict[str, Any]:
        if k == 0:
            controller.actors[0] = Actor(0)
        return {}

    controller._describe = restarted  # type: ignore[method-assign]
    controller._copy([0, 1, 0, 0, 1], {2: explored[2]})
    assert states == [(0, False), (0, False)] and len(taken) == 1


def test_a_finished_population_trained_on_copies_as_if_it_had_never_stopped(tmp_path: Path) -> None:
    """`--resume POP_DIR --generations N` on a population that had finished: its last generation, ranked and not
    copied then, makes its copies now, so the population trains on as one started with N generations (the same
    lineage and values), instead of skipping a generation's exploit."""
    straight = _simulated_generations(tmp_path / "straight", 4)
    _simulated_generations(tmp_path / "extended", 2)
    extended = _simulated_generations(tmp_path / "extended", 4)
    assert any(r["parent"] != r["member"] for r in straight if r["generation"] == "2")  # generation 1 copied
    assert extended == straight

def test_copies_of_one_run_retrace_each_other_unless_reseeded(tmp_path: Path) -> None:
    """Two members continued from copies of one checkpoint (a tournament's "best" children) draw the same exploration
    noise and minibatches, so they train to the same parameters; reseeded with their own seeds they differ, and one
    seed gives one result."""
    from jaderl.population.store import copy_run

    settings = dict(TINY, algo="ppo", env=ENV, total_steps=10_000)
    source = Member({**settings, "seed": 1, "run_dir": str(tmp_path / "source")})
    source.train_until(128)
    source.close()

    def child(name: str, seed: int | None) -> list[torch.Tensor]:
        copy_run(tmp_path / "source", tmp_path / name)
        member = Member({**settings, "seed": 1, "run_dir": str(tmp_path / name)})
        if seed is not None:
            member.reseed(seed)
        member.train_until(256)
        params = [p.detach().clone() for p in member.trainer.agent.parameters()]
        member.close()
        return params

    same = [child("a", None), child("b", None)]
    assert all(torch.equal(x, y) for x, y in zip(*same, strict=True))  # they retrace each other
    reseeded = [child("c", 5), child("d", 6), child("e", 5)]
    assert not all(torch.equal(x, y) for x, y in zip(reseeded[0], reseeded[1], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(reseeded[0], reseeded[2], strict=True))


def test_a_period_in_seconds(tmp_path: Path) -> None:
    """period_s: a member trains until that much of its own training time, evaluates and checkpoints; its budget in
    steps stays out of the way and its time limit is left as it was."""
    from jaderl.population.pbt import UNBOUNDED, PBTSettings

    config = PBTSettings("ppo", ENV, generations=3, period_s=0.5, settings=dict(TINY))
    assert config.target(1) == ("time_s", 1.0) and PBTSettings("ppo", ENV, period=64).target(1) == ("steps", 128)
    settings = config.member_settings(0, tmp_path)
    assert settings["total_steps"] == settings["eval_every"] == UNBOUNDED
    member = Member(settings, {"lr": 1e-3})
    out = member.train_until(time_s=0.5)
    assert out["stop_reason"] == "time_limit" and member.trainer.time_s >= 0.5 and out["steps"] > 0
    assert math.isfinite(out["score"]) and member.trainer.config.time_limit is None
    assert api.load(tmp_path / "members" / "m00", best=False).steps == out["steps"]  # checkpointed at the end
    member.close()
    with pytest.raises(ConfigError, match="period_s=0 is out of range"):
        PBTSettings("ppo", ENV, period_s=0).validate()


def test_a_period_of_seconds_that_never_ends_is_refused() -> None:
    """`--period-seconds inf` (or NaN) is refused before anything starts: members would train without end."""
    for period_s in (math.inf, math.nan, -1.0):
        with pytest.raises(ConfigError, match=rf"period_s={period_s} is out of range: it must be a finite number"):
            PBTSettings("ppo", ENV, period_s=period_s, settings=dict(TINY)).validate()


def test_a_budget_in_env_steps_is_the_populations_own(tmp_path: Path) -> None:
    """--set total_steps would be replaced by period * generations without a word: refused before anything starts
    (with periods in seconds a member's total_steps still bounds it)."""
    with pytest.raises(ConfigError, match=r"^total_steps=5000 cannot be given to a population: each member trains "
                                          r"period \* generations = 40 env steps"):
        pbt("ppo", ENV, members=2, period=20, generations=2, run_dir=str(tmp_path / "pop"), total_steps=5000, **TINY)
    assert not (tmp_path / "pop").exists()


def test_exploit_without_the_buffer_keeps_the_members_own_transitions(tmp_path: Path) -> None:
    """copy_buffer=False (an off-policy member): the copy takes its parent's networks but keeps its own replay
    buffer, whose newest episodes are cut where the parent's env state begins."""
    settings = dict(algo="dqn", env=ENV, num_envs=4, horizon=8, hidden=[16, 16], buffer_size=1000, batch_size=32,
                    warmup_steps=64, eval_episodes=2, device="cpu", total_steps=10_000)
    parent = Member({**settings, "seed": 1, "run_dir": str(tmp_path / "a")})
    child = Member({**settings, "seed": 2, "run_dir": str(tmp_path / "b")})
    parent.train_until(256)
    child.train_until(128)
    own_obs = child.trainer.buffer.state_dict()[0]["obs"].clone()
    newest = child.trainer.buffer.state_dict()[1]["ptr"] - 1
    assert not bool(child.trainer.buffer.state_dict()[0]["truncated"][newest].any())  # episodes still running
    child.exploit(parent.state(include_buffer=False), {"lr": 2e-4})
    rows, meta = child.trainer.buffer.state_dict()
    assert torch.equal(rows["obs"], own_obs) and meta["size"] == own_obs.shape[0]
    ended = rows["truncated"][meta["ptr"] - 1] | rows["terminated"][meta["ptr"] - 1]
    assert bool(ended.all())  # the newest episodes end before the parent's env state begins
    for name, tensor in parent.trainer.agent.networks()["q_net"].state_dict().items():
        assert torch.equal(tensor, child.trainer.agent.networks()["q_net"].state_dict()[name])
    assert child.describe()["steps"] == 256
    parent.close()
    child.close()


@pytest.fixture(scope="module")
def population(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """A population of 3 tiny PPO members, 3 generations of 128 steps, made by ``jaderl pbt``: (its directory, the
    JSON it printed, what it printed on stderr)."""
    pop_dir = tmp_path_factory.mktemp("pbt") / "pop"
    argv = ["pbt", "ppo", ENV, "--members", "3", "--period", "128", "--generations", "3", "--seed", "1",
            "--run-dir", str(pop_dir), "--space", "lr=loguniform:1e-4:1e-2", "--resample-probability", "0",
            "--quantile", "0.34", "--json"]
    argv += [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}".replace(" ", ""))]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(argv) == 0
    return pop_dir, json.loads(out.getvalue().splitlines()[-1]), err.getvalue()


def test_population_csv_records_every_member_and_generation(population: tuple[Path, dict, str]) -> None:
    pop_dir, result, err = population
    rows = _rows(pop_dir)
    assert list(rows[0]) == ["generation", "member", "parent", "steps", "score", "hyperparameters", "node"]
    assert [(int(r["generation"]), int(r["member"])) for r in rows] == [(g, m) for g in range(3) for m in range(3)]
    assert all(int(r["steps"]) == 128 * (int(r["generation"]) + 1) for r in rows)
    lines = [line for line in err.splitlines() if line.startswith("generation")]
    assert [line.split(" |")[0] for line in lines] == ["generation 1/3", "generation 2/3", "generation 3/3"]
    # each generation but the last ends with the exploit step: the worst of 3 members (quantile 0.34) copies the best
    assert [re.search(r"\| (\d) copied in [\d.]+ s \|", line) is not None for line in lines] == [True, True, False]
    distinct = 0  # generations whose scores were not all tied: the copy check below ran for them
    for g in (1, 2):  # the worst member of g - 1 started generation g from a copy of the best one, with lr x0.8/1.2
        before = [r for r in rows if int(r["generation"]) == g - 1]
        scores = [float(r["score"]) for r in before]
        # ties: the first of the best copies (split_by_score's stable ranking, best first), the last of the worst copies
        worst = max(k for k, score in enumerate(scores) if score == min(scores))
        best = scores.index(max(scores))
        now = {int(r["member"]): r for r in rows if int(r["generation"]) == g}
        if min(scores) < max(scores):
            distinct += 1
            assert int(now[worst]["parent"]) == best
            lr = json.loads(now[worst]["hyperparameters"])["lr"]
            parent_lr = json.loads(before[best]["hyperparameters"])["lr"]
            assert min(abs(lr / parent_lr - f) for f in (0.8, 1.2)) < 1e-3
        assert sum(int(r["parent"]) != m for m, r in now.items()) <= 1
    assert distinct > 0, "every generation's scores tied: the exploit step went unchecked"
    assert (pop_dir / "population.png").stat().st_size > 0
    state = json.loads((pop_dir / "population.json").read_text())
    assert state["generation"] == 3
    assert result["best_score"] == max(float(r["score"]) for r in rows if r["generation"] == "2")
    assert result["best_run_dir"] == str(pop_dir / "best") and result["generations"] == 3


def test_a_copy_travels_through_the_object_store(population: tuple[Path, dict, str]) -> None:
    """A member that copied another took its evaluations too: its metrics.csv shows the parent's score at the step of
    the copy."""
    pop_dir, _, _ = population
    rows = _rows(pop_dir)
    copies = [r for r in rows if r["parent"] != r["member"]]
    assert copies, "no member copied another"
    for row in copies:
        g, child, parent = int(row["generation"]), row["member"], row["parent"]
        parent_score = next(float(r["score"]) for r in rows if int(r["generation"]) == g - 1 and r["member"] == parent)
        with open(pop_dir / "members" / f"m{int(child):02d}" / "metrics.csv", newline="") as f:
            at_copy = [float(r["eval_return_mean"]) for r in csv.DictReader(f) if int(r["step"]) == 128 * g]
        assert at_copy == [parent_score]


def test_best_member_is_an_ordinary_run_directory(population: tuple[Path, dict, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pop_dir, result, _ = population
    best = Path(result["best_run_dir"])
    assert best == pop_dir / "best" and (best / "checkpoint.json").exists()
    assert api.load(best).config.algo == "ppo"
    assert main(["eval", str(best), "--episodes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    assert api.resume(best, total_steps=512).steps >= 512


def test_resume_after_the_driver_stopped_loses_at_most_a_period(population: tuple[Path, dict, str]) -> None:
    """As if the driver died after the last period's training but before committing it: the resume trains that
    generation no further (every member is at its target), ranks it again and writes its rows once, then trains the
    generation added."""
    pop_dir, _, _ = population
    last = [r["score"] for r in _rows(pop_dir) if r["generation"] == "2"]
    state = json.loads((pop_dir / "population.json").read_text())
    state["generation"] = 2
    (pop_dir / "population.json").write_text(json.dumps(state))
    more = resume_pbt(pop_dir, generations=4)
    rows = _rows(pop_dir)
    assert [(int(r["generation"]), int(r["member"])) for r in rows] == [(g, m) for g in range(4) for m in range(3)]
    assert [r["score"] for r in rows if r["generation"] == "2"] == last  # its evaluations then, not new ones
    for member in (pop_dir / "members").iterdir():
        steps = [line.split(",")[0] for line in (member / "metrics.csv").read_text().splitlines()[1:]]
        assert len(steps) == len(set(steps)), f"{member.name} evaluated a step twice: {steps}"
    assert [int(r["steps"]) for r in rows[-6:]] == [384] * 3 + [512] * 3
    assert more.generations == 4 and json.loads((pop_dir / "population.json").read_text())["generation"] == 4
    with pytest.raises(ConfigError, match="already finished 4 generations; resume with --generations larger than 4"):
        resume_pbt(pop_dir)
    with pytest.raises(ConfigError, match="already finished 4 generations"):
        resume_pbt(pop_dir, generations=3)
    # as if the driver stopped after committing the last generation, before copying its best member (a copy of an
    # earlier generation may be there): the resume copies the best of the last generation and trains nothing
    assert json.loads((pop_dir / "population.json").read_text())["best_generation"] == 4
    state = json.loads((pop_dir / "population.json").read_text())
    state["best_generation"] = 3
    (pop_dir / "population.json").write_text(json.dumps(state))
    (pop_dir / "best" / "checkpoint.json").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="already finished 4 generations"):
        resume_pbt(pop_dir, generations=3)  # fewer generations than it trained: refused, copied or not
    copied = resume_pbt(pop_dir)
    last = {int(r["member"]): float(r["score"]) for r in _rows(pop_dir) if r["generation"] == "3"}
    best = max(last, key=lambda k: last[k])
    assert (copied.best_member, copied.best_score, copied.generations) == (best, pytest.approx(last[best]), 4)
    assert (pop_dir / "best" / "checkpoint.json").exists() and len(_rows(pop_dir)) == 12
    with pytest.raises(ConfigError, match="already finished 4 generations"):
        resume_pbt(pop_dir)


def test_a_driver_that_dies_while_members_copy_redoes_the_same_copies(local_ray: None, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan of a generation's copies (who copies whom, the explored values) is saved before any copy: after the
    driver dies with a copy made and nothing committed, ``--resume`` makes the planned copies, and population.csv
    records that lineage and those values."""
    from jaderl.population.pbt import _Controller

    copy = _Controller._copy
    calls: list[dict[int, dict[str, float]]] = []

    def dies_during_the_second(self: Any, parents: list[int], explored: dict[int, dict[str, float]]) -> None:
        calls.append(explored)
        copy(self, parents, explored)  # (generation 1's copy made, its commit not)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(_Controller, "_copy", dies_during_the_second)
    with pytest.raises(KeyboardInterrupt):
        pbt("ppo", ENV, members=3, period=128, generations=3, seed=2, space=["lr=loguniform:1e-4:1e-2"],
            quantile=0.34, run_dir=str(tmp_path / "pop"), **TINY)
    state = json.loads((tmp_path / "pop" / "population.json").read_text())
    assert state["generation"] == 1 and "pending" in state
    plan = state["pending"]
    monkeypatch.setattr(_Controller, "_copy", copy)
    resume_pbt(tmp_path / "pop")
    assert "pending" not in json.loads((tmp_path / "pop" / "population.json").read_text())
    rows = [r for r in _rows(tmp_path / "pop") if r["generation"] == "2"]
    assert [int(r["parent"]) for r in rows] == plan["parents"] and len(plan["explored"]) == 1
    for k, values in plan["explored"].items():
        assert json.loads(rows[int(k)]["hyperparameters"]) == pytest.approx(values, rel=1e-5)
    assert [(int(r["generation"]), int(r["member"])) for r in _rows(tmp_path / "pop")] == \
        [(g, m) for g in range(3) for m in range(3)]


def _member_pids(busy: str = "", kinds: tuple[str, ...] = ("Member", "Standby")) -> list[int]:
    """Process ids of this test process's Ray workers (not another test's) holding a population member or a standby
    (``busy``: only those inside that method; ``kinds``: only those actor classes)."""
    from tests.conftest import _descendants

    return [pid for pid, (state, cmd) in _descendants().items() if state != "Z"
            and any(cmd.startswith(f"ray::{kind}{'.' + busy if busy else ''}") for kind in kinds)]


def _imported_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's library loaded."""
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_a_standby_becomes_a_member(tmp_path: Path) -> None:
    """The standby process's actor (jaderl imported, no Trainer) turns into a member that trains and checkpoints."""
    standby = Standby()
    assert standby.start({"algo": "ppo", "env": ENV, "seed": 0, "run_dir": str(tmp_path / "m"), **TINY}) == os.getpid()
    assert standby.describe()["steps"] == 0 and standby.train_for(64)["steps"] >= 64
    assert (tmp_path / "m" / "checkpoint.json").exists()
    standby.close()
    # the tournament's reuse: the same process becomes another member, of another algorithm, from step 0
    first = weakref.ref(standby.trainer)
    standby.start({"algo": "a2c", "env": ENV, "seed": 1, "run_dir": str(tmp_path / "m2"), "device": "cpu"})
    assert first() is None, "the previous member's Trainer is still alive"
    assert standby.describe()["algo"] == "a2c" and standby.describe()["steps"] == 0
    assert standby.train_for(64)["steps"] >= 64 and (tmp_path / "m2" / "checkpoint.json").exists()
    standby.close()


def test_a_standby_has_imported_what_training_imports_later() -> None:
    """A new process's first optimizer imports ``torch._dynamo`` (seconds of CPU time); a standby has done so before it
    becomes a member, so that a dead member trains again sooner."""
    code = ("import sys; from jaderl.population.member import Standby; before = 'torch._dynamo' in sys.modules; "
            "Standby(); print(before, 'torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "True"], done.stderr


@pytest.mark.alone  # the 10 s to train again are the population's on this machine, with no other test beside it
@pytest.mark.parametrize("spare_cpu", [True, False], ids=["on-the-standby", "in-a-new-process"])
def test_a_member_killed_mid_period_is_restarted_from_its_checkpoint(local_ray: None, tmp_path: Path,
                                                                     spare_cpu: bool) -> None:
    """SIGKILL one member's process while it trains: the population notices and restarts it from its last
    checkpoint, training again within the issue's 10 s, and finishes every generation; no member or standby process
    stays after the population ends. With a CPU that no member holds (members at cpu=0.5 on 2 CPUs) the member
    continues on the standby process (jaderl imported already); on a cluster the members fill there is no standby
    (its import would slow the members down) and the member starts in a new process."""
    pop_dir = tmp_path / "pop"
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            # periods of 6 s of each member's training time, so that the standby comes up before the population
            # ends even on busy cores (periods in env steps ended first under CI's load)
            outcome["result"] = pbt("ppo", ENV, members=2, period_s=6.0, generations=3, seed=4, run_dir=str(pop_dir),
                                    space=["lr=loguniform:1e-4:1e-2"], resources="cpu=0.5" if spare_cpu else "",
                                    **TINY)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    def ready() -> bool:  # both members train; the standby, when there is one, has imported torch
        if len(_member_pids("train_until")) < 2:
            return False
        return not spare_cpu or bool((standby := _member_pids(kinds=("Standby",)))
                                     and all(_imported_torch(pid) for pid in standby))

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120  # three processes importing torch, slow when every core is busy
    while not ready() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    busy, standby = _member_pids("train_until"), set(_member_pids(kinds=("Standby",)))
    assert len(busy) == 2, f"the members did not start training: {outcome}"
    if spare_cpu:
        assert standby, "no standby process started"
        time.sleep(1.0)  # the standby's torch is loaded; give it a moment to finish importing jaderl
    else:
        time.sleep(2.0)  # a standby that was wrongly started would show by now
        assert not _member_pids(kinds=("Standby",)), "a standby started on a cluster that the members fill"
    members_then = set(_member_pids(kinds=("Member",)))
    killed_at = time.monotonic()
    os.kill(busy[0], signal.SIGKILL)
    # restored: a process other than the surviving members holds the member (its checkpoint loaded) and trains again
    while not (restored := set(_member_pids("train_until")) - members_then) and thread.is_alive():
        time.sleep(0.05)
    restored_s = time.monotonic() - killed_at
    assert restored, f"the killed member never trained again: {outcome}"
    if spare_cpu:
        assert restored == standby, "the killed member did not continue on the standby process"
    assert restored_s < 10, f"the killed member trained again only {restored_s:.1f} s later"
    thread.join(timeout=120)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    rows = _rows(pop_dir)
    assert [(int(r["generation"]), int(r["member"])) for r in rows] == [(g, m) for g in range(3) for m in range(2)]
    assert all(math.isfinite(float(r["score"])) for r in rows)
    assert len({r["node"] for r in rows}) >= 1
    assert all(r["node"] for r in rows), "a row does not say which node trained it"
    assert time.monotonic() - killed_at < 120
    deadline = time.monotonic() + 10  # killed actors' processes exit moments later
    while _member_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _member_pids(), "a member's or standby's process outlived its population"


def test_too_many_members_are_refused_before_any_starts(local_ray: None, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["pbt", "ppo", ENV, "--members", "3", "--resources-per-member", "cpu=1", "--run-dir",
                    str(tmp_path / "p")], capsys)
    assert "3 members at cpu=1 need 3 CPUs, but the cluster has 2 CPUs" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p").exists()


def test_a_population_directory_in_use_is_refused(population: tuple[Path, dict, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pop_dir, _, _ = population
    assert "continue it with `jaderl pbt --resume`" in _refused(["pbt", "ppo", ENV, "--run-dir", str(pop_dir)], capsys)
    state = (pop_dir / "population.json").read_text()
    with driven(pop_dir):  # a driver of it still running: a resume would change its members and files too
        err = _refused(["pbt", "--resume", str(pop_dir), "--generations", "9"], capsys).strip()
    assert err == (f"jaderl: error: {pop_dir} is in use by another driver (pid {os.getpid()} on "
                   f"{socket.gethostname()}); wait for it to end, or stop it with Ctrl-C, before resuming")
    assert (pop_dir / "population.json").read_text() == state


def test_an_address_that_does_not_answer_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jaderl.population.cluster import check_reachable

    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"the Ray cluster at 127.0.0.1:1 does not answer"):
        check_reachable("127.0.0.1:1")
    with pytest.raises(ConfigError, match="is not host:port"):
        check_reachable("nowhere")
    assert time.monotonic() - start < 10


def test_a_tournament_that_fails_kills_the_member_that_failed(tmp_path: Path) -> None:
    """A member whose period fails (not a divergence) stops the tournament in one sentence, and its actor is killed
    as every other one is: none outlives the tournament (a Ray the caller started and keeps would keep it)."""
    from jaderl.population.space import parse_space
    from jaderl.population.tournament import _Tournament

    class Failing:
        def start(self, settings: dict[str, Any], values: dict[str, float]) -> int:
            return 1

        def train_for(self, steps: int) -> dict[str, Any]:
            raise ValueError("a bad env step")

    fake = FakeRay(Failing)
    (tmp_path / "t").mkdir()
    runner = _Tournament(fake, {}, tmp_path / "t", ["ppo"], ENV, {"ppo": parse_space(api.ALGOS["ppo"].agent_cls, [])},
                         {}, 64, 2, (0.0, 0.0, 1.0), random.Random(0), 0)
    with pytest.raises(PopulationError, match="member t0000 failed: a bad env step"):
        runner.run(pool=1, rounds=2, size=2, progress=None)
    assert len(fake.actors) == 2 and set(map(id, fake.killed)) == set(map(id, fake.actors))  # the board, the member

def test_a_tournament_fusion_that_fails_copies_the_best_entry(tmp_path: Path) -> None:
    """Leaderboard entries that cannot be averaged (networks of other shapes) do not stop the tournament: the member
    is a copy of the best entry, with a one-sentence warning saying why, and tournament.csv records it as such."""
    from jaderl.algos.ppo import PPO
    from jaderl.core.loop import Trainer
    from jaderl.population.space import parse_space, sample
    from jaderl.population.tournament import _Tournament

    pop_dir, space = tmp_path / "t", parse_space(api.ALGOS["ppo"].agent_cls, [])
    entries = []
    for name, hidden, score in (("a", [16, 16], 2.0), ("b", [32, 32], 1.0)):
        run_dir = pop_dir / "leaderboard" / name
        config = api.make_config("ppo", ENV, seed=1, run_dir=str(run_dir), hidden=hidden, eval_episodes=2,
                                 device="cpu")
        with Trainer(config, PPO) as trainer:
            trainer.checkpoint()
        entries.append({"name": name, "algo": "ppo", "score": score, "steps": 0, "origin": "fresh", "parents": [],
                        "hyperparameters": sample(space, random.Random(0)), "run_dir": str(run_dir)})
    (pop_dir / "leaderboard.json").write_text(json.dumps({"size": 2, "entries": entries}))
    runner = _Tournament(FakeRay(Continuing), {}, pop_dir, ["ppo"], ENV, {"ppo": space}, {}, 128, 2,
                         (0.0, 1.0, 0.0), random.Random(0), 0)
    with pytest.warns(UserWarning) as warned:
        result = runner.run(pool=1, rounds=1, size=2, progress=None)
    [warning] = [str(w.message) for w in warned if "cannot be fused" in str(w.message)]
    assert re.fullmatch(r"member t0000 copies the best entry a instead of fusing a, b, which cannot be fused: \S+ has "
                        r"hidden=\[32, 32\] but \S+ has hidden=\[16, 16\]; [^.]*", warning), warning
    with open(pop_dir / "tournament.csv", newline="") as f:
        [row] = list(csv.DictReader(f))
    assert (row["member"], row["origin"], row["parents"], row["score"]) == ("t0000", "best", "a", "0.5")
    assert api.load(pop_dir / "members" / "t0000", best=False).config.hidden == [16, 16]
    assert result.best_score == 2.0 and [e["name"] for e in result.leaderboard] == ["a", "b"]


def test_tournament_csv_is_flushed_and_synced_for_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row of tournament.csv is on disk (written, flushed, synced) before the file replaces the last one, as
    population.csv's rows are."""
    from jaderl.population.space import parse_space
    from jaderl.population.tournament import _Tournament

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.name.startswith("tournament.csv"):
            synced.append(path.read_text())  # what the file holds on disk when it is synced
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    (tmp_path / "t").mkdir()
    runner = _Tournament(FakeRay(Continuing), {}, tmp_path / "t", ["ppo"], ENV,
                         {"ppo": parse_space(api.ALGOS["ppo"].agent_cls, [])}, {}, 64, 2, (0.0, 0.0, 1.0),
                         random.Random(0), 0)
    for round_ in range(2):
        info = {"round": round_, "member": f"t{round_:04d}", "algo": "ppo", "origin": "fresh", "parents": []}
        runner.update(None, info, {"score": -math.inf, "steps": 0}, {"hyperparameters": {}})
        assert len(synced) == round_ + 1 and f"t{round_:04d}" in synced[-1]
        assert (tmp_path / "t" / "tournament.csv").read_text() == synced[-1]


def test_tournament_of_two_algorithms(local_ray: None, tmp_path: Path) -> None:
    """Asynchronous tournament: PPO and A2C members, a leaderboard of 2 persisted to disk, later members continued
    from the best entry or fused from the top entries of one algorithm."""
    from jaderl.population import tournament

    finished: list[dict] = []
    result = tournament(["ppo", "a2c"], ENV, pool=2, period=128, rounds=4, leaderboard_size=2, fuse_top=2,
                        strategy_weights=(1.0, 1.0, 0.0), seed=2, run_dir=str(tmp_path / "t"),
                        space=["lr=loguniform:1e-4:1e-2"], progress=finished.append, **TINY)
    with open(tmp_path / "t" / "tournament.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["round"]) for r in rows) == [0, 1, 2, 3] and len(finished) == 4
    first_two = [r for r in rows if int(r["round"]) < 2]
    assert all(r["origin"] == "fresh" for r in first_two) and {r["algo"] for r in rows} <= {"ppo", "a2c"}
    for row in rows:
        if row["origin"] == "best":  # continued from its parent's state: one more period on top of its steps
            parent = next(r for r in rows if r["member"] == row["parents"])
            assert int(row["steps"]) == int(parent["steps"]) + 128
        elif row["origin"] == "fuse":
            assert len(row["parents"].split()) == 2
    # (by round, not by row: a continued member in a warm process may finish before a fresh one that started first)
    assert {r["origin"] for r in rows if int(r["round"]) >= 2} <= {"best", "fuse"}
    # a finished member's process trains the next member (torch imported once): 4 rounds in the pool's 2 processes
    assert len({info["pid"] for info in finished}) == 2 and None not in {info["pid"] for info in finished}
    board = json.loads((tmp_path / "t" / "leaderboard.json").read_text())
    scores = [e["score"] for e in board["entries"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)
    assert scores[0] == max(float(r["score"]) for r in rows) == result.best_score
    assert all(Path(e["run_dir"], "checkpoint.json").exists() for e in board["entries"])
    assert len(list((tmp_path / "t" / "leaderboard").iterdir())) == 2  # evicted entries' copies are gone
    assert api.load(result.best_run_dir).config.algo == board["entries"][0]["algo"]
    for path in (tmp_path / "t").rglob("config.yaml"):  # its history records changes only
        for line in path.read_text().splitlines():
            if line.startswith("# step"):
                changes = [change.split(" ") for change in line.split(": ", 1)[1].split(", ")]
                assert all(old != new for _, old, _, new in changes), f"{path}: {line}"
    # continued on Ray with one more round (tests/population/test_tournament_resume.py: a driver that stopped)
    more = resume_tournament(tmp_path / "t", rounds=5)
    with open(tmp_path / "t" / "tournament.csv", newline="") as f:
        assert [r["round"] for r in csv.DictReader(f)] == [r["round"] for r in rows] + ["4"]
    assert more.rounds == 5 and more.best_score >= result.best_score


def test_tune_pbt_keeps_the_explored_hyperparameters_and_trials_keep_their_run_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Tune's PBT does to a trainable: ``reset_config`` with the explored learning rate, then ``restore`` of the
    copied checkpoint, which keeps the explored value. A trial started again in a new actor continues in its run
    directory; another trial that reuses the actor gets a Trainer of its own."""
    import ray.tune.trainable.trainable as trainable_module

    from jaderl.population.tune import JaderlTrainable

    monkeypatch.setattr(trainable_module, "DEFAULT_STORAGE_PATH", str(tmp_path))  # trial directories
    config = {"algo": "ppo", "env": ENV, "period": 128, "lr": 1e-3, **TINY}  # one rollout of 4 x 32
    trainable = JaderlTrainable(config=dict(config))
    again = JaderlTrainable.__new__(JaderlTrainable)
    try:
        trainable.train()
        checkpoint = trainable.save()
        explored = dict(config, lr=5e-3)
        assert trainable.reset_config(explored)
        trainable.config = explored  # (Tune's reset sets it)
        trainable.restore(checkpoint)
        assert trainable.trainer.config.lr == 5e-3 == trainable.trainer.agent.optimizer.param_groups[0]["lr"]
        assert trainable.trainer.agent.steps == 128
        again._logdir = trainable.logdir  # a new actor for the same trial: Tune gives it the trial's directory
        again.setup(dict(config))
        assert again.trainer.run_dir == trainable.trainer.run_dir and again.trainer.agent.steps == 128
        again.cleanup()
        other = dict(config, algo="a2c", period=256, lr=7e-4)
        for key in ("minibatch_size", "num_epochs"):  # PPO's, not A2C's
            other.pop(key)
        assert trainable.reset(other)  # another trial: its own directory and Trainer, in this process
        assert trainable.trainer.config.algo == "a2c" and trainable.period == 256
        assert trainable.trainer.run_dir == Path(trainable.logdir) / "run" != again.trainer.run_dir
    finally:
        trainable.stop()


def test_tune_pbt_exploit_carries_the_parents_best_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune's PBT exploit: a trial restores another trial's checkpoint. As a copy in jaderl's own PBT, it takes the
    parent's best policy with the parent's evaluation history, so its best-policy file and its best score are the
    parent's (its own file used to stay, beside the parent's history and best score)."""
    import ray.tune.trainable.trainable as trainable_module

    from jaderl.population.tune import JaderlTrainable

    monkeypatch.setattr(trainable_module, "DEFAULT_STORAGE_PATH", str(tmp_path))
    config = {"algo": "ppo", "env": ENV, "period": 128, "lr": 1e-3, **TINY}
    parent, child = JaderlTrainable(config=dict(config, seed=1)), JaderlTrainable(config=dict(config, seed=2))

    def best_policy(trainable: JaderlTrainable) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        with safe_open(str(trainable.trainer.run_dir / BEST_POLICY), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})  # noqa: SIM118

    try:
        parent.train()
        child.train()
        checkpoint = parent.save()
        (tensors, meta), best = best_policy(parent), parent.trainer.best_return
        child_tensors, _ = best_policy(child)
        assert not all(torch.equal(tensors[k], child_tensors[k]) for k in tensors)  # (seeds 1 and 2 differ)
        assert child.reset_config(dict(config, seed=2, lr=1.2e-3))
        child.config = dict(config, seed=2, lr=1.2e-3)
        child.restore(checkpoint)
        copied, copied_meta = best_policy(child)
        assert copied_meta == meta and float(meta["eval_return_mean"]) == best == child.trainer.best_return
        assert copied.keys() == tensors.keys() and all(torch.equal(copied[k], tensors[k]) for k in tensors)
        result = child.train()
        assert result["best_eval_return"] >= best and child.trainer.agent.steps == 256
        assert float(best_policy(child)[1]["eval_return_mean"]) == result["best_eval_return"]
    finally:
        parent.stop()
        child.stop()


def test_tune_trainable_under_asha(local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' example, tiny: two trials of PPO under Tune's ASHA; checkpoints are jaderl's own safetensors + JSON,
    which jaderl.load reads, and a restored trainable continues from the saved step."""
    import ray.tune.trainable.trainable as trainable_module
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from jaderl.population.tune import JaderlTrainable

    tuner = tune.Tuner(
        tune.with_resources(JaderlTrainable, {"cpu": 1}),
        param_space={"algo": "ppo", "env": ENV, "period": 128, "lr": tune.loguniform(1e-4, 1e-2), **TINY},
        tune_config=tune.TuneConfig(metric="eval_return", mode="max", num_samples=2,
                                    scheduler=ASHAScheduler(max_t=2, grace_period=1)),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="asha", stop={"training_iteration": 2},
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True), verbose=0))
    results = tuner.fit()
    assert not results.errors and len(results) == 2
    best = results.get_best_result()
    assert best.metrics["env_steps"] in (128, 256) and math.isfinite(best.metrics["eval_return"])
    with best.checkpoint.as_directory() as ckpt:
        assert sorted(p.suffix for p in Path(ckpt).iterdir()) == [".json", ".safetensors"]
        agent = api.load(ckpt, best=False)
        assert agent.steps == best.metrics["env_steps"] and agent.config.lr == pytest.approx(best.config["lr"])
        monkeypatch.setattr(trainable_module, "DEFAULT_STORAGE_PATH", str(tmp_path))  # not ~/ray_results
        trainable = JaderlTrainable(config={**best.config, "period": 128})
        try:
            trainable.restore(ckpt)
            assert trainable.train()["env_steps"] == agent.steps + 128
        finally:
            trainable.stop()
