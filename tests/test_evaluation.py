"""--evaluate, in every script, as the docs describe it: it samples each action from the saved
policy, as training does (not the most likely action), on seeds that training never played.

Each script's checkpoint comes from one tiny run of its own (conftest's `tiny`)."""

import signal
import subprocess

import numpy as np
import pytest
import torch

from conftest import parse_args, run_script, script_command, script_environment

from ppo_utils import procgen_games  # noqa: E402
# the scripts' Evaluation, whose play() every evaluate() calls
from ppo_utils import evaluation  # noqa: E402


def uniform(model: dict) -> dict:
    """The saved weights with the policy's head zeroed: every choice equally likely (a Gaussian
    policy: mean 0, standard deviation 1), whatever the observation."""
    heads = [name for name in model
             if name.startswith("actor") and name.endswith(("weight", "bias"))][-2:]
    return {name: torch.zeros_like(value) if name in heads or name == "actor_logstd" else value
            for name, value in model.items()}


def played_actions(script, checkpoint_path, monkeypatch) -> tuple[np.ndarray, np.ndarray]:
    """The actions an evaluation of `checkpoint_path` played in 2 episodes, and the most likely
    action of a uniform policy at each of those steps: the first choice of each part of the action
    that its mask (ppo_multidiscrete.py's) allows. From every call of the policy that evaluate()
    hands Evaluation.play."""
    actions, first_allowed = [], []
    play = evaluation.Evaluation.play

    def recording_play(self, envs, policy, *rest, **options):
        nvec = getattr(envs.single_action_space, "nvec", None)

        def recorded(obs, done, *more):
            decided = policy(obs, done, *more)
            # the LSTM's: with its state
            action = decided[0] if isinstance(decided, tuple) else decided
            actions.append(np.asarray(action, dtype=float).reshape(len(obs), -1))
            masks = (more[0]["action_mask"] if nvec is not None
                     else np.ones((len(obs), 1), dtype=bool))
            starts = np.cumsum([0, *(nvec if nvec is not None else [1])[:-1]])
            first_allowed.append([[np.argmax(row[start:start + n])
                                   for start, n in zip(starts, nvec)] if nvec is not None else [0]
                                  for row in masks])
            return decided

        return play(self, envs, recorded, *rest, **options)

    monkeypatch.setattr(evaluation.Evaluation, "play", recording_play)
    script.evaluate(*parse_args(script, ["--evaluate", str(checkpoint_path),
                                         "--eval-episodes", "2", "--no-cuda"]))
    return np.concatenate(actions), np.concatenate(first_allowed)


def test_an_evaluation_samples_its_actions_from_the_policy(tiny, tmp_path, monkeypatch):
    """With every choice equally likely, the most likely action is always the first one (the first
    allowed one, under a mask), and a Gaussian's is its mean, 0; a sampled one is any, each step
    anew."""
    script, path = tiny
    checkpoint = torch.load(path, weights_only=False)
    torch.save({**checkpoint, "model": uniform(checkpoint["model"])}, tmp_path / "uniform.pt")
    monkeypatch.chdir(tmp_path)
    actions, most_likely = played_actions(script, tmp_path / "uniform.pt", monkeypatch)
    assert len(actions) >= 20
    if script.VARIANT == "ppo_continuous_action":
        assert actions.std() > 0.3, actions[:5]  # std 1, clipped to the action's bounds
    else:
        assert (actions != most_likely).mean() > 0.2, actions[:10].tolist()


def recording_seeds(script, monkeypatch) -> list[int]:
    """From here on, the seed of every environment the script builds or resets with one: a gymnasium
    vector environment's (seed + i for its i-th), an envpool's (game i: seed + i) or Procgen's (its
    games draw their levels from one seed, here counted as seed + i for its i-th game too)."""
    import gymnasium as gym

    seeds = []

    def recording(method, count_of):
        def method_recording(self, *inputs, seed=None, **options):
            if seed is not None:
                seeds.extend(range(seed, seed + count_of(self)))
            return method(self, *inputs, seed=seed, **options)

        return method_recording

    for vector_env in (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv):
        monkeypatch.setattr(vector_env, "reset",
                            recording(vector_env.reset, lambda envs: envs.num_envs))
    if script.VARIANT == "ppo_procgen":
        monkeypatch.setattr(procgen_games.Games, "reset",
                            recording(procgen_games.Games.reset, lambda envs: envs.num_envs))
    if script.VARIANT == "ppo_atari_envpool":
        from ppo_utils import envpool_games

        build = envpool_games.Games.__init__

        def building(self, pools, seed, *rest):
            seeds.extend(range(seed, seed + sum(pool.config["num_envs"] for pool in pools)))
            build(self, pools, seed, *rest)

        monkeypatch.setattr(envpool_games.Games, "__init__", building)
    return seeds


def test_an_evaluation_plays_on_seeds_that_training_never_played(tiny, tmp_path, monkeypatch):
    """The scores of --evaluate come from games the agent never trained on: its seeds (--seed plus
    100,000) and a fresh training run's (--seed on) have none in common."""
    from conftest import TINY_RUNS, only_run_dir

    script, _ = tiny
    monkeypatch.chdir(tmp_path)
    played = recording_seeds(script, monkeypatch)
    script.main(script.Args(save_model=True, seed=3, **TINY_RUNS[script.VARIANT][1]))
    training = list(played)
    assert training
    evaluated = recording_seeds(script, monkeypatch)
    script.evaluate(*parse_args(script, ["--evaluate",
                                         str(only_run_dir(tmp_path) / "checkpoint.pt"),
                                         "--eval-episodes", "1", "--no-cuda"]))
    assert evaluated and not set(evaluated) & set(training), (sorted(evaluated), sorted(training))


def test_ctrl_c_stops_an_evaluation_that_started_with_it_ignored(tmp_path):
    """A shell script's background job starts with Ctrl-C (SIGINT) ignored, and Python leaves it
    ignored: the scripts hear it anyway, an evaluation as a training run does (one played on
    after it, in a CI run started from such a job). It stops at once: exit code 130."""
    run_script("ppo.py", "--total-timesteps", "64", "--num-envs", "2", "--num-steps", "32",
               "--num-minibatches", "2", "--save-model", "--no-cuda", cwd=tmp_path)
    (checkpoint,) = tmp_path.glob("runs/*/checkpoint.pt")
    playing = subprocess.Popen(
        script_command("ppo.py", ["--evaluate", str(checkpoint), "--eval-episodes", "100000"]),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=script_environment(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    output = []
    for line in playing.stdout:
        output.append(line)
        if line.startswith("episode "):
            playing.send_signal(signal.SIGINT)
            break
    try:
        output.append(playing.communicate(timeout=60)[0])
    except subprocess.TimeoutExpired:
        playing.kill()
        pytest.fail("Ctrl-C did not stop the evaluation within 60 s:\n"
                    + "".join(output)[-2000:])
    assert playing.returncode == 130, "".join(output)[-2000:]
    assert "".join(output).strip().splitlines()[-1] == "stopped at once by Ctrl-C"
