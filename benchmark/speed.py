"""Training speed of the scripts against the raw speed of their environments, measured in one run.

    python benchmark/speed.py                      # every script, speed options off and on
    python benchmark/speed.py --scripts ppo.py     # ppo.py on CartPole-v1
    python benchmark/speed.py --scripts ppo_atari_envpool.py --env-id Pong-v5 --num-envs 16 \\
        --set clip_coef=0.2 num_minibatches=8 update_epochs=3 \\
        --options plain async_envs async_envs+compile

For each script, its own vector environment (built by the script's `make_envs`, so with the same
wrappers) is first stepped with random actions for `--raw-seconds`: the most the training could
reach. Then the script's `main()` trains in a temporary directory, in this process, once for each
combination of speed options (`--async-envs`, `--compile`, `--cudagraphs`, where the script has
them), on the CPU and, when there is one, on the GPU. One table comes out at the end.

Training speed is measured after the first `--warmup-iterations` iterations, which pay for
torch.compile's compilation and for recording CUDA graphs, from the run's own TensorBoard log: the
time of its first event, written as the writer opens just before the first iteration, and of each
charts/SPS point, logged with its step at the end of every iteration. The CPU time of that span is
the process's CPU rate between the first and the last reading within it of a thread that reads it
every 50 ms beside the run; nothing in the script or its run machinery is replaced
(benchmark/timer/speed_clocks.py, docs/notes/speed.md for the checks). The ratio of training to
raw throughput is what the training loop costs beyond the environments: 1.0 would mean learning
for free.

Wall-clock figures are what a user sees, but they drop whenever anything else runs on the machine;
CPU-time figures (the CPU time of this process, its environment threads included) hardly move, so on
a shared machine compare those. A run whose games play in worker processes (`--async-envs` of the
ale-py scripts) has no CPU-time figure: the workers' CPU time is not this process's.

`--parts` measures what bounds each part of a run, on the plain settings, and prints two more
tables (benchmark/timer/speed_parts.py). The first: the policy step alone (the agent's call of the
rollout on one step's observations, the action back on the host) and one gradient step alone (the
script's `minibatch_loss`, backward, gradient clipping and Adam on one minibatch), each replaying
the arguments that a one-iteration run passed them (seen with sys.setprofile, in that untimed run
only); from those and the raw rate, the floor: the steps per second a run would reach if it did
nothing but step the environments, take the policy steps and the gradient steps; and the start, a
fresh Python process that imports the script and builds its optimizer, as every run does before its
first step. The second splits a real run into its rollout and its update, each against its own
floor, to show which of the two loses the time: the loop's own statements, and its parts running
slower interleaved with each other than alone. The rollout ends where the script's `main` reaches
its value call for the last observations: halfway between the last and the next of the readings of
where `main` is, which a thread takes every millisecond (further apart where the run holds the
GIL); the update ends when the iteration logs charts/SPS. That thread makes both halves a little
slower (about 2% on CartPole).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import time
import types
import typing
from typing import NoReturn

from benchmark.timer.speed_clocks import fail, loop_split, training_speed  # a run, timed
from benchmark.timer.speed_parts import part_floors, raw_env_speed, start_seconds  # the parts alone

# What each script is measured on by default: env id, number of environments (the script's default)
# and number of iterations: 4 (1 to warm up, 3 measured), 40 for ppo.py, whose iterations are short.
# --total-timesteps, when not given, is that many batches of the settings measured.
DEFAULTS = {
    "ppo.py": ("CartPole-v1", 4, 40),
    "ppo_atari.py": ("BreakoutNoFrameskip-v4", 8, 4),
    "ppo_atari_lstm.py": ("BreakoutNoFrameskip-v4", 8, 4),
    "ppo_atari_envpool.py": ("Breakout-v5", 8, 4),
    "ppo_continuous_action.py": ("Hopper-v4", 1, 4),
    "ppo_procgen.py": ("starpilot", 64, 4),
    "ppo_atari_multigpu.py": ("BreakoutNoFrameskip-v4", 8, 4),
    "ppo_multidiscrete.py": ("Jumanji/Cleaner-v0", 4, 40),
}
# Scripts whose --async-envs plays the games in worker processes, whose CPU time this process
# cannot see (envpool's pools step on threads of this process).
ASYNC_IN_WORKER_PROCESSES = {"ppo_atari.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"}
SPEED_OPTIONS = ("async_envs", "numpy_policy", "compile", "cudagraphs")


def script_options(script) -> list[str]:
    """The speed options the script has (fields of its Args)."""
    return [name for name in SPEED_OPTIONS
            if name in {field.name for field in dataclasses.fields(script.Args)}]


def check_requested_options(script_file: str, script, requested: list[str],
                            devices: list[str]) -> None:
    """Refuse an --options item that names an option the script does not have, or that no
    device of this measurement can run (--cudagraphs needs CUDA): it would be left out, and
    measure nothing."""
    has = script_options(script)
    for item in requested:
        for name in item.split("+"):
            if name != "plain" and name not in has:
                fail(f"--options {item}: {script_file} has no speed option {name!r}; it has: "
                     f"{', '.join(['plain', *has])} (join several with +)")
        if "cudagraphs" in item.split("+") and "cuda" not in devices:
            fail(f"--options {item}: --cudagraphs needs CUDA, and this measurement runs on "
                 f"{', '.join(devices)} only: add --devices cuda on a machine with a GPU")


def option_sets(script, device: str, requested: list[str] | None) -> list[tuple[str, ...]]:
    """The combinations of speed options to measure: those requested (checked by
    check_requested_options), or by default none, each option the script has alone, and all of them
    together. --cudagraphs only on a GPU: a requested set with it is left out on the CPU."""
    available = [name for name in script_options(script)
                 if not (name == "cudagraphs" and device != "cuda")]
    if requested is not None:
        sets = [tuple(part for part in item.split("+") if part != "plain") for item in requested]
        return [options for options in sets if all(name in available for name in options)]
    sets = [()] + [(name,) for name in available]
    if len(available) > 1:
        sets.append(tuple(available))
    return sets


def field_values(script, assignments: list[str]) -> dict:
    """`--set name=value ...` as Args fields, each value read as its field's annotation says."""
    hints = typing.get_type_hints(script.Args)
    values = {}
    for assignment in assignments:
        name, _, text = assignment.partition("=")
        if name not in hints:
            fail(f"--set {assignment}: {script.__name__} has no setting {name!r}: "
                 "give a field of its Args")
        values[name] = parse_value(hints[name], text, assignment)
    return values


