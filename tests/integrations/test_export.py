"""``jaderl export``: every registered algorithm's policy, written as ONNX and as TorchScript, computes what
``agent.predict`` computes (normalised observations in, deterministic actions in the env's own space out)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import jaderl
from jaderl.algos import PPO, action_spaces
from jaderl.api import ALGOS, make_config
from jaderl.cli import main
from jaderl.core.agent import Agent
from jaderl.core.config import ConfigError
from jaderl.envs import make_env
from jaderl.envs.vec import EnvSpec
from jaderl.integrations.export import MissingExtra, export_policy

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytestmark = [pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:REINFORCE without a baseline:UserWarning")]  # 16-step rollouts

ENVS = {"discrete": "jaderl/CartPole-v1", "continuous": "Pendulum-v1",  # Gymnasium's: torques rescaled to [-2, 2]
        "multi-agent discrete": "jaderl/simple_spread",
        "multi-agent continuous": "jaderl/simple_spread?continuous=true"}
CASES = [(name, kind) for name, spec in ALGOS.items() for kind in action_spaces(spec.agent_cls)]
TOTAL_STEPS = 64
SETTINGS: dict[str, Any] = {
    "num_envs": 4, "hidden": [16], "total_steps": TOTAL_STEPS, "eval_every": TOTAL_STEPS, "eval_episodes": 1,
    "device": "cpu", "seed": 1, "normalize_obs": True,  # the normaliser's statistics must travel into the file
    "warmup_steps": 16, "batch_size": 16, "buffer_size": 256, "updates_per_step": 0.25,  # off-policy
    "horizon": 16, "minibatch_size": 32, "num_epochs": 1,  # on-policy: one rollout of 4 x 16 steps
}


def tiny_run(algo: str, env_id: str, run_dir: Path, **extra: Any) -> Agent:
    """Train ``algo`` on ``env_id`` for a few steps with real updates (and ``extra`` settings) and load its best
    policy."""
    fields = {f.name for f in dataclasses.fields(ALGOS[algo].agent_cls.config_cls)}
    settings = {k: v for k, v in SETTINGS.items() if k in fields} | extra
    if not ALGOS[algo].agent_cls.on_policy:
        settings["horizon"] = 1
    jaderl.train(algo, env_id, run_dir=str(run_dir), **settings)
    return jaderl.load(run_dir)


def observations(agent: Agent, env_id: str, num: int = 7) -> np.ndarray:
    """Observations the env really gives: ``num`` sub-envs after a few steps of the agent's stochastic policy."""
    env = make_env(env_id, num, "cpu", seed=5)
    obs = env.reset()
    for _ in range(3):
        obs, *_ = env.step(agent.act(obs))
    env.close()
    return obs.numpy()


def run_onnx(path: Path, obs: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["action"], {"obs": obs})[0]


def run_torchscript(path: Path, obs: np.ndarray) -> np.ndarray:
    return torch.jit.load(str(path))(torch.from_numpy(obs)).numpy()


def assert_same_actions(got: np.ndarray, expected: np.ndarray, discrete: bool) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if discrete:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("algo", "kind"), CASES, ids=[f"{a}-{k.replace(' ', '-')}" for a, k in CASES])
def test_exported_policy_computes_predict(algo: str, kind: str, tmp_path: Path) -> None:
    check_export(algo, kind, tmp_path)


def check_export(algo: str, kind: str, tmp_path: Path, **extra: Any) -> None:
    """``algo`` trained a little on the ``kind`` env: its ONNX and TorchScript files compute what predict does."""
    env_id = ENVS[kind]
    agent = tiny_run(algo, env_id, tmp_path / "run", **extra)
    assert agent.obs_norm.enabled and not torch.equal(agent.obs_norm.mean, torch.zeros_like(agent.obs_norm.mean))
    obs = observations(agent, env_id)
    expected = agent.predict(obs)
    assert expected.dtype == (np.int64 if agent.is_discrete else np.float32)
    for fmt, run in (("onnx", run_onnx), ("torchscript", run_torchscript)):
        path = export_policy(agent, fmt, tmp_path / f"policy.{fmt}")
        assert path.is_file()
        assert_same_actions(run(path, obs), expected, agent.is_discrete)
        assert_same_actions(run(path, obs[:1]), expected[:1], agent.is_discrete)  # any batch size
    if kind == "continuous":  # the env's own bounds, not [-1, 1]
        assert np.abs(expected).max() <= 2.0
        raw = agent.act(torch.from_numpy(obs), deterministic=True).numpy()
        np.testing.assert_allclose(expected, 2.0 * raw, atol=1e-6)


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_gsde_policy_exports_its_mean_action(algo: str, tmp_path: Path) -> None:
    """gSDE's noise weights are exploration only: the exported policy is the deterministic one, as predict's."""
    check_export(algo, "continuous", tmp_path, use_sde=True)


