# Over 400 lines, kept whole: one command whose measurements (the raw environments, the training, the
# parts alone) share their clocks and their hooks into a script's run (the monkeypatches below, which
# stand in for hooks ppo/ lacks); main names its steps (parse_args, measure_script, print_speeds).
"""Training speed of the scripts against the raw speed of their environments, measured in one run.

    python benchmark/speed.py                                   # every script, speed options off and on
    python benchmark/speed.py --scripts ppo.py                  # ppo.py on CartPole-v1
    python benchmark/speed.py --scripts ppo_atari_envpool.py --env-id Pong-v5 --num-envs 16 \\
        --set clip_coef=0.2 num_minibatches=8 update_epochs=3 --options plain async_envs async_envs+compile

For each script, its own vector environment (built by the script's `make_envs`, so with the same
wrappers) is first stepped with random actions for `--raw-seconds`: the most the training could
reach. Then the script's `main()` trains in a temporary directory, in this process, once for each
combination of speed options (`--async-envs`, `--compile`, `--cudagraphs`, where the script has
them), on the CPU and, when there is one, on the GPU. One table comes out at the end.

Training speed is measured after the first `--warmup-iterations` iterations, which pay for
torch.compile's compilation and for recording CUDA graphs: the steps and the clocks are read when
the script opens its TensorBoard writer, just before its first iteration, and each time it logs
charts/SPS, at the end of every iteration. The ratio of training to raw
throughput is what the training loop costs beyond the environments: 1.0 would mean learning for free.

Wall-clock figures are what a user sees, but they drop whenever anything else runs on the machine;
CPU-time figures (the CPU time of this process, its environment threads included) hardly move, so on
a shared machine compare those. A run whose games play in worker processes (`--async-envs` of the
ale-py scripts) has no CPU-time figure: the workers' CPU time is not this process's.

`--parts` measures what bounds each part of a run, on the plain settings, and prints two more tables.
The first: the policy step alone (the agent's call of the rollout on one step's observations, the
action back on the host) and one gradient step alone (the script's `minibatch_loss`, backward,
gradient clipping and Adam on one minibatch), each replaying the arguments that a one-iteration run
passed them; from those and the raw rate, the floor: the steps per second a run would reach if it did
nothing but step the environments, take the policy steps and the gradient steps; and the start, a
fresh Python process that imports the script and builds its optimizer, as every run does before its
first step. The second splits a real run into its rollout and its update, each against its own
floor, to show which of the two loses the time: the loop's own statements, and its parts running
slower interleaved with each other than alone.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import typing
from pathlib import Path
from typing import NoReturn

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmark.scripts_on_path import make_scripts_importable  # noqa: E402

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


def fail(message: str) -> NoReturn:
    """Wrong input: one line saying what to do, exit code 2."""
    print(f"speed.py: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def timed(function) -> tuple[float, float]:
    """Run `function()`; return the (wall, CPU) seconds it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def raw_env_speed(script, env_id: str, num_envs: int, seconds: float) -> tuple[float, float]:
    """(wall, CPU) environment steps per second of the script's vector env under random actions."""
    envs = script.make_envs(env_id, num_envs)
    # Actions are drawn beforehand: they are not part of the env's cost. Every script's make_envs
    # gives a gymnasium vector env or a class that steps like one (ppo_procgen.py's, envpool_games').
    envs.reset(seed=0)
    envs.single_action_space.seed(0)
    actions = [np.stack([envs.single_action_space.sample() for _ in range(num_envs)])
               for _ in range(256)]
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


