"""How a script ends, and with which exit code: 0 when it finished, 2 on wrong input (WrongInput),
3 when its network diverged (Diverged), 130 when it was asked to stop; `exit_codes`, around the
script's command, gives each ending its code and its one line. Standard library only."""

import contextlib
import os
import re
import signal
import sys
import time

# A flag, a checkpoint or an environment the script refuses.
WRONG_INPUT = 2
# The network became non-finite (NaN or infinite): run again from its last checkpoint with the same
# settings, it diverges again.
DIVERGED = 3
# Asked to stop before its end (Ctrl-C, `kill`, Slurm's warning before a time limit): with
# --save-model, --resume continues it. 130 is the shell's code for Ctrl-C.
STOPPED = 130
# What asks a run to stop after the current iteration: Ctrl-C, `kill` and a Slurm task's end
# (SIGTERM), and Slurm's warning before a time limit (`#SBATCH --signal=B:USR1@<seconds>`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class WrongInput(Exception):
    """Input the script refuses (never a bug): the message says what to do instead."""


class Diverged(Exception):
    """The network became non-finite: the message says where, the likely cause, what is kept."""


class StoppedAtOnce(KeyboardInterrupt):
    """A stop signal that ends the run where it is (a second one, or one before training began):
    its arguments name the signal and what the stop keeps."""


def signal_name(signum: int) -> str:
    """Ctrl-C for SIGINT, else the signal's name (SIGTERM, SIGUSR1)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def stop_at_once(signum, frame):
    """Until training begins, SIGTERM and SIGUSR1 stop a script at once, as Ctrl-C does (their
    default would end it without a word)."""
    raise StoppedAtOnce(signal_name(signum), "training had not begun, nothing is lost")


def says(line: str) -> None:
    """Print one line on stderr; under torchrun, where every process of a node finds the same, only
    from its first (local rank 0): one line per node, since a node may lack what others have."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def exit_codes(program: str):
    """Around a script's command: wrong input ends it with `<program>: error: <what to do>` and exit
    code 2, a divergence with its line and 3, a stop at once with what it kept and 130."""
    signal.signal(signal.SIGTERM, stop_at_once)  # until training begins (its Iterations)
    signal.signal(signal.SIGUSR1, stop_at_once)
    try:
        yield
    except WrongInput as error:
        says(f"{program}: error: {error}")
        if int(os.environ.get("LOCAL_RANK", "0")) > 0 and "TORCHELASTIC_RUN_ID" in os.environ:
            leave_the_line_to_local_rank_0()
        sys.exit(WRONG_INPUT)
    except Diverged as diverged:
        says(f"{program}: diverged: {diverged}")
        sys.exit(DIVERGED)
    except KeyboardInterrupt as stop:  # a second signal, or one before training began
        by, kept = stop.args if isinstance(stop, StoppedAtOnce) else ("Ctrl-C", "")
        says(f"stopped at once by {by}" + (f": {kept}" if kept else ""))
        sys.exit(STOPPED)
    # The run is over: a late copy of its signal changes nothing.
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)


def leave_the_line_to_local_rank_0(seconds: float = 30.0) -> None:
    """Under torchrun the node's first process finds the same mistake and says it. Were this one to
    exit first, torchrun would end that one (SIGTERM) before it could: this one waits instead, until
    torchrun ends it once the first has exited (with exit code 2), or `seconds` at most."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(WRONG_INPUT))
    time.sleep(seconds)


@contextlib.contextmanager
def missing_packages(pip_extra: str, capture_video: bool):
    """Within the block, a package that gymnasium imports only when it is first used (a renderer,
    a simulator, moviepy for videos) and finds missing is wrong input: the line names the script's
    extra in pyproject.toml (`pip_extra`, and `video` with --capture-video)."""
    import gymnasium as gym  # here: benchmark/run.py reads the exit codes without gymnasium

    try:
        yield
    except gym.error.DependencyNotInstalled as error:
        extras = f"{pip_extra},video" if capture_video else pip_extra
        # gymnasium's own advice names its extras; this project's installs the same packages at the
        # versions it was tested with
        reason = re.sub(r",? run `pip install [^`]*`", "", str(error)).rstrip(". ")
        raise WrongInput(f"missing optional dependency: {reason}: pip install -e "
                         f"'.[{extras}]'") from None
