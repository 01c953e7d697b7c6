"""Tests of ppo/ppo_continuous_action.py: the continuous-action details (clipped actions stored
unclipped, observation statistics that travel with the agent, reward scaling), an end-to-end run on
MuJoCo, exact resumption after Ctrl-C, evaluation, and the errors for input the script cannot
take."""

import dataclasses
import os
import platform
import signal
import sys
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmark import report
from conftest import (assert_compiled_loss_matches_plain, assert_every_evaluated_episode_returns,
                      assert_run_with_option_resumes_exactly, assert_compiles_whole,
                      assert_details_marked, assert_evaluation_output, assert_logs_every_metric,
                      assert_same_agent_state, assert_same_logs, expect_missing_package_error,
                      expect_usage_error, only_run_dir, read_scalars, run_script,
                      run_unbroken_and_interrupted_in_process, without_module,
                      assert_evaluation_plays_the_saved_weights,
                      assert_target_kl_ends_the_update_early, assert_one_copy_to_the_host_per_step,
                      assert_the_batch_is_what_the_policy_saw_and_did,
                      assert_anneal_clip_lowers_the_clipping_coefficient, PROGRESS_LINE,
                      assert_progress_is_printed_within_a_rollout,
                      assert_stopped_with_its_logs_flushed)
from ppo import ppo_continuous_action as script
from conftest import parse_args as parse_args_of
from ppo.ppo_continuous_action import (Agent, Args, RewardScaler, RunningMeanStd, evaluate, main,
                                       minibatch_loss)
from ppo_utils import checkpoint as checkpoints
from ppo_utils import environments


def parse_args(argv: list[str]):  # what `python ppo/ppo_continuous_action.py argv...` reads
    return parse_args_of(script, argv)

SCRIPT = "ppo_continuous_action.py"

# A small, fast configuration: 1 env x 64 steps, 2 minibatches, 2 epochs.
SMALL = dict(num_steps=64, num_minibatches=2, update_epochs=2, cuda=False)
SMALL_FLAGS = ["--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2", "--no-cuda"]


@pytest.fixture
def mujoco():
    """Skip a test that needs MuJoCo where the optional package is not installed."""
    return pytest.importorskip("mujoco",
                               reason="MuJoCo is not installed: pip install -e '.[mujoco]'")


# --------------------------------------------------------------------------------------------------
# Stand-in environments with known behaviour (no MuJoCo needed)
# --------------------------------------------------------------------------------------------------

# action bounds far inside the first policy's std of 1: nearly every sample gets clipped
BOUND = 0.05
EPISODE_LENGTH = 5
REWARD = 100.0  # large, so scaled and clipped rewards could never pass for the environment's own


class TightBoundsEnv(gym.Env):
    """Actions in [-BOUND, BOUND]^2; every episode lasts EPISODE_LENGTH steps with reward REWARD per
    step; the class keeps every action that reaches step()."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(-BOUND, BOUND, (2,), np.float32)
    received: list = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.normal(5.0, 2.0, 3).astype(np.float32), {}

    def step(self, action):
        TightBoundsEnv.received.append(np.array(action, copy=True))
        self.t += 1
        obs = self.np_random.normal(5.0, 2.0, 3).astype(np.float32)
        return obs, REWARD, self.t == EPISODE_LENGTH, False, {}


class TargetEnv(gym.Env):
    """One-step episodes: the observation is a target drawn in [-1, 1], the reward -(action -
    target)^2. The best policy puts its mean on the target, which it can only learn from the
    observation."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1.0, 1.0, (1,)).astype(np.float32)
        return self.target, {}

    def step(self, action):
        return self.target, -float(np.sum((action - self.target) ** 2)), True, False, {}


gym.register(id="TightBounds-v0", entry_point=TightBoundsEnv)
gym.register(id="Target-v0", entry_point=TargetEnv)


class EndlessBoundsEnv(TightBoundsEnv):
    """TightBoundsEnv that never terminates: registered with a time limit of EPISODE_LENGTH
    steps."""

    def step(self, action):
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


gym.register(id="TimeLimitedBounds-v0", entry_point=EndlessBoundsEnv,
             max_episode_steps=EPISODE_LENGTH)


