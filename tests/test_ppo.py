"""Tests of ppo/ppo.py: gymnasium 1.x autoreset, learning, determinism, checkpoints (exact
resumption after Ctrl-C, evaluation) and the command line. Its GAE and loss are checked with every
script's, in test_algorithm.py."""

import importlib.util
import os
import re
import signal
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (METRICS, REPO, assert_compiled_loss_matches_plain,
                      assert_run_with_option_resumes_exactly,
                      assert_every_evaluated_episode_returns, assert_compiles_whole,
                      assert_details_marked, assert_evaluation_output,
                      assert_first_minibatch_replays_the_rollout, assert_logs_every_metric,
                      assert_same_final_weights, expect_missing_package_error, expect_usage_error,
                      interrupt_after_first_progress_line, only_run_dir, read_scalars, run_script,
                      run_unbroken_and_interrupted, without_module,
                      assert_evaluation_plays_the_saved_weights,
                      assert_target_kl_ends_the_update_early, assert_one_copy_to_the_host_per_step,
                      assert_logged_losses_are_the_updates_own, expect_error_line,
                      assert_the_batch_is_what_the_policy_saw_and_did,
                      assert_anneal_clip_lowers_the_clipping_coefficient, PROGRESS_LINE,
                      assert_progress_is_printed_within_a_rollout,
                      assert_stopped_with_its_logs_flushed, clock_of_the_steps)
import ppo.ppo as script
from conftest import parse_args as parse_args_of
from ppo.ppo import Agent, Args, evaluate, main, minibatch_loss


def parse_args(argv: list[str]):  # what `python ppo/ppo.py argv...` reads
    return parse_args_of(script, argv)


# A small, fast configuration: 2 envs x 32 steps, 2 minibatches.
SMALL = dict(num_envs=2, num_steps=32, num_minibatches=2, cuda=False)
SMALL_FLAGS = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--no-cuda"]


# GAE and the loss of every script, this one's included: tests/test_algorithm.py.


# --------------------------------------------------------------------------------------------------
# gymnasium 1.x autoreset
# --------------------------------------------------------------------------------------------------

EPISODE_LENGTH = 5
# per step: an episode's return is never its length, so a logged return can't be a length
REWARD = 2.0


