"""Tests of data-parallel learners (jaderl.parallel.ddp): gradient averaging and state merging against single-process
references (in threads joined by a gloo group), then real runs of 2 learner processes with gloo on CPU: identical
state on every learner, global step counts, checkpoint + resume, the CLI, failures reported by learner, Ctrl-C,
SIGTERM."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from jaderl.algos.base import ReturnNorm
from jaderl.algos.ppo import PPO
from jaderl.algos.sac import SAC
from jaderl.api import ALGOS, make_config
from jaderl.cli import main
from jaderl.core.buffers import RolloutBuffer
from jaderl.core.checkpoint import CHECKPOINT_JSON, load_checkpoint
from jaderl.core.config import ConfigError
from jaderl.core.loop import TrainingError
from jaderl.core.nets import ObsNorm
from jaderl.envs import make_env
from jaderl.envs.vec import EnvError
from jaderl.parallel import ddp
from jaderl.parallel.ddp import Learners, average_gradients, train_ddp
from jaderl.parallel.exits import ENDED_EXIT, stop_on_sigterm
from jaderl.parallel.fusion import state_tensors
from tests.conftest import own_session

REPO = Path(__file__).resolve().parents[2]
ENV = "jaderl/CartPole-v1"
TINY = ["--device", "cpu", "--num-envs", "4", "--eval-episodes", "2", "--eval-every", "256", "--checkpoint-every",
        "256", "--seed", "3", "--set", "hidden=[32,32]", "--set", "horizon=32", "--set", "minibatch_size=64",
        "--set", "num_epochs=2"]
TINY_PPO: dict[str, Any] = dict(num_envs=4, horizon=32, minibatch_size=64, num_epochs=2, hidden=[32, 32],
                                eval_every=256, checkpoint_every=256, eval_episodes=2, device="cpu", seed=3,
                                learners=2)


# --- helpers ---

def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _agent_tensors(run_dir: Path) -> tuple[int, list[torch.Tensor]]:
    """The step and every agent tensor of the checkpoint in ``run_dir``."""
    agent = load_checkpoint(run_dir)["agent"]
    return agent["counters"]["steps"], [t for k in sorted(agent) for t in _flat(agent[k])]


def _flat(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _flat(obj[k])]
    if isinstance(obj, list):
        return [t for v in obj for t in _flat(v)]
    return []


def _assert_learners_identical(run_dir: Path, learners: int = 2) -> int:
    """Every learner's checkpointed agent equals learner 0's, tensor for tensor; returns their step."""
    step, main_tensors = _agent_tensors(run_dir)
    assert len(main_tensors) > 10
    for rank in range(1, learners):
        other_step, tensors = _agent_tensors(run_dir / f"learner-{rank}")
        assert other_step == step
        assert len(tensors) == len(main_tensors)
        for a, b in zip(main_tensors, tensors, strict=True):
            assert torch.equal(a, b)
    return step


# --- the pieces, in threads ---

def _ppo(seed: int = 0, **settings: Any) -> PPO:
    config = make_config("ppo", ENV, num_envs=2, horizon=8, minibatch_size=8, hidden=[16], device="cpu", seed=seed,
                         **settings)
    env = make_env(ENV, 2, torch.device("cpu"), seed=0)
    torch.manual_seed(seed)
    agent = PPO(config, env, torch.device("cpu"))
    env.close()
    return agent


def _loss(agent: PPO, obs: torch.Tensor, target: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """A mean over the batch touching actor and critic, so that averaging the halves' gradients is exact."""
    x = agent.features(obs)
    value_loss = (agent.critic(x).squeeze(-1) - target).square().mean()
    return value_loss - agent.actor.evaluate(x, action)[0].mean()


