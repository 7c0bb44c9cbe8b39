"""jaderl under ``lightning.Trainer.fit``: metrics reach Lightning's loggers, ``eval_return`` drives ModelCheckpoint
and EarlyStopping, a run resumed from a (safetensors) Lightning checkpoint continues bit for bit, the Bolts names
build and train, and ``strategy="ddp"`` trains with two CPU processes."""

from __future__ import annotations

import csv
import importlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from safetensors import safe_open

from jaderl.api import build_saved_agent
from jaderl.core.config import Config, ConfigError
from jaderl.core.loop import Trainer
from jaderl.envs import make_env
from jaderl.integrations.lightning import (
    BOLTS_NAMES,
    DQN,
    METADATA_KEY,
    JaderlModule,
    SafetensorsCheckpointIO,
)
from jaderl.marl.base import TeamRewardWarning

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),  # Lightning's tips on workers, loggers, devices
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TINY_DQN: dict[str, Any] = dict(total_steps=600, eval_every=200, eval_episodes=2, warmup_steps=100, batch_size=32,
                                buffer_size=1_000, hidden=[32, 32], device="cpu", seed=3, zoo=False)
"""A DQN run on jaderl/CartPole-v1 of 3 epochs (evaluations) of 200 one-step iterations, a few seconds."""
REPO = Path(__file__).resolve().parents[2]


def lightning_trainer(root: Path, **kwargs: Any) -> L.Trainer:
    """A quiet Lightning Trainer logging to CSV under ``root``."""
    return L.Trainer(default_root_dir=root, logger=CSVLogger(root, name="logs"), enable_progress_bar=False,
                     enable_model_summary=False, log_every_n_steps=5, **kwargs)


def csv_rows(trainer: L.Trainer) -> list[dict[str, str]]:
    with open(Path(trainer.logger.log_dir) / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_fit_logs_metrics_and_stops_at_the_budget(tmp_path: Path) -> None:
    model = JaderlModule("dqn", "jaderl/CartPole-v1", **TINY_DQN)
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    assert model.stop_reason == "total_steps" and model.agent.steps == 600
    # a batch is 32 one-step iterations; an epoch 7 batches (>= eval_every env steps), the last one cut at the budget
    assert model.iterations_per_batch == 32 and model.batches_per_epoch == 7
    assert trainer.global_step == 7 + 7 + 5
    assert trainer.current_epoch == 3  # one epoch per evaluation period
    rows = csv_rows(trainer)
    evals = [float(r["eval_return"]) for r in rows if r.get("eval_return")]
    assert len(evals) == 3 and all(1 <= v <= 500 for v in evals)
    steps = [float(r["env_steps"]) for r in rows if r.get("env_steps")]
    assert sorted(set(steps)) == [32.0 * 5, 32.0 * 10, 32.0 * 15]  # every log_every_n_steps=5 batches
    assert any(r.get("loss/q") for r in rows), rows[0].keys()  # the update's statistics
    assert any(r.get("train/episode_return") for r in rows)
    # the jaderl run directory sits in the logger's: its own metrics.csv records the same evaluations
    with open(Path(trainer.logger.log_dir) / "jaderl-run" / "metrics.csv") as f:
        jaderl_rows = list(csv.DictReader(f))
    jaderl_evals = [float(r["eval_return_mean"]) for r in jaderl_rows]
    assert jaderl_evals == pytest.approx(evals)
    # and the training episodes' returns that Lightning's logger got, epoch by epoch
    logged = [float(r["train/episode_return"]) for r in rows if r.get("eval_return")]
    assert [float(r["train_episode_return"]) for r in jaderl_rows] == pytest.approx(logged)
    # the checkpoint of the last epoch gives the trained agent back, ready to act
    (saved,) = (Path(trainer.logger.log_dir) / "checkpoints").iterdir()
    loaded = JaderlModule.load_from_checkpoint(saved)
    for name, network in model.agent.networks().items():
        for key, value in network.state_dict().items():
            assert torch.equal(loaded.agent.networks()[name].state_dict()[key], value), (name, key)
    obs = torch.zeros(4)
    assert loaded.agent.predict(obs) == model.agent.predict(obs)
    with pytest.raises(ConfigError, match="trained already"):  # a run goes on through a checkpoint, not a 2nd fit
        lightning_trainer(tmp_path / "again").fit(model)


def test_limit_train_batches_makes_every_epoch_that_many_batches_each_ending_with_an_evaluation(
        tmp_path: Path) -> None:
    """An epoch of Trainer(limit_train_batches=3) is 3 batches, the 3rd epoch as the 1st: the position in the epoch
    is counted in Lightning's epochs, not in evaluation periods of 7 batches that Lightning never runs whole."""
    model = JaderlModule("dqn", "jaderl/CartPole-v1", **TINY_DQN)
    positions: list[tuple[int, int]] = []
    train = model.training_step

    def recorded(batch: Any, batch_idx: int) -> None:
        positions.append((model.current_epoch, int(batch)))
        train(batch, batch_idx)

    model.training_step = recorded  # type: ignore[method-assign]
    trainer = lightning_trainer(tmp_path, max_epochs=3, limit_train_batches=3)
    trainer.fit(model)
    assert model.batches_per_epoch == 3
    assert positions == [(epoch, batch) for epoch in range(3) for batch in range(3)]
    assert trainer.global_step == 9 and model.agent.steps == 9 * 32 and model.stop_reason == ""
    evals = [float(r["eval_return"]) for r in csv_rows(trainer) if r.get("eval_return")]
    with open(Path(trainer.logger.log_dir) / "jaderl-run" / "metrics.csv") as f:
        jaderl_rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in jaderl_rows] == [96, 192, 288]  # one evaluation at the end of every epoch
    assert [float(r["eval_return_mean"]) for r in jaderl_rows] == pytest.approx(evals)


