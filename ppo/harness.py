"""The harness of the PPO scripts: everything a run needs that is not PPO, written once for all seven.

Each script in this folder holds PPO whole (its settings, environments, agent, GAE, loss and training
loop), so that one file teaches the algorithm. What surrounds a run lives here, in the order a run
meets it:

1. errors: one line that says what to do, and exit code 2 (`fail`);
2. the command line, where --resume and --evaluate take a checkpoint's settings (`parse_args`), and
   the engine that runs a script's rules for its flags (`check_rules`);
3. checkpoints, which are data and read as data, so that reading one runs no code: reading, writing,
   the random generators' state (`load_checkpoint`, `save_checkpoint`);
4. the environments' state, saved as data and put back into environments built anew (`save_envs`,
   `SavableGame`, `restored_envs`);
5. the run itself: name, folder, device, seeds, TensorBoard and W&B, the clock and the progress line,
   Ctrl-C and the other signals that stop it (`kill`, Slurm's), the checkpoints it writes and what it
   says at the end (`Run`);
6. the speed options' wiring, where it is not a marked line in a script's loop (`compiled`, ...);
7. evaluation: the device, the seeds, and each played episode's score (`Evaluation`);
8. the command `python ppo/<script>.py` itself: exit codes, a second signal, missing packages (`run`).

It knows no script: a script passes in what it needs (its Args class, its name, its main and evaluate
functions), and nothing here imports one. The fields of Args read here are those every script has:
env_id, exp_name, seed, torch_deterministic, cuda, cudagraphs, compile, track, wandb_project_name,
wandb_entity, capture_video, save_model, save_interval, save_minutes, resume, trust_old_checkpoint,
evaluate, eval_episodes and total_timesteps. A script copied elsewhere needs this file beside it.
"""

import contextlib
import functools
import importlib
import math
import os
import pickle
import random
import signal
import sys
import time
import types
import warnings
from collections import deque
from dataclasses import asdict, fields, replace
from time import monotonic  # not time.monotonic: tests replace `time` by a clock of their own
from typing import Callable, NoReturn

import cloudpickle
import gymnasium as gym
import numpy as np
import torch
import tyro
from torch.utils.tensorboard import SummaryWriter

# Procgen's gym3 holds imageio-ffmpeg below 0.4, which warns when the first video is written that
# pkg_resources is deprecated: noise about a library no script calls itself.
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)


# ---------------------------------------------------------------------------------------------------
# 1. Errors
# ---------------------------------------------------------------------------------------------------


