"""PPO on Procgen games with the IMPALA CNN: starpilot, bossfight, bigfish and the 13 others.

    python ppo/ppo_procgen.py --env-id starpilot                      # train
    python ppo/ppo_procgen.py --save-model                           # ... and keep a checkpoint
    python ppo/ppo_procgen.py --resume runs/<run>/checkpoint.pt      # go on after Ctrl-C or a crash
    python ppo/ppo_procgen.py --evaluate runs/<run>/checkpoint.pt    # score a saved agent

Procgen comes with the extra: pip install -e ".[procgen]" (OpenAI's procgen, on PyPI as
procgen-mirror). The file follows ppo/ppo_atari.py, its core details marked where they happen as
there, and so are the network, `[Procgen: IMPALA CNN]`, and openai/train-procgen's two settings that
the other scripts lack (Procgen 1 in Args, 2 in RewardScaler); docs/ppo_procgen.md explains each.
The run around it (its flags, checkpoints, logs and stop signals) comes from the package ppo_utils.
"""

from dataclasses import dataclass
from typing import Annotated, NamedTuple

import numpy as np
import torch
import torch.nn as nn
from gymnasium.wrappers.utils import RunningMeanStd
from torch.distributions.categorical import Categorical

from ppo_utils import adam, command_line, environments, procgen_games, speed, training
from ppo_utils.evaluation import Evaluation

# names the script in its messages and checkpoints
VARIANT = "ppo_procgen"

MODES = procgen_games.DISTRIBUTION_MODES
ONE_OF_THE_MODES = command_line.Rule(f"one of {', '.join(MODES)}", lambda value: value in MODES)
LEVELS = command_line.Rule("0 (unlimited levels) or more", lambda value: value >= 0)


