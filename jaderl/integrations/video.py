"""Videos of a trained policy: one MP4 per episode of the policy acting deterministically in one sub-env.

How each kind of env is drawn:

* a Gymnasium id: the env itself, made with ``render_mode="rgb_array"`` and stepped with ``agent.predict``;
* the torch-native classic-control envs (``jaderl/CartPole-v1``, ``jaderl/Pendulum-v1``, ``jaderl/Acrobot-v1``,
  ``jaderl/MountainCar-v0``, ``jaderl/MountainCarContinuous-v0``): Gymnasium's own drawing of the same env, whose
  ``unwrapped.state`` is set from the torch env's observation after every step (the observation holds the state:
  angles as cos and sin; Pendulum's torque arrow is set from the action too);
* the torch-native MPE envs (``jaderl/simple_spread``, ``jaderl/simple_tag``): a small renderer of filled circles in
  MPE2's colours (agents blue; adversaries red and good agents green; landmarks and obstacles grey) in a view that
  holds every entity of the episode.

A video has one frame for the first observation and one per step, the step that ends the episode included (the
torch envs' frames show the state reached before their automatic reset), so ``steps + 1`` frames; it plays at the
env's ``render_fps`` (MPE: 10 frames per second, its real time at ``dt = 0.1``). Other envs (Atari, stock trading,
chasing, VMAS, PettingZoo), and Gymnasium envs that cannot draw here (no ``rgb_array`` render mode, or a package
their drawing needs missing, such as pygame), cannot be recorded and say so in one sentence; with ``record_every``
before the run starts (the first frame is drawn then), so that no run directory is left half made.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from jaderl.api import episode_count
from jaderl.core.agent import Agent
from jaderl.core.config import Config, ConfigError
from jaderl.core.loop import VIDEO_RECORDER, PeerError
from jaderl.envs import NOT_GYMNASIUM, REGISTERED_ENVS, TORCH_ENVS, make_env
from jaderl.envs.atari import is_atari_id
from jaderl.envs.classic import AcrobotEnv, CartPoleEnv, MountainCarContinuousEnv, MountainCarEnv, PendulumEnv
from jaderl.envs.mpe import SimpleSpreadEnv, SimpleTagEnv
from jaderl.envs.stock import is_stock_id
from jaderl.envs.vec import EnvError, GymnasiumVecEnv, VecEnv
from jaderl.integrations.export import require

Frames = Callable[[int], Iterator[np.ndarray]]
"""An episode's frames, (H, W, 3) uint8, for a seed."""

TWINS: dict[type[VecEnv], tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    CartPoleEnv: ("CartPole-v1", lambda obs: obs),
    MountainCarEnv: ("MountainCar-v0", lambda obs: obs),
    MountainCarContinuousEnv: ("MountainCarContinuous-v0", lambda obs: obs),
    PendulumEnv: ("Pendulum-v1", lambda obs: np.array([math.atan2(obs[1], obs[0]), obs[2]])),
    AcrobotEnv: ("Acrobot-v1", lambda obs: np.array([math.atan2(obs[1], obs[0]), math.atan2(obs[3], obs[2]),
                                                    obs[4], obs[5]])),
}
"""Torch-native classic envs -> the Gymnasium id that draws them and its ``unwrapped.state`` (Gymnasium's layout)
from one sub-env's observation."""

MPE_FPS = 10
FRAME_SIZE = 512
"""Width and height of an MPE frame in pixels."""
GREY, BLUE, RED, GREEN = (0.25, 0.25, 0.25), (0.35, 0.35, 0.85), (0.85, 0.35, 0.35), (0.35, 0.85, 0.35)
"""MPE2's entity colours."""
SPREAD_LANDMARK_SIZE = 0.05
"""MPE2's default entity size, simple_spread's landmarks' (they do not collide, so the env does not keep it)."""


class RecordingError(PeerError):
    """``record_every`` could not draw the env during training; the run's own state is sound, so the Trainer
    checkpoints it before the error stops the run (as it does for a failed process beside it)."""