def training_speed(script, args, warmup_iterations: int) -> tuple[float, float, int]:
    """(wall, CPU) environment steps per second of `script.main(args)` from the end of iteration
    `warmup_iterations` (0: the start of training) to the end of the run, and the number of steps
    measured. The clocks are read when the script opens its writer (ppo/run_logs.py's RunLogs) and
    whenever it logs charts/SPS, which every script does once per iteration."""
    import run_logs  # the scripts' run machinery (their logs), importable once a script is

    marks = []  # (global_step, wall, CPU): at the start of training, then at the end of each iteration

    class ClockedWriter(run_logs.SummaryWriter):
        def __init__(self, *options, **named_options):
            super().__init__(*options, **named_options)
            marks.append((0, time.perf_counter(), time.process_time()))

        def add_scalar(self, tag, value, global_step=None, *rest, **options):
            if tag == "charts/SPS":
                marks.append((global_step, time.perf_counter(), time.process_time()))
            return super().add_scalar(tag, value, global_step, *rest, **options)

    previous_directory, previous_writer = os.getcwd(), run_logs.SummaryWriter
    with tempfile.TemporaryDirectory() as workdir:
        os.chdir(workdir)
        # Monkeypatched (put back below): ppo/ has no hook for reading the clocks where the run logs.
        run_logs.SummaryWriter = ClockedWriter
        try:
            script.main(args)
        finally:
            run_logs.SummaryWriter = previous_writer
            os.chdir(previous_directory)
    iterations = len(marks) - 1
    if iterations <= warmup_iterations:
        fail(f"{iterations} iterations are too few to measure after {warmup_iterations} warm-up iterations: "
             "raise --total-timesteps")
    (first_step, first_wall, first_cpu), (last_step, last_wall, last_cpu) = marks[warmup_iterations], marks[-1]
    steps = last_step - first_step
    return steps / (last_wall - first_wall), steps / (last_cpu - first_cpu), steps


def record_first_calls(script, run_args) -> dict:
    """The arguments of the first policy step and of the first minibatch loss of a one-iteration
    run of `script` with `run_args`: {"policy": (args, kwargs), "loss": (args, kwargs)}."""
    recorded = {}

    def recording(name, function):
        def wrapper(*positional, **named):
            recorded.setdefault(name, (positional, named))
            return function(*positional, **named)
        return wrapper

    name = policy_step_name(script)
    policy_step, loss = getattr(script.Agent, name), script.minibatch_loss
    setattr(script.Agent, name, recording("policy", policy_step))
    # Monkeypatched (put back below): to measure the loss alone, its real arguments are recorded.
    script.minibatch_loss = recording("loss", loss)
    try:
        batch_size = run_args.num_envs * run_args.num_steps
        training_speed(script, dataclasses.replace(run_args, total_timesteps=batch_size), 0)
    finally:
        setattr(script.Agent, name, policy_step)
        script.minibatch_loss = loss
    return recorded


def policy_step_name(script) -> str:
    """The agent's method that the rollout calls: get_action where the script has one (the MLP
    scripts, which leave log-probabilities and values for after the rollout), else
    get_action_and_value, whose first call in a run is the rollout's."""
    return "get_action" if hasattr(script.Agent, "get_action") else "get_action_and_value"


def seconds_per_call(function, calls: int) -> float:
    """The median over 5 blocks of `calls` calls of the seconds one call of `function` takes, after
    `calls` calls to warm up."""
    for _ in range(calls):
        function()
    blocks = [timed(lambda: [function() for _ in range(calls)])[0] / calls for _ in range(5)]
    return statistics.median(blocks)


def part_floors(script, run_args) -> tuple[float, float]:
    """(policy step, gradient step): the seconds each takes alone, replaying the arguments that a
    one-iteration run passed them, as the script's loop runs them."""
    import torch

    recorded = record_first_calls(script, run_args)
    (agent, *policy_args), policy_named = recorded["policy"]

    def policy_step():
        with torch.inference_mode():
            action = getattr(script.Agent, policy_step_name(script))(agent, *policy_args, **policy_named)
            (action[0] if isinstance(action, tuple) else action).cpu().numpy()

    (agent, *loss_args), loss_named = recorded["loss"]
    optimizer = script.adam.Adam(agent.parameters(), lr=1e-6, eps=1e-5, fused=True)  # the scripts' own

    def gradient_step():
        loss, _ = script.minibatch_loss(agent, *loss_args, **loss_named)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), run_args.max_grad_norm, foreach=True)
        optimizer.step()

    return seconds_per_call(policy_step, 200), seconds_per_call(gradient_step, 50)


