"""PPO with an LSTM policy for Atari 2600 games through ale-py: BreakoutNoFrameskip-v4, and more.

    python ppo/ppo_atari_lstm.py --env-id BreakoutNoFrameskip-v4    # train (10M steps: hours)
    python ppo/ppo_atari_lstm.py --save-model                        # ... and keep a checkpoint
    python ppo/ppo_atari_lstm.py --resume runs/<run>/checkpoint.pt   # go on after Ctrl-C, a crash
    python ppo/ppo_atari_lstm.py --evaluate runs/<run>/checkpoint.pt # score a saved agent

ppo/ppo_atari.py with memory: it sees one frame at a time, and an LSTM carries what it needs of the
earlier ones; the update replays each environment's whole sequence. The 5 LSTM details are marked
where they happen (1, 2 in the agent, 3 in lstm_with_episode_resets, 4, 5 in the update).
The run around it (its flags, checkpoints, logs and stop signals) comes from the package ppo_utils.
"""

from dataclasses import dataclass
from typing import Annotated, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

from ppo_utils import adam, atari_games, command_line, environments, speed, training
from ppo_utils.evaluation import Evaluation

# names the script in its messages and checkpoints
VARIANT = "ppo_atari_lstm"
# [LSTM 4] a minibatch holds whole environment sequences: some of the environments
WHOLE_SEQUENCES = command_line.Rule("a divisor of --num-envs (a minibatch holds whole sequences)",
                                    lambda value, args: args.num_envs % value == 0, with_args=True)


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
    num_minibatches: Annotated[int, WHOLE_SEQUENCES] = 4
    """the number of minibatches per batch (split by environment: must divide --num-envs)"""
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
        # [Atari 7: FrameStack] with 1 frame: the LSTM remembers the earlier frames instead of a
        # stack of 4; the wrapper only adds the channel axis, (1, 84, 84).
        env = gym.wrappers.FrameStackObservation(env, stack_size=1)
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


