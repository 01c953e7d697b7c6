"""A training run as a script sees it (Run): started or resumed from its checkpoint, its iterations,
what it logs and saves after each, its stop on a signal or on divergence, and its last words."""

import math
import os
import random
import time
from collections import deque
from dataclasses import asdict
from typing import NoReturn

import numpy as np
import torch

from ppo_utils import command_line, environments
from ppo_utils.checkpoint import Checkpoint, ProcessState, all_finite, restore_rng, \
    restore_statistics, rng_state, statistics_state
from ppo_utils.exits import Diverged, StopOnInterrupt
from ppo_utils.run_logs import RunLogs


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """[Core 12: Debug variables] 1 - Var[target - predicted] / Var[target]: 1 is a perfect value
    function, 0 no better than a constant."""
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


def likely_cause(args) -> str:
    learning_rate, default = args.learning_rate, type(args)().learning_rate
    if learning_rate > 2 * default:
        return (f"the learning rate {learning_rate:g} is {learning_rate / default:g} times the "
                f"default ({default:g}): lower it")
    return ("a learning rate too high for this task, or rewards or observations too large for the "
            "network: lower --learning-rate, or scale them")


def clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02}:{seconds:02}"


def moved(value, device: torch.device | str):
    """A rollout's value (a tensor, an array, a tuple of them) on `device`, arrays copied."""
    if isinstance(value, tuple):
        return tuple(moved(item, device) for item in value)
    return value.to(device) if torch.is_tensor(value) else (
        value.copy() if isinstance(value, np.ndarray) else value)


class OneProcess:
    """The world of a script that runs in one process (ranks.World is torchrun's)."""

    rank, world_size, gathers = 0, 1, False

    def __init__(self, args, checkpoint: Checkpoint | None):
        self.device = command_line.device(args)

    def gathered(self, item) -> list:
        return [item]


