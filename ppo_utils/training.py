"""A training run as a script sees it (Run): its flags checked, its device and name; started, or
resumed from its checkpoint; its iterations, what it logs after each step and update, its
checkpoints, its stop on a signal or on divergence, and what it says at the end."""

import math
import os
import random
import time
from collections import deque
from dataclasses import asdict
from typing import Callable, NoReturn

import numpy as np
import torch

from ppo_utils import command_line, environments
from ppo_utils.checkpoint import Checkpoint, ProcessState, all_finite, restore_rng, \
    restore_statistics, rng_state, statistics_state
from ppo_utils.exits import Diverged, WrongInput
from ppo_utils.run_logs import RunLogs
from ppo_utils.speed import compile_with
from ppo_utils.stop_signals import StopOnInterrupt


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    """Seed Python, NumPy and PyTorch (and cuDNN picks deterministic kernels, if asked)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """[Core 12: Debug variables] 1 - Var[target - predicted] / Var[target] of the values a rollout
    recorded against their returns: 1 is a perfect value function, 0 no better than a constant;
    nan when the targets do not vary."""
    target_variance = np.var(target)
    if target_variance == 0:
        return np.nan
    return float(1 - np.var(target - predicted) / target_variance)


def divergence(update_means: dict[str, float], agent: torch.nn.Module) -> str | None:
    """What became NaN or infinite in an update (a loss, the gradient norm, a weight), or None."""
    for key, quantity in (("policy_loss", "the policy loss"), ("value_loss", "the value loss"),
                          ("entropy", "the entropy"), ("grad_norm", "the gradient norm")):
        if key in update_means and not math.isfinite(update_means[key]):
            return f"{quantity} became {update_means[key]}"
    return None if all_finite(agent.state_dict()) else "the weights became non-finite"


def diverged_line(args, global_step: int, what_happened: str, last_good: tuple | None) -> str:
    """The one line a diverged run ends with: what happened, the likely cause, what is kept."""
    learning_rate, default = args.learning_rate, type(args)().learning_rate
    cause = (f"the learning rate {learning_rate:g} is {learning_rate / default:g} times the "
             f"default ({default:g}): lower it" if learning_rate > 2 * default else
             "a learning rate too high for this task, or rewards or observations too large "
             "for the network: lower --learning-rate, or scale them")
    kept_file = ("no checkpoint was written" if last_good is None else
                 f"the last good checkpoint, {last_good[0]} (step {last_good[1]:,}), is kept")
    return (f"at step {global_step:,}, {what_happened} in the update; likely cause: {cause}; "
            f"{kept_file}")


def clock(seconds: float) -> str:
    """A duration as h:mm:ss."""
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02}:{seconds:02}"


class OneProcess:
    """The world of a script that runs in one process: rank 0 of 1, on the device its flags ask for
    (ppo_utils.ranks.World is torchrun's, with the same members)."""

    rank, world_size, gathers = 0, 1, False

    def __init__(self, args):
        self.device = command_line.device(args)

    def gathered(self, item) -> list:
        return [item]


class Iterations:
    """The iterations of a run, from the first (or the one after the checkpoint's) to the last,
    unless a stop signal ends them after the iteration it came in; the progress line, with the mean
    return of the `recent_episodes` last episodes; and the clock of --save-minutes. Under torchrun
    the ranks agree on stopping and saving (`all_ranks_stop`, `all_ranks_save`: None otherwise)."""

    def __init__(self, args, checkpoint: Checkpoint | None, rank: int, recent_episodes: int):
        self.args, self.rank, self.interrupt, self.last_save = args, rank, None, 0.0
        self.all_ranks_stop: bool | None = None
        self.all_ranks_save: bool | None = None
        self.recent_returns = deque(checkpoint.recent_returns if checkpoint else [],
                                    maxlen=recent_episodes)

    def begin(self, start_iteration: int, num_iterations: int, global_step: int,
              kept: Callable[[], str]) -> None:
        """Start the clock and the Ctrl-C handler, just before the first iteration; `kept()` says
        what a stop at once keeps."""
        self.start_iteration, self.num_iterations = start_iteration, num_iterations
        self.start_time, self.start_step, self.last_print = time.time(), global_step, 0.0
        self.last_save = self.start_time
        self.interrupt = StopOnInterrupt(kept=kept)

    def __iter__(self):
        for iteration in range(self.start_iteration + 1, self.num_iterations + 1):
            yield iteration
            if self.stopping:
                return

    @property
    def stop_requested(self) -> bool:
        """Whether this process was asked to stop: Ctrl-C, SIGTERM or SIGUSR1 came."""
        return self.interrupt.requested

    @property
    def stopping(self) -> bool:
        """Whether the run stops after this iteration (under torchrun: some rank was asked to)."""
        return self.stop_requested if self.all_ranks_stop is None else self.all_ranks_stop

    @property
    def save_minutes_passed(self) -> bool:
        minutes = self.args.save_minutes
        return minutes > 0 and time.time() - self.last_save >= 60 * minutes

    def steps_per_second(self, global_step: int) -> int:
        """Environment steps per second of this sitting: a resumed run counts from its resume."""
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-6))

    def print_progress(self, global_step: int, iteration: int | None = None) -> None:
        """`step N/TOTAL | SPS | time elapsed and left | mean return (last K episodes)`. After an
        iteration (`iteration` given): the first time, then at most every 2 s, and always after the
        last iteration and when the run stops. Within a rollout: after 5 s of silence."""
        now = time.time()
        if iteration is None:
            due = now - max(self.last_print, self.start_time) >= 5.0
        else:
            due = now - self.last_print > 2.0 or iteration == self.num_iterations or self.stopping
        if self.rank != 0 or not due:
            return
        self.last_print = now
        sps, total = self.steps_per_second(global_step), f"{self.args.total_timesteps:,}"
        left = clock((self.args.total_timesteps - global_step) / sps) if sps > 0 else "?"
        returns = self.recent_returns
        mean_return = f"{np.mean(returns):8.2f}" if returns else "     n/a"
        print(f"step {global_step:>{max(len(total), 9)},}/{total} | {sps:>6,} SPS | "
              f"{clock(now - self.start_time)} elapsed, {left} left | mean return {mean_return} "
              f"(last {len(returns)} episodes)", flush=True)

    def checkpoint_due(self, iteration: int) -> bool:
        """With --save-model: at the end, every --save-interval iterations, when --save-minutes have
        passed since the last save, and when the run stops."""
        interval = self.args.save_interval
        by_the_clock = (self.save_minutes_passed if self.all_ranks_save is None
                        else self.all_ranks_save)
        by_the_count = interval > 0 and iteration % interval == 0
        return self.args.save_model and (self.stopping or iteration == self.num_iterations
                                         or by_the_clock or by_the_count)


