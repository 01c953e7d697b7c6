"""One environment's state as a checkpoint holds it: saved as data, layer by layer from the
outermost wrapper in (env_state), and put back into the same environment built anew (restore_env),
so that a resumed run continues its very episodes. Which environments a run saves, and where (a game
in its worker process with --async-envs), is environments.py's.
"""

import types
from collections import deque
from typing import Callable

import gymnasium as gym
import numpy as np

from ppo_utils.exits import WrongInput


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


class EnvStateMismatch(WrongInput):
    """A saved environment's state that does not fit the environment built to take it back (another
    version of the wrappers, an altered file): found where the environments are built, which may be
    a worker process of --async-envs."""


def mismatch(detail: str) -> EnvStateMismatch:
    return EnvStateMismatch(f"cannot resume the saved environments: {detail}")


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
        raise mismatch(f"a saved simulator state does not fit the {kind} built")


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
            raise mismatch(f"{state['class']} holds no data in {name!r}") from None
        if isinstance(current, deque):
            current.clear()
            current.extend(value)
        else:
            setattr(layer, name, value)
    for name, saved in state["generators"].items():
        generator = getattr(layer, name, None)
        if not isinstance(generator, np.random.Generator):  # a generator made at the first reset
            if generator is not None or saved.get("bit_generator") not in BIT_GENERATORS:
                raise mismatch(f"{state['class']}.{name} is not a random generator of NumPy's")
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
            if layer is None or state["class"] != type(layer).__name__:
                built = type(layer).__name__ if layer is not None else "nothing"
                raise mismatch(f"the saved environment has a {state['class']} where the one "
                               f"built has {built}")
            restore_layer(layer, state)
            layer = layer.env if isinstance(layer, gym.Wrapper) else None
    except EnvStateMismatch:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as error:  # data of another kind
        raise mismatch(f"the saved state does not fit ({error})") from None
    if layer is not None:
        raise mismatch(f"the environment built has a {type(layer).__name__} the saved one has not")
    return env
