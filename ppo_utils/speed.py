"""The speed options --compile and --cudagraphs: the functions they compile, and replay as CUDA
graphs (`compiled`), for the agent a run marks (`compile_with`)."""

import functools
from typing import Callable

import torch


def compile_with(agent: torch.nn.Module, mode: str | None) -> torch.nn.Module:
    """`agent`, its functions marked @compiled (its policy step, and the minibatch loss, which takes
    it first) to be called in `mode`: None (as they are), "default" (torch.compile) or
    "reduce-overhead" (compiled, and replayed as CUDA graphs). The run marks the agent it trains
    with the mode of its --compile and --cudagraphs; an agent no run marked (an evaluation's, a
    test's) is called as it is."""
    agent.compile_mode = mode
    return agent


def compiled(function: Callable) -> Callable:
    """[Speed: torch.compile] Marks `function`, whose first argument is the agent (the rollout's
    policy step, the update's minibatch loss), as what --compile compiles into a few fused kernels,
    so that a GPU does not wait for Python to launch many small ones. [Speed: CUDA graphs] With
    --cudagraphs it is also replayed as CUDA graphs: a replay writes its outputs where the previous
    replay of the same graph wrote them, so each call is marked as a new step, and what a caller
    keeps past the next call it copies first. Without either option it is called as it is, and so
    it is where a compiled function calls it (the minibatch loss calls the agent's policy). The mode
    is the agent's (`compile_with`)."""
    versions = {}  # mode -> the function compiled in that mode

    @functools.wraps(function)
    def call(agent, *inputs, **options):
        mode = getattr(agent, "compile_mode", None)
        if mode is None or torch.compiler.is_compiling():
            return function(agent, *inputs, **options)
        if mode not in versions:
            versions[mode] = torch.compile(function, mode=mode)
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        return versions[mode](agent, *inputs, **options)

    return call
