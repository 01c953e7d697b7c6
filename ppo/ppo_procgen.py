"""PPO on Procgen games with the IMPALA CNN: starpilot, bossfight, bigfish and the 13 others.

    python ppo/ppo_procgen.py --env-id starpilot                      # train
    python ppo/ppo_procgen.py --save-model                           # ... and keep a checkpoint
    python ppo/ppo_procgen.py --resume runs/<run>/checkpoint.pt      # go on after Ctrl-C or a crash
    python ppo/ppo_procgen.py --evaluate runs/<run>/checkpoint.pt    # score a saved agent

Procgen comes with the extra: pip install -e ".[procgen]" (OpenAI's procgen, published on PyPI as
procgen-mirror). The file follows ppo/ppo.py: settings, environments, the agent, GAE, the clipped
loss, then the training loop in `main()`. The 13 core details are marked `[Core N: ...]` where they
happen, the network `[Procgen: IMPALA CNN]`, and the two settings of openai/train-procgen that the
other scripts lack (no learning-rate annealing, rewards scaled and clipped) `[Procgen N: ...]`;
docs/ppo_procgen.md lists them all. The games are played on the easy levels. What a run needs beyond
PPO comes from four modules beside this file, one concern each: command_line (flags, --resume and
--evaluate), checkpoints, run_life (logs, progress, stop signals, speed options, evaluation) and
exits (exit codes): copy them along with it.
"""

import contextlib
import io
import warnings
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

# The run machinery, beside this file: what a run needs that is not PPO.
import command_line
import exits
import run_life

try:
    # procgen imports the retired `gym` package only to register old-style environments, and gym
    # prints a notice about itself on import; it concerns neither this script nor its user.
    with contextlib.redirect_stderr(io.StringIO()):
        from procgen import ProcgenGym3Env
    # gym3 holds imageio-ffmpeg below 0.4, which warns when the first video is written that
    # pkg_resources is deprecated: noise about a library this script does not call itself.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
except ImportError as error:  # reported by make_envs, with the command that installs it
    ProcgenGym3Env, PROCGEN_IMPORT_ERROR = None, error

VARIANT = "ppo_procgen"  # written into checkpoints, so another variant's checkpoint is refused

# The 16 games of the Procgen Benchmark; --env-id takes one of these names.
GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball",
         "fruitbot", "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")
DISTRIBUTION_MODES = ("easy", "hard", "extreme", "memory", "exploration")
# Two modes exist for some games only. "exploration" is one hard level per game, fixed by Procgen.
MODE_GAMES = {"memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
              "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper",
                              "maze", "ninja")}


