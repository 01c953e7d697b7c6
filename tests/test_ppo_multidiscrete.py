"""Tests of ppo/ppo_multidiscrete.py: the action as independent parts, invalid-action masks (never
sampled, the log-probability and entropy of the valid choices, the same masks in the update as in
the rollout), the three ways an environment hands its mask out, envpool's Jumanji ports, exact
resumption, evaluation and the refusals. Its GAE and loss are checked with every script's, in
test_algorithm.py.

The environment is tests/masked_envs.py, imported as a user's own module would be."""

import math
import os
import signal
from dataclasses import replace

import numpy as np
import pytest
import torch

import masked_envs  # noqa: F401  (registers Shelves-v0 and its variants)
from conftest import (METRICS, REPO, assert_details_marked, assert_evaluation_output,
                      assert_first_minibatch_replays_the_rollout,
                      assert_logged_losses_are_the_updates_own, assert_same_final_weights,
                      expect_usage_error, only_run_dir, read_scalars, run_script,
                      run_unbroken_and_interrupted)
import ppo.ppo_multidiscrete as script
from ppo_utils import environments
from conftest import parse_args as parse_args_of
from ppo.ppo_multidiscrete import ActionParts, Agent, Args, main, ruled_out_share
from ppo_utils.jumanji_games import JumanjiGame

SMALL = dict(env_id="Shelves-v0", num_envs=2, num_steps=32, num_minibatches=2, cuda=False)
SMALL_FLAGS = ["--env-id", "masked_envs:Shelves-v0", "--num-envs", "2", "--num-steps", "32",
               "--num-minibatches", "2", "--no-cuda"]
NVEC = [3, 4, 5]


@pytest.fixture
def tests_on_the_path(monkeypatch):
    """tests/ on PYTHONPATH, for scripts run in a subprocess to import masked_envs as a user's
    module."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                                   os.environ.get("PYTHONPATH")])))


def random_masks(rng: np.random.Generator, rows: int) -> torch.Tensor:
    """Masks over NVEC's choices with at least one valid choice per part; row 0 allows exactly one
    choice in every part (the last one)."""
    masks = rng.random((rows, sum(NVEC))) < 0.5
    start = 0
    for n in NVEC:
        part = masks[:, start:start + n]
        part[~part.any(axis=1), rng.integers(n)] = True
        part[0] = False
        part[0, -1] = True
        start += n
    return torch.as_tensor(masks)


def an_agent_that_prefers_the_ruled_out_choices(masks: torch.Tensor) -> Agent:
    """An agent whose logits are large for every choice and largest where row 0's mask rules a
    choice out: without the mask, the ruled-out choices would be drawn almost always."""
    agent = Agent(6, NVEC)
    head = agent.actor[-1]
    torch.nn.init.zeros_(head.weight)
    with torch.no_grad():
        head.bias.copy_(torch.where(masks[0], 0.0, 30.0))
    return agent


# --------------------------------------------------------------------------------------------------
# [Masking 2], [Masking 3], [MultiDiscrete 1]: the masked distribution
# --------------------------------------------------------------------------------------------------


def allowed(actions: torch.Tensor, masks: torch.Tensor, nvec: list[int] = NVEC) -> torch.Tensor:
    """Whether each part's choice is one its mask allows."""
    first = torch.tensor(np.cumsum([0, *nvec[:-1]]))
    return torch.gather(masks, 1, actions + first)


