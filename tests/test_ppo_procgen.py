"""Tests of ppo/ppo_procgen.py: the IMPALA network's shapes, the Procgen adapter (same-step episode
ends, the real game score in the logs) on a stand-in for procgen, then, where procgen is installed,
a short run end to end on a real game, exact resumption after Ctrl-C, evaluation, and the errors."""

import signal

import numpy as np
import pytest
import torch

from conftest import (assert_compiled_loss_matches_plain, assert_run_with_option_resumes_exactly,
                      assert_compiles_whole, assert_details_marked, assert_evaluation_output,
                      assert_first_minibatch_replays_the_rollout, assert_logs_every_metric,
                      assert_same_agent_state, assert_same_logs, expect_usage_error, only_run_dir,
                      run_script, run_unbroken_and_interrupted_in_process,
                      assert_evaluation_plays_the_saved_weights,
                      assert_target_kl_ends_the_update_early, assert_one_copy_to_the_host_per_step,
                      assert_logged_losses_are_the_updates_own,
                      assert_anneal_clip_lowers_the_clipping_coefficient, PROGRESS_LINE,
                      assert_progress_is_printed_within_a_rollout,
                      assert_stopped_with_its_logs_flushed)
from ppo_utils import procgen_games  # noqa: E402
from ppo import ppo_procgen as script
from conftest import parse_args as parse_args_of
from ppo.ppo_procgen import Agent, Args, evaluate, main, minibatch_loss


def parse_args(argv: list[str]):  # what `python ppo/ppo_procgen.py argv...` reads
    return parse_args_of(script, argv)

SCRIPT = "ppo_procgen.py"

# Tiny sizes: 4 games x 16 steps, 2 minibatches, 2 iterations in 128 steps.
SMALL = dict(num_envs=4, num_steps=16, num_minibatches=2, cuda=False)
SMALL_FLAGS = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--no-cuda"]
# The CNN on a small CPU: one thread is fastest for these batches and immune to a busy second core.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def procgen():
    """Skip a test that needs the real games where the optional package is not installed."""
    if procgen_games.ProcgenGym3Env is None:
        pytest.skip("procgen is not installed: pip install -e '.[procgen]'")


# --------------------------------------------------------------------------------------------------
# The IMPALA CNN
# --------------------------------------------------------------------------------------------------


def test_impala_network_shapes():
    agent = Agent(15)
    obs = torch.randint(0, 256, (5, 64, 64, 3), dtype=torch.uint8)
    trunk = obs.permute(0, 3, 1, 2).float() / 255.0
    for sequence, expected in zip(agent.network[:3],
                                  [(5, 16, 32, 32), (5, 32, 16, 16), (5, 32, 8, 8)]):
        trunk = sequence(trunk)
        assert tuple(trunk.shape) == expected
    assert tuple(agent.features(obs).shape) == (5, 256)
    action, logprob, entropy, value = agent.get_action_and_value(obs)
    assert action.shape == logprob.shape == entropy.shape == (5,)
    assert value.shape == (5, 1)
    assert torch.all((action >= 0) & (action < 15))
    # Three ConvSequences (one conv and two residual blocks of two convs each), 2048 -> 256, two
    # heads.
    convs = [m for m in agent.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16] * 5 + [32] * 10
    assert agent.network[-2].in_features == 32 * 8 * 8 and agent.network[-2].out_features == 256


def test_impala_blocks_compute_what_the_architecture_says():
    """Shapes cannot show these: a residual block adds its input back (with zero convolutions it is
    the identity), each ConvSequence max-pools over 3x3 windows with stride 2, and the trunk's ReLUs
    sit before and after the 256-unit layer (its input and the features are never negative)."""
    torch.manual_seed(0)
    agent = Agent(15)
    block = agent.network[0].res0
    for conv in (block.conv0, block.conv1):
        torch.nn.init.zeros_(conv.weight)
        torch.nn.init.zeros_(conv.bias)
    x = torch.randn(2, 16, 32, 32)
    assert torch.equal(block(x), x)
    x = torch.randn(2, 16, 64, 64)
    for sequence in agent.network[:3]:
        assert torch.equal(sequence.pool(x[:, :1]),
                           torch.nn.functional.max_pool2d(x[:, :1], 3, stride=2, padding=1))
    dense_inputs = []
    agent.network[-2].register_forward_hook(
        lambda module, inputs, output: dense_inputs.append(inputs[0]))
    features = agent.features(torch.randint(0, 256, (4, 64, 64, 3), dtype=torch.uint8))
    assert dense_inputs[0].min() >= 0 and (dense_inputs[0] > 0).any()
    assert features.min() >= 0 and (features > 0).any()


