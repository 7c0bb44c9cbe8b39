"""Train any jaderl algorithm under ``lightning.Trainer.fit`` (``pip install 'jaderl[lightning]'``).

    import lightning as L
    from jaderl.integrations.lightning import DQN, JaderlModule

    model = JaderlModule("ppo", "jaderl/CartPole-v1", num_envs=8)   # any registered algorithm and env, any setting
    model = DQN("CartPole-v1")                                      # or a Lightning Bolts name and its first argument
    L.Trainer(max_epochs=20).fit(model)

:class:`JaderlModule` drives one :class:`jaderl.Trainer <jaderl.core.loop.Trainer>`, so the algorithm runs exactly
as ``jaderl train`` runs it:

* one training batch is one or more jaderl iterations (``Trainer.step()``: explore ``horizon`` steps in each of
  ``num_envs`` sub-envs, store, update), enough to explore at least 32 env steps unless ``iterations_per_batch``
  says; ``global_step`` counts batches, so ``max_steps`` bounds them;
* one epoch is one evaluation period (``eval_every`` env steps, or ``limit_train_batches`` batches when that is
  fewer); each epoch ends with a deterministic evaluation logged as ``eval_return`` (and ``best_eval_return``), which
  ``ModelCheckpoint`` and ``EarlyStopping`` can monitor;
* the update's statistics (``loss/critic`` ...), ``env_steps`` and the training episodes' returns go through
  ``self.log``, so every Lightning logger records them;
* the agent owns its optimizers (manual optimization); they are also returned by ``configure_optimizers``;
* a Lightning checkpoint holds the jaderl run's whole state (networks, optimizers, replay buffer, normalisers,
  counters, random streams, env state), so ``fit(ckpt_path=...)`` continues it, bit for bit on one device; the run
  stops by itself at ``total_steps``, ``time_limit`` or ``target_return``, as ``jaderl train`` would;
* checkpoints are written by :class:`SafetensorsCheckpointIO` (safetensors with a JSON header; nothing is ever
  unpickled), installed by the module unless the Trainer was given another ``CheckpointIO`` plugin;
* ``strategy="ddp"`` makes every Lightning process a jaderl data-parallel learner
  (:class:`jaderl.parallel.ddp.Learners`): each explores its own envs, gradients are averaged at every optimizer
  step, and process 0 evaluates.

The Lightning Bolts names (``DQN``, ``DoubleDQN``, ``DuelingDQN``, ``NoisyDQN``, ``PERDQN``, ``Reinforce``,
``VanillaPolicyGradient``, ``AdvantageActorCritic``, ``SAC``) take the env id first; a Gymnasium id with a
torch-native twin (``CartPole-v1``) trains on the twin (``jaderl/CartPole-v1``). See docs/lightning.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.plugins.io import CheckpointIO
except ImportError:  # pragma: no cover - exercised only without the extra
    raise ImportError("jaderl.integrations.lightning needs Lightning; install it with "
                      "pip install 'jaderl[lightning]'") from None

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from jaderl.api import ALGOS, RESUME_SETTINGS, build_saved_agent, load_saved_agent, make_config
from jaderl.core.agent import Agent
from jaderl.core.checkpoint import atomic_write, finite_or_raise, flatten, unflatten
from jaderl.core.config import Config, ConfigError
from jaderl.core.loop import Trainer
from jaderl.envs import TORCH_ENVS, make_env
from jaderl.parallel.ddp import SEED_STRIDE, Learners, learner_config

FORMAT = 1
"""The layout of a Lightning checkpoint written by :class:`SafetensorsCheckpointIO` (refused on load if another)."""
METADATA_KEY = "jaderl.lightning"
MIN_STEPS_PER_BATCH = 32
"""Unless told otherwise, a training batch runs as many jaderl iterations as explore at least this many env steps."""
"""The safetensors metadata entry holding the checkpoint's JSON skeleton."""


