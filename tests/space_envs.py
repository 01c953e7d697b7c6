"""Environments over every combination of gymnasium's observation and action spaces, for the
property test of tests/test_spaces.py: `--env-id space_envs:Spaces-<observations>-<actions>-v0`,
importable as a user's own module (tests/ is on sys.path in the tests, on PYTHONPATH for a
subprocess).

Each observes a sample of its observation space and pays 1 a step for 8 steps, a time limit. It
refuses an action outside its action space, as a real environment would misbehave on one: a script
that lets through a space it cannot act in crashes here, not silently.
"""

import gymnasium as gym
import numpy as np
from gymnasium import spaces

OBSERVATIONS = {
    "Box": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "Box2x2": spaces.Box(-1.0, 1.0, (2, 2), np.float32),
    "Image": spaces.Box(0, 255, (6, 6, 3), np.uint8),
    "IntBox": spaces.Box(-5, 5, (3,), np.int64),
    "Unbounded": spaces.Box(-np.inf, np.inf, (3,), np.float64),
    "Discrete": spaces.Discrete(5),
    "DiscreteFrom2": spaces.Discrete(4, start=2),
    "MultiDiscrete": spaces.MultiDiscrete([2, 3]),
    "MultiBinary": spaces.MultiBinary(4),
    "Dict": spaces.Dict({"position": spaces.Box(-1.0, 1.0, (2,), np.float32),
                         "door": spaces.Discrete(2)}),
    "Tuple": spaces.Tuple((spaces.Discrete(3), spaces.Box(-1.0, 1.0, (2,), np.float32))),
    "Text": spaces.Text(6),
    "Graph": spaces.Graph(spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(2)),
    "Sequence": spaces.Sequence(spaces.Box(-1.0, 1.0, (2,), np.float32)),
    "DictWithText": spaces.Dict({"position": spaces.Box(-1.0, 1.0, (2,), np.float32),
                                 "note": spaces.Text(4)}),
}
ACTIONS = {
    "Discrete": spaces.Discrete(3),
    "DiscreteFrom2": spaces.Discrete(3, start=2),
    "MultiDiscrete": spaces.MultiDiscrete([2, 3]),
    "MultiDiscrete2x2": spaces.MultiDiscrete([[2, 3], [3, 2]]),
    "Box": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "Box2x2": spaces.Box(-1.0, 1.0, (2, 2), np.float32),
    "Unbounded": spaces.Box(-np.inf, np.inf, (2,), np.float32),
    "IntBox": spaces.Box(0, 3, (2,), np.int64),
    "MultiBinary": spaces.MultiBinary(3),
    "MultiBinary2x2": spaces.MultiBinary((2, 2)),
}


class SpaceEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, observations: str, actions: str):
        self.observation_space, self.action_space = OBSERVATIONS[observations], ACTIONS[actions]
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"{action!r} is no action of {self.action_space}")
        self.t += 1
        return self.observation_space.sample(), 1.0, False, self.t >= 8, {}


for observed in OBSERVATIONS:
    for acted in ACTIONS:
        gym.register(f"Spaces-{observed}-{acted}-v0", entry_point=SpaceEnv,
                     kwargs={"observations": observed, "actions": acted})