def parse_value(kind, text: str, assignment: str):
    """`text` as a value of type `kind`: bool, int, float, str, a Literal, any of them `| None`."""
    def refuse(what: str) -> NoReturn:
        fail(f"--set {assignment}: {what}")

    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if text.lower() == "none" and type(None) in typing.get_args(kind):
            return None
        kind = next(option for option in typing.get_args(kind) if option is not type(None))
    if kind is bool:
        if text.lower() not in ("1", "true", "yes", "0", "false", "no"):
            refuse("true or false?")
        return text.lower() in ("1", "true", "yes")
    if typing.get_origin(kind) is typing.Literal:
        if text not in typing.get_args(kind):
            refuse(f"pick one of {', '.join(map(str, typing.get_args(kind)))}")
        return text
    if kind not in (int, float, str):
        refuse(f"settings of type {kind} cannot be set here")
    try:
        return kind(text)
    except ValueError:
        refuse(f"not a valid {kind.__name__}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    if "cuda" in devices and not torch.cuda.is_available():
        fail("--devices cuda, but PyTorch sees no CUDA device: measure on --devices cpu")
    device_name = torch.cuda.get_device_name() if "cuda" in devices else "no GPU"
    scripts = {name: importlib.import_module(f"ppo.{name.removesuffix('.py')}")
               for name in args.scripts}
    settings_of = {name: field_values(script, args.set) for name, script in scripts.items()}
    if args.options is not None:
        for name, script in scripts.items():
            check_requested_options(name, script, args.options, devices)

    rows, part_rows, starts = [], [], {}
    for script_file, script in scripts.items():
        measure_script(script_file, script, settings_of[script_file], devices, args, rows,
                       part_rows)
        if args.parts:
            starts[script_file] = start_seconds(script_file)
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, {device_name}, "
          f"torch {torch.__version__}\n")
    print_speeds(rows)
    if part_rows:
        print_parts(part_rows, starts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, any wrong input refused before the first measurement, which takes a while."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scripts", "--script", nargs="+", default=list(DEFAULTS),
                        metavar="SCRIPT", help="scripts in ppo/ to measure (default: all of them)")
    parser.add_argument("--env-id", help="environment to measure on (default: each script's own, "
                        "see DEFAULTS)")
    parser.add_argument("--num-envs", type=int,
                        help="number of environments (default: each script's own)")
    parser.add_argument("--total-timesteps", type=int,
                        help="training steps per measurement (default: a few iterations)")
    parser.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                        help="other settings of the scripts' Args, "
                        "e.g. --set num_minibatches=8 clip_coef=0.2")
    parser.add_argument("--options", nargs="+", metavar="OPTIONS",
                        help="speed options to measure, e.g. plain async_envs compile+cudagraphs "
                             "(default: none, each alone, all together)")
    parser.add_argument("--devices", nargs="+", choices=["cpu", "cuda"],
                        help="where to train (default: cpu, and cuda when there is a GPU)")
    parser.add_argument("--raw-seconds", type=float, default=10.0,
                        help="how long to step the raw environments")
    parser.add_argument("--parts", action="store_true",
                        help="also measure the policy step, a gradient step and the start alone, "
                        "and the floor they set")
    parser.add_argument("--warmup-iterations", type=int, default=1,
                        help="iterations left out of the training speed "
                        "(compilation, CUDA-graph recording)")
    args = parser.parse_args(argv)
    # Every wrong input is refused before the first measurement, which takes a while.
    for flag, value, least in [("--num-envs", args.num_envs, 1),
                               ("--total-timesteps", args.total_timesteps, 1),
                               ("--warmup-iterations", args.warmup_iterations, 0)]:
        if value is not None and value < least:
            fail(f"{flag} {value}: give at least {least}")
    if not args.raw_seconds > 0:  # also refuses nan
        fail(f"--raw-seconds {args.raw_seconds}: give a positive number of seconds")
    unknown = [name for name in args.scripts if name not in DEFAULTS]
    if unknown:
        fail(f"unknown script {unknown[0]!r}: pick from {', '.join(DEFAULTS)}")
    return args


