"""Reference returns on Jumanji/Cleaner-v0 (envpool's port): what hand-written policies score, to
set a trained agent's return beside.

    python benchmark/cleaner_references.py                      # 400 episodes a policy, seed 1
    python benchmark/cleaner_references.py --episodes 100 --seed 2

Three agents clean a 10 x 10 maze; each step every agent moves up, right, down or left (0 to 3).
The observation's grid holds 0 for a dirty tile, 1 for a clean one and 2 for a wall, and its
action_mask one row per agent of the moves that stay on the board and off the walls. A move onto a
dirty tile cleans it, +1; every step costs 0.5; a move the mask rules out ends the episode, as does
the 100th step (Jumanji's Cleaner, https://instadeepai.github.io/jumanji/environments/cleaner/).

The policies, each agent choosing on its own:

- random (unmasked): any of the four moves, uniformly;
- random valid: uniformly among the moves its mask allows;
- greedy: onto an adjacent dirty tile its mask allows (uniformly among them), else as random valid.

An agent whose mask allows no move (a maze can wall in the corner the agents start from) moves at
random, as ppo_multidiscrete.py's policy does then. Each policy plays its episodes one after the
other in a pool of one game seeded with --seed, so the k-th episode of every policy has the same
maze; its moves come from NumPy's generator seeded with --seed too. The same command prints the
same table. envpool resets a finished game on the step after its end,
which ignores the action and returns reward 0: that step belongs to no episode and is not counted.
The table gives each policy's mean and standard deviation (NumPy, ddof=0) of the episode returns,
and the mean episode length.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

import numpy as np

ENV_ID = "Jumanji/Cleaner-v0"
DIRTY = 0  # the grid's code of a dirty tile (1: clean, 2: wall)
# The move each action makes, as (row, column) steps: 0 up, 1 right, 2 down, 3 left.
MOVES = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]])

Policy = Callable[[dict, np.random.Generator], np.ndarray]


def fail(message: str) -> NoReturn:
    """Wrong input: one line saying what to do, exit code 2."""
    print(f"cleaner_references.py: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def random_unmasked(obs: dict, rng: np.random.Generator) -> np.ndarray:
    """Any of the four moves for each agent, whatever its mask says."""
    return rng.integers(len(MOVES), size=len(obs["action_mask"]))


def random_among(allowed: np.ndarray, rng: np.random.Generator) -> int:
    """A uniform choice among the True entries of `allowed`; among all moves if there is none."""
    choices = np.flatnonzero(allowed)
    return int(rng.choice(choices)) if len(choices) else int(rng.integers(len(allowed)))


def random_valid(obs: dict, rng: np.random.Generator) -> np.ndarray:
    """For each agent, a move its mask allows."""
    return np.array([random_among(allowed, rng) for allowed in obs["action_mask"]])


def greedy(obs: dict, rng: np.random.Generator) -> np.ndarray:
    """For each agent, a move onto an adjacent dirty tile its mask allows, else a valid one."""
    grid, actions = obs["grid"], []
    for location, allowed in zip(obs["agents_locations"], obs["action_mask"]):
        targets = location + MOVES
        inside = np.all((targets >= 0) & (targets < grid.shape), axis=1)
        dirty = np.zeros(len(MOVES), dtype=bool)
        dirty[inside] = grid[targets[inside, 0], targets[inside, 1]] == DIRTY
        actions.append(random_among(allowed & dirty, rng) if (allowed & dirty).any()
                       else random_among(allowed, rng))
    return np.array(actions)


POLICIES: dict[str, Policy] = {"random (unmasked)": random_unmasked, "random valid": random_valid,
                               "greedy": greedy}


def first(batch: dict) -> dict:
    """The one game's share of the pool's observation."""
    return {key: value[0] for key, value in batch.items()}


def play(policy: Policy, episodes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The returns and lengths of `episodes` episodes of `policy`, played one after the other."""
    import envpool

    pool = envpool.make(ENV_ID, env_type="gymnasium", num_envs=1, seed=seed)
    rng = np.random.default_rng(seed)
    returns, lengths = [], []
    obs, info = pool.reset()
    episode_return, length = 0.0, 0
    while len(returns) < episodes:
        if length == 0:  # the grid's codes, checked against the game's own count of dirty tiles
            assert (obs["grid"][0] == DIRTY).sum() == info["num_dirty_tiles"][0]
        action = policy(first(obs), rng).astype(pool.action_space.dtype)
        obs, reward, terminated, truncated, info = pool.step(action[None])
        episode_return += float(reward[0])
        length += 1
        if terminated[0] or truncated[0]:
            returns.append(episode_return)
            lengths.append(length)
            episode_return, length = 0.0, 0
            # envpool's reset step: the action is ignored, the reward 0, the next episode's start.
            obs, reward, _, _, info = pool.step(np.zeros_like(action)[None])
            assert reward[0] == 0 and info["elapsed_step"][0] == 0
    pool.close()
    return np.array(returns), np.array(lengths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=400,
                        help="episodes per policy (default 400)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the mazes and the moves (default 1)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        fail(f"--episodes must be 1 or more, got {args.episodes}")
    if not 0 <= args.seed < 2**31:
        fail(f"--seed must be in [0, 2**31), got {args.seed}")
    try:
        import envpool  # noqa: F401
    except ImportError:
        fail("the game comes from envpool: pip install -e '.[envpool]'")
    print(f"{ENV_ID}, {args.episodes} episodes a policy, seed {args.seed}\n")
    print("| policy | episode return, mean ± std | episode length, mean |")
    print("| --- | --- | --- |")
    for name, policy in POLICIES.items():
        returns, lengths = play(policy, args.episodes, args.seed)
        print(f"| {name} | {returns.mean():.2f} ± {returns.std():.2f} | {lengths.mean():.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
