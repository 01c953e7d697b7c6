"""PPO for continuous actions on vector observations: MuJoCo's Hopper-v4, Walker2d-v4,
HalfCheetah-v4.

    python ppo/ppo_continuous_action.py --env-id Hopper-v4                   # train
    python ppo/ppo_continuous_action.py --save-model                         # ... keep a checkpoint
    python ppo/ppo_continuous_action.py --resume runs/<run>/checkpoint.pt    # go on after a stop
    python ppo/ppo_continuous_action.py --evaluate runs/<run>/checkpoint.pt  # score a saved agent

MuJoCo comes with the extra: pip install -e ".[mujoco]". The file follows ppo/ppo.py: settings,
environments, the agent (with its observation statistics), GAE, the clipped loss, then the training
loop in `main()`. The 13 core details are marked `[Core N: ...]` and the 9 details for continuous
actions `[Continuous N: ...]` where they happen; docs/ppo_continuous_action.md lists them all. What
a run needs beyond PPO comes from four modules beside this file, one concern each: command_line
(flags, --resume and --evaluate), checkpoints, run_life (logs, progress, stop signals, speed
options, evaluation) and exits (exit codes): copy them along with it.
"""

import os
import sys
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.normal import Normal

# The run machinery, beside this file: what a run needs that is not PPO.
import checkpoints
import command_line
import exits
import run_life

# written into checkpoints, so another variant's checkpoint is refused
VARIANT = "ppo_continuous_action"


@dataclass
class Args:
    # The algorithm
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
    obs_clip: float = 10.0
    """normalized observations are clipped to [-obs_clip, obs_clip]"""
    reward_clip: float = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""
    bootstrap_truncated: bool = False
    """if toggled, a time limit is no death: its last reward gets + gamma x V(final observation)"""

    # The run: its name, seed and device, logs, checkpoints and evaluation
    exp_name: str = VARIANT
    """the name of this experiment, part of the run name"""
    seed: int = 1
    """seed of the experiment (Python, NumPy, PyTorch and the environments)"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic`"""
    cuda: bool = True
    """if toggled, use CUDA when it is available"""
    track: bool = False
    """if toggled, log the run to Weights & Biases (WANDB_MODE=offline works without a network)"""
    wandb_project_name: str = "ppo-scripts"
    """the Weights & Biases project"""
    wandb_entity: str | None = None
    """the Weights & Biases entity (team); None uses your default"""
    capture_video: bool = False
    """if toggled, record videos of the first environment to `videos/<run_name>/`"""
    save_model: bool = False
    """if toggled, save runs/<run_name>/checkpoint.pt at the end and when a signal stops the run"""
    save_interval: int = 100
    """with --save-model, also save every this many iterations (0: only at the end)"""
    save_minutes: float = 0.0
    """with --save-model, also save after this many minutes (0: never): what a crash can lose"""
    resume: str | None = None
    """path of a checkpoint to continue training from; the run keeps the checkpoint's settings"""
    trust_old_checkpoint: bool = False
    """if toggled, --resume reads old-format checkpoints, which can run code: only your own files"""
    evaluate: str | None = None
    """path of a checkpoint to evaluate instead of training"""
    eval_episodes: int = 10
    """number of episodes to play with --evaluate"""

    # Speed: how fast the run goes, never what it learns
    compile: bool = False
    """if toggled, torch.compile the policy step and minibatch loss (pays on a GPU, slow start)"""
    cudagraphs: bool = False
    """if toggled, compile as --compile does and replay both as CUDA graphs (needs CUDA)"""


# --------------------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------------------