class FixedLengthEnv(gym.Env):
    """Every episode lasts exactly EPISODE_LENGTH steps with REWARD per step; the class counts the
    step() calls that really reach an environment."""

    observation_space = gym.spaces.Box(0.0, EPISODE_LENGTH, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    step_calls = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        FixedLengthEnv.step_calls += 1
        self.t += 1
        return np.array([self.t], dtype=np.float32), REWARD, self.t == EPISODE_LENGTH, False, {}


gym.register(id="FixedLength-v0", entry_point=FixedLengthEnv)


class EndlessEnv(FixedLengthEnv):
    """FixedLengthEnv that never terminates: registered with a time limit of EPISODE_LENGTH steps,
    its episodes end by truncation only."""

    def step(self, action):
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


gym.register(id="TimeLimited-v0", entry_point=EndlessEnv, max_episode_steps=EPISODE_LENGTH)


def test_a_time_limit_ends_the_episode_for_gae_too(workdir, monkeypatch):
    """A truncated episode ends like a terminated one in the rollout (the next step begins a new
    episode, so GAE does not run on into it), and it is logged as a finished episode."""
    received_dones = []
    compute_gae = script.compute_gae

    def recording_gae(rewards, values, dones, *rest):
        received_dones.append(dones.copy())
        return compute_gae(rewards, values, dones, *rest)

    monkeypatch.setattr(script, "compute_gae", recording_gae)
    result = main(Args(env_id="TimeLimited-v0", total_timesteps=64, **SMALL))
    # the first rollout, first environment: episodes start at 0, 5, 10, ...
    dones = received_dones[0][:, 0]
    assert list(np.flatnonzero(dones)) == list(range(EPISODE_LENGTH, len(dones), EPISODE_LENGTH))
    assert result["recent_returns"] and set(result["recent_returns"]) == {REWARD * EPISODE_LENGTH}


def test_every_stored_transition_is_a_real_step(workdir):
    """With gymnasium's default NEXT_STEP autoreset, the step after an episode's end only resets the
    environment and ignores the action; storing it would train on a transition that never happened.
    Here every one of the run's transitions must have reached an environment's step(), and every
    logged episode must have exactly EPISODE_LENGTH real steps, each with its REWARD."""
    FixedLengthEnv.step_calls = 0
    args = Args(env_id="FixedLength-v0", total_timesteps=128, **SMALL)
    result = main(args)
    assert result["global_step"] == 128
    assert FixedLengthEnv.step_calls == 128

    scalars = read_scalars(only_run_dir(workdir))
    returns = [value for _, value in scalars["charts/episodic_return"]]
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    # 64 steps per env, a finished episode every 5
    assert len(returns) == 2 * (64 // EPISODE_LENGTH)
    assert set(returns) == {REWARD * EPISODE_LENGTH}
    assert set(lengths) == {float(EPISODE_LENGTH)}


@pytest.mark.smoke
def test_evaluation_prints_each_episodes_own_return(workdir, capsys):
    """Every episode of FixedLength-v0 returns the same, whatever the policy: an evaluation that
    carried one episode's return into the next would print a growing sequence."""
    assert_every_evaluated_episode_returns(script, Args(env_id="FixedLength-v0",
                                                        total_timesteps=128, **SMALL), capsys,
                                           expected=REWARD * EPISODE_LENGTH)


def test_the_env_factory_returns_the_next_episode_on_the_step_that_ends_one():
    from ppo.ppo import make_envs

    envs = make_envs("FixedLength-v0", 1)
    obs, _ = envs.reset(seed=0)
    for t in range(1, EPISODE_LENGTH + 3):
        obs, reward, terminated, truncated, info = envs.step(np.array([0]))
        assert reward[0] == REWARD  # never the zero-reward reset step
        if t == EPISODE_LENGTH:
            assert terminated[0]
            assert obs[0, 0] == 0.0  # already the first observation of the next episode
            assert info["final_obs"][0][0] == EPISODE_LENGTH
        else:
            assert obs[0, 0] == t % EPISODE_LENGTH
    envs.close()


# --------------------------------------------------------------------------------------------------
# Learning and determinism
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_cartpole(tmp_path_factory) -> Path:
    """A short CartPole-v1 training run with a saved checkpoint, shared by the tests that need
    one."""
    directory = tmp_path_factory.mktemp("trained")
    previous = Path.cwd()
    os.chdir(directory)
    try:
        result = main(Args(env_id="CartPole-v1", total_timesteps=40_960, seed=1, cuda=False,
                           save_model=True))
    finally:
        os.chdir(previous)
    return result, only_run_dir(directory) / "checkpoint.pt"


def test_cartpole_learns_well_above_random(trained_cartpole):
    """A uniformly random policy scores about 22 on CartPole-v1."""
    result, _ = trained_cartpole
    assert np.mean(result["recent_returns"]) > 120


def test_the_first_minibatch_of_each_update_replays_the_rollout(workdir, monkeypatch):
    assert_first_minibatch_replays_the_rollout(
        script, Args(env_id="CartPole-v1", total_timesteps=256, **SMALL), monkeypatch)


def test_the_batch_holds_the_observations_acted_on_and_the_actions_drawn(workdir, monkeypatch):
    assert_the_batch_is_what_the_policy_saw_and_did(
        script, Args(env_id="CartPole-v1", total_timesteps=256, **SMALL), monkeypatch)


def test_anneal_clip_lowers_the_clipping_coefficient_with_each_iteration(workdir, monkeypatch):
    assert_anneal_clip_lowers_the_clipping_coefficient(
        script, Args(env_id="CartPole-v1", total_timesteps=256, **SMALL), monkeypatch)


def test_the_rollout_copies_only_the_actions_to_the_host(workdir, monkeypatch):
    assert_one_copy_to_the_host_per_step(script,
                                         Args(env_id="CartPole-v1", total_timesteps=128, **SMALL),
                                         monkeypatch, gym.vector.SyncVectorEnv, action_shape=(2,))


def test_the_logged_losses_are_the_updates_own(workdir, monkeypatch):
    assert_logged_losses_are_the_updates_own(script, Args(env_id="CartPole-v1", total_timesteps=128,
                                                          **SMALL), monkeypatch)


def test_target_kl_ends_the_update_early(workdir, monkeypatch):
    assert_target_kl_ends_the_update_early(
        script, Args(env_id="CartPole-v1", total_timesteps=128, **SMALL), monkeypatch)


def test_evaluation_plays_the_saved_weights(workdir, monkeypatch):
    assert_evaluation_plays_the_saved_weights(
        script, Args(env_id="CartPole-v1", total_timesteps=128, **SMALL), monkeypatch)


def test_same_seed_gives_identical_metrics(workdir, monkeypatch):
    logs = []
    for name in ("first", "second"):
        (workdir / name).mkdir()
        monkeypatch.chdir(workdir / name)
        main(Args(env_id="CartPole-v1", total_timesteps=2048, seed=7, **SMALL))
        logs.append(read_scalars(only_run_dir(workdir / name)))
    first, second = logs
    assert set(first) >= set(METRICS)
    for tag in METRICS:
        if tag != "charts/SPS":  # wall-clock speed is the one thing allowed to differ
            assert first[tag] == second[tag], tag


# --------------------------------------------------------------------------------------------------
# Checkpoints: Ctrl-C, exact resumption, evaluation
# --------------------------------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_interrupted_and_resumed_run_ends_with_the_same_weights(tmp_path, stop_signal):
    """Ctrl-C and `kill` (SIGTERM, also what Slurm sends at a time limit), each sent to every
    process of the run, as a terminal and Slurm do: the run finishes the iteration, writes its
    checkpoint and logs, exits 130, and resumed it ends as an unbroken run. (SIGUSR1: the video test
    below.)"""
    flags = ["--seed", "3", "--total-timesteps", "2560", "--save-model", *SMALL_FLAGS]
    unbroken, interrupted, output = run_unbroken_and_interrupted("ppo.py", flags, tmp_path,
                                                                 stop_signal=stop_signal)
    # the path as run
    assert f"resume with: python {REPO / 'ppo' / 'ppo.py'} --resume runs/" in output
    run_dir = only_run_dir(interrupted)
    checkpoint_path = run_dir / "checkpoint.pt"
    stopped_at = assert_stopped_with_its_logs_flushed(checkpoint_path)
    assert 0 < stopped_at < 2560

    # Resumed from another directory: the run goes on in its checkpoint's folder all the same.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = run_script("ppo.py", "--resume", str(checkpoint_path), cwd=elsewhere)
    assert f"resuming {run_dir.name} at step {stopped_at:,}" in resumed.stdout
    assert not (elsewhere / "runs").exists()

    assert_same_final_weights(unbroken, checkpoint_path, 2560)  # and the same TensorBoard log

    evaluation = run_script("ppo.py", "--evaluate", str(checkpoint_path), "--eval-episodes", "3",
                            cwd=interrupted)
    assert_evaluation_output(evaluation.stdout, "CartPole-v1", 3)


# `python ppo/ppo.py ...` killed by SIGKILL (the out-of-memory killer, a node that dies) at the
# KILL_AT_STEP-th step of its CartPole games, once TensorBoard's writer has written out what it
# holds: a run whose log has iterations past its last checkpoint, which it cannot clean up.
KILLED_AT_A_STEP = """\
import os, runpy, signal, sys
import gymnasium.envs.classic_control.cartpole as cartpole
from torch.utils.tensorboard import SummaryWriter
writers, steps, kill_at = [], [0], int(os.environ["KILL_AT_STEP"])
open_writer, step = SummaryWriter.__init__, cartpole.CartPoleEnv.step
def recorded(self, *args, **kwargs):
    open_writer(self, *args, **kwargs)
    writers.append(self)
def step_or_die(self, action):
    steps[0] += 1
    if steps[0] == kill_at:
        for writer in writers:
            writer.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, action)
SummaryWriter.__init__, cartpole.CartPoleEnv.step = recorded, step_or_die
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as `python ppo/ppo.py` puts it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_run_killed_past_its_checkpoint_resumes_to_the_unbroken_runs_log(tmp_path):
    """SIGKILL gives a run no chance to save: its log holds iterations after its last checkpoint
    (every 3rd iteration of 2 x 16 steps here, killed in the 8th, the 7th logged). Resumed from the
    checkpoint, the log holds each step once, as an unbroken run's does: no doubled points, no
    zig-zag back."""
    import subprocess
    import sys

    flags = ["--seed", "4", "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "320",
             "--save-model", "--save-interval", "3", "--no-cuda"]
    (tmp_path / "unbroken").mkdir()
    run_script("ppo.py", *flags, cwd=tmp_path / "unbroken")
    (tmp_path / "killed").mkdir()
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_A_STEP, str(REPO / "ppo" / "ppo.py"),
                             *flags], cwd=tmp_path / "killed", capture_output=True, text=True, env={
                                 **os.environ, "KILL_AT_STEP": str(7 * 32 + 5),
                                 "OMP_NUM_THREADS": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    checkpoint_path = only_run_dir(tmp_path / "killed") / "checkpoint.pt"
    saved_at = torch.load(checkpoint_path, weights_only=False)["global_step"]
    logged = [step for step, _ in read_scalars(checkpoint_path.parent)["charts/SPS"]]
    # one iteration past the checkpoint
    assert saved_at == 6 * 32 and logged[-1] == 7 * 32, (saved_at, logged)

    run_script("ppo.py", "--resume", str(checkpoint_path), cwd=tmp_path / "killed")
    # and the same log, step for step
    assert_same_final_weights(tmp_path / "unbroken", checkpoint_path, 320)


def test_a_signal_delivered_twice_is_one_request_and_a_second_one_stops_at_once(
        capsys, monkeypatch):
    """Slurm signals every process of a task, and the runner (or torchrun) above a run passes the
    signal on: a SIGTERM within a second of the first stop signal is the same request, and so is
    SIGUSR1, Slurm's warning, whenever it comes again. A later SIGTERM, or a second Ctrl-C however
    soon, stops at once."""
    from ppo_utils import exits
    from ppo_utils import training

    now = [100.0]
    monkeypatch.setattr(training.time, "monotonic", lambda: now[0])

    def stops_at_once(signum: int) -> bool:
        try:
            signal.raise_signal(signum)
        except exits.StoppedAtOnce:
            # a KeyboardInterrupt: caught here, it would end the whole session
            return True
        return False

    stop = exits.StopOnInterrupt()
    try:
        assert not stops_at_once(signal.SIGTERM) and stop.requested
        assert ("SIGTERM: stopping after this iteration (Ctrl-C or SIGTERM to quit at once)"
                in capsys.readouterr().out)
        now[0] += 0.5
        assert not stops_at_once(signal.SIGTERM)  # the same request, from the runner
        now[0] += 60
        assert not stops_at_once(signal.SIGUSR1)  # Slurm's warning, again
        assert stops_at_once(signal.SIGTERM)
    finally:
        stop.restore()
    stop = exits.StopOnInterrupt()
    try:
        assert not stops_at_once(signal.SIGINT)
        assert stops_at_once(signal.SIGINT)  # pressed twice at once: two presses
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_save_minutes_writes_the_checkpoint_by_the_clock(workdir, monkeypatch):
    """--save-minutes bounds the work a crash or `kill -9` loses: with a clock that each step of the
    environments advances by 1/1024 s, iterations of 32 steps last 1/32 s, and a run told to save
    every 1.5/32 s (and never by its iteration count) saves after every second iteration, and at the
    end."""
    from ppo_utils import checkpoint as checkpoints

    saved = []
    write = checkpoints.Checkpoint.write
    monkeypatch.setattr(checkpoints.Checkpoint, "write",
                        lambda checkpoint, path: saved.append(checkpoint.iteration)
                        or write(checkpoint, path))
    with clock_of_the_steps(gym.vector.SyncVectorEnv):
        main(Args(total_timesteps=512, save_model=True, save_interval=0,
                  save_minutes=1.5 / 32 / 60, **SMALL))
    assert saved == [2, 4, 6, 8]


def test_a_checkpoint_of_another_version_is_refused_in_one_line(trained_cartpole, capsys, workdir):
    """A checkpoint written by a version of the script with a setting this one lacks cannot be
    resumed: the runner reports that line, rather than a traceback, and does not start the run
    again."""
    _, checkpoint_path = trained_cartpole
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    torch.save({**checkpoint, "args": {**checkpoint["args"], "a_later_setting": 1}},
               workdir / "later.pt")
    expect_usage_error(capsys, lambda: parse_args(["--resume", str(workdir / "later.pt")]),
                       "ppo.py", "written by another version of ppo.py", "(a_later_setting)")


def test_evaluation_scores_a_trained_agent_far_above_an_untrained_one(trained_cartpole, workdir):
    _, checkpoint_path = trained_cartpole
    trained = evaluate(*parse_args(["--evaluate", str(checkpoint_path),
                                    "--eval-episodes", "10", "--no-cuda"]))

    from ppo.ppo import Agent
    untrained_checkpoint = torch.load(checkpoint_path, weights_only=False)
    untrained_checkpoint["model"] = Agent(4, 2).state_dict()
    torch.save(untrained_checkpoint, workdir / "untrained.pt")
    untrained = evaluate(*parse_args(["--evaluate", "untrained.pt",
                                      "--eval-episodes", "10", "--no-cuda"]))
    assert len(trained) == len(untrained) == 10
    assert np.mean(trained) > 80
    assert np.mean(trained) > 2 * np.mean(untrained)


# --------------------------------------------------------------------------------------------------
# The command line: flags, metrics, errors
# --------------------------------------------------------------------------------------------------


def test_help_lists_the_shared_flags(tmp_path):
    result = run_script("ppo.py", "--help", cwd=tmp_path)
    for flag in ("--env-id", "--seed", "--total-timesteps", "--num-envs", "--cuda", "--no-cuda",
                 "--track", "--capture-video", "--save-model", "--resume", "--evaluate",
                 "--learning-rate", "--clip-coef"):
        # whole: not --cuda in --cudagraphs
        assert re.search(rf"(?<![\w-]){flag}(?![\w-])", result.stdout), flag


@pytest.mark.smoke
def test_tiny_run_logs_every_metric_and_the_hyperparameters(tmp_path):
    result = run_script("ppo.py", "--total-timesteps", "1024", *SMALL_FLAGS, cwd=tmp_path)
    assert ([match.group(1) for match in PROGRESS_LINE.finditer(result.stdout)][-1]
            == "1,024"), result.stdout
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("CartPole-v1__ppo__1__")
    assert_logs_every_metric(run_dir)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    assert "hyperparameters/text_summary" in accumulator.Tags()["tensors"]


@pytest.mark.smoke
def test_capture_video_writes_mp4_files(tmp_path):
    run_script("ppo.py", "--total-timesteps", "512", "--capture-video", *SMALL_FLAGS, cwd=tmp_path)
    videos = list((tmp_path / "videos").rglob("*.mp4"))
    assert videos and all(video.stat().st_size > 1000 for video in videos)


def test_a_run_resumed_with_capture_video_records_new_episodes_beside_the_old_ones(tmp_path):
    """Environments that record cannot be saved: a resumed run with --capture-video starts new
    episodes, says so, and writes their videos into a folder of its own (its episode count starts
    again at 0: the first sitting's episode 0 must stay as it was). Stopped by SIGUSR1, Slurm's
    warning before a time limit, which stops a run as Ctrl-C does."""
    flags = ["--total-timesteps", "2560", "--save-model", "--capture-video", *SMALL_FLAGS]
    code, output = interrupt_after_first_progress_line("ppo.py", flags, cwd=tmp_path,
                                                       stop_signal=signal.SIGUSR1)
    assert code == 130 and "SIGUSR1: stopping after this iteration" in output, output
    assert_stopped_with_its_logs_flushed(only_run_dir(tmp_path) / "checkpoint.pt")
    run_dir, videos = only_run_dir(tmp_path), tmp_path / "videos" / only_run_dir(tmp_path).name
    first_sitting = {video.name: video.read_bytes() for video in videos.glob("*.mp4")}
    assert "rl-video-episode-0.mp4" in first_sitting
    stopped_at = torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"]

    result = run_script("ppo.py", "--resume", str(run_dir / "checkpoint.pt"),
                        cwd=tmp_path)  # video kept on
    assert "resuming" in result.stdout and "(with new episodes)" in result.stdout, result.stdout
    assert {video.name: video.read_bytes() for video in videos.glob("*.mp4")} == first_sitting
    resumed = list((videos / f"resumed-at-step-{stopped_at}").glob("*.mp4"))
    assert resumed and all(video.stat().st_size > 1000 for video in resumed)


def test_an_evaluation_films_its_episodes_and_no_more(workdir):
    """After the last evaluated episode the environment resets, which starts episode 1 on
    gymnasium's schedule (0, 1, 8, ...): closing the environment then wrote a one-frame video of a
    game nobody played."""
    main(Args(total_timesteps=128, save_model=True, **SMALL))
    run_dir = only_run_dir(workdir)
    evaluate(*parse_args(["--evaluate", str(run_dir / "checkpoint.pt"), "--eval-episodes", "1",
                          "--capture-video", "--no-cuda"]))
    videos = workdir / "videos" / f"{run_dir.name}-eval"
    assert sorted(video.name for video in videos.glob("*.mp4")) == ["rl-video-episode-0.mp4"]


@pytest.mark.smoke
def test_track_works_offline(tmp_path):
    run_script("ppo.py", "--total-timesteps", "512", "--track", *SMALL_FLAGS, cwd=tmp_path,
               env={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"})
    offline_runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1
    assert list(offline_runs[0].glob("*.wandb"))


def test_a_ctrl_c_while_wandb_saves_the_run_does_not_interrupt_it(capsys, monkeypatch, workdir):
    """Interrupting wandb.finish() crashes W&B's service (a Go panic) and loses the upload: a first
    Ctrl-C there only says that W&B is still saving; a second one abandons it."""
    wandb = pytest.importorskip("wandb")
    import signal

    presses = []

    def finish_pressing_ctrl_c(times: int):
        def finish():
            for press in range(1, times + 1):
                try:
                    signal.raise_signal(signal.SIGINT)
                except KeyboardInterrupt:
                    presses.append(f"interrupted by press {press}")
                    raise
            presses.append(f"{times} presses")
        return finish

    monkeypatch.setattr(wandb, "init", lambda **kwargs: None)
    monkeypatch.setattr(wandb, "finish", finish_pressing_ctrl_c(1))
    try:
        result = main(Args(total_timesteps=128, track=True, **SMALL))
    except KeyboardInterrupt:  # caught here: pytest would stop the whole session
        result = None
    assert presses == ["1 presses"], presses
    assert not result["interrupted"] and result["global_step"] == 128
    assert ("W&B is still saving the run (press Ctrl-C again to abandon it)"
            in capsys.readouterr().out)

    monkeypatch.setattr(wandb, "finish", finish_pressing_ctrl_c(2))
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):  # __main__ turns it into one line and exit code 130
            main(Args(total_timesteps=128, track=True, **SMALL))
    finally:
        signal.signal(signal.SIGINT, handler)
    assert presses[-1] == "interrupted by press 2"


def test_track_without_a_wandb_login_is_one_line(tmp_path):
    """Online tracking with no API key (none in the environment, no ~/.netrc): wandb.init
    refuses."""
    result = run_script("ppo.py", "--track", "--total-timesteps", "128", *SMALL_FLAGS, cwd=tmp_path,
                        check=False, env={"WANDB_MODE": "online", "WANDB_API_KEY": "",
                                          "HOME": str(tmp_path), "WANDB_DIR": str(tmp_path),
                                          "WANDB_CONFIG_DIR": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("ppo.py: error: --track could not "
                                                             "start Weights & Biases")
    assert "Traceback" not in result.stderr and "WANDB_MODE=offline" in result.stderr


def test_unknown_env_id(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="CartPoel-v1", cuda=False)), "ppo.py",
                       "unknown env id 'CartPoel-v1'")
    expect_usage_error(capsys, lambda: main(Args(env_id="BreakoutNoFrameskip-v4", cuda=False)),
                       "ppo.py", "ppo/ppo_atari.py")


def test_an_atari_game_is_refused_once_ale_py_registered_its_games(capsys, workdir):
    """Registered (ale-py registers its games in the process that imports it), an Atari game's
    frames are a Box that the MLP could flatten: it is refused with the script that trains on
    them."""
    gym.register_envs(pytest.importorskip("ale_py"))
    expect_usage_error(capsys, lambda: main(Args(env_id="BreakoutNoFrameskip-v4", cuda=False)),
                       "ppo.py", "is an Atari game, seen as frames: ppo/ppo_atari.py")


def test_registered_ids_that_cannot_be_made_here(capsys, workdir):
    """gymnasium registers ids whose code needs a package the project does not install (jax)."""
    if importlib.util.find_spec("jax") is not None:
        pytest.skip("jax is installed here")
    expect_usage_error(capsys, lambda: main(Args(env_id="phys2d/CartPole-v1", cuda=False)),
                       "ppo.py", "phys2d/CartPole-v1 cannot be made with the packages installed",
                       "No module named 'jax'")


def test_continuous_actions_point_to_the_continuous_script(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="Pendulum-v1", cuda=False)), "ppo.py",
                       "Box action space", "ppo/ppo_continuous_action.py")


def test_sizes_that_do_not_divide(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(num_envs=3, num_steps=5, num_minibatches=4)),
                       "ppo.py", "15", "--num-minibatches 4")


def test_total_timesteps_smaller_than_one_batch(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(total_timesteps=100)), "ppo.py",
                       "--total-timesteps 100", "512")


def test_checkpoints_of_another_variant_or_env_are_refused(capsys, workdir):
    main(Args(total_timesteps=128, save_model=True, **SMALL))
    checkpoint_path = str(only_run_dir(workdir) / "checkpoint.pt")
    expect_usage_error(capsys,
                       lambda: parse_args(["--resume", checkpoint_path, "--env-id", "Acrobot-v1"]),
                       "ppo.py", "--env-id CartPole-v1", "Acrobot-v1")
    expect_usage_error(capsys, lambda: parse_args(["--resume", checkpoint_path, "--num-envs", "8"]),
                       "ppo.py", "--num-envs 2", "not 8")
    expect_usage_error(capsys, lambda: parse_args(["--evaluate", checkpoint_path,
                                                   "--env-id", "Acrobot-v1"]), "ppo.py",
                       "--env-id CartPole-v1")
    # Evaluating on other seeds, or resuming with other run-time options, is fine.
    assert parse_args(["--evaluate", checkpoint_path, "--seed", "5"])[0].seed == 5
    resumed, _ = parse_args(["--resume", checkpoint_path, "--no-save-model"])
    assert (resumed.num_envs, resumed.save_model, resumed.resume) == (2, False, checkpoint_path)

    checkpoint = torch.load(checkpoint_path, weights_only=False)
    checkpoint["variant"] = "ppo_atari"
    torch.save(checkpoint, "atari.pt")
    expect_usage_error(capsys, lambda: parse_args(["--evaluate", "atari.pt"]), "ppo.py",
                       "ppo/ppo_atari.py")
    expect_usage_error(capsys, lambda: parse_args(["--resume", "missing.pt"]), "ppo.py",
                       "no checkpoint at 'missing.pt'")
    Path("junk.pt").write_text("not a checkpoint")
    expect_usage_error(capsys, lambda: parse_args(["--evaluate", "junk.pt"]), "ppo.py",
                       "cannot read checkpoint")


def test_the_progress_line_speaks_within_long_rollouts_too(workdir, capsys):
    assert_progress_is_printed_within_a_rollout(script, Args(env_id="CartPole-v1",
                                                             total_timesteps=128, **SMALL), capsys,
                                                gym.vector.SyncVectorEnv)


def test_a_finished_run_resumed_says_so_and_exits_0(tmp_path):
    run_script("ppo.py", "--total-timesteps", "128", "--save-model", *SMALL_FLAGS, cwd=tmp_path)
    checkpoint_path = only_run_dir(tmp_path) / "checkpoint.pt"
    before = checkpoint_path.read_bytes()
    # exit code 0, or it raises
    result = run_script("ppo.py", "--resume", str(checkpoint_path), cwd=tmp_path)
    assert result.stdout.strip() == (f"{checkpoint_path.parent.name} is already finished (128 of "
                                     "128 steps): evaluate it with: python "
                                     f"{REPO / 'ppo' / 'ppo.py'} --evaluate {checkpoint_path}")
    assert checkpoint_path.read_bytes() == before


def test_help_begins_with_what_the_script_is_for_and_its_commands(tmp_path):
    result = run_script("ppo.py", "--help", cwd=tmp_path)
    assert "PPO for discrete actions on vector observations" in result.stdout
    assert "python ppo/ppo.py --resume runs/<run>/checkpoint.pt" in result.stdout


def test_a_runs_file_in_the_way_is_a_one_line_error(tmp_path):
    """Where `runs` is a file, not a folder, the run cannot write its logs: it says so in one line
    (it ended in a NotADirectoryError traceback before)."""
    (tmp_path / "runs").write_text("not a folder")
    result = run_script("ppo.py", "--total-timesteps", "128", *SMALL_FLAGS,
                        cwd=tmp_path, check=False)
    line = expect_error_line(result, "ppo.py",
                             "cannot write the run's logs to 'runs/CartPole-v1__ppo__1__")
    assert "remove what is in the way" in line


def test_errors_end_without_a_traceback(tmp_path):
    result = run_script("ppo.py", "--env-id", "NoSuchEnv-v0", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "Traceback" not in result.stderr


def test_missing_video_dependency_names_the_extra(tmp_path):
    result = run_script("ppo.py", "--total-timesteps", "512", "--capture-video", *SMALL_FLAGS,
                        cwd=tmp_path, env=without_module(tmp_path, "moviepy"), check=False)
    expect_missing_package_error(result, "ppo.py", "moviepy", ".[classic-control,video]")


# --------------------------------------------------------------------------------------------------
# Speed options: --compile, --cudagraphs
# --------------------------------------------------------------------------------------------------


def test_compiled_minibatch_loss_equals_the_plain_one():
    """--compile changes how the loss is computed, not what: on the same minibatch the compiled
    loss, statistics and gradients are the plain ones within float tolerance."""
    torch.manual_seed(0)
    agent, size = Agent(4, 2), 32  # the size of a minibatch of SMALL: one graph to compile
    obs, actions = torch.randn(size, 4), torch.randint(0, 2, (size,))
    with torch.no_grad():
        _, logprob, _, value = agent.get_action_and_value(obs, actions)
    # The policy and value as they were before a few updates: some ratios leave the clip range.
    old_logprob, old_value = (logprob + 0.3 * torch.randn(size),
                              value.flatten() + 0.3 * torch.randn(size))
    stats = assert_compiled_loss_matches_plain(minibatch_loss, agent, obs, actions, old_logprob,
                                               old_value, torch.randn(size), torch.randn(size),
                                               0.2, Args())
    assert 0 < stats["clipfrac"] < 1  # both branches of the clipped objective took part
    actions = assert_compiles_whole(agent.get_action, obs)  # the rollout's policy step
    assert actions.shape == (size,) and set(actions.tolist()) <= {0, 1}


def test_compiled_run_logs_every_metric_and_resumes_exactly(workdir):
    # Ctrl-C during the 40th vector step, in the second iteration: that iteration finishes, then the
    # run stops.
    args = Args(env_id="CartPole-v1", seed=3, total_timesteps=320, save_model=True,
                compile=True, **SMALL)
    assert_run_with_option_resumes_exactly(script, args, workdir, gym.vector.SyncVectorEnv,
                                           interrupt_at_step=40)


def test_the_numpy_policy_gives_the_networks_logits_and_draws_as_its_softmax_says():
    """[Speed: the policy step in NumPy] The actor's NumPy copy gives the network's logits (up to
    float rounding), and the draw picks each action as often as their softmax says: 20,000 draws
    where the softmax is (0.1, 0.2, 0.7) whatever the observation."""
    torch.manual_seed(0)
    agent = Agent(4, 3)
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    with torch.no_grad():
        logits = agent.actor(torch.as_tensor(obs)).numpy()
    assert np.allclose(script.numpy_policy.NumpyMLP(agent.actor)(obs), logits, atol=1e-6)
    with torch.no_grad():
        agent.actor[4].weight.zero_()
        agent.actor[4].bias.copy_(torch.tensor([0.1, 0.2, 0.7]).log())
    np.random.seed(0)
    actions = script.numpy_policy.categorical_draw(agent.actor)(
        np.zeros((20_000, 4), dtype=np.float32))
    assert np.allclose(np.bincount(actions, minlength=3) / 20_000, [0.1, 0.2, 0.7], atol=0.01)


def test_a_numpy_policy_run_learns(workdir):
    """The same run as trained_cartpole's, with the policy step in NumPy: other random numbers, the
    same learning (final returns 170, 192, 206 with seeds 1, 2, 3)."""
    result = main(Args(env_id="CartPole-v1", total_timesteps=40_960, seed=1, cuda=False,
                       numpy_policy=True))
    assert np.mean(result["recent_returns"]) > 120


def test_a_numpy_policy_run_logs_every_metric_and_resumes_exactly(workdir):
    args = Args(env_id="CartPole-v1", seed=3, total_timesteps=320, save_model=True,
                numpy_policy=True, **SMALL)
    assert_run_with_option_resumes_exactly(script, args, workdir, gym.vector.SyncVectorEnv,
                                           interrupt_at_step=40, option="numpy_policy")


def test_cudagraphs_without_a_gpu_is_a_one_line_error(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(total_timesteps=128, cudagraphs=True, **SMALL)),
                       "ppo.py", "--cudagraphs needs a CUDA device")


def test_every_core_detail_is_marked_in_the_script():
    assert_details_marked("ppo.py", {"Core": 13})