class SafetensorsCheckpointIO(CheckpointIO):
    """Lightning checkpoints as one safetensors file: every tensor of the checkpoint dict is a tensor of the file,
    and everything else (epochs, loop progress, callback states, hyperparameters) is JSON in the file's metadata.
    Nothing is pickled, so loading a checkpoint runs no code from it. Values must be tensors, numbers, strings,
    booleans, None, lists, tuples (read back as lists) or dicts; anything else is refused when saving. Local paths
    only."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"SafetensorsCheckpointIO takes no storage_options (got {storage_options!r})")
        tensors: dict[str, torch.Tensor] = {}
        try:
            skeleton = flatten(checkpoint, tensors)
        except TypeError as exc:
            raise TypeError(f"{exc}; a safetensors checkpoint holds only tensors and JSON values (numbers, strings, "
                            "lists, dicts)") from None
        metadata = {METADATA_KEY: json.dumps({"format": FORMAT, "checkpoint": skeleton})}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # a complete file or none, on disk before it is renamed: a run killed while saving, or a machine that goes
        # down, leaves the previous checkpoints readable
        atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))

    def load_checkpoint(self, path: str | os.PathLike[str], map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint dict saved at ``path``, tensors on the CPU (or on ``map_location`` when it names a
        device); ``weights_only`` is moot, nothing is unpickled."""
        device = str(map_location) if isinstance(map_location, (str, torch.device)) else "cpu"
        try:
            with safe_open(str(path), framework="pt", device=device) as f:
                header = (f.metadata() or {}).get(METADATA_KEY)
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        except (OSError, SafetensorError) as exc:
            raise FileNotFoundError(f"{path} is not a readable safetensors checkpoint ({exc}); jaderl reads only "
                                    "checkpoints written by SafetensorsCheckpointIO and never unpickles a "
                                    "file") from None
        if header is None:
            raise ConfigError(f"{path} is a safetensors file but not a Lightning checkpoint of jaderl (no "
                              f"{METADATA_KEY!r} metadata)")
        try:
            meta = json.loads(header)
            if meta.get("format") != FORMAT:
                raise ConfigError(f"{path} holds a checkpoint of format {meta.get('format')}; this jaderl reads "
                                  f"format {FORMAT}")
            return unflatten(meta["checkpoint"], tensors)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:  # (ConfigError: a ValueError)
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{path} is a damaged Lightning checkpoint (its {METADATA_KEY!r} metadata cannot be "
                              "read); resume from another checkpoint of the run") from None

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        Path(path).unlink(missing_ok=True)


class _Batches(IterableDataset):
    """The training "data": one index per training batch of the current epoch. A resumed epoch yields only the
    batches it still owes (its position is the module's ``global_step``)."""

    def __init__(self, module: JaderlModule) -> None:
        self.module = module

    def __iter__(self) -> Iterator[int]:
        per_epoch = self.module.batches_per_epoch
        return iter(range(self.module.global_step % per_epoch, per_epoch))