def make_env(env_id: str, idx: int, capture_video: bool, video_folder: str,
             video_episodes: int | None = None):
    """Return a function that builds one environment; video is recorded from the first one only.

    The environments stay raw: observation normalization lives in the agent and reward scaling in
    the training loop, so what the environment reports (and `charts/episodic_return`) is the task's
    own."""

    def thunk():
        if capture_video and idx == 0:
            if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
                # Without a display MuJoCo renders through EGL; it reads this when it is first
                # imported.
                os.environ.setdefault("MUJOCO_GL", "egl")
            return run_life.record_video(gym.make(env_id, render_mode="rgb_array"), video_folder,
                                         video_episodes)
        return gym.make(env_id)

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              saved_envs: list | None = None,
              video_episodes: int | None = None) -> gym.vector.SyncVectorEnv:
    """Build the vector of environments (from `saved_envs`, the very ones a checkpoint saved),
    checking that this script can train on them.

    [Core 1: Vectorized architecture] One learner steps `num_envs` copies of the environment in lock
    step, so each rollout holds num_envs x num_steps transitions.

    Autoreset: as in ppo.py, SAME_STEP mode resets a finished sub-environment within the step that
    ends its episode, so every step() is a real transition and the observation it returns for a
    finished environment is already the first of the next episode.
    """
    command_line.check_gymnasium_id(env_id, VARIANT)
    env_fns = [make_env(env_id, i, capture_video, video_folder, video_episodes)
               for i in range(num_envs)]
    # the environments built anew, then put back where the checkpoint saved them
    if saved_envs is not None:
        env_fns = checkpoints.restored_envs(env_fns, saved_envs)
    try:
        with command_line.packages_checked(env_id, VARIANT):
            envs = gym.vector.SyncVectorEnv(env_fns,
                                            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.DependencyNotInstalled as error:
        if "mujoco" in str(error).lower():
            exits.fail(VARIANT, f"{env_id} needs MuJoCo, which is not installed: pip install -e "
                                "\".[mujoco]\"")
        raise  # another missing package (video writing, rendering): reported by exits.run_and_exit
    check_spaces(env_id, envs)
    return envs


# --------------------------------------------------------------------------------------------------
# Agent
# --------------------------------------------------------------------------------------------------


class RunningMeanStd:
    """Running mean and variance of a stream of batches, merged batch by batch (Chan et al.'s
    parallel algorithm) in float64. Starts at mean 0, variance 1, with a tiny pseudo-count."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        batch_mean, batch_var, batch_count = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count
                    + np.square(delta) * self.count * batch_count / total) / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"].copy(), state["var"].copy(), state["count"]


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """[Core 2: Orthogonal initialization of weights, constant initialization of biases] Orthogonal
    weights with gain sqrt(2) for the hidden layers, openai/baselines' choice, kept for fidelity
    (sqrt(2) is the gain that suits ReLU; tanh's would be 5/3); the policy head uses 0.01 so the
    first policy's means are close to 0, the value head uses 1."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """[Core 13: Separate MLP networks for policy and value functions]
    [Continuous 4: Separate MLP networks for policy and value functions] Two 64-64 tanh MLPs: one
    for the value, one for the means of the action distribution; openai/baselines' PPO for MuJoCo
    shares nothing between them either.

    The agent also owns the running statistics of the observations it has seen (see
    `normalize_obs`): a policy trained on normalized observations only means something together with
    them."""

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
        # [Continuous 2: State-independent log standard deviation] one learned log std per action
        # dimension, the same whatever the observation; 0 at first, so the first policy has std 1.
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_size))
        self.obs_rms = RunningMeanStd((obs_size,))
        self.obs_clip = obs_clip

    # PyTorch keeps what get_extra_state returns in state_dict() beside the weights, and hands it
    # back to set_extra_state in load_state_dict(): the observation statistics travel with the
    # weights into every checkpoint, and a loaded agent sees observations exactly as it did in
    # training.
    def get_extra_state(self) -> dict:
        return self.obs_rms.state_dict()

    def set_extra_state(self, state: dict) -> None:
        self.obs_rms.load_state_dict(state)

    def normalize_obs(self, obs: np.ndarray, update: bool) -> np.ndarray:
        """[Continuous 6: Normalization of observations] Each observation dimension is shifted and
        scaled by the running mean and standard deviation of everything seen so far. Training passes
        update=True, so each observation the agent acts on enters the statistics once, as it
        arrives, before it is normalized (an episode's last observation, which with SAME_STEP
        autoreset arrives only in info["final_obs"], is never acted on and never counted);
        evaluation passes update=False and uses the statistics as saved.

        [Continuous 7: Observation clipping] The result is clipped to [-obs_clip, obs_clip].

        This runs in NumPy, on the environments' side of the device boundary: a dozen operations on
        a vector of 11 to 376 numbers cost a few microseconds there and several times more in
        PyTorch."""
        if update:
            self.obs_rms.update(obs)
        normalized = (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8)
        return np.clip(normalized, -self.obs_clip, self.obs_clip).astype(np.float32)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs)

    def get_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The rollout's policy step: sample actions, and nothing else. The rollout needs only the
        actions at each step; their log-probabilities and values come after it, in one batched pass
        (main). The draw is the one Normal(mean, std).sample() makes, without building the
        distribution object."""
        mean = self.actor_mean(obs)
        return torch.normal(mean, self.actor_logstd.exp().expand_as(mean))

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Sample an action (or score a given one): returns action, log-prob, entropy and value.

        [Continuous 1: Continuous actions via normal distributions] The policy is a Gaussian whose
        mean comes from the actor network and whose std is exp(actor_logstd)."""
        mean = self.actor_mean(obs)
        std = self.actor_logstd.exp().expand_as(mean)
        # Both come straight from the network, so argument validation would only cost time.
        distribution = Normal(mean, std, validate_args=False)
        if action is None:
            action = distribution.sample()
        # [Continuous 3: Independent action components] the action dimensions are independent
        # Gaussians, so the log-probability of an action is the sum of theirs, and so is the
        # entropy.
        return (action, distribution.log_prob(action).sum(1), distribution.entropy().sum(1),
                self.critic(obs))


class RewardScaler:
    """[Continuous 8: Reward scaling] Rewards are divided by the running standard deviation of the
    discounted return (not of the rewards themselves, and without subtracting a mean), which keeps
    the value targets in a range the value network learns well whatever the task's reward scale.

    Per environment it keeps a return discounted by gamma; every step discounts it, adds the new
    reward, updates the statistics with the returns, then scales the rewards by their std. The rule
    for episode ends is that of the reference implementation, which wraps each environment in
    gymnasium's NormalizeReward: a termination cuts the return at the terminal step, whose return is
    its own reward alone; a time-limit truncation cuts nothing, the return runs on into the next
    episode. The 37-details post's detail 8 points to openai/baselines' VecNormalize instead, which
    restarts the return after every episode end, truncations included; the two rules differ only in
    the standard deviation they estimate. One set of statistics serves all environments, as the one
    value network learns from all of them (docs/ppo_continuous_action.md discusses both choices)."""

    def __init__(self, num_envs: int, gamma: float):
        self.gamma = gamma
        self.return_rms = RunningMeanStd(())
        self.discounted_return = np.zeros(num_envs)

    def scale(self, reward: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        self.discounted_return = self.discounted_return * self.gamma * (1.0 - terminated) + reward
        self.return_rms.update(self.discounted_return)
        return reward / np.sqrt(self.return_rms.var + 1e-8)

    def state_dict(self) -> dict:
        return {"return_rms": self.return_rms.state_dict(),
                "discounted_return": self.discounted_return.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.return_rms.load_state_dict(state["return_rms"])
        self.discounted_return = state["discounted_return"].copy()


# --------------------------------------------------------------------------------------------------
# Generalized advantage estimation and the PPO loss
# --------------------------------------------------------------------------------------------------


def compute_gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_value: np.ndarray,
                next_done: np.ndarray, gamma: float,
                gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """[Core 5: Generalized Advantage Estimation] Advantages and value targets of one rollout.

    All arrays are (num_steps, num_envs) except next_value and next_done, (num_envs,), which
    describe the observation after the last step. dones[t] is 1 when obs[t] is the first observation
    of a new episode, that is, when the step before it ended an episode: then nothing flows back
    across t."""
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
             returns: torch.Tensor, clip_coef: float,
             args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO objective on one minibatch, with the clipping coefficient of this update; returns the
    loss to minimize and detached statistics."""
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

    # [Core 10: Overall loss and entropy bonus] one loss for both networks; the entropy coefficient
    # is 0 by default here: the learned std alone sets how much the policy explores.
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
    V(final observation) for each environment whose episode the time limit cut off, 0 elsewhere.

    A time limit is not a state of the task: the episode would have gone on, and its return with it.
    With SAME_STEP autoreset the observation the step returned is already the next episode's; the
    one the episode ended on is in info["final_obs"]. It is valued as the agent would have seen it:
    normalized with the statistics as they stand (and not counted in them, as no final observation
    is). The caller adds gamma x this value to the step's reward, so that the step's target is r +
    gamma V(s_final), where GAE, which stops at every episode end, would otherwise take r alone;
    docs/notes/truncation.md shows that this is the target a GAE bootstrapped at s_final gives."""
    values = np.zeros(len(truncated), dtype=np.float32)
    if truncated.any():
        final_obs = np.stack(infos["final_obs"][truncated])
        with torch.inference_mode():
            final_value = agent.get_value(torch.as_tensor(agent.normalize_obs(final_obs,
                                                                              update=False),
                                                                              device=device))
        values[truncated] = final_value.flatten().cpu().numpy()
    return values


def explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """[Core 12: Debug variables] 1 - Var[target - predicted] / Var[target]: 1 is a perfect value
    function, 0 no better than a constant, negative worse than one; nan when the targets do not
    vary."""
    target_variance = np.var(target)
    if target_variance == 0:
        return np.nan
    return float(1 - np.var(target - predicted) / target_variance)


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def episodes_at_start(envs: gym.vector.VectorEnv, checkpoint: dict | None, seed: int,
                      agent: Agent, reward_scaler: RewardScaler):
    """Where the environments' episodes stand as training starts: the next (normalized)
    observation, whether it begins an episode, and each episode's running (raw) return and length.
    A resumed run goes on with the episodes it left (`checkpoint`, whose environments were rebuilt
    as they were). A new run, or one that starts new episodes (None), resets the environments on
    `seed`: their first observations join the observation statistics, and the reward scaler's
    discounted returns start again from 0."""
    if checkpoint is not None:
        return (checkpoint["next_obs"], checkpoint["next_done"], checkpoint["episode_return"],
                checkpoint["episode_length"])
    next_obs = agent.normalize_obs(envs.reset(seed=seed)[0], update=True)
    reward_scaler.discounted_return[:] = 0.0
    return (next_obs, np.zeros(envs.num_envs, dtype=bool), np.zeros(envs.num_envs),
            np.zeros(envs.num_envs, dtype=np.int64))


def main(args: Args, checkpoint: dict | None = None) -> dict:
    """Train as `args` says, from `checkpoint` (read by parse_args) with --resume; returns a summary
    of the run for callers such as tests."""
    check_args(args)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # Networks this small run fastest on one thread: more threads cost more in handing work out than
    # they save.
    torch.set_num_threads(1)
    # The run: its name and folder, device and seeds, and the releases it records.
    run = run_life.Run(args, VARIANT, checkpoint, num_iterations, env_package="mujoco")
    device = run.device

    # A resumed run goes on with the saved environments, the very episodes it left; they cannot
    # record video, so with --capture-video it starts new ones instead (and no longer ends exactly
    # as an unbroken run would).
    saved_envs = checkpoint["envs"] if checkpoint and not args.capture_video else None
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     saved_envs=saved_envs)
    obs_shape = envs.single_observation_space.shape
    action_shape = envs.single_action_space.shape
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    agent = Agent(obs_shape[0], action_shape[0], args.obs_clip).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8. Adam divides each step by sqrt(v) + eps: the larger eps damps the steps of weights whose
    # gradients are tiny, which Adam would otherwise scale up to full size. fused=True: the same
    # Adam, in one kernel for all parameters instead of a dozen small ops each.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # policy_step (the rollout's call of the agent) and loss_on_minibatch (the update's): the two
    # functions as they are, or [Speed: torch.compile] compiled into a few fused kernels, so that a
    # GPU does not wait for Python to launch many small ones.
    policy_step, loss_on_minibatch = run_life.compiled(args, agent.get_action, minibatch_loss)
    writer = run.open_logs(batch_size=batch_size, minibatch_size=minibatch_size,
                           num_iterations=num_iterations)

    # Rollout storage, (num_steps, num_envs, ...), refilled every iteration. It is kept in NumPy,
    # beside the environments, and the whole batch moves to the training device once per iteration.
    # It holds what the agent saw and did: normalized observations, sampled actions, scaled rewards.
    obs = np.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=np.float32)
    actions = np.zeros((args.num_steps, args.num_envs) + action_shape, dtype=np.float32)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)

    # Where the run starts: its iteration and step (0 unless resumed), where each environment's
    # episode stands (new episodes begin on seeds that a resumed run has not played yet), and the
    # returns of the latest finished episodes. A resumed run restores the agent's weights with its
    # observation statistics, then the reward's.
    start_iteration, global_step = run.start(agent, optimizer, new_episodes=saved_envs is None)
    if checkpoint:
        reward_scaler.load_state_dict(checkpoint["reward_scaler"])
    next_obs, next_done, episode_return, episode_length = episodes_at_start(
        envs, checkpoint if saved_envs is not None else None, seed=args.seed + global_step,
        agent=agent, reward_scaler=reward_scaler)
    recent_returns = deque(checkpoint["recent_returns"] if checkpoint else [], maxlen=20)

    for iteration in range(start_iteration + 1, num_iterations + 1):
        # [Core 4: Adam learning rate annealing] linearly from learning_rate toward 0, which the end
        # of the run would reach: the last iteration uses learning_rate / num_iterations.
        # --anneal-clip lowers the clipping coefficient alike.
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every environment with the current policy.
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            with torch.inference_mode():
                action = policy_step(torch.as_tensor(next_obs, device=device))
            # [Speed: one host transfer per step] the sampled action is the only thing the rollout
            # brings back from the device; log-probabilities and values wait for the batched pass
            # below.
            actions[step] = action.cpu().numpy()

            # [Continuous 5: Handling of action clipping to valid range and storage] The Gaussian's
            # samples are unbounded; the environment gets them clipped to its bounds, but the
            # rollout keeps the sample itself, whose log-probability is what the loss compares
            # against.
            raw_obs, reward, terminations, truncations, infos = envs.step(
                np.clip(actions[step], action_low, action_high))
            # A time-limit truncation ends the episode like a termination, as in the original PPO...
            next_done = np.logical_or(terminations, truncations)
            next_obs = agent.normalize_obs(raw_obs, update=True)
            # [Continuous 9: Reward clipping] the scaled reward is clipped to [-reward_clip,
            # reward_clip].
            rewards[step] = np.clip(reward_scaler.scale(reward, terminations), -args.reward_clip,
                                    args.reward_clip)
            if args.bootstrap_truncated:  # ...unless the run values what the time limit cut off
                cut_off = truncations & ~terminations
                rewards[step] += args.gamma * truncated_value(agent, infos, cut_off, device)

            # the environment's own reward: charts/episodic_return is the task's score
            episode_return += reward
            episode_length += 1
            for i in np.flatnonzero(next_done):
                writer.add_scalar("charts/episodic_return", episode_return[i], global_step)
                writer.add_scalar("charts/episodic_length", episode_length[i], global_step)
                recent_returns.append(episode_return[i])
            episode_return[next_done] = 0.0
            episode_length[next_done] = 0
            # within a long rollout too, every few seconds
            run.print_progress(global_step, recent_returns)

        # Flatten the rollout into one batch of num_envs x num_steps transitions.
        # b_ names an array of the whole batch, mb_ one of a minibatch.
        b_obs = torch.as_tensor(obs.reshape((-1,) + obs_shape), device=device)
        b_actions = torch.as_tensor(actions.reshape((-1,) + action_shape), device=device)

        # The policy did not change during the rollout, so the log-probabilities and values it had
        # at each step can be computed now, in one batched pass instead of num_steps small ones (a
        # second network call per step for the separate critic, where the Atari scripts' one trunk
        # gives the value with the action).
        with torch.no_grad():
            _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_actions)
            b_values = b_values.flatten()
            next_value = agent.get_value(torch.as_tensor(next_obs, device=device))
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
                loss, stats = loss_on_minibatch(agent, b_obs[mb_inds], b_actions[mb_inds],
                                                b_logprobs[mb_inds],
                                                b_values[mb_inds], b_advantages[mb_inds],
                                                b_returns[mb_inds], clip_coef, args)
                optimizer.zero_grad()
                loss.backward()
                # [Core 11: Global gradient clipping] when the norm of all gradients together
                # exceeds max_grad_norm, all are scaled down alike: one minibatch of extreme
                # advantages or value errors cannot throw the weights far, and the gradient keeps
                # its direction.
                grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm,
                                                     foreach=True)
                optimizer.step()
                # [Speed: CUDA graphs] the statistics are copied: with --cudagraphs the next replay
                # of the loss writes its outputs where these are.
                minibatch_stats.append({**{key: value.clone() for key, value in stats.items()},
                                        "grad_norm": grad_norm})
            if args.target_kl is not None and minibatch_stats[-1]["approx_kl"] > args.target_kl:
                break

        # [Core 12: Debug variables] averaged over every minibatch of this update.
        means = {key: torch.stack([s[key] for s in minibatch_stats]).mean().item()
                 for key in minibatch_stats[0]}
        # a NaN or infinity ends the run here, in one line
        run.stop_if_diverged(global_step, means, agent)
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl",
                    "clipfrac"):
            writer.add_scalar(f"losses/{key}", means[key], global_step)
        writer.add_scalar("losses/explained_variance",
                          explained_variance(host_values.reshape(-1), returns.reshape(-1)),
                          global_step)
        writer.add_scalar("charts/SPS", run.steps_per_second(global_step), global_step)
        run.print_progress(global_step, recent_returns, iteration)

        if run.checkpoint_due(iteration):
            run.save_checkpoint(iteration, global_step, agent, optimizer,
                                envs=checkpoints.save_envs(envs),
                                reward_scaler=reward_scaler.state_dict(), next_obs=next_obs,
                                next_done=next_done, episode_return=episode_return.copy(),
                                episode_length=episode_length.copy(),
                                recent_returns=list(recent_returns))
        if run.stopping:  # Ctrl-C, kill or Slurm: this iteration was finished, logged and saved
            break

    envs.close()
    run.finish(global_step)
    return {"run_name": run.name, "global_step": global_step, "interrupted": run.stopping,
            "recent_returns": list(recent_returns), "agent": agent, "reward_scaler": reward_scaler}


def evaluate(args: Args, checkpoint: dict) -> list[float]:
    """--evaluate: play episodes with the saved agent and its saved observation statistics, its
    actions sampled and clipped as in training. Playing leaves the statistics as they were saved."""
    check_args(args)
    # the device and seeds; prints the returns
    evaluation = run_life.Evaluation(args, VARIANT, checkpoint)
    envs = make_envs(args.env_id, 1, args.capture_video, evaluation.video_folder,
                     video_episodes=args.eval_episodes)
    agent = evaluation.load(Agent(envs.single_observation_space.shape[0],
                                  envs.single_action_space.shape[0], args.obs_clip))
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs, _ = envs.reset(seed=evaluation.seed)
    episode_return = 0.0
    while evaluation.playing:
        with torch.inference_mode():
            action = agent.get_action(torch.as_tensor(agent.normalize_obs(obs, update=False),
                                                      device=evaluation.device))
        obs, reward, terminated, truncated, _ = envs.step(np.clip(action.cpu().numpy(), low, high))
        episode_return += float(reward[0])
        if terminated[0] or truncated[0]:
            evaluation.episode_ended(episode_return)
            episode_return = 0.0
    envs.close()
    return evaluation.report()


# --------------------------------------------------------------------------------------------------
# The command line: which settings a resumed run may change, and which settings and environments
# make no run at all
# --------------------------------------------------------------------------------------------------

# Settings that may differ between a run and its resumption; every other field must stay the same.
RUNTIME_FIELDS = {"cuda", "track", "wandb_project_name", "wandb_entity", "capture_video",
                  "save_model", "save_interval", "save_minutes", "resume", "evaluate",
                  "eval_episodes", "compile", "cudagraphs"}
# The training setting an evaluation also reads and may change: the seed of its games.
EVALUATION_FIELDS = {"seed"}


def parse_args(argv: list[str] | None = None) -> tuple[Args, dict | None]:
    """The settings of the command line, and the checkpoint that --resume or --evaluate names. An
    evaluation keeps the observation clip the network learned with."""
    return command_line.parse_args(Args, VARIANT, RUNTIME_FIELDS, EVALUATION_FIELDS, argv,
                              evaluation_keeps=("env_id", "obs_clip"), doc=__doc__)


def check_args(args: Args) -> None:
    """Refuse settings that cannot make a valid run, before any environment is built: first each
    flag on its own, then the sizes that must fit together."""
    # (flags, what each must be, which values are allowed)
    command_line.check_rules(args, VARIANT, [
        ("env_id", "a MuJoCo id such as HalfCheetah-v4", lambda value: value.strip() != ""),
        ("seed", "a whole number from 0 to 2**31 - 1", lambda value: 0 <= value < 2**31),
        ("save_interval", "0 (save only at the end) or more", lambda value: value >= 0),
        ("save_minutes", "0 (never save by the clock) or more", lambda value: 0 <= value < np.inf),
        ("eval_episodes total_timesteps num_envs num_steps num_minibatches update_epochs", "at "
                                                                                           "least "
                                                                                           "1",
         lambda value: value >= 1),
        ("learning_rate", "a finite number above 0", lambda value: 0 < value < np.inf),
        ("gamma gae_lambda", "between 0 and 1", lambda value: 0 <= value <= 1),
        ("clip_coef max_grad_norm obs_clip reward_clip", "above 0", lambda value: value > 0),
        ("ent_coef vf_coef", "0 or more", lambda value: value >= 0),
        ("target_kl", "above 0 (leave it out to never stop early)",
         lambda value: value is None or value > 0),
    ])
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        exits.fail(VARIANT, f"--num-envs x --num-steps = {batch_size} does not divide into "
                            f"--num-minibatches {args.num_minibatches} equal minibatches: pick "
                            "sizes whose product is a multiple of it")
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        exits.fail(VARIANT, f"minibatches of {batch_size // args.num_minibatches} transition "
                            "cannot be normalized (--norm-adv divides by their standard "
                            "deviation): use fewer --num-minibatches or a larger batch")
    if args.total_timesteps < batch_size:
        exits.fail(VARIANT, f"--total-timesteps {args.total_timesteps} is smaller than one batch "
                            f"(--num-envs x --num-steps = {batch_size}): raise it or shrink the "
                            "batch")



def check_spaces(env_id: str, envs: gym.vector.VectorEnv) -> None:
    """Refuse environments whose spaces this script cannot train on, naming the script that can."""
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        hint = ("use ppo/ppo.py for Discrete actions"
                if isinstance(envs.single_action_space, gym.spaces.Discrete)
                else "no script here takes these: expose Box or Discrete actions in your "
                     "environment")
        exits.fail(VARIANT, f"{env_id} has a {type(envs.single_action_space).__name__} action "
                            f"space but {VARIANT}.py needs Box (continuous) actions: {hint}")
    space = envs.single_observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        hint = ("flatten them into one vector (gymnasium.wrappers.FlattenObservation) in your "
                "environment"
                if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)) else
                "image observations need a CNN, as in ppo/ppo_atari.py or ppo/ppo_procgen.py")
        exits.fail(VARIANT, f"{env_id} observations are {space}, but {VARIANT}.py needs flat "
                            f"vectors: {hint}")


if __name__ == "__main__":
    args, checkpoint = parse_args()
    exits.run_and_exit(evaluate if args.evaluate else main, args, checkpoint, VARIANT,
                       pip_extra="mujoco")
