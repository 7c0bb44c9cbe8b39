"""Optional compiled paths: ``torch.compile`` for an agent's act and loss functions, CUDA graphs on GPU.

:func:`accelerate` (applied by the training loop when ``config.compile`` is true) replaces the methods an algorithm
lists in ``compiled_methods`` (by default ``act``) with compiled versions on that agent instance:

* what is compiled are pure functions: ``act`` (and ``explore_action`` of on-policy agents) and the loss functions
  that ``update_once`` / ``update`` call (SAC's ``critic_loss`` and ``actor_loss``, PPO's ``minibatch_loss`` ...).
  Their backward passes are compiled with them; the optimizer steps, target updates and counters stay in eager
  Python (fused Adam is one kernel already), so no Python state is baked into a compiled graph.
* on CUDA the mode is ``reduce-overhead``: each compiled function runs as a captured CUDA graph. Outputs are copied
  out of the graph's memory pool, so statistics kept across calls are not overwritten by the next replay.
* random numbers: Inductor is told to call the same random kernels as eager mode (``fallback_random``), so a
  compiled and an eager run draw the same numbers from a seed; results agree up to floating-point rounding.
* fallback: if compiling fails (no C++ compiler, an unsupported operation), one warning names the cause and the
  agent continues in eager mode. The failed call is repeated eagerly from the random state it started with; the
  compiled functions change no other state, so the run goes on exactly as an eager one would.

``precision=bfloat16`` (:func:`mixed_precision`, also applied by :func:`accelerate`) runs the layers that each network
declares bfloat16 (:func:`jaderl.core.nets.declare_precision`: the hidden layers) in bfloat16 and everything else in
float32.

:func:`zero_grad` and :func:`optimizer_step` (gradient clipping and a fused Adam step), which every agent's gradient
step goes through, call the kernels that ``torch.optim`` and ``torch.nn.utils.clip_grad_norm_`` call, without their
per-call Python.

:class:`Tanh`, the activation of jaderl's tanh MLPs, computes large float32 batches on the CPU as 2 sigmoid(2x) - 1
on CPUs where that is faster than ``torch.tanh`` (:func:`sigmoid_tanh_is_faster` measures it once per process).

This module sits below the core and imports nothing of jaderl: it reads an agent's ``config``, ``device``,
``networks()`` and ``compiled_methods``.

Whether compiling pays depends on the device and the network size: it removes Python and kernel-launch overhead,
which dominates small networks (on GPU always; on a CPU for networks of a few dozen units, like PPO's [64, 64]),
while for networks of a few hundred units on a CPU the matrix products dominate and compiled code can even be
slower (SAC's [256, 256]); the ppo and sac sections of ``benchmarks/throughput.py`` measure both with and without.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.autograd import forward_ad

if TYPE_CHECKING:
    from jaderl.core.agent import Agent

__all__ = ["accelerate", "compiled_mode", "mixed_precision", "native_bfloat16", "optimizer_step", "rng_state",
           "set_rng_state", "zero_grad"]


def compiled_mode(device: torch.device) -> str | None:
    """The ``torch.compile`` mode for ``device``: CUDA graphs on GPU, Inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def accelerate(agent: Agent) -> bool:
    """Compile ``agent``'s ``compiled_methods`` in place when ``agent.config.compile`` is true.

    Also applies :func:`mixed_precision` (``agent.config.precision``). Returns whether compiled versions were
    installed (False when compiling is off or torch cannot compile here; the latter with a warning). Compilation
    itself happens at the first call of each function, and a failure then falls back to eager mode as the module
    docstring describes.
    """
    mixed_precision(agent)
    if not getattr(agent.config, "compile", False):
        return False
    if not hasattr(torch, "compile") or not torch._dynamo.is_dynamo_supported():
        warnings.warn("torch.compile is not supported by this Python or torch build; running in eager mode",
                      RuntimeWarning, stacklevel=2)
        return False
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True  # the same random kernels as eager mode: same samples for a seed
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):  # compile backward passes with their forward,
        functorch_config.force_non_lazy_backward_lowering = True  # so a failure there falls back to eager as well
    state = _Fallback(agent)
    mode = compiled_mode(agent.device)
    for name in getattr(agent, "compiled_methods", ("act",)):
        eager = getattr(agent, name)
        setattr(agent, name, _CompiledMethod(name, eager, mode, agent.device, state))
    return True


