"""The benchmark on Slurm: the job scripts `benchmark/run.py --slurm` writes, what their tasks do,
the errors, and the quick benchmark submitted to a real one-node Slurm cluster on this machine
(skipped, with the reason, where Slurm is not installed: `apt-get install slurm-wlm munge`)."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmark.runner.slurm import fill
from conftest import (FAKE_SCRIPT, HUNG_AFTER, REPO, SLOW_PPO, SLOW_RUNS,
                      assert_quick_runs_finished, assert_same_final_weights, calls,
                      expect_error_line, run_tool, table_rows, wait_for_jobs)
from slurm_cluster import OneNodeCluster

# The stand-in script on two environments (one with a slash in its id) and two seeds: four tasks.
FAKE_ARGS = ["--env-ids", "A-v1", "ALE/B-v5", "--command", "python fake.py --extra x",
             "--num-seeds", "2"]
FAKE_RUNS = [("A-v1", "A-v1", 1), ("A-v1", "A-v1", 2), ("ALE/B-v5", "ALE_B-v5", 1),
             ("ALE/B-v5", "ALE_B-v5", 2)]
SLURM_DIR = Path("benchmark") / "logs" / "slurm"


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def bin_dir(tmp_path: Path, **programs: str) -> dict:
    """Environment variables whose PATH has only the shell tools ppo.sh and the stand-ins use, and
    these stand-in programs ({name: shell script}): no real Slurm command is found."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    for tool in ("dirname", "wc"):
        (directory / tool).symlink_to(shutil.which(tool))
    for name, text in programs.items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return {"PATH": str(directory)}


