"""Tune a PPO script's hyperparameters with Optuna, on one machine or as a Slurm job array.

    python benchmark/tune.py --command "python ppo/ppo.py" --env-ids CartPole-v1 \\
        --space benchmark/spaces/classic.toml --total-timesteps 50000 --seeds 2 --trials 25 \\
        --workers 2
    python benchmark/tune.py ... --slurm --workers 8 --time 4:00:00  # 8 workers as a job array
    python benchmark/tune.py --report --study-dir tuning/<study>     # the report of a study so far

A trial samples the flags of the search space (a TOML file, benchmark/spaces/ has three), then runs
`<command> <flags> --env-id ID --seed S --total-timesteps T --save-model --save-minutes M` for every
env id and for seeds 1 to --seeds (the same seeds in every trial, so that trials are compared on the
same seeds), one after the other, each in its own folder <study-dir>/trials/<trial>/<env>__seed<S>/,
whose runs/ then holds that one run. Its score is the mean over those (env, seed) runs of the final
return (benchmark/report.py's: the mean of the episodes of the last 10% of the steps), each env's
min-max normalized by the space file's [bounds]: (return - low) / (high - low). The mean, not the
median: with two or three seeds the median would hide the seed on which a setting collapses, and a
setting that fails one seed in three is not one to recommend.

While a run goes, its TensorBoard log is read every --poll-seconds: at --report-points evenly spaced
steps of its budget the normalized mean of the episodes that ended in the span before is reported to
Optuna (at step position x budget + step, so that each (env, seed) run has steps of its own), and a
run the pruner gives up is stopped by SIGTERM, its normal stop signal (it saves and exits 130): the
trial is PRUNED. A run that diverges (exit 3, the scripts' guard), refuses its flags (exit 2),
crashes or is killed makes the trial FAILED, the reason stored as its user attribute `failure`:
never a score, and the study goes on. A study that has its trials, all of them failed, ends with
exit code 2 and one line naming the first failure, after its report.

Before the first trial, every flag of the space and of --command, and those the tuner gives each
run, is looked up in the script's own `--help`: a flag the script does not take would fail every
trial, so it is refused in one line (exit 2). A run refusing the values sampled for it (exit 2:
sizes that do not divide) still fails only its trial.

--trials N is a total for the study: workers claim trials under a lock in the study folder, so that
together they make exactly N (complete, pruned and failed ones), and running the same command again
continues the study (a larger --trials adds to it). A worker that is lost (killed, preempted, its
node gone) stops touching its trial's heartbeat file; after --grace-seconds another worker marks the
trial FAILED and queues a retry with the same flags (writing the system attributes of Optuna's
RetryHeartbeatStaleTrialCallback). Optuna's own heartbeats exist for RDBStorage only, not for the
JournalStorage a study keeps by default, so the heartbeats are files beside the trials, on the
filesystem the workers share anyway. The retry takes over what the lost runs left: a run with a
checkpoint is continued from it (`--resume`); a run lost before its first checkpoint has its folder
moved aside (to set-aside/, named in the run's log and the worker's output) and starts afresh. A
retry whose continued run fails (its checkpoint unreadable, say) moves that folder aside too and is
itself retried, up to --max-retries. A worker asked to stop (Ctrl-C, `kill`, Slurm's warning) stops
its run the same way and queues the same retry.

Each complete trial keeps the wall time of its runs added up (each run's, as benchmark/report.py
reads it from its event files) and their mean SPS. At the end, and with --report, the study's report
goes to <study-dir>/report/: the best settings as the command that trains them, the best within the
wall time of the script's defaults (a trial whose flags all equal the defaults its --help shows; or
within --max-seconds), the top trials with their wall time and SPS, the failed and pruned ones with
their reasons, and plots of the optimization history, of score against wall time and of the
parameters' importances.
"""


from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import time
from pathlib import Path