@command_line.with_run_flags(VARIANT)  # then --seed, --cuda, --track, --save-model, --resume, ...
@dataclass
class Args:
    env_id: str = "starpilot"
    """the Procgen game: one of the 16, bigfish, bossfight, caveflyer, ..., starpilot"""
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


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              distribution_mode: str = "easy", num_levels: int = 0, start_level: int = 0):
    """[Core 1: Vectorized architecture] One learner steps `num_envs` games in lock step, in
    Procgen's C++ threads, so each rollout holds num_envs x num_steps transitions. Procgen resets a
    finished game within the step that ends it, as SAME_STEP mode does, and its time limits end
    episodes like losses (`terminated`). Games and settings Procgen lacks are refused."""
    procgen_games.check_procgen_id(env_id, distribution_mode, num_levels, start_level)
    return procgen_games.Games(env_id, num_envs, distribution_mode, num_levels, start_level,
                               video_folder if capture_video else None)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """[Core 2: Orthogonal initialization of weights, constant initialization of biases] Orthogonal
    weights for the two heads, 0.01 for the policy (so the first policy is close to uniform) and 1
    for the value. The convolutions and the dense layer keep PyTorch's default initialization, as
    the reference implementation keeps TensorFlow's (openai/train-procgen: Glorot-uniform)."""
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
    16x16 -> 8x8), then ReLU, a 256-unit linear layer and ReLU. It replaces [Core 13: Separate MLP
    networks for policy and value functions]: as in Procgen's code, both heads share the trunk."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            ConvSequence(3, 16),  # 64x64 RGB images -> 32x32
            ConvSequence(16, 32),  # -> 16x16
            ConvSequence(32, 32),  # -> 8x8
            nn.Flatten(),
            nn.ReLU(),
            nn.Linear(32 * 8 * 8, 256),  # PyTorch's default initialization (see layer_init)
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(256, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(256, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Images (N, 64, 64, 3) uint8 -> (N, 256) features, channels first for the convolutions."""
        return self.network(obs.permute(0, 3, 1, 2).float() / 255.0)

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


class RewardScaler:
    """[Procgen 2: Reward scaling and clipping] As openai/train-procgen's VecNormalize does, rewards
    are divided by the running standard deviation of the discounted return (not of the rewards, and
    without subtracting a mean), so the value targets stay in a range the value head learns well in
    every game, whatever its score scale; the rollout then clips them to [-reward_clip,
    reward_clip]. Per game it keeps the return discounted by gamma of the episode so far; a finished
    episode's return restarts at 0."""

    def __init__(self, num_envs: int, gamma: float):
        self.gamma = gamma
        self.return_rms = RunningMeanStd(shape=())
        self.discounted_return = np.zeros(num_envs)

    def scale(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.discounted_return = self.discounted_return * self.gamma + reward
        self.return_rms.update(self.discounted_return)
        self.discounted_return[done] = 0.0
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


def main(args: Args, checkpoint=None) -> dict:
    """Train as `args` says (resumed: from `checkpoint`); returns a summary for callers (tests)."""
    # The run: its flags checked, its device and name (training.Run).
    run = training.Run(args, checkpoint, env_package="procgen-mirror", recent_episodes=100)
    device = run.device
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # Python's, NumPy's and PyTorch's random generators start from --seed (the environments' below).
    training.seed_everything(args.seed, args.torch_deterministic)
    # PyTorch keeps a thread per core for the IMPALA CNN (on a shared machine: OMP_NUM_THREADS=1).

    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     args.distribution_mode, args.num_levels, args.start_level)
    obs_shape = envs.single_observation_space.shape  # (64, 64, 3)
    agent = Agent(envs.single_action_space.n).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
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

    # The run starts: resumed, it takes back its weights, optimizer, random generators and reward
    # statistics. Procgen builds its games anew at a reset (on seeds a resumed run has not played);
    # a resumed run then puts back the episodes it left, unless they were being filmed.
    Rollout = NamedTuple("Rollout", [
        ("next_obs", np.ndarray), ("next_done", np.ndarray), ("discounted_return", np.ndarray),
        ("games", list), ("episode_return", np.ndarray), ("episode_length", np.ndarray)])
    global_step, rollout = run.start(agent, optimizer, num_iterations, Rollout,
                                     statistics={"reward_scaler": reward_scaler.return_rms},
                                     batch_size=batch_size, minibatch_size=minibatch_size)
    next_obs, next_done = envs.reset(seed=args.seed + global_step)[0], np.zeros(args.num_envs, bool)
    if rollout and rollout.games is not None:
        envs.games.set_state(rollout.games)  # the games' full states, random generators included
        (next_obs, next_done, reward_scaler.discounted_return, _, envs.episode_return,
         envs.episode_length) = rollout

    for iteration in run.iterations():  # resumed: from the checkpoint's; a stop signal ends them
        # [Core 4: Adam learning rate annealing] off by default here ([Procgen 1]); when on,
        # linearly from learning_rate toward 0, reached at the run's end; --anneal-clip too.
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
            next_done = np.logical_or(terminations, truncations)
            # [Procgen 2] Rewards scaled by the discounted return's std, clipped to ±reward_clip.
            rewards[step] = np.clip(reward_scaler.scale(reward, next_done), -args.reward_clip,
                                    args.reward_clip)
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
                          returns.reshape(-1), Rollout(  # a recording run's games are not saved
                              next_obs, next_done, reward_scaler.discounted_return,
                              None if args.capture_video else envs.games.get_state(),
                              envs.episode_return, envs.episode_length))

    envs.close()
    return run.finish(global_step, agent=agent, reward_scaler=reward_scaler)


def evaluate(args: Args, checkpoint) -> list[float]:
    """--evaluate: play episodes with the saved agent, its actions sampled as in training. With
    unlimited levels, the evaluation's seeds draw levels the agent most likely never saw."""
    evaluation = Evaluation(args, checkpoint)  # the device and seeds
    envs = make_envs(args.env_id, 1, evaluation.renders, evaluation.video_folder,
                     args.distribution_mode, args.num_levels, args.start_level)
    agent = evaluation.load(Agent(envs.single_action_space.n))
    return evaluation.play(envs, lambda obs, _: agent.get_action_and_value(
        torch.as_tensor(obs, dtype=torch.float32, device=evaluation.device))[0].cpu().numpy())


if __name__ == "__main__":
    command_line.run_script(main, evaluate, Args, __doc__, pip_extra="procgen")
