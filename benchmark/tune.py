"""Tune a PPO script's hyperparameters with Optuna, on one machine or as a Slurm job array.

    python benchmark/tune.py --command "python ppo/ppo.py" --env-ids CartPole-v1 \\
        --space benchmark/spaces/classic.toml --total-timesteps 50000 --seeds 2 --trials 25 --workers 2
    python benchmark/tune.py ... --slurm --workers 8 --time 4:00:00   # 8 workers as a job array
    python benchmark/tune.py --report --study-dir tuning/<study>        # the report of a study so far

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
trial is PRUNED. A run that diverges (exit 3, the scripts' guard), refuses its flags (exit 2), crashes
or is killed makes the trial FAILED, the reason stored as its user attribute `failure`: never a score,
and the study goes on. A study that has its trials, all of them failed, ends with exit code 2 and one
line naming the first failure, after its report.

Before the first trial, every flag of the space and of --command, and those the tuner gives each run,
is looked up in the script's own `--help`: a flag the script does not take would fail every trial, so
it is refused in one line (exit 2). A run refusing the values sampled for it (exit 2: sizes that do
not divide) still fails only its trial.

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
import ctypes
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmark import report, run  # noqa: E402  (the report's metric, the runner's commands and Slurm)
from benchmark.run import fail  # noqa: E402  (wrong input: main prints it as tune.py's one line, exit 2)
from ppo.exits import DIVERGED, STOPPED, WRONG_INPUT  # noqa: E402  (the scripts' exit codes)

TUNER = Path(__file__).resolve()
# What the tuner gives every run itself; the command and the space may not set them.
RESERVED_FLAGS = {"env-id", "seed", "total-timesteps", "save-model", "save-minutes", "resume", "evaluate"}
# The Optuna release on which `set_user_attr_of_trial`, the one reach into Optuna's internals, was
# checked; tests/test_tune.py fails on another, to have it checked again.
OPTUNA_CHECKED = "5.0.0"


# ---------------------------------------------------------------------------------------------------
# The search space
# ---------------------------------------------------------------------------------------------------


@dataclass
class Param:
    """One entry of the space: `name` is the script's flag without its dashes (`learning-rate`)."""

    name: str
    distribution: object       # an optuna distribution
    when: dict[str, list]      # sampled only when each named parameter has one of these values
    flag: bool = True          # false: a switch of the space only (it decides a `when`), never passed on

    def arguments(self, value) -> list[str]:
        """The flag as the scripts read it: `--name value`, or `--name` / `--no-name` for a boolean."""
        if not self.flag:
            return []
        if isinstance(value, bool):
            return [f"--{self.name}" if value else f"--no-{self.name}"]
        return [f"--{self.name}", str(value)]


@dataclass
class Space:
    params: list[Param]
    bounds: dict[str, tuple[float, float]]  # env id -> (low, high) of the min-max normalization
    text: str                               # the file as read, kept in the study

    def sample(self, trial) -> dict:
        """The trial's values, a parameter whose `when` does not hold left out (the script's default
        then applies). A retried or enqueued trial gets its stored values back from Optuna."""
        values = {}
        for param in self.params:
            if all(values.get(other, object()) in allowed for other, allowed in param.when.items()):
                values[param.name] = suggest(trial, param.name, param.distribution)
        return values

    def arguments(self, values: dict) -> list[str]:
        return [token for param in self.params if param.name in values
                for token in param.arguments(values[param.name])]

    def normalize(self, env_id: str, value: float) -> float:
        low, high = self.bounds[env_id]
        return (value - low) / (high - low)


def suggest(trial, name: str, distribution):
    """Sample (or get back) one value through Optuna's public suggest_* calls."""
    import optuna

    if isinstance(distribution, optuna.distributions.FloatDistribution):
        return trial.suggest_float(name, distribution.low, distribution.high, log=distribution.log,
                                   step=distribution.step)
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step,
                                 log=distribution.log)
    return trial.suggest_categorical(name, distribution.choices)


PARAM_KEYS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"},
              "categorical": {"choices"}}


def load_space(path: Path, env_ids: list[str]) -> Space:
    """Read and check a space file; anything wrong is one line and exit 2, before any trial runs.

        [params.learning-rate]        # a flag of the script, without its dashes
        type = "float"                # float (low, high, log, step), int (the same), categorical (choices)
        low = 1e-5
        high = 1e-2
        log = true
        [params.target-kl]
        type = "float"
        low = 0.005
        high = 0.05
        when = { early-stop = true }  # sampled only when early-stop is true (a list: one of its values)
        [params.early-stop]           # must come before the parameters whose `when` names it
        type = "categorical"
        choices = [false, true]
        flag = false                  # a switch of the space, not a flag of the script
        [bounds]
        "CartPole-v1" = [0, 500]      # the env's return that normalizes to 0, and to 1
    """
    import optuna

    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except OSError as error:
        fail(f"cannot read the space file {path} ({error.strerror}): give an existing TOML file to --space")
    except tomllib.TOMLDecodeError as error:
        fail(f"the space file {path} is not valid TOML ({error}): fix it")
    where = f"the space file {path}"
    unknown = set(data) - {"params", "bounds"}
    if unknown:
        fail(f"{where}: unknown table(s) {', '.join(sorted(unknown))}: it holds [params.<flag>] and [bounds]")
    if not isinstance(data.get("params"), dict) or not data["params"]:
        fail(f"{where} has no [params.<flag>] table: give at least one flag to tune")
    params: list[Param] = []
    for name, entry in data["params"].items():
        label = f"{where}: [params.{name}]"
        if name.startswith("-") or name.replace("_", "-") != name:
            fail(f"{label}: name the flag as the script spells it, without its dashes (learning-rate)")
        if name in RESERVED_FLAGS:
            fail(f"{label}: the tuner sets --{name} itself "
                 f"({', '.join(sorted(RESERVED_FLAGS))}): leave it out")
        if not isinstance(entry, dict) or entry.get("type") not in PARAM_KEYS:
            fail(f"{label}: give a type, one of float, int, categorical")
        kind = entry["type"]
        extra = set(entry) - PARAM_KEYS[kind] - {"type", "when", "flag"}
        if extra:
            fail(f"{label}: unknown key(s) {', '.join(sorted(extra))} for type {kind} "
                 f"(it takes {', '.join(sorted(PARAM_KEYS[kind] | {'when', 'flag'}))})")
        try:
            if kind == "categorical":
                choices = entry.get("choices")
                if not isinstance(choices, list) or not choices or any(
                        not isinstance(choice, (bool, int, float, str)) for choice in choices):
                    raise ValueError("choices must be a non-empty list of booleans, numbers or strings")
                distribution = optuna.distributions.CategoricalDistribution(choices)
            else:
                number = float if kind == "float" else int
                if not all(isinstance(entry.get(key), (int, float)) and not isinstance(entry.get(key), bool)
                           for key in ("low", "high")):
                    raise ValueError("low and high must be numbers")
                if kind == "int" and not all(isinstance(entry[key], int) for key in ("low", "high")):
                    raise ValueError("low and high of an int must be integers")
                if not entry["low"] < entry["high"]:
                    raise ValueError(f"low ({entry['low']}) must be below high ({entry['high']})")
                step = entry.get("step", None if kind == "float" else 1)
                distribution = (optuna.distributions.FloatDistribution if kind == "float" else
                                optuna.distributions.IntDistribution)(
                    number(entry["low"]), number(entry["high"]), log=bool(entry.get("log", False)), step=step)
        except (ValueError, TypeError) as error:
            fail(f"{label}: {error}")
        when = entry.get("when", {})
        if not isinstance(when, dict):
            fail(f"{label}: when = {{ other-flag = value }} (or a list of values)")
        conditions = {}
        for other, allowed in when.items():
            earlier = next((param for param in params if param.name == other), None)
            if earlier is None:
                fail(f"{label}: `when` names {other}, which is not a parameter above it: "
                     f"define {other} first")
            allowed = allowed if isinstance(allowed, list) else [allowed]
            choices = getattr(earlier.distribution, "choices", None)
            if choices is None or any(value not in choices for value in allowed):
                fail(f"{label}: `when` needs {other} to be a categorical whose choices include "
                     f"{', '.join(map(str, allowed))}")
            conditions[other] = allowed
        if not isinstance(entry.get("flag", True), bool):
            fail(f"{label}: flag is true (the default: pass it to the script) or false "
                 "(a switch of the space)")
        params.append(Param(name, distribution, conditions, entry.get("flag", True)))

    bounds = {}
    for env_id, pair in (data.get("bounds") or {}).items():
        if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(v, (int, float)) for v in pair)
                or not pair[0] < pair[1]):
            fail(f"{where}: [bounds] \"{env_id}\" must be [low, high], two numbers with low below high")
        bounds[env_id] = (float(pair[0]), float(pair[1]))
    missing = [env_id for env_id in env_ids if env_id not in bounds]
    if missing:
        fail(f"{where} has no [bounds] for {', '.join(missing)}: add \"{missing[0]}\" = [low, high] (the "
             "returns that normalize to 0 and 1, e.g. a random policy's and a good one's)")
    return Space(params, bounds, text)