def test_onnx_graph_has_a_dynamic_batch_axis(tmp_path: Path) -> None:
    agent = tiny_run("ppo", ENVS["discrete"], tmp_path / "run")
    path = export_policy(agent, "onnx", tmp_path / "policy.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, out.name) == ("obs", "action")
    assert isinstance(inp.shape[0], str) and inp.shape[1:] == [4] and inp.type == "tensor(float)"
    assert isinstance(out.shape[0], str) and out.type == "tensor(int64)"
    assert inp.shape[0] == out.shape[0] == "batch"  # the axis by its name, for runtimes' shape profiles
    assert not (tmp_path / "policy.onnx.data").exists()  # one file: the weights are inside


def test_image_observations_stay_uint8_and_pass_the_encoder(tmp_path: Path) -> None:
    spec = EnvSpec(num_envs=1, obs_shape=(40, 40, 3), is_discrete=False, action_dim=2, action_low=(-1.0, 0.0),
                   action_high=(1.0, 4.0), obs_dtype="uint8")
    torch.manual_seed(0)
    agent = PPO(make_config("ppo", "CartPole-v1", device="cpu", hidden=[16]), spec, torch.device("cpu"))
    obs = np.random.default_rng(0).integers(0, 256, (5, 40, 40, 3), dtype=np.uint8)
    expected = agent.predict(obs)
    np.testing.assert_array_equal(agent.predict(obs.astype(np.int64)), expected)  # pixels as plain integers (tolist)
    assert_same_actions(run_onnx(export_policy(agent, "onnx", tmp_path / "p.onnx"), obs), expected, False)
    assert_same_actions(run_torchscript(export_policy(agent, "torchscript", tmp_path / "p.pt"), obs), expected, False)


def test_cli_export_writes_the_best_or_the_last_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    agent = tiny_run("sac", ENVS["continuous"], run_dir)
    obs = observations(agent, ENVS["continuous"])
    assert main(["export", str(run_dir), "--format", "onnx"]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "policy.onnx")
    assert_same_actions(run_onnx(run_dir / "policy.onnx", obs), agent.predict(obs), False)
    out = tmp_path / "deploy" / "last.pt"
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(out), "--last"]) == 0
    assert "warning" not in capsys.readouterr().err  # the tracer finds no size-dependent branch to warn about
    last = jaderl.load(run_dir, best=False)
    assert_same_actions(run_torchscript(out, obs), last.predict(obs), False)
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(out)]) == 0  # an export replaced
    notes = tmp_path / "notes.txt"
    notes.write_text("kept")
    for target, said in ((tmp_path, "is a directory; give the file to write, such as"),
                         (notes, "exists and is not an earlier export (a .onnx file); remove it or give another")):
        with pytest.raises(SystemExit) as exit_info:
            main(["export", str(run_dir), "--format", "onnx", "--out", str(target)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and said in err and len(err.strip().splitlines()) == 1
    assert notes.read_text() == "kept"


@pytest.mark.parametrize(("argv", "message"), [
    (["export", "{run}", "--format", "tflite"], "invalid choice: 'tflite'"),
    (["export", "{run}/missing", "--format", "onnx"], "holds no readable checkpoint"),
])
def test_cli_export_refuses_bad_input_in_one_line(argv: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([arg.replace("{run}", str(tmp_path)) for arg in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_missing_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    agent = PPO(make_config("ppo", "jaderl/CartPole-v1", device="cpu", hidden=[16]),
                make_env("jaderl/CartPole-v1", 1).spec, torch.device("cpu"))
    with pytest.raises(ImportError, match=r"needs onnxscript, which is not installed; pip install 'jaderl\[export\]'"):
        export_policy(agent, "onnx", tmp_path / "p.onnx")  # an ImportError, and a ConfigError for the CLI's exit 2
    assert issubclass(MissingExtra, ConfigError)
    with pytest.raises(ConfigError, match="format='tflite' is not supported"):
        export_policy(agent, "tflite", tmp_path / "p.tflite")


def test_cli_export_refuses_a_file_named_for_the_other_format(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    tiny_run("sac", ENVS["continuous"], run_dir)
    for fmt, out, said in (("onnx", "p.pt", "p.pt has the suffix of a TorchScript file but --format is onnx; name it "
                            "p.onnx or pass --format torchscript"),
                           ("torchscript", "p.onnx", "p.onnx has the suffix of an ONNX file but --format is "
                            "torchscript; name it p.pt or pass --format onnx"),
                           ("onnx", "p.pth", "p.pth has the suffix of a TorchScript file")):
        with pytest.raises(SystemExit) as exit_info:
            main(["export", str(run_dir), "--format", fmt, "--out", str(tmp_path / out)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / out).exists()  # refused before anything is written


def test_the_file_rescales_every_agent_to_its_own_bounds_and_stays_inside_them(tmp_path: Path) -> None:
    """Agents with bounds of their own get them, and an action at an end of [-1, 1] is the bound itself (no float32
    rounding beyond it), in the file as in predict."""
    low, high = np.array([[0.0, 0.0], [-4.0, -4.0], [-1.5, 0.1]]), np.array([[1.0, 1.0], [4.0, 4.0], [0.2, 0.7]])
    env_id = ENVS["multi-agent continuous"]
    spec = make_env(env_id, 1).spec.replace(action_low=tuple(low.ravel()), action_high=tuple(high.ravel()))
    agent = ALGOS["mappo"].agent_cls(make_config("mappo", env_id, device="cpu", hidden=[16]), spec,
                                     torch.device("cpu"))
    agent.act = lambda obs, deterministic=False: (obs[..., :2] * 1e3).clamp(-1.0, 1.0)  # type: ignore[method-assign]
    obs = np.zeros((3, 3, 18), np.float32)
    obs[0, :, :2], obs[1, :, :2] = 5.0, -5.0  # the ends of [-1, 1]; then the middle
    expected = agent.predict(obs)
    np.testing.assert_array_equal(expected[:2], np.stack([high, low]).astype(np.float32))
    assert_same_actions(run_onnx(export_policy(agent, "onnx", tmp_path / "p.onnx"), obs), expected, False)
    assert_same_actions(run_torchscript(export_policy(agent, "torchscript", tmp_path / "p.pt"), obs), expected, False)
