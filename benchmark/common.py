"""What the benchmark's commands share: the repository's path, wrong input as one line (`fail`,
raised as `WrongInput` and printed by the main of the command that was run, `refuse`), and the
directories they make. Standard library only (with ppo/exits.py's exit codes), as run.py is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from ppo_utils.exits import WRONG_INPUT

REPO = Path(__file__).resolve().parents[1]


class WrongInput(Exception):
    """Wrong input, or a submission Slurm refused: the one line saying what to do. The helpers here
    raise it (`fail`), for this runner and for the tuner, which calls them too; the main of the
    command that was run prints it as its own (`refuse`), so each speaks as itself."""


def fail(message: str) -> NoReturn:
    raise WrongInput(message)


def refuse(command: str, error: WrongInput) -> int:
    """A command's one line for wrong input, `<command>: error: <what to do>`; its exit code, 2."""
    print(f"{command}: error: {error}", file=sys.stderr, flush=True)
    return WRONG_INPUT


def refuse_a_file(path: Path, given_as: str) -> None:
    """Refuse a path that should be a directory but is a file; `given_as` says where the path comes
    from (the option that names it)."""
    if path.exists() and not path.is_dir():
        fail(f"{path} ({given_as}) is a file: give a directory (it is made if it does not exist)")


def make_directory(path: Path, given_as: str) -> None:
    """mkdir -p, or one line saying why the directory cannot be made."""
    refuse_a_file(path, given_as)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"cannot make the directory {path} ({given_as}): {error.strerror}; "
             "give one you can write to")
