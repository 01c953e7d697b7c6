"""Bad input, typed as a new user would, in all eight scripts: for every numeric and choice flag,
values that the rules (command_line.check_args: the shared RULES, and those a script declares with
its field) must refuse with one line `<script>.py: error: ...` and exit code 2, before any
environment is built. One table for all scripts, so a script cannot silently miss a rule, and a
check that every such field of each script's Args has a row, so a new field cannot arrive unchecked.

Each case runs in process (parse_args, then main or evaluate) and stops in check_args, so the whole
table takes a few seconds. Flags that tyro itself refuses while parsing (a choice outside a Literal)
get its own usage message, also with exit code 2 and no traceback; check_args refuses the same
values when Args is built in Python."""

import importlib
import typing
from dataclasses import fields

import pytest

from conftest import expect_usage_error, parse_args, write_checkpoint

from ppo_utils import command_line  # noqa: E402
from ppo_utils import exits  # noqa: E402

SCRIPTS = ["ppo", "ppo_atari", "ppo_atari_lstm", "ppo_atari_envpool", "ppo_continuous_action",
           "ppo_procgen", "ppo_atari_multigpu", "ppo_multidiscrete"]

# Values every script must refuse, as they are typed on the command line.
COMMON = {
    "env_id": [""],
    "seed": ["-1", str(2**31)],
    "save_interval": ["-1"],
    "save_minutes": ["-1", "nan", "inf"],
    "eval_episodes": ["0", "-3"],
    "watch_fps": ["0", "-5", "nan", "inf"],
    "total_timesteps": ["0"],
    "learning_rate": ["0", "-2.5e-4", "nan", "inf"],
    "num_envs": ["0"],
    "num_steps": ["0"],
    "gamma": ["-0.1", "1.5"],
    "gae_lambda": ["-0.1", "1.01"],
    "num_minibatches": ["0"],
    "update_epochs": ["0"],
    "clip_coef": ["0", "-0.2"],
    "ent_coef": ["-0.01"],
    "vf_coef": ["-0.5"],
    "max_grad_norm": ["0", "-1"],
    "target_kl": ["0", "-0.01"],
}
# The flags only some scripts have.
SPECIFIC = {
    "ppo_continuous_action": {"obs_clip": ["0", "-10"], "reward_clip": ["0", "-10"]},
    "ppo_procgen": {"distribution_mode": ["medium", ""], "num_levels": ["-1"],
                    "start_level": ["-1"], "reward_clip": ["0"]},
    "ppo_atari_multigpu": {"device_ids": ["-1"]},
}
# Choice flags that tyro refuses itself (Literal types): refused in Python by check_args too.
PARSED_BY_TYRO = {"ppo_atari_multigpu": {"backend": "mpi"}}
# Free text that needs no rule: names, checkpoint paths (load_checkpoint refuses a bad one), and
# --export's folder (refused where it exists and holds files).
FREE_TEXT = {"exp_name", "wandb_project_name", "wandb_entity", "resume", "evaluate", "export"}


def table(script: str) -> dict[str, list[str]]:
    return {**COMMON, **SPECIFIC.get(script, {})}


CASES = [(script, name, value) for script in SCRIPTS for name, values in table(script).items()
         for value in values]


def load(script: str):
    return importlib.import_module(f"ppo.{script}")


@pytest.fixture(autouse=True, scope="module")
def import_every_script():
    """Import the scripts first: a library's import-time warnings (envpool 1.0 imports gym, which
    prints a notice) must not land in the stderr a test reads."""
    for script in SCRIPTS:
        load(script)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_command(module, argv: list[str]):
    """What `python ppo/<script>.py argv...` runs, in this process: main, or evaluate with
    --evaluate."""
    args, checkpoint = parse_args(module, argv)
    return (module.evaluate if args.evaluate else module.main)(args, checkpoint)


