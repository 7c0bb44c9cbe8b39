"""Tests of the image encoder (jaderl.core.nets.NatureCNN) and of PPO and DQN on image observations."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from jaderl.algos import ALGOS
from jaderl.algos.dqn import DQN, DQNConfig
from jaderl.algos.nets import EncodedNet
from jaderl.algos.ppo import PPO, PPOConfig
from jaderl.api import make_config
from jaderl.core.agent import Agent
from jaderl.core.checkpoint import load_checkpoint, save_checkpoint
from jaderl.core.nets import NatureCNN
from jaderl.envs.vec import VecEnv

SIZE = 36  # the smallest image the Nature convolutions take: keeps the tests fast


class BrightnessEnv(VecEnv):
    """A torch image env: each sub-env shows a dark or a bright uint8 image with noise, and action 1 is rewarded on
    bright images, action 0 on dark ones; episodes are truncated after ``max_steps`` steps."""

    def __init__(self, num_envs: int, channels_last: bool = False, seed: int = 0) -> None:
        self.num_envs, self.is_discrete, self.action_dim, self.max_steps = num_envs, True, 2, 8
        self.device = torch.device("cpu")
        self.obs_shape = (SIZE, SIZE, 2) if channels_last else (2, SIZE, SIZE)
        self.generator = torch.Generator().manual_seed(seed)
        self.bright = torch.zeros(num_envs, dtype=torch.bool)
        self.t = torch.zeros(num_envs, dtype=torch.long)

    def _obs(self) -> torch.Tensor:
        noise = torch.randint(0, 60, (self.num_envs, *self.obs_shape), generator=self.generator)
        return (noise + 190 * self.bright.view(-1, 1, 1, 1)).to(torch.uint8)  # (N, *obs_shape)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self.bright = torch.rand(self.num_envs, generator=self.generator) < 0.5
        self.t.zero_()
        return self._obs()

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        reward = (action.long() == self.bright.long()).float()
        self.t += 1
        truncated = self.t >= self.max_steps
        terminated = torch.zeros_like(truncated)
        self.bright = torch.rand(self.num_envs, generator=self.generator) < 0.5
        final_obs = self._obs()
        self.t[truncated] = 0
        return final_obs, reward, terminated, truncated, {"final_obs": final_obs}


def test_channels_first_and_last_give_the_same_features() -> None:
    torch.manual_seed(0)
    first = NatureCNN((4, 84, 84))
    last = NatureCNN((84, 84, 4))
    last.load_state_dict(first.state_dict())  # same layers: the layout is not a parameter
    assert not first.channels_last and last.channels_last
    images = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out = first(images)
    assert out.shape == (3, 512) and first.out_dim == 512
    torch.testing.assert_close(last(images.permute(0, 2, 3, 1)), out)


def test_leading_dims_and_uint8_scaling() -> None:
    torch.manual_seed(0)
    cnn = NatureCNN((2, SIZE, SIZE), out_dim=16)
    images = torch.randint(0, 256, (5, 3, 2, SIZE, SIZE), dtype=torch.uint8)  # (T, N, C, H, W)
    out = cnn(images)
    assert out.shape == (5, 3, 16)
    torch.testing.assert_close(out[4, 2], cnn(images[4, 2:3])[0])
    torch.testing.assert_close(out[4, 2], cnn(images[4, 2]))  # one image, no leading dimension
    # uint8 pixels are scaled to [0, 1]; float images are taken as they are
    torch.testing.assert_close(out, cnn(images.float() / 255.0))
    assert not torch.allclose(out, cnn(images.float()))


def test_rejects_images_too_small() -> None:
    with pytest.raises(ValueError, match="at least 36x36"):
        NatureCNN((4, 20, 20))


def _parameters(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _changed(before: list[torch.Tensor], module: nn.Module) -> bool:
    return all(not torch.equal(b, p) for b, p in zip(before, module.parameters(), strict=True))


def _train(agent: Agent, env: VecEnv, iterations: int) -> None:
    buffer = agent.make_buffer()
    for _ in range(iterations):
        buffer.add(agent.explore(env, agent.config.horizon))
        agent.update(buffer)


def _same_policy(agent: PPO | DQN, other: PPO | DQN, env: VecEnv) -> None:
    """Both agents give the same logits (PPO) or Q-values (DQN) and actions on the same images."""
    obs = env.reset(seed=7)
    outputs = [(a.actor.net if isinstance(a, PPO) else a.q_net)(a.features(obs)) for a in (agent, other)]
    torch.testing.assert_close(outputs[1], outputs[0])
    assert torch.equal(other.act(obs, deterministic=True), agent.act(obs, deterministic=True))


@pytest.mark.parametrize("channels_last", [False, True])
def test_ppo_trains_its_shared_encoder_and_saves_it(channels_last: bool, tmp_path) -> None:
    torch.manual_seed(0)
    env = BrightnessEnv(4, channels_last)
    config = PPOConfig(env="test/brightness", num_envs=4, horizon=16, minibatch_size=32, num_epochs=2,
                       hidden=[32], lr=1e-3, device="cpu")
    agent = PPO(config, env, torch.device("cpu"))
    assert isinstance(agent.encoder, NatureCNN) and agent.obs_dim == 512
    before = _parameters(agent.encoder)
    _train(agent, env, 5)  # 320 env steps
    assert agent.steps == 320
    assert _changed(before, agent.encoder)  # the encoder is in the optimizer and gets gradients
    # full state through a checkpoint on disk, into a fresh agent
    save_checkpoint(tmp_path, {"agent": agent.state_dict()}, agent.steps)
    fresh = PPO(config, env, torch.device("cpu"))
    fresh.load_state_dict(load_checkpoint(tmp_path)["agent"])
    _same_policy(agent, fresh, env)
    # the best-policy file holds the encoder
    policy = agent.policy_state_dict()
    assert any(k.startswith("encoder.") for k in policy)
    fresh = PPO(config, env, torch.device("cpu"))
    fresh.load_policy_state_dict(policy)
    _same_policy(agent, fresh, env)


def test_dqn_owns_its_encoder_and_the_target_copies_it(tmp_path) -> None:
    torch.manual_seed(0)
    env = BrightnessEnv(4)
    config = DQNConfig(env="test/brightness", num_envs=4, horizon=8, buffer_size=512, batch_size=16,
                       warmup_steps=64, updates_per_step=0.25, target_update_every=10, hidden=[32], device="cpu")
    agent = DQN(config, env, torch.device("cpu"))
    assert agent.encoder is None and isinstance(agent.q_net, EncodedNet)
    assert agent.q_target.encoder is not agent.q_net.encoder  # the target network has its own copy
    online_before = _parameters(agent.q_net.encoder)
    target_before = _parameters(agent.q_target.encoder)
    _train(agent, env, 10)  # 320 env steps
    assert agent.num_updates == 72  # 8 per iteration once the 64 warm-up steps are done (9 iterations)
    assert _changed(online_before, agent.q_net.encoder)
    assert _changed(target_before, agent.q_target.encoder)  # synced from the online network, not frozen
    # the replay buffer keeps images as uint8
    buffer = agent.make_buffer()
    buffer.add(agent.explore(env, 4))
    assert buffer.data["obs"].dtype == torch.uint8 and buffer.data["next_obs"].dtype == torch.uint8
    # full state through a checkpoint on disk, and the best-policy tensors, into fresh agents
    save_checkpoint(tmp_path, {"agent": agent.state_dict()}, agent.steps)
    fresh = DQN(config, env, torch.device("cpu"))
    fresh.load_state_dict(load_checkpoint(tmp_path)["agent"])
    _same_policy(agent, fresh, env)
    torch.testing.assert_close(fresh.q_target.state_dict(), agent.q_target.state_dict())
    policy = agent.policy_state_dict()
    assert any(k.startswith("q_net.encoder.") for k in policy)
    fresh = DQN(config, env, torch.device("cpu"))
    fresh.load_policy_state_dict(copy.deepcopy(policy))
    _same_policy(agent, fresh, env)


def test_vector_observations_have_no_encoder() -> None:
    from jaderl.envs import make_env

    env = make_env("jaderl/CartPole-v1", 2)
    agent = PPO(PPOConfig(env="jaderl/CartPole-v1", num_envs=2, minibatch_size=2), env, torch.device("cpu"))
    assert agent.encoder is None and agent.obs_dim == 4
    assert "encoder" not in agent.state_dict()
    assert not any(k.startswith("encoder") for k in agent.policy_state_dict())


@pytest.mark.parametrize("algo", ["a2c", "reinforce", "vpg", "sac_discrete"])
def test_other_discrete_algorithms_train_the_shared_encoder(algo: str) -> None:
    torch.manual_seed(0)
    env = BrightnessEnv(4)
    spec = ALGOS[algo]
    settings: dict = {"hidden": [16], "num_envs": 4, "device": "cpu"}
    if spec.agent_cls.on_policy:
        settings |= {"horizon": 8}
    else:
        settings |= {"warmup_steps": 0, "batch_size": 8, "buffer_size": 64}
    config = make_config(algo, "jaderl/CartPole-v1", **settings)
    agent = spec.agent_cls(config, env, torch.device("cpu"))
    before = _parameters(agent.encoder)
    _train(agent, env, 3)
    assert _changed(before, agent.encoder)


def test_agent_on_images_too_small_names_the_problem() -> None:
    from jaderl.envs.vec import EnvError, EnvSpec

    env = EnvSpec(num_envs=2, obs_shape=(3, 8, 8), is_discrete=True, action_dim=2)
    with pytest.raises(EnvError, match=r"at least 36x36.*resize"):
        PPO(make_config("ppo", "jaderl/CartPole-v1"), env, torch.device("cpu"))


def test_predict_takes_pixels_as_the_env_gives_them_and_refuses_others() -> None:
    """Pixel observations reach the agent as uint8: whole numbers in 0..255 (also as floats or wider integers) are
    taken, while values a uint8 frame cannot hold (300, or a frame scaled to [0, 1]) would wrap or round to other
    pixels, so predict refuses them in one sentence."""
    import numpy as np

    env = BrightnessEnv(2)
    env._obs_dtype = torch.uint8  # (the env's frames are uint8: its spec says so, as a Gymnasium pixel env's does)
    agent = PPO(PPOConfig(env="test/brightness", num_envs=2, minibatch_size=32, hidden=[32], device="cpu"), env.spec,
                torch.device("cpu"))
    frames = env.reset(seed=0).numpy()  # (2, 2, SIZE, SIZE) uint8, values 0..249
    actions = agent.predict(frames)
    np.testing.assert_array_equal(agent.predict(frames.astype(np.float32)), actions)
    np.testing.assert_array_equal(agent.predict(frames.astype(np.int64)), actions)
    for bad in (frames.astype(np.int64) + 256, frames / 255.0, frames.astype(np.int64) - 256):
        with pytest.raises(ValueError, match=r"^predict takes pixel observations as whole numbers in 0\.\.255, as "
                                             r"the env gives them \(uint8\); got values from "):
            agent.predict(bad)
