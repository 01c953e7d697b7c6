#!/bin/bash
# Run from the repository root on a GPU machine, with OUT set to a folder for the logs
# (docs/notes/gpu.md has the figures this gave). Re-checks the scripts after changes made on a CPU:
# the first checks and the short speed rows (first.sh with ROWS=short), then Breakout-v5
# --cudagraphs alternating the scripts of cbe6116 and of the checkout on the same warm machine.
# cbe6116's scripts are expected in .gpu/base, made beforehand on the CPU machine with
#   mkdir -p .gpu/base && git archive cbe6116 ppo benchmark/speed.py | tar -x -C .gpu/base
T0=$(date +%s)
ROWS=short LIMIT=${FIRST_LIMIT:-250} CHECK_LIMIT=150 bash benchmark/gpu/first.sh \
    > $OUT/first.out 2>&1
CHECKOUT=$(git rev-parse --short HEAD 2>/dev/null || echo HEAD)
echo "# Breakout-v5 --cudagraphs, 10,240 steps (2 warm-up iterations, 3 measured), alternating" \
     "cbe6116 (.gpu/base) and $CHECKOUT (.), one warm machine" > $OUT/ab.txt
for r in .gpu/base . .gpu/base .; do
  [ $(( $(date +%s) - T0 )) -lt ${AB_UNTIL:-430} ] \
      || { echo "SKIPPED (time) $r" >> $OUT/ab.txt; continue; }
  echo "===== $r" >> $OUT/ab.txt
  timeout 100 python3 $r/benchmark/speed.py --devices cuda --scripts ppo_atari_envpool.py \
      --env-id Breakout-v5 --options cudagraphs --total-timesteps 10240 --warmup-iterations 2 \
      --raw-seconds 5 2>&1 | grep "^| ppo" >> $OUT/ab.txt
done
echo "call took $(( $(date +%s) - T0 )) s" >> $OUT/ab.txt
