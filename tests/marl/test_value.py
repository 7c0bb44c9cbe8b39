"""Tests of QMIX / VDN / IQL (jaderl.marl.value) against the papers' formulas written out by hand, and a smoke test."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from jaderl.accel import mixed_precision
from jaderl.api import ALGOS, load, make_config, resume, train
from jaderl.core.checkpoint import load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.envs import make_env
from jaderl.marl.value import QMIX, QMixer

ENV = "jaderl/simple_spread"
AGENTS, OBS_DIM, STATE_DIM, ACTIONS, BATCH = 3, 18, 54, 5, 32


def make_agent(algo: str = "qmix", **settings: Any) -> QMIX:
    small = {"hidden": [16, 16], "mixing_embed_dim": 8, "hypernet_hidden": [16], "device": "cpu"}
    config = make_config(algo, ENV, **(small | settings))
    env = make_env(config.env, 1, "cpu", seed=0)
    torch.manual_seed(0)
    agent = QMIX(config, env.spec, torch.device("cpu"))
    env.close()
    return agent


def random_batch(seed: int = 0, gamma: float = 0.9) -> dict[str, torch.Tensor]:
    """A replay batch as the buffer samples it (2-step transitions have discount gamma^2)."""
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(BATCH, AGENTS, OBS_DIM, generator=g),
            "next_obs": torch.randn(BATCH, AGENTS, OBS_DIM, generator=g),
            "state": torch.randn(BATCH, STATE_DIM, generator=g),
            "next_state": torch.randn(BATCH, STATE_DIM, generator=g),
            "action": torch.randint(ACTIONS, (BATCH, AGENTS), generator=g),
            "reward": torch.randn(BATCH, AGENTS, generator=g),
            "terminated": torch.rand(BATCH, generator=g) < 0.3,
            "truncated": torch.zeros(BATCH, dtype=torch.bool),
            "discount": gamma ** torch.randint(1, 3, (BATCH,), generator=g).float()}


def reference_mixer(mixer: QMixer, agent_q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Rashid et al. 2018, one transition at a time: Q_tot = |W2(s)|^T elu(|W1(s)|^T q + b1(s)) + V(s)."""
    out = []
    for q, s in zip(agent_q, state, strict=True):
        w1 = mixer.hyper_w1(s).abs().reshape(AGENTS, -1)  # (agents, embed)
        hidden = F.elu(q @ w1 + mixer.hyper_b1(s))  # (embed,)
        out.append(hidden @ mixer.hyper_w2(s).abs() + mixer.hyper_v(s)[0])
    return torch.stack(out)


def inputs(agent: QMIX, obs: torch.Tensor) -> torch.Tensor:
    """The shared network's input, built by hand: each agent's observation, then its one-hot id."""
    return torch.cat([obs, torch.eye(AGENTS).expand(obs.shape[0], -1, -1)], -1)


def reference_target(agent: QMIX, batch: dict[str, torch.Tensor], double: bool) -> torch.Tensor:
    """y = R + discount (1 - terminated) mix_target(Q_target(o', a')); a' from the online (double) or target net;
    IQL: y_i = r_i + discount (1 - terminated) Q_target_i(o'_i, a'_i)."""
    with torch.no_grad():
        next_x = inputs(agent, batch["next_obs"])
        q_target = agent.q_target(next_x)
        greedy = (agent.q_net(next_x) if double else q_target).argmax(-1)
        next_q = torch.stack([q_target[:, i, :][torch.arange(BATCH), greedy[:, i]] for i in range(AGENTS)], 1)
        bootstrap = batch["discount"] * (1.0 - batch["terminated"].float())
        if agent.config.mixer == "none":
            return batch["reward"] + bootstrap[:, None] * next_q
        team = batch["reward"][:, 0] + batch["reward"][:, 1] + batch["reward"][:, 2]
        mixed = next_q.sum(1) if agent.mixer is None else reference_mixer(agent.mixer_target, next_q,
                                                                          batch["next_state"])
        return team + bootstrap * mixed


