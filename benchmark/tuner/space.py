"""The tuner's search space: the TOML file's parameters and bounds, what a trial samples from them,
the trials --enqueue asks for, and the script's own flags, read from its --help, that they must be.

benchmark/tune.py is the command; this module is one of its parts (benchmark/tuner/: space, study,
runner, worker, report). Wrong input is refused with benchmark/common.py's `fail`, which tune.py's
main prints as its one line (exit 2).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from benchmark.common import fail

# What the tuner gives every run itself; the command and the space may not set them.
RESERVED_FLAGS = {"env-id", "seed", "total-timesteps", "save-model", "save-minutes", "resume",
                  "evaluate"}


@dataclass
class Param:
    """One entry of the space: `name` is the script's flag without its dashes (`learning-rate`)."""

    name: str
    distribution: object       # an optuna distribution
    when: dict[str, list]      # sampled only when each named parameter has one of these values
    flag: bool = True          # false: a switch of the space only (it decides a `when`), not passed

    def arguments(self, value) -> list[str]:
        """The flag as the scripts read it: `--name value`; a boolean's `--name` / `--no-name`."""
        if not self.flag:
            return []
        if isinstance(value, bool):
            return [f"--{self.name}" if value else f"--no-{self.name}"]
        return [f"--{self.name}", str(value)]


@dataclass
class Space:
    params: list[Param]
    bounds: dict[str, tuple[float, float]]  # env id -> (low, high) of the min-max normalization
    text: str                               # the file as read, kept in the study

    def sample(self, trial) -> dict:
        """The trial's values, a parameter whose `when` does not hold left out (the script's default
        then applies). A retried or enqueued trial gets its stored values back from Optuna."""
        values = {}
        for param in self.params:
            if all(values.get(other, object()) in allowed for other, allowed in param.when.items()):
                values[param.name] = suggest(trial, param.name, param.distribution)
        return values

    def arguments(self, values: dict) -> list[str]:
        return [token for param in self.params if param.name in values
                for token in param.arguments(values[param.name])]

    def normalize(self, env_id: str, value: float) -> float:
        low, high = self.bounds[env_id]
        return (value - low) / (high - low)


def suggest(trial, name: str, distribution):
    """Sample (or get back) one value through Optuna's public suggest_* calls."""
    import optuna

    if isinstance(distribution, optuna.distributions.FloatDistribution):
        return trial.suggest_float(name, distribution.low, distribution.high, log=distribution.log,
                                   step=distribution.step)
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step,
                                 log=distribution.log)
    return trial.suggest_categorical(name, distribution.choices)


PARAM_KEYS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"},
              "categorical": {"choices"}}


def load_space(path: Path, env_ids: list[str]) -> Space:
    """Read and check a space file; anything wrong is one line and exit 2, before any trial runs.

        [params.learning-rate]        # a flag of the script, without its dashes
        type = "float"                # float or int (low, high, log, step), categorical (choices)
        low = 1e-5
        high = 1e-2
        log = true
        [params.target-kl]
        type = "float"
        low = 0.005
        high = 0.05
        when = { early-stop = true }  # sampled only when early-stop is true (given a list:
                                      # when early-stop is one of its values)
        [params.early-stop]           # must come before the parameters whose `when` names it
        type = "categorical"
        choices = [false, true]
        flag = false                  # a switch of the space, not a flag of the script
        [bounds]
        "CartPole-v1" = [0, 500]      # the env's return that normalizes to 0, and to 1
    """
    text, data = read_toml(path)
    where = f"the space file {path}"
    unknown = set(data) - {"params", "bounds"}
    if unknown:
        fail(f"{where}: unknown table(s) {', '.join(sorted(unknown))}: "
             "it holds [params.<flag>] and [bounds]")
    if not isinstance(data.get("params"), dict) or not data["params"]:
        fail(f"{where} has no [params.<flag>] table: give at least one flag to tune")
    params: list[Param] = []
    for name, entry in data["params"].items():
        params.append(read_param(f"{where}: [params.{name}]", name, entry, params))
    return Space(params, read_bounds(where, data, env_ids), text)


def read_toml(path: Path) -> tuple[str, dict]:
    """The space file's text and its tables."""
    try:
        text = path.read_text()
        return text, tomllib.loads(text)
    except OSError as error:
        fail(f"cannot read the space file {path} ({error.strerror}): "
             "give an existing TOML file to --space")
    except tomllib.TOMLDecodeError as error:
        fail(f"the space file {path} is not valid TOML ({error}): fix it")


