"""The tuner's runner: one run of a trial, started (or continued from what a lost try left, or read
back when it finished), its TensorBoard log read as it goes and reported to the pruner, its ending
judged and its final return scored. Part of benchmark/tune.py.

A run the pruner gives up is stopped by SIGTERM, its normal stop signal (it saves and exits 130):
the trial is pruned (`Pruned`). A run that diverges, refuses its flags, crashes or is killed fails
the trial (`Failed`); one continued from a lost run's checkpoint that fails has its folder set aside
(`TakeoverFailed`), and a worker asked to stop stops its run the same way (`WorkerStopped`).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmark import report
from benchmark.runner import run_plan
from benchmark.tuner.study import Tuning
from ppo_utils.exits import DIVERGED, STOPPED, WRONG_INPUT


class Pruned(Exception):
    """The pruner gave the trial up; the argument says where."""


class Failed(Exception):
    """A run failed; the argument is the reason stored with the trial."""


class TakeoverFailed(Failed):
    """A run continued from what a lost or stopped run left failed; its folder was moved aside, so
    that the trial's retry starts that run afresh."""


class WorkerStopped(Exception):
    """The worker was asked to stop; its run saved and stopped."""


try:  # looked up here, not in the child: between fork and exec only the call itself is safe
    PRCTL = ctypes.CDLL(None).prctl
except (OSError, AttributeError):  # not Linux
    PRCTL = None


def die_with_the_worker() -> None:
    """In a run's process, before it starts: SIGTERM when the worker that started it dies (Linux's
    PR_SET_PDEATHSIG), so that a killed worker's run saves and stops rather than run on beside the
    trial's retry. Elsewhere a lost worker's run goes on, and a retry started before it ends would
    share its folder: give such a system a --grace-seconds longer than a run."""
    if PRCTL is not None:
        PRCTL(1, signal.SIGTERM)


class Episodes:
    """The episodes a run has logged so far, read from its TensorBoard folder as it grows."""

    def __init__(self, workdir: Path):
        self.runs_dir, self.accumulator = workdir / "runs", None

    def read(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(steps, returns) of the episodes, and the step up to which every episode is logged (the
        last `charts/SPS` point, written at the end of an iteration, after its episodes)."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        if self.accumulator is None:
            found = report.find_run_dirs(self.runs_dir) if self.runs_dir.is_dir() else []
            if not found:
                return np.zeros(0), np.zeros(0), 0
            self.accumulator = EventAccumulator(str(found[0]), size_guidance={"scalars": 0})
        self.accumulator.Reload()
        tags = self.accumulator.Tags()["scalars"]
        tag = "charts/episodic_return"
        episodes = self.accumulator.Scalars(tag) if tag in tags else []
        logged = self.accumulator.Scalars("charts/SPS")[-1].step if "charts/SPS" in tags else 0
        return (np.array([event.step for event in episodes]),
                np.array([event.value for event in episodes]), logged)


@dataclass
class RunSpec:
    env_id: str
    seed: int
    # in the trial's order of (env, seed): its steps for the pruner start at position x budget
    position: int
    workdir: Path
    command: list[str]   # as given, with flags, env id, seed and budget: what identifies the run
    argv: list[str]      # what is executed

    @property
    def label(self) -> str:
        return f"{self.env_id} seed {self.seed}"


def plan_run(tuning: Tuning, flags: list[str], env_id: str, seed: int, position: int,
             home: Path) -> RunSpec:
    """The run of (env_id, seed) with a trial's flags, in the trial's folder `home`."""
    tail = [*flags, "--env-id", env_id, "--seed", str(seed),
            "--total-timesteps", str(tuning.total_timesteps)]
    saving = ["--save-model", "--save-minutes", f"{tuning.save_minutes:g}"]
    return RunSpec(env_id, seed, position, home / f"{run_plan.safe_name(env_id)}__seed{seed}",
                   [*tuning.command, *tail], [*tuning.resolved, *tail, *saving])


def run_environment() -> dict[str, str]:
    """The environment of a run's process."""
    # One thread per run, as benchmark/run.py gives its runs, unless the user or Slurm set another.
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("SLURM_CPUS_PER_TASK") or "1"
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}
    # The runs start elsewhere: `PYTHONPATH=.` means the folder here.
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(entry) if entry else entry
                                            for entry in os.environ["PYTHONPATH"].split(os.pathsep))
    return env