class JaderlModule(pl.LightningModule):
    """A LightningModule that trains ``algo`` (a name of :data:`jaderl.api.ALGOS`, single- or multi-agent) on
    ``env`` (any id :func:`jaderl.envs.make_env` accepts) with config ``settings`` (``num_envs=8``, ``lr=1e-3``,
    ``total_steps=50_000`` ...); ``iterations_per_batch`` jaderl iterations make one training batch (None: enough
    for :data:`MIN_STEPS_PER_BATCH` env steps). See the module docstring for how batches, epochs, logging,
    checkpoints and DDP map onto the jaderl run. The run's directory (metrics.csv, best policy, config.yaml) is
    ``run_dir`` when given (it must be new), else ``jaderl-run`` inside the logger's directory.

    After ``fit`` the trained agent is :attr:`agent` (``agent.predict(obs)`` acts in the env's own action space)."""

    ALGO: ClassVar[str | None] = None
    """The algorithm a subclass trains (the Bolts names); None: the first argument names it."""

    def __init__(self, algo: str, env: str, iterations_per_batch: int | None = None, **settings: Any) -> None:
        super().__init__()
        self.config: Config = make_config(algo, env, **settings)  # refuses a bad name or setting now, not in fit
        if iterations_per_batch is not None and iterations_per_batch < 1:
            raise ConfigError(f"iterations_per_batch={iterations_per_batch} is out of range: it must be >= 1 (or "
                              "None to pick it)")
        self.requested_iterations_per_batch = iterations_per_batch
        # a path as a string: the checkpoint's hyperparameters are JSON (SafetensorsCheckpointIO)
        settings = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in settings.items()}
        hparams = {"env": env, **settings} if type(self).ALGO is not None else {"algo": algo, "env": env, **settings}
        if iterations_per_batch is not None:
            hparams["iterations_per_batch"] = iterations_per_batch
        self.save_hyperparameters(hparams)
        self.automatic_optimization = False  # the agent steps its own optimizers, as often as its update says
        self.jaderl_trainer: Trainer | None = None
        self.networks: nn.ModuleDict | None = None
        self.stop_reason = ""
        self._loaded_agent: Agent | None = None
        self._epoch_eval: dict[str, float] | None = None  # the evaluation that ends the current epoch, once made
        self._run_closed = False

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | os.PathLike[str],  # type: ignore[override]
                             map_location: str | torch.device | None = None, **kwargs: Any) -> JaderlModule:
        """The module of a checkpoint written by :class:`SafetensorsCheckpointIO`, with its trained agent in
        :attr:`agent` (on ``map_location``, default CPU) for ``agent.predict``; ``kwargs`` override its
        hyperparameters. To train on, pass the file to ``Trainer.fit(module, ckpt_path=...)`` (with this module, or
        a new one of the run's settings); the run then goes on in a new run directory."""
        checkpoint = SafetensorsCheckpointIO().load_checkpoint(checkpoint_path)
        if "jaderl" not in checkpoint:
            raise ConfigError(f"{checkpoint_path} holds no jaderl run (it was not written by JaderlModule)")
        saved = checkpoint["jaderl"]["config"]["algo"]
        keywords = getattr(cls, "BOLTS_KEYWORDS", {})  # a Bolts keyword (learning_rate) overrides its jaderl name (lr)
        hparams = {**checkpoint["hyper_parameters"], **{keywords.get(k, k): v for k, v in kwargs.items()}}
        if cls.ALGO is None:  # (a Bolts name's checkpoint has no "algo": its class named it)
            algo = hparams.setdefault("algo", saved)
        else:
            hparams.pop("algo", None)
            algo = cls.algo_for(_env_id(hparams["env"])) if issubclass(cls, _BoltsModule) else cls.ALGO
        if algo != saved:
            raise ConfigError(f"{checkpoint_path} holds a {saved} run, and {cls.__name__} trains {algo}; load it "
                              "with JaderlModule.load_from_checkpoint")
        module = cls(**hparams)
        device = torch.device(map_location or "cpu")
        # the networks as the run built them: its saved config, not one resolved again (a zoo entry may change)
        names = [getattr(cls, "BOLTS_KEYWORDS", {}).get(k, k) for k in kwargs]  # a Bolts keyword: its jaderl name
        overrides = {k: getattr(module.config, k) for k in names if hasattr(module.config, k)}
        # training on (fit with ckpt_path) writes a new run directory beside the logs, unless run_dir= is given
        saved_config = {**checkpoint["jaderl"]["config"], "run_dir": "", **overrides}
        config = type(module.config).from_dict(saved_config).replace(device=str(device))
        module.config = config
        probe = make_env(config.env, 1, device)
        try:
            spec = probe.spec  # agents are built from the env's description
        finally:
            probe.close()
        agent = build_saved_agent(config, spec, device)
        finite_or_raise(checkpoint["jaderl"]["agent"]["networks"], str(checkpoint_path))
        load_saved_agent(agent, checkpoint["jaderl"]["agent"])  # (a reward normaliser's returns: the run's sub-envs)
        module._loaded_agent = agent
        return module

    # --- what fit builds ---
    @property
    def agent(self) -> Agent:
        """The jaderl agent being trained (built when ``fit`` starts, or read by :meth:`load_from_checkpoint`)."""
        if self.jaderl_trainer is not None:
            return self.jaderl_trainer.agent
        if self._loaded_agent is not None:
            return self._loaded_agent
        raise RuntimeError("the agent is built when Trainer.fit starts; call fit first")

    @property
    def env_steps_per_iteration(self) -> int:
        """Env steps one jaderl iteration explores, all processes counted."""
        world = self.trainer.world_size if self._trainer is not None else 1
        return self.config.horizon * self.config.num_envs * world

    @property
    def iterations_per_batch(self) -> int:
        """Jaderl iterations per training batch: as given, else as many as explore at least
        :data:`MIN_STEPS_PER_BATCH` env steps (Lightning's fixed cost per training step is then small beside
        them)."""
        if self.requested_iterations_per_batch is not None:
            return self.requested_iterations_per_batch
        return max(1, math.ceil(MIN_STEPS_PER_BATCH / self.env_steps_per_iteration))

    @property
    def batches_per_epoch(self) -> int:
        """Training batches per epoch: one evaluation period of ``eval_every`` env steps, or fewer when the Lightning
        Trainer's ``limit_train_batches`` is a smaller whole number (every epoch then has that many batches and
        ends with an evaluation)."""
        period = max(1, math.ceil(self.config.eval_every / (self.env_steps_per_iteration * self.iterations_per_batch)))
        limit = self._trainer.limit_train_batches if self._trainer is not None else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return min(period, limit)
        return period

    def setup(self, stage: str) -> None:
        """Build the jaderl Trainer on Lightning's device (a data-parallel learner under DDP)."""
        if stage != "fit":
            return
        if self.jaderl_trainer is not None:
            raise ConfigError("this JaderlModule has trained already; continue its run with a new module and "
                              "Trainer.fit(module, ckpt_path=...)")
        trainer = self.trainer
        if str(trainer.precision) not in ("32-true", "32"):
            raise ConfigError(f"Trainer(precision={trainer.precision!r}) does not apply to jaderl agents; leave "
                              "Lightning's precision at 32 and pass precision='bfloat16' to the module instead")
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default: pickles
            trainer.strategy.checkpoint_io = SafetensorsCheckpointIO()
        config = self.config.replace(device=str(trainer.strategy.root_device), run_dir=self._run_dir())
        coordinator = None
        if trainer.world_size > 1:
            if not dist.is_available() or not dist.is_initialized():
                raise ConfigError(f"{type(trainer.strategy).__name__} runs {trainer.world_size} processes without "
                                  "torch.distributed; use strategy='ddp'")
            coordinator = Learners()
            # Lightning gave this process its own device already (root_device): only the seed and run dir change
            config = learner_config(config, trainer.global_rank).replace(device=config.device)
            Path(config.run_dir).mkdir(parents=True, exist_ok=True)
        self.jaderl_trainer = Trainer(config, ALGOS[config.algo].agent_cls, coordinator=coordinator)
        self.networks = nn.ModuleDict(self.jaderl_trainer.agent.networks())  # seen by summaries, DDP and devices

    def configure_callbacks(self) -> list[pl.Callback]:
        return [_CloseOnException()]  # a fit that raises (or Ctrl-C) skips on_fit_end: its envs are closed there

    def _run_dir(self) -> str:
        """The jaderl run directory: ``run_dir`` if given, else a new ``jaderl-run`` directory beside the logs (the
        same on every process)."""
        trainer = self.trainer
        chosen = self.config.run_dir
        if not chosen:
            base = Path(trainer.log_dir or trainer.default_root_dir) / "jaderl-run"
            chosen, k = str(base), 2
            while Path(chosen).exists() and any(Path(chosen).iterdir()):
                chosen, k = f"{base}-{k}", k + 1
        return trainer.strategy.broadcast(chosen, src=0)

    def on_train_start(self) -> None:
        wrapped = self.trainer.strategy.model
        if isinstance(wrapped, nn.parallel.DistributedDataParallel):
            # jaderl's Learners average the gradients of every optimizer step (an update may take many), so DDP's
            # own reducer, which expects one backward pass per forward, stays idle
            wrapped.require_backward_grad_sync = False
            wrapped.require_forward_param_sync = False

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """The agent's own optimizers (for LearningRateMonitor and Lightning's view of the run); they are stepped
        by the agent's update, never by Lightning."""
        return list(self.agent.optimizers().values())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Batches(self), batch_size=None)

    # --- training ---
    def training_step(self, batch: Any, batch_idx: int) -> None:
        """:attr:`iterations_per_batch` jaderl iterations (explore, store, update) or fewer when the run's budget is
        reached; logs the latest update's statistics and ``env_steps``."""
        run = self.jaderl_trainer
        assert run is not None
        reason = self._budget_reason()  # a run resumed at its budget (a finished run's checkpoint) trains no further
        for _ in range(self.iterations_per_batch if not reason else 0):
            run.step()
            run.record_if_due()
            if reason := self._budget_reason():
                break
        if reason:
            self.stop_reason = reason
            self.trainer.should_stop = True
        # logged only on the batches Lightning writes (log_every_n_steps): a self.log call costs about as much as
        # a small update
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self.log_dict({**run.stats, "env_steps": float(run.agent.steps)}, on_step=True, on_epoch=False,
                          batch_size=1)
        # global_step counts batches: the agent steps its optimizers directly, so Lightning's progress is told
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.increment_ready()
        progress.increment_completed()
        # the epoch's evaluation, at its last batch: a checkpoint written after that batch holds it (Lightning writes
        # one there before on_train_epoch_end, and a run resumed from it starts the next epoch)
        if int(batch) == self.batches_per_epoch - 1 or reason:  # (batch: its index in the epoch; reason: the run ends)
            self._evaluate()

    def _budget_reason(self) -> str:
        """Why the run must stop now ("" if it goes on), agreed by every learner."""
        run = self.jaderl_trainer
        assert run is not None
        reason = run.budget_reason()
        return run.coordinator.agree(reason) if run.coordinator is not None else reason

    def _evaluate(self) -> None:
        """Evaluate the policy (process 0; the result reaches every process) for :meth:`on_train_epoch_end` to log."""
        run = self.jaderl_trainer
        assert run is not None
        finished = run.agent.episodes.finished.clone()
        episodes = run.agent.episodes.summary()
        start = time.perf_counter()
        rows = run.evaluator.rows if run.evaluator is not None else []
        if rows and rows[-1]["step"] == run.agent.steps:  # this policy was evaluated (a finished run resumed)
            value = rows[-1]["eval_return_mean"]
        elif run.evaluator is not None:
            run.agent.episodes.add(finished)  # the evaluation's row of metrics.csv records them too
            value = run.evaluate()
        else:
            value = math.nan
        run.time_s += time.perf_counter() - start  # the evaluation counts as training time, as in jaderl train
        if run.coordinator is not None:
            shared = torch.tensor([value, run.best_return], dtype=torch.float64, device=run.device)
            dist.broadcast(shared, src=0)
            value, best = shared.tolist()
        else:
            best = run.best_return
        self._epoch_eval = {"eval_return": value, "best_eval_return": best, **episodes}
        target = run.config.target_return
        if target is not None and value >= target:
            self.stop_reason = "solved"
            self.trainer.should_stop = True

    def on_train_epoch_end(self) -> None:
        """Log the epoch's evaluation as ``eval_return`` (evaluating now if its last batch did not, as when Lightning's
        ``max_steps`` ends the epoch early)."""
        if self._epoch_eval is None:
            self._evaluate()
        assert self._epoch_eval is not None
        self.log_dict(self._epoch_eval, batch_size=1)
        self._epoch_eval = None

    # --- checkpoints ---
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Put the jaderl run's whole state into Lightning's checkpoint."""
        assert self.jaderl_trainer is not None
        checkpoint["jaderl"] = self.jaderl_trainer.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Continue the jaderl run of ``checkpoint``. Under DDP every process continues process 0's saved state
        (networks, optimizers, replay buffer), each with random streams of its own and a fresh start of its envs."""
        if "jaderl" not in checkpoint:
            raise ConfigError("this Lightning checkpoint holds no jaderl run (it was not written by JaderlModule)")
        if self.jaderl_trainer is None:
            raise RuntimeError("a jaderl checkpoint is loaded by Trainer.fit(model, ckpt_path=...)")
        state = checkpoint["jaderl"]
        # the settings that shaped the saved networks, optimizers and buffer must be this module's (as jaderl resume)
        saved, mine = (json.loads(json.dumps(c)) for c in (state["config"], self.config.to_dict()))
        free = {*RESUME_SETTINGS, *self.jaderl_trainer.agent.hyperparameters, "run_dir"}
        if changed := [k for k in mine if k not in free and saved.get(k, mine[k]) != mine[k]]:
            k = changed[0]
            raise ConfigError(f"this Lightning checkpoint's run was trained with {k}={saved[k]!r}, and this module "
                              f"has {k}={mine[k]!r}; build the module with the run's settings to train on "
                              "(JaderlModule.load_from_checkpoint(path) gives one), or start a new run")
        finite_or_raise(state["agent"]["networks"], "the Lightning checkpoint")
        rank = self.trainer.global_rank
        if rank > 0:
            own_seed = self.config.seed + SEED_STRIDE * rank + int(state["agent"]["counters"]["steps"])
            generator = torch.Generator().manual_seed(own_seed)
            state = {**state, "rng": {"torch": generator.get_state(), "cuda": None}, "env": None, "last_obs": None}
        self.jaderl_trainer.load_state_dict(state)

    def on_fit_end(self) -> None:
        self.close_run()

    def close_run(self) -> None:
        """Close the jaderl run's envs (their worker processes) and evaluator, once: at the end of ``fit``, or when
        it raises."""
        if self.jaderl_trainer is not None and not self._run_closed:
            self._run_closed = True
            self.jaderl_trainer.close()