def test_a_truncation_ends_the_episode_for_gae_but_not_the_scaled_return(workdir, monkeypatch):
    """[Continuous 8] The return the rewards are scaled by runs on across a time-limit cut (only a
    termination cuts it), while GAE, like every script's, stops each episode at the cut."""
    cut_by_scaler, gae_dones = [], []
    scale, compute_gae = RewardScaler.scale, script.compute_gae

    def recording_scale(self, reward, terminated):
        cut_by_scaler.append(np.array(terminated, copy=True))
        return scale(self, reward, terminated)

    def recording_gae(rewards, values, dones, *rest):
        gae_dones.append(dones.copy())
        return compute_gae(rewards, values, dones, *rest)

    monkeypatch.setattr(RewardScaler, "scale", recording_scale)
    monkeypatch.setattr(script, "compute_gae", recording_gae)
    main(Args(env_id="TimeLimitedBounds-v0", total_timesteps=64, **SMALL))
    assert len(cut_by_scaler) == 64 and not np.any(cut_by_scaler)
    assert (list(np.flatnonzero(gae_dones[0][:, 0]))
            == list(range(EPISODE_LENGTH, 64, EPISODE_LENGTH)))


def test_the_policy_learns_to_follow_its_observation(workdir):
    """4,096 steps (16 updates) on Target-v0 at the default settings otherwise. The first policy's
    mean is about 0 whatever the target (mean error 0.45 on these targets) with std 1; a trained one
    puts its mean on the target (mean error 0.033, 0.023, 0.019 with this test's settings and seeds
    1, 2, 3) and has narrowed its std (to 0.48)."""
    agent = main(Args(env_id="Target-v0", total_timesteps=4096, num_steps=256, cuda=False))["agent"]
    targets = np.linspace(-0.9, 0.9, 19, dtype=np.float32)[:, None]
    with torch.no_grad():
        mean = agent.actor_mean(torch.as_tensor(agent.normalize_obs(targets, update=False))).numpy()
    assert np.abs(mean - targets).mean() < 0.1
    assert agent.actor_logstd.exp().item() < 0.8


def test_the_first_policy_has_std_1_and_training_uses_the_observation_clip_given(workdir):
    """[Continuous 2] the log std starts at 0 for every action dimension; [Continuous 7] --obs-clip
    reaches the agent that trains (and so its checkpoint and every evaluation of it)."""
    assert torch.equal(Agent(3, 2).actor_logstd, torch.zeros(1, 2))
    agent = main(Args(env_id="TightBounds-v0", total_timesteps=64, obs_clip=3.0, **SMALL))["agent"]
    assert agent.obs_clip == 3.0
    assert np.abs(agent.normalize_obs(np.full((1, 3), 1e6, dtype=np.float32),
                                      update=False)).max() == 3.0


def test_the_batch_holds_the_normalized_observations_acted_on_and_the_actions_drawn(
        workdir, monkeypatch):
    assert_the_batch_is_what_the_policy_saw_and_did(script,
                                                    Args(env_id="TightBounds-v0", num_envs=2,
                                                         total_timesteps=256, **SMALL), monkeypatch)


def test_anneal_clip_lowers_the_clipping_coefficient_with_each_iteration(workdir, monkeypatch):
    assert_anneal_clip_lowers_the_clipping_coefficient(
        script, Args(env_id="TightBounds-v0", total_timesteps=192, **SMALL), monkeypatch)


def test_the_progress_line_speaks_within_long_rollouts_too(workdir, capsys):
    assert_progress_is_printed_within_a_rollout(script, Args(env_id="TightBounds-v0",
                                                             total_timesteps=128, **SMALL), capsys,
                                                gym.vector.SyncVectorEnv)


def test_the_rollout_copies_only_the_actions_to_the_host(workdir, monkeypatch):
    """The observation statistics are kept on the host, where the observations are: nothing else
    comes back from the device."""
    assert_one_copy_to_the_host_per_step(script, Args(env_id="TightBounds-v0", total_timesteps=128,
                                                      **SMALL), monkeypatch,
                                         gym.vector.SyncVectorEnv, action_shape=(1, 2))


def test_target_kl_ends_the_update_early(workdir, monkeypatch):
    assert_target_kl_ends_the_update_early(script, Args(env_id="TightBounds-v0",
                                                        total_timesteps=128, **SMALL), monkeypatch)


def test_evaluation_plays_the_saved_weights_and_observation_statistics(workdir, monkeypatch):
    assert_evaluation_plays_the_saved_weights(
        script, Args(env_id="TightBounds-v0", total_timesteps=128, **SMALL), monkeypatch)


