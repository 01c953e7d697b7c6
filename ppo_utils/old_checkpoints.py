"""Checkpoints of earlier formats, brought to today's as they are read: each change of format, when
it came and what it moved, here in one place, so that checkpoint.py and env_states.py describe
today's format alone, and a migration can go when no checkpoint it reads is left to resume.

Until format 2 (2026-11-25) a checkpoint's environments were pickled Python objects, and unpickling
runs whatever code they name: load_checkpoint marks their bytes (TrustedOldPickle) only when the
user resumes with --trust-old-checkpoint, and they are unpickled here (unpickled_envs), and nowhere
else.
"""

import functools
import pickle
from typing import Callable

import cloudpickle
import gymnasium as gym


class TrustedOldPickle(bytes):
    """Pickled environments of a checkpoint in the older format. Only load_checkpoint makes these,
    from such a checkpoint's bytes, when the user resumes it with --trust-old-checkpoint: they are
    the only bytes ever unpickled here, and no file can hold one (reading builds no class of this
    module)."""


def old_pickles(saved):
    """`saved`, the environments of an older checkpoint (bytes, or lists of bytes), its bytes marked
    as TrustedOldPickle."""
    if isinstance(saved, list):
        return [old_pickles(item) for item in saved]
    return TrustedOldPickle(saved) if isinstance(saved, bytes) else saved


def episode_statistics_into_envs(checkpoint: dict) -> None:
    """Until 2026-11-27, ppo.py and ppo_continuous_action.py kept each episode's running return and
    length beside their environments, under "episode_return" and "episode_length"; gymnasium's
    RecordEpisodeStatistics, now the outermost wrapper of their environments, keeps them. Such a
    checkpoint's figures are put where the environments built now keep them: into a layer added
    to each saved environment, or, for the pickled ones of the older format, into a
    RecordEpisodeStatistics wrapped around each when they are unpickled. A checkpoint of any other
    kind is left as it is."""
    saved = checkpoint.get("envs")
    layered = isinstance(saved, list) and all(
        isinstance(layers, list) and all(isinstance(layer, dict) for layer in layers)
        for layers in saved)
    if "episode_return" not in checkpoint or not (layered or isinstance(saved, TrustedOldPickle)):
        return
    returns, lengths = checkpoint.pop("episode_return"), checkpoint.pop("episode_length")
    if isinstance(saved, TrustedOldPickle):
        saved.episode_statistics = (returns, lengths)
        return
    for layers, episode_return, episode_length in zip(saved, returns, lengths):
        layers.insert(0, {"class": "RecordEpisodeStatistics", "generators": {}, "simulators": {},
                          "data": {"episode_returns": float(episode_return),
                                   "episode_lengths": int(episode_length)}})


def reward_statistics_as_saved_now(checkpoint: dict) -> None:
    """Until 2026-11-26, the "reward_scaler" entry of the checkpoints of ppo_continuous_action.py
    and ppo_procgen.py held the return statistics under "return_rms" and, in the earlier ones, each
    environment's discounted return too. It now holds the statistics alone, and the discounted
    returns are saved beside the rest of the rollout's state, under "discounted_return", which a
    resumed run reads back only when it goes on with the saved episodes. Such a checkpoint's
    entries are moved there."""
    scaler = checkpoint.get("reward_scaler")
    if isinstance(scaler, dict) and "return_rms" in scaler:
        checkpoint["reward_scaler"] = scaler["return_rms"]
        if "discounted_return" in scaler:
            checkpoint["discounted_return"] = scaler["discounted_return"]


# Checkpoints of the older format (before CHECKPOINT_FORMAT 2) held their environments as pickles.
# Resumed with --trust-old-checkpoint, they are unpickled here, and nowhere else.


def unpickled_envs(saved: TrustedOldPickle | list[TrustedOldPickle],
                   savable: Callable[[gym.Env], gym.Env]) -> list[Callable[[], gym.Env]]:
    """A function per environment of an older checkpoint that returns it as it was saved: ale-py's
    games (one pickle each, unpickled where the game will run), classic control's environments
    (pickled whole), MuJoCo's (each with its random generator's state and MjData), or ale-py's games
    of a yet older checkpoint (all in one pickle, each to be wrapped in `savable`, the wrapper that
    saves a game where it runs: environments.SavableGame, which they lack)."""
    if isinstance(saved, list):
        return [functools.partial(unpickle_game, game) for game in saved]
    items = pickle.loads(saved)
    if all(isinstance(item, gym.Env) for item in items):
        return with_episode_statistics(items, saved)
    if all(isinstance(rng, dict) for _, rng, _ in items):
        envs = []
        for env, rng, data in items:
            env.unwrapped.np_random.bit_generator.state = rng
            if data is not None:
                import mujoco  # installed, since a MuJoCo environment was saved

                mujoco.mj_copyData(env.unwrapped.data, env.unwrapped.model, data)
            envs.append(env)
        return with_episode_statistics(envs, saved)
    return [functools.partial(unpickle_game, cloudpickle.dumps((savable(env), emulator, rng)))
            for env, emulator, rng in items]


def with_episode_statistics(envs: list[gym.Env],
                            saved: TrustedOldPickle) -> list[Callable[[], gym.Env]]:
    """Classic control's or MuJoCo's unpickled environments, each in the RecordEpisodeStatistics
    that the scripts now wrap around them, holding the running return and length that the
    checkpoint kept beside them (`episode_statistics_into_envs`), if it did."""
    statistics = getattr(saved, "episode_statistics", None)
    if statistics is None:
        return [lambda env=env: env for env in envs]
    wrapped = []
    for env, episode_return, episode_length in zip(envs, *statistics):
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.episode_returns, env.episode_lengths = float(episode_return), int(episode_length)
        wrapped.append(env)
    return [lambda env=env: env for env in wrapped]


def unpickle_game(saved_game: bytes) -> gym.Env:
    """An ale-py game of an older checkpoint: its pickled wrapper stack, with its emulator put
    back."""
    env, emulator_state, rng = pickle.loads(saved_game)
    env.unwrapped.ale.restoreState(emulator_state)
    env.unwrapped.np_random.bit_generator.state = rng
    return env