def chosen_q(agent: QMIX, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    q = agent.q_net(inputs(agent, batch["obs"]))  # (B, agents, actions)
    return torch.stack([q[:, i, :][torch.arange(BATCH), batch["action"][:, i]] for i in range(AGENTS)], 1)


# --- the mixer ---

def test_qmix_mixer_matches_the_paper_and_is_monotonic() -> None:
    agent = make_agent()
    batch = random_batch()
    agent_q = torch.randn(BATCH, AGENTS, requires_grad=True)
    q_tot = agent.mixer(agent_q, batch["state"])
    torch.testing.assert_close(q_tot, reference_mixer(agent.mixer, agent_q, batch["state"]))
    # monotonic: dQ_tot / dQ_i >= 0 for every agent and state (Rashid et al. 2018, eq. 5)
    (grad,) = torch.autograd.grad(q_tot.sum(), agent_q)
    assert (grad >= 0).all() and (grad > 0).any()
    # leading axes are kept: (T, B, agents) -> (T, B)
    assert agent.mixer(agent_q.detach().view(4, 8, AGENTS), batch["state"].view(4, 8, -1)).shape == (4, 8)


# --- targets and losses ---

@pytest.mark.parametrize("algo", ["qmix", "vdn", "iql"])
@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_loss_targets_and_td_errors_match_reference(algo: str, double: bool, loss: str) -> None:
    agent = make_agent(algo, double=double, loss=loss, gamma=0.9)
    with torch.no_grad():  # a target network that differs from the online one, so that `double` matters
        for p in [*agent.q_target.parameters(), *([] if agent.mixer is None else agent.mixer_target.parameters())]:
            p.add_(0.3 * torch.randn_like(p))
    batch = random_batch() | {"weight": torch.rand(BATCH)}  # as prioritized replay samples it
    target = reference_target(agent, batch, double)
    with torch.no_grad():
        q = chosen_q(agent, batch)
        q = {"qmix": lambda: reference_mixer(agent.mixer, q, batch["state"]), "vdn": lambda: q.sum(1),
             "iql": lambda: q}[algo]()
    err = q - target
    per_item = err.square() if loss == "mse" else torch.where(err.abs() < 1, 0.5 * err.square(), err.abs() - 0.5)
    per_item = per_item.mean(1) if algo == "iql" else per_item  # IQL: the agents' losses averaged
    got_loss, got_q, td_error = agent.q_loss(batch)
    torch.testing.assert_close(got_loss, (batch["weight"] * per_item).mean())
    torch.testing.assert_close(got_q, q)
    torch.testing.assert_close(td_error, err.abs().mean(1) if algo == "iql" else err)  # PER priorities
    done = batch["terminated"]  # terminated transitions do not bootstrap
    reward = batch["reward"][done]
    torch.testing.assert_close(target[done], reward if algo == "iql" else reward.sum(1))


def test_hand_computed_vdn_target() -> None:
    # target Q made constant: agent i values every action at i + 1, so the team bootstraps from 1 + 2 + 3 = 6
    agent = make_agent("vdn")
    agent.q_target = _ConstantPerAgent()
    batch = random_batch()
    batch["reward"] = torch.tensor([1.0, 2.0, -0.5]).expand(BATCH, -1)
    batch["terminated"] = torch.arange(BATCH) % 2 == 0
    batch["discount"] = torch.full((BATCH,), 0.5)
    _, q, td_error = agent.q_loss(batch)
    expected = torch.where(batch["terminated"], 2.5, 2.5 + 0.5 * 6.0)
    torch.testing.assert_close(q - td_error, expected)


class _ConstantPerAgent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.arange(AGENTS, dtype=torch.float32) + 1.0)[:, None].expand(*x.shape[:-1], ACTIONS)


def test_update_trains_the_mixer_and_polyak_averages_both_targets() -> None:
    agent = make_agent(tau=0.25, target_update_every=2)
    before = {name: [p.detach().clone() for p in agent.networks()[name].parameters()]
              for name in ("q_net", "q_target", "mixer", "mixer_target")}
    agent.update_once(random_batch())
    for name in ("q_target", "mixer_target"):  # not due after one step
        assert all(torch.equal(p, b) for p, b in zip(agent.networks()[name].parameters(), before[name], strict=True))
    agent.update_once(random_batch(1))
    assert agent.num_updates == 2
    for online, target in (("q_net", "q_target"), ("mixer", "mixer_target")):
        assert any(not torch.equal(p, b) for p, b in zip(agent.networks()[online].parameters(), before[online],
                                                          strict=True)), f"{online} did not learn"
        for t, t0, o in zip(agent.networks()[target].parameters(), before[target],
                            agent.networks()[online].parameters(), strict=True):
            torch.testing.assert_close(t, 0.75 * t0 + 0.25 * o)


def test_vdn_and_iql_have_no_mixer_network() -> None:
    for algo in ("vdn", "iql"):
        agent = make_agent(algo)
        assert agent.mixer is None and set(agent.networks()) == {"q_net", "q_target"}
    assert set(make_agent("qmix").networks()) == {"q_net", "q_target", "mixer", "mixer_target"}