def measure_script(script_file: str, script, settings: dict, devices: list[str],
                   args: argparse.Namespace, rows: list, part_rows: list) -> None:
    """Measure one script on each device with each set of speed options, adding a row to `rows` for
    each (the raw environments' rate and the training's, wall and CPU); with --parts, the parts
    alone too, a row of `part_rows` per device."""
    default_env, default_num_envs, default_iterations = DEFAULTS[script_file]
    env_id = args.env_id or default_env
    num_envs = default_num_envs if args.num_envs is None else args.num_envs
    num_steps = settings.get("num_steps", script.Args().num_steps)
    total_timesteps = args.total_timesteps or default_iterations * num_envs * num_steps
    raw_wall, raw_cpu = raw_env_speed(script, env_id, num_envs, args.raw_seconds)
    for device in devices:
        for options in option_sets(script, device, args.options):
            run_args = script.Args(env_id=env_id, num_envs=num_envs, cuda=device == "cuda",
                                   total_timesteps=total_timesteps,
                                   **settings, **{name: True for name in options})
            print(f"{script_file} on {env_id}, {num_envs} envs, {device}, "
                  f"options: {'+'.join(options) or 'plain'}", flush=True)
            train_wall, train_cpu, _ = training_speed(script, run_args, args.warmup_iterations)
            if "async_envs" in options and script_file in ASYNC_IN_WORKER_PROCESSES:
                train_cpu = None  # the games' CPU time is the workers', out of this process's sight
            rows.append((script_file, env_id, num_envs, device, "+".join(options) or "plain",
                         raw_wall, train_wall, raw_cpu, train_cpu))
        if args.parts:
            plain_args = script.Args(env_id=env_id, num_envs=num_envs, cuda=device == "cuda",
                                     **settings)
            print(f"{script_file}: the parts alone, {device}", flush=True)
            policy_seconds, gradient_seconds = part_floors(script, plain_args)
            plain_rows = [row for row in rows
                          if row[:5] == (script_file, env_id, num_envs, device, "plain")]
            split = loop_split(script,
                               dataclasses.replace(plain_args, total_timesteps=total_timesteps),
                               args.warmup_iterations)
            part_rows.append((script_file, env_id, device, plain_args, raw_wall, policy_seconds,
                              gradient_seconds, plain_rows[0][6] if plain_rows else None, split))