def test_a_ruled_out_choice_is_never_sampled_even_when_the_policy_prefers_it():
    rng = np.random.default_rng(0)
    masks = random_masks(rng, 64)
    agent = an_agent_that_prefers_the_ruled_out_choices(masks)
    obs = torch.as_tensor(rng.normal(size=(64, 6)), dtype=torch.float32)
    for _ in range(50):  # 3,200 draws of each part, in both ways the script samples
        action = agent.get_action(obs, masks)
        sampled, logprob, entropy, _ = agent.get_action_and_value(obs, masks)
        assert allowed(action, masks).all() and allowed(sampled, masks).all()
        assert torch.isfinite(logprob).all() and torch.isfinite(entropy).all()
    # Row 0 allows one choice per part: it is always taken, with log-probability and entropy 0.
    assert action[0].tolist() == [n - 1 for n in NVEC]
    assert logprob[0].item() == 0.0 and entropy[0].item() == 0.0
    # Unmasked, the same agent draws the ruled-out choices: what the test above would miss.
    unmasked = Agent(6, NVEC, action_masks=False)
    unmasked.load_state_dict(agent.state_dict())
    assert not allowed(unmasked.get_action(obs, masks), masks).all()


def reference_logprob_and_entropy(logits: np.ndarray, mask: np.ndarray,
                                  action: list[int]) -> tuple[float, float]:
    """From the definition, in float64: each part a softmax over its valid choices only; the
    action's log-probability and the entropy are sums over the parts."""
    logprob = entropy = 0.0
    start = 0
    for part, n in enumerate(NVEC):
        valid = [j for j in range(n) if mask[start + j]]
        normalizer = math.log(sum(math.exp(logits[start + j]) for j in valid))
        probabilities = {j: math.exp(logits[start + j] - normalizer) for j in valid}
        logprob += math.log(probabilities[action[part]])
        entropy -= sum(p * math.log(p) for p in probabilities.values())
        start += n
    return logprob, entropy


def test_log_probability_and_entropy_under_a_mask_match_a_hand_computation():
    rng = np.random.default_rng(1)
    masks = random_masks(rng, 32)
    agent = Agent(6, NVEC)
    with torch.no_grad():
        # logits of a few units, not the first policy's near-zero ones
        agent.actor[-1].weight.mul_(300.0)
    obs = torch.as_tensor(rng.normal(size=(32, 6)), dtype=torch.float32)
    action, logprob, entropy, _ = agent.get_action_and_value(obs, masks)
    logits = agent.actor(obs).detach().double().numpy()
    for row in range(32):
        expected_logprob, expected_entropy = reference_logprob_and_entropy(
            logits[row], masks[row].numpy(), action[row].tolist())
        assert logprob[row].item() == pytest.approx(expected_logprob, abs=1e-4)
        assert entropy[row].item() == pytest.approx(expected_entropy, abs=1e-4)


def test_a_part_with_every_choice_ruled_out_gives_no_nan():
    """A mask row with no valid choice (a bug of the environment's, or a part that has nothing to
    do) leaves that part uniform: a NaN would reach every weight at the next update."""
    masks = random_masks(np.random.default_rng(2), 4)
    masks[1, :NVEC[0]] = False
    agent = Agent(6, NVEC)
    _, logprob, entropy, _ = agent.get_action_and_value(torch.zeros(4, 6), masks)
    assert torch.isfinite(logprob).all() and torch.isfinite(entropy).all()
    (logprob.sum() + entropy.sum()).backward()
    assert all(torch.isfinite(parameter.grad).all() for parameter in agent.actor.parameters())


def test_ruled_out_share_counts_the_actions_with_a_ruled_out_part():
    masks = np.ones((1, 2, sum(NVEC)), dtype=bool)
    masks[0, 1, NVEC[0] + 2] = False  # environment 1: part 1's choice 2
    actions = np.array([[[0, 2, 0], [0, 2, 4]]])
    assert ruled_out_share(actions, masks, NVEC) == 0.5

# --------------------------------------------------------------------------------------------------
# [Masking 1]: where an environment keeps its mask, and the shapes it may have
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", sorted(masked_envs.CONVENTIONS))
def test_each_way_of_handing_out_the_mask_is_read_as_the_same_rows(env_id):
    """The Dict observation's key (rows or flat), the info's, the action_masks() method: every info
    carries the same flat mask, and the observation is the game's values alone."""
    envs = script.make_envs(env_id, 2)
    reference = script.make_envs("Shelves-v0", 2)
    obs, infos = envs.reset(seed=5)
    reference_obs, reference_infos = reference.reset(seed=5)
    for _ in range(20):
        assert np.array_equal(obs, reference_obs) and obs.shape == (2, 3 * 5 + 1)
        assert infos["action_mask"].shape == (2, sum([4, 5, 6]))
        assert np.array_equal(infos["action_mask"], reference_infos["action_mask"])
        action = np.stack([envs.single_action_space.sample() for _ in range(2)])
        obs, _, _, _, infos = envs.step(action)
        reference_obs, _, _, _, reference_infos = reference.step(action)


