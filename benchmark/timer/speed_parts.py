"""Each part of a run alone, for benchmark/speed.py: the raw environments (the script's own vector
env under random actions), the policy step and one gradient step, each replaying the arguments that
a one-iteration run passed them (seen with sys.setprofile, in that untimed run only), and the start
(a fresh Python process that imports the script and builds its optimizer)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmark.common import REPO
from benchmark.timer.speed_clocks import run_logged


def timed(function) -> tuple[float, float]:
    """Run `function()`; return the (wall, CPU) seconds it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def raw_env_speed(script, env_id: str, num_envs: int, seconds: float) -> tuple[float, float]:
    """(wall, CPU) environment steps per second of the script's vector env under random actions."""
    envs = script.make_envs(env_id, num_envs)
    # Actions are drawn beforehand: they are not part of the env's cost. Every script's make_envs
    # gives a gymnasium vector env or a class that steps like one (ppo_procgen.py's,
    # envpool_games').
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


def policy_step_name(script) -> str:
    """The agent's method that the rollout calls: get_action where the script has one (the MLP
    scripts, which leave log-probabilities and values for after the rollout), else
    get_action_and_value, whose first call in a run is the rollout's."""
    return "get_action" if hasattr(script.Agent, "get_action") else "get_action_and_value"


def call_arguments(frame) -> tuple[tuple, dict]:
    """The arguments of the call that `frame` has just started, as (positional, named), read from
    its locals by its code's signature (the parameters come first among a code's variables)."""
    code, values = frame.f_code, frame.f_locals
    names = code.co_varnames
    positional = [values[name] for name in names[:code.co_argcount]]
    index = code.co_argcount + code.co_kwonlyargcount
    named = {name: values[name] for name in names[code.co_argcount:index]}
    if code.co_flags & inspect.CO_VARARGS:
        positional += values[names[index]]
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        named.update(values[names[index]])
    return tuple(positional), named


@contextlib.contextmanager
def first_calls_noted(functions: dict, noted: dict):
    """Within the block, note in `noted[name]` the arguments of the first call of each of
    `functions` ({name: function}) in this thread, seen with sys.setprofile, which observes every
    call (and so slows them: no timed run is watched) and is taken away once each function was
    called. A function behind a decorator (the scripts' `run_life.compiled`, the same wrapper around
    each) is known by the code of the function it wraps."""
    wanted = {inspect.unwrap(function).__code__: name for name, function in functions.items()}
    previous = sys.getprofile()

    def watch(frame, event, _):
        if event == "call" and frame.f_code in wanted and wanted[frame.f_code] not in noted:
            noted[wanted[frame.f_code]] = call_arguments(frame)
            if len(noted) == len(wanted):
                sys.setprofile(previous)

    sys.setprofile(watch)
    try:
        yield noted
    finally:
        sys.setprofile(previous)


def record_first_calls(script, run_args) -> dict:
    """The arguments of the first policy step and of the first minibatch loss of a one-iteration
    run of `script` with `run_args`: {"policy": (args, kwargs), "loss": (args, kwargs)}."""
    recorded = {}
    functions = {"policy": getattr(script.Agent, policy_step_name(script)),
                 "loss": script.minibatch_loss}
    batch_size = run_args.num_envs * run_args.num_steps
    run_logged(script, dataclasses.replace(run_args, total_timesteps=batch_size),
               first_calls_noted(functions, recorded))
    return recorded


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
            action = getattr(script.Agent, policy_step_name(script))(agent, *policy_args,
                                                                     **policy_named)
            (action[0] if isinstance(action, tuple) else action).cpu().numpy()

    (agent, *loss_args), loss_named = recorded["loss"]
    # The scripts' own optimizer.
    optimizer = script.adam.Adam(agent.parameters(), lr=1e-6, eps=1e-5, fused=True)

    def gradient_step():
        loss, _ = script.minibatch_loss(agent, *loss_args, **loss_named)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), run_args.max_grad_norm, foreach=True)
        optimizer.step()

    return seconds_per_call(policy_step, 200), seconds_per_call(gradient_step, 50)


def start_seconds(script_file: str) -> float:
    """The median wall time of 3 fresh Python processes that import the script and build its
    optimizer: what every run pays before its first step, environments left out. Each starts in
    ppo/, which `-c` puts on the path as a script's run puts its folder there."""
    module = script_file.removesuffix(".py")
    code = (f"import torch, {module} as script; "
            "script.adam.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1)")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=REPO / "ppo", check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
