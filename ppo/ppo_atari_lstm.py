"""PPO with an LSTM policy for Atari 2600 games through ale-py: BreakoutNoFrameskip-v4, PongNoFrameskip-v4, ...

    python ppo/ppo_atari_lstm.py --env-id BreakoutNoFrameskip-v4    # train (10M steps: hours on a GPU)
    python ppo/ppo_atari_lstm.py --save-model                        # ... and keep a checkpoint
    python ppo/ppo_atari_lstm.py --resume runs/<run>/checkpoint.pt   # carry on after Ctrl-C or a crash
    python ppo/ppo_atari_lstm.py --evaluate runs/<run>/checkpoint.pt # score a saved agent

ppo/ppo_atari.py with memory: the agent sees one frame at a time (no frame stacking) and an LSTM after
the convolutional network carries what it needs from earlier frames. The rollout records the LSTM
state it started from, and training replays each environment's whole sequence from that state.
The 13 core details are marked `[Core N: ...]`, the 9 Atari details `[Atari N: ...]` and the 5 LSTM
details `[LSTM N: ...]`; docs/ppo_atari_lstm.md lists them all.
"""

import functools
import os
import pickle
import random
import signal
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, fields, replace
from typing import NoReturn

import cloudpickle
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

try:
    import ale_py
except ImportError:  # reported with the command that installs it when an environment is made
    ale_py = None

VARIANT = "ppo_atari_lstm"  # written into checkpoints, so another variant's checkpoint is refused

# Procgen's gym3 holds imageio-ffmpeg below 0.4, which warns when the first video is written that
# pkg_resources is deprecated: noise about a library this script never calls itself.
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)


@dataclass
class Args:
    # Experiment
    exp_name: str = VARIANT
    """the name of this experiment, part of the run name"""
    seed: int = 1
    """seed of the experiment (Python, NumPy, PyTorch and the environments)"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic`"""
    cuda: bool = True
    """if toggled, use CUDA when it is available"""
    track: bool = False
    """if toggled, log the run to Weights & Biases (set WANDB_MODE=offline to work without a network)"""
    wandb_project_name: str = "ppo-scripts"
    """the Weights & Biases project"""
    wandb_entity: str | None = None
    """the Weights & Biases entity (team); None uses your default"""
    capture_video: bool = False
    """if toggled, record videos of the first environment to `videos/<run_name>/`"""
    save_model: bool = False
    """if toggled, write `runs/<run_name>/checkpoint.pt` at the end, every `save_interval` iterations and on Ctrl-C"""
    save_interval: int = 100
    """with --save-model, also write the checkpoint every this many iterations (0: only at the end)"""
    resume: str | None = None
    """path of a checkpoint to continue training from; the run keeps the checkpoint's settings"""
    evaluate: str | None = None
    """path of a checkpoint to evaluate instead of training"""
    eval_episodes: int = 10
    """number of games to play with --evaluate"""

    # Speed: how fast the run goes, never what it learns
    compile: bool = False
    """if toggled, compile the policy step and the minibatch loss with torch.compile (pays on a GPU; the first iterations are slow while it compiles)"""
    cudagraphs: bool = False
    """if toggled, compile as --compile does and replay the policy step and minibatch loss as CUDA graphs (needs CUDA)"""
    async_envs: bool = False
    """if toggled, step each game in its own worker process, all games at once, instead of one after another in this process"""

    # Algorithm
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
    """the number of minibatches each batch is split into (by environment: must divide --num-envs)"""
    update_epochs: int = 4
    """the number of passes over the batch per update"""
    norm_adv: bool = True
    """if toggled, normalize advantages within each minibatch"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
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


# Settings that may differ between a run and its resumption; every other field must stay the same.
RUNTIME_FIELDS = {"cuda", "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model",
                  "save_interval", "resume", "evaluate", "eval_episodes", "compile", "cudagraphs", "async_envs"}
# The training setting an evaluation also reads and may change: the seed of its games.
EVALUATION_FIELDS = {"seed"}


def fail(message: str) -> NoReturn:
    """Stop with one line saying what to do and exit code 2: for wrong input, never for bugs."""
    print(f"{VARIANT}.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint written by this script; refuse anything else with a clear message."""
    if not os.path.isfile(path):
        fail(f"no checkpoint at {path!r}")
    try:
        # weights_only=False: the checkpoint holds NumPy RNG state and pickled environments, not
        # only tensors. Only load checkpoints you wrote yourself.
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # torch raises many kinds of errors for a file it cannot read
        fail(f"cannot read checkpoint {path!r}: {error}")
    if not isinstance(checkpoint, dict) or "variant" not in checkpoint:
        fail(f"{path!r} is not a checkpoint of this collection")
    if checkpoint["variant"] != VARIANT:
        fail(f"{path!r} was written by {checkpoint['variant']}.py: use ppo/{checkpoint['variant']}.py for it")
    return checkpoint