def clock_time() -> str:
    """The local time as nvidia-smi's timestamps give it, to find the steady state in its samples."""
    now = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def iteration_parts(script, run_args, warmup_iterations: int,
                    profiler: cProfile.Profile | None = None) -> list[tuple[float, float, int]]:
    """(rollout seconds, update seconds, steps) of each iteration of `script.main(run_args)` after
    the first `warmup_iterations`, which `profiler`, if given, leaves out too. The rollout ends at
    the iteration's last call of `Agent.get_value` (the last observations' value; a time limit's
    bootstrap calls it earlier), the update when the iteration logs charts/SPS."""
    import run_logs  # the scripts' run machinery (their logs), importable once a script is

    value_called = [0.0]  # wall clock of the latest Agent.get_value call
    iteration_ends = []  # (wall clock, global step) when training starts and each iteration ends
    rollout_ends = []
    original_get_value = script.Agent.get_value

    def get_value_noting_the_time(agent, *inputs, **options):
        value_called[0] = time.perf_counter()
        return original_get_value(agent, *inputs, **options)

    class ClockedWriter(run_logs.SummaryWriter):
        def __init__(self, *options, **named_options):
            super().__init__(*options, **named_options)
            iteration_ends.append((time.perf_counter(), 0))

        def add_scalar(self, tag, value, global_step=None, *rest, **options):
            if tag == "charts/SPS":
                iteration_ends.append((time.perf_counter(), global_step))
                rollout_ends.append(value_called[0])
                if profiler and len(iteration_ends) - 1 == warmup_iterations:
                    print(f"steady state from {clock_time()}", flush=True)
                    profiler.enable()
            return super().add_scalar(tag, value, global_step, *rest, **options)

    previous_directory, previous_writer = os.getcwd(), run_logs.SummaryWriter
    # Monkeypatched (put back below): ppo/ has no hook for timing the rollout and the update apart.
    script.Agent.get_value, run_logs.SummaryWriter = get_value_noting_the_time, ClockedWriter
    try:
        with tempfile.TemporaryDirectory() as workdir:
            os.chdir(workdir)
            script.main(run_args)
    finally:
        if profiler:
            profiler.disable()
            print(f"steady state until {clock_time()}")
        script.Agent.get_value, run_logs.SummaryWriter = original_get_value, previous_writer
        os.chdir(previous_directory)
    # iteration i (from 1) starts at iteration_ends[i - 1] and its rollout ends at rollout_ends[i - 1]
    return [(rollout_ends[i - 1] - iteration_ends[i - 1][0], iteration_ends[i][0] - rollout_ends[i - 1],
             iteration_ends[i][1] - iteration_ends[i - 1][1])
            for i in range(warmup_iterations + 1, len(iteration_ends))]


def loop_split(script, run_args, warmup_iterations: int) -> tuple[float, float]:
    """Seconds per environment step of the rollout and of the update in a real run (medians over
    the iterations after the warm-up), split at the iteration's last value call as
    `iteration_parts` splits them: the rollout then includes the batched pass over it."""
    parts = iteration_parts(script, run_args, warmup_iterations)
    return (statistics.median(rollout / steps for rollout, _, steps in parts),
            statistics.median(update / steps for _, update, steps in parts))


def start_seconds(script_file: str) -> float:
    """The median wall time of 3 fresh Python processes that import the script and build its
    optimizer: what every run pays before its first step, environments left out."""
    module = f"ppo.{script_file.removesuffix('.py')}"
    code = f"import torch, {module} as script; script.adam.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1)"
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def script_options(script) -> list[str]:
    """The speed options the script has (fields of its Args)."""
    return [name for name in SPEED_OPTIONS if name in {field.name for field in dataclasses.fields(script.Args)}]


