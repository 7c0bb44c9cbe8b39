"""The Trainer: one run as an object that steps, hands its whole state to another Trainer and takes new
hyperparameters while it trains."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest
import torch

import jaderl
from jaderl.algos import ALGOS
from jaderl.api import make_config
from jaderl.core.checkpoint import CHECKPOINT_JSON, FORMAT, load_checkpoint
from jaderl.core.config import ConfigError

CASES = {  # on- and off-policy algorithms, each on a torch-native env whose state is copied (and OU noise's)
    "ppo": ("jaderl/CartPole-v1", {"num_envs": 4, "horizon": 25, "minibatch_size": 50, "num_epochs": 2,
                                   "hidden": [16, 16], "normalize_obs": True,
                                   "normalize_reward": True}),
    "sac": ("jaderl/Pendulum-v1", {"num_envs": 4, "horizon": 1, "warmup_steps": 200, "batch_size": 32,
                                   "buffer_size": 5_000, "hidden": [16, 16], "n_step": 3, "updates_per_step": 0.25}),
    "ddpg": ("jaderl/Pendulum-v1", {"num_envs": 4, "horizon": 1, "warmup_steps": 200, "batch_size": 32,
                                    "buffer_size": 5_000, "hidden": [16, 16], "noise": "ou",  # a state per sub-env
                                    "updates_per_step": 0.25}),
}


def _config(algo: str, run_dir: Path, **extra: object) -> jaderl.core.config.Config:
    env, settings = CASES[algo]
    base = {"seed": 3, "device": "cpu", "total_steps": 4_000, "eval_every": 1_000, "checkpoint_every": 100_000,
            "eval_episodes": 2, "zoo": False}  # the algorithms' defaults, which these tests name
    return make_config(algo, env, run_dir=str(run_dir), **{**base, **settings, **extra})


def _parameters(trainer: jaderl.Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.agent.parameters()]


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "time_s"} for row in csv.DictReader(f)]


@pytest.mark.parametrize("algo", list(CASES))
def test_a_copy_in_memory_continues_bit_identically(algo: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    with jaderl.Trainer(_config(algo, tmp_path / "a", total_steps=2_000), ALGOS[algo].agent_cls) as first:
        first.run()  # a few thousand steps, with evaluations
        with jaderl.Trainer(_config(algo, tmp_path / "b"), ALGOS[algo].agent_cls) as copy:
            copy.load_state_dict(first.state_dict())
            first.config.total_steps = copy.config.total_steps = 4_000
            a, b = first.run(), copy.run()
            assert a.steps == b.steps == 4_000 and a.last_eval_return == b.last_eval_return
            for p, q in zip(_parameters(first), _parameters(copy), strict=True):
                assert torch.equal(p, q)
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b") and len(_rows(tmp_path / "a")) == 4


@pytest.mark.parametrize("algo", list(CASES))
def test_a_copy_through_a_checkpoint_continues_bit_identically(algo: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    with jaderl.Trainer(_config(algo, tmp_path / "a", total_steps=2_000), ALGOS[algo].agent_cls) as first:
        first.run()  # ends with a checkpoint
        shutil.copytree(tmp_path / "a", tmp_path / "b")
        first.config.total_steps = 4_000
        first.run()  # goes on in memory, as if it had never stopped
    jaderl.resume(tmp_path / "b", total_steps=4_000)  # a second Trainer, from the files
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert a["agent"]["counters"] == b["agent"]["counters"] and a["agent"]["counters"]["steps"] == 4_000
    for name, state in a["agent"]["networks"].items():
        for key, value in state.items():
            assert torch.equal(value, b["agent"]["networks"][name][key]), (name, key)
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b") and len(_rows(tmp_path / "a")) == 4


def test_an_evaluation_by_hand_restarts_the_schedule_and_a_checkpoint_keeps_it(tmp_path: Path) -> None:
    """evaluate() between steps moves the next scheduled evaluation to eval_every steps after it; a resume from a
    checkpoint written then evaluates where the run in memory does."""
    torch.set_num_threads(1)
    with jaderl.Trainer(_config("ppo", tmp_path / "a", total_steps=2_500), ALGOS["ppo"].agent_cls) as first:
        for _ in range(9):  # 100 env steps each
            first.step()
        first.evaluate()
        assert first.next_eval == 1_900
        first.checkpoint()
        shutil.copytree(tmp_path / "a", tmp_path / "b")
        first.run()
    jaderl.resume(tmp_path / "b")
    assert [int(r["step"]) for r in _rows(tmp_path / "a")] == [900, 1_900, 2_500]  # not 1_000 right after 900
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")


def test_step_returns_named_statistics_and_trainers_do_not_share_random_streams(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = _config("ppo", tmp_path / "a")
    with (jaderl.Trainer(config, ALGOS["ppo"].agent_cls) as a,
          jaderl.Trainer(_config("ppo", tmp_path / "b"), ALGOS["ppo"].agent_cls) as b):
        stats = a.step()
        assert {"loss/policy", "loss/value", "policy/entropy", "policy/clip_fraction"} <= set(stats)
        torch.rand(100)  # a draw outside either Trainer does not change their streams
        b.step()
        a.step()
        b.step()
        for p, q in zip(_parameters(a), _parameters(b), strict=True):
            assert torch.equal(p, q)


def test_hyperparameters_change_in_flight_within_their_ranges(tmp_path: Path) -> None:
    with jaderl.Trainer(_config("sac", tmp_path / "run"), ALGOS["sac"].agent_cls) as trainer:
        trainer.set_hyperparameters(lr=1e-3, gamma=0.95)
        assert trainer.agent.config.lr == 1e-3 and trainer.agent.config.gamma == 0.95
        assert all(g["lr"] == 1e-3 for opt in trainer.agent.optimizers().values() for g in opt.param_groups)
        with pytest.raises(ConfigError, match=r"^lr=0.5 is out of range: it must be a number in \[1e-06, 0.1\]$"):
            trainer.set_hyperparameters(lr=0.5)
        with pytest.raises(ConfigError, match=r"^hidden is not a hyperparameter SAC can change while it trains"):
            trainer.set_hyperparameters(hidden=[8])
        assert "# step 0: lr 0.0003 -> 0.001, gamma 0.99 -> 0.95" in (tmp_path / "run" / "config.yaml").read_text()


def test_an_interrupted_write_of_config_yaml_leaves_the_last_one_whole(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """config.yaml starts a resumed run: Ctrl-C (or a full disk) while it is rewritten leaves the previous file."""
    from jaderl.core.config import Config

    real = Config.save_yaml

    def half_then_interrupt(self: Config, path: Path, history: list = ()) -> None:
        real(self, path, history)
        Path(path).write_text(Path(path).read_text()[:20])  # a partial file, then the interrupt
        raise KeyboardInterrupt

    with jaderl.Trainer(_config("sac", tmp_path / "run"), ALGOS["sac"].agent_cls) as trainer:
        before = (tmp_path / "run" / "config.yaml").read_text()
        monkeypatch.setattr(Config, "save_yaml", half_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            trainer.set_hyperparameters(lr=1e-3)
    assert (tmp_path / "run" / "config.yaml").read_text() == before
    assert sorted(p.name for p in (tmp_path / "run").glob("*.tmp")) == []

def test_every_algorithm_lists_hyperparameters_whose_ranges_hold_its_defaults() -> None:
    for name, spec in ALGOS.items():
        config = spec.agent_cls.config_cls.from_dict({**spec.preset, "algo": name})
        assert {"lr", "gamma"} <= set(spec.agent_cls.hyperparameters), name
        for key, valid in spec.agent_cls.hyperparameters.items():
            assert valid.low <= getattr(config, key) <= valid.high, (name, key)


def test_a_resume_may_change_the_learning_rate_and_records_it(tmp_path: Path) -> None:
    jaderl.train("ppo", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), device="cpu", total_steps=256,
                 num_envs=4, horizon=32, minibatch_size=64, hidden=[8], eval_every=256, eval_episodes=1, zoo=False)
    jaderl.resume(tmp_path / "run", total_steps=512, lr=1e-3)
    state = load_checkpoint(tmp_path / "run")
    assert state["config"]["lr"] == 1e-3 and state["history"][0]["changed"]["lr"] == [3e-4, 1e-3]
    assert all(g["lr"] == 1e-3 for g in state["agent"]["optimizers"]["optimizer"]["param_groups"])
    assert "lr 0.0003 -> 0.001" in (tmp_path / "run" / "config.yaml").read_text()


def test_a_checkpoint_written_before_the_first_step_resumes(tmp_path: Path) -> None:
    """A torch env's state is saved from the start, but there is no last observation yet: the resumed run begins its
    episodes from a reset and trains like a fresh one."""
    config = _config("ppo", tmp_path / "run", total_steps=200)
    with jaderl.Trainer(config, ALGOS["ppo"].agent_cls) as trainer:
        trainer.checkpoint()
    assert load_checkpoint(tmp_path / "run")["last_obs"] is None
    with jaderl.Trainer(config, ALGOS["ppo"].agent_cls, resume=True) as resumed:
        assert resumed.run().steps == 200


def test_a_checkpoint_of_another_format_is_refused_in_one_sentence(tmp_path: Path) -> None:
    jaderl.train("ppo", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), device="cpu", total_steps=128,
                 num_envs=4, horizon=32, minibatch_size=64, hidden=[8], eval_every=128, eval_episodes=1)
    path = tmp_path / "run" / CHECKPOINT_JSON
    path.write_text(path.read_text().replace(f'"format": {FORMAT}', '"format": 1'))
    with pytest.raises(ConfigError, match=r"holds a checkpoint of format 1, written by another jaderl version"):
        load_checkpoint(tmp_path / "run")


def test_a_checkpoint_with_nan_parameters_is_refused_on_resume(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    jaderl.train("ppo", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), device="cpu", total_steps=128,
                 num_envs=4, horizon=32, minibatch_size=64, hidden=[8], eval_every=128, eval_episodes=1)
    (tensor_file,) = (tmp_path / "run").glob("ckpt-*.safetensors")
    tensors = load_file(str(tensor_file))
    key = next(k for k in tensors if "/networks/actor/" in k)
    tensors[key] = torch.full_like(tensors[key], math.nan)
    save_file(tensors, str(tensor_file))
    with pytest.raises(ConfigError, match=r"NaN or infinite values"):
        jaderl.resume(tmp_path / "run", total_steps=256)
    # an optimizer's moments too: they would make the next step's parameters NaN, blamed on the learning rate
    tensors = load_file(str(tensor_file))
    tensors[key] = torch.zeros_like(tensors[key])
    moment = next(k for k in tensors if "/optimizers/" in k and k.endswith("exp_avg_sq"))
    tensors[moment] = torch.full_like(tensors[moment], math.inf)
    save_file(tensors, str(tensor_file))
    config = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"^the state to load holds NaN or infinite values \(agent\.optimizers\."):
        jaderl.resume(tmp_path / "run", total_steps=256)
    assert (tmp_path / "run" / "config.yaml").read_text() == config  # nothing rewritten


def test_an_algorithm_refuses_an_env_it_cannot_train_on_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^dqn cannot train on jaderl/Pendulum-v1: its actions are continuous"):
        jaderl.train("dqn", "jaderl/Pendulum-v1", run_dir=str(tmp_path / "run"), device="cpu")
