"""A run's life, from its first line to its last word: its name and folder, device and logs, the
iterations it runs, what it records after each step and at each iteration's end (the progress line,
the divergence guard, the checkpoints), the stop signals and torchrun's ranks; the speed options
(torch.compile, CUDA graphs, environments in worker processes); and the evaluation of a saved agent.
"""

import contextlib
import functools
import math
import os
import random
import signal
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict
from typing import Callable, NoReturn

import gymnasium as gym
import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

import checkpoints
import command_line
import videos
from exits import STOP_SIGNALS, UNUSED_RUN_FOLDERS, Diverged, StoppedAtOnce, fail, signal_name

# A second stop signal this soon after the first is the same request arriving twice, not a second
# one: Slurm signals every process of a task, and the runner or torchrun above the run passes it on.
SAME_REQUEST_SECONDS = 1.0


# What the first stop signal prints: {signal} names it, {again} how to stop at once.
STOP_NOTICE = "{signal}: stopping after this iteration ({again} to quit at once)"


class StopOnInterrupt:
    """The first Ctrl-C, SIGTERM or SIGUSR1 only prints `notice` and sets `requested`: training then
    stops after the current iteration, so the run can flush its logs and save a checkpoint at a
    clean point. A second Ctrl-C or SIGTERM stops at once (StoppedAtOnce, a KeyboardInterrupt), but
    for a SIGTERM within SAME_REQUEST_SECONDS of the first signal, which is the first one delivered
    twice (two presses of Ctrl-C are always two). SIGUSR1, Slurm's warning that the time limit is
    near, never stops at once: said again, it says nothing new. Under torchrun, which passes a
    signal on to every process, only rank 0 prints the notice; {signal} in it names the signal,
    {again} how to stop at once."""

    def __init__(self, notice: str = STOP_NOTICE):
        self.requested, self.notice, self.first = False, notice, (None, 0.0)
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
            raise StoppedAtOnce(signal_name(signum))
        self.requested, self.first = True, (signum, time.monotonic())
        if int(os.environ.get("RANK", "0")) == 0:
            again = "press Ctrl-C again" if signum == signal.SIGINT else "Ctrl-C or SIGTERM"
            print("\n" + self.notice.format(signal=signal_name(signum), again=again), flush=True)

    def restore(self):
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)


def choose_device(args, variant: str, device: torch.device | None = None) -> torch.device:
    """`device`, or else CUDA when it is there and --cuda allows it, else the CPU; --cudagraphs
    needs CUDA."""
    device = device or torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        fail(variant, "--cudagraphs needs a CUDA device: drop it, or run on a GPU (and without "
                      "--no-cuda)")
    return device


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


def text_table(key_header: str, value_header: str, rows: dict) -> str:
    """A two-column markdown table, as the run logs its settings and releases to TensorBoard's text
    tab (benchmark/report.py reads them back)."""
    rows_text = "\n".join(f"|{key}|{value}|" for key, value in rows.items())
    return f"|{key_header}|{value_header}|\n|-|-|\n" + rows_text


# The packages whose release can change what any run learns. A script names its environments' own
# package too (Run's `env_package`): MuJoCo 3.5.0, for one, changed Hopper's contacts.
CORE_PACKAGES = ("torch", "gymnasium", "numpy")


def software_versions(env_package: str | None) -> dict[str, str]:
    """{package: release} of Python, the CORE_PACKAGES and `env_package` (those installed), for the
    run's `versions` text in TensorBoard (benchmark/report.py lists them beside the results)."""
    from importlib.metadata import PackageNotFoundError, version

    releases = {"python": sys.version.split()[0]}
    for distribution in CORE_PACKAGES + ((env_package,) if env_package else ()):
        with contextlib.suppress(PackageNotFoundError):
            releases[distribution] = version(distribution)
    return releases


