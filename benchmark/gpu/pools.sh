#!/bin/bash
# One pool of 16 against two of 8 (--async-envs), both with --compile --cudagraphs, Pong-v5
# settings. Run from the repository root on a GPU machine, with OUT set to a folder for the logs
# (docs/notes/gpu.md has the figures this gave). TOTAL, WARM (warm-up iterations), OPTS and UNTIL
# (seconds) can be set.
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/pools.txt
PAIR="compile+cudagraphs async_envs+compile+cudagraphs"
for o in ${OPTS:-$PAIR $PAIR}; do  # by default the pair, then the pair again
  [ $(( $(date +%s) - T0 )) -lt ${UNTIL:-300} ] \
      || { echo "SKIPPED (time) $o" >> $OUT/pools.txt; continue; }
  timeout 110 python3 benchmark/speed.py --devices cuda --scripts ppo_atari_envpool.py \
     --env-id Pong-v5 --num-envs 16 --set clip_coef=0.2 num_minibatches=8 update_epochs=3 \
     --options $o --total-timesteps ${TOTAL:-20480} --warmup-iterations ${WARM:-2} \
     --raw-seconds 5 2>&1 | grep "^| ppo" >> $OUT/pools.txt
done
echo "call took $(( $(date +%s) - T0 )) s" >> $OUT/pools.txt
