"""The speed options' wiring: the functions --compile compiles and --cudagraphs replays as CUDA
graphs (`compiled`), and the vector environments, stepped in turn or, with --async-envs, each in a
worker process of its own (`vector_env`)."""

import functools
import signal
import warnings
from typing import Callable

import gymnasium as gym
import torch

import environments
from exits import STOP_SIGNALS


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


def vector_env(env_fns: list[Callable[[], gym.Env]], env_id: str, variant: str,
               saved_envs: list | None = None, async_envs: bool = False) -> gym.vector.VectorEnv:
    """The environments `env_fns` build, as one vector environment whose autoreset is SAME_STEP
    (the step that ends an episode resets it), stepped one after the other, or each in a worker
    process of its own with `async_envs`; built anew and put back where a checkpoint's
    `saved_envs` left them. A registered id whose code needs a package that is missing is refused
    in one line."""
    if saved_envs is not None:
        env_fns = environments.restored_envs(env_fns, saved_envs)
    with environments.packages_checked(env_id, variant):
        if async_envs:
            return async_vector_env(env_fns)
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def async_vector_env(env_fns: list[Callable[[], gym.Env]]) -> gym.vector.AsyncVectorEnv:
    """--async-envs: each environment in a worker process of its own, all stepping at once, the
    observations coming back through shared memory; SAME_STEP autoreset, as the scripts' sync envs.
    forkserver: the workers start from a clean process, not a copy of this one with its threads.
    AsyncVectorEnv builds one environment here too, for the spaces: this process's signal handlers
    are kept."""
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    envs = gym.vector.AsyncVectorEnv(
        [functools.partial(in_worker, make_env) for make_env in env_fns],
        shared_memory=True, context="forkserver", autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    return envs


def in_worker(make_env: Callable[[], gym.Env]) -> gym.Env:
    """Build an environment in a worker process of --async-envs. Ctrl-C reaches every process of the
    terminal's group, and a Slurm task's end or torchrun's SIGTERM every process of the run, but
    they are the main process's to handle (finish the iteration, save): the worker ignores them, and
    ends when the main process closes the environments."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # AsyncVectorEnv built the first environment once in the main process too, for its spaces; with
    # video that made the (new) folder, which RecordVideo here would warn of as if it held old
    # videos.
    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
    return make_env()