def claim_run_folder(name: str, variant: str) -> str:
    """Make runs/<name> and return the name. os.mkdir is atomic: of two runs started in the same
    second with the same settings (a tuner's workers, a shell loop), one makes the folder and the
    other finds it taken, and takes <name>-2 (or -3, ...) instead, and says so: two runs never share
    a folder. Until the run's first iteration ends, `fail` removes it (exits.UNUSED_RUN_FOLDERS)."""
    def cannot_write(error: OSError) -> NoReturn:  # `runs` is a file, or a folder we may not write
        fail(variant, f"cannot write the run's logs to {os.path.join('runs', name)!r} "
                      f"({error.strerror}): start the run in a folder where it can create runs/, "
                      "or remove what is in the way")

    try:
        os.makedirs("runs", exist_ok=True)
    except OSError as error:
        cannot_write(error)
    for attempt in range(1, 1000):
        candidate = name if attempt == 1 else f"{name}-{attempt}"
        try:
            os.mkdir(os.path.join("runs", candidate))
        except FileExistsError:
            continue
        except OSError as error:
            cannot_write(error)
        UNUSED_RUN_FOLDERS[os.path.join("runs", candidate)] = None
        if attempt > 1:
            print(f"runs/{name} is another run's (started in the same second): this run is "
                  f"{candidate}", flush=True)
        return candidate
    fail(variant, f"runs/{name} and its next 998 alternatives are all taken: clean up runs/")