def test_the_mask_of_a_finished_environment_is_its_next_episode_s_first(workdir):
    """SAME_STEP autoreset: the step that ends an episode returns the next episode's first
    observation, and with it that episode's mask (the shelves the new episode starts with)."""
    envs = script.make_envs("ShelvesInfo-v0", 1)
    _, infos = envs.reset(seed=3)
    for _ in range(8):  # the horizon
        _, _, terminated, _, infos = envs.step(np.zeros((1, 3), dtype=np.int64))
    assert terminated[0]
    game = envs.envs[0].unwrapped
    assert game.t == 0 and np.array_equal(infos["action_mask"][0], np.concatenate(
        [row[:n] for row, n in zip(game.rows(), game.nvec)]))


def test_discrete_and_integer_box_actions_become_parts_from_zero():
    import gymnasium as gym

    class Game(gym.Env):
        observation_space = gym.spaces.Discrete(4)

        def __init__(self, action_space):
            self.action_space, self.received = action_space, []

        def reset(self, *, seed=None, options=None):
            return 2, {}

        def step(self, action):
            self.received.append(action)
            return 3, 0.0, False, False, {}

    discrete = ActionParts(Game(gym.spaces.Discrete(3, start=-1)))
    boxed = ActionParts(Game(gym.spaces.Box(-2, 3, (2, 2), np.int32)))
    assert discrete.action_space == gym.spaces.MultiDiscrete([3])
    assert boxed.action_space == gym.spaces.MultiDiscrete([6, 6, 6, 6])
    obs, info = discrete.reset()
    # one-hot; no mask
    assert obs.tolist() == [0, 0, 1, 0] and info["action_mask"].tolist() == [True] * 3
    discrete.step(np.array([0]))
    boxed.step(np.array([0, 1, 2, 5]))
    assert discrete.env.received == [-1]
    assert (boxed.env.received[0].tolist() == [[-2, -1], [0, 3]]
            and boxed.env.received[0].dtype == np.int32)


def test_a_joint_mask_is_refused_in_one_line(capsys, workdir):
    expect_usage_error(capsys, lambda: main(Args(**{**SMALL, "env_id": "ShelvesJoint-v0"},
                                                 total_timesteps=64)), "ppo_multidiscrete.py",
                       "mask's shape (4, 5, 6) is joint over the action's 3 parts",
                       "make the action one Discrete(120) with that mask flattened")
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("env_id,shape,size",
                         [("JointEye-v0", (2, 2), 4), ("JointTwoByThree-v0", (2, 3), 5)])
def test_a_joint_mask_shaped_like_padded_rows_is_refused_never_read_as_rows(
        env_id, shape, size, capsys, workdir):
    """nvec [2, k]: a joint mask's shape, tuple(nvec), is that of one row per part padded to the
    longest, (2, max(nvec)). np.eye(2) for nvec [2, 2] allows (0, 0) and (1, 1) only; read as rows
    it would force the forbidden (0, 1) at every step (issue 63). Whichever it is, the script cannot
    tell: refused."""
    expect_usage_error(
        capsys, lambda: main(Args(**{**SMALL, "env_id": env_id}, total_timesteps=64)),
        "ppo_multidiscrete.py", f"mask's shape {shape} is both one row per part, padded, and joint",
        f"hand them out flat, {size} booleans")
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("env_id,says",
                         [("masked_envs:JointEye-v0", "(2, 2) is both one row per part"),
                          ("masked_envs:ShortMask-v0",
                           "(4,) is neither (5,) nor (2, 3) for the action's parts [2, 3]")])
