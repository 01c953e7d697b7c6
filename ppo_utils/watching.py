"""--watch: a saved agent's games in a window as it plays them, at the game's own frame rate or
--watch-fps, drawn from the frames the environment renders (those --capture-video films)."""

import os
import sys
import time

import numpy as np

from ppo_utils.exits import WrongInput


def check_display() -> None:
    """Refuse --watch where no window can open: on Linux, without an X or a Wayland display."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY")
                                                 or os.environ.get("WAYLAND_DISPLAY")):
        raise WrongInput("--watch opens a window, and there is no display (DISPLAY is not set): "
                         "film the games with --capture-video instead, or give them a virtual "
                         "display: xvfb-run -a python ... --watch")


class Window:
    """A window showing each frame it is given, `fps` a second at most. Closing it stops the
    evaluation as Ctrl-C does."""

    def __init__(self, title: str, fps: float):
        try:
            import pygame
        except ImportError:
            raise WrongInput("--watch draws with pygame: pip install -e '.[classic-control]'") \
                from None
        self.pygame, self.title, self.fps, self.screen = pygame, title, fps, None
        # The window's pixels put there by the CPU: SDL's OpenGL framebuffer would take over the GL
        # context MuJoCo renders its frames with, and both would then draw black.
        os.environ.setdefault("SDL_FRAMEBUFFER_ACCELERATION", "0")
        pygame.display.init()
        self.next_frame = time.monotonic()

    def show(self, frame: np.ndarray) -> None:
        pygame = self.pygame
        if any(event.type == pygame.QUIT for event in pygame.event.get()):
            raise KeyboardInterrupt  # the window closed: as Ctrl-C
        height, width = frame.shape[:2]
        if self.screen is None:  # small frames (Procgen's 64x64, Atari's 210x160) made larger
            scale = max(1, 640 // max(height, width))
            self.screen = pygame.display.set_mode((width * scale, height * scale))
            pygame.display.set_caption(self.title)
        surface = pygame.surfarray.make_surface(np.ascontiguousarray(frame[..., :3].swapaxes(0, 1)))
        self.screen.blit(pygame.transform.scale(surface, self.screen.get_size()), (0, 0))
        pygame.display.flip()
        self.next_frame = max(self.next_frame + 1 / self.fps, time.monotonic() - 1 / self.fps)
        time.sleep(max(0.0, self.next_frame - time.monotonic()))

    def close(self) -> None:
        self.pygame.display.quit()
