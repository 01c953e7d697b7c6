"""A run's checkpoint: what it holds, declared once (Checkpoint), written atomically and read as
data, so that reading one runs no code it names."""

import contextlib
import os
import random
from dataclasses import dataclass, fields

import numpy as np
import torch
from gymnasium.wrappers.utils import RunningMeanStd

from ppo_utils.exits import WrongInput

# Each change of what a checkpoint holds raises FORMAT; an earlier format is refused, naming the
# last commit whose scripts read it.
FORMAT = 3
LAST_COMMIT_READING = {1: "3e60c83", 2: "3e60c83"}


@dataclass
class ProcessState:
    """What one process keeps of its own; under torchrun, each rank's."""

    rng: dict  # Python's, NumPy's and PyTorch's (and CUDA's) random generators
    rollout: dict  # where the script's rollout stood: its Rollout's fields
    envs: list | None  # each environment's state (env_states); None: the resumed run plays anew
    statistics: dict  # the script's running statistics, by name (a reward scaler's)


MODEL_FILE = "model.pt"  # an exported agent's checkpoint, in its folder (model_folder)


@dataclass
class Checkpoint:
    """What resuming a run needs; an evaluation reads the first four."""

    variant: str  # the script that wrote it: the others refuse it
    args: dict  # the run's settings: the defaults of --resume and --evaluate
    run_name: str
    model: dict  # the agent's state_dict
    optimizer: dict
    iteration: int
    global_step: int
    recent_returns: list  # the latest episodes' scores, which the progress line averages
    processes: list[ProcessState]  # one, or one per torchrun rank

    def write(self, path: str) -> None:
        state = {field.name: getattr(self, field.name) for field in fields(self)}
        write_atomically(path, {"format": FORMAT, **state,
                                "processes": [vars(process) for process in self.processes]})

    @classmethod
    def read(cls, path: str, variant: str) -> "Checkpoint":
        """The checkpoint at `path`, which the script `variant` wrote, read as data; `path` may be
        an exported agent's folder (--export), which holds it as MODEL_FILE."""
        if os.path.isdir(path):
            path = os.path.join(path, MODEL_FILE)
        if not os.path.isfile(path):
            several_nodes = int(os.environ.get("WORLD_SIZE", "1")) > int(
                os.environ.get("LOCAL_WORLD_SIZE", "1"))
            raise WrongInput(f"no checkpoint at {path!r}"
                             + (" (every node needs it, at this path)" if several_nodes else ""))
        saved = read_data(path)
        if not isinstance(saved, dict) or not isinstance(saved.get("args"), dict):
            raise WrongInput(f"{path!r} is not a checkpoint of this collection")
        if saved.get("variant") != variant:
            raise WrongInput(f"{path!r} was written by {saved.get('variant')}.py: use "
                             f"ppo/{saved.get('variant')}.py for it")
        written = saved.get("format", 1)
        if written != FORMAT:
            last = LAST_COMMIT_READING.get(written)
            raise WrongInput(f"{path!r} has checkpoint format {written}, which this version of the "
                             f"scripts does not read: " + (
                                 f"resume or evaluate it with those of commit {last} (git checkout "
                                 f"{last})" if last else "use the version that wrote it"))
        try:
            return cls(**{field.name: saved[field.name] for field in fields(cls)
                          if field.name != "processes"},
                       processes=[ProcessState(**process) for process in saved["processes"]])
        except (KeyError, TypeError) as error:
            raise WrongInput(f"{path!r} is not a whole checkpoint ({error})") from None


def numpy_types() -> list:
    """What a checkpoint may hold beside tensors, containers, numbers and text: NumPy's arrays and
    scalars of numbers, by NumPy 1's and 2's names; `bytes`, which an empty one pickles as."""
    try:
        from numpy._core import multiarray
    except ImportError:  # NumPy before 1.26
        from numpy.core import multiarray
    allowed = [bytes, np.ndarray,
               np.dtype] + [type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"]
    for function in (multiarray._reconstruct, multiarray.scalar):
        allowed += [(function, f"numpy.{core}.multiarray.{function.__name__}")
                    for core in ("core", "_core")]
    return allowed


def read_data(path: str):
    """torch.load(weights_only=True) with `numpy_types`: a file that names anything else (a function
    to call, a class to build) is refused in one line that names it."""
    with torch.serialization.safe_globals(numpy_types()):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds of errors for a file it cannot read
            lines = [line.strip() for line in str(error).splitlines()
                     if line.strip()] or [type(error).__name__]
            try:
                found = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            except Exception:  # not a file that torch.save wrote
                raise WrongInput(f"cannot read checkpoint {path!r}: {lines[0]}") from None
    if found:
        held = f"{', '.join(found)}, which loading it would call or build"
    elif lines[0].startswith("Weights only load failed") and len(lines) > 2:
        held = f"what a checkpoint never holds ({lines[-2]})"  # torch's reason, amid its advice
    else:
        raise WrongInput(f"cannot read checkpoint {path!r}: {lines[0]}")
    raise WrongInput(f"refusing {path!r}: it holds {held}; the checkpoints of these scripts hold "
                     "only tensors, arrays, numbers and text, so this file was made otherwise or "
                     "altered")


def write_atomically(path: str, state: dict) -> None:
    """Replace `path` atomically: a process killed while writing, or stopped by a second Ctrl-C,
    leaves the previous checkpoint whole and nothing beside it. The new one is written to a file
    without a name (Linux's O_TMPFILE), which dies with the process, named once complete; elsewhere
    to `<path>.tmp`, removed on failure."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    temporary = f"{path}.tmp"
    try:
        descriptor, unnamed = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o666), True
    except (AttributeError, OSError):  # not Linux, or a file system without unnamed files
        flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
        descriptor, unnamed = os.open(temporary, flags, 0o666), False
    try:
        with open(descriptor, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
            if unnamed:
                name_file(file.fileno(), temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def name_file(descriptor: int, path: str) -> None:
    """Name the unnamed file open at `descriptor` `path`, through /proc's link to it."""
    with contextlib.suppress(FileNotFoundError):  # left by a save killed just here
        os.remove(path)
    descriptors = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:  # linkat, following /proc's link to the file (link() would link the link)
        os.link(str(descriptor), path, src_dir_fd=descriptors, follow_symlinks=True)
    finally:
        os.close(descriptors)


def all_finite(state: dict) -> bool:
    """Whether no floating-point tensor of a state_dict holds NaN or an infinity."""
    return all(bool(torch.isfinite(value).all()) for value in state.values()
               if isinstance(value, torch.Tensor) and value.is_floating_point())


def statistics_state(statistics: RunningMeanStd) -> dict:
    return {"mean": statistics.mean.copy(), "var": statistics.var.copy(), "count": statistics.count}


def restore_statistics(statistics: RunningMeanStd, state: dict) -> None:
    statistics.mean, statistics.var, statistics.count = (state["mean"].copy(), state["var"].copy(),
                                                         state["count"])


def rng_state(device: torch.device) -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
