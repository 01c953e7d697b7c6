"""The PPO scripts, importable as `ppo.<script>` by the tests and benchmark tools.

Each script imports its run machinery (`import command_line`, `checkpoints`, `run_life`, `exits`),
the modules beside it: that works as it is when a script runs as `python ppo/<script>.py`, whose
folder Python puts first on its path. For `import ppo.<script>` the folder goes on the path here,
last, so that nothing else is shadowed.
"""

import os
import sys

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
