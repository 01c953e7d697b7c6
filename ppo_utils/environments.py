"""The environments as the scripts use them, beyond what gymnasium gives: which ones each script
trains on (the ids, before anything is built, and the spaces of what was built: a refusal is one
line that names the script to use instead), their games saved for a checkpoint and put back where
they run, the episodes that ended in a step, and --capture-video's filming of the first environment.
"""

import contextlib
import functools
import importlib
import io
import os
import signal
import sys
import warnings
from typing import Callable

import gymnasium as gym
import numpy as np

from ppo_utils.env_states import env_state, mismatch, restore_env
from ppo_utils.exits import STOP_SIGNALS, WrongInput


# Which script of the collection trains on which action space, and on which observations: named in
# the line that refuses an environment, so that the user knows where to go.
SCRIPT_FOR_ACTIONS = {"Discrete": "ppo/ppo.py", "Box": "ppo/ppo_continuous_action.py",
                      "MultiDiscrete": "ppo/ppo_multidiscrete.py"}
SCRIPT_FOR_IMAGES = "ppo/ppo_atari.py"


def check_spaces(envs, env_id: str, actions: tuple[type, ...],
                 vector_observations: bool = True) -> None:
    """Refuse environments whose action space is none of `actions`, or (with `vector_observations`)
    whose observations are not flat vectors, naming the script that takes them. `envs` is a vector
    environment, or an envpool, whose spaces are one environment's."""
    action_space = getattr(envs, "single_action_space", None) or envs.action_space
    space = getattr(envs, "single_observation_space", None) or envs.observation_space
    if not isinstance(action_space, actions):
        envs.close()
        kind = type(action_space).__name__
        wanted = " or ".join(space.__name__ for space in actions)
        hint = (f"use {SCRIPT_FOR_ACTIONS[kind]} for {kind} actions" if kind in SCRIPT_FOR_ACTIONS
                else "no script here takes these: expose Discrete, MultiDiscrete or Box actions "
                     "in your environment")
        raise WrongInput(f"{env_id} has a {kind} action space, but this script trains on {wanted} "
                         f"actions: {hint}")
    if vector_observations and (not isinstance(space, gym.spaces.Box) or len(space.shape) != 1):
        envs.close()
        if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            hint = (": flatten them into one vector (gymnasium.wrappers.FlattenObservation) in "
                    "your environment")
        else:
            images = len(getattr(space, "shape", None) or ()) == 3
            hint = f": use {SCRIPT_FOR_IMAGES} for images" if images else ""
        raise WrongInput(f"{env_id} observations are {type(space).__name__}, but this script needs "
                         f"flat vectors (a one-dimensional Box){hint}")


def gymnasium_spec(env_id: str, hint: str = "") -> gym.envs.registration.EnvSpec:
    """The registration of `env_id`; an id that gymnasium does not know is refused in one line, with
    `hint` (the script to use instead, say).

    `module:EnvId` is gymnasium's way to name an environment that a package of the user's registers
    when it is imported: the module is imported first, as gym.make does, so that the id is known
    when it is looked up (gym.make imports it again, a no-op, and so do the worker processes of
    --async-envs, where the environments are made). A module that does not import, or an id it does
    not register, is refused in one line that says which."""
    module, _, bare_id = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as error:  # ModuleNotFoundError, or whatever the user's module raised
            raise WrongInput(f"--env-id {env_id}: cannot import the module {module!r} "
                             f"({type(error).__name__}: {error}): is it installed, or on "
                             "PYTHONPATH?")
    try:
        return gym.spec(bare_id)
    except gym.error.Error as error:
        if module:
            raise WrongInput(f"--env-id {env_id}: importing {module!r} registered no environment "
                             f"{bare_id!r} (gymnasium.register(id=..., entry_point=...) in the "
                             "module makes one)")
        raise WrongInput(f"unknown env id {env_id!r}{hint}: {error}")


def check_gymnasium_id(env_id: str, atari: bool = False,
                       envpool_namespace: str | None = None) -> None:
    """Refuse an id that gymnasium does not know (`gymnasium_spec`) and, for a script that trains on
    `atari` games, one that is not an ale-py game, naming the script to use instead. ale-py (0.9 and
    later) registers its games only when asked: that is done here, with its banner silenced. For a
    script that also takes envpool's ids of `envpool_namespace` (Jumanji/...), a bare one of them
    (envpool.list_all_envs() lists both) is refused with the id to give."""
    if not atari:
        atari_id = "NoFrameskip" in env_id or env_id.startswith("ALE/")
        hint = " (Atari ids need ppo/ppo_atari.py)" if atari_id else ""
        if envpool_namespace and ":" not in env_id and env_id not in gym.registry:
            with contextlib.suppress(ImportError), contextlib.redirect_stderr(io.StringIO()):
                import envpool

                ported = f"{envpool_namespace}/{env_id}"
                if ported in envpool.list_all_envs():
                    hint = f" (envpool's port of it is {ported}: --env-id {ported})"
        gymnasium_spec(env_id, hint)
        return
    try:
        import ale_py
    except ImportError:
        raise WrongInput("this script needs ale-py and opencv-python: pip install -e '.[atari]'")
    gym.register_envs(ale_py)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game made
    hint = ""
    if env_id.endswith("-v5") and not env_id.startswith("ALE/"):
        hint = (f" (ale-py names it ALE/{env_id}; envpool ids such as {env_id} need "
                "ppo/ppo_atari_envpool.py)")
    if gymnasium_spec(env_id, hint).entry_point != "ale_py.env:AtariEnv":
        raise WrongInput(f"{env_id} is not an Atari game of ale-py: this script trains on Atari "
                         "frames only; use ppo/ppo.py for vector observations and "
                         "ppo/ppo_continuous_action.py for Box actions")