# The tuner's parts, one concern a module, in benchmark/tuner/: the search space, the study (its
# storage, lock, heartbeats and retries), the runner of a trial's runs, the workers (here or on
# Slurm) and the report. This file is the command: its options, the checks before any trial, and
# main.
from benchmark import common  # what the commands share: wrong input, folders
from benchmark.runner import run_plan  # the runner's commands: resolved, checked, named
from benchmark.report import format_duration
from benchmark.common import fail  # wrong input: main prints it as tune.py's one line, exit 2
from benchmark.tuner import space
from benchmark.tuner.report import write_report
from benchmark.tuner.study import Tuning, fail_if_every_trial_failed, open_study
from benchmark.tuner.worker import Worker, run_local_workers, submit_to_slurm


# Over 60 lines since its options were wrapped at 100 characters: a statement per option, in the
# order --help lists them, reads better whole than split.
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", help="the script, or the command with fixed flags: "
                        '"python ppo/ppo.py --num-envs 8"; each run adds the sampled flags, '
                        "--env-id, --seed, --total-timesteps")
    parser.add_argument("--env-ids", nargs="+", metavar="ID",
                        help="environments every trial runs on")
    parser.add_argument("--space", type=Path,
                        help="the search space, a TOML file (benchmark/spaces/)")
    parser.add_argument("--total-timesteps", type=int, help="steps of each run")
    parser.add_argument("--seeds", type=int, default=2,
                        help="seeds per env in every trial: 1 to K (default 2)")
    parser.add_argument("--trials", type=int, default=20,
                        help="trials of the study in all, over every worker and invocation "
                        "(default 20)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes here, or Slurm tasks (default 1)")
    parser.add_argument("--study-name", help="default: <variant>-<env ids>-<steps>; "
                        "with --report, the study the storage holds")
    parser.add_argument("--study-dir", type=Path,
                        help="where trials, heartbeats, the journal and the report go; every "
                        "worker must see it (default tuning/<study name>)")
    parser.add_argument("--storage", help="a database URL (sqlite:///tune.db, postgresql://...) "
                        "or a journal file path (default: <study-dir>/journal.log)")
    parser.add_argument("--enqueue", action="append", default=[], metavar="FLAGS",
                        help="a trial to run with these values first, "
                        'e.g. "--learning-rate 2.5e-4" '
                        "(repeatable; flags of the space, the others sampled)")
    parser.add_argument("--pruner", choices=("median", "halving", "none"), default="median",
                        help="median (default), asynchronous successive halving, or none")
    parser.add_argument("--prune-startup-trials", type=int, default=5,
                        help="median: no pruning until this many trials have finished (default 5)")
    parser.add_argument("--prune-warmup", type=float, default=0.2,
                        help="median: no pruning in this fraction of the first run's steps "
                        "(default 0.2)")
    parser.add_argument("--sampler-startup-trials", type=int, default=8,
                        help="TPE samples at random until this many trials have finished "
                        "(default 8)")
    parser.add_argument("--sampler-seed", type=int, help="TPE's seed (worker i uses seed + i)")
    parser.add_argument("--report-points", type=int, default=10,
                        help="points per run reported to the pruner")
    parser.add_argument("--poll-seconds", type=float, default=2.0,
                        help="how often a run's log is read")
    parser.add_argument("--save-minutes", type=float, default=1.0,
                        help="runs keep a checkpoint at most this old, for a retried trial to "
                        "continue from")
    parser.add_argument("--heartbeat-seconds", type=float, default=10.0,
                        help="how often a worker says it lives (default 10)")
    parser.add_argument("--grace-seconds", type=float, default=60.0,
                        help="a trial without a heartbeat this long is failed and retried; it "
                        "must cover an iteration of a run, which a lost worker's run finishes "
                        "before it stops (default 60)")
    parser.add_argument("--max-retries", type=int, default=3, help="times a lost trial is retried")
    parser.add_argument("--report", action="store_true",
                        help="write and print the report of the study as it is")
    parser.add_argument("--max-seconds", type=float,
                        help="the report's time budget for a trial (its runs' wall time, added "
                        "up): it names the best settings within it (default: the wall time of the "
                        "script's defaults)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    add_slurm_options(parser)
    args = parser.parse_args(argv)
    # slurm.resource_lines reads it: workers are not requeued, their trials are
    args.requeue = False
    check_args(parser, args)
    return args


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    """--slurm and what the job array's scripts are made with."""
    slurm = parser.add_argument_group("Slurm",
                                      "submit the workers as a job array, not run them here")
    slurm.add_argument("--slurm", action="store_true",
                       help="a job array of --workers workers, and a report job after it")
    slurm.add_argument("--partition")
    slurm.add_argument("--gpus", type=int, help="GPUs per worker (#SBATCH --gres=gpu:N)")
    slurm.add_argument("--cpus-per-task", type=int, help="CPUs per worker (default 1)")
    slurm.add_argument("--time", help="time limit per worker, e.g. 12:00:00")
    slurm.add_argument("--slurm-template", type=Path)
    slurm.add_argument("--warning-seconds", type=int, default=120,
                       help="Slurm warns each worker this early (SIGUSR1): its run saves, its "
                       "trial is queued again (default 120)")
    slurm.add_argument("--dry-run", action="store_true",
                       help="write the job scripts, submit nothing")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check: each number in its range, the options a study needs."""
    if args.max_seconds is not None and not 0 < args.max_seconds < float("inf"):
        parser.error(f"--max-seconds must be above 0, got {args.max_seconds}")
    if args.report:
        if args.study_dir is None:
            parser.error("--report needs --study-dir "
                         "(and --study-name where it holds several studies)")
        return
    missing = [flag for flag, value in [("--command", args.command), ("--env-ids", args.env_ids),
                                        ("--space", args.space),
                                        ("--total-timesteps", args.total_timesteps)]
               if value is None]
    if missing:
        parser.error(f"{', '.join(missing)} required (or --report on a study)")
    for flag, value, least in [("--seeds", args.seeds, 1), ("--trials", args.trials, 1),
                               ("--workers", args.workers, 1),
                               ("--total-timesteps", args.total_timesteps, 1),
                               ("--report-points", args.report_points, 1),
                               ("--prune-startup-trials", args.prune_startup_trials, 0),
                               ("--sampler-startup-trials", args.sampler_startup_trials, 0),
                               ("--max-retries", args.max_retries, 0)]:
        if value < least:
            parser.error(f"{flag} must be at least {least}, got {value}")
    for flag, value in [("--poll-seconds", args.poll_seconds),
                        ("--save-minutes", args.save_minutes),
                        ("--heartbeat-seconds", args.heartbeat_seconds),
                        ("--grace-seconds", args.grace_seconds)]:
        if not 0 < value < float("inf"):
            parser.error(f"{flag} must be above 0, got {value}")
    if not 0 <= args.prune_warmup < 1:
        parser.error("--prune-warmup is a fraction of a run's steps, 0 to below 1, "
                     f"got {args.prune_warmup}")
    if args.grace_seconds <= 2 * args.heartbeat_seconds:
        parser.error("--grace-seconds must be more than twice --heartbeat-seconds, "
                     "or a live worker may look lost")


def plan(args: argparse.Namespace) -> Tuning:
    """Check the command and the space, and fill in the study's name and folder."""
    try:
        command = shlex.split(args.command)
    except ValueError as error:
        fail(f"--command {args.command!r} cannot be split into words ({str(error).lower()})")
    if len(command) == 1 and command[0].endswith(".py"):
        command = ["python", *command]  # a bare script
    if not command:
        fail('--command is empty: give the script to tune, e.g. "python ppo/ppo.py"')
    run_plan.check_program(command[0], run_plan.resolve(command)[0])
    script = next((token for token in command[1:] if token.endswith(".py")), None)
    if script is not None and not os.path.isfile(script):
        fail(f"--command: the script {script} does not exist (paths are read from {os.getcwd()})")
    given = {token[2:].split("=")[0] for token in command if token.startswith("--")}
    if given & space.RESERVED_FLAGS:
        fail("--command sets "
             f"{', '.join('--' + flag for flag in sorted(given & space.RESERVED_FLAGS))}, which "
             "the tuner gives each run itself: leave it out (--env-ids, --seeds, "
             "--total-timesteps say them)")
    search_space = space.load_space(args.space, args.env_ids)
    both = sorted(given & {param.name for param in search_space.params})
    if both:
        fail(f"--{both[0]} is both in --command and in the space: fix it in one place")
    variant = run_plan.variant_name(command)
    envs = "+".join(map(run_plan.safe_name, args.env_ids))
    args.study_name = args.study_name or f"{variant}-{envs}-{args.total_timesteps}"
    args.study_dir = args.study_dir or Path("tuning") / args.study_name
    return Tuning(command, args.env_ids, list(range(1, args.seeds + 1)), args.total_timesteps,
                  search_space, args.study_dir.resolve(), args.save_minutes, args.poll_seconds,
                  args.report_points, args.heartbeat_seconds, args.grace_seconds,
                  args.max_retries, run_plan.resolve(command))


def check_script(args: argparse.Namespace, tuning: Tuning) -> None:
    """The flags of the space and of --command against the script's --help, which also gives the
    defaults the report compares trials with (kept in `tuning`). Last of the checks: it runs the
    script, which takes seconds."""
    label = next((token for token in tuning.command[1:] if token.endswith(".py")),
                 tuning.command[0])
    options = space.script_options(tuning.command, tuning.resolved, label)
    space.check_flags(tuning.command, tuning.space, args.space, options, label)
    tuning.script_defaults = {param.name: options[param.name] for param in tuning.space.params
                              if param.flag and options.get(param.name) is not None}


def main(argv: list[str] | None = None) -> int:
    try:
        return tune(parse_args(argv))
    except common.WrongInput as error:
        return common.refuse("tune.py", error)


def tune(args: argparse.Namespace) -> int:
    """The study's report (--report), a worker's loop (--worker), or the study: its workers here or
    as a Slurm job array, then its report. Returns the exit code."""
    try:
        import matplotlib  # noqa: F401
        import optuna  # noqa: F401
    except ImportError as error:
        fail(f"{error.name} is not installed, and the tuner needs it: "
             'pip install -e ".[benchmark]"')
    if args.report:
        return report_only(args)
    tuning = plan(args)
    enqueued = [space.enqueued_values(tuning.space, flags) for flags in args.enqueue]
    if not args.worker:  # a worker's invocation has checked them
        check_script(args, tuning)
    common.make_directory(tuning.study_dir, "--study-dir")
    study = open_study(args, tuning, args.worker_index)
    if not args.worker and "script_defaults" not in study.user_attrs:
        # Kept once, with the study: the report finds the trial of the defaults by them.
        study.set_user_attr("script_defaults", tuning.script_defaults)
    if args.worker:
        name = (f"slurm {os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
                if "SLURM_ARRAY_TASK_ID" in os.environ else f"{socket.gethostname()}:{os.getpid()}")
        return Worker(study, tuning, args.trials, name).loop()
    for values in enqueued:
        study.enqueue_trial(values, skip_if_exists=True)  # once: a later invocation finds it there
    if args.slurm:
        return submit_to_slurm(args)
    started = time.time()
    print(f"study {args.study_name!r} in {tuning.study_dir}: {args.trials} trials of "
          f"{len(tuning.pairs())} run(s) each, {args.workers} worker(s)", flush=True)
    if args.workers == 1:
        code = Worker(study, tuning, args.trials, f"{socket.gethostname()}:{os.getpid()}").loop()
    else:
        code = run_local_workers(args)
    print(write_report(study, tuning.study_dir / "report", max_seconds=args.max_seconds),
          flush=True)
    print(f"this invocation: {format_duration(time.time() - started)}; report: "
          f"{tuning.study_dir / 'report' / 'index.md'}", flush=True)
    if code == 0:
        fail_if_every_trial_failed(study)
    return code


def report_only(args: argparse.Namespace) -> int:
    """--report: the report of the study as it is."""
    journal = args.study_dir / "journal.log"
    if args.storage is None and not journal.is_file():
        fail(f"no study in {args.study_dir} (no {journal}): give the --study-dir of a study, "
             "or its --storage")
    study = open_study(args, None)
    if "definition" not in study.user_attrs:
        fail(f"the study {args.study_name!r} was not made by tune.py: "
             "it holds no definition to report on")
    print(write_report(study, args.study_dir / "report", max_seconds=args.max_seconds), flush=True)
    print(f"report: {args.study_dir / 'report' / 'index.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