def read_param(label: str, name: str, entry, earlier: list[Param]) -> Param:
    """One [params.<flag>] table, checked against the parameters above it (`earlier`)."""
    if name.startswith("-") or name.replace("_", "-") != name:
        fail(f"{label}: name the flag as the script spells it, without its dashes (learning-rate)")
    if name in RESERVED_FLAGS:
        fail(f"{label}: the tuner sets --{name} itself "
             f"({', '.join(sorted(RESERVED_FLAGS))}): leave it out")
    if not isinstance(entry, dict) or entry.get("type") not in PARAM_KEYS:
        fail(f"{label}: give a type, one of float, int, categorical")
    kind = entry["type"]
    extra = set(entry) - PARAM_KEYS[kind] - {"type", "when", "flag"}
    if extra:
        fail(f"{label}: unknown key(s) {', '.join(sorted(extra))} for type {kind} "
             f"(it takes {', '.join(sorted(PARAM_KEYS[kind] | {'when', 'flag'}))})")
    try:
        distribution = read_distribution(kind, entry)
    except (ValueError, TypeError) as error:
        fail(f"{label}: {error}")
    conditions = read_when(label, entry.get("when", {}), earlier)
    if not isinstance(entry.get("flag", True), bool):
        fail(f"{label}: flag is true (the default: pass it to the script) or false "
             "(a switch of the space)")
    return Param(name, distribution, conditions, entry.get("flag", True))


def read_distribution(kind: str, entry: dict):
    """A parameter table's optuna distribution; a ValueError or TypeError says what is wrong."""
    import optuna

    if kind == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list) or not choices or any(
                not isinstance(choice, (bool, int, float, str)) for choice in choices):
            raise ValueError("choices must be a non-empty list of booleans, numbers or strings")
        return optuna.distributions.CategoricalDistribution(choices)
    number = float if kind == "float" else int
    if not all(isinstance(entry.get(key), (int, float)) and not isinstance(entry.get(key), bool)
               for key in ("low", "high")):
        raise ValueError("low and high must be numbers")
    if kind == "int" and not all(isinstance(entry[key], int) for key in ("low", "high")):
        raise ValueError("low and high of an int must be integers")
    if not entry["low"] < entry["high"]:
        raise ValueError(f"low ({entry['low']}) must be below high ({entry['high']})")
    step = entry.get("step", None if kind == "float" else 1)
    return (optuna.distributions.FloatDistribution if kind == "float" else
            optuna.distributions.IntDistribution)(
        number(entry["low"]), number(entry["high"]), log=bool(entry.get("log", False)), step=step)


def read_when(label: str, when, earlier: list[Param]) -> dict[str, list]:
    """A parameter's `when`: each name a categorical above it, each value one of its choices."""
    if not isinstance(when, dict):
        fail(f"{label}: when = {{ other-flag = value }} (or a list of values)")
    conditions = {}
    for other, allowed in when.items():
        named = next((param for param in earlier if param.name == other), None)
        if named is None:
            fail(f"{label}: `when` names {other}, which is not a parameter above it: "
                 f"define {other} first")
        allowed = allowed if isinstance(allowed, list) else [allowed]
        choices = getattr(named.distribution, "choices", None)
        if choices is None or any(value not in choices for value in allowed):
            fail(f"{label}: `when` needs {other} to be a categorical whose choices include "
                 f"{', '.join(map(str, allowed))}")
        conditions[other] = allowed
    return conditions


def read_bounds(where: str, data: dict, env_ids: list[str]) -> dict[str, tuple[float, float]]:
    """[bounds]: each env id's (low, high), one for every env id the study runs on."""
    bounds = {}
    for env_id, pair in (data.get("bounds") or {}).items():
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(v, (int, float)) for v in pair) or not pair[0] < pair[1]):
            fail(f"{where}: [bounds] \"{env_id}\" must be [low, high], "
                 "two numbers with low below high")
        bounds[env_id] = (float(pair[0]), float(pair[1]))
    missing = [env_id for env_id in env_ids if env_id not in bounds]
    if missing:
        fail(f"{where} has no [bounds] for {', '.join(missing)}: "
             f"add \"{missing[0]}\" = [low, high] (the returns that normalize to 0 and 1, "
             "e.g. a random policy's and a good one's)")
    return bounds