def test_the_first_policy_is_close_to_uniform():
    agent = Agent(15)
    _, _, entropy, _ = agent.get_action_and_value(torch.randint(0, 256, (8, 64, 64, 3),
                                                                dtype=torch.uint8))
    assert torch.allclose(entropy, torch.full((8,), float(np.log(15))), atol=1e-2)


def test_initialization_matches_the_reference():
    """The heads are orthogonal (gain 0.01 for the policy, 1 for the value) with zero biases; the
    256-unit dense layer keeps PyTorch's default, uniform weights and biases within 1/sqrt(fan_in),
    as in openai/train-procgen and the reference implementation."""
    torch.manual_seed(0)
    agent = Agent(15)
    dense = agent.network[-2]
    bound = 1 / np.sqrt(dense.in_features)
    assert dense.weight.abs().max() <= bound and dense.bias.abs().max() <= bound
    assert dense.bias.abs().max() > bound / 2  # not the zero biases of layer_init
    # An orthogonal layer with gain 1 would reach far beyond the bound; the default init stays
    # inside.
    assert dense.weight.std() < bound
    for head, gain in ((agent.actor, 0.01), (agent.critic, 1.0)):
        weight = head.weight
        assert torch.allclose(weight @ weight.T, gain**2 * torch.eye(weight.shape[0]), atol=1e-6)
        assert torch.all(head.bias == 0)


# --------------------------------------------------------------------------------------------------
# The adapter and the logged score, on a stand-in for procgen
# --------------------------------------------------------------------------------------------------

EPISODE_LENGTH = 6
FINAL_REWARD = 10.0


class FakeGames:
    """Stands in for procgen's ProcgenGym3Env: every episode lasts EPISODE_LENGTH steps, each step
    scores 1 and the last FINAL_REWARD; as Procgen does, the step that ends an episode returns the
    first observation of the next one (first=True) with the finished episode's last reward."""

    def __init__(self, num, env_name, rand_seed=None, **options):
        self.num, self.t = num, np.zeros(num, dtype=np.int64)
        self.reward, self.first = np.zeros(num, dtype=np.float32), np.ones(num, dtype=bool)

    def act(self, actions):
        assert actions.dtype == np.int32 and actions.shape == (self.num,)
        self.t += 1
        self.first = self.t == EPISODE_LENGTH
        self.reward = np.where(self.first, FINAL_REWARD, 1.0).astype(np.float32)
        self.t[self.first] = 0

    def observe(self):
        obs = np.broadcast_to(self.t[:, None, None, None], (self.num, 64, 64, 3)).astype(np.uint8)
        return self.reward, {"rgb": obs}, self.first

    def get_state(self):
        return [int(t).to_bytes(1, "little") for t in self.t]

    def set_state(self, state):
        self.t = np.array([int.from_bytes(s, "little") for s in state])

    def close(self):
        pass


