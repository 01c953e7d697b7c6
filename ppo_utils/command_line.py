"""The command line of every script: the run's flags beside the script's own, a checkpoint's
settings as the defaults of --resume and --evaluate, and the rules every flag follows."""

import math
import os
import sys
import typing
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any, Callable, NamedTuple, NoReturn, TypeVar

import torch
import tyro

from ppo_utils import exits, run_logs
from ppo_utils.checkpoint import Checkpoint
from ppo_utils.exits import WrongInput

T = TypeVar("T")


class Rule(NamedTuple):
    """What a flag must be, as a refusal says it, and its test (`with_args`: of value and args)."""

    requirement: str
    allowed: Callable[..., bool]
    with_args: bool = False


AT_LEAST_ONE = Rule("at least 1", lambda value: value >= 1)
ABOVE_ZERO = Rule("above 0", lambda value: value > 0)
ZERO_OR_MORE = Rule("0 or more", lambda value: value >= 0)
FINITE_ABOVE_ZERO = Rule("a finite number above 0", lambda value: 0 < value < math.inf)
BETWEEN_ZERO_AND_ONE = Rule("between 0 and 1", lambda value: 0 <= value <= 1)

# The flags every script has; a script's own carry theirs (`Annotated[float, ABOVE_ZERO]`).
RULES = {
    "env_id": Rule("an environment id such as {default}", lambda value: value.strip() != ""),
    "seed": Rule("a whole number from 0 to 2**31 - 1", lambda value: 0 <= value < 2**31),
    "save_interval": Rule("0 (save only at the end) or more", lambda value: value >= 0),
    "save_minutes": Rule("0 (never save by the clock) or more",
                         lambda value: 0 <= value < math.inf),
    "watch_fps": Rule("above 0 (leave it out for the game's own rate)",
                      lambda value: value is None or 0 < value < math.inf),
    "eval_episodes": AT_LEAST_ONE, "total_timesteps": AT_LEAST_ONE, "num_envs": AT_LEAST_ONE,
    "num_steps": AT_LEAST_ONE, "num_minibatches": AT_LEAST_ONE, "update_epochs": AT_LEAST_ONE,
    "learning_rate": FINITE_ABOVE_ZERO,
    "gamma": BETWEEN_ZERO_AND_ONE, "gae_lambda": BETWEEN_ZERO_AND_ONE,
    "clip_coef": ABOVE_ZERO, "max_grad_norm": ABOVE_ZERO,
    "ent_coef": ZERO_OR_MORE, "vf_coef": ZERO_OR_MORE,
    "target_kl": Rule("above 0 (leave it out to never stop early)",
                      lambda value: value is None or value > 0),
}


# Which runs may change a field's value from the checkpoint's (`cuda: ResumeMayChange[bool]`): an
# evaluation starts from the defaults of the ResumeMayChange fields.
RESUME_MAY_CHANGE = "a resumed run may change it: how the run goes, not what it learns"
EVALUATION_MAY_CHANGE = "an evaluation reads it and may change it"
EVALUATION_KEEPS = "an evaluation reads it and keeps the checkpoint's value"
ResumeMayChange = Annotated[T, RESUME_MAY_CHANGE]
EvaluationMayChange = Annotated[T, EVALUATION_MAY_CHANGE]
EvaluationKeeps = Annotated[T, EVALUATION_KEEPS]


@dataclass
class RunFlags:
    """The run's flags, the same in every script, after its own (`with_run_flags`)."""

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
    watch: ResumeMayChange[bool] = False
    """with --evaluate, show the agent playing in a window"""
    watch_fps: ResumeMayChange[float | None] = None
    """frames a second --watch shows; None: the environment's own rate"""
    export: ResumeMayChange[str | None] = None
    """with --evaluate, write the agent, its evaluation and a model card to this new folder"""
    compile: ResumeMayChange[bool] = False
    """if toggled, torch.compile the policy step and minibatch loss (pays on a GPU, slow start)"""
    cudagraphs: ResumeMayChange[bool] = False
    """if toggled, compile as --compile does and replay both as CUDA graphs (needs CUDA)"""


def with_run_flags(variant: str) -> Callable[[type], type]:
    """The script's `Args`, then RunFlags; `variant` names the script for the whole run."""
    def combined(algorithm: type) -> type:
        namespace = {"__module__": algorithm.__module__, "__qualname__": algorithm.__qualname__,
                     "__doc__": algorithm.__doc__, "__annotations__": {"exp_name": str},
                     "exp_name": variant, "variant": variant}
        # fields in the bases' reversed method resolution order: the algorithm's first
        return dataclass(type(algorithm.__name__, (RunFlags, algorithm), namespace))

    return combined


def marked(args_class: type, marker: str) -> set[str]:
    hints = typing.get_type_hints(args_class, include_extras=True)
    return {name for name, hint in hints.items() if marker in getattr(hint, "__metadata__", ())}


def parse_args(args_class: type, argv: list[str] | None = None,
               doc: str = "") -> tuple[Any, Checkpoint | None]:
    """The command line as `args_class`, and the checkpoint --resume or --evaluate names (or None),
    whose settings are the defaults. A resumed run may change only the ResumeMayChange fields; an
    evaluation those and the EvaluationMayChange ones, and refuses every training flag."""
    description = "\n\n".join(doc.split("\n\n")[:2])
    args = tyro.cli(args_class, args=argv, description=description)
    if args.resume and args.evaluate:
        raise WrongInput("--resume goes on training a saved run and --evaluate plays a saved "
                         "agent: give one of them")
    if not (args.resume or args.evaluate):
        return args, None
    path = args.resume or args.evaluate
    if args.resume and os.path.isdir(path):
        raise WrongInput(f"--resume {path}: that folder is an exported agent, which --evaluate "
                         "plays; resume its run from the checkpoint in runs/")
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
    """`python ppo/<variant>.py ...`: read the command line, train (`main`) or play the saved agent
    (`evaluate`), and exit with the ending's code (exits); `pip_extra` is the script's extra."""
    run_logs.script_as_run = sys.argv[0]
    with exits.exit_codes(f"{args_class.variant}.py"):
        args, checkpoint = parse_args(args_class, doc=doc)
        with exits.missing_packages(pip_extra, args.capture_video):
            result = (evaluate if args.evaluate else main)(args, checkpoint)
    sys.exit(exits.STOPPED if isinstance(result, dict) and result.get("interrupted") else 0)


def check_args(args) -> None:
    """Refuse settings that cannot make a run: a flag that breaks its rules (RULES, the script's, a
    Literal's choices), a batch that does not split or fit, --cudagraphs without CUDA."""
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
    for flag, given in (("--watch", args.watch), ("--export", args.export)):
        if given and not args.evaluate:
            raise WrongInput(f"{flag} goes with --evaluate CHECKPOINT: it shows or exports a saved "
                             "agent")
    if args.watch_fps is not None and not args.watch:
        raise WrongInput("--watch-fps sets --watch's frame rate: add --watch, or drop it")
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
    return torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