def test_evaluation_scores_each_episode_with_the_environments_own_rewards(workdir, capsys):
    """Every TightBounds-v0 episode returns EPISODE_LENGTH x REWARD whatever the actions: an
    evaluation that scored the scaled, clipped training rewards, or carried a return into the next
    episode, would print something else."""
    assert_every_evaluated_episode_returns(script, Args(env_id="TightBounds-v0",
                                                        total_timesteps=128, **SMALL), capsys,
                                           expected=EPISODE_LENGTH * REWARD)


def test_the_rollout_stores_the_sampled_action_and_the_env_gets_it_clipped(workdir, monkeypatch):
    """[Continuous 5] The loss must score the action the Gaussian drew, not the clipped one the
    environment executed: the log-probability of a clipped action is not the one it was drawn
    with."""
    scored = []
    original = Agent.get_action_and_value

    def recording(self, obs, action=None):
        if action is not None and action.shape[0] == 128:  # the batched pass over the whole rollout
            scored.append(action.clone())
        return original(self, obs, action)

    monkeypatch.setattr(Agent, "get_action_and_value", recording)
    TightBoundsEnv.received = []
    main(Args(env_id="TightBounds-v0", num_envs=2, total_timesteps=128, **SMALL))

    stored = scored[0].numpy().reshape(64, 2, 2)  # (num_steps, num_envs, action dims)
    received = np.array(TightBoundsEnv.received).reshape(64, 2, 2)  # step() calls, env 0 then env 1
    assert np.all(np.abs(received) <= BOUND)
    assert np.mean(np.abs(stored) > BOUND) > 0.9  # the stored actions are the raw samples...
    np.testing.assert_array_equal(np.clip(stored, -BOUND, BOUND),
                                  received)  # ...of what the envs got


def test_episodic_return_is_the_environments_own_reward(workdir):
    """Rewards are scaled and clipped for learning; the logged return must still be the task's."""
    main(Args(env_id="TightBounds-v0", total_timesteps=128, **SMALL))
    scalars = read_scalars(only_run_dir(workdir))
    returns = {value for _, value in scalars["charts/episodic_return"]}
    lengths = {value for _, value in scalars["charts/episodic_length"]}
    assert returns == {REWARD * EPISODE_LENGTH} and lengths == {EPISODE_LENGTH}


# --------------------------------------------------------------------------------------------------
# Normalization statistics
# --------------------------------------------------------------------------------------------------