def test_episodes_end_within_the_step_and_score_the_real_game_reward(workdir, monkeypatch):
    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", FakeGames)
    envs = script.make_envs("starpilot", 2)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 64, 64, 3) and obs.dtype == np.uint8
    for t in range(1, EPISODE_LENGTH + 1):
        obs, reward, terminated, truncated, _ = envs.step(np.array([3, 4]))
        assert not truncated.any()
        assert terminated.all() == (t == EPISODE_LENGTH)
    assert reward.tolist() == [FINAL_REWARD] * 2
    assert obs[0, 0, 0, 0] == 0  # already the first observation of the next episode

    # In training, rewards are scaled and clipped; the logged return is still the game's own score.
    main(Args(env_id="starpilot", total_timesteps=128, **SMALL))
    scalars = assert_logs_every_metric(only_run_dir(workdir))
    assert ({value for _, value in scalars["charts/episodic_return"]}
            == {EPISODE_LENGTH - 1 + FINAL_REWARD})
    assert {value for _, value in scalars["charts/episodic_length"]} == {EPISODE_LENGTH}
    assert len(scalars["charts/episodic_return"]) == 4 * (32 // EPISODE_LENGTH)


def test_capture_video_writes_the_first_games_scheduled_episodes(workdir, monkeypatch):
    pytest.importorskip("moviepy", reason="moviepy is not installed: pip install -e '.[video]'")
    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", FakeGames)
    envs = script.make_envs("starpilot", 2, capture_video=True, video_folder="videos/run")
    envs.reset(seed=0)
    for _ in range(3 * EPISODE_LENGTH):
        envs.step(np.zeros(2))
    # gymnasium's schedule records episodes 0, 1, 8, 27, ...: here the first two of the three.
    videos = sorted(path.name for path in (workdir / "videos" / "run").glob("*.mp4"))
    assert videos == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]


# --------------------------------------------------------------------------------------------------
# The real games: a run end to end, exact resumption, evaluation
# --------------------------------------------------------------------------------------------------


def test_seeds_past_31_bits_wrap_around(procgen):
    """--seed goes up to 2**31 - 1, and a resumed run and an evaluation add an offset to it, but
    Procgen takes 32-bit seeds: reset wraps them, so seed 2**31 + 5 draws seed 5's levels."""
    wrapped, plain = script.make_envs("starpilot", 2), script.make_envs("starpilot", 2)
    np.testing.assert_array_equal(wrapped.reset(seed=2**31 + 5)[0], plain.reset(seed=5)[0])
    for _ in range(50):
        np.testing.assert_array_equal(wrapped.step(np.array([1, 3]))[0],
                                      plain.step(np.array([1, 3]))[0])
    wrapped.close()
    plain.close()


def test_speed_py_steps_the_games_for_their_raw_rate(procgen):
    """benchmark/speed.py's raw rate steps the script's own vector env with random actions drawn
    from its single action space, which ProcgenVectorEnv has (it has no batched action_space)."""
    from benchmark import speed

    wall, cpu = speed.raw_env_speed(script, "starpilot", 2, seconds=0.01)
    assert wall > 0 and cpu > 0


@pytest.mark.smoke
def test_tiny_run_on_starpilot_then_evaluate(tmp_path, monkeypatch, capsys, procgen):
    result = run_script(SCRIPT, *SMALL_FLAGS, "--total-timesteps", "128", "--save-model",
                        cwd=tmp_path, env=ONE_THREAD)
    assert ([match.group(1) for match in PROGRESS_LINE.finditer(result.stdout)][-1]
            == "128"), result.stdout
    assert result.stderr.strip() == ""  # nothing from the retired gym package that procgen imports
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("starpilot__ppo_procgen__1__")
    # no episode may end in 32 steps
    assert_logs_every_metric(run_dir,
                             except_for=("charts/episodic_return", "charts/episodic_length"))


    monkeypatch.chdir(tmp_path)
    evaluation = evaluate(*parse_args(["--evaluate", str(run_dir / "checkpoint.pt"),
                                       "--eval-episodes", "2", "--no-cuda"]))
    assert len(evaluation) == 2
    printed = assert_evaluation_output(capsys.readouterr().out, "starpilot", 2)
    assert printed == pytest.approx(evaluation, abs=0.05)


def test_the_first_minibatch_of_each_update_replays_the_rollout(workdir, monkeypatch, procgen):
    assert_first_minibatch_replays_the_rollout(script,
                                               Args(total_timesteps=192, **SMALL), monkeypatch)


def test_anneal_clip_lowers_the_clipping_coefficient_with_each_iteration(workdir, monkeypatch):
    """On the stand-in games."""
    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", FakeGames)
    assert_anneal_clip_lowers_the_clipping_coefficient(script, Args(total_timesteps=192, **SMALL),
                                                       monkeypatch)


