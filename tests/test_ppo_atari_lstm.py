"""Tests of ppo/ppo_atari_lstm.py: the LSTM state is reconstructed exactly during training, reset at
episode ends, zero at the start; one-frame observations; a short run; exact resumption with the
LSTM state in the checkpoint; the errors."""

import signal
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from conftest import (parse_args, write_checkpoint,  # noqa: E402
                      assert_compiled_loss_matches_plain, assert_details_marked,
                      assert_evaluation_output, assert_first_minibatch_replays_the_rollout,
                      assert_logs_every_metric, assert_resume_keeps_the_latest_scores,
                      assert_same_final_weights, expect_usage_error, only_run_dir, run_script,
                      run_unbroken_and_interrupted, assert_evaluation_plays_the_saved_weights,
                      assert_target_kl_ends_the_update_early, assert_one_copy_to_the_host_per_step,
                      assert_logged_losses_are_the_updates_own,
                      assert_each_update_starts_at_ratio_one,
                      assert_anneal_clip_lowers_the_clipping_coefficient,
                      assert_progress_is_printed_within_a_rollout,
                      assert_stopped_with_its_logs_flushed)
import ppo.ppo_atari_lstm as script  # noqa: E402
from ppo.ppo_atari_lstm import (Agent, Args, lstm_with_episode_resets, main,  # noqa: E402
                                make_envs, minibatch_loss)

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--no-cuda"]
TINY_ARGS = dict(num_envs=2, num_steps=16, num_minibatches=2, cuda=False)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def rollout_and_agent():
    """A fresh agent's second rollout of 64 steps in 4 Breakout games, played as the training loop
    plays it, one network call per step carrying the LSTM state: it starts from a non-zero state,
    and lost lives reset the state within it. Returns the rollout (steps first) and the agent."""
    torch.manual_seed(0)
    envs = make_envs("BreakoutNoFrameskip-v4", 4)
    obs, _ = envs.reset(seed=1)
    agent = Agent(envs.single_action_space.n)
    done, state = np.zeros(4, dtype=bool), agent.initial_state(4, CPU)
    for num_steps in (40, 64):
        rollout = SimpleNamespace(initial_lstm_state=state, obs=[], dones=[], actions=[],
                                  logprobs=[], values=[])
        for _ in range(num_steps):
            with torch.no_grad():
                action, logprob, _, value, state = agent.get_action_and_value(
                    torch.as_tensor(obs), state, torch.as_tensor(done, dtype=torch.float32))
            for name, item in (("obs", torch.as_tensor(obs)), ("dones", done.astype(np.float32)),
                               ("actions", action), ("logprobs", logprob),
                               ("values", value.flatten())):
                getattr(rollout, name).append(item)
            obs, _, terminated, truncated, _ = envs.step(action.numpy())
            done = np.logical_or(terminated, truncated)
    envs.close()
    rollout.dones = np.stack(rollout.dones)
    for name in ("obs", "actions", "logprobs", "values"):
        setattr(rollout, name, torch.stack(getattr(rollout, name)))
    return rollout, agent


def replay(agent, rollout, columns, dones=None, initial_state=None):
    """The update's replay (minibatch_loss's network call) of the rollout's `columns`, from its
    initial LSTM state: log-probs, entropies and values, each (num_steps, len(columns))."""
    columns = torch.tensor(columns)
    dones = torch.as_tensor(rollout.dones if dones is None else dones)[:, columns]
    state = rollout.initial_lstm_state if initial_state is None else initial_state
    with torch.no_grad():
        _, logprob, entropy, value, _ = agent.get_action_and_value(
            rollout.obs[:, columns].flatten(0, 1), (state[0][:, columns], state[1][:, columns]),
            dones.flatten(),
            rollout.actions[:, columns].flatten())
    return tuple(x.reshape(dones.shape) for x in (logprob, entropy, value))


