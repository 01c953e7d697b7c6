#!/bin/bash
# Run from the repository root on a GPU machine, with OUT set to a folder for the logs
# (docs/notes/gpu.md has the figures these gave).
# GPU call 3: where an iteration's time goes in the Pong-v5 row with every speed option: cProfile of
# the training process over 163,840 steps (the first iterations compile), top functions by own time.
export PYTHONUNBUFFERED=1
R=$PWD; mkdir -p /tmp/prof && cd /tmp/prof
timeout ${LIMIT:-150} python3 -m cProfile -o $OUT/pong.prof $R/ppo/ppo_atari_envpool.py \
  --env-id Pong-v5 --clip-coef 0.2 --num-envs 16 --num-minibatches 8 --update-epochs 3 \
  --total-timesteps ${STEPS:-163840} $EXTRA 2>&1 | grep "^step" | tail -3 > $OUT/prof.log
python3 - >> $OUT/prof.log 2>&1 <<'PY'
import os, pstats
stats = pstats.Stats(os.environ["OUT"] + "/pong.prof")
stats.sort_stats("tottime").print_stats(25)
stats.sort_stats("cumulative").print_stats(30)
PY