class Run:
    """One training run, from its first line to its last: its flags checked, its name, folder and
    device; then (`start`) its logs, its clock and Ctrl-C, and a resumed run's weights, optimizer,
    random generators and step count; the iterations it runs (`iterations`), what it records after
    each step (`record_step`) and at each iteration's end (`end_iteration`: the divergence guard,
    the logs, the progress line, the checkpoint), and what it says at the end (`finish`).

    A new run is named `<env_id>__<exp_name>__<seed>__<unix time>` and keeps its TensorBoard log and
    checkpoint in runs/<name>/. A resumed run (`checkpoint`, read by command_line.parse_args) keeps
    its name and goes on in the folder of the checkpoint it was given, from wherever it is started.
    `env_package` is the package the script's environments come from, whose release the run records
    with PyTorch's, gymnasium's and NumPy's; the progress line shows the mean return of the
    `recent_episodes` last episodes.

    Under torchrun, `rank` is this process among the `world_size` the script runs as: only rank 0
    logs, prints and writes the checkpoint; the ranks agree once an iteration on whether to stop and
    to save; and the checkpoint holds each rank's own state (random generators, environments, where
    they stand) as a list, one entry per rank. A script that runs in one process leaves world_size
    None, and its checkpoint holds one of each."""

    def __init__(self, args, variant: str, checkpoint: dict | None,
                 device: torch.device | None = None, rank: int = 0, world_size: int | None = None,
                 env_package: str | None = None, recent_episodes: int = 20):
        command_line.check_args(args, variant)
        if world_size:  # --num-envs counts the world's environments, each rank steps its share
            check_world_sizes(args, variant, world_size)
        self.args, self.variant, self.checkpoint, self.rank, self.world_size = \
            args, variant, checkpoint, rank, world_size
        self.env_package = env_package
        self.device = choose_device(args, variant, device)
        if checkpoint and world_size and checkpoint["world_size"] != world_size:
            fail(variant, f"the checkpoint was written by {checkpoint['world_size']} processes, "
                          f"not {world_size}: resume it with as many (torchrun --nproc-per-node "
                          f"{checkpoint['world_size']} on one node)")
        if checkpoint:
            self.name, self.folder = checkpoint["run_name"], os.path.dirname(args.resume) or "."
        # ALE/Pong-v5 -> ALE-Pong-v5, mymodule:MyEnv-v0 -> mymodule-MyEnv-v0: the name is a folder's
        else:
            env_name = args.env_id.replace("/", "-").replace(":", "-")
            self.name = f"{env_name}__{args.exp_name}__{args.seed}__{int(time.time())}"
            if rank == 0:  # the process that writes the logs and checkpoints claims their folder
                self.name = claim_run_folder(self.name, variant)
            self.folder = f"runs/{self.name}"
        self.checkpoint_path = os.path.join(self.folder, "checkpoint.pt")
        # A resumed run's videos go into a folder of their own: its episode count starts again at 0.
        self.video_folder = f"videos/{self.name}" + (f"/resumed-at-step-{checkpoint['global_step']}"
                                                     if checkpoint else "")
        # A resumed run goes on with the saved environments, the very episodes it left; they cannot
        # record video, so the process that records (rank 0) starts new ones instead, and the run
        # no longer ends exactly as an unbroken one would. None where the checkpoint holds none.
        records_video = args.capture_video and rank == 0
        if records_video:
            videos.render_off_screen()
        self.saved_envs = (self.this_ranks(checkpoint.get("envs"))
                           if checkpoint and not records_video else None)
        if args.track:
            try:
                # Checked now, before anything is built; W&B starts in `start`.
                import wandb  # noqa: F401
            except ImportError:
                fail(variant, "--track needs wandb: pip install wandb")
        # What --compile and --cudagraphs ask of the functions marked @compiled, for the agent
        # `start` is given (`compile_with`).
        self.compile_mode = ("reduce-overhead" if args.cudagraphs else "default" if args.compile
                             else None)
        self.writer, self.interrupt, self.finished_earlier, self.last_save = None, None, False, 0.0
        self.all_ranks_stop: bool | None = None  # under torchrun: some rank was asked to stop
        self.all_ranks_save: bool | None = None  # under torchrun: some rank's save clock ran out
        self.recent_returns = deque(checkpoint["recent_returns"] if checkpoint else [],
                                    maxlen=recent_episodes)
        self.episodes_of_this_iteration: list[tuple[int, float, int]] = []
        # The newest checkpoint of this run on disk, and its step: what a diverged run leaves
        # behind.
        self.last_good_checkpoint = (args.resume, checkpoint["global_step"]) if checkpoint else None

    def this_ranks(self, saved):
        """What the checkpoint saved of this process: its own entry under torchrun, else all of
        it."""
        return saved[self.rank] if self.world_size and saved is not None else saved

    def resumed(self, resumable: type[tuple]) -> tuple | None:
        """Where the rollout stood when the checkpoint was written, as the script's `resumable`
        NamedTuple (this rank's, tensors on the run's device), whose fields name what the
        checkpoint holds: what `end_iteration` was given. None for a new run, or one that starts
        new episodes (the script then resets its environments)."""
        if self.saved_envs is None:
            return None

        def on_device(value):
            return value.to(self.device) if torch.is_tensor(value) else value

        values = [self.this_ranks(self.checkpoint[name]) for name in resumable._fields]
        return resumable._make(tuple(map(on_device, value)) if isinstance(value, tuple)
                               else on_device(value) for value in values)

    def start(self, agent: torch.nn.Module, optimizer: torch.optim.Optimizer, num_iterations: int,
              envs=None, statistics: dict | None = None, **sizes) -> int:
        """Just before the first iteration: open the logs (the settings and derived `sizes` as a
        table), restore a resumed run's weights, optimizer, random generators and the script's other
        running `statistics` (by name: gymnasium's RunningMeanStd, such as a reward scaler's), and
        say so; then start the clock and the Ctrl-C handler. Each checkpoint saves the same, and
        `envs`, gymnasium vector environments (None where they cannot be saved). Returns the
        environment steps so far."""
        self.agent, self.optimizer, self.envs, self.num_iterations = \
            compile_with(agent, self.compile_mode), optimizer, envs, num_iterations
        self.statistics = statistics or {}
        self.open_logs(num_iterations=num_iterations, **sizes)
        self.start_iteration, global_step = 0, 0
        if self.checkpoint:
            agent.load_state_dict(self.checkpoint["model"])
            optimizer.load_state_dict(self.checkpoint["optimizer"])
            for name, statistic in self.statistics.items():
                checkpoints.restore_statistics(statistic, self.this_ranks(self.checkpoint[name]))
            rng = self.checkpoint["rng"]
            checkpoints.restore_rng(rng[self.rank] if isinstance(rng, list) else rng, self.device)
            self.start_iteration = self.checkpoint["iteration"]
            global_step = self.checkpoint["global_step"]
            self.finished_earlier = self.start_iteration >= num_iterations
        if self.rank == 0 and self.finished_earlier:
            print(f"{self.name} is already finished ({global_step:,} of "
                  f"{self.args.total_timesteps:,} steps): evaluate it with: python "
                  f"ppo/{self.variant}.py --evaluate {self.checkpoint_path}")
        # the start line: what runs where, and where its logs and checkpoint go
        elif self.rank == 0:
            saved = (self.checkpoint_path if self.args.save_model
                     else "none (--save-model keeps one)")
            new_episodes = " (with new episodes)" if self.saved_envs is None else ""
            print((f"resuming {self.name} at step {global_step:,} of {self.args.total_timesteps:,}"
                   + new_episodes if self.checkpoint else
                   f"{self.name}: {self.args.total_timesteps:,} steps")
                  + f" on {self.device}\n  logs in {self.folder}/ (tensorboard --logdir "
                  f"{os.path.dirname(self.folder) or '.'}), checkpoint: {saved}", flush=True)
        self.start_time, self.start_step, self.last_print = time.time(), global_step, 0.0
        self.last_save = self.start_time
        self.interrupt = StopOnInterrupt()
        return global_step

    def open_logs(self, **sizes) -> None:
        """The run's TensorBoard writer (and, with --track, a W&B run that mirrors it), with the
        settings and the derived `sizes` as a table; none on ranks other than 0. After a resume,
        TensorBoard drops whatever the interrupted run logged past the checkpoint (purge_step)."""
        if self.rank != 0:
            return
        settings = {**asdict(self.args), **sizes}
        if self.args.track:
            import wandb

            try:
                wandb.init(project=self.args.wandb_project_name, entity=self.args.wandb_entity,
                           sync_tensorboard=True, config=settings, name=self.name, id=self.name,
                           resume="allow", save_code=True)
            except wandb.errors.Error as error:  # no API key, no network
                fail(self.variant, "--track could not start Weights & Biases "
                                   f"({str(error).splitlines()[0]}): log in with `wandb login`, or "
                                   "set WANDB_MODE=offline to keep the run on this machine")
        try:
            os.makedirs(self.folder, exist_ok=True)
            purge_step = self.checkpoint["global_step"] + 1 if self.checkpoint else None
            self.writer = SummaryWriter(self.folder, purge_step=purge_step)
            if self.folder in UNUSED_RUN_FOLDERS:  # a new run's: a refusal closes it first
                UNUSED_RUN_FOLDERS[self.folder] = self.writer.close
        except OSError as error:  # `runs` is a file, or a folder this user may not write to
            fail(self.variant, f"cannot write the run's logs to {self.folder!r} "
                               f"({error.strerror}): start the run in a folder where it can create "
                               "runs/, or remove what is in the way")
        self.writer.add_text("hyperparameters", text_table("param", "value", settings))
        self.writer.add_text("versions",
                             text_table("package", "version", software_versions(self.env_package)))

    def iterations(self):
        """The iterations still to run, from the first (or the one after the checkpoint's) to the
        last; after an iteration in which a stop signal came (Ctrl-C, SIGTERM, Slurm's SIGUSR1),
        which end_iteration finished, logged and saved, there are no more."""
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

    def record_step(self, global_step: int, episodes: list[tuple[float, int]]) -> None:
        """After each step of the rollout: log the `episodes` (score, length) that ended in it
        (`charts/episodic_return` and `charts/episodic_length`; under torchrun, rank 0 logs every
        rank's at the iteration's end), and print the progress line if nothing was printed for 5 s,
        so that a long rollout is not silent."""
        if self.world_size:
            self.episodes_of_this_iteration += [(global_step, *episode) for episode in episodes]
        else:
            for score, length in episodes:
                self.log_episode(global_step, score, length)
        self.print_progress(global_step)

    def log_episode(self, global_step: int, score: float, length: int) -> None:
        self.writer.add_scalar("charts/episodic_return", score, global_step)
        self.writer.add_scalar("charts/episodic_length", length, global_step)
        self.recent_returns.append(score)

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

    def end_iteration(self, iteration: int, global_step: int, update_means: dict[str, float],
                      values: np.ndarray, returns: np.ndarray, resumable: tuple | None = None,
                      charts: dict | None = None) -> None:
        """After each update: stop the run if it diverged; log the update's `update_means` (the
        losses, the approximate KL, the clip fraction), the learning rate, the explained variance of
        the `values` the rollout recorded against their `returns`, the SPS, and the script's own
        `charts` (as charts/<name>); print the progress line; and, when due, write the checkpoint,
        with `resumable` (where the rollout stands: the script's NamedTuple, each field under its
        name, which `resumed` gives back).

        Under torchrun every rank sends rank 0 its figures and the episodes that ended, once an
        iteration: rank 0 logs the world's (the means of the ranks' means, the explained variance
        over every rank's batch), and all ranks stop, or save, as soon as one of them would: a
        signal that reaches one rank late, or clocks a moment apart, must not split them (a rank
        that saved alone would wait forever for the others)."""
        UNUSED_RUN_FOLDERS.clear()  # from here the run's folder holds its iterations: kept
        episodes = []
        if self.world_size:
            reports = all_gathered({"means": update_means, "values": values, "returns": returns,
                                    "episodes": self.episodes_of_this_iteration,
                                    "stop": self.stop_requested, "save": self.save_minutes_passed},
                                   self.world_size)
            self.all_ranks_stop = any(report["stop"] for report in reports)
            self.all_ranks_save = any(report["save"] for report in reports)
            update_means = {key: np.mean([report["means"][key] for report in reports])
                            for key in update_means}
            values = np.concatenate([report["values"] for report in reports])
            returns = np.concatenate([report["returns"] for report in reports])
            episodes = sorted(episode for report in reports for episode in report["episodes"])
            self.episodes_of_this_iteration = []
        self.stop_if_diverged(global_step, update_means)
        if self.rank == 0:
            for episode in episodes:
                self.log_episode(*episode)
            self.writer.add_scalar("charts/learning_rate", self.optimizer.param_groups[0]["lr"],
                                   global_step)
            for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl",
                        "clipfrac"):
                self.writer.add_scalar(f"losses/{key}", update_means[key], global_step)
            self.writer.add_scalar("losses/explained_variance", explained_variance(values, returns),
                                   global_step)
            self.writer.add_scalar("charts/SPS", self.steps_per_second(global_step), global_step)
            for name, value in (charts or {}).items():
                self.writer.add_scalar(f"charts/{name}", value, global_step)
            self.print_progress(global_step, iteration)
        if self.checkpoint_due(iteration):
            self.save_checkpoint(iteration, global_step, resumable._asdict() if resumable else {})

    def checkpoint_due(self, iteration: int) -> bool:
        """With --save-model: at the end, every --save-interval iterations, when --save-minutes have
        passed since the last save, and when the run stops."""
        interval = self.args.save_interval
        by_the_clock = (self.save_minutes_passed if self.all_ranks_save is None
                        else self.all_ranks_save)
        by_the_count = interval > 0 and iteration % interval == 0
        return self.args.save_model and (self.stopping or iteration == self.num_iterations
                                         or by_the_clock or by_the_count)

    def save_checkpoint(self, iteration: int, global_step: int, rollout_state: dict) -> None:
        """Write what resuming needs: the settings, the weights, the optimizer, the random
        generators, the environments, the script's running statistics and its `rollout_state`,
        copied; under torchrun the ranks' own (their generators, environments and rollout state)
        gathered into lists, which rank 0 writes."""
        self.last_save = time.time()
        # never written over the last good checkpoint
        if not checkpoints.all_finite(self.agent.state_dict()):
            self.diverged(global_step, "the weights became non-finite")
        state = {"rng": checkpoints.rng_state(self.device),
                 **({} if self.envs is None else {"envs": checkpoints.save_envs(self.envs)}),
                 **{name: checkpoints.statistics_state(statistic)
                    for name, statistic in self.statistics.items()},
                 **{name: kept(value) for name, value in rollout_state.items()}}
        if self.world_size:
            ranks = all_gathered(state, self.world_size)
            state = {"world_size": self.world_size,
                     **{name: [rank[name] for rank in ranks] for name in state}}
        if self.rank == 0:
            self.last_good_checkpoint = (self.checkpoint_path, global_step)
            checkpoints.save_checkpoint(self.checkpoint_path, {
                "format": checkpoints.CHECKPOINT_FORMAT, "variant": self.variant,
                "args": asdict(self.args), "run_name": self.name, "iteration": iteration,
                "global_step": global_step, "model": self.agent.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "recent_returns": list(self.recent_returns), **state})

    def stop_if_diverged(self, global_step: int, update_means: dict[str, float]) -> None:
        """The divergence guard, after each update: when a loss, the gradient norm or a weight has
        become NaN or infinite, stop the run before it logs or saves anything of this update
        (Diverged, which `exits.run_and_exit` turns into one line and exit code DIVERGED). Once a
        weight is NaN, every action and every update after it is NaN too: going on would only fill
        the logs with NaN and, at the next save, write over the last good checkpoint."""
        for key, quantity in (("policy_loss", "the policy loss"), ("value_loss", "the value loss"),
                              ("entropy", "the entropy"), ("grad_norm", "the gradient norm")):
            if key in update_means and not math.isfinite(update_means[key]):
                self.diverged(global_step, f"{quantity} became {update_means[key]}")
        if not checkpoints.all_finite(self.agent.state_dict()):
            self.diverged(global_step, "the weights became non-finite")

    def diverged(self, global_step: int, what_happened: str) -> NoReturn:
        """Flush and close the logs, then raise Diverged with the line that says it all."""
        if self.rank == 0:
            self.close_logs()
        self.interrupt.restore()
        learning_rate, default = self.args.learning_rate, type(self.args)().learning_rate
        cause = (f"the learning rate {learning_rate:g} is {learning_rate / default:g} times the "
                 f"default ({default:g}): lower it" if learning_rate > 2 * default else
                 "a learning rate too high for this task, or rewards or observations too large "
                 "for the network: lower --learning-rate, or scale them")
        kept_file = ("no checkpoint was written" if self.last_good_checkpoint is None else
                     f"the last good checkpoint, {self.last_good_checkpoint[0]} (step "
                     f"{self.last_good_checkpoint[1]:,}), is kept")
        raise Diverged(f"at step {global_step:,}, {what_happened} in the update; likely cause: "
                       f"{cause}; {kept_file}")

    def finish(self, global_step: int, **summary) -> dict:
        """Flush and close the logs, then say what comes next: how to resume a stopped run, or where
        its checkpoint is. Until the logs are closed a stop signal is still the run's: the same
        request delivered again changes nothing, a second one stops at once. Returns a summary of
        the run for callers such as tests, with the script's own `summary`."""
        try:
            if self.rank == 0:
                self.close_logs()
        finally:
            self.interrupt.restore()
        if self.rank == 0 and not self.finished_earlier:  # start() said that it was finished
            if self.stopping:
                how = (f"resume with the same launch command and --resume {self.checkpoint_path}"
                       if self.world_size else
                       f"resume with: python ppo/{self.variant}.py --resume {self.checkpoint_path}")
                print(f"stopped at step {global_step:,}; " + (how if self.args.save_model else
                      "no checkpoint written (run with --save-model to be able to resume)"))
            elif self.args.save_model:
                print(f"checkpoint: {self.checkpoint_path}\nevaluate it with: python "
                      f"ppo/{self.variant}.py --evaluate {self.checkpoint_path}")
        return {"run_name": self.name, "global_step": global_step, "interrupted": self.stopping,
                "recent_returns": list(self.recent_returns), **summary}

    def close_logs(self) -> None:
        """Flush and close TensorBoard's log and, with --track, the W&B run."""
        self.writer.close()
        if self.args.track:
            import wandb

            # wandb.finish() takes seconds, and a Ctrl-C inside it crashes W&B's service and loses
            # the run's upload: a first Ctrl-C here only says so, a second one abandons the upload.
            print("saving the W&B run...", flush=True)
            still_saving = StopOnInterrupt("{signal}: W&B is still saving the run ({again} to "
                                           "abandon it)")
            wandb.finish()
            still_saving.restore()