def parse_args(argv: list[str] | None = None) -> Args:
    """Read the command line. With --resume or --evaluate the checkpoint's settings are the defaults,
    so `--resume PATH` alone continues the run. A resumed run refuses a training flag that contradicts
    the checkpoint. An evaluation needs the same environment, may change the EVALUATION_FIELDS, and
    refuses every other training flag."""
    args = tyro.cli(Args, args=argv)
    if args.resume and args.evaluate:
        fail("--resume goes on training a saved run and --evaluate plays a saved agent: give one of them")
    checkpoint_path = args.resume or args.evaluate
    if checkpoint_path is None:
        return args
    saved = replace(Args(**load_checkpoint(checkpoint_path)["args"]), resume=None, evaluate=None)
    if args.evaluate:  # an evaluation starts from the default run-time options, not the training run's
        saved = replace(saved, **{name: getattr(Args(), name) for name in RUNTIME_FIELDS})
    args = tyro.cli(Args, args=argv, default=saved)
    must_match = ["env_id"] if args.evaluate else [f.name for f in fields(Args) if f.name not in RUNTIME_FIELDS]
    for name in must_match:
        if getattr(args, name) != getattr(saved, name):
            flag = "--" + name.replace("_", "-")
            fail(f"the checkpoint was made with {flag} {getattr(saved, name)}, not "
                 f"{getattr(args, name)}: drop {flag} to keep the checkpoint's value")
    if args.evaluate:  # any other training flag would be silently ignored: say so instead
        for name in (f.name for f in fields(Args) if f.name not in RUNTIME_FIELDS | EVALUATION_FIELDS):
            if getattr(args, name) != getattr(saved, name):
                flag = "--" + name.replace("_", "-")
                fail(f"{flag} is a training setting, which --evaluate does not use: drop it")
    return args


def check_args(args: Args) -> None:
    """Refuse settings that cannot make a valid run, before any environment is built: first each flag
    on its own (one rule per numeric or choice flag), then the sizes that must fit together."""
    rules = [  # (field, whether its value is allowed, what it must be)
        ("env_id", args.env_id.strip() != "", "an Atari id such as BreakoutNoFrameskip-v4"),
        ("seed", 0 <= args.seed < 2**31, "a whole number from 0 to 2**31 - 1"),
        ("save_interval", args.save_interval >= 0, "0 (save only at the end) or more"),
        ("eval_episodes", args.eval_episodes >= 1, "at least 1"),
        ("total_timesteps", args.total_timesteps >= 1, "at least 1"),
        ("learning_rate", 0 < args.learning_rate < np.inf, "a finite number above 0"),
        ("num_envs", args.num_envs >= 1, "at least 1"),
        ("num_steps", args.num_steps >= 1, "at least 1"),
        ("gamma", 0 <= args.gamma <= 1, "between 0 and 1"),
        ("gae_lambda", 0 <= args.gae_lambda <= 1, "between 0 and 1"),
        ("num_minibatches", args.num_minibatches >= 1, "at least 1"),
        ("update_epochs", args.update_epochs >= 1, "at least 1"),
        ("clip_coef", args.clip_coef > 0, "above 0"),
        ("ent_coef", args.ent_coef >= 0, "0 or more"),
        ("vf_coef", args.vf_coef >= 0, "0 or more"),
        ("max_grad_norm", args.max_grad_norm > 0, "above 0"),
        ("target_kl", args.target_kl is None or args.target_kl > 0, "above 0 (leave it out to never stop early)"),
    ]
    for name, allowed, rule in rules:
        if not allowed:
            default = getattr(Args(), name)
            fail(f"--{name.replace('_', '-')} must be {rule}, got {getattr(args, name)!r}"
                 + ("" if default is None else f": the default is {default!r}"))
    batch_size = args.num_envs * args.num_steps
    if args.num_envs % args.num_minibatches != 0:
        fail(f"--num-envs {args.num_envs} does not divide into --num-minibatches {args.num_minibatches}: a "
             "minibatch holds whole environment sequences, so pick a number of envs that is a multiple of it")
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        fail(f"minibatches of {batch_size // args.num_minibatches} transition cannot be normalized (--norm-adv "
             f"divides by their standard deviation): use fewer --num-minibatches or a larger batch")
    if args.total_timesteps < batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one batch "
             f"(--num-envs x --num-steps = {batch_size}): raise it or shrink the batch")


# ---------------------------------------------------------------------------------------------------
# Environments: the Atari preprocessing
# ---------------------------------------------------------------------------------------------------