def test_the_progress_line_speaks_within_long_rollouts_too(workdir, capsys, monkeypatch):
    """On the stand-in games."""
    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", FakeGames)
    assert_progress_is_printed_within_a_rollout(script, Args(total_timesteps=128, **SMALL), capsys,
                                                procgen_games.Games)


def test_the_rollout_copies_only_the_actions_to_the_host(workdir, monkeypatch, procgen):
    assert_one_copy_to_the_host_per_step(script, Args(total_timesteps=128, **SMALL), monkeypatch,
                                         procgen_games.Games, action_shape=(4,))


def test_the_logged_losses_are_the_updates_own(workdir, monkeypatch, procgen):
    assert_logged_losses_are_the_updates_own(script,
                                             Args(total_timesteps=128, **SMALL), monkeypatch)


def test_target_kl_ends_the_update_early(workdir, monkeypatch, procgen):
    assert_target_kl_ends_the_update_early(script, Args(total_timesteps=128, **SMALL), monkeypatch)


def test_evaluation_plays_the_saved_weights(workdir, monkeypatch, procgen):
    assert_evaluation_plays_the_saved_weights(script,
                                              Args(total_timesteps=128, **SMALL), monkeypatch)


@pytest.mark.smoke
def test_interrupted_and_resumed_run_ends_exactly_like_an_unbroken_one(workdir, procgen):
    """The games' states go into the checkpoint (procgen can save them), so a run stopped by SIGTERM
    (`kill`, or Slurm) and resumed ends bit for bit where an unbroken run ends. (Ctrl-C: the
    compiled run's test.)"""
    args = Args(env_id="bigfish", seed=3, total_timesteps=192, save_model=True, **SMALL)
    # SIGTERM during the 20th step, in the second iteration: that iteration finishes, then the run
    # stops.
    unbroken, stopped, checkpoint_path = run_unbroken_and_interrupted_in_process(
        main, args, workdir, procgen_games.Games, interrupt_at_step=20, stop_signal=signal.SIGTERM)
    assert stopped["interrupted"] and stopped["global_step"] == 128
    assert_stopped_with_its_logs_flushed(checkpoint_path)

    resumed = main(*parse_args(["--resume", str(checkpoint_path)]))
    assert resumed["global_step"] == unbroken["global_step"] == 192
    assert_same_agent_state(unbroken["agent"].state_dict(), resumed["agent"].state_dict())
    assert resumed["reward_scaler"].return_rms.var == unbroken["reward_scaler"].return_rms.var
    assert resumed["recent_returns"] == unbroken["recent_returns"]
    assert_same_logs(only_run_dir(workdir / "unbroken"), checkpoint_path.parent)


# --------------------------------------------------------------------------------------------------
# Speed options: --compile, --cudagraphs
# --------------------------------------------------------------------------------------------------


def test_compiled_minibatch_loss_equals_the_plain_one():
    """--compile changes how the loss is computed, not what: on the same minibatch of uint8 frames
    the compiled loss, statistics and gradients (convolutions included) are the plain ones within
    float tolerance."""
    torch.manual_seed(0)
    agent, size = Agent(15), 32  # the size of a minibatch of SMALL: one graph to compile
    obs = torch.randint(0, 256, (size, 64, 64, 3), dtype=torch.uint8)
    with torch.no_grad():
        actions, logprob, _, value = agent.get_action_and_value(obs)
    # The policy and value as they were before a few updates: some ratios leave the clip range.
    old_logprob, old_value = (logprob + 0.3 * torch.randn(size),
                              value.flatten() + 0.3 * torch.randn(size))
    stats = assert_compiled_loss_matches_plain(minibatch_loss, agent, obs, actions, old_logprob,
                                               old_value, torch.randn(size), torch.randn(size),
                                               0.2, Args())
    assert 0 < stats["clipfrac"] < 1  # both branches of the clipped objective took part
    # the rollout's policy step
    action, _, _, value = assert_compiles_whole(agent.get_action_and_value, obs)
    assert action.shape == (size,) and value.shape == (size, 1)


