"""The algorithm's arithmetic, in all eight scripts: each carries its own copy of GAE and of the PPO
loss (a reader opens one file and sees everything), so each copy is checked against the same
references here, not only ppo.py's. A test that compares a script with itself (resumption, the
compiled loss) cannot see a wrong sign or a missing factor; these can."""

import importlib

import numpy as np
import pytest
import torch

from conftest import parse_args, write_checkpoint  # noqa: E402

from ppo_utils import exits  # noqa: E402
from ppo_utils import training  # noqa: E402

SCRIPTS = ["ppo", "ppo_atari", "ppo_atari_lstm", "ppo_atari_envpool", "ppo_continuous_action",
           "ppo_procgen", "ppo_atari_multigpu", "ppo_multidiscrete"]


def load(script: str):
    return importlib.import_module(f"ppo.{script}")


# --------------------------------------------------------------------------------------------------
# [Core 5: Generalized Advantage Estimation]
# --------------------------------------------------------------------------------------------------


def reference_gae(rewards, values, dones, next_value, next_done, gamma, lam, final_values=None):
    """GAE written the plain way: cut each environment's stream into episodes, and within an episode
    sum the discounted TD errors forward from each step. Quadratic, but obviously right.

    `final_values` (num_steps, num_envs), NaN where nothing was cut off: the value of the final
    observation of an episode that the time limit cut off after step k. That episode's TD error at k
    bootstraps from it, as at any step inside an episode, instead of counting nothing after the end:
    the target that --bootstrap-truncated must give."""
    num_steps, num_envs = rewards.shape
    advantages = np.zeros_like(rewards)
    # does step t+1 begin a new episode?
    starts_new_episode = np.vstack([dones[1:], next_done[None]])
    for env in range(num_envs):
        for t in range(num_steps):
            total, weight = 0.0, 1.0
            for k in range(t, num_steps):
                ended = starts_new_episode[k, env]
                following_value = next_value[env] if k == num_steps - 1 else values[k + 1, env]
                if final_values is not None and not np.isnan(final_values[k, env]):
                    # the episode would have gone on
                    following_value, ended = final_values[k, env], 0.0
                    ended_here = True
                else:
                    ended_here = bool(ended)
                delta = rewards[k, env] + gamma * following_value * (1 - ended) - values[k, env]
                total += weight * delta
                if ended_here:
                    break
                weight *= gamma * lam
            advantages[t, env] = total
    return advantages, advantages + values


@pytest.mark.parametrize("script", SCRIPTS)
def test_gae_matches_reference_across_episode_boundaries(script):
    rng = np.random.default_rng(0)
    num_steps, num_envs = 40, 3
    rewards = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    values = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    dones = (rng.random((num_steps, num_envs)) < 0.15).astype(np.float32)
    dones[:, 2] = 0.0  # one environment never ends an episode in this rollout
    next_value = rng.normal(size=num_envs).astype(np.float32)
    next_done = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    assert dones[:, :2].sum() > 3  # the draw really contains boundaries

    advantages, returns = load(script).compute_gae(rewards, values, dones, next_value,
                                                   next_done, 0.99, 0.95)
    expected_advantages, expected_returns = reference_gae(rewards, values, dones, next_value,
                                                          next_done, 0.99, 0.95)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("script", SCRIPTS)
def test_gae_with_lambda_one_is_the_discounted_return_minus_value(script):
    rewards = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    values = np.array([[0.5], [0.25], [0.125]], dtype=np.float32)
    dones = np.zeros((3, 1), dtype=np.float32)
    advantages, returns = load(script).compute_gae(
        rewards, values, dones, np.array([10.0], dtype=np.float32),
        np.array([1.0], dtype=np.float32), gamma=0.5, gae_lambda=1.0)
    # The episode ends after the last step, so the bootstrap value 10 must be ignored.
    np.testing.assert_allclose(returns[:, 0], [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0])
    np.testing.assert_allclose(advantages, returns - values)


# --------------------------------------------------------------------------------------------------
# The loss: [Core 7] advantage normalization, [Core 8] clipped objective, [Core 9] value clipping,
# [Core 12] debug variables
# --------------------------------------------------------------------------------------------------