class _CloseOnException(pl.Callback):
    """Closes the module's jaderl run when ``fit`` raises or is interrupted (Lightning then skips ``on_fit_end``)."""

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(pl_module, JaderlModule):
            pl_module.close_run()


def _env_id(env: str) -> str:
    """A Gymnasium id with a torch-native twin (``CartPole-v1``) becomes the twin's id; others stay as given."""
    return f"jaderl/{env}" if "/" not in env and f"jaderl/{env}" in TORCH_ENVS else env


class _BoltsModule(JaderlModule):
    """A Lightning Bolts name: ``Name(env, **settings)`` with the env id first. Besides jaderl's settings it takes
    the Bolts keywords listed in ``BOLTS_KEYWORDS`` under their jaderl names."""

    PRESET: ClassVar[dict[str, Any]] = {}
    """Settings that make this variant (below the user's own)."""
    BOLTS_KEYWORDS: ClassVar[dict[str, str]] = {"learning_rate": "lr", "gamma": "gamma", "seed": "seed"}

    def __init__(self, env: str, **settings: Any) -> None:
        translated: dict[str, Any] = {}
        given_as: dict[str, str] = {}  # jaderl setting -> the keyword that set it first
        for key, value in settings.items():
            name = self.BOLTS_KEYWORDS.get(key, key)
            if name in translated and translated[name] != value:
                raise ConfigError(f"{type(self).__name__} got {given_as[name]}={translated[name]!r} and "
                                  f"{key}={value!r}, which both set jaderl's one {name!r} setting; give them the "
                                  "same value or pass only one")
            translated[name] = value
            given_as.setdefault(name, key)
        super().__init__(self.algo_for(_env_id(env)), _env_id(env), **{**self.PRESET, **translated})

    @classmethod
    def algo_for(cls, env: str) -> str:
        """The registered algorithm this name trains on ``env``."""
        assert cls.ALGO is not None
        return cls.ALGO


