"""PPO for Atari trained by several processes at once: data parallelism with torch.distributed.

    torchrun --standalone --nproc-per-node 2 ppo/ppo_atari_multigpu.py --env-id Breakout...-v4
    torchrun --standalone --nproc-per-node 2 ppo/ppo_atari_multigpu.py --backend nccl  # a GPU each
    torchrun --standalone --nproc-per-node 4 ppo/ppo_atari_multigpu.py --device-ids 0 0 1 1
    torchrun --standalone --nproc-per-node 2 ppo/ppo_atari_multigpu.py --resume runs/<run>/...pt
    python ppo/ppo_atari_multigpu.py --evaluate runs/<run>/checkpoint.pt  # one process is enough

The same PPO as ppo/ppo_atari.py, the same preprocessing and network, but the environments are split
between N processes (ranks). Each rank collects its share of the rollout and computes gradients on
its share of every minibatch; the gradients are averaged over the ranks before each optimizer step,
so every rank applies the same update to the same weights and the world trains one agent, as one
process with all the environments and the full minibatches would. Started without torchrun, the
script runs as a world of one process.

The 13 core details are marked `[Core N: ...]`, the 9 Atari details `[Atari N: ...]` and the 3 data-
parallel ones `[Multi-GPU N: ...]`; docs/ppo_atari_multigpu.md lists them all. What a run needs
beyond PPO comes from four modules beside this file, one concern each: command_line (flags, --resume
and --evaluate), checkpoints, run_life (logs, progress, stop signals, speed options, evaluation) and
exits (exit codes): copy them along with it.
"""

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

# The run machinery, beside this file: what a run needs that is not PPO.
import checkpoints
import command_line
import exits
import run_life

try:
    import ale_py
except ImportError:  # reported with the command that installs it when an environment is made
    ale_py = None

# written into checkpoints, so another variant's checkpoint is refused
VARIANT = "ppo_atari_multigpu"


@dataclass
class Args:
    # The algorithm
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment: an ale-py game, `<Game>NoFrameskip-v4` or `ALE/<Game>-v5`"""
    total_timesteps: int = 10000000
    """total environment steps of the experiment, over all processes (each step is 4 frames)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel environments over ALL processes (as CleanRL's 2022 PPO docs read it;
    its current script counts them per process): each of N processes steps num_envs / N, so a batch
    is num_envs x num_steps for any N (1024 by default: 8 x 128 in 1 process, 4 x 128 in each of 2,
    2 x 128 in each of 4)"""
    num_steps: int = 128
    """the number of steps to run in each environment per rollout"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to zero"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 4
    """the number of minibatches each batch is split into"""
    update_epochs: int = 4
    """the number of passes over the batch per update"""
    norm_adv: bool = True
    """if toggled, normalize advantages within each minibatch"""
    clip_coef: float = 0.1
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
    bootstrap_truncated: bool = False
    """if toggled, a time limit is no death: its last reward gets + gamma x V(final observation)"""

    # Distributed training
    backend: Literal["gloo", "nccl"] = "gloo"
    """the torch.distributed backend: gloo works on CPUs and GPUs, nccl needs one GPU per process"""
    device_ids: list[int] = field(default_factory=list)
    """the GPU of each process on a node, in local-rank order (`0 0 1 1`: two processes per GPU);
    empty: process i uses GPU i, modulo the number of GPUs"""

    # The run: its name, seed and device, logs, checkpoints and evaluation
    exp_name: str = VARIANT
    """the name of this experiment, part of the run name"""
    seed: int = 1
    """seed of the experiment; rank r seeds Python, NumPy and its environments from seed + r"""
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
    """if toggled, record videos of rank 0's first environment to `videos/<run_name>/`"""
    save_model: bool = False
    """if toggled, save runs/<run_name>/checkpoint.pt at the end and when a signal stops the run"""
    save_interval: int = 100
    """with --save-model, also save every this many iterations (0: only at the end)"""
    save_minutes: float = 0.0
    """with --save-model, also save after this many minutes (0: never): what a crash can lose"""
    resume: str | None = None
    """path of a checkpoint to continue training from (the same path on every node); the run keeps
    the checkpoint's settings and needs as many processes as wrote it"""
    trust_old_checkpoint: bool = False
    """if toggled, --resume reads old-format checkpoints, which can run code: only your own files"""
    evaluate: str | None = None
    """path of a checkpoint to evaluate instead of training (in one process, started with python)"""
    eval_episodes: int = 10
    """number of games to play with --evaluate"""

    # Speed: how fast the run goes, never what it learns
    compile: bool = False
    """if toggled, torch.compile the policy step and minibatch loss (pays on a GPU, slow start)"""
    cudagraphs: bool = False
    """if toggled, compile as --compile does and replay both as CUDA graphs (needs CUDA)"""
    async_envs: bool = False
    """if toggled, each process steps its games in worker processes of their own, all at once"""