def check_envpool_id(env_id: str, kinds: tuple[str, ...] | None,
                     example: str) -> None:
    """Refuse an id that envpool does not have, or one of another kind of task than `kinds` (the
    names of envpool's spec classes, such as AtariEnvSpec; None takes any), naming the script to
    use instead; `example` is an id of the kind the script takes."""
    try:
        # envpool 1.0 imports the retired `gym` package where it is installed (Procgen's extra
        # brings it), and gym prints a notice about itself that concerns no user of this collection.
        with contextlib.redirect_stderr(io.StringIO()):
            import envpool
    except ImportError:
        raise WrongInput("this script needs envpool: pip install -e '.[envpool]'")
    if env_id not in envpool.list_all_envs():
        hint = ""
        if env_id.endswith("NoFrameskip-v4") or env_id.startswith("ALE/"):
            game = env_id.removeprefix("ALE/").removesuffix("NoFrameskip-v4").removesuffix("-v5")
            hint = (f" (envpool names the game {game}-v5; ale-py ids such as {env_id} need "
                    "ppo/ppo_atari.py)")
        raise WrongInput(f"unknown env id {env_id!r}{hint}: envpool's ids of this kind are named "
                         f"like {example}")
    kind = type(envpool.make_spec(env_id)).__name__
    if kinds is not None and kind not in kinds:
        raise WrongInput(f"{env_id} is not a task this script trains on ({kind}): use ppo/ppo.py "
                         "for vector observations and ppo/ppo_continuous_action.py for Box actions")


# Procgen's 16 games, and the two distribution modes that only some of them have ("exploration" is
# one hard level per game, fixed by Procgen).
PROCGEN_GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball",
                 "fruitbot", "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder",
                 "starpilot")
PROCGEN_MODE_GAMES = {"memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
                      "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper",
                                      "leaper", "maze", "ninja")}


def check_procgen_id(env_id: str, distribution_mode: str, num_levels: int,
                     start_level: int, installed: bool) -> None:
    """Refuse a game that Procgen does not have (naming the one meant, or the script to use
    instead), a distribution mode the game lacks, levels the exploration mode does not take, and
    Procgen not `installed` (the script could not import it)."""
    if env_id not in PROCGEN_GAMES:
        hint = ""
        game = next((game for game in PROCGEN_GAMES if game in env_id.lower()), None)
        if "NoFrameskip" in env_id or env_id.startswith("ALE/"):
            hint = " (Atari games need ppo/ppo_atari.py)"
        elif game:  # StarPilot, StarpilotEasy-v0 (envpool), procgen:procgen-starpilot-v0 (gym)
            hint = f" (did you mean {game!r}?)"
        elif env_id in gym.registry:
            hint = " (a gymnasium id: use ppo/ppo.py or ppo/ppo_continuous_action.py for those)"
        raise WrongInput(f"unknown Procgen game {env_id!r}{hint}: pick one of "
                         f"{', '.join(PROCGEN_GAMES)}")
    mode_games = PROCGEN_MODE_GAMES.get(distribution_mode, PROCGEN_GAMES)
    if env_id not in mode_games:
        raise WrongInput(f"{env_id} has no {distribution_mode!r} distribution mode: only "
                         f"{', '.join(mode_games)} have it")
    if distribution_mode == "exploration" and (num_levels, start_level) != (0, 0):
        raise WrongInput("the exploration mode plays the one level Procgen picks for the game: "
                         "leave out --num-levels and --start-level")
    if not installed:
        raise WrongInput("Procgen is not installed: pip install -e \".[procgen]\"")


@contextlib.contextmanager
def packages_checked(env_id: str):
    """Within the block, an ImportError (a registered id whose code needs a package, or a version of
    one, that is not installed) ends the run in one line, naming a newer version of the id if
    any."""
    try:
        yield
    except ImportError as error:
        namespace, name, version = gym.envs.registration.parse_env_id(env_id.rpartition(":")[2])
        newest = gym.envs.registration.find_highest_version(namespace, name)
        newest_id = gym.envs.registration.get_env_id(namespace, name, newest)
        hint = "" if newest in (None, version) else f" (try {newest_id})"
        raise WrongInput(f"{env_id} cannot be made with the packages installed: {error}{hint}")


