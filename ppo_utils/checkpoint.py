"""Checkpoints, as data: what a run writes to continue later, how a checkpoint is read without
running any code it names, and the random generators' and running statistics' state it holds. The
environments' state is env_states.py's; checkpoints of earlier formats are brought to this one as
they are read, by old_checkpoints.py.
"""

import contextlib
import os
import random

import numpy as np
from gymnasium.wrappers.utils import RunningMeanStd
import torch

from ppo_utils import old_checkpoints
from ppo_utils.exits import fail


# The format of the checkpoints written here: 2, data only. A checkpoint is read with torch.load's
# weights_only=True, which builds tensors, plain containers, numbers, strings and bytes, and of
# other types only those allowed here (NumPy's arrays and scalars of numbers): reading it runs no
# code that the file names. A checkpoint without "format" is of the older format, whose environments
# were pickled Python objects (see old_checkpoints.py).
CHECKPOINT_FORMAT = 2
# What an evaluation reads of a checkpoint: the weights, with the statistics the agent owns (they
# are in its state_dict), and the settings.
EVALUATION_KEYS = ("variant", "args", "run_name", "model")


def numpy_types() -> list:
    """The NumPy types a checkpoint may hold besides tensors: arrays and scalars of booleans and
    numbers (random-generator states, statistics, observations, the environments' arrays), allowed
    under the names both NumPy 1 and NumPy 2 pickle them with. Arrays of Python objects stay
    refused. And `bytes`, which torch.save's pickle protocol calls for an empty bytes (an empty
    array's data)."""
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


def read_data(path: str, variant: str):
    """The checkpoint at `path`, read as data: torch.load(weights_only=True) with the NumPy types of
    `numpy_types`. A file that names anything else (a function that unpickling would call, a class
    it would build) is refused in one line that names it."""
    with torch.serialization.safe_globals(numpy_types()):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds of errors for a file it cannot read
            lines = [line.strip() for line in str(error).splitlines()
                     if line.strip()] or [type(error).__name__]
            try:
                found = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            except Exception:  # not a file that torch.save wrote
                fail(variant, f"cannot read checkpoint {path!r}: {lines[0]}")
    if found:
        held = f"{', '.join(found)}, which loading it would call or build"
    elif lines[0].startswith("Weights only load failed") and len(lines) > 2:
        held = f"what a checkpoint never holds ({lines[-2]})"  # torch's reason, between its advice
    else:
        fail(variant, f"cannot read checkpoint {path!r}: {lines[0]}")
    fail(variant, f"refusing {path!r}: it holds {held}; the checkpoints of these scripts hold only "
                  "tensors, arrays, numbers and text, so this file was made otherwise or altered")


def load_checkpoint(path: str, variant: str, resuming: bool = False,
                    trust_old: bool = False) -> dict:
    """Read a checkpoint written by the script `variant`, as data (`read_data`): reading it runs no
    code. Refuse anything else with a clear message. An evaluation gets only what it reads
    (EVALUATION_KEYS).

    A checkpoint of the older format (written before format 2) evaluates as it is, its weights and
    settings being data; but its environments are pickled objects, which can run any code when they
    are loaded, so it resumes only with `trust_old` (--trust-old-checkpoint), and its bytes are then
    marked for unpickling (old_checkpoints.TrustedOldPickle). The checkpoints the resumed run writes
    are of the new format; older entries are moved to where this format keeps them."""
    if not os.path.isfile(path):
        several_nodes = int(os.environ.get("WORLD_SIZE",
                                           "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        fail(variant,
             f"no checkpoint at {path!r}"
             + (" (every node needs it, at this path)" if several_nodes else ""))
    checkpoint = read_data(path, variant)
    if not isinstance(checkpoint, dict) or "variant" not in checkpoint:
        fail(variant, f"{path!r} is not a checkpoint of this collection")
    if checkpoint["variant"] != variant:
        fail(variant, f"{path!r} was written by {checkpoint['variant']}.py: use "
                      f"ppo/{checkpoint['variant']}.py for it")
    if not isinstance(checkpoint.get("args"), dict):
        fail(variant, f"{path!r} is not a checkpoint of this collection: it holds no settings")
    version = checkpoint.get("format")
    if version is None and resuming:
        if not trust_old:
            fail(variant, f"{path!r} is a checkpoint of the older format, whose saved environments "
                          "are pickled Python objects, and loading those runs whatever code they "
                          "name: if you wrote it yourself, resume it with --trust-old-checkpoint "
                          "(the run then saves the new format, which needs no flag)")
        checkpoint["envs"] = old_checkpoints.old_pickles(checkpoint.get("envs"))
    elif version is not None and version != CHECKPOINT_FORMAT:
        fail(variant, f"{path!r} has checkpoint format {version!r}, which this version of the "
                      "scripts does not read: use the version that wrote it")
    if resuming:
        old_checkpoints.episode_statistics_into_envs(checkpoint)
        old_checkpoints.reward_statistics_as_saved_now(checkpoint)
    return checkpoint if resuming else {key: checkpoint[key] for key in EVALUATION_KEYS
                                        if key in checkpoint}


def save_checkpoint(path: str, state: dict) -> None:
    """Replace the file at `path` atomically: a process killed while writing, or stopped by a second
    Ctrl-C, leaves the previous checkpoint whole and nothing beside it. The new one is written to a
    file without a name (Linux's O_TMPFILE), which vanishes with a process that dies, and is named
    only once complete; where the file system has no such files, to `<path>.tmp`, removed if the
    write fails."""
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
    """Give the unnamed file open at `descriptor` the name `path`, through /proc's link to it."""
    with contextlib.suppress(FileNotFoundError):  # left by a save killed just here
        os.remove(path)
    descriptors = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:  # linkat, following /proc's link to the file (link() would link the link)
        os.link(str(descriptor), path, src_dir_fd=descriptors, follow_symlinks=True)
    finally:
        os.close(descriptors)


def all_finite(state: dict) -> bool:
    """Whether every floating-point tensor of a state_dict is free of NaN and infinities."""
    return all(bool(torch.isfinite(value).all()) for value in state.values()
               if isinstance(value, torch.Tensor) and value.is_floating_point())


def statistics_state(statistics: RunningMeanStd) -> dict:
    """A running mean and variance (gymnasium's RunningMeanStd: observation or return statistics)
    as a checkpoint keeps it: its arrays, copied, and its count."""
    return {"mean": statistics.mean.copy(), "var": statistics.var.copy(), "count": statistics.count}


def restore_statistics(statistics: RunningMeanStd, state: dict) -> None:
    """Put back into `statistics` the running mean and variance that `statistics_state` saved."""
    statistics.mean, statistics.var = state["mean"].copy(), state["var"].copy()
    statistics.count = state["count"]


def rng_state(device: torch.device) -> dict:
    """The state of every random generator a run draws from: Python's, NumPy's, PyTorch's (and
    CUDA's)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng(state: dict, device: torch.device) -> None:
    """Put the random generators back where `rng_state` found them."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
