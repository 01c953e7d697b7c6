"""ale-py's Atari games as the Atari scripts need them: which ids are games (check_atari_id); the
two wrappers gymnasium lacks (CleanRL's scripts import them from Stable-Baselines3): a lost life
ends the training episode (EpisodicLife), FIRE starts the games that wait for it (FireReset); and
the outermost wrapper, which saves a game for a checkpoint where it runs (SavableGame).
"""

import gymnasium as gym

from ppo_utils.env_states import env_state
from ppo_utils.environments import gymnasium_spec
from ppo_utils.exits import WrongInput


def check_atari_id(env_id: str) -> None:
    """Refuse an id that is no game of ale-py (which registers its games when asked, here)."""
    try:
        import ale_py
    except ImportError:
        raise WrongInput("this script needs ale-py and opencv-python: pip install -e "
                         "'.[atari]'") from None
    gym.register_envs(ale_py)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game made
    hint = ""
    if env_id.endswith("-v5") and not env_id.startswith("ALE/"):
        hint = (f" (ale-py names it ALE/{env_id}; envpool ids such as {env_id} need "
                "ppo/ppo_atari_envpool.py)")
    spec = gymnasium_spec(env_id, hint)
    if spec.entry_point != "ale_py.env:AtariEnv":
        raise WrongInput(f"{env_id} is not an Atari game of ale-py: this script trains on Atari "
                         "frames only; use ppo/ppo.py for vector observations and "
                         "ppo/ppo_continuous_action.py for Box actions")
    if spec.kwargs.get("continuous"):
        raise WrongInput(f"{env_id} plays ALE's continuous mode, a Box action space: this script "
                         "takes the games' Discrete actions (ppo/ppo_continuous_action.py takes "
                         "Box actions, of vector observations)")


class EpisodicLife(gym.Wrapper):
    """[Atari 3: EpisodicLifeEnv] A lost life ends the episode for training (terminated=True): the
    state before it is not bootstrapped from the next life. The game goes on: reset() then takes a
    no-op step. (AtariPreprocessing(terminal_on_life_loss=True) would restart the game instead.)"""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        # the last life's loss is left to the game's own end, a few frames later in some games
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
    """[Atari 4: FireResetEnv] In games that wait for FIRE (Breakout's ball), press FIRE after every
    reset, a lost life's too, then action 2, as the original wrapper does."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class SavableGame(gym.Wrapper):
    """The outermost wrapper of an ale-py game: saves it where it runs (maybe an --async-envs
    worker, which environments.save_envs reaches through `save_game`)."""

    def save_game(self) -> list[dict] | None:
        return env_state(self)