@pytest.mark.parametrize("columns", [[0, 1, 2, 3], [2], [3, 0]])
def test_replaying_the_rollout_reproduces_its_log_probs_and_values(rollout_and_agent, columns):
    """[LSTM 4] and [LSTM 5]: a minibatch of whole env sequences, replayed from the state the
    rollout started with through the training code path, gives back what the rollout recorded step
    by step."""
    rollout, agent = rollout_and_agent
    assert rollout.dones[1:].sum() >= 1  # an episode boundary inside the sequences
    assert rollout.initial_lstm_state[0].abs().sum() > 0
    logprob, entropy, value = replay(agent, rollout, columns)
    assert logprob.shape == value.shape == (64, len(columns))
    np.testing.assert_allclose(logprob.numpy(), rollout.logprobs[:, columns], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value.numpy(), rollout.values[:, columns], rtol=1e-5, atol=1e-6)


def test_the_first_minibatch_of_each_update_replays_the_rollout(workdir, monkeypatch):
    """The training loop's own indexing: shuffled environments, each with its saved state (4 games,
    2 minibatches of 2)."""
    args = Args(total_timesteps=256, num_envs=4, num_steps=16, num_minibatches=2, cuda=False)
    assert_first_minibatch_replays_the_rollout(script, args, monkeypatch)


def test_with_async_envs_each_update_starts_at_ratio_one(workdir):
    assert_each_update_starts_at_ratio_one(
        script, lambda: main(Args(total_timesteps=64, async_envs=True, **TINY_ARGS)))


def test_anneal_clip_lowers_the_clipping_coefficient_with_each_iteration(workdir, monkeypatch):
    assert_anneal_clip_lowers_the_clipping_coefficient(
        script, Args(total_timesteps=96, **TINY_ARGS), monkeypatch)


def test_the_progress_line_speaks_within_long_rollouts_too(workdir, capsys):
    assert_progress_is_printed_within_a_rollout(script, Args(total_timesteps=64, **TINY_ARGS),
                                                capsys, gym.vector.SyncVectorEnv)


def test_the_rollout_copies_only_the_actions_to_the_host(workdir, monkeypatch):
    """The recurrent state and the episode starts stay on the device too."""
    assert_one_copy_to_the_host_per_step(script, Args(total_timesteps=64, **TINY_ARGS), monkeypatch,
                                         gym.vector.SyncVectorEnv, action_shape=(2,))