# --- exploration ---

def test_epsilon_decays_linearly_over_env_steps() -> None:
    agent = make_agent(epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_steps=1000)
    for steps, eps in ((0, 1.0), (500, 0.55), (1000, 0.1), (5000, 0.1)):
        agent.steps = steps
        assert agent.epsilon() == pytest.approx(eps)


def test_each_agent_draws_its_own_exploration() -> None:
    agent = make_agent(epsilon_start=0.5, epsilon_end=0.5, warmup_steps=0)
    with torch.no_grad():  # a greedy policy that always picks action 0
        agent.q_net.advantage.bias.copy_(torch.tensor([100.0, 0.0, 0.0, 0.0, 0.0]))
    torch.manual_seed(1)
    action = agent.explore_action(torch.zeros(4096, AGENTS, OBS_DIM))  # (N, agents)
    assert action.shape == (4096, AGENTS) and action.dtype == torch.int64
    greedy = action == 0
    p = 1 - 0.5 * 4 / 5  # greedy, or explored onto action 0
    assert torch.allclose(greedy.double().mean(0), torch.full((AGENTS,), p, dtype=torch.float64), atol=0.03)
    # independent draws: all three greedy with p^3, not p (one draw per sub-env would give p)
    assert float(greedy.all(1).double().mean()) == pytest.approx(p**3, abs=0.03)


# --- what it accepts, and its config ---

def test_accepts_multi_agent_discrete_envs_only() -> None:
    spec = make_env(ENV, 1, "cpu").spec
    assert QMIX.accepts(spec) is None
    continuous = QMIX.accepts(spec.replace(is_discrete=False, action_dim=2))
    assert continuous is not None and continuous.count(".") == 0 and "continuous" in continuous
    assert "single agent" in QMIX.accepts(make_env("jaderl/CartPole-v1", 1, "cpu").spec)
    with pytest.raises(ConfigError, match=r"^qmix cannot train on jaderl/simple_spread\?continuous=true: its actions "
                                          r"are continuous"):
        train("qmix", "jaderl/simple_spread?continuous=true", device="cpu", total_steps=1)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("mixer", "sum", "mixer='sum' is invalid: use qmix, vdn, none"),
    ("loss", "l1", "loss='l1' is invalid: use huber or mse"),
    ("hypernet_hidden", [], "hypernet_hidden=[] is invalid: give one or more positive sizes")])
def test_config_errors_name_the_field(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        make_config("qmix", ENV, **{field: value})


def test_registry_presets_and_hyperparameters() -> None:
    assert {name: ALGOS[name].preset.get("mixer", "qmix") for name in ("qmix", "vdn", "iql")} == {
        "qmix": "qmix", "vdn": "vdn", "iql": "none"}
    config = make_config("qmix", ENV)
    for name, valid in QMIX.hyperparameters.items():  # the defaults lie in the ranges a search may use
        assert valid.low <= getattr(config, name) <= valid.high, name
    agent = make_agent()
    agent.set_hyperparameters(lr=1e-4, epsilon_end=0.0)
    assert agent.optimizer.param_groups[0]["lr"] == 1e-4 and agent.config.epsilon_end == 0.0


# --- mixed precision ---

def test_bfloat16_runs_hypernetwork_hidden_layers_in_bfloat16_and_the_rest_in_float32() -> None:
    settings = {"hypernet_hidden": [16, 16], "hidden": [16, 16, 16]}
    fp32 = make_agent(**settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no bfloat16 matrix units on this CPU: slower, not wrong
        agent = make_agent(precision="bfloat16", **settings)
        assert mixed_precision(agent, warn=False)
    agent.load_state_dict(fp32.state_dict())
    batch = random_batch()
    dtypes: dict[str, torch.dtype] = {}
    hooks = [m.register_forward_hook(lambda m, a, out, name=name: dtypes.update({name: out.dtype}))
             for name, m in agent.mixer.named_modules() if isinstance(m, torch.nn.Linear)]
    agent_q = torch.randn(BATCH, AGENTS)
    q_tot = agent.mixer(agent_q, batch["state"])
    for hook in hooks:
        hook.remove()
    hypernets = ("hyper_w1", "hyper_w2")  # state -> 16 -> 16 -> weights: the middle layer is hidden
    assert {k: v for k, v in dtypes.items() if k.startswith(hypernets)} == {
        "hyper_w1.0": torch.float32, "hyper_w1.2": torch.bfloat16, "hyper_w1.4": torch.float32,
        "hyper_w2.0": torch.float32, "hyper_w2.2": torch.bfloat16, "hyper_w2.4": torch.float32}
    assert dtypes["hyper_b1"] == dtypes["hyper_v.0"] == dtypes["hyper_v.2"] == torch.float32  # no hidden layer
    # the mixing and Q_tot are float32, close to the float32 mixer's: only the hidden activations are rounded
    assert q_tot.dtype == torch.float32
    torch.testing.assert_close(q_tot, fp32.mixer(agent_q, batch["state"]), rtol=0.03, atol=0.03)
    assert agent.mixer_target.hyper_w1[2].forward.args[0] is agent.mixer_target.hyper_w1[2]  # its own layer
    stats, _ = agent.update_once(batch)
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in stats.values())
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in agent.mixer.parameters())


