"""Populations on Ray: population-based training, fusion and ensembles of agents (Ray is imported only here).

    >>> from jaderl.population import pbt
    >>> result = pbt("ppo", "jaderl/CartPole-v1", members=8, period=20_000, generations=10,
    ...              space=["lr=loguniform:1e-4:1e-2"], run_dir="runs/pbt-cartpole")
    >>> result.best_run_dir                       # an ordinary run directory: jaderl eval / jaderl.load accept it

See docs/population.md.
"""

from jaderl.population.cluster import PopulationError, Resources
from jaderl.population.ensemble import Ensemble, fuse_runs
from jaderl.population.pbt import PBTResult, PBTSettings, pbt, resume_pbt
from jaderl.population.space import Dimension, default_space, parse_space
from jaderl.population.tournament import Leaderboard, TournamentResult, resume_tournament, tournament

__all__ = ["Dimension", "Ensemble", "Leaderboard", "PBTResult", "PBTSettings", "PopulationError", "Resources",
           "TournamentResult", "default_space", "fuse_runs", "parse_space", "pbt", "resume_pbt",
           "resume_tournament", "tournament"]