def record(agent: Agent, out: str | Path, episodes: int = 3, seed: int = 0) -> list[Path]:
    """Write ``episodes`` videos of ``agent`` acting deterministically in ``agent.config.env`` to the directory
    ``out`` (``episode-0.mp4``, ...; episode ``i`` starts from ``reset(seed=seed + i)``) and return their paths."""
    episodes = episode_count(episodes)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:  # refused now, not mid-way by
        raise ConfigError(f"seed={seed!r} is out of range: it must be a whole number >= 0")  # Gymnasium's reset
    seed = int(seed)  # numpy's integers too: Gymnasium's reset takes a Python int
    if Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"{out} is a file; give the directory to write the videos to")
    require(("imageio", "imageio_ffmpeg"), "recording videos", "video")
    import imageio.v2 as imageio  # optional: pip install 'jaderl[video]'

    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # Gymnasium draws on pygame surfaces, off screen; on a machine without a display SDL would print an error
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

    frames, fps, close = _scene(agent.config.env, agent)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    try:
        for episode in range(episodes):
            path = out / f"episode-{episode}.mp4"
            stream = frames(seed + episode)
            first = next(stream)  # an env that draws nothing says so before a file is opened
            partial = out / f"episode-{episode}.partial.mp4"  # renamed when whole: a cut video never looks complete
            try:
                # macro_block_size=2: even sizes are kept as they are, not scaled up to multiples of 16
                with imageio.get_writer(partial, fps=fps, macro_block_size=2, ffmpeg_log_level="error") as writer:
                    for frame in itertools.chain([first], stream):
                        writer.append_data(frame)
            except BaseException:  # Ctrl-C, a full disk, an env that fails mid-episode
                partial.unlink(missing_ok=True)
                raise
            partial.replace(path)
            paths.append(path)
    finally:
        close()
    return paths


def check_recordable(env_id: str) -> None:
    """A one-sentence :class:`EnvError` now, before a run with ``record_every`` starts, when ``env_id`` cannot be
    recorded: a kind of env :func:`record` does not draw (told from the id, nothing built), or a Gymnasium drawing
    that fails here (its first frame is drawn: a missing pygame or renderer shows now, not mid-run)."""
    base = env_id.partition("?")[0]
    if (env_id in REGISTERED_ENVS or is_atari_id(env_id) or is_stock_id(env_id)
            or (TORCH_ENVS[base] not in (*TWINS, SimpleSpreadEnv, SimpleTagEnv) if base in TORCH_ENVS
                else base.startswith(NOT_GYMNASIUM))):
        raise EnvError(_not_drawn(env_id))
    if TORCH_ENVS.get(base) in (SimpleSpreadEnv, SimpleTagEnv):
        return  # drawn by jaderl itself: nothing it needs can be missing
    frames, _, close = _scene(env_id, None)
    try:
        next(frames(0))  # the first frame is drawn before the policy acts (it takes no agent)
    finally:
        close()


def _not_drawn(env_id: str) -> str:
    return (f"{env_id} cannot be recorded: videos are drawn for Gymnasium ids, the torch-native classic-control envs "
            "and jaderl/simple_spread or jaderl/simple_tag")


def _scene(env_id: str, agent: Agent | None) -> tuple[Frames, float, Callable[[], None]]:
    """The episode player of env ``env_id`` for ``agent`` (None: a check that draws only the first frame), its
    frame rate, and what releases it; or a one-sentence refusal."""
    env = make_env(env_id, 1, torch.device("cpu") if agent is None else agent.device)
    if type(env) in TWINS:
        gym_id, to_state = TWINS[type(env)]
        twin = gym.make(gym_id, render_mode="rgb_array").unwrapped

        def close() -> None:
            twin.close()
            env.close()

        return ((lambda seed: _twin_frames(agent, env, twin, to_state, seed, env_id)), twin.metadata["render_fps"],
                close)
    if isinstance(env, (SimpleSpreadEnv, SimpleTagEnv)):
        return (lambda seed: _mpe_frames(agent, env, seed)), MPE_FPS, env.close
    env.close()
    if type(env) is GymnasiumVecEnv and not is_atari_id(env_id):
        try:
            gym_env = gym.make(env_id, render_mode="rgb_array")
        except gym.error.DependencyNotInstalled as exc:  # a renderer Gymnasium loads on making the env
            raise EnvError(_cannot_draw(env_id, exc)) from None
        except (TypeError, gym.error.Error):  # an env class that takes no render_mode
            raise EnvError(f"{env_id} cannot be recorded: it does not render with render_mode='rgb_array'") from None
        modes = gym_env.metadata.get("render_modes") or []
        if "rgb_array" not in modes:  # Gymnasium only warns; its render() would fail on the first frame
            gym_env.close()
            raise EnvError(f"{env_id} cannot be recorded: it does not render with render_mode='rgb_array' (its "
                           f"metadata's render_modes are {list(modes)}); record an env that draws itself as RGB "
                           "arrays")
        return ((lambda seed: _gymnasium_frames(agent, gym_env, seed, env_id)), gym_env.metadata.get("render_fps", 30),
                gym_env.close)
    raise EnvError(_not_drawn(env_id))


