"""Tests of ppo/ppo_atari.py on real Atari frames: the wrapper stack (shapes, clipped rewards,
lives, game scores, frame skipping for v4 and v5 ids), a short training run, exact resumption from a
checkpoint, evaluation, and the errors for wrong input."""

import importlib

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from conftest import (assert_compiled_loss_matches_plain, assert_compiles_whole,  # noqa: E402
                      assert_details_marked, assert_evaluation_output,
                      assert_first_minibatch_replays_the_rollout, assert_logs_every_metric,
                      assert_resume_keeps_the_latest_scores, assert_same_final_weights,
                      expect_missing_package_error, expect_usage_error, only_run_dir, run_script,
                      run_unbroken_and_interrupted, without_module,
                      assert_evaluation_plays_the_saved_weights,
                      assert_target_kl_ends_the_update_early, assert_one_copy_to_the_host_per_step,
                      assert_logged_losses_are_the_updates_own,
                      assert_each_update_starts_at_ratio_one,
                      assert_anneal_clip_lowers_the_clipping_coefficient,
                      assert_progress_is_printed_within_a_rollout,
                      assert_stopped_with_its_logs_flushed)
import ppo.ppo_atari as ppo_atari  # noqa: E402
from conftest import parse_args as parse_args_of  # noqa: E402
from ppo.ppo_atari import Agent, Args, main, make_env, make_envs, minibatch_loss  # noqa: E402
from ppo_utils import atari_games  # noqa: E402
from ppo_utils.environments import finished_episodes, save_envs  # noqa: E402


def parse_args(argv: list[str]):  # what `python ppo/ppo_atari.py argv...` reads
    return parse_args_of(ppo_atari, argv)

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--no-cuda"]
TINY_ARGS = dict(num_envs=2, num_steps=16, num_minibatches=2, cuda=False)


def wrapper_types(env: gym.Env) -> list[type]:
    """The classes of a wrapper stack, outermost first."""
    types = []
    while isinstance(env, gym.Wrapper):
        types.append(type(env))
        env = env.env
    return types


# --------------------------------------------------------------------------------------------------
# The wrapper stack, on real frames. ppo_atari_lstm.py and ppo_atari_multigpu.py carry their own
# copy of it: the tests that need no original pipeline check all three.
# --------------------------------------------------------------------------------------------------

ALE_SCRIPTS = ["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu"]


@pytest.fixture(params=ALE_SCRIPTS)
def script(request):
    return importlib.import_module(f"ppo.{request.param}")


def test_observations_are_stacked_84x84_grayscale_frames(script):
    """Four stacked frames; one in the LSTM variant, whose memory replaces the stack."""
    frames = 1 if script.VARIANT == "ppo_atari_lstm" else 4
    env = script.make_env("BreakoutNoFrameskip-v4", 0, False, "videos")()
    obs, _ = env.reset(seed=0)
    assert env.observation_space.shape == obs.shape == (frames, 84, 84)
    assert obs.dtype == np.uint8
    assert np.array_equal(obs[0], obs[-1])  # on reset the stack holds the first frame four times
    rng = np.random.default_rng(0)
    for _ in range(300):
        obs, reward, terminated, truncated, _ = env.step(rng.integers(4))
        if terminated or truncated:
            env.reset()
    assert obs.std() > 0  # real frames, not a blank screen
    types = wrapper_types(env)
    assert (types.index(atari_games.FireReset) < types.index(atari_games.EpisodicLife)
            < types.index(gym.wrappers.RecordEpisodeStatistics))


