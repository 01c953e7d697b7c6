"""The benchmark suite: the runner, the published baselines, the report and its plots, ppo.sh, and the
quick mode that runs the whole pipeline for real on a tiny budget."""

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmark import report
from conftest import (FAKE_SCRIPT, REPO, assert_quick_runs_finished, calls, expect_error_line, read_scalars, run_tool,
                      table_rows)

SEED_DOCUMENT = REPO.parent / "shared" / "seeds" / "000_858a261d7ff62938.txt"

# Every row of the result tables of the source document (Huang et al. 2022 numbers and the document's
# own), in its order: variant, row name as printed, own column (mean, std), comparison column (mean, std).
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


# ---------------------------------------------------------------------------------------------------
# The runner, with a stand-in script: fast, and no training
# ---------------------------------------------------------------------------------------------------

def test_runner_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    result = run_tool("run.py", "--env-ids", "A-v1", "B-v0", "--command", "python fake.py --extra x",
                      "--num-seeds", "2", "--start-seed", "5", "--dry-run", cwd=tmp_path)
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
    result = run_tool("run.py", "--env-ids", "A-v1", "--command", "python fake.py", "--num-seeds", "1",
                      "--log-dir", "bench logs", "--dry-run", cwd=tmp_path)
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
    args = ["--env-ids", "A-v1", "ALE/B-v5", "--command", "python fake.py", "--num-seeds", "2", "--workers", "2"]
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
    result = run_tool("run.py", "--env-ids", "A-v1", "--command", "python fake.py", "--num-seeds", "1",
                      "--workdir", "work", "--log-dir", "logs", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls(tmp_path / "work") == ["A-v1 1"]  # fake.py was found although the run started in work/
    assert (tmp_path / "logs" / "fake" / "A-v1__seed1.done").is_file()

    # A program given by a relative path, too, is read from where run.py runs, not from --workdir.
    launcher = f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / "fake.py"))} "$@"\n'
    (tmp_path / "fake-launcher").write_text(launcher)
    (tmp_path / "fake-launcher").chmod(0o755)
    result = run_tool("run.py", "--env-ids", "B-v1", "--command", "./fake-launcher", "--num-seeds", "1",
                      "--workdir", "work", "--log-dir", "logs", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls(tmp_path / "work") == ["A-v1 1", "B-v1 1"]


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
    assert calls(tmp_path) == [] and not (tmp_path / "benchmark").exists()  # refused before anything ran


@pytest.mark.parametrize("options, fragment", [
    (["--workdir", "a-file"], "a-file (--workdir) is a file: give a directory"),
    (["--log-dir", "a-file"], "a-file (--log-dir) is a file: give a directory"),
    (["--log-dir", "a-file/logs"], "cannot make the directory a-file/logs (--log-dir): Not a directory"),
    (["--workdir", "a-file", "--dry-run"], "a-file (--workdir) is a file"),
    (["--log-dir", "a-file", "--slurm", "--dry-run"], "cannot make the directory a-file/slurm (--log-dir)"),
])
def test_runner_refuses_a_file_for_a_directory(tmp_path, options, fragment):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    (tmp_path / "a-file").write_text("")
    result = run_tool("run.py", "--env-ids", "A-v1", "--command", "python fake.py", *options, cwd=tmp_path)
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
    (["--quick", "--command", "python fake.py", "--num-seeds", "5"], "--command, --num-seeds: not with --quick"),
    (["--quick", "--workdir", "w", "--log-dir", "l", "--start-seed", "3"],
     "--start-seed, --workdir, --log-dir: not with --quick"),
    (["--env-ids", "A-v1", "--command", "python fake.py", "--quick-dir", "q"], "--quick-dir: only with --quick"),
])
def test_runner_refuses_options_that_would_be_ignored(tmp_path, options, fragment):
    result = run_tool("run.py", *options, cwd=tmp_path)
    expect_error_line(result, "run.py", fragment, only_line=False)  # argparse prints its usage first
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------------


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
            found.append((variant, env.get("table_env", env["env_id"]), env["ours"]["mean"], env["ours"]["std"],
                          env["reference"]["mean"], env["reference"]["std"]))
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
    # envpool's v5 ids against the table's NoFrameskip-v4 rows; its comparison column is ppo_atari.py.
    entry, row = report.find_baseline(baselines, "ppo_atari_envpool", "Breakout-v5")
    assert row["table_env"] == "BreakoutNoFrameskip-v4" and row["ours"] == {"mean": 389.57, "std": 29.62}
    assert "ppo_atari.py" in entry["reference_label"] and entry["reference_minutes"] == 220
    entry, row = report.find_baseline(baselines, "ppo_atari_multigpu", "BeamRiderNoFrameskip-v4")
    assert row["ours"] == {"mean": 2454.54, "std": 740.49} and entry["ours_minutes"] == 160
    assert report.find_baseline(baselines, "ppo", "Pong-v5") == (baselines["variants"]["ppo"], None)
    assert report.find_baseline(baselines, "nope", "CartPole-v1") == (None, None)


