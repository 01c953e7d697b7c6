"""A run's life, from its start line to its last word: its name and folder, device and seeds, the
TensorBoard and W&B logs, the progress line, the stop signals, the checkpoints it writes and the
divergence guard; the speed options (torch.compile, CUDA graphs, environments in worker
processes); and the evaluation of a saved agent.
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
from dataclasses import asdict
from typing import Callable, NoReturn

import gymnasium as gym
import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

import checkpoints
from exits import STOP_SIGNALS, UNUSED_RUN_FOLDERS, Diverged, StoppedAtOnce, fail, signal_name

# A second stop signal this soon after the first is the same request arriving twice, not a second
# one: Slurm signals every process of a task, and the runner or torchrun above the run passes it on.
SAME_REQUEST_SECONDS = 1.0


def record_video(env: gym.Env, folder: str, episodes: int | None = None) -> gym.Env:
    """`env` filmed into `folder` on gymnasium's schedule: episodes 0, 1, 8, 27, ..., 1000, 2000,
    ...; an evaluation of `episodes` episodes films none past its last (the reset after it starts
    one)."""
    trigger = None
    if episodes is not None:
        from gymnasium.utils.save_video import capped_cubic_video_schedule as schedule

        trigger = lambda episode: episode < episodes and schedule(episode)  # noqa: E731
    return gym.wrappers.RecordVideo(env, folder, episode_trigger=trigger)


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
    a folder. Until the run writes its logs there, `fail` removes it (exits.UNUSED_RUN_FOLDERS)."""
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
        UNUSED_RUN_FOLDERS.append(os.path.join("runs", candidate))
        if attempt > 1:
            print(f"runs/{name} is another run's (started in the same second): this run is "
                  f"{candidate}", flush=True)
        return candidate
    fail(variant, f"runs/{name} and its next 998 alternatives are all taken: clean up runs/")