@pytest.mark.parametrize("bucket_bytes", [ddp.BUCKET_BYTES, 200])
def test_averaged_steps_equal_single_process_steps_on_all_data(bucket_bytes: int, monkeypatch: pytest.MonkeyPatch,
                                                               in_threads: Callable[..., list[Any]]) -> None:
    monkeypatch.setattr(ddp, "BUCKET_BYTES", bucket_bytes)  # 200 bytes: a bucket per tensor or two
    reference = _ppo()
    learners = [copy.deepcopy(reference) for _ in range(2)]
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 4, generator=gen) * 3, torch.randn(16, generator=gen) * 5,
             torch.randint(2, (16,), generator=gen)) for _ in range(3)]
    for obs, target, action in data:  # the full batch in one process: clipped (max_grad_norm=0.5), Adam-stepped
        reference.optimize(reference.optimizer, _loss(reference, obs, target, action))

    def learn(rank: int, group: dist.ProcessGroup) -> None:
        agent = learners[rank]
        agent.grad_hook = lambda params: average_gradients(params, group)
        for obs, target, action in data:  # each learner sees its half of every batch
            half = slice(8 * rank, 8 * rank + 8)
            agent.optimize(agent.optimizer, _loss(agent, obs[half], target[half], action[half]))

    in_threads(2, learn)
    for a, b, ref in zip(state_tensors(learners[0]), state_tensors(learners[1]), state_tensors(reference),
                         strict=True):
        assert torch.equal(a, b)  # learners stay bit-identical
        torch.testing.assert_close(a, ref, rtol=1e-4, atol=1e-6)
    assert not torch.equal(next(reference.critic.parameters()), next(_ppo().critic.parameters()))


def _sac(seed: int) -> SAC:
    config = make_config("modsac", "jaderl/Pendulum-v1", num_envs=2, hidden=[16], device="cpu", seed=seed,
                         normalize_obs=True)
    env = make_env("jaderl/Pendulum-v1", 2, torch.device("cpu"), seed=0)
    torch.manual_seed(seed)
    agent = SAC(config, env, torch.device("cpu"))
    env.close()
    return agent


def test_coordinator_shares_state_merges_obs_norm_and_agrees(in_threads: Callable[..., list[Any]]) -> None:
    agents = [_sac(seed=0), _sac(seed=1)]
    first_actor = [p.detach().clone() for p in agents[0].actor.parameters()]
    agents[0].critic_updates = 5  # learner 0's counters win too
    gen = torch.Generator().manual_seed(2)
    batches = [torch.randn(2, 10, 3, generator=gen) * (r + 1) + r for r in range(2)]  # (T, N, obs_dim) per learner
    reference = ObsNorm((3,), True)
    reference.update(batches[0])  # what learner 0 saw in iteration 1
    reference.update(torch.cat(batches))  # then both learners' observations of iteration 2, as one batch

    def learn(rank: int, group: dist.ProcessGroup) -> tuple[str, str]:
        agent, coordinator = agents[rank], Learners(group)
        coordinator.attach(agent)
        # iteration 1: only learner 0 has observations; iteration 2: both
        if rank == 0:
            agent.obs_norm.update(batches[0])
        agent.steps += 20
        agent._critic_loss_ema.fill_(rank + 1.0)
        coordinator.after_update(agent)
        agent.obs_norm.update(batches[rank])
        agent.steps += 20
        coordinator.after_update(agent)
        return coordinator.agree("solved" if rank == 0 else "time_limit"), coordinator.agree("")

    reasons = in_threads(2, learn)
    assert reasons == [("solved", ""), ("solved", "")]
    for agent in agents:
        for p, q in zip(agent.actor.parameters(), first_actor, strict=True):
            assert torch.equal(p, q)
        assert agent.steps == 80 and agent.critic_updates == 5
        assert agent._critic_loss_ema.item() == 1.5
        for name in ("mean", "var", "count"):
            torch.testing.assert_close(getattr(agent.obs_norm, name), getattr(reference, name))
    for a, b in zip(state_tensors(agents[0]), state_tensors(agents[1]), strict=True):
        assert torch.equal(a, b)


def test_reward_normalisers_merge_and_keep_their_own_returns(in_threads: Callable[..., list[Any]]) -> None:
    agents = [_ppo(normalize_reward=True), _ppo(normalize_reward=True)]
    gen = torch.Generator().manual_seed(4)
    never = torch.zeros(6, 2, dtype=torch.bool)
    rollouts = [{"reward": torch.randn(6, 2, generator=gen) * (r + 1), "terminated": never, "truncated": never}
                for r in range(2)]
    references = [ReturnNorm((2,), True) for _ in range(2)]
    for reference, rollout in zip(references, rollouts, strict=True):
        reference.normalize_(dict(rollout), 0.99)  # each learner's returns alone
    pooled = ReturnNorm((4,), True)  # both learners' sub-envs side by side: the returns of both, in one statistic
    pooled.normalize_({k: torch.cat([r[k] for r in rollouts], dim=1) for k in rollouts[0]}, 0.99)

    def learn(rank: int, group: dist.ProcessGroup) -> None:
        coordinator = Learners(group)
        coordinator.attach(agents[rank])
        agents[rank].reward_norm.normalize_(dict(rollouts[rank]), 0.99)
        coordinator.after_update(agents[rank])

    in_threads(2, learn)
    for agent, reference in zip(agents, references, strict=True):
        torch.testing.assert_close(agent.reward_norm.running, reference.running)  # each learner's own sub-envs
        for name in ("mean", "var"):
            torch.testing.assert_close(getattr(agent.reward_norm, name), getattr(pooled, name))
        assert agent.reward_norm.count.item() == pytest.approx(24, abs=1e-3)