# ---------------------------------------------------------------------------------------------------
# The script's own flags, read from its --help
# ---------------------------------------------------------------------------------------------------

# An option's line starts with its flags (`--env-id STR`, `--anneal-lr, --no-anneal-lr`,
# `-e ENV, --env-id ENV`), then two spaces or more, then its help, which may end in `(default: X)`.
OPTION = re.compile(r"(?:^|, )--([A-Za-z0-9][\w.-]*)")
DEFAULT = re.compile(r"\(default: ([^()]*)\)")


def script_options(command: list[str], resolved: list[str], script: str) -> dict[str, str | None]:
    """The long flags the script's `--help` lists (without their dashes), each with the default it
    shows, as tyro and argparse's ArgumentDefaultsHelpFormatter print it, or None. A wide COLUMNS
    keeps each option's flags and help on one line; tyro draws a box around them, taken off here."""
    shown = f"`{shlex.join([*command, '--help'])}`"
    try:
        result = subprocess.run([*resolved, "--help"], capture_output=True, text=True, timeout=300,
                                stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "400"})
    except subprocess.TimeoutExpired:
        fail(f"--command: {shown} did not answer in 300 s: the tuner reads {script}'s flags from it")
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        fail(f"--command: {shown} exited {result.returncode} ({said}): the tuner reads {script}'s "
             "flags from it, so it must run")
    options: dict[str, str | None] = {}
    flags: list[str] = []
    for line in result.stdout.splitlines():
        text = line.strip().strip("\u2502|").strip()
        column = re.split(r"\s{2,}", text, maxsplit=1)[0] if text.startswith("-") else ""
        if OPTION.findall(column):  # a new option; else a line of the current one's help
            flags = OPTION.findall(column)
            options.update({flag: None for flag in flags if flag not in options})
            text = text[len(column):]
        default = DEFAULT.search(text)
        if default and flags:
            options[flags[0]] = default.group(1).strip()
    return options


def check_flags(command: list[str], space: Space, space_path: Path, options: dict, script: str) -> None:
    """Refuse, before any trial, a flag that the script does not take: each run of every trial would
    stop on it (exit 2) and the study would end with nothing but failed trials. The flags are those
    of --command after the script (a launcher's own, torchrun's, come before it), each value a
    boolean parameter of the space can take (--flag, --no-flag), and the ones the tuner gives."""
    if not options:
        fail(f"--command: {script}'s --help lists no --flags: the tuner checks the space's flags against "
             "them, so it needs a script whose --help lists its options")
    start = next((i + 1 for i, token in enumerate(command) if token.endswith(".py")), 1)
    fix = ": fix the name, or leave the flag out"
    needed = [(token[2:].split("=")[0], "--command: ", fix)
              for token in command[start:] if token.startswith("--")]
    for param in space.params:
        if param.flag:
            choices = getattr(param.distribution, "choices", None) or [None]
            needed += [(name, f"the space file {space_path}: ", fix)
                       for name in dict.fromkeys(param.arguments(choice)[0][2:] if isinstance(choice, bool)
                                                 else param.name for choice in choices)]
    needed += [(name, "", ", and the tuner gives it to every run: tune a script that takes the flags of "
                "ppo/'s scripts") for name in sorted(RESERVED_FLAGS - {"evaluate"})]
    for name, where, hint in needed:
        if name not in options:
            fail(f"{where}--{name} is not a flag of {script} (its --help lists no --{name}){hint}")


# ---------------------------------------------------------------------------------------------------
# The study: its definition, storage, lock and heartbeats
# ---------------------------------------------------------------------------------------------------


@dataclass
class Tuning:
    """What every worker of a study does: the definition kept in the study, and how the runs go."""

    command: list[str]          # as given (the best settings are printed with it)
    env_ids: list[str]
    seeds: list[int]
    total_timesteps: int
    space: Space
    study_dir: Path
    save_minutes: float = 1.0
    poll_seconds: float = 2.0
    report_points: int = 10
    heartbeat_seconds: float = 10.0
    grace_seconds: float = 60.0
    max_retries: int = 3
    resolved: list[str] = field(default_factory=list)  # the command as executed (run.resolve)
    script_defaults: dict = field(default_factory=dict)  # the space's flags' defaults, as --help shows them

    def definition(self) -> dict:
        """What makes a study this study: a later command that differs in it is refused."""
        return {"command": self.command, "env_ids": self.env_ids, "seeds": self.seeds,
                "total_timesteps": self.total_timesteps, "space": self.space.text}

    def pairs(self) -> list[tuple[str, int]]:
        return [(env_id, seed) for env_id in self.env_ids for seed in self.seeds]

    def trial_dir(self, trial_number: int) -> Path:
        return self.study_dir / "trials" / str(trial_number)

    def heartbeat(self, trial_number: int) -> Path:
        return self.study_dir / "heartbeats" / str(trial_number)


def make_storage(storage: str | None, study_dir: Path):
    """A JournalStorage file in the study folder (default, or a path), or a database URL (sqlite:///x.db)."""
    import optuna

    if storage is None or "://" not in storage:
        path = study_dir / "journal.log" if storage is None else Path(storage)
        run.make_directory(path.parent, "the journal's folder")
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    try:
        return optuna.storages.RDBStorage(storage)
    except Exception as error:  # a wrong URL, a database that does not answer, a missing driver
        fail(f"--storage {storage}: {type(error).__name__}: {str(error).splitlines()[0]}")


