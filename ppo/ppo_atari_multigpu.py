"""PPO for Atari trained by several processes at once: data parallelism with torch.distributed.

    torchrun --standalone --nproc-per-node 2 ppo/ppo_atari_multigpu.py --env-id Breakout...-v4
    torchrun --standalone --nproc-per-node 2 ppo/ppo_atari_multigpu.py --backend nccl  # a GPU each
    torchrun --standalone --nproc-per-node 4 ppo/ppo_atari_multigpu.py --device-ids 0 0 1 1
    torchrun --standalone --nproc-per-node 2 ppo/ppo_atari_multigpu.py --resume runs/<run>/...pt
    python ppo/ppo_atari_multigpu.py --evaluate runs/<run>/checkpoint.pt  # one process is enough

ppo/ppo_atari.py with its environments split between N processes (ranks). Each rank collects its
share of the rollout and computes gradients on its share of every minibatch, averaged over the ranks
before each step: every rank applies the same update, as one process with all the environments
would. The 3 data-parallel details are marked where they happen (Multi-GPU 1 and 2 in main, 3 in
average_gradients); docs/ppo_atari_multigpu.md explains each.
The run around it (its flags, checkpoints, logs and stop signals) comes from the package ppo_utils.
"""

import os
from dataclasses import dataclass, field
from typing import Annotated, Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions.categorical import Categorical

from ppo_utils import (adam, atari_games, command_line, environments, exits,
                       ranks, speed, training)
from ppo_utils.evaluation import Evaluation

# names the script in its messages and checkpoints
VARIANT = "ppo_atari_multigpu"
GPU_NUMBERS = command_line.Rule("GPU numbers, 0 or more (or none)",
                                lambda value: all(i >= 0 for i in value))


@command_line.with_run_flags(VARIANT)  # then --seed, --cuda, --track, --save-model, --resume, ...
@dataclass
class Args:
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment: an ale-py game, `<Game>NoFrameskip-v4` or `ALE/<Game>-v5`"""
    total_timesteps: int = 10000000
    """total environment steps of the experiment, over all processes (each step is 4 frames)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """envs over ALL processes, split evenly (CleanRL's current script counts them per process)"""
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
    async_envs: command_line.ResumeMayChange[bool] = False
    """if toggled, each process steps its games in worker processes of their own, all at once"""
    backend: command_line.ResumeMayChange[Literal["gloo", "nccl"]] = "gloo"
    """the torch.distributed backend: gloo works on CPUs and GPUs, nccl needs one GPU per process"""
    device_ids: command_line.ResumeMayChange[Annotated[list[int], GPU_NUMBERS]] = field(
        default_factory=list)
    """each process's GPU on a node, in local-rank order (`0 0 1 1`); empty: process i uses GPU i"""


