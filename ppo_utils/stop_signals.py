"""How a run hears its stop signals: the first Ctrl-C, SIGTERM or SIGUSR1 stops it after the current
iteration, a second one at once."""

import os
import signal
import time
from typing import Callable

from ppo_utils.exits import STOP_SIGNALS, StoppedAtOnce, signal_name

# A second stop signal this soon after the first is the same request arriving twice, not a second
# one: Slurm signals every process of a task, and the runner or torchrun above the run passes it on.
SAME_REQUEST_SECONDS = 1.0
# What the first stop signal prints: {signal} names it, {again} how to stop at once.
STOP_NOTICE = "{signal}: stopping after this iteration ({again} to quit at once)"


class StopOnInterrupt:
    """The first Ctrl-C, SIGTERM or SIGUSR1 only prints `notice` and sets `requested`: training then
    stops after the current iteration, to flush its logs and save at a clean point. A second Ctrl-C
    or SIGTERM stops at once (StoppedAtOnce, with what `kept()` says is kept), but for a SIGTERM
    within SAME_REQUEST_SECONDS of the first signal, which is the first one delivered twice.
    SIGUSR1, Slurm's warning, never stops at once. Under torchrun only rank 0 prints the notice."""

    def __init__(self, notice: str = STOP_NOTICE, kept: Callable[[], str] = lambda: ""):
        self.requested, self.notice, self.kept, self.first = False, notice, kept, (None, 0.0)
        self.previous_handlers = {signum: signal.signal(signum, self.handle)
                                  for signum in STOP_SIGNALS}

    def handle(self, signum, frame):
        first_signal, first_time = self.first
        if self.requested:
            soon = time.monotonic() - first_time < SAME_REQUEST_SECONDS
            same_request = signum == signal.SIGUSR1 or (
                soon and not signum == signal.SIGINT == first_signal)
            if same_request:
                return
            raise StoppedAtOnce(signal_name(signum), self.kept())
        self.requested, self.first = True, (signum, time.monotonic())
        if int(os.environ.get("RANK", "0")) == 0:
            again = "press Ctrl-C again" if signum == signal.SIGINT else "Ctrl-C or SIGTERM"
            print("\n" + self.notice.format(signal=signal_name(signum), again=again), flush=True)

    def restore(self):
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)
