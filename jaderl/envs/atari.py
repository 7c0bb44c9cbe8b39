"""Atari games through ``ale-py`` (its ROMs ship inside the package) with the standard preprocessing.

Each sub-env is ``gym.make(env_id, frameskip=1)`` wrapped in Gymnasium's ``AtariPreprocessing`` (up to 30 no-op
actions at reset, the action repeated for 4 frames with the last two max-pooled, 84x84 grayscale) and
``FrameStackObservation(4)``, so observations are uint8 (4, 84, 84), as in Mnih et al. 2015
(https://doi.org/10.1038/nature14236). Sticky actions (``repeat_action_probability=0.25``) stay as the v5 ids
define them (Machado et al. 2018). Rewards are the game's; training on an Atari id (``ALE/`` or one of ale-py's
older ids, :func:`is_atari_id`) clips them to their sign by default (``clip_rewards``, applied where the agent
learns, so logged returns are the game's scores). Install with ``pip install jaderl[atari]``.
"""

from __future__ import annotations

import importlib.util
import re

import gymnasium as gym
import torch

from jaderl.envs.vec import EnvError, GymnasiumVecEnv

FRAME_STACK = 4
"""Frames per observation."""


def is_atari_id(env_id: str) -> bool:
    """Whether ``env_id`` names an ale-py game: an ``ALE/...-v5`` id, or (when ale-py is installed) one of its older
    ids such as ``PongNoFrameskip-v4`` or ``Breakout-v4``, with or without Gymnasium's module prefix
    (``ale_py:ALE/Pong-v5``). Every one is built with the preprocessing above."""
    env_id = env_id.removeprefix("ale_py:")
    if env_id.startswith("ALE/"):
        return True
    if not re.fullmatch(r"[A-Z]\w*-v[04]", env_id) or importlib.util.find_spec("ale_py") is None:
        return False  # the check below imports ale-py, which only ale-py's own ids need
    import ale_py

    gym.register_envs(ale_py)
    try:
        return str(gym.spec(env_id).entry_point).startswith("ale_py")
    except gym.error.Error:
        return False


def register_atari_envs() -> None:
    """Register the ``ALE/`` ids with Gymnasium; a one-sentence EnvError when ale-py or OpenCV is missing."""
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing resizes frames with OpenCV)
    except ImportError as exc:
        missing = f"Atari envs need ale-py and OpenCV ({exc}); install them with `pip install jaderl[atari]`"
        raise EnvError(missing) from None
    gym.register_envs(ale_py)  # importing ale_py registers the ids; this keeps the import from looking unused


def make_atari_env(
    env_id: str,
    num_envs: int,
    device: torch.device | str = "cpu",
    asynchronous: bool = False,
    max_episode_steps: int | None = None,
) -> GymnasiumVecEnv:
    """``num_envs`` preprocessed copies of the Atari game ``env_id`` (``ALE/Pong-v5``, ``PongNoFrameskip-v4`` ...),
    vectorised in this process (or in one process per sub-env with ``asynchronous=True``). The game itself always
    advances one frame per emulator step (``frameskip=1``; ``AtariPreprocessing`` repeats each action 4 times), so
    an id's own frame skip (``Pong-v4``: 2 to 4 frames at random) is replaced by that fixed skip of 4; its sticky-action
    probability (0.25 for v5 ids, 0 for v4 ids) is kept.

    An episode is a whole game (a lost life does not end it). ``max_episode_steps`` truncates episodes after
    that many agent steps (frame-skipped), which the v5 ids leave unbounded apart from ALE's 108,000-frame limit.
    Episodes are seeded by ``reset(seed=...)``, like every Gymnasium env jaderl adapts.
    """
    register_atari_envs()
    env_id = env_id.removeprefix("ale_py:")  # registered above
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise EnvError(f"unknown Atari env {env_id!r} ({exc}); use an id such as ALE/Pong-v5") from None

    def factory() -> gym.Env:
        env = gym.make(env_id, frameskip=1)  # AtariPreprocessing skips frames itself (and max-pools the last two)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                              terminal_on_life_loss=False, grayscale_obs=True)
        if max_episode_steps is not None:  # outside the frame skip, so that it counts agent steps
            env = gym.wrappers.TimeLimit(env, max_episode_steps)
        return gym.wrappers.FrameStackObservation(env, FRAME_STACK)

    vector_cls = gym.vector.AsyncVectorEnv if asynchronous and num_envs > 1 else gym.vector.SyncVectorEnv
    vector = vector_cls([factory] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return GymnasiumVecEnv(vector, device=device)