def _cannot_draw(env_id: str, exc: BaseException) -> str:
    """The sentence for a Gymnasium drawing that failed: its render() is not implemented, or a package it needs is
    missing (Gymnasium's message names the command that installs it)."""
    if isinstance(exc, NotImplementedError):
        return (f"{env_id} cannot be recorded: its render() is not implemented; implement it for "
                "render_mode='rgb_array' to record this env")
    reason = (str(exc).strip().splitlines() or [""])[0].rstrip(".") or type(exc).__name__
    return f"{env_id} cannot be drawn here: {reason}"


def _render(env: gym.Env, env_id: str) -> np.ndarray:
    """``env.render()``, or a one-sentence EnvError when Gymnasium cannot draw it (a package missing, no drawing)."""
    try:
        frame = env.render()
    except (NotImplementedError, ImportError, gym.error.DependencyNotInstalled) as exc:
        raise EnvError(_cannot_draw(env_id, exc)) from None
    if not isinstance(frame, np.ndarray):
        raise EnvError(f"{env_id} cannot be recorded: it does not render with render_mode='rgb_array'")
    return frame


def _gymnasium_frames(agent: Agent, env: gym.Env, seed: int, env_id: str) -> Iterator[np.ndarray]:
    """Frames of a Gymnasium env made with ``render_mode="rgb_array"``, stepped with ``agent.predict``."""
    obs, _ = env.reset(seed=seed)
    start = int(env.action_space.start) if isinstance(env.action_space, gym.spaces.Discrete) else 0
    done = False
    while True:
        yield _render(env, env_id)
        if done:
            return
        obs, _, terminated, truncated, _ = env.step(agent.predict(obs) + start)
        done = terminated or truncated


def _twin_frames(agent: Agent, env: VecEnv, twin: gym.Env, to_state: Callable[[np.ndarray], np.ndarray],
                 seed: int, env_id: str) -> Iterator[np.ndarray]:
    """Frames of Gymnasium's ``twin`` following the torch env ``env`` (one sub-env)."""
    obs = env.reset(seed=seed)
    shown, action, done = obs, None, False
    while True:
        twin.state = to_state(shown[0].double().cpu().numpy())
        if isinstance(env, PendulumEnv):  # Gymnasium's arrow shows the torque of the last step (none at first)
            twin.last_u = None if action is None else float(env.max_torque * action.clamp(-1.0, 1.0).item())
        yield _render(twin, env_id)
        if done:
            return
        action = agent.act(obs, deterministic=True)
        obs, _, terminated, truncated, info = env.step(action)
        shown, done = info["final_obs"], bool((terminated | truncated)[0])  # final_obs: before any auto-reset


