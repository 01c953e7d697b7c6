"""The locks (locks/main.txt, locks/procgen.txt, locks/tools.txt) satisfy pyproject.toml.

Each tested stack is installed from its lock and nothing else (noxfile.py: `uv pip sync`), so a lock
that pyproject.toml no longer admits would test releases users cannot get: a floor raised above a
pin, a release excluded after it was locked, a new dependency missing from the lock. Each
requirement that applies to a stack (its extra, the extras that one names, the core dependencies, on
the Python the stacks are tested on) must be pinned in the stack's lock to a version its specifier
admits. When this fails, renew the locks: `nox -s lock` (CONTRIBUTING.md).
"""

import ast
import re
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import conftest
from conftest import REPO

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def noxfile_constant(name: str):
    """A constant of noxfile.py (STACKS, PYTHON), read without importing nox."""
    for node in ast.parse((REPO / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name
                                                for target in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"noxfile.py defines no {name}")


STACKS = noxfile_constant("STACKS")  # stack: (its extra, the tests it runs, the files they are in)


def test_pyproject_admits_exactly_the_tested_pythons():
    """requires-python and the classifiers name the Pythons noxfile.py tests on, no more: 3.11 (the
    locks' Python, the whole suite) and NEWER_PYTHONS (the smoke tests)."""
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    tested = [noxfile_constant("PYTHON"), *noxfile_constant("NEWER_PYTHONS")]
    named = [line.rsplit(":: ", 1)[1] for line in project["classifiers"]
             if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", line)]
    assert named == tested
    admitted = [f"3.{minor}" for minor in range(8, 20)
                if f"3.{minor}.0" in SpecifierSet(project["requires-python"])]
    assert admitted == tested


def pins(lock_text: str) -> dict[str, Version]:
    """{package: version} of a lock; every line that is not a comment must pin one package."""
    pinned = {}
    for line in lock_text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = PIN.match(line.strip())
        assert match, f"not a pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pinned, f"{name} pinned twice"
        pinned[name] = Version(match.group(2))
    return pinned


def requirements(extra: str) -> list[Requirement]:
    """What pyproject.toml requires of a stack that installs `extra`: the core dependencies and the
    extra's, following the extras it names (`ppo-scripts[atari,...]`), with the markers that hold on
    the stacks' Python."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    environment = {**default_environment(),
                   "python_version": noxfile_constant("PYTHON"), "extra": ""}
    found = [Requirement(text) for text in project["dependencies"]]
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in project["optional-dependencies"][name]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == canonicalize_name(project["name"]):
                todo += sorted(requirement.extras)
            else:
                found.append(requirement)
    return [requirement for requirement in found
            if requirement.marker is None or requirement.marker.evaluate(environment)]


def unmet(pinned: dict[str, Version], required: list[Requirement]) -> list[str]:
    """Each requirement the pins do not meet, in words."""
    problems = []
    for requirement in required:
        name = canonicalize_name(requirement.name)
        if name not in pinned:
            problems.append(f"{requirement} is not in the lock")
        elif not requirement.specifier.contains(pinned[name], prereleases=True):
            problems.append(f"{name}=={pinned[name]} is outside {requirement}")
    return problems


def lock_text(stack: str) -> str:
    return (REPO / "locks" / f"{stack}.txt").read_text()


@pytest.mark.parametrize("stack", list(STACKS))
def test_each_lock_meets_every_requirement_of_its_stack(stack):
    extra, _, _ = STACKS[stack]
    assert unmet(pins(lock_text(stack)), requirements(extra)) == [], (
        f"locks/{stack}.txt no longer satisfies pyproject.toml: renew it with `nox -s lock`")


def test_the_tools_lock_meets_the_tools_group():
    """locks/tools.txt: what the README's test command installs to run nox (and uv)."""
    group = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]["tools"]
    assert unmet(pins(lock_text("tools")), [Requirement(text) for text in group]) == []


@pytest.mark.parametrize("stack", list(STACKS))
def test_each_lock_is_written_by_the_lock_command_and_holds_pytorchs_cpu_build(stack):
    text = lock_text(stack)
    assert "#    nox -s lock" in text.splitlines()[:3]
    (torch,) = [line for line in (REPO / "locks" / "torch.txt").read_text().splitlines()
                if PIN.match(line)]
    assert pins(text)["torch"] == Version(PIN.match(torch).group(2))


def test_the_main_stack_is_on_numpy_2_without_procgen_and_the_procgen_stack_has_it():
    main, procgen = pins(lock_text("main")), pins(lock_text("procgen"))
    assert main["numpy"].major >= 2 and "procgen-mirror" not in main and "gym3" not in main
    assert procgen["numpy"].major == 1 and "procgen-mirror" in procgen


def test_a_pin_outside_a_range_or_a_missing_package_is_found():
    """The check itself, on planted mismatches: NumPy below pyproject's floor, the MuJoCo release it
    leaves out, a dependency the lock lacks."""
    text = lock_text("main")
    planted = re.sub(r"(?m)^numpy==\S+$", "numpy==1.23.5", text)
    planted = re.sub(r"(?m)^mujoco==\S+$", "mujoco==4.0.0", planted)
    planted = re.sub(r"(?m)^tyro==\S+$\n", "", planted)
    problems = (set(unmet(pins(planted), requirements("test")))
                - set(unmet(pins(text), requirements("test"))))
    assert sorted(problems) == ["mujoco==4.0.0 is outside mujoco!=4.0.0",
                                "numpy==1.23.5 is outside numpy>=1.24",
                                "tyro>=0.8 is not in the lock"], problems


def test_the_procgen_stack_looks_in_every_file_that_holds_a_procgen_test(request):
    """The Procgen stack runs `-m procgen` on the files noxfile.py names: a Procgen test elsewhere
    would run in neither stack. (Checked on the files this pytest run collected: all of them in the
    main stack.)"""
    _, _, files = STACKS["procgen"]
    assert request.config.stash[conftest.PROCGEN_TEST_FILES] - set(files) == set()
