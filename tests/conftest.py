"""Helpers shared by the tests: running a script as a user would, and reading what it logged."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_script(script: str, *args: str, cwd: Path, timeout: float = 300, env: dict | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run `python ppo/<script> args...` in `cwd` (so runs/ and videos/ land there), as a user would."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    result = subprocess.run([sys.executable, str(REPO / "ppo" / script), *args], cwd=cwd, env=full_env,
                            capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} exited {result.returncode}\n"
                             f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars a run wrote to TensorBoard, as {tag: [(step, value), ...]} in logged order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def only_run_dir(workdir: Path) -> Path:
    """The single run directory under workdir/runs."""
    runs = [path for path in (workdir / "runs").iterdir() if path.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A fresh working directory, also for in-process runs, so runs/ never lands in the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
