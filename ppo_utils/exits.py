"""How a script ends, and with which exit code: 0 finished, 2 wrong input (WrongInput), 3 diverged
(Diverged), 130 asked to stop (the shell's code for Ctrl-C); and how a run hears its stop signals
(StopOnInterrupt). Standard library only."""

import contextlib
import os
import re
import signal
import sys
import time
import traceback
from typing import Callable

WRONG_INPUT, DIVERGED, STOPPED = 2, 3, 130
# What asks a run to stop after the current iteration: Ctrl-C, `kill` and a Slurm task's end
# (SIGTERM), and Slurm's warning before a time limit (`#SBATCH --signal=B:USR1@<seconds>`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class WrongInput(Exception):
    """Input the script refuses (never a bug): the message says what to do instead."""


class Diverged(Exception):
    """The network became non-finite: the message says where, the likely cause, what is kept."""


class StoppedAtOnce(KeyboardInterrupt):
    """A stop signal that ends the run where it is; its arguments: the signal, what is kept."""


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def stop_at_once(signum, frame):
    """Until training begins, SIGTERM and SIGUSR1 stop a script as Ctrl-C does, with a word."""
    raise StoppedAtOnce(signal_name(signum), "training had not begun, nothing is lost")


def says(line: str) -> None:
    """Print `line` on stderr; under torchrun, where every process of a node finds the same, from
    the node's first process only."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(line, file=sys.stderr, flush=True)


# A second signal this soon after the first is the first delivered twice: Slurm signals every
# process of a task, and the runner or torchrun above the run passes it on.
SAME_REQUEST_SECONDS = 1.0
STOP_NOTICE = "{signal}: stopping after this iteration ({again} to quit at once)"


class StopOnInterrupt:
    """The first stop signal prints `notice` (rank 0) and sets `requested`, so that training stops
    at a clean point, its logs flushed and its checkpoint saved. A second Ctrl-C or SIGTERM raises
    StoppedAtOnce with what `kept()` says is kept; SIGUSR1, Slurm's warning, never does."""

    def __init__(self, notice: str = STOP_NOTICE, kept: Callable[[], str] = lambda: ""):
        self.requested, self.notice, self.kept, self.first = False, notice, kept, (None, 0.0)
        self.previous_handlers = {signum: signal.signal(signum, self.handle)
                                  for signum in STOP_SIGNALS}

    def handle(self, signum, frame):
        first_signal, first_time = self.first
        if self.requested:
            soon = time.monotonic() - first_time < SAME_REQUEST_SECONDS
            if signum == signal.SIGUSR1 or (soon and not signum == signal.SIGINT == first_signal):
                return
            raise StoppedAtOnce(signal_name(signum), self.kept())
        self.requested, self.first = True, (signum, time.monotonic())
        if int(os.environ.get("RANK", "0")) == 0:
            again = "press Ctrl-C again" if signum == signal.SIGINT else "Ctrl-C or SIGTERM"
            print("\n" + self.notice.format(signal=signal_name(signum), again=again), flush=True)

    def restore(self):
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def exit_codes(program: str):
    """Around a script's command: each ending's one line (`<program>: error: <what to do>`) and
    its exit code."""
    # Ctrl-C too where the script started with it ignored, as a shell script's background job does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, stop_at_once)  # until training begins (Run.iterations)
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
    except Exception:  # an environment that raised, a bug: the traceback, then what is kept
        traceback.print_exc()
        training = getattr(signal.getsignal(signal.SIGINT), "__self__", None)  # its stop handler
        if isinstance(training, StopOnInterrupt) and training.kept():
            says(f"{program}: the run stopped on the error above; {training.kept()}")
        sys.exit(1)
    # The run is over: a late copy of its signal changes nothing.
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)


def leave_the_line_to_local_rank_0(seconds: float = 30.0) -> None:
    """Under torchrun, were this process to exit first, torchrun would end the node's first one
    (SIGTERM) before it says the line: this one waits until torchrun ends it (exit code 2)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(WRONG_INPUT))
    time.sleep(seconds)


@contextlib.contextmanager
def missing_packages(pip_extra: str, capture_video: bool):
    """A package that gymnasium imports only at first use (a renderer, a simulator, moviepy) and
    finds missing is wrong input: the line names the script's extra (and `video`)."""
    import gymnasium as gym  # here: benchmark/run.py reads the exit codes without gymnasium

    try:
        yield
    except gym.error.DependencyNotInstalled as error:
        extras = f"{pip_extra},video" if capture_video else pip_extra
        # gymnasium's advice names its own extras; this project's pins the tested versions
        reason = re.sub(r",? run `pip install [^`]*`", "", str(error)).rstrip(". ")
        raise WrongInput(f"missing optional dependency: {reason}: pip install -e "
                         f"'.[{extras}]'") from None