@pytest.mark.parametrize("script,name,value", CASES, ids=[f"{s}-{n}={v!r}" for s, n, v in CASES])
def test_a_bad_value_stops_with_one_line_before_anything_is_built(
        script, name, value, capsys, workdir, monkeypatch):
    module = load(script)

    def nothing_may_be_built(*args, **kwargs):
        raise AssertionError(f"{script}.py built its environments before refusing "
                             f"{flag(name)} {value!r}")

    monkeypatch.setattr(module, "make_envs", nothing_may_be_built)
    argv = [flag(name), value, "--no-cuda"]
    expect_usage_error(capsys, lambda: run_command(module, argv), f"{script}.py",
                       flag(name), "must be")
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("script", sorted(PARSED_BY_TYRO))
def test_a_choice_outside_a_literal_is_refused_by_the_parser_and_by_check_args(
        script, capsys, workdir):
    module = load(script)
    for name, value in PARSED_BY_TYRO[script].items():
        with pytest.raises(SystemExit) as stop:
            parse_args(module, [flag(name), value])
        assert stop.value.code == 2
        error = capsys.readouterr().err
        assert "Traceback" not in error and value in error and flag(name) in error, error
        args = module.Args(**{name: value}, cuda=False)
        expect_usage_error(capsys, lambda: module.main(args), f"{script}.py", flag(name), "must be")


def checked_fields(script: str) -> set[str]:
    """The fields of a script's Args that need a rule: every one but booleans and free text."""
    args_class = load(script).Args
    hints = typing.get_type_hints(args_class)
    return {f.name for f in fields(args_class)
            if hints[f.name] is not bool and f.name not in FREE_TEXT}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_numeric_and_choice_field_has_a_row(script):
    rows = set(table(script)) | set(PARSED_BY_TYRO.get(script, {}))
    missing = checked_fields(script) - rows
    assert not missing, (f"{script}.py: give {sorted(missing)} a rule in check_args and a row "
                         "in this table")
    assert not rows - checked_fields(script), (f"{script}.py has no field "
                                               f"{sorted(rows - checked_fields(script))}")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_defaults_pass_the_checks(script):
    module = load(script)
    command_line.check_args(module.Args())


@pytest.mark.parametrize("script", SCRIPTS)
def test_flags_given_with_resume_or_evaluate_are_checked_too(script, capsys, workdir):
    """--resume and --evaluate read the checkpoint's settings first; the flags given beside them
    (run-time options such as --save-interval and --eval-episodes) still meet their rules."""
    module = load(script)
    path = str(workdir / "checkpoint.pt")
    write_checkpoint(path, module)
    for argv, name in ((["--evaluate", path, "--eval-episodes", "0"], "eval_episodes"),
                       (["--resume", path, "--save-interval", "-1"], "save_interval")):
        expect_usage_error(capsys, lambda: run_command(module, argv), f"{script}.py",
                           flag(name), "must be")
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_resume_refuses_a_changed_hyperparameter_and_takes_run_time_options(
        script, capsys, workdir):
    """A resumed run must end where the unbroken one ends: a changed hyperparameter (--gamma,
    --update-epochs, --total-timesteps) is refused by name, while what only changes how the run is
    carried out (--compile, --save-interval, --no-cuda) is taken. An evaluation starts from the
    run-time defaults, not from the training run's: a run trained with --capture-video and
    --cudagraphs is evaluated without video and, on a machine without CUDA, at all."""
    module = load(script)
    path = str(workdir / "checkpoint.pt")
    write_checkpoint(path, module,
                     module.Args(capture_video=True, cudagraphs=True, save_interval=5))
    # --total-timesteps too: the learning rate falls to 0 at the end it sets, so another end is
    # another run
    for name, value in (("gamma", "0.5"), ("update_epochs", "7"), ("total_timesteps", "999")):
        expect_usage_error(capsys,
                           lambda: parse_args(module, ["--resume", path, flag(name), value]),
                           f"{script}.py", f"made with {flag(name)}", f"drop {flag(name)}")
    resumed, _ = parse_args(module,
                            ["--resume", path, "--compile", "--save-interval", "3", "--no-cuda"])
    assert (resumed.compile and resumed.save_interval == 3 and not resumed.cuda
            and resumed.capture_video)
    evaluation, _ = parse_args(module, ["--evaluate", path])
    assert not (evaluation.capture_video or evaluation.cudagraphs)
    assert evaluation.save_interval == module.Args().save_interval


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_and_evaluate_together_are_refused(script, capsys, workdir):
    """Each would read its own checkpoint's settings; together they evaluated one run's weights in
    the other's environment (a traceback when the two games had different actions)."""
    module = load(script)
    path = str(workdir / "checkpoint.pt")
    write_checkpoint(path, module)
    expect_usage_error(capsys, lambda: parse_args(module, ["--resume", path, "--evaluate", path]),
                       f"{script}.py", "--resume", "--evaluate", "give one of them")


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_evaluation_refuses_the_training_flags_it_would_not_use(script, capsys, workdir):
    """--evaluate with --num-envs 3 used to evaluate as if it were not there, while
    --num-minibatches 7 was refused by a rule about training minibatches. Every training flag is now
    refused, by name; the settings an evaluation reads (marked EvaluationMayChange: the seed, and
    Procgen's levels) may change."""
    module = load(script)
    path = str(workdir / "checkpoint.pt")
    write_checkpoint(path, module)
    for name, value in (("num_minibatches", "7"), ("num_envs", "3"), ("learning_rate", "0.1")):
        expect_usage_error(
            capsys, lambda: parse_args(module, ["--evaluate", path, flag(name), value]),
            f"{script}.py", f"{flag(name)} is a training setting, which --evaluate does not use")
    evaluation_flags = {"seed": "9", "distribution_mode": "hard", "num_levels": "0",
                        "start_level": "5"}
    evaluation_fields = command_line.marked(module.Args, command_line.EVALUATION_MAY_CHANGE)
    assert "seed" in evaluation_fields and evaluation_fields <= evaluation_flags.keys()
    for name in evaluation_fields:
        args, _ = parse_args(module, ["--evaluate", path, flag(name), evaluation_flags[name]])
        assert str(getattr(args, name)) == evaluation_flags[name]


