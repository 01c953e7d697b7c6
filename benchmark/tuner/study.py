"""The tuner's study: its definition and storage, the lock under which workers claim trials, the
heartbeats that tell a lost worker's trial, and the retry that takes it over.

--trials N is a total for the study: workers claim trials under a lock in the study folder, so
that together they make exactly N. A worker touches its trial's heartbeat file; one that stops
(the worker lost) gets its trial failed by another after --grace-seconds, and a retry queued
with the same values (the system attributes of Optuna's RetryHeartbeatStaleTrialCallback). Part
of benchmark/tune.py.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmark.common import fail, make_directory
from benchmark.tuner.space import Space

# The Optuna release on which `set_user_attr_of_trial`, the one reach into Optuna's internals, was
# checked; tests/test_tune.py fails on another, to have it checked again.
OPTUNA_CHECKED = "5.0.0"


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
    resolved: list[str] = field(default_factory=list)  # the command as executed (run_plan.resolve)
    # the space's flags' defaults, as --help shows them
    script_defaults: dict = field(default_factory=dict)

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
    """A JournalStorage file in the study folder (default, or a path), or a database URL
    (sqlite:///x.db)."""
    import optuna

    if storage is None or "://" not in storage:
        path = study_dir / "journal.log" if storage is None else Path(storage)
        make_directory(path.parent, "the journal's folder")
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
    refused, as continuing it would mix trials of two questions. Without `tuning` (--report), it
    must exist."""
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
                fail(f"{where} holds {len(names)} studies "
                     f"({', '.join(map(repr, names)) or 'none'}): give the --study-name of one")
            args.study_name = names[0]
        if args.study_name not in names:
            fail(f"no study {args.study_name!r} in {where} "
                 f"(it holds {', '.join(map(repr, names))}): "
                 "give its --study-name and --study-dir (or --storage)")
        return optuna.load_study(study_name=args.study_name, storage=storage)
    study = optuna.create_study(study_name=args.study_name, storage=storage, sampler=sampler,
                                pruner=pruner, direction="maximize", load_if_exists=True)
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
    """Optuna's own lock file (an exclusive create, which works on NFS too): workers claim trials
    one at a time. A worker killed while it holds it (a few milliseconds) delays the others by 30 s
    at most."""

    def __init__(self, study_dir: Path):
        from optuna.storages.journal import JournalFileOpenLock

        self.lock = JournalFileOpenLock(str(study_dir / "claims"), grace_period=30)

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def filesystem_now(tuning: Tuning) -> float:
    """The shared filesystem's clock: heartbeats' times are its, whatever this node's clock says."""
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
    """Queue a copy of a lost or stopped trial with the same values, to be claimed as a new trial.
    Its system attributes are those Optuna's RetryHeartbeatStaleTrialCallback writes
    (`failed_trial`: the first trial of the series, `retry_history`), so that Optuna's tools read
    it; the copy works in the first trial's folder and takes over its runs. Returns the first
    trial's number, or None past `max_retries`."""
    import optuna

    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > max_retries:
        return None
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=trial.params,
        distributions=trial.distributions,
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
    replaced = {number for trial in trials
                for number in trial.system_attrs.get("retry_history", [])}
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


def fail_if_every_trial_failed(study) -> None:
    """A study that has its trials, each of them failed (a fixed flag of --command every run
    refuses, say), found nothing: it ends with one line naming the first failure, and exit code 2,
    as wrong input, not 0."""
    import optuna

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    failed = [trial for trial in trials if trial.state == states.FAIL]
    if failed and all(trial.state == states.FAIL for trial in trials):
        first = failed[0]
        fail(f"all {len(trials)} trials failed, none scored; the first, trial {first.number}: "
             f"{first.user_attrs.get('failure', 'no reason kept')}")
