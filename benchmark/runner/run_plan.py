"""The runs a benchmark plans: each (environment, seed) of a command as a `Run` (its command, what
is executed, its log and .done marker, the checkpoint an earlier attempt left), the command's words
resolved and checked, and a `Benchmark`, one invocation's plan (the quick one's too). Standard
library only; run.py, local.py and slurm.py read it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmark.common import REPO, fail, make_directory
from ppo_utils.exits import DIVERGED

REPORT = REPO / "benchmark" / "report.py"

# The quick mode: the whole pipeline on a budget small enough for CI.
QUICK_ENV_IDS = ["CartPole-v1", "Acrobot-v1"]
QUICK_SEEDS = 2
QUICK_ARGS = ["--total-timesteps", "2048", "--num-steps", "64"]

# The line of a PPO script's start that says where its checkpoint goes (ppo/run_life.py, Run.start).
CHECKPOINT_LINE = re.compile(r"^  logs in .*, checkpoint: (.+)$")


@dataclass
class Run:
    """One (environment, seed) run of the benchmarked command."""

    variant: str
    env_id: str
    seed: int
    command: list[str]  # as given, with --env-id and --seed appended: what identifies the run
    argv: list[str]     # what is executed: `python` and script paths resolved, with checkpointing
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
        """The checkpoint an unfinished earlier attempt of exactly this run left, to continue it
        from; None if there is none. Found through the run's log, which keeps every attempt: its
        first line names the run (`# run: <command>`), and each attempt's start line names its
        checkpoint (`  logs in runs/<name>/ (...), checkpoint: runs/<name>/checkpoint.pt`, a
        path from `workdir`)."""
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
    `torchrun` this interpreter's torch.distributed.run (so runs use the runner's environment,
    whether or not it is activated), and a relative path to an existing `.py` file or to the program
    is made absolute, so the command means the same whatever --workdir the runs start in."""
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
            fail(f"--command: the program {given!r} is not found on PATH: check its name, "
                 "or give its path")
    elif not os.path.isfile(executed):
        fail(f"--command: {given} does not exist (paths are read from {os.getcwd()}): "
             "give the right path")
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
    if script is not None and not os.path.isfile(script):  # each run would stop: "can't open file"
        fail(f"--command: the script {script} does not exist "
             f"(paths are read from {os.getcwd()}): give the right path")
    variant = variant_name(base)
    saving = ["--save-model", "--save-minutes", f"{save_minutes:g}"] if save_minutes > 0 else []
    runs = []
    for env_id in env_ids:
        for seed in seeds:
            full = base + ["--env-id", env_id, "--seed", str(seed)]
            runs.append(Run(variant, env_id, seed, full, resolve(full) + saving,
                            log_dir / variant / f"{safe_name(env_id)}__seed{seed}.log"))
    return runs


@dataclass
class Benchmark:
    """What one invocation of the runner does: `command` on every env id and seed, each run started
    in `workdir` and logged under `log_dir`."""

    command: str
    env_ids: list[str]
    seeds: list[int]  # consecutive, from the first
    workdir: Path
    log_dir: Path
    save_minutes: float = 10  # each run keeps a checkpoint at most this old (0: none, runs restart)

    def runs(self) -> list[Run]:
        return plan_runs(self.command, self.env_ids, self.seeds, self.log_dir, self.save_minutes)

    def runner_args(self) -> list[str]:
        """The runner's arguments that plan exactly these runs (a Slurm task is given them)."""
        return ["--env-ids", *self.env_ids, "--command", self.command,
                "--num-seeds", str(len(self.seeds)), "--start-seed", str(self.seeds[0]),
                "--workdir", str(self.workdir), "--log-dir", str(self.log_dir),
                "--save-minutes", f"{self.save_minutes:g}"]

    def report_command(self, out_dir: Path) -> list[str]:
        return [sys.executable, str(REPORT), "--runs-dir", str(self.workdir / "runs"),
                "--out-dir", str(out_dir)]


def quick_benchmark(quick_dir: Path | None, shared: bool, save_minutes: float = 10) -> Benchmark:
    """ppo.py on two small environments, in quick_dir or a new temporary directory. `shared`: the
    runs will be Slurm tasks, maybe on other machines, which do not see this one's /tmp; the
    directory is then made under the repository's benchmark/logs/, which every node running its
    scripts sees."""
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
    return Benchmark(command, QUICK_ENV_IDS, list(range(1, QUICK_SEEDS + 1)), quick_dir,
                     quick_dir / "logs", save_minutes)