def test_attach_keeps_each_learners_own_running_returns(in_threads: Callable[..., list[Any]]) -> None:
    """A resumed learner continues its own sub-envs' episodes: attach gives it learner 0's state, but not learner 0's
    running discounted returns, which belong to learner 0's sub-envs."""
    agents = [_ppo(normalize_reward=True), _ppo(seed=1, normalize_reward=True)]
    own = [torch.tensor([1.0, 2.0]), torch.tensor([-3.0, 4.0])]  # as loaded from each learner's checkpoint
    for agent, running in zip(agents, own, strict=True):
        agent.reward_norm.running.copy_(running)

    def learn(rank: int, group: dist.ProcessGroup) -> None:
        Learners(group).attach(agents[rank])

    in_threads(2, learn)
    for agent, running in zip(agents, own, strict=True):
        assert torch.equal(agent.reward_norm.running, running)
    for a, b in zip(agents[0].actor.parameters(), agents[1].actor.parameters(), strict=True):
        assert torch.equal(a, b)  # everything else is learner 0's


def test_mappo_learners_normalise_value_targets_with_every_learners_statistics(
        in_threads: Callable[..., list[Any]]) -> None:
    """MAPPO updates its value normaliser with a rollout's targets and normalises them with it at once: through
    ``agent.stats_hook`` every learner's targets are normalised with the statistics of all learners' targets, and
    after_update does not count them twice."""
    from tests.marl.test_mappo import make_agent, random_rollout

    agents = [make_agent("mappo", num_epochs=1), make_agent("mappo", num_epochs=1)]
    rollouts = [random_rollout(seed) for seed in range(2)]
    for r, rollout in enumerate(rollouts):
        rollout["reward"] = rollout["reward"] * (r + 1) * 10 + 5 * r  # learners see targets of different scales
    with torch.no_grad():
        targets = [agents[0].returns(rollout)[1] for rollout in rollouts]
    reference = ObsNorm((1,), True)
    reference.update(torch.cat(targets))  # one normaliser that saw both learners' targets
    buffers = [RolloutBuffer(), RolloutBuffer()]

    def learn(rank: int, group: dist.ProcessGroup) -> None:
        coordinator = Learners(group)
        coordinator.attach(agents[rank])
        buffers[rank].add(rollouts[rank])
        agents[rank].update(buffers[rank])
        coordinator.after_update(agents[rank])

    in_threads(2, learn)
    for agent, buffer, target in zip(agents, buffers, targets, strict=True):
        torch.testing.assert_close(buffer.data["value_target"],
                                   (target - reference.mean) / (reference.var + 1e-8).sqrt())
        for name in ("mean", "var", "count"):
            torch.testing.assert_close(getattr(agent.value_norm, name), getattr(reference, name))


def test_diverging_counters_are_an_error(in_threads: Callable[..., list[Any]]) -> None:
    agents = [_ppo(), _ppo()]

    def learn(rank: int, group: dist.ProcessGroup) -> None:
        coordinator = Learners(group)
        coordinator.attach(agents[rank])
        agents[rank].update_debt = 0.25 * rank
        coordinator.after_update(agents[rank])

    with pytest.raises(TrainingError, match="diverged: their update_debt differ"):
        in_threads(2, learn)


def test_more_learners_than_gpus_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert ddp._learner_devices(make_config("ppo", ENV, learners=2, device="cuda")) == [0, 1]
    with pytest.raises(ConfigError, match=r"learners=2 need GPUs cuda:1\.\.cuda:2 but 2 are visible"):
        ddp._learner_devices(make_config("ppo", ENV, learners=2, device="cuda:1"))
    assert ddp.learner_config(make_config("ppo", ENV, learners=2, device="cuda:1", run_dir="r"), 1).device == "cuda:2"


