"""``jaderl record``: one valid MP4 per episode, ``steps + 1`` frames (the first observation and every step's), for a
torch-native classic env drawn by Gymnasium, a Gymnasium env, and an MPE env drawn by jaderl's own renderer."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch

import jaderl
from jaderl.algos import PPO
from jaderl.api import make_config
from jaderl.cli import main
from jaderl.core.agent import Agent
from jaderl.core.config import ConfigError
from jaderl.core.loop import TrainingError
from jaderl.envs import EnvError, make_env
from jaderl.integrations.video import BLUE, GREY, draw_circles, record

imageio = pytest.importorskip("imageio.v2")
pytest.importorskip("imageio_ffmpeg")

SETTINGS = {"device": "cpu", "total_steps": 64, "eval_every": 64, "eval_episodes": 1, "hidden": [16], "num_envs": 4,
            "seed": 2}
ON_POLICY = {"horizon": 16, "minibatch_size": 32, "num_epochs": 1}


def read_frames(path: Path) -> np.ndarray:
    """Every frame of an MP4 file, decoded: (frames, H, W, 3) uint8."""
    with imageio.get_reader(path) as reader:
        return np.stack([np.asarray(frame) for frame in reader])  # (not list(reader): its length hint is inf)


def torch_episode(agent: Agent, env_id: str, seed: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The deterministic episode ``record`` plays from ``reset(seed=seed)``: its steps, first and final observation."""
    env = make_env(env_id, 1, "cpu")
    first = obs = env.reset(seed=seed)
    steps, done = 0, False
    while not done:
        obs, _, terminated, truncated, info = env.step(agent.act(obs, deterministic=True))
        steps, done = steps + 1, bool((terminated | truncated)[0])
    return steps, first[0], info["final_obs"][0]


def gymnasium_drawing(env_id: str, state: torch.Tensor) -> np.ndarray:
    """Gymnasium's own frame of ``env_id`` in ``state``."""
    env = gym.make(env_id, render_mode="rgb_array").unwrapped
    env.state = state.double().numpy()
    frame = env.render()
    env.close()
    return frame


def test_torch_cartpole_is_drawn_by_gymnasium_from_the_synced_state(tmp_path: Path) -> None:
    jaderl.train("ppo", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), **SETTINGS, **ON_POLICY)
    agent = jaderl.load(tmp_path / "run")
    paths = record(agent, tmp_path / "videos", episodes=2, seed=3)
    assert paths == [tmp_path / "videos" / "episode-0.mp4", tmp_path / "videos" / "episode-1.mp4"]
    for episode, path in enumerate(paths):
        frames = read_frames(path)
        steps, first, final = torch_episode(agent, "jaderl/CartPole-v1", seed=3 + episode)
        assert frames.shape == (steps + 1, 400, 600, 3)
        with imageio.get_reader(path) as reader:
            assert reader.get_meta_data()["fps"] == 50  # Gymnasium's render_fps for CartPole
        # the first frame shows the reset state, the last the state that ended the episode (not the auto-reset one)
        for frame, state in ((frames[0], first), (frames[-1], final)):
            error = np.abs(frame.astype(float) - gymnasium_drawing("CartPole-v1", state)).mean()
            assert error < 1.0, f"the video differs from Gymnasium's drawing by {error:.2f} on average"
        reset_drawing = gymnasium_drawing("CartPole-v1", first)
        assert np.abs(frames[-1].astype(float) - reset_drawing).mean() > 2 * np.abs(
            frames[-1].astype(float) - gymnasium_drawing("CartPole-v1", final)).mean()


def test_gymnasium_pendulum_renders_itself(tmp_path: Path) -> None:
    jaderl.train("sac", "Pendulum-v1", run_dir=str(tmp_path / "run"), warmup_steps=16, batch_size=16, horizon=1,
                 **SETTINGS)
    (path,) = record(jaderl.load(tmp_path / "run"), tmp_path / "videos", episodes=1)
    frames = read_frames(path)
    assert frames.shape == (200 + 1, 500, 500, 3)  # Pendulum-v1 is truncated after 200 steps
    assert frames.std(axis=0).max() > 50  # the pendulum moves