# --------------------------------------------------------------------------------------------------
# Environments: the Atari preprocessing
# --------------------------------------------------------------------------------------------------


class EpisodicLife(gym.Wrapper):
    """[Atari 3: EpisodicLifeEnv] Losing a life ends the episode for training (terminated=True), so
    the value of the state before a lost life is not bootstrapped from the next life. The game
    itself goes on: after a lost life, reset() takes one no-op step instead of restarting the game,
    and only a game that is really over is reset.

    gymnasium's AtariPreprocessing(terminal_on_life_loss=True) is not the same: its environment is
    then reset by the vector env, so every life would start a new game and the agent would never see
    the later stages of a game."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        # `0 < lives`: the last life's loss is left to the game's own termination, which some games
        # signal a few frames later.
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the game ended during that no-op (practically never)
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """[Atari 4: FireResetEnv] For games that wait for FIRE before they start (Breakout launches its
    ball only then), press FIRE after every reset, including the reset that follows a lost life, and
    then action 2, as the original wrapper does. gymnasium has no such wrapper."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def make_env(env_id: str, idx: int, capture_video: bool, video_folder: str,
             video_episodes: int | None = None):
    """Return a function that builds one preprocessed Atari game; video is recorded from the first
    one only, at the game's full frame rate and in color, one file per real game."""

    def thunk():
        # frameskip=1 for every id: the preprocessing below skips frames itself. ALE/<Game>-v5 would
        # otherwise skip 4 frames per step on its own, and with the 4 below each step would span 16
        # frames. v5's sticky actions (repeat_action_probability=0.25) are kept: they are what the
        # v5 ids stand for. For the published setting use <Game>NoFrameskip-v4, which has none.
        env = gym.make(env_id, frameskip=1,
                       render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:
            env = run_life.record_video(env, video_folder, video_episodes)
        # gymnasium's AtariPreprocessing carries out three of the details as the original wrappers
        # do, with one difference: it max-pools two grayscale frames where the original max-pools
        # two color frames and then converts them. Breakout's observations come out identical; in
        # Pong 0.2% of the pixels differ (tests/test_ppo_atari.py, docs/ppo_atari.md).
        env = gym.wrappers.AtariPreprocessing(
            env,
            # [Atari 1: NoopResetEnv] 1 to 30 no-op frames (random) at the start of each game
            noop_max=30,
            # [Atari 2: MaxAndSkipEnv] repeat each action for 4 frames, sum their rewards
            frame_skip=4,
            # and max-pool the last two frames (Atari draws some sprites only every other frame).
            # [Atari 5: WarpFrame] grayscale, resized to 84x84 with area interpolation
            screen_size=84,
            grayscale_obs=True,
            terminal_on_life_loss=False,  # lives are handled by EpisodicLife below
        )
        # Below EpisodicLife and the reward clipping, this wrapper sees the real game: it adds the
        # game's unclipped score and length to `info` when the game is over, not when a life is
        # lost.
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = EpisodicLife(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)
        # [Atari 6: ClipRewardEnv] the reward's sign: -1, 0 or +1, the same scale for every game.
        # (gymnasium's ClipReward clips to a range; TransformReward with np.sign is the original.)
        env = gym.wrappers.TransformReward(env, np.sign)
        # [Atari 7: FrameStack] the last 4 frames as one (4, 84, 84) observation, so that motion is
        # visible. gymnasium's FrameStackObservation fills the stack with the first frame on reset,
        # as the original does.
        env = gym.wrappers.FrameStackObservation(env, stack_size=4)
        return checkpoints.SavableGame(env)  # saves the game for a checkpoint, where the game runs

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              saved_envs: list | None = None, async_envs: bool = False,
              video_episodes: int | None = None) -> gym.vector.VectorEnv:
    """Build the vector of preprocessed games (from `saved_envs`, the very games a checkpoint
    saved), checking that this script can train on them.

    [Core 1: Vectorized architecture] Each process steps `num_envs` copies of the game in lock step,
    its share of the world's environments, so its rollout holds num_envs x num_steps transitions.

    Autoreset: SAME_STEP, as in ppo.py: the step that ends an episode (here also a lost life) resets
    it, so every stored step is a real transition.

    [Speed: asynchronous environments] With async_envs each game runs in its own worker process and
    all of them step at once; the frames come back through shared memory. The games, their seeds and
    so their frames are the same as in this process: only the time differs.
    """
    check_env_id(env_id)
    env_fns = [make_env(env_id, i, capture_video, video_folder, video_episodes)
               for i in range(num_envs)]
    # the games built anew, then put back where the checkpoint saved them
    if saved_envs is not None:
        env_fns = checkpoints.restored_envs(env_fns, saved_envs)
    if async_envs:
        envs = run_life.async_vector_env(env_fns, prepare_worker)
    else:
        envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    check_spaces(env_id, envs)
    return envs


