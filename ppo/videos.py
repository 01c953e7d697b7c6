"""--capture-video: how the scripts film their first environment. gymnasium's RecordVideo wrapper
films the environments that gymnasium builds (`record_video`); VideoRecorder films, frame by frame,
those that no wrapper can (envpool's games, Procgen's); `render_off_screen` makes either work on a
machine without a display. This module imports no other of this folder.
"""

import os
import sys
import warnings
from typing import Callable

import gymnasium as gym
import numpy as np


def render_off_screen() -> None:
    """--capture-video draws its frames off screen, which on a machine without a display needs two
    settings, made before any environment is built (a user's own choice of either stands). pygame,
    classic control's renderer, starts SDL's video anyway, which prints an error without a display:
    SDL's dummy driver needs none. MuJoCo picks its OpenGL backend when it is first imported: on
    Linux without a display, EGL."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")


def record_video(env: gym.Env, folder: str, episodes: int | None = None) -> gym.Env:
    """`env` filmed into `folder` on gymnasium's schedule: episodes 0, 1, 8, 27, ..., 1000, 2000,
    ...; an evaluation of `episodes` episodes films none past its last (the reset after it starts
    one)."""
    trigger = None
    if episodes is not None:
        from gymnasium.utils.save_video import capped_cubic_video_schedule as schedule

        trigger = lambda episode: episode < episodes and schedule(episode)  # noqa: E731
    return gym.wrappers.RecordVideo(env, folder, episode_trigger=trigger)


class VideoRecorder:
    """--capture-video where no gymnasium wrapper films the environments (envpool's, Procgen's):
    the script adds the first environment's frames while the schedule is `filming` its episode
    (gymnasium's: episodes 0, 1, 8, 27, ..., 1000, 2000, ...), and each filmed episode is written
    to `folder` when it ends, at 15 frames a second (moviepy writes it)."""

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
        """One step of the filmed environment: its frame, `render()`, called only while the schedule
        films its episode; then, if the step ended the episode, the episode's video."""
        if self.filming:
            self.add(render())
        if episode_over:
            self.episode_ended()
