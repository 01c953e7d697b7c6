"""A run's name, folder and logs: runs/<name>/ claimed for it, TensorBoard's log there (with
--track mirrored to W&B) with the settings and releases as tables, and what the run says at start
and end."""

import contextlib
import os
import shlex
import sys
import time

from torch.utils.tensorboard import SummaryWriter

from ppo_utils.exits import StopOnInterrupt, WrongInput

# The packages whose release can change what a run learns, with the script's `env_package`:
# MuJoCo 3.5.0, for one, changed Hopper's contacts.
CORE_PACKAGES = ("torch", "gymnasium", "numpy")
# The script's path as its command line gave it (command_line.run_script sets it), which the
# commands a run prints begin with; None where main() is called from Python: ppo/<variant>.py.
script_as_run: str | None = None


def text_table(key_header: str, value_header: str, rows: dict) -> str:
    """A two-column markdown table for TensorBoard's text tab (benchmark/report.py reads it)."""
    rows_text = "\n".join(f"|{key}|{value}|" for key, value in rows.items())
    return f"|{key_header}|{value_header}|\n|-|-|\n" + rows_text


def software_versions(env_package: str | None) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    releases = {"python": sys.version.split()[0]}
    for distribution in CORE_PACKAGES + ((env_package,) if env_package else ()):
        with contextlib.suppress(PackageNotFoundError):
            releases[distribution] = version(distribution)
    return releases


def cannot_write(folder: str, error: OSError) -> WrongInput:
    return WrongInput(f"cannot write the run's logs to {folder!r} ({error.strerror}): start the "
                      "run in a folder where it can create runs/, or remove what is in the way")


def claim_run_folder(name: str) -> str:
    """Make runs/<name> and return the name. os.mkdir is atomic: of two runs started in the same
    second with the same settings (a tuner's workers), one takes <name>, the other <name>-2."""
    try:
        os.makedirs("runs", exist_ok=True)
    except OSError as error:  # `runs` is a file, or a folder we may not write
        raise cannot_write(os.path.join("runs", name), error) from None
    for attempt in range(1, 1000):
        candidate = name if attempt == 1 else f"{name}-{attempt}"
        try:
            os.mkdir(os.path.join("runs", candidate))
        except FileExistsError:
            continue
        except OSError as error:
            raise cannot_write(os.path.join("runs", candidate), error) from None
        if attempt > 1:
            print(f"runs/{name} is another run's (started in the same second): this run is "
                  f"{candidate}", flush=True)
        return candidate
    raise WrongInput(f"runs/{name} and its next 998 alternatives are all taken: clean up runs/")


def command(variant: str, flag: str, path: str) -> str:
    """The command that goes on with a checkpoint (or an exported agent) at `path`, to paste into
    the shell the run was started from: the script's path as it was run, the checkpoint's from
    there (an evaluation plays in one process, a resumed torchrun run in as many as before)."""
    if flag == "--resume" and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun's ranks
        return f"the same torchrun command with --resume {shlex.quote(path)}"
    script = script_as_run or f"ppo/{variant}.py"
    return f"python {shlex.quote(script)} {flag} {shlex.quote(path)}"