def loss(script: str, args, new_logprob, advantages, new_value=None, old_value=None, returns=None):
    """The script's ppo_loss on a minibatch with no entropy and (unless given) no value error."""
    size = len(advantages)
    zeros = torch.zeros(size)
    return load(script).ppo_loss(new_logprob, zeros, zeros if new_value is None else new_value,
                                 zeros, zeros if old_value is None else old_value, advantages,
                                 zeros if returns is None else returns, args.clip_coef, args)


@pytest.mark.parametrize("ratio, advantage, clipped", [(1.5, 1.0, True), (0.5, -1.0, True),
                                                       (1.5, -1.0, False), (1.1, 1.0, False)])
@pytest.mark.parametrize("script", SCRIPTS)
def test_clipped_objective_stops_gradient_only_where_the_ratio_left_the_trust_region(
        script, ratio, advantage, clipped):
    args = load(script).Args(norm_adv=False, clip_coef=0.2, ent_coef=0.0)
    new_logprob = torch.tensor([np.log(ratio)], requires_grad=True)
    total, stats = loss(script, args, new_logprob, torch.tensor([advantage]))
    total.backward()
    if clipped:
        assert new_logprob.grad.item() == 0.0
        assert (stats["policy_loss"].item()
                == pytest.approx(-advantage * float(np.clip(ratio, 0.8, 1.2))))
    else:
        # d(-A * ratio)/d(log ratio) = -A * ratio
        assert new_logprob.grad.item() == pytest.approx(-advantage * ratio)
    assert stats["clipfrac"].item() == (1.0 if abs(ratio - 1) > 0.2 else 0.0)
    assert stats["approx_kl"].item() == pytest.approx((ratio - 1) - np.log(ratio), rel=1e-5)
    assert stats["old_approx_kl"].item() == pytest.approx(-np.log(ratio), rel=1e-5)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_loss_clips_with_the_coefficient_it_is_given(script):
    """--anneal-clip hands ppo_loss a clipping coefficient that falls with each iteration: the
    surrogate objective and the value clipping must both use it, not --clip-coef. With --clip-coef
    0.2 and a coefficient of 0.5, a ratio of 1.4 and a value that moved 0.4 are both inside the clip
    range."""
    args = load(script).Args(norm_adv=False, clip_coef=0.2, clip_vloss=True, ent_coef=0.0)
    new_logprob = torch.tensor([np.log(1.4)], requires_grad=True)
    zero = torch.zeros(1)
    total, stats = load(script).ppo_loss(new_logprob, zero, torch.tensor([0.4]), zero, zero,
                                         torch.ones(1), torch.tensor([2.0]), 0.5, args)
    total.backward()
    # the unclipped branch: -A x ratio
    assert new_logprob.grad.item() == pytest.approx(-1.4, rel=1e-5)
    assert stats["clipfrac"].item() == 0.0
    # not (2 - 0.2)^2
    assert stats["value_loss"].item() == pytest.approx(0.5 * (2.0 - 0.4) ** 2, rel=1e-5)