@pytest.mark.parametrize("script", SCRIPTS)
def test_minibatches_of_one_transition_are_refused_when_advantages_are_normalized(
        script, capsys, workdir):
    """A one-transition minibatch has no standard deviation: normalizing its advantage would make
    the weights NaN one update later. Refused in one line; without --norm-adv such a minibatch is
    allowed."""
    module = load(script)
    checks = command_line.check_args
    sizes = dict(num_envs=4, num_steps=1, num_minibatches=4, total_timesteps=8, cuda=False)
    expect_usage_error(capsys, lambda: checks(module.Args(**sizes)), f"{script}.py",
                       "minibatches of 1 transition", "--num-minibatches")
    checks(module.Args(**sizes, norm_adv=False))


# What each script needs installed to reach its first reset, by the names the Procgen stack
# recognizes (tests/conftest.py marks the ppo_procgen case `procgen`).
NEEDS = {"ppo_atari": ("ale_py", "cv2"), "ppo_atari_lstm": ("ale_py", "cv2"),
         "ppo_atari_multigpu": ("ale_py", "cv2"), "ppo_atari_envpool": ("envpool",),
         "ppo_procgen": ("procgen",), "ppo_multidiscrete": ("envpool",)}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_refusal_at_the_first_reset_comes_before_the_run_claims_its_folder(
        script, capsys, workdir, monkeypatch):
    """Wrong input that shows only once the environments play: a first observation or action mask
    the script refuses (ppo_multidiscrete.py's masks), a package an environment needs only when it
    resets. Planted in each script as a refusal of its first reset: the run claims its folder and
    opens its logs only as its first iteration begins, after that reset, so nothing is left
    behind."""
    for package in NEEDS.get(script, ()):
        pytest.importorskip(package)
    module = load(script)
    build, folders_at_the_refusal = module.make_envs, []

    def refusing_the_first_reset(*args, **kwargs):
        envs = build(*args, **kwargs)

        def reset(**options):
            folders_at_the_refusal.extend((workdir / "runs").glob("*"))
            raise exits.WrongInput("the first observation is refused")

        envs.reset = reset
        return envs

    monkeypatch.setattr(module, "make_envs", refusing_the_first_reset)
    expect_usage_error(capsys, lambda: run_command(module, ["--num-envs", "4", "--no-cuda"]),
                       f"{script}.py", "the first observation is refused")
    assert folders_at_the_refusal == [] and not (workdir / "runs").exists()
