"""PPO with an LSTM policy for Atari 2600 games through ale-py: BreakoutNoFrameskip-v4, and more.

    python ppo/ppo_atari_lstm.py --env-id BreakoutNoFrameskip-v4    # train (10M steps: hours)
    python ppo/ppo_atari_lstm.py --save-model                        # ... and keep a checkpoint
    python ppo/ppo_atari_lstm.py --resume runs/<run>/checkpoint.pt   # go on after Ctrl-C, a crash
    python ppo/ppo_atari_lstm.py --evaluate runs/<run>/checkpoint.pt # score a saved agent

ppo/ppo_atari.py with memory: the agent sees one frame at a time (no frame stacking) and an LSTM
after the convolutional network carries what it needs from earlier frames. The rollout records the
LSTM state it started from, and training replays each environment's whole sequence from that state.
The 13 core details are marked `[Core N: ...]`, the 9 Atari details `[Atari N: ...]` and the 5 LSTM
details `[LSTM N: ...]`; docs/ppo_atari_lstm.md lists them all. What a run needs beyond PPO comes
from four modules beside this file, one concern each: command_line (flags, --resume and --evaluate),
checkpoints, run_life (logs, progress, stop signals, speed options, evaluation) and exits (exit
codes): copy them along with it.
"""

from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
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

VARIANT = "ppo_atari_lstm"  # written into checkpoints, so another variant's checkpoint is refused


