"""The command line of every script: the run's flags, declared once beside each script's own; a
checkpoint's settings as the defaults of --resume and --evaluate; the rules every flag follows,
checked before anything is built; and the device the flags ask for."""

import math
import sys
import typing
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any, Callable, NamedTuple, NoReturn, TypeVar

import torch
import tyro

from ppo_utils import exits
from ppo_utils.checkpoint import Checkpoint
from ppo_utils.exits import WrongInput

T = TypeVar("T")


class Rule(NamedTuple):
    """What a flag's value must be, as the refusal says it, and the test of a value (of the value
    and all the settings, `with_args`, for a rule that involves other flags)."""

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
    """A mark on a field: which runs may give it another value than the checkpoint they read."""

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
    """The run's flags, the same in every script; `with_run_flags` puts them after a script's."""

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
    evaluate: ResumeMayChange[str | None] = None
    """path of a checkpoint to evaluate instead of training"""
    eval_episodes: ResumeMayChange[int] = 10
    """number of episodes (games) to play with --evaluate"""
    compile: ResumeMayChange[bool] = False
    """if toggled, torch.compile the policy step and minibatch loss (pays on a GPU, slow start)"""
    cudagraphs: ResumeMayChange[bool] = False
    """if toggled, compile as --compile does and replay both as CUDA graphs (needs CUDA)"""


def with_run_flags(variant: str) -> Callable[[type], type]:
    """A class decorator: the script's `Args` followed by the run's flags (RunFlags), in one
    dataclass of the same name, as --help lists them. The class names its script, `variant` (the
    experiment's default name), once for the whole run."""
    def combined(algorithm: type) -> type:
        namespace = {"__module__": algorithm.__module__, "__qualname__": algorithm.__qualname__,
                     "__doc__": algorithm.__doc__, "__annotations__": {"exp_name": str},
                     "exp_name": variant, "variant": variant}
        # Fields come in the order of the bases' reversed method resolution: the algorithm's first.
        return dataclass(type(algorithm.__name__, (RunFlags, algorithm), namespace))

    return combined


def marked(args_class: type, marker: Marker) -> set[str]:
    """The fields of `args_class` whose type carries `marker`."""
    hints = typing.get_type_hints(args_class, include_extras=True)
    return {name for name, hint in hints.items() if marker in getattr(hint, "__metadata__", ())}


def parse_args(args_class: type, argv: list[str] | None = None,
               doc: str = "") -> tuple[Any, Checkpoint | None]:
    """Read the command line into `args_class`; returns the settings and the checkpoint that
    --resume or --evaluate names (None without either). --help begins with the first two paragraphs
    of `doc`, the script's docstring: what it is for, and its commands.

    With a checkpoint its settings are the defaults, so `--resume PATH` alone continues the run. A
    resumed run may change only the fields marked ResumeMayChange (how it runs, not what it learns).
    An evaluation starts from the defaults of those, may change the fields marked
    EvaluationMayChange too (the seed of its games, say), keeps the environment and the fields
    marked EvaluationKeeps, and refuses every other training flag, which it would ignore."""
    description = "\n\n".join(doc.split("\n\n")[:2])
    args = tyro.cli(args_class, args=argv, description=description)
    if args.resume and args.evaluate:
        raise WrongInput("--resume goes on training a saved run and --evaluate plays a saved "
                         "agent: give one of them")
    if not (args.resume or args.evaluate):
        return args, None
    path = args.resume or args.evaluate
    checkpoint = Checkpoint.read(path, args_class.variant)
    unknown = sorted(set(checkpoint.args) - {field.name for field in fields(args_class)})
    if unknown:
        raise WrongInput(f"{path!r} was written by another version of {args_class.variant}.py, "
                         f"with settings this one lacks ({', '.join(unknown)}): continue it with "
                         "that version, or start the run again")
    run_time = marked(args_class, RESUME_MAY_CHANGE)
    saved = replace(args_class(**checkpoint.args), resume=None, evaluate=None)
    if args.evaluate:
        saved = replace(saved, **{name: getattr(args_class(), name) for name in run_time})
    args = tyro.cli(args_class, args=argv, default=saved, description=description)
    kept = (["env_id", *marked(args_class, EVALUATION_KEEPS)] if args.evaluate else
            [f.name for f in fields(args_class) if f.name not in run_time])
    for name in kept:
        if getattr(args, name) != getattr(saved, name):
            flag = "--" + name.replace("_", "-")
            raise WrongInput(f"the checkpoint was made with {flag} {getattr(saved, name)}, not "
                             f"{getattr(args, name)}: drop {flag} to keep the checkpoint's value")
    if args.evaluate:
        evaluation_reads = run_time | set(kept) | marked(args_class, EVALUATION_MAY_CHANGE)
        for name in (f.name for f in fields(args_class) if f.name not in evaluation_reads):
            if getattr(args, name) != getattr(saved, name):
                raise WrongInput(f"--{name.replace('_', '-')} is a training setting, which "
                                 "--evaluate does not use: drop it")
    return args, checkpoint


def run_script(main: Callable, evaluate: Callable, args_class: type, doc: str,
               pip_extra: str) -> NoReturn:
    """`python ppo/<variant>.py ...`, as `absl.app.run(main)` runs a program: read the command line,
    then train (`main`) or, with --evaluate, play the saved agent (`evaluate`), and exit with 0, or
    with STOPPED (130) when a stop signal ended the training after an iteration; exits.exit_codes
    gives every other ending its code and line. `pip_extra` is the script's extra in pyproject.toml,
    named when a package is missing."""
    with exits.exit_codes(f"{args_class.variant}.py"):
        args, checkpoint = parse_args(args_class, doc=doc)
        with exits.missing_packages(pip_extra, args.capture_video):
            result = (evaluate if args.evaluate else main)(args, checkpoint)
    sys.exit(exits.STOPPED if isinstance(result, dict) and result.get("interrupted") else 0)


def check_args(args) -> None:
    """Refuse settings that cannot make a run, before anything is built: each flag on its own
    (RULES, a rule the script declared with its field, a Literal's choices), naming the flag, the
    rule, the value and the default; then the batch, num_envs x num_steps transitions, which must
    split into --num-minibatches equal minibatches and fit in --total-timesteps."""
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
                raise WrongInput(f"--{field.name.replace('_', '-')} must be "
                                 f"{requirement.format(default=default)}, got {value!r}"
                                 + ("" if default is None else f": the default is {default!r}"))
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        raise WrongInput(f"--num-envs x --num-steps = {batch_size} does not divide into "
                         f"--num-minibatches {args.num_minibatches} equal minibatches: pick sizes "
                         "whose product is a multiple of it")
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        raise WrongInput(f"minibatches of {batch_size // args.num_minibatches} transition cannot "
                         "be normalized (--norm-adv divides by their standard deviation): use "
                         "fewer --num-minibatches or a larger batch")
    if args.total_timesteps < batch_size:
        raise WrongInput(f"--total-timesteps {args.total_timesteps} is smaller than one batch "
                         f"(--num-envs x --num-steps = {batch_size}): raise it or shrink the batch")
    if args.cudagraphs and device(args).type != "cuda":
        raise WrongInput("--cudagraphs needs a CUDA device: drop it, or run on a GPU (and without "
                         "--no-cuda)")


def device(args) -> torch.device:
    """CUDA when it is there and --cuda allows it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
