"""PPO on Procgen games with the IMPALA CNN: starpilot, bossfight, bigfish and the 13 others.

    python ppo/ppo_procgen.py --env-id starpilot                      # train
    python ppo/ppo_procgen.py --save-model                           # ... and keep a checkpoint
    python ppo/ppo_procgen.py --resume runs/<run>/checkpoint.pt      # go on after Ctrl-C or a crash
    python ppo/ppo_procgen.py --evaluate runs/<run>/checkpoint.pt    # score a saved agent

Procgen comes with the extra: pip install -e ".[procgen]" (OpenAI's procgen, published on PyPI as
procgen-mirror). The file follows ppo/ppo_atari.py; its 13 core details are marked where they happen
as there, and so are the network, `[Procgen: IMPALA CNN]`, and the two settings of
openai/train-procgen that the other scripts lack (no learning-rate annealing in Args, rewards scaled
and clipped in RewardScaler): docs/ppo_procgen.md explains each. The games play the easy levels.
The run itself (its flags, checkpoints, logs, progress line and stop signals) comes from the modules
beside this file, written once for every script: copy them along with it."""

import contextlib
import io
import warnings
from dataclasses import dataclass
from typing import Annotated

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from gymnasium.wrappers.utils import RunningMeanStd
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
# The rules of --distribution-mode and --num-levels (Procgen's own flags).
ONE_OF_THE_MODES = command_line.Rule(f"one of {', '.join(DISTRIBUTION_MODES)}",
                                     lambda value: value in DISTRIBUTION_MODES)
LEVELS = command_line.Rule("0 (unlimited levels) or more", lambda value: value >= 0)