# --- real learner processes ---

@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A finished ModSAC run (target critics, alpha, a critic-loss average, observation normalisation) with 2
    learners, made by ``jaderl train --learners 2 --json``, and its JSON report."""
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    code, out, err = _cli(["train", "modsac", "jaderl/Pendulum-v1", "--learners", "2", "--run-dir", str(run_dir),
                           "--total-steps", "160", "--num-envs", "2", "--eval-every", "80", "--eval-episodes", "1",
                           "--checkpoint-every", "80", "--device", "cpu", "--seed", "0", "--set", "hidden=[32]",
                           "--set", "batch_size=32", "--set", "warmup_steps=64", "--set", "normalize_obs=true",
                           "--json"])
    assert code == 0, err
    return run_dir, json.loads(out.splitlines()[-1])


def test_cli_trains_with_two_learners(cli_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, report = cli_run
    # 2 learners x 2 envs x 1 step = 4 env steps per iteration, all counted
    assert report["steps"] == 160 and report["stop_reason"] == "total_steps"
    metrics = (run_dir / "metrics.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in metrics[1:]] == ["80", "160"]
    assert "learners: 2" in (run_dir / "config.yaml").read_text()


def test_learners_hold_identical_state(cli_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir = cli_run[0]
    assert _assert_learners_identical(run_dir) == 160  # networks, targets, log_alpha, Adam states, obs_norm, counters
    agent = load_checkpoint(run_dir)["agent"]
    # every observation of both learners went into the one normaliser
    assert agent["running_stats"]["obs_norm"]["count"].item() == pytest.approx(160, abs=1e-3)
    # warm-up (64 global steps) ends in iteration 17; then 24 iterations x 2 owed gradient steps (2 local env steps)
    assert agent["counters"]["critic_updates"] == 48 and agent["networks"]["alpha"]["log_alpha"].item() != 0.0
    # ... while each learner explored its own envs into its own replay buffer, with its own random streams
    main_state, other_state = (load_checkpoint(d) for d in (run_dir, run_dir / "learner-1"))
    main_obs, other_obs = main_state["buffer"][0]["obs"], other_state["buffer"][0]["obs"]
    assert main_obs.shape == other_obs.shape and not torch.equal(main_obs, other_obs)
    assert not torch.equal(main_state["rng"]["torch"], other_state["rng"]["torch"])


def test_only_learner_0_evaluates_and_logs(cli_run: tuple[Path, dict[str, Any]]) -> None:
    """Learner 1 keeps its checkpoint (and config) only: no evaluator, so no metrics.csv, TensorBoard or curve."""
    run_dir = cli_run[0]
    assert (run_dir / "metrics.csv").exists() and any((run_dir / "tb").iterdir())
    learner_1 = sorted(p.name for p in (run_dir / "learner-1").iterdir())
    assert learner_1 == ["checkpoint.json", "ckpt-160.safetensors", "config.yaml"]


def test_a_learner_without_a_matching_checkpoint_gets_learner_0s(cli_run: tuple[Path, dict[str, Any]],
                                                                tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(cli_run[0], run_dir)
    shutil.rmtree(run_dir / "learner-1")  # as if the run had been started with one learner
    config = make_config("modsac", "jaderl/Pendulum-v1", run_dir=str(run_dir), learners=2)
    ddp._prepare_learner_dirs(config, resume=True)
    assert _assert_learners_identical(run_dir) == 160
    main_state, copied = load_checkpoint(run_dir), load_checkpoint(run_dir / "learner-1")
    assert torch.equal(main_state["buffer"][0]["obs"], copied["buffer"][0]["obs"])  # learner 0's replay data
    assert not torch.equal(main_state["rng"]["torch"], copied["rng"]["torch"])  # but its own random streams
    assert copied["config"]["seed"] == ddp.SEED_STRIDE and copied["env"] is None


class FailsOnLearner1(PPO):
    """PPO whose learner 1 fails in its second update: it raises, or it is sent SIGKILL (``mode``)."""

    mode = "raise"

    def update(self, buffer: Any) -> dict[str, torch.Tensor]:
        if dist.get_rank() == 1 and self.steps >= 512:
            (Path(self.config.run_dir) / "failed_at").write_text(str(time.time()))
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(30)
            raise RuntimeError("injected failure")
        return super().update(buffer)


class KilledOnLearner1(FailsOnLearner1):
    mode = "kill"


class TerminatedOnLearner1(PPO):
    """PPO whose learner 1 is sent SIGTERM once, in its update from step 512 on (as `kill PID` sends it), and goes
    on training; the step it was sent at is in ``learner-1/terminated_at``."""

    def update(self, buffer: Any) -> dict[str, torch.Tensor]:
        sent = Path(self.config.run_dir) / "terminated_at"
        if dist.get_rank() == 1 and self.steps >= 512 and not sent.exists():
            sent.write_text(str(self.steps))
            os.kill(os.getpid(), signal.SIGTERM)
        return super().update(buffer)


class EnvFailsOnLearner1(PPO):
    """PPO whose learner 1 meets an env error (as NaN from the env raises) in its update from step 512 on."""

    def update(self, buffer: Any) -> dict[str, torch.Tensor]:
        if dist.get_rank() == 1 and self.steps >= 512:
            raise EnvError("the env returned a non-finite reward; fix the env or wrap it to clip or reset")
        return super().update(buffer)


def test_an_env_error_mid_run_keeps_the_run_directory_and_a_failed_set_up_leaves_none(
        tmp_path: Path, no_leftover_processes: None) -> None:
    """Before its first checkpoint, a run whose env fails mid-run keeps what learner 0 wrote (config.yaml, metrics,
    the best policy), as a run in one process does; a run whose learners fail to set up leaves no directory."""
    config = make_config("ppo", ENV, total_steps=100_000, run_dir=str(tmp_path / "run"),
                         **(TINY_PPO | {"checkpoint_every": 10**9}))
    with pytest.raises(EnvError, match="non-finite reward"):
        train_ddp(config, EnvFailsOnLearner1)
    assert (tmp_path / "run" / "config.yaml").exists() and (tmp_path / "run" / "metrics.csv").exists()
    assert not (tmp_path / "run" / CHECKPOINT_JSON).exists()
    with pytest.raises(ConfigError, match="multi-agent"):
        train_ddp(make_config("mappo", ENV, run_dir=str(tmp_path / "setup"), learners=2, device="cpu"),
                  ALGOS["mappo"].agent_cls)
    assert not (tmp_path / "setup").exists()


@pytest.mark.parametrize(("agent_cls", "expected"), [(FailsOnLearner1, "learner 1 failed: RuntimeError: injected"),
                                                     (KilledOnLearner1, "learner 1 was killed by SIGKILL")])
def test_a_failing_learner_is_reported_by_name(agent_cls: type[PPO], expected: str, tmp_path: Path,
                                               no_leftover_processes: None) -> None:
    config = make_config("ppo", ENV, total_steps=100_000, run_dir=str(tmp_path / "run"), **TINY_PPO)
    with pytest.raises(TrainingError, match=expected) as info:
        train_ddp(config, agent_cls)
    assert str(info.value).endswith(f"the last checkpoint is kept: continue from it with `jaderl train --resume "
                                    f"{tmp_path / 'run'}`")  # the fix, in the same sentence
    failed_at = float((tmp_path / "run" / "learner-1" / "failed_at").read_text())
    assert time.time() - failed_at < 10.0


def test_sigterm_to_a_learner_stops_the_run_after_a_last_checkpoint(tmp_path: Path,
                                                                    no_leftover_processes: None) -> None:
    """SIGTERM to one learner asks the run to stop, as Ctrl-C to the parent does: the learner touches the run's stop
    file and every learner stops at the next step learner 0 reads it, each after a last checkpoint at that step (here
    the only one: no periodic checkpoint is due before step 100,000)."""
    run_dir = tmp_path / "run"
    config = make_config("ppo", ENV, total_steps=100_000, run_dir=str(run_dir),
                         **(TINY_PPO | {"checkpoint_every": 100_000}))
    result = train_ddp(config, TerminatedOnLearner1)
    sent_at = int((run_dir / "learner-1" / "terminated_at").read_text())
    assert result.stop_reason == "stop_file"  # the parent was not signalled: the stop file's reason
    assert 512 <= sent_at <= result.steps <= sent_at + 2 * 256  # within a step or two (256 env steps each)
    assert _assert_learners_identical(run_dir) == result.steps  # every learner checkpointed at the stop step
    assert not (run_dir / "stop").exists()


def test_sigterm_to_a_learner_while_it_starts_stops_the_run_once_it_can(
        tmp_path: Path, session_ended: Callable[[int], None]) -> None:
    """SIGTERM to one learner while it starts (here: while it imports the script that started the run, before any
    jaderl code runs in it) neither ends it nor is lost: the learner asks for the stop as soon as it answers SIGTERM,
    so the run stops at the first step learner 0 reads the stop file, after a last checkpoint of every learner."""
    run_dir, starting, sent = tmp_path / "run", tmp_path / "starting", tmp_path / "sent"
    starting.mkdir()
    script = tmp_path / "run_learners.py"
    script.write_text(textwrap.dedent(f"""
        import os
        import time
        from pathlib import Path

        if __name__ == "__mp_main__":  # every learner imports this script as it starts
            (Path({str(starting)!r}) / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while not Path({str(sent)!r}).exists() and time.monotonic() < deadline:
                time.sleep(0.01)

        if __name__ == "__main__":
            import jaderl

            result = jaderl.train("ppo", {ENV!r}, total_steps=1024, run_dir={str(run_dir)!r}, **{TINY_PPO!r})
            print(result.stop_reason, result.steps)
    """))
    with own_session([sys.executable, str(script)], cwd=REPO) as proc:
        deadline = time.monotonic() + 60
        while len(learners := [int(p.name) for p in starting.iterdir()]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(learners) == 2, "the learners did not start"
        os.kill(min(learners), signal.SIGTERM)  # to one learner only; both wait for the `sent` file to go on
        sent.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "stop_file 256", err  # the first step (2 learners x 4 envs x 32), not 1024
    assert _assert_learners_identical(run_dir) == 256
    assert not (run_dir / "stop").exists()
    session_ended(proc.pid)


@pytest.mark.parametrize(("then", "code"), [(signal.SIGTERM, 128 + signal.SIGTERM),
                                            (signal.SIGUSR1, 128 + signal.SIGUSR1)])
def test_a_learners_first_sigterm_asks_for_a_stop_and_the_next_signal_ends_it(then: signal.Signals, code: int,
                                                                              tmp_path: Path) -> None:
    """A learner's first SIGTERM only touches the stop file; a second SIGTERM, or SIGUSR1 (the parent's way to end
    the survivors of a failed run), ends it at once through SystemExit, so its finally blocks run."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from jaderl.parallel.exits import stop_on_sigterm

        stop_on_sigterm(Path({str(tmp_path / "stop")!r}))
        print("ready", flush=True)
        try:
            while True:
                time.sleep(0.01)
        finally:
            Path({str(tmp_path / "closed")!r}).touch()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not (tmp_path / "stop").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (tmp_path / "stop").exists() and proc.poll() is None  # asked for a stop, still running
        assert not (tmp_path / "closed").exists()
        proc.send_signal(then)
        assert proc.wait(timeout=10) == code
        assert (tmp_path / "closed").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _until_ended(tmp_path: Path) -> None:
    """A stand-in learner: stops on SIGTERM as a learner does, says it is ready, waits; its finally block leaves a
    ``closed`` file."""
    stop_on_sigterm(tmp_path / "stop")
    try:
        (tmp_path / "ready").touch()
        while True:
            time.sleep(0.01)
    finally:
        (tmp_path / "closed").touch()


