"""envpool's C++ ports of Jumanji's tasks as gymnasium environments (JumanjiGame), for
ppo_multidiscrete.py: a game gymnasium's wrappers count, film and show as any other."""

import gymnasium as gym
import numpy as np

from ppo_utils.exits import WrongInput


class JumanjiGame(gym.Env):
    """One of envpool's C++ ports of Jumanji's tasks as a gymnasium environment: a pool of one game,
    made anew on the seed a reset is given. envpool resets a finished game on the step after its
    end, whatever that step's action: a reset after an episode's end is that step."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}  # the grid envpool draws

    def __init__(self, env_id: str, render_mode: str | None = None):
        import envpool

        self.render_mode = render_mode  # "rgb_array": filmed by --capture-video, shown by --watch
        self.make_pool = lambda seed: envpool.make(env_id, env_type="gymnasium", num_envs=1,
                                                   seed=seed, render_mode=render_mode)
        try:
            self.pool, self.finished = self.make_pool(0), False
        except Exception as error:  # envpool's own: a game whose data its wheel lacks (Sudoku)
            raise WrongInput(f"envpool cannot make {env_id} ({str(error).splitlines()[0]}): train "
                             "on another of its Jumanji games")
        self.observation_space, self.action_space = self.pool.observation_space, \
            self.pool.action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.pool, self.finished = self.make_pool(seed), False
        if self.finished:  # the pool's own reset: the step after the end, its action ignored
            obs, *_, info = self.pool.step(np.zeros((1, *self.action_space.shape), np.int32))
        else:
            obs, info = self.pool.reset()
        self.finished = False
        return first_of(obs), first_of(info)

    def step(self, action: np.ndarray):
        obs, reward, terminated, truncated, info = map(first_of, self.pool.step(action[None]))
        self.finished = bool(terminated or truncated)
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> np.ndarray:
        return self.pool.render(env_ids=[0])[0]


def first_of(batch):
    """The first environment's share of a pool's output: an array, or a dict of them (nested)."""
    return ({key: first_of(value) for key, value in batch.items()} if isinstance(batch, dict)
            else batch[0])