class Run:
    """One training run: its name, folder, device and seeds, then its logs, clock, progress line and
    Ctrl-C, the checkpoints it writes, and what it says at the end.

    A new run is named `<env_id>__<exp_name>__<seed>__<unix time>` and keeps its TensorBoard log and
    checkpoint in runs/<name>/. A resumed run (`checkpoint`, read by parse_args) keeps its name and
    goes on in the folder of the checkpoint it was given, from wherever it is started. `seed`
    defaults to --seed (the multi-GPU script seeds each rank apart); under torchrun only rank 0
    logs, prints and writes the checkpoint. `env_package` is the package the script's environments
    come from, whose release the run records with PyTorch's, gymnasium's and NumPy's."""

    def __init__(self, args, variant: str, checkpoint: dict | None, num_iterations: int,
                 device: torch.device | None = None, rank: int = 0, seed: int | None = None,
                 env_package: str | None = None):
        self.args, self.variant, self.checkpoint, self.num_iterations, self.rank = \
            args, variant, checkpoint, num_iterations, rank
        self.env_package = env_package
        self.device = choose_device(args, variant, device)
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
        if args.track:
            try:
                # Checked now, before anything is built; W&B starts in open_logs.
                import wandb  # noqa: F401
            except ImportError:
                fail(variant, "--track needs wandb: pip install wandb")
        # A resumed run overwrites the random generators' states with the checkpoint's in `start`.
        seed_everything(args.seed if seed is None else seed, args.torch_deterministic)
        self.writer, self.interrupt, self.finished_earlier, self.last_save = None, None, False, 0.0
        # Under torchrun the ranks decide together, once an iteration, whether to stop and whether
        # to save by the clock (the multi-GPU script sets these two); None: this process decides
        # alone.
        self.all_ranks_stop: bool | None = None
        self.all_ranks_save: bool | None = None
        # The newest checkpoint of this run on disk, and its step: what a diverged run leaves
        # behind.
        self.last_good_checkpoint = (args.resume, checkpoint["global_step"]) if checkpoint else None

    def open_logs(self, **sizes) -> SummaryWriter | None:
        """The run's TensorBoard writer (and, with --track, a W&B run that mirrors it), with the
        settings and the derived `sizes` as a table; None on ranks other than 0. After a resume,
        TensorBoard drops whatever the interrupted run logged past the checkpoint (purge_step)."""
        if self.rank != 0:
            return None
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
        UNUSED_RUN_FOLDERS.clear()  # the run's folder is in use from here on
        try:
            os.makedirs(self.folder, exist_ok=True)
            purge_step = self.checkpoint["global_step"] + 1 if self.checkpoint else None
            self.writer = SummaryWriter(self.folder, purge_step=purge_step)
        except OSError as error:  # `runs` is a file, or a folder this user may not write to
            fail(self.variant, f"cannot write the run's logs to {self.folder!r} "
                               f"({error.strerror}): start the run in a folder where it can create "
                               "runs/, or remove what is in the way")
        self.writer.add_text("hyperparameters", text_table("param", "value", settings))
        self.writer.add_text("versions",
                             text_table("package", "version", software_versions(self.env_package)))
        return self.writer

    def start(self, agent: torch.nn.Module, optimizer: torch.optim.Optimizer,
              new_episodes: bool = False) -> tuple[int, int]:
        """Just before the first iteration: restore a resumed run's weights, optimizer and random
        generators (and say so; `new_episodes`: it could not go on with the saved ones), then start
        the clock and the Ctrl-C handler. Returns the last iteration done and the environment steps
        so far."""
        iteration, global_step = 0, 0
        if self.checkpoint:
            agent.load_state_dict(self.checkpoint["model"])
            optimizer.load_state_dict(self.checkpoint["optimizer"])
            rng = self.checkpoint["rng"]
            checkpoints.restore_rng(rng[self.rank] if isinstance(rng, list) else rng, self.device)
            iteration, global_step = self.checkpoint["iteration"], self.checkpoint["global_step"]
            self.finished_earlier = iteration >= self.num_iterations
        if self.rank == 0 and self.finished_earlier:
            print(f"{self.name} is already finished ({global_step:,} of "
                  f"{self.args.total_timesteps:,} steps): evaluate it with: python "
                  f"ppo/{self.variant}.py --evaluate {self.checkpoint_path}")
        # the start line: what runs where, and where its logs and checkpoint go
        elif self.rank == 0:
            saved = (self.checkpoint_path if self.args.save_model
                     else "none (--save-model keeps one)")
            print((f"resuming {self.name} at step {global_step:,} of {self.args.total_timesteps:,}"
                   + (" (with new episodes)" if new_episodes else "") if self.checkpoint else
                   f"{self.name}: {self.args.total_timesteps:,} steps")
                  + f" on {self.device}\n  logs in {self.folder}/ (tensorboard --logdir "
                  f"{os.path.dirname(self.folder) or '.'}), checkpoint: {saved}", flush=True)
        self.start_time, self.start_step, self.last_print = time.time(), global_step, 0.0
        self.last_save = self.start_time
        self.interrupt = StopOnInterrupt()
        return iteration, global_step

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

    def print_progress(self, global_step: int, recent_returns,
                       iteration: int | None = None) -> None:
        """`step N/TOTAL | SPS | time elapsed and left | mean return (last K episodes)`. After an
        iteration (`iteration` given): the first time, then at most every 2 s, and always after the
        last iteration and when the run stops. Within a rollout: when nothing was printed for 5 s,
        so that a long rollout is not silent."""
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
        mean_return = f"{np.mean(recent_returns):8.2f}" if recent_returns else "     n/a"
        print(f"step {global_step:>{max(len(total), 9)},}/{total} | {sps:>6,} SPS | "
              f"{clock(now - self.start_time)} elapsed, {left} left | mean return {mean_return} "
              f"(last {len(recent_returns)} episodes)", flush=True)

    def checkpoint_due(self, iteration: int) -> bool:
        """With --save-model: at the end, every --save-interval iterations, when --save-minutes have
        passed since the last save, and when the run stops."""
        interval = self.args.save_interval
        by_the_clock = (self.save_minutes_passed if self.all_ranks_save is None
                        else self.all_ranks_save)
        by_the_count = interval > 0 and iteration % interval == 0
        return self.args.save_model and (self.stopping or iteration == self.num_iterations
                                         or by_the_clock or by_the_count)

    def save_checkpoint(self, iteration: int, global_step: int, agent: torch.nn.Module,
                        optimizer: torch.optim.Optimizer, **loop_state) -> None:
        """Write what resuming needs: the settings, the weights, the optimizer, the random
        generators (unless `loop_state` brings its own, as one per rank) and the script's
        `loop_state` (where the environments stand, statistics...). Only rank 0 writes."""
        self.last_save = time.time()
        # never written over the last good checkpoint
        if not checkpoints.all_finite(agent.state_dict()):
            self.diverged(global_step, "the weights became non-finite")
        if self.rank == 0:
            self.last_good_checkpoint = (self.checkpoint_path, global_step)
            checkpoints.save_checkpoint(self.checkpoint_path, {
                "format": checkpoints.CHECKPOINT_FORMAT, "variant": self.variant,
                "args": asdict(self.args), "run_name": self.name,
                "iteration": iteration, "global_step": global_step, "model": agent.state_dict(),
                "optimizer": optimizer.state_dict(), "rng": checkpoints.rng_state(self.device),
                **loop_state})

    def stop_if_diverged(self, global_step: int, update_means: dict[str, float],
                         agent: torch.nn.Module) -> None:
        """The divergence guard, after each update: when a loss, the gradient norm or a weight has
        become NaN or infinite, stop the run before it logs or saves anything of this update
        (Diverged, which `exits.run_and_exit` turns into one line and exit code DIVERGED). Once a
        weight is NaN, every action and every update after it is NaN too: going on would only fill
        the logs with NaN and, at the next save, write over the last good checkpoint."""
        for key, quantity in (("policy_loss", "the policy loss"), ("value_loss", "the value loss"),
                              ("entropy", "the entropy"), ("grad_norm", "the gradient norm")):
            if key in update_means and not math.isfinite(update_means[key]):
                self.diverged(global_step, f"{quantity} became {update_means[key]}")
        if not checkpoints.all_finite(agent.state_dict()):
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
        kept = ("no checkpoint was written" if self.last_good_checkpoint is None else
                f"the last good checkpoint, {self.last_good_checkpoint[0]} (step "
                f"{self.last_good_checkpoint[1]:,}), is kept")
        raise Diverged(f"at step {global_step:,}, {what_happened} in the update; likely cause: "
                       f"{cause}; {kept}")

    def finish(self, global_step: int, how_to_resume: str | None = None) -> None:
        """Flush and close the logs, then say what comes next: how to resume a stopped run, or where
        its checkpoint is. Until the logs are closed a stop signal is still the run's: the same
        request delivered again changes nothing, a second one stops at once."""
        try:
            if self.rank == 0:
                self.close_logs()
        finally:
            self.interrupt.restore()
        if self.rank != 0 or self.finished_earlier:  # start() said that it was finished
            return
        if self.stopping:
            how = how_to_resume or (f"resume with: python ppo/{self.variant}.py --resume "
                                    f"{self.checkpoint_path}")
            print(f"stopped at step {global_step:,}; " + (how if self.args.save_model else
                  "no checkpoint written (run with --save-model to be able to resume)"))
        elif self.args.save_model:
            print(f"checkpoint: {self.checkpoint_path}\nevaluate it with: python "
                  f"ppo/{self.variant}.py --evaluate {self.checkpoint_path}")

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