def make_pruner(kind: str, startup_trials: int, warmup: float, total_timesteps: int):
    """median: a run's best value so far below the median of the earlier trials' at the same step,
    after --prune-startup-trials trials and --prune-warmup of the first run's steps; halving:
    asynchronous successive halving over the same steps; none."""
    import optuna

    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials,
                                           n_warmup_steps=int(warmup * total_timesteps))
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def open_study(args: argparse.Namespace, tuning: Tuning | None, worker_index: int = 0):
    """Create the study, or load it to continue: one whose definition differs from `tuning`'s is
    refused, as continuing it would mix trials of two questions. Without `tuning` (--report), it must
    exist."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = make_storage(args.storage, args.study_dir)
    seed = None if args.sampler_seed is None else args.sampler_seed + worker_index
    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True,
                                         n_startup_trials=args.sampler_startup_trials)
    total = tuning.total_timesteps if tuning else 1
    pruner = make_pruner(args.pruner, args.prune_startup_trials, args.prune_warmup, total)
    if tuning is None:
        where = args.storage or args.study_dir / "journal.log"
        names = optuna.get_all_study_names(storage)
        if args.study_name is None:  # the study in the folder, whatever its name (the one there)
            if len(names) != 1:
                fail(f"{where} holds {len(names)} studies ({', '.join(map(repr, names)) or 'none'}): "
                     "give the --study-name of one")
            args.study_name = names[0]
        if args.study_name not in names:
            fail(f"no study {args.study_name!r} in {where} (it holds {', '.join(map(repr, names))}): "
                 "give its --study-name and --study-dir (or --storage)")
        return optuna.load_study(study_name=args.study_name, storage=storage)
    study = optuna.create_study(study_name=args.study_name, storage=storage, sampler=sampler, pruner=pruner,
                                direction="maximize", load_if_exists=True)
    stored = study.user_attrs.get("definition")
    if stored is None:
        study.set_user_attr("definition", tuning.definition())
    else:
        differs = [key for key, value in tuning.definition().items() if stored.get(key) != value]
        if differs:
            fail(f"the study {args.study_name!r} in {args.study_dir} was made with another "
                 f"{', '.join(differs)}: run it with the same ones to continue it, "
                 "or give a new --study-name")
    return study


class Lock:
    """Optuna's own lock file (an exclusive create, which works on NFS too): workers claim trials one at
    a time. A worker killed while it holds it (a few milliseconds) delays the others by 30 s at most."""

    def __init__(self, study_dir: Path):
        from optuna.storages.journal import JournalFileOpenLock

        self.lock = JournalFileOpenLock(str(study_dir / "claims"), grace_period=30)

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def filesystem_now(tuning: Tuning) -> float:
    """The shared filesystem's clock: the heartbeats' times are its, whatever this node's clock says."""
    clock = tuning.study_dir / "heartbeats" / ".clock"
    clock.parent.mkdir(parents=True, exist_ok=True)
    clock.touch()
    return clock.stat().st_mtime


class Heartbeat(threading.Thread):
    """Touches the trial's heartbeat file every `seconds` while the worker holds the trial."""

    def __init__(self, path: Path, seconds: float):
        super().__init__(daemon=True)
        self.path, self.seconds, self.done = path, seconds, threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def run(self):
        while not self.done.wait(self.seconds):
            try:
                self.path.touch()
            except OSError:
                pass  # a filesystem hiccup: the next beat tries again


def retry(study, trial, max_retries: int) -> int | None:
    """Queue a copy of a lost or stopped trial with the same values, to be claimed as a new trial. Its
    system attributes are those Optuna's RetryHeartbeatStaleTrialCallback writes (`failed_trial`: the
    first trial of the series, `retry_history`), so that Optuna's tools read it; the copy works in the
    first trial's folder and takes over its runs. Returns the first trial's number, or None past
    `max_retries`."""
    import optuna

    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > max_retries:
        return None
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=trial.params, distributions=trial.distributions,
        system_attrs={"failed_trial": history[0], "retry_history": history}))
    return history[0]


def set_user_attr_of_trial(study, number: int, key: str, value) -> None:
    """Set a user attribute of a running trial that another process asked for. Optuna's public API
    sets one only through the Trial object that study.ask() gave the trial's own process
    (Trial.set_user_attr), and a lost worker's Trial is gone with it; so this goes through the
    storage's internal interface, as Optuna's own heartbeat code (optuna.storages.fail_stale_trials)
    does. Its one reach into Optuna's internals, checked on OPTUNA_CHECKED."""
    storage = study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    storage.set_trial_user_attr(trial_id, key, value)


def fail_stale_trials(study, tuning: Tuning) -> None:
    """Mark FAILED each running trial whose heartbeat is older than the grace period (its worker is
    lost), with the reason, and queue its retry. Run under the lock, before a trial is claimed."""
    import optuna

    now = filesystem_now(tuning)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        try:
            age = now - tuning.heartbeat(trial.number).stat().st_mtime
        except FileNotFoundError:  # claimed by another tool: judge by its start
            age = time.time() - trial.datetime_start.timestamp() if trial.datetime_start else 0
        if age <= tuning.grace_seconds:
            continue
        try:  # the reason first: a finished trial takes no attribute
            set_user_attr_of_trial(study, trial.number, "failure",
                                   f"its worker was lost: no heartbeat for {age:.0f} s")
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # it ended meanwhile: its worker was slow, not lost
        first = retry(study, trial, tuning.max_retries)
        print(f"[trial {trial.number}] FAILED: its worker was lost (no heartbeat for {age:.0f} s); "
              + (f"retried, taking over the runs of trial {first}" if first is not None else
                 f"retried {tuning.max_retries} times already: not again"), flush=True)


def counted_trials(study) -> list:
    """The trials that count towards --trials: all but those replaced by a retry."""
    trials = study.get_trials(deepcopy=False)
    replaced = {number for trial in trials for number in trial.system_attrs.get("retry_history", [])}
    return [trial for trial in trials if trial.number not in replaced]


def claim(study, n_trials: int):
    """Under the lock: a waiting trial (a retry, an enqueued one), or a new one while fewer than
    n_trials count; else None, and whether trials of other workers still run (then wait for them:
    one of them may be lost, and its retry needs a worker)."""
    import optuna

    states = optuna.trial.TrialState
    trials = counted_trials(study)
    if any(trial.state == states.WAITING for trial in trials) or len(trials) < n_trials:
        return study.ask(), False
    return None, any(trial.state == states.RUNNING for trial in trials)


# ---------------------------------------------------------------------------------------------------
# One trial: its runs, read as they go
# ---------------------------------------------------------------------------------------------------


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
        """(steps, returns) of the episodes, and the step up to which every episode is logged (the last
        `charts/SPS` point, written at the end of an iteration, after its episodes)."""
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
        return (np.array([event.step for event in episodes]), np.array([event.value for event in episodes]),
                logged)


@dataclass
class RunSpec:
    env_id: str
    seed: int
    position: int   # in the trial's order of (env, seed): its steps for the pruner start at position x budget
    workdir: Path
    command: list[str]   # as given, with the flags, env id, seed and budget: what identifies the run
    argv: list[str]      # what is executed

    @property
    def label(self) -> str:
        return f"{self.env_id} seed {self.seed}"