class _Fallback:
    """Shared by one agent's compiled methods: once one fails to compile, all of them run eagerly."""

    def __init__(self, agent: Agent) -> None:
        self.agent_name = type(agent).__name__
        self.failed = False

    def fail(self, name: str, exc: BaseException) -> None:
        if not self.failed:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            message = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else " ".join(lines[:1])
            cause = type(exc).__name__ + (f": {message[:300]}" if message else "")
            warnings.warn(f"torch.compile failed on {self.agent_name}.{name} ({cause}); continuing in eager mode",
                          RuntimeWarning, stacklevel=3)
        self.failed = True


class _CompiledMethod:
    """A bound method and its compiled version; calls the compiled one until compiling fails."""

    def __init__(self, name: str, eager: Callable[..., Any], mode: str | None, device: torch.device,
                 fallback: _Fallback) -> None:
        self.name, self.eager, self.device, self.fallback = name, eager, device, fallback
        self.cuda_graphs = mode == "reduce-overhead"
        self.compiled = torch.compile(eager, mode=mode, dynamic=False)
        functools.update_wrapper(self, eager)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fallback.failed:
            return self.eager(*args, **kwargs)
        rng = rng_state(self.device)
        try:
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs were copied out
                return _copy_out(self.compiled(*args, **kwargs))
            return self.compiled(*args, **kwargs)
        except torch.OutOfMemoryError:  # not a compile error: the eager code would run out of memory too
            raise
        except Exception as exc:  # compile errors surface at the first call of each new input signature
            set_rng_state(self.device, rng)
            self.fallback.fail(self.name, exc)
            return self.eager(*args, **kwargs)


def rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU generator's state and, on CUDA, the device generator's (its seed and offset, held on the host)."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_rng_state(device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    """Make ``state`` (from :func:`rng_state`) the CPU generator's (and ``device``'s CUDA generator's) state."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _copy_out(value: Any) -> Any:
    """Tensors of ``value`` (nested in tuples, lists, dicts) cloned out of a CUDA graph's memory pool."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_copy_out(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_out(v) for k, v in value.items()}
    return value


def mixed_precision(agent: Agent, warn: bool = True) -> bool:
    """Make the hidden layers of ``agent``'s networks compute in bfloat16 when ``agent.config.precision`` says so.

    A layer that its network declares bfloat16 (:func:`jaderl.core.nets.declare_precision`) runs under
    ``torch.autocast`` in bfloat16, its forward and backward matrix products included, and hands bfloat16 activations
    on: every layer of an MLP but its first and its last, and every layer of the image encoder (pixels have 8 bits).
    A network's first layer reads observations and actions in float32, as they come (1234.5 would be 1232 in
    bfloat16). Output layers (policy means and logits, values, Q-values) take float32 inputs and compute in float32,
    and so does every loss: only the hidden layers' products lose precision (their weights, activations and
    gradients rounded to bfloat16's 8 bits of mantissa), and a network with one hidden layer has none. Parameters,
    optimizer state and checkpoints stay float32, and state-dict keys do not change, so a run can resume in the
    other precision. Pays where bfloat16 matrix products are fast: GPUs with bfloat16 tensor cores and CPUs with
    AVX-512 BF16 or AMX; elsewhere they are emulated and slower than float32, which one warning says unless ``warn``
    is false (the pipeline's explorer and evaluator processes, which convert only on such CPUs, and
    :func:`jaderl.load`, whose run's precision is already chosen). Returns whether anything was changed.
    """
    if getattr(agent.config, "precision", "float32") != "bfloat16":
        return False
    if warn and not native_bfloat16(agent.device):
        warnings.warn(f"precision=bfloat16 on {agent.device}: it has no bfloat16 matrix units (a GPU of compute "
                      "capability 8.0 or newer, a CPU with AVX-512 BF16 or AMX), so mixed precision runs slower than "
                      "float32 there; set precision=float32", RuntimeWarning, stacklevel=2)
    _convert_layers(agent)
    return True


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices natively (bfloat16 tensor cores, AVX-512 BF16 or AMX)."""
    if device.type == "cuda":
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return any(probe() for probe in probes if probe is not None)
    return True


def _convert_layers(agent: Agent) -> None:
    """Install the forwards of :func:`mixed_precision` on the layers of ``agent``'s networks as each layer declared
    (``precision``: bfloat16, float32 or float32_output); a layer converted already is left as it is."""
    forwards = {"bfloat16": _bfloat16_forward, "float32": _float32_forward, "float32_output": _float32_output_forward}
    modules = {id(m): m for net in agent.networks().values() for m in net.modules()}.values()  # shared ones once
    for module in modules:  # instance-level forwards: copy.deepcopy and pickle rebind them to the copy
        forward = forwards.get(getattr(module, "precision", ""))
        if forward is not None and "forward" not in vars(module):
            module.forward = functools.partial(forward, module)


def _bfloat16_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A hidden layer's forward under autocast: bfloat16 products, bfloat16 output."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return type(self).forward(self, x, *args, **kwargs)


def _float32_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A float32 layer's forward on float32 inputs (its input may be a hidden layer's bfloat16 activations)."""
    return type(self).forward(self, x.float(), *args, **kwargs)


def _float32_output_forward(self: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A network's forward with its output in float32 (an encoder whose last layer is hidden)."""
    return type(self).forward(self, *args, **kwargs).float()


