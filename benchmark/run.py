"""Run one PPO script on several environments and seeds, keep every run's output, skip finished runs.

    python benchmark/run.py --env-ids CartPole-v1 Acrobot-v1 \\
        --command "python ppo/ppo.py --total-timesteps 500000" --num-seeds 3 --workers 2
    python benchmark/run.py ... --dry-run          # print the commands, run nothing
    python benchmark/run.py --quick                # the whole pipeline on a tiny budget, in a temp dir

Each run is `<command> --env-id ID --seed S`, started in --workdir (default: the current directory,
so its TensorBoard logs land in ./runs/) with OMP_NUM_THREADS=1, since parallel runs would otherwise
fight over cores.
Its stdout and stderr go to `<log-dir>/<variant>/<env id>__seed<S>.log`; when it exits 0 a
`.done` marker is written beside the log, and a later invocation with the same command skips it.
So an interrupted benchmark is resumed by running the same command again.

Paths to scripts in the command are relative to where run.py is started (normally the repository
root), also with --workdir. Standard library only, so it works before anything else is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The quick mode: the whole pipeline on a budget small enough for CI.
QUICK_ENV_IDS = ["CartPole-v1", "Acrobot-v1"]
QUICK_SEEDS = 2
QUICK_ARGS = ["--total-timesteps", "2048", "--num-steps", "64"]


@dataclass
class Run:
    """One (environment, seed) run of the benchmarked command."""

    variant: str
    env_id: str
    seed: int
    command: list[str]  # as given, with --env-id and --seed appended: what identifies the run
    argv: list[str]     # what is executed: `python` and script paths resolved
    log_path: Path

    @property
    def done_path(self) -> Path:
        """The marker written beside the log when the run exits 0."""
        return self.log_path.with_suffix(".done")

    @property
    def label(self) -> str:
        return f"{self.variant} {self.env_id} seed {self.seed}"

    def finished_earlier(self) -> bool:
        """True when a previous invocation ran exactly this command to a successful end."""
        try:
            record = json.loads(self.done_path.read_text())
        except (OSError, ValueError):
            return False
        return record.get("command") == self.command


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
    or not it is activated), and a relative path to an existing `.py` file is made absolute, so the
    command means the same whatever --workdir the runs start in."""
    resolved = list(tokens)
    if resolved[0] in ("python", "python3"):
        resolved[0] = sys.executable
    elif resolved[0] == "torchrun":
        resolved[0:1] = [sys.executable, "-m", "torch.distributed.run"]
    for i, token in enumerate(resolved):
        if token.endswith(".py") and not os.path.isabs(token) and os.path.isfile(token):
            resolved[i] = os.path.abspath(token)
    return resolved


def plan_runs(command: str, env_ids: list[str], seeds: list[int], log_dir: Path) -> list[Run]:
    """Every run to do, environment by environment, seed by seed."""
    base = shlex.split(command)
    if not base:
        raise SystemExit("run.py: error: --command is empty")
    variant = variant_name(base)
    runs = []
    for env_id in env_ids:
        for seed in seeds:
            full = base + ["--env-id", env_id, "--seed", str(seed)]
            runs.append(Run(variant, env_id, seed, full, resolve(full),
                            log_dir / variant / f"{safe_name(env_id)}__seed{seed}.log"))
    return runs


