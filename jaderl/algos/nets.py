"""Networks of the algorithms: policies, critics (twin / ensemble critics as one batched module), Q networks.

Each declares the precision of its layers (:func:`jaderl.core.nets.declare_precision`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from jaderl.core.nets import declare_precision, mlp

SHORT_SOFTMAX = 16
"""On the CPU, categorical policies with fewer actions than this compute their log-probabilities in (actions, batch)
layout, where reductions over the actions are vectorised along the batch."""


@torch.no_grad()
def orthogonal_hidden_(net: nn.Module, gain: float) -> None:
    """Orthogonal weights scaled by ``gain`` and zero biases for every ``Linear`` layer of ``net`` but its last, whose
    initialisation its builder chose (a policy's output at gain 0.01, a value's at 1)."""
    for layer in [m for m in net.modules() if isinstance(m, nn.Linear)][:-1]:
        nn.init.orthogonal_(layer.weight, gain)
        layer.bias.zero_()


class CategoricalActor(nn.Module):
    """Discrete policy: logits from an MLP. Sampling and log-probabilities are written out (no Distribution objects,
    whose argument checks cost more than the network on small batches)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], activation: type[nn.Module] = nn.Tanh):
        super().__init__()
        self.net = mlp([obs_dim, *hidden, num_actions], activation, out_gain=0.01)

    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions (B,) drawn by the Gumbel-max trick."""
        logits = self.net(obs)
        return (logits - torch.rand_like(logits).log_().neg_().log_()).argmax(-1)

    def sample_log_prob(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions (...,) drawn as :meth:`sample` draws them, and their log-probabilities (...,), computed as
        :meth:`evaluate` computes them."""
        logits = self.net(obs)
        action = (logits - torch.rand_like(logits).log_().neg_().log_()).argmax(-1)
        return action, self.log_prob_entropy(logits, action)[0]

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability (B,) of ``action`` and the policy's entropy (B,)."""
        return self.log_prob_entropy(self.net(obs), action)

    @staticmethod
    def log_prob_entropy(logits: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability (...,) of ``action`` under ``logits`` (..., actions) and the entropy (...,)."""
        if logits.device.type == "cpu" and logits.shape[-1] < SHORT_SOFTMAX:
            # (actions, B) layout: PyTorch's CPU softmax and sums over a last dim this short run element by element
            # (MAPPO's 19,200 x 5 logits: 4.5 ms forward and backward, 0.9 ms here)
            shape = logits.shape[:-1]
            log_p = F.log_softmax(logits.reshape(-1, logits.shape[-1]).t().contiguous(), 0)
            return log_p.gather(0, action.long().reshape(1, -1)).view(shape), -(log_p.exp() * log_p).sum(0).view(shape)
        log_p = F.log_softmax(logits, -1)
        return log_p.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic action: the most likely one."""
        return self.net(obs).argmax(-1)


class GaussianActor(nn.Module):
    """Continuous policy N(mean(obs), exp(log_std)) with a state-independent log std (PPO, A2C, REINFORCE, VPG)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], activation: type[nn.Module] = nn.Tanh):
        super().__init__()
        self.net = mlp([obs_dim, *hidden, action_dim], activation, out_gain=0.01)
        self.log_std = nn.Parameter(torch.full((action_dim,), -0.5))

    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Unsquashed actions (B, action_dim); the env clips them to [-1, 1]."""
        mean = self.net(obs)
        return mean + self.log_std.exp() * torch.randn_like(mean)

    def sample_log_prob(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unsquashed actions (..., action_dim) drawn as :meth:`sample` draws them, and their log-probabilities
        (...,)."""
        mean = self.net(obs)
        noise = torch.randn_like(mean)
        log_prob = (-0.5 * noise.square() - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return mean + self.log_std.exp() * noise, log_prob

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability (B,) of ``action`` and the policy's entropy (B,)."""
        mean = self.net(obs)
        z = (action - mean) * (-self.log_std).exp()
        log_prob = (-0.5 * z.square() - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum().expand(mean.shape[0])
        return log_prob, entropy

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).clamp(-1.0, 1.0)


class StateDependentNoise:
    """gSDE's noise (Raffin et al. 2022, https://arxiv.org/abs/2005.05719), mixed into the actors that explore with
    it: a linear function z(s) theta of the policy's last hidden layer z(s), with noise weights theta (hidden[-1],
    action_dim) drawn from N(0, sigma^2) for each sub-env (and agent) by :meth:`resample`, which the agent calls at
    the start of every explore() call (and every ``sde_sample_freq`` steps). Between draws a sub-env explores along a
    smooth function of its state instead of with independent noise at every step. For one state, the noise is
    Gaussian with variance sum_j z_j(s)^2 sigma_jk^2 per action dimension k (:meth:`variance`). ``log_std``
    (hidden[-1], action_dim) is learned."""

    log_std: nn.Parameter
    noise: torch.Tensor  # the noise weights (..., hidden[-1], action_dim) of each sub-env; drawn again, not saved

    @torch.no_grad()
    def resample(self, batch_shape: Sequence[int]) -> None:
        """Draw new noise weights for a batch of ``batch_shape`` (sub-envs, or sub-envs x agents)."""
        shape = (*batch_shape, *self.log_std.shape)
        if self.noise.shape != shape:
            self.noise = torch.empty(shape, device=self.log_std.device)
        self.noise.normal_().mul_(self.log_std.exp())

    def state_noise(self, latent: torch.Tensor) -> torch.Tensor:
        """z(s) theta (..., action_dim) with the current noise weights; a batch of another shape than theirs gets
        weights of its own for this call."""
        noise = self.noise
        if noise.shape[:-2] != latent.shape[:-1]:
            noise = torch.randn(*latent.shape[:-1], *self.log_std.shape, device=latent.device) * self.log_std.exp()
        return (latent.detach().unsqueeze(-2) @ noise).squeeze(-2)

    def variance(self, latent: torch.Tensor) -> torch.Tensor:
        """The noise's variance (..., action_dim) in the states whose last hidden layer is ``latent``."""
        return latent.square() @ (2.0 * self.log_std).exp() + 1e-6  # SB3's epsilon


class SDEGaussianActor(StateDependentNoise, GaussianActor):
    """The Gaussian policy with gSDE (:class:`StateDependentNoise`), the exploration of RL Zoo's A2C and PPO entries
    for Pendulum, MountainCarContinuous and some PyBullet tasks, and of its A2C entries for LunarLanderContinuous and
    BipedalWalker: a = mu(s) + z(s) theta, with z(s) taken as a constant (SB3's ``learn_features=False``). For one
    state, the action is Gaussian with mean mu(s) and the noise's variance: that is the distribution :meth:`evaluate`
    scores."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], activation: type[nn.Module] = nn.Tanh):
        super().__init__(obs_dim, action_dim, hidden, activation)
        self.log_std = nn.Parameter(torch.full((hidden[-1], action_dim), -0.5))
        self.register_buffer("noise", torch.empty(0), persistent=False)

    def latent_and_mean(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last hidden layer z(s) (..., hidden[-1]) in float32 (it may be computed in bfloat16:
        ``precision``) and the mean action mu(s) (..., action_dim)."""
        latent = self.net[:-1](obs).float()
        return latent, self.net[-1](latent)

    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Unsquashed actions (..., action_dim) with the current noise weights."""
        latent, mean = self.latent_and_mean(obs)
        return mean + self.state_noise(latent)

    def sample_log_prob(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unsquashed actions (..., action_dim) with the current noise weights, and their log-probabilities (...,)
        under the distribution :meth:`evaluate` scores."""
        latent, mean = self.latent_and_mean(obs)
        noise, var = self.state_noise(latent), self.variance(latent)
        log_prob = (-0.5 * noise.square() / var - 0.5 * var.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
        return mean + noise, log_prob

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability (B,) of ``action`` and the policy's entropy (B,) in each state."""
        latent, mean = self.latent_and_mean(obs)
        var = self.variance(latent.detach())  # (B, action_dim)
        log_var = var.log()
        log_prob = (-0.5 * (action - mean).square() / var - 0.5 * log_var - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + 0.5 * log_var).sum(-1)
        return log_prob, entropy


class TanhGaussianActor(nn.Module):
    """Squashed Gaussian policy a = tanh(u), u ~ N(mean, std) (SAC); log-probabilities include the tanh Jacobian."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *hidden, 2 * action_dim])

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised action (B, action_dim) and its log-probability (B,)."""
        mean, log_std = self.net(obs).chunk(2, -1)
        log_std, noise = log_std.clamp(-5.0, 2.0), torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), squashed_log_prob(u, noise, log_std)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs).chunk(2, -1)[0])


