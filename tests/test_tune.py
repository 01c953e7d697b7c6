"""The tuner (benchmark/tune.py) with real Optuna, a real journal file and tiny CartPole runs: the
number of trials, the report's wall times and best settings within the defaults' time, pruning
during a run, a worker lost mid-trial (alone; with its run, before its first checkpoint, after one,
after one left unreadable), a diverging trial and one whose sizes do not divide, wrong input (a flag
the script lacks among it), the one reach into Optuna's internals, and a study of a two-task Slurm
job array on the one-node cluster (skipped where Slurm is not installed)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmark.report import format_duration
from conftest import (HUNG_AFTER, REPO, SLOW_PPO, expect_error_line, run_tool,
                      table_rows, wait_for_jobs)

optuna = pytest.importorskip("optuna")



def learning_rate_space(low: float = 1e-4, high: float = 1e-2) -> str:
    """A space of the learning rate alone (the other flags keep ppo.py's defaults)."""
    return f'[params.learning-rate]\ntype = "float"\nlow = {low}\nhigh = {high}\nlog = true\n\n' \
           '[bounds]\n"CartPole-v1" = [0, 500]\n'


LEARNING_RATE_SPACE = learning_rate_space()
TINY = ["--env-ids", "CartPole-v1", "--total-timesteps", "2048", "--seeds", "1",
        "--poll-seconds", "0.5"]


def tune(tmp_path: Path, *options: str, space: str = LEARNING_RATE_SPACE,
         command: str = "python ppo/ppo.py", timeout: float = HUNG_AFTER,
         env: dict | None = None) -> subprocess.CompletedProcess:
    """benchmark/tune.py on `space` in tmp_path (study folder tmp_path/study), with `options`."""
    (tmp_path / "space.toml").write_text(space)
    space = tmp_path / "space.toml"
    command = command.replace("ppo/ppo.py", str(REPO / "ppo" / "ppo.py"))
    return run_tool("tune.py", "--command", command, "--space", str(space), "--study-dir",
                    str(tmp_path / "study"), "--study-name", "test", *options, cwd=tmp_path,
                    timeout=timeout, env=env)


def load_study(study_dir: Path, name: str = "test"):
    """The study as the tuner left it in its journal file."""
    journal = optuna.storages.journal.JournalFileBackend(str(study_dir / "journal.log"))
    storage = optuna.storages.JournalStorage(journal)
    return optuna.load_study(study_name=name, storage=storage)


def run_logs(study_dir: Path, trial: int) -> list[Path]:
    return sorted((study_dir / "trials" / str(trial)).glob("*/run.log"))


def assert_costs_reported(study_dir: Path, study, report_module) -> None:
    """Each complete trial's wall time and SPS in the top trials' table, the trial of the script's
    defaults (trial 0, enqueued with them) found, and the best settings within its wall time (or
    within --max-seconds) named beside the best overall, as the data say, whatever the times
    were."""
    trials = {trial.number: trial for trial in study.get_trials()}
    for trial in trials.values():
        assert (trial.user_attrs["wall_seconds"] > 0
                and trial.user_attrs["sps"] > 0), trial.user_attrs
    report = (study_dir / "report" / "index.md").read_text()
    rows = {int(row["trial"]): row for row in table_rows(report, "trial")}
    assert set(rows) == set(trials)
    for number, row in rows.items():
        assert row["SPS"] == f"{trials[number].user_attrs['sps']:,.0f}"
        assert row["wall time"] != "-"
    assert rows[0]["state"] == "complete, the defaults"
    assert [row["state"] for number, row in rows.items() if number != 0] == ["complete"] * 2
    budget = trials[0].user_attrs["wall_seconds"] * (1 + report_module.TIMING_NOISE)
    within = max((trial for trial in trials.values() if trial.user_attrs["wall_seconds"] <= budget),
                 key=lambda trial: trial.value)
    section = report.split("## Best within the defaults' wall time")[1].split("## ")[0]
    assert (f"The best of them is trial {within.number}: score {within.value:.4f}"
            in section), section
    assert "--learning-rate " in section  # the command that trains them
    assert (study_dir / "report" / "cost.png").is_file()

    # A budget of the user's: all trials are within a day, none within a millisecond.
    best = study.best_trial
    for seconds, expected in [("86400",
                               f"The best of them is trial {best.number}: score {best.value:.4f}"),
                              ("0.001", "No complete trial took at most 0.0 s.")]:
        again = run_tool("tune.py", "--report", "--study-dir", str(study_dir),
                         "--study-name", "test", "--max-seconds", seconds, cwd=study_dir)
        assert again.returncode == 0, again.stderr
        section = again.stdout.split("## Best within ")[1].split("## ")[0]
        assert section.startswith(f"{format_duration(float(seconds))} (--max-seconds)"), section
        assert expected in section, section


def test_two_workers_make_exactly_the_trials_asked_for_and_the_same_command_continues(
        tmp_path, report_module):
    """Three trials for two workers: the last is claimed while the other worker's trial runs, which
    a worker that counted only finished trials (as Optuna's MaxTrialsCallback does) would not see.
    The first is ppo.py's default learning rate: the report finds it, and the best within its wall
    time."""
    result = tune(tmp_path, *TINY, "--trials", "3", "--workers", "2", "--enqueue",
                  "--learning-rate 0.00025")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(tmp_path / "study")
    trials = study.get_trials()
    assert [trial.number for trial in trials] == [0, 1, 2]
    assert all(trial.state == optuna.trial.TrialState.COMPLETE for trial in trials), trials
    assert len({trial.user_attrs["worker"] for trial in trials}) == 2  # both workers took trials
    for trial in trials:
        # each trial ran once: one run folder holding one run, one start in its log
        logs = run_logs(tmp_path / "study", trial.number)
        assert [log.parent.name for log in logs] == ["CartPole-v1__seed1"]
        assert logs[0].read_text().count("# command: ") == 1
        assert len(list((logs[0].parent / "runs").iterdir())) == 1
    report = (tmp_path / "study" / "report" / "index.md").read_text()
    assert "3 trials: 3 complete" in report
    assert (tmp_path / "study" / "report" / "history.png").is_file()
    best = study.best_trial
    # the command that trains it
    assert f"--learning-rate {best.params['learning-rate']}" in result.stdout
    assert_costs_reported(tmp_path / "study", study, report_module)

    again = tune(tmp_path, *TINY, "--trials", "3", "--workers", "2")
    assert again.returncode == 0, again.stderr
    # nothing left to run: the study is continued, not started over
    assert "[trial" not in again.stdout
    assert len(load_study(tmp_path / "study").get_trials()) == 3


def test_a_bad_region_is_pruned_during_its_run(tmp_path):
    """A learning rate of 1e-9 learns nothing; after a good trial, the median pruner stops its run
    long before its budget, by the run's own stop signal (it saves and exits 130)."""
    budget = 32768
    result = tune(tmp_path, "--env-ids", "CartPole-v1", "--total-timesteps", str(budget),
                  "--seeds", "1", "--poll-seconds", "0.5", "--trials", "2", "--pruner", "median",
                  "--prune-startup-trials", "1", "--prune-warmup", "0", "--report-points", "8",
                  "--enqueue", "--learning-rate 0.0025", "--enqueue", "--learning-rate 1e-9",
                  space=learning_rate_space(low=1e-9))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    good, bad = load_study(tmp_path / "study").get_trials()
    assert good.state == optuna.trial.TrialState.COMPLETE and good.params["learning-rate"] == 0.0025
    assert bad.state == optuna.trial.TrialState.PRUNED, bad
    assert bad.user_attrs["pruned"].startswith("CartPole-v1 seed 1 at step ")
    log = run_logs(tmp_path / "study", bad.number)[0]
    assert log.read_text().rstrip().endswith("# exit code 130")
    import torch

    checkpoint = next(log.parent.glob("runs/*/checkpoint.pt"))
    assert torch.load(checkpoint, weights_only=False)["global_step"] < budget / 2
    assert "pruned" in (tmp_path / "study" / "report" / "index.md").read_text()


def child_processes(pid: int) -> list[int]:
    """The processes that `pid` started and that still run (Linux's /proc)."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def lose_with_its_run(worker: subprocess.Popen) -> None:
    """The worker and its run gone at once, as a node that vanishes takes them: neither gets a
    signal it could act on (a worker killed alone has its run stopped by SIGTERM, and the run
    saves)."""
    [run_pid] = child_processes(worker.pid)
    worker.send_signal(signal.SIGSTOP)  # so that it does not see its run die
    os.kill(run_pid, signal.SIGKILL)
    worker.send_signal(signal.SIGKILL)


@pytest.mark.parametrize("loss", ["worker alone", "with its run, before the first checkpoint",
                                  "with its run, after a checkpoint",
                                  "after a checkpoint left unreadable"])
def test_a_lost_worker_s_trial_is_retried_and_takes_over_what_its_run_left(tmp_path, loss):
    """A worker lost mid-trial: the same command later finds the trial without a heartbeat, fails it
    with the reason and retries it. The retry continues the run from its checkpoint: the one it
    saved as its worker died (SIGTERM, from the worker's death), or its last periodic one
    (--save-minutes); a run lost before any has its folder moved aside and starts afresh, where a
    run beside it would leave two for the scorer. A retry that cannot continue (an unreadable
    checkpoint) moves the folder aside too and is retried in turn. Either way the study ends with
    its one trial scored."""
    (tmp_path / "slow_ppo.py").write_text(SLOW_PPO)
    space = tmp_path / "space.toml"
    space.write_text(LEARNING_RATE_SPACE)
    before = loss == "with its run, before the first checkpoint"
    command = [sys.executable, str(REPO / "benchmark" / "tune.py"),
               "--command", "python slow_ppo.py --num-steps 16", "--space", str(space),
               "--study-dir", str(tmp_path / "study"), "--study-name", "test",
               "--env-ids", "CartPole-v1", "--total-timesteps", "2048", "--seeds", "1",
               "--trials", "1", "--poll-seconds", "0.5", "--heartbeat-seconds", "0.5",
               "--grace-seconds", "3"]
    # 32 iterations of 4 x 16 steps, 1.3 s each; a checkpoint every 0.6 s (at the end of an
    # iteration), or none before 10 minutes.
    worker = subprocess.Popen([*command, "--save-minutes", "10" if before else "0.01"],
                              cwd=tmp_path, env={**os.environ, "SLOW_STEP_SECONDS": "0.02"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    workdir = tmp_path / "study" / "trials" / "0" / "CartPole-v1__seed1"
    log = workdir / "run.log"

    def ready() -> bool:
        # a run under way: an iteration logged, and with a checkpoint when asked for
        return (log.is_file() and "\nstep " in log.read_text()
                and (before or loss == "worker alone" or any(workdir.glob("runs/*/checkpoint.pt"))))

    deadline = time.time() + HUNG_AFTER
    while not ready():
        assert worker.poll() is None and time.time() < deadline, worker.communicate()[0]
        time.sleep(0.2)
    if loss == "worker alone":
        worker.send_signal(signal.SIGKILL)
    else:
        lose_with_its_run(worker)
    worker.wait()
    [lost_run] = list((workdir / "runs").iterdir())
    if before:
        assert (not list(lost_run.glob("checkpoint.pt*"))
                and list(lost_run.glob("events.out.tfevents.*")))
    if loss == "after a checkpoint left unreadable":
        (lost_run / "checkpoint.pt").write_text("not a checkpoint\n")

    # The retries' runs go at full speed.
    again = subprocess.run(command, cwd=tmp_path, env={**os.environ, "SLOW_STEP_SECONDS": "0"},
                           capture_output=True, text=True, timeout=HUNG_AFTER)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    lost, *retries = load_study(tmp_path / "study").get_trials()
    assert lost.state == optuna.trial.TrialState.FAIL
    assert lost.user_attrs["failure"].startswith("its worker was lost: no heartbeat for ")
    *failed_retries, scored = retries
    assert scored.state == optuna.trial.TrialState.COMPLETE, scored.user_attrs
    for retry in retries:
        assert retry.system_attrs["failed_trial"] == 0 and retry.params == lost.params
    assert "1 trials: 1 complete, 0 pruned, 0 failed" in again.stdout
    [run] = list((workdir / "runs").iterdir())  # the one run the scorer found
    text = log.read_text()
    set_aside = workdir / "set-aside" / lost_run.name
    if loss in ("worker alone", "with its run, after a checkpoint"):
        assert not failed_retries and run == lost_run
        if loss == "worker alone":
            assert "stopped at step" in text  # the lost worker's run saved when its worker died ...
        assert "--resume runs/" in text and "resuming " in text  # ... and the retry continued it
        assert not set_aside.exists()
    else:
        moved = f"moved runs/{lost_run.name} aside to set-aside/{lost_run.name}: "
        # named in the run's log and the worker's output
        assert moved in text and moved in again.stdout
        assert set_aside.is_dir() and run != lost_run
        assert "--resume" not in text.split(moved)[-1]  # the run then started afresh
    if loss == "after a checkpoint left unreadable":
        [failed] = failed_retries
        assert failed.state == optuna.trial.TrialState.FAIL
        assert "(continuing the run left by an earlier try)" in failed.user_attrs["failure"]
        assert "cannot read checkpoint" in failed.user_attrs["failure"]
        assert scored.system_attrs["retry_history"] == [0, failed.number]
    elif loss == "with its run, before the first checkpoint":
        assert not failed_retries


def test_a_diverging_trial_and_one_whose_sizes_do_not_divide_fail_with_their_reasons(tmp_path):
    """Sampled values a run refuses (4 x 128 steps in 3 minibatches: its exit 2) fail their trial,
    as a divergence does; neither is wrong input of the study, which goes on and ends with exit
    0."""
    minibatches = '[params.num-minibatches]\ntype = "categorical"\nchoices = [3, 4]\n'
    space = learning_rate_space(high=1e31) + minibatches
    result = tune(tmp_path, *TINY, "--trials", "3", "--enqueue",
                  "--learning-rate 1e30 --num-minibatches 4", "--enqueue",
                  "--learning-rate 0.0025 --num-minibatches 3", "--enqueue",
                  "--learning-rate 0.0025 --num-minibatches 4", space=space)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    diverged, undivided, good = load_study(tmp_path / "study").get_trials()
    assert diverged.state == optuna.trial.TrialState.FAIL and diverged.value is None
    assert diverged.user_attrs["failure"].startswith("CartPole-v1 seed 1: ppo.py: diverged: ")
    # The scripts' divergence guard (ppo/training.py) stopped it, with its exit code.
    assert run_logs(tmp_path / "study", 0)[0].read_text().rstrip().endswith("# exit code 3")
    assert undivided.state == optuna.trial.TrialState.FAIL
    failure = undivided.user_attrs["failure"]
    assert failure.startswith("CartPole-v1 seed 1: wrong input (exit 2): ppo.py: error: ")
    assert "into --num-minibatches 3 equal minibatches" in failure
    assert good.state == optuna.trial.TrialState.COMPLETE
    report = (tmp_path / "study" / "report" / "index.md").read_text()
    assert "- trial 0: fail: CartPole-v1 seed 1: ppo.py: diverged: " in report
    assert "1 complete, 0 pruned, 2 failed" in report


def test_a_study_whose_every_trial_failed_exits_2_and_its_report_finds_the_study_in_its_folder(
        tmp_path):
    """`--num-envs 0` fixed in --command: every run refuses it, every trial fails. The study ends
    with its report, then one line naming the first failure, and exit 2, never 0 (issue 63).
    `--report --study-dir` alone then finds the study in the folder, whatever its name ("test", in
    the folder "study")."""
    result = tune(tmp_path, *TINY, "--trials", "2", command="python ppo/ppo.py --num-envs 0")
    line = expect_error_line(result, "tune.py", "all 2 trials failed, none scored; the first, "
                                                "trial 0: CartPole-v1 seed 1: wrong input (exit "
                                                "2): ppo.py: error: --num-envs", only_line=False)
    assert "Traceback" not in result.stderr and line == result.stderr.strip().splitlines()[-1]
    assert ("2 trials: 0 complete, 0 pruned, 2 failed"
            in (tmp_path / "study" / "report" / "index.md").read_text())
    report = run_tool("tune.py", "--report", "--study-dir", str(tmp_path / "study"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "# Tuning study `test`" in report.stdout


def test_an_environment_of_the_user_s_module_on_a_relative_pythonpath(tmp_path):
    """`PYTHONPATH=. tune.py --env-ids myenvs:MyCartPole-v0`: the runs start in folders of their
    own, where `.` would be another folder, so the tuner hands them the path made absolute."""
    cartpole = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
    (tmp_path / "myenvs.py").write_text(
        f"import gymnasium as gym\ngym.register(id='MyCartPole-v0', entry_point={cartpole!r})\n")
    space = LEARNING_RATE_SPACE.replace('"CartPole-v1"', '"myenvs:MyCartPole-v0"')
    result = tune(tmp_path, *TINY[2:], "--env-ids", "myenvs:MyCartPole-v0", "--trials", "1",
                  space=space, env={"PYTHONPATH": "."})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trial = load_study(tmp_path / "study").get_trials()[0]
    assert trial.state == optuna.trial.TrialState.COMPLETE, trial.user_attrs
    assert list(trial.user_attrs["returns"]) == ["myenvs:MyCartPole-v0 seed 1"]


PPO = str(REPO / "ppo" / "ppo.py")


@pytest.mark.parametrize("space, options, fragment", [
    (LEARNING_RATE_SPACE, ["--command", "python missing.py"],
     "the script missing.py does not exist"),
    ("[params.learning-rate\n", [], "is not valid TOML"),
    (LEARNING_RATE_SPACE.replace('"CartPole-v1"', '"Acrobot-v1"'), [],
     "has no [bounds] for CartPole-v1"),
    (LEARNING_RATE_SPACE.replace("learning-rate", "seed"), [], "the tuner sets --seed itself"),
    (LEARNING_RATE_SPACE + '[params.target-kl]\ntype = "float"\nlow = 0.01\nhigh = 0.1\n'
     'when = { early = true }\n', [], "`when` names early, which is not a parameter above it"),
    (LEARNING_RATE_SPACE, ["--command", f"python {PPO} --seed 3"], "--command sets --seed"),
    (LEARNING_RATE_SPACE, ["--enqueue", "--gamma 0.9"], "--gamma is not a flag of the space"),
    # A flag the script lacks would fail every trial: it is looked up in the script's --help first.
    (LEARNING_RATE_SPACE + '[params.num-layers]\ntype = "int"\nlow = 1\nhigh = 3\n', [],
     f"the space file space.toml: --num-layers is not a flag of {PPO} (its --help lists no "
     "--num-layers)"),
    (LEARNING_RATE_SPACE, ["--command", f"python {PPO} --num-env 8"],
     f"--command: --num-env is not a flag of {PPO} (its --help lists no --num-env)"),
], ids=["no script", "bad TOML", "no bounds", "reserved flag", "bad when", "fixed seed",
        "bad enqueue", "space flag the script lacks", "command flag the script lacks"])
def test_wrong_input_is_one_line(tmp_path, space, options, fragment):
    (tmp_path / "space.toml").write_text(space)
    # A --command in `options` replaces the first. Two trials at most, should wrong input get
    # through.
    result = run_tool("tune.py", "--command", f"python {PPO}", "--space", "space.toml",
                      "--trials", "2", "--env-ids", "CartPole-v1", "--total-timesteps", "2048",
                      *options, cwd=tmp_path)
    expect_error_line(result, "tune.py", fragment)
    assert not list(tmp_path.glob("tuning/*/trials"))  # refused before any trial


def test_a_two_task_job_array_of_workers_finishes_one_study(slurm_cluster, tmp_path):
    result = tune(tmp_path, *TINY, "--trials", "3", "--workers", "2", "--slurm",
                  env=slurm_cluster.environment())
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = re.search(r"submitted workers (\d+) and the report job (\d+)", result.stdout)
    array_job, report_job = jobs.groups()
    wait_for_jobs(slurm_cluster, [array_job, report_job])
    trials = load_study(tmp_path / "study").get_trials()
    outputs = "".join(path.read_text() for path in (tmp_path / "study" / "slurm").glob("*.out"))
    assert [trial.state for trial in trials] == [optuna.trial.TrialState.COMPLETE] * 3, outputs
    workers = {trial.user_attrs["worker"] for trial in trials}
    assert workers == {f"slurm {array_job}_{task}" for task in (0, 1)}
    # The report job ran after the workers.
    assert "3 trials: 3 complete" in (tmp_path / "study" / "report" / "index.md").read_text()


@pytest.fixture
def report_module():
    """The tuner's report module (benchmark/tuner/report.py) imported here."""
    from benchmark.tuner import report as module

    return module


@pytest.fixture
def study_module():
    """The tuner's study module (benchmark/tuner/study.py) imported here."""
    from benchmark.tuner import study as module

    return module


def test_the_one_reach_into_optuna_s_internals_works_on_the_release_it_was_checked_on(
        tmp_path, study_module):
    """set_user_attr_of_trial (benchmark/tuner/study.py) sets the failure reason of a lost worker's
    trial, for which Optuna has no public call: it uses the storage's internal interface. Checked on
    OPTUNA_CHECKED there; another Optuna release fails here, to have it checked again (then the
    constant is updated)."""
    tuner_study = study_module
    assert optuna.__version__ == tuner_study.OPTUNA_CHECKED, (
        f"Optuna {optuna.__version__}: check set_user_attr_of_trial against it, then set "
        "OPTUNA_CHECKED")
    study = load_or_create(tmp_path)
    study.ask()  # a trial whose Trial object is gone, as with its lost worker
    tuner_study.set_user_attr_of_trial(load_or_create(tmp_path), 0, "failure",
                                       "its worker was lost")
    load_or_create(tmp_path).tell(0, state=optuna.trial.TrialState.FAIL)
    [trial] = load_or_create(tmp_path).get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs == {"failure": "its worker was lost"}


def load_or_create(tmp_path: Path):
    """A study in a journal file of tmp_path, opened afresh, as another process would."""
    journal = optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log"))
    return optuna.create_study(study_name="test", storage=optuna.storages.JournalStorage(journal),
                               load_if_exists=True)
