"""Procgen's games for ppo_procgen.py, as its other scripts see theirs: behind the calls of one
gymnasium vector environment (Games), their episodes reported as RecordEpisodeStatistics reports
them and filmed by --capture-video; and the check of a game and its settings."""

import contextlib
import io

import gymnasium as gym
import numpy as np

from ppo_utils.exits import WrongInput
from ppo_utils.video_recorder import VideoRecorder

try:
    # procgen imports the retired `gym` package to register old-style environments, and gym prints
    # a notice about itself on import that concerns neither this script nor its user.
    with contextlib.redirect_stderr(io.StringIO()):
        from procgen import ProcgenGym3Env
except ImportError:  # check_procgen_id says how to install it
    ProcgenGym3Env = None

GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball",
         "fruitbot", "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")
DISTRIBUTION_MODES = ("easy", "hard", "extreme", "memory", "exploration")
# The games of the two modes that only some have ("exploration" is one hard level per game).
MODE_GAMES = {"memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
              "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper",
                              "maze", "ninja")}


def check_procgen_id(env_id: str, distribution_mode: str, num_levels: int,
                     start_level: int) -> None:
    """Refuse a game that Procgen does not have (naming the one meant, or the script to use), a
    distribution mode the game lacks, levels the exploration mode does not take, and Procgen not
    installed."""
    if env_id not in GAMES:
        hint = ""
        game = next((game for game in GAMES if game in env_id.lower()), None)
        if "NoFrameskip" in env_id or env_id.startswith("ALE/"):
            hint = " (Atari games need ppo/ppo_atari.py)"
        elif game:  # StarPilot, StarpilotEasy-v0 (envpool), procgen:procgen-starpilot-v0 (gym)
            hint = f" (did you mean {game!r}?)"
        elif env_id in gym.registry:
            hint = " (a gymnasium id: use ppo/ppo.py or ppo/ppo_continuous_action.py for those)"
        raise WrongInput(f"unknown Procgen game {env_id!r}{hint}: pick one of {', '.join(GAMES)}")
    mode_games = MODE_GAMES.get(distribution_mode, GAMES)
    if env_id not in mode_games:
        raise WrongInput(f"{env_id} has no {distribution_mode!r} distribution mode: only "
                         f"{', '.join(mode_games)} have it")
    if distribution_mode == "exploration" and (num_levels, start_level) != (0, 0):
        raise WrongInput("the exploration mode plays the one level Procgen picks for the game: "
                         "leave out --num-levels and --start-level")
    if ProcgenGym3Env is None:
        raise WrongInput("Procgen is not installed: pip install -e \".[procgen]\"")


class Games:
    """`num_envs` Procgen games (`games`, gym3's) behind the calls of a gymnasium vector
    environment. reset(seed) builds the games anew, their levels drawn from that seed. Each step's
    info reports the episodes that ended as RecordEpisodeStatistics does; `video_folder` films the
    first game as the agent sees it."""

    single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    single_action_space = gym.spaces.Discrete(15)
    metadata = {"render_fps": 15}  # Procgen's own rate, at which its videos play

    def __init__(self, game: str, num_envs: int, distribution_mode: str = "easy",
                 num_levels: int = 0, start_level: int = 0, video_folder: str | None = None):
        self.num_envs = num_envs
        self.options = dict(env_name=game, distribution_mode=distribution_mode)
        if distribution_mode != "exploration":  # which sets its own level
            self.options.update(num_levels=num_levels, start_level=start_level)
        self.games, self.episode_return, self.episode_length = None, None, None
        self.recorder = VideoRecorder(video_folder) if video_folder else None

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        if self.games is not None:
            self.games.close()
        # a 32-bit seed: a resumed run's or an evaluation's (--seed plus an offset) may pass 2**31
        seed = None if seed is None else seed % 2**31
        self.games = ProcgenGym3Env(num=self.num_envs, rand_seed=seed, **self.options)
        _, obs, _ = self.games.observe()
        self.episode_return = np.zeros(self.num_envs)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self.film(obs["rgb"], episode_ended=False)
        return obs["rgb"], {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                 dict]:
        self.games.act(np.asarray(actions, dtype=np.int32))
        reward, obs, first = self.games.observe()  # first: this observation begins a new episode
        self.film(obs["rgb"], episode_ended=first[0])
        self.episode_return += reward
        self.episode_length += 1
        info = {"final_info": {"episode": {"r": self.episode_return.copy(),
                                           "l": self.episode_length.copy()}, "_episode": first}}
        self.episode_return[first], self.episode_length[first] = 0.0, 0
        return obs["rgb"], reward, first, np.zeros_like(first), info

    def film(self, obs: np.ndarray, episode_ended: bool) -> None:
        """--capture-video: the first game's frames, scaled up 4x, while the schedule films it."""
        if self.recorder and episode_ended:
            self.recorder.episode_ended()
        if self.recorder and self.recorder.filming:
            self.recorder.add(obs[0].repeat(4, axis=0).repeat(4, axis=1))

    def render(self) -> tuple[np.ndarray]:
        """The first game as the agent sees it, 64x64: what --watch shows."""
        _, obs, _ = self.games.observe()  # the latest observation again, no step taken
        return (obs["rgb"][0],)

    def close(self) -> None:
        if self.games is not None:
            self.games.close()
