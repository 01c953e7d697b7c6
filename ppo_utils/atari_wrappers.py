"""The two Atari wrappers that gymnasium lacks, shared by the ale-py scripts: a lost life ends the
training episode (EpisodicLife), and FIRE starts the games that wait for it (FireReset).

gymnasium's AtariPreprocessing carries out the other preprocessing details; these two are written
here once for ppo_atari.py, ppo_atari_lstm.py and ppo_atari_multigpu.py, as CleanRL's Atari scripts
import them from Stable-Baselines3. Each script marks the detail where it wraps its games
(`[Atari 3]`, `[Atari 4]` in make_env); envpool carries out both in C++ (ppo_atari_envpool.py).
They hold only data (lives, whether the game is over), so checkpoints save them with the game.
"""

import gymnasium as gym


class EpisodicLife(gym.Wrapper):
    """[Atari 3: EpisodicLifeEnv] Losing a life ends the episode for training (terminated=True), so
    the value of the state before a lost life is not bootstrapped from the next life. The game
    itself goes on: after a lost life, reset() takes one no-op step instead of restarting the game.
    (gymnasium's AtariPreprocessing(terminal_on_life_loss=True) lets the vector env reset the game
    at every lost life: the agent would never see a game's later stages.)"""

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
