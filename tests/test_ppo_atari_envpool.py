"""Tests of ppo/ppo_atari_envpool.py: what envpool does at an episode's end (the facts the training
loop relies on), game scores logged from envpool's info, a short run, checkpoints, and the
errors."""

import signal

import numpy as np
import pytest
import torch

pytest.importorskip("envpool")

import ppo.ppo_atari_envpool as script  # noqa: E402
from conftest import (parse_args, write_checkpoint,  # noqa: E402
                      assert_compiled_loss_matches_plain, assert_compiles_whole,
                      assert_details_marked, assert_evaluation_output,
                      assert_first_minibatch_replays_the_rollout, assert_logs_every_metric,
                      expect_missing_package_error, expect_usage_error,
                      interrupt_after_first_progress_line, only_run_dir, read_scalars, run_script,
                      without_module, assert_evaluation_plays_the_saved_weights,
                      assert_target_kl_ends_the_update_early, assert_one_copy_to_the_host_per_step,
                      assert_logged_losses_are_the_updates_own,
                      assert_each_update_starts_at_ratio_one,
                      assert_anneal_clip_lowers_the_clipping_coefficient,
                      assert_progress_is_printed_within_a_rollout,
                      assert_stopped_with_its_logs_flushed)
from ppo.ppo_atari_envpool import Args, main, make_envs  # noqa: E402
from ppo_utils import exits, training  # noqa: E402

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--no-cuda"]
TINY_ARGS = dict(num_envs=2, num_steps=16, num_minibatches=2, cuda=False)


def play(actions: np.ndarray, seed: int = 3) -> list[tuple]:
    """Step one Breakout-v5 game with the given actions; (obs, reward, terminated, truncated, info)
    per step."""
    envs = make_envs("Breakout-v5", 1, seed=seed)
    envs.reset()
    steps = [envs.step(np.array([action])) for action in actions]
    envs.close()
    return steps


def test_the_step_after_an_episode_ends_is_a_reset_that_ignores_its_action():
    """envpool's autoreset, which the training loop relies on: after a lost life (episodic_life) or
    a game's end, the next step() resets that environment, returns reward 0 and ignores the action.
    Two runs that differ only in that step's action stay identical; differing in any other step's
    action makes them drift apart. The training loop leaves exactly those steps (dones[t] = 1) out.
    The step that ends an episode returns its final observation, which Games passes on as
    info["final_obs"]."""
    actions = np.random.default_rng(0).integers(4, size=400)
    steps = play(actions)
    ends = [t for t, step in enumerate(steps) if step[2][0] or step[3][0]]
    lost_life = next(t for t in ends if not steps[t][4]["terminated"][0])
    game_over = next(t for t in ends if steps[t][4]["terminated"][0])
    for end in (lost_life, game_over):
        reset_step = end + 1
        assert steps[reset_step][1][0] == 0.0 and steps[reset_step][4]["reward"][0] == 0.0
        variants = []
        for action in (2, 3):  # RIGHT, LEFT
            changed = actions.copy()
            changed[reset_step] = action
            variants.append(play(changed))
        for a, b in zip(variants[0][reset_step:reset_step + 30],
                        variants[1][reset_step:reset_step + 30]):
            assert np.array_equal(a[0], b[0])
    # So where an episode ends, the step's observation is its last, not the next one's first: Games
    # reports it as info["final_obs"], the observation --bootstrap-truncated values.
    for end in (lost_life, game_over):
        assert np.array_equal(steps[end][4]["final_obs"][0], steps[end][0][0])
        assert not np.array_equal(steps[end + 1][0][0], steps[end][0][0])
    # After a lost life the game goes on (the reset step does not count as a step of the game);
    # after the game's end a new game starts.
    assert steps[lost_life + 1][4]["elapsed_step"][0] == steps[lost_life][4]["elapsed_step"][0]
    assert (steps[game_over + 1][4]["elapsed_step"][0] == 0
            and steps[game_over + 1][4]["lives"][0] == 5)

    # The control: changing the action of an ordinary step changes what follows.
    ordinary = lost_life + 8
    variants = []
    for action in (2, 3):
        changed = actions.copy()
        changed[ordinary:ordinary + 3] = action
        variants.append(play(changed))
    assert any(not np.array_equal(a[0], b[0])
               for a, b in zip(variants[0][ordinary:], variants[1][ordinary:]))


