"""--capture-video for the environments that no gymnasium wrapper can film (envpool's games,
Procgen's): their frames, collected while gymnasium's schedule films an episode, written as one
video each."""

import warnings
from typing import Callable

import numpy as np


class VideoRecorder:
    """The first environment's frames while the schedule is `filming` its episode (episodes 0, 1,
    8, 27, ..., 1000, 2000, ...), each filmed episode written to `folder` when it ends, at 15 frames
    a second (moviepy writes it)."""

    def __init__(self, folder: str):
        from gymnasium.utils.save_video import capped_cubic_video_schedule, save_video

        # Procgen's gym3 holds imageio-ffmpeg below 0.4, which warns on the first video that
        # pkg_resources is deprecated: noise about a library the scripts do not call themselves.
        warnings.filterwarnings("ignore", "pkg_resources is deprecated", UserWarning)
        self.schedule, self.save_video = capped_cubic_video_schedule, save_video
        self.folder, self.episode, self.frames = folder, 0, []

    @property
    def filming(self) -> bool:
        return self.schedule(self.episode)

    def add(self, frame: np.ndarray) -> None:
        self.frames.append(frame)

    def episode_ended(self) -> None:
        if self.frames:
            self.save_video(self.frames, self.folder, fps=15, episode_index=self.episode)
        self.episode, self.frames = self.episode + 1, []

    def film(self, render: Callable[[], np.ndarray], episode_over: bool) -> None:
        """One step of the filmed environment: its frame, `render()`, taken only while the schedule
        films its episode; then, if the step ended the episode, the episode's video."""
        if self.filming:
            self.add(render())
        if episode_over:
            self.episode_ended()
