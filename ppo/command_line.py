"""The command line of every script: the run's flags, declared once beside each script's algorithm;
a checkpoint's settings as the defaults of --resume and --evaluate; the rules every flag follows and
the spaces a script trains on, checked before anything is built; and environment ids.
"""

import contextlib
import importlib
import io
import math
import sys
import typing
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any, Callable, NamedTuple, NoReturn, TypeVar

import gymnasium as gym
import tyro

from checkpoints import load_checkpoint
from exits import STOPPED, exit_codes, fail

T = TypeVar("T")


class Rule(NamedTuple):
    """What a flag's value must be, said as the refusal says it, and the test of a value (of the
    value and all the settings, `with_args`, for a rule that involves other flags)."""

    requirement: str
    allowed: Callable[..., bool]
    with_args: bool = False


AT_LEAST_ONE = Rule("at least 1", lambda value: value >= 1)
ABOVE_ZERO = Rule("above 0", lambda value: value > 0)
ZERO_OR_MORE = Rule("0 or more", lambda value: value >= 0)
FINITE_ABOVE_ZERO = Rule("a finite number above 0", lambda value: 0 < value < math.inf)
BETWEEN_ZERO_AND_ONE = Rule("between 0 and 1", lambda value: 0 <= value <= 1)

# The rules of the flags every script has. A script declares the rule of a flag of its own with the
# field (`Annotated[float, command_line.ABOVE_ZERO]`); a Literal flag must be one of its choices.
RULES = {
    "env_id": Rule("an environment id such as {default}", lambda value: value.strip() != ""),
    "seed": Rule("a whole number from 0 to 2**31 - 1", lambda value: 0 <= value < 2**31),
    "save_interval": Rule("0 (save only at the end) or more", lambda value: value >= 0),
    "save_minutes": Rule("0 (never save by the clock) or more",
                         lambda value: 0 <= value < math.inf),
    "eval_episodes": AT_LEAST_ONE, "total_timesteps": AT_LEAST_ONE, "num_envs": AT_LEAST_ONE,
    "num_steps": AT_LEAST_ONE, "num_minibatches": AT_LEAST_ONE, "update_epochs": AT_LEAST_ONE,
    "learning_rate": FINITE_ABOVE_ZERO,
    "gamma": BETWEEN_ZERO_AND_ONE, "gae_lambda": BETWEEN_ZERO_AND_ONE,
    "clip_coef": ABOVE_ZERO, "max_grad_norm": ABOVE_ZERO,
    "ent_coef": ZERO_OR_MORE, "vf_coef": ZERO_OR_MORE,
    "target_kl": Rule("above 0 (leave it out to never stop early)",
                      lambda value: value is None or value > 0),
}


class Marker(NamedTuple):
    """A mark on a field, read by parse_args: which runs may give the field another value than the
    checkpoint they read."""

    name: str


RESUME_MAY_CHANGE = Marker("a resumed run may change it: how the run goes, not what it learns")
EVALUATION_MAY_CHANGE = Marker("an evaluation reads it and may change it")
EVALUATION_KEEPS = Marker("an evaluation reads it and keeps the checkpoint's value")
# `cuda: ResumeMayChange[bool] = True`: the field's type, marked. An evaluation starts from the
# defaults of these and may change them too.
ResumeMayChange = Annotated[T, RESUME_MAY_CHANGE]
EvaluationMayChange = Annotated[T, EVALUATION_MAY_CHANGE]
EvaluationKeeps = Annotated[T, EVALUATION_KEEPS]


@dataclass
class RunFlags:
    """The run's flags, the same in every script: its name, seed and device, its logs, checkpoints
    and evaluation, and the speed options. `with_run_flags` puts them after a script's settings."""

    exp_name: str = ""
    """the name of this experiment, part of the run name"""
    seed: EvaluationMayChange[int] = 1
    """seed of the experiment (Python, NumPy, PyTorch and the environments)"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic`"""
    cuda: ResumeMayChange[bool] = True
    """if toggled, use CUDA when it is available"""
    track: ResumeMayChange[bool] = False
    """if toggled, log the run to Weights & Biases (WANDB_MODE=offline works without a network)"""
    wandb_project_name: ResumeMayChange[str] = "ppo-scripts"
    """the Weights & Biases project"""
    wandb_entity: ResumeMayChange[str | None] = None
    """the Weights & Biases entity (team); None uses your default"""
    capture_video: ResumeMayChange[bool] = False
    """if toggled, record videos of the first environment to `videos/<run_name>/`"""
    save_model: ResumeMayChange[bool] = False
    """if toggled, save runs/<run_name>/checkpoint.pt at the end and when a signal stops the run"""
    save_interval: ResumeMayChange[int] = 100
    """with --save-model, also save every this many iterations (0: only at the end)"""
    save_minutes: ResumeMayChange[float] = 0.0
    """with --save-model, also save after this many minutes (0: never): what a crash can lose"""
    resume: ResumeMayChange[str | None] = None
    """path of a checkpoint to continue training from; the run keeps the checkpoint's settings"""
    trust_old_checkpoint: ResumeMayChange[bool] = False
    """if toggled, --resume reads old-format checkpoints, which can run code: only your own files"""
    evaluate: ResumeMayChange[str | None] = None
    """path of a checkpoint to evaluate instead of training"""
    eval_episodes: ResumeMayChange[int] = 10
    """number of episodes (games) to play with --evaluate"""
    compile: ResumeMayChange[bool] = False
    """if toggled, torch.compile the policy step and minibatch loss (pays on a GPU, slow start)"""
    cudagraphs: ResumeMayChange[bool] = False
    """if toggled, compile as --compile does and replay both as CUDA graphs (needs CUDA)"""


