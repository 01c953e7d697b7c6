"""Checkpoints (ppo_utils/checkpoint.py): what one holds, declared once and versioned; reading one
runs no code that it names; writing one replaces the last one atomically. In every script.

A checkpoint crafted to run a command when it is unpickled (in a top-level entry, in the settings or
in the environments' state) is refused by --evaluate and by --resume: exit code 2, one line that
names what was found, and the command never runs. A checkpoint of an earlier format is refused in
one line that names the last commit that reads it; one of today's format, kept in tests/fixtures/,
resumes. Each script's checkpoint comes from one tiny run of its own (conftest's `tiny`), shared by
the tests of a file.
"""

import os
import shlex
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from conftest import REPO, parse_args, expect_usage_error, read_scalars, run_script

from ppo_utils import checkpoint as checkpoints  # noqa: E402
from ppo_utils import exits  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"


class RunsACommand:
    """Unpickled, this runs `touch <marker>`: what a crafted checkpoint can do to a pickle
    reader."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def read(path: Path) -> dict:
    """A checkpoint's file as the scripts read it (as data), whole."""
    with torch.serialization.safe_globals(checkpoints.numpy_types()):
        return torch.load(path, weights_only=True)


def first_leaf_replaced(state, payload):
    """`state` with its first value (going down the first item of each list and dict) replaced by
    `payload`."""
    if isinstance(state, list) and state:
        return [first_leaf_replaced(state[0], payload), *state[1:]]
    if isinstance(state, dict) and state:
        key = next(iter(state))
        return {**state, key: first_leaf_replaced(state[key], payload)}
    return payload


def crafted(checkpoint: dict, where: str, payload) -> dict:
    """The checkpoint with `payload` as a top-level entry, in the settings, or in the environments'
    state (for envpool and Procgen, which save no environments there, in the latest scores)."""
    if where == "entry":
        return {**checkpoint, "notes": payload}
    if where == "args":
        return {**checkpoint, "args": {**checkpoint["args"], "exp_name": payload}}
    process = checkpoint["processes"][0]
    if process["envs"] is not None:
        return {**checkpoint, "processes": [{**process,
                                             "envs": first_leaf_replaced(process["envs"], payload)},
                                            *checkpoint["processes"][1:]]}
    return {**checkpoint,
            "recent_returns": first_leaf_replaced(checkpoint["recent_returns"] or [0.0], payload)}


@pytest.mark.parametrize("where", ["entry", "args", "envs"])
def test_a_checkpoint_that_would_run_a_command_is_refused(tiny, where, tmp_path, capsys):
    script, path = tiny
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pt"
    torch.save(crafted(read(path), where, RunsACommand(marker)), evil)
    for mode in ("--evaluate", "--resume"):
        expect_usage_error(capsys, lambda: parse_args(script, [mode, str(evil)]),
                           f"{script.VARIANT}.py", f"refusing {str(evil)!r}", "posix.system")
        assert not marker.exists(), mode
    torch.load(evil, weights_only=False)  # the payload is live: a pickle reader runs it
    assert marker.exists()


@pytest.mark.parametrize("tiny", ["ppo"], indirect=True)
def test_the_command_line_refuses_the_crafted_checkpoint_of_the_issue(tiny, tmp_path):
    """The issue's steps: a real checkpoint plus one entry whose unpickling calls os.system, given
    to `python ppo/ppo.py --evaluate`, as a user would."""
    marker = tmp_path / "marker"
    torch.save({**read(tiny[1]), "notes": RunsACommand(marker)}, tmp_path / "evil.pt")
    result = run_script("ppo.py", "--evaluate", "evil.pt", "--eval-episodes", "1",
                        cwd=tmp_path, check=False)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.strip().splitlines() == [
        "ppo.py: error: refusing 'evil.pt': it holds posix.system, which loading it would call or "
        "build; the checkpoints of these scripts hold only tensors, arrays, numbers and text, "
        "so this file was made otherwise or altered"]
    assert not marker.exists()


# --------------------------------------------------------------------------------------------------
# What a checkpoint holds, and its format
# --------------------------------------------------------------------------------------------------


def one_batch_more(checkpoint: dict) -> dict:
    """The finished run's checkpoint with one more batch to go, so that it resumes."""
    args = checkpoint["args"]
    return {**checkpoint, "args": {**args, "total_timesteps": 2 * args["total_timesteps"]}}


def test_a_checkpoint_holds_the_declared_fields_and_each_process_its_own(tiny):
    """The file holds exactly what Checkpoint and ProcessState declare, and its format: the script's
    rollout has a key of its own inside its process's state, where none of its names can replace the
    run's (a field called `model` or `rng` once could)."""
    script, path = tiny
    saved = read(path)
    assert set(saved) == {"format", *(field.name for field in fields(checkpoints.Checkpoint))}
    assert saved["format"] == checkpoints.FORMAT and saved["variant"] == script.VARIANT
    for process in saved["processes"]:
        assert set(process) == {field.name for field in fields(checkpoints.ProcessState)}
    loaded = checkpoints.Checkpoint.read(str(path), script.VARIANT)
    assert (loaded.global_step == saved["global_step"]
            and len(loaded.processes) == len(saved["processes"]))


