"""A researcher's own problem, as a user meets it: an environment registered by a module of their
own (`--env-id mymodule:MyEnv-v0`), spaces a script cannot train on, two runs started in the same
second, and a run whose network diverges (issues 37 and 38).

The user's module is written into a temporary folder on PYTHONPATH, as a user would keep it."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (HUNG_AFTER, REPO, ctrl_c_during_step, expect_usage_error, only_run_dir,
                      read_scalars, run_script, run_script_here, script_command, script_environment)

MODULE = '''
import gymnasium as gym
import numpy as np

gym.register(id="MyCartPole-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
             max_episode_steps=500)
gym.register(id="MyPendulum-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
             max_episode_steps=200)
gym.register(id="MyBreakout-v0", entry_point="ale_py.env:AtariEnv", max_episode_steps=400,
             kwargs={"game": "breakout", "obs_type": "rgb", "frameskip": 1,
                     "repeat_action_probability": 0.0})


class DictObservations(gym.Env):
    observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,))})
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class SeveralActions(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        return np.zeros(2, dtype=np.float32), 0.0, False, False, {}


gym.register(id="MyDict-v0", entry_point=DictObservations)
gym.register(id="MyMultiDiscrete-v0", entry_point=SeveralActions)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> Path:
    """`myenvs.py` in a folder of its own, on PYTHONPATH (for subprocesses) and sys.path (in
    process); the working directory is another folder, as where a user starts a run."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "myenvs.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH",
                       os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    yield workdir
    sys.modules.pop("myenvs", None)


def load(script: str):
    return importlib.import_module(f"ppo.{script}")


# --------------------------------------------------------------------------------------------------
# module:EnvId
# --------------------------------------------------------------------------------------------------

TRAINS = [  # (script, env id, flags of a tiny run, what it needs installed)
    ("ppo.py", "myenvs:MyCartPole-v0", ["--total-timesteps", "256", "--num-steps", "32"], ()),
    ("ppo_continuous_action.py", "myenvs:MyPendulum-v0",
     ["--total-timesteps", "128", "--num-steps", "64", "--num-minibatches", "2"], ()),
    *((script, "myenvs:MyBreakout-v0", ["--total-timesteps", "64", "--num-envs", "2",
                                        "--num-steps", "16", "--num-minibatches", "2",
                                        "--update-epochs", "1"], ("ale_py", "cv2"))
      for script in ("ppo_atari.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py")),
    ("ppo_multidiscrete.py", "myenvs:MyMultiDiscrete-v0",
     ["--total-timesteps", "256", "--num-steps", "32"], ()),
    # a Dict observation, flattened into one vector (tests/test_spaces.py: every space, every
    # script)
    ("ppo.py", "myenvs:MyDict-v0", ["--total-timesteps", "256", "--num-steps", "32"], ()),
]


@pytest.mark.parametrize("script,env_id,flags,needs", TRAINS, ids=[case[0] for case in TRAINS])
def test_an_environment_of_the_users_own_module_trains(script, env_id, flags, needs, user_module):
    for package in needs:
        pytest.importorskip(package)
    result = run_script(script, "--env-id", env_id, "--no-cuda", *flags, cwd=user_module)
    (run_dir,) = (user_module / "runs").iterdir()
    # a folder's name, no colon
    assert run_dir.name.startswith(env_id.replace(":", "-") + "__"), run_dir.name
    assert read_scalars(run_dir)["charts/SPS"], result.stdout


@pytest.mark.parametrize("script", ["ppo", "ppo_continuous_action", "ppo_atari", "ppo_atari_lstm",
                                    "ppo_atari_multigpu", "ppo_multidiscrete"])
def test_a_module_that_does_not_import_or_register_the_id_is_named(script, user_module, capsys):
    if script.startswith("ppo_atari"):
        pytest.importorskip("ale_py")
    module = load(script)
    for env_id, fragments in (("nosuchmodule:MyEnv-v0",
                               ["cannot import the module 'nosuchmodule'", "PYTHONPATH"]),
                              ("myenvs:Unregistered-v0", ["importing 'myenvs' registered no "
                                                          "environment 'Unregistered-v0'"])):
        args = module.Args(env_id=env_id, cuda=False)
        expect_usage_error(capsys, lambda: module.main(args), f"{script}.py", *fragments)
    assert not (user_module / "runs").exists()  # a refused command leaves no run folder behind


