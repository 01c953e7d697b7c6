"""A trained agent as users handle one (issue 71): watched live in a window (`--evaluate CHECKPOINT
--watch`), under a real X server (Xvfb) whose screen is read back while the agent plays; refused in
one line without a display; and exported as a model folder (`--export DIR`) whose model card holds
the evaluation's mean and which `--evaluate DIR` plays to the same mean."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import HUNG_AFTER, REPO, run_script_here, script_environment

def screen(display: str) -> np.ndarray:
    """The X server's whole screen as RGB, (height, width, 3), read with xwd: a ZPixmap whose
    pixels are 24 or 32 bits, in the byte order its header gives."""
    dump = subprocess.run(["xwd", "-root", "-silent", "-display", display], capture_output=True,
                          check=True).stdout
    header = [int(word) for word in np.frombuffer(dump[:100], dtype=">u4")]
    header_size, width, height, byte_order = header[0], header[4], header[5], header[7]
    bits_per_pixel, bytes_per_line, colors = header[11], header[12], header[19]
    assert bits_per_pixel in (24, 32), header
    size = bits_per_pixel // 8
    rows = np.frombuffer(dump[header_size + 12 * colors:], dtype=np.uint8)[:height * bytes_per_line]
    pixels = rows.reshape(height, bytes_per_line)[:, :width * size].reshape(height, width, size)
    # LSBFirst (0): blue, green, red[, pad]; MSBFirst: [pad,] red, green, blue
    return pixels[..., [2, 1, 0] if byte_order == 0 else [size - 3, size - 2, size - 1]]


def shows_a_picture(image: np.ndarray) -> bool:
    """Not a blank screen: a tenth of it or more differs from its most common colour."""
    flat = image.reshape(-1, 3)
    values, counts = np.unique(flat, axis=0, return_counts=True)
    return (flat != values[counts.argmax()]).any(axis=1).mean() > 0.1


@pytest.fixture
def xserver(tmp_path):
    """A virtual X server (Xvfb) for the test, and its DISPLAY."""
    if shutil.which("Xvfb") is None or shutil.which("xwd") is None:
        pytest.skip("needs Xvfb and xwd (Debian: apt-get install xvfb x11-apps; .ci/run "
                    "installs them)")
    display = f":{90 + os.getpid() % 500}"
    server = subprocess.Popen(["Xvfb", display, "-screen", "0", "800x700x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while subprocess.run(["xwd", "-root", "-silent", "-display", display],
                         capture_output=True).returncode:
        assert time.monotonic() < deadline and server.poll() is None, "Xvfb did not start"
        time.sleep(0.1)
    yield display
    server.terminate()
    server.wait()


def on_screen(display: str) -> dict:
    """A script's environment drawing on `display`: without the off-screen drivers that the tests
    filming in this process (render_off_screen) left in its environment."""
    environment = {**script_environment(), "DISPLAY": display}
    for off_screen in ("SDL_VIDEODRIVER", "MUJOCO_GL"):
        environment.pop(off_screen, None)
    return environment


def watch(script: str, checkpoint: Path, display: str, cwd: Path, *flags: str) -> subprocess.Popen:
    """The script's --watch, its output piped; PYTHONFAULTHANDLER: a SIGABRT prints where each of
    its threads is (a test's report of a hang)."""
    return subprocess.Popen([sys.executable, str(REPO / "ppo" / f"{script}.py"), "--evaluate",
                             str(checkpoint), "--watch", *flags], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**on_screen(display), "PYTHONFAULTHANDLER": "1"})


def test_watch_shows_the_agent_playing_in_a_window_then_its_scores(tiny, xserver, tmp_path):
    """The window shows the game while the agent plays (the screen, read back from the X server, is
    not blank), then the evaluation's lines are printed as without --watch. Each script shows the
    frames its environments render: the game as --capture-video films it (envpool's: the console's
    screen; Procgen's: the 64x64 frames the agent sees)."""
    script, checkpoint = tiny
    name = script.__name__.rpartition(".")[2]
    playing = watch(name, checkpoint, xserver, tmp_path, "--eval-episodes", "2",
                    "--watch-fps", "10")
    shown, deadline = None, time.monotonic() + HUNG_AFTER
    while playing.poll() is None and time.monotonic() < deadline:
        image = screen(xserver)
        if shows_a_picture(image):
            shown = image
            break
        time.sleep(0.2)
    output = playing.communicate(timeout=HUNG_AFTER)[0]
    assert playing.returncode == 0, output
    assert shown is not None, f"the screen stayed blank while {name}.py played\n{output}"
    if os.environ.get("PPO_SCREENSHOTS"):  # for a reader: what the window showed
        import matplotlib.image

        matplotlib.image.imsave(Path(os.environ["PPO_SCREENSHOTS"]) / f"{name}.png", shown)
    assert ": mean return " in output.splitlines()[-1], output
    assert sum(line.startswith("episode ") for line in output.splitlines()) == 2, output


