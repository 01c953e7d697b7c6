"""The README's quickstart is the contract with new users: CI must run exactly its commands."""

import re

from conftest import REPO


def quickstart_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", quickstart, flags=re.S)


def test_ci_runs_the_readme_install_and_test_command():
    train, test = quickstart_commands()
    assert "python ppo/ppo.py" in train
    assert "pytest" in test
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci_lines