@pytest.mark.parametrize("script", SCRIPTS)
def test_value_loss_clipping_keeps_the_larger_error(script):
    Args = load(script).Args
    one, two, zero = torch.tensor([1.0]), torch.tensor([2.0]), torch.zeros(1)
    # The new value 1.0 moved 1.0 away from the old 0.0; the clipped prediction is 0.2.
    args = Args(clip_coef=0.2, norm_adv=False, clip_vloss=True)
    _, stats = loss(script, args, zero, zero, new_value=one, old_value=zero, returns=two)
    assert stats["value_loss"].item() == pytest.approx(0.5 * (2.0 - 0.2) ** 2)
    # Toward the target, the clipped prediction has the larger error: still the one kept.
    _, stats = loss(script, args, zero, zero, new_value=one, old_value=zero,
                    returns=torch.tensor([-1.0]))
    assert stats["value_loss"].item() == pytest.approx(0.5 * (1.0 + 1.0) ** 2)
    args = Args(clip_coef=0.2, norm_adv=False, clip_vloss=False)
    _, stats = loss(script, args, zero, zero, new_value=one, old_value=zero, returns=two)
    assert stats["value_loss"].item() == pytest.approx(0.5 * (2.0 - 1.0) ** 2)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_loss_subtracts_the_entropy_bonus_and_adds_the_weighted_value_loss(script):
    """[Core 10] loss = policy loss - ent_coef x mean entropy + vf_coef x value loss, with both
    coefficients taken from the arguments (the other tests of the loss pass zero entropy). More
    entropy must lower the loss: d loss / d entropy_i = -ent_coef / N."""
    module = load(script)
    rng = np.random.default_rng(2)
    size = 8
    new_logprob = torch.tensor(rng.normal(scale=0.1, size=size), dtype=torch.float32)
    entropy = torch.tensor(rng.uniform(0.5, 1.5, size), dtype=torch.float32, requires_grad=True)
    new_value, returns = (torch.tensor(rng.normal(size=size), dtype=torch.float32)
                          for _ in range(2))
    advantages = torch.tensor(rng.normal(size=size), dtype=torch.float32)
    args = module.Args(norm_adv=False, clip_vloss=False, ent_coef=0.03, vf_coef=0.7)
    total, stats = module.ppo_loss(new_logprob, entropy, new_value, torch.zeros(size),
                                   new_value.clone(), advantages, returns, args.clip_coef, args)
    assert stats["entropy"].item() == pytest.approx(entropy.mean().item())
    assert (stats["value_loss"].item()
            == pytest.approx(0.5 * ((new_value - returns) ** 2).mean().item()))
    expected = stats["policy_loss"] - 0.03 * stats["entropy"] + 0.7 * stats["value_loss"]
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)
    total.backward()
    torch.testing.assert_close(entropy.grad, torch.full((size,), -0.03 / size))


def test_explained_variance():
    """[Core 12] 1 - Var(target - predicted) / Var(target), which every script's run logs
    (training.Run.end_iteration): 1 for perfect predictions, 0 for predicting the mean, negative for
    worse; undefined (nan) when the targets do not vary."""
    explained_variance = training.explained_variance
    rng = np.random.default_rng(3)
    target = rng.normal(size=50).astype(np.float32)
    predicted = (target + rng.normal(scale=0.5, size=50)).astype(np.float32)
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert (explained_variance(np.full_like(target, target.mean()), target)
            == pytest.approx(0.0, abs=1e-6))
    assert (explained_variance(predicted, target)
            == pytest.approx(1 - np.var(target - predicted) / np.var(target), rel=1e-5))
    assert explained_variance(-target, target) < 0
    assert np.isnan(explained_variance(target, np.ones_like(target)))


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "ppo_atari_multigpu"])
def test_normalized_advantages_ignore_their_shift_and_scale(script):
    """With --norm-adv the loss sees each minibatch's advantages standardized: shifting and scaling
    them changes nothing, while without it the same change moves the loss. (ppo_atari_multigpu.py
    normalizes over the world's minibatch before its loss: see the next test.)"""
    Args = load(script).Args
    rng = np.random.default_rng(1)
    advantages = torch.tensor(rng.normal(size=16), dtype=torch.float32)
    new_logprob = torch.tensor(rng.normal(scale=0.3, size=16), dtype=torch.float32)
    for norm_adv, same in ((True, True), (False, False)):
        args = Args(norm_adv=norm_adv, ent_coef=0.0)
        plain, _ = loss(script, args, new_logprob, advantages)
        shifted, _ = loss(script, args, new_logprob, 5 * advantages + 100)
        assert (abs(plain.item() - shifted.item()) < 1e-5) == same, norm_adv



