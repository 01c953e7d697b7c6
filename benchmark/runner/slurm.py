"""Slurm: a benchmark's runs as the tasks of one job array, then a report job after it. The job
scripts are written from benchmark/slurm_template.sh and submitted with sbatch; each task calls
run.py with `--task-index N`, which does run N exactly as run.py does it here. Also the Slurm
options of run.py's command line, and --requeue's `scontrol requeue`. Standard library only."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from benchmark.common import REPO, fail, make_directory, refuse_a_file
from benchmark.runner.run_plan import Benchmark, Run

RUNNER = REPO / "benchmark" / "run.py"
SLURM_TEMPLATE = REPO / "benchmark" / "slurm_template.sh"
PLACEHOLDERS = ("job_name", "output", "array_line", "resource_lines", "command")
# The placeholders that stand for one value of an `#SBATCH --option=VALUE` line: fill() quotes them.
VALUE_PLACEHOLDERS = ("job_name", "output")
# Every report job has this name and `--dependency=singleton`: Slurm runs them one at a time, so the
# reports of families submitted together never write the same files at once.
REPORT_JOB_NAME = "ppo-benchmark-report"



def array_spec(indices: list[int]) -> str:
    """Slurm's --array value of these task indices, runs of them folded: [0, 1, 2, 5] -> 0-2,5."""
    parts: list[str] = []
    first = last = indices[0]
    for index in indices[1:] + [None]:
        if index is not None and index == last + 1:
            last = index
            continue
        parts.append(str(first) if first == last else f"{first}-{last}")
        first = last = index
    return ",".join(parts)


def resource_lines(args: argparse.Namespace, report_job: bool) -> str:
    """The #SBATCH lines of the resource options; the report job needs no GPU and one CPU.
    The array's tasks also ask for the warning before their time limit, and with --requeue
    may be requeued."""
    options = [("partition", args.partition)]
    if not report_job:
        # --gres=gpu:N rather than --gpus=N: it works with every select plugin and Slurm version.
        options += [("gres", f"gpu:{args.gpus}" if args.gpus else None),
                    ("cpus-per-task", args.cpus_per_task or 1)]
    options.append(("time", args.time))
    if not report_job:
        # SIGUSR1 to the batch shell, which is this runner (the task script execs it): its run saves
        # and stops. Slurm may send it up to a minute early.
        options.append(("signal", f"B:USR1@{args.warning_seconds}"))
        if args.requeue:  # a requeued task's output goes on in the same file
            options += [("requeue", None), ("open-mode", "append")]
    return "\n".join(f"#SBATCH --{name}" + ("" if value is None else f"={value}")
                     for name, value in options if value is not None or name == "requeue")


def read_template(path: Path) -> str:
    """The template without its `##` notes; a template that lacks a placeholder is refused."""
    try:
        text = path.read_text()
    except OSError as error:
        fail(f"cannot read the Slurm template {path} ({error.strerror}): "
             "give an existing file to --slurm-template")
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("##"))
    missing = [f"{{{name}}}" for name in PLACEHOLDERS if f"{{{name}}}" not in body]
    if missing:
        fail(f"the Slurm template {path} lacks {', '.join(missing)}: keep every placeholder of "
             f"{SLURM_TEMPLATE} in it (an option you do not pass leaves its line empty)")
    return body