@pytest.mark.parametrize("game, max_differing_pixels", [("Breakout", 0.0), ("Pong", 0.01)])
def test_atari_preprocessing_matches_the_original_pipeline_but_for_the_pooling_order(
        game, max_differing_pixels):
    """The original wrappers max-pool the last two color frames, convert to grayscale, then resize
    (OpenCV, area interpolation); gymnasium's AtariPreprocessing, which the script uses, max-pools
    grayscale frames. Same emulator, same actions: the rewards agree, and the observations are
    identical in Breakout and differ in under 1% of the pixels in Pong."""
    import cv2

    env_id = f"{game}NoFrameskip-v4"
    make_env(env_id, 0, False, "videos")  # registers ale-py's games
    ours = gym.wrappers.AtariPreprocessing(gym.make(env_id), noop_max=0, frame_skip=4,
                                           screen_size=84)
    raw = gym.make(env_id)
    ours.reset(seed=0)
    raw.reset(seed=0)
    rng = np.random.default_rng(0)
    differing = []
    for _ in range(300):
        action = rng.integers(ours.action_space.n)
        obs, reward, terminated, _, _ = ours.step(action)
        frames, raw_reward = [], 0.0
        for _ in range(4):
            frame, r, raw_terminated, _, _ = raw.step(action)
            frames, raw_reward = frames[-1:] + [frame], raw_reward + r
            if raw_terminated:
                break
        assert reward == raw_reward and terminated == raw_terminated
        if terminated:
            break
        original = cv2.resize(cv2.cvtColor(np.maximum(*frames), cv2.COLOR_RGB2GRAY), (84, 84),
                              interpolation=cv2.INTER_AREA)
        differing.append(np.mean(obs != original))
    assert len(differing) > 100
    assert max(differing) <= max_differing_pixels


def test_each_game_starts_after_a_random_number_of_no_ops(script):
    """[Atari 1] Up to 30 no-op frames on reset, drawn from the seed: the first observed frame
    varies from game to game (FireReset's fixed steps come on top)."""
    env = script.make_env("BreakoutNoFrameskip-v4", 0, False, "videos")()
    start_frames = set()
    for seed in range(10):
        env.reset(seed=seed)
        start_frames.add(env.unwrapped.ale.getEpisodeFrameNumber())
    assert len(start_frames) > 3


def test_every_reset_presses_fire_then_action_2_also_after_a_lost_life(script, monkeypatch):
    """[Atari 4] Breakout launches its ball only on FIRE: each reset, the game's first and the one
    after a lost life, ends with FIRE (1) and then action 2, as the original wrapper's does."""
    actions = []
    original_step = gym.wrappers.AtariPreprocessing.step

    def recording_step(self, action):
        actions.append(int(action))
        return original_step(self, action)

    monkeypatch.setattr(gym.wrappers.AtariPreprocessing, "step", recording_step)
    env = script.make_env("BreakoutNoFrameskip-v4", 0, False, "videos")()
    env.reset(seed=0)
    assert actions[-2:] == [1, 2]
    lives = env.unwrapped.ale.lives()
    while env.unwrapped.ale.lives() == lives:  # no action at all: the ball is lost
        env.step(0)
    actions.clear()
    env.reset()
    assert actions[-2:] == [1, 2]


