"""Running a benchmark's runs here: each started in the background with its log (continued from the
checkpoint an earlier attempt left), `workers` at a time, their progress read from their logs and
shown, each ending judged and marked, and a stop (Ctrl-C, SIGTERM, Slurm's SIGUSR1) passed on to
them so that they save first. Standard library only."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmark.runner.run_plan import Run
from ppo_utils.exits import DIVERGED, STOPPED


def attempt(run: Run, workdir: Path, force: bool) -> tuple[list[str], Path | None]:
    """What to execute for `run` now, and the checkpoint it continues from: with
    `--resume CHECKPOINT` when an earlier attempt left one (unless `force`, which starts every run
    again), else the run itself."""
    checkpoint = None if force else run.checkpoint(workdir)
    if checkpoint is None:
        return run.argv, None
    return run.argv + ["--resume", os.path.relpath(checkpoint, workdir)], checkpoint


def start(run: Run, workdir: Path,
          force: bool = False) -> tuple[subprocess.Popen, object, Path | None]:
    """Start one run in the background, its output going to its log file: a new log, or, when it
    continues from a checkpoint, the earlier attempts' log with this attempt's output added. Returns
    the process, the open log and that checkpoint (None for a new start)."""
    run.log_path.parent.mkdir(parents=True, exist_ok=True)
    run.done_path.unlink(missing_ok=True)
    argv, checkpoint = attempt(run, workdir, force)
    log = open(run.log_path, "a" if checkpoint else "w")
    log.write(("# ---- continued\n" if checkpoint else f"# run: {json.dumps(run.command)}\n")
              + f"# command: {shlex.join(argv)}\n# cwd: {workdir}\n"
              f"# started: {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    log.flush()
    # One thread per run unless the user (OMP_NUM_THREADS) or Slurm (the task's CPUs) set another.
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("SLURM_CPUS_PER_TASK") or "1"
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    return process, log, checkpoint


def finish(run: Run, returncode: int, seconds: float, log) -> None:
    """Close the run's log and, when it succeeded or diverged (it is over either way), write its
    .done marker."""
    log.write(f"# exit code {returncode} after {seconds:.1f}s\n")
    log.close()
    if returncode in (0, DIVERGED):
        run.done_path.write_text(json.dumps({
            "command": run.command, "argv": run.argv, "exit_code": returncode,
            "seconds": round(seconds, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S")},
            indent=1) + "\n")


def log_tail(path: Path, lines: int = 3) -> str:
    """The last few lines of a log, indented, for the summary of a failed run."""
    return "".join(f"\n        {line}" for line in last_lines(path, lines))


def last_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines a run wrote to its log (not the runner's own `# exit code` lines)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in text if not line.startswith("# exit code")][-count:]


# A run's progress line, as the PPO scripts print it:
# `step N/TOTAL | SPS | E elapsed, L left | ...`.
PROGRESS = re.compile(r"^step +([\d,]+)/([\d,]+) \|[^|]*\| *([\d:]+) elapsed, ([\d:]+|\?) left")
# How often the progress of the running runs is shown: live in a terminal, as lines elsewhere.
LIVE_SECONDS, LINE_SECONDS = 1.0, 60.0


def seconds_of(clock: str) -> int:
    """h:mm:ss (or m:ss) as seconds."""
    total = 0
    for part in clock.split(":"):
        total = 60 * total + int(part)
    return total


def clock(seconds: float) -> str:
    """A duration as h:mm:ss."""
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02}:{seconds:02}"


def last_progress(log_path: Path) -> tuple[int, int, int, int | None] | None:
    """A running run's last progress line, read from its log: (step, total, seconds elapsed, seconds
    left or None); None before its first one."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        match = PROGRESS.match(line)
        if match:
            step, total = (int(group.replace(",", "")) for group in match.group(1, 2))
            left = None if match.group(4) == "?" else seconds_of(match.group(4))
            return step, total, seconds_of(match.group(3)), left
    return None


def progress_report(running: list, pending: int, done: int, workers: int,
                    durations: list[float]) -> list[str]:
    """What the running runs have done (from their logs) and the time the whole benchmark has
    left: the running runs' own estimates, then the waiting runs at the mean length of the runs
    seen so far (finished, or estimated from their progress), `workers` at a time. `running` holds
    (run, started)."""
    lines, lefts, lengths = [], [], list(durations)
    for run, started in running:
        progress = last_progress(run.log_path)
        if progress is None or progress[3] is None:
            lines.append(f"{run.label}: starting ({clock(time.time() - started)})")
            continue
        step, total, elapsed, left = progress
        lines.append(f"{run.label}: step {step:,}/{total:,}, {clock(left)} left")
        lefts.append(left)
        lengths.append(elapsed + left)
    summary = f"{done} of {done + len(running) + pending} run(s) done"
    if lengths and len(lefts) == len(running):
        mean = sum(lengths) / len(lengths)
        whole = (sum(lefts) + pending * mean) / max(1, min(workers, len(running) + pending))
        summary += f", about {clock(whole)} left in all"
    return lines + [summary]


