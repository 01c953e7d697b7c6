"""PPO for continuous actions on vector observations: Hopper-v4, Walker2d-v4, HalfCheetah-v4.

    python ppo/ppo_continuous_action.py --env-id Hopper-v4                   # train
    python ppo/ppo_continuous_action.py --save-model                         # ... keep a checkpoint
    python ppo/ppo_continuous_action.py --resume runs/<run>/checkpoint.pt    # go on after a stop
    python ppo/ppo_continuous_action.py --evaluate runs/<run>/checkpoint.pt  # score a saved agent

The file reads top to bottom: the settings, the environments, the agent, GAE and the clipped loss,
then the training loop in `main()`. The 13 core implementation details of PPO are marked where they
happen, `[Core 5: Generalized Advantage Estimation]` for one: 1 in make_envs, 2 and 13 in the agent,
5 in compute_gae, 7 to 10 and 12 in ppo_loss, 3, 4, 6 and 11 in main; docs/ppo.md explains each.
So are the 9 details for continuous actions: 1 to 4 in the agent, 5 and 9 in the rollout, 6 and 7
in normalize_obs, 8 in RewardScaler; docs/ppo_continuous_action.md explains them.
The run around it (its flags, checkpoints, logs and stop signals) comes from the package ppo_utils.
"""

from dataclasses import dataclass
from typing import Annotated, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from gymnasium.wrappers.utils import RunningMeanStd
from torch.distributions.normal import Normal

from ppo_utils import adam, command_line, environments, numpy_policy, spaces, speed, training
from ppo_utils.checkpoint import restore_statistics, statistics_state
from ppo_utils.evaluation import Evaluation

# names the script in its messages and checkpoints
VARIANT = "ppo_continuous_action"