def test_a_run_dir_given_as_a_path_is_checkpointed(tmp_path: Path) -> None:
    """The hyperparameters hold the path as a string: the safetensors checkpoint's JSON takes it."""
    model = JaderlModule("dqn", "jaderl/CartPole-v1", **{**TINY_DQN, "total_steps": 200}, run_dir=tmp_path / "run")
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    (saved,) = (Path(trainer.logger.log_dir) / "checkpoints").iterdir()
    assert SafetensorsCheckpointIO().load_checkpoint(saved)["hyper_parameters"]["run_dir"] == str(tmp_path / "run")
    assert (tmp_path / "run" / "metrics.csv").exists()


def test_a_finished_run_resumed_from_its_last_checkpoint_trains_no_further(tmp_path: Path) -> None:
    """fit(ckpt_path=...) of the checkpoint written when the budget was reached: no env step beyond it."""
    model = JaderlModule("dqn", "jaderl/CartPole-v1", **TINY_DQN)
    trainer = lightning_trainer(tmp_path / "first")
    trainer.fit(model)
    assert model.agent.steps == 600
    (saved,) = (Path(trainer.logger.log_dir) / "checkpoints").iterdir()
    resumed = JaderlModule("dqn", "jaderl/CartPole-v1", **TINY_DQN)
    trainer = lightning_trainer(tmp_path / "again", max_epochs=10)
    trainer.fit(resumed, ckpt_path=saved)
    assert resumed.stop_reason == "total_steps" and resumed.agent.steps == 600
    # nor another evaluation of the policy evaluated at step 600: the run's evaluations stay as they were
    evaluations = []
    for run in (model, resumed):
        assert run.jaderl_trainer is not None
        with open(run.jaderl_trainer.run_dir / "metrics.csv") as f:
            evaluations.append([{k: v for k, v in row.items() if k != "time_s"} for row in csv.DictReader(f)])
    assert len(evaluations[0]) == 3 and evaluations[1] == evaluations[0]
    assert resumed.jaderl_trainer.best_return == model.jaderl_trainer.best_return


