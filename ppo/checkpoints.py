"""Checkpoints, as data: what a run writes to continue later, how a checkpoint is read without
running any code it names, the random generators' state, and the environments' state, saved layer
by layer and put back into environments built anew.
"""

import functools
import os
import pickle
import random
import types
from collections import deque
from typing import Callable

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.wrappers.utils import RunningMeanStd
import torch

from exits import EnvStateMismatch, fail


# The format of the checkpoints written here: 2, data only. A checkpoint is read with torch.load's
# weights_only=True, which builds tensors, plain containers, numbers, strings and bytes, and of
# other types only those allowed here (NumPy's arrays and scalars of numbers): reading it runs no
# code that the file names. A checkpoint without "format" is of the older format, whose environments
# were pickled Python objects (see TrustedOldPickle).
CHECKPOINT_FORMAT = 2
# What an evaluation reads of a checkpoint: the weights, with the statistics the agent owns (they
# are in its state_dict), and the settings.
EVALUATION_KEYS = ("variant", "args", "run_name", "model")


def numpy_types() -> list:
    """The NumPy types a checkpoint may hold besides tensors: arrays and scalars of booleans and
    numbers (random-generator states, statistics, observations, the environments' arrays), allowed
    under the names both NumPy 1 and NumPy 2 pickle them with. Arrays of Python objects stay
    refused. And `bytes`, which torch.save's pickle protocol calls for an empty bytes (an empty
    array's data)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # NumPy before 1.26
        from numpy.core import multiarray
    allowed = [bytes, np.ndarray,
               np.dtype] + [type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"]
    for function in (multiarray._reconstruct, multiarray.scalar):
        allowed += [(function, f"numpy.{core}.multiarray.{function.__name__}")
                    for core in ("core", "_core")]
    return allowed


def read_data(path: str, variant: str):
    """The checkpoint at `path`, read as data: torch.load(weights_only=True) with the NumPy types of
    `numpy_types`. A file that names anything else (a function that unpickling would call, a class
    it would build) is refused in one line that names it."""
    with torch.serialization.safe_globals(numpy_types()):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds of errors for a file it cannot read
            lines = [line.strip() for line in str(error).splitlines()
                     if line.strip()] or [type(error).__name__]
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
    fail(variant, f"refusing {path!r}: it holds {held}; the checkpoints of these scripts hold only "
                  "tensors, arrays, numbers and text, so this file was made otherwise or altered")


class TrustedOldPickle(bytes):
    """Pickled environments of a checkpoint in the older format. Only load_checkpoint makes these,
    from such a checkpoint's bytes, when the user resumes it with --trust-old-checkpoint: they are
    the only bytes ever unpickled here, and no file can hold one (reading builds no class of this
    module)."""


def old_pickles(saved):
    """`saved`, the environments of an older checkpoint (bytes, or lists of bytes), its bytes marked
    as TrustedOldPickle."""
    if isinstance(saved, list):
        return [old_pickles(item) for item in saved]
    return TrustedOldPickle(saved) if isinstance(saved, bytes) else saved


def load_checkpoint(path: str, variant: str, resuming: bool = False,
                    trust_old: bool = False) -> dict:
    """Read a checkpoint written by the script `variant`, as data (`read_data`): reading it runs no
    code. Refuse anything else with a clear message. An evaluation gets only what it reads
    (EVALUATION_KEYS).

    A checkpoint of the older format (written before format 2) evaluates as it is, its weights and
    settings being data; but its environments are pickled objects, which can run any code when they
    are loaded, so it resumes only with `trust_old` (--trust-old-checkpoint), and its bytes are then
    marked for unpickling (TrustedOldPickle). The checkpoints the resumed run writes are of the new
    format."""
    if not os.path.isfile(path):
        several_nodes = int(os.environ.get("WORLD_SIZE",
                                           "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        fail(variant,
             f"no checkpoint at {path!r}"
             + (" (every node needs it, at this path)" if several_nodes else ""))
    checkpoint = read_data(path, variant)
    if not isinstance(checkpoint, dict) or "variant" not in checkpoint:
        fail(variant, f"{path!r} is not a checkpoint of this collection")
    if checkpoint["variant"] != variant:
        fail(variant, f"{path!r} was written by {checkpoint['variant']}.py: use "
                      f"ppo/{checkpoint['variant']}.py for it")
    if not isinstance(checkpoint.get("args"), dict):
        fail(variant, f"{path!r} is not a checkpoint of this collection: it holds no settings")
    version = checkpoint.get("format")
    if version is None and resuming:
        if not trust_old:
            fail(variant, f"{path!r} is a checkpoint of the older format, whose saved environments "
                          "are pickled Python objects, and loading those runs whatever code they "
                          "name: if you wrote it yourself, resume it with --trust-old-checkpoint "
                          "(the run then saves the new format, which needs no flag)")
        checkpoint["envs"] = old_pickles(checkpoint.get("envs"))
    elif version is not None and version != CHECKPOINT_FORMAT:
        fail(variant, f"{path!r} has checkpoint format {version!r}, which this version of the "
                      "scripts does not read: use the version that wrote it")
    if resuming:
        episode_statistics_into_envs(checkpoint)
        reward_statistics_as_saved_now(checkpoint)
    return checkpoint if resuming else {key: checkpoint[key] for key in EVALUATION_KEYS
                                        if key in checkpoint}


def episode_statistics_into_envs(checkpoint: dict) -> None:
    """Until 2026-11-27, ppo.py and ppo_continuous_action.py kept each episode's running return and
    length beside their environments, under "episode_return" and "episode_length"; gymnasium's
    RecordEpisodeStatistics, now the outermost wrapper of their environments, keeps them. Such a
    checkpoint's figures are put where the environments built now keep them: into a layer added
    to each saved environment, or, for the pickled ones of the older format, into a
    RecordEpisodeStatistics wrapped around each when they are unpickled. A checkpoint of any other
    kind is left as it is."""
    saved = checkpoint.get("envs")
    layered = isinstance(saved, list) and all(
        isinstance(layers, list) and all(isinstance(layer, dict) for layer in layers)
        for layers in saved)
    if "episode_return" not in checkpoint or not (layered or isinstance(saved, TrustedOldPickle)):
        return
    returns, lengths = checkpoint.pop("episode_return"), checkpoint.pop("episode_length")
    if isinstance(saved, TrustedOldPickle):
        saved.episode_statistics = (returns, lengths)
        return
    for layers, episode_return, episode_length in zip(saved, returns, lengths):
        layers.insert(0, {"class": "RecordEpisodeStatistics", "generators": {}, "simulators": {},
                          "data": {"episode_returns": float(episode_return),
                                   "episode_lengths": int(episode_length)}})


def reward_statistics_as_saved_now(checkpoint: dict) -> None:
    """Until 2026-11-26, the "reward_scaler" entry of the checkpoints of ppo_continuous_action.py
    and ppo_procgen.py held the return statistics under "return_rms" and, in the earlier ones, each
    environment's discounted return too. It now holds the statistics alone, and the discounted
    returns are saved beside the rest of the rollout's state, under "discounted_return", which a
    resumed run reads back only when it goes on with the saved episodes. Such a checkpoint's
    entries are moved there."""
    scaler = checkpoint.get("reward_scaler")
    if isinstance(scaler, dict) and "return_rms" in scaler:
        checkpoint["reward_scaler"] = scaler["return_rms"]
        if "discounted_return" in scaler:
            checkpoint["discounted_return"] = scaler["discounted_return"]


def save_checkpoint(path: str, state: dict) -> None:
    """Write atomically: a crash or a second Ctrl-C while writing leaves the previous file
    intact."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def all_finite(state: dict) -> bool:
    """Whether every floating-point tensor of a state_dict is free of NaN and infinities."""
    return all(bool(torch.isfinite(value).all()) for value in state.values()
               if isinstance(value, torch.Tensor) and value.is_floating_point())