def vector_env(env_fns: list[Callable[[], gym.Env]], env_id: str,
               saved_envs: list | None = None, async_envs: bool = False) -> gym.vector.VectorEnv:
    """The environments `env_fns` build, as one vector environment whose autoreset is SAME_STEP
    (the step that ends an episode resets it), stepped one after the other, or each in a worker
    process of its own with `async_envs`; built anew and put back where a checkpoint's
    `saved_envs` left them. A registered id whose code needs a package that is missing is refused
    in one line."""
    if saved_envs is not None:
        env_fns = restored_envs(env_fns, saved_envs)
    with packages_checked(env_id):
        if async_envs:
            return async_vector_env(env_fns)
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def async_vector_env(env_fns: list[Callable[[], gym.Env]]) -> gym.vector.AsyncVectorEnv:
    """--async-envs: each environment in a worker process of its own, all stepping at once, the
    observations coming back through shared memory; SAME_STEP autoreset, as the scripts' sync envs.
    forkserver: the workers start from a clean process, not a copy of this one with its threads.
    AsyncVectorEnv builds one environment here too, for the spaces: this process's signal handlers
    are kept."""
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    envs = gym.vector.AsyncVectorEnv(
        [functools.partial(in_worker, make_env) for make_env in env_fns],
        shared_memory=True, context="forkserver", autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    return envs


def in_worker(make_env: Callable[[], gym.Env]) -> gym.Env:
    """Build an environment in a worker process of --async-envs. Ctrl-C reaches every process of the
    terminal's group, and a Slurm task's end or torchrun's SIGTERM every process of the run, but
    they are the main process's to handle (finish the iteration, save): the worker ignores them, and
    ends when the main process closes the environments."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # AsyncVectorEnv built the first environment once in the main process too, for its spaces; with
    # video that made the (new) folder, which RecordVideo here would warn of as if it held old
    # videos.
    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
    return make_env()


# A checkpoint holds each environment's state (env_states.py: one environment's, as data), saved and
# put back where the environment runs: in this process, or in a worker process of --async-envs.


class SavableGame(gym.Wrapper):
    """The outermost wrapper of an ale-py game: it saves the game it wraps where the game runs. With
    --async-envs that is a worker process, which `envs.call("save_game")` reaches (`save_envs`)."""

    def save_game(self) -> list[dict] | None:
        """The game's full state as data (`env_state`: the emulator's, the wrappers' and the random
        generators'); None for the game whose video is being recorded: the recorder is not saved, so
        a resumed run starts new games."""
        return env_state(self)


def save_envs(envs: gym.vector.VectorEnv) -> list[list[dict]] | None:
    """Every environment's state (`env_state`), so a resumed run continues the very same episodes;
    None where one cannot be saved as data (video recording, for one). The environments of an
    AsyncVectorEnv live in worker processes, where each ale-py game saves itself (SavableGame); a
    SyncVectorEnv's are saved here, and an ale-py game's state is the same either way, so a run
    saved with --async-envs may resume without it, and the other way round."""
    if isinstance(envs, gym.vector.SyncVectorEnv):
        saved = [env_state(env) for env in envs.envs]
    else:
        saved = list(envs.call("save_game"))
    return None if any(state is None for state in saved) else saved


def restored_envs(env_fns: list[Callable[[], gym.Env]], saved: list) -> list[Callable[[], gym.Env]]:
    """A function per environment that builds it with its function of `env_fns` and puts its state
    of `saved` (`save_envs`) back: for a SyncVectorEnv, or for the worker processes of
    an AsyncVectorEnv, where each game is then rebuilt."""
    if not isinstance(saved, list) or len(saved) != len(env_fns):
        held = len(saved) if isinstance(saved, list) else "no list of"
        raise mismatch(f"the checkpoint holds {held} environments, not {len(env_fns)}")
    return [functools.partial(restore_env, make_env, state) for make_env,
            state in zip(env_fns, saved)]


def finished_episodes(infos: dict) -> list[tuple[float, int]]:
    """(score, length) of every episode that ended in this step of a vector environment, as
    gymnasium's RecordEpisodeStatistics reports it (at the real end: the Atari wrappers put it below
    the lost-life and reward-clipping ones); the vector env files the report of a step that ended
    an episode under `final_info`."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    return [(float(final["episode"]["r"][i]), int(final["episode"]["l"][i]))
            for i in np.flatnonzero(final["_episode"])]


# --capture-video: gymnasium's RecordVideo wrapper films the environments that gymnasium builds
# (`record_video`); VideoRecorder films, frame by frame, those that no wrapper can (envpool's games,
# Procgen's); `render_off_screen` makes either work on a machine without a display.


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