def test_a_checkpoint_of_other_settings_is_refused_before_training_on(tmp_path: Path) -> None:
    """A module of other network sizes (or another algorithm's settings) cannot continue the checkpoint's run: one
    sentence names the setting, and the module built by load_from_checkpoint trains on."""
    model = JaderlModule("dqn", "jaderl/CartPole-v1", **(TINY_DQN | {"total_steps": 200}))
    trainer = lightning_trainer(tmp_path / "first")
    trainer.fit(model)
    (saved,) = (Path(trainer.logger.log_dir) / "checkpoints").iterdir()
    other = JaderlModule("dqn", "jaderl/CartPole-v1", **(TINY_DQN | {"hidden": [16]}))
    with pytest.raises(ConfigError, match=r"^this Lightning checkpoint's run was trained with hidden=\[32, 32\], and "
                                          r"this module has hidden=\[16\]; build the module with the run's settings"):
        lightning_trainer(tmp_path / "other").fit(other, ckpt_path=saved)
    # a budget and a mutable hyperparameter may change, as with jaderl resume
    resumed = JaderlModule("dqn", "jaderl/CartPole-v1", **(TINY_DQN | {"total_steps": 400, "lr": 5e-4}))
    lightning_trainer(tmp_path / "again", max_epochs=10).fit(resumed, ckpt_path=saved)
    assert resumed.agent.steps == 400
    loaded = JaderlModule.load_from_checkpoint(saved, total_steps=400)  # the run's settings, a new run directory
    trainer = lightning_trainer(tmp_path / "loaded", max_epochs=10)
    trainer.fit(loaded, ckpt_path=saved)
    assert loaded.agent.steps == 400 and loaded.jaderl_trainer is not None
    assert loaded.jaderl_trainer.run_dir == Path(trainer.logger.log_dir) / "jaderl-run"