def prepare_worker() -> None:
    """Ready a worker process of --async-envs before its game is built: OpenCV resizes the frames on
    one thread (the other workers have the other cores), and ale-py prints no banner per game."""
    import cv2  # installed with ale-py: the atari extra holds both

    cv2.setNumThreads(1)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def finished_games(infos: dict) -> list[tuple[int, float, int]]:
    """(env index, score, length) of every game that ended in this step. RecordEpisodeStatistics
    reports a game only when it is really over; the vector env files the report of a step that ended
    an episode under `final_info`."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    return [(int(i), float(final["episode"]["r"][i]), int(final["episode"]["l"][i]))
            for i in np.flatnonzero(final["_episode"])]


# --------------------------------------------------------------------------------------------------
# Agent
# --------------------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """[Core 2: Orthogonal initialization of weights, constant initialization of biases]
    Orthogonal weights scaled by sqrt(2) for the ReLU layers, 0.01 for the policy head so the first
    policy is close to uniform, 1 for the value head; biases 0."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """[Atari 8: Shared Nature-CNN] One convolutional trunk (Mnih et al., 2015) feeds both heads:
    the image features are what both the policy and the value function need, and learning them once
    is cheaper. This replaces [Core 13: Separate MLP networks for policy and value functions] of
    ppo.py."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            # 4 stacked 84x84 frames -> 20x20
            layer_init(nn.Conv2d(4, 32, kernel_size=8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, kernel_size=4, stride=2)),  # -> 9x9
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, kernel_size=3, stride=1)),  # -> 7x7
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        # The convolutions' weights in channels-last layout: the same network, but the layout that
        # PyTorch's CPU convolutions (oneDNN) prefer, and there the update runs about 1.4x faster.
        self.network.to(memory_format=torch.channels_last)
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        # [Atari 9: Scaling the images to [0, 1]] frames are stored as uint8 (a quarter of the
        # memory of float32) and scaled here, inside the network.
        return self.network(obs.float() / 255.0)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs))

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Sample an action (or score a given one): returns action, log-prob, entropy and value."""
        hidden = self.features(obs)
        # The logits come straight from the network, so argument validation would only cost time.
        distribution = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = distribution.sample()
        return action, distribution.log_prob(action), distribution.entropy(), self.critic(hidden)


# --------------------------------------------------------------------------------------------------
# Generalized advantage estimation and the PPO loss
# --------------------------------------------------------------------------------------------------


def compute_gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_value: np.ndarray,
                next_done: np.ndarray, gamma: float,
                gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """[Core 5: Generalized Advantage Estimation] Advantages and value targets of one rollout.

    All arrays are (num_steps, num_envs) except next_value and next_done, (num_envs,), which
    describe the observation after the last step. dones[t] is 1 when obs[t] is the first observation
    of a new episode (here: of a new life), that is, when the step before it ended one: then nothing
    flows back across t. Each rank computes them for its own environments: no episode spans two
    ranks."""
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


def world_mean_and_std(x: torch.Tensor, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and standard deviation of the world's minibatch, all ranks' shares together: what
    x.mean() and x.std() of their concatenation would give. One all-reduce of three numbers, summed
    in float64 so that the shortcut through the sum of squares loses nothing."""
    if world_size == 1:
        return x.mean(), x.std()
    x64 = x.double()
    sums = torch.stack([x64.sum(), (x64 * x64).sum(),
                        torch.tensor(float(x.numel()), device=x.device).double()])
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    total, total_of_squares, count = sums
    mean = total / count
    # Bessel's correction, as x.std()
    variance = (total_of_squares - count * mean * mean) / (count - 1)
    return mean.to(x.dtype), variance.clamp(min=0).sqrt().to(x.dtype)


