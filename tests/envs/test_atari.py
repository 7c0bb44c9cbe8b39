"""Atari through ale-py: the preprocessed env and smoke runs of DQN and PPO on ALE/Pong-v5 on CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

import jaderl
from jaderl.core import loop
from jaderl.envs import EnvError, GymnasiumVecEnv, VecEnv, make_env
from jaderl.envs.atari import is_atari_id, make_atari_env

PONG = "ALE/Pong-v5"


def test_pong_builds_and_steps() -> None:
    env = make_env(PONG, 2)
    try:
        assert isinstance(env, GymnasiumVecEnv)
        assert env.obs_shape == (4, 84, 84) and env.is_discrete and env.action_dim == 6
        obs = env.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == torch.uint8
        for _ in range(10):
            obs, reward, terminated, truncated, info = env.step(torch.randint(6, (2,)))
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == torch.uint8
        assert info["final_obs"].dtype == torch.uint8 and reward.dtype == torch.float32
        assert obs.float().std() > 0  # real frames, not a blank screen
        assert terminated.shape == truncated.shape == (2,)
    finally:
        env.close()


def test_asynchronous_steps_sub_envs_in_processes() -> None:
    env = make_atari_env(PONG, 2, asynchronous=True)
    try:
        assert isinstance(env.env, gym.vector.AsyncVectorEnv)
        env.reset(seed=0)
        obs = env.step(torch.randint(6, (2,)))[0]
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == torch.uint8
    finally:
        env.close()


def test_max_episode_steps_counts_agent_steps() -> None:
    env = make_atari_env(PONG, 1, max_episode_steps=5)
    try:
        assert env.max_steps == 5
        env.reset(seed=0)
        truncated = [env.step(torch.zeros(1, dtype=torch.long))[3].item() for _ in range(5)]
        assert truncated == [False] * 4 + [True]
    finally:
        env.close()


def test_unknown_atari_id_is_one_sentence() -> None:
    with pytest.raises(EnvError, match="unknown Atari env 'ALE/NoSuchGame-v5'"):
        make_env("ALE/NoSuchGame-v5", 1)
    with pytest.raises(EnvError, match=r"^Atari ids take no \?options \('ALE/Pong-v5\?frameskip=4'\): jaderl "):
        make_env("ALE/Pong-v5?frameskip=4", 1)


def test_missing_ale_py_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ale_py", None)  # makes `import ale_py` fail
    with pytest.raises(EnvError, match=r"pip install jaderl\[atari\]"):
        make_env(PONG, 1)


def _short_pong(monkeypatch: pytest.MonkeyPatch, max_episode_steps: int) -> None:
    """Make the training loop build Pong with short episodes, so that an evaluation takes seconds, not minutes."""

    def short(name: str, num_envs: int, device: Any = "cpu", seed: int | None = None, workers: int = 0) -> VecEnv:
        return make_atari_env(name, num_envs, device, max_episode_steps=max_episode_steps)

    monkeypatch.setattr(loop, "make_env", short)


SMOKE: dict[str, dict[str, Any]] = {
    "dqn": dict(num_envs=2, horizon=4, total_steps=2000, warmup_steps=500, buffer_size=5000, batch_size=32,
                updates_per_step=0.05, hidden=[64]),
    "ppo": dict(num_envs=2, horizon=128, total_steps=2048, minibatch_size=128, num_epochs=1, hidden=[64]),
}


@pytest.mark.parametrize("algo", list(SMOKE))
def test_pong_smoke_run(algo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starts, takes gradient steps and checkpoints on CPU (learning Pong takes millions of steps, not this)."""
    _short_pong(monkeypatch, max_episode_steps=200)
    settings = SMOKE[algo]
    stats: list[dict[str, Any]] = []
    result = jaderl.train(algo, PONG, run_dir=str(tmp_path / algo), device="cpu", seed=0, eval_every=2000,
                          eval_episodes=1, checkpoint_every=2000, progress=stats.append, **settings)
    assert result.steps >= settings["total_steps"] and result.stop_reason == "total_steps"
    run_dir = Path(result.run_dir)
    assert (run_dir / "checkpoint.json").exists() and (run_dir / "best_policy.safetensors").exists()
    state = json.loads((run_dir / "checkpoint.json").read_text())["state"]
    if algo == "dqn":
        assert state["agent"]["counters"]["num_updates"] > 0  # (2000 - 500) * 0.05 gradient steps after the warm-up
    else:
        assert "encoder" in state["agent"]["networks"]
    # gradient steps were taken: the encoder differs from the one the run started with (same seed, same build)
    trained = jaderl.load(run_dir, best=False)
    env = make_atari_env(PONG, 1)
    torch.manual_seed(0)
    initial = type(trained)(trained.config, env, torch.device("cpu"))
    encoders = [agent.q_net.encoder if algo == "dqn" else agent.encoder for agent in (initial, trained)]
    assert all(not torch.equal(a, b) for a, b in zip(*(e.parameters() for e in encoders), strict=True))
    assert trained.act(env.reset(seed=1), deterministic=True).shape == (1,)
    env.close()
    assert stats and stats[-1]["done"]


@pytest.mark.parametrize("env_id", ["PongNoFrameskip-v4", "Pong-v4", "ale_py:PongNoFrameskip-v4", "ale_py:ALE/Pong-v5"])
def test_older_ale_ids_get_the_same_preprocessing(env_id: str) -> None:
    """ale-py's v4 ids are Atari games too: preprocessed, frame-stacked and (when training) reward-clipped."""
    assert is_atari_id(env_id) and not is_atari_id("CartPole-v0") and not is_atari_id("Pendulum-v1")
    env = make_env(env_id, 1)
    try:
        assert isinstance(env, GymnasiumVecEnv) and env.obs_shape == (4, 84, 84) and env.action_dim == 6
        assert env.reset(seed=0).dtype == torch.uint8
        game = env.env.envs[0].unwrapped  # type: ignore[attr-defined]
        assert game.spec.id == env_id.removeprefix("ale_py:") and game._frameskip == 1  # the wrapper skips frames
    finally:
        env.close()
    assert jaderl.make_config("dqn", env_id).clip_rewards and not jaderl.make_config("dqn", "CartPole-v1").clip_rewards
