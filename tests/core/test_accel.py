"""Compiled paths (jaderl.accel): compiled and eager agents agree, a failing compiler falls back to eager mode with
one warning and identical results, and training with ``compile=True`` runs."""

from __future__ import annotations

import pickle
import platform
import warnings
from collections.abc import Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from jaderl import accel
from jaderl.accel import Tanh, accelerate
from jaderl.algos import PPO, SAC
from jaderl.api import make_config, train
from jaderl.core.agent import Agent
from jaderl.core.nets import mlp
from jaderl.envs import make_env


def _agent(cls: type[Agent], algo: str, env_id: str, compile_: bool, **settings: Any) -> tuple[Agent, Any]:
    torch.manual_seed(0)
    config = make_config(algo, env_id, compile=compile_, **{"hidden": [16, 16], **settings})
    env = make_env(env_id, 4, "cpu", seed=0)
    agent = cls(config, env, torch.device("cpu"))
    buffer = agent.make_buffer()
    buffer.add(agent.explore(env, 8))
    accelerate(agent)
    return agent, buffer


def _sac_pair(**settings: Any) -> tuple[SAC, SAC, list[dict[str, torch.Tensor]]]:
    settings = {"warmup_steps": 0, "batch_size": 8, "buffer_size": 64, **settings}
    eager, buffer = _agent(SAC, "sac", "jaderl/Pendulum-v1", False, **settings)
    compiled, _ = _agent(SAC, "sac", "jaderl/Pendulum-v1", True, **settings)
    torch.manual_seed(1)
    return eager, compiled, [buffer.sample(8) for _ in range(3)]  # type: ignore[return-value]


def _updates(agent: SAC, batches: list[dict[str, torch.Tensor]]) -> list[dict[str, float]]:
    stats = []
    for i, batch in enumerate(batches):
        torch.manual_seed(i)
        stats.append({k: float(v) for k, v in agent.update_once(batch)[0].items()})
    return stats


def test_accelerate_does_nothing_unless_asked() -> None:
    agent, _ = _agent(SAC, "sac", "jaderl/Pendulum-v1", False)
    assert not accelerate(agent) and "act" not in vars(agent)