def test_the_pool_is_configured_as_the_atari_details_say():
    """envpool's settings for the [Atari 1-7] details and the v5 games' deviations from them: the
    frames and rewards other tests check cannot tell sticky actions or a shorter time limit
    apart."""
    envs = make_envs("Breakout-v5", 1, seed=1)
    expected = {"noop_max": 30, "frame_skip": 4, "episodic_life": True, "use_fire_reset": True,
                "img_height": 84, "img_width": 84, "gray_scale": True, "reward_clip": True,
                "stack_num": 4, "repeat_action_probability": 0.0, "max_episode_steps": 27000}
    assert {name: envs.pools[0].config[name] for name in expected} == expected
    envs.close()


def test_observations_rewards_and_unclipped_info_rewards():
    envs = make_envs("BeamRider-v5", 2, seed=1)
    obs, _ = envs.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert envs.single_observation_space.shape == (4, 84, 84)
    rng = np.random.default_rng(0)
    clipped, unclipped = set(), set()
    for _ in range(1500):
        obs, reward, terminated, truncated, info = envs.step(
            rng.integers(envs.single_action_space.n, size=2))
        clipped.update(reward.tolist())
        unclipped.update(info["reward"].tolist())
        assert np.array_equal(info["env_id"], [0, 1])  # results come back in environment order
    envs.close()
    assert clipped <= {-1.0, 0.0, 1.0}
    assert 44.0 in unclipped  # BeamRider's points per enemy: the training reward is 1, the score 44


class RecordingGames:
    """The games script.make_envs builds, each result of their recv() also given to
    record(pool, result), pool naming the envpool it came from (--async-envs makes two)."""

    def __init__(self, envs, record):
        self.envs, self.record = envs, record

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def recv(self, pool=0):
        result = self.envs.recv(pool)
        self.record(pool, result)
        return result


def record_every_recv(monkeypatch, record) -> None:
    """Have script.make_envs build RecordingGames that give every recv()'s result to record."""

    make = script.make_envs
    monkeypatch.setattr(script, "make_envs",
                        lambda *args, **kwargs: RecordingGames(make(*args, **kwargs), record))


@pytest.mark.parametrize("async_envs", [False, True], ids=["one-pool", "two-pools"])
def test_logged_game_scores_are_the_sums_of_info_reward_over_whole_games(
        workdir, monkeypatch, async_envs):
    """Train briefly while recording every step envpool returns; recompute each game's score by hand
    (the sum of info["reward"] until the game itself ends, across lost lives) and compare with
    charts/episodic_return, logged at the number of steps played so far. With --async-envs the two
    pools' steps alternate, each adding its own games' steps to the count."""
    # (pool, terminated, truncated, info) in the order the training loop received them
    recorded = []
    record_every_recv(monkeypatch, lambda pool, result: recorded.append(
        (pool, result[2].copy(), result[3].copy(),
         {k: result[4][k].copy() for k in ("reward", "terminated", "elapsed_step")})))
    main(Args(env_id="Breakout-v5", total_timesteps=1024, seed=5,
              async_envs=async_envs, **TINY_ARGS))

    expected, lives_lost_in_logged_games, steps_played = [], 0, 0
    score, lost = {}, {}
    for pool, terminated, truncated, info in recorded:
        score.setdefault(pool, np.zeros(len(terminated)))
        lost.setdefault(pool, np.zeros(len(terminated)))
        steps_played += len(terminated)
        score[pool] += info["reward"]
        over = info["terminated"].astype(bool) | truncated
        lost[pool] += terminated & ~over
        for i in np.flatnonzero(over):
            expected.append((steps_played, score[pool][i], info["elapsed_step"][i]))
            lives_lost_in_logged_games += lost[pool][i]
        score[pool][over], lost[pool][over] = 0.0, 0
    assert len(score) == (2 if async_envs else 1) and steps_played == 1024
    scalars = read_scalars(only_run_dir(workdir))
    logged = [(step, value) for step, value in scalars["charts/episodic_return"]]
    assert len(expected) >= 2 and lives_lost_in_logged_games >= 4  # whole games, across lives
    assert logged == [(step, pytest.approx(value)) for step, value, _ in expected]
    assert ([value for _, value in scalars["charts/episodic_length"]]
            == [length for _, _, length in expected])