@dataclass
class Args:
    # The algorithm
    env_id: str = "starpilot"
    """the Procgen game: bigfish, bossfight, caveflyer, chaser, climber, coinrun, dodgeball,
    fruitbot, heist, jumper, leaper, maze, miner, ninja, plunder or starpilot"""
    distribution_mode: str = "easy"
    """the Procgen level distribution: easy, hard, extreme, memory or exploration"""
    num_levels: int = 0
    """the number of distinct levels to train on (0: unlimited)"""
    start_level: int = 0
    """the seed of the first level, with --num-levels above 0"""
    total_timesteps: int = 25000000
    """total environment steps of the experiment"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 64
    """the number of parallel games"""
    num_steps: int = 256
    """the number of steps to run in each game per rollout"""
    # [Procgen 1: Learning rate annealing off] train-procgen keeps the rate constant.
    anneal_lr: bool = False
    """if toggled, anneal the learning rate linearly to zero (train-procgen does not)"""
    gamma: float = 0.999
    """the discount factor gamma (also the discount of the return that scales rewards)"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 8
    """the number of minibatches each batch is split into"""
    update_epochs: int = 3
    """the number of passes over the batch per update"""
    norm_adv: bool = True
    """if toggled, normalize advantages within each minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    anneal_clip: bool = False
    """if toggled, anneal the clip coefficient linearly to zero, as the PPO paper does for Atari"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as the original PPO code does"""
    ent_coef: float = 0.01
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for global gradient clipping"""
    target_kl: float | None = None
    """if set, stop the update epochs early once the approximate KL exceeds it"""
    reward_clip: float = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""

    # The run: its name, seed and device, logs, checkpoints and evaluation
    exp_name: str = VARIANT
    """the name of this experiment, part of the run name"""
    seed: int = 1
    """seed of the experiment (Python, NumPy, PyTorch and the levels the games draw)"""
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
    """if toggled, record videos of the first game to `videos/<run_name>/`"""
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


class ProcgenVectorEnv:
    """`num_envs` Procgen games behind the calls of a gymnasium vector environment: reset(seed),
    step(actions) -> (obs, reward, terminated, truncated, info), close(), and the spaces.

    [Core 1: Vectorized architecture] One learner steps all games in lock step; Procgen runs them in
    C++ threads, so each rollout holds num_envs x num_steps transitions.

    Procgen already resets a finished game within the step that ends it, as SAME_STEP mode does in
    the other scripts: the observation that step returns is the first of the next episode, and the
    step's reward is the last one of the finished episode. Procgen's time limits end episodes like
    losses do; both count as `terminated`. Observations are (64, 64, 3) uint8 RGB images; there are
    15 actions.

    A game cannot be restarted on demand, so reset(seed) builds the games anew; their levels are
    drawn from that seed. With `video_folder`, the first game's episodes are written as mp4 files on
    gymnasium's schedule (episodes 0, 1, 8, 27, ..., 1000, 2000, ...), from what the agent sees."""

    single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    single_action_space = gym.spaces.Discrete(15)

    def __init__(self, game: str, num_envs: int, distribution_mode: str = "easy",
                 num_levels: int = 0, start_level: int = 0, video_folder: str | None = None):
        self.num_envs = num_envs
        self.action_space = gym.spaces.MultiDiscrete([15] * num_envs)
        self.options = dict(env_name=game, distribution_mode=distribution_mode)
        if distribution_mode != "exploration":  # which sets its own level
            self.options.update(num_levels=num_levels, start_level=start_level)
        self.games = None
        self.video_folder, self.frames, self.episode = video_folder, [], 0
        if video_folder is not None:
            # needs moviepy
            from gymnasium.utils.save_video import capped_cubic_video_schedule, save_video

            self.schedule, self.save_video = capped_cubic_video_schedule, save_video

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        if self.games is not None:
            self.games.close()
        # Procgen takes a 32-bit seed; a resumed run's or an evaluation's seed (--seed plus an
        # offset) may pass 2**31.
        seed = None if seed is None else seed % 2**31
        self.games = ProcgenGym3Env(num=self.num_envs, rand_seed=seed, **self.options)
        _, obs, _ = self.games.observe()
        self.frames = []
        self.record(obs["rgb"], episode_ended=False)
        return obs["rgb"], {}

    def step(self,
             actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        self.games.act(np.asarray(actions, dtype=np.int32))
        reward, obs, first = self.games.observe()  # first: this observation begins a new episode
        self.record(obs["rgb"], episode_ended=first[0])
        return obs["rgb"], reward, first, np.zeros_like(first), {}

    def record(self, obs: np.ndarray, episode_ended: bool) -> None:
        """Keep the first game's frames (scaled up 4x) while the schedule picks its episode, and
        write each picked episode out when it ends."""
        if self.video_folder is None:
            return
        if episode_ended:
            if self.schedule(self.episode):
                self.save_video(self.frames, self.video_folder, episode_trigger=self.schedule,
                                episode_index=self.episode, fps=15)
            self.frames, self.episode = [], self.episode + 1
        if self.schedule(self.episode):  # 256x256 RGB frames: keep none of the episodes not written
            self.frames.append(obs[0].repeat(4, axis=0).repeat(4, axis=1))

    def get_state(self) -> list[bytes]:
        """Every game's full state (level, positions, random generators), for exact resumption."""
        return self.games.get_state()

    def set_state(self, state: list[bytes]) -> None:
        self.games.set_state(state)

    def close(self) -> None:
        if self.games is not None:
            self.games.close()


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              distribution_mode: str = "easy", num_levels: int = 0,
              start_level: int = 0) -> ProcgenVectorEnv:
    """Build the vector of games, checking that this script can train on them."""
    check_env_id(env_id, distribution_mode, num_levels, start_level)
    return ProcgenVectorEnv(env_id, num_envs, distribution_mode, num_levels, start_level,
                            video_folder if capture_video else None)