class Worker:
    """Claims trials of the study and runs them until the study has its trials."""

    def __init__(self, study, tuning: Tuning, n_trials: int, name: str):
        self.study, self.tuning, self.n_trials, self.name = study, tuning, n_trials, name
        self.process: subprocess.Popen | None = None
        self.stop_signal: int | None = None
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        """Ctrl-C, `kill`, Slurm's warning: the run saves and stops (SIGTERM, its own stop signal; another
        signal here sends another, which stops it at once), the trial is queued again, the worker ends."""
        if self.stop_signal is None:
            print(f"{signal.Signals(signum).name if signum != signal.SIGINT else 'Ctrl-C'}: stopping the "
                  "running trial's run (it saves); the same command continues it", flush=True)
        self.stop_signal = signum
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def loop(self) -> int:
        """Returns the exit code: 0 when the study has its trials, STOPPED when asked to stop."""
        lock = Lock(self.tuning.study_dir)
        while self.stop_signal is None:
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
        import optuna

        states = optuna.trial.TrialState
        stored = self.study.get_trials(deepcopy=False)[trial.number]  # a Trial shows no system attributes
        first = stored.system_attrs.get("failed_trial", trial.number)
        home = self.tuning.trial_dir(first)
        values = self.tuning.space.sample(trial)
        flags = self.tuning.space.arguments(values)
        trial.set_user_attr("worker", self.name)
        trial.set_user_attr("directory", str(home))
        continues = f"continues trial {first}: " if first != trial.number else ""
        print(f"[trial {trial.number}] {continues}{shlex.join(flags) or '(the defaults)'}  ({self.name})",
              flush=True)
        returns, scores, runs = {}, [], []
        try:
            for position, (env_id, seed) in enumerate(self.tuning.pairs()):
                spec = self.plan(flags, env_id, seed, position, home)
                scored = self.run_one(trial, spec)
                value = returns[spec.label] = scored["final_return"]
                runs.append(scored)
                scores.append(self.tuning.space.normalize(env_id, value))
                print(f"[trial {trial.number}] {spec.label}: final return {value:.2f} "
                      f"(normalized {scores[-1]:.3f})", flush=True)
        except Pruned as where:
            trial.set_user_attr("returns", returns)
            trial.set_user_attr("pruned", str(where))
            self.study.tell(trial, state=states.PRUNED)
            print(f"[trial {trial.number}] pruned: {where}", flush=True)
            return
        except TakeoverFailed as reason:
            trial.set_user_attr("returns", returns)
            trial.set_user_attr("failure", f"{reason} (continuing the run left by an earlier try)")
            queued = self.fail_and_retry(trial)
            print(f"[trial {trial.number}] FAILED: {reason}, continuing the run left by an earlier try: "
                  + ("retried, to start that run afresh" if queued is not None else
                     f"retried {self.tuning.max_retries} times already: not again"), flush=True)
            return
        except Failed as reason:
            trial.set_user_attr("returns", returns)
            trial.set_user_attr("failure", str(reason))
            self.study.tell(trial, state=states.FAIL)
            print(f"[trial {trial.number}] FAILED: {reason}", flush=True)
            return
        except WorkerStopped:
            name = signal.Signals(self.stop_signal).name
            trial.set_user_attr("failure", f"stopped by {name} to its worker")
            queued = self.fail_and_retry(trial)
            print(f"[trial {trial.number}] stopped ({name}): "
                  + ("queued again, to continue from its runs' checkpoints" if queued is not None else
                     "retried too often already: not queued again"), flush=True)
            return
        trial.set_user_attr("returns", returns)
        # What the settings cost: the runs go one after the other, so the trial's wall time is theirs
        # added up (None where a run's is unknown: one read back from an older tuner's done.json).
        seconds = [scored.get("wall_seconds") for scored in runs]
        sps = [scored.get("sps") for scored in runs]
        trial.set_user_attr("wall_seconds", None if None in seconds else float(sum(seconds)))
        trial.set_user_attr("sps", None if None in sps else float(np.mean(sps)))
        score = float(np.mean(scores))
        self.study.tell(trial, score)
        print(f"[trial {trial.number}] score {score:.4f} (mean of {len(scores)} normalized final returns)",
              flush=True)

    def fail_and_retry(self, trial):
        """Mark `trial` failed and queue it again (retry), under the study's lock; returns what
        retry returns: the queued trial, or None once it was retried max_retries times."""
        import optuna

        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        with Lock(self.tuning.study_dir):
            return retry(self.study, self.study.get_trials(deepcopy=False)[trial.number],
                         self.tuning.max_retries)

    def plan(self, flags: list[str], env_id: str, seed: int, position: int, home: Path) -> RunSpec:
        tail = [*flags, "--env-id", env_id, "--seed", str(seed),
                "--total-timesteps", str(self.tuning.total_timesteps)]
        saving = ["--save-model", "--save-minutes", f"{self.tuning.save_minutes:g}"]
        return RunSpec(env_id, seed, position, home / f"{run.safe_name(env_id)}__seed{seed}",
                       [*self.tuning.command, *tail], [*self.tuning.resolved, *tail, *saving])

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
        checkpoint = self.take_over(trial, spec)
        resume = ["--resume", os.path.relpath(checkpoint, spec.workdir)] if checkpoint else []
        argv = spec.argv + resume
        log_path = spec.workdir / "run.log"
        with open(log_path, "a") as log:
            log.write(f"# command: {shlex.join(argv)}\n# started: {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            log.flush()
            # One thread per run, as benchmark/run.py gives its runs, unless the user or Slurm says otherwise.
            threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("SLURM_CPUS_PER_TASK") or "1"
            env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}
            if os.environ.get("PYTHONPATH"):  # the runs start elsewhere: `PYTHONPATH=.` means the folder here
                env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(entry) if entry else entry
                                                    for entry in os.environ["PYTHONPATH"].split(os.pathsep))
            self.process = subprocess.Popen(argv, cwd=spec.workdir, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=die_with_the_worker, env=env)
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
        if code == STOPPED and pruned is not None:
            raise Pruned(f"{spec.label} at step {pruned - spec.position * self.tuning.total_timesteps:,} "
                         f"of {self.tuning.total_timesteps:,}")
        if code == STOPPED and self.stop_signal is not None:
            raise WorkerStopped()
        if code != 0:
            reason = f"{spec.label}: {why_it_failed(code, log_path)}"
            if checkpoint is not None and code != DIVERGED:
                # Not the settings' fault (they ran until the checkpoint): what the lost run left is,
                # an unreadable checkpoint say. Continuing it would fail again: the retry starts afresh.
                self.set_aside(trial, spec, checkpoint.parent,
                               f"continuing it failed (exit {code}); the trial's retry starts the run afresh")
                raise TakeoverFailed(reason)
            raise Failed(reason)
        scored = self.score_run(spec)
        if self.report_progress(trial, spec, episodes, reported, finished=True):
            pruned = max(reported) - spec.position * self.tuning.total_timesteps
            raise Pruned(f"{spec.label} at step {pruned:,} of {self.tuning.total_timesteps:,} (its end)")
        done.write_text(json.dumps({"command": spec.command, **scored}) + "\n")
        return scored

    def take_over(self, trial, spec: RunSpec) -> Path | None:
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
            self.set_aside(trial, spec, folder, why)
        return kept

    def set_aside(self, trial, spec: RunSpec, folder: Path, why: str) -> None:
        """Move a run folder from the run's runs/ to its set-aside/ (kept, for a look), and say so in
        the run's log and the worker's output."""
        target = spec.workdir / "set-aside" / folder.relative_to(spec.workdir / "runs")
        for count in range(1, 1000):
            if not target.exists():
                break
            target = target.with_name(f"{folder.name}.{count}")
        target.parent.mkdir(parents=True, exist_ok=True)
        folder.rename(target)
        said = f"moved {folder.relative_to(spec.workdir)} aside to {target.relative_to(spec.workdir)}: {why}"
        with open(spec.workdir / "run.log", "a") as log:
            log.write(f"# {said}\n")
        print(f"[trial {trial.number}] {spec.label}: {said}", flush=True)

    def report_progress(self, trial, spec: RunSpec, episodes: Episodes, reported: set[int],
                        finished: bool) -> bool:
        """Report each new point of the run's grid to Optuna: at step k x budget / points, the normalized
        mean return of the episodes that ended in the span before it (a span without one is left out).
        Returns whether the pruner says to stop."""
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
            trial.report(self.tuning.space.normalize(spec.env_id, float(values[ended].mean())), step)
            if trial.should_prune():
                return True
        return False

    def score_run(self, spec: RunSpec) -> dict:
        """The report's metric for the run (benchmark/report.py: load_run, final_return), and what it
        cost: its wall time (its sittings' spans, added up) and SPS, as the report reads them."""
        runs_dir = spec.workdir / "runs"
        found = report.find_run_dirs(runs_dir) if runs_dir.is_dir() else []
        if len(found) != 1:
            raise Failed(f"{spec.label}: {len(found)} runs in {runs_dir}, not one: remove the stray ones")
        data = report.load_run(found[0], runs_dir)
        value, count, _ = data.final_return() if data is not None else (math.nan, 0, False)
        if count == 0:
            raise Failed(f"{spec.label}: no episode ended in the run: raise --total-timesteps")
        return {"final_return": value, "wall_seconds": data.wall_seconds, "sps": data.sps}