def spy_on_the_update(monkeypatch) -> tuple[list, list]:
    """Record the dones of each rollout (what compute_gae is given) and, for each minibatch the loss
    is computed on, its size and the agent's weights at that moment."""
    rollouts, minibatches = [], []
    compute_gae, minibatch_loss = script.compute_gae, script.minibatch_loss

    def recording_gae(rewards, values, dones, *rest):
        rollouts.append(dones.copy())
        return compute_gae(rewards, values, dones, *rest)

    def recording_loss(agent, obs, *rest):
        minibatches.append((len(obs),
                            {name: value.clone() for name, value in agent.state_dict().items()}))
        return minibatch_loss(agent, obs, *rest)

    monkeypatch.setattr(script, "compute_gae", recording_gae)
    monkeypatch.setattr(script, "minibatch_loss", recording_loss)
    return rollouts, minibatches


def test_an_evaluation_scores_whole_games_unclipped(workdir, monkeypatch):
    """BeamRider pays 44 points per enemy: the evaluation's score is the sum of envpool's unclipped
    info["reward"] over the game's lives, not of the clipped rewards the agent trains on."""

    steps = []

    class Recording:
        def __init__(self, envs):
            self.envs = envs

        def __getattr__(self, name):
            return getattr(self.envs, name)

        def step(self, action):
            result = self.envs.step(action)
            steps.append((float(result[1][0]), float(result[4]["reward"][0])))
            return result

    make = script.make_envs
    monkeypatch.setattr(script, "make_envs",
                        lambda *args, **kwargs: Recording(make(*args, **kwargs)))
    torch.manual_seed(0)
    write_checkpoint(workdir / "untrained.pt", script, Args(env_id="BeamRider-v5"),
                     script.Agent(9).state_dict(), run_name="untrained")
    scores = script.evaluate(*parse_args(script, ["--evaluate", "untrained.pt",
                                                  "--eval-episodes", "1", "--no-cuda"]))
    clipped, unclipped = (sum(rewards) for rewards in zip(*steps))
    assert scores == [unclipped]
    assert unclipped >= 44 * clipped > 0


def test_the_first_minibatch_of_each_update_replays_the_rollout(workdir, monkeypatch):
    assert_first_minibatch_replays_the_rollout(script,
                                               Args(total_timesteps=96, **TINY_ARGS), monkeypatch)


@pytest.mark.parametrize("async_envs, pool_size", [(False, 2), (True, 1)],
                         ids=["one-pool", "two-pools"])
def test_the_rollout_copies_only_the_actions_to_the_host(workdir, monkeypatch,
                                                         async_envs, pool_size):
    """Between two sends to a pool, whichever pool: its actions, and nothing else."""
    from envpool.python.envpool import EnvPoolMixin

    assert_one_copy_to_the_host_per_step(script, Args(total_timesteps=64, async_envs=async_envs,
                                                      **TINY_ARGS), monkeypatch, EnvPoolMixin,
                                         action_shape=(pool_size,), step_method="send")


def test_the_progress_line_speaks_within_long_rollouts_too(workdir, capsys):
    """The clock ticks at each pool's recv: a step of the games."""
    from envpool.python.envpool import EnvPoolMixin

    assert_progress_is_printed_within_a_rollout(script, Args(total_timesteps=64, **TINY_ARGS),
                                                capsys, EnvPoolMixin, step_method="recv")


def test_the_logged_losses_are_the_updates_own(workdir, monkeypatch):
    """320 random steps lose lives: reset steps are in the rollouts."""
    assert_logged_losses_are_the_updates_own(script, Args(total_timesteps=320, **TINY_ARGS),
                                             monkeypatch, reset_steps_left_out=True)


