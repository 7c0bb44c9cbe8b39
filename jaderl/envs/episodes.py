"""Statistics of the episodes a batched env produces while an agent explores it."""

from __future__ import annotations

import torch


class EpisodeStats:
    """The training episodes: running return (per agent) and length of every sub-env's episode, and their sums over
    the episodes finished since the last :meth:`summary`. Several agents' rewards make a team return (their sum)."""

    def __init__(self, num_envs: int, num_agents: int, device: torch.device, teams: tuple[str, ...] = ()) -> None:
        self.teams = teams
        self.running = torch.zeros(num_envs, num_agents + 1, device=device)  # each agent's return, the length
        self.finished = torch.zeros(num_agents + 2, device=device)  # count, each agent's summed return, summed length
        self.last_step: tuple[torch.Tensor, torch.Tensor] | None = None
        """(terminated, truncated) of the last step of an explore in progress, which :meth:`track` has not seen yet
        (None between explores)."""

    def track(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """Add a rollout's rewards (T, N) or (T, N, agents); ``done`` (T, N) ends episodes. Batched over time: an
        episode that ends in the rollout owns every step up to its end, and the steps after a sub-env's last episode
        end start its running episode."""
        steps, num_envs = done.shape
        reward = reward.reshape(steps, num_envs, -1)
        step = torch.cat([reward, torch.ones_like(reward[..., :1])], -1)  # (T, N, agents + 1): rewards, one step
        ends = done.flip(0).cumsum(0).flip(0) > 0  # (T, N): an episode of this sub-env ends at this step or later
        owned = step * ends.unsqueeze(-1)
        ended = ends[0].unsqueeze(-1)  # (N, 1): the sub-env finished an episode in the rollout
        self.finished[0] += done.sum()
        self.finished[1:] += (owned.sum(0) + self.running * ended).sum(0)
        self.running.mul_(~ended).add_((step - owned).sum(0))
        self.last_step = None

    def new_episode(self) -> torch.Tensor:
        """(N,) bool: the sub-envs about to take the first step of an episode (also between the steps of an explore
        in progress)."""
        if self.last_step is not None:
            terminated, truncated = self.last_step
            return terminated | truncated
        return self.running[:, -1] == 0

    def take(self) -> torch.Tensor:
        """The finished sums, cleared here (an explorer process sends them to the learner, which :meth:`add` s them)."""
        finished = self.finished.clone()
        self.finished.zero_()
        return finished

    def add(self, finished: torch.Tensor) -> None:
        self.finished += finished.to(self.finished.device)

    def summary(self) -> dict[str, float]:
        """Mean team return and length of the episodes finished since the last call, with the mean return per agent
        and per team when there are several agents (host sync: logging only)."""
        count, *returns, length = self.take().tolist()
        if not count:
            return {}
        returns = [r / count for r in returns]
        stats = {"train/episode_return": sum(returns), "train/episode_length": length / count}
        if len(returns) > 1:
            stats["train/episode_return_per_agent"] = sum(returns) / len(returns)
            for team in dict.fromkeys(self.teams):
                stats[f"train/episode_return/{team}"] = sum(r for r, t in zip(returns, self.teams, strict=True)
                                                             if t == team)
        return stats

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"running": self.running, "finished": self.finished}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.running.copy_(state["running"])
        self.finished.copy_(state["finished"])