# --------------------------------------------------------------------------------------------------
# Agent
# --------------------------------------------------------------------------------------------------


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """[Core 2: Orthogonal initialization of weights, constant initialization of biases] Orthogonal
    weights for the two heads, 0.01 for the policy (so the first policy is close to uniform) and 1
    for the value. The convolutions and the 256-unit dense layer keep PyTorch's default
    initialization, as in the reference implementation (openai/train-procgen keeps TensorFlow's,
    Glorot-uniform)."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), both convolutions 3x3 with the block's channels."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    """A 3x3 convolution to `out_channels`, a 3x3 max-pool with stride 2 (halving height and width),
    then two residual blocks."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.res0 = ResidualBlock(out_channels)
        self.res1 = ResidualBlock(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res1(self.res0(self.pool(self.conv(x))))


class Agent(nn.Module):
    """[Procgen: IMPALA CNN] The network of IMPALA (Espeholt et al., 2018) as Procgen's paper uses
    it: pixels scaled to [0, 1], three ConvSequences of 16, 32 and 32 channels (64x64 -> 32x32 ->
    16x16 -> 8x8), then ReLU, a 256-unit linear layer and ReLU.

    [Core 13: Separate MLP networks for policy and value functions] not here: as in the original
    Procgen code, the policy and the value are two linear heads on the one shared IMPALA trunk,
    which learns features from pixels for both."""

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int):
        super().__init__()
        height, width, channels = obs_shape
        sequences = []
        for out_channels in (16, 32, 32):
            sequences.append(ConvSequence(channels, out_channels))
            channels, height, width = out_channels, (height + 1) // 2, (width + 1) // 2
        self.network = nn.Sequential(
            *sequences,
            nn.Flatten(),
            nn.ReLU(),
            # PyTorch's default initialization (see layer_init)
            nn.Linear(channels * height * width, 256),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(256, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(256, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Images (N, 64, 64, 3) uint8 -> (N, 256) features; channels go first for the
        convolutions."""
        return self.network(obs.permute(0, 3, 1, 2).float() / 255.0)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs))

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Sample an action (or score a given one): returns action, log-prob, entropy and value.
        One pass through the trunk gives all four, so the rollout asks for them at every step."""
        hidden = self.features(obs)
        # The logits come straight from the network, so argument validation would only cost time.
        distribution = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = distribution.sample()
        return action, distribution.log_prob(action), distribution.entropy(), self.critic(hidden)


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


class RewardScaler:
    """[Procgen 2: Reward scaling and clipping] As openai/train-procgen does (its VecNormalize
    without observation normalization), rewards are divided by the running standard deviation of the
    discounted return (not of the rewards themselves, and without subtracting a mean), so the value
    targets stay in a range the value head learns well in every game, whatever its score scale; the
    rollout then clips them to [-reward_clip, reward_clip].

    Per game it keeps the return discounted by gamma of the episode so far; every step adds the new
    rewards, updates the statistics with the returns, then scales the rewards by their std. A
    finished episode's return restarts at 0."""

    def __init__(self, num_envs: int, gamma: float):
        self.gamma = gamma
        self.return_rms = RunningMeanStd(())
        self.discounted_return = np.zeros(num_envs)

    def scale(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.discounted_return = self.discounted_return * self.gamma + reward
        self.return_rms.update(self.discounted_return)
        self.discounted_return[done] = 0.0
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

    # [Core 10: Overall loss and entropy bonus] one loss for both heads and the shared trunk; the
    # entropy term keeps the policy exploring.
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


def episodes_at_start(envs: ProcgenVectorEnv, checkpoint: dict | None, seed: int,
                      reward_scaler: RewardScaler):
    """Where the games' episodes stand as training starts: the next observation, whether it begins
    an episode, and each episode's running score and length. Procgen builds its games anew at a
    reset; a resumed run (`checkpoint`) then puts the saved games' own states back and goes on with
    the very episodes it left. A new run, or one that starts new episodes (None), plays the games
    the reset on `seed` built, and the reward scaler's discounted returns start again from 0."""
    next_obs, _ = envs.reset(seed=seed)
    if checkpoint is not None:
        envs.set_state(checkpoint["envs"])
        return (checkpoint["next_obs"], checkpoint["next_done"], checkpoint["episode_return"],
                checkpoint["episode_length"])
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
    # The run: its name and folder, device and seeds, and the releases it records.
    run = run_life.Run(args, VARIANT, checkpoint, num_iterations, env_package="procgen-mirror")
    device = run.device
    # PyTorch keeps its default of one thread per core here: on a CPU nearly all the time goes to
    # the IMPALA CNN, which a dedicated many-core machine runs faster on all its cores. On a shared
    # machine set OMP_NUM_THREADS=1: docs/ppo_procgen.md, Speed, measured the default up to 80x
    # slower there.

    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     args.distribution_mode, args.num_levels, args.start_level)
    obs_shape = envs.single_observation_space.shape
    agent = Agent(obs_shape, envs.single_action_space.n).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8. Adam divides each step by sqrt(v) + eps: the larger eps damps the steps of weights whose
    # gradients are tiny, which Adam would otherwise scale up to full size. fused=True: the same
    # Adam, in one kernel for all parameters instead of a dozen small ops each.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # policy_step (the rollout's call of the agent) and loss_on_minibatch (the update's): the two
    # functions as they are, or [Speed: torch.compile] compiled into a few fused kernels, so that a
    # GPU does not wait for Python to launch many small ones.
    policy_step, loss_on_minibatch = run_life.compiled(args, agent.get_action_and_value,
                                                       minibatch_loss)
    writer = run.open_logs(batch_size=batch_size, minibatch_size=minibatch_size,
                           num_iterations=num_iterations)

    # Rollout storage, (num_steps, num_envs, ...), refilled every iteration. What the network reads
    # and writes lives on the training device, allocated once: the images as they come, uint8 (200
    # MB at the default sizes, four times that as floats; the network scales them), the actions,
    # their log-probabilities and the values. Rewards and episode ends come from the games as NumPy
    # and stay there until GAE.
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)

    # Where the run starts: its iteration and step (0 unless resumed), where each game's episode
    # stands (new episodes begin on seeds that a resumed run has not played yet), and the scores of
    # the latest finished episodes. A recording run saved no games; resuming it starts new ones.
    saved_games = checkpoint["envs"] if checkpoint else None
    start_iteration, global_step = run.start(agent, optimizer, new_episodes=saved_games is None)
    if checkpoint:
        reward_scaler.load_state_dict(checkpoint["reward_scaler"])
    next_obs, next_done, episode_return, episode_length = episodes_at_start(
        envs, checkpoint if saved_games is not None else None, seed=args.seed + global_step,
        reward_scaler=reward_scaler)
    recent_returns = deque(checkpoint["recent_returns"] if checkpoint else [], maxlen=100)

    for iteration in range(start_iteration + 1, num_iterations + 1):
        # [Core 4: Adam learning rate annealing] off by default here ([Procgen 1]); when on,
        # linearly from learning_rate toward 0, which the end of the run would reach: the last
        # iteration uses learning_rate / num_iterations. --anneal-clip lowers the clipping
        # coefficient alike.
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every game with the current policy.
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = torch.as_tensor(next_obs, device=device)  # uint8 on its way to the device
            dones[step] = next_done

            # The network runs once per step anyway to choose the action, and its one trunk gives
            # the log-probability and value with it: they are recorded here, on the device
            # (ppo.py's separate critic would cost a second call; it scores the batch later).
            with torch.inference_mode():
                action, logprob, _, value = policy_step(obs[step])
            actions[step], logprobs[step], values[step] = action, logprob, value.flatten()

            # [Speed: one host transfer per step] the actions, which the games need, and nothing
            # else.
            next_obs, reward, terminations, truncations, _ = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            # [Procgen 2] Rewards scaled by the std of the discounted return, then clipped to
            # ±reward_clip.
            rewards[step] = np.clip(reward_scaler.scale(reward, next_done), -args.reward_clip,
                                    args.reward_clip)

            episode_return += reward  # the game's own score, not the scaled reward
            episode_length += 1
            for i in np.flatnonzero(next_done):
                writer.add_scalar("charts/episodic_return", episode_return[i], global_step)
                writer.add_scalar("charts/episodic_length", episode_length[i], global_step)
                recent_returns.append(episode_return[i])
            episode_return[next_done] = 0.0
            episode_length[next_done] = 0
            # within a long rollout too, every few seconds
            run.print_progress(global_step, recent_returns)

        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(next_obs, device=device))
        # GAE runs on the host, in NumPy: one transfer of the rollout's values per iteration.
        host_values = values.cpu().numpy()
        advantages, returns = compute_gae(rewards, host_values, dones,
                                          next_value.cpu().numpy().flatten(), next_done,
                                          args.gamma, args.gae_lambda)

        # Flatten the rollout into one batch of num_envs x num_steps transitions.
        # b_ names an array of the whole batch, mb_ one of a minibatch.
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions = actions.reshape(-1)
        b_logprobs = logprobs.reshape(-1)
        b_values = values.reshape(-1)
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
            # A recording run's games are not saved: its video would restart mid-episode anyway.
            run.save_checkpoint(iteration, global_step, agent, optimizer,
                                reward_scaler=reward_scaler.state_dict(),
                                envs=None if args.capture_video else envs.get_state(),
                                next_obs=next_obs, next_done=next_done,
                                episode_return=episode_return.copy(),
                                episode_length=episode_length.copy(),
                                recent_returns=list(recent_returns))
        if run.stopping:  # Ctrl-C, kill or Slurm: this iteration was finished, logged and saved
            break

    envs.close()
    run.finish(global_step)
    return {"run_name": run.name, "global_step": global_step, "interrupted": run.stopping,
            "recent_returns": list(recent_returns), "agent": agent, "reward_scaler": reward_scaler}


def evaluate(args: Args, checkpoint: dict) -> list[float]:
    """--evaluate: play episodes with the saved agent, its actions sampled as in training. With
    unlimited levels, the evaluation's seeds draw levels the agent most likely never saw."""
    check_args(args)
    # the device and seeds; prints the scores
    evaluation = run_life.Evaluation(args, VARIANT, checkpoint)
    envs = make_envs(args.env_id, 1, args.capture_video, evaluation.video_folder,
                     args.distribution_mode, args.num_levels, args.start_level)
    agent = evaluation.load(Agent(envs.single_observation_space.shape, envs.single_action_space.n))
    obs, _ = envs.reset(seed=evaluation.seed)
    episode_return = 0.0
    while evaluation.playing:
        with torch.inference_mode():
            action, _, _, _ = agent.get_action_and_value(torch.as_tensor(obs,
                                                                         device=evaluation.device))
        obs, reward, terminated, truncated, _ = envs.step(action.cpu().numpy())
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
# Training settings an evaluation also reads and may change: the seed of its games, and which levels
# it plays (an agent trained on 200 levels can be evaluated on all of them: --num-levels 0).
EVALUATION_FIELDS = {"seed", "distribution_mode", "num_levels", "start_level"}


def parse_args(argv: list[str] | None = None) -> tuple[Args, dict | None]:
    """The settings of the command line, and the checkpoint that --resume or --evaluate names."""
    return command_line.parse_args(Args, VARIANT, RUNTIME_FIELDS, EVALUATION_FIELDS, argv,
                                   doc=__doc__)


def check_args(args: Args) -> None:
    """Refuse settings that cannot make a valid run, before any environment is built: first each
    flag on its own, then the sizes that must fit together."""
    # (flags, what each must be, which values are allowed)
    command_line.check_rules(args, VARIANT, [
        ("env_id", "a Procgen game such as starpilot", lambda value: value.strip() != ""),
        ("seed", "a whole number from 0 to 2**31 - 1", lambda value: 0 <= value < 2**31),
        ("distribution_mode", f"one of {', '.join(DISTRIBUTION_MODES)}",
         lambda value: value in DISTRIBUTION_MODES),
        ("num_levels", "0 (unlimited levels) or more", lambda value: value >= 0),
        ("start_level", "0 or more", lambda value: value >= 0),
        ("save_interval", "0 (save only at the end) or more", lambda value: value >= 0),
        ("save_minutes", "0 (never save by the clock) or more", lambda value: 0 <= value < np.inf),
        ("eval_episodes total_timesteps num_envs num_steps num_minibatches update_epochs", "at "
                                                                                           "least "
                                                                                           "1",
         lambda value: value >= 1),
        ("learning_rate", "a finite number above 0", lambda value: 0 < value < np.inf),
        ("gamma gae_lambda", "between 0 and 1", lambda value: 0 <= value <= 1),
        ("clip_coef max_grad_norm reward_clip", "above 0", lambda value: value > 0),
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



def check_env_id(env_id: str, distribution_mode: str, num_levels: int, start_level: int) -> None:
    """Refuse a game that Procgen does not have (naming the one meant, or the script to use
    instead), a distribution mode the game lacks, and levels the exploration mode does not take."""
    if env_id not in GAMES:
        hint, game = "", next((game for game in GAMES if game in env_id.lower()), None)
        if "NoFrameskip" in env_id or env_id.startswith("ALE/"):
            hint = " (Atari games need ppo/ppo_atari.py)"
        elif game:  # StarPilot, StarpilotEasy-v0 (envpool), procgen:procgen-starpilot-v0 (gym)
            hint = f" (did you mean {game!r}?)"
        else:
            with contextlib.suppress(gym.error.Error):
                gym.spec(env_id)
                hint = " (a gymnasium id: use ppo/ppo.py or ppo/ppo_continuous_action.py for those)"
        exits.fail(VARIANT, f"unknown Procgen game {env_id!r}{hint}: pick one of "
                            f"{', '.join(GAMES)}")
    if distribution_mode in MODE_GAMES and env_id not in MODE_GAMES[distribution_mode]:
        exits.fail(VARIANT, f"{env_id} has no {distribution_mode!r} distribution mode: only "
                              f"{', '.join(MODE_GAMES[distribution_mode])} have it")
    if distribution_mode == "exploration" and (num_levels, start_level) != (0, 0):
        exits.fail(VARIANT, "the exploration mode plays the one level Procgen picks for the game: "
                              "leave out --num-levels and --start-level")
    if ProcgenGym3Env is None:
        exits.fail(VARIANT, f"Procgen is not installed ({PROCGEN_IMPORT_ERROR}): pip install -e "
                            "\".[procgen]\"")


if __name__ == "__main__":
    args, checkpoint = parse_args()
    exits.run_and_exit(evaluate if args.evaluate else main, args, checkpoint, VARIANT,
                       pip_extra="procgen")
