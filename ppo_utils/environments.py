"""The environments as the scripts use them: which ids a script trains on (refused in one line
naming the script to use instead), their vector (SAME_STEP autoreset, --async-envs), their states
saved and put back where they run, the episodes that ended, and --capture-video's filming."""

import contextlib
import functools
import importlib
import os
import signal
import sys
import warnings
from typing import Callable

import gymnasium as gym
import numpy as np

from ppo_utils.env_states import env_state, mismatch, restore_env
from ppo_utils.exits import STOP_SIGNALS, WrongInput

def gymnasium_spec(env_id: str, hint: str = "") -> gym.envs.registration.EnvSpec:
    """The registration of `env_id`, or a refusal with `hint`. `module:EnvId` names one that the
    user's module registers: imported first, as gym.make (and each --async-envs worker) does."""
    module, _, bare_id = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as error:  # ModuleNotFoundError, or whatever the user's module raised
            raise WrongInput(f"--env-id {env_id}: cannot import the module {module!r} "
                             f"({type(error).__name__}: {error}): is it installed, or on "
                             "PYTHONPATH?") from None
    try:
        return gym.spec(bare_id)
    except gym.error.Error as error:
        if module:
            raise WrongInput(f"--env-id {env_id}: importing {module!r} registered no environment "
                             f"{bare_id!r} (gymnasium.register(id=..., entry_point=...) in the "
                             "module makes one)") from None
        raise WrongInput(f"unknown env id {env_id!r}{hint}: {error}") from None


@contextlib.contextmanager
def packages_checked(env_id: str):
    """An ImportError within (an id whose code needs a package not installed) is refused in one
    line, naming a newer version of the id if there is one."""
    try:
        yield
    except ImportError as error:
        namespace, name, version = gym.envs.registration.parse_env_id(env_id.rpartition(":")[2])
        newest = gym.envs.registration.find_highest_version(namespace, name)
        newest_id = gym.envs.registration.get_env_id(namespace, name, newest)
        hint = "" if newest in (None, version) else f" (try {newest_id})"
        raise WrongInput(f"{env_id} cannot be made with the packages installed: {error}"
                         f"{hint}") from None


def vector_env(env_fns: list[Callable[[], gym.Env]], env_id: str,
               saved_envs: list | None = None, async_envs: bool = False) -> gym.vector.VectorEnv:
    """The environments `env_fns` build as one vector environment, autoreset SAME_STEP (the step
    that ends an episode resets it), each in a worker process with `async_envs`; put back where a
    checkpoint's `saved_envs` left them."""
    if saved_envs is not None:
        env_fns = restored_envs(env_fns, saved_envs)
    with packages_checked(env_id):
        if async_envs:
            return async_vector_env(env_fns)
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def async_vector_env(env_fns: list[Callable[[], gym.Env]]) -> gym.vector.AsyncVectorEnv:
    """--async-envs: observations through shared memory, workers started clean (forkserver), not
    copied with this process's threads; this process's signal handlers kept."""
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    envs = gym.vector.AsyncVectorEnv(
        [functools.partial(in_worker, make_env) for make_env in env_fns],
        shared_memory=True, context="forkserver", autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    return envs


def in_worker(make_env: Callable[[], gym.Env]) -> gym.Env:
    """An environment built in a worker of --async-envs, which leaves the stop signals (sent to
    every process) to the main process: it ends when that one closes the environments."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # the environment built for the spaces made the (new) videos' folder: it holds no old videos
    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
    return make_env()


def save_envs(envs: gym.vector.VectorEnv) -> list[list[dict]] | None:
    """Every environment's state (env_states), or None where one cannot be saved (one that films).
    Saved in a worker or here, it is the same: --async-envs may differ on resuming."""
    if isinstance(envs, gym.vector.SyncVectorEnv):
        saved = [env_state(env) for env in envs.envs]
    else:
        saved = list(envs.call("save_game"))
    return None if any(state is None for state in saved) else saved


def restored_envs(env_fns: list[Callable[[], gym.Env]], saved: list) -> list[Callable[[], gym.Env]]:
    """A function per environment that builds it and puts its `saved` state back."""
    if not isinstance(saved, list) or len(saved) != len(env_fns):
        held = len(saved) if isinstance(saved, list) else "no list of"
        raise mismatch(f"the checkpoint holds {held} environments, not {len(env_fns)}")
    return [functools.partial(restore_env, make_env, state)
            for make_env, state in zip(env_fns, saved)]


def finished_episodes(infos: dict) -> list[tuple[float, int]]:
    """(score, length) of each episode that ended in this step (RecordEpisodeStatistics')."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    return [(float(final["episode"]["r"][i]), int(final["episode"]["l"][i]))
            for i in np.flatnonzero(final["_episode"])]


def render_off_screen(window: bool = False) -> None:
    """The frames --capture-video films and --watch shows are drawn off screen, which needs, before
    any environment is built, SDL's dummy driver (pygame's, classic control's) unless --watch's
    `window` takes SDL's display, and, without a display, EGL for MuJoCo."""
    if not window:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")


def record_video(env: gym.Env, folder: str | None, episodes: int | None = None) -> gym.Env:
    """`env` filmed into `folder`, episodes 0, 1, 8, 27, ..., 1000, 2000, ... (an evaluation's, of
    `episodes` episodes, none past its last); not filmed without a folder (--watch alone)."""
    from gymnasium.utils.save_video import capped_cubic_video_schedule as schedule

    if folder is None:
        return env

    return gym.wrappers.RecordVideo(env, folder, episode_trigger=None if episodes is None else (
        lambda episode: episode < episodes and schedule(episode)))
