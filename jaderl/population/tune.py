"""Ray Tune interop: :class:`JaderlTrainable` trains any registered jaderl algorithm under Tune's own schedulers and
searchers (ASHA, PB2, PBT, Optuna ...).

    from ray import tune
    from jaderl.population.tune import JaderlTrainable

    tuner = tune.Tuner(JaderlTrainable, param_space={
        "algo": "ppo", "env": "jaderl/CartPole-v1", "period": 10_000,     # one Tune iteration = 10,000 env steps
        "lr": tune.loguniform(1e-4, 1e-2), "num_envs": 8,               # any config field
    }, tune_config=tune.TuneConfig(metric="eval_return", mode="max", scheduler=ASHAScheduler(), num_samples=8))

Each iteration trains ``period`` env steps and reports ``eval_return`` (the evaluation at its end),
``best_eval_return`` and ``env_steps``. A Tune checkpoint is the Trainer's whole state as jaderl writes it, with the
run's best policy (safetensors + JSON, nothing pickled), so ``jaderl.load(CHECKPOINT_DIR, best=False)`` reads one too;
a trial that restores another's checkpoint (Tune's PBT exploit) takes that trial's evaluations and best policy.
Changing only the algorithm's mutable hyperparameters of a trial (Tune's PBT) happens in place, through
``Trainer.set_hyperparameters``, and a restored checkpoint keeps them. Importing this module needs Ray
(``pip install 'jaderl[ray]'``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jaderl.api import ALGOS, make_config
from jaderl.core.checkpoint import CHECKPOINT_JSON, load_checkpoint, save_checkpoint
from jaderl.core.loop import Trainer
from jaderl.population.cluster import require_ray
from jaderl.population.member import read_best_policy, write_best_policy

require_ray()
from ray import tune  # noqa: E402  (after the one-sentence check of the optional extra)

TRIAL_KEYS = ("algo", "env", "period")
"""Keys of a trial's config that are not config fields: the algorithm, the env and the env steps per iteration."""


class JaderlTrainable(tune.Trainable):  # type: ignore[misc]
    """A jaderl Trainer as a Tune trainable; the trial's config names ``algo``, ``env``, ``period`` (env steps per
    iteration, default 10,000) and any config fields. The run directory is ``run/`` in the trial's directory; a trial
    that Tune starts again in a new actor continues there."""

    def setup(self, config: dict[str, Any]) -> None:
        self.trial = {k: config.get(k) for k in TRIAL_KEYS}
        self.fields = {k: v for k, v in config.items() if k not in TRIAL_KEYS}
        self.period = int(config.get("period", 10_000))
        run_dir = Path(self.logdir) / "run"
        resume = (run_dir / CHECKPOINT_JSON).exists()  # the trial ran before, in an actor that is gone
        if not resume and run_dir.exists():  # (that actor died before its first checkpoint)
            shutil.rmtree(run_dir)
        settings = {"eval_every": self.period, "checkpoint_every": self.period, **self.fields, "run_dir": str(run_dir)}
        cfg = make_config(config["algo"], config["env"], **settings)
        self.trainer = Trainer(cfg, ALGOS[cfg.algo].agent_cls, resume=resume)

    def step(self) -> dict[str, Any]:
        result = self.trainer.run(steps=self.period)
        return {"eval_return": self.trainer.last_eval, "best_eval_return": result.best_eval_return,
                "env_steps": result.steps, "done": result.stop_reason in ("total_steps", "solved", "time_limit")}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """The Trainer's state with the run's best policy (``best_policy``: its tensors and metadata, None before the
        first evaluation), which goes with the evaluation history to a trial that restores this checkpoint."""
        state = {**self.trainer.state_dict(), "best_policy": read_best_policy(self.trainer.run_dir)}
        save_checkpoint(checkpoint_dir, state, self.trainer.agent.steps)

    def load_checkpoint(self, checkpoint: Any) -> None:
        """Continue from ``checkpoint`` with this trial's hyperparameters: Tune's PBT sets the explored ones
        (``reset_config``) before it restores the copied checkpoint, whose own values they replace. The
        checkpoint's best policy replaces the run's, as a copy in jaderl's own PBT takes its parent's, so the best
        policy and the best score (``best_eval_return``) both come from the evaluations the checkpoint holds."""
        state = load_checkpoint(checkpoint, self.trainer.device)
        if "best_policy" in state:
            write_best_policy(self.trainer.run_dir, state.pop("best_policy"))
        self.trainer.resume_from(state)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Take a new config: in place when only mutable hyperparameters of the same trial change (Tune's PBT);
        otherwise (another trial reusing this actor, other settings) with a new Trainer in this process."""
        fields = {k: v for k, v in new_config.items() if k not in TRIAL_KEYS}
        mutable = self.trainer.agent.hyperparameters
        same = {k: v for k, v in fields.items() if k not in mutable} == \
            {k: v for k, v in self.fields.items() if k not in mutable}
        same = same and {k: new_config.get(k) for k in TRIAL_KEYS} == self.trial \
            and self.trainer.run_dir == Path(self.logdir) / "run"
        if not same:
            self.trainer.close(plot=False)  # (the other trial is paused: its curve is drawn when it ends)
            self.setup(new_config)
            return True
        if changed := {k: v for k, v in fields.items() if k in mutable and v != getattr(self.trainer.config, k)}:
            self.trainer.set_hyperparameters(**changed)
        self.fields = fields
        return True

    def cleanup(self) -> None:
        self.trainer.close()