@dataclass
class Args:
    # The algorithm
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
    """number of games to play with --evaluate"""

    # Speed: how fast the run goes, never what it learns
    compile: bool = False
    """if toggled, torch.compile the policy step and minibatch loss (pays on a GPU, slow start)"""
    cudagraphs: bool = False
    """if toggled, compile as --compile does and replay both as CUDA graphs (needs CUDA)"""
    async_envs: bool = False
    """if toggled, step each game in a worker process of its own, all at once, not one by one"""


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
        # [Atari 7: FrameStack] with 1 frame: the LSTM remembers the earlier frames instead of a
        # stack of 4. The wrapper only adds the channel axis, (1, 84, 84), so the network is
        # ppo_atari.py's.
        env = gym.wrappers.FrameStackObservation(env, stack_size=1)
        return checkpoints.SavableGame(env)  # saves the game for a checkpoint, where the game runs

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              saved_envs: list | None = None, async_envs: bool = False,
              video_episodes: int | None = None) -> gym.vector.VectorEnv:
    """Build the vector of preprocessed games (from `saved_envs`, the very games a checkpoint
    saved), checking that this script can train on them.

    [Core 1: Vectorized architecture] One learner steps `num_envs` copies of the game in lock step,
    so each rollout holds num_envs x num_steps transitions.

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


LSTMState = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (1, num_envs, 128)


def lstm_with_episode_resets(lstm: nn.LSTM, inputs: torch.Tensor, state: LSTMState,
                             done: torch.Tensor) -> tuple[torch.Tensor, LSTMState]:
    """The LSTM over T steps of E environments, its state reset to zeros where an episode begins.
    inputs is (T, E, features), done (T, E): done[t] is 1 where step t begins a new episode. Returns
    the outputs (T, E, hidden) and the state after the last step. It computes what this loop does,
    one step at a time (tests/test_ppo_atari_lstm.py checks that the two agree):

        for t in range(T):
            keep = 1 - done[t]                       # 0 where an episode begins
            state = (keep * state[0], keep * state[1])
            outputs[t], state = lstm(inputs[t], state)

    [Speed: the LSTM over whole stretches] It calls the LSTM once per stretch of steps in which no
    environment begins an episode, not once per step: in the update a minibatch's 128 steps take a
    few calls instead of 128. (A one-step sequence, the rollout's, needs no stretches, and so reads
    nothing back from the device here.)"""
    num_steps = inputs.shape[0]
    starts = (done[1:].any(dim=1).nonzero().flatten() + 1).tolist() if num_steps > 1 else []
    bounds = [0, *starts, num_steps]  # within each stretch no episode begins after its first step
    outputs = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        # [LSTM 3: Reset LSTM states at the end of the episode] the state is multiplied by
        # 1 - done, so an environment whose episode begins at the stretch's first step starts
        # it from zeros.
        keep = (1.0 - done[begin]).view(1, -1, 1)
        output, state = lstm(inputs[begin:end], (keep * state[0], keep * state[1]))
        outputs.append(output)
    return torch.cat(outputs), state


class Agent(nn.Module):
    """[Atari 8: Shared Nature-CNN] One convolutional trunk (Mnih et al., 2015), here followed by an
    LSTM, feeds both heads. This replaces [Core 13: Separate MLP networks for policy and value
    functions] of ppo.py."""

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
        self.lstm = nn.LSTM(512, 128)
        # [LSTM 1: Layer initialization for LSTM layers] orthogonal weights (gain 1), zero biases.
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(128, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(128, 1), std=1.0)

    def initial_state(self, num_envs: int, device: torch.device) -> LSTMState:
        # [LSTM 2: Initialize the LSTM states to be zeros]
        zeros = torch.zeros(self.lstm.num_layers, num_envs, self.lstm.hidden_size, device=device)
        return zeros, zeros.clone()

    def get_states(self, obs: torch.Tensor, lstm_state: LSTMState, done: torch.Tensor):
        """Run the network over a sequence of steps of some environments.

        obs is (T * E, 1, 84, 84) and done (T * E,), time-major: step t of environment e at t * E +
        e; lstm_state holds the state of the E environments before step 0. done[t] is 1 where obs[t]
        begins a new episode. Returns the LSTM outputs (T * E, 128) and the state after the last
        step."""
        # [Atari 9: Scaling the images to [0, 1]] frames are stored as uint8 and scaled here.
        hidden = self.network(obs.float() / 255.0)
        num_envs = lstm_state[0].shape[1]
        hidden = hidden.reshape(-1, num_envs, self.lstm.input_size)
        outputs, lstm_state = lstm_with_episode_resets(self.lstm, hidden, lstm_state,
                                                       done.reshape(-1, num_envs))
        return outputs.flatten(0, 1), lstm_state

    def get_value(self, obs: torch.Tensor, lstm_state: LSTMState,
                  done: torch.Tensor) -> torch.Tensor:
        return self.critic(self.get_states(obs, lstm_state, done)[0])

    def get_action_and_value(self, obs: torch.Tensor, lstm_state: LSTMState, done: torch.Tensor,
                             action: torch.Tensor | None = None):
        """Sample actions (or score given ones) for a sequence: returns action, log-prob, entropy,
        value and the LSTM state after the sequence."""
        hidden, lstm_state = self.get_states(obs, lstm_state, done)
        # The logits come straight from the network, so argument validation would only cost time.
        distribution = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = distribution.sample()
        return (action, distribution.log_prob(action), distribution.entropy(), self.critic(hidden),
                lstm_state)


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
    flows back across t."""
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


