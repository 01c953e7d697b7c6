"""The tested stacks, each installed from its lock in locks/, and the commands that look after them.

    nox                  # both stacks, `main` then `procgen`: the README's test command
    nox -s main          # every extra but Procgen, on NumPy 2: the whole suite but the Procgen tests
    nox -s procgen       # the Procgen extra on its NumPy 1 stack: the tests of ppo_procgen.py
    nox -s floors        # the core dependencies' lowest releases: each script's tiny run, evaluation, resumption
    nox -s newer_python  # the locks on Python 3.12 and 3.13: the same smoke tests
    nox -s lock          # renew the locks: the newest releases pyproject.toml admits
    nox -s newest        # no lock, the newest releases: the same smoke tests

CI runs `nox`, then `nox -s floors newer_python` (.ci/run). Arguments after `--` go to pytest, e.g.
`nox -s main -- tests/test_ppo.py -n 0`.

A stack is installed with uv: `uv pip sync` of its lock (which makes the environment hold exactly
the lock's packages, resolving nothing), then the project itself without its dependencies. The locks
pin PyTorch's CPU build, which PyPI does not carry: where no wheel folder or index that uv is given
holds it for the session's Python (a laptop, or Python 3.12 and 3.13 here), the same release comes from PyPI
instead, its CUDA build, which runs on a CPU (about 3 GB to download once). uv writes
no bytecode unless asked (pip does), and a shell with PYTHONDONTWRITEBYTECODE=1 never writes it later:
without `--compile-bytecode` every process of the suite compiled PyTorch's sources anew, seconds each.
tests/test_locks.py fails when a lock no longer satisfies pyproject.toml. Which tests a stack runs is
chosen by the markers declared in pyproject.toml.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import nox

PYTHON = "3.11"  # the Python the locks are resolved for, and the whole suite runs on
# The smoke tests run on these too; pyproject.toml's classifiers and requires-python name these four.
NEWER_PYTHONS = ["3.12", "3.13"]
PROCGEN_LAST_PYTHON = "3.12"  # procgen-mirror's newest wheels (its extra installs nothing on 3.13)
LOCKS = Path("locks")
# PyTorch's CPU build (PyPI's torch is the CUDA build, several GB), which uv finds in the wheel folders
# pip is given (find_links), in those of UV_FIND_LINKS or in an index of UV_INDEX; PyPI's build of the
# same release where none holds it (installs_torch).
TORCH = LOCKS / "torch.txt"
# stack: (the extra it installs, the tests it runs: a pytest marker expression, and the files to look in,
# all of tests/ where none are named). The Procgen stack names the files that hold Procgen tests (the
# other scripts' files would only skip there, their environments missing); tests/test_locks.py fails
# when a Procgen test lies in another file.
STACKS = {
    "main": ("test", "not procgen", []),
    "procgen": ("test-procgen", "procgen", ["tests/test_ppo_procgen.py", "tests/test_algorithm.py",
                                            "tests/test_bad_input.py", "tests/test_checkpoints.py",
                                            "tests/test_evaluation.py", "tests/test_observations.py",
                                            "tests/test_own_environment.py", "tests/test_spaces.py",
                                            "tests/test_watch_and_export.py"]),
}

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["main", "procgen"]
nox.options.error_on_missing_interpreters = True
# A Python that is not on PATH (3.12 on a machine with 3.11 alone) is downloaded by uv where its
# source is reachable; pyenv's installed versions are put on PATH first (pythons_of_pyenv).
nox.options.download_python = "auto"
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


def pythons_of_pyenv() -> None:
    """Let pyenv's shims answer for every Python pyenv holds, the selected one first: a shim answers
    only for the selected version, so beside a selected 3.11 `python3.12` fails, and uv stops there
    (CI's machine holds both). A PYENV_VERSION already set is kept."""
    def pyenv(*arguments: str) -> list[str]:
        try:
            return subprocess.run(["pyenv", *arguments], capture_output=True, text=True).stdout.split()
        except FileNotFoundError:
            return []
    selected, held = pyenv("version-name"), pyenv("versions", "--bare")
    if selected and held and "PYENV_VERSION" not in os.environ:
        os.environ["PYENV_VERSION"] = ":".join(dict.fromkeys(selected + held))


pythons_of_pyenv()


def torch_requirement() -> str:
    """locks/torch.txt's requirement, e.g. `torch==2.13.0+cpu`."""
    (line,) = [line for line in TORCH.read_text().splitlines() if line.startswith("torch==")]
    return line


def installs_torch(session: nox.Session) -> str:
    """The PyTorch to install: locks/torch.txt's CPU build where a wheel folder or index uv is given
    holds it for this session's Python (uv's dry run finds it), else PyPI's build of the same release
    (`torch==2.13.0`, CUDA libraries and all), which runs on a CPU."""
    wanted = torch_requirement()
    dry_run = subprocess.run(["uv", "pip", "install", "--dry-run", "--no-deps", "--python",
                              str(Path(session.bin) / "python"), *find_links(), wanted], capture_output=True)
    if dry_run.returncode == 0:
        return wanted
    from_pypi = wanted.split("+")[0]
    session.log(f"{wanted} is in no wheel folder or index given to uv (UV_FIND_LINKS, pip's find-links) for "
                f"this Python: installing {from_pypi} from PyPI instead, a CUDA build that runs on a CPU "
                f"(about 3 GB to download once; CONTRIBUTING.md says how to point uv at the CPU build)")
    return from_pypi


def sync(session: nox.Session, lock: Path) -> None:
    """Make the environment hold exactly the lock's packages, with the PyTorch of installs_torch:
    where that is PyPI's build, the lock less its torch line, then that build with what it needs."""
    torch = installs_torch(session)
    if torch == torch_requirement():
        session.run_install("uv", "pip", "sync", "--compile-bytecode", *find_links(), str(lock))
        return
    without_torch = Path(session.create_tmp()) / lock.name
    without_torch.write_text("".join(line for line in lock.read_text().splitlines(keepends=True)
                                     if not line.startswith("torch==")))
    session.run_install("uv", "pip", "sync", "--compile-bytecode", str(without_torch))
    session.run_install("uv", "pip", "install", "--compile-bytecode", torch)


def floor_requirements() -> list[str]:
    """`name==lowest` for each of pyproject.toml's core dependencies, its floor (`torch>=2.6` gives
    `torch==2.6`)."""
    import tomllib
    dependencies = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
    return [re.sub(r">=([^,]+).*", r"==\1", dependency) for dependency in dependencies]


def pytest(session: nox.Session, stack: str, selection: str) -> None:
    """pytest on the stack's files, or on those the arguments after `--` name."""
    _, _, files = STACKS[stack]
    names_files = any(argument.startswith("tests") for argument in session.posargs)
    session.run("python", "-m", "pytest", "-m", selection, *([] if names_files else files), *session.posargs)


def install_and_test(session: nox.Session, stack: str) -> None:
    extra, selection, _ = STACKS[stack]
    sync(session, LOCKS / f"{stack}.txt")
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
@nox.parametrize("stack", list(STACKS))
def floors(session: nox.Session, stack: str) -> None:
    """The lowest releases pyproject.toml admits of every core dependency (PyTorch from PyPI, its CUDA
    build), the rest of the stack's extra as it resolves beside them: the smoke tests, so that each
    floor is a release the scripts train, save, resume and evaluate on (tests/test_floors.py)."""
    extra, selection, _ = STACKS[stack]
    session.install("--compile-bytecode", *floor_requirements(), "-e", f".[{extra}]")
    session.run("uv", "pip", "freeze")
    pytest(session, stack, f"smoke and {selection}")


@nox.session(python=NEWER_PYTHONS)
@nox.parametrize("stack", list(STACKS))
def newer_python(session: nox.Session, stack: str) -> None:
    """Each stack from its lock (resolved for 3.11) on a newer Python, PyTorch from PyPI where no
    folder holds its CPU build for that Python: the smoke tests."""
    extra, selection, _ = STACKS[stack]
    if stack == "procgen" and session.python != PROCGEN_LAST_PYTHON:
        session.skip(f"procgen-mirror has wheels up to Python {PROCGEN_LAST_PYTHON}")
    sync(session, LOCKS / f"{stack}.txt")
    session.install("--no-deps", "-e", f".[{extra}]")
    pytest(session, stack, f"smoke and {selection}")


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
    session.install("--compile-bytecode", *find_links(), installs_torch(session), "-e", f".[{extra}]")
    session.run("uv", "pip", "freeze")
    pytest(session, stack, f"smoke and {selection}")
