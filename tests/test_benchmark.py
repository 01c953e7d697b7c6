"""The benchmark suite: the runner, the published baselines, the report and its plots, ppo.sh, and
the quick mode that runs the whole pipeline for real on a tiny budget."""

import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ppo_utils import run_logs  # the scripts' run logs: how a run writes its text tables
from benchmark import report
from benchmark.runner import local, run_plan
from benchmark.reporter.pages import repository_name
from conftest import (FAKE_SCRIPT, HUNG_AFTER, REPO, SLOW_PPO, SLOW_RUNS,
                      assert_quick_runs_finished, assert_same_final_weights,
                      assert_stopped_with_its_logs_flushed, calls, expect_error_line,
                      expect_usage_error, only_run_dir, read_scalars, run_tool, table_rows)

# Every row of the result tables of CleanRL's PPO documentation (its own numbers, and Huang et al.
# 2022's for openai/baselines), in its order: variant, row name as printed, CleanRL's column (mean,
# std), comparison column (mean, std).
PUBLISHED = [
    ("ppo", "CartPole-v1", 492.40, 13.05, 497.54, 4.02),
    ("ppo", "Acrobot-v1", -89.93, 6.34, -81.82, 5.58),
    ("ppo", "MountainCar-v0", -200.00, 0.00, -200.00, 0.00),
    ("ppo_atari", "BreakoutNoFrameskip-v4", 416.31, 43.92, 406.57, 31.554),
    ("ppo_atari", "PongNoFrameskip-v4", 20.59, 0.35, 20.512, 0.50),
    ("ppo_atari", "BeamRiderNoFrameskip-v4", 2445.38, 528.91, 2642.97, 670.37),
    ("ppo_continuous_action", "Hopper-v2", 2231.12, 656.72, 2518.95, 850.46),
    ("ppo_continuous_action", "Walker2d-v2", 3050.09, 1136.21, 3208.08, 1264.37),
    ("ppo_continuous_action", "HalfCheetah-v2", 1822.82, 928.11, 2152.26, 1159.84),
    ("ppo_atari_lstm", "BreakoutNoFrameskip-v4", 128.92, 31.10, 138.98, 50.76),
    ("ppo_atari_lstm", "PongNoFrameskip-v4", 19.78, 1.58, 19.79, 0.67),
    ("ppo_atari_lstm", "BeamRiderNoFrameskip-v4", 1536.20, 612.21, 1591.68, 372.95),
    ("ppo_atari_envpool", "BreakoutNoFrameskip-v4", 389.57, 29.62, 416.31, 43.92),
    ("ppo_atari_envpool", "PongNoFrameskip-v4", 20.55, 0.37, 20.59, 0.35),
    ("ppo_atari_envpool", "BeamRiderNoFrameskip-v4", 2039.83, 1146.62, 2445.38, 528.91),
    ("ppo_procgen", "StarPilot", 31.40, 11.73, 33.97, 7.86),
    ("ppo_procgen", "BossFight", 9.09, 2.35, 9.35, 2.04),
    ("ppo_procgen", "BigFish", 21.44, 6.73, 20.06, 5.34),
    ("ppo_atari_multigpu", "BreakoutNoFrameskip-v4", 429.06, 52.09, 416.31, 43.92),
    ("ppo_atari_multigpu", "PongNoFrameskip-v4", 20.40, 0.46, 20.59, 0.35),
    ("ppo_atari_multigpu", "BeamRiderNoFrameskip-v4", 2454.54, 740.49, 2445.38, 528.91),
]


# --------------------------------------------------------------------------------------------------
# The runner, with a stand-in script: fast, and no training
# --------------------------------------------------------------------------------------------------