def lstm_with_episode_resets(lstm: nn.LSTM, inputs: torch.Tensor, state: tuple,
                             done: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """The LSTM over T steps of E environments (inputs (T, E, features); done (T, E), 1 where step t
    begins an episode), its state reset to zeros where an episode begins: the outputs (T, E, hidden)
    and the state after the last step, as one LSTM call a step would make them. [Speed: the LSTM
    over whole stretches] One call per stretch in which no episode begins, not one a step."""
    num_steps = inputs.shape[0]
    starts = (done[1:].any(dim=1).nonzero().flatten() + 1).tolist() if num_steps > 1 else []
    bounds = [0, *starts, num_steps]  # within each stretch no episode begins after its first step
    outputs = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        # [LSTM 3: Reset LSTM states at the end of the episode] an episode begins from zeros
        keep = (1.0 - done[begin]).view(1, -1, 1)
        output, state = lstm(inputs[begin:end], (keep * state[0], keep * state[1]))
        outputs.append(output)
    return torch.cat(outputs), state


class Agent(nn.Module):
    """[Atari 8: Shared Nature-CNN] One convolutional trunk (Mnih et al., 2015) feeds both heads:
    both the policy and the value need the image's features, and learning them once is cheaper. It
    replaces [Core 13: Separate MLP networks for policy and value functions] of ppo.py."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(1, 32, kernel_size=8, stride=4)),  # one 84x84 frame -> 20x20
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
        self.lstm = nn.LSTM(512, 128)  # after the trunk: both heads read its output
        # [LSTM 1: Layer initialization for LSTM layers] orthogonal weights (gain 1), zero biases.
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(128, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(128, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        # [Atari 9: Scaling the images to [0, 1]] here: stored as uint8, a quarter of float32's size
        return self.network(obs.float() / 255.0)

    def initial_state(self, num_envs: int, device: torch.device) -> tuple:
        # [LSTM 2: Initialize the LSTM states to be zeros] (h, c), each (1, num_envs, 128)
        zeros = torch.zeros(self.lstm.num_layers, num_envs, self.lstm.hidden_size, device=device)
        return zeros, zeros.clone()

    def get_states(self, obs: torch.Tensor, lstm_state: tuple, done: torch.Tensor):
        """The network over T steps of E environments, time-major (step t of environment e at t * E
        + e), from `lstm_state`: the outputs (T * E, 128) and the state after step T."""
        num_envs = lstm_state[0].shape[1]
        hidden = self.features(obs).reshape(-1, num_envs, self.lstm.input_size)
        outputs, lstm_state = lstm_with_episode_resets(self.lstm, hidden, lstm_state,
                                                       done.reshape(-1, num_envs))
        return outputs.flatten(0, 1), lstm_state

    def get_value(self, obs: torch.Tensor, lstm_state: tuple, done: torch.Tensor):
        return self.critic(self.get_states(obs, lstm_state, done)[0])

    @speed.compiled  # with --compile the rollout's step is compiled too; else it runs as written
    def get_action_and_value(self, obs: torch.Tensor, lstm_state: tuple, done: torch.Tensor,
                             action: torch.Tensor | None = None):
        """Sample actions (or score given ones) for a sequence; its LSTM state after it, last."""
        hidden, lstm_state = self.get_states(obs, lstm_state, done)
        # The network's outputs need no argument validation, which would only cost time.
        distribution = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = distribution.sample()
        return (action, distribution.log_prob(action), distribution.entropy(), self.critic(hidden),
                lstm_state)


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
def minibatch_loss(agent: Agent, obs: torch.Tensor, dones: torch.Tensor, actions: torch.Tensor,
                   old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, initial_lstm_state: tuple, clip_coef: float,
                   args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The network on one minibatch, then the PPO loss: the unit --compile compiles. The tensors
    are (num_steps, E) columns of the rollout. [LSTM 5: Reconstruct LSTM states during training]
    The network replays the E environments' whole sequences from their state when the rollout
    began (`initial_lstm_state`): before any update, the rollout's own log-probs and values."""
    _, new_logprob, entropy, new_value, _ = agent.get_action_and_value(
        obs.flatten(0, 1), initial_lstm_state, dones.flatten(), actions.flatten())
    return ppo_loss(new_logprob, entropy, new_value.flatten(), old_logprob.flatten(),
                    old_value.flatten(), advantages.flatten(), returns.flatten(), clip_coef, args)


def truncated_value(agent: Agent, infos: dict, truncated: np.ndarray, lstm_state: tuple,
                    device: torch.device) -> np.ndarray:
    """[Truncation: bootstrap the value of a time limit's final observation] (--bootstrap-truncated)
    V(final observation) where the time limit cut an episode off, 0 elsewhere (info["final_obs"],
    SAME_STEP); the caller adds gamma x it to the step's reward: the target r + gamma V(s_final)."""
    values = np.zeros(len(truncated), dtype=np.float32)
    if truncated.any():
        final_obs = np.stack(infos["final_obs"][truncated])
        games = torch.as_tensor(np.flatnonzero(truncated), device=device)
        state = tuple(part[:, games] for part in lstm_state)  # the memory that led there, not reset
        with torch.no_grad():  # as the rollout: see its comment on inference_mode
            final_value = agent.get_value(torch.as_tensor(final_obs, dtype=torch.float32,
                                                          device=device), state,
                                          torch.zeros(len(games), device=device))
        values[truncated] = final_value.flatten().cpu().numpy()
    return values


def main(args: Args, checkpoint=None) -> dict:
    """Train as `args` says (resumed: from `checkpoint`); returns a summary for callers (tests)."""
    # The run: its flags checked, its device and name (training.Run).
    run = training.Run(args, checkpoint, env_package="ale-py")
    device = run.device
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    envs_per_minibatch = args.num_envs // args.num_minibatches  # [LSTM 4] whole sequences
    num_iterations = args.total_timesteps // batch_size
    # Python's, NumPy's and PyTorch's random generators start from --seed (the environments' below).
    training.seed_everything(args.seed, args.torch_deterministic)

    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     saved_envs=run.saved_envs, async_envs=args.async_envs)
    obs_shape = envs.single_observation_space.shape  # (1, 84, 84)
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
    Rollout = NamedTuple("Rollout", [("next_obs", np.ndarray), ("next_done", np.ndarray),
                                     ("next_lstm_state", tuple)])  # the memory before next_obs
    global_step, rollout = run.start(agent, optimizer, num_iterations, Rollout, envs,
                                     batch_size=batch_size, minibatch_size=minibatch_size)
    next_obs, next_done, next_lstm_state = rollout or (
        envs.reset(seed=args.seed + global_step)[0], np.zeros(args.num_envs, dtype=bool),
        agent.initial_state(args.num_envs, device))

    for iteration in run.iterations():  # resumed: from the checkpoint's; a stop signal ends them
        # [Core 4: Adam learning rate annealing] linearly, 0 just after the last iteration
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every environment with the current policy.
        initial_lstm_state = tuple(part.clone() for part in next_lstm_state)  # the replay's start
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = torch.as_tensor(next_obs, device=device)
            dones[step] = next_done

            # The network runs once a step anyway, and its one trunk gives the log-probability and
            # value with the action: kept on the device (ppo.py's separate critic scores later).
            # no_grad, not inference_mode: CUDA graphs of the compiled heads, first run in inference
            # mode, would fail when the update runs them with gradients (pytorch/pytorch#135892).
            with torch.no_grad():
                action, logprob, _, value, lstm_state = agent.get_action_and_value(
                    obs[step], next_lstm_state, torch.as_tensor(dones[step], device=device))
            actions[step], logprobs[step], values[step] = action, logprob, value.flatten()
            next_lstm_state = tuple(part.clone() for part in lstm_state)  # goes on step to step

            # The step's one transfer to the host: the actions, which the games need.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # A time limit ends the episode like a termination, as in the original PPO...
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = reward
            if args.bootstrap_truncated:  # ...unless the run values what the time limit cut off
                cut_off = truncations & ~terminations
                rewards[step] += args.gamma * truncated_value(agent, infos, cut_off,
                                                              next_lstm_state, device)
            # the episodes that ended, logged with their scores; and the progress line now and then
            run.record_step(global_step, environments.finished_episodes(infos))

        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(next_obs, dtype=torch.float32,
                                                         device=device), next_lstm_state,
                                         torch.as_tensor(next_done, dtype=torch.float32,
                                                         device=device))
        # GAE runs on the host, in NumPy: one transfer of the rollout's values per iteration.
        host_values = values.cpu().numpy()
        advantages, returns = compute_gae(rewards, host_values, dones,
                                          next_value.cpu().numpy().flatten(), next_done,
                                          args.gamma, args.gae_lambda)

        # The batch stays (num_steps, num_envs, ...): whole sequences in its columns (b_, mb_).
        b_obs, b_actions, b_logprobs, b_values = obs, actions, logprobs, values
        b_dones = torch.as_tensor(dones, device=device)
        b_advantages = torch.as_tensor(advantages, device=device)
        b_returns = torch.as_tensor(returns, device=device)

        # [Core 6: Mini-batch updates] several epochs over shuffled minibatches of the batch.
        # [LSTM 4: Prepare sequential rollouts in mini-batches] the environments are shuffled and
        # split, not the transitions: each minibatch holds whole sequences, for the LSTM's replay.
        b_inds = np.arange(args.num_envs)  # the batch's columns, one per environment
        minibatch_stats = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            epoch_inds = torch.from_numpy(b_inds).to(device)
            for start in range(0, args.num_envs, envs_per_minibatch):
                mb_inds = epoch_inds[start:start + envs_per_minibatch]
                mb_lstm_state = tuple(state[:, mb_inds] for state in initial_lstm_state)
                loss, stats = minibatch_loss(agent, b_obs[:, mb_inds], b_dones[:, mb_inds],
                                             b_actions[:, mb_inds], b_logprobs[:, mb_inds],
                                             b_values[:, mb_inds], b_advantages[:, mb_inds],
                                             b_returns[:, mb_inds], mb_lstm_state, clip_coef, args)
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
                          returns.reshape(-1), Rollout(next_obs, next_done, next_lstm_state))

    envs.close()
    return run.finish(global_step, agent=agent)


def evaluate(args: Args, checkpoint) -> list[float]:
    """--evaluate: the saved agent plays whole games, scored with their own rewards."""
    evaluation = Evaluation(args, checkpoint)  # the device and seeds
    envs = make_envs(args.env_id, 1, evaluation.renders, evaluation.video_folder,
                     video_episodes=args.eval_episodes)
    agent = evaluation.load(Agent(envs.single_action_space.n))

    def policy(obs: np.ndarray, done: np.ndarray, lstm_state: tuple):
        # the LSTM state is reset where training resets it (done), at every lost life
        action, _, _, _, lstm_state = agent.get_action_and_value(
            torch.as_tensor(obs, dtype=torch.float32, device=evaluation.device), lstm_state,
            torch.as_tensor(done, dtype=torch.float32, device=evaluation.device))
        return action.cpu().numpy(), lstm_state

    return evaluation.play(envs, policy, state=agent.initial_state(1, evaluation.device))


if __name__ == "__main__":
    command_line.run_script(main, evaluate, Args, __doc__, pip_extra="atari")
