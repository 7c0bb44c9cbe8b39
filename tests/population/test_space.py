"""Search spaces (jaderl.population.space): parsing, validation against the algorithm's ranges, sampling, explore."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from jaderl.algos.ppo import PPO
from jaderl.algos.sac import SAC
from jaderl.api import ALGOS, make_config
from jaderl.core.config import ConfigError
from jaderl.envs.vec import EnvSpec
from jaderl.population.cluster import Resources
from jaderl.population.pbt import PBTSettings
from jaderl.population.space import Dimension, default_space, explore, live_hyperparameters, parse_space, sample


def test_default_space_is_the_algorithms_mutable_hyperparameters() -> None:
    space = default_space(PPO)
    assert set(space) == set(PPO.hyperparameters)
    assert space["lr"].kind == "loguniform" and space["clip_ratio"].kind == "uniform"
    assert (space["lr"].low, space["lr"].high) == (PPO.hyperparameters["lr"].low, PPO.hyperparameters["lr"].high)


def test_parse_space_reads_every_kind() -> None:
    space = parse_space(SAC, ["lr=loguniform:1e-4:1e-2", "gamma=uniform:0.95:0.999", "tau=choice:0.01:0.005:0.01"])
    assert space["lr"] == Dimension("loguniform", 1e-4, 1e-2)
    assert space["gamma"] == Dimension("uniform", 0.95, 0.999)
    assert space["tau"].values == (0.005, 0.01)  # sorted, duplicates dropped
    assert parse_space(SAC, {"lr": "uniform:0.001:0.002"})["lr"].kind == "uniform"


@pytest.mark.parametrize(("entry", "words"), [
    ("foo=uniform:1:2", "foo is not a hyperparameter PPO can change"),
    ("lr=loguniform:1e-2:1e-3", "empty range"),
    ("lr=uniform:0.1:0.1", "empty range"),
    ("lr=gaussian:0:1", "unknown distribution 'gaussian'"),
    ("lr=loguniform:0:1e-3", "positive bounds"),
    ("lr=uniform:a:b", "must be numbers"),
    ("gamma=uniform:0.5:0.99", "outside the valid range of gamma"),
    ("lr", "is not NAME=KIND:LOW:HIGH"),
    ("clip_ratio=choice", "empty choice"),
    ("lr=choice:0.001:nan", "finite numbers"),  # NaN passed the range check: members started with lr=nan
    ("lr=uniform:nan:0.01", "finite numbers"),
])
def test_a_bad_space_is_one_sentence(entry: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        parse_space(PPO, [entry])
    assert "\n" not in str(info.value)


def test_a_hyperparameter_given_two_ranges_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--space names lr twice; give each hyperparameter one range$"):
        parse_space(PPO, ["lr=loguniform:1e-4:1e-3", "gamma=uniform:0.95:0.99", "lr=uniform:0.01:0.02"])


def test_sample_and_explore_stay_in_range() -> None:
    space = parse_space(PPO, ["lr=loguniform:1e-4:1e-2", "clip_ratio=choice:0.1:0.2:0.3"])
    rng = random.Random(0)
    values = [sample(space, rng) for _ in range(200)]
    lrs = [v["lr"] for v in values]
    assert all(1e-4 <= x <= 1e-2 for x in lrs)
    assert sum(x < 1e-3 for x in lrs) in range(70, 131)  # log-uniform: half the draws below the geometric middle
    assert {v["clip_ratio"] for v in values} == {0.1, 0.2, 0.3}
    for _ in range(200):  # perturbed: x0.8 or x1.2, clipped to the range; a choice moves to a neighbour
        new = explore(space, {"lr": 5e-3, "clip_ratio": 0.2}, rng, resample_probability=0.0)
        assert math.isclose(new["lr"], 4e-3) or math.isclose(new["lr"], 6e-3)
        assert new["clip_ratio"] in (0.1, 0.3)
    assert explore(space, {"lr": 9.5e-3, "clip_ratio": 0.3}, random.Random(1), 0.0)["lr"] <= 1e-2
    resampled = {explore(space, {"lr": 5e-3, "clip_ratio": 0.2}, rng, 1.0)["lr"] for _ in range(20)}
    assert len(resampled) == 20 and not any(math.isclose(x, 4e-3) or math.isclose(x, 6e-3) for x in resampled)


def test_resources_per_member() -> None:
    assert Resources.parse("cpu=1,gpu=0.25") == Resources(1.0, 0.25)
    assert Resources.parse("") == Resources()
    assert Resources().options(4, {"CPU": 2.0}) == {"num_cpus": 0.5, "num_gpus": 0.0}
    assert Resources(cpu=1).options(2, {"CPU": 2.0}) == {"num_cpus": 1.0, "num_gpus": 0.0}
    with pytest.raises(ConfigError, match="3 members at cpu=1 need 3 CPUs, but the cluster has 2 CPUs"):
        Resources(cpu=1).options(3, {"CPU": 2.0})
    with pytest.raises(ConfigError, match="GPUs"):
        Resources(gpu=0.5).options(4, {"CPU": 8.0, "GPU": 1.0})
    for bad in ("cpu", "tpu=1", "cpu=x", "cpu=0", "gpu=-1", "cpu=nan", "gpu=nan", "cpu=inf"):
        with pytest.raises(ConfigError, match="resources-per-member"):
            Resources.parse(bad)


def test_without_ray_one_sentence_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from jaderl.population.cluster import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ConfigError, match=r"populations run on Ray, which is not installed; install it with "
                                          r"pip install 'jaderl\[ray\]'"):
        require_ray()


def test_every_error_that_says_a_members_process_is_gone_is_caught_as_such() -> None:
    """Ray's memory monitor and a lost node end an actor with errors that are not ``RayActorError``s; the drivers
    treat them as a dead member (restarted, or out of the tournament) rather than stop with a traceback."""
    ray = pytest.importorskip("ray")
    from jaderl.population.cluster import process_gone

    gone = process_gone(ray)
    assert {ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError, ray.exceptions.NodeDiedError} <= set(gone)
    assert not issubclass(ray.exceptions.OutOfMemoryError, ray.exceptions.RayActorError)  # why the tuple is needed
    assert isinstance(ray.exceptions.ActorDiedError(), gone)


@pytest.mark.parametrize(("algo", "env", "settings", "dead"), [
    ("reinforce", "jaderl/CartPole-v1", {}, {"vf_coef"}),  # no baseline: no value loss to weigh
    ("vpg", "jaderl/CartPole-v1", {}, set()),  # (REINFORCE with a baseline)
    ("reinforce", "jaderl/CartPole-v1", {"baseline": True}, set()),
    ("noisy_dqn", "jaderl/CartPole-v1", {}, {"epsilon_end"}),  # noisy layers alone explore: epsilon stays 0
    ("dqn", "jaderl/CartPole-v1", {"noisy": True}, set()),  # noisy layers and epsilon-greedy
    ("dqn", "jaderl/CartPole-v1", {}, set()),
    ("maddpg", "jaderl/simple_spread", {}, {"exploration_noise", "target_noise"}),  # Gumbel-max samples explore
    ("matd3", "jaderl/simple_spread", {}, {"exploration_noise", "target_noise"}),
    ("maddpg", "jaderl/simple_spread?continuous=true", {}, {"target_noise"}),  # 0: no target smoothing
    ("matd3", "jaderl/simple_spread?continuous=true", {}, set()),
    ("ddpg", "jaderl/Pendulum-v1", {}, {"target_noise"}),  # a draw of it would smooth DDPG's target as TD3 does
    ("td3", "jaderl/Pendulum-v1", {}, set()),
    ("ddpg", "jaderl/Pendulum-v1", {"noise": "ou"}, {"target_noise", "exploration_noise"}),  # OU: ou_sigma explores
])
def test_default_space_leaves_out_hyperparameters_without_effect(algo: str, env: str, settings: dict[str, Any],
                                                                 dead: set[str]) -> None:
    """Without --space a population searches the mutable hyperparameters that change its members' training: PBT's
    draws and perturbations of one that changes nothing in their configuration would be spent on nothing."""
    agent_cls = ALGOS[algo].agent_cls
    space = PBTSettings(algo, env, settings=dict(settings)).validate()
    assert set(space) == set(agent_cls.hyperparameters) - dead
    assert dead <= set(agent_cls.hyperparameters)
    assert set(default_space(agent_cls)) == set(agent_cls.hyperparameters)  # (without a config: all of them)
    for name in dead:  # named in --space, it is searched as before
        bounds = agent_cls.hyperparameters[name]
        explicit = PBTSettings(algo, env, space={name: f"uniform:{bounds.low}:{bounds.high}"},
                               settings=dict(settings)).validate()
        assert set(explicit) == {name}


def test_a_tournament_searches_each_algorithms_live_hyperparameters(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """Several algorithms without --space: each member is searched over its own algorithm's hyperparameters that
    change its training (reinforce without vf_coef, vpg with it)."""
    import contextlib
    import importlib

    tournament_module = importlib.import_module("jaderl.population.tournament")  # (the package exports the function)

    spaces: dict[str, dict[str, Any]] = {}

    class Recorder:
        def __init__(self, *args: Any) -> None:
            spaces.update(args[5])

        def run(self, *args: Any) -> None:
            return None

    ray = type("Ray", (), {"cluster_resources": staticmethod(lambda: {"CPU": 2.0})})()
    monkeypatch.setattr(tournament_module, "connected", lambda *a: contextlib.nullcontext(ray))
    monkeypatch.setattr(tournament_module, "_Tournament", Recorder)
    tournament_module.tournament(["reinforce", "vpg"], "jaderl/CartPole-v1", pool=2, run_dir=str(tmp_path / "t"))
    hyperparameters = set(ALGOS["reinforce"].agent_cls.hyperparameters)
    assert set(spaces["reinforce"]) == hyperparameters - {"vf_coef"} and set(spaces["vpg"]) == hyperparameters


def test_an_algorithm_without_its_own_live_hyperparameters_searches_all_of_them() -> None:
    spec = EnvSpec(num_envs=1, obs_shape=(3,), is_discrete=True, action_dim=2)
    assert live_hyperparameters(PPO, make_config("ppo", "jaderl/CartPole-v1"), spec) == PPO.hyperparameters
