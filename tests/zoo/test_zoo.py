"""The tuned-settings zoo: every entry is a valid config, covers the demo tasks, and is applied below given settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import jaderl
from jaderl import zoo
from jaderl.algos import ALGOS, action_spaces
from jaderl.cli import main
from jaderl.core.config import ConfigError


@pytest.mark.parametrize("entry", zoo.entries(), ids=lambda e: f"{e.algo}-{e.task}")
def test_every_entry_is_a_valid_config_on_each_of_its_envs(entry: zoo.ZooEntry) -> None:
    assert entry.measured, f"{entry.source}: {entry.algo} says nothing of what it reached"
    assert "total_steps" in entry.settings, f"{entry.source}: {entry.algo} states no budget"
    for env in entry.envs:
        config = jaderl.make_config(entry.algo, env)
        for key, value in entry.settings.items():
            assert getattr(config, key) == value, (entry.source, entry.algo, key)
        for key, goes in entry.together.items():  # a misspelt name would leave nothing out
            assert hasattr(config, key) and goes and set(goes) <= set(entry.settings), (entry.source, entry.algo, key)


def test_every_single_agent_algorithm_has_an_entry_on_cartpole_or_pendulum() -> None:
    """The 19 (algorithm, task) pairs of the classic demo tasks: discrete actions on CartPole, continuous on
    Pendulum, each on Gymnasium's id and jaderl's torch twin."""
    pairs = [(name, env) for name, spec in ALGOS.items() for kind, env in (("discrete", "CartPole-v1"),
                                                                          ("continuous", "Pendulum-v1"))
             if kind in action_spaces(spec.agent_cls)]
    assert len(pairs) == 19
    missing = [(algo, env) for algo, env in pairs for env in (env, f"jaderl/{env}") if zoo.lookup(algo, env) is None]
    assert not missing


def test_task_files_name_their_envs_and_only_registered_algorithms() -> None:
    for task, data in zoo.tasks().items():
        assert data["envs"], task
        unknown = set(data) - set(zoo.META_KEYS) - set(jaderl.api.ALGOS)
        assert not unknown, f"jaderl/zoo/{task}.yaml: unknown algorithms {unknown}"


def test_make_config_applies_the_entry_below_given_settings() -> None:
    entry = zoo.lookup("ppo", "jaderl/CartPole-v1")
    assert entry is not None and entry.target == 475
    default = jaderl.make_config("ppo", "jaderl/CartPole-v1", zoo=False)
    tuned = jaderl.make_config("ppo", "jaderl/CartPole-v1")
    assert tuned.zoo and not default.zoo
    assert tuned.horizon == entry.settings["horizon"] != default.horizon
    assert tuned.total_steps == entry.settings["total_steps"]
    given = jaderl.make_config("ppo", "jaderl/CartPole-v1", horizon=4, minibatch_size=64)
    assert given.horizon == 4 and given.num_epochs == entry.settings["num_epochs"]
    # presets stay: double_dqn's entry does not undo double=True
    assert jaderl.make_config("double_dqn", "CartPole-v1").double


def test_a_given_setting_leaves_out_the_entry_settings_that_go_with_it() -> None:
    """dqn's CartPole entry Polyak-averages its target after every gradient step: a user's own interval asks for
    copies, so tau stays at its default; a user's own tau keeps the entry's interval. gSDE's log_std_init goes too
    when use_sde is given."""
    plain = jaderl.make_config("dqn", "CartPole-v1", zoo=False)
    tuned = jaderl.make_config("dqn", "CartPole-v1")
    assert (tuned.target_update_every, tuned.tau) == (1, 0.02) and plain.tau == 1.0
    copies = jaderl.make_config("dqn", "CartPole-v1", target_update_every=100)
    assert (copies.target_update_every, copies.tau) == (100, plain.tau)
    assert copies.n_step == tuned.n_step  # the rest of the entry stays
    polyak = jaderl.make_config("dqn", "CartPole-v1", tau=0.005)
    assert (polyak.target_update_every, polyak.tau) == (1, 0.005)
    assert jaderl.make_config("dqn", "CartPole-v1", target_update_every=10, tau=0.5).tau == 0.5  # both given
    gaussian = jaderl.make_config("a2c", "BipedalWalker-v3", use_sde=False)
    assert not gaussian.use_sde and gaussian.log_std_init == jaderl.make_config("a2c", "BipedalWalker-v3",
                                                                                zoo=False).log_std_init
    assert jaderl.make_config("a2c", "BipedalWalker-v3").log_std_init == -2.0
    entry = zoo.lookup("dqn", "CartPole-v1")
    assert entry is not None and entry.left_out(["target_update_every"]) == ["tau"]
    assert entry.left_out(["tau"]) == [] and entry.left_out(["target_update_every", "tau"]) == []


def test_lookup_ignores_env_options_and_misses_cleanly() -> None:
    assert zoo.lookup("maddpg", "jaderl/simple_spread?continuous=true") is zoo.lookup("maddpg", "jaderl/simple_spread")
    assert zoo.lookup("ppo", "jaderl/Acrobot-v1") is None
    assert jaderl.make_config("ppo", "jaderl/Acrobot-v1") == jaderl.make_config("ppo", "jaderl/Acrobot-v1", zoo=True)


def test_a_malformed_zoo_setting_is_one_sentence() -> None:
    with pytest.raises(ConfigError, match="zoo"):
        jaderl.make_config("ppo", "jaderl/CartPole-v1", zoo="no")


def _train_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["train", *argv])
    return code, capsys.readouterr().err


def test_cli_says_which_zoo_entry_it_used_and_no_zoo_leaves_it_out(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    small = ["--device", "cpu", "--total-steps", "1024", "--eval-episodes", "2"]
    code, err = _train_cli(["ppo", "jaderl/CartPole-v1", "--run-dir", str(tmp_path / "zoo"), *small], capsys)
    assert code == 0
    line = next(line for line in err.splitlines() if line.startswith("zoo:"))
    assert "jaderl/zoo/cartpole.yaml" in line and "horizon=16" in line and "total_steps" not in line  # given: left out
    saved = yaml.safe_load((tmp_path / "zoo" / "config.yaml").read_text())
    assert saved["zoo"] is True and saved["horizon"] == 16
    code, err = _train_cli(["ppo", "jaderl/CartPole-v1", "--run-dir", str(tmp_path / "plain"), "--no-zoo", *small],
                           capsys)
    assert code == 0 and "zoo:" not in err
    saved = yaml.safe_load((tmp_path / "plain" / "config.yaml").read_text())
    assert saved["zoo"] is False
    assert saved["horizon"] == jaderl.make_config("ppo", "jaderl/CartPole-v1", zoo=False).horizon
    code, err = _train_cli(["dqn", "jaderl/CartPole-v1", "--run-dir", str(tmp_path / "dqn"), "--set",
                            "target_update_every=100", *small], capsys)
    assert code == 0
    line = next(line for line in err.splitlines() if line.startswith("zoo:"))
    assert "n_step=3" in line and "tau" not in line.split(";")[0]
    assert line.endswith("; its tau left out too: it goes with its target_update_every, which you set")
    saved = yaml.safe_load((tmp_path / "dqn" / "config.yaml").read_text())
    assert (saved["target_update_every"], saved["tau"]) == (100, 1.0)


def test_the_docs_page_lists_every_entry() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "zoo.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    missing = [(e.task, e.algo) for e in zoo.entries()
               if not any(row.startswith(f"| {e.task} |") and f"| {e.algo} |" in row and e.measured in row
                          for row in rows)]
    assert not missing, f"docs/zoo.md does not list (or has an old measured line of) {missing}"