class RunLogs:
    """The logs of one run, written by rank 0: a new run's in
    runs/<env_id>__<exp_name>__<seed>__<unix time>/, claimed when they open; a resumed run's in the
    folder of its checkpoint, under its name."""

    def __init__(self, args, checkpoint, rank: int = 0, env_package: str | None = None):
        self.args, self.checkpoint, self.rank = args, checkpoint, rank
        self.env_package = env_package
        if checkpoint:
            self.name, self.folder = checkpoint.run_name, os.path.dirname(args.resume) or "."
        else:  # ALE/Pong-v5 -> ALE-Pong-v5, mymodule:MyEnv-v0 -> mymodule-MyEnv-v0: a folder's name
            env_name = args.env_id.replace("/", "-").replace(":", "-")
            self.name = f"{env_name}__{args.exp_name}__{args.seed}__{int(time.time())}"
            self.folder = f"runs/{self.name}"
        self.writer = None

    def check_track(self) -> None:
        if self.args.track:
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise WrongInput("--track needs wandb: pip install wandb") from None

    def open(self, settings: dict) -> None:
        """Claim a new run's folder, start TensorBoard's writer (and W&B) with the `settings` as a
        table. Resumed, TensorBoard drops what the run logged past its checkpoint (purge_step)."""
        if self.rank != 0:
            return
        if not self.checkpoint:
            self.name = claim_run_folder(self.name)
            self.folder = f"runs/{self.name}"
        if self.args.track:
            import wandb

            try:
                wandb.init(project=self.args.wandb_project_name, entity=self.args.wandb_entity,
                           sync_tensorboard=True, config=settings, name=self.name, id=self.name,
                           resume="allow", save_code=True)
            except wandb.errors.Error as error:  # no API key, no network
                if not self.checkpoint:  # the folder just claimed, still empty
                    os.rmdir(self.folder)
                    with contextlib.suppress(OSError):  # other runs' are there
                        os.rmdir("runs")
                raise WrongInput("--track could not start Weights & Biases "
                                 f"({str(error).splitlines()[0]}): log in with `wandb login`, or "
                                 "set WANDB_MODE=offline to keep the run on this machine") from None
        try:
            os.makedirs(self.folder, exist_ok=True)
            purge_step = self.checkpoint.global_step + 1 if self.checkpoint else None
            self.writer = SummaryWriter(self.folder, purge_step=purge_step)
        except OSError as error:  # `runs` is a file, or a folder this user may not write to
            raise cannot_write(self.folder, error) from None
        self.writer.add_text("hyperparameters", text_table("param", "value", settings))
        self.writer.add_text("versions",
                             text_table("package", "version", software_versions(self.env_package)))

    def command(self, flag: str, checkpoint_path: str) -> str:
        return command(self.args.variant, flag, checkpoint_path)

    def say_start(self, global_step: int, finished: bool, checkpoint_path: str,
                  new_episodes: bool, device) -> None:
        """What runs where, where its logs and checkpoint go; or that the run is `finished`."""
        total = f"{self.args.total_timesteps:,}"
        if finished:
            print(f"{self.name} is already finished ({global_step:,} of {total} steps): evaluate "
                  f"it with: {self.command('--evaluate', checkpoint_path)}")
            return
        saved = checkpoint_path if self.args.save_model else "none (--save-model keeps one)"
        new_episodes = " (with new episodes)" if new_episodes else ""
        print((f"resuming {self.name} at step {global_step:,} of {total}" + new_episodes
               if self.checkpoint else f"{self.name}: {total} steps")
              + f" on {device}\n  logs in {self.folder}/ (tensorboard --logdir "
              f"{os.path.dirname(self.folder) or '.'}), checkpoint: {saved}", flush=True)

    def say_end(self, global_step: int, stopped: bool, checkpoint_path: str) -> None:
        if stopped:
            print(f"stopped at step {global_step:,}; " + (
                f"resume with: {self.command('--resume', checkpoint_path)}" if self.args.save_model
                else "no checkpoint written (run with --save-model to be able to resume)"))
        elif self.args.save_model:
            print(f"checkpoint: {checkpoint_path}\nevaluate it with: "
                  f"{self.command('--evaluate', checkpoint_path)}")

    def log_episode(self, global_step: int, score: float, length: int) -> None:
        self.writer.add_scalar("charts/episodic_return", score, global_step)
        self.writer.add_scalar("charts/episodic_length", length, global_step)

    def log_update(self, global_step: int, learning_rate: float, update_means: dict[str, float],
                   explained_variance: float, steps_per_second: int, charts: dict | None) -> None:
        self.writer.add_scalar("charts/learning_rate", learning_rate, global_step)
        for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl",
                    "clipfrac"):
            self.writer.add_scalar(f"losses/{key}", update_means[key], global_step)
        self.writer.add_scalar("losses/explained_variance", explained_variance, global_step)
        self.writer.add_scalar("charts/SPS", steps_per_second, global_step)
        for name, value in (charts or {}).items():
            self.writer.add_scalar(f"charts/{name}", value, global_step)

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        if self.args.track:
            import wandb

            # wandb.finish() takes seconds, and a Ctrl-C in it loses the upload: a first one here
            # only says so, a second abandons it.
            print("saving the W&B run...", flush=True)
            still_saving = StopOnInterrupt("{signal}: W&B is still saving the run ({again} to "
                                           "abandon it)")
            wandb.finish()
            still_saving.restore()