class _BoltsDQN(_BoltsModule):
    """The DQN family's Bolts keywords. Bolts copies the target network every ``sync_rate`` steps: as jaderl's
    ``target_update_every``, it leaves out a zoo entry's ``tau`` (an entry that averages the target instead), so the
    target is copied unless ``tau`` is given too."""

    BOLTS_KEYWORDS: ClassVar[dict[str, str]] = {
        **_BoltsModule.BOLTS_KEYWORDS, "eps_start": "epsilon_start", "eps_end": "epsilon_end",
        "eps_last_frame": "epsilon_decay_steps", "sync_rate": "target_update_every", "batch_size": "batch_size",
        "replay_size": "buffer_size", "warm_start_size": "warmup_steps", "n_steps": "n_step"}


_PG_KEYWORDS = {**_BoltsModule.BOLTS_KEYWORDS, "lr": "lr", "entropy_beta": "ent_coef", "critic_beta": "vf_coef"}


class DQN(_BoltsDQN):
    """Deep Q-Network (jaderl ``dqn``): ``DQN("CartPole-v1")``."""

    ALGO = "dqn"


class DoubleDQN(_BoltsDQN):
    """Double DQN (jaderl ``double_dqn``)."""

    ALGO = "double_dqn"


class DuelingDQN(_BoltsDQN):
    """Dueling DQN (jaderl ``dueling_dqn``)."""

    ALGO = "dueling_dqn"