def check_requested_options(script_file: str, script, requested: list[str], devices: list[str]) -> None:
    """Refuse an --options item that names an option the script does not have, or that no device of
    this measurement can run (--cudagraphs needs CUDA): it would be left out, and measure nothing."""
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
    available = [name for name in script_options(script) if not (name == "cudagraphs" and device != "cuda")]
    if requested is not None:
        sets = [tuple(part for part in item.split("+") if part != "plain") for item in requested]
        return [options for options in sets if all(name in available for name in options)]
    sets = [()] + [(name,) for name in available]
    if len(available) > 1:
        sets.append(tuple(available))
    return sets


def field_values(script, assignments: list[str]) -> dict:
    """`--set name=value ...` as Args fields, each value read as the field's type annotation says."""
    hints = typing.get_type_hints(script.Args)
    values = {}
    for assignment in assignments:
        name, _, text = assignment.partition("=")
        if name not in hints:
            fail(f"--set {assignment}: {script.__name__} has no setting {name!r}: give a field of its Args")
        values[name] = parse_value(hints[name], text, assignment)
    return values


def parse_value(kind, text: str, assignment: str):
    """`text` as a value of type `kind`: bool, int, float, str, a Literal or any of them `| None`."""
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
    make_scripts_importable()
    scripts = {name: importlib.import_module(f"ppo.{name.removesuffix('.py')}") for name in args.scripts}
    settings_of = {name: field_values(script, args.set) for name, script in scripts.items()}
    if args.options is not None:
        for name, script in scripts.items():
            check_requested_options(name, script, args.options, devices)

    rows, part_rows, starts = [], [], {}
    for script_file, script in scripts.items():
        measure_script(script_file, script, settings_of[script_file], devices, args, rows, part_rows)
        if args.parts:
            starts[script_file] = start_seconds(script_file)
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, {device_name}, torch {torch.__version__}\n")
    print_speeds(rows)
    if part_rows:
        print_parts(part_rows, starts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every wrong input among them refused before the first measurement, which takes a while."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scripts", "--script", nargs="+", default=list(DEFAULTS), metavar="SCRIPT",
                        help="scripts in ppo/ to measure (default: all of them)")
    parser.add_argument("--env-id", help="environment to measure on (default: each script's own, see DEFAULTS)")
    parser.add_argument("--num-envs", type=int, help="number of environments (default: each script's own)")
    parser.add_argument("--total-timesteps", type=int, help="training steps per measurement (default: a few iterations)")
    parser.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                        help="other settings of the scripts' Args, e.g. --set num_minibatches=8 clip_coef=0.2")
    parser.add_argument("--options", nargs="+", metavar="OPTIONS",
                        help="speed options to measure, e.g. plain async_envs compile+cudagraphs "
                             "(default: none, each alone, all together)")
    parser.add_argument("--devices", nargs="+", choices=["cpu", "cuda"],
                        help="where to train (default: cpu, and cuda when there is a GPU)")
    parser.add_argument("--raw-seconds", type=float, default=10.0, help="how long to step the raw environments")
    parser.add_argument("--parts", action="store_true",
                        help="also measure the policy step, a gradient step and the start alone, and the floor they set")
    parser.add_argument("--warmup-iterations", type=int, default=1,
                        help="iterations left out of the training speed (compilation, CUDA-graph recording)")
    args = parser.parse_args(argv)
    # Every wrong input is refused before the first measurement, which takes a while.
    for flag, value, least in [("--num-envs", args.num_envs, 1), ("--total-timesteps", args.total_timesteps, 1),
                               ("--warmup-iterations", args.warmup_iterations, 0)]:
        if value is not None and value < least:
            fail(f"{flag} {value}: give at least {least}")
    if not args.raw_seconds > 0:  # also refuses nan
        fail(f"--raw-seconds {args.raw_seconds}: give a positive number of seconds")
    unknown = [name for name in args.scripts if name not in DEFAULTS]
    if unknown:
        fail(f"unknown script {unknown[0]!r}: pick from {', '.join(DEFAULTS)}")
    return args