class Run:
    """One training run, in its `world` (one process, or torchrun's, where rank 0 logs, prints and
    writes the checkpoint, which holds each rank's own state)."""

    def __init__(self, args, checkpoint: Checkpoint | None, env_package: str | None = None,
                 world: type = OneProcess, recent_episodes: int = 20):
        command_line.check_args(args)
        self.world = world(args, checkpoint)
        self.args, self.checkpoint, self.device = args, checkpoint, self.world.device
        self.logs = RunLogs(args, checkpoint, self.world.rank, env_package)
        # A resumed run's videos go into a folder of their own: its episode count starts again at 0.
        self.video_folder = f"videos/{self.logs.name}" + (
            f"/resumed-at-step-{checkpoint.global_step}" if checkpoint else "")
        self.records_video = args.capture_video and self.world.rank == 0
        if self.records_video:
            environments.render_off_screen()
        # The very episodes the checkpoint left, unless it saved none or this run films (new ones).
        own = checkpoint.processes[self.world.rank] if checkpoint else None
        self.saved_envs = own.envs if own and not self.records_video else None
        self.last_good = (args.resume, checkpoint.global_step) if checkpoint else None
        self.resumed_at = checkpoint.global_step if checkpoint else 0
        self.logs.check_track()
        self.compile_mode = ("reduce-overhead" if args.cudagraphs else "default" if args.compile
                             else None)
        self.recent_returns = deque(checkpoint.recent_returns if checkpoint else [],
                                    maxlen=recent_episodes)
        self.episodes_of_this_iteration: list = []
        # Under torchrun the ranks agree on stopping and saving; None in one process.
        self.all_ranks_stop: bool | None = None
        self.all_ranks_save: bool | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.logs.folder, "checkpoint.pt")

    def start(self, agent: torch.nn.Module, optimizer, num_iterations: int,
              rollout: type[tuple] | None = None, envs=None, statistics: dict | None = None,
              **sizes) -> tuple[int, tuple | None]:
        """Resumed, take back the weights, optimizer, random generators and running `statistics`
        (by name). Returns the steps so far and where the rollout stood, as the script's `rollout`
        NamedTuple, or None where the run plays new episodes. `sizes` are logged with the flags."""
        agent.compile_mode = self.compile_mode  # what its @speed.compiled functions run as
        self.agent, self.optimizer = agent, optimizer
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
        resumed = rollout(**{name: moved(value, self.device)
                             for name, value in own.rollout.items()}) if continues else None
        self.new_episodes = resumed is None
        return saved.global_step, resumed

    def iterations(self):
        """The iterations still to run, until a stop signal ends them after the one it came in.
        Before the first, every check has passed: the run claims its folder and opens its logs."""
        self.finished_earlier = self.start_iteration >= self.num_iterations
        self.logs.open({**asdict(self.args), "num_iterations": self.num_iterations, **self.sizes})
        if self.world.rank == 0:
            self.logs.say_start(self.resumed_at, self.finished_earlier, self.path,
                                self.new_episodes, self.device)
        self.start_time = self.last_save = time.time()
        self.last_print = 0.0
        self.interrupt = StopOnInterrupt(kept=self.kept)
        for iteration in range(self.start_iteration + 1, self.num_iterations + 1):
            yield iteration
            if self.stopping:
                return

    @property
    def stopping(self) -> bool:
        return self.interrupt.requested if self.all_ranks_stop is None else self.all_ranks_stop

    def save_minutes_passed(self) -> bool:
        minutes = self.args.save_minutes
        return minutes > 0 and time.time() - self.last_save >= 60 * minutes

    def kept(self, command: bool = True) -> str:
        """Which checkpoint a run that stops now leaves, if any, and (`command`) how to resume."""
        if self.last_good is None:
            return "no checkpoint was written"
        path, step = self.last_good
        return (f"the last good checkpoint, {path} (step {step:,}), is kept" + (
            f": resume with: {self.logs.command('--resume', path)}" if command else ""))

    def steps_per_second(self, global_step: int) -> int:
        """Of this sitting: a resumed run counts from where it resumed."""
        seconds = max(time.time() - self.start_time, 1e-6)
        return int((global_step - self.resumed_at) / seconds)

    def print_progress(self, global_step: int, iteration: int | None = None) -> None:
        """`step N/TOTAL | SPS | elapsed, left | mean return`: after the first iteration, then at
        most every 2 s, after the last and at a stop; within a rollout, after 5 s of silence."""
        now = time.time()
        if iteration is None:
            due = now - max(self.last_print, self.start_time) >= 5.0
        else:
            due = now - self.last_print > 2.0 or iteration == self.num_iterations or self.stopping
        if self.world.rank != 0 or not due:
            return
        self.last_print = now
        sps, total = self.steps_per_second(global_step), f"{self.args.total_timesteps:,}"
        left = clock((self.args.total_timesteps - global_step) / sps) if sps > 0 else "?"
        returns = self.recent_returns
        mean_return = f"{np.mean(returns):8.2f}" if returns else "     n/a"
        print(f"step {global_step:>{max(len(total), 9)},}/{total} | {sps:>6,} SPS | "
              f"{clock(now - self.start_time)} elapsed, {left} left | mean return {mean_return} "
              f"(last {len(returns)} episodes)", flush=True)

    def record_step(self, global_step: int, episodes: list[tuple[float, int]]) -> None:
        """After each step: log the `episodes` (score, length) that ended in it; under torchrun
        rank 0 logs every rank's at the iteration's end."""
        if self.world.gathers:
            self.episodes_of_this_iteration += [(global_step, *episode) for episode in episodes]
        else:
            for score, length in episodes:
                self.log_episode(global_step, score, length)
        self.print_progress(global_step)

    def log_episode(self, global_step: int, score: float, length: int) -> None:
        self.logs.log_episode(global_step, score, length)
        self.recent_returns.append(score)

    def end_iteration(self, iteration: int, global_step: int, update_means: dict[str, float],
                      values: np.ndarray, returns: np.ndarray, rollout: tuple | None = None,
                      charts: dict | None = None) -> None:
        """After each update: stop if it diverged; log the `update_means`, the learning rate, the
        explained variance, the SPS and the script's `charts`; save, with `rollout`, when due."""
        episodes = []
        if self.world.gathers:
            (update_means, values, returns, episodes, self.all_ranks_stop,
             self.all_ranks_save) = self.world.gathered_iteration(
                update_means, values, returns, self.episodes_of_this_iteration,
                self.interrupt.requested, self.save_minutes_passed())
            self.episodes_of_this_iteration = []
        if what_happened := divergence(update_means, self.agent):
            self.diverged(global_step, what_happened)  # before it logs or saves this update
        if self.world.rank == 0:
            for episode in episodes:
                self.log_episode(*episode)
            self.logs.log_update(global_step, self.optimizer.param_groups[0]["lr"], update_means,
                                 explained_variance(values, returns),
                                 self.steps_per_second(global_step), charts)
            self.print_progress(global_step, iteration)
        # With --save-model: at the end, at a stop, every --save-interval iterations and every
        # --save-minutes.
        interval = self.args.save_interval
        by_the_clock = (self.save_minutes_passed() if self.all_ranks_save is None
                        else self.all_ranks_save)
        if self.args.save_model and (self.stopping or iteration == self.num_iterations
                                     or by_the_clock or interval > 0 and iteration % interval == 0):
            self.last_save = time.time()
            self.save(iteration, global_step, rollout)

    def save(self, iteration: int, global_step: int, rollout: tuple | None) -> None:
        if not all_finite(self.agent.state_dict()):  # never over the last good one
            self.diverged(global_step, "the weights became non-finite")
        own = ProcessState(rng=rng_state(self.device),
                           rollout={name: moved(value, "cpu") for name, value in
                                    (rollout._asdict() if rollout else {}).items()},
                           envs=None if self.envs is None else environments.save_envs(self.envs),
                           statistics={name: statistics_state(statistic)
                                       for name, statistic in self.statistics.items()})
        processes = self.world.gathered(own)
        if self.world.rank == 0:
            Checkpoint(variant=self.args.variant, args=asdict(self.args), run_name=self.logs.name,
                       model=self.agent.state_dict(), optimizer=self.optimizer.state_dict(),
                       iteration=iteration, global_step=global_step,
                       recent_returns=list(self.recent_returns),
                       processes=processes).write(self.path)
            self.last_good = (self.path, global_step)

    def diverged(self, global_step: int, what_happened: str) -> NoReturn:
        """Going on would fill the logs with NaN and, at the next save, lose the last good
        checkpoint: close the logs and end the run (exit code 3)."""
        if self.world.rank == 0:
            self.logs.close()
        self.interrupt.restore()
        raise Diverged(f"at step {global_step:,}, {what_happened} in the update; likely cause: "
                       f"{likely_cause(self.args)}; {self.kept(command=False)}")

    def finish(self, global_step: int, **summary) -> dict:
        """Close the logs (a stop signal is the run's until then) and say how to go on. Returns a
        summary for callers (tests), with `summary`."""
        try:
            if self.world.rank == 0:
                self.logs.close()
        finally:
            self.interrupt.restore()
        if self.world.rank == 0 and not self.finished_earlier:
            self.logs.say_end(global_step, self.stopping, self.path)
        return {"run_name": self.logs.name, "global_step": global_step,
                "interrupted": self.stopping, "recent_returns": list(self.recent_returns),
                **summary}