class EpisodicLife(gym.Wrapper):
    """[Atari 3: EpisodicLifeEnv] Losing a life ends the episode for training (terminated=True), so
    the value of the state before a lost life is not bootstrapped from the next life. The game itself
    goes on: after a lost life, reset() takes one no-op step instead of restarting the game, and only
    a game that is really over is reset.

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
        env = gym.make(env_id, frameskip=1, render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:
            trigger = None  # RecordVideo's own: episodes 0, 1, 8, 27, ..., 1000, 2000, ...
            if video_episodes is not None:  # an evaluation's: none past its last (the reset after it starts one)
                from gymnasium.utils.save_video import capped_cubic_video_schedule as schedule

                trigger = lambda episode: episode < video_episodes and schedule(episode)  # noqa: E731
            env = gym.wrappers.RecordVideo(env, video_folder, episode_trigger=trigger)
        # gymnasium's AtariPreprocessing carries out three of the details as the original wrappers do,
        # with one difference: it max-pools two grayscale frames where the original max-pools two color
        # frames and then converts them. Breakout's observations come out identical; in Pong 0.2% of
        # the pixels differ (tests/test_ppo_atari.py, docs/ppo_atari.md).
        env = gym.wrappers.AtariPreprocessing(
            env,
            noop_max=30,  # [Atari 1: NoopResetEnv] 1 to 30 no-op frames (random) at the start of each game
            frame_skip=4,  # [Atari 2: MaxAndSkipEnv] repeat each action for 4 frames, sum their rewards
            # and max-pool the last two frames (Atari draws some sprites only every other frame).
            screen_size=84,  # [Atari 5: WarpFrame] grayscale, resized to 84x84 with area interpolation
            grayscale_obs=True,
            terminal_on_life_loss=False,  # lives are handled by EpisodicLife below
        )
        # Below EpisodicLife and the reward clipping, this wrapper sees the real game: it adds the game's
        # unclipped score and length to `info` when the game is over, not when a life is lost.
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = EpisodicLife(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)
        # [Atari 6: ClipRewardEnv] the reward's sign: -1, 0 or +1, the same scale for every game.
        # (gymnasium's ClipReward clips to a range; TransformReward with np.sign is the original.)
        env = gym.wrappers.TransformReward(env, np.sign)
        # [Atari 7: FrameStack] with 1 frame: the LSTM remembers the earlier frames instead of a stack
        # of 4. The wrapper only adds the channel axis, (1, 84, 84), so the network is ppo_atari.py's.
        env = gym.wrappers.FrameStackObservation(env, stack_size=1)
        return SavableGame(env)

    return thunk


class SavableGame(gym.Wrapper):
    """The outermost wrapper: it saves the game it wraps, where the game runs. With --async-envs that
    is a worker process, which `envs.call("save_game")` reaches as it reaches this process's games.

    Pickling alone is not enough: ale-py's AtariEnv pickles only its constructor arguments, so an
    unpickled game is a fresh one, at its first frame. The emulator's state (with its random
    generator) and the environment's own generator (the no-op counts) are saved beside the wrapper
    stack, which pickles whole (frame stack, lives, running game statistics). cloudpickle, not pickle:
    it also carries the wrapper classes when they live in a script's __main__, which a worker process
    or a later run may not have."""

    def save_game(self) -> bytes | None:
        """The game's full state, for restore_game; None for the game whose video is being recorded:
        the recorder is not saved, so a resumed run starts new games."""
        env = self.env
        while isinstance(env, gym.Wrapper):
            if isinstance(env, gym.wrappers.RecordVideo):
                return None
            env = env.env
        try:
            return cloudpickle.dumps((self, self.unwrapped.ale.cloneState(include_rng=True),
                                      self.unwrapped.np_random.bit_generator.state))
        except (pickle.PicklingError, TypeError, AttributeError):
            return None


def restore_game(saved_game: bytes) -> gym.Env:
    """The wrapper stack of SavableGame.save_game, with its emulator put back where it was."""
    env, emulator_state, rng_state = pickle.loads(saved_game)
    env.unwrapped.ale.restoreState(emulator_state)
    env.unwrapped.np_random.bit_generator.state = rng_state
    return env


def in_worker(make_game) -> gym.Env:
    """Build a game in a worker process of --async-envs. Ctrl-C reaches every process of the terminal's
    group, but it is the main process's to handle (finish the iteration, save): the worker ignores it.
    OpenCV, which resizes the frames, runs on one thread: the other workers have the other cores."""
    import cv2  # installed with ale-py (the atari extra); AtariPreprocessing imports it too

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cv2.setNumThreads(1)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game made
    # AsyncVectorEnv built the first game once in the main process too, for its spaces; with video
    # that made the (new) folder, which RecordVideo here would warn of as if it held older videos.
    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
    return make_game()


def check_env_id(env_id: str) -> None:
    """Refuse, with the script to use instead, an id that is not an ale-py Atari game."""
    if ale_py is None:
        fail("ppo_atari_lstm.py needs ale-py and opencv-python: pip install -e '.[atari]'")
    gym.register_envs(ale_py)  # ale-py >= 0.9 registers its games only when asked
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game made
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as error:
        hint = ""
        if env_id.endswith("-v5") and not env_id.startswith("ALE/"):
            hint = f" (ale-py names it ALE/{env_id}; envpool ids such as {env_id} need ppo/ppo_atari_envpool.py)"
        fail(f"unknown env id {env_id!r}{hint}: {error}")
    if spec.entry_point != "ale_py.env:AtariEnv":
        fail(f"{env_id} is not an Atari game of ale-py: ppo_atari_lstm.py trains on Atari frames only; use "
             "ppo/ppo.py for vector observations and ppo/ppo_continuous_action.py for Box actions")


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_folder: str = "videos",
              saved_envs: list[bytes] | bytes | None = None, async_envs: bool = False,
              video_episodes: int | None = None) -> gym.vector.VectorEnv:
    """Build the vector of preprocessed games, checking that this script can train on them; from
    `saved_envs` (pickle_envs), the very games that were saved.

    [Core 1: Vectorized architecture] One learner steps `num_envs` copies of the game in lock step,
    so each rollout holds num_envs x num_steps transitions.

    Autoreset: SAME_STEP, as in ppo.py: the step that ends an episode (here also a lost life) resets
    it, so every stored step is a real transition.

    [Speed: asynchronous environments] With async_envs each game runs in its own worker process and
    all of them step at once; the frames come back through shared memory. The games, their seeds and
    so their frames are the same as in this process: only the time differs.
    """
    check_env_id(env_id)
    if isinstance(saved_envs, bytes):  # a checkpoint from before SavableGame: all games in one pickle
        saved_envs = [cloudpickle.dumps((SavableGame(env), emulator_state, rng_state))
                      for env, emulator_state, rng_state in pickle.loads(saved_envs)]
    if saved_envs is not None:
        env_fns = [functools.partial(restore_game, saved_game) for saved_game in saved_envs]
    else:
        env_fns = [make_env(env_id, i, capture_video, video_folder, video_episodes) for i in range(num_envs)]
    if async_envs:
        # forkserver: the workers start from a clean process, not a copy of this one with its threads.
        # AsyncVectorEnv builds one game here too, for the spaces: keep this process's Ctrl-C handler.
        sigint_handler = signal.getsignal(signal.SIGINT)
        envs = gym.vector.AsyncVectorEnv([functools.partial(in_worker, make_game) for make_game in env_fns],
                                         shared_memory=True, context="forkserver",
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        signal.signal(signal.SIGINT, sigint_handler)
    else:
        envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        kind = type(envs.single_action_space).__name__
        envs.close()
        fail(f"{env_id} has a {kind} action space but ppo_atari_lstm.py needs Discrete actions: "
             f"use ppo/ppo_continuous_action.py for Box actions")
    return envs


def pickle_envs(envs: gym.vector.VectorEnv) -> list[bytes] | None:
    """Every game's full state (SavableGame.save_game), so a resumed run continues the very same
    games; None where that is impossible (video recording). The same for sync and async envs, so a
    run saved with --async-envs may resume without it, and the other way round."""
    saved_games = list(envs.call("save_game"))
    return None if any(saved_game is None for saved_game in saved_games) else saved_games


def finished_games(infos: dict) -> list[tuple[int, float, int]]:
    """(env index, score, length) of every game that ended in this step. RecordEpisodeStatistics
    reports a game only when it is really over; the vector env files the report of a step that ended
    an episode under `final_info`."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    return [(int(i), float(final["episode"]["r"][i]), int(final["episode"]["l"][i]))
            for i in np.flatnonzero(final["_episode"])]