@command_line.with_run_flags(VARIANT)  # then --seed, --cuda, --track, --save-model, --resume, ...
@dataclass
class Args:
    env_id: str = "starpilot"
    """the Procgen game: bigfish, bossfight, caveflyer, chaser, climber, coinrun, dodgeball,
    fruitbot, heist, jumper, leaper, maze, miner, ninja, plunder or starpilot"""
    # An evaluation may play other levels than training did (all of them, say: --num-levels 0).
    distribution_mode: command_line.EvaluationMayChange[Annotated[str, ONE_OF_THE_MODES]] = "easy"
    """the Procgen level distribution: easy, hard, extreme, memory or exploration"""
    num_levels: command_line.EvaluationMayChange[Annotated[int, LEVELS]] = 0
    """the number of distinct levels to train on (0: unlimited)"""
    start_level: command_line.EvaluationMayChange[Annotated[int, command_line.ZERO_OR_MORE]] = 0
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
    reward_clip: Annotated[float, command_line.ABOVE_ZERO] = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""

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
    drawn from that seed. Each step's info reports the episodes that ended as gymnasium's
    RecordEpisodeStatistics does (the game's own score and length). With `video_folder`, the first
    game's episodes are written as mp4 files on gymnasium's schedule (episodes 0, 1, 8, 27, ...,
    1000, 2000, ...), from what the agent sees."""

    single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    single_action_space = gym.spaces.Discrete(15)

    def __init__(self, game: str, num_envs: int, distribution_mode: str = "easy",
                 num_levels: int = 0, start_level: int = 0, video_folder: str | None = None):
        self.num_envs = num_envs
        self.action_space = gym.spaces.MultiDiscrete([15] * num_envs)
        self.options = dict(env_name=game, distribution_mode=distribution_mode)
        if distribution_mode != "exploration":  # which sets its own level
            self.options.update(num_levels=num_levels, start_level=start_level)
        self.games, self.episode_return, self.episode_length = None, None, None
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
        self.episode_return = np.zeros(self.num_envs)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self.frames = []
        self.record(obs["rgb"], episode_ended=False)
        return obs["rgb"], {}

    def step(self,
             actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        self.games.act(np.asarray(actions, dtype=np.int32))
        reward, obs, first = self.games.observe()  # first: this observation begins a new episode
        self.record(obs["rgb"], episode_ended=first[0])
        self.episode_return += reward
        self.episode_length += 1
        info = {"final_info": {"episode": {"r": self.episode_return.copy(),
                                           "l": self.episode_length.copy()}, "_episode": first}}
        self.episode_return[first], self.episode_length[first] = 0.0, 0
        return obs["rgb"], reward, first, np.zeros_like(first), info

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

    @run_life.compiled
    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Sample an action (or score a given one): returns action, log-prob, entropy and value.
        One pass through the trunk gives all four, so the rollout asks for them at every step."""
        hidden = self.features(obs)
        # The logits come straight from the network, so argument validation would only cost time.
        distribution = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = distribution.sample()
        return action, distribution.log_prob(action), distribution.entropy(), self.critic(hidden)


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
        self.return_rms = RunningMeanStd(shape=())
        self.discounted_return = np.zeros(num_envs)

    def scale(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.discounted_return = self.discounted_return * self.gamma + reward
        self.return_rms.update(self.discounted_return)
        self.discounted_return[done] = 0.0
        return reward / np.sqrt(self.return_rms.var + 1e-8)

    def state_dict(self) -> dict:
        return {"return_rms": statistics(self.return_rms),
                "discounted_return": self.discounted_return.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.return_rms = statistics(state["return_rms"])
        self.discounted_return = state["discounted_return"].copy()


def statistics(saved: RunningMeanStd | dict) -> dict | RunningMeanStd:
    """A running mean and variance (gymnasium's RunningMeanStd: Chan et al.'s parallel merge of
    batches, in float64) as a checkpoint keeps it, and back."""
    if isinstance(saved, RunningMeanStd):
        return {"mean": saved.mean.copy(), "var": saved.var.copy(), "count": saved.count}
    kept = RunningMeanStd(shape=np.shape(saved["mean"]))
    kept.mean, kept.var, kept.count = saved["mean"].copy(), saved["var"].copy(), saved["count"]
    return kept


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
             returns: torch.Tensor, clip_coef: float, args: Args) -> tuple[torch.Tensor, dict]:
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

    # [Core 10: Overall loss and entropy bonus] one loss for the policy and the value function; the
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


@run_life.compiled
def minibatch_loss(agent: Agent, obs: torch.Tensor, actions: torch.Tensor,
                   old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, clip_coef: float,
                   args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The network on one minibatch, then the PPO loss: the unit --compile compiles."""
    _, new_logprob, entropy, new_value = agent.get_action_and_value(obs, actions)
    return ppo_loss(new_logprob, entropy, new_value.flatten(), old_logprob, old_value, advantages,
                    returns, clip_coef, args)


def main(args: Args, checkpoint: dict | None = None) -> dict:
    """Train as `args` says, from `checkpoint` (read by command_line.parse_args) with --resume;
    returns a summary of the run for callers such as tests."""
    # The run: its flags checked, its name and folder, its device (run_life.Run).
    run = run_life.Run(args, VARIANT, checkpoint, env_package="procgen-mirror", recent_episodes=100)
    device = run.device
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # Python's, NumPy's and PyTorch's random generators start from --seed; the environments are
    # seeded at their reset, below.
    run_life.seed_everything(args.seed, args.torch_deterministic)
    # PyTorch keeps its default of one thread per core here: on a CPU nearly all the time goes to
    # the IMPALA CNN, which a dedicated many-core machine runs faster on all its cores. On a shared
    # machine set OMP_NUM_THREADS=1: docs/ppo_procgen.md, Speed, measured the default up to 80x
    # slower there.

    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     args.distribution_mode, args.num_levels, args.start_level)
    obs_shape = envs.single_observation_space.shape  # (64, 64, 3)
    agent = Agent(obs_shape, envs.single_action_space.n).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8. Adam divides each step by sqrt(v) + eps: the larger eps damps the steps of weights whose
    # gradients are tiny, which Adam would otherwise scale up to full size. fused=True: the same
    # Adam, in one kernel for all parameters instead of a dozen small ops each.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    # Rollout storage, (num_steps, num_envs, ...), refilled every iteration. [Speed: one host
    # transfer per step] What the network reads or writes lives on its device (the frames as uint8,
    # until the network scales them); rewards and dones stay on the host, where GAE runs.
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)

    # The run starts: its logs open and, resumed, it takes back its weights, optimizer, random
    # generators and step count, and the reward scaler's statistics. Procgen builds its games anew
    # at a reset, on seeds that a resumed run has not played yet; a resumed run then puts the saved
    # games back, the very episodes it left (their scores so far with them), and a new one's
    # discounted returns that scale the rewards start from 0.
    global_step = run.start(agent, optimizer, num_iterations, batch_size=batch_size,
                            minibatch_size=minibatch_size)
    if checkpoint:
        reward_scaler.load_state_dict(checkpoint["reward_scaler"])
    next_obs, next_done = envs.reset(seed=args.seed + global_step)[0], np.zeros(args.num_envs, bool)
    resumed = run.resumed("next_obs", "next_done", "episode_return", "episode_length")
    if resumed:
        envs.set_state(run.saved_envs)
        next_obs, next_done, envs.episode_return, envs.episode_length = resumed
    else:
        reward_scaler.discounted_return[:] = 0.0

    for iteration in run.iterations():  # resumed: from the checkpoint's; a stop signal ends them
        # [Core 4: Adam learning rate annealing] off by default here ([Procgen 1]); when on,
        # linearly from learning_rate toward 0, which the end of the run would reach: the last
        # iteration uses learning_rate / num_iterations. --anneal-clip lowers the clipping
        # coefficient alike.
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every environment with the current policy.
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = torch.as_tensor(next_obs, device=device)
            dones[step] = next_done

            # The network runs once per step anyway to choose the action, and its one trunk gives
            # the log-probability and value with it: they are recorded here, on the device
            # (ppo.py's separate critic would cost a second call; it scores the batch later).
            with torch.inference_mode():
                action, logprob, _, value = agent.get_action_and_value(obs[step])
            actions[step], logprobs[step], values[step] = action, logprob, value.flatten()

            # The step's one transfer to the host: the actions, which the games need.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            # [Procgen 2] Rewards scaled by the std of the discounted return, then clipped to
            # ±reward_clip.
            rewards[step] = np.clip(reward_scaler.scale(reward, next_done), -args.reward_clip,
                                    args.reward_clip)
            # the episodes that ended, logged with the games' own scores; and the progress line now
            # and then
            run.record_step(global_step, run_life.finished_episodes(infos))

        # Flatten the rollout into one batch of num_envs x num_steps transitions.
        # b_ names an array of the whole batch, mb_ one of a minibatch.
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions = actions.reshape(-1)
        b_logprobs = logprobs.reshape(-1)
        b_values = values.reshape(-1)
        with torch.no_grad():
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

        # [Core 12: Debug variables] averaged over every minibatch of this update. The iteration's
        # end (run.end_iteration): a NaN or infinity stops the run in one line; else the logs (with
        # the values' explained variance), the progress line and, when due, a checkpoint.
        means = {key: torch.stack([s[key] for s in minibatch_stats]).mean().item()
                 for key in minibatch_stats[0]}
        run.end_iteration(iteration, global_step, means, host_values.reshape(-1),
                          returns.reshape(-1), next_obs=next_obs, next_done=next_done,
                          reward_scaler=reward_scaler.state_dict(),
                          # a recording run's games are not saved: a resumed one starts new ones
                          envs=None if args.capture_video else envs.get_state(),
                          episode_return=envs.episode_return, episode_length=envs.episode_length)

    envs.close()
    return run.finish(global_step, agent=agent, reward_scaler=reward_scaler)


def evaluate(args: Args, checkpoint: dict) -> list[float]:
    """--evaluate: play episodes with the saved agent, its actions sampled as in training. With
    unlimited levels, the evaluation's seeds draw levels the agent most likely never saw."""
    evaluation = run_life.Evaluation(args, VARIANT, checkpoint)  # the device and seeds
    envs = make_envs(args.env_id, 1, args.capture_video, evaluation.video_folder,
                     args.distribution_mode, args.num_levels, args.start_level)
    agent = evaluation.load(Agent(envs.single_observation_space.shape, envs.single_action_space.n))
    return evaluation.play(envs, lambda obs, _: agent.get_action_and_value(
        torch.as_tensor(obs, dtype=torch.float32, device=evaluation.device))[0].cpu().numpy())


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
    command_line.run_script(main, evaluate, Args, VARIANT, __doc__, pip_extra="procgen")
