"""jaderl: massively parallel deep reinforcement learning in PyTorch."""

from jaderl.api import evaluate, load, make_config, resume, train

__version__ = "0.1.0"
__all__ = ["__version__", "evaluate", "load", "make_config", "resume", "train"]
