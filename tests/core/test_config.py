"""Tests of jaderl.core.config and the algorithm configs: validation, YAML round trip, --set parsing."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import yaml

from jaderl.algos import ALGOS, DQNConfig, PPOConfig, SACConfig
from jaderl.api import make_config
from jaderl.core.config import Config, ConfigError, parse_assignment

CONFIG_CLASSES = [Config, PPOConfig, SACConfig, DQNConfig]


@pytest.mark.parametrize("cls", CONFIG_CLASSES)
def test_defaults_are_valid_and_typed(cls: type[Config]) -> None:
    config = cls()
    assert isinstance(config.hidden, list) and all(isinstance(h, int) for h in config.hidden)
    assert isinstance(config.lr, float) and isinstance(config.total_steps, int)


@pytest.mark.parametrize("cls", CONFIG_CLASSES)
def test_yaml_round_trip(cls: type[Config], tmp_path: Path) -> None:
    config = cls(seed=7, lr=1e-5, hidden=[17, 5], target_return=123.5, time_limit=3.0, normalize_obs=True,
                 gamma=0.9, device="cpu", env="CartPole-v1")
    path = tmp_path / "config.yaml"
    config.save_yaml(path)
    assert isinstance(yaml.safe_load(path.read_text()), dict)
    loaded = cls.from_dict(Config.read_yaml(path))
    assert loaded == config
    assert type(loaded.lr) is float and type(loaded.seed) is int and loaded.hidden == [17, 5]
    assert cls.from_dict(config.to_dict()) == config


def test_every_field_has_help() -> None:
    for cls in CONFIG_CLASSES:
        for field in dataclasses.fields(cls):
            assert field.metadata.get("help"), f"{cls.__name__}.{field.name} has no help text"


def test_lossless_coercions() -> None:
    config = Config(total_steps=1e4, lr=1, hidden=(8, 4))  # type: ignore[arg-type]
    assert config.total_steps == 10_000 and type(config.total_steps) is int
    assert config.lr == 1.0 and type(config.lr) is float
    assert config.hidden == [8, 4]


@pytest.mark.parametrize(("field", "value"), [
    ("total_steps", 1.5),        # would lose information
    ("total_steps", "100"),      # a string is not an int
    ("seed", True),              # bool is not an int
    ("lr", "fast"),
    ("lr", True),
    ("normalize_obs", 1),        # int is not a bool
    ("hidden", [64, "a"]),
    ("hidden", 64),
    ("hidden", [64.5]),
    ("env", 3),
    ("target_return", "high"),
])
def test_bad_types_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}=.*invalid: expected"):
        Config(**{field: value})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["lr", "gamma", "reward_scale", "target_return", "time_limit", "max_grad_norm"])
def test_nan_and_infinity_are_rejected(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}={value} is invalid: expected a finite number$"):
        Config(**{field: value})


def test_numbers_too_large_for_a_float_name_the_field(tmp_path: Path) -> None:
    """1e400 reads as infinity; an integer of 400 digits has no float (its conversion would raise OverflowError),
    and one of 5,000 digits cannot even be read: each is one sentence."""
    big = "1" + "0" * 400
    for settings, shown in ((dict([parse_assignment("lr=1e400")]), "lr=inf"),
                            (dict([parse_assignment(f"lr={big}")]), "lr=1.000e+400"),
                            ({"lr": -(10**400)}, "lr=-1.000e+400"),
                            ({"target_return": 10**5000}, "target_return=1.000e+5000")):
        with pytest.raises(ConfigError, match=rf"^{re.escape(shown)} is invalid: expected a finite number$"):
            Config.from_dict(settings)
    (tmp_path / "c.yaml").write_text(f"lr: {big}\n")
    with pytest.raises(ConfigError, match=r"^lr=1.000e\+400 is invalid: expected a finite number$"):
        Config.from_dict(Config.read_yaml(tmp_path / "c.yaml"))
    huge = "1" + "0" * 5000  # more digits than Python turns into an int
    (tmp_path / "huge.yaml").write_text(f"lr: {huge}\n")
    with pytest.raises(ConfigError, match=r"^cannot read config file .*huge.yaml: "):
        Config.read_yaml(tmp_path / "huge.yaml")
    with pytest.raises(ConfigError, match=r"^--set 'lr=1000.*: cannot read the value"):
        parse_assignment(f"lr={huge}")


def test_integers_too_large_for_int64_name_the_field() -> None:
    """Integer settings end up in torch and NumPy as 64-bit integers: a larger one (or a float of that size) is one
    sentence naming the field, not an overflow deep inside a run's set-up."""
    big = 10**50
    for settings, match in (({"seed": big}, r"^seed=1e\+50 is invalid: expected an int below 2\*\*63 in size"),
                            ({"total_steps": 2**63}, r"^total_steps=9223372036854775808 is invalid: expected an int "),
                            ({"total_steps": 1e30}, r"^total_steps=1e\+30 is invalid: expected an int "),
                            ({"total_steps": 1e99}, r"^total_steps=1e\+99 is invalid: expected an int "),
                            ({"horizon": 1e99}, r"^horizon=1e\+99 is out of range: it must be >= 1 and <= 100000$"),
                            ({"hidden": [64, big]}, r"^hidden=\[64, 1000+\] is invalid: expected a list of integers, "
                                                    r"each below 2\*\*63 in size$")):
        with pytest.raises(ConfigError, match=match):
            make_config("ppo", "jaderl/CartPole-v1", **settings)
    assert make_config("ppo", "jaderl/CartPole-v1", seed=2**63 - 1).seed == 2**63 - 1