def test_target_kl_ends_the_update_early(workdir, monkeypatch):
    assert_target_kl_ends_the_update_early(script,
                                           Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_evaluation_plays_the_saved_weights(workdir, monkeypatch):
    assert_evaluation_plays_the_saved_weights(script,
                                              Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_the_reset_steps_are_left_out_of_the_update(workdir, monkeypatch):
    """The step after a lost life only resets the game (envpool ignores its action): an update
    trains on every other step of the rollout, and on nothing else."""
    rollouts, minibatches = spy_on_the_update(monkeypatch)
    main(Args(**TINY_ARGS, update_epochs=1, total_timesteps=320))
    assert sum(dones.sum() for dones in rollouts) > 0  # 160 random steps per game lose lives
    trained = [size for size, _ in minibatches]
    per_update = [sum(trained[i:i + 2]) for i in range(0, len(trained), 2)]  # 2 minibatches each
    assert per_update == [dones.size - dones.sum() for dones in rollouts]


def test_a_resumed_run_trains_the_saved_weights(workdir, monkeypatch):
    """envpool's games restart on --resume, so no unbroken run can be compared with: the resumed
    run's first update must start from the checkpoint's weights, and shuffle its batch with the
    checkpoint's NumPy generator (the rollout between draws nothing from it)."""
    class StopAfterTheFirstIteration(exits.StopOnInterrupt):
        def __init__(self, **options):
            super().__init__(**options)
            self.requested = True  # as if Ctrl-C came during the first iteration

    with monkeypatch.context() as patch:
        patch.setattr(training, "StopOnInterrupt", StopAfterTheFirstIteration)
        stopped = main(Args(**TINY_ARGS, total_timesteps=96, save_model=True))
    assert stopped["interrupted"] and stopped["global_step"] == 32

    _, minibatches = spy_on_the_update(monkeypatch)
    generator_states, shuffle = [], np.random.shuffle

    def recording_shuffle(indices):
        generator_states.append(np.random.get_state())
        shuffle(indices)

    monkeypatch.setattr(np.random, "shuffle", recording_shuffle)
    checkpoint_path = only_run_dir(workdir) / "checkpoint.pt"
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    resumed = main(*parse_args(script, ["--resume", str(checkpoint_path)]))
    assert resumed["global_step"] == 96
    _, first_weights = minibatches[0]
    for name, value in checkpoint["model"].items():
        assert torch.equal(first_weights[name], value), name
    for drawn_from, saved in zip(generator_states[0], checkpoint["processes"][0]["rng"]["numpy"]):
        assert np.array_equal(drawn_from, saved)


@pytest.mark.parametrize("norm_adv, num_minibatches", [(True, 2), (False, 4)],
                         ids=["size-2", "size-1"])
def test_the_smallest_minibatches_train_without_nans(workdir, norm_adv, num_minibatches):
    """Leaving a lost life's reset step out of a 4-step batch shrinks a minibatch of 2 to 1 (no
    spread to normalize by) and can leave a minibatch of 1 empty (a mean over nothing): both trained
    NaN weights or losses before. 400 steps of one random Breakout game lose a few lives."""
    result = main(Args(num_envs=1, num_steps=4, num_minibatches=num_minibatches, norm_adv=norm_adv,
                       total_timesteps=400, cuda=False))
    assert all(torch.isfinite(weights).all() for weights in result["agent"].state_dict().values())
    for tag, points in read_scalars(only_run_dir(workdir)).items():
        assert np.isfinite([value for _, value in points]).all(), tag


def test_an_evaluation_films_the_whole_first_game(workdir):
    """envpool has no gymnasium wrapper to film with: --capture-video renders the game at each step
    and writes the video when the game, not a life, is over."""
    torch.manual_seed(0)
    write_checkpoint(workdir / "untrained.pt", script, Args(), script.Agent(4).state_dict(),
                     run_name="untrained")
    script.evaluate(*parse_args(script, ["--evaluate", "untrained.pt", "--eval-episodes", "1",
                                         "--capture-video", "--no-cuda"]))
    videos = list((workdir / "videos" / "untrained-eval").glob("*.mp4"))
    assert ([video.name for video in videos] == ["rl-video-episode-0.mp4"]
            and videos[0].stat().st_size > 1000)


@pytest.mark.parametrize("speed_flags, stop_signal",
                         [([], signal.SIGTERM), (["--async-envs"], signal.SIGINT)],
                         ids=["one-pool-SIGTERM", "two-pools-Ctrl-C"])
@pytest.mark.smoke
def test_an_interrupted_run_resumes_with_new_games_and_evaluates(
        tmp_path, speed_flags, stop_signal):
    """envpool's games cannot be saved: the weights, optimizer, random generators and counters
    resume exactly, and the games start anew. Stopped by Ctrl-C, or by SIGTERM as `kill` and Slurm
    stop it: the checkpoint and the logs up to it are written all the same."""
    flags = ["--total-timesteps", "160", "--save-model", *TINY, *speed_flags]
    code, output = interrupt_after_first_progress_line("ppo_atari_envpool.py", flags, cwd=tmp_path,
                                                       stop_signal=stop_signal)
    assert code == 130 and "stopping after this iteration" in output, output
    checkpoint_path = only_run_dir(tmp_path) / "checkpoint.pt"
    assert 0 < assert_stopped_with_its_logs_flushed(checkpoint_path) < 160
    stopped = torch.load(checkpoint_path, weights_only=False)
    assert stopped["variant"] == "ppo_atari_envpool"

    resumed = run_script("ppo_atari_envpool.py", "--resume", str(checkpoint_path), cwd=tmp_path)
    assert f"at step {stopped['global_step']:,} of 160 (with new episodes)" in resumed.stdout
    assert torch.load(checkpoint_path, weights_only=False)["global_step"] == 160
    # One point per iteration, none lost or doubled where the run stopped.
    steps = [step for step, _ in read_scalars(only_run_dir(tmp_path))["charts/SPS"]]
    assert steps == list(range(32, 161, 32))

    evaluation = run_script("ppo_atari_envpool.py", "--evaluate", str(checkpoint_path),
                            "--eval-episodes", "2", cwd=tmp_path)
    assert_evaluation_output(evaluation.stdout, "Breakout-v5", 2)


def test_ids_that_are_not_envpool_atari_games_point_to_the_right_script(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="BreakoutNoFrameskip-v4")),
                       "ppo_atari_envpool.py", "Breakout-v5", "ppo/ppo_atari.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="CartPole-v1")),
                       "ppo_atari_envpool.py", "ppo/ppo.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="Pendulum-v1")), "ppo_atari_envpool.py",
                       "ppo/ppo_continuous_action.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="Breakuot-v5")), "ppo_atari_envpool.py",
                       "unknown env id")