def start(run: Run, workdir: Path) -> tuple[subprocess.Popen, object]:
    """Start one run in the background, its output going to its log file."""
    run.log_path.parent.mkdir(parents=True, exist_ok=True)
    run.done_path.unlink(missing_ok=True)
    log = open(run.log_path, "w")
    log.write(f"# command: {shlex.join(run.argv)}\n# cwd: {workdir}\n"
              f"# started: {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    log.flush()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(run.argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    return process, log


def finish(run: Run, returncode: int, seconds: float, log) -> None:
    """Close the run's log and, on success only, write its .done marker."""
    log.write(f"# exit code {returncode} after {seconds:.1f}s\n")
    log.close()
    if returncode == 0:
        run.done_path.write_text(json.dumps({
            "command": run.command, "argv": run.argv, "exit_code": 0, "seconds": round(seconds, 1),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")


def log_tail(path: Path, lines: int = 3) -> str:
    """The last few lines of a log, indented, for the summary of a failed run."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    tail = [line for line in text if not line.startswith("# exit code")][-lines:]
    return "".join(f"\n        {line}" for line in tail)


def run_all(runs: list[Run], workers: int, workdir: Path, force: bool = False) -> dict[str, int]:
    """Run everything not finished earlier, `workers` at a time; print a line per run as it ends.

    Returns the counts of runs that succeeded, were skipped and failed."""
    counts = {"ok": 0, "skipped": 0, "failed": 0}
    pending = []
    for run in runs:
        if not force and run.finished_earlier():
            counts["skipped"] += 1
            print(f"[skip] {run.label}: finished earlier ({run.done_path})", flush=True)
        else:
            pending.append(run)

    running: list[tuple[Run, subprocess.Popen, object, float]] = []
    try:
        while pending or running:
            while pending and len(running) < workers:
                run = pending.pop(0)
                process, log = start(run, workdir)
                running.append((run, process, log, time.time()))
            time.sleep(0.1)
            for entry in list(running):
                run, process, log, started = entry
                if process.poll() is None:
                    continue
                running.remove(entry)
                seconds = time.time() - started
                finish(run, process.returncode, seconds, log)
                if process.returncode == 0:
                    counts["ok"] += 1
                    print(f"[ok]   {run.label}: {seconds:.1f}s, log {run.log_path}", flush=True)
                else:
                    counts["failed"] += 1
                    print(f"[FAIL] {run.label}: exit code {process.returncode} after {seconds:.1f}s, "
                          f"log {run.log_path}{log_tail(run.log_path)}", flush=True)
    except KeyboardInterrupt:
        print(f"\ninterrupted: stopping {len(running)} running run(s); finished runs keep their "
              ".done markers, so the same command resumes the benchmark", flush=True)
        for run, process, log, started in running:
            process.send_signal(signal.SIGTERM)
        for run, process, log, started in running:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            finish(run, process.returncode, time.time() - started, log)
        raise
    return counts


def quick(workers: int, quick_dir: Path | None) -> int:
    """Runner, logs, report and plots for ppo.py on two small environments, in a temporary directory."""
    workdir = quick_dir or Path(tempfile.mkdtemp(prefix="ppo-benchmark-quick-"))
    workdir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", str(REPO / "ppo" / "ppo.py"), *QUICK_ARGS])
    print(f"quick benchmark in {workdir}: {command}", flush=True)
    runs = plan_runs(command, QUICK_ENV_IDS, list(range(1, QUICK_SEEDS + 1)), workdir / "logs")
    counts = run_all(runs, workers, workdir)
    print(summary_line(counts), flush=True)
    if counts["failed"]:
        return 1
    report = subprocess.run([sys.executable, str(REPO / "benchmark" / "report.py"),
                             "--runs-dir", str(workdir / "runs"), "--out-dir", str(workdir / "results")])
    if report.returncode != 0:
        return report.returncode
    print(f"quick benchmark done: report in {workdir / 'results'}", flush=True)
    return 0


def stop_on_sigterm(signum, frame):
    """Treat `kill` like Ctrl-C, so the runs this runner started are stopped too."""
    raise KeyboardInterrupt


def summary_line(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return (f"{total} run(s): {counts['ok']} ran ok, {counts['skipped']} skipped (finished earlier), "
            f"{counts['failed']} failed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-ids", nargs="+", metavar="ID", help="environments to run on")
    parser.add_argument("--command", help='the command to run, e.g. "python ppo/ppo.py --total-timesteps '
                        '500000"; `--env-id ID --seed S` is appended to it')
    parser.add_argument("--num-seeds", type=int, default=3, help="seeds per environment (default 3)")
    parser.add_argument("--start-seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--log-dir", type=Path, default=Path("benchmark/logs"),
                        help="where run logs and .done markers go (default benchmark/logs)")
    parser.add_argument("--workdir", type=Path, default=Path("."),
                        help="directory the runs start in, so their runs/ lands there (default .)")
    parser.add_argument("--force", action="store_true", help="rerun runs that finished earlier too")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and run nothing")
    parser.add_argument("--quick", action="store_true",
                        help="run the whole pipeline (runs, report, plots) with ppo.py on "
                        f"{' and '.join(QUICK_ENV_IDS)}, {QUICK_SEEDS} seeds, {' '.join(QUICK_ARGS)}, "
                        "in a temporary directory")
    parser.add_argument("--quick-dir", type=Path, help="with --quick: use this directory instead of a temporary one")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.num_seeds < 1:
        parser.error("--workers and --num-seeds must be at least 1")
    if not args.quick and (not args.env_ids or not args.command):
        parser.error("--env-ids and --command are required (or use --quick)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        signal.signal(signal.SIGTERM, stop_on_sigterm)
        try:
            return quick(args.workers, args.quick_dir)
        except KeyboardInterrupt:
            return 130
    seeds = list(range(args.start_seed, args.start_seed + args.num_seeds))
    runs = plan_runs(args.command, args.env_ids, seeds, args.log_dir)
    if args.dry_run:
        for run in runs:
            state = "  # finished earlier, would be skipped" if run.finished_earlier() and not args.force else ""
            where = "" if args.workdir == Path(".") else f"(cd {shlex.quote(str(args.workdir))} && "
            print(f"{where}{shlex.join(run.argv)}{')' if where else ''} > {run.log_path} 2>&1{state}")
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        counts = run_all(runs, args.workers, args.workdir, args.force)
    except KeyboardInterrupt:
        return 130
    print(summary_line(counts), flush=True)
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
