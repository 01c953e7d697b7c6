"""The two Atari wrappers gymnasium lacks, for the ale-py scripts (CleanRL's import them from
Stable-Baselines3): a lost life ends the training episode (EpisodicLife), and FIRE starts the games
that wait for it (FireReset). They hold only data, which checkpoints save with the game.
"""

import gymnasium as gym


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