# --- a faster tanh on the CPU (the activation of jaderl's Tanh MLPs: jaderl.core.nets.mlp) ---


def _sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) as 2 sigmoid(2x) - 1, in place on one new tensor."""
    return (x * 2.0).sigmoid_().mul_(2.0).sub_(1.0)


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) = 2 sigmoid(2x) - 1 forward; backward from the output, as PyTorch's own tanh: grad (1 - y^2)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = _sigmoid_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


_SIGMOID_TANH: list[bool] = []  # decided once per process by sigmoid_tanh_is_faster()


def sigmoid_tanh_is_faster() -> bool:
    """Whether 2 sigmoid(2x) - 1 computes tanh faster than ``torch.tanh`` on this CPU, for a 2048 x 64 float32 batch
    on the current threads: measured at the first call (best of 5 tries of each, a few milliseconds in all) and kept
    for the process. PyTorch's CPU tanh is 3x-5x slower than the sigmoid form on some CPUs (AMD EPYC machines) and 2x-3x
    faster on others (an Intel Xeon with AVX-512). The environment variable ``JADERL_SIGMOID_TANH=1`` (or ``0``)
    decides instead, e.g. for bit-identical runs on machines of both kinds (the two forms are at most about 1e-7
    apart); another value is ignored with a warning."""
    if not _SIGMOID_TANH:
        forced = os.environ.get("JADERL_SIGMOID_TANH", "").strip()
        if forced in ("0", "1"):
            _SIGMOID_TANH.append(forced == "1")
        else:
            if forced:
                warnings.warn(f"JADERL_SIGMOID_TANH={forced!r} is neither 0 nor 1, so it is ignored and the faster "
                              "form is measured; set it to 0 or 1 or unset it", RuntimeWarning, stacklevel=2)
            x = torch.linspace(-3.0, 3.0, 2048 * 64).view(2048, 64)  # no random numbers: the seeded streams stay

            def best(fn: Callable[[torch.Tensor], torch.Tensor]) -> float:
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    for _ in range(4):
                        fn(x)
                    times.append(time.perf_counter() - start)
                return min(times)

            best(torch.tanh)  # warm: the first calls page in the kernels
            _SIGMOID_TANH.append(best(_sigmoid_tanh) < best(torch.tanh))
    return _SIGMOID_TANH[0]


class Tanh(nn.Module):
    """``nn.Tanh`` that is faster on CPUs with a slow ``torch.tanh`` (:func:`sigmoid_tanh_is_faster`): there, large
    float32 tensors take 2 sigmoid(2x) - 1 (3x-5x faster than ``torch.tanh`` on one core of those CPUs for a
    2048 x 64 batch; at most about 1e-7 apart), and so do bfloat16 ones (the output of a mixed-precision layer),
    computed in float32 and returned in bfloat16. Small tensors (acting on a few sub-envs, evaluating), other devices
    and dtypes, code being compiled (Inductor writes its own tanh) and CPUs whose ``torch.tanh`` is the faster take
    ``torch.tanh`` (a custom autograd function costs tens of microseconds a call); on those CPUs large bfloat16
    tensors take it in float32 (2x faster forward than PyTorch's bfloat16 tanh on an Intel Xeon)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) or torch.compiler.is_compiling():
            return torch.tanh(x)
        if not sigmoid_tanh_is_faster():
            if x.dtype == torch.bfloat16 and x.numel() >= FAST_TANH_MIN_NOGRAD:  # float32's tanh is the faster
                return torch.tanh(x.float()).to(x.dtype)
            return torch.tanh(x)
        if not (x.requires_grad and torch.is_grad_enabled()):  # nothing to save for a backward pass
            if x.numel() < FAST_TANH_MIN_NOGRAD:
                return torch.tanh(x)
            return _sigmoid_tanh(x.float()).to(x.dtype)
        if x.numel() < FAST_TANH_MIN_GRAD:
            return torch.tanh(x)
        return _SigmoidTanh.apply(x.float()).to(x.dtype)


FAST_TANH_MIN_GRAD = 65_536
"""Elements from which :class:`Tanh` takes 2 sigmoid(2x) - 1 with its own backward (measured on an AMD EPYC core:
below this ``torch.tanh`` is as fast or faster, the autograd function's overhead being the larger cost)."""
FAST_TANH_MIN_NOGRAD = 16_384
"""Elements from which :class:`Tanh` takes 2 sigmoid(2x) - 1 when no gradient is needed (three in-place ops)."""


class CacheBlocked(nn.Sequential):
    """``nn.Sequential`` that runs a large batch on the CPU in blocks of rows whose activations fit half the core's
    L2 cache, or 1 MiB where that is more (:func:`block_bytes`), each block through every layer. Each layer's output
    is then read by the next while it is still in the cache, instead of being written to memory and read back: a
    MAPPO iteration on ``jaderl/simple_spread`` (minibatches of 19,200 actor rows through [64, 64] tanh layers, in 5
    blocks) took 11-16 % less time on an Intel Xeon core with 2 MB of L2. The backward pass is blocked too. GPUs,
    small batches and code being compiled or exported run unblocked.

    A float32 tanh MLP (jaderl's on-policy networks: :func:`_tanh_mlp_layers`) runs as one autograd function,
    :class:`_TanhMLP`, forward and backward block by block. Its hidden values, with gradients or without, are bit for
    bit those that its layers compute one by one on each block without gradients, and its outputs and gradients
    equal theirs up to rounding. Other networks (ReLU MLPs, a layer with a hook, mixed precision) run their layers
    one by one on each block, and their weight gradients are summed block by block (equal up to rounding)."""

    max_rows: int | None = None
    """Rows of float32 activations of the widest layer that fit :func:`block_bytes` (set at the first call)."""
    tanh_linears: tuple[tuple[nn.Module, ...], list[nn.Linear]] | None = None
    """The layers, and the linear ones when they make a tanh MLP (else none): :func:`_tanh_mlp_layers` checks their
    kinds once for the same layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or x.device.type != "cpu" or x.dim() < 2:
            # no guard on a traced size: compiled and exported graphs run unblocked
            return super().forward(x)
        if self.max_rows is None:
            width = max((m.out_features for m in self if isinstance(m, nn.Linear)), default=1)
            self.max_rows = max(1, block_bytes() // (4 * width))
        rows = x.numel() // x.shape[-1]
        if rows < NARROW_OUTPUT_MIN_ROWS and rows <= self.max_rows and not torch.is_grad_enabled():
            # acting on a few sub-envs: the layers one by one, with less overhead and the values of _tanh_mlp_forward
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1])
        blocks = max(1, -(-rows // self.max_rows))
        layers = _tanh_mlp_layers(self, flat)
        if layers is not None:  # every block through every layer in one autograd function (or none: no gradients)
            params = [p for layer in layers for p in (layer.weight, layer.bias)]
            if torch.is_grad_enabled() and (flat.requires_grad or any(p.requires_grad for p in params)):
                out = _TanhMLP.apply(flat, blocks, *params)
            else:
                out = _tanh_mlp_forward(flat, blocks, params[0::2], params[1::2], None)
        elif blocks == 1:
            out = super().forward(flat)
        else:
            out = torch.cat([super(CacheBlocked, self).forward(block) for block in flat.tensor_split(blocks)])
        return out.view(*x.shape[:-1], out.shape[-1])


def _tanh_mlp_layers(net: CacheBlocked, x: torch.Tensor) -> list[nn.Linear] | None:
    """The linear layers of ``net`` when it is a tanh MLP that :class:`_TanhMLP` computes, for float32 rows ``x``
    (B, in) on the CPU: ``Linear, Tanh, ..., Linear, Tanh, Linear`` (at least one :class:`Tanh`), plain float32
    ``nn.Linear`` layers with biases, no module has hooks or a mixed-precision forward, and no autocast, ``torch.func``
    transform or forward-mode AD is on; None otherwise."""
    layers = tuple(net._modules.values())
    if net.tanh_linears is None or net.tanh_linears[0] != layers:  # the layers' kinds, once for these layers
        mlp = (len(layers) >= 3 and len(layers) % 2 == 1
               and all(type(m) is (nn.Linear if i % 2 == 0 else Tanh) for i, m in enumerate(layers))
               and all(m.bias is not None for m in layers[0::2]))
        net.tanh_linears = (layers, list(layers[0::2]) if mlp else [])
    linears = net.tanh_linears[1]
    if (not linears or x.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
            or torch._C._functorch.maybe_current_level() is not None  # torch.func transforms (vmap, grad, ...)
            or forward_ad._current_level >= 0  # forward-mode AD: the layers one by one have their jvp
            or any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                   or "forward" in vars(m) for m in layers)
            or any(m.bias is None or m.weight.dtype != torch.float32 or m.bias.dtype != torch.float32
                   for m in linears)):
        return None
    return linears


def _tanh_mlp_forward(x: torch.Tensor, blocks: int, weights: tuple[torch.Tensor, ...] | list[torch.Tensor],
                      biases: tuple[torch.Tensor, ...] | list[torch.Tensor],
                      saved: list[list[torch.Tensor]] | None) -> torch.Tensor:
    """The tanh MLP of ``weights`` and ``biases`` on rows ``x`` (B, in), ``blocks`` blocks of rows one after the
    other, each through every layer. Each hidden layer is one matrix product and its tanh: on CPUs whose tanh takes
    the sigmoid form (:func:`sigmoid_tanh_is_faster`), 2 sigmoid(2 z) - 1 with the doubling in the product (exact in
    floating point) and the other steps in place, for blocks of at least ``FAST_TANH_MIN_NOGRAD`` elements, with or
    without gradients (there is no autograd function per layer to pay for); otherwise ``tanh_`` in place. Acting and
    training therefore compute the same values, bit for bit those of the layers one by one on each block with no
    gradients (:class:`Tanh` decides by the size of the tensor it is given). A narrow output layer
    (:data:`NARROW_OUTPUT`) computes W h^T and transposes it: the same dot products, which may round differently from
    ``nn.Linear``'s h W^T. ``saved`` (when given) gets every block's layer inputs, for the backward pass."""
    out = x.new_empty(x.shape[0], weights[-1].shape[0])
    sigmoid_form = sigmoid_tanh_is_faster()
    start = 0
    for block in x.tensor_split(blocks):
        h, inputs = block, [block]
        for weight, bias in zip(weights[:-1], biases[:-1], strict=True):
            if sigmoid_form and h.shape[0] * weight.shape[0] >= FAST_TANH_MIN_NOGRAD:
                h = torch.addmm(bias, h, weight.t(), beta=2.0, alpha=2.0).sigmoid_().mul_(2.0).sub_(1.0)
            else:
                h = torch.addmm(bias, h, weight.t()).tanh_()
            inputs.append(h)
        target = out[start:start + block.shape[0]]
        if 1 < weights[-1].shape[0] < NARROW_OUTPUT and block.shape[0] >= NARROW_OUTPUT_MIN_ROWS:  # W h^T, (out, B)
            target.copy_(torch.addmm(biases[-1].unsqueeze(1), weights[-1], h.t()).t())
        else:
            torch.addmm(biases[-1], h, weights[-1].t(), out=target)
        start += block.shape[0]
        if saved is not None:
            saved.append(inputs)
    return out


class _TanhMLP(torch.autograd.Function):
    """A tanh MLP (:func:`_tanh_mlp_layers`) on rows x (B, in) in cache-sized blocks (:class:`CacheBlocked`) as one
    autograd function: the forward pass of :func:`_tanh_mlp_forward`, and a backward pass that goes through the
    blocks one by one as well, each through every layer, accumulating the weight and bias gradients in place. One
    autograd node instead of one per layer and block (tens of microseconds of Python each), no gradients of the
    blocks to concatenate and sum. Each weight gradient is the matrix product in the orientation whose output has
    more columns (x^T g, transposed, for a layer with more outputs than inputs: half the time of g^T x for a
    1,920 x 21 block of a 21 -> 64 layer on an AMD EPYC core). Gradients equal those of the layers one by one up to
    rounding."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, blocks: int, *params: torch.Tensor) -> torch.Tensor:
        saved: list[list[torch.Tensor]] = []
        out = _tanh_mlp_forward(x, blocks, params[0::2], params[1::2], saved)
        ctx.blocks = blocks
        ctx.save_for_backward(*params[0::2], *(h for inputs in saved for h in inputs))  # no double backward
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph=True: these gradients would have no graph of their own
            raise RuntimeError("jaderl's tanh MLP (jaderl.accel.CacheBlocked) has no second derivatives, which "
                               "create_graph=True asks for; run its layers one by one for that, as "
                               "torch.nn.Sequential.forward(net, x)")
        needs = ctx.needs_input_grad  # x, blocks, then every layer's weight and bias
        layers = (len(needs) - 2) // 2
        weights, saved = ctx.saved_tensors[:layers], ctx.saved_tensors[layers:]
        inputs = [saved[k:k + layers] for k in range(0, len(saved), layers)]  # every block's layer inputs
        last = layers - 1
        weight_grads: list[torch.Tensor | None] = [None] * len(weights)
        bias_grads: list[torch.Tensor | None] = [None] * len(weights)
        # the gradients at the hidden layers, block after block in the same two buffers (still in the cache, where
        # new tensors would be written to memory: about 100 us more for a 1,920 x 64 block on an AMD EPYC core)
        rows, width = max(len(block[0]) for block in inputs), max(w.shape[1] for w in weights[1:])
        scratch = [grad.new_empty(rows * width), grad.new_empty(rows * width)]
        input_grad = grad.new_empty(grad.shape[0], weights[0].shape[1]) if needs[0] else None
        # down to the lowest layer with a parameter that needs its gradient (the input layer when x needs one)
        stop = 0 if needs[0] else min(i for i in range(layers) if needs[2 + 2 * i] or needs[3 + 2 * i])
        start = 0
        for g, block_inputs in zip(grad.contiguous().tensor_split(ctx.blocks), inputs, strict=True):
            n = g.shape[0]
            for i in range(last, stop - 1, -1):
                if i < last:  # through the tanh, from its output (the next layer's input), in place
                    torch.ops.aten.tanh_backward.grad_input(g, block_inputs[i + 1], grad_input=g)
                weight, h, acc = weights[i], block_inputs[i], weight_grads[i]
                if needs[2 + 2 * i]:
                    a, b = (h.t(), g) if weight.shape[0] > weight.shape[1] else (g.t(), h)
                    weight_grads[i] = a.mm(b) if acc is None else acc.addmm_(a, b)
                if needs[3 + 2 * i]:
                    bias_grads[i] = g.sum(0) if bias_grads[i] is None else bias_grads[i].add_(g.sum(0))
                if i > stop:
                    g = torch.mm(g, weight, out=scratch[i % 2][:n * weight.shape[1]].view(n, weight.shape[1]))
                elif input_grad is not None:
                    torch.mm(g, weight, out=input_grad[start:start + n])
            start += n
        grads: list[torch.Tensor | None] = [input_grad, None]
        for weight, weight_grad, bias_grad in zip(weights, weight_grads, bias_grads, strict=True):
            transposed = weight_grad is not None and weight.shape[0] > weight.shape[1]
            grads += [weight_grad.t() if transposed else weight_grad, bias_grad]
        return tuple(grads)


NARROW_OUTPUT = 8
"""Output layers of more than one and fewer than this many units compute W h^T (out, B) for blocks of at least
:data:`NARROW_OUTPUT_MIN_ROWS` rows and transpose it into place: for a 1,920-row block of a 64 -> 5 layer, 45 us
against 72-85 us for h W^T on an AMD EPYC core (17 us against 19 us for 256 rows, 368 us against 913 us for 19,200).
A single output unit (a value) is a matrix-vector product, faster as h W^T."""
NARROW_OUTPUT_MIN_ROWS = 256
"""Rows from which a narrow output layer takes W h^T (below, h W^T is as fast or faster); below it, a tanh MLP acting
without gradients on rows that make one block runs its layers one by one (the same values as
:func:`_tanh_mlp_forward`, less overhead)."""


@functools.cache
def block_bytes() -> int:
    """Bytes of one layer's activations in a :class:`CacheBlocked` block: half the L2 cache of CPU 0 (read from
    Linux's sysfs), and at least :data:`MIN_BLOCK_BYTES` (also where sysfs does not say). ``JADERL_BLOCK_BYTES`` sets
    it (0: no blocking); a value that is not a whole number >= 0 is ignored with a warning."""
    forced = os.environ.get("JADERL_BLOCK_BYTES", "").strip()
    if forced.isdecimal():
        return int(forced) or 2**62
    if forced:
        warnings.warn(f"JADERL_BLOCK_BYTES={forced!r} is not a whole number of bytes, so it is ignored; set it to one "
                      "such as 262144 (0: no blocking) or unset it", RuntimeWarning, stacklevel=2)
    for index in range(8):
        path = f"/sys/devices/system/cpu/cpu0/cache/index{index}/"
        try:
            with open(path + "level") as level, open(path + "type") as kind, open(path + "size") as size:
                if level.read().strip() == "2" and kind.read().strip() in ("Unified", "Data"):
                    text = size.read().strip().upper()
                    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
                    return max(MIN_BLOCK_BYTES, int(text.rstrip("KMG")) * scale // 2)
        except (OSError, ValueError):
            continue
    return MIN_BLOCK_BYTES


MIN_BLOCK_BYTES = 2**20
"""The smallest :func:`block_bytes`: 1 MiB (4,096 rows of 64 float32 units). Each block costs a tanh MLP about 25
tensor operations of Python in its forward and backward passes, which for blocks of half a small L2 cache outweighs
what the cache saves: on an AMD EPYC core with 512 KiB of L2, a MAPPO update on ``jaderl/simple_spread`` took 13 %
less time in 1 MiB blocks than in 256 KiB ones (median of 12 updates each, alternating; 3 % less than unblocked)."""


# --- optimizer steps without the per-call Python of torch.optim ---------------------------------------------------
# Around their few kernels, torch.optim's zero_grad and Adam.step and torch.nn.utils' clip_grad_norm_ spend a few
# hundred microseconds of Python per call (profiler scopes, hooks, grouping tensors by device and dtype, state
# checks): for the 12 tensors of a [64, 64] actor-critic on one AMD EPYC core, 56, 152 and 165 us, against 55 us for
# the fused Adam kernel called directly. That is about a tenth of a PPO gradient step on CartPole's minibatches and
# more of an off-policy one. The functions below call the same kernels in the same order with the same arguments,
# so results are bit for bit those of the torch calls, and take the torch calls for anything they do not handle.


def zero_grad(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad(set_to_none=True)``: every parameter's gradient set to None."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


def _one_kind(tensors: list[torch.Tensor]) -> bool:
    """Whether ``tensors`` are real, dense and of one device and dtype (one fused call takes them all)."""
    first = tensors[0]
    return all(t.device == first.device and t.dtype == first.dtype and not t.is_sparse
               and not t.is_complex() for t in tensors)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> None:
    """``nn.utils.clip_grad_norm_(params, max_norm, foreach=True)``: the gradients scaled by
    min(1, max_norm / (total norm + 1e-6)), the total norm being the 2-norm of every gradient together."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if not _one_kind(grads):
        nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(float(max_norm) / (total + 1e-6), max=1.0))


def _hooked(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step hook is registered on ``optimizer`` or on every optimizer (``step`` must run them)."""
    module = sys.modules["torch.optim.optimizer"]
    return bool(optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
                or getattr(module, "_global_optimizer_pre_hooks", None)
                or getattr(module, "_global_optimizer_post_hooks", None))


def optimizer_step(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], max_grad_norm: float) -> None:
    """Clip the gradients of ``params`` to a total norm of ``max_grad_norm`` (:func:`clip_grad_norm`; 0: no
    clipping), then step ``optimizer`` (:func:`adam_step`)."""
    if max_grad_norm > 0:
        clip_grad_norm(params, max_grad_norm)
    adam_step(optimizer)


def adam_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``. For a fused ``torch.optim.Adam`` (:meth:`jaderl.core.agent.Agent.adam`) whose
    parameters all have gradients and a state (from its first step on), and whose groups are plain (float
    hyperparameters, no AMSGrad, no capturable or differentiable mode, one device and dtype per group), the fused
    kernel itself, as ``Adam.step`` calls it; anything else takes ``optimizer.step()``."""
    if type(optimizer) is not torch.optim.Adam or _hooked(optimizer):
        optimizer.step()
        return
    calls = []
    for group in optimizer.param_groups:
        params = group["params"]
        if not params:
            continue
        states = [optimizer.state.get(p) for p in params]
        if (not group.get("fused") or any(group.get(k) for k in ("amsgrad", "capturable", "differentiable",
                                                                  "decoupled_weight_decay"))
                or not all(isinstance(group[k], float | int) for k in ("lr", "eps", "weight_decay"))
                or not all(isinstance(b, float | int) for b in group["betas"])
                or any(p.grad is None or not s for p, s in zip(params, states, strict=True))
                or not _one_kind([*params, *(p.grad for p in params)])):
            optimizer.step()
            return
        calls.append((group, params, states))
    with torch.no_grad():
        for group, params, states in calls:
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                               [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=group["lr"],
                               beta1=group["betas"][0], beta2=group["betas"][1], weight_decay=group["weight_decay"],
                               eps=group["eps"], maximize=group.get("maximize", False), grad_scale=None, found_inf=None)