def test_runner_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    result = run_tool("run.py", "--env-ids", "A-v1", "B-v0",
                      "--command", "python fake.py --extra x", "--num-seeds", "2",
                      "--start-seed", "5", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    for line, (env_id, seed) in zip(lines, [("A-v1", 5), ("A-v1", 6), ("B-v0", 5), ("B-v0", 6)]):
        assert f"fake.py --extra x --env-id {env_id} --seed {seed}" in line
        assert f"benchmark/logs/fake/{env_id}__seed{seed}.log" in line
    assert calls(tmp_path) == []
    assert not (tmp_path / "benchmark").exists()


def test_dry_run_quotes_log_paths_for_the_shell(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    result = run_tool("run.py", "--env-ids", "A-v1", "--command", "python fake.py",
                      "--num-seeds", "1", "--log-dir", "bench logs", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert shlex.split(line)[-2:] == ["bench logs/fake/A-v1__seed1.log", "2>&1"]


def test_quick_dry_run_leaves_no_temporary_directory(tmp_path):
    result = run_tool("run.py", "--quick", "--dry-run", cwd=tmp_path, env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert [line.startswith("(cd ") for line in result.stdout.splitlines()].count(True) == 4
    assert "removed again" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_runner_skips_finished_runs_and_retries_failed_ones(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    args = ["--env-ids", "A-v1", "ALE/B-v5", "--command", "python fake.py", "--num-seeds", "2",
            "--workers", "2"]
    logs = tmp_path / "benchmark" / "logs" / "fake"

    # First pass: seed 2 fails everywhere.
    (tmp_path / "fail-seed-2").touch()
    first = run_tool("run.py", *args, cwd=tmp_path)
    assert first.returncode == 1, first.stdout
    assert calls(tmp_path) == ["A-v1 1", "A-v1 2", "ALE/B-v5 1", "ALE/B-v5 2"]
    assert "4 run(s): 2 ran ok, 0 skipped (finished earlier), 2 failed" in first.stdout
    assert first.stdout.count("[FAIL]") == 2 and "failing on purpose" in first.stdout
    for env in ("A-v1", "ALE_B-v5"):  # a slash in an env id becomes an underscore in file names
        assert (logs / f"{env}__seed1.done").is_file()
        assert not (logs / f"{env}__seed2.done").exists()
        assert "OMP_NUM_THREADS=1" in (logs / f"{env}__seed1.log").read_text()
        assert "failing on purpose" in (logs / f"{env}__seed2.log").read_text()

    # Second pass: only the failed runs run again.
    (tmp_path / "fail-seed-2").unlink()
    (tmp_path / "calls.txt").unlink()
    second = run_tool("run.py", *args, cwd=tmp_path)
    assert second.returncode == 0, second.stdout
    assert calls(tmp_path) == ["A-v1 2", "ALE/B-v5 2"]
    assert "4 run(s): 2 ran ok, 2 skipped (finished earlier), 0 failed" in second.stdout

    # Third pass: nothing left to do.
    (tmp_path / "calls.txt").unlink()
    third = run_tool("run.py", *args, cwd=tmp_path)
    assert third.returncode == 0 and calls(tmp_path) == []
    assert third.stdout.count("[skip]") == 4

    # Another command is another benchmark: nothing is skipped; --force reruns too.
    changed = run_tool("run.py", *args[:4], "python fake.py --extra 1", *args[5:], cwd=tmp_path)
    assert changed.returncode == 0 and len(calls(tmp_path)) == 4
    (tmp_path / "calls.txt").unlink()
    forced = run_tool("run.py", *args, "--force", cwd=tmp_path)
    assert forced.returncode == 0 and len(calls(tmp_path)) == 4


def test_runner_starts_runs_in_workdir(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    result = run_tool("run.py", "--env-ids", "A-v1", "--command", "python fake.py",
                      "--num-seeds", "1", "--workdir", "work", "--log-dir", "logs", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # fake.py was found although the run started in work/
    assert calls(tmp_path / "work") == ["A-v1 1"]
    assert (tmp_path / "logs" / "fake" / "A-v1__seed1.done").is_file()

    # A program given by a relative path, too, is read from where run.py runs, not from --workdir.
    launcher = (f'#!/bin/sh\nexec {shlex.quote(sys.executable)} '
                f'{shlex.quote(str(tmp_path / "fake.py"))} "$@"\n')
    (tmp_path / "fake-launcher").write_text(launcher)
    (tmp_path / "fake-launcher").chmod(0o755)
    result = run_tool("run.py", "--env-ids", "B-v1", "--command", "./fake-launcher",
                      "--num-seeds", "1", "--workdir", "work", "--log-dir", "logs", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls(tmp_path / "work") == ["A-v1 1", "B-v1 1"]


def test_runner_keeps_workers_runs_going_at_a_time(tmp_path, monkeypatch):
    """--workers 3 starts three runs at once and a new one as each ends, never a fourth beside them:
    runs share the machine's cores (one thread each), and a runner that ignored the cap would
    overload them, or, run one at a time, take three times as long. Counted by the runner's own
    start and finish of each real run."""
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    monkeypatch.chdir(tmp_path)
    runs = run_plan.plan_runs("python fake.py", ["A-v1"], [1, 2, 3, 4, 5], tmp_path / "logs")
    start, finish = local.start, local.finish
    running = []  # how many runs were going after each start

    def counted_start(*arguments):
        running.append((running[-1] if running else 0) + 1)
        return start(*arguments)

    def counted_finish(*arguments):
        running.append(running[-1] - 1)
        return finish(*arguments)

    monkeypatch.setattr(local, "start", counted_start)
    monkeypatch.setattr(local, "finish", counted_finish)
    assert local.run_all(runs, workers=3, workdir=tmp_path) == {"ok": 5, "skipped": 0, "failed": 0}
    assert running[:3] == [1, 2, 3] and max(running) == 3 and running[-1] == 0
    assert calls(tmp_path) == [f"A-v1 {seed}" for seed in range(1, 6)]


def test_runner_names_each_runs_log_as_it_starts(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    result = run_tool("run.py", "--env-ids", "A-v1", "--command", "python fake.py",
                      "--num-seeds", "2", "--log-dir", "logs", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for seed in (1, 2):
        assert f"[start] fake A-v1 seed {seed}: log logs/fake/A-v1__seed{seed}.log" in result.stdout


def test_the_runners_progress_reads_each_runs_log_and_estimates_the_whole(tmp_path, monkeypatch):
    """While runs go, the runner shows each one's step and time left, from the last progress line in
    its log, and the whole benchmark's time left: the running runs' own, then the waiting ones at
    the mean length of the runs seen so far, `workers` at a time. Fixed logs and clock: the
    arithmetic is checked, no timing."""
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    monkeypatch.chdir(tmp_path)
    runs = run_plan.plan_runs("python fake.py", ["A-v1"], [1, 2, 3], tmp_path / "logs")
    runs[0].log_path.parent.mkdir(parents=True)
    runs[0].log_path.write_text(
        "# command: ...\nCartPole-v1__ppo__1__1: 1,000 steps on cpu\n"
        "step       100/1,000 |    100 SPS | 0:00:01 elapsed, 0:00:09 left | mean return      n/a "
        "(last 0 episodes)\n"
        "step       500/1,000 |    100 SPS | 0:00:05 elapsed, 0:00:05 left | mean return    20.00 "
        "(last 4 episodes)\n")
    runs[1].log_path.write_text("# command: ...\n")  # started, no progress line yet
    monkeypatch.setattr(local.time, "time", lambda: 1000.0)
    report = local.progress_report([(runs[0], 990.0), (runs[1], 998.0)], pending=1, done=2,
                                   workers=2, durations=[30.0])
    assert report == ["fake A-v1 seed 1: step 500/1,000, 0:00:05 left",
                      "fake A-v1 seed 2: starting (0:00:02)",
                      "2 of 5 run(s) done"]  # no estimate of the whole while a run has not said
    runs[1].log_path.write_text(runs[0].log_path.read_text())
    report = local.progress_report([(runs[0], 990.0), (runs[1], 998.0)], pending=1, done=2,
                                   workers=2, durations=[30.0])
    # left: 5 + 5 s now, then one more run of the mean length (30, 10, 10 s: 16.7 s), 2 at a time
    assert report[-1] == "2 of 5 run(s) done, about 0:00:13 left in all"


def test_a_stopped_benchmark_continues_its_runs_where_they_stopped(tmp_path, unbroken_slow_runs):
    """Ctrl-C in the runner's terminal reaches the runner and its run; the runner also sends the run
    SIGTERM, which the run takes for the same request: it saves and stops, the runner says where and
    exits 130. The same command again continues the run from its checkpoint (--resume), to the
    weights, latest scores and TensorBoard log of a run that never stopped; a checkpoint that cannot
    be read is said in one line, and the run is not started again in its place."""
    (tmp_path / "slow_ppo.py").write_text(SLOW_PPO)
    benchmark = [*SLOW_RUNS, "--num-seeds", "1"]
    log = tmp_path / "benchmark" / "logs" / "slow_ppo" / "CartPole-v1__seed1.log"
    first = subprocess.Popen([sys.executable, str(REPO / "benchmark" / "run.py"), *benchmark],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True,
                             env={**os.environ, "SLOW_STEP_SECONDS": "0.005"})
    deadline = time.time() + HUNG_AFTER
    while not (log.is_file() and "\nstep " in log.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C in a terminal: its whole process group
    output = first.communicate(timeout=HUNG_AFTER)[0]
    assert first.returncode == 130, output
    checkpoint_path = only_run_dir(tmp_path) / "checkpoint.pt"
    assert ("[stop] slow_ppo CartPole-v1 seed 1: stopped, the same command continues it from "
            f"{checkpoint_path.relative_to(tmp_path)}") in output, output
    # One stop notice, named after whichever of the two signals the run took first: the other is the
    # same request.
    notices = re.findall(r"(Ctrl-C|SIGTERM): stopping after this iteration", log.read_text())
    assert len(notices) == 1 and "stopped at once" not in log.read_text(), log.read_text()
    assert 0 < assert_stopped_with_its_logs_flushed(checkpoint_path) < 2048

    corrupt = tmp_path.parent / f"{tmp_path.name}-corrupt"
    shutil.copytree(tmp_path, corrupt)
    (only_run_dir(corrupt) / "checkpoint.pt").write_bytes(b"not a checkpoint")
    refused = run_tool("run.py", *benchmark, cwd=corrupt)
    assert refused.returncode == 1
    (line,) = [line for line in refused.stdout.splitlines() if line.startswith("[FAIL]")]
    checkpoint_there = only_run_dir(corrupt).relative_to(corrupt) / "checkpoint.pt"
    assert f"cannot resume from {checkpoint_there} (ppo.py: error: cannot read checkpoint" in line
    assert len(list((corrupt / "runs").iterdir())) == 1  # not started again beside it

    second = run_tool("run.py", *benchmark, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "[resume] slow_ppo CartPole-v1 seed 1: from " in second.stdout
    assert "1 run(s): 1 ran ok, 0 skipped (finished earlier), 0 failed" in second.stdout
    # the log keeps both sittings
    assert f"resuming {checkpoint_path.parent.name} at step" in log.read_text()
    assert_same_final_weights(unbroken_slow_runs / "seed1", checkpoint_path, 2048)


@pytest.mark.parametrize("command, fragment", [
    ("nosuchprog --x", "the program 'nosuchprog' is not found on PATH"),
    ("./missing.sh", "./missing.sh does not exist"),
    ("./not-executable.sh", "./not-executable.sh is not executable"),
    ("python ppo/nosuch.py --x 1", "the script ppo/nosuch.py does not exist"),
    ('python "fake.py', "cannot be split into words (no closing quotation)"),
    ("  ", "--command is empty"),
])
def test_runner_refuses_a_command_that_cannot_start(tmp_path, command, fragment):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    (tmp_path / "not-executable.sh").write_text("#!/bin/sh\n")
    for extra in ([], ["--dry-run"], ["--slurm", "--dry-run"]):
        result = run_tool("run.py", "--env-ids", "A-v1", "--command", command, *extra, cwd=tmp_path)
        expect_error_line(result, "run.py", "--command", fragment)
    # refused before anything ran
    assert calls(tmp_path) == [] and not (tmp_path / "benchmark").exists()


@pytest.mark.parametrize("options, fragment", [
    (["--workdir", "a-file"], "a-file (--workdir) is a file: give a directory"),
    (["--log-dir", "a-file"], "a-file (--log-dir) is a file: give a directory"),
    (["--log-dir", "a-file/logs"],
     "cannot make the directory a-file/logs (--log-dir): Not a directory"),
    (["--workdir", "a-file", "--dry-run"], "a-file (--workdir) is a file"),
    (["--log-dir", "a-file", "--slurm", "--dry-run"],
     "cannot make the directory a-file/slurm (--log-dir)"),
])
def test_runner_refuses_a_file_for_a_directory(tmp_path, options, fragment):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    (tmp_path / "a-file").write_text("")
    result = run_tool("run.py", "--env-ids", "A-v1", "--command", "python fake.py",
                      *options, cwd=tmp_path)
    expect_error_line(result, "run.py", fragment)
    assert calls(tmp_path) == []


@pytest.mark.parametrize("quick_dir, fragment", [
    ("a-file", "a-file (--quick-dir) is a file: give a directory"),
    ("a-file/quick", "cannot make the directory a-file/quick (--quick-dir): Not a directory"),
])
def test_quick_mode_refuses_a_quick_dir_it_cannot_make(tmp_path, quick_dir, fragment):
    (tmp_path / "a-file").write_text("")
    result = run_tool("run.py", "--quick", "--quick-dir", quick_dir, cwd=tmp_path)
    expect_error_line(result, "run.py", fragment)


@pytest.mark.parametrize("options, fragment", [
    (["--quick", "--env-ids", "A-v1"], "--env-ids: not with --quick"),
    (["--quick", "--command", "python fake.py", "--num-seeds", "5"],
     "--command, --num-seeds: not with --quick"),
    (["--quick", "--workdir", "w", "--log-dir", "l", "--start-seed", "3"],
     "--start-seed, --workdir, --log-dir: not with --quick"),
    (["--env-ids", "A-v1", "--command", "python fake.py", "--quick-dir", "q"],
     "--quick-dir: only with --quick"),
])
def test_runner_refuses_options_that_would_be_ignored(tmp_path, options, fragment):
    result = run_tool("run.py", *options, cwd=tmp_path)
    # argparse prints its usage first
    expect_error_line(result, "run.py", fragment, only_line=False)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------------


def test_baselines_file_holds_every_published_number():
    baselines = report.load_baselines(REPO / "benchmark" / "baselines.toml")
    assert "Huang et al. 2022" in baselines["source"]["citation"]
    variants = baselines["variants"]
    assert set(variants) == {row[0] for row in PUBLISHED}
    for variant, entry in variants.items():
        assert entry["section"].startswith(entry["script"].removeprefix("ppo/"))
        assert len(entry["envs"]) == 3
    found = []
    for variant, entry in variants.items():
        for env in entry["envs"]:
            found.append((variant, env.get("table_env", env["env_id"]), env["ours"]["mean"],
                          env["ours"]["std"], env["reference"]["mean"], env["reference"]["std"]))
    assert sorted(found) == sorted(PUBLISHED)  # exact float equality: transcribed, not recomputed


def test_baselines_spot_checks_and_env_name_mapping():
    baselines = report.load_baselines()
    _, row = report.find_baseline(baselines, "ppo_atari", "BreakoutNoFrameskip-v4")
    assert row["reference"] == {"mean": 406.57, "std": 31.554}
    # MuJoCo: the table's v2 rows, our v4 runs; either name finds the row.
    for name in ("Hopper-v4", "Hopper-v2"):
        _, row = report.find_baseline(baselines, "ppo_continuous_action", name)
        assert row["env_id"] == "Hopper-v4" and row["ours"] == {"mean": 2231.12, "std": 656.72}
    # Procgen display names against procgen ids.
    _, row = report.find_baseline(baselines, "ppo_procgen", "starpilot")
    assert row["table_env"] == "StarPilot" and row["ours"]["mean"] == 31.40
    # envpool's v5 ids against the table's NoFrameskip-v4 rows; its comparison column is
    # ppo_atari.py.
    entry, row = report.find_baseline(baselines, "ppo_atari_envpool", "Breakout-v5")
    assert (row["table_env"] == "BreakoutNoFrameskip-v4"
            and row["ours"] == {"mean": 389.57, "std": 29.62})
    assert "ppo_atari.py" in entry["reference_label"] and entry["reference_minutes"] == 220
    entry, row = report.find_baseline(baselines, "ppo_atari_multigpu", "BeamRiderNoFrameskip-v4")
    assert row["ours"] == {"mean": 2454.54, "std": 740.49} and entry["ours_minutes"] == 160
    assert report.find_baseline(baselines, "ppo", "Pong-v5") == (baselines["variants"]["ppo"], None)
    assert report.find_baseline(baselines, "nope", "CartPole-v1") == (None, None)


# --------------------------------------------------------------------------------------------------
# The report, on hand-made TensorBoard logs with known numbers
# --------------------------------------------------------------------------------------------------


def write_run(runs_dir: Path, env_id: str, exp_name: str, seed: int, started: int,
              total_timesteps: int, episodes: list[tuple[int, float]], last_step: int | None = None,
              batch_size: int = 100, seconds_per_step: float = 0.001, first_step: int = 0,
              sitting_began: float | None = None, versions: dict[str, str] | None = None) -> Path:
    """A run directory as the scripts write it: hyperparameters text, the `versions` text if given
    (runs from before the scripts logged it have none), episodic returns, SPS per batch; each point
    is logged `seconds_per_step` per step after the sitting began (`sitting_began`, default now) at
    `first_step`. A second call on the same run with a later `first_step` writes a resumed run's
    next sitting, in an event file of its own."""
    from unittest import mock

    from torch.utils.tensorboard import SummaryWriter

    run_dir = runs_dir / f"{env_id}__{exp_name}__{seed}__{started}"
    began = time.time() if sitting_began is None else sitting_began
    with mock.patch("time.time", return_value=began):  # the event file's first event, and its name
        writer = SummaryWriter(str(run_dir), purge_step=first_step + 1 if first_step else None)
    params = {"exp_name": exp_name, "seed": seed, "env_id": env_id,
              "total_timesteps": total_timesteps, "batch_size": batch_size}
    writer.add_text("hyperparameters", run_logs.text_table("param", "value", params),
                    walltime=began)
    if versions is not None:
        writer.add_text("versions", run_logs.text_table("package", "version", versions),
                        walltime=began)
    for step, value in episodes:
        writer.add_scalar("charts/episodic_return", value, step,
                          walltime=began + (step - first_step) * seconds_per_step)
    last_step = total_timesteps if last_step is None else last_step
    for step in range(first_step + batch_size, last_step + 1, batch_size):
        writer.add_scalar("charts/SPS", step // 10, step,
                          walltime=began + (step - first_step) * seconds_per_step)
    writer.close()
    return run_dir


# the header of the table's result column
FINAL_RETURN = "final return, mean ± std over seeds (last 10% of steps)"

# Published numbers for the variant `demo`, whose two columns' bands differ from each other and from
# the spread of the runs the tests write.
BAND_BASELINES = """
[variants.demo]
ours_label = "ours"
reference_label = "theirs"
[[variants.demo.envs]]
env_id = "CartPole-v1"
ours = { mean = 100.0, std = 10.0 }
reference = { mean = 80.0, std = 1.0 }
"""


def runs_used(page: str) -> list[dict[str, str]]:
    """The rows of a variant page's "Runs used" table, one per run."""
    return table_rows(page.split("## Runs used")[1], "env")


def record_saved_figures(monkeypatch) -> dict[str, dict]:
    """From now on, what each figure holds when it is saved, by `<variant>/<file name>`: its title,
    x label, lines ({label: (x, y, line style)}) and shaded bands ({label: the (x, y) points of
    their outlines})."""
    import matplotlib.figure

    figures, savefig = {}, matplotlib.figure.Figure.savefig

    def outline(band) -> np.ndarray:
        return np.concatenate([path.vertices for path in band.get_paths()] or [np.empty((0, 2))])

    def record_then_save(figure, path, *rest, **options):
        (axes,) = figure.axes
        figures[f"{Path(path).parent.name}/{Path(path).name}"] = {
            "title": axes.get_title(), "xlabel": axes.get_xlabel(),
            "lines": {line.get_label(): (np.asarray(line.get_xdata(), dtype=float),
                                         np.asarray(line.get_ydata(), dtype=float),
                                         line.get_linestyle()) for line in axes.get_lines()},
            "bands": {band.get_label(): outline(band) for band in axes.collections}}
        return savefig(figure, path, *rest, **options)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record_then_save)
    return figures


def test_mann_whitney_matches_hand_counts():
    # Every value of the first above every value of the second: U = 3 x 3 = 9; of the 20 ways to
    # split six values into two groups of three, two are as extreme (both directions): p = 0.1.
    assert (report.mann_whitney(np.array([4.0, 5.0, 6.0]), np.array([1.0, 2.0, 3.0]))
            == (9.0, pytest.approx(0.1)))
    # Interleaved: U sits at its centre, and every split is at least as extreme.
    assert (report.mann_whitney(np.array([1.0, 4.0]), np.array([2.0, 3.0]))
            == (2.0, pytest.approx(1.0)))
    # past 20 values: no exact p
    assert math.isnan(report.mann_whitney(np.arange(11.0), np.arange(11.0))[1])


def test_a_report_of_two_variants_on_one_env_sets_them_side_by_side(tmp_path):
    """An ablation (the same script with a flag on and off, two exp_names): a comparison page with
    the final returns of the seeds both ran, the U test, and one plot with both curves."""
    runs = tmp_path / "runs"
    for seed, (off, on) in enumerate([(10.0, 50.0), (20.0, 60.0), (30.0, 40.0)], start=1):
        write_run(runs, "Pendulum-v1", "off", seed, 100 + seed, 1000, [(500, 0.0), (990, off)])
        write_run(runs, "Pendulum-v1", "on", seed, 200 + seed, 1000, [(500, 0.0), (990, on)])
    # one variant alone: no comparison row
    write_run(runs, "Hopper-v4", "on", 1, 300, 1000, [(990, 1.0)])
    out = tmp_path / "report"
    report.build_report(runs, out, baselines_path=Path(os.devnull))
    assert not (out / "comparison.md").exists()  # only when asked for
    report.build_report(runs, out, baselines_path=Path(os.devnull), compare=True)
    page = (out / "comparison.md").read_text()
    (row,) = table_rows(page, "env")
    assert row == {"env": "Pendulum-v1", "seeds": "1, 2, 3", "off": "20.00 ± 8.16",
                   "on": "50.00 ± 8.16", "U": "0", "p": "0.100"}
    assert ((out / "comparison" / "Pendulum-v1.png").is_file()
            and (out / "comparison" / "Pendulum-v1-time.png").is_file())
    assert "- [the variants compared](comparison.md)" in (out / "index.md").read_text()


def test_report_uses_the_newest_complete_run_per_seed(tmp_path):
    runs = tmp_path / "runs"
    early = [(100, -500.0), (500, -300.0)]
    write_run(runs, "Acrobot-v1", "ppo", 1, 100, 1000,
              early + [(950, -1.0), (1000, -3.0)])  # superseded
    write_run(runs, "Acrobot-v1", "ppo", 1, 200, 1000,
              early + [(850, -99.0), (950, -80.0), (1000, -90.0)])
    write_run(runs, "Acrobot-v1", "ppo", 1, 300, 1000, early,
              last_step=500)  # newest, but incomplete
    write_run(runs, "Acrobot-v1", "ppo", 2, 150, 1000,
              early + [(920, -100.0), (990, -110.0), (1000, -120.0)])
    # no complete run: no seed 3
    write_run(runs, "Acrobot-v1", "ppo", 3, 160, 1000, early, last_step=600)
    # newest, complete, but a short trial
    write_run(runs, "Acrobot-v1", "ppo", 2, 400, 100, [(100, -500.0)])
    write_run(runs, "Hopper-v4", "ppo_continuous_action", 1, 100, 1000,
              [(400, 10.0), (1000, 2300.0)])
    write_run(runs, "ALE/Pong-v5", "mine", 1, 100, 1000, [(300, -21.0)])  # nested dir, no baseline

    out = tmp_path / "results"
    rows = report.build_report(runs, out)
    assert set(rows) == {"ppo", "ppo_continuous_action", "mine"}

    (acrobot,) = rows["ppo"]
    assert [run.path.name for run in acrobot.runs] == ["Acrobot-v1__ppo__1__200",
                                                       "Acrobot-v1__ppo__2__150"]
    # Final returns: the episodes after step 900 (the last 10% of 1000 steps).
    assert acrobot.values.tolist() == [-85.0, -110.0]
    assert acrobot.mean == -97.5 and acrobot.std == 12.5
    assert acrobot.status == "below"  # -97.5 < -89.93 - 6.34

    page = (out / "ppo.md").read_text()
    (row,) = table_rows(page, "env")
    assert row["env"] == "Acrobot-v1"
    assert row["seeds"] == "2" and row["steps per run"] == "1,000"
    assert row[FINAL_RETURN] == "-97.50 ± 12.50"
    assert row["mean SPS"] == "100"
    assert row["baseline: ppo.py (CleanRL)"] == "-89.93 ± 6.34"
    assert row["openai/baselines' PPO (Huang et al. 2022)"] == "-81.82 ± 5.58"
    assert row["status"] == "below"
    left_out = page.split("Runs left out:")[1]
    assert "Acrobot-v1__ppo__1__300`: incomplete (reached step 500 of 1,000)" in left_out
    assert "Acrobot-v1__ppo__1__100`: a newer complete run of the same seed exists" in left_out
    assert "Acrobot-v1__ppo__3__160`: incomplete" in left_out
    assert ("Acrobot-v1__ppo__2__400`: a complete run of the same seed with a larger budget exists"
            in left_out)
    assert "last 10%" in page and "ddof=0" in page

    (hopper,) = rows["ppo_continuous_action"]
    assert hopper.baseline["table_env"] == "Hopper-v2" and hopper.status == "within"
    assert 'Hopper-v4 against the row "Hopper-v2"' in (out / "ppo_continuous_action.md").read_text()

    (pong,) = rows["mine"]
    assert pong.env_id == "ALE/Pong-v5" and pong.status == "no baseline"
    assert pong.finals == [(-21.0, 1, True)]  # no episode in the last 10%: the last one, marked
    assert "-21.00 ± 0.00*" in (out / "mine.md").read_text()
    assert (out / "mine" / "ALE_Pong-v5.png").is_file()
    assert "[ppo](ppo.md)" in (out / "index.md").read_text()


def test_report_leaves_out_a_seed_without_episodes_and_says_so(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "ppo", 1, 100, 1000, [(950, 40.0), (1000, 60.0)])
    write_run(runs, "CartPole-v1", "ppo", 2, 100, 1000, [])  # no episode ended in the whole run
    write_run(runs, "Acrobot-v1", "ppo", 1, 100, 1000, [])
    out = tmp_path / "results"
    figures = record_saved_figures(monkeypatch)
    rows = {row.env_id: row for row in report.build_report(runs, out)["ppo"]}
    # The plots' legends count the seeds the mean curve averages: those in which an episode ended.
    for env_id, seeds in (("CartPole-v1", 1), ("Acrobot-v1", 0)):
        for suffix in ("", "-time"):
            label = f"ppo, mean of {seeds} seed(s) (1 without an episode left out)"
            assert label in figures[f"ppo/{env_id}{suffix}.png"]["lines"]
    assert (rows["CartPole-v1"].values.tolist() == [50.0]
            and rows["CartPole-v1"].seeds_without_episodes == [2])
    assert rows["Acrobot-v1"].status == "no data"

    page = (out / "ppo.md").read_text()
    table = {row["env"]: row for row in table_rows(page, "env")}
    assert (table["CartPole-v1"][FINAL_RETURN] == "50.00 ± 0.00†"
            and table["CartPole-v1"]["seeds"] == "2")
    assert table["Acrobot-v1"][FINAL_RETURN] == "n/a†"
    assert "nan" not in page
    assert "† leave out a run in which no episode ended" in page
    assert ((out / "ppo" / "CartPole-v1.png").is_file()
            and (out / "ppo" / "Acrobot-v1.png").is_file())


def test_a_report_of_some_variants_keeps_the_others_in_the_index(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "demo", 1, 100, 1000, [(1000, 50.0)])
    write_run(runs, "Acrobot-v1", "other", 1, 100, 1000, [(1000, -90.0)])
    out = tmp_path / "results"
    report.build_report(runs, out)
    report.build_report(runs, out, variants=["demo"])
    index = (out / "index.md").read_text()
    assert "- [demo](demo.md): CartPole-v1" in index and "- [other](other.md): Acrobot-v1" in index


def test_progress_table_averages_each_tenth_of_the_steps_per_seed_then_over_seeds(tmp_path):
    runs = tmp_path / "runs"
    # Seed 1: two episodes in the first tenth, none in the second, one on the border of the third.
    write_run(runs, "CartPole-v1", "demo", 1, 100, 1000,
              [(10, 1.0), (100, 3.0), (300, 7.0), (1000, 50.0)])
    # Seed 2: one episode in each of the first and third tenths, and one in the last.
    write_run(runs, "CartPole-v1", "demo", 2, 100, 1000, [(40, 6.0), (250, 9.0), (950, 100.0)])
    out = tmp_path / "results"
    (row,) = report.build_report(runs, out)["demo"]
    spans = report.progress(row)
    assert [(first, last) for first, last, _, _ in spans[:3]] == [(0, 100), (100, 200), (200, 300)]
    # The first tenth: seed 1's mean (1 + 3) / 2 = 2 and seed 2's 6, so (2 + 6) / 2 = 4, from 3
    # episodes.
    assert spans[0][2:] == (4.0, 3)
    assert math.isnan(spans[1][2]) and spans[1][3] == 0
    assert spans[2][2:] == (8.0, 2)  # step 300 ends the third tenth, (200, 300]
    assert spans[9][2:] == (75.0, 2)
    page = (out / "demo.md").read_text()
    progress_rows = table_rows(page, "steps")
    assert progress_rows[0] == {"steps": "0-100", "mean return": "4.00", "episodes": "3"}
    assert progress_rows[1]["mean return"] == "n/a"
    assert progress_rows[9]["steps"] == "900-1k"


def test_include_incomplete_reports_how_far_each_run_got(tmp_path):
    """A run stopped before its budget (Ctrl-C at 40% of 1,000 steps) is used only with
    --include-incomplete, and then the table says how far it got and the progress spans the steps it
    ran, not its whole budget (which would leave six of the ten spans empty). A complete seed beside
    it keeps its budget."""
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "demo", 1, 100, 1000,
              [(50, 1.0), (150, 2.0), (390, 3.0)], last_step=400)
    out = tmp_path / "results"
    # no complete run: nothing to report without the flag
    assert report.build_report(runs, out) == {}
    (row,) = report.build_report(runs, out, include_incomplete=True)["demo"]
    assert row.finals == [(3.0, 1, False)]  # the last 10% of the 400 steps it ran: (360, 400]
    spans = report.progress(row)
    assert ([(first, last) for first, last, _, _ in spans[:2]] == [(0, 40), (40, 80)]
            and spans[9][1] == 400)
    assert [mean for _, _, mean, _ in spans if not math.isnan(mean)] == [1.0, 2.0, 3.0]
    (table_row,) = table_rows((out / "demo.md").read_text(), "env")
    assert table_row["steps per run"] == "400 of 1,000"

    write_run(runs, "CartPole-v1", "demo", 2, 100, 1000, [(950, 5.0), (1000, 7.0)])
    (row,) = report.build_report(runs, out, include_incomplete=True)["demo"]
    # the longest run's steps: seed 2's whole budget
    assert report.progress(row)[9][:2] == (900, 1000)
    (table_row,) = table_rows((out / "demo.md").read_text(), "env")
    assert table_row["steps per run"] == "400 of 1,000, 1,000"


def test_a_run_without_an_episode_in_its_last_tenth_counts_its_last_episode(tmp_path):
    """With no episode ended in a run's last 10% of steps (long episodes, a short budget), its final
    return is its last episode's, marked *: not its first, nor the mean of the whole run, which
    would show where the run began rather than where it got to. The other seed's episode in its last
    10% counts as usual."""
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "demo", 1, 100, 1000, [(200, 10.0), (500, 50.0), (800, 20.0)])
    write_run(runs, "CartPole-v1", "demo", 2, 100, 1000, [(300, 5.0), (950, 40.0)])
    out = tmp_path / "results"
    (row,) = report.build_report(runs, out, baselines_path=Path("/dev/null"))["demo"]
    assert row.finals == [(20.0, 1, True), (40.0, 1, False)]
    page = (out / "demo.md").read_text()
    assert table_rows(page, "env")[0][FINAL_RETURN] == "30.00 ± 10.00*"
    assert ("Values marked * include a run in which no episode ended in that window: its last "
            "episode counts" in page)
    assert ([(run["seed"], run["final return"], run["episodes averaged"])
             for run in runs_used(page)] == [("1", "20.00", "1"), ("2", "40.00", "1")])


def test_status_places_the_mean_in_the_published_band_not_the_measured_spread(tmp_path, capsys):
    """A row's status is where its mean falls in the band mean ± std of the baseline's own column
    ("ours": 100 ± 10), as the page says: the measured std (1 here) would make 92 read below, the
    comparison column's band (80 ± 1) above."""
    (tmp_path / "band.toml").write_text(BAND_BASELINES)
    for seed, value in ((1, 91.0), (2, 93.0)):
        write_run(tmp_path / "runs", "CartPole-v1", "demo", seed, 100, 1000, [(1000, value)])
    assert report.main(["--runs-dir", str(tmp_path / "runs"), "--out-dir", str(tmp_path / "out"),
                        "--baselines", str(tmp_path / "band.toml")]) == 0
    (row,) = table_rows((tmp_path / "out" / "demo.md").read_text(), "env")
    assert [row[column] for column in (FINAL_RETURN, "baseline: ours", "theirs", "status")] == [
        "92.00 ± 1.00", "100.00 ± 10.00", "80.00 ± 1.00", "within"]
    assert re.search(r"^  CartPole-v1 +92\.00 ± 1\.00  2 seed\(s\)  within$",
                     capsys.readouterr().out, re.MULTILINE)


@pytest.mark.parametrize("total_timesteps, batch_size, last_step, complete", [
    # ppo.py's 500k budget in batches of 512: 976 whole batches, 288 steps short
    (500_000, 512, 499_712, True),
    (1000, 100, 900, True),         # one batch short, a batch being more than 1% of the budget
    (1000, 100, 899, False),
    (100_000, 100, 99_000, True),   # 1% of the budget short, that being more than a batch
    (100_000, 100, 98_999, False),
])
def test_a_run_is_complete_within_one_batch_or_one_percent_of_its_budget(
        tmp_path, total_timesteps, batch_size, last_step, complete):
    """A run logs at the end of each batch, so one whose budget is not a whole number of batches
    stops short of it, and would otherwise never count as complete: every 500k-step ppo.py run would
    be left out of the report."""
    run_dir = write_run(tmp_path, "CartPole-v1", "demo", 1, 100, total_timesteps,
                        [(last_step, 1.0)], last_step=last_step, batch_size=batch_size)
    run = report.load_run(run_dir, tmp_path)
    assert ((run.total_timesteps, run.batch_size, run.last_step)
            == (total_timesteps, batch_size, last_step))
    assert run.complete is complete


def test_wall_time_is_each_runs_span_of_events_averaged_over_seeds(tmp_path):
    """The wall time per run is the time from a run's first event to its last, in seconds below two
    minutes, minutes below two hours, hours above: per run in the runs' table, their mean over seeds
    in the result table."""
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "demo", 1, 100, 1000, [(1000, 1.0)],
              seconds_per_step=0.06)  # 60 s
    write_run(runs, "CartPole-v1", "demo", 2, 100, 1000, [(1000, 1.0)],
              seconds_per_step=0.15)  # 150 s
    write_run(runs, "Acrobot-v1", "demo", 1, 100, 1000, [(1000, 1.0)],
              seconds_per_step=9.0)  # 9000 s
    out = tmp_path / "results"
    report.build_report(runs, out, baselines_path=Path("/dev/null"))
    page = (out / "demo.md").read_text()
    assert {row["env"]: row["wall time per run"] for row in table_rows(page, "env")} == {
        "CartPole-v1": "105.0 s", "Acrobot-v1": "2.50 h"}
    assert [(row["env"], row["seed"], row["wall time"]) for row in runs_used(page)] == [
        ("Acrobot-v1", "1", "2.50 h"), ("CartPole-v1", "1", "60.0 s"),
        ("CartPole-v1", "2", "2.5 min")]


def test_a_resumed_runs_wall_time_leaves_out_the_time_between_its_sittings(tmp_path):
    """A run stopped at step 500 and resumed an hour later (a preempted job requeued) took 50 s + 50
    s of training: its wall time is 100 s, not an hour, and its returns' times on the wall-time plot
    run on from the first sitting's end."""
    runs = tmp_path / "runs"
    first_sitting = 1_000_000.0
    write_run(runs, "CartPole-v1", "demo", 1, 100, 1000, [(250, 1.0), (500, 2.0)], last_step=500,
              seconds_per_step=0.1, sitting_began=first_sitting)
    run_dir = write_run(runs, "CartPole-v1", "demo", 1, 100, 1000, [(750, 3.0), (1000, 4.0)],
                        first_step=500, seconds_per_step=0.1, sitting_began=first_sitting + 3600.0)
    run = report.load_run(run_dir, runs)
    assert run.wall_seconds == pytest.approx(100.0)
    assert run.return_seconds.tolist() == pytest.approx([25.0, 50.0, 75.0, 100.0])
    assert (run.last_step, run.return_values.tolist()) == (1000, [1.0, 2.0, 3.0, 4.0])
    report.build_report(runs, tmp_path / "results", baselines_path=Path("/dev/null"))
    assert ([row["wall time"] for row in runs_used((tmp_path / "results" / "demo.md").read_text())]
            == ["100.0 s"])


def software(page: str) -> list[str]:
    """The lines of a variant page's "Software" section."""
    return page.split("## Software")[1].split("\n## ")[0].strip().splitlines()


def test_the_software_section_names_the_releases_each_run_ran_on(tmp_path):
    """A package's release can change what is learned (MuJoCo 3.5.0 moved Hopper's contacts), so a
    page says what its runs ran on: one line when they agree; else each set of releases with its
    runs, a run resumed on other releases with both sets, and runs from before the scripts logged
    their releases as not recorded."""
    runs, out = tmp_path / "runs", tmp_path / "results"
    write_run(runs, "Walker2d-v4", "before", 1, 100, 1000, [(1000, 1.0)])
    report.build_report(runs, out, baselines_path=Path("/dev/null"))
    assert software((out / "before.md").read_text()) == [
        "Not recorded: these runs predate the `versions` text the scripts log."]

    old = {"python": "3.11.7", "torch": "2.13.0+cpu", "mujoco": "3.4.0"}
    new = {**old, "mujoco": "3.17.0"}
    for seed in (1, 2):
        write_run(runs, "Hopper-v4", "demo", seed, 100, 1000, [(1000, 1.0)], versions=new)
    report.build_report(runs, out, baselines_path=Path("/dev/null"))
    assert software((out / "demo.md").read_text()) == [
        "Every run above: python 3.11.7, torch 2.13.0+cpu, mujoco 3.17.0."]

    write_run(runs, "Hopper-v4", "demo", 3, 100, 1000, [(500, 1.0)], last_step=500, versions=old)
    write_run(runs, "Hopper-v4", "demo", 3, 100, 1000, [(1000, 1.0)], first_step=500, versions=new)
    write_run(runs, "Hopper-v4", "demo", 4, 100, 1000, [(1000, 1.0)])
    report.build_report(runs, out, baselines_path=Path("/dev/null"))
    assert software((out / "demo.md").read_text()) == [
        "The releases each run logged (runs from before the scripts logged them have none):", "",
        "- python 3.11.7, torch 2.13.0+cpu, mujoco 3.17.0: `Hopper-v4__demo__1__100`, "
        "`Hopper-v4__demo__2__100`",
        "- python 3.11.7, torch 2.13.0+cpu, mujoco 3.4.0, then python 3.11.7, torch 2.13.0+cpu, "
        "mujoco 3.17.0: `Hopper-v4__demo__3__100`",
        "- not recorded: `Hopper-v4__demo__4__100`"]


def test_plots_show_the_mean_over_seeds_their_range_and_the_published_means(tmp_path, monkeypatch):
    """Each env's two plots, return against global step and against wall time (in minutes beyond 3
    minutes), draw the mean of the seeds' smoothed returns, shade their min–max range, and draw a
    line at each published mean with its column's label; an env without published numbers gets no
    such line. The seeds always return 10, 20 and 60 (mean 30, median 20), from step 100 (a tenth of
    the run, 0.5 of its 5 minutes) on."""
    (tmp_path / "band.toml").write_text(BAND_BASELINES)
    runs = tmp_path / "runs"
    for seed, value in ((1, 10.0), (2, 20.0), (3, 60.0)):
        write_run(runs, "CartPole-v1", "demo", seed, 100, 1000,
                  [(step, value) for step in range(100, 1001, 100)], seconds_per_step=0.3)
    write_run(runs, "Acrobot-v1", "demo", 1, 100, 1000, [(1000, -90.0)])
    figures = record_saved_figures(monkeypatch)
    report.build_report(runs, tmp_path / "out", baselines_path=tmp_path / "band.toml")
    assert sorted(figures) == ["demo/Acrobot-v1-time.png", "demo/Acrobot-v1.png",
                               "demo/CartPole-v1-time.png", "demo/CartPole-v1.png"]
    for suffix, xlabel, x_end in (("", "global step", 1000.0),
                                  ("-time", "wall time (minutes)", 5.0)):
        figure = figures[f"demo/CartPole-v1{suffix}.png"]
        assert (figure["title"], figure["xlabel"]) == ("demo on CartPole-v1", xlabel)
        assert list(figure["lines"]) == ["demo, mean of 3 seed(s)", "ours: 100.00", "theirs: 80.00"]
        x, y, _ = figure["lines"]["demo, mean of 3 seed(s)"]
        assert (len(x) == report.CURVE_POINTS and x[0] == 0
                and x[-1] == pytest.approx(x_end, rel=1e-3))
        started = x > x_end / 10
        # The last point may lie past the end of a seed's clock, a few milliseconds shorter than
        # another's.
        assert np.isnan(y[~started]).all() and (y[started][:-1] == 30.0).all()
        band = figure["bands"]["min–max over seeds"]
        assert set(band[band[:, 0] < x[-1], 1]) == {10.0, 60.0}
        published = [figure["lines"][label] for label in ("ours: 100.00", "theirs: 80.00")]
        assert ([(level.tolist(), style) for _, level, style in published]
                == [([100.0] * 2, "--"), ([80.0] * 2, ":")])
    # no published numbers
    assert list(figures["demo/Acrobot-v1.png"]["lines"]) == ["demo, mean of 1 seed(s)"]
    assert figures["demo/Acrobot-v1-time.png"]["xlabel"] == "wall time (seconds)"


def test_variants_reports_only_those_and_each_page_lists_only_its_own_left_out_runs(
        tmp_path, capsys):
    """--variants writes the pages of the variants named, and no other (a report of one family must
    not rewrite another's page from older runs); a page's "Runs left out" lists that variant's runs
    only, and a page without such a run has no such list."""
    runs = tmp_path / "runs"
    for variant in ("demo", "other", "third"):
        write_run(runs, "CartPole-v1", variant, 1, 100, 1000, [(1000, 50.0)])
    for variant in ("demo", "third"):
        write_run(runs, "CartPole-v1", variant, 2, 100, 1000, [(500, 5.0)], last_step=500)
    out = tmp_path / "out"
    arguments = ["--runs-dir", str(runs), "--out-dir", str(out), "--baselines", "/dev/null"]
    assert report.main([*arguments, "--variants", "demo", "other"]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["demo", "demo.md", "index.md",
                                                           "other", "other.md"]
    pages = re.findall(r"^\S+\.md$", capsys.readouterr().out, re.MULTILINE)
    assert pages == [str(out / "demo.md"), str(out / "other.md")]
    left_out = (out / "demo.md").read_text().split("Runs left out:")[1].split("##")[0]
    assert re.findall(r"`([^`]+)`", left_out) == ["CartPole-v1__demo__2__100"]
    assert "Runs left out" not in (out / "other.md").read_text()
    expect_usage_error(capsys, lambda: report.main([*arguments, "--variants", "nope"]), "report.py",
                       "no complete runs of nope under")


@pytest.mark.parametrize("value, expected", [
    (89.99, "below"), (90.0, "within"), (100.0, "within"), (110.0, "within"), (110.01, "above"),
    (math.nan, "no data"),
])
def test_status_against_the_published_band(value, expected):
    assert report.classify(value, mean=100.0, std=10.0) == expected


def test_status_with_a_zero_width_band():
    assert report.classify(-200.0, mean=-200.0, std=0.0) == "within"
    assert report.classify(-199.5, mean=-200.0, std=0.0) == "above"
    assert report.classify(-200.5, mean=-200.0, std=0.0) == "below"


def test_report_without_runs_says_so_and_writes_nothing(tmp_path):
    (tmp_path / "runs").mkdir()
    result = run_tool("report.py", "--runs-dir", "runs", "--out-dir", "out", cwd=tmp_path)
    expect_error_line(result, "report.py", "no complete runs under runs, nothing written",
                      "--include-incomplete")
    assert not (tmp_path / "out").exists()
    result = run_tool("report.py", "--runs-dir", "nowhere", "--out-dir", "out", cwd=tmp_path)
    expect_error_line(result, "report.py", "no runs directory nowhere")



def test_report_without_matplotlib_says_which_extra_to_install(tmp_path):
    # an import of matplotlib fails, as in an install without it
    hiding = tmp_path / "hiding" / "matplotlib"
    hiding.mkdir(parents=True)
    (hiding / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    (tmp_path / "runs").mkdir()
    result = run_tool("report.py", "--runs-dir", "runs", "--out-dir", "out", cwd=tmp_path,
                      env={"PYTHONPATH": str(hiding.parent)})
    expect_error_line(result, "report.py", "matplotlib is not installed",
                      'pip install -e ".[benchmark]"')
    assert not (tmp_path / "out").exists()

INCOMPLETE_BASELINE = """
[variants.ppo]
[[variants.ppo.envs]]
env_id = "CartPole-v1"
ours = { mean = 492.4, std = 13.05 }
reference = { mean = 497.54 }
"""


@pytest.mark.parametrize("options, fragment", [
    (["--baselines", "missing.toml"],
     "cannot read the baselines file missing.toml (No such file or directory)"),
    (["--baselines", "broken.toml"], "the baselines file broken.toml is not valid TOML"),
    (["--baselines", "incomplete.toml"],
     "env 1 of variant 'ppo' (CartPole-v1) lacks reference.std"),
    (["--out-dir", "a-file"], "--out-dir a-file is a file"),
])
def test_report_refuses_wrong_input_before_writing(tmp_path, options, fragment):
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "ppo", 1, 100, 1000, [(1000, 50.0)])
    (tmp_path / "broken.toml").write_text("[variants.ppo\n")
    (tmp_path / "incomplete.toml").write_text(INCOMPLETE_BASELINE)
    (tmp_path / "a-file").write_text("")
    result = run_tool("report.py", "--runs-dir", "runs",
                      *(["--out-dir", "out"] if "--out-dir" not in options else []),
                      *options, cwd=tmp_path)
    expect_error_line(result, "report.py", fragment)
    assert not (tmp_path / "out").exists()


def test_report_names_the_baselines_file_it_used(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "ppo", 1, 100, 1000, [(1000, 50.0)])
    mine = tmp_path / "my baselines.toml"
    shutil.copy(REPO / "benchmark" / "baselines.toml", mine)
    for baselines, named in [(report.DEFAULT_BASELINES,
                              "**Baselines** from `benchmark/baselines.toml`"),
                             (mine, f"**Baselines** from `{mine}`"),
                             (Path("/dev/null"),
                              "No comparison: made with `--baselines /dev/null`")]:
        report.build_report(runs, tmp_path / "out", baselines_path=baselines)
        assert named in (tmp_path / "out" / "ppo.md").read_text()


def test_docs_results_is_what_the_report_makes_of_the_committed_logs(tmp_path):
    """`python benchmark/report.py` rewrites docs/results/ from benchmark/logs/runs/, its defaults.
    Made again from the same logs, on any machine and at any time, every page and plot is the
    committed one byte for byte, so `git diff` stays empty: a page names the logs by their path in
    the repository, not by where this checkout lies, and holds no clock."""
    assert report.main(["--out-dir", str(tmp_path)]) == 0
    committed = REPO / "docs" / "results"

    def files_under(folder: Path) -> list[Path]:
        return sorted(path.relative_to(folder) for path in folder.rglob("*") if path.is_file())

    assert files_under(tmp_path) == files_under(committed)
    assert (tmp_path / "ppo.md").read_text().splitlines()[2] == \
        "Made by `benchmark/report.py` from the TensorBoard logs in `benchmark/logs/runs`."
    differ = [str(path) for path in files_under(committed)
              if (tmp_path / path).read_bytes() != (committed / path).read_bytes()]
    assert not differ, ("made again from benchmark/logs/runs/, these differ from "
                        f"docs/results/: {differ}")


def test_a_page_names_what_lies_in_the_repository_by_its_path_there(monkeypatch):
    """However the path is given (absolute, or relative to another folder than the root), what lies
    in the repository is named from its root; what lies outside it, as it was given."""
    monkeypatch.chdir(REPO / "docs")
    for given in (REPO / "benchmark" / "logs" / "runs", Path("../benchmark/logs/runs")):
        assert repository_name(given) == "benchmark/logs/runs"
    assert repository_name(Path("/dev/null")) == "/dev/null"


# --------------------------------------------------------------------------------------------------
# ppo.sh
# --------------------------------------------------------------------------------------------------


def test_ppo_sh_lists_the_families():
    result = run_tool("ppo.sh", cwd=REPO)
    assert result.returncode == 0, result.stderr
    for family in ("classic", "atari", "lstm", "envpool", "mujoco", "procgen", "multigpu", "quick"):
        assert re.search(rf"^\s+{family}\s+(ready|missing)", result.stdout, re.MULTILINE), family
    assert ("torchrun --standalone --nnodes=1 --nproc_per_node=2 ppo/ppo_atari_multigpu.py"
            in result.stdout)


def test_ppo_sh_dry_run_of_a_family(tmp_path):
    result = run_tool("ppo.sh", "--dry-run", "classic", cwd=REPO)
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if "--seed" in line]
    assert len(commands) == 9
    for env_id in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
        for seed in (1, 2, 3):
            assert any(f"ppo.py --total-timesteps 500000 --env-id {env_id} --seed {seed}" in line
                       for line in commands)
    assert all(line.startswith("(cd benchmark/logs && ") for line in commands)


def test_ppo_sh_skips_a_family_whose_script_is_missing(tmp_path):
    """Run from a checkout that has ppo.sh but not the family's script: the family is skipped with a
    line saying why, and nothing runs."""
    (tmp_path / "benchmark").mkdir()
    (tmp_path / "ppo").mkdir()
    (tmp_path / "benchmark" / "ppo.sh").write_text((REPO / "benchmark" / "ppo.sh").read_text())
    result = subprocess.run(["bash", str(tmp_path / "benchmark" / "ppo.sh"), "--dry-run", "mujoco"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=HUNG_AFTER,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    assert "mujoco: skipped, ppo/ppo_continuous_action.py is missing" in result.stdout
    assert "== report" not in result.stdout


def test_ppo_sh_stops_at_a_ctrl_c_that_run_py_caught(tmp_path):
    """run.py catches Ctrl-C, stops its runs and exits 130; bash, not having seen the signal, would
    go on to the next family and the report. ppo.sh stops there, with that code. A stand-in for
    Python records what ppo.sh starts and exits as run.py does after a Ctrl-C."""
    started = tmp_path / "started.txt"
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\necho "$*" >> {started}\nexit 130\n')
    stand_in.chmod(0o755)
    result = subprocess.run(["bash", "benchmark/ppo.sh", "classic", "mujoco"], cwd=REPO,
                            capture_output=True, text=True, timeout=HUNG_AFTER,
                            env={**os.environ, "PYTHON": str(stand_in)})
    assert result.returncode == 130, result.stdout + result.stderr
    lines = started.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("benchmark/run.py --env-ids CartPole-v1"), lines
    assert "== report" not in result.stdout


def test_ppo_sh_refuses_an_unknown_family_or_option():
    result = run_tool("ppo.sh", "--dry-run", "classic", "nonsense", cwd=REPO)
    expect_error_line(result, "ppo.sh", "unknown family 'nonsense'",
                      only_line=False)  # after the list
    assert "--seed" not in result.stdout  # nothing ran before the check
    result = run_tool("ppo.sh", "--bogus", "classic", cwd=REPO)
    expect_error_line(result, "ppo.sh", "unknown option '--bogus'", "--help")
    assert "--seed" not in result.stdout


# --------------------------------------------------------------------------------------------------
# Quick mode: the real pipeline, ppo.py on CartPole-v1 and Acrobot-v1, 2 seeds, 2048 steps
# --------------------------------------------------------------------------------------------------


def test_quick_mode_keeps_logs_and_markers(quick_dir):
    assert_quick_runs_finished(quick_dir)


def test_quick_report_numbers_match_the_tensorboard_logs(quick_dir):
    """Recompute the table from the raw scalars: final return = mean of the episodic returns logged
    in the last 10% of a run's steps; then mean and (ddof=0) std over seeds; SPS = last SPS
    point."""
    page = (quick_dir / "results" / "ppo.md").read_text()
    rows = {row["env"]: row for row in table_rows(page, "env")}
    assert list(rows) == ["CartPole-v1", "Acrobot-v1"]  # the source table's order
    for env_id, published in [("CartPole-v1", "492.40 ± 13.05"), ("Acrobot-v1", "-89.93 ± 6.34")]:
        finals, sps = [], []
        for run_dir in sorted((quick_dir / "runs").glob(f"{env_id}__ppo__*")):
            scalars = read_scalars(run_dir)
            last_step = max(step for points in scalars.values() for step, _ in points)
            assert last_step == 2048
            late = [value for step, value in scalars["charts/episodic_return"]
                    if step > 0.9 * last_step]
            assert late, "the quick budget should end episodes in the last 10% of steps"
            finals.append(sum(late) / len(late))
            sps.append(scalars["charts/SPS"][-1][1])
        assert len(finals) == 2
        row = rows[env_id]
        assert row[FINAL_RETURN] == f"{np.mean(finals):.2f} ± {np.std(finals):.2f}"
        assert row["seeds"] == "2" and row["steps per run"] == "2,048"
        assert row["mean SPS"] == f"{np.mean(sps):,.0f}"
        assert row["baseline: ppo.py (CleanRL)"] == published
        assert row["status"] == report.classify(float(np.mean(finals)),
                                                *map(float, published.split(" ± ")))
    assert "measured after 500,000 steps; these runs used 2,048" in page


def test_quick_report_names_the_releases_the_runs_ran_on(quick_dir):
    """ppo.py's runs log the releases of Python, PyTorch, gymnasium and NumPy, and no environment
    package that classic control does not import; the page names them."""
    from importlib.metadata import version

    page = (quick_dir / "results" / "ppo.md").read_text()
    assert software(page) == [f"Every run above: python {platform.python_version()}, torch "
                              f"{version('torch')}, gymnasium {version('gymnasium')}, numpy "
                              f"{version('numpy')}."]


def test_quick_report_embeds_valid_plots(quick_dir):
    import matplotlib.image

    results = quick_dir / "results"
    page = (results / "ppo.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert sorted(images) == sorted(f"ppo/{env}{suffix}.png"
                                    for env in ("CartPole-v1", "Acrobot-v1")
                                    for suffix in ("", "-time"))
    for image in images:
        path = results / image  # relative to the page
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = matplotlib.image.imread(path)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0  # not a blank canvas


def test_rerunning_quick_mode_skips_the_finished_runs(quick_dir):
    result = run_tool("run.py", "--quick", "--quick-dir", str(quick_dir), cwd=quick_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 run(s): 0 ran ok, 4 skipped (finished earlier), 0 failed" in result.stdout
    assert len(list((quick_dir / "runs").iterdir())) == 4  # no new training run


# --------------------------------------------------------------------------------------------------
# benchmark/'s layout: a command a file, its parts in a folder, the logs apart, 100 characters a
# line
# --------------------------------------------------------------------------------------------------

BENCHMARK = REPO / "benchmark"
# benchmark/'s top holds the commands and what they share; each command's parts are in its folder
# (the runner's in runner/, the report's in reporter/, speed's in timer/, the tuner's in tuner/).
COMMANDS = {"run.py", "report.py", "speed.py", "tune.py", "cleaner_references.py"}
SHARED = {"common.py"}


def code_files() -> list[Path]:
    """benchmark/'s code and settings: its Python, shell and TOML files, the logs left aside."""
    return sorted(path for path in BENCHMARK.rglob("*") if path.suffix in (".py", ".sh", ".toml")
                  and path.is_file() and BENCHMARK / "logs" not in path.parents)


def test_benchmark_holds_a_command_a_file_and_its_parts_in_a_folder():
    assert {path.name for path in BENCHMARK.glob("*.py")} == COMMANDS | SHARED
    for folder in ("runner", "reporter", "timer", "tuner"):
        assert list((BENCHMARK / folder).glob("*.py")), f"benchmark/{folder}/ holds no module"


def test_the_logs_behind_the_docs_lie_in_benchmark_logs_alone():
    """The TensorBoard logs behind docs/results/ and docs/notes/ are kept apart from the code."""
    events = list(BENCHMARK.rglob("events.out.tfevents.*"))
    assert events and all(BENCHMARK / "logs" in path.parents for path in events)


def test_no_line_of_benchmark_code_is_over_100_characters():
    long_lines = [f"{path.relative_to(REPO)}:{number}" for path in code_files()
                  for number, line in enumerate(path.read_text().splitlines(), start=1)
                  if len(line) > 100]
    assert not long_lines, long_lines


def test_ruff_finds_nothing_in_benchmark():
    """pyproject.toml's [tool.ruff] (ppo/'s line length, pycodestyle and pyflakes) holds benchmark/
    too, as it holds ppo/ and ppo_utils/ (tests/test_layout.py)."""
    pytest.importorskip("ruff", reason="ruff comes with the test extra")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "benchmark"],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No Python files found" not in result.stderr  # benchmark/ is in ruff's include
