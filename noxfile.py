"""The tested stacks, each installed from its lock in locks/, and the commands that look after them.

    nox                  # both stacks, `main` then `procgen`: the README's and CI's test command
    nox -s main          # every extra but Procgen, on NumPy 2: the whole suite but the Procgen tests
    nox -s procgen       # the Procgen extra on its NumPy 1 stack: the tests of ppo_procgen.py
    nox -s lock          # renew the locks: the newest releases pyproject.toml admits
    nox -s newest        # no lock, the newest releases: each script's tiny run, evaluation, resumption

Arguments after `--` go to pytest, e.g. `nox -s main -- tests/test_ppo.py -n 0`.

A stack is installed with uv: `uv pip sync` of its lock (which makes the environment hold exactly
the lock's packages, resolving nothing), then the project itself without its dependencies. uv writes
no bytecode unless asked (pip does), and a shell with PYTHONDONTWRITEBYTECODE=1 never writes it later:
without `--compile-bytecode` every process of the suite compiled PyTorch's sources anew, seconds each.
tests/test_locks.py fails when a lock no longer satisfies pyproject.toml. Which tests a stack runs is
chosen by the markers declared in pyproject.toml.
"""

import os
import subprocess
import sys
from pathlib import Path

import nox

PYTHON = "3.11"  # the Python the stacks are tested on; pyproject.toml's classifiers name it
LOCKS = Path("locks")
# PyTorch's CPU build (PyPI's torch is the CUDA build, several GB), which uv finds in the wheel folders
# pip is given (find_links) or in those of UV_FIND_LINKS.
TORCH = LOCKS / "torch.txt"
# stack: (the extra it installs, the tests it runs: a pytest marker expression, and the files to look in,
# all of tests/ where none are named). The Procgen stack names the files that hold Procgen tests (the
# other scripts' files would only skip there, their environments missing); tests/test_locks.py fails
# when a Procgen test lies in another file.
STACKS = {
    "main": ("test", "not procgen", []),
    "procgen": ("test-procgen", "procgen", ["tests/test_ppo_procgen.py", "tests/test_algorithm.py",
                                            "tests/test_bad_input.py", "tests/test_checkpoints.py",
                                            "tests/test_observations.py", "tests/test_own_environment.py"]),
}

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["main", "procgen"]
nox.options.error_on_missing_interpreters = True
nox.options.download_python = "never"
# A stack's environment is kept between runs, and synced to its lock at each: the same packages as a
# new one would hold, in seconds.
nox.options.reuse_venv = "yes"


def find_links() -> list[str]:
    """uv does not read pip's settings: hand it the wheel folders pip is given (`find-links` in a
    pip.conf, or PIP_FIND_LINKS), where a machine may keep PyTorch's CPU build."""
    settings = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    places = os.environ.get("PIP_FIND_LINKS", "").split()
    for line in settings.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            places += value.strip("'\"").split()
    return [f"--find-links={place}" for place in dict.fromkeys(places)]


def pytest(session: nox.Session, stack: str, selection: str) -> None:
    """pytest on the stack's files, or on those the arguments after `--` name."""
    _, _, files = STACKS[stack]
    names_files = any(argument.startswith("tests") for argument in session.posargs)
    session.run("python", "-m", "pytest", "-m", selection, *([] if names_files else files), *session.posargs)


def install_and_test(session: nox.Session, stack: str) -> None:
    extra, selection, _ = STACKS[stack]
    session.run_install("uv", "pip", "sync", "--compile-bytecode", *find_links(), str(LOCKS / f"{stack}.txt"))
    session.install("--no-deps", "-e", f".[{extra}]")
    pytest(session, stack, selection)


@nox.session(python=PYTHON)
def main(session: nox.Session) -> None:
    """Every extra but Procgen, from locks/main.txt (NumPy 2): the whole suite but the Procgen tests."""
    install_and_test(session, "main")


@nox.session(python=PYTHON)
def procgen(session: nox.Session) -> None:
    """The Procgen extra, from locks/procgen.txt (NumPy 1): the tests of ppo_procgen.py."""
    install_and_test(session, "procgen")


@nox.session(python=PYTHON)
def lock(session: nox.Session) -> None:
    """Renew locks/main.txt and locks/procgen.txt (the newest releases pyproject.toml admits, with the
    PyTorch of locks/torch.txt), and locks/tools.txt (nox and uv, which run the tests)."""
    compile_ = ("uv", "pip", "compile", "--python-version", PYTHON, "--upgrade", "--quiet",
                "--custom-compile-command", "nox -s lock")
    for stack, (extra, _, _) in STACKS.items():
        session.run(*compile_, "pyproject.toml", "--extra", extra, "--constraint", str(TORCH), *find_links(),
                    "--output-file", str(LOCKS / f"{stack}.txt"))
    session.run(*compile_, "--group", "tools", "--output-file", str(LOCKS / "tools.txt"))


@nox.session(python=PYTHON, reuse_venv="no")
@nox.parametrize("stack", list(STACKS))
def newest(session: nox.Session, stack: str) -> None:
    """No lock: the newest releases that install (PyTorch stays the CPU build of locks/torch.txt), in a
    new environment; each script's tiny run, evaluation and resumption (the `smoke` tests)."""
    extra, selection, _ = STACKS[stack]
    session.install("--compile-bytecode", *find_links(), "-r", str(TORCH), "-e", f".[{extra}]")
    session.run("uv", "pip", "freeze")
    pytest(session, stack, f"smoke and {selection}")