def test_compiled_run_logs_every_metric_and_resumes_exactly(workdir, monkeypatch):
    """On the stand-in games."""
    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", FakeGames)
    args = Args(env_id="starpilot", seed=3, total_timesteps=192, save_model=True,
                compile=True, **SMALL)
    assert_run_with_option_resumes_exactly(script, args, workdir, procgen_games.Games,
                                           interrupt_at_step=20)


def test_cudagraphs_without_a_gpu_is_a_one_line_error(capsys, workdir, monkeypatch):
    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", FakeGames)
    expect_usage_error(capsys, lambda: main(Args(total_timesteps=128, cudagraphs=True, **SMALL)),
                       SCRIPT, "--cudagraphs needs a CUDA device")


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


def test_unknown_games_and_settings(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(env_id="starpilt", cuda=False)), SCRIPT,
                       "unknown Procgen game 'starpilt'", "bigfish", "starpilot")
    expect_usage_error(capsys, lambda: main(Args(env_id="StarPilot", cuda=False)), SCRIPT,
                       "did you mean 'starpilot'")
    expect_usage_error(capsys, lambda: main(Args(env_id="BigfishEasy-v0", cuda=False)), SCRIPT,
                       "did you mean 'bigfish'")
    expect_usage_error(capsys, lambda: main(Args(env_id="Hopper-v5", cuda=False)), SCRIPT,
                       "ppo/ppo_continuous_action.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="CartPole-v1", cuda=False)),
                       SCRIPT, "ppo/ppo.py")
    expect_usage_error(capsys, lambda: main(Args(env_id="BreakoutNoFrameskip-v4", cuda=False)),
                       SCRIPT, "ppo/ppo_atari.py")
    expect_usage_error(capsys,
                       lambda: main(Args(distribution_mode="medium", **SMALL, total_timesteps=128)),
                       SCRIPT, "--distribution-mode", "'medium'", "easy, hard")
    expect_usage_error(capsys, lambda: main(Args(num_envs=3, num_steps=5, num_minibatches=8)),
                       SCRIPT, "15", "--num-minibatches 8")


def test_the_modes_only_some_games_have(capsys, workdir, procgen):
    """"exploration" is the one level Procgen keeps for the game, whatever the seed; "memory" and
    "exploration" are refused for the games that lack them, before Procgen's own assertion (or its
    C++ abort) would stop the run."""
    first, second = (script.make_envs("heist", 1, distribution_mode="exploration")
                     for _ in range(2))
    np.testing.assert_array_equal(first.reset(seed=1)[0], second.reset(seed=2)[0])
    first.close()
    second.close()
    expect_usage_error(capsys,
                       lambda: main(Args(distribution_mode="memory", **SMALL, total_timesteps=128)),
                       SCRIPT, "starpilot has no 'memory' distribution mode", "maze")
    expect_usage_error(capsys, lambda: main(Args(distribution_mode="exploration", **SMALL,
                                                 total_timesteps=128)), SCRIPT,
                       "starpilot has no 'exploration' distribution mode", "coinrun")
    expect_usage_error(capsys, lambda: main(Args(env_id="heist", distribution_mode="exploration",
                                                 num_levels=200, **SMALL, total_timesteps=128)),
                       SCRIPT, "leave out --num-levels")


def test_missing_procgen_names_the_extra(capsys, workdir, monkeypatch):
    # as the script is where procgen is not installed
    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", None)
    expect_usage_error(capsys, lambda: main(Args(**SMALL, total_timesteps=128)), SCRIPT,
                       'pip install -e ".[procgen]"')


def test_checkpoints_of_another_variant_are_refused(capsys, workdir):
    torch.save({"variant": "ppo_atari", "args": {}}, "atari.pt")
    expect_usage_error(capsys, lambda: parse_args(["--resume", "atari.pt"]), SCRIPT,
                       "ppo/ppo_atari.py")


def test_every_detail_is_marked_in_the_script():
    assert_details_marked(SCRIPT, {"Core": 13, "Procgen": 2}, labels=("[Procgen: IMPALA CNN]",))
