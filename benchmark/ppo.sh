#!/usr/bin/env bash
# Benchmark the PPO variants on the environments of the published result tables (3 seeds each),
# then write the report (tables and learning curves) to docs/results/, where the docs site shows
# them.
#
#   bash benchmark/ppo.sh                      # list the families and whether their script exists
#   bash benchmark/ppo.sh classic              # one family; several: ... classic mujoco
#   bash benchmark/ppo.sh all                  # every family whose script exists
#   bash benchmark/ppo.sh --workers 2 classic  # runs at a time (or WORKERS=2); default 1
#   bash benchmark/ppo.sh --dry-run classic    # print the commands only
#   bash benchmark/ppo.sh quick                # the whole pipeline on a tiny budget, in a temp dir
#   bash benchmark/ppo.sh --slurm classic      # submit to Slurm: a job array per family, the report
#   bash benchmark/ppo.sh --slurm --partition gpu --gpus 1 --cpus-per-task 4 --time 12:00:00 atari
#   bash benchmark/ppo.sh --slurm --requeue --time 12:00:00 atari  # a task at its limit requeues
#
# Runs start in benchmark/logs/ (BENCH_WORKDIR), so their TensorBoard logs go to
# benchmark/logs/runs/, apart from ad-hoc runs in ./runs/; their output logs and .done markers go to
# benchmark/logs/ too. Only the TensorBoard logs are committed: docs/results/ is made from them.
# Running the same family again skips the runs that already finished and continues the others from
# their checkpoints (every run keeps one at most --save-minutes M old, default 10; Ctrl-C lets the
# runs save before they stop). NUM_SEEDS (default 3) and PYTHON (default python) can be set.
# With --slurm nothing runs here: benchmark/run.py --slurm writes and submits each family's job
# array (a task per run, the same command, log and .done marker) and a report job that runs after
# it; --partition, --gpus, --cpus-per-task, --time, --slurm-template FILE, --warning-seconds S and
# --requeue go to it (see benchmark/run.py --help).
# The script works from the repository root, but a path you give it (--slurm-template FILE, a PYTHON
# or BENCH_WORKDIR with a relative path) is read from the directory you run it in.
set -euo pipefail

CALLER_DIR=$PWD
# A path the user gave, as meant from where ppo.sh was run (the script cds to the repository root).
from_caller() {
    if [[ $1 == /* ]]; then echo "$1"; else echo "$CALLER_DIR/$1"; fi
}
# PYTHON is a command: a bare name is looked up on PATH, only a path with a slash is a path.
PYTHON=${PYTHON:-python}
if [[ $PYTHON == */* ]]; then PYTHON=$(from_caller "$PYTHON"); fi
if [[ -n ${BENCH_WORKDIR:-} ]]; then BENCH_WORKDIR=$(from_caller "$BENCH_WORKDIR"); fi
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-1}
NUM_SEEDS=${NUM_SEEDS:-3}
BENCH_WORKDIR=${BENCH_WORKDIR:-benchmark/logs}

FAMILIES=(classic atari lstm envpool mujoco procgen multigpu multidiscrete)
declare -A SCRIPT ENVS COMMAND TIME
# How long one run takes, from the committed runs' SPS on a 2-core CPU (docs/results); no GPU run
# has been timed yet. A family is its environments x NUM_SEEDS runs, WORKERS at a time.
SCRIPT[classic]=ppo/ppo.py
ENVS[classic]="CartPole-v1 Acrobot-v1 MountainCar-v0"
COMMAND[classic]="python ppo/ppo.py --total-timesteps 500000"
TIME[classic]="about 2 min a run on a CPU"

SCRIPT[atari]=ppo/ppo_atari.py
ENVS[atari]="BreakoutNoFrameskip-v4 PongNoFrameskip-v4 BeamRiderNoFrameskip-v4"
COMMAND[atari]="python ppo/ppo_atari.py --total-timesteps 10000000"
TIME[atari]="13 to 19 h a run on a CPU (214 SPS idle, 144 loaded); on a GPU: not measured"

SCRIPT[lstm]=ppo/ppo_atari_lstm.py
ENVS[lstm]="BreakoutNoFrameskip-v4 PongNoFrameskip-v4 BeamRiderNoFrameskip-v4"
COMMAND[lstm]="python ppo/ppo_atari_lstm.py --total-timesteps 10000000"
TIME[lstm]="about 6 h a run on a CPU (489 SPS); on a GPU: not measured"

