"""One environment's state as data, layer by layer from the outermost wrapper in (env_state), put
back into the same environment built anew (restore_env): a resumed run goes on with its episodes."""

import types
from collections import deque
from typing import Callable

import gymnasium as gym
import numpy as np

from ppo_utils.exits import WrongInput


# A layer holds data, random generators, a simulator, or what building it made, which the rebuilt
# layer has: these, by name and by kind (spaces, functions such as np.sign, MuJoCo's model).
REBUILT_ATTRIBUTES = {"env", "spec", "_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs",
                      "_action_set"}
REBUILT_TYPES = (gym.Space, gym.envs.registration.EnvSpec, types.FunctionType,
                 types.BuiltinFunctionType, types.MethodType, np.ufunc)
REBUILT_CLASS_NAMES = {"MjModel", "MujocoRenderer"}
SIMULATORS = {"MjData", "ALEInterface"}  # MuJoCo's simulation data, ale-py's emulator
BIT_GENERATORS = {"PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"}


class EnvStateMismatch(WrongInput):
    """A saved state that does not fit the environment built to take it back."""


def mismatch(detail: str) -> EnvStateMismatch:
    return EnvStateMismatch(f"cannot resume the saved environments: {detail}")


class NotSavableAsData(Exception):
    """A value that is no data: the state that holds it cannot be saved."""


def as_data(value):
    """`value` as a checkpoint holds it (numbers, text, bytes, NumPy's numbers, containers of
    these), arrays copied; else NotSavableAsData."""
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
    """MuJoCo's: the time and all of MjData's arrays (some tasks read derived ones before a step);
    ale-py's: the emulator's state with its random generator, as ALE's bytes."""
    kind = type(simulator).__name__
    if kind == "MjData":
        arrays = {name: getattr(simulator, name) for name in dir(simulator)
                  if not name.startswith("_")}
        return {"mujoco": {"time": simulator.time,
                           "arrays": {name: array.copy() for name, array in arrays.items()
                                      if isinstance(array, np.ndarray)}}}
    return {"ale": simulator.cloneState(include_rng=True).__getstate__()}


def restore_simulator(simulator, state: dict) -> None:
    """Put back what `simulator_state` saved (but MuJoCo's arrays sized by the moment's contacts,
    which each step computes anew)."""
    kind = type(simulator).__name__
    if kind == "MjData" and isinstance(state.get("mujoco"), dict):
        for name, array in state["mujoco"]["arrays"].items():
            target = getattr(simulator, name, None)
            if isinstance(target, np.ndarray) and target.shape == np.shape(array):
                target[...] = array
        simulator.time = state["mujoco"]["time"]
    elif kind == "ALEInterface" and isinstance(state.get("ale"), bytes):
        import ale_py  # installed, since an ale-py game was built

        emulator = ale_py.ALEState.__new__(ale_py.ALEState)
        emulator.__setstate__(state["ale"])
        simulator.restoreState(emulator)
    else:
        raise mismatch(f"a saved simulator state does not fit the {kind} built")


def layer_state(layer, simulators: set[int]) -> dict:
    """One layer's class, data, random generators and simulator (saved with the first layer that
    holds it); NotSavableAsData for an attribute that is none of these, nor rebuilt."""
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
    """One environment's layers' states, the outermost first; None where some of it is no data (a
    video half written, a Box2D world): a resumed run then plays new episodes."""
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
    """Put back one layer's state, into attributes that hold data or are not made yet (classic
    control's `state`), never over anything else (a method, a space)."""
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
    """The environment `make_env` builds, `layers` put back; EnvStateMismatch if they misfit."""
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