def why_it_failed(code: int, log_path: Path) -> str:
    """A failed run's reason: the script's own line (`<script>.py: diverged: ...` for exit 3,
    `<script>.py: error: ...` for 2), or the exit code or signal with the log's last line."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if not line.startswith("# ")]
    said = next((line for line in reversed(lines) if ".py: diverged: " in line or ".py: error: " in line),
                None)
    if code == DIVERGED:
        return said or "diverged (exit 3)"
    if code == WRONG_INPUT:
        return f"wrong input (exit 2): {said or (lines[-1] if lines else '')}"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code == STOPPED:
        return "stopped by a signal from outside the tuner (exit 130)"
    return f"crashed (exit {code}): {lines[-1] if lines else 'no output'} (log {log_path})"


# ---------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------


def best_commands(study, trial) -> list[str]:
    """A trial's settings as the commands that train them, one per env id."""
    definition = study.user_attrs["definition"]
    space = load_space_text(definition["space"])
    flags = space.arguments(trial.params)
    return [shlex.join([*definition["command"], "--env-id", env_id, "--total-timesteps",
                        str(definition["total_timesteps"]), *flags]) for env_id in definition["env_ids"]]


def same_value(value, shown: str) -> bool:
    """Whether a trial's value is the default `shown` as the script's --help prints it."""
    if isinstance(value, bool) or shown in ("True", "False"):
        return str(value) == shown
    if isinstance(value, (int, float)):
        try:
            return math.isclose(float(shown), value, rel_tol=1e-9)
        except ValueError:
            return False
    return str(value) == shown


def defaults_trials(study, complete: list) -> list:
    """The complete trials of the script's defaults: each flag a trial passes (a flag its `when`
    leaves out takes the default anyway) equals the default the script's --help shows, which the
    study keeps as `script_defaults`."""
    defaults = study.user_attrs.get("script_defaults") or {}
    flags = {param.name for param in load_space_text(study.user_attrs["definition"]["space"]).params
             if param.flag}
    return [trial for trial in complete if defaults and all(
        name in defaults and same_value(value, defaults[name])
        for name, value in trial.params.items() if name in flags)]


def cost(trial) -> str:
    """A trial's wall time (its runs', added up) and mean SPS, for the report."""
    seconds, sps = trial.user_attrs.get("wall_seconds"), trial.user_attrs.get("sps")
    return (f"{report.format_duration(seconds) if seconds is not None else 'unknown wall time'}, "
            f"{f'{sps:,.0f}' if sps is not None else '?'} SPS")


# A trial of the same cost as the defaults' may time a little slower (other work on the machine, the
# disk): the report's budget from the defaults' wall time allows this much more.
TIMING_NOISE = 0.10


def within_budget(study, complete: list, max_seconds: float | None) -> tuple[list[str], dict]:
    """The report's section on the best settings within a time budget, for a researcher whose compute
    is fixed: the best overall may buy its score with many times the defaults' wall time. The budget
    is --max-seconds, else the wall time of the script's defaults (their trials' mean) plus
    TIMING_NOISE. Returns its lines, and what the plot of score against wall time marks."""
    defaults = defaults_trials(study, complete)
    timed = [trial.user_attrs["wall_seconds"] for trial in defaults
             if trial.user_attrs.get("wall_seconds") is not None]
    said = [f"The script's defaults, trial {trial.number}: score {trial.value:.4f}, {cost(trial)}."
            for trial in defaults]
    if max_seconds is not None:
        budget = max_seconds
        heading, limit = f"{report.format_duration(budget)} (--max-seconds)", report.format_duration(budget)
    elif timed:
        budget = float(np.mean(timed)) * (1 + TIMING_NOISE)
        heading = "the defaults' wall time"
        limit = (f"the defaults' wall time plus {TIMING_NOISE:.0%}, the noise of timing one trial: "
                 f"{report.format_duration(budget)}")
    else:
        why = ("the study keeps no defaults of the script (run the tuner's command once more to store "
               "them)" if not study.user_attrs.get("script_defaults") else
               "no trial of the script's defaults has completed (enqueue one: --enqueue with the "
               "defaults its --help shows)")
        return ["## Best within the defaults' wall time", "",
                f"Not known: {why}; or give --max-seconds.", ""], {"defaults": defaults}
    within = [trial for trial in complete if trial.user_attrs.get("wall_seconds") is not None
              and trial.user_attrs["wall_seconds"] <= budget]
    marks = {"defaults": defaults, "budget": budget, "best_within": within[0] if within else None,
             "budget_label": "--max-seconds" if max_seconds is not None else
             f"the defaults' wall time + {TIMING_NOISE:.0%}"}
    lines = [f"## Best within {heading}", "", *said]
    if not within:
        return [*lines, f"No complete trial took at most {limit}.", ""], marks
    best = within[0]
    lines.append(f"{len(within)} complete trial(s) took at most {limit}. The best of them is trial "
                 f"{best.number}: score {best.value:.4f}, {cost(best)}"
                 + (", the defaults themselves." if best in defaults else
                    ", the best overall too." if best.number == complete[0].number else "."))
    return [*lines, "", "```bash", *best_commands(study, best), "```", ""], marks


