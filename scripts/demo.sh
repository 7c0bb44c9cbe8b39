#!/usr/bin/env bash
# The main job: train PPO on the built-in torch Pendulum (64 batched sub-envs) until an evaluation reaches -200,
# printing progress. Leaves runs/demo-pendulum-<time>/ with metrics.csv, learning_curve.png, TensorBoard logs,
# the best policy and a checkpoint. Extra arguments go to `jaderl train` (e.g. --device cuda).
source "$(dirname "$0")/venv.sh"
jaderl train ppo jaderl/Pendulum-v1 --config configs/ppo_pendulum.yaml \
  --run-dir "runs/demo-pendulum-$(date +%Y%m%d-%H%M%S)" "$@"