class TanhSDEActor(StateDependentNoise, nn.Module):
    """SAC's squashed policy with gSDE (:class:`StateDependentNoise`), as in RL Zoo's SAC entries that set
    ``use_sde`` (BipedalWalker, the PyBullet tasks): a = tanh(u), u = mu(s) + z(s) theta while exploring, with the
    mean clipped to [-2, 2] (SB3's ``clip_mean``) and the features z(s) learned with the policy (SB3's
    ``learn_features=True``: gradients reach them through the variance).

    :meth:`sample` (the SAC losses) draws u from the per-state distribution the exploring actions have,
    N(mu(s), variance(z(s))), with independent noise per sample, and scores it with the tanh Jacobian as
    :class:`TanhGaussianActor` does. (SB3 draws one theta for the whole batch at every gradient step: the same
    distribution per state, with noise correlated across the batch.)"""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], log_std_init: float = -3.0,
                 clip_mean: float = 2.0) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *hidden, action_dim])
        self.log_std = nn.Parameter(torch.full((hidden[-1], action_dim), log_std_init))
        self.register_buffer("noise", torch.empty(0), persistent=False)
        self.clip_mean = clip_mean

    def latent_and_mean(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last hidden layer z(s) (..., hidden[-1]) in float32 and the clipped mean mu(s) (..., action_dim)."""
        latent = self.net[:-1](obs).float()
        return latent, self.net[-1](latent).clamp(-self.clip_mean, self.clip_mean)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised action (B, action_dim) and its log-probability (B,)."""
        latent, mean = self.latent_and_mean(obs)
        std = self.variance(latent).sqrt()
        noise = torch.randn_like(mean)
        u = mean + std * noise
        return torch.tanh(u), squashed_log_prob(u, noise, std.log())

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions (..., action_dim) with the current noise weights."""
        latent, mean = self.latent_and_mean(obs)
        return torch.tanh(mean + self.state_noise(latent))

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) (B,) of actions a in (-1, 1), e.g. stored ones."""
        latent, mean = self.latent_and_mean(obs)
        log_std = 0.5 * self.variance(latent).log()
        u = torch.atanh(action.clamp(-1 + 1e-3, 1 - 1e-3))  # saturated actions would give atanh -> inf
        return squashed_log_prob(u, (u - mean) * (-log_std).exp(), log_std)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.latent_and_mean(obs)[1])