def with_run_flags(variant: str) -> Callable[[type], type]:
    """A class decorator: the script's `Args` (a dataclass of its algorithm's settings) followed by
    the run's flags (RunFlags), in one dataclass of the same name, as --help lists them; the
    experiment's name defaults to the script's."""
    def combined(algorithm: type) -> type:
        namespace = {"__module__": algorithm.__module__, "__qualname__": algorithm.__qualname__,
                     "__doc__": algorithm.__doc__, "__annotations__": {"exp_name": str},
                     "exp_name": variant}
        # Fields come in the order of the bases' reversed method resolution: the algorithm's first.
        return dataclass(type(algorithm.__name__, (RunFlags, algorithm), namespace))

    return combined


def marked(args_class: type, marker: Marker) -> set[str]:
    """The fields of `args_class` whose type carries `marker`."""
    hints = typing.get_type_hints(args_class, include_extras=True)
    return {name for name, hint in hints.items() if marker in getattr(hint, "__metadata__", ())}


def parse_args(args_class: type, variant: str, argv: list[str] | None = None,
               doc: str = "") -> tuple[Any, dict | None]:
    """Read the command line into `args_class`; returns the settings and the checkpoint that
    --resume or --evaluate names (None without either), read once, here. --help begins with the
    first two paragraphs of `doc`, the script's docstring: what it is for, and its commands.

    With a checkpoint its settings are the defaults, so `--resume PATH` alone continues the run. A
    resumed run may change only the fields marked ResumeMayChange (how it runs, not what it learns)
    and refuses any other flag that contradicts the checkpoint. An evaluation starts from the
    defaults of those, may change the fields marked EvaluationMayChange too (the seed of its games,
    say), must keep the environment and the fields marked EvaluationKeeps (what the network learned
    with), and refuses every other training flag, which it would silently ignore. --resume,
    --evaluate and --trust-old-checkpoint speak for this command alone: they are never taken from a
    checkpoint."""
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
    run_time = marked(args_class, RESUME_MAY_CHANGE)
    saved = replace(args_class(**checkpoint["args"]), resume=None, evaluate=None,
                    trust_old_checkpoint=False)
    if args.evaluate:
        saved = replace(saved, **{name: getattr(args_class(), name) for name in run_time})
    args = tyro.cli(args_class, args=argv, default=saved, description=description)
    kept = (["env_id", *marked(args_class, EVALUATION_KEEPS)] if args.evaluate else
            [f.name for f in fields(args_class) if f.name not in run_time])
    for name in kept:
        if getattr(args, name) != getattr(saved, name):
            flag = "--" + name.replace("_", "-")
            fail(variant, f"the checkpoint was made with {flag} {getattr(saved, name)}, not "
                          f"{getattr(args, name)}: drop {flag} to keep the checkpoint's value")
    if args.evaluate:
        evaluation_reads = run_time | set(kept) | marked(args_class, EVALUATION_MAY_CHANGE)
        for name in (f.name for f in fields(args_class) if f.name not in evaluation_reads):
            if getattr(args, name) != getattr(saved, name):
                fail(variant, f"--{name.replace('_', '-')} is a training setting, which --evaluate "
                              "does not use: drop it")
    return args, checkpoint


def run_script(main: Callable, evaluate: Callable, args_class: type, variant: str, doc: str,
               pip_extra: str) -> NoReturn:
    """`python ppo/<variant>.py ...`, as `absl.app.run(main)` runs a program: read the command line,
    then train (`main`) or, with --evaluate, play the saved agent (`evaluate`), and exit with 0, or
    with STOPPED (130) when a stop signal ended the training after an iteration; exits.exit_codes
    gives every other ending its code. `pip_extra` is the script's extra in pyproject.toml, named
    when a package is missing."""
    args, checkpoint = parse_args(args_class, variant, doc=doc)
    with exit_codes(variant, pip_extra, args.capture_video):
        result = (evaluate if args.evaluate else main)(args, checkpoint)
    sys.exit(STOPPED if isinstance(result, dict) and result.get("interrupted") else 0)