def test_simple_spread_is_drawn_as_circles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    jaderl.train("mappo", "jaderl/simple_spread", run_dir=str(run_dir), **SETTINGS, **ON_POLICY)
    assert main(["record", str(run_dir), "--episodes", "1", "--seed", "4"]) == 0  # through the CLI
    path = run_dir / "videos" / "episode-0.mp4"
    assert capsys.readouterr().out.split() == [str(path)]
    frames = read_frames(path)
    assert frames.shape == (25 + 1, 512, 512, 3)  # 25 steps (MPE2's max_cycles), then truncated
    pixels = frames[0].reshape(-1, 3).astype(int)
    for colour in (BLUE, GREY):  # agents and landmarks are there
        target = np.array(colour) * 255
        assert (np.abs(pixels - target).max(axis=1) < 20).sum() > 50


def test_draw_circles_in_world_coordinates() -> None:
    frame = draw_circles([(0.5, 0.5, 0.1, (1.0, 0.0, 0.0))], extent=1.0, size=100)
    assert frame.shape == (100, 100, 3) and frame.dtype == np.uint8
    assert tuple(frame[25, 75]) == (255, 0, 0)  # (0.5, 0.5) is up and to the right: row 25, column 75
    assert tuple(frame[75, 25]) == (255, 255, 255) and tuple(frame[0, 0]) == (255, 255, 255)
    assert tuple(frame[25, 75 + 5]) != (255, 0, 0)  # the outline, 5 pixels (0.1 units) out


