"""The core: the Trainer (:mod:`jaderl.core.loop`), the agent base and its seams (:mod:`jaderl.core.agent`),
configs, buffers, the evaluator, checkpoints and the shared networks."""
