"""The command line of every script: its flags read with tyro, a checkpoint's settings taken as the
defaults of --resume and --evaluate, the rules a script sets for its flags, and environment ids
checked before anything is built.
"""

import contextlib
import importlib
from dataclasses import fields, replace
from typing import Callable

import gymnasium as gym
import tyro

from checkpoints import load_checkpoint
from exits import fail


def parse_args(args_class: type, variant: str, runtime_fields: set[str],
               evaluation_fields: set[str], argv: list[str] | None = None,
               evaluation_keeps: tuple[str, ...] = ("env_id",), doc: str = ""):
    """Read the command line into `args_class`; returns the settings and the checkpoint that
    --resume or --evaluate names (None without either), read once, here. --help begins with the
    first two paragraphs of `doc`, the script's docstring: what it is for, and its commands.

    With a checkpoint its settings are the defaults, so `--resume PATH` alone continues the run. A
    resumed run may change only the `runtime_fields` (how it runs, not what it learns) and refuses
    any other flag that contradicts the checkpoint. An evaluation starts from the default run-time
    options, may change the `evaluation_fields` (the seed of its games, say), must keep
    `evaluation_keeps` (the environment) and refuses every other training flag, which it would
    silently ignore."""
    description = "\n\n".join(doc.split("\n\n")[:2])
    args = tyro.cli(args_class, args=argv, description=description)
    if args.resume and args.evaluate:
        fail(variant, "--resume goes on training a saved run and --evaluate plays a saved agent: "
                      "give one of them")
    if not (args.resume or args.evaluate):
        return args, None
    path = args.resume or args.evaluate
    checkpoint = load_checkpoint(path, variant, resuming=bool(args.resume),
                                 trust_old=args.trust_old_checkpoint)
    unknown = sorted(map(str,
                         set(checkpoint["args"]) - {field.name for field in fields(args_class)}))
    if unknown:
        fail(variant, f"{path!r} was written by another version of {variant}.py, with settings "
                      f"this one lacks ({', '.join(unknown)}): continue it with that version, or "
                      "start the run again")
    # --trust-old-checkpoint speaks for this command alone: never taken from a checkpoint, free to
    # differ.
    runtime_fields = runtime_fields | {"trust_old_checkpoint"}
    saved = replace(args_class(**checkpoint["args"]), resume=None, evaluate=None,
                    trust_old_checkpoint=False)
    if args.evaluate:
        saved = replace(saved, **{name: getattr(args_class(), name) for name in runtime_fields})
    args = tyro.cli(args_class, args=argv, default=saved, description=description)
    kept = evaluation_keeps if args.evaluate else [f.name for f in fields(args_class)
                                                   if f.name not in runtime_fields]
    for name in kept:
        if getattr(args, name) != getattr(saved, name):
            flag = "--" + name.replace("_", "-")
            fail(variant, f"the checkpoint was made with {flag} {getattr(saved, name)}, not "
                          f"{getattr(args, name)}: drop {flag} to keep the checkpoint's value")
    if args.evaluate:
        for name in (f.name for f in fields(args_class)
                     if f.name not in runtime_fields | evaluation_fields):
            if getattr(args, name) != getattr(saved, name):
                fail(variant, f"--{name.replace('_', '-')} is a training setting, which --evaluate "
                              "does not use: drop it")
    return args, checkpoint


def check_rules(args, variant: str, rules: list[tuple[str, str, Callable]]) -> None:
    """Refuse the first flag that breaks its rule, naming the flag, the rule, the value and the
    default. `rules` is a script's table: (field names separated by spaces, what each must be,
    whether a value is allowed)."""
    defaults = type(args)()
    for names, requirement, allowed in rules:
        for name in names.split():
            value = getattr(args, name)
            if not allowed(value):
                default = getattr(defaults, name)
                fail(variant, f"--{name.replace('_', '-')} must be {requirement}, got {value!r}"
                              + ("" if default is None else f": the default is {default!r}"))


def gymnasium_spec(env_id: str, variant: str, hint: str = "") -> gym.envs.registration.EnvSpec:
    """The registration of `env_id`; an id that gymnasium does not know is refused in one line, with
    `hint` (the script to use instead, say).

    `module:EnvId` is gymnasium's way to name an environment that a package of the user's registers
    when it is imported: the module is imported first, as gym.make does, so that the id is known
    when it is looked up (gym.make imports it again, a no-op, and so do the worker processes of
    --async-envs, where the environments are made). A module that does not import, or an id it does
    not register, is refused in one line that says which."""
    module, _, bare_id = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as error:  # ModuleNotFoundError, or whatever the user's module raised
            fail(variant, f"--env-id {env_id}: cannot import the module {module!r} "
                          f"({type(error).__name__}: {error}): is it installed, or on PYTHONPATH?")
    try:
        return gym.spec(bare_id)
    except gym.error.Error as error:
        if module:
            fail(variant, f"--env-id {env_id}: importing {module!r} registered no environment "
                          f"{bare_id!r} (gymnasium.register(id=..., entry_point=...) in the module "
                          "makes one)")
        fail(variant, f"unknown env id {env_id!r}{hint}: {error}")


def check_gymnasium_id(env_id: str, variant: str) -> None:
    """Refuse an id that gymnasium does not know (`gymnasium_spec`), pointing Atari ids to the Atari
    script."""
    atari = "NoFrameskip" in env_id or env_id.startswith("ALE/")
    gymnasium_spec(env_id, variant, hint=" (Atari ids need ppo/ppo_atari.py)" if atari else "")


@contextlib.contextmanager
def packages_checked(env_id: str, variant: str):
    """Within the block, an ImportError (a registered id whose code needs a package, or a version of
    one, that is not installed) ends the run in one line, naming a newer version of the id if
    any."""
    try:
        yield
    except ImportError as error:
        namespace, name, version = gym.envs.registration.parse_env_id(env_id.rpartition(":")[2])
        newest = gym.envs.registration.find_highest_version(namespace, name)
        newest_id = gym.envs.registration.get_env_id(namespace, name, newest)
        hint = "" if newest in (None, version) else f" (try {newest_id})"
        fail(variant, f"{env_id} cannot be made with the packages installed: {error}{hint}")