@pytest.mark.skipif(not SEED_DOCUMENT.exists(), reason="the source document is not in this checkout")
def test_published_table_above_is_the_whole_source_document():
    """Cross-check PUBLISHED (and so baselines.toml) against every table row of the source document."""
    sections = {"ppo.py": "ppo", "ppo_atari.py": "ppo_atari", "ppo_continuous_action.py": "ppo_continuous_action",
                "ppo_atari_lstm.py": "ppo_atari_lstm", "ppo_atari_envpool.py": "ppo_atari_envpool",
                "ppo_procgen.py": "ppo_procgen", "ppo_atari_multigpu.py": "ppo_atari_multigpu"}
    number = r"(-?\d+(?:\.\d+)?)\s*±\s*(\d+(?:\.\d+)?)"
    row_pattern = re.compile(rf"^\|\s*([^|]+?)\s*\|\s*{number}\s*\|\s*{number}")
    variant, rows = None, []
    for line in SEED_DOCUMENT.read_text().splitlines():
        heading = re.match(r"^## `([\w.]+)`", line)
        if heading:
            variant = sections[heading.group(1)]
        match = row_pattern.match(line)
        if match:
            rows.append((variant, match.group(1), *map(float, match.groups()[1:])))
    assert sorted(rows) == sorted(PUBLISHED)


# ---------------------------------------------------------------------------------------------------
# The report, on hand-made TensorBoard logs with known numbers
# ---------------------------------------------------------------------------------------------------