def measure_script(script_file: str, script, settings: dict, devices: list[str], args: argparse.Namespace,
                   rows: list, part_rows: list) -> None:
    """Measure one script on each device with each set of speed options, adding a row to `rows` for
    each (the raw environments' rate and the training's, wall and CPU); with --parts, the parts alone
    too, a row of `part_rows` per device."""
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
                train_cpu = None  # the games' CPU time is in the workers, out of this process's sight
            rows.append((script_file, env_id, num_envs, device, "+".join(options) or "plain",
                         raw_wall, train_wall, raw_cpu, train_cpu))
        if args.parts:
            plain_args = script.Args(env_id=env_id, num_envs=num_envs, cuda=device == "cuda", **settings)
            print(f"{script_file}: the parts alone, {device}", flush=True)
            policy_seconds, gradient_seconds = part_floors(script, plain_args)
            plain_rows = [row for row in rows if row[:5] == (script_file, env_id, num_envs, device, "plain")]
            split = loop_split(script, dataclasses.replace(plain_args, total_timesteps=total_timesteps),
                               args.warmup_iterations)
            part_rows.append((script_file, env_id, device, plain_args, raw_wall, policy_seconds,
                              gradient_seconds, plain_rows[0][6] if plain_rows else None, split))


def print_speeds(rows: list) -> None:
    """The main table: each measurement's raw environment and training rates and their ratios."""
    print("| script | env | envs | device | options | raw env SPS | training SPS | ratio | CPU-time ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for script_file, env_id, num_envs, device, options, raw_wall, train_wall, raw_cpu, train_cpu in rows:
        print(f"| {script_file} | {env_id} | {num_envs} | {device} | {options} | {raw_wall:,.0f} | "
              f"{train_wall:,.0f} | {train_wall / raw_wall:.3g} | "
              f"{'n/a' if train_cpu is None else f'{train_cpu / raw_cpu:.3g}'} |")


def print_parts(part_rows: list, starts: dict) -> None:
    """The --parts table: each part's cost per call and the steps per second it alone would allow."""
    print("\nEach part alone, in steps per second of the environments (a policy step serves num_envs steps,")
    print("a batch of num_envs x num_steps steps pays update_epochs x num_minibatches gradient steps);")
    print("the floor adds the three parts' times per step: training with nothing else in the loop.\n")
    print("| script | env | device | raw env SPS | policy step | policy SPS | gradient step (minibatch) | "
          "gradient SPS | floor SPS | training SPS (plain) | of the floor | start |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    split_lines = []
    for script_file, env_id, device, run_args, raw, policy_seconds, gradient_seconds, train, split in part_rows:
        batch_size = run_args.num_envs * run_args.num_steps
        policy_rate = run_args.num_envs / policy_seconds
        gradient_rate = batch_size / (run_args.update_epochs * run_args.num_minibatches * gradient_seconds)
        floor = 1 / (1 / raw + 1 / policy_rate + 1 / gradient_rate)
        rollout_floor = 1 / (1 / raw + 1 / policy_rate)
        split_lines.append(f"| {script_file} | {env_id} | {device} | {rollout_floor:,.0f} | {1 / split[0]:,.0f} | "
                           f"{split[0] * rollout_floor:.2f} | {gradient_rate:,.0f} | {1 / split[1]:,.0f} | "
                           f"{split[1] * gradient_rate:.2f} |")
        print(f"| {script_file} | {env_id} | {device} | {raw:,.0f} | {policy_seconds * 1e6:,.0f} µs | "
              f"{policy_rate:,.0f} | {gradient_seconds * 1e3:.2f} ms ({batch_size // run_args.num_minibatches}) | "
              f"{gradient_rate:,.0f} | {floor:,.0f} | {'-' if train is None else f'{train:,.0f}'} | "
              f"{'-' if train is None else f'{train / floor:.2f}'} | {starts[script_file]:.2f} s |")
    print("\nThe same run split in two, in steps per second, against each half's floor: the rollout (the"
          "\nenvironments and policy steps, then the batched pass over the rollout) and the update (GAE, the"
          "\ngradient steps, the logs); 'x floor': how many times its floor's time each half took.\n")
    print("| script | env | device | rollout floor SPS | rollout SPS | rollout, x floor | update floor SPS | "
          "update SPS | update, x floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(split_lines))


if __name__ == "__main__":
    main()
