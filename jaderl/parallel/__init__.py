"""Parallel trainers beyond one process: explorer/learner/evaluator pipelines (:mod:`jaderl.parallel.pipeline`),
data-parallel learners (:mod:`jaderl.parallel.ddp`) and model fusion (:mod:`jaderl.parallel.fusion`)."""
