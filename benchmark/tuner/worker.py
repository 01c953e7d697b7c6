"""The tuner's workers: each claims trials of the study and runs them (`Worker`) until the study has
its trials; several of them here (`run_local_workers`), or as a Slurm job array (`submit_to_slurm`).
Part of benchmark/tune.py, which each worker process runs again with --worker.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmark.runner import slurm
from benchmark.common import make_directory
from benchmark.tuner.runner import (Failed, Pruned, Runner, TakeoverFailed, WorkerStopped,
                                    die_with_the_worker, plan_run)
from benchmark.tuner.study import Heartbeat, Lock, Tuning, claim, fail_stale_trials, retry
from ppo_utils.exits import STOPPED

TUNER = Path(__file__).resolve().parents[1] / "tune.py"


class Worker:
    """Claims trials of the study and runs them until the study has its trials."""

    def __init__(self, study, tuning: Tuning, n_trials: int, name: str):
        self.study, self.tuning, self.n_trials, self.name = study, tuning, n_trials, name
        self.runner = Runner(tuning)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        """Ctrl-C, `kill`, Slurm's warning: the run saves and stops (SIGTERM, its own stop signal;
        another signal here sends another, which stops it at once), the trial is queued again, the
        worker ends."""
        if self.runner.stop_signal is None:
            print(f"{signal.Signals(signum).name if signum != signal.SIGINT else 'Ctrl-C'}: "
                  "stopping the running trial's run (it saves); the same command continues it",
                  flush=True)
        self.runner.stop(signum)

    def loop(self) -> int:
        """Returns the exit code: 0 when the study has its trials, STOPPED when asked to stop."""
        lock = Lock(self.tuning.study_dir)
        while self.runner.stop_signal is None:
            with lock:
                fail_stale_trials(self.study, self.tuning)
                trial, others_running = claim(self.study, self.n_trials)
                beat = None if trial is None else Heartbeat(self.tuning.heartbeat(trial.number),
                                                            self.tuning.heartbeat_seconds)
            if trial is None:
                if not others_running:
                    return 0
                time.sleep(min(self.tuning.heartbeat_seconds, 5.0))
                continue
            beat.start()
            try:
                self.run_trial(trial)
            finally:
                beat.done.set()
        return STOPPED

    def run_trial(self, trial) -> None:
        """The trial's runs, one after the other, in the folder of the first trial of its series (a
        retry takes over what the lost try left); then its score, or why it ended early."""
        # the stored trial: a Trial shows no system attributes
        stored = self.study.get_trials(deepcopy=False)[trial.number]
        first = stored.system_attrs.get("failed_trial", trial.number)
        home = self.tuning.trial_dir(first)
        values = self.tuning.space.sample(trial)
        flags = self.tuning.space.arguments(values)
        trial.set_user_attr("worker", self.name)
        trial.set_user_attr("directory", str(home))
        continues = f"continues trial {first}: " if first != trial.number else ""
        print(f"[trial {trial.number}] {continues}{shlex.join(flags) or '(the defaults)'}  "
              f"({self.name})", flush=True)
        returns, scores, runs = {}, [], []
        try:
            for position, (env_id, seed) in enumerate(self.tuning.pairs()):
                spec = plan_run(self.tuning, flags, env_id, seed, position, home)
                scored = self.runner.run_one(trial, spec)
                value = returns[spec.label] = scored["final_return"]
                runs.append(scored)
                scores.append(self.tuning.space.normalize(env_id, value))
                print(f"[trial {trial.number}] {spec.label}: final return {value:.2f} "
                      f"(normalized {scores[-1]:.3f})", flush=True)
        except (Pruned, Failed, WorkerStopped) as ending:
            self.end_early(trial, ending, returns)
            return
        self.complete(trial, returns, scores, runs)

    def end_early(self, trial, ending: Exception, returns: dict) -> None:
        """A trial that ended before its runs did: pruned, failed (a takeover that failed, and a
        trial whose worker was asked to stop, queued again), with the reason kept."""
        import optuna

        states = optuna.trial.TrialState
        if isinstance(ending, Pruned):
            trial.set_user_attr("returns", returns)
            trial.set_user_attr("pruned", str(ending))
            self.study.tell(trial, state=states.PRUNED)
            print(f"[trial {trial.number}] pruned: {ending}", flush=True)
        elif isinstance(ending, TakeoverFailed):
            trial.set_user_attr("returns", returns)
            trial.set_user_attr("failure", f"{ending} (continuing the run left by an earlier try)")
            queued = self.fail_and_retry(trial)
            print(f"[trial {trial.number}] FAILED: {ending}, continuing the run left by an earlier "
                  "try: " + ("retried, to start that run afresh" if queued is not None else
                             f"retried {self.tuning.max_retries} times already: not again"),
                  flush=True)
        elif isinstance(ending, Failed):
            trial.set_user_attr("returns", returns)
            trial.set_user_attr("failure", str(ending))
            self.study.tell(trial, state=states.FAIL)
            print(f"[trial {trial.number}] FAILED: {ending}", flush=True)
        else:  # WorkerStopped
            name = signal.Signals(self.runner.stop_signal).name
            trial.set_user_attr("failure", f"stopped by {name} to its worker")
            queued = self.fail_and_retry(trial)
            print(f"[trial {trial.number}] stopped ({name}): "
                  + ("queued again, to continue from its runs' checkpoints" if queued is not None
                     else "retried too often already: not queued again"), flush=True)

    def complete(self, trial, returns: dict, scores: list[float], runs: list[dict]) -> None:
        """A trial whose runs all finished: its score, their normalized final returns averaged."""
        trial.set_user_attr("returns", returns)
        # What the settings cost: the runs go one after the other, so the trial's wall time is
        # theirs added up (None where a run's is unknown: one read back from an older tuner's
        # done.json).
        seconds = [scored.get("wall_seconds") for scored in runs]
        sps = [scored.get("sps") for scored in runs]
        trial.set_user_attr("wall_seconds", None if None in seconds else float(sum(seconds)))
        trial.set_user_attr("sps", None if None in sps else float(np.mean(sps)))
        score = float(np.mean(scores))
        self.study.tell(trial, score)
        print(f"[trial {trial.number}] score {score:.4f} "
              f"(mean of {len(scores)} normalized final returns)", flush=True)

    def fail_and_retry(self, trial):
        """Mark `trial` failed and queue it again (retry), under the study's lock; returns what
        retry returns: the queued trial, or None once it was retried max_retries times."""
        import optuna

        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        with Lock(self.tuning.study_dir):
            return retry(self.study, self.study.get_trials(deepcopy=False)[trial.number],
                         self.tuning.max_retries)


def worker_args(args: argparse.Namespace) -> list[str]:
    """The options that make a worker of this study (each local worker and Slurm task gets them)."""
    options = ["--command", args.command, "--env-ids", *args.env_ids,
               "--space", str(args.space.resolve()),
               "--total-timesteps", str(args.total_timesteps), "--seeds", str(args.seeds),
               "--trials", str(args.trials), "--study-name", args.study_name,
               "--study-dir", str(args.study_dir.resolve()), "--pruner", args.pruner,
               "--prune-startup-trials", str(args.prune_startup_trials),
               "--prune-warmup", f"{args.prune_warmup:g}",
               "--sampler-startup-trials", str(args.sampler_startup_trials),
               "--report-points", str(args.report_points),
               "--poll-seconds", f"{args.poll_seconds:g}",
               "--save-minutes", f"{args.save_minutes:g}",
               "--heartbeat-seconds", f"{args.heartbeat_seconds:g}",
               "--grace-seconds", f"{args.grace_seconds:g}", "--max-retries", str(args.max_retries)]
    if args.storage:
        options += ["--storage", args.storage]
    if args.sampler_seed is not None:
        options += ["--sampler-seed", str(args.sampler_seed)]
    if args.max_seconds is not None:  # for the report job
        options += ["--max-seconds", f"{args.max_seconds:g}"]
    return options


def run_local_workers(args: argparse.Namespace) -> int:
    """--workers N > 1: N worker processes on this machine, each the loop of a Slurm task; they end
    with this process (SIGTERM), and a `kill` of it asks them to stop."""
    command = [sys.executable, str(TUNER), *worker_args(args), "--worker"]
    workers = [subprocess.Popen([*command, "--worker-index", str(index)],
                                preexec_fn=die_with_the_worker)
               for index in range(args.workers)]

    def pass_on(signum, frame):  # Ctrl-C reaches the workers from the terminal itself
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGUSR1, pass_on)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    codes = [worker.wait() for worker in workers]
    return STOPPED if STOPPED in codes else max(codes)


def submit_to_slurm(args: argparse.Namespace) -> int:
    """--slurm: a job array of --workers tasks, each a worker of the study, and a report job after
    it, written from benchmark/slurm_template.sh and submitted with sbatch
    (benchmark/runner/slurm.py's helpers)."""
    template = slurm.read_template(args.slurm_template or slurm.SLURM_TEMPLATE)
    program = None if args.dry_run else slurm.find_sbatch()
    slurm_dir = args.study_dir / "slurm"
    make_directory(slurm_dir, "--study-dir")
    here = f"cd {shlex.quote(os.getcwd())}\n"
    tuner = [sys.executable, str(TUNER), *worker_args(args)]
    array_script, report_script = slurm_dir / "workers.sbatch", slurm_dir / "report.sbatch"
    array_script.write_text(slurm.fill(template, {
        "job_name": f"ppo-tune-{args.study_name}",
        "output": slurm.output_pattern(slurm_dir, "worker_%A_%a.out"),
        "array_line": f"#SBATCH --array=0-{args.workers - 1}",
        "resource_lines": slurm.resource_lines(args, report_job=False),
        "command": here + f"exec {shlex.join([*tuner, '--worker'])} "
                          '--worker-index "$SLURM_ARRAY_TASK_ID"'}))
    report_script.write_text(slurm.fill(template, {
        "job_name": f"ppo-tune-report-{args.study_name}",
        "output": slurm.output_pattern(slurm_dir, "report_%j.out"), "array_line": "",
        "resource_lines": slurm.resource_lines(args, report_job=True),
        "command": here + f"exec {shlex.join([*tuner, '--report'])}"}))
    print(f"slurm: wrote {array_script} ({args.workers} workers) and {report_script}", flush=True)
    if args.dry_run:
        print(f"dry run: nothing submitted. By hand: sbatch {array_script}, then "
              f"sbatch --dependency=afterany:<its job id> {report_script}")
        return 0
    array_job = slurm.sbatch(program, [], array_script)
    report_job = slurm.sbatch(program, [f"--dependency=afterany:{array_job}"], report_script)
    print(f"slurm: submitted workers {array_job} and the report job {report_job}\n"
          f"  follow:  squeue -j {array_job},{report_job}\n"
          f"  workers' output: {slurm_dir.resolve()}/worker_{array_job}_<task>.out\n"
          f"  the report, when they are done: {args.study_dir / 'report'}/index.md", flush=True)
    return 0
