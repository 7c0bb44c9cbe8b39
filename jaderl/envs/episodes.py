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

    def track(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """Add one step's rewards (N,) or (N, agents); ``done`` (N,) ends episodes."""
        self.running[:, :-1] += reward.view(self.running.shape[0], -1)
        self.running[:, -1] += 1
        done_f = done.float()
        self.finished[0] += done_f.sum()
        self.finished[1:] += (self.running * done_f[:, None]).sum(0)
        self.running *= 1.0 - done_f[:, None]

    def new_episode(self) -> torch.Tensor:
        """(N,) bool: the sub-envs about to take the first step of an episode."""
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
