"""Networks shared by the algorithms: MLPs, actors, critics (twin / ensemble critics as one batched module).

Every network declares how each of its layers computes under ``precision=bfloat16`` (:func:`declare_precision`):
``"bfloat16"`` for hidden layers, ``"float32"`` for a network's first layer (it reads raw observations and actions)
and its output layer (values, logits, means), ``"float32_output"`` for a module whose output leaves in float32 (the
image encoder). :func:`jaderl.accel.mixed_precision` applies what is declared and nothing else, so a network that
declares nothing computes in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from jaderl.accel import CacheBlocked, Tanh


def declare_precision(layers: Sequence[nn.Module], pixels: bool = False) -> None:
    """Declare the precision of a stack of layers: the first and the last compute in float32, the ones between in
    bfloat16; with ``pixels`` (8-bit images, nothing to lose) every layer computes in bfloat16."""
    for i, layer in enumerate(layers):
        layer.precision = "bfloat16" if pixels or 0 < i < len(layers) - 1 else "float32"


def mlp(sizes: Sequence[int], activation: type[nn.Module] = nn.ReLU, out_gain: float | None = None) -> CacheBlocked:
    """Linear layers of ``sizes`` with ``activation`` between them; orthogonal init of the last layer if out_gain.
    Large CPU batches run in cache-sized blocks (:class:`~jaderl.accel.CacheBlocked`)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:  # ReLU in place: a Linear's backward needs its input, not its output
            layers.append(nn.ReLU(inplace=True) if activation is nn.ReLU else Tanh() if activation is nn.Tanh
                          else activation())  # Tanh: the function of nn.Tanh, faster on the CPU (jaderl.accel)
    if out_gain is not None:
        nn.init.orthogonal_(layers[-1].weight, out_gain)
        nn.init.zeros_(layers[-1].bias)
    declare_precision(layers[::2])
    return CacheBlocked(*layers)


class ObsNorm(nn.Module):
    """Running mean / variance of observations (Chan et al. parallel update); its buffers are checkpointed."""

    def __init__(self, shape: Sequence[int], enabled: bool, clip: float = 10.0) -> None:
        super().__init__()
        self.enabled, self.clip = enabled, clip
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(1e-4))

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        if not self.enabled:
            return
        batch = obs.reshape(-1, *self.mean.shape).float()
        n, mean = batch.shape[0], batch.mean(0)
        var, delta, total = (batch - mean).square_().mean(0), mean - self.mean, self.count + n  # var(0): 6x slower
        self.var.copy_((self.var * self.count + var * n + delta.square() * self.count * n / total) / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return obs.float()
        scale = (self.var + 1e-8).rsqrt()  # obs * scale - mean * scale: one new tensor of obs's size, clipped in place
        return torch.addcmul(self.mean * -scale, obs.float(), scale).clamp_(-self.clip, self.clip)


class NatureCNN(nn.Module):
    """The image encoder of Mnih et al. 2015 (https://doi.org/10.1038/nature14236): convolutions 32 8x8 stride 4,
    64 4x4 stride 2, 64 3x3 stride 1, then a linear layer of ``out_dim``, each followed by a ReLU.

    Images are (..., C, H, W) or channels-last (..., H, W, C); the layout is read once from ``obs_shape``: the
    channels are the last size when it is smaller than the first (84x84x4), the first otherwise (4x84x84). uint8
    pixels are scaled to [0, 1]; float images are taken as they are. Returns features (..., out_dim).
    """

    def __init__(self, obs_shape: Sequence[int], out_dim: int = 512) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"NatureCNN takes images of 3 dimensions, not observations of shape {tuple(obs_shape)}")
        self.obs_shape, self.channels_last = tuple(obs_shape), obs_shape[2] < obs_shape[0]
        channels, height, width = (obs_shape[2], *obs_shape[:2]) if self.channels_last else tuple(obs_shape)
        if min(height, width) < 36:  # the smallest input the three strided convolutions leave a pixel of
            raise ValueError(f"NatureCNN needs images of at least 36x36 pixels, got {height}x{width}")
        self.conv = nn.Sequential(nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                  nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            conv_dim = self.conv(torch.zeros(1, channels, height, width)).shape[1]
        self.linear, self.out_dim = nn.Sequential(nn.Linear(conv_dim, out_dim), nn.ReLU()), out_dim
        declare_precision([*(m for m in self.conv if isinstance(m, nn.Conv2d)), self.linear[0]], pixels=True)
        self.precision = "float32_output"  # its features reach other code in float32

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[:obs.dim() - 3]
        x = obs.reshape(-1, *self.obs_shape)  # (B, *obs_shape)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        x = x.permute(0, 3, 1, 2) if self.channels_last else x  # (B, C, H, W)
        return self.linear(self.conv(x)).reshape(*lead, self.out_dim)  # lead may be (): one image