@pytest.mark.parametrize("norm_adv", [True, False])
def test_the_multigpu_script_normalizes_advantages_before_its_loss(norm_adv, monkeypatch):
    """ppo_atari_multigpu.py standardizes the world's minibatch in gradient_step (all ranks' shares
    together), so its loss receives them standardized; with one process, by this minibatch alone."""
    module = load("ppo_atari_multigpu")
    torch.manual_seed(0)
    agent = module.Agent(4)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-4, eps=1e-5)
    size = 8
    obs = torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)
    raw_advantages = 5 * torch.randn(size) + 100
    received = []

    minibatch_loss = module.minibatch_loss

    def recording_loss(agent, obs, actions, old_logprob, old_value, advantages, returns,
                       clip_coef, args):
        received.append(advantages.clone())
        return minibatch_loss(agent, obs, actions, old_logprob, old_value, advantages, returns,
                              clip_coef, args)

    monkeypatch.setattr(module, "minibatch_loss", recording_loss)

    minibatch = (obs, torch.randint(0, 4, (size,)), torch.zeros(size), torch.zeros(size),
                 raw_advantages, torch.zeros(size))
    args = module.Args(norm_adv=norm_adv)
    module.gradient_step(agent, optimizer, minibatch, args.clip_coef, args, 1)
    if norm_adv:
        assert (abs(received[0].mean().item()) < 1e-5
                and received[0].std().item() == pytest.approx(1.0, abs=1e-5))
    else:
        assert torch.equal(received[0], raw_advantages)

# --------------------------------------------------------------------------------------------------
# [Core 2: Orthogonal initialization of weights, constant initialization of biases], in the two MLP
# scripts (the CNN scripts test their own networks')
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script, actor, actions", [("ppo", "actor", 3),
                                                    ("ppo_continuous_action", "actor_mean", 3),
                                                    ("ppo_multidiscrete", "actor", [3, 4])])
def test_mlp_layers_are_orthogonal_with_the_reference_gains_and_zero_biases(script, actor, actions):
    """An orthogonal matrix scaled by g has W W^T = g^2 I (or W^T W, the smaller side): sqrt(2) for
    the hidden layers, 1 for the value head, 0.01 for the policy head (a near-uniform first
    policy)."""
    agent = load(script).Agent(11, actions)
    for network, head_gain in ((agent.critic, 1.0), (getattr(agent, actor), 0.01)):
        layers = [layer for layer in network if isinstance(layer, torch.nn.Linear)]
        assert len(layers) == 3
        for layer, gain in zip(layers, (np.sqrt(2), np.sqrt(2), head_gain)):
            weight = layer.weight.detach().double()
            small_side = (weight @ weight.T if weight.shape[0] <= weight.shape[1]
                          else weight.T @ weight)
            torch.testing.assert_close(small_side,
                                       gain**2 * torch.eye(len(small_side), dtype=torch.float64),
                                       rtol=0, atol=1e-5 * gain**2 + 1e-12)
            assert torch.count_nonzero(layer.bias) == 0

# --------------------------------------------------------------------------------------------------
# Reward scaling: [Continuous 8] in ppo_continuous_action.py, train-procgen's in ppo_procgen.py
# --------------------------------------------------------------------------------------------------


# The two references cut the return differently at an episode's end. gymnasium's NormalizeReward
# (the continuous script's reference) drops the old return in the terminal step itself, so that
# step's return is its reward alone, and carries it into the next episode; baselines' VecNormalize
# (Procgen's) adds the terminal reward, counts that return, then starts the next episode from 0.
SCALED_RETURNS = {  # script: (returns the statistics see, the return kept after each step)
    "ppo_continuous_action": ([1.0, 2.9, 3.0, 6.7, 11.03], [1.0, 2.9, 3.0, 6.7, 11.03]),
    "ppo_procgen": ([1.0, 2.9, 5.61, 4.0, 8.6], [1.0, 2.9, 0.0, 4.0, 8.6]),
}


@pytest.mark.parametrize("script", sorted(SCALED_RETURNS))
def test_rewards_are_scaled_by_the_std_of_the_discounted_return(script):
    """Each reward is divided by the standard deviation of every discounted return so far, the
    current one included (gamma 0.9 here); an episode's end cuts the return, not the statistics."""
    scaler = load(script).RewardScaler(num_envs=1, gamma=0.9)
    rewards = [1.0, 2.0, 3.0, 4.0, 5.0]
    ended = [False, False, True, False, False]  # an episode ends with the third reward
    counted_returns, kept_returns = SCALED_RETURNS[script]
    for t, (reward, end) in enumerate(zip(rewards, ended)):
        scaled = scaler.scale(np.array([reward]), np.array([end]))
        if t > 0:  # (one sample has no variance; the prior's pseudo-count decides the first scale)
            std = np.std(counted_returns[:t + 1])
            assert scaled[0] == pytest.approx(reward / std, rel=1e-3)
        assert scaler.discounted_return[0] == pytest.approx(kept_returns[t])


