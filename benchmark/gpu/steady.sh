#!/bin/bash
# Run from the repository root on a GPU machine, with OUT set to a folder for the logs
# (docs/notes/gpu.md has the figures these gave).
# GPU call 4: the steady state of the rows that missed their targets, rollout against update
# (benchmark/gpu/steady.py) with the GPU's utilisation sampled alongside, then the speed rows again
# on this machine's GPU. Each part is given what is left of the call's time, in order of use.
START=$(date +%s); LIMIT=${LIMIT:-500}
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
rm -f /tmp/steady-*.prof
. benchmark/gpu/machine.sh  # the GPU, cores and releases: $OUT/machine.txt
nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 200 \
    > $OUT/utilization.csv 2>&1 &
SAMPLER=$!
PONG="--env-id Pong-v5 --num-envs 16 --set clip_coef=0.2 num_minibatches=8 update_epochs=3"
# ONLY: a pattern of the parts to run (default: all); at most 8 files come back from a call
part() {
    local name=$1 least=$2; shift 2
    local t=$(left)
    [[ $name == ${ONLY:-*} ]] || return
    [ $t -gt $least ] || { echo "SKIPPED (time): $name" >> $OUT/skipped.txt; return; }
    echo "===== $name (given $t s): $*" > $OUT/$name.txt
    timeout $t "$@" 2>&1 | grep -v "^step " >> $OUT/$name.txt
    echo "[$name] exit ${PIPESTATUS[0]} at $(( $(date +%s) - START )) s" >> $OUT/$name.txt
}
part steady-pong-all 90 python3 benchmark/gpu/steady.py $PONG \
    --options async_envs compile cudagraphs --warmup-iterations 20 --iterations 100 \
    --profile /tmp/steady-pong-all.prof
part steady-breakout-cudagraphs 50 python3 benchmark/gpu/steady.py --env-id Breakout-v5 \
    --options cudagraphs --warmup-iterations 10 --iterations 40 \
    --profile /tmp/steady-breakout-cudagraphs.prof
part speed-pong 80 python3 benchmark/speed.py --devices cuda --scripts ppo_atari_envpool.py $PONG \
    --options plain async_envs async_envs+compile+cudagraphs
part speed-breakout 80 python3 benchmark/speed.py --devices cuda --scripts ppo_atari_envpool.py \
    --env-id Breakout-v5 --options plain cudagraphs async_envs+compile+cudagraphs
part steady-pong-plain 40 python3 benchmark/gpu/steady.py $PONG --warmup-iterations 3 \
    --iterations 40 --profile /tmp/steady-pong-plain.prof
kill $SAMPLER
STATS="import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats('tottime').print_stats(25)"
STATS+="; s.sort_stats('cumulative').print_stats(40)"
for prof in /tmp/steady-*.prof; do
    python3 -c "$STATS" $prof > $OUT/$(basename ${prof%.prof})-stats.txt 2>&1
done
echo "call took $(( $(date +%s) - START )) s"