def check_args(args, variant: str) -> None:
    """Refuse settings that cannot make a run, before anything is built: first each flag on its own
    (RULES, a rule the script declared with its field, a Literal's choices), naming the flag, the
    rule, the value and the default; then the sizes of the batch, num_envs x num_steps transitions,
    which must split into --num-minibatches equal minibatches and fit in --total-timesteps."""
    defaults, hints = type(args)(), typing.get_type_hints(type(args), include_extras=True)
    for field in fields(args):
        hint = hints[field.name]
        rules = [RULES[field.name]] if field.name in RULES else []
        rules += [rule for rule in getattr(hint, "__metadata__", ()) if isinstance(rule, Rule)]
        bare = hint.__origin__ if typing.get_origin(hint) is Annotated else hint
        if typing.get_origin(bare) is typing.Literal:
            choices = typing.get_args(bare)
            rules.append(Rule(" or ".join(choices), lambda value, among=choices: value in among))
        value, default = getattr(args, field.name), getattr(defaults, field.name)
        for requirement, allowed, with_args in rules:
            if not (allowed(value, args) if with_args else allowed(value)):
                fail(variant, f"--{field.name.replace('_', '-')} must be "
                              f"{requirement.format(default=default)}, got {value!r}"
                              + ("" if default is None else f": the default is {default!r}"))
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        fail(variant, f"--num-envs x --num-steps = {batch_size} does not divide into "
                      f"--num-minibatches {args.num_minibatches} equal minibatches: pick sizes "
                      "whose product is a multiple of it")
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        fail(variant, f"minibatches of {batch_size // args.num_minibatches} transition cannot be "
                      "normalized (--norm-adv divides by their standard deviation): use fewer "
                      "--num-minibatches or a larger batch")
    if args.total_timesteps < batch_size:
        fail(variant, f"--total-timesteps {args.total_timesteps} is smaller than one batch "
                      f"(--num-envs x --num-steps = {batch_size}): raise it or shrink the batch")


# Which script of the collection trains on which action space, and on which observations: named in
# the line that refuses an environment, so that the user knows where to go.
SCRIPT_FOR_ACTIONS = {"Discrete": "ppo/ppo.py", "Box": "ppo/ppo_continuous_action.py",
                      "MultiDiscrete": "ppo/ppo_multidiscrete.py"}
SCRIPT_FOR_IMAGES = "ppo/ppo_atari.py"


def check_spaces(envs, env_id: str, variant: str, actions: tuple[type, ...],
                 vector_observations: bool = True) -> None:
    """Refuse environments whose action space is none of `actions`, or (with `vector_observations`)
    whose observations are not flat vectors, naming the script that takes them. `envs` is a vector
    environment, or an envpool, whose spaces are one environment's."""
    action_space = getattr(envs, "single_action_space", None) or envs.action_space
    space = getattr(envs, "single_observation_space", None) or envs.observation_space
    if not isinstance(action_space, actions):
        envs.close()
        kind = type(action_space).__name__
        wanted = " or ".join(space.__name__ for space in actions)
        hint = (f"use {SCRIPT_FOR_ACTIONS[kind]} for {kind} actions" if kind in SCRIPT_FOR_ACTIONS
                else "no script here takes these: expose Discrete, MultiDiscrete or Box actions "
                     "in your environment")
        fail(variant, f"{env_id} has a {kind} action space but {variant}.py needs {wanted} "
                      f"actions: {hint}")
    if vector_observations and (not isinstance(space, gym.spaces.Box) or len(space.shape) != 1):
        envs.close()
        if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            hint = (": flatten them into one vector (gymnasium.wrappers.FlattenObservation) in "
                    "your environment")
        else:
            images = len(getattr(space, "shape", None) or ()) == 3
            hint = f": use {SCRIPT_FOR_IMAGES} for images" if images else ""
        fail(variant, f"{env_id} observations are {type(space).__name__}, but {variant}.py needs "
                      f"flat vectors (a one-dimensional Box){hint}")


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


