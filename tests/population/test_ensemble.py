"""Fusion of finished runs and ensembles (jaderl.population.ensemble, ``jaderl fuse``); no Ray needed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from jaderl import api
from jaderl.cli import main
from jaderl.core.checkpoint import load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.population import Ensemble, fuse_runs

ENV = "jaderl/CartPole-v1"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two tiny PPO runs on CartPole with different seeds (about a second each)."""
    root = tmp_path_factory.mktemp("runs")
    torch.set_num_threads(1)
    settings = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden=[16, 16], eval_every=256,
                    checkpoint_every=256, eval_episodes=2, total_steps=256, device="cpu")
    return [Path(api.train("ppo", ENV, seed=seed, run_dir=str(root / f"s{seed}"), **settings).run_dir)
            for seed in (1, 2)]


def test_fused_run_holds_the_mean_of_the_runs(two_runs: list[Path], tmp_path: Path) -> None:
    report = fuse_runs(two_runs, tmp_path / "fused")
    a, b, fused = (load_checkpoint(d, part="agent") for d in (*two_runs, tmp_path / "fused"))
    for name, tensor in fused["networks"]["actor"].items():
        torch.testing.assert_close(tensor, (a["networks"]["actor"][name] + b["networks"]["actor"][name]) / 2)
    adam = fused["optimizers"]["optimizer"]["state"][0]["exp_avg_sq"]
    torch.testing.assert_close(adam, (a["optimizers"]["optimizer"]["state"][0]["exp_avg_sq"]
                                      + b["optimizers"]["optimizer"]["state"][0]["exp_avg_sq"]) / 2)
    assert not torch.equal(a["networks"]["actor"]["net.0.weight"], b["networks"]["actor"]["net.0.weight"])
    # an ordinary run directory: evaluated once (its own row), loadable, resumable
    rows = (tmp_path / "fused" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 2 and float(rows[1].split(",")[2]) == pytest.approx(report["eval_return"])
    agent = api.load(tmp_path / "fused", best=False)
    torch.testing.assert_close(agent.actor.state_dict()["net.0.weight"], fused["networks"]["actor"]["net.0.weight"])
    assert api.resume(tmp_path / "fused", total_steps=384).steps >= 384


def test_fuse_refuses_runs_of_other_settings(two_runs: list[Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    other = api.train("ppo", ENV, seed=3, run_dir=str(tmp_path / "wide"), num_envs=4, horizon=32, minibatch_size=64,
                      num_epochs=2, hidden=[32, 32], eval_every=256, eval_episodes=2, total_steps=128, device="cpu")
    with pytest.raises(SystemExit) as exit_info:
        main(["fuse", str(two_runs[0]), other.run_dir, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "hidden=[32, 32]" in err and "same settings" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("kept")
    with pytest.raises(SystemExit) as exit_info:
        main(["fuse", *map(str, two_runs), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("is not an empty directory; pick another --out")
    assert (tmp_path / "out" / "notes.txt").read_text() == "kept"


def test_fuse_names_the_algorithms_of_runs_of_two(two_runs: list[Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Runs of two algorithms differ in settings one of them does not have: the algorithms are named, not those."""
    dqn = api.train("dqn", ENV, seed=3, run_dir=str(tmp_path / "dqn"), num_envs=4, horizon=8, hidden=[16, 16],
                    buffer_size=1000, batch_size=32, warmup_steps=64, eval_every=128, eval_episodes=2,
                    total_steps=128, device="cpu")
    with pytest.raises(SystemExit) as exit_info:
        main(["fuse", "--out", str(tmp_path / "out"), str(two_runs[0]), dqn.run_dir])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"jaderl: error: {two_runs[0]} is a ppo run and {dqn.run_dir} a dqn run; only runs of one algorithm can be "
        "fused (an Ensemble combines agents of several algorithms)")
    assert not (tmp_path / "out").exists()


def test_fuse_refuses_a_run_given_twice(two_runs: list[Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Fusing a run with itself averages an agent with itself: nothing to fuse, refused before anything is read."""
    run = str(two_runs[0])
    with pytest.raises(SystemExit) as exit_info:
        main(["fuse", "--out", str(tmp_path / "out"), run, run])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"jaderl: error: {run} is given twice; fusing a run with itself averages its agent with itself and changes "
        "nothing, so pass each run directory once")
    other_spelling = str(two_runs[0] / ".." / two_runs[0].name)
    with pytest.raises(ConfigError, match=rf"^{re.escape(run)} and {re.escape(other_spelling)} are the same run "
                                          "directory; fusing a run with itself"):
        fuse_runs([run, str(two_runs[1]), other_spelling], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_fusion_that_fails_leaves_no_run_behind(two_runs: list[Path], tmp_path: Path) -> None:
    """Runs whose optimizers hold states of other shapes (one never updated) cannot be fused: the refusal leaves
    nothing in ``out``, so fusing into it again, once the runs are fixed, is not refused as a directory in use."""
    from jaderl.algos.ppo import PPO
    from jaderl.core.loop import Trainer

    config = api.make_config("ppo", ENV, seed=3, run_dir=str(tmp_path / "new"), num_envs=4, horizon=32,
                             minibatch_size=64, num_epochs=2, hidden=[16, 16], eval_episodes=2, device="cpu")
    with Trainer(config, PPO) as trainer:  # a checkpoint at step 0: no optimizer step taken, no Adam state
        trainer.checkpoint()
    with pytest.raises(ConfigError, match=r"cannot fuse .*have all taken a step"):
        fuse_runs([two_runs[0], tmp_path / "new"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="cannot fuse"):
        fuse_runs([two_runs[0], tmp_path / "new"], tmp_path / "empty")
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    assert fuse_runs(two_runs, tmp_path / "out")["run_dir"] == str(tmp_path / "out")


def test_fuse_command_prints_json(two_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuse", *map(str, two_runs), "--out", str(tmp_path / "f"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["run_dir"] == str(tmp_path / "f") and len(report["fused"]) == 2
    assert api.evaluate(tmp_path / "f", episodes=2)["episodes"] == 2


class _Fixed:
    """A stand-in agent that always takes the same action (the ensemble only calls act / predict)."""

    def __init__(self, action: Any, discrete: bool, agent: Any) -> None:
        self.action, self.is_discrete = action, discrete
        self.config, self.device, self.action_dim = agent.config, agent.device, 3
        # continuous actions: a spec that says so (in [-1, 1], not rescaled)
        self.spec = agent.spec if discrete else agent.spec.replace(is_discrete=False, action_dim=len(action))

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return torch.as_tensor(self.action).expand(obs.shape[0], *np.shape(self.action)).clone()

    def predict(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        return self.act(torch.as_tensor(obs)[None])[0].numpy()


@pytest.mark.parametrize(("actions", "discrete", "expected"), [
    ([0, 2, 2], True, 2),        # majority
    ([1, 0, 2], True, 0),        # a tie goes to the smaller index
    ([[0.5, -1.0], [1.0, 0.0], [0.0, 0.4]], False, [0.5, -0.2]),  # continuous: the mean
])
def test_ensemble_combines_actions(two_runs: list[Path], actions: list[Any], discrete: bool, expected: Any) -> None:
    base = api.load(two_runs[0])
    dtype = torch.int64 if discrete else torch.float32
    ensemble = Ensemble([_Fixed(torch.tensor(a, dtype=dtype), discrete, base) for a in actions])  # type: ignore[misc]
    out = ensemble.act(torch.zeros(5, 4))
    assert out.shape[0] == 5
    torch.testing.assert_close(out[0].float(), torch.tensor(expected, dtype=torch.float32))
    np.testing.assert_allclose(ensemble.predict(np.zeros(4, np.float32)), expected, rtol=1e-6)


def test_fuse_names_a_damaged_checkpoint_and_what_fusing_needs(two_runs: list[Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose last checkpoint is damaged: the message used to suggest its best policy and `jaderl eval`, which
    fusing cannot use."""
    damaged = tmp_path / "damaged"
    shutil.copytree(two_runs[1], damaged)
    tensor_file = next(damaged.glob("ckpt-*.safetensors"))
    tensor_file.write_bytes(tensor_file.read_bytes()[:100])
    with pytest.raises(SystemExit) as exit_info:
        main(["fuse", str(two_runs[0]), str(damaged), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(rf"jaderl: error: {re.escape(str(damaged))} holds no readable checkpoint: "
                        rf"{re.escape(str(tensor_file))} is missing or damaged \(.+\); fusion averages the runs' last "
                        rf"checkpoints, so restore {re.escape(str(damaged))} from a copy or leave it out", err), err
    assert "jaderl eval" not in err and not (tmp_path / "out").exists()
    (damaged / "checkpoint.json").write_text("{")  # a damaged JSON: load's advice was its best policy (best=True)
    with pytest.raises(SystemExit):
        main(["fuse", str(two_runs[0]), str(damaged), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"is missing or damaged); fusion averages the runs' last checkpoints, so restore {damaged} "
                        "from a copy or leave it out") and "best=True" not in err, err


def test_ensemble_of_runs_evaluates(two_runs: list[Path]) -> None:
    ensemble = Ensemble.from_runs(two_runs)
    report = ensemble.evaluate(episodes=3)
    assert report["episodes"] == 3 and report["mean"] >= 1  # CartPole: every step is worth 1
    assert ensemble.predict(np.zeros(4, np.float32)) in (0, 1)


def test_ensemble_from_runs_refuses_one_path_for_a_list(two_runs: list[Path]) -> None:
    """A single run directory used to be read as its characters (``r holds no readable checkpoint``)."""
    for one in (str(two_runs[0]), two_runs[0]):
        with pytest.raises(ConfigError, match=rf'^from_runs takes a list of run directories, not one path: pass '
                                              rf'\["{re.escape(str(two_runs[0]))}"\]$'):
            Ensemble.from_runs(one)  # type: ignore[arg-type]


def test_ensemble_evaluate_refuses_episodes_that_are_not_a_count(two_runs: list[Path]) -> None:
    """``episodes=0`` used to be named ``num_envs`` (by the env), and ``episodes="2"`` was taken."""
    ensemble = Ensemble([api.load(two_runs[0])])
    for episodes in (0, -1, "2", 2.0, True, None):
        with pytest.raises(ConfigError, match=rf"^episodes={re.escape(repr(episodes))} is out of range: it must be a "
                                              r"whole number >= 1 \(how many episodes to run\)$"):
            ensemble.evaluate(episodes=episodes)  # type: ignore[arg-type]
    assert ensemble.evaluate(episodes=1)["episodes"] == 1


def test_multi_agent_members_copy_fuse_and_ensemble(tmp_path: Path) -> None:
    """MAPPO on the torch-native simple_spread: a member takes another's state, runs fuse, and an ensemble acts
    (its return is the team's, the sum over agents)."""
    from jaderl.population.member import Member

    settings = dict(algo="mappo", env="jaderl/simple_spread", num_envs=4, horizon=25, hidden=[16, 16],
                    minibatch_size=50, num_epochs=1, eval_episodes=2, device="cpu", total_steps=10_000)
    a = Member({**settings, "seed": 1, "run_dir": str(tmp_path / "a")}, {"lr": 1e-3})
    b = Member({**settings, "seed": 2, "run_dir": str(tmp_path / "b")}, {"lr": 2e-3})
    a.train_until(200)
    b.train_until(200)
    b.exploit(a.state(), {"lr": 1.5e-3})
    for name, tensor in a.trainer.agent.actor.state_dict().items():
        assert torch.equal(tensor, b.trainer.agent.actor.state_dict()[name])
    a.close()
    b.close()
    report = fuse_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "f")
    assert report["eval_return"] < 0  # simple_spread's rewards are distances: negative
    ensemble = Ensemble.from_runs([tmp_path / "a", tmp_path / "f"])
    assert ensemble.act(torch.zeros(3, 3, ensemble.spec.obs_shape[-1])).shape[:2] == (3, 3)
    assert ensemble.evaluate(episodes=2)["mean"] < 0


def _merged(stats: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean and variance of the union of the samples of normalisers saved as ``stats``, and their mean count."""
    counts = [s["count"].double() for s in stats]
    count = sum(counts)
    mean = sum(n * s["mean"].double() for n, s in zip(counts, stats, strict=True)) / count
    var = sum(n * (s["var"].double() + (s["mean"].double() - mean).square())
              for n, s in zip(counts, stats, strict=True)) / count
    return {"count": (count / len(stats)).float(), "mean": mean.float(), "var": var.float()}


def test_fusion_keeps_the_first_runs_own_running_returns(tmp_path: Path) -> None:
    """With normalize_reward, the reward normaliser's statistics are merged as those of both runs' returns together,
    but its running discounted returns are those of the first run's sub-envs' episodes, which the fused run continues:
    they stay the first run's."""
    settings = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=1, hidden=[16, 16], eval_every=128,
                    eval_episodes=2, total_steps=128, device="cpu", normalize_reward=True)
    runs = [api.train("ppo", ENV, seed=seed, run_dir=str(tmp_path / f"s{seed}"), **settings).run_dir for seed in (1, 2)]
    fuse_runs(runs, tmp_path / "fused")
    a, b, fused = (load_checkpoint(d, part="agent")["running_stats"]["reward_norm"]
                   for d in (*runs, tmp_path / "fused"))
    assert not torch.equal(a["running"], b["running"])
    torch.testing.assert_close(fused["running"], a["running"])
    expected = _merged([a, b])
    for key in ("count", "mean", "var"):
        torch.testing.assert_close(fused[key], expected[key])


def test_fusion_merges_normalisers_of_runs_of_unequal_lengths(tmp_path: Path) -> None:
    """Runs that trained 128 and 384 env steps: the fused observation and reward normalisers hold the mean and
    variance of the 512 steps' samples together (the longer run weighs three times as much), not the plain mean of
    the two, and the mean count (256)."""
    settings = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=1, hidden=[16, 16], eval_episodes=2,
                    device="cpu", normalize_obs=True, normalize_reward=True)
    runs = [api.train("ppo", ENV, seed=seed, run_dir=str(tmp_path / f"s{seed}"), total_steps=steps,
                      eval_every=steps, **settings).run_dir for seed, steps in ((1, 128), (2, 384))]
    fuse_runs(runs, tmp_path / "fused")
    saved = [load_checkpoint(d, part="agent")["running_stats"] for d in (*runs, tmp_path / "fused")]
    for name in ("obs_norm", "reward_norm"):
        a, b, fused = (s[name] for s in saved)
        assert a["count"].item() == pytest.approx(128, abs=1e-3) and b["count"].item() == pytest.approx(384, abs=1e-3)
        expected = _merged([a, b])
        for key in ("count", "mean", "var"):
            torch.testing.assert_close(fused[key], expected[key])
        assert not torch.allclose(fused["mean"], (a["mean"] + b["mean"]) / 2)


def test_fused_run_keeps_the_device_of_its_runs(two_runs: list[Path], tmp_path: Path) -> None:
    """Runs trained on a GPU (their checkpoints' and config.yaml's device is cuda; their tensors, read here on the
    CPU, are the same) fuse on the CPU into a run whose config says cuda, so a resume continues it on the GPU."""
    copies = []
    for run in two_runs:
        copy = tmp_path / run.name
        shutil.copytree(run, copy)
        meta = json.loads((copy / "checkpoint.json").read_text())
        assert meta["state"]["config"]["device"] == "cpu"
        meta["state"]["config"]["device"] = "cuda"
        (copy / "checkpoint.json").write_text(json.dumps(meta))
        (copy / "config.yaml").write_text((copy / "config.yaml").read_text().replace("device: cpu", "device: cuda"))
        copies.append(copy)
    fuse_runs(copies, tmp_path / "fused")
    meta = json.loads((tmp_path / "fused" / "checkpoint.json").read_text())
    assert meta["state"]["config"]["device"] == "cuda"
    assert "device: cuda" in (tmp_path / "fused" / "config.yaml").read_text().splitlines()
    if not torch.cuda.is_available():  # the resume asks for the GPU the runs trained on
        with pytest.raises(ConfigError, match=r"^device='cuda' was asked for but CUDA is not available"):
            api.resume(tmp_path / "fused", total_steps=384)
    assert api.resume(tmp_path / "fused", total_steps=384, device="cpu").steps >= 384


def test_fuse_runs_refuses_one_path_for_a_list(two_runs: list[Path], tmp_path: Path) -> None:
    """A single run directory is a sequence of characters: it is refused, not fused as one-letter directories."""
    for one in (str(two_runs[0]), two_runs[0]):
        with pytest.raises(ConfigError, match=r"^fuse_runs takes a list of run directories, not one path"):
            fuse_runs(one, tmp_path / "out")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_tournament_refuses_total_steps(tmp_path: Path) -> None:
    """A tournament sets each member's budget itself: a total_steps setting is refused, not silently replaced."""
    from jaderl.population import tournament

    with pytest.raises(ConfigError, match=r"^total_steps=1000 cannot be given to a tournament: .* = 640 env steps"):
        tournament("ppo", ENV, pool=1, period=64, rounds=10, run_dir=str(tmp_path / "t"), total_steps=1000)
    assert not (tmp_path / "t").exists()