def minibatch_loss(agent: Agent, obs: torch.Tensor, dones: torch.Tensor, actions: torch.Tensor,
                   old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, initial_lstm_state: LSTMState, clip_coef: float,
                   args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The network on one minibatch, then the PPO loss: the unit --compile compiles. Every tensor is
    (num_steps, E) columns of the rollout, initial_lstm_state the state of those E environments.

    [LSTM 5: Reconstruct LSTM states during training] The rollout's actions are scored again by the
    current network, replaying the E environments' whole sequences from the LSTM state the rollout
    started with; before any update they are the rollout's own log-probs and values."""
    _, new_logprob, entropy, new_value, _ = agent.get_action_and_value(
        obs.flatten(0, 1), initial_lstm_state, dones.flatten(), actions.flatten())
    return ppo_loss(new_logprob, entropy, new_value.flatten(), old_logprob.flatten(),
                    old_value.flatten(), advantages.flatten(), returns.flatten(), clip_coef, args)


def truncated_value(agent: Agent, infos: dict, truncated: np.ndarray, lstm_state: LSTMState,
                    device: torch.device) -> np.ndarray:
    """[Truncation: bootstrap the value of a time limit's final observation] (--bootstrap-truncated)
    V(final observation) for each game that the time limit cut off, 0 elsewhere.

    As in ppo_atari.py, the observation the game ended on is in info["final_obs"] (SAME_STEP
    autoreset). The LSTM's value of it also needs the memory the agent would have had there: the
    state after the step that led to it, `lstm_state`, taken for those games alone, and not reset
    (the episode goes on, as far as the value knows). The caller adds gamma x this value to the
    step's (clipped) reward, so that the step's target is r + gamma V(s_final)."""
    values = np.zeros(len(truncated), dtype=np.float32)
    if truncated.any():
        final_obs = torch.as_tensor(np.stack(infos["final_obs"][truncated]), device=device)
        games = torch.as_tensor(np.flatnonzero(truncated), device=device)
        state = (lstm_state[0][:, games], lstm_state[1][:, games])
        with torch.no_grad():  # as the rollout: see its comment on inference_mode
            final_value = agent.get_value(final_obs, state, torch.zeros(len(games), device=device))
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
                      agent: Agent, device: torch.device):
    """Where the games stand as training starts: the next observation, whether it begins an
    episode (a life), and the LSTM state before it. A resumed run goes on with the games it left
    and the agent's memory of them (`checkpoint`, whose games were rebuilt as they were, their
    statistics with them); a new run, or one that starts new games (None), resets the games on
    `seed`, with an empty memory."""
    if checkpoint is not None:
        next_lstm_state = tuple(state.to(device) for state in checkpoint["next_lstm_state"])
        return checkpoint["next_obs"], checkpoint["next_done"], next_lstm_state
    next_obs, _ = envs.reset(seed=seed)
    return next_obs, np.zeros(envs.num_envs, dtype=bool), agent.initial_state(envs.num_envs, device)


