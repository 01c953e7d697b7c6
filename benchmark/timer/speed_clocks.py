"""A script's run timed from outside, for benchmark/speed.py: `script.main()` trains in this
process, untouched, and the clocks are read where the run leaves them or beside it. The iterations'
ends are its TensorBoard log's own times (the first event, written as its writer opens before the
first iteration; then each charts/SPS point, logged as an iteration ends). A thread beside the run
(`Sampler`) reads the CPU time every 50 ms, whose rate within the measured span gives the span's CPU
time; or, for the split into rollout and update, where `main` is every millisecond: each iteration's
rollout ends where `main` reaches the value call after it (`value_call_line`)."""

from __future__ import annotations

import ast
import bisect
import contextlib
import inspect
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

from benchmark.reporter.run_data import find_run_dirs, logged_times

# How often the sampler reads the clocks: every 50 ms for the CPU time of a training measurement,
# every 1 ms for the split into rollout and update, whose iterations can be tens of milliseconds
# (CartPole's).
CPU_PERIOD, LINE_PERIOD = 0.05, 0.001


def fail(message: str) -> NoReturn:
    """Wrong input: one line, speed.py's (the command whose measurements these are), exit code 2."""
    print(f"speed.py: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class Sampler:
    """A thread that reads, every `period` seconds while it runs (a `with` block), the wall clock
    (time.time(), the clock of TensorBoard's events) and either this process's CPU time (its
    threads' included) or, with `watch` (a function's code), where the thread that started it is in
    that function: its frame's last instruction, whose line `lines` finds after the run (reading the
    line itself scans the function's line table, a microsecond or more, holding the GIL), or None
    where the function is not running. It observes and changes nothing, but the run may wait for the
    GIL while it reads: docs/notes/speed.md has the overheads measured."""

    def __init__(self, period: float, watch=None):
        self.period, self.watch, self.samples = period, watch, []  # (wall, CPU time or instruction)
        self.watched_thread, self.frame, self.stopped = threading.get_ident(), None, False
        self.thread = threading.Thread(target=self.sample_until_stopped, name="speed.py sampler",
                                       daemon=True)

    def __enter__(self) -> Sampler:
        self.sample()
        self.thread.start()
        return self

    def __exit__(self, *exception) -> None:
        self.stopped = True
        self.thread.join()
        self.sample()

    def sample_until_stopped(self) -> None:
        # time.sleep, not an Event's wait: one call that lets go of the GIL, where a wait runs a few
        # Python statements of threading's with it at each sample
        while not self.stopped:
            time.sleep(self.period)
            self.sample()

    def sample(self) -> None:
        self.samples.append((time.time(),
                             time.process_time() if self.watch is None else self.instruction()))

    def instruction(self) -> int | None:
        """The offset of the watched function's frame's last instruction (the call it is in, if it
        called one)."""
        if self.frame is None:  # found once: the frame stays the run's while `main` runs
            frame = sys._current_frames().get(self.watched_thread)
            while frame is not None and frame.f_code is not self.watch:
                frame = frame.f_back
            self.frame = frame
        return None if self.frame is None else self.frame.f_lasti

    def lines(self) -> list[tuple[float, int | None]]:
        """The samples of `watch` as (wall, the line the thread was at, or None)."""
        line_of = {offset: line for start, end, line in self.watch.co_lines()
                   for offset in range(start, end)}
        return [(wall, None if offset is None else line_of.get(offset))
                for wall, offset in self.samples]

    def cpu_seconds(self, start: float, end: float) -> float:
        """The CPU time spent from wall time `start` to `end`: the CPU rate between the first and
        the last sample within them, over the whole span. A steady loop keeps its rate up to the
        span's edges, where a reading between the samples around an edge would take in a change of
        pace just outside it (the run's end, which waits for its logs to close). Where fewer than
        two samples fall within (a run of a few milliseconds), the CPU time is read between those
        around it."""
        inside = [(wall, cpu) for wall, cpu in self.samples if start <= wall <= end]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            (first_wall, first_cpu), (last_wall, last_cpu) = inside[0], inside[-1]
            return (last_cpu - first_cpu) / (last_wall - first_wall) * (end - start)
        walls, cpus = zip(*self.samples)
        return float(np.interp(end, walls, cpus) - np.interp(start, walls, cpus))


def run_logged(script, args, *beside) -> list[tuple[float, int]]:
    """Run `script.main(args)` in a temporary folder, inside the context managers `beside` (entered
    in this thread, in order, just before it); return the wall time (with the global step, 0 first)
    when its TensorBoard writer opened and whenever it logged charts/SPS, from the log it wrote."""
    previous_directory = os.getcwd()
    with tempfile.TemporaryDirectory() as workdir:
        os.chdir(workdir)
        try:
            with contextlib.ExitStack() as stack:
                for manager in beside:
                    stack.enter_context(manager)
                script.main(args)
        finally:
            os.chdir(previous_directory)
        (run_dir,) = find_run_dirs(Path(workdir) / "runs")
        opened, points = logged_times(run_dir, "charts/SPS")
    return [(opened, 0)] + [(wall, step) for step, wall in points]


def training_speed(script, args, warmup_iterations: int) -> tuple[float, float, int]:
    """(wall, CPU) environment steps per second of `script.main(args)` from the end of iteration
    `warmup_iterations` (0: the start of training, when the writer opened) to the end of the run,
    and the number of steps measured."""
    sampler = Sampler(CPU_PERIOD)
    ends = run_logged(script, args, sampler)
    iterations = len(ends) - 1
    if iterations <= warmup_iterations:
        fail(f"{iterations} iterations are too few to measure after {warmup_iterations} warm-up "
             "iterations: raise --total-timesteps")
    (first_wall, first_step), (last_wall, last_step) = ends[warmup_iterations], ends[-1]
    steps = last_step - first_step
    return (steps / (last_wall - first_wall), steps / sampler.cpu_seconds(first_wall, last_wall),
            steps)


def value_call_line(script) -> int:
    """The line of the statement in `script.main`'s iteration loop that takes the value of the last
    observations (its last call of a `get_value`), where the rollout hands over to the update."""
    lines, first = inspect.getsourcelines(script.main)
    main = ast.parse(textwrap.dedent("".join(lines))).body[0]
    loop = next(node for node in ast.walk(main)
                if isinstance(node, ast.For) and getattr(node.target, "id", "") == "iteration")
    statements = [node for node in ast.walk(loop)
                  if isinstance(node, ast.stmt) and not hasattr(node, "body")
                  and any(isinstance(call, ast.Call)
                          and getattr(call.func, "attr", "") == "get_value"
                          for call in ast.walk(node))]
    if not statements:
        raise ValueError(f"{script.__name__}.main's iteration loop calls no get_value: "
                         "nowhere to split it")
    return first - 1 + max(statement.lineno for statement in statements)


def rollout_ends(lines: list[tuple[float, int | None]], ends: list[tuple[float, int]],
                 split_line: int) -> list[float]:
    """When each iteration's rollout ended (iteration i, from 1, runs from ends[i - 1] to ends[i]),
    from the lines `main` was seen at (Sampler.lines, in time order): halfway between the
    iteration's last sample before `split_line` and the next sample (or the iteration's end), so off
    by half their gap at most."""
    times = [wall for wall, _ in lines]
    found = []
    for (start, _), (end, _) in zip(ends, ends[1:]):
        first, last = bisect.bisect_right(times, start), bisect.bisect_left(times, end)
        before = next((index for index in range(last - 1, first - 1, -1)
                       if lines[index][1] is not None and lines[index][1] < split_line), None)
        last_before, following = (start, first) if before is None else (times[before], before + 1)
        found.append((last_before + (times[following] if following < last else end)) / 2)
    return found


def clock_time(now: float | None = None) -> str:
    """The local time as nvidia-smi's timestamps give it, to find the steady state in them."""
    now = time.time() if now is None else now
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


@contextlib.contextmanager
def profiled_after_warmup(profiler, warmup_iterations: int):
    """`profiler` (a cProfile.Profile) on from the end of iteration `warmup_iterations` to the end
    of the run. The moment is seen with sys.setprofile, which observes every call of this thread: it
    slows the warm-up, which no figure includes, and hands over to the profiler when the run logs
    charts/SPS for the warm-up's last iteration, or at once without a warm-up."""
    from torch.utils.tensorboard import SummaryWriter

    add_scalar, logged, previous = SummaryWriter.add_scalar.__code__, [0], sys.getprofile()

    def start_profiling():
        print(f"steady state from {clock_time()}", flush=True)
        profiler.enable()  # in place of this watcher: cProfile's own profile function

    def watch(frame, event, _):
        if event == "call" and frame.f_code is add_scalar \
                and frame.f_locals.get("tag") == "charts/SPS":
            logged[0] += 1
            if logged[0] == warmup_iterations:
                start_profiling()

    if warmup_iterations == 0:
        start_profiling()
    else:
        sys.setprofile(watch)
    try:
        yield
    finally:
        profiler.disable()
        sys.setprofile(previous)
        print(f"steady state until {clock_time()}")


def iteration_parts(script, run_args, warmup_iterations: int,
                    profiler=None) -> list[tuple[float, float, int]]:
    """(rollout seconds, update seconds, steps) of each iteration of `script.main(run_args)` after
    the first `warmup_iterations`, which `profiler`, if given, leaves out too. The rollout ends
    where `main` reaches its value call (`value_call_line`; a time limit's bootstrap values
    elsewhere), the update when the iteration logs charts/SPS."""
    split_line = value_call_line(script)
    sampler = Sampler(LINE_PERIOD, watch=script.main.__code__)
    beside = [sampler] + ([profiled_after_warmup(profiler, warmup_iterations)] if profiler else [])
    ends = run_logged(script, run_args, *beside)
    rollouts = rollout_ends(sampler.lines(), ends, split_line)
    # iteration i (from 1) runs from ends[i - 1] to ends[i], and its rollout ends at rollouts[i - 1]
    return [(rollouts[i - 1] - ends[i - 1][0], ends[i][0] - rollouts[i - 1],
             ends[i][1] - ends[i - 1][1]) for i in range(warmup_iterations + 1, len(ends))]


def loop_split(script, run_args, warmup_iterations: int) -> tuple[float, float]:
    """Seconds per environment step of the rollout and of the update in a real run (medians over
    the iterations after the warm-up), split where `main` takes the last observations' value, as
    `iteration_parts` splits them: the rollout then includes the batched pass over it."""
    parts = iteration_parts(script, run_args, warmup_iterations)
    return (statistics.median(rollout / steps for rollout, _, steps in parts),
            statistics.median(update / steps for _, update, steps in parts))