def test_running_statistics_match_numpy_over_the_whole_stream():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(4, 5)) for _ in range(50)]
    rms = RunningMeanStd(shape=(5,))
    for batch in batches:
        rms.update(batch)
    everything = np.concatenate(batches)
    # The prior (mean 0, variance 1, count 1e-4) weighs 1e-4 against 200 samples.
    np.testing.assert_allclose(rms.mean, everything.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(rms.var, everything.var(axis=0), rtol=1e-5)
    assert rms.count == pytest.approx(200, abs=1e-3)


def test_observations_are_normalized_with_the_agents_statistics_and_clipped():
    agent = Agent(3, 2, obs_clip=10.0)
    agent.obs_rms.mean = np.array([1.0, -2.0, 0.0])
    agent.obs_rms.var = np.array([4.0, 1.0, 1e-6])
    obs = np.array([[3.0, -2.0, 1.0]])
    expected = np.array([[1.0, 0.0, 10.0]])  # (3-1)/2, (-2+2)/1, and 1/0.001 clipped to 10
    np.testing.assert_allclose(agent.normalize_obs(obs, update=False), expected, rtol=1e-4)
    assert agent.obs_rms.mean[0] == 1.0  # update=False leaves the statistics alone
    agent.normalize_obs(obs, update=True)
    assert agent.obs_rms.mean[0] > 1.0


def test_observation_statistics_travel_in_the_state_dict(tmp_path):
    agent = Agent(3, 2)
    agent.obs_rms.update(np.random.default_rng(0).normal(7.0, 3.0, size=(100, 3)))
    torch.save(agent.state_dict(), tmp_path / "agent.pt")
    loaded = Agent(3, 2)
    loaded.load_state_dict(torch.load(tmp_path / "agent.pt", weights_only=False))
    np.testing.assert_array_equal(loaded.obs_rms.mean, agent.obs_rms.mean)
    np.testing.assert_array_equal(loaded.obs_rms.var, agent.obs_rms.var)
    assert loaded.obs_rms.count == agent.obs_rms.count


class KnownRewards(gym.Env):
    """A tiny task with known rewards: step k of an episode (k = 1, 2, ...) pays k; the episode
    terminates after `terminate_after` steps, if given, else runs until a time limit cuts it."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, terminate_after: int | None = None):
        self.terminate_after, self.k = terminate_after, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.k += 1
        return np.zeros(1, np.float32), float(self.k), self.k == self.terminate_after, False, {}


def test_the_return_is_cut_at_a_termination_and_kept_across_a_truncation():
    """The reference's rule, on two environments stepped as the training loop steps them: one whose
    episodes terminate after 3 steps, one cut by a 3-step time limit. Rewards 1, 2, 3, 1, 2, ..."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: KnownRewards(terminate_after=3),
         lambda: gym.wrappers.TimeLimit(KnownRewards(), 3)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    scaler = RewardScaler(num_envs=2, gamma=0.5)
    returns, ends = [], []
    for _ in range(5):
        _, reward, terminations, truncations, _ = envs.step(np.zeros((2, 1), np.float32))
        scaler.scale(reward, terminations)
        returns.append(scaler.discounted_return.copy())
        ends.append((terminations.tolist(), truncations.tolist()))
    assert ends[2] == ([True, False], [False, True])  # step 3: a termination, and a truncation
    terminated_env = [1.0, 0.5 * 1 + 2, 3.0, 0.5 * 3 + 1, 0.5 * 2.5 + 2]  # cut at the terminal step
    truncated_env = [1.0, 2.5, 0.5 * 2.5 + 3, 0.5 * 4.25 + 1,
                     0.5 * 3.125 + 2]  # runs on across the cut
    np.testing.assert_allclose(np.array(returns), np.array([terminated_env, truncated_env]).T)
    # One set of statistics for both environments: every return of both entered it.
    all_returns = np.array(returns).ravel()
    assert scaler.return_rms.count == pytest.approx(len(all_returns) + 1e-4)
    assert scaler.return_rms.mean == pytest.approx(all_returns.mean(), rel=1e-4)


def test_log_prob_and_entropy_are_sums_over_independent_action_dimensions():
    """[Continuous 1, 3] A diagonal Gaussian, written out by hand: per dimension
    -(a - mu)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2, and 1/2 + log(2 pi) / 2 + log sigma for
    the entropy, each summed over the action's dimensions."""
    torch.manual_seed(0)
    agent = Agent(11, 3)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-0.5, 0.0, 0.3]]))
    obs, action = torch.randn(5, 11), torch.randn(5, 3)
    with torch.no_grad():
        _, log_prob, entropy, _ = agent.get_action_and_value(obs, action)
        mean, log_std = agent.actor_mean(obs), agent.actor_logstd
    half_log_2pi = 0.5 * np.log(2 * np.pi)
    expected_log_prob = (-(action - mean) ** 2 / (2 * torch.exp(2 * log_std)) - log_std
                         - half_log_2pi).sum(1)
    expected_entropy = (0.5 + half_log_2pi + log_std).sum(1).expand(5)
    torch.testing.assert_close(log_prob, expected_log_prob)
    torch.testing.assert_close(entropy, expected_entropy)


gym.register(id="KnownRewards-v0", entry_point=KnownRewards, max_episode_steps=40)


def test_the_training_rewards_are_scaled_then_clipped(workdir, monkeypatch):
    """[Continuous 8, 9] What GAE receives: the environment's rewards (1, 2, 3, ... here) scaled,
    then clipped to --reward-clip, which bites at 0.5 while the statistics hold few returns."""
    received = []
    compute_gae = script.compute_gae

    def recording_gae(rewards, *rest):
        received.append(rewards.copy())
        return compute_gae(rewards, *rest)

    monkeypatch.setattr(script, "compute_gae", recording_gae)
    main(Args(env_id="KnownRewards-v0", total_timesteps=128, reward_clip=0.5, **SMALL))
    rewards = np.concatenate(received)
    # clipped, early on
    assert rewards.max() == pytest.approx(0.5) and np.sum(rewards == rewards.max()) > 1
    assert 0 < rewards.min() < 0.01  # scaled: the raw rewards are 1 or more