# --------------------------------------------------------------------------------------------------
# The default hyperparameters: the reference implementation's, per variant
# --------------------------------------------------------------------------------------------------

# What every variant shares, then each one's own values (the scripts' pages list them with the
# published tables of CleanRL's PPO docs); a changed default changes every result the docs report.
SHARED_DEFAULTS = dict(gae_lambda=0.95, norm_adv=True, clip_vloss=True, vf_coef=0.5,
                       max_grad_norm=0.5, target_kl=None, anneal_clip=False)
ATARI_DEFAULTS = dict(total_timesteps=10_000_000, learning_rate=2.5e-4, num_envs=8, num_steps=128,
                      anneal_lr=True, gamma=0.99, num_minibatches=4, update_epochs=4,
                      clip_coef=0.1, ent_coef=0.01)
CLASSIC_DEFAULTS = dict(total_timesteps=500_000, learning_rate=2.5e-4, num_envs=4, num_steps=128,
                        anneal_lr=True, gamma=0.99, num_minibatches=4, update_epochs=4,
                        clip_coef=0.2, ent_coef=0.01)
VARIANT_DEFAULTS = {
    "ppo": CLASSIC_DEFAULTS,
    # ppo.py's, as its neighbour's (no published table of its own)
    "ppo_multidiscrete": CLASSIC_DEFAULTS,
    "ppo_atari": ATARI_DEFAULTS,
    "ppo_atari_lstm": ATARI_DEFAULTS,
    "ppo_atari_envpool": ATARI_DEFAULTS,
    "ppo_atari_multigpu": ATARI_DEFAULTS,
    "ppo_continuous_action": dict(total_timesteps=1_000_000, learning_rate=3e-4, num_envs=1,
                                  num_steps=2048, anneal_lr=True, gamma=0.99, num_minibatches=32,
                                  update_epochs=10, clip_coef=0.2, ent_coef=0.0),
    "ppo_procgen": dict(total_timesteps=25_000_000, learning_rate=5e-4, num_envs=64, num_steps=256,
                        anneal_lr=False, gamma=0.999, num_minibatches=8, update_epochs=3,
                        clip_coef=0.2, ent_coef=0.01),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_defaults_are_the_reference_implementations(script):
    args = load(script).Args()
    expected = {**SHARED_DEFAULTS, **VARIANT_DEFAULTS[script]}
    assert {name: getattr(args, name) for name in expected} == expected


# --------------------------------------------------------------------------------------------------
# [Truncation: bootstrap the value of a time limit's final observation] (--bootstrap-truncated)
# --------------------------------------------------------------------------------------------------

BOOTSTRAPPING = ["ppo", "ppo_atari", "ppo_atari_lstm", "ppo_atari_envpool", "ppo_continuous_action",
                 "ppo_atari_multigpu", "ppo_multidiscrete"]


class ValueOfTheSum(torch.nn.Module):
    """A stand-in agent whose value of an observation is the sum of its numbers: any other
    observation than the final one gives another value."""

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float().flatten(1).sum(1, keepdim=True)


def a_cut_off_rollout(obs_shape: tuple[int, ...]):
    """Three steps of two environments. Environment 0's episode is cut off by its time limit after
    step 1: the step returns the first observation of the next episode (all zeros) and, in info, the
    final one (all ones), not also terminated. Environment 1's episode terminates after step 0."""
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(3, 2)).astype(np.float32)
    values = rng.normal(size=(3, 2)).astype(np.float32)
    dones = np.zeros((3, 2), dtype=np.float32)
    dones[2, 0] = dones[1, 1] = 1.0
    step_results = []  # per step: (terminations, truncations, infos)
    for step in range(3):
        terminated, truncated = np.array([False, step == 0]), np.array([step == 1, False])
        final_obs = np.empty(2, dtype=object)
        if step == 1:
            final_obs[0] = np.ones(obs_shape, dtype=np.float32)
        if step == 0:
            final_obs[1] = np.full(obs_shape, 7.0, dtype=np.float32)
        step_results.append((terminated, truncated, {"final_obs": final_obs}))
    next_value, next_done = rng.normal(size=2).astype(np.float32), np.zeros(2, dtype=np.float32)
    return rewards, values, dones, next_value, next_done, step_results