def make_env(env_id: str, idx: int, capture_video: bool, video_folder: str,
             video_episodes: int | None = None):
    """Return a function that builds one preprocessed Atari game; video is recorded from the first
    one only, at the game's full frame rate and in color, one file per real game."""

    def thunk():
        # settings of the process that makes the game: with --async-envs, a worker of its own
        import ale_py
        import cv2  # installed with ale-py: the atari extra holds both
        cv2.setNumThreads(1)  # the games' worker processes of --async-envs share the cores
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game
        # frameskip=1: the preprocessing below skips frames (ALE/<Game>-v5 would skip 4 more). v5's
        # sticky actions stay, as its ids mean; the published <Game>NoFrameskip-v4 has none.
        env = gym.make(env_id, frameskip=1,
                       render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:
            env = environments.record_video(env, video_folder, video_episodes)
        # gymnasium's AtariPreprocessing carries out three details; it max-pools grayscale frames
        # where the original pools color ones (0.2% of Pong's pixels differ: docs/ppo_atari.md).
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
        # Below EpisodicLife and the reward clipping, this wrapper sees the real game: it reports
        # the game's unclipped score and length when the game is over, not when a life is lost.
        env = gym.wrappers.RecordEpisodeStatistics(env)
        # [Atari 3: EpisodicLifeEnv] a lost life ends the training episode; the game goes on
        env = atari_games.EpisodicLife(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            # [Atari 4: FireResetEnv] FIRE, then action 2, after every reset and lost life
            env = atari_games.FireReset(env)
        # [Atari 6: ClipRewardEnv] the reward's sign, -1, 0 or +1: one scale for every game.
        env = gym.wrappers.TransformReward(env, np.sign)
        # [Atari 7: FrameStack] the last 4 frames as one (4, 84, 84) observation, so that motion is
        # visible; on reset the stack is filled with the first frame, as the original does.
        env = gym.wrappers.FrameStackObservation(env, stack_size=4)
        return atari_games.SavableGame(env)  # saves the game for a checkpoint, where the game runs

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              saved_envs: list | None = None, async_envs: bool = False,
              video_episodes: int | None = None) -> gym.vector.VectorEnv:
    """[Core 1: Vectorized architecture] Each process steps `num_envs` copies of the environment in
    lock step (its share of the world's), so its rollout holds num_envs x num_steps transitions.
    Resumed: the very ones a checkpoint saved (`saved_envs`). Spaces this script cannot train on
    are refused. Autoreset is SAME_STEP: every step() is a real transition (docs/ppo.md)."""
    atari_games.check_atari_id(env_id)
    # [Speed: asynchronous environments] async_envs: each game in a worker process, all at once
    envs = environments.vector_env([make_env(env_id, i, capture_video, video_folder, video_episodes)
                                    for i in range(num_envs)], env_id, saved_envs, async_envs)
    return envs


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """[Core 2: Orthogonal initialization of weights, constant initialization of biases] Gain
    sqrt(2) for the hidden layers, 0.01 for the policy head (near-uniform first choices, means near
    0), 1 for the value head; biases 0."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """[Atari 8: Shared Nature-CNN] One convolutional trunk (Mnih et al., 2015) feeds both heads:
    both the policy and the value need the image's features, and learning them once is cheaper. It
    replaces [Core 13: Separate MLP networks for policy and value functions] of ppo.py."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, kernel_size=8, stride=4)),  # 4 frames of 84x84 -> 20x20
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
        # [Atari 9: Scaling the images to [0, 1]] here: stored as uint8, a quarter of float32's size
        return self.network(obs.float() / 255.0)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs))

    @speed.compiled  # with --compile the rollout's step is compiled too; else it runs as written
    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Sample an action (or score a given one): returns action, log-prob, entropy and value."""
        hidden = self.features(obs)
        # The network's outputs need no argument validation, which would only cost time.
        distribution = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = distribution.sample()
        return action, distribution.log_prob(action), distribution.entropy(), self.critic(hidden)


def compute_gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_value: np.ndarray,
                next_done: np.ndarray, gamma: float,
                gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """[Core 5: Generalized Advantage Estimation] Advantages and value targets of one rollout. The
    arrays are (num_steps, num_envs), next_value and next_done (num_envs,): the observation after
    the last step. dones[t] = 1 where obs[t] begins an episode, so nothing flows back across t.
    Each rank computes them for its own environments: no episode spans two ranks."""
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
    """x.mean() and x.std() of all ranks' shares together: one all-reduce of three numbers, in
    float64 so that the sum of squares loses nothing."""
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
             returns: torch.Tensor, clip_coef: float, args: Args) -> tuple[torch.Tensor, dict]:
    """The PPO objective on this rank's share of one minibatch (advantages normalized already): the
    ranks' averaged gradients are the whole minibatch's."""
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


@speed.compiled  # [Speed: torch.compile] with --compile, fused into a few kernels
def minibatch_loss(agent: Agent, obs: torch.Tensor, actions: torch.Tensor,
                   old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, clip_coef: float,
                   args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The network on this rank's share of one minibatch, then the PPO loss: the unit --compile
    compiles, into one graph, since it talks to no other rank."""
    _, new_logprob, entropy, new_value = agent.get_action_and_value(obs, actions)
    return ppo_loss(new_logprob, entropy, new_value.flatten(), old_logprob, old_value, advantages,
                    returns, clip_coef, args)


def truncated_value(agent: Agent, infos: dict, truncated: np.ndarray,
                    device: torch.device) -> np.ndarray:
    """[Truncation: bootstrap the value of a time limit's final observation] (--bootstrap-truncated)
    V(final observation) where the time limit cut an episode off, 0 elsewhere (info["final_obs"],
    SAME_STEP); the caller adds gamma x it to the step's reward: the target r + gamma V(s_final)."""
    values = np.zeros(len(truncated), dtype=np.float32)
    if truncated.any():
        final_obs = np.stack(infos["final_obs"][truncated])
        with torch.inference_mode():
            final_value = agent.get_value(torch.as_tensor(final_obs, dtype=torch.float32,
                                                          device=device))
        values[truncated] = final_value.flatten().cpu().numpy()
    return values


def average_gradients(parameters: list[nn.Parameter], world_size: int) -> None:
    """[Multi-GPU 3: Efficient gradient averaging] Every gradient replaced by its mean over the
    ranks, in one all-reduce of one flat vector, not one round trip per tensor (12 here)."""
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