# --- smoke: train, resume, load, act ---

SMOKE: dict[str, Any] = {"num_envs": 4, "hidden": [32], "mixing_embed_dim": 8, "hypernet_hidden": [16],
                         "total_steps": 256, "eval_every": 256, "checkpoint_every": 256, "eval_episodes": 2,
                         "warmup_steps": 64, "batch_size": 32, "buffer_size": 1_000, "epsilon_decay_steps": 128,
                         "updates_per_step": 0.5, "device": "cpu", "seed": 1}


@pytest.mark.parametrize(("algo", "extra"), [("qmix", {}), ("vdn", {}), ("iql", {}),
                                             ("qmix", {"use_per": True})])
def test_train_resume_load_act(algo: str, extra: dict[str, Any], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = train(algo, ENV, run_dir=str(run_dir), **SMOKE, **extra)
    assert result.steps == 256 and math.isfinite(result.last_eval_return)
    state = load_checkpoint(run_dir)["agent"]
    assert float(next(iter(state["optimizers"]["optimizer"]["state"].values()))["step"]) > 0
    assert state["counters"]["num_updates"] == (256 - 64 + 4) // 2  # from the explore call that ends the warm-up
    resumed = resume(run_dir, total_steps=512)
    assert resumed.steps == 512
    assert load_checkpoint(run_dir)["agent"]["counters"]["num_updates"] == (512 - 64 + 4) // 2
    for best in (True, False):
        agent = load(run_dir, best=best)
        assert type(agent) is QMIX and agent.config.mixer == ALGOS[algo].preset.get("mixer", "qmix")
        env = make_env(ENV, 7, "cpu", seed=5)
        obs = env.reset()
        action = agent.act(obs, deterministic=True)
        assert action.shape == (7, AGENTS) and action.dtype == torch.int64 and not action.requires_grad
        assert int(action.min()) >= 0 and int(action.max()) < ACTIONS
        env.step(action)
        env.close()


@pytest.mark.parametrize("algo", ["qmix", "maddpg"])
def test_normalize_obs_also_normalises_the_state_the_centralised_parts_read(algo: str, tmp_path: Path) -> None:
    """QMIX's mixer and MADDPG's critics read the global state through a normaliser of their own, kept from every
    explored step and checkpointed, as MAPPO's critic does (``normalize_obs``)."""
    run_dir = tmp_path / algo
    train(algo, ENV, run_dir=str(run_dir), num_envs=4, hidden=[16], total_steps=128, warmup_steps=32, batch_size=16,
          buffer_size=500, eval_every=128, eval_episodes=1, device="cpu", seed=1, normalize_obs=True)
    stats = load_checkpoint(run_dir)["agent"]["running_stats"]
    assert stats["state_norm"]["count"].item() == pytest.approx(128, abs=1e-3)  # every explored sub-env step
    assert stats["obs_norm"]["count"].item() == pytest.approx(128 * AGENTS, abs=1e-3)  # every agent's observation
    agent = load(run_dir, best=False)
    torch.testing.assert_close(agent.state_norm.mean, stats["state_norm"]["mean"])
    state = agent.state_norm.mean.expand(5, -1)
    assert agent.state_norm(state).abs().max() < 1e-5  # the mean state reads as zeros
    if algo == "qmix":
        q = torch.randn(5, AGENTS)
        torch.testing.assert_close(agent.mix(q, state), agent.mixer(q, agent.state_norm(state)))
    off = train(algo, ENV, run_dir=str(tmp_path / "off"), num_envs=4, hidden=[16], total_steps=64, warmup_steps=32,
                batch_size=16, buffer_size=500, eval_every=64, eval_episodes=1, device="cpu", seed=1)
    assert "state_norm" not in load_checkpoint(off.run_dir)["agent"]["running_stats"]  # off by default, as before