def run_all(runs: list[Run], workers: int, workdir: Path, force: bool = False) -> dict[str, int]:
    """Run everything not finished earlier, `workers` at a time, continuing each from its
    checkpoint if an earlier attempt left one (`force`: start every run again); print a line per
    run as it starts and as it ends, and meanwhile each running run's step and time left, read from
    its log, and the whole benchmark's: live in a terminal, as a few lines a minute elsewhere (CI,
    Slurm logs).

    Returns the counts of runs that succeeded, were skipped, failed and stopped (a run stopped by a
    signal of its own, not the runner's). Asked to stop itself (Stopped, a KeyboardInterrupt), it
    lets the running runs save and stop (stop_runs), starts no other, and raises it again."""
    counts = {"ok": 0, "skipped": 0, "failed": 0}  # and "stopped", once a run stops
    pending = skip_finished(runs, force, counts)
    running: list[tuple[Run, subprocess.Popen, object, float, Path | None]] = []
    live = sys.stdout.isatty()
    durations, last_report, shown = [], time.time(), ""

    def say(line: str) -> None:
        """A line of its own, above the live progress (which the next report redraws)."""
        print(("\r\033[K" if shown else "") + line, flush=True)

    try:
        while pending or running:
            while pending and len(running) < workers:
                run = pending.pop(0)
                process, log, checkpoint = start(run, workdir, force)
                running.append((run, process, log, time.time(), checkpoint))
                say(f"[resume] {run.label}: from {checkpoint}, log {run.log_path}" if checkpoint
                    else f"[start] {run.label}: log {run.log_path}")
                shown = ""
            time.sleep(0.1)
            for line in reap(running, counts, durations, workdir):
                say(line)
                shown = ""
            if running and time.time() - last_report >= (LIVE_SECONDS if live else LINE_SECONDS):
                last_report = time.time()
                report = progress_report([(entry[0], entry[3]) for entry in running], len(pending),
                                         counts["ok"] + counts["failed"], workers, durations)
                shown = show_progress(report, live)
    except KeyboardInterrupt as stop:
        print(("\n" if shown else "")
              + f"{signal_name(stop)}: asking {len(running)} running run(s) to save and stop "
              "(again: stop them at once); the same command continues them", flush=True)
        stop_runs(running, workdir)
        raise
    return counts


def skip_finished(runs: list[Run], force: bool, counts: dict[str, int]) -> list[Run]:
    """The runs to do: all with `force`, else those not finished earlier (the others counted as
    skipped, each with its line)."""
    pending = []
    for run in runs:
        if not force and run.finished_earlier():
            counts["skipped"] += 1
            how = "diverged" if run.diverged_earlier() else "finished"
            print(f"[skip] {run.label}: {how} earlier ({run.done_path})", flush=True)
        else:
            pending.append(run)
    return pending


def reap(running: list, counts: dict[str, int], durations: list[float], workdir: Path) -> list[str]:
    """Take the runs that ended out of `running`: each one's marker written, its ending counted (and
    its time, if it succeeded); returns the line that says how each ended."""
    said = []
    for entry in list(running):
        run, process, log, started, checkpoint = entry
        if process.poll() is None:
            continue
        running.remove(entry)
        seconds = time.time() - started
        finish(run, process.returncode, seconds, log)
        outcome = judge(run, process.returncode, seconds, checkpoint, workdir)
        counts[outcome[0]] = counts.get(outcome[0], 0) + 1
        if outcome[0] == "ok":
            durations.append(seconds)
        said.append(outcome[1])
    return said


def show_progress(report: list[str], live: bool) -> str:
    """The progress report: in a terminal one line, redrawn in place (returned, for the next line to
    clear); elsewhere a few lines of their own (and "" returned)."""
    if not live:
        print("\n".join(f"[...]  {line}" for line in report), flush=True)
        return ""
    shown = " | ".join(report)
    width = shutil.get_terminal_size().columns - 1
    print("\r\033[K" + (shown if len(shown) <= width else shown[:width - 3] + "..."), end="",
          flush=True)
    return shown