def write_run(runs_dir: Path, env_id: str, exp_name: str, seed: int, started: int, total_timesteps: int,
              episodes: list[tuple[int, float]], last_step: int | None = None, batch_size: int = 100) -> Path:
    """A run directory as the scripts write it: hyperparameters text, episodic returns, SPS per batch."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = runs_dir / f"{env_id}__{exp_name}__{seed}__{started}"
    writer = SummaryWriter(str(run_dir))
    params = {"exp_name": exp_name, "seed": seed, "env_id": env_id, "total_timesteps": total_timesteps,
              "batch_size": batch_size}
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in params.items()))
    now = time.time()
    for step, value in episodes:
        writer.add_scalar("charts/episodic_return", value, step, walltime=now + step / 1000)
    last_step = total_timesteps if last_step is None else last_step
    for step in range(batch_size, last_step + 1, batch_size):
        writer.add_scalar("charts/SPS", step // 10, step, walltime=now + step / 1000)
    writer.close()
    return run_dir


def test_report_uses_the_newest_complete_run_per_seed(tmp_path):
    runs = tmp_path / "runs"
    early = [(100, -500.0), (500, -300.0)]
    write_run(runs, "Acrobot-v1", "ppo", 1, 100, 1000, early + [(950, -1.0), (1000, -3.0)])  # superseded
    write_run(runs, "Acrobot-v1", "ppo", 1, 200, 1000, early + [(850, -99.0), (950, -80.0), (1000, -90.0)])
    write_run(runs, "Acrobot-v1", "ppo", 1, 300, 1000, early, last_step=500)  # newest, but incomplete
    write_run(runs, "Acrobot-v1", "ppo", 2, 150, 1000, early + [(920, -100.0), (990, -110.0), (1000, -120.0)])
    write_run(runs, "Acrobot-v1", "ppo", 3, 160, 1000, early, last_step=600)  # no complete run: no seed 3
    write_run(runs, "Acrobot-v1", "ppo", 2, 400, 100, [(100, -500.0)])  # newest, complete, but a short trial
    write_run(runs, "Hopper-v4", "ppo_continuous_action", 1, 100, 1000, [(400, 10.0), (1000, 2300.0)])
    write_run(runs, "ALE/Pong-v5", "mine", 1, 100, 1000, [(300, -21.0)])  # nested dir, no baseline

    out = tmp_path / "results"
    rows = report.build_report(runs, out)
    assert set(rows) == {"ppo", "ppo_continuous_action", "mine"}

    (acrobot,) = rows["ppo"]
    assert [run.path.name for run in acrobot.runs] == ["Acrobot-v1__ppo__1__200", "Acrobot-v1__ppo__2__150"]
    # Final returns: the episodes after step 900 (the last 10% of 1000 steps).
    assert acrobot.values.tolist() == [-85.0, -110.0]
    assert acrobot.mean == -97.5 and acrobot.std == 12.5
    assert acrobot.status == "below"  # -97.5 < -89.93 - 6.34

    page = (out / "ppo.md").read_text()
    (row,) = table_rows(page, "env")
    assert row["env"] == "Acrobot-v1"
    assert row["seeds"] == "2" and row["steps per run"] == "1,000"
    assert row["final return, mean ± std over seeds (last 10% of steps)"] == "-97.50 ± 12.50"
    assert row["mean SPS"] == "100"
    assert row["baseline: ppo.py (source document)"] == "-89.93 ± 6.34"
    assert row["openai/baselines' PPO (Huang et al. 2022)"] == "-81.82 ± 5.58"
    assert row["status"] == "below"
    left_out = page.split("Runs left out:")[1]
    assert "Acrobot-v1__ppo__1__300`: incomplete (reached step 500 of 1,000)" in left_out
    assert "Acrobot-v1__ppo__1__100`: a newer complete run of the same seed exists" in left_out
    assert "Acrobot-v1__ppo__3__160`: incomplete" in left_out
    assert "Acrobot-v1__ppo__2__400`: a complete run of the same seed with a larger budget exists" in left_out
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
    import matplotlib.axes

    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "ppo", 1, 100, 1000, [(950, 40.0), (1000, 60.0)])
    write_run(runs, "CartPole-v1", "ppo", 2, 100, 1000, [])  # no episode ended in the whole run
    write_run(runs, "Acrobot-v1", "ppo", 1, 100, 1000, [])
    out = tmp_path / "results"
    curve_labels, plot = [], matplotlib.axes.Axes.plot

    def plot_and_note_the_label(axes, *data, **style):
        curve_labels.append(style.get("label"))
        return plot(axes, *data, **style)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot_and_note_the_label)
    rows = {row.env_id: row for row in report.build_report(runs, out)["ppo"]}
    # The plots' legends count the seeds the mean curve averages: those in which an episode ended.
    assert curve_labels.count("ppo, mean of 1 seed(s) (1 without an episode left out)") == 2  # step, time
    assert curve_labels.count("ppo, mean of 0 seed(s) (1 without an episode left out)") == 2
    assert rows["CartPole-v1"].values.tolist() == [50.0] and rows["CartPole-v1"].seeds_without_episodes == [2]
    assert rows["Acrobot-v1"].status == "no data"

    page = (out / "ppo.md").read_text()
    table = {row["env"]: row for row in table_rows(page, "env")}
    band = "final return, mean ± std over seeds (last 10% of steps)"
    assert table["CartPole-v1"][band] == "50.00 ± 0.00†" and table["CartPole-v1"]["seeds"] == "2"
    assert table["Acrobot-v1"][band] == "n/a†"
    assert "nan" not in page
    assert "† leave out a run in which no episode ended" in page
    assert (out / "ppo" / "CartPole-v1.png").is_file() and (out / "ppo" / "Acrobot-v1.png").is_file()


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
    write_run(runs, "CartPole-v1", "demo", 1, 100, 1000, [(10, 1.0), (100, 3.0), (300, 7.0), (1000, 50.0)])
    # Seed 2: one episode in each of the first and third tenths, and one in the last.
    write_run(runs, "CartPole-v1", "demo", 2, 100, 1000, [(40, 6.0), (250, 9.0), (950, 100.0)])
    out = tmp_path / "results"
    (row,) = report.build_report(runs, out)["demo"]
    spans = report.progress(row)
    assert [(first, last) for first, last, _, _ in spans[:3]] == [(0, 100), (100, 200), (200, 300)]
    # The first tenth: seed 1's mean (1 + 3) / 2 = 2 and seed 2's 6, so (2 + 6) / 2 = 4, from 3 episodes.
    assert spans[0][2:] == (4.0, 3)
    assert math.isnan(spans[1][2]) and spans[1][3] == 0
    assert spans[2][2:] == (8.0, 2)  # step 300 ends the third tenth, (200, 300]
    assert spans[9][2:] == (75.0, 2)
    page = (out / "demo.md").read_text()
    progress_rows = table_rows(page, "steps")
    assert progress_rows[0] == {"steps": "0-100", "mean return": "4.00", "episodes": "3"}
    assert progress_rows[1]["mean return"] == "n/a"
    assert progress_rows[9]["steps"] == "900-1k"


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
    expect_error_line(result, "report.py", "no complete runs under runs, nothing written", "--include-incomplete")
    assert not (tmp_path / "out").exists()
    result = run_tool("report.py", "--runs-dir", "nowhere", "--out-dir", "out", cwd=tmp_path)
    expect_error_line(result, "report.py", "no runs directory nowhere")


INCOMPLETE_BASELINE = """
[variants.ppo]
[[variants.ppo.envs]]
env_id = "CartPole-v1"
ours = { mean = 492.4, std = 13.05 }
reference = { mean = 497.54 }
"""


@pytest.mark.parametrize("options, fragment", [
    (["--baselines", "missing.toml"], "cannot read the baselines file missing.toml (No such file or directory)"),
    (["--baselines", "broken.toml"], "the baselines file broken.toml is not valid TOML"),
    (["--baselines", "incomplete.toml"], "env 1 of variant 'ppo' (CartPole-v1) lacks reference.std"),
    (["--out-dir", "a-file"], "--out-dir a-file is a file"),
])
def test_report_refuses_wrong_input_before_writing(tmp_path, options, fragment):
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "ppo", 1, 100, 1000, [(1000, 50.0)])
    (tmp_path / "broken.toml").write_text("[variants.ppo\n")
    (tmp_path / "incomplete.toml").write_text(INCOMPLETE_BASELINE)
    (tmp_path / "a-file").write_text("")
    result = run_tool("report.py", "--runs-dir", "runs", *(["--out-dir", "out"] if "--out-dir" not in options else []),
                      *options, cwd=tmp_path)
    expect_error_line(result, "report.py", fragment)
    assert not (tmp_path / "out").exists()


def test_report_names_the_baselines_file_it_used(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "CartPole-v1", "ppo", 1, 100, 1000, [(1000, 50.0)])
    mine = tmp_path / "my baselines.toml"
    shutil.copy(REPO / "benchmark" / "baselines.toml", mine)
    for baselines, named in [(report.DEFAULT_BASELINES, "**Baselines** from `benchmark/baselines.toml`"),
                             (mine, f"**Baselines** from `{mine}`"),
                             (Path("/dev/null"), "No comparison: made with `--baselines /dev/null`")]:
        report.build_report(runs, tmp_path / "out", baselines_path=baselines)
        assert named in (tmp_path / "out" / "ppo.md").read_text()


# ---------------------------------------------------------------------------------------------------
# ppo.sh
# ---------------------------------------------------------------------------------------------------


def test_ppo_sh_lists_the_families():
    result = run_tool("ppo.sh", cwd=REPO)
    assert result.returncode == 0, result.stderr
    for family in ("classic", "atari", "lstm", "envpool", "mujoco", "procgen", "multigpu", "quick"):
        assert re.search(rf"^\s+{family}\s+(ready|missing)", result.stdout, re.MULTILINE), family
    assert "torchrun --standalone --nnodes=1 --nproc_per_node=2 ppo/ppo_atari_multigpu.py" in result.stdout


def test_ppo_sh_dry_run_of_a_family(tmp_path):
    result = run_tool("ppo.sh", "--dry-run", "classic", cwd=REPO)
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if "--seed" in line]
    assert len(commands) == 9
    for env_id in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
        for seed in (1, 2, 3):
            assert any(f"ppo.py --total-timesteps 500000 --env-id {env_id} --seed {seed}" in line
                       for line in commands)
    assert all(line.startswith("(cd benchmark && ") for line in commands)


def test_ppo_sh_skips_a_family_whose_script_is_missing(tmp_path):
    """Run from a checkout that has ppo.sh but not the family's script: the family is skipped with a
    line saying why, and nothing runs."""
    (tmp_path / "benchmark").mkdir()
    (tmp_path / "ppo").mkdir()
    (tmp_path / "benchmark" / "ppo.sh").write_text((REPO / "benchmark" / "ppo.sh").read_text())
    result = subprocess.run(["bash", str(tmp_path / "benchmark" / "ppo.sh"), "--dry-run", "mujoco"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    assert "mujoco: skipped, ppo/ppo_continuous_action.py is missing" in result.stdout
    assert "== report" not in result.stdout


def test_ppo_sh_stops_at_a_ctrl_c_that_run_py_caught(tmp_path):
    """run.py catches Ctrl-C, stops its runs and exits 130; bash, not having seen the signal, would go
    on to the next family and the report. ppo.sh stops there, with that code. A stand-in for Python
    records what ppo.sh starts and exits as run.py does after a Ctrl-C."""
    started = tmp_path / "started.txt"
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\necho "$*" >> {started}\nexit 130\n')
    stand_in.chmod(0o755)
    result = subprocess.run(["bash", "benchmark/ppo.sh", "classic", "mujoco"], cwd=REPO, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHON": str(stand_in)})
    assert result.returncode == 130, result.stdout + result.stderr
    lines = started.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("benchmark/run.py --env-ids CartPole-v1"), lines
    assert "== report" not in result.stdout


def test_ppo_sh_refuses_an_unknown_family_or_option():
    result = run_tool("ppo.sh", "--dry-run", "classic", "nonsense", cwd=REPO)
    expect_error_line(result, "ppo.sh", "unknown family 'nonsense'", only_line=False)  # after the list
    assert "--seed" not in result.stdout  # nothing ran before the check
    result = run_tool("ppo.sh", "--bogus", "classic", cwd=REPO)
    expect_error_line(result, "ppo.sh", "unknown option '--bogus'", "--help")
    assert "--seed" not in result.stdout


# ---------------------------------------------------------------------------------------------------
# Quick mode: the real pipeline, ppo.py on CartPole-v1 and Acrobot-v1, 2 seeds, 2048 steps
# ---------------------------------------------------------------------------------------------------


def test_quick_mode_keeps_logs_and_markers(quick_dir):
    assert_quick_runs_finished(quick_dir)


def test_quick_report_numbers_match_the_tensorboard_logs(quick_dir):
    """Recompute the table from the raw scalars: final return = mean of the episodic returns logged in
    the last 10% of a run's steps; then mean and (ddof=0) std over seeds; SPS = last SPS point."""
    page = (quick_dir / "results" / "ppo.md").read_text()
    rows = {row["env"]: row for row in table_rows(page, "env")}
    assert list(rows) == ["CartPole-v1", "Acrobot-v1"]  # the source table's order
    for env_id, published in [("CartPole-v1", "492.40 ± 13.05"), ("Acrobot-v1", "-89.93 ± 6.34")]:
        finals, sps = [], []
        for run_dir in sorted((quick_dir / "runs").glob(f"{env_id}__ppo__*")):
            scalars = read_scalars(run_dir)
            last_step = max(step for points in scalars.values() for step, _ in points)
            assert last_step == 2048
            late = [value for step, value in scalars["charts/episodic_return"] if step > 0.9 * last_step]
            assert late, "the quick budget should end episodes in the last 10% of steps"
            finals.append(sum(late) / len(late))
            sps.append(scalars["charts/SPS"][-1][1])
        assert len(finals) == 2
        row = rows[env_id]
        assert row["final return, mean ± std over seeds (last 10% of steps)"] == \
            f"{np.mean(finals):.2f} ± {np.std(finals):.2f}"
        assert row["seeds"] == "2" and row["steps per run"] == "2,048"
        assert row["mean SPS"] == f"{np.mean(sps):,.0f}"
        assert row["baseline: ppo.py (source document)"] == published
        assert row["status"] == report.classify(float(np.mean(finals)), *map(float, published.split(" ± ")))
    assert "measured after 500,000 steps; these runs used 2,048" in page


def test_quick_report_embeds_valid_plots(quick_dir):
    import matplotlib.image

    results = quick_dir / "results"
    page = (results / "ppo.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert sorted(images) == sorted(f"ppo/{env}{suffix}.png" for env in ("CartPole-v1", "Acrobot-v1")
                                    for suffix in ("", "-time"))
    for image in images:
        path = results / image  # relative to the page
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = matplotlib.image.imread(path)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0  # not a blank canvas


def test_rerunning_quick_mode_skips_the_finished_runs(quick_dir):
    result = run_tool("run.py", "--quick", "--quick-dir", str(quick_dir), cwd=quick_dir, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 run(s): 0 ran ok, 4 skipped (finished earlier), 0 failed" in result.stdout
    assert len(list((quick_dir / "runs").iterdir())) == 4  # no new training run