# --------------------------------------------------------------------------------------------------
# MuJoCo: a run end to end, evaluation with the saved statistics, exact resumption
# --------------------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_tiny_run_on_hopper_logs_every_metric_and_the_mujoco_release(tmp_path, mujoco):
    result = run_script(SCRIPT, "--env-id", "Hopper-v4", *SMALL_FLAGS,
                        "--total-timesteps", "256", cwd=tmp_path)
    assert ([match.group(1) for match in PROGRESS_LINE.finditer(result.stdout)][-1]
            == "256"), result.stdout
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("Hopper-v4__ppo_continuous_action__1__")
    scalars = assert_logs_every_metric(run_dir)
    assert [step for step, _ in scalars["charts/SPS"]] == [64, 128, 192, 256]
    # The MuJoCo release changes Hopper's contacts (3.5.0 did): the run records it for the benchmark
    # report.
    assert report.load_run(run_dir, tmp_path / "runs").versions == [{
        "python": platform.python_version(), **{package: version(package) for package in
                                                ("torch", "gymnasium", "numpy", "mujoco")}}]


@pytest.fixture(scope="module")
def trained_hopper(tmp_path_factory):
    """A short Hopper-v4 run with a saved checkpoint: its in-memory agent and the checkpoint's
    path."""
    pytest.importorskip("mujoco", reason="MuJoCo is not installed: pip install -e '.[mujoco]'")
    directory = tmp_path_factory.mktemp("hopper")
    previous = Path.cwd()
    os.chdir(directory)
    try:
        result = main(Args(env_id="Hopper-v4", total_timesteps=2048, num_steps=512,
                           num_minibatches=4, update_epochs=2, cuda=False, save_model=True))
    finally:
        os.chdir(previous)
    return result["agent"], only_run_dir(directory) / "checkpoint.pt"


def test_a_saved_agent_plays_exactly_like_the_trained_one_with_its_statistics(
        trained_hopper, workdir):
    """The checkpoint carries the observation statistics: evaluating it gives the very episodes that
    the in-memory agent's state (weights and statistics) plays, and the same weights with fresh
    (identity) statistics play others."""
    agent, checkpoint_path = trained_hopper
    stats = checkpoints.statistics_state(agent.obs_rms)
    assert stats["count"] > 2000 and not np.allclose(stats["var"], 1.0)  # the statistics have moved

    def evaluated(model: dict) -> list[float]:
        args, checkpoint = parse_args(["--evaluate", str(checkpoint_path),
                                       "--eval-episodes", "3", "--no-cuda"])
        return evaluate(args, dataclasses.replace(checkpoint, model=model))

    saved = evaluate(*parse_args(["--evaluate", str(checkpoint_path),
                                  "--eval-episodes", "3", "--no-cuda"]))
    assert saved == evaluated(agent.state_dict())
    without_stats = Agent(11, 3)
    without_stats.load_state_dict(agent.state_dict())
    without_stats.obs_rms = RunningMeanStd(shape=(11,))
    assert evaluated(without_stats.state_dict()) != saved


@pytest.mark.smoke
def test_evaluation_prints_each_episode_and_the_mean(trained_hopper, workdir, capsys):
    _, checkpoint_path = trained_hopper
    returns = evaluate(*parse_args(["--evaluate", str(checkpoint_path),
                                    "--eval-episodes", "2", "--no-cuda"]))
    output = capsys.readouterr().out
    printed = assert_evaluation_output(output, "Hopper-v4", 2)
    assert printed == pytest.approx(returns, abs=0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="EGL: MuJoCo's renderer without a display on Linux")
def test_video_is_filmed_without_a_display(trained_hopper, workdir, monkeypatch):
    """On a machine without a display, as CI's, MuJoCo draws through EGL only if MUJOCO_GL says so
    before it is imported: --capture-video sets it (a user's own value stands)."""
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    result = run_script(SCRIPT, "--evaluate", str(trained_hopper[1]), "--eval-episodes", "1",
                        "--capture-video", cwd=workdir, check=False)
    videos = list((workdir / "videos").rglob("*.mp4"))
    assert result.returncode == 0 and videos and all(video.stat().st_size > 1000
                                                     for video in videos), result.stderr


def test_evaluation_keeps_the_observation_clip_it_was_trained_with(trained_hopper, capsys, workdir):
    _, checkpoint_path = trained_hopper
    expect_usage_error(capsys,
                       lambda: parse_args(["--evaluate", str(checkpoint_path), "--obs-clip", "5"]),
                       "ppo_continuous_action.py", "--obs-clip 10.0, not 5.0")


