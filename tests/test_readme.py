"""The README's quickstart is the contract with new users: CI must run exactly its commands."""

import ast
import re

from conftest import REPO


def quickstart_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", quickstart, flags=re.S)


def default_nox_sessions() -> list[str]:
    """The sessions a plain `nox` runs (noxfile.py's nox.options.sessions)."""
    for node in ast.parse((REPO / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "nox.options.sessions":
            return ast.literal_eval(node.value)
    raise LookupError("noxfile.py sets no nox.options.sessions")


def test_ci_runs_the_readme_install_and_test_command():
    train, test = quickstart_commands()
    assert "python ppo/ppo.py" in train
    assert test.endswith("&& nox")  # every default session: both tested stacks
    assert default_nox_sessions() == ["main", "procgen"]
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci_lines