def statistics_state(statistics: RunningMeanStd) -> dict:
    """A running mean and variance (gymnasium's RunningMeanStd: observation or return statistics)
    as a checkpoint keeps it: its arrays, copied, and its count."""
    return {"mean": statistics.mean.copy(), "var": statistics.var.copy(), "count": statistics.count}


def restore_statistics(statistics: RunningMeanStd, state: dict) -> None:
    """Put back into `statistics` the running mean and variance that `statistics_state` saved."""
    statistics.mean, statistics.var = state["mean"].copy(), state["var"].copy()
    statistics.count = state["count"]


def rng_state(device: torch.device) -> dict:
    """The state of every random generator a run draws from: Python's, NumPy's, PyTorch's (and
    CUDA's)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng(state: dict, device: torch.device) -> None:
    """Put the random generators back where `rng_state` found them."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


# An environment's state goes into a checkpoint as data (env_state) and back into an environment
# built anew (restore_env). Layer by layer, from the outermost wrapper to the environment itself,
# what a layer holds is saved as data, or is a random generator (its state is data), or a simulator
# (its state is arrays or bytes), or else it was made when the layer was built and never changes,
# and the rebuilt layer has it: these attributes, by name (the arguments that built it, ALE's action
# set) and by kind (spaces, functions such as TransformReward's np.sign, MuJoCo's model and its
# renderer).
REBUILT_ATTRIBUTES = {"env", "spec", "_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs",
                      "_action_set"}
