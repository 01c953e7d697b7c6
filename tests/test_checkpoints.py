"""Checkpoints are data: reading one runs no code that it names, in every script (ppo/checkpoints.py).

A checkpoint crafted to run a command when it is unpickled (in a top-level entry, in the settings or
in the environments' state) is refused by --evaluate and by --resume: exit code 2, one line that names
what was found, and the command never runs. A checkpoint of the older format, whose environments
were pickled, evaluates as it is (its weights and settings are data) and resumes only with
--trust-old-checkpoint, then exactly as its new-format twin does. Each script's checkpoint comes from
one tiny run of its own (conftest's `tiny`), shared by the tests of a file.
"""

import os
import pickle
import shlex
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch

from conftest import parse_args, assert_same_agent_state, expect_usage_error, run_script

from ppo_utils import checkpoint as checkpoints  # noqa: E402
from ppo_utils import exits  # noqa: E402
from ppo_utils import old_checkpoints  # noqa: E402

# The scripts whose older checkpoints held pickled environments (envpool saves no games; Procgen's
# were already its own state bytes).
PICKLED_ENVS = ["ppo", "ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_continuous_action"]


class RunsACommand:
    """Unpickled, this runs `touch <marker>`: what a crafted checkpoint can do to a pickle reader."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def read(path: Path) -> dict:
    """A checkpoint as the scripts read it (as data), whole."""
    with torch.serialization.safe_globals(checkpoints.numpy_types()):
        return torch.load(path, weights_only=True)


def first_leaf_replaced(state, payload):
    """`state` with its first value (going down the first item of each list and dict) replaced by `payload`."""
    if isinstance(state, list) and state:
        return [first_leaf_replaced(state[0], payload), *state[1:]]
    if isinstance(state, dict) and state:
        key = next(iter(state))
        return {**state, key: first_leaf_replaced(state[key], payload)}
    return payload


def crafted(checkpoint: dict, where: str, payload) -> dict:
    """The checkpoint with `payload` as a top-level entry, in the settings, or in the environments'
    state (for envpool, which saves no games, in the loop state it saves: the latest scores)."""
    if where == "entry":
        return {**checkpoint, "notes": payload}
    if where == "args":
        return {**checkpoint, "args": {**checkpoint["args"], "exp_name": payload}}
    key = "envs" if checkpoint.get("envs") is not None else "recent_returns"
    return {**checkpoint, key: first_leaf_replaced(checkpoint[key] or [0.0], payload)}


@pytest.mark.parametrize("where", ["entry", "args", "envs"])
def test_a_checkpoint_that_would_run_a_command_is_refused(tiny, where, tmp_path, capsys):
    script, path = tiny
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pt"
    torch.save(crafted(read(path), where, RunsACommand(marker)), evil)
    for mode in ("--evaluate", "--resume"):
        expect_usage_error(capsys, lambda: parse_args(script, [mode, str(evil)]), f"{script.VARIANT}.py",
                           f"refusing {str(evil)!r}", "posix.system")
        assert not marker.exists(), mode
    torch.load(evil, weights_only=False)  # the payload is live: a pickle reader runs it
    assert marker.exists()


@pytest.mark.parametrize("tiny", ["ppo"], indirect=True)
def test_the_command_line_refuses_the_crafted_checkpoint_of_the_issue(tiny, tmp_path):
    """The issue's steps: a real checkpoint plus one entry whose unpickling calls os.system, given to
    `python ppo/ppo.py --evaluate`, as a user would."""
    marker = tmp_path / "marker"
    torch.save({**read(tiny[1]), "notes": RunsACommand(marker)}, tmp_path / "evil.pt")
    result = run_script("ppo.py", "--evaluate", "evil.pt", "--eval-episodes", "1", cwd=tmp_path, check=False)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.strip().splitlines() == [
        "ppo.py: error: refusing 'evil.pt': it holds posix.system, which loading it would call or build; the "
        "checkpoints of these scripts hold only tensors, arrays, numbers and text, so this file was made "
        "otherwise or altered"]
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# Checkpoints of the older format: their environments were pickled
# ---------------------------------------------------------------------------------------------------


def pickled_as_before(script, checkpoint: dict) -> dict:
    """`checkpoint` as the scripts wrote it before checkpoints were data: no "format", and the
    environments pickled, rebuilt here from their saved state and pickled as the older scripts did
    (classic control whole; MuJoCo with its random generator and MjData; each ale-py game with its
    emulator state and random generator, by cloudpickle)."""
    old = {key: value for key, value in checkpoint.items() if key != "format"}
    args = checkpoint["args"]
    if script.VARIANT not in PICKLED_ENVS:
        return old
    if script.VARIANT == "ppo_atari_multigpu":
        ranks = [script.make_envs(args["env_id"], args["num_envs"], saved_envs=games) for games in checkpoint["envs"]]
    else:
        ranks = [script.make_envs(args["env_id"], args["num_envs"], saved_envs=checkpoint["envs"])]
    saved = []
    for envs in ranks:
        if script.VARIANT == "ppo":
            saved.append(pickle.dumps(envs.envs))
        elif script.VARIANT == "ppo_continuous_action":
            saved.append(pickle.dumps([(env, env.unwrapped.np_random.bit_generator.state,
                                        getattr(env.unwrapped, "data", None)) for env in envs.envs]))
        else:
            saved.append([cloudpickle.dumps((game, game.unwrapped.ale.cloneState(include_rng=True),
                                             game.unwrapped.np_random.bit_generator.state)) for game in envs.envs])
    return {**old, "envs": saved if script.VARIANT == "ppo_atari_multigpu" else saved[0]}


def leaves(state) -> list:
    """The values of nested lists (the environments' entry of a checkpoint)."""
    return [leaf for item in state for leaf in leaves(item)] if isinstance(state, list) else [state]


def one_batch_more(checkpoint: dict) -> dict:
    """The finished run's checkpoint with one more batch to go, so that it resumes."""
    args = checkpoint["args"]
    return {**checkpoint, "args": {**args, "total_timesteps": 2 * args["total_timesteps"]}}


def test_an_old_checkpoint_resumes_only_with_the_flag(tiny, tmp_path, capsys):
    script, path = tiny
    torch.save(pickled_as_before(script, one_batch_more(read(path))), tmp_path / "old.pt")
    old_path = str(tmp_path / "old.pt")
    expect_usage_error(capsys, lambda: parse_args(script, ["--resume", old_path]), f"{script.VARIANT}.py",
                       f"{old_path!r} is a checkpoint of the older format", "--trust-old-checkpoint")
    _, old = parse_args(script, ["--resume", old_path, "--trust-old-checkpoint"])
    if script.VARIANT in PICKLED_ENVS:  # its pickles, marked for unpickling
        assert all(isinstance(item, old_checkpoints.TrustedOldPickle) for item in leaves(old["envs"]))


# One script per kind of pickle the older checkpoints held: classic control's environments, MuJoCo's
# with their MjData, ale-py's games one by one (and per rank).
@pytest.mark.parametrize("tiny", ["ppo", "ppo_continuous_action", "ppo_atari", "ppo_atari_multigpu"], indirect=True)
def test_an_old_checkpoint_resumed_with_the_flag_ends_as_its_new_twin(tiny, tmp_path, monkeypatch):
    script, path = tiny
    new = one_batch_more(read(path))
    for name, checkpoint in (("new", new), ("old", pickled_as_before(script, new))):
        (tmp_path / name).mkdir()
        torch.save(checkpoint, tmp_path / name / "checkpoint.pt")
    old_path = str(tmp_path / "old" / "checkpoint.pt")
    monkeypatch.chdir(tmp_path)
    with_new = script.main(*parse_args(script, ["--resume", str(tmp_path / "new" / "checkpoint.pt")]))
    with_old = script.main(*parse_args(script, ["--resume", old_path, "--trust-old-checkpoint"]))
    assert_same_agent_state(with_new["agent"].state_dict(), with_old["agent"].state_dict())
    assert with_old["recent_returns"] == with_new["recent_returns"]
    rewritten = read(old_path)  # the resumed run saved the new format, which resumes without the flag
    assert rewritten["format"] == checkpoints.CHECKPOINT_FORMAT and rewritten["global_step"] == new["args"]["total_timesteps"]
    assert parse_args(script, ["--resume", old_path])[1]["format"] == checkpoints.CHECKPOINT_FORMAT


@pytest.mark.parametrize("tiny", ["ppo_continuous_action", "ppo_procgen"], indirect=True)
def test_a_reward_scaler_saved_in_an_earlier_layout_resumes_as_its_new_twin(tiny, tmp_path, monkeypatch):
    """Until 2026-11-26 the reward scaler's entry held the return statistics under "return_rms" and, earlier
    still, each environment's discounted return. Now the entry is the statistics, and the returns go with the
    rollout's state. Checkpoints of both earlier layouts resume to the very run their twin of the new layout
    does."""
    script, path = tiny
    new = one_batch_more(read(path))
    # returns that scale the next rewards (a tiny run's may all be 0: no reward yet, or an episode just ended)
    new["discounted_return"] = np.linspace(0.5, 2.0, len(new["discounted_return"]))
    statistics_inside = {**new, "reward_scaler": {"return_rms": new["reward_scaler"]}}
    returns_inside = {key: value for key, value in new.items() if key != "discounted_return"}
    returns_inside["reward_scaler"] = {"return_rms": new["reward_scaler"], "discounted_return": new["discounted_return"]}
    layouts = {"new": new, "statistics_inside": statistics_inside, "returns_inside": returns_inside}
    for name, checkpoint in layouts.items():
        (tmp_path / name).mkdir()
        torch.save(checkpoint, tmp_path / name / "checkpoint.pt")
    monkeypatch.chdir(tmp_path)
    runs = [script.main(*parse_args(script, ["--resume", str(tmp_path / name / "checkpoint.pt")]))
            for name in layouts]
    for run in runs[1:]:
        assert_same_agent_state(runs[0]["agent"].state_dict(), run["agent"].state_dict())
        assert run["reward_scaler"].return_rms.var == runs[0]["reward_scaler"].return_rms.var
        assert run["reward_scaler"].return_rms.count == runs[0]["reward_scaler"].return_rms.count
        np.testing.assert_array_equal(run["reward_scaler"].discounted_return, runs[0]["reward_scaler"].discounted_return)


def test_an_old_checkpoint_evaluates_without_the_flag_and_its_pickles_stay_shut(tiny, tmp_path):
    """An evaluation reads only the weights (with the statistics the agent owns) and the settings:
    the pickled environments of an older checkpoint, here with a command in them, are never opened."""
    script, path = tiny
    marker = tmp_path / "marker"
    old = pickled_as_before(script, read(path))
    if script.VARIANT in PICKLED_ENVS:
        old["envs"] = first_leaf_replaced(old["envs"], pickle.dumps(RunsACommand(marker)))
    torch.save(old, tmp_path / "old.pt")
    args, checkpoint = parse_args(script, ["--evaluate", str(tmp_path / "old.pt")])
    assert set(checkpoint) == set(checkpoints.EVALUATION_KEYS)
    assert_same_agent_state(read(path)["model"], checkpoint["model"])
    with pytest.raises(SystemExit):
        parse_args(script, ["--resume", str(tmp_path / "old.pt")])
    assert not marker.exists()


def test_the_flag_comes_from_the_command_line_never_from_the_checkpoint(tiny, tmp_path, capsys):
    script, path = tiny
    old = one_batch_more(pickled_as_before(script, read(path)))
    old["args"]["trust_old_checkpoint"] = True
    torch.save(old, tmp_path / "old.pt")
    expect_usage_error(capsys, lambda: parse_args(script, ["--resume", str(tmp_path / "old.pt")]),
                       f"{script.VARIANT}.py", "--trust-old-checkpoint")


@pytest.mark.parametrize("tiny", ["ppo"], indirect=True)
def test_saved_environments_that_do_not_fit_are_refused_in_one_line(tiny, tmp_path, capsys, monkeypatch):
    """Data that cannot run code can still be wrong (another version of the wrappers, an altered file):
    resuming it stops with one line, not a traceback from inside the environments."""
    script, path = tiny
    checkpoint = one_batch_more(read(path))
    checkpoint["envs"][0][0]["class"] = "AnotherWrapper"
    torch.save(checkpoint, tmp_path / "checkpoint.pt")
    monkeypatch.chdir(tmp_path)
    args, loaded = parse_args(script, ["--resume", str(tmp_path / "checkpoint.pt")])

    def resume():
        with exits.exit_codes(script.VARIANT, "classic-control", capture_video=False):
            script.main(args, loaded)

    expect_usage_error(capsys, resume, "ppo.py", "cannot resume the saved environments", "AnotherWrapper")


# ---------------------------------------------------------------------------------------------------
# A checkpoint is replaced atomically
# ---------------------------------------------------------------------------------------------------

# A process that saves a checkpoint over an earlier one and, halfway through writing it (while its state
# is being pickled, the new file already opened), says so in a file and waits to be killed.
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

checkpoints.save_checkpoint(sys.argv[1], {"model": {"weight": torch.zeros(1000)}, "halfway": Halfway()})
"""


def saved_over(tmp_path: Path) -> tuple[Path, bytes]:
    """A folder holding one good checkpoint, its path and its bytes."""
    path = tmp_path / "run" / "checkpoint.pt"
    checkpoints.save_checkpoint(str(path), {"model": {"weight": torch.ones(1000)}, "global_step": 128})
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
    middle of the write: the previous checkpoint is kept, and the unfinished file goes; also where the
    file system has no unnamed files, and the save writes <path>.tmp."""
    path, before = saved_over(tmp_path)
    if not unnamed_files:
        monkeypatch.delattr(os, "O_TMPFILE")

    class SecondCtrlC:
        def __reduce__(self):
            raise exits.StoppedAtOnce("Ctrl-C")

    with pytest.raises(exits.StoppedAtOnce):
        checkpoints.save_checkpoint(str(path), {"model": {"weight": torch.zeros(1000)}, "halfway": SecondCtrlC()})
    assert sorted(path.parent.iterdir()) == [path]
    assert path.read_bytes() == before


# ---------------------------------------------------------------------------------------------------
# A migration of an earlier layout keeps every field
# ---------------------------------------------------------------------------------------------------


def same_data(first, second) -> bool:
    """Whether two checkpoints' entries hold the same data: containers item by item, arrays and tensors
    element by element (and of the same type and shape)."""
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(same_data(first[key], second[key]) for key in first)
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        return type(first) is type(second) and len(first) == len(second) and all(map(same_data, first, second))
    if torch.is_tensor(first) or torch.is_tensor(second):
        return torch.is_tensor(first) and torch.is_tensor(second) and torch.equal(first, second)
    if isinstance(first, (np.ndarray, np.generic)) or isinstance(second, (np.ndarray, np.generic)):
        return type(first) is type(second) and np.shape(first) == np.shape(second) and np.array_equal(first, second)
    return type(first) is type(second) and first == second


def migrated(old: dict, tmp_path: Path, script) -> dict:
    """`old` as a resumed run reads it, its earlier layout brought to today's."""
    torch.save(old, tmp_path / "old.pt")
    return checkpoints.load_checkpoint(str(tmp_path / "old.pt"), script.VARIANT, resuming=True)


@pytest.mark.parametrize("tiny", ["ppo", "ppo_continuous_action"], indirect=True)
def test_the_episode_figures_kept_beside_the_environments_come_back_in_them(tiny, tmp_path):
    """Until 2026-11-27 the running return and length of each environment's episode stood beside the
    environments; read, they go into the RecordEpisodeStatistics layer, and every other entry is as in
    the twin of today's layout."""
    script, path = tiny
    new = one_batch_more(read(path))
    for i, layers in enumerate(new["envs"]):  # figures no fresh environment has
        layers[0]["data"].update(episode_returns=12.5 + i, episode_lengths=7 + i)
    old = {**{key: value for key, value in new.items() if key != "envs"},
           "envs": [layers[1:] for layers in new["envs"]],
           "episode_return": np.array([layers[0]["data"]["episode_returns"] for layers in new["envs"]]),
           "episode_length": np.array([layers[0]["data"]["episode_lengths"] for layers in new["envs"]])}
    now = migrated(old, tmp_path, script)
    assert same_data({key: value for key, value in now.items() if key != "envs"},
                     {key: value for key, value in new.items() if key != "envs"})
    for layers, twin in zip(now["envs"], new["envs"], strict=True):
        assert same_data(layers[1:], twin[1:])
        assert layers[0]["class"] == twin[0]["class"] == "RecordEpisodeStatistics"
        assert layers[0]["data"] == {name: twin[0]["data"][name] for name in ("episode_returns", "episode_lengths")}


@pytest.mark.parametrize("tiny", ["ppo_continuous_action", "ppo_procgen"], indirect=True)
def test_a_reward_scaler_of_an_earlier_layout_reads_as_its_twin_field_for_field(tiny, tmp_path):
    script, path = tiny
    new = one_batch_more(read(path))
    new["discounted_return"] = np.linspace(0.5, 2.0, len(new["discounted_return"]))
    statistics_inside = {**new, "reward_scaler": {"return_rms": new["reward_scaler"]}}
    returns_inside = {key: value for key, value in new.items() if key != "discounted_return"}
    returns_inside["reward_scaler"] = {"return_rms": new["reward_scaler"], "discounted_return": new["discounted_return"]}
    for old in (statistics_inside, returns_inside):
        assert same_data(migrated(old, tmp_path, script), new)