@pytest.mark.smoke
def test_interrupted_and_resumed_run_ends_exactly_like_an_unbroken_one(workdir, mujoco):
    """MuJoCo environments are saved with their physics and random generators, the agent with its
    observation statistics, the loop with its reward statistics: a run stopped by SIGTERM (`kill`,
    or Slurm) and resumed ends bit for bit where an unbroken run ends. (Ctrl-C: the compiled run's
    test.)"""
    args = Args(env_id="Hopper-v4", seed=3, total_timesteps=640, save_model=True, **SMALL)
    # SIGTERM during the 100th step, in the second iteration: that iteration finishes, then the run
    # stops.
    unbroken, stopped, checkpoint_path = run_unbroken_and_interrupted_in_process(
        main, args, workdir, gym.vector.SyncVectorEnv, interrupt_at_step=100,
        stop_signal=signal.SIGTERM)
    assert stopped["interrupted"] and stopped["global_step"] == 128
    assert_stopped_with_its_logs_flushed(checkpoint_path)
    assert torch.load(checkpoint_path, weights_only=False)["processes"][0]["envs"] is not None

    resumed = main(*parse_args(["--resume", str(checkpoint_path)]))
    assert resumed["global_step"] == unbroken["global_step"] == 640
    assert_same_agent_state(unbroken["agent"].state_dict(), resumed["agent"].state_dict())
    assert resumed["reward_scaler"].return_rms.var == unbroken["reward_scaler"].return_rms.var
    assert resumed["recent_returns"] == unbroken["recent_returns"]
    assert_same_logs(only_run_dir(workdir / "unbroken"), checkpoint_path.parent)


def test_saved_mujoco_environments_continue_the_same_episodes(mujoco):
    """A MuJoCo environment built anew has new physics; the saved MjData arrays and random state,
    put back into it, make the copy continue exactly (Ant reads derived positions too)."""
    for env_id in ("Hopper-v4", "Ant-v5"):
        envs = script.make_envs(env_id, 1)
        envs.reset(seed=0)
        rng = np.random.default_rng(0)
        actions = rng.uniform(-1, 1, size=(300,) + envs.action_space.shape).astype(np.float32)
        for action in actions[:30]:
            envs.step(action)
        copy = script.make_envs(env_id, 1, saved_envs=environments.save_envs(envs))
        for action in actions[30:]:  # long enough to cross episode ends and their resets
            original, restored = envs.step(action), copy.step(action)
            for a, b in zip(original[:4], restored[:4]):
                np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------------
# Speed options: --compile, --cudagraphs
# --------------------------------------------------------------------------------------------------


def test_compiled_minibatch_loss_equals_the_plain_one():
    """--compile changes how the loss is computed, not what: on the same minibatch the compiled
    loss, statistics and gradients (the log std's included) are the plain ones within float
    tolerance."""
    torch.manual_seed(0)
    agent, size = Agent(11, 3), 32  # the size of a minibatch of SMALL: one graph to compile
    obs = torch.randn(size, 11)
    with torch.no_grad():
        actions, logprob, _, value = agent.get_action_and_value(obs)
    # The policy and value as they were before a few updates: some ratios leave the clip range.
    old_logprob, old_value = (logprob + 0.3 * torch.randn(size),
                              value.flatten() + 0.3 * torch.randn(size))
    stats = assert_compiled_loss_matches_plain(minibatch_loss, agent, obs, actions, old_logprob,
                                               old_value, torch.randn(size), torch.randn(size), 0.2,
                                               Args(ent_coef=0.01))
    assert 0 < stats["clipfrac"] < 1  # both branches of the clipped objective took part
    # the rollout's policy step
    assert assert_compiles_whole(agent.get_action, obs).shape == (size, 3)


def test_compiled_run_logs_every_metric_and_resumes_exactly(workdir, mujoco):
    args = Args(env_id="Hopper-v4", seed=3, total_timesteps=320, save_model=True,
                compile=True, **SMALL)
    assert_run_with_option_resumes_exactly(script, args, workdir, gym.vector.SyncVectorEnv,
                                           interrupt_at_step=100)