REFUSED = [  # (script, env id, what the line must say)
    ("ppo", "space_envs:Spaces-DictWithText-Discrete-v0", ["observes a Text within its Dict",
                                                           "encode the text as numbers"]),
    ("ppo", "myenvs:MyMultiDiscrete-v0",
     ["MultiDiscrete action space", "ppo/ppo_multidiscrete.py"]),
    ("ppo_continuous_action", "myenvs:MyMultiDiscrete-v0",
     ["MultiDiscrete action space", "ppo/ppo_multidiscrete.py"]),
    ("ppo_continuous_action", "myenvs:MyCartPole-v0", ["Discrete action space", "ppo/ppo.py"]),
    ("ppo", "myenvs:MyPendulum-v0", ["Box action space", "ppo/ppo_continuous_action.py"]),
]


@pytest.mark.parametrize("script,env_id,fragments", REFUSED,
                         ids=[f"{s}-{e}" for s, e, _ in REFUSED])
def test_spaces_a_script_cannot_train_on_are_refused_in_one_line(
        script, env_id, fragments, user_module, capsys):
    module = load(script)
    expect_usage_error(capsys, lambda: module.main(module.Args(env_id=env_id, cuda=False)),
                       f"{script}.py", *fragments)
    assert not (user_module / "runs").exists()


def test_discrete_observations_are_one_hot_encoded(workdir):
    """FrozenLake's square is an index, not a quantity: ppo.py gives the network one input per
    square."""
    module = load("ppo")
    envs = module.make_envs("FrozenLake-v1", 2)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 16) and set(np.unique(obs)) == {0, 1}
    assert (obs.sum(axis=1) == 1).all() and obs[0, 0] == 1  # both start on square 0
    obs, *_ = envs.step(np.array([2, 1]))  # right, down: squares 1 and 4 (unless the ice slips)
    assert (obs.sum(axis=1) == 1).all()
    envs.close()
    result = module.main(module.Args(env_id="FrozenLake-v1", total_timesteps=256,
                                     num_steps=32, cuda=False))
    assert result["agent"].critic[0].in_features == 16