class Runner:
    """A trial's runs, one at a time, for a worker, which passes on its stop requests (`stop`)."""

    def __init__(self, tuning: Tuning):
        self.tuning = tuning
        self.process: subprocess.Popen | None = None
        self.stop_signal: int | None = None

    def stop(self, signum: int) -> None:
        """The worker was asked to stop: the run saves and stops (SIGTERM, its own stop signal; a
        second request sends another, which stops it at once)."""
        self.stop_signal = signum
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def run_one(self, trial, spec: RunSpec) -> dict:
        """Run (or continue, or read back) one run of the trial, reporting to the pruner as it goes;
        returns its score_run dict, or raises Pruned, Failed or WorkerStopped."""
        spec.workdir.mkdir(parents=True, exist_ok=True)
        done = spec.workdir / "done.json"
        reported: set[int] = set()
        episodes = Episodes(spec.workdir)
        if done.is_file() and json.loads(done.read_text()).get("command") == spec.command:
            self.report_progress(trial, spec, episodes, reported, finished=True)
            return json.loads(done.read_text())
        checkpoint = take_over(trial, spec)
        resume = ["--resume", os.path.relpath(checkpoint, spec.workdir)] if checkpoint else []
        code, pruned = self.watch(trial, spec, spec.argv + resume, episodes, reported)
        self.judge(trial, spec, code, pruned, checkpoint)
        scored = score_run(spec)
        if self.report_progress(trial, spec, episodes, reported, finished=True):
            pruned = max(reported) - spec.position * self.tuning.total_timesteps
            raise Pruned(f"{spec.label} at step {pruned:,} of {self.tuning.total_timesteps:,} "
                         "(its end)")
        done.write_text(json.dumps({"command": spec.command, **scored}) + "\n")
        return scored

    def watch(self, trial, spec: RunSpec, argv: list[str], episodes: Episodes,
              reported: set[int]) -> tuple[int, int | None]:
        """Start the run, its output appended to its run.log, and read its log every --poll-seconds
        until it exits, stopping it when the pruner says so. Returns its exit code, and the step at
        which it was pruned (None if it was not)."""
        with open(spec.workdir / "run.log", "a") as log:
            log.write(f"# command: {shlex.join(argv)}\n"
                      f"# started: {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            log.flush()
            self.process = subprocess.Popen(argv, cwd=spec.workdir, stdout=log,
                                            stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=die_with_the_worker, env=run_environment())
            if self.stop_signal is not None:  # asked to stop as the run started
                self.process.send_signal(signal.SIGTERM)
            pruned = None
            while self.process.poll() is None:
                time.sleep(self.tuning.poll_seconds)
                if pruned is None and self.stop_signal is None and self.report_progress(
                        trial, spec, episodes, reported, finished=False):
                    pruned = reported and max(reported)
                    self.process.send_signal(signal.SIGTERM)
            code = self.process.wait()
            self.process = None
            log.write(f"# exit code {code}\n")
        return code, pruned

    def judge(self, trial, spec: RunSpec, code: int, pruned: int | None,
              checkpoint: Path | None) -> None:
        """Raise what a run's ending means for its trial, if it did not finish: Pruned,
        WorkerStopped, TakeoverFailed (its continued run's folder set aside) or Failed."""
        if code == STOPPED and pruned is not None:
            raise Pruned(f"{spec.label} at step "
                         f"{pruned - spec.position * self.tuning.total_timesteps:,} "
                         f"of {self.tuning.total_timesteps:,}")
        if code == STOPPED and self.stop_signal is not None:
            raise WorkerStopped()
        if code != 0:
            reason = f"{spec.label}: {why_it_failed(code, spec.workdir / 'run.log')}"
            if checkpoint is not None and code != DIVERGED:
                # Not the settings' fault (they ran until the checkpoint): what the lost run left
                # is, an unreadable checkpoint say. Continuing it would fail again: the retry
                # starts afresh.
                set_aside(trial, spec, checkpoint.parent,
                          f"continuing it failed (exit {code}); "
                          "the trial's retry starts the run afresh")
                raise TakeoverFailed(reason)
            raise Failed(reason)

    def report_progress(self, trial, spec: RunSpec, episodes: Episodes, reported: set[int],
                        finished: bool) -> bool:
        """Report each new point of the run's grid to Optuna: at step k x budget / points, the
        normalized mean return of the episodes that ended in the span before it (a span without one
        is left out). Returns whether the pruner says to stop."""
        steps, values, logged = episodes.read()
        budget, points = self.tuning.total_timesteps, self.tuning.report_points
        span = budget / points
        for k in range(1, points + 1):
            at = round(k * span)
            step = spec.position * budget + at
            if step in reported or (at > logged and not finished):
                continue
            ended = (steps > at - span) & (steps <= at)
            if not ended.any():
                continue
            reported.add(step)
            trial.report(self.tuning.space.normalize(spec.env_id, float(values[ended].mean())),
                         step)
            if trial.should_prune():
                return True
        return False


def take_over(trial, spec: RunSpec) -> Path | None:
    """Before a run starts: what earlier tries of it left in its runs/ (a lost or stopped worker's
    run). The folder with a checkpoint is continued from it (its path is returned); every other
    one, a run lost before its first checkpoint, is moved aside, so that the run starts afresh
    and is the one run the scorer finds there. A first try finds nothing."""
    runs_dir = spec.workdir / "runs"
    if not runs_dir.is_dir():
        return None
    checkpoints = sorted(runs_dir.rglob("checkpoint.pt"), key=lambda path: path.stat().st_mtime)
    kept = checkpoints[-1] if checkpoints else None
    folders = set(report.find_run_dirs(runs_dir)) | {path.parent for path in checkpoints}
    for folder in sorted(folders - {kept and kept.parent}):
        why = ("a run lost before its first checkpoint; the run starts afresh"
               if not (folder / "checkpoint.pt").is_file() else
               f"a run with an older checkpoint than {kept.parent.relative_to(spec.workdir)}'s")
        set_aside(trial, spec, folder, why)
    return kept


def set_aside(trial, spec: RunSpec, folder: Path, why: str) -> None:
    """Move a run folder from the run's runs/ to its set-aside/ (kept, for a look), and say so in
    the run's log and the worker's output."""
    target = spec.workdir / "set-aside" / folder.relative_to(spec.workdir / "runs")
    for count in range(1, 1000):
        if not target.exists():
            break
        target = target.with_name(f"{folder.name}.{count}")
    target.parent.mkdir(parents=True, exist_ok=True)
    folder.rename(target)
    said = (f"moved {folder.relative_to(spec.workdir)} aside to "
            f"{target.relative_to(spec.workdir)}: {why}")
    with open(spec.workdir / "run.log", "a") as log:
        log.write(f"# {said}\n")
    print(f"[trial {trial.number}] {spec.label}: {said}", flush=True)


def score_run(spec: RunSpec) -> dict:
    """The report's metric for the run (benchmark/report.py: load_run, final_return), and what it
    cost: its wall time (its sittings' spans, added up) and SPS, as the report reads them."""
    runs_dir = spec.workdir / "runs"
    found = report.find_run_dirs(runs_dir) if runs_dir.is_dir() else []
    if len(found) != 1:
        raise Failed(f"{spec.label}: {len(found)} runs in {runs_dir}, not one: "
                     "remove the stray ones")
    data = report.load_run(found[0], runs_dir)
    value, count, _ = data.final_return() if data is not None else (math.nan, 0, False)
    if count == 0:
        raise Failed(f"{spec.label}: no episode ended in the run: raise --total-timesteps")
    return {"final_return": value, "wall_seconds": data.wall_seconds, "sps": data.sps}


def why_it_failed(code: int, log_path: Path) -> str:
    """A failed run's reason: the script's own line (`<script>.py: diverged: ...` for exit 3,
    `<script>.py: error: ...` for 2), or the exit code or signal with the log's last line."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines()
             if not line.startswith("# ")]
    said = next((line for line in reversed(lines)
                 if ".py: diverged: " in line or ".py: error: " in line), None)
    if code == DIVERGED:
        return said or "diverged (exit 3)"
    if code == WRONG_INPUT:
        return f"wrong input (exit 2): {said or (lines[-1] if lines else '')}"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code == STOPPED:
        return "stopped by a signal from outside the tuner (exit 130)"
    return f"crashed (exit {code}): {lines[-1] if lines else 'no output'} (log {log_path})"