def compiled(args, *functions: Callable) -> tuple[Callable, ...]:
    """The functions as they are, or compiled by torch.compile with --compile, and also replayed as
    CUDA graphs with --cudagraphs (torch.compile's reduce-overhead mode). A replay writes its
    outputs where the previous replay of the same graph wrote them, so each call is marked as a new
    step, and what a caller keeps past the next call it copies first."""
    if not (args.compile or args.cudagraphs):
        return functions
    mode = "reduce-overhead" if args.cudagraphs else "default"
    functions = tuple(torch.compile(function, mode=mode) for function in functions)
    return tuple(map(marked_as_a_new_step, functions)) if args.cudagraphs else functions


def marked_as_a_new_step(function: Callable) -> Callable:
    """`function`, each call of which tells the CUDA graphs that a new step begins: the outputs of
    the graphs' previous replays may be overwritten from here on."""
    def call(*inputs, **options):
        torch.compiler.cudagraph_mark_step_begin()
        return function(*inputs, **options)

    return call


def async_vector_env(env_fns: list[Callable[[], gym.Env]],
                     prepare_worker: Callable[[], None]) -> gym.vector.AsyncVectorEnv:
    """--async-envs: each environment in a worker process of its own, all stepping at once, the
    observations coming back through shared memory; SAME_STEP autoreset, as the scripts' sync envs.
    forkserver: the workers start from a clean process, not a copy of this one with its threads.
    Each worker calls `prepare_worker` (the script's) before it builds its environment.
    AsyncVectorEnv builds one environment here too, for the spaces: this process's signal handlers
    are kept."""
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    envs = gym.vector.AsyncVectorEnv(
        [functools.partial(in_worker, make_env, prepare_worker) for make_env in env_fns],
        shared_memory=True, context="forkserver", autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    return envs


def in_worker(make_env: Callable[[], gym.Env], prepare_worker: Callable[[], None]) -> gym.Env:
    """Build an environment in a worker process of --async-envs. Ctrl-C reaches every process of the
    terminal's group, and a Slurm task's end or torchrun's SIGTERM every process of the run, but
    they are the main process's to handle (finish the iteration, save): the worker ignores them, and
    ends when the main process closes the environments."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    prepare_worker()
    # AsyncVectorEnv built the first environment once in the main process too, for its spaces; with
    # video that made the (new) folder, which RecordVideo here would warn of as if it held old
    # videos.
    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
    return make_env()


class Evaluation:
    """--evaluate: the device, the videos' folder and the seeds of an evaluation, and the scores of
    the episodes it plays, each printed as it ends and their mean and standard deviation at the
    end."""

    def __init__(self, args, variant: str, checkpoint: dict):
        if not checkpoints.all_finite(checkpoint["model"]):
            fail(variant, f"{args.evaluate!r} holds non-finite weights (NaN or infinite: the run "
                          "diverged): evaluate a checkpoint saved before it diverged")
        self.args, self.checkpoint, self.scores = args, checkpoint, []
        self.device = choose_device(args, variant)
        self.video_folder = f"videos/{checkpoint['run_name']}-eval"
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

