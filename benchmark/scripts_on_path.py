"""`import ppo.<script>` in a process of its own: the tests', and the tools' that call a script's functions
(speed.py, the GPU checks).

ppo/ is a folder of scripts, not a package: a script imports the modules beside it by their file names
(`import run_life`), which Python finds because it puts the folder of the script it runs on the path.
Imported from elsewhere, as `ppo.<script>` (the folder is then a namespace package), the script finds
them once ppo/ is on the path too. It goes there last, after the name `ppo` is bound to the folder:
with ppo/ on the path, `import ppo` would find ppo/ppo.py, the CartPole script, first. Standard
library only.
"""

import importlib
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "ppo"


def make_scripts_importable() -> None:
    """Bind `ppo` to the folder, then put the folder on the path, last. A process that
    multiprocessing spawns inherits its parent's path, the folder on it: it is taken off while the
    name is bound."""
    folder = str(SCRIPTS)
    if "ppo" not in sys.modules:
        sys.path[:] = [entry for entry in sys.path if entry != folder]
        importlib.import_module("ppo")
    if folder not in sys.path:
        sys.path.append(folder)