@pytest.mark.parametrize("tiny", ["ppo"], indirect=True)
@pytest.mark.parametrize("written", [None, 2, 99], ids=["no-format", "format-2", "format-99"])
def test_a_checkpoint_of_another_format_is_refused_naming_the_commit_that_reads_it(
        tiny, written, tmp_path, capsys):
    script, path = tiny
    old = {key: value for key, value in read(path).items() if key != "format"}
    torch.save(old if written is None else {**old, "format": written}, tmp_path / "old.pt")
    for mode in ("--resume", "--evaluate"):
        line = expect_usage_error(capsys,
                                  lambda: parse_args(script, [mode, str(tmp_path / "old.pt")]),
                                  "ppo.py", f"has checkpoint format {written or 1}, which this "
                                            "version of the scripts does not read")
        last = checkpoints.LAST_COMMIT_READING.get(written or 1)
        assert (f"git checkout {last}" in line) if last else "use the version that wrote it" in line


def test_a_checkpoint_of_today_s_format_kept_from_an_earlier_commit_still_resumes(tmp_path):
    """tests/fixtures/checkpoint-format-<FORMAT>.pt: a checkpoint ppo.py wrote when the format was
    introduced (CartPole-v1, stopped at step 256 of 512). Whatever changes in how checkpoints are
    read, it resumes to its end, its log holding each step once; a new format keeps the old fixture
    resuming (a migration) or says in LAST_COMMIT_READING which commit reads it, and brings a
    fixture of its own."""
    fixture = FIXTURES / f"checkpoint-format-{checkpoints.FORMAT}.pt"
    run_dir = tmp_path / "runs" / "kept"
    run_dir.mkdir(parents=True)
    shutil.copy(fixture, run_dir / "checkpoint.pt")
    resumed = run_script("ppo.py", "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert "at step 256 of 512" in resumed.stdout, resumed.stdout
    finished = checkpoints.Checkpoint.read(str(run_dir / "checkpoint.pt"), "ppo")
    assert finished.global_step == 512 and checkpoints.all_finite(finished.model)
    steps = [step for step, _ in read_scalars(run_dir)["charts/SPS"]]
    assert steps == [384, 512]


@pytest.mark.parametrize("tiny", ["ppo"], indirect=True)
def test_saved_environments_that_do_not_fit_are_refused_in_one_line(
        tiny, tmp_path, capsys, monkeypatch):
    """Data that cannot run code can still be wrong (another version of the wrappers, an altered
    file): resuming it stops with one line, not a traceback from inside the environments."""
    script, path = tiny
    checkpoint = one_batch_more(read(path))
    checkpoint["processes"][0]["envs"][0][0]["class"] = "AnotherWrapper"
    torch.save(checkpoint, tmp_path / "checkpoint.pt")
    monkeypatch.chdir(tmp_path)
    args, loaded = parse_args(script, ["--resume", str(tmp_path / "checkpoint.pt")])
    expect_usage_error(capsys, lambda: script.main(args, loaded), "ppo.py",
                       "cannot resume the saved environments", "AnotherWrapper")


# --------------------------------------------------------------------------------------------------
# A checkpoint is replaced atomically
# --------------------------------------------------------------------------------------------------

# A process that saves a checkpoint over an earlier one and, halfway through writing it (while its
# state is being pickled, the new file already opened), says so in a file and waits to be killed.
SAVE_UNTIL_KILLED = """\
import sys, time
from pathlib import Path
import torch
from ppo_utils import checkpoint as checkpoints

class Halfway:
    def __reduce__(self):
        Path(sys.argv[2]).touch()
        time.sleep(600)
        return int, ()

checkpoints.write_atomically(sys.argv[1], {"model": {"weight": torch.zeros(1000)},
                                           "halfway": Halfway()})
"""


def saved_over(tmp_path: Path) -> tuple[Path, bytes]:
    """A folder holding one good checkpoint, its path and its bytes."""
    path = tmp_path / "run" / "checkpoint.pt"
    checkpoints.write_atomically(str(path),
                                 {"model": {"weight": torch.ones(1000)}, "global_step": 128})
    return path, path.read_bytes()


def test_a_save_killed_halfway_leaves_the_previous_checkpoint_and_nothing_else(tmp_path):
    """SIGKILL (the out-of-memory killer, a cluster's hard limit) while a checkpoint is written: the
    previous checkpoint is still there, whole, and no partial file lies beside it."""
    import signal
    import subprocess
    import sys
    import time

    path, before = saved_over(tmp_path)
    halfway = tmp_path / "halfway"
    saving = subprocess.Popen([sys.executable, "-c", SAVE_UNTIL_KILLED, str(path), str(halfway)])
    deadline = time.monotonic() + 120
    while not halfway.exists() and saving.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert halfway.exists(), "the save never got halfway"
    saving.send_signal(signal.SIGKILL)
    saving.wait()
    assert sorted(path.parent.iterdir()) == [path]
    assert path.read_bytes() == before


@pytest.mark.parametrize("unnamed_files", [True, False], ids=["O_TMPFILE", "without"])
def test_a_save_stopped_by_a_second_ctrl_c_leaves_the_previous_checkpoint_and_nothing_else(
        tmp_path, monkeypatch, unnamed_files):
    """A second Ctrl-C during the save (the first one asked the run to stop and save) raises in the
    middle of the write: the previous checkpoint is kept, and the unfinished file goes; also where
    the file system has no unnamed files, and the save writes <path>.tmp."""
    path, before = saved_over(tmp_path)
    if not unnamed_files:
        monkeypatch.delattr(os, "O_TMPFILE")

    class SecondCtrlC:
        def __reduce__(self):
            raise exits.StoppedAtOnce("Ctrl-C")

    with pytest.raises(exits.StoppedAtOnce):
        checkpoints.write_atomically(str(path), {"model": {"weight": torch.zeros(1000)},
                                                 "halfway": SecondCtrlC()})
    assert sorted(path.parent.iterdir()) == [path]
    assert path.read_bytes() == before