def sbatch_quote(value: str) -> str:
    """A value as sbatch reads it from an `#SBATCH` line: in double quotes, with backslashes and
    double quotes escaped. Unquoted, a space ends the value (a run directory `my runs/` makes sbatch
    refuse the script) and a `#` starts a comment."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_pattern(directory: Path, name: str) -> str:
    """sbatch's --output value for the file `name` in `directory`, where `name` may hold Slurm's
    replacement symbols (%A the array's job id, %a the task index, %j the job id). Absolute, as
    Slurm reads a relative path from where sbatch is run, and a script may be resubmitted by hand. A
    `%` of the directory's own is doubled, Slurm's escape for it: `runs%j/` would otherwise become
    `runs123/`, a directory that does not exist, and Slurm would write no output at all."""
    return f"{str(directory.resolve()).replace('%', '%%')}/{name}"


def fill(template: str, values: dict[str, str]) -> str:
    """The template with the runner's placeholders filled. Only those names are replaced, so the
    braces of a site's own shell code (`${HOME}`) stay as they are. The values of {job_name} and
    {output} are quoted here rather than in the template, so that a site's template copied before
    they were quoted works too; a template that quotes them itself (`"{output}"`) gets them
    quoted once."""
    def replace(match: re.Match) -> str:
        if match.group("value"):
            return sbatch_quote(values[match.group("value")])
        return values[match.group("lines")]

    line_names = [name for name in PLACEHOLDERS if name not in VALUE_PLACEHOLDERS]
    pattern = (rf'"?\{{(?P<value>{"|".join(VALUE_PLACEHOLDERS)})\}}"?'
               rf'|\{{(?P<lines>{"|".join(line_names)})\}}')
    return re.sub(pattern, replace, template)


def task_command(bench: Benchmark, runs: list[Run], force: bool, requeue: bool = False) -> str:
    """The array job's command: this runner, told which run to do by the task index. The runs are
    listed above it in comments, so that the script says what each task does. `exec`: the runner is
    the batch shell, which gets Slurm's warning before the time limit (--signal=B:...)."""
    runner = [sys.executable, str(RUNNER), *bench.runner_args(), *(["--force"] if force else []),
              *(["--requeue"] if requeue else [])]
    listing = [f"#   {index}: {run.label}: {shlex.join(run.argv)} > {run.log_path}"
               for index, run in enumerate(runs)]
    return "\n".join([
        f"# Task N does run N, started in {bench.workdir}, "
        "exactly as run.py without --slurm does it",
        "# (same command, log and .done marker), and skips it if it finished earlier:",
        *listing,
        f"cd {shlex.quote(os.getcwd())}",
        f'exec {shlex.join(runner)} --task-index "$SLURM_ARRAY_TASK_ID"',
    ])


def sbatch(program: str, options: list[str], script: Path,
           throwaway_dir: Path | None = None) -> str:
    """Submit one script; returns the job id. A refusal ends the runner with Slurm's own
    message, after removing `throwaway_dir` (made for this submission, and holding nothing that
    runs) if given."""
    result = subprocess.run([program, "--parsable", *options, str(script)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        message = " ".join(line.strip() for line in (result.stderr or result.stdout).splitlines()
                           if line.strip())
        if throwaway_dir is not None:
            shutil.rmtree(throwaway_dir, ignore_errors=True)
        kept = (f"{throwaway_dir}, made for this submission, is removed again"
                if throwaway_dir is not None else f"the job scripts stay in {script.parent}")
        fail(f"sbatch refused {script}: {message or f'exit code {result.returncode}'}; {kept}; "
             "fix the options or the template and submit again")
    # --parsable prints `id` or `id;cluster` as its last line.
    return result.stdout.strip().splitlines()[-1].split(";")[0]


def find_sbatch() -> str:
    program = shutil.which("sbatch")
    if program is None:
        fail("sbatch not found: run --slurm where Slurm's commands are on PATH "
             "(a cluster's login node), or without --slurm to run here")
    return program


def write_array_script(bench: Benchmark, runs: list[Run], todo: list[int], args: argparse.Namespace,
                       template: str, slurm_dir: Path) -> Path:
    """The job array's script, a task per run in `todo`; with none to do, no script (an earlier
    submission's is removed). Returns its path."""
    variant = runs[0].variant
    array_script = slurm_dir / f"{variant}.sbatch"
    if todo:
        array_script.write_text(fill(template, {
            "job_name": f"ppo-benchmark-{variant}",
            "output": output_pattern(slurm_dir, f"{variant}_%A_%a.out"),
            "array_line": f"#SBATCH --array={array_spec(todo)}",
            "resource_lines": resource_lines(args, report_job=False),
            "command": task_command(bench, runs, args.force, args.requeue)}))
        print(f"slurm: wrote {array_script}: {len(todo)} task(s), --array={array_spec(todo)}; "
              f"{len(runs) - len(todo)} of {len(runs)} run(s) finished earlier and are left out",
              flush=True)
    else:
        print(f"slurm: all {len(runs)} run(s) finished earlier: no array job, only the report",
              flush=True)
        # One from an earlier submission: its runs are done, it is not to be resubmitted.
        if array_script.exists():
            array_script.unlink()
            print(f"slurm: removed {array_script}, the job array of an earlier submission",
                  flush=True)
    return array_script


def submit(bench: Benchmark, report_dir: Path, args: argparse.Namespace, template: str,
           program: str | None, throwaway_dir: Path | None = None) -> int:
    """Write the array job (a task per run not finished earlier) and the report job that runs after
    it from the template, then submit both with `program` (sbatch), unless --dry-run.
    `throwaway_dir`: a directory made for this submission (the quick benchmark's), removed if Slurm
    refuses the first job."""
    runs = bench.runs()
    todo = [index for index, run in enumerate(runs) if args.force or not run.finished_earlier()]
    variant = runs[0].variant
    slurm_dir = bench.log_dir / "slurm"
    refuse_a_file(bench.workdir, "--workdir")  # the tasks make it; a file there fails every one
    make_directory(slurm_dir, "--log-dir")
    here = f"cd {shlex.quote(os.getcwd())}\n"

    array_script = write_array_script(bench, runs, todo, args, template, slurm_dir)
    report_script = slurm_dir / f"{variant}-report.sbatch"
    report = bench.report_command(report_dir)
    report_script.write_text(fill(template, {
        "job_name": REPORT_JOB_NAME,
        "output": output_pattern(slurm_dir, f"{variant}-report_%j.out"), "array_line": "",
        "resource_lines": resource_lines(args, report_job=True),
        "command": here + f"exec {shlex.join(report)}"}))
    print(f"slurm: wrote {report_script}: the report into {report_dir}", flush=True)

    if args.dry_run:
        print("dry run: nothing submitted. To submit by hand: "
              + (f"sbatch {array_script}, then " if todo else "")
              + f"sbatch --dependency={'afterany:<its job id>,' if todo else ''}singleton "
              f"{report_script}")
        return 0
    jobs = []
    if todo:
        array_job = sbatch(program, [], array_script, throwaway_dir)
        jobs.append(array_job)
        print(f"slurm: submitted job array {array_job} ({len(todo)} task(s) of {variant})",
              flush=True)
    # afterany, not afterok: like the local runner, report on what finished even if a run failed.
    dependency = f"afterany:{jobs[0]},singleton" if todo else "singleton"
    # Not throwaway_dir: the array's tasks, submitted by now, use it whatever befalls the report.
    report_job = sbatch(program, [f"--dependency={dependency}"], report_script)
    jobs.append(report_job)
    print(f"slurm: submitted report job {report_job}, "
          f"to run {'after the array' if todo else 'now'}: {shlex.join(report)}", flush=True)
    hints = [f"  follow:  squeue -j {','.join(jobs)}",
             f"  each run's output, as without --slurm: "
             f"{bench.log_dir / variant}/<env id>__seed<S>.log "
             "(.done beside it when the run succeeded)"]
    if todo:
        hints.append("  Slurm's output of each task: "
                     f"{slurm_dir.resolve() / f'{variant}_{jobs[0]}_<task>.out'}")
    hints += ["  the report job's output: "
              f"{slurm_dir.resolve() / f'{variant}-report_{report_job}.out'}",
              f"  the report, when the array is done: {report_dir}/ "
              f"(or by hand: {shlex.join(report)})",
              f"  cancel:  scancel {' '.join(jobs)}; "
              "submitting again leaves out the runs that finished"]
    print("\n".join(hints), flush=True)
    return 0


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    """--slurm, what the job scripts are made with, and --task-index, which each task calls."""
    slurm = parser.add_argument_group("Slurm",
                                      "submit the runs as a job array instead of running them here")
    slurm.add_argument("--slurm", action="store_true",
                       help="write a job array (a task per run not finished earlier) and a report "
                       "job after it, submit both with sbatch, print the job ids")
    slurm.add_argument("--partition", help="the partition (default: the cluster's default)")
    slurm.add_argument("--gpus", type=int, help="GPUs per run (#SBATCH --gres=gpu:N; default none)")
    slurm.add_argument("--cpus-per-task", type=int, help="CPUs per run (default 1)")
    slurm.add_argument("--time", help="time limit per run, in Slurm's format, e.g. 12:00:00 "
                       "(default: the partition's)")
    slurm.add_argument("--slurm-template", type=Path,
                       help="the job script template "
                       f"(default {SLURM_TEMPLATE.relative_to(REPO)}): "
                       "copy it and edit it for your site")
    slurm.add_argument("--warning-seconds", type=int, default=120, metavar="S",
                       help="Slurm warns each task S seconds before its time limit (#SBATCH "
                       "--signal=B:USR1@S), up to a minute early; its run finishes the iteration "
                       "and saves, so S must cover one iteration and a save (default 120)")
    slurm.add_argument("--requeue", action="store_true",
                       help="a task warned of its time limit (or sent SIGUSR1) saves its run and "
                       "requeues itself, to continue it when Slurm starts it again (#SBATCH "
                       "--requeue); without it, submitting the same command again continues the "
                       "unfinished runs")
    slurm.add_argument("--report-dir", type=Path,
                       help="where the report job writes the report (default WORKDIR/results; "
                       "with --quick QUICK_DIR/results)")
    slurm.add_argument("--task-index", type=int, metavar="N",
                       help="do run N of the plan (env ids in order, seeds within each), as run "
                       "here; what each array task calls with $SLURM_ARRAY_TASK_ID")


def requeue_this_task() -> None:
    """--requeue: put this Slurm task back in the queue (`scontrol requeue`), to continue its run
    when it starts again; it waits as pending, and the report job, which waits for the whole array,
    with it. Slurm ends the task now with SIGTERM, which is ignored (main): the run has saved, the
    runner is done."""
    # An array task by `<array job>_<task>`: the array's own job id is also the id of one of its
    # tasks, and given alone it would requeue the whole array, its running tasks too.
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")
    if job is None:
        print("--requeue: not in a Slurm job, nothing to requeue; "
              "the same command continues the run", flush=True)
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except OSError as error:  # scontrol not found
        result = subprocess.CompletedProcess([], 1, "", str(error))
    if result.returncode == 0:
        print(f"[requeue] job {job} is back in the queue: when Slurm starts it again, "
              "it continues the run", flush=True)
    else:
        message = " ".join((result.stderr or result.stdout).split())
        print(f"[requeue] Slurm did not requeue job {job} ({message}): "
              "submit the same command again to continue the run", flush=True)