def gradient_step(agent: nn.Module, optimizer: adam.Adam, minibatch: tuple[torch.Tensor, ...],
                  clip_coef: float, args: Args, world_size: int) -> dict[str, torch.Tensor]:
    """One optimizer step on this rank's share of a minibatch. Every rank takes the same step, on
    the same averaged gradient: the copies of the agent stay identical."""
    obs, actions, old_logprob, old_value, advantages, returns = minibatch
    if args.norm_adv:
        # [Core 7: Normalization of advantages] per minibatch, by the world's statistics as one
        # process would; outside the compiled loss: a CUDA graph cannot hold gloo's all-reduce.
        mean, std = world_mean_and_std(advantages, world_size)
        advantages = (advantages - mean) / (std + 1e-8)
    loss, stats = minibatch_loss(agent, obs, actions, old_logprob, old_value, advantages, returns,
                                 clip_coef, args)
    optimizer.zero_grad()
    loss.backward()
    average_gradients(list(agent.parameters()), world_size)
    # [Core 11: Global gradient clipping] all gradients scaled down alike when their norm exceeds
    # max_grad_norm: one extreme minibatch cannot throw the weights far (every rank's the same).
    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
    optimizer.step()
    # [Speed: CUDA graphs] copies: --cudagraphs' next replay writes where these are
    return {**{key: value.clone() for key, value in stats.items()}, "grad_norm": grad_norm}