def kept(value):
    """`value` as a checkpoint keeps it: arrays copied, tensors (alone or in a tuple) on the CPU."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if torch.is_tensor(value):
        return value.cpu()
    return tuple(map(kept, value)) if isinstance(value, tuple) else value


def explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """[Core 12: Debug variables] 1 - Var[target - predicted] / Var[target] of the values a rollout
    recorded against their returns: 1 is a perfect value function, 0 no better than a constant,
    negative worse than one; nan when the targets do not vary."""
    target_variance = np.var(target)
    if target_variance == 0:
        return np.nan
    return float(1 - np.var(target - predicted) / target_variance)


def finished_episodes(infos: dict) -> list[tuple[float, int]]:
    """(score, length) of every episode that ended in this step of a vector environment, as
    gymnasium's RecordEpisodeStatistics reports it (at the real end: the Atari wrappers put it below
    the lost-life and reward-clipping ones); the vector env files the report of a step that ended
    an episode under `final_info`."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    return [(float(final["episode"]["r"][i]), int(final["episode"]["l"][i]))
            for i in np.flatnonzero(final["_episode"])]


def all_gathered(item, world_size: int) -> list:
    """[item of rank 0, item of rank 1, ...] on every rank of a torchrun world (any picklable item).
    Used once per iteration, for what is logged and for the checkpoint, never per step."""
    if world_size == 1:
        return [item]
    items = [None] * world_size
    torch.distributed.all_gather_object(items, item)
    return items


