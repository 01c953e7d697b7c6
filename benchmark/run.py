"""Run one PPO script on several environments and seeds, keep every run's output, skip finished runs.

    python benchmark/run.py --env-ids CartPole-v1 Acrobot-v1 \\
        --command "python ppo/ppo.py --total-timesteps 500000" --num-seeds 3 --workers 2
    python benchmark/run.py ... --dry-run          # print the commands, run nothing
    python benchmark/run.py --quick                # the whole pipeline on a tiny budget, in a temp dir
    python benchmark/run.py ... --slurm --partition gpu --gpus 1 --time 12:00:00   # on a Slurm cluster

While runs go, each one's step and time left (from the progress line in its log) and the whole
benchmark's are shown: live on one line in a terminal, as a few lines a minute elsewhere (CI, Slurm).

Each run is `<command> --env-id ID --seed S`, started in --workdir (default: the current directory,
so its TensorBoard logs land in ./runs/) with OMP_NUM_THREADS=1, since parallel runs would otherwise
fight over cores; an OMP_NUM_THREADS you set, or a Slurm task's --cpus-per-task, is passed on instead.
Its stdout and stderr go to `<log-dir>/<variant>/<env id>__seed<S>.log`; when it exits 0 a
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
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python benchmark/run.py` puts only benchmark/ on the path
    sys.path.append(str(REPO))
# The scripts' exit codes, declared once, in ppo/exits.py (standard library only, as this runner is):
# WRONG_INPUT (2); STOPPED (130), a run or a runner that stopped because it was asked to, before its
# end: the same command continues it; DIVERGED (3), a run whose network became non-finite. Such a run
# is over: its checkpoint is the last good one, and continuing from it with the same settings would
# diverge again, so it gets a marker as a finished run does and is not started again.
from ppo.exits import DIVERGED, STOPPED, WRONG_INPUT  # noqa: E402

RUNNER = Path(__file__).resolve()
REPORT = REPO / "benchmark" / "report.py"

# The quick mode: the whole pipeline on a budget small enough for CI.
QUICK_ENV_IDS = ["CartPole-v1", "Acrobot-v1"]
QUICK_SEEDS = 2
QUICK_ARGS = ["--total-timesteps", "2048", "--num-steps", "64"]


class WrongInput(Exception):
    """Wrong input, or a submission Slurm refused: the one line saying what to do. The helpers here
    raise it (`fail`), for this runner and for the tuner, which calls them too; the main of the command
    that was run prints it as its own (`refuse`), so each speaks as itself."""


def fail(message: str) -> NoReturn:
    raise WrongInput(message)


def refuse(command: str, error: WrongInput) -> int:
    """A command's one line for wrong input, `<command>: error: <what to do>`; its exit code, 2."""
    print(f"{command}: error: {error}", file=sys.stderr, flush=True)
    return WRONG_INPUT


def refuse_a_file(path: Path, given_as: str) -> None:
    """Refuse a path that should be a directory but is a file; `given_as` says where the path comes
    from (the option that names it)."""
    if path.exists() and not path.is_dir():
        fail(f"{path} ({given_as}) is a file: give a directory (it is made if it does not exist)")


def make_directory(path: Path, given_as: str) -> None:
    """mkdir -p, or one line saying why the directory cannot be made."""
    refuse_a_file(path, given_as)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"cannot make the directory {path} ({given_as}): {error.strerror}; give one you can write to")