class ThreeStepEpisodes(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t == 3, False, {}


def test_a_lost_life_beside_a_finished_game_is_not_a_game(script):
    """In one step, game 0 loses a life (its training episode ends, with no game statistics) while
    game 1 is over: only game 1 is a finished game. The vector env files both ends under final_info;
    the game statistics' own mask says which games they belong to."""
    with_statistics = lambda: gym.wrappers.RecordEpisodeStatistics(  # noqa: E731
        ThreeStepEpisodes())
    envs = gym.vector.SyncVectorEnv([ThreeStepEpisodes, with_statistics],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    for _ in range(3):
        *_, infos = envs.step(np.zeros(2, dtype=np.int64))
    assert list(infos["_final_info"]) == [True, True]
    assert finished_episodes(infos) == [(3.0, 3)]


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5"])
def test_every_step_is_four_frames_for_v4_and_v5_ids(script, env_id):
    """ALE/...-v5 skips 4 frames itself by default; the script makes it with frameskip=1 so that
    the preprocessing skips 4, as for NoFrameskip-v4, and never 16."""
    env = script.make_env(env_id, 0, False, "videos")()
    env.reset(seed=0)
    ale = env.unwrapped.ale
    for _ in range(5):
        before = ale.getEpisodeFrameNumber()
        _, _, terminated, _, _ = env.step(0)
        assert ale.getEpisodeFrameNumber() - before == 4
        assert not terminated


def test_a_lost_life_ends_the_training_episode_but_not_the_game(script, monkeypatch):
    """Random Breakout until the game is over: every lost life sets terminated for training, the
    game goes on after the reset (same game, one life fewer), and the logged score is that of the
    whole game: the sum of the unclipped rewards over all its lives."""
    raw_rewards = []
    original_step = gym.wrappers.AtariPreprocessing.step

    def recording_step(self, action):
        result = original_step(self, action)
        raw_rewards.append(result[1])
        return result

    monkeypatch.setattr(gym.wrappers.AtariPreprocessing, "step", recording_step)
    env = script.make_env("BreakoutNoFrameskip-v4", 0, False, "videos")()
    env.reset(seed=1)  # FireReset's steps in here are part of the game, and recorded
    ale = env.unwrapped.ale
    rng = np.random.default_rng(1)
    lives_at_episode_end, clipped_sum = [], 0.0
    for _ in range(10_000):
        _, reward, terminated, truncated, info = env.step(rng.integers(4))
        clipped_sum += reward
        if terminated or truncated:
            lives_at_episode_end.append(ale.lives())
            if "episode" in info:  # the game is over
                break
            assert not ale.game_over()
            frame = ale.getEpisodeFrameNumber()
            env.reset()  # after a lost life: the same game goes on
            assert ale.getEpisodeFrameNumber() > frame and ale.lives() == lives_at_episode_end[-1]
    else:
        pytest.fail("the game did not end")
    assert lives_at_episode_end[:4] == [4, 3, 2, 1]  # four lost lives, each a training episode...
    assert ale.game_over()  # ...and the fifth ended the game
    assert info["episode"]["r"] == pytest.approx(sum(raw_rewards))
    assert info["episode"]["r"] >= clipped_sum


def test_rewards_are_clipped_and_the_game_score_is_not(script):
    """BeamRider scores 44 points per enemy: the training reward is 1, the logged score 44 each."""
    env = script.make_env("BeamRiderNoFrameskip-v4", 0, False, "videos")()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    rewards = []
    for _ in range(20_000):
        _, reward, terminated, truncated, info = env.step(rng.integers(env.action_space.n))
        rewards.append(reward)
        if "episode" in info:
            break
        if terminated or truncated:
            env.reset()
    assert set(rewards) <= {-1.0, 0.0, 1.0} and sum(rewards) > 0
    assert info["episode"]["r"] > sum(rewards)
    assert info["episode"]["r"] % 44 == 0


def test_a_restored_vector_env_continues_the_very_same_games():
    """pickle alone would rebuild each emulator at a new game's first frame; with the emulator state
    saved beside it, the games continue exactly, frame stacks, lives and game scores included."""
    envs = make_envs("BreakoutNoFrameskip-v4", 2)
    envs.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(100):
        envs.step(rng.integers(4, size=2))
    restored = make_envs("BreakoutNoFrameskip-v4", 2, saved_envs=save_envs(envs))
    games = 0
    for _ in range(600):
        action = rng.integers(4, size=2)
        expected, actual = envs.step(action), restored.step(action)
        for a, b in zip(expected[:4], actual[:4]):
            assert np.array_equal(a, b)
        assert finished_episodes(expected[4]) == finished_episodes(actual[4])
        games += len(finished_episodes(expected[4]))
    assert games > 0


# --------------------------------------------------------------------------------------------------
# Training, checkpoints, evaluation
# --------------------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_a_tiny_run_logs_every_metric_and_real_game_scores(workdir):
    result = main(Args(total_timesteps=1024, seed=2, **TINY_ARGS))
    assert result["global_step"] == 1024
    scalars = assert_logs_every_metric(only_run_dir(workdir))
    # Random Breakout loses its 5 lives in roughly 150-250 steps: games, not lives, are logged.
    assert all(length > 50 for _, length in scalars["charts/episodic_length"])
    assert len(scalars["charts/episodic_return"]) < 1024 / 50


def test_the_first_minibatch_of_each_update_replays_the_rollout(workdir, monkeypatch):
    assert_first_minibatch_replays_the_rollout(ppo_atari,
                                               Args(total_timesteps=96, **TINY_ARGS), monkeypatch)


def test_with_async_envs_each_update_starts_at_ratio_one(workdir):
    """The games play in worker processes: the observations, actions and log-probabilities stored
    must still be those of one and the same step."""
    assert_each_update_starts_at_ratio_one(
        ppo_atari, lambda: main(Args(total_timesteps=96, async_envs=True, **TINY_ARGS)))


def test_anneal_clip_lowers_the_clipping_coefficient_with_each_iteration(workdir, monkeypatch):
    assert_anneal_clip_lowers_the_clipping_coefficient(
        ppo_atari, Args(total_timesteps=96, **TINY_ARGS), monkeypatch)


def test_the_progress_line_speaks_within_long_rollouts_too(workdir, capsys):
    assert_progress_is_printed_within_a_rollout(ppo_atari, Args(total_timesteps=64, **TINY_ARGS),
                                                capsys, gym.vector.SyncVectorEnv)


def test_the_rollout_copies_only_the_actions_to_the_host(workdir, monkeypatch):
    assert_one_copy_to_the_host_per_step(ppo_atari, Args(total_timesteps=64, **TINY_ARGS),
                                         monkeypatch, gym.vector.SyncVectorEnv, action_shape=(2,))


def test_the_logged_losses_are_the_updates_own(workdir, monkeypatch):
    assert_logged_losses_are_the_updates_own(ppo_atari,
                                             Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_target_kl_ends_the_update_early(workdir, monkeypatch):
    assert_target_kl_ends_the_update_early(ppo_atari,
                                           Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_evaluation_plays_the_saved_weights(workdir, monkeypatch):
    assert_evaluation_plays_the_saved_weights(ppo_atari,
                                              Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_v5_ids_train_and_name_the_run_without_a_slash(workdir):
    result = main(Args(env_id="ALE/Pong-v5", total_timesteps=64, **TINY_ARGS))
    assert result["run_name"].startswith("ALE-Pong-v5__ppo_atari__1__")
    assert only_run_dir(workdir).name == result["run_name"]


def test_network_shapes_and_initialization():
    agent = Agent(num_actions=6)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    action, logprob, entropy, value = agent.get_action_and_value(obs)
    assert action.shape == logprob.shape == entropy.shape == (3,) and value.shape == (3, 1)
    # The policy head starts near uniform (std 0.01), so the entropy is close to log(6).
    assert entropy.mean().item() == pytest.approx(np.log(6), abs=0.01)
    assert agent.network[0].bias.abs().sum() == 0


@pytest.mark.smoke
def test_interrupted_and_resumed_run_ends_with_the_same_weights_and_evaluates(tmp_path):
    flags = ["--seed", "3", "--total-timesteps", "160", "--save-model", *TINY]
    unbroken, interrupted, output = run_unbroken_and_interrupted("ppo_atari.py", flags, tmp_path)
    run_dir = only_run_dir(interrupted)
    checkpoint_path = run_dir / "checkpoint.pt"
    stopped = torch.load(checkpoint_path, weights_only=False)
    assert 0 < stopped["global_step"] < 160
    assert stopped["processes"][0]["envs"] is not None  # the games themselves were saved
    assert_resume_keeps_the_latest_scores("ppo_atari.py", checkpoint_path, tmp_path)

    resumed = run_script("ppo_atari.py", "--resume", str(checkpoint_path), cwd=interrupted)
    assert f"resuming {run_dir.name} at step {stopped['global_step']:,}" in resumed.stdout
    expected, actual = assert_same_final_weights(unbroken, checkpoint_path, 160)
    assert np.array_equal(expected["processes"][0]["rollout"]["next_obs"],
                          actual["processes"][0]["rollout"]["next_obs"])

    evaluation = run_script("ppo_atari.py", "--evaluate", str(checkpoint_path),
                            "--eval-episodes", "2", cwd=interrupted)
    assert_evaluation_output(evaluation.stdout, "BreakoutNoFrameskip-v4", 2)


# --------------------------------------------------------------------------------------------------
# Speed options: asynchronous environments, torch.compile, CUDA graphs
# --------------------------------------------------------------------------------------------------


def test_async_envs_play_the_same_games_as_sync_envs_and_save_them_alike():
    """ale-py is deterministic given the seeds: the games in worker processes give the same frames,
    rewards, dones and game scores as the games in this process; and games saved from the workers
    continue, in this process, exactly as the workers' own games do."""
    sync, workers = (make_envs("BreakoutNoFrameskip-v4", 2),
                     make_envs("BreakoutNoFrameskip-v4", 2, async_envs=True))
    try:
        assert isinstance(workers, gym.vector.AsyncVectorEnv)
        assert np.array_equal(sync.reset(seed=5)[0], workers.reset(seed=5)[0])
        rng = np.random.default_rng(0)
        games = 0
        for step in range(500):
            action = rng.integers(4, size=2)
            expected, actual = sync.step(action), workers.step(action)
            for a, b in zip(expected[:4], actual[:4]):
                assert np.array_equal(a, b), step
            assert finished_episodes(expected[4]) == finished_episodes(actual[4])
            games += len(finished_episodes(expected[4]))
        assert games > 0
        saved = save_envs(workers)
        assert isinstance(saved, list) and len(saved) == 2
        restored = make_envs("BreakoutNoFrameskip-v4", 2, saved_envs=saved)
        for _ in range(300):
            action = rng.integers(4, size=2)
            expected, actual = workers.step(action), restored.step(action)
            for a, b in zip(expected[:4], actual[:4]):
                assert np.array_equal(a, b)
    finally:
        sync.close()
        workers.close()


@pytest.mark.parametrize("async_envs", [False, True], ids=["sync", "async"])
def test_games_recorded_on_video_are_not_saved_and_the_worker_writes_the_video(
        tmp_path, async_envs):
    """The video recorder is not part of a checkpoint (a resumed run starts new games), in this
    process as in a worker process, where RecordVideo writes its files itself."""
    envs = make_envs("BreakoutNoFrameskip-v4", 2, capture_video=True,
                     video_folder=str(tmp_path / "videos"), async_envs=async_envs)
    envs.reset(seed=0)
    for _ in range(20):
        envs.step(np.ones(2, dtype=np.int64))
    assert save_envs(envs) is None
    envs.close()  # ends the recording of the unfinished game: the file is written now
    assert list((tmp_path / "videos").glob("*.mp4"))


def test_an_async_run_interrupted_and_resumed_ends_as_an_unbroken_sync_run(tmp_path):
    """Ctrl-C reaches the workers too (the whole process group): they ignore it, the main process
    saves their games and its logs, and the run resumes, with or without --async-envs, to the very
    weights of a run that never stopped and never had worker processes. (SIGTERM to every process,
    as at a Slurm task's time limit: the LSTM script's async test.)"""
    import shutil

    flags = ["--seed", "3", "--total-timesteps", "160", "--save-model", *TINY]
    unbroken, interrupted, output = run_unbroken_and_interrupted(
        "ppo_atari.py", flags, tmp_path, interrupted_flags=("--async-envs",))
    assert "Traceback" not in output, output
    run_dir = only_run_dir(interrupted)
    assert 0 < assert_stopped_with_its_logs_flushed(run_dir / "checkpoint.pt") < 160
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert stopped["args"]["async_envs"]
    assert len(stopped["processes"][0]["envs"]) == 2  # every worker's game was saved
    in_sync = tmp_path / "in_sync"
    shutil.copytree(interrupted, in_sync)

    run_script("ppo_atari.py", "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert_same_final_weights(unbroken, run_dir / "checkpoint.pt", 160)
    sync_checkpoint = only_run_dir(in_sync) / "checkpoint.pt"
    run_script("ppo_atari.py", "--resume", str(sync_checkpoint), "--no-async-envs", cwd=in_sync)
    assert_same_final_weights(unbroken, sync_checkpoint, 160)


def test_the_compiled_minibatch_loss_gives_the_plain_loss_and_gradients():
    torch.manual_seed(0)
    agent = Agent(num_actions=4)
    generator = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (32, 4, 84, 84), dtype=torch.uint8, generator=generator)
    actions = torch.randint(0, 4, (32,), generator=generator)
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(obs, actions)
    minibatch = (obs, actions, logprobs + 0.2 * torch.randn(32, generator=generator),
                 values.flatten() + torch.randn(32, generator=generator),
                 1.0 + torch.randn(32, generator=generator),
                 values.flatten() + torch.randn(32, generator=generator))
    stats = assert_compiled_loss_matches_plain(minibatch_loss, agent, *minibatch, 0.1, Args())
    assert stats["clipfrac"] > 0  # the clipped branches are part of the comparison
    # the rollout's policy step
    action, _, _, value = assert_compiles_whole(agent.get_action_and_value, obs)
    assert action.shape == (32,) and value.shape == (32, 1)


def test_a_compiled_run_trains_starts_each_update_at_ratio_one_and_logs_every_metric(workdir):
    result = assert_each_update_starts_at_ratio_one(
        ppo_atari, lambda: main(Args(total_timesteps=64, compile=True, **TINY_ARGS)))
    assert result["global_step"] == 64
    assert_logs_every_metric(only_run_dir(workdir),
                             except_for=("charts/episodic_return", "charts/episodic_length"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cudagraphs_without_cuda_is_a_one_line_error(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(cudagraphs=True, **TINY_ARGS)), "ppo_atari.py",
                       "--cudagraphs needs a CUDA device")


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


def test_ids_that_are_not_ale_games_point_to_the_right_script(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="CartPole-v1")),
                       "ppo_atari.py", "ppo/ppo.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="Pendulum-v1")), "ppo_atari.py",
                       "ppo/ppo_continuous_action.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="Breakout-v5")), "ppo_atari.py",
                       "ALE/Breakout-v5", "ppo/ppo_atari_envpool.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="Breakuot-v4")), "ppo_atari.py",
                       "unknown env id")


def test_a_box_action_space_is_refused(capsys, workdir):
    gym.register(id="ContinuousBreakoutTest-v0", entry_point="ale_py.env:AtariEnv",
                 kwargs={"game": "breakout", "continuous": True, "repeat_action_probability": 0.0})
    expect_usage_error(capsys, lambda: main(Args(env_id="ContinuousBreakoutTest-v0", **TINY_ARGS)),
                       "ppo_atari.py", "Box action space", "ppo/ppo_continuous_action.py")


def test_sizes_and_checkpoints_of_another_variant(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(num_envs=3, num_steps=5, num_minibatches=4)),
                       "ppo_atari.py", "--num-minibatches 4")
    main(Args(total_timesteps=32, save_model=True, **TINY_ARGS))
    checkpoint_path = str(only_run_dir(workdir) / "checkpoint.pt")
    expect_usage_error(capsys, lambda: parse_args(["--resume", checkpoint_path,
                                                   "--env-id", "PongNoFrameskip-v4"]),
                       "ppo_atari.py", "--env-id BreakoutNoFrameskip-v4")
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    checkpoint["variant"] = "ppo_atari_lstm"
    torch.save(checkpoint, "lstm.pt")
    expect_usage_error(capsys, lambda: parse_args(["--evaluate", "lstm.pt"]), "ppo_atari.py",
                       "ppo/ppo_atari_lstm.py")


def test_missing_ale_py_names_the_extra(tmp_path):
    result = run_script("ppo_atari.py", *TINY, "--total-timesteps", "32", cwd=tmp_path,
                        env=without_module(tmp_path, "ale_py"), check=False)
    expect_missing_package_error(result, "ppo_atari.py", "pip install -e '.[atari]'")


def test_every_core_and_atari_detail_is_marked_in_the_script():
    assert_details_marked("ppo_atari.py", {"Core": 13, "Atari": 9})
