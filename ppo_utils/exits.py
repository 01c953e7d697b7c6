"""How a script's run ends, and with which exit code: 0 when it finished, 2 on wrong input (`fail`),
3 when it diverged, 130 when it was asked to stop; `exit_codes`, around the run, maps each ending to
its code.

This module imports no other of this folder, and the others import it: a refusal anywhere in the
run machinery is the same one line and the same exit code.
"""

import contextlib
import os
import re
import shutil
import signal
import sys
import time
from typing import Callable, NoReturn

# The exit code of wrong input: a flag, a checkpoint or an environment the script refuses (`fail`).
WRONG_INPUT = 2
# The exit code of a run whose network became non-finite (NaN or infinite): the divergence guard
# (Run.stop_if_diverged) stopped it after the update in which that happened, before it logged or
# saved it. Distinct from a crash (1), wrong input (2) and a stop on request (130): running it again
# from its last checkpoint, with the same settings, diverges again.
DIVERGED = 3
# The exit code of a run that stopped before its end because it was asked to (Ctrl-C, `kill`,
# Slurm's warning before a time limit): with --save-model its checkpoint continues it (--resume).
# 130 is the shell's code for Ctrl-C, which Ctrl-C has always given.
STOPPED = 130
# What asks a run to stop after the current iteration: Ctrl-C, `kill` and a Slurm task's end
# (SIGTERM), and the warning Slurm sends before a time limit when asked to
# (`#SBATCH --signal=B:USR1@<seconds>`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


# Run folders this process claimed that hold nothing of a run yet: nothing, or the header of its
# logs (the settings and releases), until its first iteration ends (run_logs.claim_run_folder adds
# them, Run.open_logs gives each the call that closes its logs, Run.end_iteration empties them).
# Wrong input found after the claim, such as an environment that cannot be made or a first
# observation or action mask the script refuses, closes the logs and removes the folders with what
# they hold, so that a refused command leaves nothing behind.
UNUSED_RUN_FOLDERS: dict[str, Callable[[], None] | None] = {}


def fail(variant: str, message: str) -> NoReturn:
    """Stop with `<variant>.py: error: <message>` on one line and exit code 2: for wrong input,
    never for bugs. Under torchrun every process of a node finds the same mistake, so only its first
    one (local rank 0) prints it: one line per node, since a node may lack what others have."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"{variant}.py: error: {message}", file=sys.stderr)
    release_unused_run_folders()
    if int(os.environ.get("LOCAL_RANK", "0")) > 0 and "TORCHELASTIC_RUN_ID" in os.environ:
        leave_the_line_to_local_rank_0()
    raise SystemExit(WRONG_INPUT)


def leave_the_line_to_local_rank_0(seconds: float = 30.0) -> None:
    """Under torchrun the node's first process finds the same mistake and says it. Were this one to
    exit first, torchrun would end that one (SIGTERM) before it could: this one waits instead, until
    torchrun ends it once the first has exited (with exit code 2), or `seconds` at most."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(WRONG_INPUT))
    time.sleep(seconds)


def release_unused_run_folders() -> None:
    """Remove the run folders this process claimed and has written no iteration to (their logs'
    header goes with them: os.mkdir made each for this process alone), and runs/ if that leaves it
    empty."""
    while UNUSED_RUN_FOLDERS:
        folder, close_logs = UNUSED_RUN_FOLDERS.popitem()
        if close_logs is not None:  # else TensorBoard's writer writes there again, by file name
            close_logs()
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty: other runs'
            os.rmdir(os.path.dirname(folder))


class Diverged(Exception):
    """The run's losses, gradients or weights became non-finite; its argument is the line that says
    where, what, why, and which checkpoint is the last good one."""


class EnvStateMismatch(ValueError):
    """A checkpoint's saved environment state that does not fit the environment built to take it
    back (another version of the wrappers): wrong input, found where the environments are built,
    which may be a worker process of --async-envs."""


class StoppedAtOnce(KeyboardInterrupt):
    """A stop signal that ends the run where it is: a second one, or one before training began. Its
    argument names the signal."""


def signal_name(signum: int) -> str:
    """How a stop signal is named to the user: Ctrl-C for SIGINT, else its name (SIGTERM,
    SIGUSR1)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def stop_at_once(signum, frame):
    """Until a run's training begins, SIGTERM and SIGUSR1 stop it at once, as Ctrl-C does (their
    default would end the process without a word)."""
    raise StoppedAtOnce(signal_name(signum))


@contextlib.contextmanager
def exit_codes(variant: str, pip_extra: str, capture_video: bool):
    """Around a script's run or evaluation (command_line.run_script): each way it can end becomes
    its exit code. With DIVERGED (3) and one line when the network became non-finite; with STOPPED
    (130) after a Ctrl-C, SIGTERM or SIGUSR1 that stopped it at once; with 2 and one line when a
    package is missing (gymnasium imports rendering and video packages only when they are first
    used: `pip_extra` is the script's extra in pyproject.toml, `capture_video` adds the video extra)
    or a checkpoint's environments cannot be rebuilt. The block is the script's own: this module
    calls nothing of it."""
    import gymnasium as gym  # here: benchmark/run.py reads the exit codes without gymnasium

    signal.signal(signal.SIGTERM, stop_at_once)  # until training begins (Run.start)
    signal.signal(signal.SIGUSR1, stop_at_once)
    try:
        yield
    except gym.error.DependencyNotInstalled as error:
        extras = f"{pip_extra},video" if capture_video else pip_extra
        # gymnasium's own advice names its extras ("run `pip install "gymnasium[mujoco]"`"): this
        # project's extra installs the same packages, at the versions it was tested with
        reason = re.sub(r",? run `pip install [^`]*`", "", str(error)).rstrip(". ")
        fail(variant, f"missing optional dependency: {reason}: pip install -e '.[{extras}]'")
    except EnvStateMismatch as error:
        fail(variant, f"cannot resume the saved environments: {error}")
    except Diverged as diverged:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(f"{variant}.py: diverged: {diverged}", file=sys.stderr, flush=True)
        sys.exit(DIVERGED)
    except KeyboardInterrupt as stop:  # a second signal, or one before training began
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            by = stop.args[0] if isinstance(stop, StoppedAtOnce) else "Ctrl-C"
            print(f"stopped at once by {by}: what came after the last checkpoint is lost",
                  file=sys.stderr)
        sys.exit(STOPPED)
    # The run is over: a late copy of its signal changes nothing.
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