# ---------------------------------------------------------------------------------------------------
# Agent
# ---------------------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """[Core 2: Orthogonal initialization of weights, constant initialization of biases]
    Orthogonal weights scaled by sqrt(2) for the ReLU layers, 0.01 for the policy head so the first
    policy is close to uniform, 1 for the value head; biases 0."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


LSTMState = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (1, num_envs, 128)


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

        obs is (T * E, 1, 84, 84) and done (T * E,), time-major: step t of environment e at t * E + e;
        lstm_state holds the state of the E environments before step 0. done[t] is 1 where obs[t]
        begins a new episode. Returns the LSTM outputs (T * E, 128) and the state after the last step.
        """
        # [Atari 9: Scaling the images to [0, 1]] frames are stored as uint8 and scaled here.
        hidden = self.network(obs.float() / 255.0)
        num_envs = lstm_state[0].shape[1]
        hidden = hidden.reshape(-1, num_envs, self.lstm.input_size)
        done = done.reshape(-1, num_envs)
        num_steps = hidden.shape[0]
        # [Speed: the LSTM over whole stretches] Between two steps at which some environment begins an
        # episode, the LSTM runs over the whole stretch in one call: the result of one call per step (to
        # float rounding), but in the update a minibatch's 128 steps take a few calls, forward and
        # backward, instead of 128 small ones each way. (The rollout's sequences are one step long:
        # there is nothing to look up, so nothing is read from the device.)
        starts = (done[1:].any(dim=1).nonzero().flatten() + 1).tolist() if num_steps > 1 else []
        bounds = [0, *starts, num_steps]
        outputs = []
        for begin, end in zip(bounds[:-1], bounds[1:]):
            # [LSTM 3: Reset LSTM states at the end of the episode] the state is multiplied by
            # 1 - done where an episode begins, so an episode that begins within the sequence starts
            # from zeros; no episode begins between `begin` and `end`.
            keep = (1.0 - done[begin]).view(1, -1, 1)
            output, lstm_state = self.lstm(hidden[begin:end], (keep * lstm_state[0], keep * lstm_state[1]))
            outputs.append(output)
        return torch.cat(outputs).flatten(0, 1), lstm_state

    def get_value(self, obs: torch.Tensor, lstm_state: LSTMState, done: torch.Tensor) -> torch.Tensor:
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
        return action, distribution.log_prob(action), distribution.entropy(), self.critic(hidden), lstm_state


# ---------------------------------------------------------------------------------------------------
# Rollouts, and their replay during training
# ---------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One rollout: arrays of (num_steps, num_envs, ...), and the LSTM state it started from.
    [Speed: one host transfer per step] What the network reads or writes is on the training device
    (frames as uint8, actions, log-probs, values, LSTM state); rewards and dones, from the games, on
    the host."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    rewards: np.ndarray
    dones: np.ndarray  # dones[t] = 1: obs[t] is the first observation of a new episode
    initial_lstm_state: LSTMState


@dataclass
class EnvCursor:
    """Where the environments stand between two rollouts: the next observation, whether it begins a
    new episode, and the LSTM state before it. The next rollout starts from here."""

    obs: np.ndarray
    done: np.ndarray
    lstm_state: LSTMState


def collect_rollout(agent: Agent, envs: gym.vector.VectorEnv, cursor: EnvCursor, num_steps: int,
                    device: torch.device, policy_step=None,
                    cudagraphs: bool = False) -> tuple[Rollout, list[tuple[int, float, int]]]:
    """Play num_steps steps in every environment with the current policy, carrying the LSTM state
    from step to step, and advance `cursor`. Returns the rollout and the games that ended in it, as
    (step, score, length). policy_step is agent.get_action_and_value or its compiled form."""
    policy_step = policy_step or agent.get_action_and_value
    num_envs = cursor.obs.shape[0]
    obs = torch.zeros((num_steps,) + cursor.obs.shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((num_steps, num_envs), device=device)
    values = torch.zeros((num_steps, num_envs), device=device)
    rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
    dones = np.zeros((num_steps, num_envs), dtype=np.float32)
    initial_lstm_state = (cursor.lstm_state[0].clone(), cursor.lstm_state[1].clone())
    games = []
    for step in range(num_steps):
        obs[step] = torch.as_tensor(cursor.obs, device=device)
        dones[step] = cursor.done
        if cudagraphs:
            # [Speed: CUDA graphs] a replay's outputs live until the next replay: they are copied first.
            torch.compiler.cudagraph_mark_step_begin()
        # no_grad, not inference_mode as in the other scripts: with the LSTM left out, torch.compile
        # compiles get_states' end and the heads as functions of their own, which the update runs
        # again with gradients, and CUDA graphs of a function first run in inference mode fail when
        # it is then run for training (pytorch/pytorch#135892).
        with torch.no_grad():
            action, logprob, _, value, lstm_state = policy_step(
                obs[step], cursor.lstm_state, torch.as_tensor(cursor.done, dtype=torch.float32, device=device))
        actions[step], logprobs[step], values[step] = action, logprob, value.flatten()
        cursor.lstm_state = (lstm_state[0].clone(), lstm_state[1].clone())

        # The step's one transfer to the host: the actions, which the games need.
        cursor.obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
        # A lost life (EpisodicLife) or a time-limit truncation ends the episode like a termination.
        cursor.done = np.logical_or(terminations, truncations)
        rewards[step] = reward  # clipped
        games += [(step, score, length) for _, score, length in finished_games(infos)]
    return Rollout(obs, actions, logprobs, values, rewards, dones, initial_lstm_state), games


def replay_sequences(agent: Agent, obs: torch.Tensor, dones: torch.Tensor, actions: torch.Tensor,
                     initial_lstm_state: LSTMState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[LSTM 5: Reconstruct LSTM states during training] Score the rollout's actions again with the
    current network, replaying some environments' whole sequences from the LSTM state the rollout
    started from. obs, dones and actions are (num_steps, E, ...) columns of the rollout, and
    initial_lstm_state the state of those E environments. Returns log-probs, entropies and values,
    each (num_steps, E). Before any update they are the rollout's own (tests/test_ppo_atari_lstm.py)."""
    num_steps, num_envs = actions.shape
    _, logprob, entropy, value, _ = agent.get_action_and_value(
        obs.flatten(0, 1), initial_lstm_state, dones.flatten(), actions.flatten())
    return (logprob.reshape(num_steps, num_envs), entropy.reshape(num_steps, num_envs),
            value.reshape(num_steps, num_envs))


