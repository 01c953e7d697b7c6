"""Which of envpool's ids a script takes: the others are refused in one line naming what to use."""

import contextlib
import io

import gymnasium as gym

from ppo_utils.exits import WrongInput


def check_envpool_id(env_id: str, kinds: tuple[str, ...] | None, example: str) -> None:
    """Refuse an id envpool lacks, or of a kind of task (AtariEnvSpec, ...) not in `kinds` (None:
    any); `example` is an id of the kind taken."""
    try:
        # envpool 1.0 imports the retired `gym` where it is installed, which prints a notice
        with contextlib.redirect_stderr(io.StringIO()):
            import envpool
    except ImportError:
        raise WrongInput("this script needs envpool: pip install -e '.[envpool]'") from None
    if env_id not in envpool.list_all_envs():
        hint = ""
        if env_id.endswith("NoFrameskip-v4") or env_id.startswith("ALE/"):
            game = env_id.removeprefix("ALE/").removesuffix("NoFrameskip-v4").removesuffix("-v5")
            hint = (f" (envpool names the game {game}-v5; ale-py ids such as {env_id} need "
                    "ppo/ppo_atari.py)")
        raise WrongInput(f"unknown env id {env_id!r}{hint}: envpool's ids of this kind are named "
                         f"like {example}")
    kind = type(envpool.make_spec(env_id)).__name__
    if kinds is not None and kind not in kinds:
        raise WrongInput(f"{env_id} is not a task this script trains on ({kind}): use ppo/ppo.py "
                         "for vector observations and ppo/ppo_continuous_action.py for Box actions")


def port_hint(env_id: str, namespace: str) -> str:
    """For a bare id gymnasium lacks and envpool has under `namespace` (Jumanji/...), the id to
    give; else nothing."""
    if ":" in env_id or env_id in gym.registry:
        return ""
    with contextlib.suppress(ImportError), contextlib.redirect_stderr(io.StringIO()):
        import envpool

        ported = f"{namespace}/{env_id}"
        if ported in envpool.list_all_envs():
            return f" (envpool's port of it is {ported}: --env-id {ported})"
    return ""