class Blind(gym.Env):
    """A Gymnasium env that takes no render_mode."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(3, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(3, np.float32), 0.0, True, False, {}


@pytest.mark.filterwarnings("ignore:.*not in the possible render_modes:UserWarning")  # Gymnasium's, before ours
def test_envs_that_cannot_be_drawn_say_so(tmp_path: Path) -> None:
    gym.register("JaderlTestBlind-v0", entry_point=Blind)
    for env_id, reason in (("jaderl/Chasing-v0", "videos are drawn for Gymnasium ids"),
                           ("JaderlTestBlind-v0", "it does not render with render_mode='rgb_array'")):
        env = make_env(env_id, 1)
        agent = PPO(make_config("ppo", env_id, device="cpu", hidden=[16]), env.spec, torch.device("cpu"))
        env.close()
        with pytest.raises(EnvError, match=rf"^{re.escape(env_id)} cannot be recorded: {re.escape(reason)}"):
            record(agent, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written
    with pytest.raises(ConfigError, match="episodes=0 is out of range"):
        record(agent, tmp_path, episodes=0)


def test_a_missing_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else
                        real(name, *a))
    agent = PPO(make_config("ppo", "jaderl/CartPole-v1", device="cpu", hidden=[16]),
                make_env("jaderl/CartPole-v1", 1).spec, torch.device("cpu"))
    with pytest.raises(ImportError, match=r"imageio_ffmpeg, which is not installed; pip install 'jaderl\[video\]'"):
        record(agent, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written


def test_cli_record_refuses_a_missing_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["record", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "holds no readable checkpoint" in err and len(err.strip().splitlines()) == 1
    notes = tmp_path / "notes.txt"
    notes.write_text("kept")
    with pytest.raises(ConfigError, match=r"notes\.txt is a file; give the directory to write the videos to"):
        record(None, notes)  # type: ignore[arg-type]  # refused before the agent is read
    assert notes.read_text() == "kept"


def test_record_every_records_during_training_and_after_a_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code = main(["train", "ppo", "jaderl/CartPole-v1", "--run-dir", str(run_dir), "--record-every", "128",
                 "--total-steps", "256", "--eval-every", "256", "--eval-episodes", "1", "--num-envs", "4",
                 "--device", "cpu", "--set", "horizon=16", "--set", "minibatch_size=32", "--set", "hidden=[16]"])
    assert code == 0
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == ["step-128", "step-256"]
    agent = jaderl.load(run_dir, best=False)  # the last policy, as it was when step-256 was recorded
    steps, _, _ = torch_episode(agent, "jaderl/CartPole-v1", seed=0)
    assert read_frames(run_dir / "videos" / "step-256" / "episode-0.mp4").shape[0] == steps + 1
    jaderl.resume(run_dir, total_steps=384)
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == ["step-128", "step-256", "step-384"]


def test_record_every_without_the_video_packages_stops_before_training(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "imageio" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'jaderl\[video\]'"):
        jaderl.train("ppo", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), record_every=64, **SETTINGS,
                     **ON_POLICY)
    assert not (tmp_path / "run").exists()


class Undrawn(gym.Env):
    """A Gymnasium env that takes a render_mode but lists no render mode and draws nothing (Gymnasium only warns)."""

    metadata: ClassVar[dict] = {"render_modes": []}
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(3, np.float32), 0.0, True, False, {}


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line that ``jaderl ARGV`` prints before it exits 2 for bad input."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("jaderl: error: ") and "Traceback" not in err
    return err


@pytest.mark.filterwarnings("ignore:.*not in the possible render_modes:UserWarning")  # Gymnasium's, before ours
def test_an_env_without_rgb_array_is_refused_by_record_and_before_training(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    gym.register("JaderlTestUndrawn-v0", entry_point=Undrawn, max_episode_steps=5)
    run_dir = tmp_path / "run"
    jaderl.train("ppo", "JaderlTestUndrawn-v0", run_dir=str(run_dir), **SETTINGS, **ON_POLICY)
    said = "JaderlTestUndrawn-v0 cannot be recorded: it does not render with render_mode='rgb_array'"
    assert said in cli_error(["record", str(run_dir), "--episodes", "1"], capsys)
    assert not (run_dir / "videos").exists()
    err = cli_error(["train", "ppo", "JaderlTestUndrawn-v0", "--run-dir", str(tmp_path / "rv"), "--record-every", "32",
                     "--device", "cpu", "--set", "hidden=[16]"], capsys)
    assert said in err and "drop --record-every" in err
    assert not (tmp_path / "rv").exists()  # refused before the run directory is made


@pytest.mark.parametrize("env_id", ["jaderl/Chasing-v0", "jaderl/StockTrading-v0"])
def test_record_every_refuses_an_env_it_cannot_draw_before_the_run_starts(env_id: str, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    err = cli_error(["train", "ppo", env_id, "--run-dir", str(tmp_path / "rv"), "--record-every", "32",
                     "--device", "cpu", "--set", "hidden=[16]"], capsys)
    assert f"{env_id} cannot be recorded: videos are drawn for Gymnasium ids" in err and "drop --record-every" in err
    assert not (tmp_path / "rv").exists()


def test_every_family_of_env_ids_make_env_knows_is_classified(monkeypatch: pytest.MonkeyPatch) -> None:
    """The families video cannot draw are make_env's own list: an id of each is refused from its prefix, nothing
    built, and make_env names no prefix outside that list."""
    import inspect

    import jaderl.envs
    from jaderl.envs import NOT_GYMNASIUM, SIMULATORS
    from jaderl.integrations.video import check_recordable

    prefixes = set(re.findall(r'"([a-z]+/)"', inspect.getsource(jaderl.envs)))
    assert prefixes and prefixes <= set(NOT_GYMNASIUM) == {"jaderl/", *SIMULATORS}

    def nothing_is_built(*args: object, **kwargs: object) -> None:
        raise AssertionError("an env was built")

    monkeypatch.setattr("jaderl.integrations.video.make_env", nothing_is_built)
    for prefix in NOT_GYMNASIUM:
        with pytest.raises(EnvError, match=rf"^{prefix}NoSuchEnv-v0 cannot be recorded: videos are drawn for"):
            check_recordable(f"{prefix}NoSuchEnv-v0")


def test_record_every_refuses_a_pettingzoo_env_before_the_run_starts(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mpe2")
    err = cli_error(["train", "mappo", "pettingzoo/mpe2.simple_spread_v3", "--run-dir", str(tmp_path / "rv"),
                     "--record-every", "50", "--total-steps", "100", "--num-envs", "2", "--device", "cpu",
                     "--set", "minibatch_size=25", "--set", "horizon=25"], capsys)
    assert "pettingzoo/mpe2.simple_spread_v3 cannot be recorded: videos are drawn for Gymnasium ids" in err
    assert not (tmp_path / "rv").exists()


def without_pygame(env: gym.Env) -> np.ndarray:
    raise gym.error.DependencyNotInstalled('pygame is not installed, run `pip install "gymnasium[classic-control]"`')


def test_a_missing_drawing_package_is_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    run_dir = tmp_path / "run"
    jaderl.train("ppo", "CartPole-v1", run_dir=str(run_dir), **SETTINGS, **ON_POLICY)
    monkeypatch.setattr(CartPoleEnv, "render", without_pygame)  # as Gymnasium says when pygame is missing
    said = 'CartPole-v1 cannot be drawn here: pygame is not installed, run `pip install "gymnasium[classic-control]"`'
    assert said in cli_error(["record", str(run_dir), "--episodes", "1"], capsys)
    assert not list((run_dir / "videos").glob("*.mp4"))
    # the torch-native twin is drawn by the same Gymnasium class
    assert "jaderl/CartPole-v1 cannot be drawn here: pygame is not installed" in cli_error(
        ["train", "ppo", "jaderl/CartPole-v1", "--run-dir", str(tmp_path / "rv"), "--record-every", "32",
         "--device", "cpu", "--set", "hidden=[16]"], capsys)
    assert not (tmp_path / "rv").exists()  # the first frame is drawn before the run directory is made


def test_a_drawing_that_fails_during_training_keeps_a_checkpoint(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    real, drawn = CartPoleEnv.render, []

    def first_frame_only(env: gym.Env) -> np.ndarray:  # drawn before training, then the package is gone
        drawn.append(1)
        return real(env) if len(drawn) == 1 else without_pygame(env)

    monkeypatch.setattr(CartPoleEnv, "render", first_frame_only)
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"^jaderl/CartPole-v1 cannot be drawn here: pygame is not installed.*"
                       r"\(--record-every 0 on resuming goes on without videos\); the run was checkpointed at step 64: "
                       r"continue it with `jaderl train --resume"):
        jaderl.train("ppo", "jaderl/CartPole-v1", run_dir=str(run_dir), record_every=64, **SETTINGS, **ON_POLICY)
    assert jaderl.load(run_dir, best=False).steps == 64  # resumable: the checkpoint holds the step it stopped at
    monkeypatch.setattr(CartPoleEnv, "render", without_pygame)
    result = jaderl.resume(run_dir, record_every=0, total_steps=128)  # on without videos, as the message says
    assert result.steps == 128 and not (run_dir / "videos" / "step-128").exists()


def test_record_refuses_a_negative_seed_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    jaderl.train("ppo", "CartPole-v1", run_dir=str(run_dir), **SETTINGS, **ON_POLICY)
    assert "seed=-1 is out of range: it must be a whole number >= 0" in cli_error(
        ["record", str(run_dir), "--seed", "-1", "--episodes", "1"], capsys)
    assert "episodes=0 is out of range" in cli_error(["record", str(run_dir), "--episodes", "0"], capsys)
    assert not (run_dir / "videos").exists()


def test_record_takes_a_numpy_integer_seed(tmp_path: Path) -> None:
    """A seed from numpy (``rng.integers``) is a whole number like any other: the same videos as the int."""
    agent = PPO(make_config("ppo", "jaderl/CartPole-v1", device="cpu", hidden=[16]),
                make_env("jaderl/CartPole-v1", 1).spec, torch.device("cpu"))
    (path,) = record(agent, tmp_path / "numpy", episodes=1, seed=np.int64(3))
    (same,) = record(agent, tmp_path / "int", episodes=1, seed=3)
    assert path.name == "episode-0.mp4"
    np.testing.assert_array_equal(read_frames(path), read_frames(same))
    with pytest.raises(ConfigError, match=r"^seed=np.int64\(-1\) is out of range: it must be a whole number >= 0$"):
        record(agent, tmp_path / "negative", episodes=1, seed=np.int64(-1))


def test_a_recording_cut_short_leaves_no_video_that_looks_whole(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the middle of the second episode: the first video is whole, and nothing of the second is left (a
    file of the frames written so far would play as if the episode ended there)."""
    import jaderl.integrations.video as video

    jaderl.train("ppo", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), **SETTINGS, **ON_POLICY)
    agent = jaderl.load(tmp_path / "run")
    scene = video._scene

    def cut(env_id: str, agent: Agent | None) -> tuple:
        frames, fps, close = scene(env_id, agent)

        def stream(seed: int) -> Any:
            for k, frame in enumerate(frames(seed)):
                if seed == 4 and k == 5:
                    raise KeyboardInterrupt
                yield frame
        return stream, fps, close

    monkeypatch.setattr(video, "_scene", cut)
    with pytest.raises(KeyboardInterrupt):
        record(agent, tmp_path / "videos", episodes=2, seed=3)
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["episode-0.mp4"]
    assert len(read_frames(tmp_path / "videos" / "episode-0.mp4")) > 5