def check_gymnasium_id(env_id: str, variant: str, atari: bool = False,
                       envpool_namespace: str | None = None) -> None:
    """Refuse an id that gymnasium does not know (`gymnasium_spec`) and, for a script that trains on
    `atari` games, one that is not an ale-py game, naming the script to use instead. ale-py (0.9 and
    later) registers its games only when asked: that is done here, with its banner silenced. For a
    script that also takes envpool's ids of `envpool_namespace` (Jumanji/...), a bare one of them
    (envpool.list_all_envs() lists both) is refused with the id to give."""
    if not atari:
        atari_id = "NoFrameskip" in env_id or env_id.startswith("ALE/")
        hint = " (Atari ids need ppo/ppo_atari.py)" if atari_id else ""
        if envpool_namespace and ":" not in env_id and env_id not in gym.registry:
            with contextlib.suppress(ImportError), contextlib.redirect_stderr(io.StringIO()):
                import envpool

                ported = f"{envpool_namespace}/{env_id}"
                if ported in envpool.list_all_envs():
                    hint = f" (envpool's port of it is {ported}: --env-id {ported})"
        gymnasium_spec(env_id, variant, hint)
        return
    try:
        import ale_py
    except ImportError:
        fail(variant, f"{variant}.py needs ale-py and opencv-python: pip install -e '.[atari]'")
    gym.register_envs(ale_py)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner for every game made
    hint = ""
    if env_id.endswith("-v5") and not env_id.startswith("ALE/"):
        hint = (f" (ale-py names it ALE/{env_id}; envpool ids such as {env_id} need "
                "ppo/ppo_atari_envpool.py)")
    if gymnasium_spec(env_id, variant, hint).entry_point != "ale_py.env:AtariEnv":
        fail(variant, f"{env_id} is not an Atari game of ale-py: {variant}.py trains on Atari "
                      "frames only; use ppo/ppo.py for vector observations and "
                      "ppo/ppo_continuous_action.py for Box actions")


def check_envpool_id(env_id: str, variant: str, kinds: tuple[str, ...] | None,
                     example: str) -> None:
    """Refuse an id that envpool does not have, or one of another kind of task than `kinds` (the
    names of envpool's spec classes, such as AtariEnvSpec; None takes any), naming the script to
    use instead; `example` is an id of the kind the script takes."""
    try:
        # envpool 1.0 imports the retired `gym` package where it is installed (Procgen's extra
        # brings it), and gym prints a notice about itself that concerns no user of this collection.
        with contextlib.redirect_stderr(io.StringIO()):
            import envpool
    except ImportError:
        fail(variant, f"{variant}.py needs envpool: pip install -e '.[envpool]'")
    if env_id not in envpool.list_all_envs():
        hint = ""
        if env_id.endswith("NoFrameskip-v4") or env_id.startswith("ALE/"):
            game = env_id.removeprefix("ALE/").removesuffix("NoFrameskip-v4").removesuffix("-v5")
            hint = (f" (envpool names the game {game}-v5; ale-py ids such as {env_id} need "
                    "ppo/ppo_atari.py)")
        fail(variant, f"unknown env id {env_id!r}{hint}: envpool's ids of this kind are named like "
                      f"{example}")
    kind = type(envpool.make_spec(env_id)).__name__
    if kinds is not None and kind not in kinds:
        fail(variant, f"{env_id} is not a task {variant}.py trains on ({kind}): use ppo/ppo.py for "
                      "vector observations and ppo/ppo_continuous_action.py for Box actions")


# Procgen's 16 games, and the two distribution modes that only some of them have ("exploration" is
# one hard level per game, fixed by Procgen).
PROCGEN_GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball",
                 "fruitbot", "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder",
                 "starpilot")
PROCGEN_MODE_GAMES = {"memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
                      "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper",
                                      "leaper", "maze", "ninja")}


def check_procgen_id(env_id: str, variant: str, distribution_mode: str, num_levels: int,
                     start_level: int, installed: bool) -> None:
    """Refuse a game that Procgen does not have (naming the one meant, or the script to use
    instead), a distribution mode the game lacks, levels the exploration mode does not take, and
    Procgen not `installed` (the script could not import it)."""
    if env_id not in PROCGEN_GAMES:
        hint = ""
        game = next((game for game in PROCGEN_GAMES if game in env_id.lower()), None)
        if "NoFrameskip" in env_id or env_id.startswith("ALE/"):
            hint = " (Atari games need ppo/ppo_atari.py)"
        elif game:  # StarPilot, StarpilotEasy-v0 (envpool), procgen:procgen-starpilot-v0 (gym)
            hint = f" (did you mean {game!r}?)"
        elif env_id in gym.registry:
            hint = " (a gymnasium id: use ppo/ppo.py or ppo/ppo_continuous_action.py for those)"
        fail(variant, f"unknown Procgen game {env_id!r}{hint}: pick one of "
                      f"{', '.join(PROCGEN_GAMES)}")
    mode_games = PROCGEN_MODE_GAMES.get(distribution_mode, PROCGEN_GAMES)
    if env_id not in mode_games:
        fail(variant, f"{env_id} has no {distribution_mode!r} distribution mode: only "
                      f"{', '.join(mode_games)} have it")
    if distribution_mode == "exploration" and (num_levels, start_level) != (0, 0):
        fail(variant, "the exploration mode plays the one level Procgen picks for the game: leave "
                      "out --num-levels and --start-level")
    if not installed:
        fail(variant, "Procgen is not installed: pip install -e \".[procgen]\"")


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