def squashed_log_prob(u: torch.Tensor, noise: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)) (B,) for u ~ N(mean, std) with ``noise`` = (u - mean) / std: log N(u) - log|d tanh(u)/du|,
    the Jacobian term written stably as 2(log 2 - u - softplus(-2u))."""
    return (-0.5 * noise.square() - log_std - (0.5 * math.log(2 * math.pi) + 2.0 * math.log(2.0))
            + 2.0 * (u + F.softplus(-2.0 * u))).sum(-1)


class EnsembleLinear(nn.Module):
    """``num`` independent linear layers applied in one batched matmul: (E, B, in) -> (E, B, out)."""

    def __init__(self, num: int, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's default init, per member
        self.weight = nn.Parameter(torch.empty(num, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num, 1, out_features).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, members: int | torch.Tensor | None = None, frozen: bool = False) -> torch.Tensor:
        """(E, B, out) for inputs (E, B, in); with ``members`` (one index, or a tensor of M indices) only those
        members' layers (1 or M leading); ``frozen`` lets no gradient reach the weights (it still reaches ``x``)."""
        weight, bias = (self.weight.detach(), self.bias.detach()) if frozen else (self.weight, self.bias)
        if isinstance(members, int):
            weight, bias = weight[members:members + 1], bias[members:members + 1]
        elif members is not None:
            weight, bias = weight.index_select(0, members), bias.index_select(0, members)
        return torch.baddbmm(bias, x, weight)


