"""A user's environment as the MLP scripts (ppo.py, ppo_continuous_action.py, ppo_multidiscrete.py)
take it: its id and render modes (check_gymnasium_id), its observations flattened into one vector
and its actions as the network writes them (as_vectors), and a refusal of the rest in one line that
says what to do (check_spaces)."""

import gymnasium as gym
import numpy as np

from ppo_utils.environments import gymnasium_spec, packages_checked
from ppo_utils.exits import WrongInput

# named when an environment is refused
SCRIPT_FOR_ACTIONS = {"Discrete": "ppo/ppo.py", "Box": "ppo/ppo_continuous_action.py",
                      "MultiDiscrete": "ppo/ppo_multidiscrete.py",
                      "MultiBinary": "ppo/ppo_multidiscrete.py",
                      "integer Box": "ppo/ppo_multidiscrete.py"}
# Observations no network here reads: characters as numbers would mean nothing, and a Graph's or a
# Sequence's size changes from step to step.
UNREADABLE = {"Text": "encode the text as numbers, in a Box", "Graph": "pad it to a fixed-size Box",
              "Sequence": "pad it to a fixed-size Box"}


def unreadable(space: gym.Space) -> gym.Space | None:
    """The part of an observation space that no network here reads (UNREADABLE), if any."""
    if type(space).__name__ in UNREADABLE:
        return space
    parts = getattr(space, "spaces", ())  # a Dict's or a Tuple's
    return next(filter(None, map(unreadable, getattr(parts, "values", lambda: parts)())), None)


def as_vectors(env: gym.Env) -> gym.Env:
    """`env` as an MLP reads and acts on it: observations that are not one flat Box flattened into
    one (FlattenObservation: a Dict's parts side by side, a Discrete as its one-hot, since the
    index of a state is no quantity); Box actions of more dimensions flattened for the network and
    reshaped for the environment; Discrete actions counted from 0."""
    space, actions = env.observation_space, env.action_space
    flat = isinstance(space, gym.spaces.Box) and len(space.shape) == 1
    if not flat and unreadable(space) is None:
        env = gym.wrappers.FlattenObservation(env)
    if isinstance(actions, gym.spaces.Box) and len(actions.shape) > 1:
        flat_actions = gym.spaces.Box(actions.low.flatten(), actions.high.flatten(),
                                      dtype=actions.dtype)
        env = gym.wrappers.TransformAction(env, lambda action: action.reshape(actions.shape),
                                           flat_actions)
    elif isinstance(actions, gym.spaces.Discrete) and actions.start != 0:
        env = gym.wrappers.TransformAction(env, lambda action: action + actions.start,
                                           gym.spaces.Discrete(actions.n))
    return env


def check_spaces(envs, env_id: str, actions: tuple[type, ...]) -> None:
    """Refuse an action space that is none of `actions`, or observations that are no flat vector
    (as_vectors made them one where it could), naming what to do."""
    action_space = getattr(envs, "single_action_space", None) or envs.action_space
    space = getattr(envs, "single_observation_space", None) or envs.observation_space
    kind = type(action_space).__name__
    if kind == "Box" and np.issubdtype(action_space.dtype, np.integer):
        kind = "integer Box"  # a Box of actions is a Gaussian's: real numbers
    if kind not in [space.__name__ for space in actions]:
        envs.close()
        wanted = " or ".join(space.__name__ for space in actions)
        hint = (f"use {SCRIPT_FOR_ACTIONS[kind]} for {kind} actions" if kind in SCRIPT_FOR_ACTIONS
                else "no script here takes these: expose Discrete, MultiDiscrete or Box actions "
                     "in your environment")
        raise WrongInput(f"{env_id} has {'an' if kind[0] in 'ei' else 'a'} {kind} action space, "
                         f"but this script trains on {wanted} actions: {hint}")
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        envs.close()
        part = unreadable(space)
        kind = type(part if part is not None else space).__name__
        within = "" if part is space or part is None else f" within its {type(space).__name__}"
        raise WrongInput(f"{env_id} observes a {kind}{within}, which this script cannot read as a "
                         f"vector: {UNREADABLE.get(kind, 'make it a Box')} in your environment")


def check_gymnasium_id(env_id: str, hint: str = "", filmed: bool = False) -> None:
    """Refuse an id gymnasium does not know, with `hint`, and (`filmed`: --capture-video, --watch)
    one that draws no frames."""
    atari = "NoFrameskip" in env_id or env_id.startswith("ALE/")
    spec = gymnasium_spec(env_id, hint or (" (Atari ids need ppo/ppo_atari.py)" if atari else ""))
    if spec.entry_point == "ale_py.env:AtariEnv" and spec.kwargs.get("obs_type") != "ram":
        raise WrongInput(f"{env_id} is an Atari game, seen as frames: ppo/ppo_atari.py trains on "
                         "it")
    if not filmed:
        return
    with packages_checked(env_id):  # its module may need a package not installed
        creator = spec.entry_point if callable(spec.entry_point) else \
            gym.envs.registration.load_env_creator(spec.entry_point)
    modes = getattr(creator, "metadata", {}).get("render_modes", ["rgb_array"])
    if "rgb_array" not in modes:
        raise WrongInput(f"--capture-video and --watch take the frames an environment draws, and "
                         f"{env_id} draws none (its render modes: {', '.join(modes) or 'none'}): "
                         "drop the flag, or give the environment an rgb_array render mode")