def _mpe_frames(agent: Agent, env: SimpleSpreadEnv | SimpleTagEnv, seed: int) -> Iterator[np.ndarray]:
    """Play the episode, then draw it in one view that holds every entity of every step."""
    obs = env.reset(seed=seed)
    worlds, done = [_mpe_world(obs[0], env.num_landmarks)], False
    while not done:
        obs, _, terminated, truncated, info = env.step(agent.act(obs, deterministic=True))
        worlds.append(_mpe_world(info["final_obs"][0], env.num_landmarks))  # before any auto-reset
        done = bool((terminated | truncated)[0])
    if isinstance(env, SimpleTagEnv):
        teams = [(env.adversary_size, RED)] * env.num_adversaries + [(env.good_size, GREEN)] * env.num_good
        landmarks = [(env.obstacle_size, GREY)] * env.num_landmarks
    else:
        teams = [(env.agent_size, BLUE)] * env.num_agents
        landmarks = [(SPREAD_LANDMARK_SIZE, GREY)] * env.num_landmarks
    looks = teams + landmarks  # agents, then landmarks: MPE2's drawing order
    radii = np.array([size for size, _ in looks])
    extent = max(1.0, max(float((np.abs(w) + radii[:, None]).max()) for w in worlds)) * 1.05
    for world in worlds:
        yield draw_circles([(x, y, size, colour) for (x, y), (size, colour) in zip(world, looks, strict=True)],
                           extent)


def _mpe_world(obs: torch.Tensor, num_landmarks: int) -> np.ndarray:
    """Positions ``(A + L, 2)`` of the agents, then the landmarks, from one sub-env's observations ``(A, obs_dim)``:
    every agent observes its own position (columns 2:4) and the landmarks relative to it (4 : 4 + 2 L)."""
    obs = obs.double().cpu().numpy()
    own = obs[:, 2:4]
    landmarks = own[0] + obs[0, 4:4 + 2 * num_landmarks].reshape(num_landmarks, 2)
    return np.concatenate([own, landmarks])


def draw_circles(circles: list[tuple[float, float, float, tuple[float, float, float]]], extent: float,
                 size: int = FRAME_SIZE) -> np.ndarray:
    """An RGB frame ``(size, size, 3)`` uint8 of filled, outlined, anti-aliased circles ``(x, y, radius, colour)`` on
    white, in world coordinates ``[-extent, extent]`` on both axes (y up); later circles are drawn over earlier ones."""
    image = np.ones((size, size, 3))
    scale = size / (2 * extent)  # pixels per world unit
    for x, y, radius, colour in circles:
        cx, cy, r = (x + extent) * scale, (extent - y) * scale, max(radius * scale, 1.5)
        x0, x1 = max(int(cx - r - 1), 0), min(int(cx + r + 2), size)
        y0, y1 = max(int(cy - r - 1), 0), min(int(cy + r + 2), size)
        if x0 >= x1 or y0 >= y1:
            continue
        px, py = np.meshgrid(np.arange(x0, x1) + 0.5, np.arange(y0, y1) + 0.5)
        distance = np.hypot(px - cx, py - cy)
        region = image[y0:y1, x0:x1]
        # a dark edge one pixel wide, then the fill; coverage of the pixel centre's distance smooths the edges
        for edge, rgb in ((r, (0.0, 0.0, 0.0)), (r - 1.0, colour)):
            alpha = np.clip(edge - distance + 0.5, 0.0, 1.0)[..., None]
            region[:] = region * (1.0 - alpha) + np.asarray(rgb) * alpha
    return (image * 255.0 + 0.5).astype(np.uint8)


__all__ = ["RecordingError", "check_recordable", "draw_circles", "record"]


def _check_before_training(config: Config) -> None:
    """``record_every``'s check, before the run directory is made: the video packages, then the env."""
    require(("imageio", "imageio_ffmpeg"), "recording videos", "video")
    try:
        check_recordable(config.env)
    except EnvError as exc:
        raise EnvError(f"{exc}; to train without videos, drop --record-every (record_every=0)") from None


def _record_during_training(agent: Agent, out: Path) -> None:
    """One episode into ``out``; a drawing that fails all the same stops the run after its checkpoint."""
    try:
        record(agent, out, episodes=1)
    except EnvError as exc:
        raise RecordingError(f"{exc} (--record-every 0 on resuming goes on without videos)") from None  # the Trainer
        # adds the step it checkpointed and how to resume


VIDEO_RECORDER[:] = [(_record_during_training, _check_before_training)]
"""``record_every``: the Trainer records one episode into ``RUN_DIR/videos/step-N/`` every that many env steps."""