def ppo_loss(new_logprob: torch.Tensor, entropy: torch.Tensor, new_value: torch.Tensor,
             old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
             returns: torch.Tensor, clip_coef: float,
             args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO objective on this rank's share of one minibatch, with the clipping coefficient of
    this update and its advantages already normalized (by gradient_step); returns the loss to
    minimize and detached statistics. Every term is a mean over the share, so the average of the
    ranks' gradients is the gradient of the same loss over the whole minibatch."""
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()

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

    # [Core 10: Overall loss and entropy bonus] one loss for the shared network and both heads; the
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
    """The network on this rank's share of one minibatch, then the PPO loss: the unit that --compile
    compiles. It talks to no other rank, so it compiles into one graph and records as one CUDA
    graph."""
    _, new_logprob, entropy, new_value = agent.get_action_and_value(obs, actions)
    return ppo_loss(new_logprob, entropy, new_value.flatten(), old_logprob, old_value, advantages,
                    returns, clip_coef, args)


def truncated_value(agent: Agent, infos: dict, truncated: np.ndarray,
                    device: torch.device) -> np.ndarray:
    """[Truncation: bootstrap the value of a time limit's final observation] (--bootstrap-truncated)
    V(final observation) for each game that the time limit cut off, 0 elsewhere.

    A time limit is not a state of the game: it would have gone on, and its score with it. With
    SAME_STEP autoreset the observation the step returned is already the next game's; the one the
    game ended on, its four frames stacked as the agent sees them, is in info["final_obs"]. The
    caller adds gamma x this value to the step's (clipped) reward, so that the step's target is
    r + gamma V(s_final) where GAE, which stops at every episode end, would otherwise take r
    alone."""
    values = np.zeros(len(truncated), dtype=np.float32)
    if truncated.any():
        final_obs = np.stack(infos["final_obs"][truncated])
        with torch.inference_mode():
            final_value = agent.get_value(torch.as_tensor(final_obs, device=device))
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
# Data parallelism: where the ranks talk to each other
# --------------------------------------------------------------------------------------------------


def device_of_this_rank(args: Args, local_rank: int, local_world_size: int) -> torch.device:
    """The device of this process: a GPU from --device-ids (or GPU local_rank, modulo the GPUs there
    are) when CUDA is there and wanted, else the CPU. Refuses settings that cannot work."""
    if args.device_ids and len(args.device_ids) != local_world_size:
        exits.fail(VARIANT, f"--device-ids names {len(args.device_ids)} GPUs for the "
                            f"{local_world_size} processes of this node: give one id per process "
                            f"(torchrun --nproc-per-node {len(args.device_ids)}, or "
                            f"{local_world_size} ids)")
    use_cuda = args.cuda and torch.cuda.is_available()
    if args.backend == "nccl" and not use_cuda:
        why = "--no-cuda was given" if not args.cuda else "no CUDA GPU is available"
        exits.fail(VARIANT, f"--backend nccl needs a CUDA GPU per process, but {why}: use "
                            "--backend gloo")
    if not use_cuda:
        return torch.device("cpu")
    device_ids = args.device_ids or [i % torch.cuda.device_count() for i in range(local_world_size)]
    if max(device_ids) >= torch.cuda.device_count() or min(device_ids) < 0:
        exits.fail(VARIANT, f"--device-ids {' '.join(map(str, device_ids))}: this node has GPUs 0 "
                            f"to {torch.cuda.device_count() - 1}")
    if args.backend == "nccl" and len(set(device_ids)) < len(device_ids):
        exits.fail(VARIANT, "nccl cannot run two processes on one GPU (GPUs "
                            f"{' '.join(map(str, device_ids))}): use --backend gloo to share GPUs, "
                            "or one process per GPU")
    return torch.device("cuda", device_ids[local_rank])


def average_gradients(parameters: list[nn.Parameter], world_size: int) -> None:
    """[Multi-GPU 3: Efficient gradient averaging] Replace every gradient by its mean over the
    ranks, in one all-reduce of one flat vector, not one call per parameter: each call has a fixed
    cost (a round trip between the processes), and this network has 12 parameter tensors."""
    if world_size == 1:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([grad.reshape(-1) for grad in grads])  # flatten...
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)  # ...reduce (gloo has no AVG, so sum and divide)...
    flat /= world_size
    offset = 0
    for grad in grads:  # ...and unflatten, back into each parameter's gradient
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def gradient_step(agent: nn.Module, optimizer: optim.Optimizer, minibatch: tuple[torch.Tensor, ...],
                  clip_coef: float, args: Args, world_size: int,
                  loss_on_minibatch=None) -> dict[str, torch.Tensor]:
    """One optimizer step on this rank's share of a minibatch (obs, actions, log-probs, values,
    advantages, returns). After the gradients' all-reduce every rank holds the same averaged
    gradient, so every rank takes the same step and the copies of the agent stay identical.
    loss_on_minibatch is minibatch_loss or its compiled form; both all-reduces stay outside it."""
    loss_on_minibatch = loss_on_minibatch or minibatch_loss
    obs, actions, old_logprob, old_value, advantages, returns = minibatch
    if args.norm_adv:
        # [Core 7: Normalization of advantages] per minibatch, not per batch. The minibatch is the
        # world's, so the statistics are too: normalizing each share by its own would make two ranks
        # compute a slightly different update than one process on the whole minibatch. Done here, in
        # plain PyTorch, so that no all-reduce lands inside the compiled loss: a CUDA graph cannot
        # hold gloo's, whose reduction runs on the CPU.
        mean, std = world_mean_and_std(advantages, world_size)
        advantages = (advantages - mean) / (std + 1e-8)
    loss, stats = loss_on_minibatch(agent, obs, actions, old_logprob, old_value, advantages,
                                    returns, clip_coef, args)
    optimizer.zero_grad()
    loss.backward()
    average_gradients(list(agent.parameters()), world_size)
    # [Core 11: Global gradient clipping] when the norm of all gradients together exceeds
    # max_grad_norm, all are scaled down alike: one minibatch of extreme advantages or value errors
    # cannot throw the weights far, and the gradient keeps its direction. After the averaging, so
    # all ranks clip the same gradient alike.
    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
    optimizer.step()
    # [Speed: CUDA graphs] the statistics are copied: with --cudagraphs the next replay of the loss
    # writes its outputs where these are, and the caller keeps them.
    return {**{key: value.clone() for key, value in stats.items()}, "grad_norm": grad_norm}