def main(args: Args, checkpoint=None) -> dict:
    """Train as `args` says (resumed: from `checkpoint`); returns a summary for callers (tests)."""
    # The run, in torchrun's world: rank `rank` of `world_size` (rank 0 logs and saves for all).
    run = training.Run(args, checkpoint, env_package="ale-py", world=ranks.World)
    device, rank, world_size = run.device, run.world.rank, run.world.world_size
    # [Multi-GPU 1: Shard the environments] The world's num_envs are split evenly between the
    # ranks: each collects and learns from its share, 1/world_size of ppo_atari.py's batch and
    # minibatches; the iterations and the global step count the world's steps.
    local_num_envs = args.num_envs // world_size
    local_batch_size = local_num_envs * args.num_steps
    local_minibatch_size = local_batch_size // args.num_minibatches
    batch_size = local_batch_size * world_size
    num_iterations = args.total_timesteps // batch_size
    # One PyTorch thread unless OMP_NUM_THREADS asks for more (torchrun sets it to 1): the
    # environments share the cores with the network, and so do the other ranks of this node.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    # [Multi-GPU 2: Adjust seed per process] Each rank draws its actions, minibatch order and games
    # from its own seed, rank r's environments seed + r x local_num_envs + i (ppo_atari.py's games).
    # The weights must start identical on every rank: the shared seed until the agent is built.
    training.seed_everything(args.seed + rank, args.torch_deterministic)
    torch.manual_seed(args.seed)

    envs = make_envs(args.env_id, local_num_envs, args.capture_video and rank == 0,
                     run.video_folder, saved_envs=run.saved_envs, async_envs=args.async_envs)
    obs_shape = envs.single_observation_space.shape  # (4, 84, 84)
    agent = Agent(envs.single_action_space.n).to(device)
    torch.manual_seed(args.seed + rank)  # [Multi-GPU 2] the agent is built: now each its own seed
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8: Adam divides each step by sqrt(v) + eps, so the larger eps damps the steps of weights
    # whose tiny gradients it would scale up to full size. fused=True: one kernel for all weights.
    # adam.Adam: torch.optim.Adam's update, bit for bit, 1.1 s faster to start (docs/ppo.md).
    optimizer = adam.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # Every input checked, join the others: a mistake stops every rank alike, none left waiting.
    if world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=args.backend)  # address and rank from torchrun's variables

    # Rollout storage, this rank's share. [Speed: one host transfer per step] What the
    # network reads or writes stays on its device (frames as uint8); rewards and dones on the host.
    obs = torch.zeros((args.num_steps, local_num_envs) + obs_shape, dtype=torch.uint8,
                      device=device)
    actions = torch.zeros((args.num_steps, local_num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, local_num_envs), device=device)
    values = torch.zeros((args.num_steps, local_num_envs), device=device)
    rewards = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)

    # The run starts: resumed, it takes back its weights, optimizer, random generators and where
    # its rollout stood; otherwise its environments begin new episodes, on seeds no sitting played.
    Rollout = NamedTuple("Rollout", [("next_obs", np.ndarray), ("next_done", np.ndarray)])
    global_step, rollout = run.start(agent, optimizer, num_iterations, Rollout, envs,
                                     world_size=world_size, batch_size=batch_size,
                                     local_batch_size=local_batch_size,
                                     local_minibatch_size=local_minibatch_size)
    next_obs, next_done = rollout or (
        envs.reset(seed=args.seed + rank * local_num_envs + global_step)[0],
        np.zeros(local_num_envs, dtype=bool))

    for iteration in run.iterations():  # resumed: from the checkpoint's; a stop signal ends them
        # [Core 4: Adam learning rate annealing] linearly, 0 just after the last iteration
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in each of this rank's environments with the current policy.
        for step in range(args.num_steps):
            global_step += local_num_envs * world_size  # [Multi-GPU 1] every rank steps at once
            obs[step] = torch.as_tensor(next_obs, device=device)
            dones[step] = next_done

            # The network runs once a step anyway, and its one trunk gives the log-probability and
            # value with the action: kept on the device (ppo.py's separate critic scores later).
            with torch.inference_mode():
                action, logprob, _, value = agent.get_action_and_value(obs[step])
            actions[step], logprobs[step], values[step] = action, logprob, value.flatten()

            # The step's one transfer to the host: the actions, which the games need.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # A time limit ends the episode like a termination, as in the original PPO...
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = reward
            if args.bootstrap_truncated:  # ...unless the run values what the time limit cut off
                cut_off = truncations & ~terminations
                rewards[step] += args.gamma * truncated_value(agent, infos, cut_off, device)
            # the episodes that ended, logged with their scores; and the progress line now and then
            run.record_step(global_step, environments.finished_episodes(infos))

        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(next_obs, dtype=torch.float32,
                                                         device=device))
        # GAE runs on the host, in NumPy: one transfer of the rollout's values per iteration.
        host_values = values.cpu().numpy()
        advantages, returns = compute_gae(rewards, host_values, dones,
                                          next_value.cpu().numpy().flatten(), next_done,
                                          args.gamma, args.gae_lambda)

        # The rollout as one batch of num_envs x num_steps (b_: the batch's, mb_: a minibatch's).
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions = actions.reshape(-1)
        b_logprobs = logprobs.reshape(-1)
        b_values = values.reshape(-1)
        b_advantages = torch.as_tensor(advantages.reshape(-1), device=device)
        b_returns = torch.as_tensor(returns.reshape(-1), device=device)

        # [Core 6: Mini-batch updates] several epochs over shuffled minibatches of the batch. Each
        # rank takes local_minibatch_size samples of its share: together, a minibatch of the world,
        # and gradient_step averages the ranks' gradients over it.
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
                                                     world_size))
            if args.target_kl is not None:
                # The ranks must agree to stop, or some would wait forever in the next all-reduce.
                world_kl = minibatch_stats[-1]["approx_kl"].clone()
                if world_size > 1:
                    dist.all_reduce(world_kl, op=dist.ReduceOp.SUM)
                if world_kl.item() / world_size > args.target_kl:
                    break

        # [Core 12: Debug variables] averaged over this update's minibatches. The run logs them with
        # the values' explained variance (a NaN stops it) and saves a checkpoint when one is due.
        # All ranks at once: rank 0 logs the world's figures; the checkpoint holds each rank's.
        means = {key: torch.stack([s[key] for s in minibatch_stats]).mean().item()
                 for key in minibatch_stats[0]}
        run.end_iteration(iteration, global_step, means, host_values.reshape(-1),
                          returns.reshape(-1), Rollout(next_obs, next_done))

    envs.close()
    if world_size > 1:
        dist.destroy_process_group()
    return run.finish(global_step, agent=agent, rank=rank, world_size=world_size)


def evaluate(args: Args, checkpoint) -> list[float]:
    """--evaluate: play episodes with the saved agent, its actions sampled as in training. An
    episode is a whole game, scored with the game's own rewards (RecordEpisodeStatistics). It plays
    in one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise exits.WrongInput(f"--evaluate plays in one process: run python ppo/{VARIANT}.py "
                               f"--evaluate {args.evaluate}")
    evaluation = Evaluation(args, checkpoint)  # the device and seeds
    envs = make_envs(args.env_id, 1, evaluation.renders, evaluation.video_folder,
                     video_episodes=args.eval_episodes)
    agent = evaluation.load(Agent(envs.single_action_space.n))
    return evaluation.play(envs, lambda obs, _: agent.get_action_and_value(
        torch.as_tensor(obs, dtype=torch.float32, device=evaluation.device))[0].cpu().numpy())


if __name__ == "__main__":
    command_line.run_script(main, evaluate, Args, __doc__, pip_extra="atari")