@pytest.mark.alone  # 400 steps must train within the 2 s that the limit leaves beside the evaluations
def test_time_limit_counts_the_evaluations_as_jaderl_train_does(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    evaluate = Trainer.evaluate

    def slow(self: Trainer) -> float:  # an evaluation of 3 s: two of them pass the 5 s limit
        value = evaluate(self)
        time.sleep(3.0)
        return value

    monkeypatch.setattr(Trainer, "evaluate", slow)
    model = JaderlModule("dqn", "jaderl/CartPole-v1", **{**TINY_DQN, "time_limit": 5.0})
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    assert model.stop_reason == "time_limit" and 400 <= model.agent.steps < 600
    with open(Path(trainer.logger.log_dir) / "jaderl-run" / "metrics.csv") as f:
        times = [float(r["time_s"]) for r in csv.DictReader(f)]
    assert times[1] >= 3.0  # the second evaluation's training time holds the first one's 3 s


def test_eval_return_drives_model_checkpoint_and_early_stopping(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="eval_return", mode="max", save_top_k=1)
    stopping = EarlyStopping(monitor="eval_return", mode="max", patience=0)  # stop at the first epoch no better
    model = JaderlModule("dqn", "jaderl/CartPole-v1", **{**TINY_DQN, "total_steps": 4_000})
    trainer = lightning_trainer(tmp_path, callbacks=[checkpoint, stopping])
    trainer.fit(model)
    evals = [float(r["eval_return"]) for r in csv_rows(trainer) if r.get("eval_return")]
    stopped_after = next((i for i in range(1, len(evals)) if evals[i] <= max(evals[:i])), None)
    assert stopped_after is not None and len(evals) == stopped_after + 1 < 20, evals
    assert float(checkpoint.best_model_score) == max(evals)
    assert Path(checkpoint.best_model_path).exists()


def _params(model: JaderlModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.networks.state_dict().items()}


@pytest.mark.parametrize(("algo", "where"), [("dqn", "mid-epoch"), ("ppo", "mid-epoch"), ("dqn", "epoch end")])
def test_resume_from_a_lightning_checkpoint_is_bit_identical(algo: str, where: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    settings = TINY_DQN | {"use_per": True, "n_step": 2, "total_steps": 10_000} if algo == "dqn" else \
        dict(num_envs=4, horizon=16, minibatch_size=32, num_epochs=2, hidden=[32, 32], eval_every=128,
             eval_episodes=2, total_steps=10_000, device="cpu", seed=3, normalize_obs=True)
    # uninterrupted: three epochs
    whole = JaderlModule(algo, "jaderl/CartPole-v1", **settings)
    trainer = lightning_trainer(tmp_path / "whole", max_epochs=3)
    trainer.fit(whole)
    whole_rows = csv_rows(trainer)
    # interrupted: a checkpoint in the middle of the second epoch (or after the first epoch's last batch, which
    # Lightning writes before the epoch ends), then a fresh module and Trainer resume it
    mid = trainer.global_step // 2 if where == "mid-epoch" else trainer.global_step // 3
    first = JaderlModule(algo, "jaderl/CartPole-v1", **settings)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=mid, save_top_k=-1)
    trainer = lightning_trainer(tmp_path / "first", max_steps=mid, callbacks=[saver])
    trainer.fit(first)
    path = Path(saver.best_model_path or next((tmp_path / "ckpt").iterdir()))
    with safe_open(str(path), framework="pt") as f:  # the file is safetensors, its JSON in the metadata
        assert json.loads(f.metadata()[METADATA_KEY])["checkpoint"]["global_step"] == mid
        keys = list(f.keys())
    assert any(k.startswith("/jaderl/agent/networks") for k in keys)
    assert any(k.startswith("/jaderl/buffer") for k in keys) or algo == "ppo"  # PPO learns from each rollout once

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a checkpoint was unpickled")

    resumed = JaderlModule(algo, "jaderl/CartPole-v1", **settings)
    trainer = lightning_trainer(tmp_path / "resumed", max_epochs=3)
    with monkeypatch.context() as m:
        for module, name in ((pickle, "load"), (pickle, "loads"), (torch, "load")):
            m.setattr(module, name, refuse)
        trainer.fit(resumed, ckpt_path=path)
    assert resumed.agent.steps == whole.agent.steps
    expected, got = _params(whole), _params(resumed)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    # the metrics logged after the checkpoint are the same numbers
    columns = list(whole_rows[0])
    after = [{c: r[c] for c in columns} for r in whole_rows if r.get("step") and int(r["step"]) >= mid]
    resumed_rows = [{c: r.get(c, "") for c in columns} for r in csv_rows(trainer)]
    if where == "epoch end":  # the first epoch's evaluation was logged by the run that wrote the checkpoint
        after = [r for r in after if not (r["eval_return"] and int(r["epoch"]) == 0)]
    assert after and after == resumed_rows
    assert any(r.get("eval_return") for r in resumed_rows)
    # every evaluation of the run (its metrics.csv), the one made before the checkpoint included, as in one go
    evaluations = []
    for run in (whole, resumed):
        with open(run.jaderl_trainer.run_dir / "metrics.csv") as f:
            evaluations.append([{k: v for k, v in row.items() if k != "time_s"} for row in csv.DictReader(f)])
    assert len(evaluations[0]) == 3 and evaluations[0] == evaluations[1]


def test_checkpoint_io_round_trip_and_refusals(tmp_path: Path) -> None:
    io = SafetensorsCheckpointIO()
    state = {"epoch": 2, "nested": {"w": torch.arange(6.0).view(2, 3), 3: [torch.ones(2, dtype=torch.bool), None]},
             "score": float("inf"), "name": "x"}
    io.save_checkpoint(state, tmp_path / "a.ckpt")
    back = io.load_checkpoint(tmp_path / "a.ckpt")
    assert back["epoch"] == 2 and back["score"] == float("inf") and back["name"] == "x"
    assert torch.equal(back["nested"]["w"], state["nested"]["w"]) and back["nested"][3][1] is None
    with pytest.raises(TypeError, match="safetensors checkpoint holds only"):
        io.save_checkpoint({"bad": object()}, tmp_path / "b.ckpt")
    assert not (tmp_path / "b.ckpt").exists() and not (tmp_path / "b.ckpt.tmp").exists()
    torch.save({"x": 1}, tmp_path / "pickle.ckpt")
    with pytest.raises(FileNotFoundError, match="never unpickles"):
        io.load_checkpoint(tmp_path / "pickle.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
    from safetensors.torch import save_file
    for i, header in enumerate(['{"format": 1, "checkpoint": {"x"', '[1, 2]', '{"format": 1}']):  # damaged metadata
        save_file({"t": torch.zeros(1)}, str(tmp_path / f"damaged{i}.ckpt"), metadata={METADATA_KEY: header})
        with pytest.raises(ConfigError, match=r"is a damaged Lightning checkpoint \(its 'jaderl.lightning' metadata "
                                              r"cannot be read\); resume from another checkpoint of the run$"):
            io.load_checkpoint(tmp_path / f"damaged{i}.ckpt")


SAC_SETTINGS = dict(warmup_steps=50, batch_size=32, buffer_size=500, hidden=[32, 32], updates_per_step=0.25)


def test_record_every_records_under_fit(tmp_path: Path) -> None:
    model = JaderlModule("ppo", "jaderl/CartPole-v1", num_envs=2, horizon=32, minibatch_size=32, num_epochs=1,
                         hidden=[16], eval_every=64, eval_episodes=1, total_steps=128, record_every=64, device="cpu",
                         zoo=False)
    lightning_trainer(tmp_path).fit(model)
    assert model.jaderl_trainer is not None
    videos = model.jaderl_trainer.run_dir / "videos"
    assert sorted(p.parent.name for p in videos.rglob("*.mp4")) == ["step-128", "step-64"]


def test_a_fit_that_raises_closes_the_envs_and_their_workers(tmp_path: Path) -> None:
    from tests.conftest import _is_infrastructure, _process_tree

    started: dict[int, str] = {}

    class Boom(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            started.update({pid: cmd for pid, (_, cmd, ppid) in _process_tree().items()
                            if pid not in before and not _is_infrastructure(cmd, ppid)})
            raise RuntimeError("boom")

    before = set(_process_tree())
    model = JaderlModule("dqn", "CartPole-v1", env_workers=1, **TINY_DQN)  # Gymnasium's: one worker process
    with pytest.raises(RuntimeError, match="boom"):
        lightning_trainer(tmp_path, callbacks=[Boom()]).fit(model)
    deadline = time.monotonic() + 5  # (the module is still held: nothing was garbage-collected)
    while (left := {pid: cmd for pid, (_, cmd, ppid) in _process_tree().items()
                    if pid not in before and not _is_infrastructure(cmd, ppid)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started, "no env worker process was running when fit raised: nothing to close"
    assert not left, f"env processes left after fit raised: {left}"
    assert model.jaderl_trainer is not None


def test_a_bolts_checkpoint_loads_through_jaderl_module_and_other_algorithms_are_refused(tmp_path: Path) -> None:
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt")
    # (a run that set the learning rate: its checkpoint's hyperparameters name it lr, jaderl's name)
    lightning_trainer(tmp_path, max_epochs=1, callbacks=[saver]).fit(DQN("CartPole-v1", learning_rate=5e-4,
                                                                         **TINY_DQN))
    path = next((tmp_path / "ckpt").iterdir())
    loaded = JaderlModule.load_from_checkpoint(path, eval_episodes=7)
    saved = SafetensorsCheckpointIO().load_checkpoint(path)["jaderl"]["config"]
    # as the run built it, with the override (and no run directory: training on writes a new one)
    assert loaded.agent.config.to_dict() == {**saved, "eval_episodes": 7, "run_dir": ""}
    assert DQN.load_from_checkpoint(path).agent.config.algo == "dqn"
    # a Bolts keyword overrides the setting it names
    assert DQN.load_from_checkpoint(path, eps_end=0.07, learning_rate=1e-3).agent.config.epsilon_end == 0.07
    assert DQN.load_from_checkpoint(path, learning_rate=1e-3).agent.config.lr == 1e-3
    with pytest.raises(ConfigError, match=r"holds a dqn run, and BOLTS_NAME trains a2c".replace(
            "BOLTS_NAME", "AdvantageActorCritic")):
        BOLTS_NAMES["AdvantageActorCritic"].load_from_checkpoint(path)


def test_load_from_checkpoint_reads_a_reward_normaliser_of_several_sub_envs(tmp_path: Path) -> None:
    """The loaded agent acts in one env, but the run's reward normaliser kept a return for each of its 4 sub-envs."""
    model = JaderlModule("ppo", "jaderl/CartPole-v1", num_envs=4, horizon=16, minibatch_size=32, num_epochs=1,
                         hidden=[16], eval_every=64, eval_episodes=1, total_steps=64, normalize_reward=True,
                         device="cpu", zoo=False)
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    (saved,) = (Path(trainer.logger.log_dir) / "checkpoints").iterdir()
    loaded = JaderlModule.load_from_checkpoint(saved)
    assert torch.equal(loaded.agent.reward_norm.var, model.agent.reward_norm.var)
    obs = torch.zeros(4)
    assert loaded.agent.predict(obs) == model.agent.predict(obs)


@pytest.mark.parametrize("name", list(BOLTS_NAMES))
def test_every_bolts_name_builds_and_trains(name: str, tmp_path: Path) -> None:
    env = "Pendulum-v1" if name == "SAC" else "CartPole-v1"
    cls = BOLTS_NAMES[name]
    small = dict(total_steps=256, eval_every=128, eval_episodes=1, device="cpu", seed=1)
    off_policy = name.endswith("DQN") or name == "SAC"
    extra = dict(SAC_SETTINGS) if off_policy else dict(num_envs=4, horizon=32, hidden=[32, 32])
    if name.endswith("DQN"):
        extra.pop("updates_per_step")
    model = cls(env, **small, **extra)
    expected = {"DQN": "dqn", "DoubleDQN": "double_dqn", "DuelingDQN": "dueling_dqn", "NoisyDQN": "noisy_dqn",
                "PERDQN": "dqn", "Reinforce": "reinforce", "VanillaPolicyGradient": "vpg",
                "AdvantageActorCritic": "a2c", "SAC": "sac"}
    assert model.config.algo == expected[name]
    assert model.config.env == f"jaderl/{env}"  # the torch-native twin of the Gymnasium id
    assert model.config.use_per is (name == "PERDQN") if off_policy else True
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    assert model.agent.steps >= 256 and [r for r in csv_rows(trainer) if r.get("eval_return")]
    assert type(model)(**model.hparams).config == model.config  # the hyperparameters rebuild the module


@pytest.mark.parametrize("algo", ["mappo", "qmix", "matd3"])
def test_multi_agent_algorithms_train_under_fit(algo: str, tmp_path: Path) -> None:
    env = "jaderl/simple_spread?continuous=true" if algo == "matd3" else "jaderl/simple_spread"
    settings: dict[str, Any] = dict(num_envs=4, hidden=[16], total_steps=256, eval_every=128, eval_episodes=1,
                                    device="cpu", seed=1)
    settings |= dict(horizon=16, minibatch_size=32, num_epochs=1) if algo == "mappo" else \
        dict(warmup_steps=32, batch_size=16, buffer_size=256)
    model = JaderlModule(algo, env, **settings)
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    assert model.agent.spec.num_agents == 3 and model.agent.steps >= 256
    rows = csv_rows(trainer)
    assert len([r for r in rows if r.get("eval_return")]) == 2
    assert any(r.get("train/episode_return_per_agent") for r in rows)


def test_load_from_checkpoint_does_not_repeat_trainings_warnings(tmp_path: Path) -> None:
    """MAPPO on a game between teams warns when the run is built, as jaderl.load, not again when it is loaded."""
    settings: dict[str, Any] = dict(num_envs=4, hidden=[16], total_steps=64, eval_every=64, eval_episodes=1,
                                    device="cpu", seed=1, horizon=16, minibatch_size=32, num_epochs=1)
    with pytest.warns(TeamRewardWarning):
        model = JaderlModule("mappo", "jaderl/simple_tag", **settings)
        trainer = lightning_trainer(tmp_path)
        trainer.fit(model)
    (saved,) = (Path(trainer.logger.log_dir) / "checkpoints").iterdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TeamRewardWarning)
        loaded = JaderlModule.load_from_checkpoint(saved)
    assert loaded.agent.spec.num_agents == 4


def test_bolts_names_take_bolts_keywords_and_pick_the_sac_variant() -> None:
    model = DQN("CartPole-v1", learning_rate=1e-3, eps_last_frame=500, sync_rate=7, replay_size=321)
    config = model.config
    assert (config.lr, config.epsilon_decay_steps, config.target_update_every, config.buffer_size) == \
        (1e-3, 500, 7, 321)
    assert config.tau == 1.0  # Bolts' sync_rate copies the network (the zoo's dqn entry averages it)
    assert DQN("CartPole-v1").config.tau < 1.0 and DQN("CartPole-v1", sync_rate=7, tau=0.5).config.tau == 0.5
    assert BOLTS_NAMES["SAC"]("CartPole-v1").config.algo == "sac_discrete"
    assert DQN("Acrobot-v1").config.env == "jaderl/Acrobot-v1"
    assert DQN("LunarLander-v3").config.env == "LunarLander-v3"  # no torch twin: Gymnasium's own


def test_bolts_sac_learning_rates_reach_the_optimizers_and_differing_ones_are_refused() -> None:
    """Bolts' SAC has policy_learning_rate and q_learning_rate; jaderl's SAC has one lr for actor, critics and
    alpha: either keyword sets it, both must agree, and no keyword is dropped silently."""
    for settings in (dict(policy_learning_rate=1e-3), dict(q_learning_rate=1e-3),
                     dict(policy_learning_rate=1e-3, q_learning_rate=1e-3)):
        model = BOLTS_NAMES["SAC"]("Pendulum-v1", **settings)
        assert model.config.lr == 1e-3, settings
        assert type(model)(**model.hparams).config == model.config  # the hyperparameters rebuild the module
        probe = make_env(model.config.env, 1)
        agent = build_saved_agent(model.config, probe.spec, torch.device("cpu"))
        probe.close()
        rates = {name: [group["lr"] for group in opt.param_groups] for name, opt in agent.optimizers().items()}
        assert rates and all(lr == [1e-3] for lr in rates.values()), rates
    with pytest.raises(ConfigError, match=r"^SAC got policy_learning_rate=0\.001 and q_learning_rate=0\.0003, which "
                                          r"both set jaderl's one 'lr' setting; give them the same value or pass "
                                          r"only one$"):
        BOLTS_NAMES["SAC"]("Pendulum-v1", policy_learning_rate=1e-3, q_learning_rate=3e-4)
    with pytest.raises(ConfigError, match=r"^DQN got learning_rate=0\.001 and lr=0\.002, which both set"):
        DQN("CartPole-v1", learning_rate=1e-3, lr=2e-3)


def test_a_missing_lightning_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "jaderl.integrations.lightning")
    with pytest.raises(ImportError, match=r"pip install 'jaderl\[lightning\]'"):
        importlib.import_module("jaderl.integrations.lightning")


DDP_SCRIPT = """
import json, os, sys, torch
torch.set_num_threads(1)
import lightning as L
from jaderl.integrations.lightning import JaderlModule

out = sys.argv[1]
model = JaderlModule("ppo", "jaderl/CartPole-v1", num_envs=2, horizon=16, minibatch_size=32, num_epochs=1,
                     hidden=[16], eval_every=128, eval_episodes=1, total_steps=256, seed=5, run_dir=out + "/run")
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=5, logger=False,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=out)
trainer.fit(model)
flat = torch.cat([p.detach().flatten() for p in model.networks.parameters()])
with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
    json.dump({"pid": os.getpid(), "steps": model.agent.steps, "params": flat.tolist(),
               "evaluated": model.jaderl_trainer.evaluator is not None, "epochs": trainer.current_epoch}, f)
"""


def test_ddp_with_two_cpu_processes_trains(tmp_path: Path, no_leftover_processes: None) -> None:
    script = tmp_path / "ddp_fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env, timeout=240,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 256  # both learners' env steps counted
    assert ranks[0]["params"] == ranks[1]["params"]  # gradients averaged: the same networks on both
    assert [r["evaluated"] for r in ranks] == [True, False]
    assert (tmp_path / "run" / "metrics.csv").exists() and (tmp_path / "run" / "learner-1").is_dir()
    deadline = time.monotonic() + 5
    for r in ranks:  # the launched process of rank 1 is gone with the launcher
        while Path(f"/proc/{r['pid']}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{r['pid']}").exists()


# --- learning (slow) ---

@pytest.mark.slow
def test_dqn_reaches_475_on_cartpole_under_fit(tmp_path: Path) -> None:
    """Budget: 50k env steps and 80 s (seed 0 solves in about 20k steps, as tests/algos/test_learning.py's
    dqn-per-3step case does in jaderl's own loop)."""
    model = DQN("CartPole-v1", seed=0, use_per=True, n_step=3, total_steps=50_000, eval_every=2_000,
                target_return=475.0, time_limit=80.0, device="cpu")
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    assert model.stop_reason == "solved", f"best {model.jaderl_trainer.best_return} in {model.agent.steps} steps"
    assert max(float(r["eval_return"]) for r in csv_rows(trainer) if r.get("eval_return")) >= 475.0


@pytest.mark.slow
def test_ppo_reaches_475_on_cartpole_under_fit(tmp_path: Path) -> None:
    """Budget: 100k env steps and 60 s (configs/ppo_cartpole.yaml: about 10k-30k steps, a few seconds)."""
    settings = {k: v for k, v in Config.read_yaml(REPO / "configs" / "ppo_cartpole.yaml").items()
                if k not in ("target_return", "total_steps")}
    model = JaderlModule("ppo", "jaderl/CartPole-v1", **settings, seed=0, total_steps=100_000, target_return=475.0,
                         time_limit=60.0, device="cpu")
    trainer = lightning_trainer(tmp_path)
    trainer.fit(model)
    assert model.stop_reason == "solved", f"best {model.jaderl_trainer.best_return} in {model.agent.steps} steps"