REBUILT_TYPES = (gym.Space, gym.envs.registration.EnvSpec, types.FunctionType,
                 types.BuiltinFunctionType, types.MethodType, np.ufunc)
REBUILT_CLASS_NAMES = {"MjModel", "MujocoRenderer"}
SIMULATORS = {"MjData", "ALEInterface"}  # MuJoCo's simulation data, ale-py's emulator
# NumPy's, by the name in their state
BIT_GENERATORS = {"PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"}


class NotSavableAsData(Exception):
    """Raised for a value that is not data: the state that holds it cannot be saved."""


def as_data(value):
    """`value` as data a checkpoint holds (None, booleans, numbers, strings, bytes, NumPy arrays and
    scalars of numbers, and tuples, lists and dicts of these), its arrays copied; NotSavableAsData
    otherwise."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if type(value) is np.ndarray or isinstance(value, np.generic):
        if value.dtype.kind not in "biufc":
            raise NotSavableAsData(value)
        return value.copy()
    if type(value) in (tuple, list):
        return type(value)(as_data(item) for item in value)
    if type(value) is dict:
        return {as_data(key): as_data(item) for key, item in value.items()}
    raise NotSavableAsData(value)


def simulator_state(simulator) -> dict:
    """The state of a simulator of SIMULATORS, for `restore_simulator`. MuJoCo: the time and all of
    MjData's arrays: positions and velocities, the solver's warm start, and the quantities derived
    from them, which some tasks read before a step (Ant's position). ale-py: the emulator's own
    state, with its random generator, as the bytes ALE serializes it to."""
    kind = type(simulator).__name__
    if kind == "MjData":
        arrays = {name: getattr(simulator, name) for name in dir(simulator)
                  if not name.startswith("_")}
        return {"mujoco": {"time": simulator.time,
                           "arrays": {name: array.copy() for name, array in arrays.items()
                                      if isinstance(array, np.ndarray)}}}
    return {"ale": simulator.cloneState(include_rng=True).__getstate__()}


def restore_simulator(simulator, state: dict) -> None:
    """Put back a simulator's state from `simulator_state`. MuJoCo's arrays whose size depends on
    the contacts of the moment (they differ from a new MjData's) are left: each step computes them
    anew."""
    kind = type(simulator).__name__
    if kind == "MjData" and isinstance(state.get("mujoco"), dict):
        for name, array in state["mujoco"]["arrays"].items():
            target = getattr(simulator, name, None)
            if isinstance(target, np.ndarray) and target.shape == np.shape(array):
                target[...] = array
        simulator.time = state["mujoco"]["time"]
    elif kind == "ALEInterface" and isinstance(state.get("ale"), bytes):
        import ale_py  # installed, since an ale-py game was built

        # as pickle rebuilds one, from its bytes
        emulator = ale_py.ALEState.__new__(ale_py.ALEState)
        emulator.__setstate__(state["ale"])
        simulator.restoreState(emulator)
    else:
        raise EnvStateMismatch(f"a saved simulator state does not fit the {kind} built")


def layer_state(layer, simulators: set[int]) -> dict:
    """One layer's state: its class, its attributes that are data, the state of each of its random
    generators and of its simulator (saved with the first layer that holds it: ale-py's wrappers
    hold the game's too). Raises NotSavableAsData for an attribute that is none of these, nor made
    when it was built."""
    state = {"class": type(layer).__name__, "data": {}, "generators": {}, "simulators": {}}
    for name, value in vars(layer).items():
        rebuilt = (name in REBUILT_ATTRIBUTES or isinstance(value, REBUILT_TYPES)
                   or type(value).__name__ in REBUILT_CLASS_NAMES)
        if rebuilt:
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
    """One environment's full state as data (`layer_state` of each layer, outermost first), so that
    a resumed run continues its very episode: classic control's `state`, MuJoCo's physics, the Atari
    emulator, the time limit's count, the frame stack, the lives, the running game statistics, and
    the random generators. None where some of it cannot be saved as data: a video recorder (its file
    half written), or an object of a kind not known here (a Box2D world, say); a resumed run then
    starts new episodes."""
    layers, simulators = [], set()
    while True:
        if isinstance(env, gym.wrappers.RecordVideo):
            return None
        try:
            layers.append(layer_state(env, simulators))
        except NotSavableAsData:
            return None
        if not isinstance(env, gym.Wrapper):
            return layers
        env = env.env


def restore_layer(layer, state: dict) -> None:
    """Put back one layer's state from `layer_state`: into attributes that the rebuilt layer holds
    data in or has not made yet (classic control's `state` is made at the first reset), and into its
    random generators and simulator; never over anything else (a method, a space)."""
    for name, value in state["data"].items():
        attribute = name.isidentifier() and not name.startswith("__")
        current = getattr(layer, name, None) if attribute else NotSavableAsData
        try:
            as_data(list(current) if isinstance(current, deque) else current)
        except NotSavableAsData:
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
                raise EnvStateMismatch(f"{state['class']}.{name} is not a random generator of "
                                       "NumPy's")
            generator = np.random.Generator(getattr(np.random, saved["bit_generator"])())
            setattr(layer, name, generator)
        generator.bit_generator.state = saved
    for name, saved in state["simulators"].items():
        restore_simulator(getattr(layer, name, None), saved)


def restore_env(make_env: Callable[[], gym.Env], layers: list[dict]) -> gym.Env:
    """The environment `make_env` builds, with the state `env_state` saved put back. Raises
    EnvStateMismatch where the saved layers do not fit the ones built (another version of the
    wrappers)."""
    env = make_env()
    layer = env
    try:
        for state in layers:
            # the saved class, or one the built layer derives from: until 2026-11-26 ppo.py's
            # one-hot layer was a TransformObservation, now gymnasium's FlattenObservation, a kind
            # of TransformObservation that holds no more data
            kinds = {kind.__name__ for kind in type(layer).__mro__}
            if layer is None or state["class"] not in kinds:
                built = type(layer).__name__ if layer is not None else "nothing"
                raise EnvStateMismatch(f"the saved environment has a {state['class']} where the "
                                       f"one built has {built}")
            restore_layer(layer, state)
            layer = layer.env if isinstance(layer, gym.Wrapper) else None
    except EnvStateMismatch:
        raise
    # data of another shape or kind
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise EnvStateMismatch(f"the saved state does not fit ({error})") from None
    if layer is not None:
        raise EnvStateMismatch(f"the environment built has a {type(layer).__name__} the saved one "
                               "has not")
    return env


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
    an AsyncVectorEnv, where each game is then rebuilt. The environments of a checkpoint of the
    older format, which the user trusts (TrustedOldPickle), are unpickled instead
    (`unpickled_envs`)."""
    if isinstance(saved, TrustedOldPickle) or (
            isinstance(saved, list) and any(isinstance(s, TrustedOldPickle) for s in saved)):
        return unpickled_envs(saved)
    if not isinstance(saved, list) or len(saved) != len(env_fns):
        raise EnvStateMismatch("the checkpoint holds "
                               f"{len(saved) if isinstance(saved, list) else 'no list of'} "
                               f"environments, not {len(env_fns)}")
    return [functools.partial(restore_env, make_env, state) for make_env,
            state in zip(env_fns, saved)]


class SavableGame(gym.Wrapper):
    """The outermost wrapper of an ale-py game: it saves the game it wraps where the game runs. With
    --async-envs that is a worker process, which `envs.call("save_game")` reaches (`save_envs`)."""

    def save_game(self) -> list[dict] | None:
        """The game's full state as data (`env_state`: the emulator's, the wrappers' and the random
        generators'); None for the game whose video is being recorded: the recorder is not saved, so
        a resumed run starts new games."""
        return env_state(self)


# Checkpoints of the older format (before CHECKPOINT_FORMAT 2) held their environments as pickles.
# Resumed with --trust-old-checkpoint, they are unpickled here, and nowhere else.


def unpickled_envs(saved: TrustedOldPickle | list[TrustedOldPickle]) -> list[Callable[[], gym.Env]]:
    """A function per environment of an older checkpoint that returns it as it was saved: ale-py's
    games (one pickle each, unpickled where the game will run), classic control's environments
    (pickled whole), MuJoCo's (each with its random generator's state and MjData), or ale-py's games
    of a yet older checkpoint (all in one pickle, with SavableGame to add)."""
    if isinstance(saved, list):
        return [functools.partial(unpickle_game, game) for game in saved]
    items = pickle.loads(saved)
    if all(isinstance(item, gym.Env) for item in items):
        return with_episode_statistics(items, saved)
    if all(isinstance(rng, dict) for _, rng, _ in items):
        envs = []
        for env, rng, data in items:
            env.unwrapped.np_random.bit_generator.state = rng
            if data is not None:
                import mujoco  # installed, since a MuJoCo environment was saved

                mujoco.mj_copyData(env.unwrapped.data, env.unwrapped.model, data)
            envs.append(env)
        return with_episode_statistics(envs, saved)
    return [functools.partial(unpickle_game, cloudpickle.dumps((SavableGame(env), emulator, rng)))
            for env, emulator, rng in items]


def with_episode_statistics(envs: list[gym.Env],
                            saved: TrustedOldPickle) -> list[Callable[[], gym.Env]]:
    """Classic control's or MuJoCo's unpickled environments, each in the RecordEpisodeStatistics
    that the scripts now wrap around them, holding the running return and length that the
    checkpoint kept beside them (`episode_statistics_into_envs`), if it did."""
    statistics = getattr(saved, "episode_statistics", None)
    if statistics is None:
        return [lambda env=env: env for env in envs]
    wrapped = []
    for env, episode_return, episode_length in zip(envs, *statistics):
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.episode_returns, env.episode_lengths = float(episode_return), int(episode_length)
        wrapped.append(env)
    return [lambda env=env: env for env in wrapped]


def unpickle_game(saved_game: bytes) -> gym.Env:
    """An ale-py game of an older checkpoint: its pickled wrapper stack, with its emulator put
    back."""
    env, emulator_state, rng = pickle.loads(saved_game)
    env.unwrapped.ale.restoreState(emulator_state)
    env.unwrapped.np_random.bit_generator.state = rng
    return env