def test_a_mask_refused_at_the_first_reset_leaves_no_run_folder(
        env_id, says, tmp_path, tests_on_the_path):
    """As a user runs it: the first reset's mask is refused before the run claims its folder and
    says where its logs go, as its first iteration begins: one line, nothing made."""
    result = run_script("ppo_multidiscrete.py", "--env-id", env_id, *SMALL_FLAGS[2:],
                        "--total-timesteps", "128", cwd=tmp_path, check=False)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"ppo_multidiscrete.py: error: the action mask's shape {says}"), line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("env_id,warning", [
    ("MasksKey-v0", "the Dict observation has no `action_mask` key: every action is allowed, and "
                    "its 'action_masks' is observed, not obeyed"),
    ("NoChoice-v0", "the action mask rules out every choice of a part of the action: that part is "
                    "drawn uniformly")])
def test_a_fallback_is_said_once_in_one_line(env_id, warning, capsys, workdir, monkeypatch):
    """A mask under another key than `action_mask`, and a part with no valid choice: the run goes on
    as the docs say (no mask; that part drawn uniformly) and says so once (issue 63)."""
    script.warn_once.cache_clear()
    main(Args(**{**SMALL, "env_id": env_id}, total_timesteps=128))
    [line] = [line for line in capsys.readouterr().err.splitlines()
              if "ppo_multidiscrete.py" in line]
    assert line.startswith(f"ppo_multidiscrete.py: warning: {warning}"), line


def test_a_bare_envpool_id_names_the_id_to_give(capsys, workdir):
    """envpool.list_all_envs() lists Jumanji's games bare (JobShop-v0) too: the script takes them as
    Jumanji/JobShop-v0, and says so."""
    pytest.importorskip("envpool")
    for game in ("JobShop-v0", "Cleaner-v0", "Knapsack-v1"):
        expect_usage_error(capsys, lambda: main(Args(**{**SMALL, "env_id": game})),
                           "ppo_multidiscrete.py", f"unknown env id '{game}'",
                           f"--env-id Jumanji/{game}")


def test_an_envpool_game_that_cannot_be_made_is_one_line(capsys, workdir):
    """envpool 1.2's wheel lacks Sudoku's puzzles: making it raises a RuntimeError of its own."""
    envpool = pytest.importorskip("envpool")
    try:
        envpool.make("Jumanji/Sudoku-v0", env_type="gymnasium", num_envs=1)
        pytest.skip("this envpool makes Sudoku")
    except RuntimeError:
        pass
    expect_usage_error(capsys, lambda: main(Args(**{**SMALL, "env_id": "Jumanji/Sudoku-v0"})),
                       "ppo_multidiscrete.py",
                       "envpool cannot make Jumanji/Sudoku-v0 (failed to open Sudoku")
    assert not (workdir / "runs").exists()


def test_continuous_actions_and_images_are_refused_with_the_script_that_takes_them(capsys, workdir):
    expect_usage_error(capsys,
                       lambda: main(Args(**{**SMALL, "env_id": "Pendulum-v1"}, total_timesteps=64)),
                       "ppo_multidiscrete.py", "Box action space", "ppo/ppo_continuous_action.py")

# --------------------------------------------------------------------------------------------------
# [Masking 4]: the update scores the rollout's actions under the rollout's masks
# --------------------------------------------------------------------------------------------------


def test_the_first_minibatch_of_each_update_replays_the_masked_rollout(workdir, monkeypatch):
    """Before the first optimizer step of an update the network is the one that acted: recomputed
    under the stored masks, every log-probability is the rollout's own. An update that dropped the
    masks, or used another step's, would score the actions under another policy."""
    assert_first_minibatch_replays_the_rollout(script,
                                               Args(**SMALL, total_timesteps=256), monkeypatch)