def test_ctrl_c_closes_the_window_and_ends_with_exit_code_130(xserver, tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "ppo" / "ppo.py"), "--total-timesteps", "64",
                          "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2",
                          "--save-model", "--no-cuda"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=HUNG_AFTER)
    (checkpoint,) = tmp_path.glob("runs/*/checkpoint.pt")
    playing = watch("ppo", checkpoint, xserver, tmp_path, "--eval-episodes", "1000",
                    "--watch-fps", "20")
    deadline = time.monotonic() + HUNG_AFTER
    while not shows_a_picture(screen(xserver)):
        assert playing.poll() is None and time.monotonic() < deadline, playing.communicate()[0]
        time.sleep(0.2)
    playing.send_signal(signal.SIGINT)
    try:
        output = playing.communicate(timeout=60)[0]  # at once: not after its 1000 episodes
    except subprocess.TimeoutExpired:  # (once, on 2 cores beside two busy processes)
        playing.send_signal(signal.SIGABRT)
        pytest.fail("Ctrl-C did not end --watch within 60 s; its output and threads:\n"
                    + playing.communicate()[0][-4000:])
    assert playing.returncode == 130, output
    assert output.strip().splitlines()[-1] == "stopped at once by Ctrl-C", output
    time.sleep(0.5)
    assert not shows_a_picture(screen(xserver)), "the window stayed open"
    assert run.returncode == 0


def test_watch_without_a_display_is_refused_in_one_line_and_writes_nothing(
        tiny, tmp_path, monkeypatch, capsys):
    script, checkpoint = tiny
    name = script.__name__.rpartition(".")[2]
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_script_here(name, ["--evaluate", str(checkpoint), "--watch", "--no-cuda"],
                                     capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"{name}.py: error: --watch opens a window, and there is no display"), err
    assert "--capture-video" in err and "xvfb-run" in err, err
    assert list(tmp_path.iterdir()) == [] and out == ""


@pytest.mark.parametrize("flag", [["--watch"], ["--export", "agent"]], ids=["watch", "export"])
def test_watch_and_export_without_evaluate_are_refused(flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_script_here("ppo", [*flag, "--no-cuda"], capsys)
    assert code == 2 and err.startswith(f"ppo.py: error: {flag[0]} goes with --evaluate "
                                        "CHECKPOINT"), err
    assert list(tmp_path.iterdir()) == []


def front_matter(card: str) -> dict:
    """The model card's YAML metadata, as the hub reads it (PyYAML comes with the docs extra)."""
    yaml = pytest.importorskip("yaml")
    assert card.startswith("---\n"), card[:100]
    return yaml.safe_load(card.split("---\n")[1])


def mean_line(output: str) -> str:
    (line,) = [line for line in output.splitlines() if ": mean return " in line]
    return line


def test_export_writes_a_model_folder_that_evaluate_plays_to_the_same_mean(
        tiny, tmp_path, monkeypatch, capsys):
    """--export: the weights, the script, the training command, the versions, the episodes and a
    model card whose YAML holds the library, the tags and the mean return in the hub's model-index;
    then `--evaluate DIR`, with the same seed, prints the same mean as the export's evaluation."""
    script, checkpoint = tiny
    name = script.__name__.rpartition(".")[2]
    monkeypatch.chdir(tmp_path)
    code, exported, err = run_script_here(name, ["--evaluate", str(checkpoint),
                                                 "--eval-episodes", "3", "--export", "agent",
                                                 "--no-cuda"], capsys)
    assert code == 0, err
    folder = tmp_path / "agent"
    assert ({"model.pt", f"{name}.py", "evaluation.json", "README.md"}
            <= {path.name for path in folder.iterdir()})
    evaluation = json.loads((folder / "evaluation.json").read_text())
    card = (folder / "README.md").read_text()
    metadata = front_matter(card)
    env_id = evaluation["env_id"]
    assert metadata["library_name"] == "ppo-scripts"
    assert {env_id, "reinforcement-learning", "ppo"} <= set(metadata["tags"])
    (result,) = metadata["model-index"][0]["results"]
    assert (result["dataset"]["name"] == env_id
            and result["task"]["type"] == "reinforcement-learning")
    (metric,) = result["metrics"]
    assert metric["type"] == "mean_reward"
    assert metric["value"] == f"{evaluation['mean_return']:.2f} +/- {evaluation['std_return']:.2f}"
    assert len(evaluation["returns"]) == 3
    assert "--evaluate . --watch" in card and f"python ppo/{name}.py" in card
    assert (folder / f"{name}.py").read_text() == (REPO / "ppo" / f"{name}.py").read_text()

    code, again, err = run_script_here(
        name, ["--evaluate", "agent", "--eval-episodes", "3", "--no-cuda"], capsys)
    assert code == 0, err
    assert mean_line(again) == mean_line(exported)
    assert f"{evaluation['mean_return']:.2f} +-" in mean_line(again)


@pytest.mark.parametrize("tiny", ["ppo"], indirect=True)  # the same in every script
def test_an_exported_folder_is_refused_by_resume_and_an_existing_one_by_export(
        tiny, tmp_path, monkeypatch, capsys):
    script, checkpoint = tiny
    name = script.__name__.rpartition(".")[2]
    monkeypatch.chdir(tmp_path)
    assert run_script_here(name, ["--evaluate", str(checkpoint), "--eval-episodes", "1",
                                  "--export", "agent"], capsys)[0] == 0
    code, _, err = run_script_here(name, ["--resume", "agent"], capsys)
    assert code == 2 and "an exported agent, which --evaluate plays" in err, err
    code, _, err = run_script_here(name,
                                   ["--evaluate", str(checkpoint), "--export", "agent"], capsys)
    assert code == 2 and "--export agent: it exists and is not an empty folder" in err, err