def test_the_parent_ends_a_learner_at_once_and_lets_it_close(tmp_path: Path, no_leftover_processes: None) -> None:
    """The parent ends the survivors of a failed run with a signal that ends them at once (not SIGTERM, which only
    asks for a stop), so they close their envs and files well within the grace period before SIGKILL."""
    learner = mp.get_context("fork").Process(target=_until_ended, args=(tmp_path,), name="jaderl-learner-test")
    learner.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    ddp._stop([learner], grace_s=10.0)
    assert learner.exitcode == ENDED_EXIT and time.monotonic() - start < 5.0
    assert (tmp_path / "closed").exists() and not (tmp_path / "stop").exists()


def test_a_learner_whose_parent_died_while_it_started_exits(no_leftover_processes: None) -> None:
    """Linux kills a learner whose parent dies only once the learner has asked for it, seconds after its start
    (importing torch): one whose parent was killed before must exit at once too, not wait a minute for the
    rendezvous. Here the learner is a grandchild of this process, so its exit is read from its stdout."""
    script = textwrap.dedent("""
        import multiprocessing as mp, os, time

        def learner():
            print(os.getpid(), flush=True)
            while os.getppid() == mp.parent_process().pid:
                time.sleep(0.01)
            from jaderl.parallel.ddp import _die_with_parent
            _die_with_parent()
            print("survived", flush=True)
            time.sleep(60)

        mp.get_context("fork").Process(target=learner).start()
        os._exit(0)  # the run, killed while its learner starts
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    learner = int(proc.stdout.readline())
    proc.wait()
    try:
        assert proc.stdout.readline() == ""  # end of file: the learner exited without a word
    finally:
        with contextlib.suppress(OSError):
            os.kill(learner, signal.SIGKILL)
        proc.stdout.close()


def test_ctrl_c_checkpoints_ends_every_learner_and_resumes(tmp_path: Path, no_leftover_processes: None) -> None:
    config = make_config("ppo", ENV, total_steps=10_000_000, run_dir=str(tmp_path / "run"), **TINY_PPO)
    seen: list[dict[str, Any]] = []

    def interrupt(info: dict[str, Any]) -> None:
        seen.append(info)
        if len(seen) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    run_dir = tmp_path / "run"
    result = train_ddp(config, PPO, progress=interrupt)
    assert result.stop_reason == "interrupted" and 0 < result.steps < 10_000_000
    assert _assert_learners_identical(run_dir) == result.steps
    assert not (run_dir / "stop").exists()
    assert seen[-1]["done"]
    # `jaderl train --resume` continues the interrupted run with its 2 learners
    code, out, err = _cli(["train", "--resume", str(run_dir), "--total-steps", str(result.steps + 512), "--json"])
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["steps"] == result.steps + 512
    assert _assert_learners_identical(run_dir) == result.steps + 512
    metrics = [int(line.split(",")[0]) for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert metrics[-2:] == [result.steps + 256, result.steps + 512]


def test_cli_sigterm_to_the_process_group_checkpoints_at_the_stop_step(
        tmp_path: Path, session_ended: Callable[[int], None]) -> None:
    """SIGTERM to every process of the run, as `kill -- -PGID` or a job scheduler (Slurm's scancel, a preemption)
    sends it: the parent and the learners each ask for a stop, the learners stop together after a last checkpoint
    at the stop step (the only one: no periodic checkpoint is due), and the command exits as after Ctrl-C, leaving
    no process of its session behind."""
    run_dir = tmp_path / "run"
    tiny = list(TINY)
    tiny[tiny.index("--checkpoint-every") + 1] = "1000000000"
    command = [sys.executable, "-m", "jaderl.cli", "train", "ppo", ENV, "--learners", "2", "--total-steps",
               "1000000000", "--run-dir", str(run_dir), "--json", *tiny]
    with own_session(command, cwd=REPO) as proc:
        deadline = time.monotonic() + 120
        metrics = run_dir / "metrics.csv"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) > 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # stopped from outside, as by Ctrl-C, after its last checkpoint
    result = json.loads(out.splitlines()[-1])
    assert result["stop_reason"] == "interrupted" and result["steps"] > 0
    assert _assert_learners_identical(run_dir) == result["steps"]
    assert not (run_dir / "stop").exists()
    session_ended(proc.pid)


def test_a_resumed_run_continues_bit_identically(tmp_path: Path, no_leftover_processes: None) -> None:
    """Stopped at a checkpoint and resumed, a run of 2 learners ends exactly as one that ran through: every learner
    keeps its own envs, buffer, random streams and its sub-envs' running returns (``normalize_reward``)."""
    settings = TINY_PPO | {"normalize_reward": True}
    train_ddp(make_config("ppo", ENV, total_steps=512, run_dir=str(tmp_path / "through"), **settings), PPO)
    train_ddp(make_config("ppo", ENV, total_steps=256, run_dir=str(tmp_path / "resumed"), **settings), PPO)
    train_ddp(make_config("ppo", ENV, total_steps=512, run_dir=str(tmp_path / "resumed"), **settings), PPO,
              resume=True)
    for learner in ("", "learner-1"):
        through, resumed = (load_checkpoint(tmp_path / run / learner) for run in ("through", "resumed"))
        assert through["agent"]["counters"]["steps"] == resumed["agent"]["counters"]["steps"] == 512
        for part in ("agent", "buffer", "env", "last_obs", "rng"):
            a, b = _flat(through[part]), _flat(resumed[part])
            assert len(a) == len(b) and (a or part == "buffer")  # a rollout buffer is empty between updates
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), (learner or "learner-0", part)