def test_infinite_policy_settings_are_rejected_before_a_run_starts() -> None:
    """An infinite initial log-std would fail only mid-run, blamed on the env's rewards."""
    with pytest.raises(ConfigError, match=r"^log_std_init=inf is invalid"):
        make_config("ppo", "jaderl/Pendulum-v1", log_std_init=parse_assignment("log_std_init=.inf")[1])


@pytest.mark.parametrize(("cls", "field", "value", "accepted"), [
    (Config, "lr", -1e-3, "> 0.0"),
    (Config, "lr", 0.0, "> 0.0"),
    (Config, "gamma", 1.5, ">= 0.0 and <= 1.0"),
    (Config, "gamma", -0.1, ">= 0.0 and <= 1.0"),
    (Config, "num_envs", 0, ">= 1"),
    (Config, "seed", -1, ">= 0"),
    (Config, "time_limit", 0, "> 0"),
    (Config, "max_grad_norm", -1.0, ">= 0.0"),
    (PPOConfig, "gae_lambda", 2.0, "<= 1.0"),
    (PPOConfig, "clip_ratio", 0.0, "> 0.0"),
    (SACConfig, "tau", 0.0, "> 0.0"),
    (SACConfig, "num_critics", 0, ">= 1"),
    (DQNConfig, "epsilon_end", 1.5, "<= 1.0"),
    (DQNConfig, "warmup_steps", -5, ">= 0"),
    (PPOConfig, "horizon", 10**20, "<= 100000"),  # a rollout is held in memory: this one would grow without end
    (Config, "horizon", 100_001, "<= 100000"),
])
def test_out_of_range_names_field_and_range(cls: type[Config], field: str, value: float, accepted: str) -> None:
    with pytest.raises(ConfigError) as info:
        cls(**{field: value})
    message = str(info.value)
    assert message.startswith(f"{field}=") and "out of range" in message and accepted in message
    assert "\n" not in message


def test_boundaries_are_accepted() -> None:
    config = Config(gamma=1.0, seed=0, max_grad_norm=0.0, num_envs=1)
    assert config.gamma == 1.0
    assert DQNConfig(warmup_steps=0, tau=1.0).tau == 1.0
    # the learner of an on-policy pipeline learns from every explorer's rollout: 8 * 2 * 32 = 512 transitions
    assert PPOConfig(num_envs=8, horizon=32, workers=2, minibatch_size=512).minibatch_size == 512
    assert PPOConfig(num_envs=1, horizon=1, minibatch_size=1, normalize_advantages=False).minibatch_size == 1