def load_space_text(text: str) -> Space:
    """A space as stored in the study (its definition keeps the file's text)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as file:
        file.write(text)
    try:
        return load_space(Path(file.name), [])
    finally:
        os.unlink(file.name)


def write_report(study, out_dir: Path, top: int = 10, max_seconds: float | None = None) -> str:
    """<out_dir>/index.md and its plots; returns the markdown, which is printed too."""
    import optuna

    states = optuna.trial.TrialState
    definition = study.user_attrs["definition"]
    trials = study.get_trials(deepcopy=False)
    replaced = {number for trial in trials for number in trial.system_attrs.get("retry_history", [])}
    counted = [trial for trial in trials if trial.number not in replaced]
    count = {state: sum(trial.state == state for trial in counted) for state in states}
    complete = sorted((trial for trial in trials if trial.state == states.COMPLETE),
                      key=lambda trial: trial.value, reverse=True)
    starts = [trial.datetime_start for trial in trials if trial.datetime_start]
    ends = [trial.datetime_complete for trial in trials if trial.datetime_complete]
    wall = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    names = list(dict.fromkeys(name for trial in trials for name in trial.params))
    seeds = ", ".join(map(str, definition["seeds"]))
    about = (f"`{shlex.join(definition['command'])}` on {', '.join(definition['env_ids'])}, "
             f"{definition['total_timesteps']:,} steps per run, seeds {seeds} in every trial. Score: the "
             "mean over the (env, seed) runs of the final return (the mean return of the episodes in the "
             "last 10% of a run's steps), min-max normalized per env by the space's bounds.")
    unfinished = count[states.RUNNING] + count[states.WAITING]
    tally = (f"{len(counted)} trials: {count[states.COMPLETE]} complete, {count[states.PRUNED]} pruned, "
             f"{count[states.FAIL]} failed, {unfinished} running or waiting; {len(replaced)} lost or stopped "
             "and retried. Wall time, first trial's start to last trial's end: "
             f"{report.format_duration(wall)}.")
    lines = [f"# Tuning study `{study.study_name}`", "", about, "", tally, ""]
    marks: dict = {}
    if complete:
        best = complete[0]
        returns = ", ".join(f"{label} {value:.2f}"
                            for label, value in best.user_attrs.get("returns", {}).items())
        lines += ["## Best settings", "",
                  f"Trial {best.number}, score {best.value:.4f}, {cost(best)}; final returns: {returns}.",
                  "", "```bash", *best_commands(study, best), "```", ""]
        budget_lines, marks = within_budget(study, complete, max_seconds)
        lines += budget_lines
        lines += ["## Top trials", "", "Wall time: the trial's runs', added up (they run one after the "
                  "other); SPS: their mean.", "",
                  "| trial | score | wall time | SPS | " + " | ".join(names) + " | state |",
                  "| --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " | --- |"]
        for trial in complete[:top]:
            cells = " | ".join(format_value(trial.params.get(name)) for name in names)
            seconds, sps = trial.user_attrs.get("wall_seconds"), trial.user_attrs.get("sps")
            state = "complete, the defaults" if trial in marks.get("defaults", []) else "complete"
            lines.append(f"| {trial.number} | {trial.value:.4f} "
                         f"| {report.format_duration(seconds) if seconds is not None else '-'} "
                         f"| {f'{sps:,.0f}' if sps is not None else '-'} | {cells} | {state} |")
        lines.append("")
    else:
        lines += ["No trial has completed yet.", ""]
    others = [trial for trial in trials if trial.state in (states.FAIL, states.PRUNED)]
    if others:
        lines += ["## Failed and pruned trials", ""]
        for trial in others:
            key = "failure" if trial.state == states.FAIL else "pruned"
            why = trial.user_attrs.get(key, "no reason stored")
            again = " (retried)" if trial.number in replaced else ""
            lines.append(f"- trial {trial.number}: {trial.state.name.lower()}{again}: {why}")
        lines.append("")
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [plot_history(study, out_dir), plot_cost(study, out_dir, complete, marks),
             plot_importances(study, out_dir)]
    lines += ["## Plots", "", *[f"![{alt}]({name})" if name else alt for alt, name in plots], ""]
    text = "\n".join(lines)
    (out_dir / "index.md").write_text(text)
    return text


def format_value(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(6, 4), dpi=100)
    return plt, fig, axes


def save_figure(plt, fig, axes, path: Path, title: str, legend: bool = True) -> None:
    """Title, grid (and legend), then the figure to `path`, closed."""
    axes.set_title(title, fontsize="medium")
    axes.grid(alpha=0.3, **({} if legend else {"axis": "x"}))
    if legend:
        axes.legend(fontsize="small", loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_history(study, out_dir: Path) -> tuple[str, str | None]:
    """Each complete trial's score against its number, the best so far as a line; pruned trials at
    their last reported value, in gray."""
    import optuna

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    complete = [trial for trial in trials if trial.state == states.COMPLETE]
    if not complete:
        return "No optimization history yet: no trial has completed.", None
    plt, fig, axes = figure()
    numbers = np.array([trial.number for trial in complete])
    values = np.array([trial.value for trial in complete])
    axes.scatter(numbers, values, color="tab:blue", s=18, label="complete trial")
    axes.step(numbers, np.maximum.accumulate(values), where="post", color="tab:blue", alpha=0.6,
              label="best so far")
    pruned = [(trial.number, trial.intermediate_values[trial.last_step]) for trial in trials
              if trial.state == states.PRUNED and trial.last_step is not None]
    if pruned:
        axes.scatter(*zip(*pruned), color="gray", marker="x", s=18, label="pruned (last reported value)")
    axes.set_xlabel("trial")
    axes.set_ylabel("score (normalized final return)")
    save_figure(plt, fig, axes, out_dir / "history.png", f"optimization history: {study.study_name}")
    return "optimization history", "history.png"


def plot_cost(study, out_dir: Path, complete: list, marks: dict) -> tuple[str, str | None]:
    """Each complete trial's score against its wall time, the trade-off the best overall may hide:
    the defaults, the time budget, the best within it and the best overall marked."""
    timed = [trial for trial in complete if trial.user_attrs.get("wall_seconds") is not None]
    if not timed:
        return "No plot of score against wall time: no complete trial has a wall time.", None
    plt, fig, axes = figure()

    def point(trial):
        return trial.user_attrs["wall_seconds"], trial.value

    axes.scatter(*zip(*map(point, timed)), color="tab:blue", s=18, label="complete trial")
    defaults = [trial for trial in marks.get("defaults", []) if trial in timed]
    if defaults:
        axes.scatter(*zip(*map(point, defaults)), facecolors="none", edgecolors="black", marker="s", s=70,
                     label="the defaults")
    if marks.get("budget") is not None:
        axes.axvline(marks["budget"], color="gray", linestyle="--", label=marks["budget_label"])
    best_within = marks.get("best_within")
    if best_within is not None and best_within in timed:
        axes.scatter(*point(best_within), facecolors="none", edgecolors="tab:green", s=160, linewidths=2,
                     label=f"best within the budget (trial {best_within.number})")
    if complete[0] in timed:
        axes.scatter(*point(complete[0]), color="tab:red", marker="*", s=140,
                     label=f"best overall (trial {complete[0].number})")
    axes.set_xlim(left=0)
    axes.set_xlabel("wall time of the trial's runs, added up (s)")
    axes.set_ylabel("score (normalized final return)")
    save_figure(plt, fig, axes, out_dir / "cost.png", f"score against wall time: {study.study_name}")
    return "score against wall time", "cost.png"


def plot_importances(study, out_dir: Path) -> tuple[str, str | None]:
    """optuna.importance.get_param_importances over the complete trials, as horizontal bars."""
    import optuna

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError) as error:
        return f"No parameter importances: {error}", None
    if not importances:
        return "No parameter importances: no parameter varies over the complete trials.", None
    plt, fig, axes = figure()
    names = list(importances)[::-1]
    axes.barh(names, [importances[name] for name in names], color="tab:blue")
    axes.set_xlabel("importance (optuna.importance, normalized to sum to 1)")
    save_figure(plt, fig, axes, out_dir / "importances.png", f"parameter importances: {study.study_name}",
                legend=False)
    return "parameter importances", "importances.png"


# ---------------------------------------------------------------------------------------------------
# Workers here, or as a Slurm job array
# ---------------------------------------------------------------------------------------------------


def worker_args(args: argparse.Namespace) -> list[str]:
    """The options that make a worker of this study (what each local worker and Slurm task is given)."""
    options = ["--command", args.command, "--env-ids", *args.env_ids, "--space", str(args.space.resolve()),
               "--total-timesteps", str(args.total_timesteps), "--seeds", str(args.seeds),
               "--trials", str(args.trials), "--study-name", args.study_name,
               "--study-dir", str(args.study_dir.resolve()), "--pruner", args.pruner,
               "--prune-startup-trials", str(args.prune_startup_trials),
               "--prune-warmup", f"{args.prune_warmup:g}",
               "--sampler-startup-trials", str(args.sampler_startup_trials),
               "--report-points", str(args.report_points), "--poll-seconds", f"{args.poll_seconds:g}",
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
    """--workers N > 1: N worker processes on this machine, each the loop of a Slurm task; they end with
    this process (SIGTERM), and a `kill` of it asks them to stop."""
    command = [sys.executable, str(TUNER), *worker_args(args), "--worker"]
    workers = [subprocess.Popen([*command, "--worker-index", str(index)], preexec_fn=die_with_the_worker)
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
    """--slurm: a job array of --workers tasks, each a worker of the study, and a report job after it,
    written from benchmark/slurm_template.sh and submitted with sbatch (run.py's helpers)."""
    template = run.read_template(args.slurm_template or run.SLURM_TEMPLATE)
    program = None if args.dry_run else run.find_sbatch()
    slurm_dir = args.study_dir / "slurm"
    run.make_directory(slurm_dir, "--study-dir")
    here = f"cd {shlex.quote(os.getcwd())}\n"
    tuner = [sys.executable, str(TUNER), *worker_args(args)]
    array_script, report_script = slurm_dir / "workers.sbatch", slurm_dir / "report.sbatch"
    array_script.write_text(run.fill(template, {
        "job_name": f"ppo-tune-{args.study_name}",
        "output": run.output_pattern(slurm_dir, "worker_%A_%a.out"),
        "array_line": f"#SBATCH --array=0-{args.workers - 1}",
        "resource_lines": run.resource_lines(args, report_job=False),
        "command": here + f'exec {shlex.join([*tuner, "--worker"])} --worker-index "$SLURM_ARRAY_TASK_ID"'}))
    report_script.write_text(run.fill(template, {
        "job_name": f"ppo-tune-report-{args.study_name}",
        "output": run.output_pattern(slurm_dir, "report_%j.out"), "array_line": "",
        "resource_lines": run.resource_lines(args, report_job=True),
        "command": here + f"exec {shlex.join([*tuner, '--report'])}"}))
    print(f"slurm: wrote {array_script} ({args.workers} workers) and {report_script}", flush=True)
    if args.dry_run:
        print(f"dry run: nothing submitted. By hand: sbatch {array_script}, then "
              f"sbatch --dependency=afterany:<its job id> {report_script}")
        return 0
    array_job = run.sbatch(program, [], array_script)
    report_job = run.sbatch(program, [f"--dependency=afterany:{array_job}"], report_script)
    print(f"slurm: submitted workers {array_job} and the report job {report_job}\n"
          f"  follow:  squeue -j {array_job},{report_job}\n"
          f"  workers' output: {slurm_dir.resolve()}/worker_{array_job}_<task>.out\n"
          f"  the report, when they are done: {args.study_dir / 'report'}/index.md", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", help='the script, or the command with fixed flags: "python ppo/ppo.py '
                        '--num-envs 8"; each run adds the sampled flags, --env-id, --seed, --total-timesteps')
    parser.add_argument("--env-ids", nargs="+", metavar="ID", help="environments every trial runs on")
    parser.add_argument("--space", type=Path, help="the search space, a TOML file (benchmark/spaces/)")
    parser.add_argument("--total-timesteps", type=int, help="steps of each run")
    parser.add_argument("--seeds", type=int, default=2,
                        help="seeds per env in every trial: 1 to K (default 2)")
    parser.add_argument("--trials", type=int, default=20,
                        help="trials of the study in all, over every worker and invocation (default 20)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes here, or Slurm tasks (default 1)")
    parser.add_argument("--study-name", help="default: <variant>-<env ids>-<steps>; with --report, the "
                        "study the storage holds")
    parser.add_argument("--study-dir", type=Path,
                        help="where trials, heartbeats, the journal and the report go; every worker must "
                        "see it (default tuning/<study name>)")
    parser.add_argument("--storage", help="a database URL (sqlite:///tune.db, postgresql://...) or a journal "
                        "file path (default: <study-dir>/journal.log)")
    parser.add_argument("--enqueue", action="append", default=[], metavar="FLAGS",
                        help='a trial to run with these values first, e.g. "--learning-rate 2.5e-4" '
                        "(repeatable; flags of the space, the others sampled)")
    parser.add_argument("--pruner", choices=("median", "halving", "none"), default="median",
                        help="median (default), asynchronous successive halving, or none")
    parser.add_argument("--prune-startup-trials", type=int, default=5,
                        help="median: no pruning until this many trials have finished (default 5)")
    parser.add_argument("--prune-warmup", type=float, default=0.2,
                        help="median: no pruning in this fraction of the first run's steps (default 0.2)")
    parser.add_argument("--sampler-startup-trials", type=int, default=8,
                        help="TPE samples at random until this many trials have finished (default 8)")
    parser.add_argument("--sampler-seed", type=int, help="TPE's seed (worker i uses seed + i)")
    parser.add_argument("--report-points", type=int, default=10, help="points per run reported to the pruner")
    parser.add_argument("--poll-seconds", type=float, default=2.0, help="how often a run's log is read")
    parser.add_argument("--save-minutes", type=float, default=1.0,
                        help="runs keep a checkpoint at most this old, for a retried trial to continue from")
    parser.add_argument("--heartbeat-seconds", type=float, default=10.0,
                        help="how often a worker says it lives (default 10)")
    parser.add_argument("--grace-seconds", type=float, default=60.0,
                        help="a trial without a heartbeat this long is failed and retried; it must cover an "
                        "iteration of a run, which a lost worker's run finishes before it stops (default 60)")
    parser.add_argument("--max-retries", type=int, default=3, help="times a lost trial is retried")
    parser.add_argument("--report", action="store_true",
                        help="write and print the report of the study as it is")
    parser.add_argument("--max-seconds", type=float,
                        help="the report's time budget for a trial (its runs' wall time, added up): it names "
                        "the best settings within it (default: the wall time of the script's defaults)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    slurm = parser.add_argument_group("Slurm", "submit the workers as a job array, not run them here")
    slurm.add_argument("--slurm", action="store_true",
                       help="a job array of --workers workers, and a report job after it")
    slurm.add_argument("--partition")
    slurm.add_argument("--gpus", type=int, help="GPUs per worker (#SBATCH --gres=gpu:N)")
    slurm.add_argument("--cpus-per-task", type=int, help="CPUs per worker (default 1)")
    slurm.add_argument("--time", help="time limit per worker, e.g. 12:00:00")
    slurm.add_argument("--slurm-template", type=Path)
    slurm.add_argument("--warning-seconds", type=int, default=120,
                       help="Slurm warns each worker this early (SIGUSR1): its run saves, its trial is "
                       "queued again (default 120)")
    slurm.add_argument("--dry-run", action="store_true", help="write the job scripts, submit nothing")
    args = parser.parse_args(argv)
    args.requeue = False  # run.resource_lines reads it: workers are not requeued, their trials are
    if args.max_seconds is not None and not 0 < args.max_seconds < float("inf"):
        parser.error(f"--max-seconds must be above 0, got {args.max_seconds}")
    if args.report:
        if args.study_dir is None:
            parser.error("--report needs --study-dir (and --study-name where it holds several studies)")
        return args
    missing = [flag for flag, value in [("--command", args.command), ("--env-ids", args.env_ids),
                                        ("--space", args.space), ("--total-timesteps", args.total_timesteps)]
               if value is None]
    if missing:
        parser.error(f"{', '.join(missing)} required (or --report on a study)")
    for flag, value, least in [("--seeds", args.seeds, 1), ("--trials", args.trials, 1),
                               ("--workers", args.workers, 1), ("--total-timesteps", args.total_timesteps, 1),
                               ("--report-points", args.report_points, 1),
                               ("--prune-startup-trials", args.prune_startup_trials, 0),
                               ("--sampler-startup-trials", args.sampler_startup_trials, 0),
                               ("--max-retries", args.max_retries, 0)]:
        if value < least:
            parser.error(f"{flag} must be at least {least}, got {value}")
    for flag, value in [("--poll-seconds", args.poll_seconds), ("--save-minutes", args.save_minutes),
                        ("--heartbeat-seconds", args.heartbeat_seconds),
                        ("--grace-seconds", args.grace_seconds)]:
        if not 0 < value < float("inf"):
            parser.error(f"{flag} must be above 0, got {value}")
    if not 0 <= args.prune_warmup < 1:
        parser.error(f"--prune-warmup is a fraction of a run's steps, 0 to below 1, got {args.prune_warmup}")
    if args.grace_seconds <= 2 * args.heartbeat_seconds:
        parser.error("--grace-seconds must be more than twice --heartbeat-seconds, "
                     "or a live worker may look lost")
    return args


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
    run.check_program(command[0], run.resolve(command)[0])
    script = next((token for token in command[1:] if token.endswith(".py")), None)
    if script is not None and not os.path.isfile(script):
        fail(f"--command: the script {script} does not exist (paths are read from {os.getcwd()})")
    given = {token[2:].split("=")[0] for token in command if token.startswith("--")}
    if given & RESERVED_FLAGS:
        fail(f"--command sets {', '.join('--' + flag for flag in sorted(given & RESERVED_FLAGS))}, which the "
             "tuner gives each run itself: leave it out (--env-ids, --seeds, --total-timesteps say them)")
    space = load_space(args.space, args.env_ids)
    both = sorted(given & {param.name for param in space.params})
    if both:
        fail(f"--{both[0]} is both in --command and in the space: fix it in one place")
    variant = run.variant_name(command)
    envs = "+".join(map(run.safe_name, args.env_ids))
    args.study_name = args.study_name or f"{variant}-{envs}-{args.total_timesteps}"
    args.study_dir = args.study_dir or Path("tuning") / args.study_name
    return Tuning(command, args.env_ids, list(range(1, args.seeds + 1)), args.total_timesteps, space,
                  args.study_dir.resolve(), args.save_minutes, args.poll_seconds, args.report_points,
                  args.heartbeat_seconds, args.grace_seconds, args.max_retries, run.resolve(command))


def check_script(args: argparse.Namespace, tuning: Tuning) -> None:
    """The flags of the space and of --command against the script's --help, which also gives the
    defaults the report compares trials with (kept in `tuning`). Last of the checks: it runs the
    script, which takes seconds."""
    label = next((token for token in tuning.command[1:] if token.endswith(".py")), tuning.command[0])
    options = script_options(tuning.command, tuning.resolved, label)
    check_flags(tuning.command, tuning.space, args.space, options, label)
    tuning.script_defaults = {param.name: options[param.name] for param in tuning.space.params
                              if param.flag and options.get(param.name) is not None}


def in_space(distribution, value) -> bool:
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return value in choices
    kinds = int if isinstance(distribution.low, int) else (int, float)  # an IntDistribution's bounds are ints
    return (isinstance(value, kinds) and not isinstance(value, bool)
            and distribution.low <= value <= distribution.high)


def parse_value(text: str):
    """A value as the scripts' command line reads it: an int, else a float, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def enqueued_values(space: Space, flags: str) -> dict:
    """--enqueue: the values of a trial to run first, read from flags as the scripts take them."""
    tokens, values = shlex.split(flags), {}
    params = {param.name: param for param in space.params}
    while tokens:
        token = tokens.pop(0)
        name = token[2:]
        negated = name.startswith("no-") and params.get(name[3:]) is not None
        param = params.get(name[3:] if negated else name)
        if not token.startswith("--") or param is None:
            fail(f"--enqueue {flags!r}: {token} is not a flag of the space ({', '.join(params)})")
        if negated or not tokens or tokens[0].startswith("--"):  # --flag / --no-flag: a boolean
            value = not negated
        else:
            value = parse_value(tokens.pop(0))
        if not in_space(param.distribution, value):
            fail(f"--enqueue {flags!r}: {token} {value} is not in the space")
        values[param.name] = value
    return values


def main(argv: list[str] | None = None) -> int:
    try:
        return tune(parse_args(argv))
    except run.WrongInput as error:
        return run.refuse("tune.py", error)


def tune(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
        import optuna  # noqa: F401
    except ImportError as error:
        fail(f"{error.name} is not installed, and the tuner needs it: pip install -e \".[benchmark]\"")
    if args.report:
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
    tuning = plan(args)
    enqueued = [enqueued_values(tuning.space, flags) for flags in args.enqueue]
    if not args.worker:  # a worker's invocation has checked them
        check_script(args, tuning)
    run.make_directory(tuning.study_dir, "--study-dir")
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
    print(f"study {args.study_name!r} in {tuning.study_dir}: {args.trials} trials of {len(tuning.pairs())} "
          f"run(s) each, {args.workers} worker(s)", flush=True)
    if args.workers == 1:
        code = Worker(study, tuning, args.trials, f"{socket.gethostname()}:{os.getpid()}").loop()
    else:
        code = run_local_workers(args)
    print(write_report(study, tuning.study_dir / "report", max_seconds=args.max_seconds), flush=True)
    print(f"this invocation: {report.format_duration(time.time() - started)}; report: "
          f"{tuning.study_dir / 'report' / 'index.md'}", flush=True)
    if code == 0:
        fail_if_every_trial_failed(study)
    return code


def fail_if_every_trial_failed(study) -> None:
    """A study that has its trials, each of them failed (a fixed flag of --command every run refuses,
    say), found nothing: it ends with one line naming the first failure, and exit code 2, as wrong
    input, not 0."""
    import optuna

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    failed = [trial for trial in trials if trial.state == states.FAIL]
    if failed and all(trial.state == states.FAIL for trial in trials):
        first = failed[0]
        fail(f"all {len(trials)} trials failed, none scored; the first, trial {first.number}: "
             f"{first.user_attrs.get('failure', 'no reason kept')}")


if __name__ == "__main__":
    sys.exit(main())