def test_compiled_act_draws_the_same_actions_as_eager() -> None:
    eager, compiled, batches = _sac_pair()
    assert "act" in vars(compiled) and "act" not in vars(eager)
    obs = batches[0]["obs"]
    for deterministic in (False, True):
        torch.manual_seed(5)
        expected = eager.act(obs, deterministic)
        torch.manual_seed(5)
        torch.testing.assert_close(compiled.act(obs, deterministic), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compiled_sac_and_ppo_updates_match_eager() -> None:
    eager, compiled, batches = _sac_pair()
    for want, got in zip(_updates(eager, batches), _updates(compiled, batches), strict=True):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    for a, b in zip(eager.actor.parameters(), compiled.actor.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    stats = []
    for compile_ in (False, True):
        agent, buffer = _agent(PPO, "ppo", "jaderl/CartPole-v1", compile_, horizon=8, minibatch_size=16,
                               num_epochs=2)
        torch.manual_seed(2)
        stats.append({k: float(v) for k, v in agent.update(buffer).items()})
    assert stats[1] == pytest.approx(stats[0], rel=1e-4, abs=1e-6)


def test_a_failing_compiler_falls_back_to_eager_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    eager, _, batches = _sac_pair()

    def broken_compile(fn: Any, **kwargs: Any) -> Any:
        def compiled(*args: Any, **kw: Any) -> Any:
            torch.randn(100)  # a failure after random numbers were drawn: the fallback must restore them
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    fallback, _ = _agent(SAC, "sac", "jaderl/Pendulum-v1", True, warmup_steps=0, batch_size=8, buffer_size=64)
    with pytest.warns(RuntimeWarning, match=r"torch.compile failed on SAC\.critic_loss .*C\+\+ compiler.*eager"):
        got = _updates(fallback, batches)
    assert got == _updates(eager, batches)  # bit for bit: the eager code ran from the same random state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not again
        _updates(fallback, batches)
        obs = batches[0]["obs"]
        torch.manual_seed(5)
        expected = SAC.act(fallback, obs)
        torch.manual_seed(5)
        assert torch.equal(fallback.act(obs), expected)


def test_running_out_of_memory_in_compiled_code_is_not_taken_for_a_compile_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(fn: Any, **kwargs: Any) -> Any:
        def compiled(*args: Any, **kw: Any) -> Any:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        return compiled

    monkeypatch.setattr(torch, "compile", out_of_memory)
    agent, _ = _agent(SAC, "sac", "jaderl/Pendulum-v1", True, warmup_steps=0, batch_size=8, buffer_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "torch.compile failed ... continuing in eager mode"
        with pytest.raises(torch.OutOfMemoryError):
            agent.act(torch.zeros(2, 3))


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """No code compiled by earlier tests (which a new agent would reuse without compiling), none left behind."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_missing_cxx_compiler_falls_back_to_eager() -> None:
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    eager, _, batches = _sac_pair()
    fallback, _ = _agent(SAC, "sac", "jaderl/Pendulum-v1", True, warmup_steps=0, batch_size=8, buffer_size=64)
    # no cached graph either: it would need no compiler
    with (inductor_config.patch(fx_graph_cache=False, **{"cpp.cxx": ("/nonexistent/g++",)}),
          functorch_config.patch(enable_autograd_cache=False),
          pytest.warns(RuntimeWarning, match=r"torch.compile failed on SAC\.critic_loss .*compiler.*eager mode")):
        got = _updates(fallback, batches)
    assert got == _updates(eager, batches)


@pytest.mark.slow(seconds=55)
@pytest.mark.usefixtures("fresh_dynamo")
def test_training_with_compile_runs(tmp_path: Path, tiny_ppo: Any) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train("ppo", "jaderl/CartPole-v1", run_dir=str(tmp_path / "run"), compile=True, **tiny_ppo())
    assert result.steps == 512 and result.stop_reason == "total_steps"
    assert not [str(w.message) for w in caught if "torch.compile failed" in str(w.message)]  # it compiled


# --- the CPU tanh ---

@pytest.fixture(params=[True, False], ids=["sigmoid-form", "torch-tanh"])
def sigmoid_tanh(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both of the CPU tanh's paths, whichever this machine's CPU takes."""
    monkeypatch.setattr(accel, "_SIGMOID_TANH", [request.param])
    return bool(request.param)


def test_cpu_tanh_matches_torch_tanh_in_value_and_gradient(sigmoid_tanh: bool) -> None:
    x = torch.linspace(-12.0, 12.0, 200_001, requires_grad=True)
    y = Tanh()(x)
    assert (y - torch.tanh(x)).abs().max() <= 2e-7
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.allclose(grad, 1 - y.detach().square(), rtol=0, atol=1e-7)  # the derivative, from the output
    with torch.no_grad():  # no backward pass to prepare: the same arithmetic in place
        assert (Tanh()(x) - torch.tanh(x)).abs().max() <= 2e-7
    small = x.detach()[:1000].clone().requires_grad_()  # a few sub-envs' batch: torch.tanh, cheaper to call
    assert torch.equal(Tanh()(small), torch.tanh(small))
    x64 = x.detach().double()
    assert torch.equal(Tanh()(x64), torch.tanh(x64))  # other dtypes (and devices) take torch.tanh
    x16 = x.detach().bfloat16()  # bfloat16 (a mixed-precision layer's output): computed in float32, kept bfloat16
    assert Tanh()(x16).dtype == torch.bfloat16 and torch.allclose(Tanh()(x16).float(), torch.tanh(x16.float()),
                                                                  rtol=0, atol=4e-3)
    assert torch.equal(Tanh()(x.detach()), torch.tanh(x.detach())) is not sigmoid_tanh  # the path taken


def test_the_cpu_tanh_form_is_measured_once_or_set_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel, "_SIGMOID_TANH", [])
    state = torch.get_rng_state()
    measured = accel.sigmoid_tanh_is_faster()
    assert isinstance(measured, bool) and [measured] == accel._SIGMOID_TANH  # kept for the process
    assert torch.equal(torch.get_rng_state(), state)  # no random numbers drawn: seeded runs are unchanged
    for value, expected in (("1", True), ("0", False)):
        monkeypatch.setattr(accel, "_SIGMOID_TANH", [])
        monkeypatch.setenv("JADERL_SIGMOID_TANH", value)
        assert accel.sigmoid_tanh_is_faster() is expected
    monkeypatch.setattr(accel, "_SIGMOID_TANH", [])
    monkeypatch.setenv("JADERL_SIGMOID_TANH", "yes")
    with pytest.warns(RuntimeWarning, match=r"JADERL_SIGMOID_TANH='yes' is neither 0 nor 1, so it is ignored"):
        assert isinstance(accel.sigmoid_tanh_is_faster(), bool)


def _counting_tanh_mlp(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets a 1 each time a network runs as one :class:`accel._TanhMLP`."""
    applied: list[int] = []
    apply = accel._TanhMLP.apply
    monkeypatch.setattr(accel._TanhMLP, "apply", lambda *args: applied.append(1) or apply(*args))
    return applied


@pytest.mark.parametrize("outputs", [8, 5], ids=["wide-output", "narrow-output"])
def test_a_tanh_mlp_runs_as_one_autograd_function_with_the_same_values(sigmoid_tanh: bool, outputs: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tanh MLP runs as one autograd function in both of the CPU tanh's forms: its outputs are bit for bit those of
    the layers one by one, except that a narrow output layer's product (W h^T) may round differently; the gradients
    of the weights, the biases and an input that needs one (an actor's output into a critic) equal theirs up to
    rounding; acting's values (no gradients) are bit for bit those of training, also for a batch small enough that
    :class:`Tanh` takes another form with gradients than without. Under autocast, or with a hook on a layer, the
    layers run one by one."""
    monkeypatch.setattr(accel, "block_bytes", lambda: 2**62)  # one block, as the reference computes
    applied = _counting_tanh_mlp(monkeypatch)
    torch.manual_seed(0)
    net = mlp([21, 64, 64, outputs], torch.nn.Tanh)
    x = torch.randn(4096, 21)
    out = net(x)
    reference = torch.nn.Sequential.forward(net, x)  # the layers one by one
    assert applied == [1] and out.shape == (4096, outputs)
    if outputs >= accel.NARROW_OUTPUT:
        assert torch.equal(out, reference)
    else:
        assert torch.allclose(out, reference, rtol=0, atol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), list(net.parameters()))
    for grad, expected in zip(grads, torch.autograd.grad(reference.square().sum(), list(net.parameters())),
                              strict=True):
        assert grad.shape == expected.shape and torch.allclose(grad, expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # acting: the same values as training's forward pass
        assert torch.equal(net(x), out.detach())
    small = x[:512]  # 32,768 elements a hidden layer: the same form of tanh with gradients as without
    trained = net(small)
    with torch.no_grad():
        assert torch.equal(net(small), trained.detach())
    x_grad = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(torch.nn.Sequential.forward(net, x_grad).sum(), x_grad)
    assert torch.allclose(torch.autograd.grad(net(x_grad).sum(), x_grad)[0], expected, rtol=1e-5, atol=1e-6)
    applied.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the layers one by one, as autocast casts them
        assert net(x).dtype == torch.bfloat16 and not applied
    calls: list[int] = []
    net[2].register_forward_hook(lambda layer, args, output: calls.append(1))
    assert torch.equal(net(x), reference) and calls == [1] and not applied


def test_a_tanh_mlp_in_blocks_computes_the_function_and_gradients_of_the_layers(
        sigmoid_tanh: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 1,024 rows: the backward pass goes through the blocks and accumulates the gradients of every layer,
    the widening ones (more outputs than inputs) too, and can be taken twice from a kept graph; any leading shape,
    and an empty batch. A network whose layers are replaced after its first calls is checked again."""
    monkeypatch.setenv("JADERL_BLOCK_BYTES", str(1024 * 64 * 4))
    accel.block_bytes.cache_clear()
    try:
        applied = _counting_tanh_mlp(monkeypatch)
        torch.manual_seed(0)
        net = mlp([7, 64, 16, 64, 3], torch.nn.Tanh)  # widening, narrowing, widening and a narrow output
        x = torch.randn(4, 1000, 7, requires_grad=True)  # 4,000 rows: 4 blocks
        out = net(x)
        assert applied == [1] and out.shape == (4, 1000, 3)
        reference = torch.nn.Sequential.forward(net, x)
        assert torch.allclose(out, reference, rtol=0, atol=1e-6)
        weights = torch.randn(4, 1000, 3)  # a gradient at the output that differs row by row
        grads = torch.autograd.grad((out * weights).sum(), [x, *net.parameters()], retain_graph=True)
        again = torch.autograd.grad((out * weights).sum(), [x, *net.parameters()])  # the graph kept: the same
        assert all(torch.equal(a, b) for a, b in zip(again, grads, strict=True))
        expected = torch.autograd.grad((reference * weights).sum(), [x, *net.parameters()])
        for grad, want in zip(grads, expected, strict=True):  # sums over 4,000 rows: up to rounding of their scale
            assert grad.shape == want.shape and torch.allclose(grad, want, rtol=1e-4, atol=1e-5 * want.abs().max())
        empty = net(torch.empty(0, 7, requires_grad=True))
        assert empty.shape == (0, 3)
        empty.sum().backward()
        assert all(p.grad is not None and not p.grad.any() for p in net.parameters())
        applied.clear()
        net[1] = torch.nn.ReLU()  # a layer replaced after the first calls: no longer a tanh MLP
        assert torch.equal(net(x[:1]), torch.nn.Sequential.forward(net, x[:1])) and not applied
    finally:
        accel.block_bytes.cache_clear()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.func's own
def test_a_tanh_mlp_leaves_to_the_layers_what_its_function_does_not_support(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.func transforms, forward-mode AD and a bias removed after the first call run the layers one by one; a
    gradient of the function's gradients (create_graph=True) raises, in a sentence that gives the way, instead of
    silently losing its second-order terms; with only the output layer trainable, its gradients are those of the
    layers one by one."""
    import torch.autograd.forward_ad as fwAD

    applied = _counting_tanh_mlp(monkeypatch)
    torch.manual_seed(0)
    net = mlp([7, 64, 64, 3], torch.nn.Tanh)
    x = torch.randn(300, 7)
    reference = torch.nn.Sequential.forward(net, x)
    batched = torch.func.vmap(net)(x.view(3, 100, 7))
    assert torch.allclose(batched.reshape(300, 3), reference, atol=1e-6) and not applied
    grad_x = torch.func.grad(lambda inputs: net(inputs).sum())(x)
    assert grad_x.shape == x.shape and not applied
    with fwAD.dual_level():
        out = net(fwAD.make_dual(x, torch.ones_like(x)))
        assert fwAD.unpack_dual(out).tangent is not None and not applied
    net(x)
    assert applied == [1]  # the function again
    for p in net[:3].parameters():  # only the output layer trains: the backward pass stops there
        p.requires_grad_(False)
    head = torch.autograd.grad(net(x).square().sum(), list(net[4].parameters()))
    expected = torch.autograd.grad(torch.nn.Sequential.forward(net, x).square().sum(), list(net[4].parameters()))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(head, expected, strict=True))
    net.requires_grad_(True)
    x_grad = torch.nn.Linear(7, 7)(x)  # an input with a graph behind it
    with pytest.raises(RuntimeError, match=r"has no second derivatives, which create_graph=True asks for; run its "
                                           r"layers one by one for that"):
        torch.autograd.grad(net(x_grad).sum(), x_grad, create_graph=True)
    (first,) = torch.autograd.grad(torch.nn.Sequential.forward(net, x_grad).sum(), x_grad, create_graph=True)
    assert first.requires_grad  # the way the message gives
    applied.clear()
    net[2].bias = None  # after the first calls
    assert torch.allclose(net(x), torch.nn.Sequential.forward(net, x)) and not applied


def test_on_policy_networks_use_the_cpu_tanh() -> None:
    assert isinstance(mlp([3, 8, 1])[1], torch.nn.ReLU)  # (nn.Tanh becomes Tanh: tests/core/test_nets.py)
    agent, _ = _agent(PPO, "ppo", "jaderl/Pendulum-v1", False)
    assert any(isinstance(m, Tanh) for m in agent.actor.modules())
    assert any(isinstance(m, Tanh) for m in agent.critic.modules())


# --- cache blocking (CacheBlocked) ---

@pytest.fixture
def block_bytes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Blocks of 16 KiB of activations: a 256-row batch of a 64-unit MLP (64 KiB) runs in 4 blocks."""
    monkeypatch.setenv("JADERL_BLOCK_BYTES", str(16 * 1024))
    accel.block_bytes.cache_clear()
    yield
    accel.block_bytes.cache_clear()


@pytest.mark.usefixtures("block_bytes")
def test_cache_blocked_mlps_compute_the_unblocked_function_and_gradients() -> None:
    torch.manual_seed(0)
    net = mlp([7, 64, 64, 3], torch.nn.Tanh)
    assert isinstance(net, accel.CacheBlocked)
    assert [k for k, _ in net.state_dict().items()][:2] == ["0.weight", "0.bias"]  # checkpoints keep nn.Sequential's
    x = torch.randn(16, 16, 7)  # 256 rows (any leading shape) x 64 units x 4 bytes: 4 blocks of 16 KiB
    calls: list[int] = []
    handle = net[0].register_forward_hook(lambda layer, args, out: calls.append(args[0].numel() // args[0].shape[-1]))
    blocked = net(x)
    handle.remove()
    assert calls == [64, 64, 64, 64] and blocked.shape == (16, 16, 3)
    unblocked = torch.nn.Sequential.forward(net, x)
    assert torch.allclose(blocked, unblocked, rtol=0, atol=1e-6)
    grads = torch.autograd.grad(blocked.square().sum(), list(net.parameters()))
    reference = torch.autograd.grad(unblocked.square().sum(), list(net.parameters()))
    for grad, expected in zip(grads, reference, strict=True):  # summed block by block: equal up to rounding
        assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-5)
    calls.clear()
    handle = net[0].register_forward_hook(lambda layer, args, out: calls.append(args[0].numel() // args[0].shape[-1]))
    net(x[:4])  # 64 rows, 16 KiB: one block, unblocked
    net(torch.randn(7))  # one unbatched observation
    handle.remove()
    assert calls == [64, 1]


def test_the_block_size_is_half_the_l2_cache_or_set_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    accel.block_bytes.cache_clear()
    try:
        monkeypatch.delenv("JADERL_BLOCK_BYTES", raising=False)
        measured = accel.block_bytes()
        assert accel.MIN_BLOCK_BYTES == 2**20  # also where sysfs does not say
        assert accel.MIN_BLOCK_BYTES <= measured <= 2**26  # half of some L2 cache, at least 1 MiB
        for value, expected in (("4096", 4096), ("0", 2**62)):  # 0: never blocked
            accel.block_bytes.cache_clear()
            monkeypatch.setenv("JADERL_BLOCK_BYTES", value)
            assert accel.block_bytes() == expected
    finally:
        accel.block_bytes.cache_clear()


# --- mixed precision (precision=bfloat16) ---

def _output_dtypes(module: torch.nn.Module, run: Any) -> dict[str, torch.dtype]:
    """The dtype each linear-like layer of ``module`` outputs while ``run()`` executes."""
    dtypes: dict[str, torch.dtype] = {}

    def record(name: str) -> Any:
        return lambda layer, args, out: dtypes.update({name: out.dtype})  # returns None: the output is kept

    handles = [m.register_forward_hook(record(name))
               for name, m in module.named_modules() if not list(m.children()) and hasattr(m, "weight")]
    run()
    for handle in handles:
        handle.remove()
    return dtypes


def test_bfloat16_runs_hidden_layers_in_bfloat16_and_keeps_inputs_outputs_and_losses_float32() -> None:
    fp32, batches = _agent(SAC, "sac", "jaderl/Pendulum-v1", False, warmup_steps=0, batch_size=8)
    agent, _ = _agent(SAC, "sac", "jaderl/Pendulum-v1", False, warmup_steps=0, batch_size=8, precision="bfloat16")
    assert agent.state_dict().keys() == fp32.state_dict().keys()  # checkpoints do not change shape
    batch = batches.sample(8)
    obs = batch["obs"]
    assert _output_dtypes(agent.critic, lambda: agent.critic(obs, batch["action"])) == {
        "layers.0": torch.float32, "layers.1": torch.bfloat16, "layers.2": torch.float32}  # input, hidden, output
    assert _output_dtypes(agent.actor, lambda: agent.act(obs)) == {
        "net.0": torch.float32, "net.2": torch.bfloat16, "net.4": torch.float32}
    # the target critic (a deep copy made before the conversion) computes as its own layers, not the online ones,
    # and so do copies made after it, pickled ones included
    assert agent.critic_target.layers[1].forward.args[0] is agent.critic_target.layers[1]
    for copy in (deepcopy(agent.critic), pickle.loads(pickle.dumps(agent.critic))):
        assert copy.layers[1].forward.args[0] is copy.layers[1]
        assert _output_dtypes(copy, lambda copy=copy: copy(obs, batch["action"]))["layers.1"] == torch.bfloat16
    # close to float32 with the same weights: only the hidden activations are rounded
    agent.load_state_dict(fp32.state_dict())
    q32, q16 = fp32.critic(obs, batch["action"]), agent.critic(obs, batch["action"])
    assert q16.dtype == torch.float32 and torch.allclose(q16, q32, rtol=0.02, atol=0.02)
    stats, _ = agent.update_once(batch)
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in stats.values())
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in agent.critic.parameters())


def test_bfloat16_covers_mlps_q_networks_and_the_image_encoder() -> None:
    from types import SimpleNamespace

    from jaderl.accel import mixed_precision
    from jaderl.algos import DQN
    from jaderl.core.nets import NatureCNN

    ppo, _ = _agent(PPO, "ppo", "jaderl/Pendulum-v1", False, precision="bfloat16")
    obs = torch.randn(5, 3)
    assert _output_dtypes(ppo.critic, lambda: ppo.critic(obs)) == {"0": torch.float32, "2": torch.bfloat16,
                                                                   "4": torch.float32}
    assert ppo.actor.evaluate(obs, torch.zeros(5, 1))[0].dtype == torch.float32
    dqn, _ = _agent(DQN, "dqn", "jaderl/CartPole-v1", False, precision="bfloat16", hidden=[16, 16, 16])
    obs = torch.randn(5, 4)
    assert _output_dtypes(dqn.q_net, lambda: dqn.q_net(obs)) == {  # QNet's body is hidden throughout but its input
        "body.0": torch.float32, "body.1": torch.bfloat16, "body.2": torch.bfloat16, "advantage": torch.float32}
    encoder = NatureCNN((36, 36, 2), out_dim=8)
    holder = SimpleNamespace(config=SimpleNamespace(precision="bfloat16"), device=torch.device("cpu"),
                             encoder=encoder, networks=lambda: {"encoder": encoder})
    assert mixed_precision(holder)  # type: ignore[arg-type]
    images = torch.randint(0, 255, (3, 36, 36, 2), dtype=torch.uint8)
    dtypes = _output_dtypes(holder.encoder, lambda: holder.encoder(images))
    assert set(dtypes.values()) == {torch.bfloat16}  # every convolution and the feature layer
    assert holder.encoder(images).dtype == torch.float32  # the features leave the encoder in float32
    assert not mixed_precision(SimpleNamespace(config=SimpleNamespace(precision="float32")))  # type: ignore[arg-type]


def test_bfloat16_without_bfloat16_matrix_units_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from jaderl.accel import native_bfloat16

    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and platform.machine() in ("x86_64", "AMD64"):  # the CPU's own word on its bfloat16 units
        flags = set(cpuinfo.read_text().split())
        assert native_bfloat16(torch.device("cpu")) == bool(flags & {"avx512_bf16", "amx_bf16", "amx_tile"})
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    with pytest.warns(RuntimeWarning, match=r"^precision=bfloat16 on cpu: it has no bfloat16 matrix units") as caught:
        _agent(PPO, "ppo", "jaderl/Pendulum-v1", False, precision="bfloat16")
    assert len([w for w in caught if "bfloat16" in str(w.message)]) == 1


def test_precision_is_validated_in_one_sentence() -> None:
    from jaderl.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"^precision='float16' is invalid: use float32 or bfloat16$"):
        make_config("ppo", "jaderl/Pendulum-v1", precision="float16")


def test_training_in_bfloat16_runs_and_resumes_in_float32(tmp_path: Path, tiny_ppo: Any) -> None:
    run_dir = str(tmp_path / "run")
    result = train("ppo", "jaderl/CartPole-v1", run_dir=run_dir, precision="bfloat16", **tiny_ppo())
    assert result.steps == 512 and result.stop_reason == "total_steps"
    from jaderl.api import resume

    resumed = resume(run_dir, total_steps=1024, precision="float32")
    assert resumed.steps == 1024
    assert "precision: float32" in (tmp_path / "run" / "config.yaml").read_text()  # the resumed run's setting


def _twin_runs(setup: Any, steps: int = 12) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Train two identical copies, one through torch.optim's calls and one through jaderl.accel's; returns both
    copies' parameters and optimizer state tensors, and how often the second took Adam's own ``step``."""
    results, own_steps = [], 0
    for fast in (False, True):
        torch.manual_seed(0)
        nets, optimizer, max_norm, change = setup()
        params = [p for g in optimizer.param_groups for p in g["params"]]
        calls = {"step": 0}
        real_step = optimizer.step

        def counted(*args: Any, calls: dict[str, int] = calls, real_step: Any = real_step, **kwargs: Any) -> Any:
            calls["step"] += 1
            return real_step(*args, **kwargs)

        optimizer.step = counted
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
        for i in range(steps):
            change(optimizer, i)
            loss = sum((net(x) * (k + 1)).square().mean() for k, net in enumerate(nets)) * 50
            if fast:
                accel.zero_grad(optimizer)
                loss.backward(inputs=params)
                accel.optimizer_step(optimizer, params, max_norm)
            else:
                optimizer.zero_grad(set_to_none=True)
                loss.backward(inputs=params)
                if max_norm > 0:
                    nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
                optimizer.step()
        state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        results.append([p.detach().clone() for p in params] + state)
        own_steps = calls["step"]
    return results[0], results[1], own_steps


def _actor_critic(**adam: Any) -> Any:
    def setup() -> tuple[list[nn.Module], torch.optim.Optimizer, float, Any]:
        actor, critic = mlp([4, 16, 16, 2], nn.Tanh), mlp([4, 16, 16, 1], nn.Tanh)
        optimizer = Agent.adam(actor.parameters(), lr=1e-2, eps=1e-5, **adam)
        optimizer.add_param_group({"params": list(critic.parameters()), "lr": 3e-3})

        def change(opt: torch.optim.Optimizer, i: int) -> None:  # a hyperparameter set in flight
            if i == 6:
                opt.param_groups[0]["lr"] = 2e-2
        return [actor, critic], optimizer, 0.5, change
    return setup


@pytest.mark.parametrize("adam", [{}, {"weight_decay": 1e-2, "betas": (0.8, 0.99)}, {"maximize": True}])
def test_optimizer_steps_compute_what_torch_optim_computes_bit_for_bit(adam: dict[str, Any]) -> None:
    """Clipping (at a norm the gradients exceed) and fused Adam steps, with two parameter groups of their own learning
    rates and one changed in flight: every parameter and optimizer state as torch.optim leaves them, to the bit; only
    the first step (no state yet) goes through Adam's own ``step``."""
    slow, fast, steps = _twin_runs(_actor_critic(**adam))
    assert all(torch.equal(a, b) for a, b in zip(slow, fast, strict=True))
    assert steps == 1


def test_optimizer_steps_take_adams_own_step_where_the_fused_kernel_does_not_apply() -> None:
    """A parameter without a gradient, a non-fused Adam, another optimizer, or a step hook: Adam's (or the
    optimizer's) own ``step`` every time, with the same results."""
    def unused_parameter() -> Any:
        nets, optimizer, max_norm, change = _actor_critic()()
        optimizer.add_param_group({"params": [nn.Parameter(torch.ones(3))]})  # no gradient reaches it: Adam skips it
        return nets, optimizer, max_norm, change

    def unfused() -> Any:
        net = mlp([4, 16, 1], nn.Tanh)
        return [net], torch.optim.Adam(net.parameters(), lr=1e-2, foreach=True), 1.0, lambda o, i: None

    def sgd() -> Any:
        net = mlp([4, 16, 1], nn.Tanh)
        return [net], torch.optim.SGD(net.parameters(), lr=1e-2, momentum=0.9), 0.0, lambda o, i: None

    hooked: list[int] = []

    def with_hook() -> Any:
        nets, optimizer, max_norm, change = _actor_critic()()
        optimizer.register_step_post_hook(lambda *_: hooked.append(1))
        return nets, optimizer, max_norm, change

    for setup in (unused_parameter, unfused, sgd, with_hook):
        slow, fast, steps = _twin_runs(setup)
        assert all(torch.equal(a, b) for a, b in zip(slow, fast, strict=True)), setup.__name__
        assert steps == 12, setup.__name__
    assert len(hooked) == 24  # both copies ran the hook at every step


def test_gradient_clipping_of_mixed_dtypes_is_torchs() -> None:
    """Gradients of two dtypes (a bfloat16 layer beside float32 ones) take torch's own clipping."""
    a, b = nn.Linear(4, 8), nn.Linear(8, 2).to(torch.bfloat16)
    for layer in (a, b):
        for p in layer.parameters():
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(p.dtype) * 10
    params = [*a.parameters(), *b.parameters()]
    copies = [nn.Parameter(p.detach().clone()) for p in params]
    for p, copy in zip(params, copies, strict=True):
        copy.grad = p.grad.clone()
    nn.utils.clip_grad_norm_(copies, 1.0, foreach=True)
    accel.clip_grad_norm(params, 1.0)
    assert all(torch.equal(p.grad, copy.grad) for p, copy in zip(params, copies, strict=True))
    total = torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params]))
    assert abs(float(total) - 1.0) < 1e-2  # scaled down to the norm asked for