def test_the_batch_holds_the_observations_masks_and_actions_of_each_step(workdir, monkeypatch):
    acted, scored = [], []
    get_action, get_action_and_value = Agent.get_action, Agent.get_action_and_value

    def recording_get_action(self, obs, mask):
        action = get_action(self, obs, mask)
        acted.append((obs.clone(), mask.clone(), action.clone()))
        return action

    def recording_get_action_and_value(self, obs, mask, action=None):
        if action is not None and len(scored) * 32 < len(acted):  # the batched pass after a rollout
            scored.append((obs.clone(), mask.clone(), action.clone()))
        return get_action_and_value(self, obs, mask, action)

    monkeypatch.setattr(Agent, "get_action", recording_get_action)
    monkeypatch.setattr(Agent, "get_action_and_value", recording_get_action_and_value)
    main(Args(**SMALL, total_timesteps=128))
    assert len(scored) == 2
    for iteration, batch in enumerate(scored):
        steps = acted[iteration * 32:(iteration + 1) * 32]
        for stored, seen in zip(batch, zip(*steps)):
            assert torch.equal(stored, torch.cat(seen)), iteration
        assert allowed(batch[2], batch[1], [4, 5, 6]).all()


def test_the_logged_losses_are_the_updates_own(workdir, monkeypatch):
    assert_logged_losses_are_the_updates_own(script,
                                             Args(**SMALL, total_timesteps=128), monkeypatch)

# --------------------------------------------------------------------------------------------------
# Learning, and what the masks buy
# --------------------------------------------------------------------------------------------------


def test_masked_runs_pick_no_ruled_out_choice_and_outscore_unmasked_ones(workdir):
    """Masked, the invalid-action rate is 0 in every iteration and each episode earns what it picks;
    unmasked, the agent picks empty slots, which cost it (charts/invalid_action_rate is what the
    masks spare). Over 500 episodes a random valid policy earned 8.4 an episode here, a random one
    0.1: the masked agent beats the first within 2,048 steps, the unmasked one not even the
    second."""
    masked = main(Args(**SMALL, total_timesteps=2048, seed=2, exp_name="masked"))
    unmasked = main(Args(**SMALL, total_timesteps=2048, seed=2, exp_name="unmasked",
                         action_masks=False))
    logs = {run["run_name"]: read_scalars(workdir / "runs" / run["run_name"])
            for run in (masked, unmasked)}
    masked_rate = [value for _, value in logs[masked["run_name"]]["charts/invalid_action_rate"]]
    unmasked_rate = [value for _, value in logs[unmasked["run_name"]]["charts/invalid_action_rate"]]
    assert set(masked_rate) == {0.0} and min(unmasked_rate) > 0.3, unmasked_rate
    assert set(logs[masked["run_name"]]) >= set(METRICS)
    # (9.4 and -0.3 when written)
    assert np.mean(masked["recent_returns"]) > 8.4 > 0.1 > np.mean(unmasked["recent_returns"])

# --------------------------------------------------------------------------------------------------
# Checkpoints: exact resumption, evaluation with the masks
# --------------------------------------------------------------------------------------------------


def test_interrupted_and_resumed_run_ends_with_the_same_weights_and_evaluates_with_masks(
        tmp_path, tests_on_the_path):
    """SIGTERM mid-run, then --resume: the saved shelves, masks and all, go on where they were, and
    the run ends with the unbroken run's weights and logs."""
    flags = ["--seed", "3", "--total-timesteps", "3200", "--save-model", *SMALL_FLAGS]
    unbroken, interrupted, _ = run_unbroken_and_interrupted("ppo_multidiscrete.py", flags, tmp_path,
                                                            stop_signal=signal.SIGTERM)
    checkpoint_path = only_run_dir(interrupted) / "checkpoint.pt"
    resumed = run_script("ppo_multidiscrete.py", "--resume", str(checkpoint_path), cwd=interrupted)
    assert "resuming" in resumed.stdout and "with new episodes" not in resumed.stdout
    _, final = assert_same_final_weights(unbroken, checkpoint_path, 3200)
    assert final["processes"][0]["rollout"]["next_mask"].shape == (2, 15)
    evaluation = run_script("ppo_multidiscrete.py", "--evaluate", str(checkpoint_path),
                            "--eval-episodes", "3", cwd=interrupted)
    assert_evaluation_output(evaluation.stdout, "masked_envs:Shelves-v0", 3)


