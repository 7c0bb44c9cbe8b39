"""PPO's update against a plain reference: per-env GAE loops, torch.distributions and a hand-written minibatch loop."""

from __future__ import annotations

import copy

import pytest
import torch

from jaderl.algos.ppo import PPO, PPOConfig
from jaderl.core.buffers import RolloutBuffer
from jaderl.envs import make_env


def reference_gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor,
                  truncated: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Backwards over each env separately; an episode end cuts the sum, only a termination drops V(s')."""
    T, N = reward.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n] or truncated[t, n]:
                running = 0.0
            bootstrap = 0.0 if terminated[t, n] else gamma * float(next_value[t, n])
            delta = float(reward[t, n]) + bootstrap - float(value[t, n])
            running = delta + gamma * lam * running
            adv[t, n] = running
    return adv.float()


@pytest.mark.parametrize("env_id", ["jaderl/Pendulum-v1", "jaderl/CartPole-v1"])
def test_ppo_update_matches_a_reference_loop(env_id: str) -> None:
    n, horizon = 4, 50
    env = make_env(env_id, n, "cpu", seed=0)
    config = PPOConfig(env=env_id, num_envs=n, horizon=horizon, minibatch_size=64, num_epochs=3, hidden=[16],
                       normalize_obs=True, device="cpu", ent_coef=0.01, gamma=0.9, gae_lambda=0.8, reward_scale=0.5,
                       lr=0.01)  # large steps, so that the clipping matters
    torch.manual_seed(0)
    agent = PPO(config, env, torch.device("cpu"))
    buffer = RolloutBuffer()
    for _ in range(2):  # observation statistics and Adam moments that are not at their initial values
        buffer.add(agent.explore(env, horizon))
        agent.update(buffer)
    rollout = agent.explore(env, horizon)
    actor, critic, norm = copy.deepcopy(agent.actor), copy.deepcopy(agent.critic), copy.deepcopy(agent.obs_norm)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=config.lr, eps=1e-5)
    optimizer.load_state_dict(copy.deepcopy(agent.optimizer.state_dict()))
    torch.manual_seed(123)
    buffer.add(dict(rollout))
    stats = agent.update(buffer)
    assert stats["policy/clip_fraction"] > 0.01, "no ratio left the clipping range: the clip would go untested"

    torch.manual_seed(123)  # the same minibatch permutations, drawn in the same order

    def policy(x: torch.Tensor) -> torch.distributions.Distribution:
        if env.is_discrete:
            return torch.distributions.Categorical(logits=actor.net(x))
        return torch.distributions.Independent(torch.distributions.Normal(actor.net(x), actor.log_std.exp()), 1)

    def normalize(o: torch.Tensor) -> torch.Tensor:  # the statistics the rollout was collected with
        return ((o - norm.mean) / (norm.var + 1e-8).sqrt()).clamp(-10, 10)

    with torch.no_grad():
        obs, next_obs = normalize(rollout["obs"]), normalize(rollout["next_obs"])
        value, next_value = critic(obs).squeeze(-1), critic(next_obs).squeeze(-1)
        old_log_prob = policy(obs).log_prob(rollout["action"])
    advantage = reference_gae(rollout["reward"], value, next_value, rollout["terminated"], rollout["truncated"],
                              config.gamma, config.gae_lambda)
    assert torch.allclose(buffer.data["advantage"], advantage, atol=1e-5)
    target = advantage + value
    flat = [x.flatten(0, 1) for x in (obs, rollout["action"], old_log_prob, advantage, target)]
    size, updates = n * horizon, 0
    for _ in range(config.num_epochs):
        perm = torch.randperm(size)
        for start in range(0, size - config.minibatch_size + 1, config.minibatch_size):  # the remainder is left out
            o, a, old, adv, ret = (x[perm[start:start + config.minibatch_size]] for x in flat)
            dist = policy(o)
            ratio = (dist.log_prob(a) - old).exp()
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
            value_loss = (critic(o).squeeze(-1) - ret).square().mean()
            loss = policy_loss + 0.5 * value_loss - config.ent_coef * dist.entropy().mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            optimizer.step()
            updates += 1
    assert updates == 3 * (200 // 64)
    for mine, reference in zip([*agent.actor.parameters(), *agent.critic.parameters()], params, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-6, rtol=1e-5)


def test_log_std_init_sets_the_gaussian_policys_starting_spread() -> None:
    env = make_env("jaderl/Pendulum-v1", 2, "cpu", seed=0)
    for value in (-0.5, -2.0):
        agent = PPO(PPOConfig(env="jaderl/Pendulum-v1", num_envs=2, horizon=8, minibatch_size=8, log_std_init=value,
                              device="cpu"), env, torch.device("cpu"))
        assert torch.equal(agent.actor.log_std.detach(), torch.full((1,), value))