def judge(run: Run, returncode: int, seconds: float, checkpoint: Path | None,
          workdir: Path) -> tuple[str, str]:
    """How a run ended, as (count, the line that says so): ok, diverged (exit code DIVERGED: its
    network became non-finite), stopped (exit code STOPPED, a signal of its own: it continues from
    its checkpoint) or failed. A run given a checkpoint that exits with 2, the PPO scripts' code for
    input they refuse, could not resume from it: that is said in one line, and the run is not
    started again in its place."""
    if returncode == 0:
        return "ok", f"[ok]   {run.label}: {seconds:.1f}s, log {run.log_path}"
    if returncode == STOPPED:
        return "stopped", (f"[stop] {run.label}: {where_it_stopped(run, workdir)}, "
                           f"log {run.log_path}")
    if returncode == DIVERGED:  # the script's own line says where, why, which checkpoint is good
        line = next((line for line in reversed(last_lines(run.log_path, 5)) if "diverged:" in line),
                    "")
        return "diverged", (f"[DIVERGED] {run.label}: {line.strip().split('diverged: ', 1)[-1]} "
                            f"(not started again: change its settings), log {run.log_path}")
    if returncode == 2 and checkpoint is not None:
        refusal = next((line for line in reversed(last_lines(run.log_path, 5)) if "error:" in line),
                       "")
        return "failed", (f"[FAIL] {run.label}: cannot resume from {checkpoint} "
                          f"({refusal.strip()}): move it away to start the run again, or continue "
                          "it with the version of the script that wrote it")
    return "failed", (f"[FAIL] {run.label}: exit code {returncode} after {seconds:.1f}s, "
                      f"log {run.log_path}{log_tail(run.log_path)}")


def where_it_stopped(run: Run, workdir: Path) -> str:
    """What a stopped run left for the next invocation: its checkpoint, or nothing to resume."""
    checkpoint = run.checkpoint(workdir)
    return (f"stopped, the same command continues it from {checkpoint}" if checkpoint else
            "stopped before its first checkpoint, the same command starts it again")


def stop_runs(running: list, workdir: Path) -> None:
    """Ask each running run to save and stop (SIGTERM, once: the PPO scripts finish their iteration
    and write their checkpoint, torchrun passes it on to its processes), wait until they have, and
    say where each one stopped. Another Ctrl-C or SIGTERM meanwhile sends SIGTERM again, which
    stops them at once (they lose the work since their last checkpoint); those still running 10 s
    later are killed. SIGUSR1, Slurm's warning of a time limit, only says again what the runs are
    doing already."""
    for entry in running:
        entry[1].send_signal(signal.SIGTERM)
    deadline = None
    while any(entry[1].poll() is None for entry in running):
        try:
            time.sleep(0.1)
            if deadline is not None and time.time() > deadline:
                for entry in running:
                    entry[1].kill()
        except KeyboardInterrupt as again:
            if deadline is None \
                    and not (isinstance(again, Stopped) and again.args[0] == signal.SIGUSR1):
                print("stopping the runs at once", flush=True)
                for entry in running:
                    if entry[1].poll() is None:
                        entry[1].send_signal(signal.SIGTERM)
                deadline = time.time() + 10
    for run, process, log, started, _ in running:
        finish(run, process.returncode, time.time() - started, log)
        if process.returncode == 0:
            print(f"[ok]   {run.label}: finished as it was asked to stop, log {run.log_path}",
                  flush=True)
        else:
            print(f"[stop] {run.label}: {where_it_stopped(run, workdir)}, log {run.log_path}",
                  flush=True)


def print_commands(runs: list[Run], workdir: Path, force: bool) -> None:
    """--dry-run: each run as a shell line (with --resume where it would continue from a
    checkpoint), marked when it would be skipped."""
    for run in runs:
        state = ("  # finished earlier, would be skipped" if run.finished_earlier() and not force
                 else "")
        argv, checkpoint = attempt(run, workdir, force)
        where = "" if workdir == Path(".") else f"(cd {shlex.quote(str(workdir))} && "
        print(f"{where}{shlex.join(argv)}{')' if where else ''} {'>>' if checkpoint else '>'} "
              f"{shlex.quote(str(run.log_path))} 2>&1{state}")


class Stopped(KeyboardInterrupt):
    """The runner was asked to stop: by Ctrl-C (SIGINT), `kill` or Slurm at a task's end (SIGTERM),
    or Slurm's warning before a task's time limit (SIGUSR1). Its argument is the signal's number."""


def stop_on_signal(signum, frame):
    """Ctrl-C, SIGTERM and SIGUSR1 stop the runner alike: its runs save and stop (run_all)."""
    raise Stopped(signum)


def signal_name(stop: KeyboardInterrupt) -> str:
    """The signal that stopped the runner, as a user names it."""
    signum = stop.args[0] if isinstance(stop, Stopped) else signal.SIGINT
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def summary_line(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    stopped = (f", {counts['stopped']} stopped (the same command continues them)"
               if counts.get("stopped") else "")
    diverged = f", {counts['diverged']} diverged" if counts.get("diverged") else ""
    return (f"{total} run(s): {counts['ok']} ran ok, "
            f"{counts['skipped']} skipped (finished earlier), "
            f"{counts['failed']} failed{diverged}{stopped}")