def test_a_wrong_env_id_prints_one_line_and_nothing_else(tmp_path):
    """Where Procgen's extra brought the retired gym package, envpool 1.0 imports it and gym prints
    a notice about itself: the script keeps it off the user's screen."""
    result = run_script("ppo_atari_envpool.py", "--env-id", "Foo-v5", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ppo_atari_envpool.py: error: unknown env id 'Foo-v5': envpool's ids of this kind are "
        "named like Breakout-v5"]


def test_missing_envpool_names_the_extra(tmp_path):
    result = run_script("ppo_atari_envpool.py", *TINY, "--total-timesteps", "32", cwd=tmp_path,
                        env=without_module(tmp_path, "envpool"), check=False)
    expect_missing_package_error(result, "ppo_atari_envpool.py", "pip install -e '.[envpool]'")


def test_every_core_and_atari_detail_is_marked_in_the_script():
    assert_details_marked("ppo_atari_envpool.py", {"Core": 13, "Atari": 9})


def test_the_speed_benchmark_measures_envpool():
    """benchmark/speed.py's raw measurement steps the script's games as it steps any vector env:
    make_envs puts the envpool behind a vector env's calls (envpool_games.Games)."""
    from benchmark import speed

    wall, cpu = speed.raw_env_speed(script, "Breakout-v5", 2, seconds=0.2)
    assert wall > 0 and cpu > 0


def test_the_games_refuse_a_seed_they_were_not_made_with():
    """envpool seeds its games when it makes them: a reset(seed) that asks for other games fails
    rather than playing the pool's own."""
    envs = make_envs("Breakout-v5", 1, seed=4)
    assert envs.reset(seed=4)[0].shape == (1, 4, 84, 84)
    with pytest.raises(ValueError, match="seeded 4 when it was made, not 5"):
        envs.reset(seed=5)
    envs.close()


