"""Ways out of jaderl for a trained agent: its policy as one file that serves without jaderl (ONNX or TorchScript,
:mod:`jaderl.integrations.export`) and videos of it acting (:mod:`jaderl.integrations.video`). See docs/deploy.md."""

from jaderl.integrations.export import export_policy
from jaderl.integrations.video import record

__all__ = ["export_policy", "record"]