@command_line.with_run_flags(VARIANT)  # then --seed, --cuda, --track, --save-model, --resume, ...
@dataclass
class Args:
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (the reference's default)"""
    total_timesteps: int = 1000000
    """total environment steps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per rollout"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to zero"""
    gamma: float = 0.99
    """the discount factor gamma (also the discount of the return that scales rewards)"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 32
    """the number of minibatches each batch is split into"""
    update_epochs: int = 10
    """the number of passes over the batch per update"""
    norm_adv: bool = True
    """if toggled, normalize advantages within each minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    anneal_clip: bool = False
    """if toggled, anneal the clip coefficient linearly to zero, as the PPO paper does for Atari"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as the original PPO code does"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for global gradient clipping"""
    target_kl: float | None = None
    """if set, stop the update epochs early once the approximate KL exceeds it"""
    obs_clip: command_line.EvaluationKeeps[Annotated[float, command_line.ABOVE_ZERO]] = 10.0
    """normalized observations are clipped to [-obs_clip, obs_clip]"""
    reward_clip: Annotated[float, command_line.ABOVE_ZERO] = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""
    bootstrap_truncated: bool = False
    """if toggled, a time limit is no death: its last reward gets + gamma x V(final observation)"""
    numpy_policy: command_line.ResumeMayChange[bool] = False
    """if toggled, the rollout's policy step runs in NumPy: faster on a CPU, other random numbers"""


def make_env(env_id: str, idx: int, capture_video: bool, video_folder: str,
             video_episodes: int | None = None):
    """Return a function that builds one environment; video is recorded from the first one only.
    RecordEpisodeStatistics reports each episode's return and length as it ends: the task's own."""

    def thunk():
        if capture_video and idx == 0:
            env = environments.record_video(gym.make(env_id, render_mode="rgb_array"),
                                            video_folder, video_episodes)
        else:
            env = gym.make(env_id)
        # one vector in and one out, as the network reads and writes them (Box actions reshaped)
        env = spaces.as_vectors(env)
        return gym.wrappers.RecordEpisodeStatistics(env)

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              saved_envs: list | None = None,
              video_episodes: int | None = None) -> gym.vector.SyncVectorEnv:
    """[Core 1: Vectorized architecture] One learner steps `num_envs` copies of the environment in
    lock step, so each rollout holds num_envs x num_steps transitions. Resumed: the very ones a
    checkpoint saved (`saved_envs`). Spaces this script cannot train on are refused. Autoreset is
    SAME_STEP: every step() is a real transition (docs/ppo.md, Episode ends)."""
    spaces.check_gymnasium_id(env_id, filmed=capture_video)
    envs = environments.vector_env([make_env(env_id, i, capture_video, video_folder, video_episodes)
                                    for i in range(num_envs)], env_id, saved_envs)
    spaces.check_spaces(envs, env_id, actions=(gym.spaces.Box,))
    return envs


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """[Core 2: Orthogonal initialization of weights, constant initialization of biases] Gain
    sqrt(2) for the hidden layers, 0.01 for the policy head (near-uniform first choices, means near
    0), 1 for the value head; biases 0."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """[Core 13: Separate MLP networks for policy and value functions] Two 64-64 tanh MLPs: on
    simple tasks a shared trunk makes the policy and value objectives compete. [Continuous 4:
    Separate MLP networks for policy and value functions] The actor gives the Gaussian's means;
    the agent owns its observation statistics (`normalize_obs`)."""

    def __init__(self, obs_size: int, action_size: int, obs_clip: float = 10.0):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, action_size), std=0.01),
        )
        # [Continuous 2: State-independent log standard deviation] one per action dimension, 0 first
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_size))
        self.obs_rms = RunningMeanStd(shape=(obs_size,))
        self.obs_clip = obs_clip

    # state_dict() keeps what get_extra_state returns beside the weights: the observation statistics
    # travel with them into every checkpoint, and a loaded agent sees as it did in training.
    def get_extra_state(self) -> dict:
        return statistics_state(self.obs_rms)

    def set_extra_state(self, state: dict) -> None:
        restore_statistics(self.obs_rms, state)

    def normalize_obs(self, obs: np.ndarray, update: bool) -> np.ndarray:
        """[Continuous 6: Normalization of observations] Shifted and scaled by the running mean and
        std of those seen so far, each counted once in training (`update`), not in an evaluation.
        [Continuous 7: Observation clipping] Then clipped to [-obs_clip, obs_clip]."""
        if update:
            self.obs_rms.update(obs)
        normalized = (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8)
        return np.clip(normalized, -self.obs_clip, self.obs_clip).astype(np.float32)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs)

    @speed.compiled  # with --compile the rollout's step is compiled too; else it runs as written
    def get_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The rollout's policy step: actions only, their log-probabilities and values computed
        after the rollout in one batched pass; the draw of Normal(mean, std).sample()."""
        mean = self.actor_mean(obs)
        return torch.normal(mean, self.actor_logstd.exp().expand_as(mean))

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Sample an action (or score a given one): returns action, log-prob, entropy and value.
        [Continuous 1: Continuous actions via normal distributions] means and a learned std"""
        mean = self.actor_mean(obs)
        std = self.actor_logstd.exp().expand_as(mean)
        # The network's outputs need no argument validation, which would only cost time.
        distribution = Normal(mean, std, validate_args=False)
        if action is None:
            action = distribution.sample()
        # [Continuous 3: Independent action components] log-probabilities and entropies sum up
        return (action, distribution.log_prob(action).sum(1), distribution.entropy().sum(1),
                self.critic(obs))


class RewardScaler:
    """[Continuous 8: Reward scaling] Rewards divided by the running std of the discounted return
    (no mean subtracted): value targets in a range the network learns well, whatever the task's
    scale. As gymnasium's NormalizeReward, a termination cuts the return, a truncation does not; one
    set of statistics serves all environments (docs/notes/design.md, against VecNormalize)."""

    def __init__(self, num_envs: int, gamma: float):
        self.gamma = gamma
        self.return_rms = RunningMeanStd(shape=())
        self.discounted_return = np.zeros(num_envs)

    def scale(self, reward: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        self.discounted_return = self.discounted_return * self.gamma * (1.0 - terminated) + reward
        self.return_rms.update(self.discounted_return)
        return reward / np.sqrt(self.return_rms.var + 1e-8)


def compute_gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_value: np.ndarray,
                next_done: np.ndarray, gamma: float,
                gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """[Core 5: Generalized Advantage Estimation] Advantages and value targets of one rollout. The
    arrays are (num_steps, num_envs), next_value and next_done (num_envs,): the observation after
    the last step. dones[t] = 1 where obs[t] begins an episode, so nothing flows back across t."""
    num_steps = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    last_advantage = np.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_nonterminal, next_values = 1.0 - next_done, next_value
        else:
            next_nonterminal, next_values = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * next_values * next_nonterminal - values[t]
        last_advantage = delta + gamma * gae_lambda * next_nonterminal * last_advantage
        advantages[t] = last_advantage
    returns = advantages + values
    return advantages, returns


def ppo_loss(new_logprob: torch.Tensor, entropy: torch.Tensor, new_value: torch.Tensor,
             old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
             returns: torch.Tensor, clip_coef: float, args: Args) -> tuple[torch.Tensor, dict]:
    """The PPO objective on one minibatch: the loss to minimize, and detached statistics."""
    # How much more (or less) likely each action is under the policy being updated than under the
    # one that played it in the rollout: ratio = pi_new(a|s) / pi_old(a|s), from log-probabilities.
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()

    if args.norm_adv:
        # [Core 7: Normalization of advantages] per minibatch, not per batch.
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # [Core 8: Clipped surrogate objective] pessimistic bound: the larger of the two losses.
    pg_loss_unclipped = -advantages * ratio
    pg_loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss_unclipped, pg_loss_clipped).mean()

    if args.clip_vloss:
        # [Core 9: Value function loss clipping] the new value may move at most clip_coef away from
        # the value recorded during the rollout before the clipped term takes over.
        v_loss_unclipped = (new_value - returns) ** 2
        v_clipped = old_value + torch.clamp(new_value - old_value, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()

    # [Core 10: Overall loss and entropy bonus] one loss for the policy and the value function; the
    # entropy coefficient is 0 by default here: the learned std alone sets how much it explores.
    entropy_mean = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_mean + args.vf_coef * v_loss

    with torch.no_grad():
        # [Core 12: Debug variables] two estimators of KL(old || new) and how often clipping bites.
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    stats = {"policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(),
             "entropy": entropy_mean.detach(), "old_approx_kl": old_approx_kl,
             "approx_kl": approx_kl, "clipfrac": clipfrac}
    return loss, stats


@speed.compiled  # [Speed: torch.compile] with --compile, fused into a few kernels
def minibatch_loss(agent: Agent, obs: torch.Tensor, actions: torch.Tensor,
                   old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, clip_coef: float,
                   args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The network on one minibatch, then the PPO loss: the unit --compile compiles."""
    _, new_logprob, entropy, new_value = agent.get_action_and_value(obs, actions)
    return ppo_loss(new_logprob, entropy, new_value.flatten(), old_logprob, old_value, advantages,
                    returns, clip_coef, args)


