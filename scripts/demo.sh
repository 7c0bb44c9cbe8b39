#!/usr/bin/env bash
# The main job: train SAC on the built-in torch Pendulum until it is solved (or 30k steps), printing progress.
# Leaves runs/demo-pendulum-<time>/ with metrics.csv, learning_curve.png, TensorBoard logs and a checkpoint.
source "$(dirname "$0")/venv.sh"
jaderl train sac jaderl/Pendulum-v1 --target-return -200 --total-steps 30000 --eval-every 1000 \
  --set hidden=[64,64] --set lr=0.001 --run-dir "runs/demo-pendulum-$(date +%Y%m%d-%H%M%S)" "$@"