# ---------------------------------------------------------------------------------------------------
# Generalized advantage estimation and the PPO loss
# ---------------------------------------------------------------------------------------------------


def compute_gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_value: np.ndarray,
                next_done: np.ndarray, gamma: float, gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """[Core 5: Generalized Advantage Estimation] Advantages and value targets of one rollout.

    All arrays are (num_steps, num_envs) except next_value and next_done, (num_envs,), which describe
    the observation after the last step. dones[t] is 1 when obs[t] is the first observation of a new
    episode (here: of a new life), that is, when the step before it ended one: then nothing flows
    back across t.
    """
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
             returns: torch.Tensor, args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO objective on one minibatch; returns the loss to minimize and detached statistics."""
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()

    if args.norm_adv:
        # [Core 7: Normalization of advantages] per minibatch, not per batch.
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # [Core 8: Clipped surrogate objective] pessimistic bound: the larger of the two losses.
    pg_loss_unclipped = -advantages * ratio
    pg_loss_clipped = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss_unclipped, pg_loss_clipped).mean()

    if args.clip_vloss:
        # [Core 9: Value function loss clipping] the new value may move at most clip_coef away from
        # the value recorded during the rollout before the clipped term takes over.
        v_loss_unclipped = (new_value - returns) ** 2
        v_clipped = old_value + torch.clamp(new_value - old_value, -args.clip_coef, args.clip_coef)
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
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    stats = {"policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(), "entropy": entropy_mean.detach(),
             "old_approx_kl": old_approx_kl, "approx_kl": approx_kl, "clipfrac": clipfrac}
    return loss, stats


def minibatch_loss(agent: Agent, obs: torch.Tensor, dones: torch.Tensor, actions: torch.Tensor,
                   old_logprob: torch.Tensor, old_value: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, initial_lstm_state: LSTMState,
                   args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The network on one minibatch, then the PPO loss: the unit --compile compiles. Every tensor is
    (num_steps, E) columns of the rollout, initial_lstm_state the state of those E environments."""
    new_logprob, entropy, new_value = replay_sequences(agent, obs, dones, actions, initial_lstm_state)
    return ppo_loss(new_logprob.flatten(), entropy.flatten(), new_value.flatten(), old_logprob.flatten(),
                    old_value.flatten(), advantages.flatten(), returns.flatten(), args)


def explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """1 - Var[target - predicted] / Var[target]: 1 is a perfect value function, 0 no better than
    a constant, negative worse than one; nan when the targets do not vary."""
    target_variance = np.var(target)
    return np.nan if target_variance == 0 else float(1 - np.var(target - predicted) / target_variance)


# ---------------------------------------------------------------------------------------------------
# Checkpoints, interruption and evaluation
# ---------------------------------------------------------------------------------------------------


def save_checkpoint(path: str, state: dict) -> None:
    """Write atomically: a crash or a second Ctrl-C while writing leaves the previous file intact."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


class StopOnInterrupt:
    """The first Ctrl-C only prints `notice` and sets `requested`: training then stops after the
    current iteration, so the run can flush its logs and save a checkpoint at a clean point. A second
    Ctrl-C stops at once (KeyboardInterrupt)."""

    def __init__(self, notice: str = "Ctrl-C: stopping after this iteration (press Ctrl-C again to quit at once)"):
        self.requested, self.notice = False, notice
        self.previous_handler = signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\n" + self.notice, flush=True)

    def restore(self):
        signal.signal(signal.SIGINT, self.previous_handler)


def evaluate(args: Args, device: torch.device) -> list[float]:
    """Play `eval_episodes` games with the saved policy (actions sampled, as in training) and print
    the mean and standard deviation of their scores. The games run through the training wrappers,
    so a game lasts all its lives and its score is the real, unclipped one; the LSTM state is reset
    where training resets it, at every lost life."""
    checkpoint = load_checkpoint(args.evaluate)
    video_folder = f"videos/{checkpoint['run_name']}-eval"
    envs = make_envs(args.env_id, 1, args.capture_video, video_folder, video_episodes=args.eval_episodes)
    agent = Agent(envs.single_action_space.n).to(device)
    agent.load_state_dict(checkpoint["model"])
    agent.eval()
    torch.manual_seed(args.seed)

    # Seeds unlike any training seed, so the scores come from games the agent never trained on.
    obs, _ = envs.reset(seed=args.seed + 100_000)
    done = np.zeros(1, dtype=bool)
    lstm_state = agent.initial_state(1, device)
    game_scores = []
    while len(game_scores) < args.eval_episodes:
        with torch.inference_mode():
            action, _, _, _, lstm_state = agent.get_action_and_value(
                torch.as_tensor(obs, device=device), lstm_state,
                torch.as_tensor(done, dtype=torch.float32, device=device))
        obs, _, terminated, truncated, infos = envs.step(action.cpu().numpy())
        done = np.logical_or(terminated, truncated)
        for _, score, length in finished_games(infos):
            game_scores.append(score)
            print(f"episode {len(game_scores)}: return {score:.1f} ({length} steps)")
    envs.close()
    print(f"{args.env_id}: mean return {np.mean(game_scores):.2f} +- {np.std(game_scores):.2f} "
          f"over {len(game_scores)} episodes")
    if args.capture_video:
        print(f"videos in {video_folder}/")
    return game_scores


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def main(args: Args) -> dict:
    """Train (or evaluate) as `args` says; returns a summary of the run for callers such as tests."""
    check_args(args)
    batch_size = args.num_envs * args.num_steps
    envs_per_minibatch = args.num_envs // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        fail("--cudagraphs needs a CUDA device: drop it, or run on a GPU (and without --no-cuda)")
    if args.evaluate:
        return {"episode_returns": evaluate(args, device)}

    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint:
        run_name = checkpoint["run_name"]
    else:
        # ALE/Pong-v5 -> ALE-Pong-v5: the run name is a directory name.
        run_name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    # The run's folder: its TensorBoard log and checkpoint. A resumed run goes on in the folder of the
    # checkpoint it was given, from wherever it is started.
    run_dir = (os.path.dirname(args.resume) or ".") if checkpoint else f"runs/{run_name}"
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")

    # Seeding. A resumed run overwrites these RNG states with the checkpoint's below.
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # A resumed run goes on with the saved environments, the very episodes it left; they cannot record
    # video, so with --capture-video it starts new ones instead (and no longer ends exactly as an
    # unbroken run would).
    saved_envs = checkpoint["envs"] if checkpoint and not args.capture_video else None
    # A resumed run's videos go into a folder of their own: its episode count starts again at 0.
    video_folder = f"videos/{run_name}" + (f"/resumed-at-step-{checkpoint['global_step']}" if checkpoint else "")
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, video_folder,
                     saved_envs=saved_envs, async_envs=args.async_envs)
    agent = Agent(envs.single_action_space.n).to(device)
    # [Core 3: The Adam optimizer's epsilon parameter] 1e-5 as in the original code, not PyTorch's 1e-8.
    # Adam divides each step by sqrt(v) + eps: the larger eps damps the steps of weights whose
    # gradients are tiny, which Adam would otherwise scale up to full size.
    # fused=True: the same Adam, in one kernel for all parameters instead of a dozen small ops each.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # [Speed: torch.compile] the policy step and the minibatch loss compiled into fused kernels, so a GPU
    # runs a few large kernels instead of waiting for Python to launch many small ones. torch.compile
    # leaves the nn.LSTM out (its default): the convolutions, heads and loss are compiled, and the
    # rest of get_states (finding the episode starts, the done masks, the LSTM's calls) runs as plain
    # PyTorch between them.
    # docs/ppo_atari_lstm.md says why it stays so.
    policy_step, loss_on_minibatch = agent.get_action_and_value, minibatch_loss
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else "default"  # reduce-overhead = CUDA graphs
        policy_step = torch.compile(policy_step, mode=mode)
        loss_on_minibatch = torch.compile(loss_on_minibatch, mode=mode)

    if args.track:
        try:
            import wandb
        except ImportError:
            fail("--track needs wandb: pip install wandb")
        try:
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=asdict(args), name=run_name, id=run_name, resume="allow", save_code=True)
        except wandb.errors.Error as error:  # no API key, no network
            fail(f"--track could not start Weights & Biases ({str(error).splitlines()[0]}): log in with "
                 "`wandb login`, or set WANDB_MODE=offline to keep the run on this machine")
    # purge_step: after a resume, TensorBoard drops anything the interrupted run logged past the checkpoint.
    writer = SummaryWriter(run_dir, purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
        f"|{key}|{value}|" for key, value in {**asdict(args), "batch_size": batch_size,
                                              "minibatch_size": envs_per_minibatch * args.num_steps,
                                              "num_iterations": num_iterations}.items()))
    recent_returns = deque(maxlen=20)  # scores of the latest finished games

    if checkpoint:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        random.setstate(checkpoint["rng"]["python"])
        np.random.set_state(checkpoint["rng"]["numpy"])
        torch.set_rng_state(checkpoint["rng"]["torch"])
        if device.type == "cuda" and checkpoint["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(checkpoint["rng"]["cuda"], device)
        start_iteration, global_step = checkpoint["iteration"], checkpoint["global_step"]
        lstm_state = tuple(state.to(device) for state in checkpoint["next_lstm_state"])
        cursor = EnvCursor(checkpoint["next_obs"], checkpoint["next_done"], lstm_state)
        recent_returns.extend(checkpoint["recent_returns"])
        if saved_envs is None:  # none saved (a run with video), or video now: new games
            next_obs, _ = envs.reset(seed=args.seed + global_step)
            cursor = EnvCursor(next_obs, np.zeros(args.num_envs, dtype=bool),
                               agent.initial_state(args.num_envs, device))
        print(f"resuming {run_name} at step {global_step:,} of {args.total_timesteps:,}"
              + (" (with new episodes)" if saved_envs is None else ""))
    else:
        start_iteration, global_step = 0, 0
        next_obs, _ = envs.reset(seed=args.seed)
        cursor = EnvCursor(next_obs, np.zeros(args.num_envs, dtype=bool), agent.initial_state(args.num_envs, device))

    def write_checkpoint(iteration: int) -> None:
        cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        save_checkpoint(checkpoint_path, {
            "variant": VARIANT, "args": asdict(args), "run_name": run_name,
            "iteration": iteration, "global_step": global_step,
            "model": agent.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state(), "cuda": cuda_rng},
            "envs": pickle_envs(envs), "next_obs": cursor.obs, "next_done": cursor.done,
            # The LSTM state the next rollout starts from: with the games, it resumes their memory.
            "next_lstm_state": tuple(state.cpu() for state in cursor.lstm_state),
            "recent_returns": list(recent_returns),
        })

    interrupt = StopOnInterrupt()
    start_time, start_step, last_print = time.time(), global_step, 0.0
    for iteration in range(start_iteration + 1, num_iterations + 1):
        # [Core 4: Adam learning rate annealing] linearly from learning_rate toward 0, which the end of
        # the run would reach: the last iteration uses learning_rate / num_iterations.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # Rollout: num_steps steps in every environment with the current policy.
        rollout, games = collect_rollout(agent, envs, cursor, args.num_steps, device, policy_step, args.cudagraphs)
        for step, score, length in games:
            writer.add_scalar("charts/episodic_return", score, global_step + (step + 1) * args.num_envs)
            writer.add_scalar("charts/episodic_length", length, global_step + (step + 1) * args.num_envs)
            recent_returns.append(score)
        global_step += batch_size

        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(cursor.obs, device=device), cursor.lstm_state,
                                         torch.as_tensor(cursor.done, dtype=torch.float32, device=device))
        # GAE runs on the host, in NumPy: one transfer of the rollout's values per iteration.
        host_values = rollout.values.cpu().numpy()
        advantages, returns = compute_gae(rollout.rewards, host_values, rollout.dones,
                                          next_value.cpu().numpy().flatten(), cursor.done, args.gamma, args.gae_lambda)

        # The batch stays (num_steps, num_envs, ...): a minibatch is a set of columns, whole sequences.
        b_obs, b_actions, b_logprobs, b_values = rollout.obs, rollout.actions, rollout.logprobs, rollout.values
        b_dones = torch.as_tensor(rollout.dones, device=device)
        b_advantages = torch.as_tensor(advantages, device=device)
        b_returns = torch.as_tensor(returns, device=device)

        # [Core 6: Mini-batch updates] several epochs over shuffled minibatches of the batch.
        # [LSTM 4: Prepare sequential rollouts in mini-batches] the environments, not the single
        # transitions, are shuffled and split: each minibatch holds whole sequences of num_steps steps,
        # in order, so the LSTM can be replayed over them.
        env_inds = np.arange(args.num_envs)
        minibatch_stats = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(env_inds)
            shuffled_envs = torch.from_numpy(env_inds).to(device)  # one copy to the device per epoch
            for start in range(0, args.num_envs, envs_per_minibatch):
                mb_envs = shuffled_envs[start:start + envs_per_minibatch]
                mb_lstm_state = (rollout.initial_lstm_state[0][:, mb_envs], rollout.initial_lstm_state[1][:, mb_envs])
                if args.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                loss, stats = loss_on_minibatch(agent, b_obs[:, mb_envs], b_dones[:, mb_envs], b_actions[:, mb_envs],
                                                b_logprobs[:, mb_envs], b_values[:, mb_envs], b_advantages[:, mb_envs],
                                                b_returns[:, mb_envs], mb_lstm_state, args)
                optimizer.zero_grad()
                loss.backward()
                # [Core 11: Global gradient clipping] when the norm of all gradients together exceeds
                # max_grad_norm, all are scaled down alike: one minibatch of extreme advantages or value
                # errors cannot throw the weights far, and the gradient keeps its direction.
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                optimizer.step()
                # [Speed: CUDA graphs] copies, kept to the end: a graph's next replay overwrites its outputs.
                minibatch_stats.append({key: value.clone() for key, value in stats.items()})
            if args.target_kl is not None and minibatch_stats[-1]["approx_kl"] > args.target_kl:
                break

        # [Core 12: Debug variables] averaged over every minibatch of this update.
        means = {key: torch.stack([s[key] for s in minibatch_stats]).mean().item() for key in minibatch_stats[0]}
        sps = int((global_step - start_step) / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac"):
            writer.add_scalar(f"losses/{key}", means[key], global_step)
        writer.add_scalar("losses/explained_variance",
                          explained_variance(host_values.reshape(-1), returns.reshape(-1)), global_step)
        writer.add_scalar("charts/SPS", sps, global_step)

        if time.time() - last_print > 2.0 or iteration == num_iterations or interrupt.requested:
            last_print = time.time()
            mean_return = f"{np.mean(recent_returns):8.2f}" if recent_returns else "     n/a"
            print(f"step {global_step:>9,}/{args.total_timesteps:,} | {sps:>6,} SPS | "
                  f"mean return {mean_return} (last {len(recent_returns)} episodes)", flush=True)

        if args.save_model and (interrupt.requested or iteration == num_iterations
                                or (args.save_interval > 0 and iteration % args.save_interval == 0)):
            write_checkpoint(iteration)
        if interrupt.requested:
            break

    interrupt.restore()
    envs.close()
    writer.close()
    if args.track:
        # wandb.finish() takes seconds, and a Ctrl-C inside it crashes W&B's service and loses the
        # run's upload: a first Ctrl-C here only says so, a second one abandons the upload.
        print("saving the W&B run...", flush=True)
        still_saving = StopOnInterrupt("Ctrl-C: W&B is still saving the run (press Ctrl-C again to abandon it)")
        wandb.finish()
        still_saving.restore()
    if interrupt.requested:
        how = f"resume with: python ppo/{VARIANT}.py --resume {checkpoint_path}" if args.save_model else \
            "no checkpoint written (run with --save-model to be able to resume)"
        print(f"stopped at step {global_step:,}; {how}")
    elif args.save_model:
        print(f"checkpoint: {checkpoint_path}\nevaluate it with: python ppo/{VARIANT}.py --evaluate {checkpoint_path}")
    return {"run_name": run_name, "global_step": global_step, "interrupted": interrupt.requested,
            "recent_returns": list(recent_returns), "agent": agent}


if __name__ == "__main__":
    args = parse_args()
    try:
        result = main(args)
    except gym.error.DependencyNotInstalled as error:
        # AtariPreprocessing imports opencv, and gymnasium the video packages, only when first used.
        extra = "'.[atari,video]'" if args.capture_video else "'.[atari]'"
        fail(f"missing optional dependency: {error} (pip install -e {extra})")
    except KeyboardInterrupt:  # a second Ctrl-C, or one before training began
        print("stopped at once by Ctrl-C: what came after the last checkpoint is lost", file=sys.stderr)
        sys.exit(130)
    sys.exit(130 if result.get("interrupted") else 0)