@pytest.mark.parametrize("script", ["ppo", "ppo_continuous_action", "ppo_multidiscrete"])
def test_capture_video_refuses_an_environment_that_draws_no_frames(script, workdir, capsys):
    """--capture-video films rgb_array frames: an environment with no such render mode is refused in
    one line before any folder is made (it crashed mid-run, its run folder left behind)."""
    code, _, err = run_script_here(script, ["--env-id", "space_envs:Spaces-Box-Box-v0",
                                            "--capture-video", "--no-cuda"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{script}.py: error: --capture-video and --watch take the frames an "
                          "environment draws, and space_envs:Spaces-Box-Box-v0 draws none (its "
                          "render modes: none)"), err
    assert sorted(os.listdir(workdir)) == []  # neither runs/ nor videos/


# The run machinery's module names, each also the name of a module of the user's (`environments.py`
# imports the others, and registers its environment only if every one is the user's own).
MACHINERY_MODULES = sorted(path.stem for path in (REPO / "ppo_utils").glob("*.py")
                           if path.stem != "__init__")
USERS_ENVIRONMENTS = """\
import importlib, os
import gymnasium as gym
here = os.path.dirname(os.path.abspath(__file__))
for name in {others!r}:
    assert os.path.dirname(os.path.abspath(importlib.import_module(name).__file__)) == here, name
gym.register(id="MyCart-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
             max_episode_steps=500)
"""


def test_a_users_modules_named_like_the_run_machinery_s_own_train(tmp_path):
    """A user's module that bears the name of a module of the run machinery (`environments`,
    `training`, ...) is the one `--env-id environments:MyCart-v0` imports: the machinery is the
    package ppo_utils, found by its full name, and ppo/ holds only the scripts (issue 70: ppo/'s
    environments.py shadowed the user's, and the error blamed the user's module)."""
    code = tmp_path / "code"
    code.mkdir()
    others = [name for name in MACHINERY_MODULES if name != "environments"]
    for name in others:
        (code / f"{name}.py").write_text("USERS = True\n")
    (code / "environments.py").write_text(USERS_ENVIRONMENTS.format(others=others))
    result = run_script("ppo.py", "--env-id", "environments:MyCart-v0", "--total-timesteps", "256",
                        "--num-steps", "32", "--no-cuda", cwd=tmp_path,
                        env={"PYTHONPATH": str(code)})
    assert read_scalars(only_run_dir(tmp_path))["charts/SPS"], result.stdout


# --------------------------------------------------------------------------------------------------
# Going on after a stop or a crash: which checkpoint is kept, and the command that resumes it
# --------------------------------------------------------------------------------------------------

SAVE_FLAGS = ["--env-id", "CartPole-v1", "--num-envs", "1", "--num-steps", "16",
              "--num-minibatches", "1", "--update-epochs", "1", "--total-timesteps", "160",
              "--save-model", "--no-cuda"]


@pytest.mark.parametrize("earlier", [True, False], ids=["over-an-earlier-one", "the-first"])
def test_a_second_ctrl_c_during_a_save_keeps_only_the_earlier_checkpoint_and_says_which(
        earlier, workdir, monkeypatch, capsys):
    """Ctrl-C asks the run to stop after its iteration and save; a second Ctrl-C while it saves
    stops it at once. The half-written checkpoint goes; the earlier one stays (or none: no
    checkpoint was written before), and the last line says which, with the command that resumes
    it."""
    import signal

    from ppo_utils import checkpoint

    saves, save = [], checkpoint.torch.save

    def save_then_ctrl_c(state, file):
        saves.append(state["global_step"])
        if len(saves) == (2 if earlier else 1):  # this save: half written when Ctrl-C comes again
            file.write(b"half a checkpoint")
            signal.raise_signal(signal.SIGINT)
        save(state, file)

    monkeypatch.setattr(checkpoint.torch, "save", save_then_ctrl_c)
    with ctrl_c_during_step(gym.envs.classic_control.CartPoleEnv, 24):  # in the second iteration
        code, out, err = run_script_here(
            "ppo", [*SAVE_FLAGS, "--save-interval", "1" if earlier else "0"], capsys)
    assert code == 130, err
    run_dir = only_run_dir(workdir)
    left = sorted(path.name for path in run_dir.iterdir() if "checkpoint" in path.name)
    last = err.strip().splitlines()[-1]
    if earlier:
        assert saves == [16, 32] and left == ["checkpoint.pt"]
        assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 16
        path = f"runs/{run_dir.name}/checkpoint.pt"
        assert last == (f"stopped at once by Ctrl-C: the last good checkpoint, {path} (step 16), "
                        f"is kept: resume with: python {REPO / 'ppo' / 'ppo.py'} --resume "
                        f"{path}"), last
    else:
        assert saves == [32] and left == []
        assert last == "stopped at once by Ctrl-C: no checkpoint was written", last


def stop_after_first_progress_line(command: list[str], cwd: Path) -> str:
    """Start `command` in `cwd`, send SIGTERM (as `kill` does) once it printed its first progress
    line, and return all it printed."""
    import signal

    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=script_environment())
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("step"):
            process.send_signal(signal.SIGTERM)
            break
    output.append(process.stdout.read())
    assert process.wait(timeout=HUNG_AFTER) == 130, "".join(output)
    return "".join(output)


def printed_command(output: str, before: str) -> str:
    (line,) = [line for line in output.splitlines() if before in line]
    return line.split(before, 1)[1]


