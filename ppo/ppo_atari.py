"""PPO for Atari 2600 games through ale-py: BreakoutNoFrameskip-v4, PongNoFrameskip-v4, ALE/Pong-v5.

    python ppo/ppo_atari.py --env-id BreakoutNoFrameskip-v4    # train (10M steps: hours on a GPU)
    python ppo/ppo_atari.py --save-model                        # ... and keep a checkpoint
    python ppo/ppo_atari.py --resume runs/<run>/checkpoint.pt   # carry on after Ctrl-C or a crash
    python ppo/ppo_atari.py --evaluate runs/<run>/checkpoint.pt # score a saved agent

ppo/ppo.py with what Atari needs: the standard preprocessing wrappers and a shared convolutional
network. The 13 core implementation details of PPO are marked where they happen, as in ppo.py (13
gives way to Atari 8), and so are the 9 Atari details: 1 to 7 in make_env (3 and 4 are the wrappers
of atari_games.py), 8 and 9 in the agent; docs/ppo_atari.md explains each.
The run around it (its flags, checkpoints, logs and stop signals) comes from the package ppo_utils.
"""

from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

from ppo_utils import adam, atari_games, command_line, environments, speed, training
from ppo_utils.evaluation import Evaluation

# names the script in its messages and checkpoints
VARIANT = "ppo_atari"


@command_line.with_run_flags(VARIANT)  # then --seed, --cuda, --track, --save-model, --resume, ...
@dataclass
class Args:
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment: an ale-py game, `<Game>NoFrameskip-v4` or `ALE/<Game>-v5`"""
    total_timesteps: int = 10000000
    """total environment steps of the experiment (each step is 4 frames of the game)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel environments"""
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
    """if toggled, step each game in a worker process of its own, all at once, not one by one"""


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
    """[Core 1: Vectorized architecture] One learner steps `num_envs` copies of the environment in
    lock step, so each rollout holds num_envs x num_steps transitions. Resumed: the very ones a
    checkpoint saved (`saved_envs`). Spaces this script cannot train on are refused. Autoreset is
    SAME_STEP: every step() is a real transition (docs/ppo.md, Episode ends)."""
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
    """The network on one minibatch, then the PPO loss: the unit --compile compiles."""
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


def main(args: Args, checkpoint=None) -> dict:
    """Train as `args` says (resumed: from `checkpoint`); returns a summary for callers (tests)."""
    # The run: its flags checked, its device and name (training.Run).
    run = training.Run(args, checkpoint, env_package="ale-py")
    device = run.device
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # Python's, NumPy's and PyTorch's random generators start from --seed (the environments' below).
    training.seed_everything(args.seed, args.torch_deterministic)

    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     saved_envs=run.saved_envs, async_envs=args.async_envs)
    obs_shape = envs.single_observation_space.shape  # (4, 84, 84)
    agent = Agent(envs.single_action_space.n).to(device)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8: Adam divides each step by sqrt(v) + eps, so the larger eps damps the steps of weights
    # whose tiny gradients it would scale up to full size. fused=True: one kernel for all weights.
    # adam.Adam: torch.optim.Adam's update, bit for bit, 1.1 s faster to start (docs/ppo.md).
    optimizer = adam.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    # Rollout storage, (num_steps, num_envs, ...). [Speed: one host transfer per step] What the
    # network reads or writes stays on its device (frames as uint8); rewards and dones on the host.
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)

    # The run starts: resumed, it takes back its weights, optimizer, random generators and where
    # its rollout stood; otherwise its environments begin new episodes, on seeds no sitting played.
    Rollout = NamedTuple("Rollout", [("next_obs", np.ndarray), ("next_done", np.ndarray)])
    global_step, rollout = run.start(agent, optimizer, num_iterations, Rollout, envs,
                                     batch_size=batch_size, minibatch_size=minibatch_size)
    next_obs, next_done = rollout or (
        envs.reset(seed=args.seed + global_step)[0], np.zeros(args.num_envs, dtype=bool))

    for iteration in run.iterations():  # resumed: from the checkpoint's; a stop signal ends them
        # [Core 4: Adam learning rate annealing] linearly, 0 just after the last iteration
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every environment with the current policy.
        for step in range(args.num_steps):
            global_step += args.num_envs
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
                          returns.reshape(-1), Rollout(next_obs, next_done))

    envs.close()
    return run.finish(global_step, agent=agent)


def evaluate(args: Args, checkpoint) -> list[float]:
    """--evaluate: the saved agent plays whole games, scored with their own rewards."""
    evaluation = Evaluation(args, checkpoint)  # the device and seeds
    envs = make_envs(args.env_id, 1, evaluation.renders, evaluation.video_folder,
                     video_episodes=args.eval_episodes)
    agent = evaluation.load(Agent(envs.single_action_space.n))
    return evaluation.play(envs, lambda obs, _: agent.get_action_and_value(
        torch.as_tensor(obs, dtype=torch.float32, device=evaluation.device))[0].cpu().numpy())


if __name__ == "__main__":
    command_line.run_script(main, evaluate, Args, __doc__, pip_extra="atari")