def test_the_logged_losses_are_the_updates_own(workdir, monkeypatch):
    assert_logged_losses_are_the_updates_own(script,
                                             Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_target_kl_ends_the_update_early(workdir, monkeypatch):
    assert_target_kl_ends_the_update_early(script,
                                           Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_evaluation_plays_the_saved_weights(workdir, monkeypatch):
    assert_evaluation_plays_the_saved_weights(script,
                                              Args(total_timesteps=64, **TINY_ARGS), monkeypatch)


def test_the_replay_depends_on_the_saved_state_and_the_resets(rollout_and_agent):
    """The check above is not vacuous: replaying from zeros, or without the resets at episode ends,
    gives other values."""
    rollout, agent = rollout_and_agent
    _, _, from_zeros = replay(agent, rollout, [0, 1, 2, 3],
                              initial_state=agent.initial_state(4, CPU))
    _, _, without_resets = replay(agent, rollout, [0, 1, 2, 3], dones=np.zeros_like(rollout.dones))
    assert (from_zeros - rollout.values).abs().max() > 1e-3
    assert (without_resets - rollout.values).abs().max() > 1e-3


def test_the_lstm_over_stretches_is_the_lstm_step_by_step_with_resets():
    """LSTM detail 3 as the textbook writes it, one step at a time, the state reset where an episode
    begins, against lstm_with_episode_resets, which calls the LSTM once per stretch without a reset:
    the same outputs and final state, for episodes that begin at the first step, mid-sequence, in
    several environments at once, and on consecutive steps."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16)
    inputs = torch.randn(12, 3, 8)
    state = (torch.randn(1, 3, 16), torch.randn(1, 3, 16))
    done = torch.zeros(12, 3)
    done[0, 1] = done[4, 0] = done[4, 2] = done[7, 1] = done[8, 1] = done[11, 0] = 1.0
    outputs, final = lstm_with_episode_resets(lstm, inputs, state, done)

    step_state, step_outputs = state, []
    for t in range(12):
        keep = (1.0 - done[t]).view(1, -1, 1)
        step_state = (keep * step_state[0], keep * step_state[1])
        output, step_state = lstm(inputs[t:t + 1], step_state)
        step_outputs.append(output)
    torch.testing.assert_close(outputs, torch.cat(step_outputs), rtol=0, atol=1e-6)
    torch.testing.assert_close(final, step_state, rtol=0, atol=1e-6)
    # The resets matter: without them the outputs differ.
    assert not torch.allclose(lstm_with_episode_resets(lstm, inputs, state, torch.zeros(12, 3))[0],
                              outputs, atol=1e-3)


def test_lstm_initialization_and_zero_initial_state():
    agent = Agent(num_actions=4)
    for name, param in agent.lstm.named_parameters():
        if "bias" in name:
            assert param.abs().sum() == 0, name
        else:  # orthogonal with gain 1: orthonormal columns (or rows, for a wide matrix)
            weight = param.detach()
            gram = weight.T @ weight if weight.shape[0] >= weight.shape[1] else weight @ weight.T
            np.testing.assert_allclose(gram.numpy(), np.eye(gram.shape[0]), atol=1e-4)
    h, c = agent.initial_state(3, CPU)
    assert h.shape == c.shape == (1, 3, 128) and h.abs().sum() == 0 and c.abs().sum() == 0


def test_an_evaluation_resets_the_lstm_state_at_every_lost_life(workdir, monkeypatch):
    """[LSTM 3] as in training: the step after an episode ends (a lost life, with the training
    wrappers) starts from a zero state, so every done the environment returns reaches the
    network."""
    dones_given, ends_returned = [], []
    get_action_and_value = Agent.get_action_and_value

    def recording_policy(self, obs, lstm_state, done, *rest):
        dones_given.append(float(done[0]))
        return get_action_and_value(self, obs, lstm_state, done, *rest)

    def recording_envs(*inputs, **options):
        envs = make_envs(*inputs, **options)
        step = envs.step

        def recording_step(action):
            result = step(action)
            ends_returned.append(float(result[2][0] or result[3][0]))
            return result

        envs.step = recording_step
        return envs

    monkeypatch.setattr(Agent, "get_action_and_value", recording_policy)
    monkeypatch.setattr(script, "make_envs", recording_envs)
    write_checkpoint(workdir / "untrained.pt", script, Args(), Agent(4).state_dict(),
                     run_name="untrained")
    script.evaluate(*parse_args(script, ["--evaluate", "untrained.pt",
                                         "--eval-episodes", "1", "--no-cuda"]))
    assert sum(ends_returned) == 5  # Breakout's five lives, the last one ending the game
    assert dones_given == [0.0] + ends_returned[:-1]


def test_observations_are_single_frames():
    envs = make_envs("BreakoutNoFrameskip-v4", 2)
    obs, _ = envs.reset(seed=0)
    assert envs.single_observation_space.shape == (1, 84, 84)
    assert obs.shape == (2, 1, 84, 84) and obs.dtype == np.uint8
    envs.close()


@pytest.mark.smoke
def test_interrupted_and_resumed_run_ends_with_the_same_weights(tmp_path):
    flags = ["--seed", "4", "--total-timesteps", "160", "--save-model", *TINY]
    unbroken, interrupted, output = run_unbroken_and_interrupted("ppo_atari_lstm.py",
                                                                 flags, tmp_path)
    checkpoint_path = only_run_dir(interrupted) / "checkpoint.pt"
    stopped = torch.load(checkpoint_path, weights_only=False)
    assert 0 < stopped["global_step"] < 160
    assert_resume_keeps_the_latest_scores("ppo_atari_lstm.py", checkpoint_path, tmp_path)
    h, c = stopped["processes"][0]["rollout"]["next_lstm_state"]
    assert h.shape == c.shape == (1, 2, 128) and h.abs().sum() > 0

    run_script("ppo_atari_lstm.py", "--resume", str(checkpoint_path), cwd=interrupted)
    expected, actual = assert_same_final_weights(unbroken, checkpoint_path, 160)
    for expected_state, actual_state in zip(expected["processes"][0]["rollout"]["next_lstm_state"],
                                            actual["processes"][0]["rollout"]["next_lstm_state"]):
        assert torch.equal(expected_state, actual_state)

    evaluation = run_script("ppo_atari_lstm.py", "--evaluate", str(checkpoint_path),
                            "--eval-episodes", "1", cwd=interrupted)
    assert_evaluation_output(evaluation.stdout, "BreakoutNoFrameskip-v4", 1)


def test_an_async_run_interrupted_and_resumed_ends_as_an_unbroken_sync_run(tmp_path):
    """--async-envs plays the same games as the games in one process, and its checkpoint carries
    the workers' games: interrupted with it and resumed, the run ends as one that never stopped and
    never had worker processes, LSTM state included. Stopped by SIGTERM to every process of the run,
    as Slurm does at a task's time limit (the workers ignore it), with its logs flushed."""
    flags = ["--seed", "4", "--total-timesteps", "160", "--save-model", *TINY]
    unbroken, interrupted, output = run_unbroken_and_interrupted(
        "ppo_atari_lstm.py", flags, tmp_path, interrupted_flags=("--async-envs",),
        stop_signal=signal.SIGTERM)
    assert "Traceback" not in output, output
    checkpoint_path = only_run_dir(interrupted) / "checkpoint.pt"
    assert 0 < assert_stopped_with_its_logs_flushed(checkpoint_path) < 160
    stopped = torch.load(checkpoint_path, weights_only=False)
    assert stopped["args"]["async_envs"] and len(stopped["processes"][0]["envs"]) == 2

    run_script("ppo_atari_lstm.py", "--resume", str(checkpoint_path), cwd=interrupted)
    expected, actual = assert_same_final_weights(unbroken, checkpoint_path, 160)
    for expected_state, actual_state in zip(expected["processes"][0]["rollout"]["next_lstm_state"],
                                            actual["processes"][0]["rollout"]["next_lstm_state"]):
        assert torch.equal(expected_state, actual_state)


def test_the_compiled_minibatch_loss_gives_the_plain_loss_and_gradients(rollout_and_agent):
    """On 16 steps of two columns of a real rollout, from its non-zero initial LSTM state, with
    advantages and returns made up around the rollout's values."""
    rollout, agent = rollout_and_agent
    columns = torch.tensor([1, 3])
    generator = torch.Generator().manual_seed(1)
    values = rollout.values[:16, columns]
    minibatch = (rollout.obs[:16, columns], torch.as_tensor(rollout.dones)[:16, columns],
                 rollout.actions[:16, columns],
                 rollout.logprobs[:16, columns] + 0.2 * torch.randn(16, 2, generator=generator),
                 values + torch.randn(16, 2, generator=generator),
                 1.0 + torch.randn(16, 2, generator=generator),
                 values + torch.randn(16, 2, generator=generator),
                 tuple(state[:, columns] for state in rollout.initial_lstm_state))
    # Not in one graph: torch.compile leaves the nn.LSTM out (docs/ppo_atari_lstm.md, Speed
    # options).
    assert_compiled_loss_matches_plain(minibatch_loss, agent, *minibatch, 0.1, Args(),
                                       fullgraph=False)


def test_a_compiled_run_trains_and_cudagraphs_needs_cuda(capsys, workdir):
    result = assert_each_update_starts_at_ratio_one(
        script, lambda: main(Args(total_timesteps=32, compile=True, **TINY_ARGS)))
    assert result["global_step"] == 32
    assert_logs_every_metric(only_run_dir(workdir),
                             except_for=("charts/episodic_return", "charts/episodic_length"))
    if not torch.cuda.is_available():
        expect_usage_error(capsys, lambda: main(Args(cudagraphs=True, **TINY_ARGS)),
                           "ppo_atari_lstm.py", "--cudagraphs needs a CUDA device")


def test_minibatches_must_hold_whole_environments(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(num_envs=6, num_minibatches=4)),
                       "ppo_atari_lstm.py", "--num-minibatches must be a divisor of --num-envs",
                       "whole sequences", "got 4")
    expect_usage_error(capsys, lambda: main(Args(env_id="CartPole-v1", **TINY_ARGS)),
                       "ppo_atari_lstm.py", "ppo/ppo.py")


def test_every_core_atari_and_lstm_detail_is_marked_in_the_script():
    assert_details_marked("ppo_atari_lstm.py", {"Core": 13, "Atari": 9, "LSTM": 5})