def gather_from_all_ranks(item, world_size: int) -> list:
    """[item of rank 0, item of rank 1, ...] on every rank (any picklable item). Used once per
    iteration for what is logged and for the checkpoint, never per step."""
    if world_size == 1:
        return [item]
    items = [None] * world_size
    dist.all_gather_object(items, item)
    return items


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def episodes_at_start(envs: gym.vector.VectorEnv, checkpoint: dict | None, seed: int, rank: int):
    """Where this rank's games stand as training starts: the next observation, and whether it
    begins an episode (a life). A resumed run goes on with the games it left (`checkpoint`, which
    holds every rank's, and whose games were rebuilt as they were, their statistics with them); a
    new run, or one that starts new games (None), resets the games on `seed`."""
    if checkpoint is not None:
        return checkpoint["next_obs"][rank], checkpoint["next_done"][rank]
    next_obs, _ = envs.reset(seed=seed)
    return next_obs, np.zeros(envs.num_envs, dtype=bool)


def main(args: Args, checkpoint: dict | None = None) -> dict:
    """Train as `args` says, from `checkpoint` (read by parse_args) with --resume; returns a summary
    of the run for callers such as tests."""
    # torchrun tells each process who it is through environment variables. Without torchrun the
    # script is a world of one process.
    rank = int(os.environ.get("RANK", "0"))  # this process among all, on all nodes
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # this process among those of its node
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    # [Multi-GPU 1: Shard the environments] The world's num_envs environments are split evenly
    # between the ranks. Each rank collects and learns from its share, so its batch and minibatches
    # are 1/world_size of those of ppo_atari.py with the same settings; the number of iterations
    # and the global-step increment count the world's steps, so they stay the same.
    check_args(args, world_size)
    local_num_envs = args.num_envs // world_size
    local_batch_size = local_num_envs * args.num_steps
    local_minibatch_size = local_batch_size // args.num_minibatches
    batch_size = local_batch_size * world_size
    num_iterations = args.total_timesteps // batch_size
    device = device_of_this_rank(args, local_rank, local_world_size)
    # One PyTorch thread unless OMP_NUM_THREADS asks for more (torchrun sets it to 1): the
    # environments share the cores with the network, and so do the other ranks of this node.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    check_env_id(args.env_id)
    if checkpoint and checkpoint["world_size"] != world_size:
        exits.fail(VARIANT, f"the checkpoint was written by {checkpoint['world_size']} processes, "
                            f"not {world_size}: resume it with as many (torchrun --nproc-per-node "
                            f"{checkpoint['world_size']} on one node)")
    # [Multi-GPU 2: Adjust seed per process] Each rank draws its actions, its minibatch order and
    # its games from its own seed, so the ranks do not collect the same data; rank r's environments
    # get the seeds seed + r x local_num_envs + i, so the world plays the same games as ppo_atari.py
    # with all the environments in one process. The weights, though, must start identical on every
    # rank, so torch is seeded with the shared seed until the agent is built.
    run = run_life.Run(args, VARIANT, checkpoint, num_iterations, device, rank,
                       seed=args.seed + rank, env_package="ale-py")
    torch.manual_seed(args.seed)

    # A resumed run goes on with the saved environments, the very episodes it left; they cannot
    # record video, so with --capture-video it starts new ones instead (and no longer ends exactly
    # as an unbroken run would).
    records_video = args.capture_video and rank == 0
    saved_envs = checkpoint["envs"][rank] if checkpoint and not records_video else None
    envs = make_envs(args.env_id, local_num_envs, records_video, run.video_folder,
                     saved_envs=saved_envs, async_envs=args.async_envs)
    obs_shape = envs.single_observation_space.shape  # (4, 84, 84)
    agent = Agent(envs.single_action_space.n).to(device)
    # [Multi-GPU 2] the agent is built: from here on, each its own
    torch.manual_seed(args.seed + rank)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8. Adam divides each step by sqrt(v) + eps: the larger eps damps the steps of weights whose
    # gradients are tiny, which Adam would otherwise scale up to full size. fused=True: the same
    # Adam, in one kernel for all parameters instead of a dozen small ops each.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # policy_step (the rollout's call of the agent) and loss_on_minibatch (the update's): the two
    # functions as they are, or [Speed: torch.compile] compiled into a few fused kernels, so that a
    # GPU does not wait for Python to launch many small ones. Both all-reduces (the advantages'
    # statistics and the gradients) stay outside, in gradient_step.
    policy_step, loss_on_minibatch = run_life.compiled(args, agent.get_action_and_value,
                                                       minibatch_loss)

    # Every input has been checked: only now join the others, so a mistake stops every rank the same
    # way instead of leaving some waiting for the rest.
    if world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=args.backend)  # address and rank from torchrun's variables
    # Only rank 0 logs, tracks and records: its logs describe the world. (writer is None elsewhere.)
    writer = run.open_logs(world_size=world_size, batch_size=batch_size,
                           local_batch_size=local_batch_size,
                           local_minibatch_size=local_minibatch_size, num_iterations=num_iterations)

    # This rank's rollout storage, (num_steps, local_num_envs, ...), refilled every iteration.
    # [Speed: one host transfer per step] What the network reads or writes lives on the training
    # device: frames (uint8 until the network scales them), actions, log-probs and values. Rewards
    # and dones come from the games and stay on the host for GAE, whose results go to the device
    # once per iteration.
    obs = torch.zeros((args.num_steps, local_num_envs) + obs_shape, dtype=torch.uint8,
                      device=device)
    actions = torch.zeros((args.num_steps, local_num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, local_num_envs), device=device)
    values = torch.zeros((args.num_steps, local_num_envs), device=device)
    rewards = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)

    # Where the run starts: its iteration and step (0 unless resumed), where each of this rank's
    # games stands (new games begin on seeds of this rank's own, [Multi-GPU 2], that a resumed run
    # has not played yet), and on rank 0 the scores of the world's latest finished games.
    start_iteration, global_step = run.start(agent, optimizer, new_episodes=saved_envs is None)
    next_obs, next_done = episodes_at_start(
        envs, checkpoint if saved_envs is not None else None,
        seed=args.seed + rank * local_num_envs + global_step, rank=rank)
    recent_returns = deque(checkpoint["recent_returns"] if checkpoint else [], maxlen=20)

    for iteration in range(start_iteration + 1, num_iterations + 1):
        # [Core 4: Adam learning rate annealing] linearly from learning_rate toward 0, which the end
        # of the run would reach: the last iteration uses learning_rate / num_iterations.
        # --anneal-clip lowers the clipping coefficient alike.
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in each of this rank's environments with the current policy.
        games = []  # (global step, score, length) of the games that ended on this rank
        for step in range(args.num_steps):
            global_step += local_num_envs * world_size  # [Multi-GPU 1] every rank steps at once
            obs[step] = torch.as_tensor(next_obs, device=device)
            dones[step] = next_done

            # The network runs once per step anyway to choose the action, and its one trunk gives
            # the log-probability and value with it: they are recorded here, on the device
            # (ppo.py's separate critic would cost a second call; it scores the batch later).
            with torch.inference_mode():
                action, logprob, _, value = policy_step(obs[step])
            actions[step], logprobs[step], values[step] = action, logprob, value.flatten()

            # The step's one transfer to the host: the actions, which the games need.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # A lost life (EpisodicLife) or a time-limit truncation ends the episode like a
            # termination...
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = reward  # clipped
            if args.bootstrap_truncated:  # ...unless the run values what the time limit cut off
                cut_off = truncations & ~terminations
                rewards[step] += args.gamma * truncated_value(agent, infos, cut_off, device)
            games += [(global_step, score, length) for _, score, length in finished_games(infos)]
            # within a long rollout too, every few seconds
            run.print_progress(global_step, recent_returns)

        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(next_obs, device=device))
        # GAE runs on the host, in NumPy: one transfer of the rollout's values per iteration.
        host_values = values.cpu().numpy()
        advantages, returns = compute_gae(rewards, host_values, dones,
                                          next_value.cpu().numpy().flatten(), next_done,
                                          args.gamma, args.gae_lambda)

        # Flatten this rank's rollout into its share of the batch: local_num_envs x num_steps
        # transitions.
        # b_ names an array of the whole batch, mb_ one of a minibatch.
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions = actions.reshape(-1)
        b_logprobs = logprobs.reshape(-1)
        b_values = values.reshape(-1)
        b_advantages = torch.as_tensor(advantages.reshape(-1), device=device)
        b_returns = torch.as_tensor(returns.reshape(-1), device=device)

        # [Core 6: Mini-batch updates] several epochs over shuffled minibatches of the batch. Each
        # rank takes local_minibatch_size samples of its own share; together they make a minibatch
        # of the world, and gradient_step averages the ranks' gradients over it.
        b_inds = np.arange(local_batch_size)
        minibatch_stats = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            epoch_inds = torch.from_numpy(b_inds).to(device)
            for start in range(0, local_batch_size, local_minibatch_size):
                mb_inds = epoch_inds[start:start + local_minibatch_size]
                minibatch = (b_obs[mb_inds], b_actions[mb_inds], b_logprobs[mb_inds],
                             b_values[mb_inds], b_advantages[mb_inds], b_returns[mb_inds])
                minibatch_stats.append(gradient_step(agent, optimizer, minibatch, clip_coef, args,
                                                     world_size, loss_on_minibatch))
            if args.target_kl is not None:
                # The ranks must agree to stop, or some would wait forever in the next all-reduce.
                world_kl = minibatch_stats[-1]["approx_kl"].clone()
                if world_size > 1:
                    dist.all_reduce(world_kl, op=dist.ReduceOp.SUM)
                if world_kl.item() / world_size > args.target_kl:
                    break

        # One message from each rank per iteration: its losses, its batch's values and returns, its
        # finished games, and whether it would stop (it was signalled) or save (--save-minutes).
        # Rank 0 logs the world's figures. All ranks stop, or save, as soon as one of them would: a
        # signal that reaches one rank late, or clocks a moment apart, must not split them (a rank
        # that saved alone would wait forever for the others).
        report = {"stats": {key: torch.stack([s[key] for s in minibatch_stats]).mean().item()
                            for key in minibatch_stats[0]},
                  "values": host_values.reshape(-1), "returns": returns.reshape(-1), "games": games,
                  "stop": run.stop_requested, "save": run.save_minutes_passed}
        reports = gather_from_all_ranks(report, world_size)
        run.all_ranks_stop = any(r["stop"] for r in reports)
        run.all_ranks_save = any(r["save"] for r in reports)
        # A NaN or infinity on any rank ends the run here, on every rank alike, in one line.
        run.stop_if_diverged(global_step,
                             {key: np.mean([r["stats"][key] for r in reports])
                              for key in report["stats"]},
                             agent)

        if rank == 0:
            for game_step, score, length in sorted(game for r in reports for game in r["games"]):
                writer.add_scalar("charts/episodic_return", score, game_step)
                writer.add_scalar("charts/episodic_length", length, game_step)
                recent_returns.append(score)
            # [Core 12: Debug variables] averaged over every minibatch of this update, on all ranks.
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl",
                        "clipfrac"):
                writer.add_scalar(f"losses/{key}", np.mean([r["stats"][key] for r in reports]),
                                  global_step)
            writer.add_scalar("losses/explained_variance",
                              explained_variance(np.concatenate([r["values"] for r in reports]),
                                                 np.concatenate([r["returns"] for r in reports])),
                                                 global_step)
            writer.add_scalar("charts/SPS", run.steps_per_second(global_step), global_step)
            run.print_progress(global_step, recent_returns, iteration)

        if run.checkpoint_due(iteration):
            # Every rank's own games and random generators go into the one file that rank 0 writes,
            # so the whole world can resume.
            this_rank = {"rng": checkpoints.rng_state(device), "envs": checkpoints.save_games(envs),
                         "next_obs": next_obs, "next_done": next_done}
            all_ranks = gather_from_all_ranks(this_rank, world_size)
            run.save_checkpoint(iteration, global_step, agent, optimizer, world_size=world_size,
                                recent_returns=list(recent_returns),
                                # one entry per rank
                                **{key: [state[key] for state in all_ranks] for key in this_rank})
        if run.stopping:  # a signal on some rank: this iteration was finished, logged and saved
            break

    envs.close()
    if world_size > 1:
        dist.destroy_process_group()
    run.finish(global_step, how_to_resume="resume with the same launch command and --resume "
                                          f"{run.checkpoint_path}")
    return {"run_name": run.name, "global_step": global_step, "interrupted": run.stopping,
            "rank": rank, "world_size": world_size, "recent_returns": list(recent_returns),
            "agent": agent}