def fail(variant: str, message: str) -> NoReturn:
    """Stop with `<variant>.py: error: <message>` on one line and exit code 2: for wrong input, never
    for bugs. Under torchrun every process of a node finds the same mistake, so only its first one
    (local rank 0) prints it: one line per node, since a node may lack what others have."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"{variant}.py: error: {message}", file=sys.stderr)
    release_unused_run_folders()
    raise SystemExit(2)


# ---------------------------------------------------------------------------------------------------
# 2. The command line
# ---------------------------------------------------------------------------------------------------


def parse_args(args_class: type, variant: str, runtime_fields: set[str], evaluation_fields: set[str],
               argv: list[str] | None = None, evaluation_keeps: tuple[str, ...] = ("env_id",), doc: str = ""):
    """Read the command line into `args_class`; returns the settings and the checkpoint that --resume
    or --evaluate names (None without either), read once, here. --help begins with the first two
    paragraphs of `doc`, the script's docstring: what it is for, and its commands.

    With a checkpoint its settings are the defaults, so `--resume PATH` alone continues the run. A
    resumed run may change only the `runtime_fields` (how it runs, not what it learns) and refuses any
    other flag that contradicts the checkpoint. An evaluation starts from the default run-time options,
    may change the `evaluation_fields` (the seed of its games, say), must keep `evaluation_keeps` (the
    environment) and refuses every other training flag, which it would silently ignore."""
    description = "\n\n".join(doc.split("\n\n")[:2])
    args = tyro.cli(args_class, args=argv, description=description)
    if args.resume and args.evaluate:
        fail(variant, "--resume goes on training a saved run and --evaluate plays a saved agent: give one of them")
    if not (args.resume or args.evaluate):
        return args, None
    path = args.resume or args.evaluate
    checkpoint = load_checkpoint(path, variant, resuming=bool(args.resume), trust_old=args.trust_old_checkpoint)
    unknown = sorted(map(str, set(checkpoint["args"]) - {field.name for field in fields(args_class)}))
    if unknown:
        fail(variant, f"{path!r} was written by another version of {variant}.py, with settings this one lacks "
                      f"({', '.join(unknown)}): continue it with that version, or start the run again")
    # --trust-old-checkpoint speaks for this command alone: never taken from a checkpoint, free to differ.
    runtime_fields = runtime_fields | {"trust_old_checkpoint"}
    saved = replace(args_class(**checkpoint["args"]), resume=None, evaluate=None, trust_old_checkpoint=False)
    if args.evaluate:
        saved = replace(saved, **{name: getattr(args_class(), name) for name in runtime_fields})
    args = tyro.cli(args_class, args=argv, default=saved, description=description)
    kept = evaluation_keeps if args.evaluate else [f.name for f in fields(args_class) if f.name not in runtime_fields]
    for name in kept:
        if getattr(args, name) != getattr(saved, name):
            flag = "--" + name.replace("_", "-")
            fail(variant, f"the checkpoint was made with {flag} {getattr(saved, name)}, not "
                          f"{getattr(args, name)}: drop {flag} to keep the checkpoint's value")
    if args.evaluate:
        for name in (f.name for f in fields(args_class) if f.name not in runtime_fields | evaluation_fields):
            if getattr(args, name) != getattr(saved, name):
                fail(variant, f"--{name.replace('_', '-')} is a training setting, which --evaluate does not use: "
                              "drop it")
    return args, checkpoint


def check_rules(args, variant: str, rules: list[tuple[str, str, Callable]]) -> None:
    """Refuse the first flag that breaks its rule, naming the flag, the rule, the value and the default.
    `rules` is a script's table: (field names separated by spaces, what each must be, whether a value
    is allowed)."""
    defaults = type(args)()
    for names, requirement, allowed in rules:
        for name in names.split():
            value = getattr(args, name)
            if not allowed(value):
                default = getattr(defaults, name)
                fail(variant, f"--{name.replace('_', '-')} must be {requirement}, got {value!r}"
                              + ("" if default is None else f": the default is {default!r}"))


# ---------------------------------------------------------------------------------------------------
# 3. Checkpoints
# ---------------------------------------------------------------------------------------------------


# The format of the checkpoints written here: 2, data only. A checkpoint is read with torch.load's
# weights_only=True, which builds tensors, plain containers, numbers, strings and bytes, and of other
# types only those allowed here (NumPy's arrays and scalars of numbers): reading it runs no code that
# the file names. A checkpoint without "format" is of the older format, whose environments were
# pickled Python objects (see OldPickle).
CHECKPOINT_FORMAT = 2
# What an evaluation reads of a checkpoint: the weights, with the statistics the agent owns (they are
# in its state_dict), and the settings.
EVALUATION_KEYS = ("variant", "args", "run_name", "model")


def numpy_types() -> list:
    """The NumPy types a checkpoint may hold besides tensors: arrays and scalars of booleans and numbers
    (random-generator states, statistics, observations, the environments' arrays), allowed under the
    names both NumPy 1 and NumPy 2 pickle them with. Arrays of Python objects stay refused. And `bytes`,
    which torch.save's pickle protocol calls for an empty bytes (an empty array's data)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # NumPy before 1.26
        from numpy.core import multiarray
    allowed = [bytes, np.ndarray, np.dtype] + [type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"]
    for function in (multiarray._reconstruct, multiarray.scalar):
        allowed += [(function, f"numpy.{core}.multiarray.{function.__name__}") for core in ("core", "_core")]
    return allowed


def read_data(path: str, variant: str):
    """The checkpoint at `path`, read as data: torch.load(weights_only=True) with the NumPy types of
    `numpy_types`. A file that names anything else (a function that unpickling would call, a class it
    would build) is refused in one line that names it."""
    with torch.serialization.safe_globals(numpy_types()):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds of errors for a file it cannot read
            lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
            try:
                found = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            except Exception:  # not a file that torch.save wrote
                fail(variant, f"cannot read checkpoint {path!r}: {lines[0]}")
    if found:
        held = f"{', '.join(found)}, which loading it would call or build"
    elif lines[0].startswith("Weights only load failed") and len(lines) > 2:
        held = f"what a checkpoint never holds ({lines[-2]})"  # torch's reason, between its advice
    else:
        fail(variant, f"cannot read checkpoint {path!r}: {lines[0]}")
    fail(variant, f"refusing {path!r}: it holds {held}; the checkpoints of these scripts hold only tensors, "
                  "arrays, numbers and text, so this file was made otherwise or altered")


class OldPickle(bytes):
    """Pickled environments of a checkpoint in the older format. Only load_checkpoint makes these, from
    such a checkpoint's bytes, when the user resumes it with --trust-old-checkpoint: they are the only
    bytes ever unpickled here, and no file can hold one (reading builds no class of this module)."""


def old_pickles(saved):
    """`saved`, the environments of an older checkpoint (bytes, or lists of bytes), its bytes marked as
    OldPickle."""
    if isinstance(saved, list):
        return [old_pickles(item) for item in saved]
    return OldPickle(saved) if isinstance(saved, bytes) else saved


def load_checkpoint(path: str, variant: str, resuming: bool = False, trust_old: bool = False) -> dict:
    """Read a checkpoint written by the script `variant`, as data (`read_data`): reading it runs no code.
    Refuse anything else with a clear message. An evaluation gets only what it reads (EVALUATION_KEYS).

    A checkpoint of the older format (written before format 2) evaluates as it is, its weights and
    settings being data; but its environments are pickled objects, which can run any code when they
    are loaded, so it resumes only with `trust_old` (--trust-old-checkpoint), and its bytes are then
    marked for unpickling (OldPickle). The checkpoints the resumed run writes are of the new format."""
    if not os.path.isfile(path):
        several_nodes = int(os.environ.get("WORLD_SIZE", "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        fail(variant, f"no checkpoint at {path!r}" + (" (every node needs it, at this path)" if several_nodes else ""))
    checkpoint = read_data(path, variant)
    if not isinstance(checkpoint, dict) or "variant" not in checkpoint:
        fail(variant, f"{path!r} is not a checkpoint of this collection")
    if checkpoint["variant"] != variant:
        fail(variant, f"{path!r} was written by {checkpoint['variant']}.py: use ppo/{checkpoint['variant']}.py for it")
    if not isinstance(checkpoint.get("args"), dict):
        fail(variant, f"{path!r} is not a checkpoint of this collection: it holds no settings")
    version = checkpoint.get("format")
    if version is None and resuming:
        if not trust_old:
            fail(variant, f"{path!r} is a checkpoint of the older format, whose saved environments are pickled Python "
                          "objects, and loading those runs whatever code they name: if you wrote it yourself, resume "
                          "it with --trust-old-checkpoint (the run then saves the new format, which needs no flag)")
        checkpoint["envs"] = old_pickles(checkpoint.get("envs"))
    elif version is not None and version != CHECKPOINT_FORMAT:
        fail(variant, f"{path!r} has checkpoint format {version!r}, which this version of the scripts does not read: "
                      "use the version that wrote it")
    return checkpoint if resuming else {key: checkpoint[key] for key in EVALUATION_KEYS if key in checkpoint}


def save_checkpoint(path: str, state: dict) -> None:
    """Write atomically: a crash or a second Ctrl-C while writing leaves the previous file intact."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def all_finite(state: dict) -> bool:
    """Whether every floating-point tensor of a state_dict is free of NaN and infinities."""
    return all(bool(torch.isfinite(value).all()) for value in state.values()
               if isinstance(value, torch.Tensor) and value.is_floating_point())


def rng_state(device: torch.device) -> dict:
    """The state of every random generator a run draws from: Python's, NumPy's, PyTorch's (and CUDA's)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng(state: dict, device: torch.device) -> None:
    """Put the random generators back where `rng_state` found them."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


# ---------------------------------------------------------------------------------------------------
# 4. The environments: ids that cannot be made, video, and their saved state
# ---------------------------------------------------------------------------------------------------


def gymnasium_spec(env_id: str, variant: str, hint: str = "") -> gym.envs.registration.EnvSpec:
    """The registration of `env_id`; an id that gymnasium does not know is refused in one line, with
    `hint` (the script to use instead, say).

    `module:EnvId` is gymnasium's way to name an environment that a package of the user's registers
    when it is imported: the module is imported first, as gym.make does, so that the id is known when
    it is looked up (gym.make imports it again, a no-op, and so do the worker processes of
    --async-envs, where the environments are made). A module that does not import, or an id it does
    not register, is refused in one line that says which."""
    module, _, bare_id = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as error:  # ModuleNotFoundError, or whatever the user's module raised
            fail(variant, f"--env-id {env_id}: cannot import the module {module!r} "
                          f"({type(error).__name__}: {error}): is it installed, or on PYTHONPATH?")
    try:
        return gym.spec(bare_id)
    except gym.error.Error as error:
        if module:
            fail(variant, f"--env-id {env_id}: importing {module!r} registered no environment {bare_id!r} "
                          "(gymnasium.register(id=..., entry_point=...) in the module makes one)")
        fail(variant, f"unknown env id {env_id!r}{hint}: {error}")


def check_gymnasium_id(env_id: str, variant: str) -> None:
    """Refuse an id that gymnasium does not know (`gymnasium_spec`), pointing Atari ids to the Atari
    script."""
    atari = "NoFrameskip" in env_id or env_id.startswith("ALE/")
    gymnasium_spec(env_id, variant, hint=" (Atari ids need ppo/ppo_atari.py)" if atari else "")


@contextlib.contextmanager
def packages_checked(env_id: str, variant: str):
    """Within the block, an ImportError (a registered id whose code needs a package, or a version of
    one, that is not installed) ends the run in one line, naming a newer version of the id if any."""
    try:
        yield
    except ImportError as error:
        namespace, name, version = gym.envs.registration.parse_env_id(env_id.rpartition(":")[2])
        newest = gym.envs.registration.find_highest_version(namespace, name)
        newest_id = gym.envs.registration.get_env_id(namespace, name, newest)
        hint = "" if newest in (None, version) else f" (try {newest_id})"
        fail(variant, f"{env_id} cannot be made with the packages installed: {error}{hint}")


def record_video(env: gym.Env, folder: str, episodes: int | None = None) -> gym.Env:
    """`env` filmed into `folder` on gymnasium's schedule: episodes 0, 1, 8, 27, ..., 1000, 2000, ...;
    an evaluation of `episodes` episodes films none past its last (the reset after it starts one)."""
    trigger = None
    if episodes is not None:
        from gymnasium.utils.save_video import capped_cubic_video_schedule as schedule

        trigger = lambda episode: episode < episodes and schedule(episode)  # noqa: E731
    return gym.wrappers.RecordVideo(env, folder, episode_trigger=trigger)


# An environment's state goes into a checkpoint as data (env_state) and back into an environment built
# anew (restore_env). Layer by layer, from the outermost wrapper to the environment itself, what a layer
# holds is saved as data, or is a random generator (its state is data), or a simulator (its state is
# arrays or bytes), or else it was made when the layer was built and never changes, and the rebuilt
# layer has it: these attributes, by name (the arguments that built it, ALE's action set) and by kind
# (spaces, functions such as TransformReward's np.sign, MuJoCo's model and its renderer).
BUILT_ATTRIBUTES = {"env", "spec", "_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs", "_action_set"}
BUILT_KINDS = (gym.Space, gym.envs.registration.EnvSpec, types.FunctionType, types.BuiltinFunctionType,
               types.MethodType, np.ufunc)
BUILT_CLASSES = {"MjModel", "MujocoRenderer"}
SIMULATORS = {"MjData", "ALEInterface"}  # MuJoCo's simulation data, ale-py's emulator
BIT_GENERATORS = {"PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"}  # NumPy's, by the name in their state


class NotData(Exception):
    """Raised for a value that is not data: the state that holds it cannot be saved."""


class EnvStateMismatch(ValueError):
    """A saved environment state that does not fit the environment built to take it back."""


def as_data(value):
    """`value` as data a checkpoint holds (None, booleans, numbers, strings, bytes, NumPy arrays and
    scalars of numbers, and tuples, lists and dicts of these), its arrays copied; NotData otherwise."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if type(value) is np.ndarray or isinstance(value, np.generic):
        if value.dtype.kind not in "biufc":
            raise NotData(value)
        return value.copy()
    if type(value) in (tuple, list):
        return type(value)(as_data(item) for item in value)
    if type(value) is dict:
        return {as_data(key): as_data(item) for key, item in value.items()}
    raise NotData(value)


def simulator_state(simulator) -> dict:
    """The state of a simulator of SIMULATORS, for `restore_simulator`. MuJoCo: the time and all of
    MjData's arrays: positions and velocities, the solver's warm start, and the quantities derived from
    them, which some tasks read before a step (Ant's position). ale-py: the emulator's own state, with
    its random generator, as the bytes ALE serializes it to."""
    kind = type(simulator).__name__
    if kind == "MjData":
        arrays = {name: getattr(simulator, name) for name in dir(simulator) if not name.startswith("_")}
        return {"mujoco": {"time": simulator.time, "arrays": {name: array.copy() for name, array in arrays.items()
                                                               if isinstance(array, np.ndarray)}}}
    return {"ale": simulator.cloneState(include_rng=True).__getstate__()}


def restore_simulator(simulator, state: dict) -> None:
    """Put back a simulator's state from `simulator_state`. MuJoCo's arrays whose size depends on the
    contacts of the moment (they differ from a new MjData's) are left: each step computes them anew."""
    kind = type(simulator).__name__
    if kind == "MjData" and isinstance(state.get("mujoco"), dict):
        for name, array in state["mujoco"]["arrays"].items():
            target = getattr(simulator, name, None)
            if isinstance(target, np.ndarray) and target.shape == np.shape(array):
                target[...] = array
        simulator.time = state["mujoco"]["time"]
    elif kind == "ALEInterface" and isinstance(state.get("ale"), bytes):
        import ale_py  # installed, since an ale-py game was built

        emulator = ale_py.ALEState.__new__(ale_py.ALEState)  # as pickle rebuilds one, from its bytes
        emulator.__setstate__(state["ale"])
        simulator.restoreState(emulator)
    else:
        raise EnvStateMismatch(f"a saved simulator state does not fit the {kind} built")


def layer_state(layer, simulators: set[int]) -> dict:
    """One layer's state: its class, its attributes that are data, the state of each of its random
    generators and of its simulator (saved with the first layer that holds it: ale-py's wrappers hold the
    game's too). Raises NotData for an attribute that is none of these, nor made when it was built."""
    state = {"class": type(layer).__name__, "data": {}, "generators": {}, "simulators": {}}
    for name, value in vars(layer).items():
        if name in BUILT_ATTRIBUTES or isinstance(value, BUILT_KINDS) or type(value).__name__ in BUILT_CLASSES:
            continue
        if isinstance(value, np.random.Generator):
            state["generators"][name] = value.bit_generator.state
        elif isinstance(value, deque):  # a frame stack, the latest episodes' statistics
            state["data"][name] = as_data(list(value))
        elif type(value).__name__ in SIMULATORS:
            if id(value) not in simulators:
                simulators.add(id(value))
                state["simulators"][name] = simulator_state(value)
        else:
            state["data"][name] = as_data(value)
    return state


def env_state(env: gym.Env) -> list[dict] | None:
    """One environment's full state as data (`layer_state` of each layer, outermost first), so that a
    resumed run continues its very episode: classic control's `state`, MuJoCo's physics, the Atari
    emulator, the time limit's count, the frame stack, the lives, the running game statistics, and the
    random generators. None where some of it cannot be saved as data: a video recorder (its file half
    written), or an object of a kind not known here (a Box2D world, say); a resumed run then starts new
    episodes."""
    layers, simulators = [], set()
    while True:
        if isinstance(env, gym.wrappers.RecordVideo):
            return None
        try:
            layers.append(layer_state(env, simulators))
        except NotData:
            return None
        if not isinstance(env, gym.Wrapper):
            return layers
        env = env.env


def restore_layer(layer, state: dict) -> None:
    """Put back one layer's state from `layer_state`: into attributes that the rebuilt layer holds data
    in or has not made yet (classic control's `state` is made at the first reset), and into its random
    generators and simulator; never over anything else (a method, a space)."""
    for name, value in state["data"].items():
        current = getattr(layer, name, None) if name.isidentifier() and not name.startswith("__") else NotData
        try:
            as_data(list(current) if isinstance(current, deque) else current)
        except NotData:
            raise EnvStateMismatch(f"{state['class']} holds no data in {name!r}") from None
        if isinstance(current, deque):
            current.clear()
            current.extend(value)
        else:
            setattr(layer, name, value)
    for name, saved in state["generators"].items():
        generator = getattr(layer, name, None)
        if not isinstance(generator, np.random.Generator):  # a generator made at the first reset
            if generator is not None or saved.get("bit_generator") not in BIT_GENERATORS:
                raise EnvStateMismatch(f"{state['class']}.{name} is not a random generator of NumPy's")
            generator = np.random.Generator(getattr(np.random, saved["bit_generator"])())
            setattr(layer, name, generator)
        generator.bit_generator.state = saved
    for name, saved in state["simulators"].items():
        restore_simulator(getattr(layer, name, None), saved)


def restore_env(make_env: Callable[[], gym.Env], layers: list[dict]) -> gym.Env:
    """The environment `make_env` builds, with the state `env_state` saved put back. Raises
    EnvStateMismatch where the saved layers do not fit the ones built (another version of the wrappers)."""
    env = make_env()
    layer = env
    try:
        for state in layers:
            if layer is None or type(layer).__name__ != state["class"]:
                raise EnvStateMismatch(f"the saved environment has a {state['class']} where the one built has "
                                       f"{type(layer).__name__ if layer is not None else 'nothing'}")
            restore_layer(layer, state)
            layer = layer.env if isinstance(layer, gym.Wrapper) else None
    except EnvStateMismatch:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as error:  # data of another shape or kind
        raise EnvStateMismatch(f"the saved state does not fit ({error})") from None
    if layer is not None:
        raise EnvStateMismatch(f"the environment built has a {type(layer).__name__} the saved one has not")
    return env


def save_envs(envs: gym.vector.SyncVectorEnv) -> list[list[dict]] | None:
    """Every environment's state (`env_state`), so a resumed run continues the very same episodes; None
    where one cannot be saved as data (video recording, for one)."""
    saved = [env_state(env) for env in envs.envs]
    return None if any(state is None for state in saved) else saved


def restored_envs(env_fns: list[Callable[[], gym.Env]], saved: list) -> list[Callable[[], gym.Env]]:
    """A function per environment that builds it with its function of `env_fns` and puts its state of
    `saved` (`save_envs`, `save_games`) back: for a SyncVectorEnv, or for the worker processes of an
    AsyncVectorEnv, where each game is then rebuilt. The environments of a checkpoint of the older
    format, which the user trusts (OldPickle), are unpickled instead (`unpickled_envs`)."""
    if isinstance(saved, OldPickle) or isinstance(saved, list) and any(isinstance(s, OldPickle) for s in saved):
        return unpickled_envs(saved)
    if not isinstance(saved, list) or len(saved) != len(env_fns):
        raise EnvStateMismatch(f"the checkpoint holds {len(saved) if isinstance(saved, list) else 'no list of'} "
                               f"environments, not {len(env_fns)}")
    return [functools.partial(restore_env, make_env, state) for make_env, state in zip(env_fns, saved)]


class SavableGame(gym.Wrapper):
    """The outermost wrapper of an ale-py game: it saves the game it wraps where the game runs. With
    --async-envs that is a worker process, which `envs.call("save_game")` reaches as it reaches this
    process's games."""

    def save_game(self) -> list[dict] | None:
        """The game's full state as data (`env_state`: the emulator's, the wrappers' and the random
        generators'); None for the game whose video is being recorded: the recorder is not saved, so a
        resumed run starts new games."""
        return env_state(self)


def save_games(envs: gym.vector.VectorEnv) -> list[list[dict]] | None:
    """Every ale-py game's full state (SavableGame.save_game), so a resumed run continues the very same
    games; None where that is impossible (video recording). The same for sync and async envs, so a run
    saved with --async-envs may resume without it, and the other way round."""
    saved_games = list(envs.call("save_game"))
    return None if any(saved_game is None for saved_game in saved_games) else saved_games


# Checkpoints of the older format (before CHECKPOINT_FORMAT 2) held their environments as pickles.
# Resumed with --trust-old-checkpoint, they are unpickled here, and nowhere else.


def unpickled_envs(saved: OldPickle | list[OldPickle]) -> list[Callable[[], gym.Env]]:
    """A function per environment of an older checkpoint that returns it as it was saved: ale-py's games
    (one pickle each, unpickled where the game will run), classic control's environments (pickled
    whole), MuJoCo's (each with its random generator's state and MjData), or ale-py's games of a yet
    older checkpoint (all in one pickle, with SavableGame to add)."""
    if isinstance(saved, list):
        return [functools.partial(unpickle_game, game) for game in saved]
    items = pickle.loads(saved)
    if all(isinstance(item, gym.Env) for item in items):
        return [lambda env=env: env for env in items]
    if all(isinstance(rng, dict) for _, rng, _ in items):
        envs = []
        for env, rng, data in items:
            env.unwrapped.np_random.bit_generator.state = rng
            if data is not None:
                import mujoco  # installed, since a MuJoCo environment was saved

                mujoco.mj_copyData(env.unwrapped.data, env.unwrapped.model, data)
            envs.append(env)
        return [lambda env=env: env for env in envs]
    return [functools.partial(unpickle_game, cloudpickle.dumps((SavableGame(env), emulator, rng)))
            for env, emulator, rng in items]


def unpickle_game(saved_game: bytes) -> gym.Env:
    """An ale-py game of an older checkpoint: its pickled wrapper stack, with its emulator put back."""
    env, emulator_state, rng = pickle.loads(saved_game)
    env.unwrapped.ale.restoreState(emulator_state)
    env.unwrapped.np_random.bit_generator.state = rng
    return env


# ---------------------------------------------------------------------------------------------------
# 5. The run
# ---------------------------------------------------------------------------------------------------


# The exit code of a run whose network became non-finite (NaN or infinite): the divergence guard
# (Run.stop_if_diverged) stopped it after the update in which that happened, before it logged or saved
# it. Distinct from a crash (1), wrong input (2) and a stop on request (130): running it again from its
# last checkpoint, with the same settings, diverges again.
DIVERGED = 3
# The exit code of a run that stopped before its end because it was asked to (Ctrl-C, `kill`, Slurm's
# warning before a time limit): with --save-model its checkpoint continues it (--resume). A finished run
# exits 0, wrong input 2, a crash 1. 130 is the shell's code for Ctrl-C, which Ctrl-C has always given.
STOPPED = 130
# What asks a run to stop after the current iteration: Ctrl-C, `kill` and a Slurm task's end (SIGTERM),
# and the warning Slurm sends before a time limit when asked to (`#SBATCH --signal=B:USR1@<seconds>`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
# A second stop signal this soon after the first is the same request arriving twice, not a second one:
# Slurm signals every process of a task, and the runner or torchrun above the run passes it on too.
SAME_REQUEST_SECONDS = 1.0


def signal_name(signum: int) -> str:
    """How a stop signal is named to the user: Ctrl-C for SIGINT, else its name (SIGTERM, SIGUSR1)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Diverged(Exception):
    """The run's losses, gradients or weights became non-finite; its argument is the line that says
    where, what, why, and which checkpoint is the last good one."""


class StoppedAtOnce(KeyboardInterrupt):
    """A stop signal that ends the run where it is: a second one, or one before training began. Its
    argument names the signal."""


def stop_at_once(signum, frame):
    """Until a run's training begins, SIGTERM and SIGUSR1 stop it at once, as Ctrl-C does (their
    default would end the process without a word)."""
    raise StoppedAtOnce(signal_name(signum))


class StopOnInterrupt:
    """The first Ctrl-C, SIGTERM or SIGUSR1 only prints `notice` and sets `requested`: training then
    stops after the current iteration, so the run can flush its logs and save a checkpoint at a clean
    point. A second Ctrl-C or SIGTERM stops at once (StoppedAtOnce, a KeyboardInterrupt), but for a
    SIGTERM within SAME_REQUEST_SECONDS of the first signal, which is the first one delivered twice (two
    presses of Ctrl-C are always two). SIGUSR1, Slurm's warning that the time limit is near, never
    stops at once: said again, it says nothing new. Under torchrun, which passes a signal on to every
    process, only rank 0 prints the notice; {signal} in it names the signal, {again} how to stop at once."""

    def __init__(self, notice: str = "{signal}: stopping after this iteration ({again} to quit at once)"):
        self.requested, self.notice, self.first = False, notice, (None, 0.0)
        self.previous_handlers = {signum: signal.signal(signum, self.handle) for signum in STOP_SIGNALS}

    def handle(self, signum, frame):
        first_signal, first_time = self.first
        if self.requested:
            same_request = signum == signal.SIGUSR1 or (monotonic() - first_time < SAME_REQUEST_SECONDS
                                                        and not signum == signal.SIGINT == first_signal)
            if same_request:
                return
            raise StoppedAtOnce(signal_name(signum))
        self.requested, self.first = True, (signum, monotonic())
        if int(os.environ.get("RANK", "0")) == 0:
            again = "press Ctrl-C again" if signum == signal.SIGINT else "Ctrl-C or SIGTERM"
            print("\n" + self.notice.format(signal=signal_name(signum), again=again), flush=True)

    def restore(self):
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)


def choose_device(args, variant: str, device: torch.device | None = None) -> torch.device:
    """`device`, or else CUDA when it is there and --cuda allows it, else the CPU; --cudagraphs needs CUDA."""
    device = device or torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        fail(variant, "--cudagraphs needs a CUDA device: drop it, or run on a GPU (and without --no-cuda)")
    return device


def clock(seconds: float) -> str:
    """A duration as h:mm:ss."""
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02}:{seconds:02}"


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    """Seed Python, NumPy and PyTorch; with torch_deterministic, cuDNN picks deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def text_table(key_header: str, value_header: str, rows: dict) -> str:
    """A two-column markdown table, as the run logs its settings and releases to TensorBoard's text tab
    (benchmark/report.py reads them back)."""
    return f"|{key_header}|{value_header}|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in rows.items())


# The packages whose release can change what a run learns, as (distribution, module): a run records the
# release of each one it imported. MuJoCo 3.5.0, for one, changed Hopper's contacts.
RECORDED_PACKAGES = [("torch", "torch"), ("gymnasium", "gymnasium"), ("numpy", "numpy"), ("mujoco", "mujoco"),
                     ("ale-py", "ale_py"), ("envpool", "envpool"), ("procgen-mirror", "procgen")]


def software_versions() -> dict[str, str]:
    """{package: release} of Python and of the RECORDED_PACKAGES this process imported, for the run's
    `versions` text in TensorBoard (benchmark/report.py lists them beside the results)."""
    from importlib.metadata import PackageNotFoundError, version

    releases = {"python": sys.version.split()[0]}
    for distribution, module in RECORDED_PACKAGES:
        if module in sys.modules:
            try:
                releases[distribution] = version(distribution)
            except PackageNotFoundError:  # imported from a folder on the path, not installed
                releases[distribution] = getattr(sys.modules[module], "__version__", "unknown")
    return releases


# Run folders this process claimed and has not written to yet: wrong input found after the claim (an
# environment that cannot be made) gives them back, so that a refused command leaves nothing behind.
UNUSED_RUN_FOLDERS: list[str] = []


def claim_run_folder(name: str, variant: str) -> str:
    """Make runs/<name> and return the name. os.mkdir is atomic: of two runs started in the same second
    with the same settings (a tuner's workers, a shell loop), one makes the folder and the other finds
    it taken, and takes <name>-2 (or -3, ...) instead, and says so: two runs never share a folder."""
    def cannot_write(error: OSError) -> NoReturn:  # `runs` is a file, or a folder this user may not write to
        fail(variant, f"cannot write the run's logs to {os.path.join('runs', name)!r} ({error.strerror}): start "
                      "the run in a folder where it can create runs/, or remove what is in the way")

    try:
        os.makedirs("runs", exist_ok=True)
    except OSError as error:
        cannot_write(error)
    for attempt in range(1, 1000):
        candidate = name if attempt == 1 else f"{name}-{attempt}"
        try:
            os.mkdir(os.path.join("runs", candidate))
        except FileExistsError:
            continue
        except OSError as error:
            cannot_write(error)
        UNUSED_RUN_FOLDERS.append(os.path.join("runs", candidate))
        if attempt > 1:
            print(f"runs/{name} is another run's (started in the same second): this run is {candidate}", flush=True)
        return candidate
    fail(variant, f"runs/{name} and its next 998 alternatives are all taken: clean up runs/")


def release_unused_run_folders() -> None:
    """Remove the run folders this process claimed but never wrote to (and runs/, if that leaves it
    empty)."""
    while UNUSED_RUN_FOLDERS:
        folder = UNUSED_RUN_FOLDERS.pop()
        for path in (folder, os.path.dirname(folder)):
            with contextlib.suppress(OSError):  # not empty: another run's, or written to
                os.rmdir(path)


class Run:
    """One training run: its name, folder, device and seeds, then its logs, clock, progress line and
    Ctrl-C, the checkpoints it writes, and what it says at the end.

    A new run is named `<env_id>__<exp_name>__<seed>__<unix time>` and keeps its TensorBoard log and
    checkpoint in runs/<name>/. A resumed run (`checkpoint`, read by parse_args) keeps its name and goes
    on in the folder of the checkpoint it was given, from wherever it is started. `seed` defaults to
    --seed (the multi-GPU script seeds each rank apart); under torchrun only rank 0 logs, prints and
    writes the checkpoint."""

    def __init__(self, args, variant: str, checkpoint: dict | None, num_iterations: int,
                 device: torch.device | None = None, rank: int = 0, seed: int | None = None):
        self.args, self.variant, self.checkpoint, self.num_iterations, self.rank = \
            args, variant, checkpoint, num_iterations, rank
        self.device = choose_device(args, variant, device)
        if checkpoint:
            self.name, self.folder = checkpoint["run_name"], os.path.dirname(args.resume) or "."
        else:  # ALE/Pong-v5 -> ALE-Pong-v5, mymodule:MyEnv-v0 -> mymodule-MyEnv-v0: the name is a folder's
            env_name = args.env_id.replace("/", "-").replace(":", "-")
            self.name = f"{env_name}__{args.exp_name}__{args.seed}__{int(time.time())}"
            if rank == 0:  # the process that writes the logs and checkpoints claims their folder
                self.name = claim_run_folder(self.name, variant)
            self.folder = f"runs/{self.name}"
        self.checkpoint_path = os.path.join(self.folder, "checkpoint.pt")
        # A resumed run's videos go into a folder of their own: its episode count starts again at 0.
        self.video_folder = f"videos/{self.name}" + (f"/resumed-at-step-{checkpoint['global_step']}"
                                                     if checkpoint else "")
        if args.track:
            try:
                import wandb  # noqa: F401  (checked now, before anything is built; W&B starts in open_logs)
            except ImportError:
                fail(variant, "--track needs wandb: pip install wandb")
        # A resumed run overwrites the random generators' states with the checkpoint's in `start`.
        seed_everything(args.seed if seed is None else seed, args.torch_deterministic)
        # Under torchrun the ranks decide together, once an iteration, whether to stop (agreed_stop), so
        # that a Ctrl-C that reaches one rank late cannot split them; None: this process decides alone.
        self.writer, self.interrupt, self.agreed_stop, self.finished_earlier = None, None, None, False
        # Under torchrun the ranks also agree whether --save-minutes have passed (agreed_save).
        self.agreed_save, self.last_save = None, 0.0
        # The newest checkpoint of this run on disk, and its step: what a diverged run leaves behind.
        self.last_good_checkpoint = (args.resume, checkpoint["global_step"]) if checkpoint else None

    def open_logs(self, **sizes) -> SummaryWriter | None:
        """The run's TensorBoard writer (and, with --track, a W&B run that mirrors it), with the settings
        and the derived `sizes` as a table; None on ranks other than 0. After a resume, TensorBoard drops
        whatever the interrupted run logged past the checkpoint (purge_step)."""
        if self.rank != 0:
            return None
        settings = {**asdict(self.args), **sizes}
        if self.args.track:
            import wandb

            try:
                wandb.init(project=self.args.wandb_project_name, entity=self.args.wandb_entity, sync_tensorboard=True,
                           config=settings, name=self.name, id=self.name, resume="allow", save_code=True)
            except wandb.errors.Error as error:  # no API key, no network
                fail(self.variant, f"--track could not start Weights & Biases ({str(error).splitlines()[0]}): log in "
                                   "with `wandb login`, or set WANDB_MODE=offline to keep the run on this machine")
        UNUSED_RUN_FOLDERS.clear()  # the run's folder is in use from here on
        try:
            os.makedirs(self.folder, exist_ok=True)
            purge_step = self.checkpoint["global_step"] + 1 if self.checkpoint else None
            self.writer = SummaryWriter(self.folder, purge_step=purge_step)
        except OSError as error:  # `runs` is a file, or a folder this user may not write to
            fail(self.variant, f"cannot write the run's logs to {self.folder!r} ({error.strerror}): start the run in "
                               "a folder where it can create runs/, or remove what is in the way")
        self.writer.add_text("hyperparameters", text_table("param", "value", settings))
        self.writer.add_text("versions", text_table("package", "version", software_versions()))
        return self.writer

    def start(self, agent: torch.nn.Module, optimizer: torch.optim.Optimizer,
              new_episodes: bool = False) -> tuple[int, int]:
        """Just before the first iteration: restore a resumed run's weights, optimizer and random
        generators (and say so; `new_episodes`: it could not go on with the saved ones), then start the
        clock and the Ctrl-C handler. Returns the last iteration done and the environment steps so far."""
        iteration, global_step = 0, 0
        if self.checkpoint:
            agent.load_state_dict(self.checkpoint["model"])
            optimizer.load_state_dict(self.checkpoint["optimizer"])
            rng = self.checkpoint["rng"]
            restore_rng(rng[self.rank] if isinstance(rng, list) else rng, self.device)
            iteration, global_step = self.checkpoint["iteration"], self.checkpoint["global_step"]
            self.finished_earlier = iteration >= self.num_iterations
        if self.rank == 0 and self.finished_earlier:
            print(f"{self.name} is already finished ({global_step:,} of {self.args.total_timesteps:,} steps): "
                  f"evaluate it with: python ppo/{self.variant}.py --evaluate {self.checkpoint_path}")
        elif self.rank == 0:  # the start line: what runs where, and where its logs and checkpoint go
            saved = self.checkpoint_path if self.args.save_model else "none (--save-model keeps one)"
            print((f"resuming {self.name} at step {global_step:,} of {self.args.total_timesteps:,}"
                   + (" (with new episodes)" if new_episodes else "") if self.checkpoint else
                   f"{self.name}: {self.args.total_timesteps:,} steps")
                  + f" on {self.device}\n  logs in {self.folder}/ (tensorboard --logdir "
                  f"{os.path.dirname(self.folder) or '.'}), checkpoint: {saved}", flush=True)
        self.start_time, self.start_step, self.last_print = time.time(), global_step, 0.0
        self.last_save = self.start_time
        self.interrupt = StopOnInterrupt()
        return iteration, global_step

    @property
    def stopping(self) -> bool:
        """Whether the run stops after this iteration: Ctrl-C was pressed, or SIGTERM or SIGUSR1 came (on
        some rank, under torchrun)."""
        return self.interrupt.requested if self.agreed_stop is None else self.agreed_stop

    @property
    def save_time_come(self) -> bool:
        """With --save-minutes: that many minutes have passed since the run started or last saved."""
        minutes = self.args.save_minutes
        return minutes > 0 and time.time() - self.last_save >= 60 * minutes

    def wishes(self) -> dict[str, bool]:
        """What this process would do after this iteration: stop (it was signalled), save (its clock says
        so). Under torchrun each rank sends its wishes to the others, for `agree`."""
        return {"stop": self.interrupt.requested, "save": self.save_time_come}

    def agree(self, wishes: list[dict]) -> None:
        """Under torchrun, once an iteration, with every rank's `wishes`: all ranks stop, and save, when
        one of them would, so that a signal that reaches one rank late, or clocks a moment apart, cannot
        split them (a rank that saved alone would wait forever for the others)."""
        self.agreed_stop = any(wish["stop"] for wish in wishes)
        self.agreed_save = any(wish["save"] for wish in wishes)

    def steps_per_second(self, global_step: int) -> int:
        """Environment steps per second of this sitting: a resumed run counts from where it resumed."""
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-6))

    def print_progress(self, global_step: int, recent_returns, iteration: int | None = None) -> None:
        """`step N/TOTAL | SPS | time elapsed and left | mean return (last K episodes)`. After an
        iteration (`iteration` given): the first time, then at most every 2 s, and always after the
        last iteration and when the run stops. Within a rollout: when nothing was printed for 5 s, so
        that a long rollout is not silent."""
        now = time.time()
        if iteration is None:
            due = now - max(self.last_print, self.start_time) >= 5.0
        else:
            due = now - self.last_print > 2.0 or iteration == self.num_iterations or self.stopping
        if self.rank != 0 or not due:
            return
        self.last_print = now
        sps, total = self.steps_per_second(global_step), f"{self.args.total_timesteps:,}"
        left = clock((self.args.total_timesteps - global_step) / sps) if sps > 0 else "?"
        mean_return = f"{np.mean(recent_returns):8.2f}" if recent_returns else "     n/a"
        print(f"step {global_step:>{max(len(total), 9)},}/{total} | {sps:>6,} SPS | {clock(now - self.start_time)} "
              f"elapsed, {left} left | mean return {mean_return} (last {len(recent_returns)} episodes)", flush=True)

    def checkpoint_due(self, iteration: int) -> bool:
        """With --save-model: at the end, every --save-interval iterations, when --save-minutes have
        passed since the last save, and when the run stops."""
        interval = self.args.save_interval
        by_the_clock = self.save_time_come if self.agreed_save is None else self.agreed_save
        return self.args.save_model and (self.stopping or iteration == self.num_iterations or by_the_clock
                                         or (interval > 0 and iteration % interval == 0))

    def save_checkpoint(self, iteration: int, global_step: int, agent: torch.nn.Module,
                        optimizer: torch.optim.Optimizer, **loop_state) -> None:
        """Write what resuming needs: the settings, the weights, the optimizer, the random generators
        (unless `loop_state` brings its own, as one per rank) and the script's `loop_state` (where the
        environments stand, statistics...). Only rank 0 writes."""
        self.last_save = time.time()
        if not all_finite(agent.state_dict()):  # never written over the last good checkpoint
            self.diverged(global_step, "the weights became non-finite")
        if self.rank == 0:
            self.last_good_checkpoint = (self.checkpoint_path, global_step)
            save_checkpoint(self.checkpoint_path, {
                "format": CHECKPOINT_FORMAT, "variant": self.variant, "args": asdict(self.args), "run_name": self.name,
                "iteration": iteration, "global_step": global_step, "model": agent.state_dict(),
                "optimizer": optimizer.state_dict(), "rng": rng_state(self.device), **loop_state})

    def stop_if_diverged(self, global_step: int, update_means: dict[str, float], agent: torch.nn.Module) -> None:
        """The divergence guard, after each update: when a loss, the gradient norm or a weight has
        become NaN or infinite, stop the run before it logs or saves anything of this update (Diverged,
        which `run` turns into one line and exit code DIVERGED). Once a weight is NaN, every action and
        every update after it is NaN too: going on would only fill the logs with NaN and, at the next
        save, write over the last good checkpoint."""
        for key, quantity in (("policy_loss", "the policy loss"), ("value_loss", "the value loss"),
                              ("entropy", "the entropy"), ("grad_norm", "the gradient norm")):
            if key in update_means and not math.isfinite(update_means[key]):
                self.diverged(global_step, f"{quantity} became {update_means[key]}")
        if not all_finite(agent.state_dict()):
            self.diverged(global_step, "the weights became non-finite")

    def diverged(self, global_step: int, what_happened: str) -> NoReturn:
        """Flush and close the logs, then raise Diverged with the line that says it all."""
        if self.rank == 0:
            self.close_logs()
        self.interrupt.restore()
        learning_rate, default = self.args.learning_rate, type(self.args)().learning_rate
        cause = (f"the learning rate {learning_rate:g} is {learning_rate / default:g} times the default "
                 f"({default:g}): lower it" if learning_rate > 2 * default else
                 "a learning rate too high for this task, or rewards or observations too large for the "
                 "network: lower --learning-rate, or scale them")
        kept = ("no checkpoint was written" if self.last_good_checkpoint is None else
                f"the last good checkpoint, {self.last_good_checkpoint[0]} (step "
                f"{self.last_good_checkpoint[1]:,}), is kept")
        raise Diverged(f"at step {global_step:,}, {what_happened} in the update; likely cause: {cause}; {kept}")

    def finish(self, global_step: int, how_to_resume: str | None = None) -> None:
        """Flush and close the logs, then say what comes next: how to resume a stopped run, or where
        its checkpoint is. Until the logs are closed a stop signal is still the run's: the same request
        delivered again changes nothing, a second one stops at once."""
        try:
            if self.rank == 0:
                self.close_logs()
        finally:
            self.interrupt.restore()
        if self.rank != 0 or self.finished_earlier:  # start() said that it was finished
            return
        if self.stopping:
            how = how_to_resume or f"resume with: python ppo/{self.variant}.py --resume {self.checkpoint_path}"
            print(f"stopped at step {global_step:,}; " + (how if self.args.save_model else
                  "no checkpoint written (run with --save-model to be able to resume)"))
        elif self.args.save_model:
            print(f"checkpoint: {self.checkpoint_path}\n"
                  f"evaluate it with: python ppo/{self.variant}.py --evaluate {self.checkpoint_path}")

    def close_logs(self) -> None:
        """Flush and close TensorBoard's log and, with --track, the W&B run."""
        self.writer.close()
        if self.args.track:
            import wandb

            # wandb.finish() takes seconds, and a Ctrl-C inside it crashes W&B's service and loses the
            # run's upload: a first Ctrl-C here only says so, a second one abandons the upload.
            print("saving the W&B run...", flush=True)
            still_saving = StopOnInterrupt("{signal}: W&B is still saving the run ({again} to abandon it)")
            wandb.finish()
            still_saving.restore()


