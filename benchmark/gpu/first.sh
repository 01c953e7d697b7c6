#!/bin/bash
# Run from the repository root on a GPU machine, with OUT set to a folder for the logs
# (docs/notes/gpu.md has the figures these gave).
# The first checks of docs/notes/gpu.md, in parallel, then the speed rows, in order, each given what
# is left of the call's time (LIMIT seconds). ROWS=short keeps three rows that compare the changed
# scripts with the H100 table of that page. Everything is logged under $OUT.
START=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
. benchmark/gpu/machine.sh  # the GPU, cores and releases: $OUT/machine.txt
mkdir -p /tmp/checks && cd /tmp/checks
R=$OLDPWD
check() {
    local name=$1; shift
    (
        s=$(date +%s)
        timeout ${CHECK_LIMIT:-200} "$@" > /tmp/checks/$name.log 2>&1
        echo "[$name] exit $? after $(( $(date +%s) - s )) s" >> /tmp/checks/$name.log
    ) &
}
check ppo python3 $R/ppo/ppo.py --cudagraphs --total-timesteps 8192
check continuous python3 $R/ppo/ppo_continuous_action.py --env-id Hopper-v4 --cudagraphs \
    --total-timesteps 8192
check atari python3 $R/ppo/ppo_atari.py --cudagraphs --total-timesteps 4096
check lstm python3 $R/ppo/ppo_atari_lstm.py --cudagraphs --total-timesteps 4096
check multigpu torchrun --standalone --nproc-per-node 2 $R/ppo/ppo_atari_multigpu.py --cudagraphs \
    --device-ids 0 0 --total-timesteps 8192
check envpool python3 $R/ppo/ppo_atari_envpool.py --env-id Breakout-v5 --cudagraphs \
    --total-timesteps 40960
check multidiscrete python3 $R/ppo/ppo_multidiscrete.py --cudagraphs --total-timesteps 8192
wait
for f in /tmp/checks/*.log; do
    echo "===== $f"; grep -v "^step " $f | tail -40; grep "^step " $f | tail -2
done > $OUT/checks.txt 2>&1
cd $R
speed() {
    local t=$(left)
    [ $t -gt 40 ] || { echo "SKIPPED (time): $*"; return; }
    echo "===== $* (given $t s)"
    timeout $t python3 benchmark/speed.py --devices cuda "$@" 2>&1 | grep -v "^step "
}
if [ "${ROWS:-all}" = short ]; then
speed --scripts ppo_atari_envpool.py --env-id Breakout-v5 --options cudagraphs
speed --scripts ppo_atari.py --options async_envs+compile+cudagraphs
speed --scripts ppo_multidiscrete.py --options plain compile+cudagraphs
else
speed --scripts ppo_atari_envpool.py --env-id Breakout-v5 \
    --options plain async_envs compile cudagraphs async_envs+compile+cudagraphs
speed --scripts ppo_atari_envpool.py --env-id Pong-v5 --num-envs 16 \
    --set clip_coef=0.2 num_minibatches=8 update_epochs=3 \
    --options plain async_envs async_envs+compile+cudagraphs
speed --scripts ppo_atari.py --options plain async_envs async_envs+compile+cudagraphs
speed --scripts ppo_atari_lstm.py --options async_envs+compile+cudagraphs
fi > $OUT/speed.txt 2>&1
echo "call took $(( $(date +%s) - START )) s"
