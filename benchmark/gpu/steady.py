"""Where a training iteration's time goes once compilation is over: the rollout against the update,
by the wall clock, and a cProfile of the steady-state iterations alone.

    python benchmark/gpu/steady.py --script ppo_atari_envpool.py --env-id Pong-v5 --num-envs 16 \\
        --set clip_coef=0.2 num_minibatches=8 update_epochs=3 \\
        --options async_envs compile cudagraphs \\
        --warmup-iterations 20 --iterations 100 --profile pong.prof

The script's `main()` trains in this process (in a temporary folder), as benchmark/speed.py runs it,
untouched (benchmark/timer/speed_clocks.py). Each iteration ends at the time of its charts/SPS point
in the run's TensorBoard log, logged after the update's statistics came back to the host; its
rollout ends where `main` reaches the value call for the last observations, after every game has
answered and the last actions came back, as a thread that reads `main`'s line every millisecond sees
it. Neither adds a synchronisation with the GPU. The iterations from `--warmup-iterations` on, which
neither compile nor record CUDA graphs, give the split; the cProfile (optional) covers the same
iterations and nothing else (sys.setprofile watches the warm-up's calls for its last charts/SPS log,
then hands over to cProfile). Alongside, the script's own raw environment rate, as speed.py measures
it, says how close the rollout comes to the games' speed.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import statistics

from benchmark import speed  # the raw rate, the --set parser, the script defaults
from benchmark.timer.speed_clocks import iteration_parts  # each iteration's rollout and update


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", default="ppo_atari_envpool.py", choices=list(speed.DEFAULTS))
    parser.add_argument("--env-id", help="default: the script's own in benchmark/speed.py")
    parser.add_argument("--num-envs", type=int, help="default: the script's own")
    parser.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                        help="other settings of the script's Args, as in benchmark/speed.py")
    parser.add_argument("--options", nargs="*", default=[], choices=speed.SPEED_OPTIONS)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (to try this tool)")
    parser.add_argument("--warmup-iterations", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=100, help="steady-state iterations timed")
    parser.add_argument("--raw-seconds", type=float, default=10.0)
    parser.add_argument("--profile", help="write the steady state's cProfile here")
    args = parser.parse_args(argv)

    script = importlib.import_module(f"ppo.{args.script.removesuffix('.py')}")
    default_env, default_num_envs, _ = speed.DEFAULTS[args.script]
    env_id = args.env_id or default_env
    num_envs = args.num_envs or default_num_envs
    settings = speed.field_values(script, args.set)
    num_steps = settings.get("num_steps", script.Args().num_steps)
    iterations = args.warmup_iterations + args.iterations
    run_args = script.Args(env_id=env_id, num_envs=num_envs, cuda=not args.cpu,
                           total_timesteps=iterations * num_envs * num_steps, **settings,
                           **{name: True for name in args.options})
    raw_wall, _ = speed.raw_env_speed(script, env_id, num_envs, args.raw_seconds)
    profiler = cProfile.Profile() if args.profile else None
    parts = iteration_parts(script, run_args, args.warmup_iterations, profiler)

    rollout = [part[0] for part in parts]
    update = [part[1] for part in parts]
    steps = sum(part[2] for part in parts)
    wall = sum(rollout) + sum(update)
    rollout_steps_per_second = steps / sum(rollout)
    print(f"\n{args.script} on {env_id}, {num_envs} envs, options: "
          f"{'+'.join(args.options) or 'plain'}, {len(parts)} steady iterations "
          f"of {steps // len(parts):,} steps")
    print("| part | mean s per iteration | median | share | steps per second |")
    print("|---|---|---|---|---|")
    print(f"| rollout | {statistics.mean(rollout):.4f} | {statistics.median(rollout):.4f} | "
          f"{sum(rollout) / wall:.2f} | {rollout_steps_per_second:,.0f} |")
    print(f"| update | {statistics.mean(update):.4f} | {statistics.median(update):.4f} | "
          f"{sum(update) / wall:.2f} | |")
    print(f"| iteration | {wall / len(parts):.4f} | | 1.00 | {steps / wall:,.0f} |")
    print(f"raw env SPS {raw_wall:,.0f}: training {steps / wall / raw_wall:.2f} of it, "
          f"the rollout alone {rollout_steps_per_second / raw_wall:.2f}")
    if profiler:
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
