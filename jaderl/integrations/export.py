"""A trained policy as one file that serves without jaderl: ONNX (onnxruntime, TensorRT, any ONNX runtime) or
TorchScript (libtorch from C++, ``torch.jit.load`` from Python).

The file computes :meth:`Agent.predict <jaderl.core.agent.Agent.predict>` for a batch: raw observations in (float32,
or uint8 for images; ``(B, *obs_shape)``, or ``(B, agents, *obs_shape)`` for several agents), the deterministic
action out in the env's own action space (int64 indices for discrete actions; float32 rescaled from [-1, 1] to the
env's bounds for continuous ones). The observation normaliser, the image encoder and the rescaling are inside the
graph, and what the policy computes is the agent's own ``act(obs, deterministic=True)``, traced once, not a copy of
it. The batch size is free (a dynamic axis); docs/deploy.md shows how to serve the file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from jaderl.accel import Tanh
from jaderl.core.agent import Agent
from jaderl.core.config import ConfigError
from jaderl.envs.vec import rescale_actions

FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
"""The export formats and the file each is written to in a run directory when no path is given."""
SUFFIXES = {"onnx": (".onnx",), "torchscript": (".pt", ".pth")}
"""The file suffixes of each format: an existing file is overwritten only when it has one of them."""

INPUT_NAME, OUTPUT_NAME = "obs", "action"
"""The names of the ONNX graph's input and output."""
BATCH_AXIS = "batch"
"""The name of the ONNX graph's dynamic first axis, the batch size, in its input and output."""


class MissingExtra(ConfigError, ImportError):
    """An optional package that a feature needs is not installed; the message names the extra that installs it."""


def require(packages: tuple[str, ...], feature: str, extra: str) -> None:
    """Raise :class:`MissingExtra` in one sentence unless every one of ``packages`` can be imported."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"{feature} needs {' and '.join(missing)}, which is not installed; "
                           f"pip install 'jaderl[{extra}]'")


class DeployedPolicy(nn.Module):
    """``agent.predict`` for a batch, as a module: ``forward(obs)`` takes raw observations and returns the
    deterministic actions in the env's action space. The agent's policy modules (:meth:`Agent.policy`) are its
    submodules, so its parameters and statistics become the graph's weights."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent  # a plain attribute: the modules act uses are registered below, by their policy() names
        self.policy = nn.ModuleDict(agent.policy())
        self.keep_uint8 = agent.spec.obs_dtype == "uint8"  # images reach the encoder as bytes, as predict does
        bounds = agent.spec.action_bounds(agent.device)  # (agents or 1, action_dim)
        self.rescale = bounds is not None
        if bounds is not None:
            self.register_buffer("low", bounds[0])
            self.register_buffer("high", bounds[1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        action = self.agent.act(obs if self.keep_uint8 else obs.float(), deterministic=True)
        if self.rescale:  # [-1, 1] -> [low, high], as predict rescales
            action = rescale_actions(action, self.low, self.high)
        return action


def example_observations(agent: Agent, batch: int = 2) -> torch.Tensor:
    """A batch of observations of the shape and dtype the exported file takes (random values: only the shapes
    matter to the exporter). A batch of at least 2 keeps the batch axis free."""
    agents = (agent.spec.num_agents,) if agent.spec.num_agents > 1 else ()
    shape = (batch, *agents, *agent.obs_shape)
    generator = torch.Generator().manual_seed(0)
    if agent.spec.obs_dtype == "uint8":
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).to(agent.device)
    return torch.randn(shape, generator=generator).to(agent.device)


def export_policy(agent: Agent, format: str, out: str | Path) -> Path:
    """Write ``agent``'s deterministic policy to ``out`` as ``format`` (``"onnx"`` or ``"torchscript"``) and return
    the path; ``out``'s suffix may not be another format's (a ``.pt`` file holding ONNX). ONNX goes through
    ``torch.export``, TorchScript through ``torch.jit.trace`` (then frozen); both read the agent's own modules. Load
    the agent on the CPU (``jaderl.load(run_dir)``) for a file that runs anywhere: a TorchScript file keeps the
    device it was traced on."""
    if format not in FORMATS:
        raise ConfigError(f"format={format!r} is not supported; choose one of: {', '.join(FORMATS)}")
    if format == "onnx":  # torch's ONNX exporter is written in onnxscript
        require(("onnx", "onnxscript"), "exporting to ONNX", "export")
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"{out} is a directory; give the file to write, such as {out / FORMATS[format]}")
    if out.exists() and out.suffix not in SUFFIXES[format]:  # an earlier export is replaced; anything else is kept
        raise ConfigError(f"{out} exists and is not an earlier export (a {' or '.join(SUFFIXES[format])} file); "
                          "remove it or give another path")
    if other := next((f for f, suffixes in SUFFIXES.items() if f != format and out.suffix in suffixes), None):
        # a .pt file holding ONNX (or the reverse) would be loaded, and later replaced, as the other format
        kind = {"onnx": "an ONNX", "torchscript": "a TorchScript"}[other]
        raise ConfigError(f"{out} has the suffix of {kind} file but --format is {format}; name it "
                          f"{out.with_suffix(SUFFIXES[format][0]).name} or pass --format {other}")
    policy = DeployedPolicy(agent).eval()
    example = example_observations(agent)
    out.parent.mkdir(parents=True, exist_ok=True)
    if format == "onnx":
        with _quiet("torch.onnx"), warnings.catch_warnings():  # the exporter's notices about its own internals
            warnings.simplefilter("ignore", FutureWarning)
            # the module itself, not a program exported first: only then does the free axis keep its name in the file
            torch.onnx.export(policy, (example,), str(out), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              dynamic_shapes=({0: torch.export.Dim(BATCH_AXIS)},), dynamo=True,
                              external_data=False, verbose=False)
    else:
        # the tracer records every size it reads from the input (the batch axis stays free); the graph of
        # torch.export would not do: its sizes are plain numbers by the time the tracer sees them
        with plain_tanh(agent.policy().values()), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # PyTorch deprecates TorchScript; still asked for
            traced = torch.jit.trace(policy, (example,))
            torch.jit.freeze(traced.eval()).save(str(out))  # weights as constants: no gradients, nothing to train
    return out


@contextlib.contextmanager
def plain_tanh(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Let ``modules`` compute tanh with ``nn.Tanh`` for a block: jaderl's :class:`~jaderl.accel.Tanh` (the same
    function, faster on the CPU) is a custom autograd function, which TorchScript cannot save."""
    swapped = [(parent, name, child) for module in modules for parent in module.modules()
               for name, child in parent.named_children() if isinstance(child, Tanh)]
    for parent, name, _ in swapped:
        setattr(parent, name, nn.Tanh())
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Raise the level of logger ``name`` to ERROR for a block (the ONNX exporter warns about optional packages of
    its own that it skips, such as torchvision)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


__all__ = ["BATCH_AXIS", "FORMATS", "DeployedPolicy", "MissingExtra", "export_policy"]