SCRIPT[envpool]=ppo/ppo_atari_envpool.py
ENVS[envpool]="Breakout-v5 Pong-v5 BeamRider-v5"
COMMAND[envpool]="python ppo/ppo_atari_envpool.py --total-timesteps 10000000"
TIME[envpool]="about 12 h a run on a CPU (237 SPS); on a GPU: not measured"

SCRIPT[mujoco]=ppo/ppo_continuous_action.py
ENVS[mujoco]="Hopper-v4 Walker2d-v4 HalfCheetah-v4"
COMMAND[mujoco]="python ppo/ppo_continuous_action.py --total-timesteps 1000000"
TIME[mujoco]="8 to 10 min a run on a CPU"

SCRIPT[procgen]=ppo/ppo_procgen.py
ENVS[procgen]="starpilot bossfight bigfish"
COMMAND[procgen]="python ppo/ppo_procgen.py --total-timesteps 25000000"
TIME[procgen]="about 38 h a run on a CPU (185 SPS); on a GPU: not measured"

SCRIPT[multigpu]=ppo/ppo_atari_multigpu.py
ENVS[multigpu]="BreakoutNoFrameskip-v4 PongNoFrameskip-v4 BeamRiderNoFrameskip-v4"
COMMAND[multigpu]="torchrun --standalone --nnodes=1 --nproc_per_node=2 ppo/ppo_atari_multigpu.py"
COMMAND[multigpu]+=" --total-timesteps 10000000"
TIME[multigpu]="not measured (2 processes; on GPUs)"

SCRIPT[multidiscrete]=ppo/ppo_multidiscrete.py
ENVS[multidiscrete]="Jumanji/Cleaner-v0"
COMMAND[multidiscrete]="python ppo/ppo_multidiscrete.py --total-timesteps 500000"
TIME[multidiscrete]="4 to 6 min a run on a CPU (1,500 to 2,200 SPS, two runs at a time)"

list_families() {
    local family  # not the caller's loop variable
    echo "usage: bash benchmark/ppo.sh [--workers K] [--dry-run] FAMILY [FAMILY ...] | all | quick"
    echo "       bash benchmark/ppo.sh --slurm [--partition P] [--gpus N] [--cpus-per-task N]" \
         "[--time T]"
    echo "                             [--slurm-template FILE] [--warning-seconds S] [--requeue]" \
         "[--dry-run]"
    echo "                             FAMILY [FAMILY ...] | all | quick"
    echo "       --save-minutes M (both): each run keeps a checkpoint at most M minutes old" \
         "(default 10)"
    echo
    printf '  %-13s %-7s %s\n' family status "command (+ --env-id ID --seed S, seeds 1..$NUM_SEEDS)"
    for family in "${FAMILIES[@]}"; do
        if [[ -f ${SCRIPT[$family]} ]]; then status=ready; else status=missing; fi
        printf '  %-13s %-7s %s\n' "$family" "$status" "${COMMAND[$family]}"
        printf '  %-13s %-7s   on %s\n' "" "" "${ENVS[$family]}"
        printf '  %-13s %-7s   %s\n' "" "" "${TIME[$family]}"
    done
    printf '  %-13s %-7s %s\n' quick ready \
        "ppo/ppo.py on CartPole-v1 and Acrobot-v1, 2 seeds, 2048 steps (CI-sized)"
    local below="its report says 'below' the published returns: 2048 steps are not meant to learn"
    printf '  %-13s %-7s   %s\n' "" "" "under a minute; $below"
}

