"""--compile and --cudagraphs: the functions they compile, for the agent a run marks."""

import functools
from typing import Callable

import torch


def compiled(function: Callable) -> Callable:
    """[Speed: torch.compile] `function(agent, ...)` (the policy step, the minibatch loss) fused
    into a few kernels, so that a GPU does not wait on Python to launch many small ones. [Speed:
    CUDA graphs] With --cudagraphs also replayed as graphs: a replay writes where the last one did,
    so each call marks a new step, and a caller copies what it keeps past the next call. Within a
    compiled function (the loss calls the policy), or for an agent no run marked with a mode
    (`agent.compile_mode`: "default" or "reduce-overhead", CUDA graphs), it runs as written."""
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
