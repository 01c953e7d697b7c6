"""What a script can train on, as a property (issue 70): every script against every combination of
gymnasium's observation and action spaces (tests/space_envs.py) either trains a tiny run and exits
0, or refuses in one line, exit code 2, no traceback, and leaves no run folder. Which it does is
this file's table, TRAINS: a space let through that a script cannot train on crashes the run (the
environment refuses actions outside its space), and one refused that it could train on is a
regression.

Each run is `python ppo/<script>.py --env-id space_envs:Spaces-<observations>-<actions>-v0`, run in
this process (conftest.run_script_here), so that the hundreds of them take seconds.
"""

import os

import pytest

import space_envs
from conftest import run_script_here

# Observations an MLP reads, once flattened into one vector (environments.as_vectors): all but text
# and the spaces whose size changes from step to step.
READABLE = set(space_envs.OBSERVATIONS) - {"Text", "Graph", "Sequence", "DictWithText"}
# What each script trains on: (actions, observations); it refuses every other combination. The
# Atari, envpool and Procgen scripts train on their own games only, never on a user's environment.
TRAINS = {
    "ppo": ({"Discrete", "DiscreteFrom2"}, READABLE),
    "ppo_continuous_action": ({"Box", "Box2x2", "Unbounded"}, READABLE),
    "ppo_multidiscrete": ({"Discrete", "DiscreteFrom2", "MultiDiscrete", "MultiDiscrete2x2",
                           "IntBox", "MultiBinary", "MultiBinary2x2"}, READABLE),
    "ppo_atari": (set(), set()), "ppo_atari_lstm": (set(), set()),
    "ppo_atari_multigpu": (set(), set()),
    "ppo_atari_envpool": (set(), set()), "ppo_procgen": (set(), set()),
}
TINY = ["--num-envs", "1", "--num-steps", "16", "--num-minibatches", "1", "--update-epochs", "1",
        "--total-timesteps", "16", "--no-cuda"]


@pytest.mark.parametrize("script", sorted(TRAINS))
def test_every_space_combination_trains_or_is_refused_in_one_line(
        script, tmp_path, monkeypatch, capsys):
    if script.startswith("ppo_atari") and script != "ppo_atari_envpool":
        pytest.importorskip("ale_py")
    monkeypatch.chdir(tmp_path)
    actions_trained, observations_read = TRAINS[script]
    wrong = []
    for observed in space_envs.OBSERVATIONS:
        for acted in space_envs.ACTIONS:
            combination = f"{observed} observations, {acted} actions"
            code, out, err = run_script_here(
                script, ["--env-id", f"space_envs:Spaces-{observed}-{acted}-v0", *TINY], capsys)
            runs = sorted(os.listdir("runs")) if os.path.isdir("runs") else []
            trains = acted in actions_trained and observed in observations_read
            if trains and (code != 0 or len(runs) != 1):
                wrong.append(f"{combination}: exit {code}, not a run that trains\n{err[-1500:]}")
            elif not trains and (code != 2 or len(err.strip().splitlines()) != 1 or runs
                                 or not err.startswith(f"{script}.py: error: ")):
                wrong.append(f"{combination}: exit {code}, runs/ {runs}, not one line of refusal\n"
                             f"{err[-1500:]}")
            for run in runs:  # each combination starts from an empty runs/
                for name in os.listdir(f"runs/{run}"):
                    os.remove(f"runs/{run}/{name}")
                os.rmdir(f"runs/{run}")
    assert not wrong, (f"{len(wrong)} of "
                       f"{len(space_envs.OBSERVATIONS) * len(space_envs.ACTIONS)}:\n"
                       + "\n".join(wrong))