dry_run=()
saving=()
use_slurm=0
slurm=()
selected=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --workers)
            if [[ $# -lt 2 ]]; then echo "ppo.sh: error: --workers needs a value" >&2; exit 2; fi
            WORKERS=$2; shift 2 ;;
        --workers=*) WORKERS=${1#*=}; shift ;;
        --dry-run) dry_run=(--dry-run); shift ;;
        --slurm) use_slurm=1; slurm+=(--slurm); shift ;;
        --requeue) slurm+=(--requeue); shift ;;
        # run.py checks these options and says what is wrong with them.
        --save-minutes)
            if [[ $# -lt 2 ]]; then echo "ppo.sh: error: $1 needs a value" >&2; exit 2; fi
            saving=("$1" "$2"); shift 2 ;;
        --save-minutes=*) saving=("$1"); shift ;;
        --partition|--gpus|--cpus-per-task|--time|--slurm-template|--warning-seconds)
            if [[ $# -lt 2 ]]; then echo "ppo.sh: error: $1 needs a value" >&2; exit 2; fi
            if [[ $1 == --slurm-template ]]; then
                slurm+=("$1" "$(from_caller "$2")")
            else
                slurm+=("$1" "$2")
            fi
            shift 2 ;;
        --slurm-template=*) slurm+=(--slurm-template "$(from_caller "${1#*=}")"); shift ;;
        --partition=*|--gpus=*|--cpus-per-task=*|--time=*|--warning-seconds=*)
            slurm+=("$1"); shift ;;
        -h|--help) list_families; exit 0 ;;
        -*)
            echo "ppo.sh: error: unknown option '$1': the options are --workers K, --dry-run," \
                 "--save-minutes, --slurm, --partition, --gpus, --cpus-per-task, --time," \
                 "--slurm-template, --warning-seconds, --requeue (bash benchmark/ppo.sh --help)" >&2
            exit 2 ;;
        all) selected+=("${FAMILIES[@]}"); shift ;;
        *) selected+=("$1"); shift ;;
    esac
done

if [[ ${#selected[@]} -eq 0 ]]; then
    list_families
    exit 0
fi

for family in "${selected[@]}"; do
    if [[ $family != quick && -z ${SCRIPT[$family]+set} ]]; then
        list_families >&2
        echo "ppo.sh: error: unknown family '$family': pick from the list above" >&2
        exit 2
    fi
done

# run.py's exit code 2 means wrong input, or Slurm refusing a job: it would be the same for the next
# family, so stop there, with that code. 130 means Ctrl-C (or kill), which run.py catches to let its
# runs save and stop: bash then does not see the interrupt itself, so stop here too, without a
# report.
run() {
    local code=0
    "$PYTHON" benchmark/run.py "$@" || code=$?
    if [[ $code -eq 2 || $code -eq 130 ]]; then exit "$code"; fi
    return $code
}

ran=0
failed=()
for family in "${selected[@]}"; do
    if [[ $family == quick ]]; then
        run --quick --workers "$WORKERS" "${saving[@]}" "${slurm[@]}" "${dry_run[@]}" \
            || failed+=(quick)
        continue
    fi
    if [[ ! -f ${SCRIPT[$family]} ]]; then
        echo "== $family: skipped, ${SCRIPT[$family]} is missing"
        continue
    fi
    echo "== $family: ${COMMAND[$family]} on ${ENVS[$family]}, $NUM_SEEDS seeds," \
         "$WORKERS at a time (${TIME[$family]})"
    # With --slurm, each family's report job writes the report of all under $BENCH_WORKDIR/runs.
    report_dir=()
    if [[ $use_slurm -eq 1 ]]; then report_dir=(--report-dir docs/results); fi
    ran=1
    # shellcheck disable=SC2086  # ENVS holds several ids on purpose
    run --env-ids ${ENVS[$family]} --command "${COMMAND[$family]}" \
        --num-seeds "$NUM_SEEDS" --workers "$WORKERS" --workdir "$BENCH_WORKDIR" \
        --log-dir benchmark/logs "${saving[@]}" "${slurm[@]}" "${report_dir[@]}" "${dry_run[@]}" \
        || failed+=("$family")
done

if [[ $ran -eq 1 && $use_slurm -eq 1 ]]; then
    echo "== report: by the report job above once its array is done, or by hand:"
    echo "   $PYTHON benchmark/report.py --runs-dir $BENCH_WORKDIR/runs --out-dir docs/results"
elif [[ $ran -eq 1 && ${#dry_run[@]} -eq 0 ]]; then
    echo "== report"
    "$PYTHON" benchmark/report.py --runs-dir "$BENCH_WORKDIR/runs" --out-dir docs/results \
        || failed+=(report)
fi

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "ppo.sh: failures in: ${failed[*]} (see the logs under benchmark/logs/)" >&2
    exit 1
fi
