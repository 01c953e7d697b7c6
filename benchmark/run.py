"""Run a PPO script on several environments and seeds, keep every run's output, skip finished runs.

    python benchmark/run.py --env-ids CartPole-v1 Acrobot-v1 \\
        --command "python ppo/ppo.py --total-timesteps 500000" --num-seeds 3 --workers 2
    python benchmark/run.py ... --dry-run    # print the commands, run nothing
    python benchmark/run.py --quick          # the whole pipeline on a tiny budget, in a temp dir
    python benchmark/run.py ... --slurm --partition gpu --gpus 1 --time 12:00:00  # on Slurm

While runs go, each one's step and time left (from the progress line in its log) and the
whole benchmark's are shown: live on one line in a terminal, as a few lines a minute
elsewhere (CI, Slurm).

Each run is `<command> --env-id ID --seed S`, started in --workdir (default: the current directory,
so its TensorBoard logs land in ./runs/) with OMP_NUM_THREADS=1, since parallel runs would otherwise
fight over cores; an OMP_NUM_THREADS you set, or a Slurm task's --cpus-per-task, is passed on
instead. Its stdout and stderr go to `<log-dir>/<variant>/<env id>__seed<S>.log`; when it exits 0 a
`.done` marker is written beside the log, and a later invocation with the same command skips it.
Each run is also given `--save-model --save-minutes M` (--save-minutes, default 10), so it keeps a
checkpoint no older than M minutes, and a later invocation continues a run that has a checkpoint and
no marker with `--resume`, from where it stopped, instead of starting it again (its log goes on).
Ctrl-C, `kill` or SIGUSR1 to the runner asks its runs to save and stop (it waits for them; a second
Ctrl-C or `kill` stops them at once), and it exits 130. So an interrupted benchmark is resumed by
running the same command again, and loses at most the work since each run's last checkpoint.

Paths to scripts in the command are relative to where run.py is started (normally the repository
root), also with --workdir. Standard library only, so it works before anything else is installed (it
reads the exit codes from ppo/exits.py, which imports nothing else at its top).

With --slurm the runs are not started here: they are submitted as one Slurm job array, a task per
run not finished earlier, and a report job that runs after the array (benchmark/slurm_template.sh is
the job scripts' template). Each task calls this runner with `--task-index N`, which does run N
exactly as a run here: same command, working directory, log, checkpoint and .done marker. So runs
done by Slurm and runs done here skip and continue each other, and benchmark/report.py reads both
alike. Slurm warns each task --warning-seconds before its time limit (SIGUSR1): its run saves and
stops, and with --requeue the task puts itself back in the queue, to continue the run when it starts
again; without, submitting the same command again continues it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

# The runner's parts, one concern a module (standard library only, as this command is), in
# benchmark/runner/: run_plan.py (the runs and the benchmark's plan), local.py (running them here),
# slurm.py (the job array); and benchmark/common.py (wrong input, directories), which the commands
# share. This file is the command: its options and main. Imports go one way: common, run_plan, then
# local and slurm, then this file.
from benchmark.runner import local, slurm
from benchmark.common import WrongInput, fail, make_directory, refuse, refuse_a_file
from benchmark.runner.run_plan import (QUICK_ARGS, QUICK_ENV_IDS, QUICK_SEEDS, Benchmark, Run,
                                       quick_benchmark)
# The scripts' exit codes, declared once, in ppo_utils/exits.py (standard library only, as this
# runner is): WRONG_INPUT (2); STOPPED (130), a run or a runner that stopped because it was asked
# to, before its end: the same command continues it; DIVERGED (3), a run whose network became
# non-finite. Such a run is over: its checkpoint is the last good one, and continuing from it with
# the same settings would diverge again, so it gets a marker as a finished run does and is not
# started again.
from ppo_utils.exits import STOPPED


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-ids", nargs="+", metavar="ID", help="environments to run on")
    parser.add_argument("--command", help='the command to run, e.g. "python ppo/ppo.py '
                        '--total-timesteps 500000"; `--env-id ID --seed S` is appended to it')
    # The defaults of the options that plan the runs are filled in below, after the check that the
    # quick mode, which plans its own runs, is not given one of them.
    parser.add_argument("--num-seeds", type=int, help="seeds per environment (default 3)")
    parser.add_argument("--start-seed", type=int, help="the first seed (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--log-dir", type=Path,
                        help="where run logs and .done markers go (default benchmark/logs)")
    parser.add_argument("--workdir", type=Path,
                        help="directory the runs start in, so their runs/ lands there (default .)")
    parser.add_argument("--force", action="store_true",
                        help="rerun runs that finished earlier too, and start unfinished ones "
                        "again rather than continue them")
    parser.add_argument("--save-minutes", type=float, default=10, metavar="M",
                        help="runs write a checkpoint at least every M minutes (--save-model "
                        "--save-minutes M), and an unfinished run continues from it; a stop loses "
                        "at most that much of a run (default 10; 0: no checkpoint, an unfinished "
                        "run starts again)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands and run nothing (with --slurm: write the job "
                        "scripts, submit nothing)")
    parser.add_argument("--quick", action="store_true",
                        help="run the whole pipeline (runs, report, plots) with ppo.py on "
                        f"{' and '.join(QUICK_ENV_IDS)}, {QUICK_SEEDS} seeds, "
                        f"{' '.join(QUICK_ARGS)}, in a temporary directory")
    parser.add_argument("--quick-dir", type=Path,
                        help="with --quick: use this directory instead of a temporary one")
    slurm.add_slurm_options(parser)
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check: the options that go together, each number in its range; and
    the planning options' defaults, filled in once the quick mode is known not to have been
    given one."""
    planning = [flag for flag, value in [("--env-ids", args.env_ids), ("--command", args.command),
                                         ("--num-seeds", args.num_seeds),
                                         ("--start-seed", args.start_seed),
                                         ("--workdir", args.workdir), ("--log-dir", args.log_dir)]
                if value is not None]
    if args.quick and planning:
        parser.error(f"{', '.join(planning)}: not with --quick, which runs its own fixed plan "
                     "(--quick-dir says where)")
    if args.quick_dir is not None and not args.quick:
        parser.error("--quick-dir: only with --quick")
    if not args.quick and (not args.env_ids or not args.command):
        parser.error("--env-ids and --command are required (or use --quick)")
    defaults = {"num_seeds": 3, "start_seed": 1, "log_dir": Path("benchmark/logs"),
                "workdir": Path(".")}
    for name, default in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.workers < 1 or args.num_seeds < 1:
        parser.error("--workers and --num-seeds must be at least 1")
    slurm_only = [flag for flag, value in [("--partition", args.partition), ("--gpus", args.gpus),
                                           ("--cpus-per-task", args.cpus_per_task),
                                           ("--time", args.time),
                                           ("--slurm-template", args.slurm_template),
                                           ("--report-dir", args.report_dir)]
                  if value is not None]
    if slurm_only and not args.slurm:
        parser.error(f"{', '.join(slurm_only)}: only with --slurm")
    if (args.gpus is not None and args.gpus < 1) \
            or (args.cpus_per_task is not None and args.cpus_per_task < 1):
        parser.error("--gpus and --cpus-per-task must be at least 1")
    if not 0 <= args.save_minutes < float("inf"):
        parser.error(f"--save-minutes must be 0 (no checkpoints) or more, got {args.save_minutes}")
    if not 0 <= args.warning_seconds <= 65535:  # what sbatch takes
        parser.error(f"--warning-seconds must be 0 to 65535, got {args.warning_seconds}")
    if args.requeue and not (args.slurm or args.task_index is not None):
        parser.error("--requeue: only with --slurm")
    if args.task_index is not None and (args.slurm or args.quick or args.dry_run):
        parser.error("--task-index does one run here: "
                     "it does not go with --slurm, --quick or --dry-run")