def test_evaluation_plays_under_the_masks_and_keeps_the_checkpoint_s_choice(
        workdir, monkeypatch, capsys):
    main(Args(**SMALL, total_timesteps=128, save_model=True))
    checkpoint = str(only_run_dir(workdir) / "checkpoint.pt")
    picks = []
    step = masked_envs.Shelves.step

    def counting_step(self, action):
        result = step(self, action)
        picks.append(result[4]["invalid_picks"])
        return result

    monkeypatch.setattr(masked_envs.Shelves, "step", counting_step)
    script.evaluate(*parse_args_of(script, ["--evaluate", checkpoint, "--eval-episodes", "4"]))
    assert len(picks) == 4 * 8 and sum(picks) == 0
    capsys.readouterr()
    expect_usage_error(capsys, lambda: parse_args_of(script, ["--evaluate", checkpoint,
                                                              "--no-action-masks"]),
                       "ppo_multidiscrete.py", "--action-masks True", "drop --action-masks")

# --------------------------------------------------------------------------------------------------
# envpool's Jumanji ports
# --------------------------------------------------------------------------------------------------


def test_a_jumanji_game_resets_within_the_step_that_ends_it():
    """envpool resets a finished game on the next step, whatever its action; JumanjiGame makes that
    step the reset, so every step the agent takes is a real one: Cleaner's episodes last 100 steps,
    each counted from 1."""
    pytest.importorskip("envpool")
    envs = script.make_envs("Jumanji/Cleaner-v0", 2)
    assert isinstance(envs.envs[0].unwrapped, JumanjiGame)
    _, infos = envs.reset(seed=1)
    rng = np.random.default_rng(0)
    lengths, elapsed = [], []
    for _ in range(250):
        # a random valid move for each of the 3 agents
        masks = infos["action_mask"].reshape(2, 3, 4)
        _, _, _, _, infos = envs.step(np.where(masks, rng.random(masks.shape), -1.0).argmax(-1))
        lengths += [length for _, length in environments.finished_episodes(infos)]
        elapsed.append(infos["elapsed_step"][0])
    assert lengths == [100] * 4
    assert elapsed[:101] == [*range(1, 100), 0, 1]  # step 100 ends the episode and starts the next


@pytest.mark.smoke
def test_the_default_task_trains_and_evaluates(tmp_path):
    pytest.importorskip("envpool")
    run_script("ppo_multidiscrete.py", "--total-timesteps", "1024", "--save-model",
               "--no-cuda", cwd=tmp_path)
    run_dir = only_run_dir(tmp_path)
    assert set(read_scalars(run_dir)) >= {*METRICS, "charts/invalid_action_rate"}
    evaluation = run_script("ppo_multidiscrete.py", "--evaluate", str(run_dir / "checkpoint.pt"),
                            "--eval-episodes", "2", cwd=tmp_path)
    assert_evaluation_output(evaluation.stdout, "Jumanji/Cleaner-v0", 2)


def test_every_detail_is_marked_in_the_script():
    assert_details_marked("ppo_multidiscrete.py", {"Core": 13, "MultiDiscrete": 1, "Masking": 4})


def test_help_lists_the_masks_flag(tmp_path):
    result = run_script("ppo_multidiscrete.py", "--help", cwd=tmp_path)
    assert "--action-masks" in result.stdout and "--no-action-masks" in result.stdout


def test_a_bad_flag_value_is_one_line(capsys, workdir):
    expect_usage_error(capsys, lambda: main(replace(Args(**SMALL), learning_rate=-1.0)),
                       "ppo_multidiscrete.py", "--learning-rate must be a finite number above 0")
