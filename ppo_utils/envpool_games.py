"""envpool's Atari games behind a gymnasium vector env's calls, as the ale-py scripts see theirs,
for ppo_atari_envpool.py (Games): the game scores and videos that gymnasium's wrappers add to the
others (no gymnasium wrapper fits an envpool), and the episodes' final observations. An envpool
ends an *episode* at every lost life and clips its rewards; a *game* is over when info["terminated"]
says so or the time limit cuts it off, and its score is the sum of its unclipped rewards,
info["reward"], over all its lives.
"""

import numpy as np

from ppo_utils.video_recorder import VideoRecorder


class Games:
    """The script's envpools (one, or two with --async-envs; game i of all seeded `seed` + i) as one
    gymnasium vector environment of all their games, plus envpool's send() and recv(), which split
    a step so that the caller can work while they play. Each step's info reports the games that
    ended as RecordEpisodeStatistics does (info["final_info"]["episode"]), and the last observation
    of each episode that ended (info["final_obs"]). `video_folder` films the first game."""

    def __init__(self, pools: list, seed: int, video_folder: str | None = None):
        self.pools, self.seed = pools, seed
        firsts = np.cumsum([0] + [pool.config["num_envs"] for pool in pools])
        self.pool_games = [slice(first, end) for first, end in zip(firsts[:-1], firsts[1:])]
        self.num_envs = int(firsts[-1])
        self.metadata = {"render_fps": 15}  # a step is 4 of the console's 60 frames a second
        # envpool's spaces are those of one game, as a vector env's single_ spaces
        self.single_observation_space = pools[0].observation_space
        self.single_action_space = pools[0].action_space
        self.score = np.zeros(self.num_envs)  # of each game so far
        self.recorder = VideoRecorder(video_folder) if video_folder else None

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        """The games' first observations. envpool seeds its games when it makes them: a `seed`
        other than the pools' is refused rather than silently ignored."""
        if seed is not None and seed != self.seed:
            raise ValueError(f"this envpool was seeded {self.seed} when it was made, not {seed}")
        self.score[:] = 0.0
        results = [pool.reset() for pool in self.pools]
        info = joined([info for _, info in results])
        info["env_id"] = np.arange(self.num_envs)  # each pool numbers its own games from 0
        return np.concatenate([obs for obs, _ in results]), info

    def send(self, actions: np.ndarray, pool: int = 0) -> None:
        self.pools[pool].send(actions)

    def recv(self, pool: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminations, truncations, info = self.pools[pool].recv()
        # envpool resets an environment on the step after its episode ended, so where one ended,
        # this step's observation is its last: gymnasium's vector envs call it info["final_obs"].
        info["final_obs"] = obs
        score = self.score[self.pool_games[pool]]  # this pool's share, in place
        # The step after an episode ended is envpool's reset step, which adds reward 0.
        score += info["reward"]
        game_over = info["terminated"].astype(bool) | truncations
        if self.recorder and pool == 0:
            self.recorder.film(lambda: self.pools[0].render(env_ids=[0])[0], game_over[0])
        if game_over.any():
            info["final_info"] = {"episode": {"r": score.copy(), "l": info["elapsed_step"]},
                                  "_episode": game_over}
            score[game_over] = 0.0
        return obs, reward, terminations, truncations, info

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                 dict]:
        """A step of one pool's games (an evaluation's): send() and recv() of several pools are
        the caller's to interleave."""
        if len(self.pools) != 1:
            raise ValueError("step() plays one envpool; with two, send() and recv() each in turn")
        self.send(actions)
        return self.recv()

    def render(self) -> tuple[np.ndarray]:
        """The first game's screen (its pool made with render_mode="rgb_array"), as a vector env's
        render() gives each environment's frame: what --watch shows."""
        return (self.pools[0].render(env_ids=[0])[0],)

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def joined(infos: list[dict]) -> dict:
    """The pools' infos as one, in the games' order: each array (or dict of arrays) joined."""
    return {key: joined([info[key] for info in infos]) if isinstance(infos[0][key], dict)
            else np.concatenate([info[key] for info in infos]) for key in infos[0]}