def print_speeds(rows: list) -> None:
    """The main table: each measurement's raw environment and training rates and their ratios."""
    print("| script | env | envs | device | options | raw env SPS | training SPS | ratio "
          "| CPU-time ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (script_file, env_id, num_envs, device, options, raw_wall, train_wall, raw_cpu,
         train_cpu) in rows:
        print(f"| {script_file} | {env_id} | {num_envs} | {device} | {options} | {raw_wall:,.0f} | "
              f"{train_wall:,.0f} | {train_wall / raw_wall:.3g} | "
              f"{'n/a' if train_cpu is None else f'{train_cpu / raw_cpu:.3g}'} |")


def print_parts(part_rows: list, starts: dict) -> None:
    """The --parts table: each part's cost per call, and the steps per second it alone allows."""
    print("\nEach part alone, in steps per second of the environments "
          "(a policy step serves num_envs steps,")
    print("a batch of num_envs x num_steps steps pays update_epochs x num_minibatches "
          "gradient steps);")
    print("the floor adds the three parts' times per step: "
          "training with nothing else in the loop.\n")
    print("| script | env | device | raw env SPS | policy step | policy SPS "
          "| gradient step (minibatch) | "
          "gradient SPS | floor SPS | training SPS (plain) | of the floor | start |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    split_lines = []
    for (script_file, env_id, device, run_args, raw, policy_seconds, gradient_seconds, train,
         split) in part_rows:
        batch_size = run_args.num_envs * run_args.num_steps
        policy_rate = run_args.num_envs / policy_seconds
        gradient_rate = batch_size / (run_args.update_epochs * run_args.num_minibatches
                                      * gradient_seconds)
        floor = 1 / (1 / raw + 1 / policy_rate + 1 / gradient_rate)
        rollout_floor = 1 / (1 / raw + 1 / policy_rate)
        split_lines.append(f"| {script_file} | {env_id} | {device} | {rollout_floor:,.0f} "
                           f"| {1 / split[0]:,.0f} | {split[0] * rollout_floor:.2f} "
                           f"| {gradient_rate:,.0f} | {1 / split[1]:,.0f} "
                           f"| {split[1] * gradient_rate:.2f} |")
        print(f"| {script_file} | {env_id} | {device} | {raw:,.0f} "
              f"| {policy_seconds * 1e6:,.0f} µs | {policy_rate:,.0f} "
              f"| {gradient_seconds * 1e3:.2f} ms ({batch_size // run_args.num_minibatches}) "
              f"| {gradient_rate:,.0f} | {floor:,.0f} "
              f"| {'-' if train is None else f'{train:,.0f}'} "
              f"| {'-' if train is None else f'{train / floor:.2f}'} "
              f"| {starts[script_file]:.2f} s |")
    print("\nThe same run split in two, in steps per second, against each half's floor: the "
          "rollout (the\nenvironments and policy steps, then the batched pass over the rollout) "
          "and the update (GAE, the\ngradient steps, the logs); 'x floor': how many times its "
          "floor's time each half took.\n")
    print("| script | env | device | rollout floor SPS | rollout SPS | rollout, x floor "
          "| update floor SPS | update SPS | update, x floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(split_lines))


if __name__ == "__main__":
    main()