@pytest.mark.parametrize("script", BOOTSTRAPPING)
def test_a_truncation_bootstraps_the_value_of_the_final_observation(script):
    """The targets of a rollout with a time-limit cut equal the reference's, which bootstraps the
    cut episode from V(final observation) inside GAE: adding gamma V(s_final) to the last reward, as
    the scripts do, gives the same target. The termination of the other environment still counts
    nothing after it, and the reset observation (zeros) is never what is valued."""
    module = load(script)
    gamma, lam = 0.9, 0.8
    device = torch.device("cpu")
    if script == "ppo_atari_lstm":
        obs_shape = (1, 84, 84)
        torch.manual_seed(0)
        agent = module.Agent(4)
        lstm_state = (torch.randn(1, 2, 128), torch.randn(1, 2, 128))
        with torch.no_grad():  # the memory of environment 0 after step 1, the episode going on
            final_value = agent.get_value(torch.ones((1,) + obs_shape),
                                          (lstm_state[0][:, :1], lstm_state[1][:, :1]),
                                          torch.zeros(1)).item()
        value_of_cut = lambda infos, cut: module.truncated_value(agent, infos, cut,  # noqa: E731
                                                                 lstm_state, device)
    elif script == "ppo_continuous_action":
        obs_shape = (3,)
        agent = module.Agent(3, 1)
        agent.obs_rms.mean, agent.obs_rms.var = (np.array([0.5, -1.0, 2.0]),
                                                 np.array([4.0, 0.25, 1.0]))
        with torch.no_grad():  # the final observation as the agent sees it: normalized
            final_value = agent.get_value(
                torch.as_tensor(agent.normalize_obs(np.ones((1, 3)), update=False))).item()
        value_of_cut = lambda infos, cut: module.truncated_value(  # noqa: E731
            agent, infos, cut, device)
    else:
        obs_shape = (4, 84, 84) if script != "ppo" else (4,)
        final_value = float(np.prod(obs_shape))  # ValueOfTheSum of the final observation, all ones
        value_of_cut = lambda infos, cut: module.truncated_value(ValueOfTheSum(),  # noqa: E731
                                                                 infos, cut, device)
    rewards, values, dones, next_value, next_done, step_results = a_cut_off_rollout(obs_shape)

    bootstrapped = rewards.copy()
    for step, (terminated, truncated, infos) in enumerate(step_results):
        bootstrapped[step] += gamma * value_of_cut(infos, truncated & ~terminated)
    advantages, returns = module.compute_gae(bootstrapped, values, dones, next_value,
                                             next_done, gamma, lam)

    final_values = np.full((3, 2), np.nan)
    final_values[1, 0] = final_value
    expected_advantages, expected_returns = reference_gae(rewards, values, dones, next_value,
                                                          next_done, gamma, lam, final_values)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-5, atol=1e-5)
    assert returns[1, 0] == pytest.approx(rewards[1, 0] + gamma * final_value, rel=1e-5)


@pytest.mark.parametrize("script", BOOTSTRAPPING)
def test_bootstrapping_is_off_by_default_and_a_resumed_run_keeps_it(script, tmp_path):
    """Off by default, as in the published runs; a checkpoint's setting comes back on --resume, and
    changing it there is refused (it changes what is learned)."""
    module = load(script)
    assert module.Args().bootstrap_truncated is False
    path = write_checkpoint(tmp_path / "checkpoint.pt", module,
                            module.Args(bootstrap_truncated=True))
    args, _ = parse_args(module, ["--resume", path])
    assert args.bootstrap_truncated is True
    with pytest.raises(exits.WrongInput):
        parse_args(module, ["--resume", path, "--no-bootstrap-truncated"])