def torchrun_process() -> tuple[int, int, int, int]:
    """Who this process is, as torchrun tells it in environment variables: its rank among all the
    processes (on all nodes), their number, its rank among those of its node, and their number.
    Without torchrun a script is a world of one process."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def check_world_sizes(args, variant: str, world_size: int) -> None:
    """Refuse sizes that the `world_size` processes of a data-parallel run cannot share: the world's
    --num-envs environments split evenly between them, and each one's share of the batch into
    --num-minibatches equal minibatches."""
    if args.num_envs % world_size != 0:
        fail(variant, f"--num-envs {args.num_envs} does not split evenly between {world_size} "
                      f"processes: make it a multiple of {world_size} or start another number of "
                      "processes")
    local_batch_size = args.num_envs // world_size * args.num_steps
    if local_batch_size % args.num_minibatches != 0:
        fail(variant, f"each process's share of the batch, --num-envs / {world_size} processes x "
                      f"--num-steps = {local_batch_size}, does not divide into --num-minibatches "
                      f"{args.num_minibatches} equal minibatches: pick sizes for which it does")


def device_of_rank(variant: str, cuda: bool, device_ids: list[int], backend: str, local_rank: int,
                   local_world_size: int) -> torch.device:
    """The device of a torchrun process: a GPU from `device_ids` (or GPU local_rank, modulo the GPUs
    there are) when CUDA is there and wanted, else the CPU. Refuses settings that cannot work."""
    if device_ids and len(device_ids) != local_world_size:
        fail(variant, f"--device-ids names {len(device_ids)} GPUs for the {local_world_size} "
                      f"processes of this node: give one id per process (torchrun "
                      f"--nproc-per-node {len(device_ids)}, or {local_world_size} ids)")
    use_cuda = cuda and torch.cuda.is_available()
    if backend == "nccl" and not use_cuda:
        why = "--no-cuda was given" if not cuda else "no CUDA GPU is available"
        fail(variant, f"--backend nccl needs a CUDA GPU per process, but {why}: use --backend gloo")
    if not use_cuda:
        return torch.device("cpu")
    device_ids = device_ids or [i % torch.cuda.device_count() for i in range(local_world_size)]
    if max(device_ids) >= torch.cuda.device_count() or min(device_ids) < 0:
        fail(variant, f"--device-ids {' '.join(map(str, device_ids))}: this node has GPUs 0 to "
                      f"{torch.cuda.device_count() - 1}")
    if backend == "nccl" and len(set(device_ids)) < len(device_ids):
        fail(variant, f"nccl cannot run two processes on one GPU (GPUs "
                      f"{' '.join(map(str, device_ids))}): use --backend gloo to share GPUs, or "
                      "one process per GPU")
    return torch.device("cuda", device_ids[local_rank])


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
        env_fns = checkpoints.restored_envs(env_fns, saved_envs)
    with command_line.packages_checked(env_id, variant):
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


class Evaluation:
    """--evaluate: the flags checked, the device, the videos' folder and the seeds of an evaluation,
    the saved agent (`load`), and the episodes it plays (`play`), each score printed as the episode
    ends and their mean and standard deviation at the end."""

    def __init__(self, args, variant: str, checkpoint: dict):
        command_line.check_args(args, variant)
        if not checkpoints.all_finite(checkpoint["model"]):
            fail(variant, f"{args.evaluate!r} holds non-finite weights (NaN or infinite: the run "
                          "diverged): evaluate a checkpoint saved before it diverged")
        self.args, self.checkpoint, self.scores = args, checkpoint, []
        self.device = choose_device(args, variant)
        self.video_folder = f"videos/{checkpoint['run_name']}-eval"
        if args.capture_video:
            videos.render_off_screen()
        # Seeds unlike any training seed, so the scores come from episodes the agent never trained
        # on.
        self.seed = args.seed + 100_000

    def load(self, agent: torch.nn.Module) -> torch.nn.Module:
        """The agent with the checkpoint's weights (and whatever else its state_dict holds), on the
        device, its actions drawn from --seed."""
        agent.load_state_dict(self.checkpoint["model"])
        agent.to(self.device).eval()
        torch.manual_seed(self.args.seed)
        return agent

    def play(self, envs: gym.vector.VectorEnv, policy: Callable, state=None,
             infos_too: bool = False) -> list[float]:
        """Play --eval-episodes episodes in `envs` (one environment, reset on the evaluation's seed)
        with `policy(obs, done)`, which returns the actions for an observation (`done`: whether the
        step before it ended an episode, as training's next_done). A recurrent policy is given its
        `state` too, from the one passed here, and returns its next state with the actions; a
        policy that reads the environments' infos (an action mask), with `infos_too`, is given
        them. Each episode's score is what RecordEpisodeStatistics reports (`finished_episodes`).
        Returns the scores."""
        obs, infos = envs.reset(seed=self.seed)
        done = np.zeros(envs.num_envs, dtype=bool)
        while self.playing:
            with torch.inference_mode():
                if state is not None:
                    action, state = policy(obs, done, state)
                else:
                    action = policy(obs, done, infos) if infos_too else policy(obs, done)
            obs, _, terminated, truncated, infos = envs.step(action)
            done = terminated | truncated
            for score, length in finished_episodes(infos):
                self.episode_ended(score, length)
        envs.close()
        return self.report()

    @property
    def playing(self) -> bool:
        return len(self.scores) < self.args.eval_episodes

    def episode_ended(self, score: float, length: int | None = None) -> None:
        self.scores.append(float(score))
        print(f"episode {len(self.scores)}: return {score:.1f}"
              + ("" if length is None else f" ({length} steps)"))

    def report(self) -> list[float]:
        print(f"{self.args.env_id}: mean return {np.mean(self.scores):.2f} +- "
              f"{np.std(self.scores):.2f} over {len(self.scores)} episodes")
        if self.args.capture_video:
            print(f"videos in {self.video_folder}/")
        return self.scores