def dry_run(bench: Benchmark, runs: list[Run], args: argparse.Namespace) -> int:
    """--dry-run: the commands, nothing run."""
    # A dry run makes nothing, but says what a run would meet.
    refuse_a_file(bench.workdir, "--workdir")
    refuse_a_file(bench.log_dir, "--log-dir")
    local.print_commands(runs, bench.workdir, args.force)
    if args.quick and args.quick_dir is None:
        bench.workdir.rmdir()  # made only to name it in the commands; a real run makes its own
        print(f"dry run: {bench.workdir} removed again; a real run makes a new temporary directory")
    return 0


def main(argv: list[str] | None = None) -> int:
    # First of all: Slurm may warn a task of its time limit as soon as it starts.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, local.stop_on_signal)
    try:
        return run_benchmark(parse_args(argv))
    except WrongInput as error:
        return refuse("run.py", error)


def run_benchmark(args: argparse.Namespace) -> int:
    """The runs here, one Slurm task's run (--task-index), their commands (--dry-run), or the job
    array (--slurm); returns the exit code."""
    if args.slurm:
        # What a submission needs is checked before anything is written.
        template = slurm.read_template(args.slurm_template or slurm.SLURM_TEMPLATE)
        program = None if args.dry_run else slurm.find_sbatch()
    if args.quick:
        bench = quick_benchmark(args.quick_dir, shared=args.slurm, save_minutes=args.save_minutes)
        report_dir = args.report_dir or bench.workdir / "results"
        print(f"quick benchmark in {bench.workdir}: {bench.command}", flush=True)
    else:
        seeds = list(range(args.start_seed, args.start_seed + args.num_seeds))
        bench = Benchmark(args.command, args.env_ids, seeds, args.workdir, args.log_dir,
                          args.save_minutes)
        report_dir = args.report_dir or bench.workdir / "results"
    if args.slurm:
        made_for_this_submission = bench.workdir if args.quick and args.quick_dir is None else None
        return slurm.submit(bench, report_dir, args, template, program, made_for_this_submission)
    runs = bench.runs()
    if args.task_index is not None:
        if not 0 <= args.task_index < len(runs):
            fail(f"--task-index {args.task_index} is out of range: "
                 f"this benchmark has runs 0 to {len(runs) - 1}")
        runs = [runs[args.task_index]]
    if args.dry_run:
        return dry_run(bench, runs, args)
    make_directory(bench.workdir, "--workdir")
    make_directory(bench.log_dir, "--log-dir")
    try:
        counts = local.run_all(runs, args.workers, bench.workdir, args.force)
    except KeyboardInterrupt as stop:
        for signum in (signal.SIGTERM, signal.SIGUSR1):  # the runs have saved: nothing more to stop
            signal.signal(signum, signal.SIG_IGN)
        unfinished = [run for run in runs if not run.finished_earlier()]
        if args.requeue and unfinished and isinstance(stop, local.Stopped) \
                and stop.args[0] == signal.SIGUSR1:
            slurm.requeue_this_task()
        return STOPPED
    print(local.summary_line(counts), flush=True)
    if counts["failed"] or counts.get("diverged"):
        return 1
    if counts.get("stopped"):
        return STOPPED
    if args.quick:
        # The quick mode is the whole pipeline: the report and its plots too.
        report = subprocess.run(bench.report_command(report_dir))
        if report.returncode != 0:
            return report.returncode
        print(f"quick benchmark done: report in {report_dir} (its runs are {QUICK_ARGS[1]} steps, "
              "to check the pipeline: 'below' the published returns is expected)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