# ---------------------------------------------------------------------------------------------------
# 6. The speed options
# ---------------------------------------------------------------------------------------------------


def compiled(args, *functions: Callable) -> tuple[Callable, ...]:
    """The functions as they are, or compiled by torch.compile with --compile, and also replayed as
    CUDA graphs with --cudagraphs (torch.compile's reduce-overhead mode)."""
    if not (args.compile or args.cudagraphs):
        return functions
    mode = "reduce-overhead" if args.cudagraphs else "default"
    return tuple(torch.compile(function, mode=mode) for function in functions)


def async_vector_env(env_fns: list[Callable[[], gym.Env]]) -> gym.vector.AsyncVectorEnv:
    """--async-envs of the ale-py scripts: each game in a worker process of its own, all stepping at
    once, the frames coming back through shared memory; SAME_STEP autoreset as the scripts' sync envs.
    forkserver: the workers start from a clean process, not a copy of this one with its threads.
    AsyncVectorEnv builds one game here too, for the spaces: this process's signal handlers are kept."""
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    envs = gym.vector.AsyncVectorEnv([functools.partial(in_worker, make_game) for make_game in env_fns],
                                     shared_memory=True, context="forkserver",
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    return envs


def in_worker(make_game: Callable[[], gym.Env]) -> gym.Env:
    """Build a game in a worker process of --async-envs. Ctrl-C reaches every process of the terminal's
    group, and a Slurm task's end or torchrun's SIGTERM every process of the run, but they are the main
    process's to handle (finish the iteration, save): the worker ignores them, and ends when the main
    process closes the environments.
    OpenCV, which resizes the frames, runs on one thread: the other workers have the other cores."""
    import ale_py  # the ale-py scripts' games: ale-py and opencv come with the atari extra
    import cv2

    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    cv2.setNumThreads(1)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game made
    # AsyncVectorEnv built the first game once in the main process too, for its spaces; with video
    # that made the (new) folder, which RecordVideo here would warn of as if it held older videos.
    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
    return make_game()


# ---------------------------------------------------------------------------------------------------
# 7. Evaluation
# ---------------------------------------------------------------------------------------------------


class Evaluation:
    """--evaluate: the device, the videos' folder and the seeds of an evaluation, and the scores of the
    episodes it plays, each printed as it ends and their mean and standard deviation at the end."""

    def __init__(self, args, variant: str, checkpoint: dict):
        if not all_finite(checkpoint["model"]):
            fail(variant, f"{args.evaluate!r} holds non-finite weights (NaN or infinite: the run diverged): "
                          "evaluate a checkpoint saved before it diverged")
        self.args, self.checkpoint, self.scores = args, checkpoint, []
        self.device = choose_device(args, variant)
        self.video_folder = f"videos/{checkpoint['run_name']}-eval"
        # Seeds unlike any training seed, so the scores come from episodes the agent never trained on.
        self.seed = args.seed + 100_000

    def load(self, agent: torch.nn.Module) -> torch.nn.Module:
        """The agent with the checkpoint's weights (and whatever else its state_dict holds), on the
        device, its actions drawn from --seed."""
        agent.load_state_dict(self.checkpoint["model"])
        agent.to(self.device).eval()
        torch.manual_seed(self.args.seed)
        return agent

    @property
    def playing(self) -> bool:
        return len(self.scores) < self.args.eval_episodes

    def episode_ended(self, score: float, length: int | None = None) -> None:
        self.scores.append(float(score))
        print(f"episode {len(self.scores)}: return {score:.1f}" + ("" if length is None else f" ({length} steps)"))

    def report(self) -> list[float]:
        print(f"{self.args.env_id}: mean return {np.mean(self.scores):.2f} +- {np.std(self.scores):.2f} "
              f"over {len(self.scores)} episodes")
        if self.args.capture_video:
            print(f"videos in {self.video_folder}/")
        return self.scores


# ---------------------------------------------------------------------------------------------------
# 8. The command
# ---------------------------------------------------------------------------------------------------


def run(function: Callable, args, checkpoint: dict | None, variant: str, extra: str) -> NoReturn:
    """`python ppo/<variant>.py`: run `function` (the script's main, or its evaluate) and exit with 0,
    with STOPPED (130) after a Ctrl-C, SIGTERM or SIGUSR1, with DIVERGED (3) and one line when the
    network became non-finite, or with 2 and one line when a package is
    missing (gymnasium imports rendering and video packages only when they are first used: `extra` is
    the script's extra)."""
    signal.signal(signal.SIGTERM, stop_at_once)  # until training begins (Run.start)
    signal.signal(signal.SIGUSR1, stop_at_once)
    try:
        result = function(args, checkpoint)
    except gym.error.DependencyNotInstalled as error:
        extras = f"{extra},video" if args.capture_video else extra
        fail(variant, f"missing optional dependency: {error} (pip install -e '.[{extras}]')")
    except EnvStateMismatch as error:  # a checkpoint's environments that the script cannot rebuild
        fail(variant, f"cannot resume the saved environments: {error}")
    except Diverged as diverged:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(f"{variant}.py: diverged: {diverged}", file=sys.stderr, flush=True)
        sys.exit(DIVERGED)
    except KeyboardInterrupt as stop:  # a second signal, or one before training began
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            by = stop.args[0] if isinstance(stop, StoppedAtOnce) else "Ctrl-C"
            print(f"stopped at once by {by}: what came after the last checkpoint is lost", file=sys.stderr)
        sys.exit(STOPPED)
    for signum in (signal.SIGTERM, signal.SIGUSR1):  # the run is over: a late copy of its signal changes nothing
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(STOPPED if isinstance(result, dict) and result.get("interrupted") else 0)