@dataclass
class Run:
    """One (environment, seed) run of the benchmarked command."""

    variant: str
    env_id: str
    seed: int
    command: list[str]  # as given, with --env-id and --seed appended: what identifies the run
    argv: list[str]     # what is executed: `python` and script paths resolved, the checkpoint flags added
    log_path: Path

    @property
    def done_path(self) -> Path:
        """The marker written beside the log when the run exits 0, or diverged (DIVERGED)."""
        return self.log_path.with_suffix(".done")

    @property
    def label(self) -> str:
        return f"{self.variant} {self.env_id} seed {self.seed}"

    def finished_earlier(self) -> bool:
        """True when a previous invocation ran exactly this command to its end: a successful one, or
        a divergence (`diverged_earlier`)."""
        return self.end_record().get("command") == self.command

    def diverged_earlier(self) -> bool:
        return self.finished_earlier() and self.end_record().get("exit_code") == DIVERGED

    def end_record(self) -> dict:
        """What the .done marker says of how the run ended (empty without one)."""
        try:
            record = json.loads(self.done_path.read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def checkpoint(self, workdir: Path) -> Path | None:
        """The checkpoint an unfinished earlier attempt of exactly this run left, to continue it from;
        None if there is none. Found through the run's log, which keeps every attempt: its first line
        names the run (`# run: <command>`), and each attempt's start line names its checkpoint
        (`  logs in runs/<name>/ (...), checkpoint: runs/<name>/checkpoint.pt`, a path from `workdir`)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return None
        if not lines or lines[0] != f"# run: {json.dumps(self.command)}":
            return None  # another command's log, or one from before checkpoints were kept
        named = [match.group(1) for match in map(CHECKPOINT_LINE.match, lines) if match]
        path = workdir / named[-1] if named else None
        return path if path is not None and path.is_file() else None


def variant_name(argv: list[str]) -> str:
    """The name runs of this command are filed under: its --exp-name if given, else the stem of the
    first `.py` file on the command line (what the scripts use as their default exp_name)."""
    for i, token in enumerate(argv):
        if token == "--exp-name" and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith("--exp-name="):
            return token.split("=", 1)[1]
    for token in argv:
        if token.endswith(".py"):
            return Path(token).stem
    return Path(argv[0]).name


def safe_name(env_id: str) -> str:
    """An env id usable as a file name (`ALE/Breakout-v5` -> `ALE_Breakout-v5`)."""
    return env_id.replace("/", "_")


def resolve(tokens: list[str]) -> list[str]:
    """The command as it is executed: a leading `python` means this interpreter and a leading
    `torchrun` this interpreter's torch.distributed.run (so runs use the runner's environment, whether
    or not it is activated), and a relative path to an existing `.py` file or to the program is made
    absolute, so the command means the same whatever --workdir the runs start in."""
    resolved = list(tokens)
    if resolved[0] in ("python", "python3"):
        resolved[0] = sys.executable
    elif resolved[0] == "torchrun":
        resolved[0:1] = [sys.executable, "-m", "torch.distributed.run"]
    elif "/" in resolved[0] and not os.path.isabs(resolved[0]) and os.path.isfile(resolved[0]):
        resolved[0] = os.path.abspath(resolved[0])
    for i, token in enumerate(resolved):
        if token.endswith(".py") and not os.path.isabs(token) and os.path.isfile(token):
            resolved[i] = os.path.abspath(token)
    return resolved


def check_program(given: str, executed: str) -> None:
    """Refuse a command whose program cannot be started, before any run does: every run would fail
    the same way. `given` is the command's first word, `executed` what resolve() made of it. A name
    without a slash is looked up on PATH; a path is read from where run.py runs."""
    if "/" not in executed:
        if shutil.which(executed) is None:
            fail(f"--command: the program {given!r} is not found on PATH: check its name, or give its path")
    elif not os.path.isfile(executed):
        fail(f"--command: {given} does not exist (paths are read from {os.getcwd()}): give the right path")
    elif not os.access(executed, os.X_OK):
        fail(f"--command: {given} is not executable: chmod +x it, or start it with its interpreter")


def plan_runs(command: str, env_ids: list[str], seeds: list[int], log_dir: Path,
              save_minutes: float = 0) -> list[Run]:
    """Every run to do, environment by environment, seed by seed; with `save_minutes`, each keeps a
    checkpoint written at least that often (its command, which names the run, stays as given)."""
    try:
        base = shlex.split(command)
    except ValueError as error:  # an unclosed quote, or a trailing backslash
        fail(f"--command {command!r} cannot be split into words ({str(error).lower()}): "
             "close its quotes, or quote the whole command once for the shell")
    if not base:
        fail("--command is empty: give the command to run, e.g. \"python ppo/ppo.py\"")
    check_program(base[0], resolve(base)[0])
    script = next((token for token in base[1:] if token.endswith(".py")), None)
    if script is not None and not os.path.isfile(script):  # every run would stop at "can't open file"
        fail(f"--command: the script {script} does not exist (paths are read from {os.getcwd()}): give the right path")
    variant = variant_name(base)
    saving = ["--save-model", "--save-minutes", f"{save_minutes:g}"] if save_minutes > 0 else []
    runs = []
    for env_id in env_ids:
        for seed in seeds:
            full = base + ["--env-id", env_id, "--seed", str(seed)]
            runs.append(Run(variant, env_id, seed, full, resolve(full) + saving,
                            log_dir / variant / f"{safe_name(env_id)}__seed{seed}.log"))
    return runs


# The line of a PPO script's start that says where its checkpoint goes (ppo/run_life.py, Run.start).
CHECKPOINT_LINE = re.compile(r"^  logs in .*, checkpoint: (.+)$")


def attempt(run: Run, workdir: Path, force: bool) -> tuple[list[str], Path | None]:
    """What to execute for `run` now, and the checkpoint it continues from: `--resume CHECKPOINT` when an
    earlier attempt left one (unless `force`, which starts every run again), else the run itself."""
    checkpoint = None if force else run.checkpoint(workdir)
    if checkpoint is None:
        return run.argv, None
    return run.argv + ["--resume", os.path.relpath(checkpoint, workdir)], checkpoint


def start(run: Run, workdir: Path, force: bool = False) -> tuple[subprocess.Popen, object, Path | None]:
    """Start one run in the background, its output going to its log file: a new log, or, when it
    continues from a checkpoint, the earlier attempts' log with this attempt's output added. Returns the
    process, the open log and that checkpoint (None for a new start)."""
    run.log_path.parent.mkdir(parents=True, exist_ok=True)
    run.done_path.unlink(missing_ok=True)
    argv, checkpoint = attempt(run, workdir, force)
    log = open(run.log_path, "a" if checkpoint else "w")
    log.write(("# ---- continued\n" if checkpoint else f"# run: {json.dumps(run.command)}\n")
              + f"# command: {shlex.join(argv)}\n# cwd: {workdir}\n"
              f"# started: {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    log.flush()
    # One thread per run unless the user (OMP_NUM_THREADS) or Slurm (the task's CPUs) says otherwise.
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("SLURM_CPUS_PER_TASK") or "1"
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    return process, log, checkpoint


def finish(run: Run, returncode: int, seconds: float, log) -> None:
    """Close the run's log and, when it succeeded or diverged (it is over either way), write its .done
    marker."""
    log.write(f"# exit code {returncode} after {seconds:.1f}s\n")
    log.close()
    if returncode in (0, DIVERGED):
        run.done_path.write_text(json.dumps({
            "command": run.command, "argv": run.argv, "exit_code": returncode, "seconds": round(seconds, 1),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")


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


# A run's progress line, as the PPO scripts print it: `step N/TOTAL | SPS | E elapsed, L left | ...`.
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


def progress_report(running: list, pending: int, done: int, workers: int, durations: list[float]) -> list[str]:
    """What the running runs have done (from their logs) and the time the whole benchmark has left: the
    running runs' own estimates, then the waiting runs at the mean length of the runs seen so far
    (finished, or estimated from their progress), `workers` at a time. `running` holds (run, started)."""
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
    """Run everything not finished earlier, `workers` at a time, continuing each from its checkpoint if
    an earlier attempt left one (`force`: start every run again); print a line per run as it starts and
    as it ends, and meanwhile each running run's step and time left, read from its log, and the whole
    benchmark's: live in a terminal, as a few lines a minute elsewhere (CI, Slurm logs).

    Returns the counts of runs that succeeded, were skipped, failed and stopped (a run stopped by a
    signal of its own, not the runner's). Asked to stop itself (Stopped, a KeyboardInterrupt), it lets
    the running runs save and stop (stop_runs), starts no other, and raises it again."""
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
                say(f"[resume] {run.label}: from {checkpoint}, log {run.log_path}" if checkpoint else
                    f"[start] {run.label}: log {run.log_path}")
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
        print(("\n" if shown else "") + f"{signal_name(stop)}: asking {len(running)} running run(s) to save and "
              "stop (again: stop them at once); the same command continues them", flush=True)
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
    print("\r\033[K" + (shown if len(shown) <= width else shown[:width - 3] + "..."), end="", flush=True)
    return shown


def judge(run: Run, returncode: int, seconds: float, checkpoint: Path | None, workdir: Path) -> tuple[str, str]:
    """How a run ended, as (count, the line that says so): ok, diverged (exit code DIVERGED: its network
    became non-finite), stopped (exit code STOPPED, a signal of its own: it continues from its
    checkpoint) or failed. A run given a checkpoint that exits with 2,
    the PPO scripts' code for input they refuse, could not resume from it: that is said in one line,
    and the run is not started again in its place."""
    if returncode == 0:
        return "ok", f"[ok]   {run.label}: {seconds:.1f}s, log {run.log_path}"
    if returncode == STOPPED:
        return "stopped", f"[stop] {run.label}: {where_it_stopped(run, workdir)}, log {run.log_path}"
    if returncode == DIVERGED:  # the script's own line says where, why, and which checkpoint is good
        line = next((line for line in reversed(last_lines(run.log_path, 5)) if "diverged:" in line), "")
        return "diverged", (f"[DIVERGED] {run.label}: {line.strip().split('diverged: ', 1)[-1]} (not started "
                            f"again: change its settings), log {run.log_path}")
    if returncode == 2 and checkpoint is not None:
        refusal = next((line for line in reversed(last_lines(run.log_path, 5)) if "error:" in line), "")
        return "failed", (f"[FAIL] {run.label}: cannot resume from {checkpoint} ({refusal.strip()}): move it "
                          "away to start the run again, or continue it with the version of the script that wrote it")
    return "failed", (f"[FAIL] {run.label}: exit code {returncode} after {seconds:.1f}s, "
                      f"log {run.log_path}{log_tail(run.log_path)}")


def where_it_stopped(run: Run, workdir: Path) -> str:
    """What a stopped run left for the next invocation: its checkpoint, or nothing to continue from."""
    checkpoint = run.checkpoint(workdir)
    return (f"stopped, the same command continues it from {checkpoint}" if checkpoint else
            "stopped before its first checkpoint, the same command starts it again")


def stop_runs(running: list, workdir: Path) -> None:
    """Ask each running run to save and stop (SIGTERM, once: the PPO scripts finish their iteration and
    write their checkpoint, torchrun passes it on to its processes), wait until they have, and say
    where each one stopped. Another Ctrl-C or SIGTERM meanwhile sends SIGTERM again, which stops them
    at once (they lose the work since their last checkpoint); those still running 10 s later are killed.
    SIGUSR1, Slurm's warning of a time limit, only says again what the runs are doing already."""
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
            if deadline is None and not (isinstance(again, Stopped) and again.args[0] == signal.SIGUSR1):
                print("stopping the runs at once", flush=True)
                for entry in running:
                    if entry[1].poll() is None:
                        entry[1].send_signal(signal.SIGTERM)
                deadline = time.time() + 10
    for run, process, log, started, _ in running:
        finish(run, process.returncode, time.time() - started, log)
        if process.returncode == 0:
            print(f"[ok]   {run.label}: finished as it was asked to stop, log {run.log_path}", flush=True)
        else:
            print(f"[stop] {run.label}: {where_it_stopped(run, workdir)}, log {run.log_path}", flush=True)


@dataclass
class Benchmark:
    """What one invocation of the runner does: `command` on every env id and seed, each run started in
    `workdir` and logged under `log_dir`."""

    command: str
    env_ids: list[str]
    seeds: list[int]  # consecutive, from the first
    workdir: Path
    log_dir: Path
    save_minutes: float = 10  # each run keeps a checkpoint at most this old (0: none, runs start over)

    def runs(self) -> list[Run]:
        return plan_runs(self.command, self.env_ids, self.seeds, self.log_dir, self.save_minutes)

    def runner_args(self) -> list[str]:
        """The arguments of this runner that plan exactly these runs (what a Slurm task is given)."""
        return ["--env-ids", *self.env_ids, "--command", self.command, "--num-seeds", str(len(self.seeds)),
                "--start-seed", str(self.seeds[0]), "--workdir", str(self.workdir), "--log-dir", str(self.log_dir),
                "--save-minutes", f"{self.save_minutes:g}"]

    def report_command(self, out_dir: Path) -> list[str]:
        return [sys.executable, str(REPORT), "--runs-dir", str(self.workdir / "runs"), "--out-dir", str(out_dir)]


def quick_benchmark(quick_dir: Path | None, shared: bool, save_minutes: float = 10) -> Benchmark:
    """ppo.py on two small environments, in quick_dir or a new temporary directory. `shared`: the runs
    will be Slurm tasks, maybe on other machines, which do not see this one's /tmp; the directory is
    then made under the repository's benchmark/logs/, which every node running its scripts sees."""
    if quick_dir is None:
        parent = REPO / "benchmark" / "logs" if shared else None
        if parent is not None:
            make_directory(parent, "where --quick --slurm makes its directory")
        try:
            quick_dir = Path(tempfile.mkdtemp(prefix="ppo-benchmark-quick-", dir=parent))
        except OSError as error:
            fail(f"--quick: cannot make a temporary directory in {parent or tempfile.gettempdir()} "
                 f"({error.strerror}): give one with --quick-dir")
    make_directory(quick_dir, "--quick-dir")
    command = shlex.join(["python", str(REPO / "ppo" / "ppo.py"), *QUICK_ARGS])
    return Benchmark(command, QUICK_ENV_IDS, list(range(1, QUICK_SEEDS + 1)), quick_dir, quick_dir / "logs",
                     save_minutes)


def print_commands(runs: list[Run], workdir: Path, force: bool) -> None:
    """--dry-run: each run as a shell line (with --resume where it would continue from a checkpoint),
    marked when it would be skipped."""
    for run in runs:
        state = "  # finished earlier, would be skipped" if run.finished_earlier() and not force else ""
        argv, checkpoint = attempt(run, workdir, force)
        where = "" if workdir == Path(".") else f"(cd {shlex.quote(str(workdir))} && "
        print(f"{where}{shlex.join(argv)}{')' if where else ''} {'>>' if checkpoint else '>'} "
              f"{shlex.quote(str(run.log_path))} 2>&1{state}")


class Stopped(KeyboardInterrupt):
    """The runner was asked to stop: by Ctrl-C (SIGINT), `kill` or Slurm at a task's end (SIGTERM), or
    Slurm's warning before a task's time limit (SIGUSR1). Its argument is the signal's number."""


def stop_on_signal(signum, frame):
    """Ctrl-C, SIGTERM and SIGUSR1 stop the runner alike: its runs save and stop (run_all)."""
    raise Stopped(signum)


def signal_name(stop: KeyboardInterrupt) -> str:
    """The signal that stopped the runner, as a user names it."""
    signum = stop.args[0] if isinstance(stop, Stopped) else signal.SIGINT
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def requeue_this_task() -> None:
    """--requeue: put this Slurm task back in the queue (`scontrol requeue`), to continue its run when it
    starts again; it waits as pending, and the report job, which waits for the whole array, with it.
    Slurm ends the task now with SIGTERM, which is ignored (main): the run has saved, the runner is done."""
    # An array task by `<array job>_<task>`: the array's own job id is also the id of one of its tasks,
    # and given alone it would requeue the whole array, its running tasks too.
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")
    if job is None:
        print("--requeue: not in a Slurm job, nothing to requeue; the same command continues the run", flush=True)
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except OSError as error:  # scontrol not found
        result = subprocess.CompletedProcess([], 1, "", str(error))
    if result.returncode == 0:
        print(f"[requeue] job {job} is back in the queue: when Slurm starts it again, it continues the run",
              flush=True)
    else:
        message = " ".join((result.stderr or result.stdout).split())
        print(f"[requeue] Slurm did not requeue job {job} ({message}): submit the same command again to "
              "continue the run", flush=True)


def summary_line(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    stopped = f", {counts['stopped']} stopped (the same command continues them)" if counts.get("stopped") else ""
    diverged = f", {counts['diverged']} diverged" if counts.get("diverged") else ""
    return (f"{total} run(s): {counts['ok']} ran ok, {counts['skipped']} skipped (finished earlier), "
            f"{counts['failed']} failed{diverged}{stopped}")


# ---------------------------------------------------------------------------------------------------
# Slurm: the same runs as the tasks of one job array, then a report job
# ---------------------------------------------------------------------------------------------------

SLURM_TEMPLATE = REPO / "benchmark" / "slurm_template.sh"
PLACEHOLDERS = ("job_name", "output", "array_line", "resource_lines", "command")
# The placeholders that stand for one value of an `#SBATCH --option=VALUE` line: fill() quotes them.
VALUE_PLACEHOLDERS = ("job_name", "output")
# Every report job has this name and `--dependency=singleton`: Slurm runs them one at a time, so the
# reports of families submitted together never write the same files at once.
REPORT_JOB_NAME = "ppo-benchmark-report"


def array_spec(indices: list[int]) -> str:
    """Slurm's --array value for these task indices, consecutive ones folded: [0, 1, 2, 5] -> 0-2,5."""
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
    """The #SBATCH lines of the resource options; the report job needs no GPU and one CPU. The array's
    tasks also ask for the warning before their time limit, and with --requeue may be requeued."""
    options = [("partition", args.partition)]
    if not report_job:
        # --gres=gpu:N rather than --gpus=N: it works with every select plugin and Slurm version.
        options += [("gres", f"gpu:{args.gpus}" if args.gpus else None), ("cpus-per-task", args.cpus_per_task or 1)]
    options.append(("time", args.time))
    if not report_job:
        # SIGUSR1 to the batch shell, which is this runner (the task script execs it): its run saves
        # and stops. Slurm may send it up to a minute early.
        options.append(("signal", f"B:USR1@{args.warning_seconds}"))
        if args.requeue:  # a requeued task's output goes on in the same file
            options += [("requeue", None), ("open-mode", "append")]
    return "\n".join(f"#SBATCH --{name}" + ("" if value is None else f"={value}") for name, value in options
                     if value is not None or name == "requeue")


def read_template(path: Path) -> str:
    """The template without its `##` notes; a template that lacks a placeholder is refused."""
    try:
        text = path.read_text()
    except OSError as error:
        fail(f"cannot read the Slurm template {path} ({error.strerror}): give an existing file to --slurm-template")
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("##"))
    missing = [f"{{{name}}}" for name in PLACEHOLDERS if f"{{{name}}}" not in body]
    if missing:
        fail(f"the Slurm template {path} lacks {', '.join(missing)}: keep every placeholder of "
             f"{SLURM_TEMPLATE} in it (an option you do not pass leaves its line empty)")
    return body


def sbatch_quote(value: str) -> str:
    """A value as sbatch reads it from an `#SBATCH` line: in double quotes, with backslashes and double
    quotes escaped. Unquoted, a space ends the value (a run directory `my runs/` makes sbatch refuse the
    script) and a `#` starts a comment."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_pattern(directory: Path, name: str) -> str:
    """sbatch's --output value for the file `name` in `directory`, where `name` may hold Slurm's
    replacement symbols (%A the array's job id, %a the task index, %j the job id). Absolute, as Slurm
    reads a relative path from where sbatch is run, and a script may be resubmitted by hand. A `%` of the
    directory's own is doubled, Slurm's escape for it: `runs%j/` would otherwise become `runs123/`, a
    directory that does not exist, and Slurm would write no output at all."""
    return f"{str(directory.resolve()).replace('%', '%%')}/{name}"


def fill(template: str, values: dict[str, str]) -> str:
    """The template with the runner's placeholders filled. Only those names are replaced, so the braces
    of a site's own shell code (`${HOME}`) stay as they are. The values of {job_name} and {output} are
    quoted here rather than in the template, so that a site's template copied before they were quoted
    works too; a template that quotes them itself (`"{output}"`) gets them quoted once."""
    def replace(match: re.Match) -> str:
        if match.group("value"):
            return sbatch_quote(values[match.group("value")])
        return values[match.group("lines")]

    line_names = [name for name in PLACEHOLDERS if name not in VALUE_PLACEHOLDERS]
    pattern = rf'"?\{{(?P<value>{"|".join(VALUE_PLACEHOLDERS)})\}}"?|\{{(?P<lines>{"|".join(line_names)})\}}'
    return re.sub(pattern, replace, template)


def task_command(bench: Benchmark, runs: list[Run], force: bool, requeue: bool = False) -> str:
    """The array job's command: this runner, told which run to do by the task index. The runs are
    listed above it in comments, so that the script says what each task does. `exec`: the runner is
    the batch shell, which gets Slurm's warning before the time limit (--signal=B:...)."""
    runner = [sys.executable, str(RUNNER), *bench.runner_args(), *(["--force"] if force else []),
              *(["--requeue"] if requeue else [])]
    listing = [f"#   {index}: {run.label}: {shlex.join(run.argv)} > {run.log_path}" for index, run in enumerate(runs)]
    return "\n".join([
        f"# Task N does run N, started in {bench.workdir}, exactly as run.py without --slurm does it",
        "# (same command, log and .done marker), and skips it if it finished earlier:",
        *listing,
        f"cd {shlex.quote(os.getcwd())}",
        f'exec {shlex.join(runner)} --task-index "$SLURM_ARRAY_TASK_ID"',
    ])


def sbatch(program: str, options: list[str], script: Path, throwaway_dir: Path | None = None) -> str:
    """Submit one script; returns the job id. A refusal ends the runner with Slurm's own message, after
    removing `throwaway_dir` (made for this submission, and holding nothing that runs) if given."""
    result = subprocess.run([program, "--parsable", *options, str(script)], capture_output=True, text=True)
    if result.returncode != 0:
        message = " ".join(line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip())
        if throwaway_dir is not None:
            shutil.rmtree(throwaway_dir, ignore_errors=True)
        kept = (f"{throwaway_dir}, made for this submission, is removed again" if throwaway_dir is not None
                else f"the job scripts stay in {script.parent}")
        fail(f"sbatch refused {script}: {message or f'exit code {result.returncode}'}; {kept}; "
             "fix the options or the template and submit again")
    # --parsable prints `id` or `id;cluster` as its last line.
    return result.stdout.strip().splitlines()[-1].split(";")[0]


def find_sbatch() -> str:
    program = shutil.which("sbatch")
    if program is None:
        fail("sbatch not found: run --slurm where Slurm's commands are on PATH (a cluster's login node), "
             "or without --slurm to run here")
    return program


def write_array_script(bench: Benchmark, runs: list[Run], todo: list[int], args: argparse.Namespace,
                       template: str, slurm_dir: Path) -> Path:
    """The job array's script, a task per run in `todo`; with none to do, no script (an earlier
    submission's is removed). Returns its path."""
    variant = runs[0].variant
    array_script = slurm_dir / f"{variant}.sbatch"
    if todo:
        array_script.write_text(fill(template, {
            "job_name": f"ppo-benchmark-{variant}", "output": output_pattern(slurm_dir, f"{variant}_%A_%a.out"),
            "array_line": f"#SBATCH --array={array_spec(todo)}",
            "resource_lines": resource_lines(args, report_job=False),
            "command": task_command(bench, runs, args.force, args.requeue)}))
        print(f"slurm: wrote {array_script}: {len(todo)} task(s), --array={array_spec(todo)}; "
              f"{len(runs) - len(todo)} of {len(runs)} run(s) finished earlier and are left out", flush=True)
    else:
        print(f"slurm: all {len(runs)} run(s) finished earlier: no array job, only the report", flush=True)
        if array_script.exists():  # from an earlier submission: its runs are done, it is not to be resubmitted
            array_script.unlink()
            print(f"slurm: removed {array_script}, the job array of an earlier submission", flush=True)
    return array_script


def submit(bench: Benchmark, report_dir: Path, args: argparse.Namespace, template: str, program: str | None,
           throwaway_dir: Path | None = None) -> int:
    """Write the array job (a task per run not finished earlier) and the report job that runs after
    it from the template, then submit both with `program` (sbatch), unless --dry-run. `throwaway_dir`:
    a directory made for this submission (the quick benchmark's), removed if Slurm refuses the first job."""
    runs = bench.runs()
    todo = [index for index, run in enumerate(runs) if args.force or not run.finished_earlier()]
    variant = runs[0].variant
    slurm_dir = bench.log_dir / "slurm"
    refuse_a_file(bench.workdir, "--workdir")  # the tasks make it; a file there would fail every one
    make_directory(slurm_dir, "--log-dir")
    here = f"cd {shlex.quote(os.getcwd())}\n"

    array_script = write_array_script(bench, runs, todo, args, template, slurm_dir)
    report_script = slurm_dir / f"{variant}-report.sbatch"
    report = bench.report_command(report_dir)
    report_script.write_text(fill(template, {
        "job_name": REPORT_JOB_NAME, "output": output_pattern(slurm_dir, f"{variant}-report_%j.out"), "array_line": "",
        "resource_lines": resource_lines(args, report_job=True), "command": here + f"exec {shlex.join(report)}"}))
    print(f"slurm: wrote {report_script}: the report into {report_dir}", flush=True)

    if args.dry_run:
        print("dry run: nothing submitted. To submit by hand: "
              + (f"sbatch {array_script}, then " if todo else "")
              + f"sbatch --dependency={'afterany:<its job id>,' if todo else ''}singleton {report_script}")
        return 0
    jobs = []
    if todo:
        array_job = sbatch(program, [], array_script, throwaway_dir)
        jobs.append(array_job)
        print(f"slurm: submitted job array {array_job} ({len(todo)} task(s) of {variant})", flush=True)
    # afterany, not afterok: like the local runner, report on what finished even if a run failed.
    dependency = f"afterany:{jobs[0]},singleton" if todo else "singleton"
    # Not throwaway_dir: the array's tasks, submitted by now, use it whatever happens to the report job.
    report_job = sbatch(program, [f"--dependency={dependency}"], report_script)
    jobs.append(report_job)
    print(f"slurm: submitted report job {report_job}, to run {'after the array' if todo else 'now'}: "
          f"{shlex.join(report)}", flush=True)
    hints = [f"  follow:  squeue -j {','.join(jobs)}",
             f"  each run's output, as without --slurm: {bench.log_dir / variant}/<env id>__seed<S>.log "
             "(.done beside it when the run succeeded)"]
    if todo:
        hints.append(f"  Slurm's output of each task: {slurm_dir.resolve() / f'{variant}_{jobs[0]}_<task>.out'}")
    hints += [f"  the report job's output: {slurm_dir.resolve() / f'{variant}-report_{report_job}.out'}",
              f"  the report, when the array is done: {report_dir}/ (or by hand: {shlex.join(report)})",
              f"  cancel:  scancel {' '.join(jobs)}; submitting again leaves out the runs that finished"]
    print("\n".join(hints), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-ids", nargs="+", metavar="ID", help="environments to run on")
    parser.add_argument("--command", help='the command to run, e.g. "python ppo/ppo.py --total-timesteps '
                        '500000"; `--env-id ID --seed S` is appended to it')
    # The defaults of the options that plan the runs are filled in below, after the check that the
    # quick mode, which plans its own runs, is not given one of them.
    parser.add_argument("--num-seeds", type=int, help="seeds per environment (default 3)")
    parser.add_argument("--start-seed", type=int, help="the first seed (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--log-dir", type=Path, help="where run logs and .done markers go (default benchmark/logs)")
    parser.add_argument("--workdir", type=Path,
                        help="directory the runs start in, so their runs/ lands there (default .)")
    parser.add_argument("--force", action="store_true",
                        help="rerun runs that finished earlier too, and start unfinished ones again rather than "
                        "continue them")
    parser.add_argument("--save-minutes", type=float, default=10, metavar="M",
                        help="runs write a checkpoint at least every M minutes (--save-model --save-minutes M), and "
                        "an unfinished run continues from it; a stop loses at most that much of a run (default 10; "
                        "0: no checkpoint, an unfinished run starts again)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands and run nothing (with --slurm: write the job scripts, submit nothing)")
    parser.add_argument("--quick", action="store_true",
                        help="run the whole pipeline (runs, report, plots) with ppo.py on "
                        f"{' and '.join(QUICK_ENV_IDS)}, {QUICK_SEEDS} seeds, {' '.join(QUICK_ARGS)}, "
                        "in a temporary directory")
    parser.add_argument("--quick-dir", type=Path, help="with --quick: use this directory instead of a temporary one")
    add_slurm_options(parser)
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    """--slurm, what the job scripts are made with, and --task-index, which each task calls."""
    slurm = parser.add_argument_group("Slurm", "submit the runs as a job array instead of running them here")
    slurm.add_argument("--slurm", action="store_true",
                       help="write a job array (a task per run not finished earlier) and a report job after it, "
                       "submit both with sbatch, print the job ids")
    slurm.add_argument("--partition", help="the partition (default: the cluster's default)")
    slurm.add_argument("--gpus", type=int, help="GPUs per run (#SBATCH --gres=gpu:N; default none)")
    slurm.add_argument("--cpus-per-task", type=int, help="CPUs per run (default 1)")
    slurm.add_argument("--time", help="time limit per run, in Slurm's format, e.g. 12:00:00 (default: the partition's)")
    slurm.add_argument("--slurm-template", type=Path,
                       help=f"the job script template (default {SLURM_TEMPLATE.relative_to(REPO)}): copy it and edit it for your site")
    slurm.add_argument("--warning-seconds", type=int, default=120, metavar="S",
                       help="Slurm warns each task S seconds before its time limit (#SBATCH --signal=B:USR1@S), up to "
                       "a minute early; its run finishes the iteration and saves, so S must cover one iteration and "
                       "a save (default 120)")
    slurm.add_argument("--requeue", action="store_true",
                       help="a task warned of its time limit (or sent SIGUSR1) saves its run and requeues itself, to "
                       "continue it when Slurm starts it again (#SBATCH --requeue); without it, submitting the same "
                       "command again continues the unfinished runs")
    slurm.add_argument("--report-dir", type=Path,
                       help="where the report job writes the report (default WORKDIR/results; with --quick QUICK_DIR/results)")
    slurm.add_argument("--task-index", type=int, metavar="N",
                       help="do run N of the plan (env ids in order, seeds within each), as run here; what "
                       "each array task calls with $SLURM_ARRAY_TASK_ID")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check: the options that go together, each number in its range; and the
    planning options' defaults, filled in once the quick mode is known not to have been given one."""
    planning = [flag for flag, value in [("--env-ids", args.env_ids), ("--command", args.command),
                                         ("--num-seeds", args.num_seeds), ("--start-seed", args.start_seed),
                                         ("--workdir", args.workdir), ("--log-dir", args.log_dir)]
                if value is not None]
    if args.quick and planning:
        parser.error(f"{', '.join(planning)}: not with --quick, which runs its own fixed plan "
                     "(--quick-dir says where)")
    if args.quick_dir is not None and not args.quick:
        parser.error("--quick-dir: only with --quick")
    if not args.quick and (not args.env_ids or not args.command):
        parser.error("--env-ids and --command are required (or use --quick)")
    defaults = {"num_seeds": 3, "start_seed": 1, "log_dir": Path("benchmark/logs"), "workdir": Path(".")}
    for name, default in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.workers < 1 or args.num_seeds < 1:
        parser.error("--workers and --num-seeds must be at least 1")
    slurm_only = [flag for flag, value in [("--partition", args.partition), ("--gpus", args.gpus),
                                           ("--cpus-per-task", args.cpus_per_task), ("--time", args.time),
                                           ("--slurm-template", args.slurm_template), ("--report-dir", args.report_dir)]
                  if value is not None]
    if slurm_only and not args.slurm:
        parser.error(f"{', '.join(slurm_only)}: only with --slurm")
    if (args.gpus is not None and args.gpus < 1) or (args.cpus_per_task is not None and args.cpus_per_task < 1):
        parser.error("--gpus and --cpus-per-task must be at least 1")
    if not 0 <= args.save_minutes < float("inf"):
        parser.error(f"--save-minutes must be 0 (no checkpoints) or more, got {args.save_minutes}")
    if not 0 <= args.warning_seconds <= 65535:  # what sbatch takes
        parser.error(f"--warning-seconds must be 0 to 65535, got {args.warning_seconds}")
    if args.requeue and not (args.slurm or args.task_index is not None):
        parser.error("--requeue: only with --slurm")
    if args.task_index is not None and (args.slurm or args.quick or args.dry_run):
        parser.error("--task-index does one run here: it does not go with --slurm, --quick or --dry-run")


def dry_run(bench: Benchmark, runs: list[Run], args: argparse.Namespace) -> int:
    """--dry-run: the commands, nothing run."""
    refuse_a_file(bench.workdir, "--workdir")  # a dry run makes nothing, but says what a run would meet
    refuse_a_file(bench.log_dir, "--log-dir")
    print_commands(runs, bench.workdir, args.force)
    if args.quick and args.quick_dir is None:
        bench.workdir.rmdir()  # made only to name it in the commands; a real run makes its own
        print(f"dry run: {bench.workdir} removed again; a real run makes a new temporary directory")
    return 0


def main(argv: list[str] | None = None) -> int:
    # First of all: Slurm may warn a task of its time limit as soon as it starts.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, stop_on_signal)
    try:
        return run_benchmark(parse_args(argv))
    except WrongInput as error:
        return refuse("run.py", error)


def run_benchmark(args: argparse.Namespace) -> int:
    """The runs here, one Slurm task's run (--task-index), their commands (--dry-run), or the job array
    (--slurm); returns the exit code."""
    if args.slurm:
        # What a submission needs is checked before anything is written.
        template = read_template(args.slurm_template or SLURM_TEMPLATE)
        program = None if args.dry_run else find_sbatch()
    if args.quick:
        bench = quick_benchmark(args.quick_dir, shared=args.slurm, save_minutes=args.save_minutes)
        report_dir = args.report_dir or bench.workdir / "results"
        print(f"quick benchmark in {bench.workdir}: {bench.command}", flush=True)
    else:
        seeds = list(range(args.start_seed, args.start_seed + args.num_seeds))
        bench = Benchmark(args.command, args.env_ids, seeds, args.workdir, args.log_dir, args.save_minutes)
        report_dir = args.report_dir or bench.workdir / "results"
    if args.slurm:
        made_for_this_submission = bench.workdir if args.quick and args.quick_dir is None else None
        return submit(bench, report_dir, args, template, program, made_for_this_submission)
    runs = bench.runs()
    if args.task_index is not None:
        if not 0 <= args.task_index < len(runs):
            fail(f"--task-index {args.task_index} is out of range: this benchmark has runs 0 to {len(runs) - 1}")
        runs = [runs[args.task_index]]
    if args.dry_run:
        return dry_run(bench, runs, args)
    make_directory(bench.workdir, "--workdir")
    make_directory(bench.log_dir, "--log-dir")
    try:
        counts = run_all(runs, args.workers, bench.workdir, args.force)
    except KeyboardInterrupt as stop:
        for signum in (signal.SIGTERM, signal.SIGUSR1):  # the runs have saved: nothing more to stop
            signal.signal(signum, signal.SIG_IGN)
        unfinished = [run for run in runs if not run.finished_earlier()]
        if args.requeue and unfinished and isinstance(stop, Stopped) and stop.args[0] == signal.SIGUSR1:
            requeue_this_task()
        return STOPPED
    print(summary_line(counts), flush=True)
    if counts["failed"] or counts.get("diverged"):
        return 1
    if counts.get("stopped"):
        return STOPPED
    if args.quick:
        # The quick mode is the whole pipeline: the report and its plots too.
        report = subprocess.run(bench.report_command(report_dir))
        if report.returncode != 0:
            return report.returncode
        print(f"quick benchmark done: report in {report_dir} (its runs are {QUICK_ARGS[1]} steps, to check the "
              "pipeline: 'below' the published returns is expected)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
