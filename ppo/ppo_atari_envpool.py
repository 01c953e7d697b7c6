"""PPO for Atari 2600 games through envpool, the fast variant: Breakout-v5, Pong-v5, BeamRider-v5.

    python ppo/ppo_atari_envpool.py --env-id Breakout-v5             # train (10M steps)
    python ppo/ppo_atari_envpool.py --save-model                      # ... and keep a checkpoint
    python ppo/ppo_atari_envpool.py --resume runs/<run>/checkpoint.pt # go on after Ctrl-C, a crash
    python ppo/ppo_atari_envpool.py --evaluate runs/<run>/checkpoint.pt

ppo/ppo_atari.py with the games run by envpool, whose C++ threads step them and do the whole Atari
preprocessing: one Python call per step. What changes is how episodes end: envpool resets a finished
environment on the *next* step, spent on the reset (its action is ignored) and kept out of training.
The 13 core and 9 Atari details are marked where they happen, as in ppo_atari.py (1 to 7 in
make_envs); docs/ppo_atari_envpool.md explains each. Works with envpool 1.0.x and 1.2.x.
The run around it (its flags, checkpoints, logs and stop signals) comes from the package ppo_utils.
"""

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

from ppo_utils import adam, command_line, environments, envpool_games, envpool_ids, speed, training
from ppo_utils.evaluation import Evaluation

# names the script in its messages and checkpoints
VARIANT = "ppo_atari_envpool"
# [Speed: asynchronous environments] --async-envs splits the games into two equal envpools
EVEN_WITH_ASYNC = command_line.Rule("even with --async-envs, which splits the games into two "
                                    "equal envpools", lambda value, args: not args.async_envs
                                    or value % 2 == 0, with_args=True)