@pytest.mark.parametrize(("cls", "settings", "names"), [
    (DQNConfig, {"batch_size": 128, "buffer_size": 64}, ("batch_size", "buffer_size")),
    (SACConfig, {"batch_size": 512, "buffer_size": 100}, ("batch_size", "buffer_size")),
    (PPOConfig, {"minibatch_size": 1000, "num_envs": 4, "horizon": 8}, ("minibatch_size",)),
    (PPOConfig, {"minibatch_size": 1000, "num_envs": 4, "horizon": 8, "workers": 2},
     ("minibatch_size", "num_envs * workers * horizon = 64")),
    (PPOConfig, {"minibatch_size": 1, "num_envs": 1, "horizon": 1}, ("normalize_advantages=true", "minibatch_size")),
    (Config, {"hidden": []}, ("hidden",)),
    (Config, {"hidden": [64, 0]}, ("hidden",)),
    (Config, {"device": "tpu"}, ("device",)),
])
def test_cross_field_checks(cls: type[Config], settings: dict, names: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        cls(**settings)
    assert all(name in str(info.value) for name in names)


def test_unknown_field_lists_accepted_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown field 'learning_rate' for PPOConfig.*clip_ratio"):
        PPOConfig.from_dict({"learning_rate": 0.1})
    with pytest.raises(ConfigError, match="unknown field 'batch_size'"):
        PPOConfig.from_dict({"batch_size": 64})  # a DQN/SAC field, not a PPO one


def test_replace_validates() -> None:
    config = DQNConfig(buffer_size=1000)
    assert config.replace(batch_size=32).batch_size == 32
    assert config.batch_size == 64  # replace returns a new config
    with pytest.raises(ConfigError, match="batch_size"):
        config.replace(batch_size=5000)
    with pytest.raises(ConfigError, match="unknown field"):
        config.replace(nope=1)


def test_presets_are_valid() -> None:
    for name, spec in ALGOS.items():
        config = spec.agent_cls.config_cls.from_dict({**spec.preset, "algo": name})
        assert config.algo == name


def test_read_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        Config.read_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1, 2\nseed: 3\n")
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        Config.read_yaml(bad)
    assert "\n" not in str(info.value)
    assert str(info.value) == f"cannot read config file {bad}: expected ',' or ']', but got ':' (line 2)"
    listed = tmp_path / "list.yaml"
    listed.write_text("- lr\n- seed\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        Config.read_yaml(listed)


@pytest.mark.parametrize(("text", "expected"), [
    ("lr=0.001", ("lr", 0.001)),
    ("lr=1e-3", ("lr", 0.001)),          # the docstring's own example
    ("total_steps=2e5", ("total_steps", 200_000.0)),
    ("hidden=[64,64]", ("hidden", [64, 64])),
    ("normalize_obs=true", ("normalize_obs", True)),
    ("target_return=null", ("target_return", None)),
    ("env=CartPole-v1", ("env", "CartPole-v1")),
    ("run_dir=a=b", ("run_dir", "a=b")),
    ("seed=3", ("seed", 3)),
])
def test_parse_assignment(text: str, expected: tuple) -> None:
    assert parse_assignment(text) == expected


def test_parsed_assignments_build_configs() -> None:
    settings = dict(parse_assignment(t) for t in ["lr=1e-3", "total_steps=2e5", "hidden=[32,32]", "gamma=0.5"])
    config = PPOConfig.from_dict(settings)
    assert config.lr == 0.001 and config.total_steps == 200_000 and config.hidden == [32, 32]


def test_yaml_file_with_exponent_floats(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("lr: 3e-4\ntotal_steps: 1e5\n")
    config = Config.from_dict(Config.read_yaml(path))
    assert config.lr == 3e-4 and config.total_steps == 100_000


def test_strings_that_read_as_exponent_floats_survive_the_yaml_round_trip(tmp_path: Path) -> None:
    config = Config(run_dir="1e5", env="2E-3", algo="+1e5")
    config.save_yaml(tmp_path / "config.yaml")
    assert Config.from_dict(Config.read_yaml(tmp_path / "config.yaml")) == config
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["run_dir"] == "1e5"  # PyYAML's own reading too


@pytest.mark.parametrize("text", ["lr", "=3", "", "hidden=[64,"])
def test_parse_assignment_malformed(text: str) -> None:
    with pytest.raises(ConfigError, match="--set"):
        parse_assignment(text)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_config_files_are_valid(path: Path) -> None:
    algo = path.name.split("_")[0]
    config = make_config(algo, "jaderl/Pendulum-v1", **Config.read_yaml(path))
    assert config.algo == algo