class NoisyDQN(_BoltsDQN):
    """Noisy DQN (jaderl ``noisy_dqn``: noisy layers explore, epsilon is 0)."""

    ALGO = "noisy_dqn"


class PERDQN(_BoltsDQN):
    """DQN with prioritized experience replay (jaderl ``dqn`` with ``use_per=True``)."""

    ALGO = "dqn"
    PRESET: ClassVar[dict[str, Any]] = {"use_per": True}


class Reinforce(_BoltsModule):
    """REINFORCE, Monte-Carlo policy gradient without a baseline (jaderl ``reinforce``)."""

    ALGO = "reinforce"
    BOLTS_KEYWORDS = _PG_KEYWORDS


class VanillaPolicyGradient(_BoltsModule):
    """Vanilla policy gradient: REINFORCE with a value baseline and an entropy bonus (jaderl ``vpg``)."""

    ALGO = "vpg"
    BOLTS_KEYWORDS = _PG_KEYWORDS


class AdvantageActorCritic(_BoltsModule):
    """Synchronous advantage actor-critic (jaderl ``a2c``)."""

    ALGO = "a2c"
    BOLTS_KEYWORDS = _PG_KEYWORDS


class SAC(_BoltsModule):
    """Soft Actor-Critic: jaderl ``sac`` on continuous actions, ``sac_discrete`` on discrete ones.

    Bolts' ``policy_learning_rate`` and ``q_learning_rate`` both set jaderl's ``lr``, the one learning rate of the
    actor, the critics and the entropy coefficient: either alone sets it for all three, and both together must be
    equal (differing rates are refused)."""

    ALGO = "sac"
    BOLTS_KEYWORDS: ClassVar[dict[str, str]] = {
        **_BoltsModule.BOLTS_KEYWORDS, "policy_learning_rate": "lr", "q_learning_rate": "lr",
        "batch_size": "batch_size", "replay_size": "buffer_size", "warm_start_size": "warmup_steps",
        "target_alpha": "tau"}

    @classmethod
    def algo_for(cls, env: str) -> str:
        probe = make_env(env, 1)
        try:
            return "sac_discrete" if probe.spec.is_discrete else "sac"
        finally:
            probe.close()


BOLTS_NAMES: dict[str, type[_BoltsModule]] = {
    cls.__name__: cls for cls in (DQN, DoubleDQN, DuelingDQN, NoisyDQN, PERDQN, Reinforce, VanillaPolicyGradient,
                                  AdvantageActorCritic, SAC)}
"""Every Lightning Bolts RL model name and its class here."""

__all__ = [
    "BOLTS_NAMES",
    "DQN",
    "PERDQN",
    "SAC",
    "AdvantageActorCritic",
    "DoubleDQN",
    "DuelingDQN",
    "JaderlModule",
    "NoisyDQN",
    "Reinforce",
    "SafetensorsCheckpointIO",
    "VanillaPolicyGradient",
]
