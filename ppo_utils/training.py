"""A run's life as a script sees it, from its first line to its last word: `Run`, the one front
door to its logs (run_logs), its checkpoint (run_checkpoint), torchrun's ranks (world), and its
iterations with the stop signals, the progress line and the divergence stop (here); and what the
scripts call beside it (the speed options, the evaluation).
"""

import math
import random
import time
from collections import deque
from dataclasses import asdict
from typing import NoReturn

import numpy as np
import torch

from ppo_utils import checkpoint as checkpoints
from ppo_utils import command_line
from ppo_utils import environments
from ppo_utils.exits import UNUSED_RUN_FOLDERS, Diverged
from ppo_utils.run_checkpoint import RunCheckpoint
from ppo_utils.run_logs import RunLogs
from ppo_utils.speed import compile_with
from ppo_utils.stop_signals import StopOnInterrupt
from ppo_utils.ranks import World, choose_device


def clock(seconds: float) -> str:
    """A duration as h:mm:ss."""
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02}:{seconds:02}"


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    """Seed Python, NumPy and PyTorch; with torch_deterministic, cuDNN picks deterministic
    kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """[Core 12: Debug variables] 1 - Var[target - predicted] / Var[target] of the values a rollout
    recorded against their returns: 1 is a perfect value function, 0 no better than a constant,
    negative worse than one; nan when the targets do not vary."""
    target_variance = np.var(target)
    if target_variance == 0:
        return np.nan
    return float(1 - np.var(target - predicted) / target_variance)


def divergence(update_means: dict[str, float], agent: torch.nn.Module) -> str | None:
    """What became NaN or infinite in an update (a loss, the gradient norm, a weight), or None.
    Once a weight is NaN, every action and every update after it is NaN too."""
    for key, quantity in (("policy_loss", "the policy loss"), ("value_loss", "the value loss"),
                          ("entropy", "the entropy"), ("grad_norm", "the gradient norm")):
        if key in update_means and not math.isfinite(update_means[key]):
            return f"{quantity} became {update_means[key]}"
    return None if checkpoints.all_finite(agent.state_dict()) else "the weights became non-finite"


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


class Iterations:
    """The iterations of a run, from the first (or the one after the checkpoint's) to the last,
    unless a stop signal (Ctrl-C, SIGTERM, Slurm's SIGUSR1) ends them after the iteration it came
    in; the progress line, with the mean return of the `recent_episodes` last episodes; and the
    clock of --save-minutes. Under torchrun the ranks agree on stopping and saving
    (`all_ranks_stop`, `all_ranks_save`: None in a run of one process)."""

    def __init__(self, args, checkpoint: dict | None, rank: int, recent_episodes: int):
        self.args, self.rank, self.interrupt, self.last_save = args, rank, None, 0.0
        self.all_ranks_stop: bool | None = None  # under torchrun: some rank was asked to stop
        self.all_ranks_save: bool | None = None  # under torchrun: some rank's save clock ran out
        self.recent_returns = deque(checkpoint["recent_returns"] if checkpoint else [],
                                    maxlen=recent_episodes)

    def begin(self, start_iteration: int, num_iterations: int, global_step: int) -> None:
        """Start the clock and the Ctrl-C handler, just before the first iteration."""
        self.start_iteration, self.num_iterations = start_iteration, num_iterations
        self.start_time, self.start_step, self.last_print = time.time(), global_step, 0.0
        self.last_save = self.start_time
        self.interrupt = StopOnInterrupt()

    def __iter__(self):
        for iteration in range(self.start_iteration + 1, self.num_iterations + 1):
            yield iteration
            if self.stopping:
                return

    @property
    def stop_requested(self) -> bool:
        """Whether this process was asked to stop: Ctrl-C was pressed, or SIGTERM or SIGUSR1
        came."""
        return self.interrupt.requested

    @property
    def stopping(self) -> bool:
        """Whether the run stops after this iteration: this process was asked to (under torchrun:
        some rank was, `all_ranks_stop`)."""
        return self.stop_requested if self.all_ranks_stop is None else self.all_ranks_stop

    @property
    def save_minutes_passed(self) -> bool:
        """With --save-minutes: that many minutes have passed since the run started or last
        saved."""
        minutes = self.args.save_minutes
        return minutes > 0 and time.time() - self.last_save >= 60 * minutes

    def steps_per_second(self, global_step: int) -> int:
        """Environment steps per second of this sitting: a resumed run counts from where it
        resumed."""
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-6))

    def print_progress(self, global_step: int, iteration: int | None = None) -> None:
        """`step N/TOTAL | SPS | time elapsed and left | mean return (last K episodes)`. After an
        iteration (`iteration` given): the first time, then at most every 2 s, and always after the
        last iteration and when the run stops. Within a rollout: when nothing was printed for 5
        s."""
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


class Run:
    """One training run as a script sees it: its flags checked, its name, folder and device; then
    (`start`) its logs, a resumed run's weights, optimizer, random generators and step count
    (`resumed`: where its rollout stood), its clock and Ctrl-C; the iterations it runs
    (`iterations`), what it records after each step (`record_step`) and at each iteration's end
    (`end_iteration`: the divergence stop, the logs, the progress line, the checkpoint), and what
    it says at the end (`finish`). Its parts: `logs` (RunLogs), `saved` (RunCheckpoint), `world`
    (torchrun's ranks, World) and `loop` (Iterations).

    Under torchrun, `rank` is this process among the `world_size` the script runs as: only rank 0
    logs, prints and writes the checkpoint; the ranks agree once an iteration on whether to stop and
    to save; and the checkpoint holds each rank's own state (random generators, environments, where
    they stand) as a list, one entry per rank. A script that runs in one process leaves world_size
    None, and its checkpoint holds one of each."""

    def __init__(self, args, variant: str, checkpoint: dict | None,
                 device: torch.device | None = None, rank: int = 0, world_size: int | None = None,
                 env_package: str | None = None, recent_episodes: int = 20):
        command_line.check_args(args, variant)
        self.world = World(args, variant, rank, world_size)
        self.args, self.variant, self.checkpoint, self.rank, self.world_size = \
            args, variant, checkpoint, rank, world_size
        self.device = choose_device(args, variant, device)
        self.world.check_checkpoint(checkpoint)
        self.logs = RunLogs(args, variant, checkpoint, rank, env_package)
        self.name, self.folder = self.logs.name, self.logs.folder
        # A resumed run's videos go into a folder of their own: its episode count starts again at 0.
        self.video_folder = f"videos/{self.name}" + (f"/resumed-at-step-{checkpoint['global_step']}"
                                                     if checkpoint else "")
        records_video = args.capture_video and rank == 0  # the process that records
        if records_video:
            environments.render_off_screen()
        self.saved = RunCheckpoint(args, variant, checkpoint, self.world, self.folder, self.name,
                                   records_video)
        self.saved_envs, self.checkpoint_path = self.saved.saved_envs, self.saved.path
        self.logs.check_track()
        # What --compile and --cudagraphs ask of the functions marked @compiled, for the agent
        # `start` is given (`compile_with`).
        self.compile_mode = ("reduce-overhead" if args.cudagraphs else "default" if args.compile
                             else None)
        self.loop = Iterations(args, checkpoint, rank, recent_episodes)
        self.finished_earlier, self.episodes_of_this_iteration = False, []

    def resumed(self, resumable: type[tuple]) -> tuple | None:
        """Where the rollout stood when the checkpoint was written, as the script's `resumable`
        NamedTuple: what `end_iteration` was given. None for a new run, or one that starts new
        episodes (the script then resets its environments)."""
        return self.saved.resumed(resumable, self.device)

    def start(self, agent: torch.nn.Module, optimizer: torch.optim.Optimizer, num_iterations: int,
              envs=None, statistics: dict | None = None, **sizes) -> int:
        """Just before the first iteration: open the logs (the settings and derived `sizes` as a
        table), restore a resumed run's weights, optimizer, random generators and the script's other
        running `statistics` (by name: gymnasium's RunningMeanStd, such as a reward scaler's), and
        say so; then start the clock and the Ctrl-C handler. Each checkpoint saves the same, and
        `envs` (None where they cannot be saved). Returns the environment steps so far."""
        self.agent, self.optimizer = compile_with(agent, self.compile_mode), optimizer
        self.envs = envs
        self.statistics = statistics or {}
        self.logs.open({**asdict(self.args), "num_iterations": num_iterations, **sizes})
        start_iteration, global_step = self.saved.restore(agent, optimizer, self.statistics,
                                                          self.device)
        self.finished_earlier = bool(self.checkpoint) and start_iteration >= num_iterations
        if self.rank == 0:
            self.logs.say_start(global_step, self.finished_earlier, self.checkpoint_path,
                                self.saved_envs is None, self.device)
        self.loop.begin(start_iteration, num_iterations, global_step)
        return global_step

    def iterations(self):
        """The iterations still to run (Iterations): none after one in which a stop signal came."""
        return iter(self.loop)

    def record_step(self, global_step: int, episodes: list[tuple[float, int]]) -> None:
        """After each step of the rollout: log the `episodes` (score, length) that ended in it
        (under torchrun, rank 0 logs every rank's at the iteration's end), and print the progress
        line if nothing was printed for 5 s, so that a long rollout is not silent."""
        if self.world_size:
            self.episodes_of_this_iteration += [(global_step, *episode) for episode in episodes]
        else:
            for score, length in episodes:
                self.log_episode(global_step, score, length)
        self.loop.print_progress(global_step)

    def log_episode(self, global_step: int, score: float, length: int) -> None:
        self.logs.log_episode(global_step, score, length)
        self.loop.recent_returns.append(score)

    def end_iteration(self, iteration: int, global_step: int, update_means: dict[str, float],
                      values: np.ndarray, returns: np.ndarray, resumable: tuple | None = None,
                      charts: dict | None = None) -> None:
        """After each update: stop the run if it diverged; log the `update_means`, the learning
        rate, the explained variance of the `values` against their `returns`, the SPS and the
        script's own `charts`; print the progress line; and, when due, write the checkpoint with
        `resumable` (the script's NamedTuple, each field under its name, which `resumed` gives
        back). Under
        torchrun rank 0 logs the world's figures (World.gathered_iteration), and all ranks stop, or
        save, as soon as one of them would."""
        UNUSED_RUN_FOLDERS.clear()  # from here the run's folder holds its iterations: kept
        episodes = []
        if self.world_size:
            (update_means, values, returns, episodes, self.loop.all_ranks_stop,
             self.loop.all_ranks_save) = self.world.gathered_iteration(
                update_means, values, returns, self.episodes_of_this_iteration,
                self.loop.stop_requested, self.loop.save_minutes_passed)
            self.episodes_of_this_iteration = []
        if what_happened := divergence(update_means, self.agent):
            self.diverged(global_step, what_happened)  # before it logs or saves this update
        if self.rank == 0:
            for episode in episodes:
                self.log_episode(*episode)
            self.logs.log_update(global_step, self.optimizer.param_groups[0]["lr"], update_means,
                                 explained_variance(values, returns),
                                 self.loop.steps_per_second(global_step), charts)
            self.loop.print_progress(global_step, iteration)
        if self.loop.checkpoint_due(iteration):
            self.loop.last_save = time.time()
            if not checkpoints.all_finite(self.agent.state_dict()):  # never over the last good one
                self.diverged(global_step, "the weights became non-finite")
            self.saved.save(iteration, global_step, self.agent, self.optimizer, self.envs,
                            self.statistics, resumable._asdict() if resumable else {},
                            self.loop.recent_returns, self.device)

    def diverged(self, global_step: int, what_happened: str) -> NoReturn:
        """Flush and close the logs, then raise Diverged (which `exits.exit_codes` turns into one
        line and exit code DIVERGED): going on would fill the logs with NaN and, at the next save,
        write over the last good checkpoint."""
        if self.rank == 0:
            self.logs.close()
        self.loop.interrupt.restore()
        raise Diverged(diverged_line(self.args, global_step, what_happened, self.saved.last_good))

    def finish(self, global_step: int, **summary) -> dict:
        """Flush and close the logs, then say what comes next: how to resume a stopped run, or where
        its checkpoint is. Until the logs are closed a stop signal is still the run's: the same
        request delivered again changes nothing, a second one stops at once. Returns a summary of
        the run for callers such as tests, with the script's own `summary`."""
        try:
            if self.rank == 0:
                self.logs.close()
        finally:
            self.loop.interrupt.restore()
        stopping = self.loop.stopping
        if self.rank == 0 and not self.finished_earlier:  # start() said that it was finished
            self.logs.say_end(global_step, stopping, self.checkpoint_path, bool(self.world_size))
        return {"run_name": self.name, "global_step": global_step, "interrupted": stopping,
                "recent_returns": list(self.loop.recent_returns), **summary}
