"""envpool's Atari games as the ale-py scripts see theirs, for ppo_atari_envpool.py: what
gymnasium's RecordEpisodeStatistics and RecordVideo add to a vector environment of games, which no
gymnasium wrapper can add to an envpool (CleanRL's envpool script writes its own for the first).

An envpool ends an *episode* at every lost life (episodic_life) and clips its rewards; a *game* is
over when envpool's info["terminated"] says so, or when the time limit cuts it off. The score that
matters is the game's: the sum of the unclipped rewards, info["reward"], over all its lives. Like
atari_wrappers, this is not run machinery; it imports only videos of this folder, and envpool is
never imported: the pool is built by the script.
"""

import numpy as np

import videos


class Games:
    """One envpool (`pool`, made by the script with `num_envs` games and seeded `seed`) behind the
    calls of a gymnasium vector environment, plus envpool's two that split a step: send() the
    actions, recv() what the games return, so that the caller can work while the games play.

    Each step's info reports the games that ended as a gymnasium vector env files
    RecordEpisodeStatistics' report, under info["final_info"]["episode"] (which
    run_life.finished_episodes reads): score and length (envpool's info["elapsed_step"]).
    `video_folder` films the first game."""

    def __init__(self, pool, num_envs: int, seed: int, video_folder: str | None = None):
        self.pool, self.num_envs, self.seed = pool, num_envs, seed
        # envpool's spaces are those of one game, as a vector env's single_ spaces
        self.single_observation_space = pool.observation_space
        self.single_action_space = pool.action_space
        self.score = np.zeros(num_envs)  # of each game so far
        self.recorder = videos.VideoRecorder(video_folder) if video_folder else None

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        """The games' first observations. envpool seeds its games when it makes them: a `seed`
        other than the pool's is refused rather than silently ignored."""
        if seed is not None and seed != self.seed:
            raise ValueError(f"this envpool was seeded {self.seed} when it was made, not {seed}")
        self.score[:] = 0.0
        return self.pool.reset()

    def send(self, actions: np.ndarray) -> None:
        self.pool.send(actions)

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminations, truncations, info = self.pool.recv()
        # The step after an episode ended is envpool's reset step, which adds reward 0.
        self.score += info["reward"]
        game_over = info["terminated"].astype(bool) | truncations
        if self.recorder:
            self.recorder.film(lambda: self.pool.render(env_ids=[0])[0], game_over[0])
        if game_over.any():
            info["final_info"] = {"episode": {"r": self.score.copy(), "l": info["elapsed_step"]},
                                  "_episode": game_over}
            self.score[game_over] = 0.0
        return obs, reward, terminations, truncations, info

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                 dict]:
        self.send(actions)
        return self.recv()

    def close(self) -> None:
        self.pool.close()