def evaluate(args: Args, checkpoint: dict) -> list[float]:
    """--evaluate: play games with the saved agent, its actions sampled as in training. The games
    run through the training wrappers, so a game lasts all its lives and its score is the real,
    unclipped one. It plays in one process."""
    check_args(args, 1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exits.fail(VARIANT, f"--evaluate plays in one process: run python ppo/{VARIANT}.py "
                            f"--evaluate {args.evaluate}")
    # the device and seeds; prints the scores
    evaluation = run_life.Evaluation(args, VARIANT, checkpoint)
    envs = make_envs(args.env_id, 1, args.capture_video, evaluation.video_folder,
                     video_episodes=args.eval_episodes)
    agent = evaluation.load(Agent(envs.single_action_space.n))
    obs, _ = envs.reset(seed=evaluation.seed)
    while evaluation.playing:
        with torch.inference_mode():
            action, _, _, _ = agent.get_action_and_value(torch.as_tensor(obs,
                                                                         device=evaluation.device))
        obs, _, _, _, infos = envs.step(action.cpu().numpy())
        for _, score, length in finished_games(infos):
            evaluation.episode_ended(score, length)
    envs.close()
    return evaluation.report()


# --------------------------------------------------------------------------------------------------
# The command line: which settings a resumed run may change, and which settings and environments
# make no run at all
# --------------------------------------------------------------------------------------------------

# Settings that may differ between a run and its resumption; every other field must stay the same.
RUNTIME_FIELDS = {"cuda", "track", "wandb_project_name", "wandb_entity", "capture_video",
                  "save_model", "save_interval", "save_minutes", "resume", "evaluate",
                  "eval_episodes", "compile", "cudagraphs", "async_envs", "backend", "device_ids"}
# The training setting an evaluation also reads and may change: the seed of its games.
EVALUATION_FIELDS = {"seed"}


def parse_args(argv: list[str] | None = None) -> tuple[Args, dict | None]:
    """The settings of the command line, and the checkpoint that --resume or --evaluate names."""
    return command_line.parse_args(Args, VARIANT, RUNTIME_FIELDS, EVALUATION_FIELDS, argv,
                                   doc=__doc__)


def check_args(args: Args, world_size: int) -> None:
    """Refuse settings that cannot make a valid run, before any environment is built: first each
    flag on its own, then the sizes that must fit together, also between the `world_size`
    processes."""
    # (flags, what each must be, which values are allowed)
    command_line.check_rules(args, VARIANT, [
        ("env_id", "an Atari id such as BreakoutNoFrameskip-v4", lambda value: value.strip() != ""),
        ("seed", "a whole number from 0 to 2**31 - 1", lambda value: 0 <= value < 2**31),
        ("backend", "gloo or nccl", lambda value: value in ("gloo", "nccl")),
        ("device_ids", "GPU numbers, 0 or more (or none)",
         lambda value: all(i >= 0 for i in value)),
        ("save_interval", "0 (save only at the end) or more", lambda value: value >= 0),
        ("save_minutes", "0 (never save by the clock) or more", lambda value: 0 <= value < np.inf),
        ("eval_episodes total_timesteps num_envs num_steps num_minibatches update_epochs", "at "
                                                                                           "least "
                                                                                           "1",
         lambda value: value >= 1),
        ("learning_rate", "a finite number above 0", lambda value: 0 < value < np.inf),
        ("gamma gae_lambda", "between 0 and 1", lambda value: 0 <= value <= 1),
        ("clip_coef max_grad_norm", "above 0", lambda value: value > 0),
        ("ent_coef vf_coef", "0 or more", lambda value: value >= 0),
        ("target_kl", "above 0 (leave it out to never stop early)",
         lambda value: value is None or value > 0),
    ])
    if args.num_envs % world_size != 0:
        exits.fail(VARIANT, f"--num-envs {args.num_envs} does not split evenly between "
                            f"{world_size} processes: make it a multiple of {world_size} or start "
                            "another number of processes")
    local_batch_size = args.num_envs // world_size * args.num_steps
    if local_batch_size % args.num_minibatches != 0:
        exits.fail(VARIANT, f"each process's share of the batch, --num-envs / {world_size} "
                            f"processes x --num-steps = {local_batch_size}, does not divide into "
                            f"--num-minibatches {args.num_minibatches} equal minibatches: pick "
                            "sizes for which it does")
    batch_size = args.num_envs * args.num_steps
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        exits.fail(VARIANT, f"minibatches of {batch_size // args.num_minibatches} transition "
                            "cannot be normalized (--norm-adv divides by their standard "
                            "deviation): use fewer --num-minibatches or a larger batch")
    if args.total_timesteps < batch_size:
        exits.fail(VARIANT, f"--total-timesteps {args.total_timesteps} is smaller than one batch "
                            f"(--num-envs x --num-steps = {batch_size}): raise it or shrink the "
                            "batch")


def check_env_id(env_id: str) -> None:
    """Refuse, with the script to use instead, an id that is not an ale-py Atari game."""
    if ale_py is None:
        exits.fail(VARIANT, f"{VARIANT}.py needs ale-py and opencv-python: pip install -e "
                            "'.[atari]'")
    gym.register_envs(ale_py)  # ale-py >= 0.9 registers its games only when asked
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game made
    hint = ""
    if env_id.endswith("-v5") and not env_id.startswith("ALE/"):
        hint = (f" (ale-py names it ALE/{env_id}; envpool ids such as {env_id} need "
                "ppo/ppo_atari_envpool.py)")
    spec = command_line.gymnasium_spec(env_id, VARIANT, hint)
    if spec.entry_point != "ale_py.env:AtariEnv":
        exits.fail(VARIANT, f"{env_id} is not an Atari game of ale-py: {VARIANT}.py trains on "
                            "Atari frames only; use ppo/ppo.py for vector observations and "
                            "ppo/ppo_continuous_action.py for Box actions")


def check_spaces(env_id: str, envs: gym.vector.VectorEnv) -> None:
    """Refuse a game whose actions this script cannot take (a continuous-action Atari game)."""
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        envs.close()
        exits.fail(VARIANT, f"{env_id} has a {type(envs.single_action_space).__name__} action "
                            f"space but {VARIANT}.py needs Discrete actions: use "
                            "ppo/ppo_continuous_action.py for Box actions")


if __name__ == "__main__":
    args, checkpoint = parse_args()
    exits.run_and_exit(evaluate if args.evaluate else main, args, checkpoint, VARIANT,
                       pip_extra="atari")