@command_line.with_run_flags(VARIANT)  # then --seed, --cuda, --track, --save-model, --resume, ...
@dataclass
class Args:
    env_id: str = "Breakout-v5"
    """the id of the environment: an envpool Atari game, `<Game>-v5`"""
    total_timesteps: int = 10000000
    """total environment steps of the experiment (each step is 4 frames of the game)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: Annotated[int, EVEN_WITH_ASYNC] = 8
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
    """if toggled, two envpools: one plays its step while the network picks the other's actions"""


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              seed: int = 0, async_envs: bool = False) -> envpool_games.Games:
    """[Core 1: Vectorized architecture] One learner steps `num_envs` copies of the environment in
    lock step, so each rollout holds num_envs x num_steps transitions: here one envpool (two halves
    with async_envs), game i seeded seed + i; ids of other tasks than Atari's games are refused.

    envpool steps them on its own threads and carries out ppo_atari.py's wrappers in C++
    (docs/ppo_atari_envpool.md lists the small ways in which they differ). The settings are spelled
    out, most of them envpool's defaults, to show which detail each one carries out. Its autoreset
    is described in main(); envpool_games reports the games' scores and films them."""
    envpool_ids.check_envpool_id(env_id, kinds=("AtariEnvSpec",), example="Breakout-v5")
    import envpool  # installed: the id was found in it

    # [Speed: asynchronous environments] async_envs: two envpools, one playing as the network works
    pool_size = num_envs // 2 if async_envs else num_envs
    pools = [envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=pool_size,
        # game i plays seed + i, in 32 bits (a resumed run's or an evaluation's seed may pass 2**31)
        seed=(seed + first) % 2**31,
        # [Atari 1: NoopResetEnv] 1-30 random no-ops at a reset (FIRE games: 0-29, then FIRE)
        noop_max=30,
        # [Atari 2: MaxAndSkipEnv] each action for 4 frames; the last two are max-pooled
        frame_skip=4,
        # [Atari 3: EpisodicLifeEnv] a lost life ends the training episode; the game goes on
        episodic_life=True,
        # [Atari 4: FireResetEnv] FIRE after a reset, for games that wait for it
        use_fire_reset=True,
        img_height=84,  # [Atari 5: WarpFrame] 84x84 grayscale, resized with area interpolation
        img_width=84,
        gray_scale=True,
        # [Atari 6: ClipRewardEnv] the reward's sign, -1, 0 or +1: one scale for every game.
        reward_clip=True,  # (info["reward"] keeps the unclipped one, the game's score)
        # [Atari 7: FrameStack] the last 4 frames as one (4, 84, 84) observation, so that motion is
        # visible; on reset the stack is filled with the first frame, as the original does.
        stack_num=4,
        repeat_action_probability=0.0,  # no sticky actions, as in the NoFrameskip-v4 games
        max_episode_steps=27000,  # 108,000 frames, as ALE's v4 and v5 games
        **({"render_mode": "rgb_array"} if capture_video and first == 0 else {}),
    ) for first in range(0, num_envs, pool_size)]
    return envpool_games.Games(pools, seed, video_folder if capture_video else None)


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

    # (Without the reset steps, a tiny minibatch may keep one transition: no spread to divide by.)
    if args.norm_adv and len(advantages) > 1:
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
    V(final observation) for each environment whose episode the time limit cut off (the episode
    would have gone on), 0 elsewhere; info["final_obs"] holds that observation (Games). The
    caller adds gamma x this value to the step's reward: its target is r + gamma V(s_final)."""
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
    run = training.Run(args, checkpoint, env_package="envpool")
    device = run.device
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # Python's, NumPy's and PyTorch's random generators start from --seed (the environments' below).
    training.seed_everything(args.seed, args.torch_deterministic)

    # envpool is seeded when it is made and cannot save its games: a resumed run plays new ones,
    # seeded by where it resumes so that it does not replay the games it began with.
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.video_folder,
                     seed=args.seed + run.resumed_at, async_envs=args.async_envs)
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

    # The run starts: resumed, it takes back its weights, optimizer and random generators; not the
    # games, which envpool cannot save (see above).
    global_step, _ = run.start(agent, optimizer, num_iterations,
                               batch_size=batch_size, minibatch_size=minibatch_size)
    # The games' latest observations, waiting for the network. On a GPU machine they are kept in
    # page-locked ("pinned") memory, which the GPU copies from directly and without blocking.
    next_obs_pinned = torch.zeros((args.num_envs,) + obs_shape, dtype=torch.uint8,
                                  pin_memory=device.type == "cuda")
    next_obs = next_obs_pinned.numpy()  # the same memory, for NumPy
    next_obs[:] = envs.reset()[0]
    next_done = np.zeros(args.num_envs, dtype=bool)

    for iteration in run.iterations():  # resumed: from the checkpoint's; a stop signal ends them
        # [Core 4: Adam learning rate annealing] linearly, 0 just after the last iteration
        fraction_left = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = fraction_left * args.learning_rate
        clip_coef = fraction_left * args.clip_coef if args.anneal_clip else args.clip_coef

        # Rollout: num_steps steps in every environment with the current policy.
        # [Speed: asynchronous environments] With --async-envs the games are in two envpools: while
        # one plays its step, the network picks the other's actions. Each pool is sent its actions,
        # and its results are received on its next turn, just before the network needs them (the
        # last step's in an extra turn). Nothing loops over games: envpool steps a pool in one call.
        for step in range(args.num_steps + 1):
            for pool, games in enumerate(envs.pool_games):
                if step > 0:  # what the pool returns for its step `step - 1`
                    next_obs[games], reward, terminations, truncations, infos = envs.recv(pool)
                    global_step += len(reward)
                    # A lost life or a time limit ends the episode like a termination...
                    next_done[games] = terminations | truncations
                    rewards[step - 1, games] = reward  # clipped
                    if args.bootstrap_truncated:  # ...unless the run values what the limit cut off
                        cut_off = truncations & ~terminations
                        rewards[step - 1, games] += args.gamma * truncated_value(agent, infos,
                                                                                 cut_off, device)
                    # the games that ended, logged with their scores; and the progress line
                    run.record_step(global_step, environments.finished_episodes(infos))
                if step == args.num_steps:  # every pool has played the rollout's last step
                    continue
                # non_blocking: the copy may overlap the network's start; it is done once
                # action.cpu() below returns, before the next recv() overwrites next_obs.
                obs[step, games].copy_(next_obs_pinned[games], non_blocking=True)
                dones[step, games] = next_done[games]
                # The network runs once a step anyway; its one trunk gives the log-probability and
                # value with the action, kept on the device (ppo.py's separate critic scores later).
                with torch.inference_mode():
                    action, logprob, _, value = agent.get_action_and_value(obs[step, games])
                actions[step, games], logprobs[step, games] = action, logprob
                values[step, games] = value.flatten()
                envs.send(action.cpu().numpy(), pool)  # the one copy to the host

        with torch.no_grad():
            next_value = agent.get_value(next_obs_pinned.to(device))
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
        # envpool's autoreset: the step after an episode ended (a lost life or the game's end) only
        # resets that environment; envpool ignores the action it is given and returns the first
        # observation of the next episode with reward 0. Those are exactly the steps whose dones[t]
        # is 1, and they leave the batch: no action was taken there. GAE needs nothing more:
        # dones[t] = 1 already stops the step before it from bootstrapping, as at any episode's end.
        acted_steps = np.flatnonzero(dones.reshape(-1) == 0)
        acted = torch.as_tensor(acted_steps, device=device)
        b_obs, b_actions, b_logprobs, b_values, b_advantages, b_returns = (
            b[acted] for b in (b_obs, b_actions, b_logprobs, b_values, b_advantages, b_returns))

        # [Core 6: Mini-batch updates] several epochs over shuffled minibatches of the batch.
        b_inds = np.arange(len(acted_steps))
        # Without the reset steps, minibatches differ in size by one at most; tiny ones are fewer.
        num_minibatches = min(args.num_minibatches, len(acted_steps))
        minibatch_stats = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            epoch_inds = torch.from_numpy(b_inds).to(device)
            for mb_inds in torch.tensor_split(epoch_inds, num_minibatches):
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
        # the acted steps' explained variance (a NaN stops it) and saves a checkpoint when due.
        means = {key: torch.stack([s[key] for s in minibatch_stats]).mean().item()
                 for key in minibatch_stats[0]}
        run.end_iteration(iteration, global_step, means, host_values.reshape(-1)[acted_steps],
                          returns.reshape(-1)[acted_steps])

    envs.close()
    return run.finish(global_step, agent=agent)


def evaluate(args: Args, checkpoint) -> list[float]:
    """--evaluate: play episodes with the saved agent, its actions sampled as in training. An
    episode is a whole game, scored with the sum of envpool's unclipped rewards over its lives."""
    evaluation = Evaluation(args, checkpoint)  # the device and seeds
    envs = make_envs(args.env_id, 1, evaluation.renders, evaluation.video_folder,
                     seed=evaluation.seed)
    agent = evaluation.load(Agent(envs.single_action_space.n))
    return evaluation.play(envs, lambda obs, _: agent.get_action_and_value(
        torch.as_tensor(obs, dtype=torch.float32, device=evaluation.device))[0].cpu().numpy())


if __name__ == "__main__":
    command_line.run_script(main, evaluate, Args, __doc__, pip_extra="envpool")