# --- Speed options: --async-envs, --compile, --cudagraphs
# -------------------------------------------


def test_two_pools_play_the_same_games_as_one():
    """--async-envs splits the games into two envpools seeded so that environment i gets seed + i,
    as in one pool: the same actions give the same frames, rewards and episode ends."""
    rng = np.random.default_rng(0)
    one, two = (make_envs("Breakout-v5", 4, seed=7),
                make_envs("Breakout-v5", 4, seed=7, async_envs=True))
    assert len(two.pools) == 2 and two.pool_games == [slice(0, 2), slice(2, 4)]
    (one_obs, one_info), (two_obs, two_info) = one.reset(), two.reset()
    np.testing.assert_array_equal(one_obs, two_obs)
    for key in ("env_id", "lives", "ram"):  # the reset's info too, numbered as one pool's
        np.testing.assert_array_equal(one_info[key], two_info[key])
    for _ in range(200):
        action = rng.integers(one.single_action_space.n, size=4)
        whole = one.step(action)
        for pool, games in enumerate(two.pool_games):
            two.send(action[games], pool)
        split = [two.recv(pool) for pool in range(2)]
        for part in range(4):  # obs, reward, terminated, truncated
            np.testing.assert_array_equal(whole[part], np.concatenate([s[part] for s in split]))
    with pytest.raises(ValueError, match="step\\(\\) plays one envpool"):
        two.step(action)
    for envs in (one, two):
        envs.close()


def test_seeds_past_31_bits_wrap_around():
    """--seed goes up to 2**31 - 1, and a resumed run and an evaluation add an offset to it, but
    envpool takes 32-bit seeds: make_envs wraps them, so seed 2**31 + 5 plays seed 5's games."""
    rng = np.random.default_rng(0)
    wrapped, plain = (make_envs("Breakout-v5", 2, seed=2**31 + 5),
                      make_envs("Breakout-v5", 2, seed=5))
    np.testing.assert_array_equal(wrapped.reset()[0], plain.reset()[0])
    for _ in range(100):
        action = rng.integers(plain.single_action_space.n, size=2)
        np.testing.assert_array_equal(wrapped.step(action)[0], plain.step(action)[0])
    wrapped.close()
    plain.close()


def test_compiled_minibatch_loss_has_the_plain_loss_and_gradients():
    """--compile runs the same computation: on the same minibatch, the compiled loss and the
    gradients it leads to equal the plain ones up to float rounding."""
    torch.manual_seed(0)
    batch = (torch.randint(0, 256, (32, 4, 84, 84), dtype=torch.uint8), torch.randint(0, 4, (32,)),
             -torch.rand(32) - 1.0, torch.randn(32), torch.randn(32), torch.randn(32))
    agent = script.Agent(num_actions=4)
    assert_compiled_loss_matches_plain(script.minibatch_loss, agent, *batch, 0.1, Args())
    # the rollout's policy step
    action, _, _, value = assert_compiles_whole(agent.get_action_and_value, batch[0])
    assert action.shape == (32,) and value.shape == (32, 1)


def test_async_envs_and_compile_train_start_each_update_at_ratio_one_and_log_every_metric(workdir):
    result = assert_each_update_starts_at_ratio_one(script, lambda: main(Args(
        env_id="Breakout-v5", total_timesteps=256, async_envs=True, compile=True, **TINY_ARGS)))
    assert result["global_step"] == 256
    assert_logs_every_metric(only_run_dir(workdir),
                             except_for=("charts/episodic_return", "charts/episodic_length"))