def kept(value):
    """`value` as a checkpoint keeps it: arrays copied, tensors (alone or in a tuple) on the CPU."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if torch.is_tensor(value):
        return value.cpu()
    return tuple(map(kept, value)) if isinstance(value, tuple) else value


def on_device(value, device: torch.device):
    """A saved rollout's value as the run uses it: tensors (alone or in a tuple) on `device`."""
    if torch.is_tensor(value):
        return value.to(device)
    return tuple(on_device(item, device) for item in value) if isinstance(value, tuple) else value


class Run:
    """One training run as a script sees it: its flags checked, its device (`world`: torchrun's
    ranks, or one process), its name and videos' folder; then (`start`) its weights, optimizer,
    random generators and rollout taken back from its `checkpoint`; its iterations (`iterations`,
    the first of which claims its folder and opens its logs), what it records after each step
    (`record_step`) and at each iteration's end (`end_iteration`: the divergence stop, the logs,
    the progress line, the checkpoint), and what it says at the end (`finish`). Under torchrun only
    rank 0 logs, prints and writes the checkpoint, which holds each rank's own state."""

    def __init__(self, args, checkpoint: Checkpoint | None, env_package: str | None = None,
                 world: type = OneProcess, recent_episodes: int = 20):
        command_line.check_args(args)
        self.world = world(args)
        self.args, self.checkpoint, self.device = args, checkpoint, self.world.device
        if checkpoint and len(checkpoint.processes) != self.world.world_size:
            written = len(checkpoint.processes)
            raise WrongInput(f"the checkpoint was written by {written} processes, not "
                             f"{self.world.world_size}: resume it with as many (torchrun "
                             f"--nproc-per-node {written} on one node)")
        rank = self.world.rank
        self.logs = RunLogs(args, checkpoint, rank, env_package)
        # A resumed run's videos go into a folder of their own: its episode count starts again at 0.
        self.video_folder = f"videos/{self.name}" + (
            f"/resumed-at-step-{checkpoint.global_step}" if checkpoint else "")
        self.records_video = args.capture_video and rank == 0  # the process that records
        if self.records_video:
            environments.render_off_screen()
        # The very episodes the checkpoint left, put back into the environments built anew, unless
        # it saved none, or this run records video, which they cannot: new episodes then.
        own = checkpoint.processes[rank] if checkpoint else None
        self.saved_envs = own.envs if own and not self.records_video else None
        self.last_good = (args.resume, checkpoint.global_step) if checkpoint else None
        self.resumed_at = checkpoint.global_step if checkpoint else 0  # the steps done before
        self.logs.check_track()
        self.compile_mode = ("reduce-overhead" if args.cudagraphs else "default" if args.compile
                             else None)
        self.loop = Iterations(args, checkpoint, rank, recent_episodes)
        self.episodes_of_this_iteration: list = []

    @property
    def name(self) -> str:
        """`<env_id>__<exp_name>__<seed>__<unix time>`, a resumed run's as its checkpoint's; -2 on
        (-3, ...) when its folder, claimed as the first iteration begins, was another's."""
        return self.logs.name

    @property
    def path(self) -> str:
        return os.path.join(self.logs.folder, "checkpoint.pt")

    def start(self, agent: torch.nn.Module, optimizer, num_iterations: int,
              rollout: type[tuple] | None = None, envs=None, statistics: dict | None = None,
              **sizes) -> tuple[int, tuple | None]:
        """Resumed, take back the checkpoint's weights, optimizer, random generators and running
        `statistics` (by name); each checkpoint saves them, and `envs` where they can be saved.
        Returns the steps so far and where the rollout stood, as the script's `rollout` NamedTuple
        (this rank's, tensors on the run's device), or None where the run plays new episodes: a
        new run, one whose environments were not saved, one that records video."""
        self.agent, self.optimizer = compile_with(agent, self.compile_mode), optimizer
        self.envs, self.statistics, self.sizes = envs, statistics or {}, sizes
        self.num_iterations, saved = num_iterations, self.checkpoint
        self.start_iteration, self.new_episodes = 0, True
        if saved is None:
            return 0, None
        own = saved.processes[self.world.rank]
        agent.load_state_dict(saved.model)
        optimizer.load_state_dict(saved.optimizer)
        for name, statistic in self.statistics.items():
            restore_statistics(statistic, own.statistics[name])
        restore_rng(own.rng, self.device)
        self.start_iteration = saved.iteration
        continues = rollout is not None and not self.records_video and (
            envs is None or self.saved_envs is not None)
        resumed = rollout(**{name: on_device(value, self.device)
                             for name, value in own.rollout.items()}) if continues else None
        self.new_episodes = resumed is None
        return saved.global_step, resumed

    def iterations(self):
        """The iterations still to run: none after one in which a stop signal came. Before the
        first, every check passed, the run claims its folder, opens its logs and says so."""
        global_step = self.resumed_at
        finished_earlier = self.start_iteration >= self.num_iterations
        self.logs.open({**asdict(self.args), "num_iterations": self.num_iterations, **self.sizes})
        if self.world.rank == 0:
            self.logs.say_start(global_step, finished_earlier, self.path, self.new_episodes,
                                self.device)
        self.finished_earlier = finished_earlier
        self.loop.begin(self.start_iteration, self.num_iterations, global_step, self.kept)
        return iter(self.loop)

    def kept(self) -> str:
        """Which checkpoint a run stopped now leaves, if any."""
        if self.last_good is None:
            return "no checkpoint was written, what it trained is lost"
        return (f"the last checkpoint, {self.last_good[0]} (step {self.last_good[1]:,}), is kept; "
                "what came after it is lost")

    def record_step(self, global_step: int, episodes: list[tuple[float, int]]) -> None:
        """After each step of the rollout: log the `episodes` (score, length) that ended in it
        (under torchrun, rank 0 logs every rank's at the iteration's end), and print the progress
        line if nothing was printed for 5 s."""
        if self.world.gathers:
            self.episodes_of_this_iteration += [(global_step, *episode) for episode in episodes]
        else:
            for score, length in episodes:
                self.log_episode(global_step, score, length)
        self.loop.print_progress(global_step)

    def log_episode(self, global_step: int, score: float, length: int) -> None:
        self.logs.log_episode(global_step, score, length)
        self.loop.recent_returns.append(score)

    def end_iteration(self, iteration: int, global_step: int, update_means: dict[str, float],
                      values: np.ndarray, returns: np.ndarray, rollout: tuple | None = None,
                      charts: dict | None = None) -> None:
        """After each update: stop the run if it diverged; log the `update_means`, the learning
        rate, the explained variance of the `values` against their `returns`, the SPS and the
        script's own `charts`; print the progress line; and, when due, write the checkpoint, with
        `rollout` (the script's NamedTuple, which `start` gives back). Under torchrun rank 0 logs
        the world's figures, and all ranks stop, or save, as soon as one of them would."""
        episodes = []
        if self.world.gathers:
            (update_means, values, returns, episodes, self.loop.all_ranks_stop,
             self.loop.all_ranks_save) = self.world.gathered_iteration(
                update_means, values, returns, self.episodes_of_this_iteration,
                self.loop.stop_requested, self.loop.save_minutes_passed)
            self.episodes_of_this_iteration = []
        if what_happened := divergence(update_means, self.agent):
            self.diverged(global_step, what_happened)  # before it logs or saves this update
        if self.world.rank == 0:
            for episode in episodes:
                self.log_episode(*episode)
            self.logs.log_update(global_step, self.optimizer.param_groups[0]["lr"], update_means,
                                 explained_variance(values, returns),
                                 self.loop.steps_per_second(global_step), charts)
            self.loop.print_progress(global_step, iteration)
        if self.loop.checkpoint_due(iteration):
            self.loop.last_save = time.time()
            self.save(iteration, global_step, rollout)

    def save(self, iteration: int, global_step: int, rollout: tuple | None) -> None:
        """Write the checkpoint: under torchrun each rank's own state, gathered, which rank 0
        writes. Never over the last good one with non-finite weights."""
        if not all_finite(self.agent.state_dict()):
            self.diverged(global_step, "the weights became non-finite")
        own = ProcessState(rng=rng_state(self.device),
                           rollout={name: kept(value) for name, value in
                                    (rollout._asdict() if rollout else {}).items()},
                           envs=None if self.envs is None else environments.save_envs(self.envs),
                           statistics={name: statistics_state(statistic)
                                       for name, statistic in self.statistics.items()})
        processes = self.world.gathered(own)
        if self.world.rank == 0:
            Checkpoint(variant=self.args.variant, args=asdict(self.args), run_name=self.name,
                       model=self.agent.state_dict(), optimizer=self.optimizer.state_dict(),
                       iteration=iteration, global_step=global_step,
                       recent_returns=list(self.loop.recent_returns),
                       processes=processes).write(self.path)
            self.last_good = (self.path, global_step)

    def diverged(self, global_step: int, what_happened: str) -> NoReturn:
        """Flush and close the logs, then raise Diverged (one line and exit code 3): going on would
        fill the logs with NaN and, at the next save, write over the last good checkpoint."""
        if self.world.rank == 0:
            self.logs.close()
        self.loop.interrupt.restore()
        raise Diverged(diverged_line(self.args, global_step, what_happened, self.last_good))

    def finish(self, global_step: int, **summary) -> dict:
        """Flush and close the logs, then say what comes next: how to resume a stopped run, or
        where its checkpoint is. Until the logs are closed a stop signal is still the run's.
        Returns a summary of the run for callers such as tests, with the script's own `summary`."""
        try:
            if self.world.rank == 0:
                self.logs.close()
        finally:
            self.loop.interrupt.restore()
        stopping = self.loop.stopping
        if self.world.rank == 0 and not self.finished_earlier:
            self.logs.say_end(global_step, stopping, self.path, self.world.gathers)
        return {"run_name": self.name, "global_step": global_step, "interrupted": stopping,
                "recent_returns": list(self.loop.recent_returns), **summary}
