"""A small environment with MultiDiscrete actions and invalid-action masks, in each of the ways an
environment hands its mask out, for the tests of ppo_multidiscrete.py (importable as a user's
module: `--env-id masked_envs:Shelves-v0` with tests/ on PYTHONPATH).

Shelves: each of three shelves has a few slots, each empty or holding an item of some value in (0,
1]. Each step every shelf either passes (choice 0) or picks one of its slots (choice 1 + slot), so
the action is MultiDiscrete([slots + 1, ...]). Picking an item earns its value and empties the slot;
picking an empty slot costs 1 and counts in info["invalid_picks"]. Empty slots refill at random. An
episode lasts `horizon` steps. The mask allows passing and the slots that hold an item, so a shelf
with nothing on it has exactly one valid choice.
"""

import gymnasium as gym
import numpy as np


class Shelves(gym.Env):
    def __init__(self, slots=(3, 4, 5), horizon: int = 8, mask_in: str = "obs",
                 mask_shape: str = "rows"):
        self.slots, self.horizon, self.mask_in, self.mask_shape = (
            tuple(slots), horizon, mask_in, mask_shape)
        self.nvec = np.array([n + 1 for n in slots])
        self.action_space = gym.spaces.MultiDiscrete(self.nvec)
        self.width = max(slots)
        values = gym.spaces.Box(0.0, 1.0, (len(slots) * self.width + 1,), np.float32)
        shape = {"rows": (len(slots), self.nvec.max()), "flat": (self.nvec.sum(),),
                 "joint": tuple(self.nvec)}
        self.observation_space = (
            gym.spaces.Dict({"values": values,
                             "action_mask": gym.spaces.MultiBinary(shape[mask_shape])})
            if mask_in == "obs" else values)
        self.values, self.t = np.zeros((len(slots), self.width), np.float32), 0

    def rows(self) -> np.ndarray:
        rows = np.zeros((len(self.slots), self.nvec.max()), dtype=bool)
        rows[:, 0] = True
        rows[:, 1:self.width + 1] = self.values > 0
        return rows

    def mask(self) -> np.ndarray:
        rows = self.rows()
        if self.mask_shape == "joint":  # one entry per combination of the three choices
            first, second, third = (row[:n] for row, n in zip(rows, self.nvec))
            return first[:, None, None] & second[None, :, None] & third[None, None, :]
        return (rows if self.mask_shape == "rows"
                else np.concatenate([row[:n] for row, n in zip(rows, self.nvec)]))

    def action_masks(self) -> np.ndarray:  # sb3-contrib's convention
        return self.mask()

    def refill(self, probability: float) -> None:
        new = np.where(self.np_random.random(self.values.shape) < probability,
                       self.np_random.uniform(0.05, 1.0, self.values.shape), 0.0)
        for shelf, n in enumerate(self.slots):
            new[shelf, n:] = 0.0
        self.values = np.where(self.values > 0, self.values, new).astype(np.float32)

    def observation(self):
        values = np.append(self.values.ravel(),
                           (self.horizon - self.t) / self.horizon).astype(np.float32)
        return ({"values": values, "action_mask": self.mask().astype(np.int8)}
                if self.mask_in == "obs" else values)

    def info(self, invalid_picks: int = 0) -> dict:
        return {"invalid_picks": invalid_picks,
                **({"action_mask": self.mask()} if self.mask_in == "info" else {})}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.values[:], self.t = 0.0, 0
        self.refill(0.6)
        return self.observation(), self.info()

    def step(self, action):
        reward, invalid = 0.0, 0
        for shelf, choice in enumerate(np.asarray(action)):
            if choice == 0:
                continue
            if choice - 1 < self.slots[shelf] and self.values[shelf, choice - 1] > 0:
                reward += float(self.values[shelf, choice - 1])
                self.values[shelf, choice - 1] = 0.0
            else:
                invalid += 1
                reward -= 1.0
        self.refill(0.3)
        self.t += 1
        return self.observation(), reward, self.t >= self.horizon, False, self.info(invalid)


# The same game with its mask in each place an environment may keep it.
CONVENTIONS = {"Shelves-v0": dict(mask_in="obs", mask_shape="rows"),
               "ShelvesFlat-v0": dict(mask_in="obs", mask_shape="flat"),
               "ShelvesInfo-v0": dict(mask_in="info", mask_shape="rows"),
               "ShelvesMethod-v0": dict(mask_in="method", mask_shape="flat")}
for env_id, kwargs in {**CONVENTIONS,
                       "ShelvesJoint-v0": dict(mask_in="obs", mask_shape="joint")}.items():
    gym.register(id=env_id, entry_point=Shelves, kwargs=kwargs)


class FixedMask(gym.Env):
    """Actions MultiDiscrete(nvec), a reward of 1 per step for 16 steps, and `mask` at every step:
    in info["action_mask"], or with `key` in a Dict observation beside the position."""

    def __init__(self, nvec=(2, 2), mask=np.eye(2, dtype=bool), key: str | None = None):
        self.mask, self.key, self.t = np.asarray(mask, dtype=bool), key, 0
        self.action_space = gym.spaces.MultiDiscrete(nvec)
        position = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = (gym.spaces.Dict({"position": position,
                                                   key: gym.spaces.MultiBinary(self.mask.shape)})
                                  if key else position)

    def observation(self):
        position = np.full(2, self.t / 16, np.float32)
        return {"position": position, self.key: self.mask.astype(np.int8)} if self.key else position

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation(), {} if self.key else {"action_mask": self.mask.copy()}

    def step(self, action):
        self.t += 1
        return (self.observation(), 1.0, self.t >= 16, False,
                {} if self.key else {"action_mask": self.mask.copy()})


# a joint mask whose shape is also that of padded rows: only (0, 0) and (1, 1) allowed
FIXED_MASKS = {
    "JointEye-v0": dict(nvec=(2, 2), mask=np.eye(2, dtype=bool)),
    "JointTwoByThree-v0": dict(nvec=(2, 3), mask=np.eye(2, 3, dtype=bool)),
    # a mask of 4 for 5 choices
    "ShortMask-v0": dict(nvec=(2, 3), mask=np.ones(4, dtype=bool)),
    # a Dict observation whose mask's key is not `action_mask`
    "MasksKey-v0": dict(nvec=(3, 4), mask=np.ones(7, dtype=bool), key="action_masks"),
    # a mask that rules out every choice of the first part
    "NoChoice-v0": dict(nvec=(2, 3), mask=np.array([False, False, True, True, False])),
}
for env_id, kwargs in FIXED_MASKS.items():
    gym.register(id=env_id, entry_point=FixedMask, kwargs=kwargs)