def test_two_pools_fill_their_own_columns_and_bootstrap_from_their_own_last_frames(
        workdir, monkeypatch):
    """--async-envs: pool k plays the games `pool_games[k]`, here columns 2k and 2k + 1 of 4. Each
    reward a pool returns must land in its own columns at the step it played (what compute_gae
    receives), and the bootstrap value after the rollout must be computed from each pool's last
    frames (what the value network receives after the rollout's last recv)."""
    received, gae_rewards, bootstrapped = {0: [], 1: []}, [], []

    def recording_make_envs(*inputs, **options):
        return RecordingGames(make(*inputs, **options), lambda pool, result: received[pool].append(
            (result[0].copy(), result[1].copy())))

    def recording_gae(rewards, *rest):
        gae_rewards.append(rewards.copy())
        return compute_gae(rewards, *rest)

    def recording_get_value(self, obs):
        bootstrapped.append(obs.clone())
        return get_value(self, obs)

    make, compute_gae, get_value = script.make_envs, script.compute_gae, script.Agent.get_value
    monkeypatch.setattr(script, "make_envs", recording_make_envs)
    monkeypatch.setattr(script, "compute_gae", recording_gae)
    monkeypatch.setattr(script.Agent, "get_value", recording_get_value)
    num_steps = TINY_ARGS["num_steps"]
    # Space Invaders: random play scores within a few steps, and the two pools score at different
    # ones.
    main(Args(env_id="SpaceInvaders-v5", total_timesteps=192, async_envs=True, seed=3,
              **{**TINY_ARGS, "num_envs": 4}))
    assert len(gae_rewards) == len(bootstrapped) == 3
    for iteration, (rewards, next_obs) in enumerate(zip(gae_rewards, bootstrapped)):
        rollout = slice(iteration * num_steps, (iteration + 1) * num_steps)
        for k in received:
            own_rewards = np.stack([reward for _, reward in received[k][rollout]])
            np.testing.assert_array_equal(rewards[:, 2 * k:2 * k + 2], own_rewards)
        last_frames = np.concatenate([received[k][rollout][-1][0] for k in received])
        np.testing.assert_array_equal(next_obs.numpy(), last_frames)
    # The check can tell the pools apart: their rewards differ.
    assert not np.array_equal(*(np.stack([reward for _, reward in received[k]]) for k in received))


def test_a_lost_life_cuts_gae_while_the_logged_score_runs_to_game_over(workdir, monkeypatch):
    """[Atari 4: EpisodicLifeEnv] in envpool's episodic_life: the step after a lost life begins a
    new training episode (dones = 1 there, so GAE does not flow back across it), although the game,
    and its logged score, go on. Recorded: the lives envpool reports at each step, and the dones GAE
    gets."""
    lives, gae_dones = [], []

    def recording_gae(rewards, values, dones, *rest):
        gae_dones.append(dones.copy())
        return compute_gae(rewards, values, dones, *rest)

    compute_gae = script.compute_gae
    record_every_recv(monkeypatch, lambda pool, result: lives.append(
        (result[4]["lives"].copy(), result[4]["terminated"].copy())))
    monkeypatch.setattr(script, "compute_gae", recording_gae)
    main(Args(env_id="Breakout-v5", total_timesteps=1024, seed=5, **TINY_ARGS))

    # Step t of the rollout (t >= 1) begins an episode exactly where the step before lost a life
    # or ended the game; the first step continues the previous rollout's last.
    received = np.stack([alive for alive, _ in lives])  # lives after each step, all games
    game_over = np.stack([ended for _, ended in lives]).astype(bool)
    before = np.vstack([np.full((1, received.shape[1]), 5), received[:-1]])
    life_lost = (received < before) & ~game_over
    ended = life_lost | game_over
    # (iterations x num_steps, num_envs): step t is after recv t - 1
    dones = np.concatenate(gae_dones)
    np.testing.assert_array_equal(dones[1:].astype(bool), ended[:len(dones) - 1])
    assert life_lost.any() and not game_over[life_lost].any()  # some lives were lost inside games
    # The score the run logged is a game's, not a life's: fewer scores than training episodes.
    assert ended.sum() > len(read_scalars(only_run_dir(workdir))["charts/episodic_return"])


def test_anneal_clip_lowers_the_clipping_coefficient_with_each_iteration(workdir, monkeypatch):
    assert_anneal_clip_lowers_the_clipping_coefficient(
        script, Args(total_timesteps=96, **TINY_ARGS), monkeypatch)


def test_speed_options_refuse_what_cannot_work(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(cudagraphs=True, **TINY_ARGS)),
                       "ppo_atari_envpool.py", "--cudagraphs needs a CUDA device")
    expect_usage_error(capsys, lambda: main(Args(async_envs=True, **{**TINY_ARGS, "num_envs": 3})),
                       "ppo_atari_envpool.py", "--num-envs must be even")
