"""Multi-agent algorithms: one file per family (MAPPO/IPPO, QMIX/VDN/IQL, MADDPG/MATD3); :data:`MARL_ALGOS` is
their part of the registry (:data:`jaderl.api.ALGOS` joins it to the single-agent algorithms)."""

from __future__ import annotations

from jaderl.algos import AlgoSpec
from jaderl.marl import maddpg, ppo, value

MARL_ALGOS: dict[str, AlgoSpec] = {**ppo.ENTRIES, **value.ENTRIES, **maddpg.ENTRIES}
"""Registry name -> agent class, preset and summary, as :data:`jaderl.algos.ALGOS`."""

__all__ = ["MARL_ALGOS"]