def submit_fake(tmp_path: Path, *options: str,
                env: dict | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    return run_tool("run.py", *FAKE_ARGS, "--slurm", *options, cwd=tmp_path, env=env)


def run_task(script: Path, index: int, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """Task `index` of the job array `script`, run as Slurm runs it: by bash, in `cwd`, with
    SLURM_ARRAY_TASK_ID (and `env`) set."""
    return subprocess.run(["bash", str(script)], cwd=cwd, capture_output=True, text=True,
                          timeout=HUNG_AFTER,
                          env={**os.environ, "SLURM_ARRAY_TASK_ID": str(index), **env})


# --------------------------------------------------------------------------------------------------
# The job scripts, without Slurm
# --------------------------------------------------------------------------------------------------


def test_job_array_has_a_task_per_run_and_the_resource_lines(tmp_path):
    result = submit_fake(tmp_path, "--dry-run", "--partition", "gpu", "--gpus", "1",
                         "--cpus-per-task", "4", "--time", "2:00:00")
    assert result.returncode == 0, result.stderr
    assert "nothing submitted" in result.stdout and calls(tmp_path) == []
    script = (tmp_path / SLURM_DIR / "fake.sbatch").read_text()
    assert sbatch_lines(script) == [
        '#SBATCH --job-name="ppo-benchmark-fake"',
        f'#SBATCH --output="{(tmp_path / SLURM_DIR).resolve()}/fake_%A_%a.out"',
        "#SBATCH --array=0-3",
        "#SBATCH --partition=gpu",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --time=2:00:00",
        "#SBATCH --signal=B:USR1@120",  # the warning before the time limit: the run saves
    ]
    # The script lists each task's command, in task order, and runs the runner for its own index.
    listed = [line for line in script.splitlines() if line.startswith("#   ")]
    assert len(listed) == len(FAKE_RUNS)
    for index, (line, (env_id, file_name, seed)) in enumerate(zip(listed, FAKE_RUNS)):
        assert line.startswith(f"#   {index}: fake {env_id} seed {seed}: ")
        assert line.endswith(f"fake.py --extra x --env-id {env_id} --seed {seed} --save-model "
                             f"--save-minutes 10 > benchmark/logs/fake/{file_name}__seed{seed}.log")
    assert script.splitlines()[-2] == f"cd {tmp_path}"
    assert script.splitlines()[-1].endswith('--task-index "$SLURM_ARRAY_TASK_ID"')
    # the template's notes and placeholders are gone
    assert "##" not in script and "{" not in script

    report = (tmp_path / SLURM_DIR / "fake-report.sbatch").read_text()
    assert sbatch_lines(report) == [  # no array, no GPU, the default CPU
        '#SBATCH --job-name="ppo-benchmark-report"',
        f'#SBATCH --output="{(tmp_path / SLURM_DIR).resolve()}/fake-report_%j.out"',
        "#SBATCH --partition=gpu",
        "#SBATCH --time=2:00:00",
    ]
    assert report.splitlines()[-1].endswith("benchmark/report.py --runs-dir runs --out-dir results")


def test_requeue_and_the_warning_before_the_time_limit(tmp_path):
    """--requeue makes the tasks requeueable, their output go on in the same file after a requeue,
    and each task's runner requeue itself when warned; --warning-seconds sets how early the warning
    comes."""
    result = submit_fake(tmp_path, "--dry-run", "--time", "1:00:00", "--requeue",
                         "--warning-seconds", "300", "--save-minutes", "2.5")
    assert result.returncode == 0, result.stderr
    script = (tmp_path / SLURM_DIR / "fake.sbatch").read_text()
    assert sbatch_lines(script)[-4:] == ["#SBATCH --time=1:00:00", "#SBATCH --signal=B:USR1@300",
                                         "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    assert "--save-minutes 2.5 " in script.splitlines()[-1]
    assert script.splitlines()[-1].endswith('--requeue --task-index "$SLURM_ARRAY_TASK_ID"')
    report = (tmp_path / SLURM_DIR / "fake-report.sbatch").read_text()
    assert not [line for line in sbatch_lines(report)
                if line.startswith(("#SBATCH --signal", "#SBATCH --requeue"))]


def test_each_task_does_its_run_as_the_local_runner_and_finished_runs_are_left_out(tmp_path):
    assert submit_fake(tmp_path, "--dry-run").returncode == 0
    script = tmp_path / SLURM_DIR / "fake.sbatch"
    # Slurm may start the job anywhere: the script goes back itself
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for task in (1, 3):
        task_run = run_task(script, task, cwd=elsewhere)
        assert task_run.returncode == 0, task_run.stdout + task_run.stderr
        assert "1 run(s): 1 ran ok" in task_run.stdout
    assert calls(tmp_path) == ["A-v1 2", "ALE/B-v5 2"]
    logs = tmp_path / "benchmark" / "logs" / "fake"
    for name in ("A-v1__seed2", "ALE_B-v5__seed2"):
        assert (logs / f"{name}.done").is_file()
        assert "OMP_NUM_THREADS=1" in (logs / f"{name}.log").read_text()

    # The local runner takes the tasks' runs for its own: it does only the other two.
    (tmp_path / "calls.txt").unlink()
    local = run_tool("run.py", *FAKE_ARGS, cwd=tmp_path)
    assert "4 run(s): 2 ran ok, 2 skipped (finished earlier), 0 failed" in local.stdout
    assert calls(tmp_path) == ["A-v1 1", "ALE/B-v5 1"]

    # A task whose run finished meanwhile skips it; a new submission leaves finished runs out.
    (tmp_path / "calls.txt").unlink()
    (logs / "A-v1__seed1.done").unlink()
    again = run_task(script, 3, cwd=elsewhere)
    assert again.returncode == 0 and "[skip]" in again.stdout and calls(tmp_path) == []
    resubmitted = submit_fake(tmp_path, "--dry-run")
    assert "1 task(s), --array=0; 3 of 4 run(s) finished earlier" in resubmitted.stdout
    assert "#SBATCH --array=0" in script.read_text().splitlines()


def test_force_gives_every_run_a_task_and_the_task_reruns_it(tmp_path):
    """--slurm --force, as --force here, reruns the runs that finished earlier: each gets a task,
    and the task, which would skip a run with a .done marker, runs it again. Were it ignored, a user
    who changed a script but not the command would get the old runs reported."""
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    assert run_tool("run.py", *FAKE_ARGS, cwd=tmp_path).returncode == 0  # every run done here
    (tmp_path / "calls.txt").unlink()
    result = submit_fake(tmp_path, "--dry-run", "--force")
    assert "4 task(s), --array=0-3; 0 of 4 run(s) finished earlier" in result.stdout
    task = run_task(tmp_path / SLURM_DIR / "fake.sbatch", 2, cwd=tmp_path)
    assert "1 run(s): 1 ran ok, 0 skipped" in task.stdout, task.stdout + task.stderr
    assert calls(tmp_path) == ["ALE/B-v5 1"]


def test_a_tasks_run_gets_a_thread_per_cpu_slurm_gave_the_task(tmp_path, monkeypatch):
    """Runs started here get OMP_NUM_THREADS=1, so that parallel runs do not fight over the cores; a
    Slurm task has --cpus-per-task CPUs of its own, and its run as many threads
    (SLURM_CPUS_PER_TASK), else it would use one of them. An OMP_NUM_THREADS the user set is passed
    on as it is, in a task too."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert submit_fake(tmp_path, "--dry-run", "--cpus-per-task", "3").returncode == 0
    script, logs = tmp_path / SLURM_DIR / "fake.sbatch", tmp_path / "benchmark" / "logs" / "fake"
    assert run_task(script, 0, cwd=tmp_path, SLURM_CPUS_PER_TASK="3").returncode == 0
    assert run_task(script, 1, cwd=tmp_path, SLURM_CPUS_PER_TASK="3",
                    OMP_NUM_THREADS="2").returncode == 0
    assert "OMP_NUM_THREADS=3" in (logs / "A-v1__seed1.log").read_text()
    assert "OMP_NUM_THREADS=2" in (logs / "A-v1__seed2.log").read_text()


def test_job_names_and_output_paths_are_quoted_for_sbatch(tmp_path):
    """Unquoted, sbatch ends `--output=` at a space (it refuses the script) and reads a `#` as the
    start of a comment. The runner quotes the values itself, whether the template has the
    placeholder bare (as benchmark/slurm_template.sh, and a site's copy of it) or quoted already."""
    template = (REPO / "benchmark" / "slurm_template.sh").read_text()
    assert "--output={output}" in template
    quoted = template.replace("{output}", '"{output}"').replace("{job_name}", '"{job_name}"')
    (tmp_path / "quoted.sh").write_text(quoted)
    logs = (tmp_path / "bench logs #1").resolve()
    for template_options in ([], ["--slurm-template", "quoted.sh"]):
        result = submit_fake(tmp_path, "--dry-run", "--log-dir", "bench logs #1", *template_options)
        assert result.returncode == 0, result.stderr
        assert sbatch_lines((logs / "slurm" / "fake.sbatch").read_text())[:2] == [
            '#SBATCH --job-name="ppo-benchmark-fake"',
            f'#SBATCH --output="{logs}/slurm/fake_%A_%a.out"']
    # Backslashes and double quotes, which end or escape a quoted value, are escaped.
    filled = fill('#SBATCH --output={output}\n#SBATCH --job-name="{job_name}"\n{command}',
                  {"output": 'a "b"\\c', "job_name": "x y", "command": 'echo "{output}"'})
    assert filled == '#SBATCH --output="a \\"b\\"\\\\c"\n#SBATCH --job-name="x y"\necho "{output}"'


def test_a_percent_sign_in_the_log_directory_is_escaped_for_sbatch(tmp_path):
    """sbatch replaces %j, %A, %a... anywhere in an --output path, the directories included: in a
    log directory named `logs%j` the output would go to `logs<job id>/`, which does not exist, and
    be lost. `%%` is Slurm's escape for a `%` (checked on slurm-wlm 22.05)."""
    result = submit_fake(tmp_path, "--dry-run", "--log-dir", "logs%j")
    assert result.returncode == 0, result.stderr
    slurm_dir = (tmp_path / "logs%j" / "slurm").resolve()
    escaped = str(slurm_dir).replace("%", "%%")
    assert (sbatch_lines((slurm_dir / "fake.sbatch").read_text())[1]
            == f'#SBATCH --output="{escaped}/fake_%A_%a.out"')
    assert sbatch_lines((slurm_dir / "fake-report.sbatch").read_text())[1] == \
        f'#SBATCH --output="{escaped}/fake-report_%j.out"'


def test_a_site_template_keeps_its_own_lines(tmp_path):
    template = (REPO / "benchmark" / "slurm_template.sh").read_text()
    site = template.replace("set -euo pipefail",
                            "#SBATCH --account=rl-lab\nset -euo pipefail\necho ${HOME}")
    (tmp_path / "site.sh").write_text(site)
    assert submit_fake(tmp_path, "--dry-run", "--slurm-template", "site.sh").returncode == 0
    script = (tmp_path / SLURM_DIR / "fake.sbatch").read_text()
    assert "#SBATCH --account=rl-lab" in sbatch_lines(script) and "echo ${HOME}" in script


def test_submission_prints_the_jobs_and_how_to_follow_them(tmp_path):
    # A stand-in sbatch: notes its arguments, answers job ids 41, then 42, as --parsable does.
    fake_sbatch = ('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'
                   'echo "$((40 + $(wc -l < "$(dirname "$0")/calls")));cluster"\n')
    result = submit_fake(tmp_path, env=bin_dir(tmp_path, sbatch=fake_sbatch))
    assert result.returncode == 0, result.stderr
    submitted = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert submitted == [f"--parsable {SLURM_DIR}/fake.sbatch",
                         "--parsable --dependency=afterany:41,singleton "
                         f"{SLURM_DIR}/fake-report.sbatch"]
    assert "submitted job array 41 (4 task(s) of fake)" in result.stdout
    assert "submitted report job 42" in result.stdout
    for hint in ("squeue -j 41,42", "benchmark/logs/fake/<env id>__seed<S>.log",
                 f"{SLURM_DIR}/fake_41_<task>.out", f"{SLURM_DIR}/fake-report_42.out",
                 "report.py --runs-dir runs --out-dir results", "scancel 41 42"):
        assert hint in result.stdout, hint


def test_sbatch_not_found(tmp_path):
    result = submit_fake(tmp_path, env=bin_dir(tmp_path))
    expect_error_line(result, "run.py", "sbatch not found", "without --slurm")
    assert not (tmp_path / SLURM_DIR).exists()  # checked before anything is written


def test_a_refused_submission_shows_slurms_message(tmp_path):
    refuse = ("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid partition name "
              "specified' >&2\nexit 1\n")
    result = submit_fake(tmp_path, "--partition", "nope", env=bin_dir(tmp_path, sbatch=refuse))
    expect_error_line(result, "run.py", "sbatch refused", "Invalid partition name specified",
                      f"the job scripts stay in {SLURM_DIR}")
    assert (tmp_path / SLURM_DIR / "fake.sbatch").is_file()  # to inspect


def test_a_refused_quick_submission_leaves_no_directory_behind(tmp_path):
    """`--slurm --quick` makes a new directory under the repository's benchmark/logs/ for each
    submission, where every node can reach it; when Slurm refuses it, nothing will run there, and it
    is removed: benchmark/logs/ holds what it held before."""
    logs = REPO / "benchmark" / "logs"
    held = lambda: sorted(logs.iterdir()) if logs.is_dir() else []  # noqa: E731
    before = held()
    refuse = ("#!/bin/sh\n"
              "echo 'sbatch: error: Batch job submission failed: Invalid account' >&2\nexit 1\n")
    result = subprocess.run([sys.executable, str(REPO / "benchmark" / "run.py"), "--quick",
                             "--slurm"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=HUNG_AFTER,
                            env={**os.environ, **bin_dir(tmp_path, sbatch=refuse)})
    expect_error_line(result, "run.py", "sbatch refused", "Invalid account",
                      "made for this submission, is removed again")
    assert held() == before


def test_when_every_run_finished_only_the_report_job_is_written(tmp_path):
    assert submit_fake(tmp_path, "--dry-run").returncode == 0
    assert run_tool("run.py", *FAKE_ARGS, cwd=tmp_path).returncode == 0  # every run done here
    result = submit_fake(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "all 4 run(s) finished earlier: no array job, only the report" in result.stdout
    assert (f"removed {SLURM_DIR}/fake.sbatch, the job array of an earlier submission"
            in result.stdout)
    assert sorted(path.name for path in (tmp_path / SLURM_DIR).iterdir()) == ["fake-report.sbatch"]


def test_a_template_without_the_placeholders_is_refused(tmp_path):
    # A placeholder that is only named in a `##` note does not count.
    (tmp_path / "bad.sh").write_text("#!/bin/bash\n## {array_line} {output}\n"
                                     "#SBATCH --job-name={job_name}\n{command}\n")
    result = submit_fake(tmp_path, "--dry-run", "--slurm-template", "bad.sh")
    line = expect_error_line(result, "run.py",
                             "bad.sh lacks {output}, {array_line}, {resource_lines}")
    assert "{job_name}" not in line and "{command}" not in line
    assert not (tmp_path / SLURM_DIR).exists()


@pytest.mark.parametrize("options, fragment", [
    (["--partition", "gpu"], "--partition: only with --slurm"),
    (["--task-index", "4"], "--task-index 4 is out of range: this benchmark has runs 0 to 3"),
])
def test_wrong_slurm_options(tmp_path, options, fragment):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    result = run_tool("run.py", *FAKE_ARGS, *options, cwd=tmp_path)
    # argparse prints its usage first
    expect_error_line(result, "run.py", fragment, only_line=False)


def test_ppo_sh_slurm_dry_run_of_a_family(tmp_path):
    """From a checkout in tmp_path (the repository's files linked in), so nothing is written into
    it."""
    (tmp_path / "benchmark").mkdir()
    for name in ("ppo.sh", "run.py"):
        (tmp_path / "benchmark" / name).symlink_to(REPO / "benchmark" / name)
    (tmp_path / "ppo").symlink_to(REPO / "ppo")
    result = subprocess.run(["bash", "benchmark/ppo.sh", "--slurm", "--dry-run",
                             "--partition", "cpu", "classic"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=HUNG_AFTER,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    script = (tmp_path / SLURM_DIR / "ppo.sbatch").read_text()
    assert ("#SBATCH --array=0-8" in sbatch_lines(script)
            and "#SBATCH --partition=cpu" in sbatch_lines(script))
    assert len([line for line in script.splitlines() if line.startswith("#   ")]) == 9
    assert "--workdir benchmark/logs --log-dir benchmark/logs" in script
    report = (tmp_path / SLURM_DIR / "ppo-report.sbatch").read_text()
    assert report.splitlines()[-1].endswith("--runs-dir benchmark/logs/runs --out-dir docs/results")
    assert "== report: by the report job above once its array is done" in result.stdout

    # Without sbatch, ppo.sh stops with run.py's error and its exit code 2.
    missing = subprocess.run([shutil.which("bash"), "benchmark/ppo.sh", "--slurm", "classic",
                              "mujoco"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=HUNG_AFTER,
                             env={**os.environ, "PYTHON": sys.executable, **bin_dir(tmp_path)})
    assert missing.returncode == 2 and "run.py: error: sbatch not found" in missing.stderr
    assert "== mujoco" not in missing.stdout


def test_ppo_sh_passes_on_requeue_the_warning_and_the_save_interval(tmp_path):
    """ppo.sh gives run.py --requeue, --warning-seconds and --save-minutes: a family submitted with
    them gets the lines and the runs that survive time limits. From a checkout in tmp_path, as
    above."""
    (tmp_path / "benchmark").mkdir()
    for name in ("ppo.sh", "run.py"):
        (tmp_path / "benchmark" / name).symlink_to(REPO / "benchmark" / name)
    (tmp_path / "ppo").symlink_to(REPO / "ppo")
    options = ["--requeue", "--warning-seconds", "300", "--save-minutes=5", "--time", "2:00:00"]
    result = subprocess.run(["bash", "benchmark/ppo.sh", "--slurm", "--dry-run", *options,
                             "classic"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=HUNG_AFTER, env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    script = (tmp_path / SLURM_DIR / "ppo.sbatch").read_text()
    assert {"#SBATCH --signal=B:USR1@300", "#SBATCH --requeue"} <= set(sbatch_lines(script))
    assert "--save-minutes 5 --requeue --task-index" in script.splitlines()[-1]


def test_ppo_sh_reads_the_paths_it_is_given_from_where_it_is_run(tmp_path):
    """ppo.sh works from the repository root, but --slurm-template FILE, PYTHON and BENCH_WORKDIR
    are read from the directory the user runs it in. A checkout in tmp_path, as above."""
    checkout, caller = tmp_path / "checkout", tmp_path / "caller"
    (checkout / "benchmark").mkdir(parents=True)
    for name in ("ppo.sh", "run.py"):
        (checkout / "benchmark" / name).symlink_to(REPO / "benchmark" / name)
    (checkout / "ppo").symlink_to(REPO / "ppo")
    (caller / "bin").mkdir(parents=True)
    (caller / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (caller / "bin" / "python").chmod(0o755)
    template = (REPO / "benchmark" / "slurm_template.sh").read_text()
    for option in (["--slurm-template", "site.sh"], ["--slurm-template=site.sh"]):
        account = f"#SBATCH --account=from-{len(option)}-word-option"
        (caller / "site.sh").write_text(template.replace("set -euo pipefail",
                                                         f"{account}\nset -euo pipefail"))
        result = subprocess.run(["bash", "../checkout/benchmark/ppo.sh", "--slurm", "--dry-run",
                                 *option, "classic"], cwd=caller, capture_output=True, text=True,
                                timeout=HUNG_AFTER,
                                env={**os.environ, "PYTHON": "bin/python", "BENCH_WORKDIR": "work"})
        assert result.returncode == 0, result.stderr
        script = (checkout / SLURM_DIR / "ppo.sbatch").read_text()
        assert account in sbatch_lines(script)
        assert f"--workdir {caller}/work --log-dir benchmark/logs" in script


# --------------------------------------------------------------------------------------------------
# The quick benchmark on a real one-node Slurm cluster
# --------------------------------------------------------------------------------------------------


def measured(page: str) -> list[list[str]]:
    """The table rows of a report page without what depends on the machine and the moment: the SPS,
    wall time and run name columns (a run's name ends in its start time)."""
    rows, keep = [], None
    for line in page.splitlines():
        if not line.startswith("|"):
            keep = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if keep is None:  # a table's header
            keep = [i for i, cell in enumerate(cells)
                    if "SPS" not in cell and "wall time" not in cell and cell != "run"]
        rows.append([cells[i] for i in keep])
    return rows


def test_quick_benchmark_on_a_one_node_slurm_cluster(slurm_cluster, quick_dir, tmp_path):
    # A space and a %j in the path: sbatch has to read the quoted `#SBATCH --output=` line whole,
    # and leave the directory's own %j as it is.
    workdir = tmp_path / "quick benchmark %j"
    workdir.mkdir()
    result = run_tool("run.py", "--quick", "--slurm", "--quick-dir", str(workdir),
                      "--cpus-per-task", "1", cwd=workdir, env=slurm_cluster.environment())
    assert result.returncode == 0, result.stdout + result.stderr
    array_job = re.search(r"submitted job array (\d+) \(4 task\(s\) of ppo\)",
                          result.stdout).group(1)
    report_job = re.search(r"submitted report job (\d+)", result.stdout).group(1)
    wait_for_jobs(slurm_cluster, [array_job, report_job])

    # Every task did its run, with the log and marker of a local run.
    for task in range(4):
        output = (workdir / "logs" / "slurm" / f"ppo_{array_job}_{task}.out").read_text()
        assert "1 run(s): 1 ran ok, 0 skipped (finished earlier), 0 failed" in output, output
    assert_quick_runs_finished(workdir)

    # The report job wrote the report the local quick run writes, with the same numbers.
    report_output = (workdir / "logs" / "slurm" / f"ppo-report_{report_job}.out").read_text()
    assert "CartPole-v1" in report_output, report_output
    slurm_results, local_results = workdir / "results", quick_dir / "results"
    files = sorted(path.relative_to(slurm_results) for path in slurm_results.rglob("*"))
    assert files == sorted(path.relative_to(local_results) for path in local_results.rglob("*"))
    assert (measured((slurm_results / "ppo.md").read_text())
            == measured((local_results / "ppo.md").read_text()))

    # Submitted again, every run is left out: only the report job runs.
    again = run_tool("run.py", "--quick", "--slurm", "--quick-dir", str(workdir), cwd=workdir,
                     env=slurm_cluster.environment())
    assert again.returncode == 0, again.stdout + again.stderr
    assert "all 4 run(s) finished earlier: no array job, only the report" in again.stdout
    assert "submitted job array" not in again.stdout
    wait_for_jobs(slurm_cluster, [re.search(r"submitted report job (\d+)", again.stdout).group(1)])


# The slowed stand-in of ppo.py on CartPole-v1, seeds 1 and 2: two tasks of 2 minutes, at one CPU
# each.
SLURM_SLOW_RUNS = [*SLOW_RUNS, "--num-seeds", "2", "--cpus-per-task", "1"]


def read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def slurm(cluster: OneNodeCluster, *command: str) -> str:
    """A Slurm command's output, against the test cluster."""
    result = subprocess.run(command, env={**os.environ, **cluster.environment()},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def wait_for(condition, what: str, cluster: OneNodeCluster, limit: float = HUNG_AFTER) -> None:
    """Until `condition()` holds (a bound, so a stuck job fails the test)."""
    deadline = time.time() + limit
    while not condition():
        if time.time() > deadline:
            pytest.fail(f"no {what} after {limit:.0f}s:\n"
                        f"{slurm(cluster, 'squeue')}{cluster.log_tails()}")
        time.sleep(0.5)


def test_tasks_stopped_by_their_time_limit_or_by_scancel_save_requeue_and_continue(
        slurm_cluster, tmp_path, unbroken_slow_runs):
    """Two runs that take 2 minutes each (slowed, until resumed), submitted with --requeue as tasks
    of 1 minute. Slurm warns task 0 of its time limit (SIGUSR1, 15 s before it, sent from 15 to 45 s
    into the task, Slurm's timer ticking every 30 s); task 1 is sent SIGUSR1 by hand
    (`scancel --batch --signal=USR1`) as soon as its run trains. Each run saves and stops, and its
    task requeues itself: squeue shows it pending, and the report job still waits. Started again (at
    once here: Slurm would wait 2 minutes), each task continues its run, which ends with the
    weights, latest scores and TensorBoard log (no step missing or doubled) of a local run that
    never stopped; then the report job reports both."""
    (tmp_path / "slow_ppo.py").write_text(SLOW_PPO)
    submitted = run_tool("run.py", *SLURM_SLOW_RUNS, "--slurm", "--time", "1",
                         "--warning-seconds", "15", "--requeue", cwd=tmp_path,
                         env={**slurm_cluster.environment(), "SLOW_STEP_SECONDS": "0.06"})
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    array_job = re.search(r"submitted job array (\d+)", submitted.stdout).group(1)
    report_job = re.search(r"submitted report job (\d+)", submitted.stdout).group(1)
    logs = tmp_path / "benchmark" / "logs" / "slow_ppo"

    def task_output(task: int) -> str:
        path = tmp_path / SLURM_DIR / f"slow_ppo_{array_job}_{task}.out"
        return path.read_text() if path.is_file() else ""

    def queue() -> str:
        return slurm(slurm_cluster, "squeue", "-h", "-o", "%i %T", "-j",
                     f"{array_job},{report_job}")

    wait_for(lambda: "\nstep " in read(logs / "CartPole-v1__seed2.log"),
             "progress line of task 1", slurm_cluster)
    slurm(slurm_cluster, "scancel", "--batch", "--signal=USR1", f"{array_job}_1")
    for task in (1, 0):
        wait_for(lambda: "[requeue]" in task_output(task), f"requeue of task {task}", slurm_cluster)
        wait_for(lambda: f"{array_job}_{task} PENDING" in queue(),
                 f"task {task} pending again", slurm_cluster)
        assert f"{report_job} PENDING" in queue()
        # slurmd refuses to start a job again within the second its credential was revoked in (the
        # kill of the requeue): one more second, then no need to wait the 2 minutes Slurm gives a
        # requeued job.
        time.sleep(2)
        slurm(slurm_cluster, "scontrol", "update", f"JobId={array_job}_{task}", "StartTime=now")
    wait_for_jobs(slurm_cluster, [array_job, report_job])

    for task, seed in ((0, 1), (1, 2)):
        output, log = task_output(task), read(logs / f"CartPole-v1__seed{seed}.log")
        assert "SIGUSR1: asking 1 running run(s) to save and stop" in output, output
        assert ("1 run(s): 1 ran ok" in output
                and (logs / f"CartPole-v1__seed{seed}.done").is_file()), output
        assert ("SIGTERM: stopping after this iteration" in log
                and "resuming CartPole-v1__ppo__" in log), log
    for seed in (1, 2):
        (run_dir,) = (tmp_path / "runs").glob(f"CartPole-v1__ppo__{seed}__*")
        assert_same_final_weights(unbroken_slow_runs / f"seed{seed}",
                                  run_dir / "checkpoint.pt", 2048)
    (row,) = table_rows((tmp_path / "results" / "ppo.md").read_text(), "env")
    # both runs were complete when it ran
    assert row["env"] == "CartPole-v1" and row["seeds"] == "2"