class EnsembleQ(nn.Module):
    """``num`` critics as one module (twin critics for num=2): Q(s, a) -> (E, B) for continuous actions, or with
    ``action_dim=0, num_outputs=A`` and no action argument, Q(s, .) -> (E, B, A) for A discrete actions."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], num: int = 2, num_outputs: int = 1):
        super().__init__()
        sizes, self.num = [obs_dim + action_dim, *hidden, num_outputs], num
        self.layers = nn.ModuleList(EnsembleLinear(num, sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1))
        declare_precision(self.layers)

    def forward(self, obs: torch.Tensor, action: torch.Tensor | None = None,
                members: int | torch.Tensor | None = None, frozen: bool = False) -> torch.Tensor:
        """Every member's values, or only those of ``members`` (one index: leading size 1; a tensor of M indices:
        M), computing nothing for the others; ``frozen=True`` evaluates the critics as constants (an actor's
        objective), so no gradient or backward work goes to their weights."""
        x = obs if action is None else torch.cat([obs, action], -1)
        num = self.num if members is None else 1 if isinstance(members, int) else members.shape[0]
        x = x.expand(num, -1, -1)  # (E, B, in): the same input for every member, no copy
        for i, layer in enumerate(self.layers):
            x = layer(x, members, frozen)
            if i < len(self.layers) - 1:
                x = F.relu(x, inplace=True)  # baddbmm's backward needs its inputs, not its output
        return x.squeeze(-1) if x.shape[-1] == 1 and action is not None else x


class NoisyLinear(nn.Linear):
    """Linear layer with factorised Gaussian weight noise (Fortunato et al. 2018, https://arxiv.org/abs/1706.10295):
    W = mu_W + sigma_W * f(eps_out) f(eps_in)^T, b = mu_b + sigma_b * f(eps_out), f(x) = sign(x) sqrt(|x|), with new
    noise at every noisy forward; ``noise=False`` uses the means (deterministic acting)."""

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5) -> None:
        super().__init__(in_features, out_features)
        bound = 1.0 / math.sqrt(in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))

    def forward(self, x: torch.Tensor, noise: bool = True) -> torch.Tensor:
        if not noise:
            return F.linear(x, self.weight, self.bias)
        eps = torch.randn(self.in_features + self.out_features, device=x.device)
        eps = eps.sign() * eps.abs().sqrt()
        eps_in, eps_out = eps[: self.in_features], eps[self.in_features:]
        weight = self.weight + self.weight_sigma * torch.outer(eps_out, eps_in)
        return F.linear(x, weight, self.bias + self.bias_sigma * eps_out)


class QNet(nn.Module):
    """Q(s, .) over discrete actions; ``dueling`` splits it into V(s) + A(s, a) - mean_a A(s, a) (Wang et al. 2016);
    ``noisy`` makes every layer a :class:`NoisyLinear` (pass ``noise=True`` to sample it)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], dueling: bool = False,
                 noisy: bool = False) -> None:
        super().__init__()
        linear = NoisyLinear if noisy else nn.Linear
        sizes = [obs_dim, *hidden]
        self.noisy = noisy
        self.body = nn.ModuleList(linear(sizes[i], sizes[i + 1]) for i in range(len(hidden)))
        self.advantage = linear(hidden[-1], num_actions)
        self.value = linear(hidden[-1], 1) if dueling else None
        declare_precision([*self.body, self.advantage])
        if self.value is not None:
            self.value.precision = "float32"

    def forward(self, obs: torch.Tensor, noise: bool = False) -> torch.Tensor:
        kwargs = {"noise": noise} if self.noisy else {}
        h = obs
        for layer in self.body:
            h = F.relu(layer(h, **kwargs))
        adv = self.advantage(h, **kwargs)
        if self.value is None:
            return adv
        return self.value(h, **kwargs) + adv - adv.mean(-1, keepdim=True)


class EncodedNet(nn.Module):
    """``head(encoder(obs), **kwargs)``: a network that owns its encoder, so that a copy of it (a target network)
    gets its own encoder too."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, obs: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.head(self.encoder(obs), **kwargs)


class Temperature(nn.Module):
    """SAC's learned entropy coefficient alpha = exp(log_alpha), a module so that it is stated like any network."""

    def __init__(self, init_alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(float(init_alpha)).log())

    def forward(self) -> torch.Tensor:
        return self.log_alpha.exp()