def load_space_text(text: str) -> Space:
    """A space as stored in the study (its definition keeps the file's text)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as file:
        file.write(text)
    try:
        return load_space(Path(file.name), [])
    finally:
        os.unlink(file.name)


def in_space(distribution, value) -> bool:
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return value in choices
    # an IntDistribution's bounds are ints
    kinds = int if isinstance(distribution.low, int) else (int, float)
    return (isinstance(value, kinds) and not isinstance(value, bool)
            and distribution.low <= value <= distribution.high)


def parse_value(text: str):
    """A value as the scripts' command line reads it: an int, else a float, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def enqueued_values(space: Space, flags: str) -> dict:
    """--enqueue: the values of a trial to run first, read from flags as the scripts take them."""
    tokens, values = shlex.split(flags), {}
    params = {param.name: param for param in space.params}
    while tokens:
        token = tokens.pop(0)
        name = token[2:]
        negated = name.startswith("no-") and params.get(name[3:]) is not None
        param = params.get(name[3:] if negated else name)
        if not token.startswith("--") or param is None:
            fail(f"--enqueue {flags!r}: {token} is not a flag of the space ({', '.join(params)})")
        if negated or not tokens or tokens[0].startswith("--"):  # --flag / --no-flag: a boolean
            value = not negated
        else:
            value = parse_value(tokens.pop(0))
        if not in_space(param.distribution, value):
            fail(f"--enqueue {flags!r}: {token} {value} is not in the space")
        values[param.name] = value
    return values


# --------------------------------------------------------------------------------------------------
# The script's own flags, read from its --help
# --------------------------------------------------------------------------------------------------

# An option's line starts with its flags (`--env-id STR`, `--anneal-lr, --no-anneal-lr`,
# `-e ENV, --env-id ENV`), then two spaces or more, then its help, which may end in `(default: X)`.
OPTION = re.compile(r"(?:^|, )--([A-Za-z0-9][\w.-]*)")
DEFAULT = re.compile(r"\(default: ([^()]*)\)")


def script_options(command: list[str], resolved: list[str], script: str) -> dict[str, str | None]:
    """The long flags the script's `--help` lists (without their dashes), each with the default it
    shows, as tyro and argparse's ArgumentDefaultsHelpFormatter print it, or None. A wide COLUMNS
    keeps each option's flags and help on one line; tyro draws a box around them, taken off here."""
    shown = f"`{shlex.join([*command, '--help'])}`"
    try:
        result = subprocess.run([*resolved, "--help"], capture_output=True, text=True, timeout=300,
                                stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "400"})
    except subprocess.TimeoutExpired:
        fail(f"--command: {shown} did not answer in 300 s: "
             f"the tuner reads {script}'s flags from it")
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        fail(f"--command: {shown} exited {result.returncode} ({said}): the tuner reads {script}'s "
             "flags from it, so it must run")
    options: dict[str, str | None] = {}
    flags: list[str] = []
    for line in result.stdout.splitlines():
        text = line.strip().strip("\u2502|").strip()
        column = re.split(r"\s{2,}", text, maxsplit=1)[0] if text.startswith("-") else ""
        if OPTION.findall(column):  # a new option; else a line of the current one's help
            flags = OPTION.findall(column)
            options.update({flag: None for flag in flags if flag not in options})
            text = text[len(column):]
        default = DEFAULT.search(text)
        if default and flags:
            options[flags[0]] = default.group(1).strip()
    return options


def check_flags(command: list[str], space: Space, space_path: Path, options: dict,
                script: str) -> None:
    """Refuse, before any trial, a flag that the script does not take: each run of every trial would
    stop on it (exit 2) and the study would end with nothing but failed trials. The flags are those
    of --command after the script (a launcher's own, torchrun's, come before it), each value a
    boolean parameter of the space can take (--flag, --no-flag), and the ones the tuner gives."""
    if not options:
        fail(f"--command: {script}'s --help lists no --flags: the tuner checks the space's flags "
             "against them, so it needs a script whose --help lists its options")
    start = next((i + 1 for i, token in enumerate(command) if token.endswith(".py")), 1)
    fix = ": fix the name, or leave the flag out"
    needed = [(token[2:].split("=")[0], "--command: ", fix)
              for token in command[start:] if token.startswith("--")]
    for param in space.params:
        if param.flag:
            choices = getattr(param.distribution, "choices", None) or [None]
            needed += [(name, f"the space file {space_path}: ", fix)
                       for name in dict.fromkeys(param.arguments(choice)[0][2:]
                                                 if isinstance(choice, bool) else param.name
                                                 for choice in choices)]
    needed += [(name, "", ", and the tuner gives it to every run: tune a script that takes the "
                "flags of ppo/'s scripts") for name in sorted(RESERVED_FLAGS - {"evaluate"})]
    for name, where, hint in needed:
        if name not in options:
            fail(f"{where}--{name} is not a flag of {script} (its --help lists no --{name}){hint}")