def test_the_numpy_policy_gives_the_networks_means_and_draws_with_its_std():
    """[Speed: the policy step in NumPy] The NumPy copy of the actor gives the network's means (up
    to float rounding), and its draws spread around them with the learned std: 20,000 draws, std
    0.5."""
    torch.manual_seed(0)
    agent = Agent(5, 2)
    obs = np.random.default_rng(0).standard_normal((64, 5)).astype(np.float32)
    with torch.no_grad():
        means = agent.actor_mean(torch.as_tensor(obs)).numpy()
        agent.actor_logstd.fill_(np.log(0.5))
    assert np.allclose(script.numpy_policy.NumpyMLP(agent.actor_mean)(obs), means, atol=1e-6)
    np.random.seed(0)
    actions = script.numpy_policy.gaussian_draw(
        agent.actor_mean, agent.actor_logstd)(np.repeat(obs[:1], 20_000, axis=0))
    assert actions.dtype == np.float32
    assert np.allclose(actions.mean(axis=0), means[0], atol=0.02)
    assert np.allclose(actions.std(axis=0), 0.5, atol=0.01)


def test_a_numpy_policy_run_learns_to_follow_its_observation(workdir):
    """test_the_policy_learns_to_follow_its_observation's run, with the policy step in NumPy (mean
    error 0.038, 0.019, 0.020 with seeds 1, 2, 3; std 0.48)."""
    agent = main(Args(env_id="Target-v0", total_timesteps=4096, num_steps=256, cuda=False,
                      numpy_policy=True))["agent"]
    targets = np.linspace(-0.9, 0.9, 19, dtype=np.float32)[:, None]
    with torch.no_grad():
        mean = agent.actor_mean(torch.as_tensor(agent.normalize_obs(targets, update=False))).numpy()
    assert np.abs(mean - targets).mean() < 0.1


def test_a_numpy_policy_run_logs_every_metric_and_resumes_exactly(workdir, mujoco):
    args = Args(env_id="Hopper-v4", seed=3, total_timesteps=320, save_model=True,
                numpy_policy=True, **SMALL)
    assert_run_with_option_resumes_exactly(script, args, workdir, gym.vector.SyncVectorEnv,
                                           interrupt_at_step=100, option="numpy_policy")


def test_cudagraphs_without_a_gpu_is_a_one_line_error(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="TightBounds-v0", total_timesteps=128,
                                                 cudagraphs=True, **SMALL)), SCRIPT,
                       "--cudagraphs needs a CUDA device")


# --------------------------------------------------------------------------------------------------
# The command line: errors
# --------------------------------------------------------------------------------------------------


def test_discrete_actions_point_to_ppo_py(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="CartPole-v1", cuda=False)), SCRIPT,
                       "Discrete action space", "ppo/ppo.py")


def test_unknown_env_id_and_sizes(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="Hoper-v4", cuda=False)), SCRIPT,
                       "unknown env id 'Hoper-v4'")
    # Registered by gymnasium, but its code moved to another project: the error names the newest
    # version.
    expect_usage_error(capsys, lambda: main(Args(env_id="Hopper-v3", cuda=False)), SCRIPT,
                       "Hopper-v3 cannot be made with the packages installed", "gymnasium-robotics",
                       "(try Hopper-v5)")
    expect_usage_error(capsys, lambda: main(Args(num_steps=100, num_minibatches=32)), SCRIPT,
                       "--num-minibatches 32")
    expect_usage_error(capsys, lambda: main(Args(total_timesteps=1000)), SCRIPT,
                       "--total-timesteps 1000", "2048")


def test_checkpoints_of_another_variant_are_refused(capsys, workdir):
    torch.save({"variant": "ppo", "args": {}}, "classic.pt")
    expect_usage_error(capsys, lambda: parse_args(["--evaluate", "classic.pt"]),
                       SCRIPT, "ppo/ppo.py")


def test_missing_mujoco_names_the_extra(tmp_path):
    result = run_script(SCRIPT, "--env-id", "Hopper-v4", "--total-timesteps", "256", *SMALL_FLAGS,
                        cwd=tmp_path, env=without_module(tmp_path, "mujoco"), check=False)
    # (gymnasium may warn first that Hopper-v4 has a newer version; the error is the last line)
    error = expect_missing_package_error(result, SCRIPT, "pip install -e '.[mujoco]'",
                                         only_line=False)
    assert (error == f"{SCRIPT}: error: missing optional dependency: MuJoCo is not installed: pip "
                     "install -e '.[mujoco]'")


def test_every_detail_is_marked_in_the_script():
    assert_details_marked(SCRIPT, {"Core": 13, "Continuous": 9})
