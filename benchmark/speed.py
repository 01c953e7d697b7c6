"""Training speed of a script against the raw speed of its environments, measured in one run.

    python benchmark/speed.py                                  # ppo.py on CartPole-v1
    python benchmark/speed.py --env-id Acrobot-v1 --total-timesteps 200000
    python benchmark/speed.py --script ppo_atari_envpool.py --env-id Breakout-v5 --num-envs 8 --total-timesteps 50000

First the script's own vector environment (built by the script's `make_envs`, so with the same
wrappers and autoreset mode) is stepped with random actions for `--raw-seconds`; then the script's
`main()` trains in a temporary directory, in this process, after every import is done. Both phases
are timed by the wall clock and by the CPU time of this process. The ratio of training to raw
throughput is what the training loop costs beyond the environments: 1.0 would mean learning for free.

Wall-clock figures are what a user sees, but they drop whenever anything else runs on the machine;
the CPU-time figures hardly move, so on a shared machine compare those.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def timed(function) -> tuple[float, float]:
    """Run `function()`; return the (wall, CPU) seconds it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def is_envpool(envs) -> bool:
    """Whether `envs` is an envpool, whose API differs from a gymnasium vector env's: it is seeded when
    made, its reset() takes no seed (envpool 1.0 refuses one), and its action_space is one environment's."""
    return any(cls.__module__.startswith("envpool.") for cls in type(envs).__mro__)


def raw_env_speed(script, env_id: str, num_envs: int, seconds: float) -> tuple[float, float]:
    """(wall, CPU) environment steps per second of the script's vector env under random actions."""
    envs = script.make_envs(env_id, num_envs)
    # Actions are drawn beforehand: they are not part of the env's cost.
    if is_envpool(envs):
        envs.reset()
        rng = np.random.default_rng(0)
        actions = [rng.integers(envs.action_space.n, size=num_envs) for _ in range(256)]
    else:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(256)]
    steps = 0

    def step_for_a_while():
        nonlocal steps
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for action in actions:
                envs.step(action)
            steps += len(actions) * num_envs

    wall, cpu = timed(step_for_a_while)
    envs.close()
    return steps / wall, steps / cpu


def training_speed(script, env_id: str, num_envs: int, total_timesteps: int) -> tuple[float, float]:
    """(wall, CPU) environment steps per second of a training run with the script's defaults."""
    args = script.Args(env_id=env_id, num_envs=num_envs, total_timesteps=total_timesteps, cuda=False)
    previous = os.getcwd()
    with tempfile.TemporaryDirectory() as workdir:
        os.chdir(workdir)
        try:
            result = {}
            wall, cpu = timed(lambda: result.update(script.main(args)))
        finally:
            os.chdir(previous)
    return result["global_step"] / wall, result["global_step"] / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", default="ppo.py", help="script in ppo/ (default: ppo.py)")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--total-timesteps", type=int, default=200_000)
    parser.add_argument("--raw-seconds", type=float, default=10.0)
    args = parser.parse_args()

    script = importlib.import_module(f"ppo.{args.script.removesuffix('.py')}")
    raw_wall, raw_cpu = raw_env_speed(script, args.env_id, args.num_envs, args.raw_seconds)
    train_wall, train_cpu = training_speed(script, args.env_id, args.num_envs, args.total_timesteps)
    print()
    print("| script | env | envs | clock | raw env SPS | training SPS | ratio |")
    print("|---|---|---|---|---|---|---|")
    for clock, raw, train in (("wall", raw_wall, train_wall), ("CPU", raw_cpu, train_cpu)):
        print(f"| {args.script} | {args.env_id} | {args.num_envs} | {clock} | {raw:,.0f} | {train:,.0f} | "
              f"{train / raw:.3f} |")


if __name__ == "__main__":
    main()