def truncated_value(agent: Agent, infos: dict, truncated: np.ndarray,
                    device: torch.device) -> np.ndarray:
    """[Truncation: bootstrap the value of a time limit's final observation] (--bootstrap-truncated)
    V(final observation) where the time limit cut an episode off, 0 elsewhere (info["final_obs"],
    SAME_STEP); the caller adds gamma x it to the step's reward: the target r + gamma V(s_final).
    The observation is valued as the agent would have seen it: normalized, not counted."""
    values = np.zeros(len(truncated), dtype=np.float32)
    if truncated.any():
        final_obs = agent.normalize_obs(np.stack(infos["final_obs"][truncated]), update=False)
        with torch.inference_mode():
            final_value = agent.get_value(torch.as_tensor(final_obs, dtype=torch.float32,
                                                          device=device))
        values[truncated] = final_value.flatten().cpu().numpy()
    return values


def main(args: Args, checkpoint=None) -> dict:
    """Train as `args` says (resumed: from `checkpoint`); returns a summary for callers (tests)."""
    # The run: its flags checked, its device and name (training.Run).
    run = training.Run(args, checkpoint, env_package="mujoco")
    device = run.device
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # Python's, NumPy's and PyTorch's random generators start from --seed (the environments' below).
    training.seed_everything(args.seed, args.torch_deterministic)
    # Networks this small run fastest on one thread: more threads cost more than they save.
    torch.set_num_threads(1)

    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     saved_envs=run.saved_envs)
    obs_shape = envs.single_observation_space.shape
    action_shape = envs.single_action_space.shape
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    agent = Agent(obs_shape[0], action_shape[0], args.obs_clip).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8: Adam divides each step by sqrt(v) + eps, so the larger eps damps the steps of weights
    # whose tiny gradients it would scale up to full size. fused=True: one kernel for all weights.
    # adam.Adam: torch.optim.Adam's update, bit for bit, 1.1 s faster to start (docs/ppo.md).
    optimizer = adam.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    # Rollout storage, (num_steps, num_envs, ...), in NumPy: the batch moves to the device at once.
    # It holds what the agent saw and did: normalized observations, sampled actions, scaled rewards.
    obs = np.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=np.float32)
    actions = np.zeros((args.num_steps, args.num_envs) + action_shape, dtype=np.float32)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)

    # The run starts: resumed, it takes back its weights, optimizer, random generators and where
    # its rollout stood; otherwise its environments begin new episodes, on seeds no sitting played.
    Rollout = NamedTuple("Rollout", [("next_obs", np.ndarray), ("next_done", np.ndarray),
                                     ("discounted_return", np.ndarray)])
    global_step, rollout = run.start(agent, optimizer, num_iterations, Rollout, envs,
                                     statistics={"reward_scaler": reward_scaler.return_rms},
                                     batch_size=batch_size, minibatch_size=minibatch_size)
    next_obs, next_done, reward_scaler.discounted_return = rollout or (
        agent.normalize_obs(envs.reset(seed=args.seed + global_step)[0], update=True),
        np.zeros(args.num_envs, dtype=bool), np.zeros(args.num_envs))

    for iteration in run.iterations():  # resumed: from the checkpoint's; a stop signal ends them
        # [Core 4: Adam learning rate annealing] linearly, 0 just after the last iteration
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every environment with the current policy.
        # [Speed: the policy step in NumPy] --numpy-policy: a NumPy copy of it, taken now, acts.
        numpy_get_action = (numpy_policy.gaussian_draw(agent.actor_mean, agent.actor_logstd)
                            if args.numpy_policy else None)
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            if args.numpy_policy:
                actions[step] = numpy_get_action(next_obs)
            else:
                with torch.inference_mode():
                    action = agent.get_action(torch.as_tensor(next_obs, dtype=torch.float32,
                                                              device=device))
                # [Speed: one host transfer per step] the sampled action is all the rollout brings
                # back from the device; log-probabilities and values wait for the batched pass.
                actions[step] = action.cpu().numpy()

            # [Continuous 5: Handling of action clipping to valid range and storage] the environment
            # gets the sample clipped to its bounds; the rollout keeps it whole, for its log-prob.
            raw_obs, reward, terminations, truncations, infos = envs.step(
                np.clip(actions[step], action_low, action_high))
            # A time limit ends the episode like a termination, as in the original PPO...
            next_done = np.logical_or(terminations, truncations)
            next_obs = agent.normalize_obs(raw_obs, update=True)
            # [Continuous 9: Reward clipping] the scaled reward is kept within +-reward_clip
            rewards[step] = np.clip(reward_scaler.scale(reward, terminations), -args.reward_clip,
                                    args.reward_clip)
            if args.bootstrap_truncated:  # ...unless the run values what the time limit cut off
                cut_off = truncations & ~terminations
                rewards[step] += args.gamma * truncated_value(agent, infos, cut_off, device)
            # the episodes that ended, logged with their scores; and the progress line now and then
            run.record_step(global_step, environments.finished_episodes(infos))

        # The rollout as one batch of num_envs x num_steps (b_: the batch's, mb_: a minibatch's).
        b_obs = torch.as_tensor(obs.reshape((-1,) + obs_shape), device=device)
        b_actions = torch.as_tensor(actions.reshape((-1,) + action_shape), device=device)

        # The policy did not change during the rollout: its log-probabilities and values come from
        # one batched pass, not a second network call a step for the separate critic.
        with torch.no_grad():
            _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_actions)
            b_values = b_values.flatten()
            next_value = agent.get_value(torch.as_tensor(next_obs, dtype=torch.float32,
                                                         device=device))
        # GAE runs on the host, in NumPy: one transfer of the rollout's values per iteration.
        host_values = b_values.cpu().numpy().reshape(args.num_steps, args.num_envs)
        advantages, returns = compute_gae(rewards, host_values, dones,
                                          next_value.cpu().numpy().flatten(), next_done,
                                          args.gamma, args.gae_lambda)
        b_advantages = torch.as_tensor(advantages.reshape(-1), device=device)
        b_returns = torch.as_tensor(returns.reshape(-1), device=device)

        # [Core 6: Mini-batch updates] several epochs over shuffled minibatches of the batch.
        b_inds = np.arange(batch_size)
        minibatch_stats = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            epoch_inds = torch.from_numpy(b_inds).to(device)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = epoch_inds[start:start + minibatch_size]
                loss, stats = minibatch_loss(agent, b_obs[mb_inds], b_actions[mb_inds],
                                             b_logprobs[mb_inds], b_values[mb_inds],
                                             b_advantages[mb_inds], b_returns[mb_inds], clip_coef,
                                             args)
                optimizer.zero_grad()
                loss.backward()
                # [Core 11: Global gradient clipping] all gradients scaled down alike when their
                # norm exceeds max_grad_norm: one extreme minibatch cannot throw the weights far.
                grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm,
                                                     foreach=True)
                optimizer.step()
                # [Speed: CUDA graphs] copies: --cudagraphs' next replay writes where these are
                minibatch_stats.append({**{key: value.clone() for key, value in stats.items()},
                                        "grad_norm": grad_norm})
            if args.target_kl is not None and minibatch_stats[-1]["approx_kl"] > args.target_kl:
                break

        # [Core 12: Debug variables] averaged over this update's minibatches. The run logs them with
        # the values' explained variance (a NaN stops it) and saves a checkpoint when one is due.
        means = {key: torch.stack([s[key] for s in minibatch_stats]).mean().item()
                 for key in minibatch_stats[0]}
        run.end_iteration(iteration, global_step, means, host_values.reshape(-1),
                          returns.reshape(-1), Rollout(next_obs, next_done,
                                                       reward_scaler.discounted_return))

    envs.close()
    return run.finish(global_step, agent=agent, reward_scaler=reward_scaler)


def evaluate(args: Args, checkpoint) -> list[float]:
    """--evaluate: play episodes with the saved agent, its observation statistics as saved."""
    evaluation = Evaluation(args, checkpoint)  # the device and seeds
    envs = make_envs(args.env_id, 1, evaluation.renders, evaluation.video_folder,
                     video_episodes=args.eval_episodes)
    agent = evaluation.load(Agent(envs.single_observation_space.shape[0],
                                  envs.single_action_space.shape[0], args.obs_clip))
    bounds = envs.single_action_space.low, envs.single_action_space.high
    return evaluation.play(envs, lambda obs, _: np.clip(agent.get_action(torch.as_tensor(
        agent.normalize_obs(obs, update=False), device=evaluation.device)).cpu().numpy(), *bounds))


if __name__ == "__main__":
    command_line.run_script(main, evaluate, Args, __doc__, pip_extra="mujoco")
