"""jaderl: massively parallel deep reinforcement learning in PyTorch."""

from jaderl.api import evaluate, load, make_config, resume, train
from jaderl.core.loop import Trainer
from jaderl.integrations import video as _video  # noqa: F401  (installs the recorder that record_every uses)

__version__ = "0.1.0"
__all__ = ["Trainer", "__version__", "evaluate", "load", "make_config", "resume", "train"]