def test_the_commands_a_run_prints_work_pasted_where_it_was_started(tmp_path):
    """Started from another folder, by a relative path: the resume command a stopped run prints,
    pasted into a shell in that folder, resumes it; the evaluate command the finished run prints
    evaluates it."""
    elsewhere = tmp_path / "experiments" / "today"
    elsewhere.mkdir(parents=True)
    script = os.path.relpath(REPO / "ppo" / "ppo.py", elsewhere)
    flags = ["--total-timesteps", "4096", "--num-steps", "128", "--save-model", "--no-cuda"]
    stopped = stop_after_first_progress_line([sys.executable, script, *flags], elsewhere)
    resume = printed_command(stopped, "resume with: ")
    assert resume.startswith(f"python {script} --resume runs/"), resume
    resumed = subprocess.run(
        resume, shell=True, cwd=elsewhere, capture_output=True, text=True, timeout=HUNG_AFTER,
        env={**script_environment(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert resumed.returncode == 0 and "resuming " in resumed.stdout, (
        resumed.stdout + resumed.stderr)
    evaluate = printed_command(resumed.stdout, "evaluate it with: ") + " --eval-episodes 1"
    evaluated = subprocess.run(
        evaluate, shell=True, cwd=elsewhere, capture_output=True, text=True, timeout=HUNG_AFTER,
        env={**script_environment(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, (
        evaluated.stdout + evaluated.stderr)


class BreaksAtStep(gym.Env):
    """An environment whose simulator raises at its `at`-th step."""

    observation_space, action_space = (gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                                       gym.spaces.Discrete(2))

    def __init__(self, at: int):
        self.at, self.t = at, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == self.at:
            raise RuntimeError("the simulator broke")
        return np.zeros(3, np.float32), 1.0, False, self.t % 8 == 0, {}


gym.register("BreaksAtStep40-v0", entry_point=BreaksAtStep, kwargs={"at": 40})


@pytest.mark.parametrize("saved", [True, False], ids=["after-a-checkpoint", "before-any"])
def test_an_environment_that_raises_mid_run_ends_naming_the_checkpoint_to_resume(
        saved, workdir, capsys):
    """The environment's traceback, as Python prints it, then one last line: the checkpoint kept and
    the command that resumes it, or that none was written."""
    flags = [*SAVE_FLAGS[2:], "--env-id", "BreaksAtStep40-v0",
             "--save-interval", "1" if saved else "0"]
    code, _, err = run_script_here("ppo", flags, capsys)
    assert code == 1 and "RuntimeError: the simulator broke" in err, err
    last = err.strip().splitlines()[-1]
    if saved:
        path = f"runs/{only_run_dir(workdir).name}/checkpoint.pt"
        assert last == ("ppo.py: the run stopped on the error above; the last good checkpoint, "
                        f"{path} (step 32), is kept: resume with: python "
                        f"{REPO / 'ppo' / 'ppo.py'} --resume {path}"), last
    else:
        assert last == "ppo.py: the run stopped on the error above; no checkpoint was written", last


# --------------------------------------------------------------------------------------------------
# Runs started together never share a folder
# --------------------------------------------------------------------------------------------------


def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path):
    """Two identical commands started at once, as a tuner's workers or a shell loop start them: each
    claims its own folder, and the one that found its name taken says which it took."""
    command = script_command("ppo.py", ["--total-timesteps", "128", "--num-steps", "32",
                                        "--no-cuda", "--save-model"])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for attempt in range(3):
        # the two must start within one second of each other: on a busy machine, retry
        workdir = tmp_path / f"attempt{attempt}"
        workdir.mkdir()
        processes = [subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        outputs = [process.communicate(timeout=HUNG_AFTER)[0] for process in processes]
        assert all(process.returncode == 0 for process in processes), outputs
        folders = sorted(path.name for path in (workdir / "runs").iterdir())
        if len({name.split("__")[-1].split("-")[0] for name in folders}) == 1:
            # both in the same second
            break
    else:
        pytest.skip("the two runs never started within the same second")
    assert len(folders) == 2 and folders[1] == folders[0] + "-2", folders
    assert sum(f"this run is {folders[1]}" in output for output in outputs) == 1, outputs
    for folder in folders:  # each its own log and checkpoint
        assert len(list((workdir / "runs" / folder).glob("events.*"))) == 1
        assert (workdir / "runs" / folder / "checkpoint.pt").is_file()


def test_every_script_claims_its_run_folder_through_its_run(workdir, monkeypatch):
    """The same name twice (the clock stopped): the second claim takes <name>-2. Every script names
    its run through training.Run, which claims the folder as the first iteration begins, checked
    here on the scripts' own source."""
    from ppo_utils import run_logs

    assert (run_logs.claim_run_folder("CartPole-v1__ppo__1__1800000000")
            == "CartPole-v1__ppo__1__1800000000")
    assert (run_logs.claim_run_folder("CartPole-v1__ppo__1__1800000000")
            == "CartPole-v1__ppo__1__1800000000-2")
    assert sorted(path.name for path in (workdir / "runs").iterdir()) == [
        "CartPole-v1__ppo__1__1800000000", "CartPole-v1__ppo__1__1800000000-2"]
    for script in ("ppo", "ppo_atari", "ppo_atari_lstm", "ppo_atari_envpool",
                   "ppo_continuous_action", "ppo_procgen", "ppo_atari_multigpu",
                   "ppo_multidiscrete"):
        assert "run = training.Run(" in (REPO / "ppo" / f"{script}.py").read_text(), script


# --------------------------------------------------------------------------------------------------
# Divergence: one line, its own exit code, and the last good checkpoint kept
# --------------------------------------------------------------------------------------------------

DIVERGED = 3
TINY = {  # flags of a tiny run of each script, and what it needs installed (by the names the
    # Procgen stack recognizes: tests/conftest.py marks the ppo_procgen case `procgen`)
    "ppo": (["--total-timesteps", "512", "--num-steps", "32"], ()),
    "ppo_continuous_action": (["--env-id", "Pendulum-v1", "--total-timesteps", "512",
                               "--num-steps", "64", "--num-minibatches", "2"], ()),
    **{script: (["--total-timesteps", "128", "--num-envs", "2", "--num-steps", "16",
                 "--num-minibatches", "2", "--update-epochs", "1"], ("ale_py", "cv2"))
       for script in ("ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu")},
    "ppo_atari_envpool": (["--env-id", "Breakout-v5", "--total-timesteps", "128", "--num-envs", "2",
                           "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"],
                          ("envpool",)),
    "ppo_procgen": (["--total-timesteps", "256", "--num-envs", "4", "--num-steps", "16",
                     "--num-minibatches", "2", "--update-epochs", "1"], ("procgen",)),
    "ppo_multidiscrete": (["--env-id", "CartPole-v1", "--total-timesteps", "512",
                           "--num-steps", "32"], ()),
}

# A launcher that runs a script as `python script.py ...` does, with one change: from the optimizer
# step given in POISON_AT on, the step writes NaN into the first weight, as a run that diverges late
# would. So divergence comes after some checkpoints were written, at a known point, in every script.
POISONED_OPTIMIZER = textwrap.dedent("""
    import os, runpy, sys, torch
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as `python script.py` does
    from ppo_utils import adam  # the scripts' optimizer
    steps, poison_at = [0], int(os.environ["POISON_AT"])
    step = adam.Adam.step
    def poisoned_step(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        steps[0] += 1
        if steps[0] >= poison_at:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("nan"))
        return result
    adam.Adam.step = poisoned_step
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def diverged_line(result: subprocess.CompletedProcess, script: str) -> str:
    assert result.returncode == DIVERGED, (result.returncode, result.stdout[-2000:],
                                           result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{script}.py: diverged: at step "), lines
    return lines[0]


@pytest.mark.parametrize("script", list(TINY))
def test_a_learning_rate_that_diverges_stops_the_run_in_one_line(script, tmp_path):
    flags, needs = TINY[script]
    for package in needs:
        pytest.importorskip(package)
    result = run_script(f"{script}.py", *flags, "--no-cuda", "--learning-rate", "1e30",
                        "--save-model", cwd=tmp_path, check=False)
    line = diverged_line(result, script)
    assert "became nan" in line or "became inf" in line or "weights became non-finite" in line, line
    assert "the learning rate 1e+30 is" in line and "lower it" in line, line
    assert "no checkpoint was written" in line, line  # the very first update diverged
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not (run_dir / "checkpoint.pt").exists()
    # The log is closed and readable, and holds nothing of the diverged update.
    assert "losses/policy_loss" not in read_scalars(run_dir)


@pytest.mark.parametrize("script", ["ppo", "ppo_continuous_action"])
def test_a_late_divergence_keeps_the_last_good_checkpoint_and_logs(script, tmp_path):
    """NaN from the third optimizer step on (the second iteration, with 2 minibatches and 1 epoch):
    the first iteration's checkpoint stays on disk, finite, the line names it, and TensorBoard holds
    the first iteration's scalars (flushed), none of the diverged one's."""
    flags, _ = TINY[script]
    launcher = [sys.executable, "-c", POISONED_OPTIMIZER]
    result = run_script(f"{script}.py", *flags, "--no-cuda", "--update-epochs", "1",
                        "--num-minibatches", "2", "--save-model", "--save-interval", "1",
                        cwd=tmp_path, check=False, launcher=launcher, env={"POISON_AT": "3"})
    line = diverged_line(result, script)
    (run_dir,) = (tmp_path / "runs").iterdir()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    first_iteration_steps = checkpoint["global_step"]
    assert checkpoint["iteration"] == 1
    assert all(torch.isfinite(value).all() for value in checkpoint["model"].values()
               if isinstance(value, torch.Tensor) and value.is_floating_point())
    assert f"at step {2 * first_iteration_steps:,}," in line, line
    assert (f"the last good checkpoint, runs/{run_dir.name}/checkpoint.pt (step "
            f"{first_iteration_steps:,}), is kept" in line), line
    assert ([step for step, _ in read_scalars(run_dir)["losses/policy_loss"]]
            == [first_iteration_steps])

    # --evaluate refuses weights that are not finite, in one line; the kept checkpoint evaluates.
    checkpoint["model"] = {key: value.fill_(float("nan")) if key.endswith("weight") else value
                           for key, value in checkpoint["model"].items()}
    torch.save(checkpoint, tmp_path / "nan.pt")
    refused = run_script(f"{script}.py", "--evaluate", str(tmp_path / "nan.pt"), "--no-cuda",
                         cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert (refused.stderr.strip().splitlines()
            == [f"{script}.py: error: '{tmp_path / 'nan.pt'}' holds non-finite weights (NaN or "
                "infinite: the run diverged): evaluate a checkpoint saved before it diverged"])
    run_script(f"{script}.py", "--evaluate", str(run_dir / "checkpoint.pt"), "--eval-episodes", "1",
               "--no-cuda", cwd=tmp_path)


def test_the_runner_reports_a_diverged_run_and_does_not_start_it_again(tmp_path):
    command = [sys.executable, str(REPO / "benchmark" / "run.py"), "--env-ids", "CartPole-v1",
               "--num-seeds", "1", "--command", "python ppo/ppo.py --total-timesteps 512 "
                                                "--num-steps 32 --no-cuda --learning-rate 1e30",
               "--workdir", str(tmp_path), "--log-dir", str(tmp_path / "logs")]
    first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=HUNG_AFTER)
    assert first.returncode == 1, first.stdout + first.stderr
    assert ("[DIVERGED] ppo CartPole-v1 seed 1: at step 128, the policy loss became nan"
            in first.stdout), first.stdout
    assert ("1 run(s): 0 ran ok, 0 skipped (finished earlier), 0 failed, 1 diverged"
            in first.stdout), first.stdout
    (marker,) = (tmp_path / "logs").rglob("*.done")
    assert json.loads(marker.read_text())["exit_code"] == DIVERGED
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=HUNG_AFTER)
    assert "[skip] ppo CartPole-v1 seed 1: diverged earlier" in again.stdout, again.stdout
    assert again.returncode == 0