def main(args: Args, checkpoint: dict | None = None) -> dict:
    """Train as `args` says, from `checkpoint` (read by parse_args) with --resume; returns a summary
    of the run for callers such as tests."""
    check_args(args)
    batch_size = args.num_envs * args.num_steps
    envs_per_minibatch = args.num_envs // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # The run: its name and folder, device and seeds, and the releases it records.
    run = run_life.Run(args, VARIANT, checkpoint, num_iterations, env_package="ale-py")
    device = run.device

    # A resumed run goes on with the saved environments, the very episodes it left; they cannot
    # record video, so with --capture-video it starts new ones instead (and no longer ends exactly
    # as an unbroken run would).
    saved_envs = checkpoint["envs"] if checkpoint and not args.capture_video else None
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     saved_envs=saved_envs, async_envs=args.async_envs)
    obs_shape = envs.single_observation_space.shape  # (1, 84, 84)
    agent = Agent(envs.single_action_space.n).to(device)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's
    # 1e-8. Adam divides each step by sqrt(v) + eps: the larger eps damps the steps of weights whose
    # gradients are tiny, which Adam would otherwise scale up to full size. fused=True: the same
    # Adam, in one kernel for all parameters instead of a dozen small ops each.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # policy_step (the rollout's call of the agent) and loss_on_minibatch (the update's): the two
    # functions as they are, or [Speed: torch.compile] compiled into a few fused kernels, so that a
    # GPU does not wait for Python to launch many small ones. The nn.LSTM and its loop over
    # stretches stay plain PyTorch (docs/ppo_atari_lstm.md says why).
    policy_step, loss_on_minibatch = run_life.compiled(args, agent.get_action_and_value,
                                                       minibatch_loss)
    writer = run.open_logs(batch_size=batch_size,
                           minibatch_size=envs_per_minibatch * args.num_steps,
                           num_iterations=num_iterations)

    # Rollout storage, (num_steps, num_envs, ...), refilled every iteration.
    # [Speed: one host transfer per step] What the network reads or writes lives on the training
    # device: frames (uint8 until the network scales them), actions, log-probs and values. Rewards
    # and dones come from the games and stay on the host for GAE, whose results go to the device
    # once per iteration.
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)

    # Where the run starts: its iteration and step (0 unless resumed), where each game stands (new
    # games begin on seeds that a resumed run has not played yet) with the LSTM state before it,
    # and the scores of the latest finished games.
    start_iteration, global_step = run.start(agent, optimizer, new_episodes=saved_envs is None)
    next_obs, next_done, next_lstm_state = episodes_at_start(
        envs, checkpoint if saved_envs is not None else None, seed=args.seed + global_step,
        agent=agent, device=device)
    recent_returns = deque(checkpoint["recent_returns"] if checkpoint else [], maxlen=20)

    for iteration in range(start_iteration + 1, num_iterations + 1):
        # [Core 4: Adam learning rate annealing] linearly from learning_rate toward 0, which the end
        # of the run would reach: the last iteration uses learning_rate / num_iterations.
        # --anneal-clip lowers the clipping coefficient alike.
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every environment with the current policy, carrying the LSTM
        # state from step to step; the state it started from is kept for the update's replay.
        initial_lstm_state = (next_lstm_state[0].clone(), next_lstm_state[1].clone())
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = torch.as_tensor(next_obs, device=device)
            dones[step] = next_done

            # The network runs once per step anyway to choose the action, and its one trunk gives
            # the log-probability and value with it: they are recorded here, on the device
            # (ppo.py's separate critic would cost a second call; it scores the batch later).
            # no_grad, not inference_mode: CUDA graphs of the compiled heads, first run in inference
            # mode, would fail when the update runs them with gradients (pytorch/pytorch#135892).
            with torch.no_grad():
                action, logprob, _, value, lstm_state = policy_step(
                    obs[step], next_lstm_state,
                    torch.as_tensor(next_done, dtype=torch.float32, device=device))
            actions[step], logprobs[step], values[step] = action, logprob, value.flatten()
            next_lstm_state = (lstm_state[0].clone(), lstm_state[1].clone())

            # The step's one transfer to the host: the actions, which the games need.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # A lost life (EpisodicLife) or a time-limit truncation ends the episode like a
            # termination...
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = reward  # clipped
            if args.bootstrap_truncated:  # ...unless the run values what the time limit cut off
                cut_off = truncations & ~terminations
                rewards[step] += args.gamma * truncated_value(agent, infos, cut_off,
                                                              next_lstm_state, device)

            for _, score, length in finished_games(infos):
                writer.add_scalar("charts/episodic_return", score, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
                recent_returns.append(score)
            # within a long rollout too, every few seconds
            run.print_progress(global_step, recent_returns)

        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(next_obs, device=device), next_lstm_state,
                                         torch.as_tensor(next_done, dtype=torch.float32,
                                                         device=device))
        # GAE runs on the host, in NumPy: one transfer of the rollout's values per iteration.
        host_values = values.cpu().numpy()
        advantages, returns = compute_gae(rewards, host_values, dones,
                                          next_value.cpu().numpy().flatten(), next_done,
                                          args.gamma, args.gae_lambda)

        # The batch stays (num_steps, num_envs, ...): a minibatch is a set of columns, whole
        # sequences, so the rollout's tensors are the batch as they are; b_ names an array of the
        # whole batch, mb_ one of a minibatch.
        b_obs, b_actions, b_logprobs, b_values = obs, actions, logprobs, values
        b_dones = torch.as_tensor(dones, device=device)
        b_advantages = torch.as_tensor(advantages, device=device)
        b_returns = torch.as_tensor(returns, device=device)

        # [Core 6: Mini-batch updates] several epochs over shuffled minibatches of the batch.
        # [LSTM 4: Prepare sequential rollouts in mini-batches] the environments, not the single
        # transitions, are shuffled and split: each minibatch holds whole sequences of num_steps
        # steps, in order, so the LSTM can be replayed over them.
        env_inds = np.arange(args.num_envs)
        minibatch_stats = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(env_inds)
            # one copy to the device per epoch
            shuffled_envs = torch.from_numpy(env_inds).to(device)
            for start in range(0, args.num_envs, envs_per_minibatch):
                mb_envs = shuffled_envs[start:start + envs_per_minibatch]
                mb_lstm_state = (initial_lstm_state[0][:, mb_envs],
                                 initial_lstm_state[1][:, mb_envs])
                loss, stats = loss_on_minibatch(agent, b_obs[:, mb_envs], b_dones[:, mb_envs],
                                                b_actions[:, mb_envs], b_logprobs[:, mb_envs],
                                                b_values[:, mb_envs], b_advantages[:, mb_envs],
                                                b_returns[:, mb_envs], mb_lstm_state, clip_coef,
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
            # The LSTM state the next rollout starts from: with the games, it resumes their memory.
            run.save_checkpoint(iteration, global_step, agent, optimizer,
                                envs=checkpoints.save_games(envs), next_obs=next_obs,
                                next_done=next_done, recent_returns=list(recent_returns),
                                next_lstm_state=tuple(state.cpu() for state in next_lstm_state))
        if run.stopping:  # Ctrl-C, kill or Slurm: this iteration was finished, logged and saved
            break

    envs.close()
    run.finish(global_step)
    return {"run_name": run.name, "global_step": global_step, "interrupted": run.stopping,
            "recent_returns": list(recent_returns), "agent": agent}


def evaluate(args: Args, checkpoint: dict) -> list[float]:
    """--evaluate: play games with the saved agent, its actions sampled as in training. The games
    run through the training wrappers, so a game lasts all its lives and its score is the real,
    unclipped one; the LSTM state is reset where training resets it, at every lost life."""
    check_args(args)
    # the device and seeds; prints the scores
    evaluation = run_life.Evaluation(args, VARIANT, checkpoint)
    envs = make_envs(args.env_id, 1, args.capture_video, evaluation.video_folder,
                     video_episodes=args.eval_episodes)
    agent = evaluation.load(Agent(envs.single_action_space.n))
    obs, _ = envs.reset(seed=evaluation.seed)
    done, lstm_state = np.zeros(1, dtype=bool), agent.initial_state(1, evaluation.device)
    while evaluation.playing:
        with torch.inference_mode():
            action, _, _, _, lstm_state = agent.get_action_and_value(
                torch.as_tensor(obs, device=evaluation.device), lstm_state,
                torch.as_tensor(done, dtype=torch.float32, device=evaluation.device))
        obs, _, terminated, truncated, infos = envs.step(action.cpu().numpy())
        done = np.logical_or(terminated, truncated)
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
                  "eval_episodes", "compile", "cudagraphs", "async_envs"}
# The training setting an evaluation also reads and may change: the seed of its games.
EVALUATION_FIELDS = {"seed"}


def parse_args(argv: list[str] | None = None) -> tuple[Args, dict | None]:
    """The settings of the command line, and the checkpoint that --resume or --evaluate names."""
    return command_line.parse_args(Args, VARIANT, RUNTIME_FIELDS, EVALUATION_FIELDS, argv,
                                   doc=__doc__)


def check_args(args: Args) -> None:
    """Refuse settings that cannot make a valid run, before any environment is built: first each
    flag on its own, then the sizes that must fit together."""
    # (flags, what each must be, which values are allowed)
    command_line.check_rules(args, VARIANT, [
        ("env_id", "an Atari id such as BreakoutNoFrameskip-v4", lambda value: value.strip() != ""),
        ("seed", "a whole number from 0 to 2**31 - 1", lambda value: 0 <= value < 2**31),
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
    batch_size = args.num_envs * args.num_steps
    if args.num_envs % args.num_minibatches != 0:
        exits.fail(VARIANT, f"--num-envs {args.num_envs} does not divide into --num-minibatches "
                            f"{args.num_minibatches}: a minibatch holds whole environment "
                            "sequences, so pick a number of envs that is a multiple of it")
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
