"""Helpers shared by the tests: running a script as a user would, and reading what it logged."""

import contextlib
import importlib.util
import os
import re
import runpy
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# How long a test waits for a process it started (a script's run, a tool, a Slurm job) before it
# calls it hung. The limits are for hangs alone, not for speed: the longest wait of a quiet 2-core
# machine, a two-rank torchrun group beside its twin, takes about 25 s, but a loaded machine (a
# second suite, a laptop at work) stretches it several times over, and a CI run once timed out at a
# 120 s limit that way. A hung process fails its test after 15 minutes with what it printed, well
# inside CI's 90.
HUNG_AFTER = 900


# The metrics every script logs, under exactly these names (CONTRIBUTING.md).
METRICS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
           "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl",
           "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"]


def is_a_procgen_test(item: pytest.Item) -> bool:
    """A test of ppo_procgen.py: in its test file, parametrized with the script (test_algorithm.py,
    test_bad_input.py, test_checkpoints.py), or named `test_procgen_...` (test_observations.py)."""
    parameters = getattr(item, "callspec", None)
    return (item.path.name == "test_ppo_procgen.py" or item.originalname.startswith("test_procgen_")
            or "ppo_procgen" in (parameters.params.values() if parameters else ()))


# The files that hold the Procgen tests this run collected, as tests/<name> (tests/test_locks.py
# holds them to the Procgen stack's files in noxfile.py).
PROCGEN_TEST_FILES = pytest.StashKey[set]()


def pytest_collection_modifyitems(config, items):
    """Mark the Procgen tests `procgen`: Procgen holds NumPy below 2, so they run in a stack of
    their own (`nox -s procgen`: `-m procgen`), and the main stack runs the others
    (`-m "not procgen"`)."""
    config.stash[PROCGEN_TEST_FILES] = set()
    for item in items:
        if is_a_procgen_test(item):
            item.add_marker(pytest.mark.procgen)
            config.stash[PROCGEN_TEST_FILES].add(f"tests/{item.path.name}")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One PyTorch thread in the test process, as script_environment gives the runs it starts:
    pytest-xdist runs a worker per core, and workers with a thread per core each would fight over
    the cores (PyTorch's threads wait for each other by spinning)."""
    torch = sys.modules.get("torch")  # imported by the test's module, if it needs it
    if torch is None or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def parse_args(script, argv: list[str]):
    """What `python ppo/<script>.py argv...` reads before it runs (command_line.parse_args): the
    settings and the checkpoint that --resume or --evaluate names."""
    from ppo_utils import command_line

    return command_line.parse_args(script.Args, argv, doc=script.__doc__)


def write_checkpoint(path, script, args=None, model: dict | None = None, **fields) -> str:
    """A checkpoint of `script` at `path` that holds the settings `args` (its defaults if None), the
    weights `model` and `fields` of ppo_utils.checkpoint.Checkpoint: what --evaluate and the checks
    of --resume read, for tests that need no trained run. Returns the path, as a string."""
    from dataclasses import asdict

    from ppo_utils.checkpoint import Checkpoint

    saved = dict(variant=script.VARIANT, args=asdict(args or script.Args()), run_name="saved",
                 model=model or {}, optimizer={}, iteration=0, global_step=0, recent_returns=[],
                 processes=[])
    Checkpoint(**{**saved, **fields}).write(str(path))
    return str(path)


def script_environment(env: dict | None = None) -> dict:
    """The environment of a script run from a test: the tests' own, unbuffered, with `env`, and one
    PyTorch thread unless OMP_NUM_THREADS says otherwise (see one_torch_thread)."""
    return {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


@pytest.fixture(autouse=True)
def signal_handlers_put_back():
    """A test that calls a script's machinery in this process (exits.exit_codes, training.Run) may
    leave its handlers for Ctrl-C, SIGTERM and SIGUSR1 behind, as a script's process does at its
    end: put them back, so that no test sees another's, and a SIGTERM to pytest still ends it."""
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    before = {signum: signal.getsignal(signum) for signum in stop_signals}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def torchrun(*options: str) -> list[str]:
    """The command prefix that launches a script under torchrun with these options (this
    interpreter's torch.distributed.run, which is what the `torchrun` command runs)."""
    return [sys.executable, "-m", "torch.distributed.run", *options]


def script_command(script: str, args, launcher: list[str] | None = None) -> list[str]:
    """`python ppo/<script> args...`, or `launcher ppo/<script> args...` (for example
    torchrun(...))."""
    return [*(launcher or [sys.executable]), str(REPO / "ppo" / script), *args]


def run_script(script: str, *args: str, cwd: Path, timeout: float = HUNG_AFTER,
               env: dict | None = None, check: bool = True,
               launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run `python ppo/<script> args...` in `cwd` (so runs/ and videos/ land there), as a user
    would; `launcher` replaces `python`, for example by torchrun(...)."""
    result = subprocess.run(script_command(script, args, launcher), cwd=cwd,
                            env=script_environment(env), capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} exited {result.returncode}\n"
                             f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result


def run_script_here(script: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """`python ppo/<script>.py argv...` run in this process, as its `__main__` (runpy): its exit
    code, stdout and stderr. Hundreds of tiny runs take seconds so, where as many processes take
    minutes."""
    saved_argv, sys.argv = sys.argv, [f"ppo/{script}.py", *argv]
    try:
        runpy.run_path(str(REPO / "ppo" / f"{script}.py"), run_name="__main__")
        code = 0
    except SystemExit as exit:
        code = exit.code
    finally:
        sys.argv = saved_argv
    out, err = capsys.readouterr()
    return code, out, err


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars a run wrote to TensorBoard, as {tag: [(step, value), ...]} in logged order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def assert_logs_every_metric(
        run_dir: Path, except_for: tuple[str, ...] = ()) -> dict[str, list[tuple[int, float]]]:
    """Every metric of METRICS (but `except_for`) has at least one point in the run's TensorBoard
    log; returns all its scalars, as read_scalars does, for further checks."""
    scalars = read_scalars(run_dir)
    for tag in METRICS:
        if tag not in except_for:
            assert scalars.get(tag), f"{tag} missing"
    return scalars


def assert_details_marked(script: str, counts: dict[str, int],
                          labels: tuple[str, ...] = ()) -> None:
    """ppo/<script> marks each numbered implementation detail, `[Core 1:` to `[Core 13:` for
    counts={"Core": 13}, and carries each of `labels` verbatim (details without a number)."""
    source = (REPO / "ppo" / script).read_text()
    for kind, count in counts.items():
        for number in range(1, count + 1):
            assert f"[{kind} {number}:" in source, (kind, number)
    for label in labels:
        assert label in source, label


def only_run_dir(workdir: Path) -> Path:
    """The single run directory under workdir/runs."""
    runs = [path for path in (workdir / "runs").iterdir() if path.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A fresh working directory, also for in-process runs, so runs/ never lands in the
    repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def interrupt_after_first_progress_line(script: str, args: list[str], cwd: Path,
                                        launcher: list[str] | None = None,
                                        stop_signal: int = signal.SIGINT) -> tuple[int, str]:
    """Start `python ppo/<script> args...` (or `launcher ppo/<script> args...`), press Ctrl-C (or
    send `stop_signal`) once it has printed its first progress line, and return its exit code and
    output. Ctrl-C in a terminal signals the whole foreground process group, and so does Slurm at a
    task's time limit (every process of the task), so that is what gets the signal here."""
    process = subprocess.Popen(script_command(script, args, launcher), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=script_environment(), start_new_session=True)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("step"):
            os.killpg(process.pid, stop_signal)
            break
    output.append(process.stdout.read())
    return process.wait(timeout=HUNG_AFTER), "".join(output)


# Unbroken runs already made in this session, by (script, flags, launcher): a run's result depends
# only on these, so tests that compare with the same unbroken run share one (the tests only read
# it).
UNBROKEN_RUNS: dict[tuple, Path] = {}


def run_unbroken_and_interrupted(script: str, flags: list[str], tmp_path: Path,
                                 launcher: list[str] | None = None, exit_code: int = 130,
                                 interrupted_flags: tuple[str, ...] = (),
                                 stop_signal: int = signal.SIGINT) -> tuple[Path, Path, str]:
    """Run `script flags` once to its end (in tmp_path/unbroken, unless an earlier test of the
    session made that very run), and once (with `interrupted_flags` added, e.g. a speed option that
    must not change the result) in tmp_path/interrupted with a Ctrl-C (or `stop_signal`) after its
    first progress line, which must make it exit with `exit_code`, saying that it stops after the
    iteration. The two runs go at the same time: they are separate processes, and neither's result
    depends on timing. Returns both directories and the interrupted run's output, for a test to
    resume that run and compare the two."""
    key = (script, tuple(flags), tuple(launcher or ()))
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    unbroken_run = None
    if key not in UNBROKEN_RUNS:
        unbroken, unbroken_log = tmp_path / "unbroken", tmp_path / "unbroken.log"
        unbroken.mkdir()
        with unbroken_log.open("w") as log:
            unbroken_run = subprocess.Popen(script_command(script, flags, launcher), cwd=unbroken,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            env=script_environment(), start_new_session=True)
    try:
        code, output = interrupt_after_first_progress_line(script, [*flags, *interrupted_flags],
                                                           cwd=interrupted, launcher=launcher,
                                                           stop_signal=stop_signal)
    except BaseException:
        if unbroken_run is not None:
            os.killpg(unbroken_run.pid, signal.SIGKILL)  # torchrun's workers too
            unbroken_run.wait()
        raise
    if unbroken_run is not None:
        try:
            returncode = unbroken_run.wait(timeout=HUNG_AFTER)
        except subprocess.TimeoutExpired:
            os.killpg(unbroken_run.pid, signal.SIGKILL)  # torchrun's workers too
            unbroken_run.wait()
            pytest.fail(f"the unbroken {script} run hung ({HUNG_AFTER} s):\n"
                        f"{unbroken_log.read_text()[-3000:]}")
        assert returncode == 0, (f"the unbroken {script} run exited {returncode}:\n"
                                 f"{unbroken_log.read_text()[-3000:]}")
        UNBROKEN_RUNS[key] = unbroken
    assert code == exit_code, output
    assert f"{signal_name(stop_signal)}: stopping after this iteration" in output, output
    return UNBROKEN_RUNS[key], interrupted, output


def signal_name(signum: int) -> str:
    """How a run names a stop signal: Ctrl-C, SIGTERM, SIGUSR1."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def assert_stopped_with_its_logs_flushed(checkpoint_path: Path) -> int:
    """A stopped run wrote its checkpoint, and its TensorBoard log holds every iteration up to it:
    the last point of charts/SPS is at the checkpoint's step (a run killed by the signal loses the
    points still in the writer's buffer). Returns that step."""
    import torch

    stopped_at = torch.load(checkpoint_path, weights_only=False)["global_step"]
    assert read_scalars(checkpoint_path.parent)["charts/SPS"][-1][0] == stopped_at
    return stopped_at


def run_unbroken_and_interrupted_in_process(
        main, args, workdir: Path, env_class: type, interrupt_at_step: int,
        stop_signal: int = signal.SIGINT) -> tuple[dict, dict, Path]:
    """The in-process twin of run_unbroken_and_interrupted: `main(args)` runs to its end in
    workdir/unbroken, then again in workdir/interrupted with a Ctrl-C (or `stop_signal`) during the
    `interrupt_at_step`-th call of `env_class.step`. Returns both runs' results and the interrupted
    run's checkpoint, for a test to resume that run and compare it with the unbroken one."""
    unbroken_dir, interrupted_dir = workdir / "unbroken", workdir / "interrupted"
    unbroken_dir.mkdir()
    interrupted_dir.mkdir()
    os.chdir(unbroken_dir)
    unbroken = main(args)
    os.chdir(interrupted_dir)
    with ctrl_c_during_step(env_class, interrupt_at_step, stop_signal):
        interrupted = main(args)
    return unbroken, interrupted, only_run_dir(interrupted_dir) / "checkpoint.pt"


@contextlib.contextmanager
def clock_of_the_steps(env_class: type, seconds_per_step: float = 1 / 1024,
                       step_method: str = "step"):
    """Within the block, the runs (ppo/training.py, ppo/run_logs.py) read the time from a clock that
    stands still except in `env_class.step` (or `step_method`), each call of which advances it by
    `seconds_per_step` (1/1024 s: a power of 2, the sums stay exact), so the steps per second that a
    run logs are a known figure, not a measurement."""
    import types

    # where the scripts' runs read the clock (run_logs: for the run's name)
    from ppo_utils import training
    from ppo_utils import run_logs

    original_step, now = getattr(env_class, step_method), 1_700_000_000.0

    def step_and_tick(self, *inputs, **options):
        nonlocal now
        now += seconds_per_step
        return original_step(self, *inputs, **options)

    setattr(env_class, step_method, step_and_tick)
    original_time = training.time
    training.time = run_logs.time = types.SimpleNamespace(time=lambda: now,
                                                          monotonic=original_time.monotonic)
    try:
        yield
    finally:
        setattr(env_class, step_method, original_step)
        training.time = run_logs.time = original_time


# A finished tiny run of each script, its checkpoint shared by the tests of a process
# (test_checkpoints.py, test_evaluation.py).
ATARI = dict(total_timesteps=32, num_envs=2, num_steps=16, num_minibatches=2,
             update_epochs=1, cuda=False)
# (script: what its tiny run needs installed, the settings of that run), for the `tiny` fixture
TINY_RUNS = {
    "ppo": ((), dict(env_id="CartPole-v1", total_timesteps=64, num_envs=2, num_steps=32,
                     num_minibatches=2, cuda=False)),
    "ppo_atari": (("ale_py", "cv2"), ATARI),
    "ppo_atari_lstm": (("ale_py", "cv2"), ATARI),
    "ppo_atari_multigpu": (("ale_py", "cv2"), ATARI),
    "ppo_atari_envpool": (("envpool",), ATARI),
    "ppo_continuous_action": ((), dict(env_id="Hopper-v4" if importlib.util.find_spec("mujoco")
                                       else "Pendulum-v1",
                                       total_timesteps=64, num_steps=64, num_minibatches=2,
                                       update_epochs=2, cuda=False)),
    "ppo_procgen": (("procgen",), dict(total_timesteps=64, num_envs=4, num_steps=16,
                                       num_minibatches=2, update_epochs=1, cuda=False)),
    "ppo_multidiscrete": ((), dict(env_id="CartPole-v1", total_timesteps=64, num_envs=2,
                                   num_steps=32, num_minibatches=2, cuda=False)),
}

# script -> the checkpoint of its tiny run, made once per test process
TRAINED: dict[str, Path] = {}


@pytest.fixture(params=list(TINY_RUNS))
def tiny(request, tmp_path_factory):
    """(script module, path of the checkpoint of its tiny finished run)."""
    needs, settings = TINY_RUNS[request.param]
    for package in needs:
        pytest.importorskip(package)
    import importlib

    import torch

    script = importlib.import_module(f"ppo.{request.param}")
    if (request.param == "ppo_procgen"
        and importlib.import_module("ppo_utils.procgen_games").ProcgenGym3Env is None):
        pytest.skip("procgen is not installed")
    if request.param not in TRAINED:
        directory, previous, threads = (tmp_path_factory.mktemp(request.param), Path.cwd(),
                                        torch.get_num_threads())
        os.chdir(directory)
        torch.set_num_threads(1)  # the tiny networks' fastest, and immune to a busy second core
        try:
            script.main(script.Args(save_model=True, **settings))
        finally:
            os.chdir(previous)
            torch.set_num_threads(threads)
        TRAINED[request.param] = only_run_dir(directory) / "checkpoint.pt"
    return script, TRAINED[request.param]


# The progress line of ppo_utils/training.py's Run.print_progress, and its numbers: step, total,
# SPS.
PROGRESS_LINE = re.compile(r"^step +([\d,]+)/([\d,]+) \| +([\d,]+) SPS \| \d+:\d\d:\d\d elapsed, "
                           r"(?:\d+:\d\d:\d\d|\?) left \| mean return +(?:-?[\d.]+|n/a) \(last "
                           r"\d+ episodes\)$", re.MULTILINE)


def assert_progress_is_printed_within_a_rollout(script, args, capsys, env_class: type,
                                                step_method: str = "step"):
    """A long rollout is not silent: with a clock that each step of the environments advances by 1
    s, a run whose rollouts last num_steps seconds prints its progress line within them, every 5 s,
    and not only after each update; and every progress line has its full form (elapsed and left
    included). Also the start line: the run's name, its steps and device, where its logs go and the
    TensorBoard command."""
    capsys.readouterr()
    with clock_of_the_steps(env_class, seconds_per_step=1.0, step_method=step_method):
        script.main(args)
    output = capsys.readouterr().out
    lines = [line for line in output.splitlines() if line.startswith("step")]
    printed = [int(match.group(1).replace(",", "")) for match in PROGRESS_LINE.finditer(output)]
    assert len(printed) == len(lines) > 0, lines
    batch = args.num_envs * args.num_steps
    assert any(step % batch for step in printed), printed  # some line came from within a rollout
    assert printed[-1] == args.total_timesteps
    first = output.splitlines()[0]
    assert f": {args.total_timesteps:,} steps on cpu" in first, output
    assert "logs in runs/" in output and "(tensorboard --logdir runs)" in output, output


def assert_run_with_option_resumes_exactly(script, args, workdir: Path, env_class: type,
                                           interrupt_at_step: int, option: str = "compile") -> None:
    """A run with the speed `option` on (args: --compile, say) trains, starts every update at
    probability ratios of 1 (assert_each_update_starts_at_ratio_one) and logs every metric, and
    interrupted by a Ctrl-C during the `interrupt_at_step`-th call of `env_class.step`, then resumed
    with `--resume PATH` alone (the checkpoint keeps the option), it ends bit for bit where an
    unbroken run with the option ends, with the same log. Its charts/SPS, under clock_of_the_steps,
    is the steps of each sitting over that sitting's time."""
    import torch

    assert getattr(args, option) and args.save_model
    with clock_of_the_steps(env_class):
        unbroken, stopped, checkpoint_path = assert_each_update_starts_at_ratio_one(
            script, lambda: run_unbroken_and_interrupted_in_process(script.main, args, workdir,
                                                                    env_class, interrupt_at_step))
        assert stopped["interrupted"] and 0 < stopped["global_step"] < args.total_timesteps
        assert_logs_every_metric(only_run_dir(workdir / "unbroken"))

        resumed_args, checkpoint = parse_args(script, ["--resume", str(checkpoint_path)])
        assert getattr(resumed_args, option)
        resumed = script.main(resumed_args, checkpoint)
    # Each step took 1/1024 s of the clock: every iteration's rate is num_envs x 1024 steps per
    # second, after the resume too (counted from where the resumed run began, not from step 0).
    for run_dir in (only_run_dir(workdir / "unbroken"), checkpoint_path.parent):
        assert ({sps for _, sps in read_scalars(run_dir)["charts/SPS"]}
                == {args.num_envs * 1024}), run_dir
    assert resumed["global_step"] == unbroken["global_step"] == args.total_timesteps
    assert_same_agent_state(unbroken["agent"].state_dict(), resumed["agent"].state_dict())
    assert resumed["recent_returns"] == unbroken["recent_returns"]
    assert_same_logs(only_run_dir(workdir / "unbroken"), checkpoint_path.parent)
    assert_core_optimizer_settings(checkpoint_path.parent,
                                   torch.load(checkpoint_path, weights_only=False))


def assert_first_minibatch_replays_the_rollout(script, args, monkeypatch) -> None:
    """Before an update's first optimizer step the network is still the one that acted, so the first
    minibatch's log-probabilities and values, recomputed from the stored batch (and, in the LSTM,
    from the stored recurrent state), must be the rollout's own: a batch whose observations,
    actions, episode starts or states fell out of step with each other fails this. Runs
    `script.main(args)` in the working directory, spying on its compute_gae (once per rollout) and
    ppo_loss; checks every iteration, since the first starts from zero LSTM states, which hide a
    wrong one. Also [Core 11]: every minibatch's gradients are clipped, to --max-grad-norm; and
    [Core 6]: every epoch shuffles the batch (the LSTM's: its environments) anew, so no two epochs
    need split it alike."""
    import numpy as np
    import torch

    compute_gae, ppo_loss, clip_grad_norm = (script.compute_gae, script.ppo_loss,
                                             torch.nn.utils.clip_grad_norm_)
    shuffle = np.random.shuffle
    first_minibatches, waiting_for_first, clipped_to, orders = [], [], [], []

    def recording_shuffle(indices):
        shuffle(indices)
        orders.append(np.array(indices))

    def recording_clip(parameters, max_norm, *rest, **options):
        clipped_to.append(max_norm)
        return clip_grad_norm(parameters, max_norm, *rest, **options)

    def recording_gae(*inputs):
        waiting_for_first.append(True)
        return compute_gae(*inputs)

    def recording_loss(new_logprob, entropy, new_value, old_logprob, old_value, *rest):
        if waiting_for_first:
            waiting_for_first.clear()
            first_minibatches.append([tensor.detach().clone() for tensor in
                                      (new_logprob, old_logprob, new_value, old_value)])
        return ppo_loss(new_logprob, entropy, new_value, old_logprob, old_value, *rest)

    monkeypatch.setattr(script, "compute_gae", recording_gae)
    monkeypatch.setattr(script, "ppo_loss", recording_loss)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    monkeypatch.setattr(np.random, "shuffle", recording_shuffle)
    script.main(args)
    num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)
    assert len(first_minibatches) == num_iterations
    assert clipped_to == [args.max_grad_norm] * (num_iterations * args.update_epochs
                                                 * args.num_minibatches)
    assert len(orders) == num_iterations * args.update_epochs
    for iteration in range(num_iterations):  # each epoch a permutation of the same batch
        epochs = orders[iteration * args.update_epochs:(iteration + 1) * args.update_epochs]
        assert all(np.array_equal(np.sort(order), np.sort(epochs[0])) for order in epochs)
    for new_logprob, old_logprob, new_value, old_value in first_minibatches:
        torch.testing.assert_close(new_logprob, old_logprob, rtol=0, atol=1e-5)
        torch.testing.assert_close(new_value, old_value, rtol=0, atol=1e-5)


def assert_the_batch_is_what_the_policy_saw_and_did(script, args, monkeypatch) -> None:
    """The batch an update learns from holds, step by step, the observations the policy acted on and
    the actions it drew. ppo.py and ppo_continuous_action.py score the stored batch after the
    rollout, so their first minibatch replays whatever was stored and cannot tell a wrong
    observation from the right one: here the policy's inputs and outputs are recorded as it acts
    (Agent.get_action) and compared with the batch that each update scores (its first
    Agent.get_action_and_value call with given actions), row by row: time-major, step t of
    environment e at t * num_envs + e. The continuous script acts on normalized observations, so
    those are what its batch must hold."""
    import torch

    # acted: (obs, action) per rollout step; batches: (obs, actions) per update
    acted, batches = [], []
    get_action, get_action_and_value = script.Agent.get_action, script.Agent.get_action_and_value

    def recording_get_action(self, obs):
        action = get_action(self, obs)
        acted.append((obs.detach().clone(), action.detach().clone()))
        return action

    def recording_get_action_and_value(self, obs, action=None):
        if action is not None and len(acted) > len(batches) * args.num_steps:
            # the first scoring after a rollout
            batches.append((obs.detach().clone(), action.detach().clone()))
        return get_action_and_value(self, obs, action)

    monkeypatch.setattr(script.Agent, "get_action", recording_get_action)
    monkeypatch.setattr(script.Agent, "get_action_and_value", recording_get_action_and_value)
    script.main(args)
    num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)
    assert len(batches) == num_iterations and len(acted) == num_iterations * args.num_steps
    for iteration, (batch_obs, batch_actions) in enumerate(batches):
        steps = acted[iteration * args.num_steps:(iteration + 1) * args.num_steps]
        assert torch.equal(batch_obs, torch.cat([obs for obs, _ in steps])), iteration
        assert torch.equal(batch_actions, torch.cat([action for _, action in steps])), iteration


def assert_each_update_starts_at_ratio_one(script, run):
    """Call `run()` (a run of `script.main`, with --compile or --async-envs, say) and check that the
    first minibatch of every update saw probability ratios of 1: the network that scores it is the
    one that acted, so old_approx_kl and approx_kl are about 0 and no ratio is clipped. The
    statistics are read from what the script's minibatch_loss returns, outside the function that
    --compile compiles (a spy inside it would be compiled too). Returns what `run()` returns."""
    minibatch_loss, compute_gae = script.minibatch_loss, script.compute_gae
    waiting, first_stats = [], []

    def recording_gae(*inputs):
        waiting.append(True)
        return compute_gae(*inputs)

    def first_minibatch_recorded(*inputs):
        loss, stats = minibatch_loss(*inputs)
        if waiting:
            waiting.clear()
            first_stats.append({key: float(value) for key, value in stats.items()})
        return loss, stats

    script.compute_gae, script.minibatch_loss = recording_gae, first_minibatch_recorded
    try:
        result = run()
    finally:
        script.compute_gae, script.minibatch_loss = compute_gae, minibatch_loss
    assert first_stats, "no update ran"
    for stats in first_stats:
        assert abs(stats["approx_kl"]) < 1e-6 and abs(stats["old_approx_kl"]) < 1e-5, stats
        assert stats["clipfrac"] == 0.0, stats
    return result


def assert_anneal_clip_lowers_the_clipping_coefficient(script, args, monkeypatch) -> None:
    """--anneal-clip (the PPO paper's Atari setting, and ppo1's): the clipping coefficient that
    every minibatch of iteration i (from 1 to N) is clipped with is clip_coef x (1 - (i - 1) / N),
    falling as the learning rate does; without it, clip_coef throughout. Spies on the script's
    ppo_loss, whose argument it is, both for the surrogate objective and for the value clipping."""
    from dataclasses import replace

    import pytest

    ppo_loss, used = script.ppo_loss, []

    def recording_loss(*inputs):
        used.append(float(inputs[7]))  # clip_coef, after the seven tensors
        return ppo_loss(*inputs)

    monkeypatch.setattr(script, "ppo_loss", recording_loss)
    num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)
    per_iteration = args.update_epochs * args.num_minibatches
    for anneal in (True, False):
        used.clear()
        script.main(replace(args, anneal_clip=anneal, clip_coef=0.3))
        falling = [0.3 * (1 - i / num_iterations) if anneal else 0.3 for i in range(num_iterations)]
        assert used == pytest.approx([value for value in falling for _ in range(per_iteration)],
                                     rel=1e-6), anneal


def assert_logged_losses_are_the_updates_own(script, args, monkeypatch,
                                             reset_steps_left_out: bool = False) -> None:
    """[Core 12: Debug variables] What a run logs under losses/ is its updates' own: each
    iteration's value_loss, policy_loss, entropy, old_approx_kl, approx_kl and clipfrac are the
    means of the statistics its minibatches' ppo_loss returned, and explained_variance compares the
    rollout's values with the returns GAE made of them (over the trained steps: envpool's reset
    steps, marked done there, are left out, `reset_steps_left_out`). Runs `script.main(args)` in the
    working directory."""
    import numpy as np
    import pytest

    from ppo_utils import training  # where the run computes the explained variance it logs

    compute_gae, ppo_loss = script.compute_gae, script.ppo_loss
    updates = []  # per iteration: (values, dones, returns, [each minibatch's statistics])

    def recording_gae(rewards, values, dones, *rest):
        advantages, returns = compute_gae(rewards, values, dones, *rest)
        updates.append((np.array(values), np.array(dones), np.array(returns), []))
        return advantages, returns

    def recording_loss(*inputs):
        loss, stats = ppo_loss(*inputs)
        updates[-1][3].append({key: float(value) for key, value in stats.items()})
        return loss, stats

    monkeypatch.setattr(script, "compute_gae", recording_gae)
    monkeypatch.setattr(script, "ppo_loss", recording_loss)
    script.main(args)
    logged = {tag: [value for _, value in points]
              for tag, points in read_scalars(only_run_dir(Path.cwd())).items()}
    assert len(updates) == len(logged["losses/approx_kl"]) > 1
    for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac"):
        expected = [np.mean([stats[key] for stats in minibatches]) for *_, minibatches in updates]
        assert logged[f"losses/{key}"] == pytest.approx(expected, rel=1e-5, abs=1e-7), key
    for (values, dones, returns, _), explained in zip(updates, logged["losses/explained_variance"]):
        trained = dones.reshape(-1) == 0 if reset_steps_left_out else slice(None)
        assert explained == pytest.approx(training.explained_variance(values.reshape(-1)[trained],
                                                                      returns.reshape(-1)[trained]),
                                          rel=1e-5)


# Tensor methods that read a tensor's values on the host: on a GPU, each one waits for the device.
HOST_READS = ("cpu", "numpy", "item", "tolist", "__bool__", "__float__", "__int__",
              "__index__", "__array__")


def assert_one_copy_to_the_host_per_step(script, args, monkeypatch, step_owner: type,
                                         action_shape: tuple, step_method: str = "step") -> None:
    """[Speed: one host transfer per step] Between two steps of the games the rollout reads one
    tensor on the host, the sampled actions, with action.cpu().numpy(): on a GPU each read of a
    tensor waits for the device, so a log-prob, a value or a done flag read at every step would
    stall the rollout again. Runs `script.main(args)` under a TorchFunctionMode that records every
    HOST_READS call, split at the calls of `step_owner.step_method` (the games' step); the spans
    that hold an update (marked by compute_gae) are left out. The calls are the same on a CPU, so a
    CPU run counts them."""
    import torch
    from torch.overrides import TorchFunctionMode

    reads = {getattr(torch.Tensor, name): name for name in HOST_READS}
    events = []

    class RecordHostReads(TorchFunctionMode):
        def __torch_function__(self, func, types, inputs=(), options=None):
            if func in reads:
                events.append((reads[func], tuple(inputs[0].shape)))
            return func(*inputs, **(options or {}))

    step, compute_gae = getattr(step_owner, step_method), script.compute_gae

    def marking_step(self, *inputs, **options):
        events.append("step")
        return step(self, *inputs, **options)

    def marking_gae(*inputs):
        events.append("update")
        return compute_gae(*inputs)

    monkeypatch.setattr(step_owner, step_method, marking_step)
    monkeypatch.setattr(script, "compute_gae", marking_gae)
    with RecordHostReads():
        script.main(args)
    spans, span = [], []
    for event in events:
        if event == "step":
            spans.append(span)
            span = []
        else:
            span.append(event)
    # spans[0]: before the first step
    rollout = [span for span in spans[1:] if "update" not in span]
    num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)
    assert len(rollout) >= num_iterations * (args.num_steps - 1)
    for span in rollout:
        assert span == [("cpu", action_shape), ("numpy", action_shape)]


def assert_target_kl_ends_the_update_early(script, args, monkeypatch) -> None:
    """--target-kl: an update stops after the epoch whose last minibatch's approx_kl exceeds it.
    With a target below any KL an update reaches, each update runs one epoch; with one above every
    KL, all its --update-epochs (3 here). Counts the script's ppo_loss calls, one per minibatch."""
    from dataclasses import replace

    calls = []
    ppo_loss = script.ppo_loss

    def counting_loss(*inputs):
        calls.append(1)
        return ppo_loss(*inputs)

    monkeypatch.setattr(script, "ppo_loss", counting_loss)
    num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)
    for target_kl, epochs in ((1e-12, 1), (1e9, 3)):
        calls.clear()
        script.main(replace(args, target_kl=target_kl, update_epochs=3))
        assert len(calls) == num_iterations * epochs * args.num_minibatches, target_kl


def assert_evaluation_plays_the_saved_weights(script, args, monkeypatch) -> None:
    """Train `args` with --save-model in the working directory, then evaluate the checkpoint for one
    episode: the agent that evaluate() builds must hold the checkpoint's weights (and whatever else
    its state_dict carries, such as observation statistics). An evaluation that forgot to load them
    would play a fresh network and still print a plausible score."""
    from dataclasses import replace

    import numpy as np
    import torch

    script.main(replace(args, save_model=True))
    checkpoint_path = only_run_dir(Path.cwd()) / "checkpoint.pt"
    built = []

    class RecordingAgent(script.Agent):
        def __init__(self, *inputs, **options):
            super().__init__(*inputs, **options)
            built.append(self)

    monkeypatch.setattr(script, "Agent", RecordingAgent)
    script.evaluate(*parse_args(script, ["--evaluate", str(checkpoint_path),
                                         "--eval-episodes", "1", "--no-cuda"]))
    saved = torch.load(checkpoint_path, weights_only=False)["model"]
    assert len(built) == 1
    played = built[0].state_dict()
    assert played.keys() == saved.keys()
    for name, value in played.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value.cpu(), saved[name]), name
        else:  # extra state: a dict of NumPy arrays and numbers
            assert value.keys() == saved[name].keys(), name
            for key in value:
                assert np.array_equal(value[key], saved[name][key]), (name, key)


def assert_same_final_weights(unbroken: Path, resumed_checkpoint: Path,
                              total_timesteps: int) -> tuple[dict, dict]:
    """The resumed run's final checkpoint must match the unbroken run's: same step count,
    bit-identical weights, the same latest game scores (the progress line's mean return); and so
    must its TensorBoard log. Returns (unbroken, resumed) checkpoints for the script's own further
    checks."""
    import torch

    expected = torch.load(only_run_dir(unbroken) / "checkpoint.pt", weights_only=False)
    actual = torch.load(resumed_checkpoint, weights_only=False)
    assert actual["global_step"] == expected["global_step"] == total_timesteps
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name
    assert actual["recent_returns"] == expected["recent_returns"]
    assert_same_logs(only_run_dir(unbroken), resumed_checkpoint.parent)
    assert_core_optimizer_settings(only_run_dir(unbroken), expected)
    return expected, actual


def assert_resume_keeps_the_latest_scores(script: str, checkpoint_path: Path, workdir: Path,
                                          launcher: list[str] | None = None) -> None:
    """A resumed run goes on with the checkpoint's latest game scores, which its progress line
    averages: a copy of the checkpoint, given the scores 4 and 6, resumes to "mean return 5.00 (last
    2 episodes)" and ends with them first. (For runs too short for a game to end, whose resume test
    compares empty lists.)"""
    import shutil

    import torch

    copy = workdir / "with_scores" / checkpoint_path.parent.name / checkpoint_path.name
    shutil.copytree(checkpoint_path.parent, copy.parent)
    checkpoint = torch.load(copy, weights_only=False)
    assert (checkpoint["recent_returns"] == []
            and checkpoint["global_step"] < checkpoint["args"]["total_timesteps"])
    torch.save({**checkpoint, "recent_returns": [4.0, 6.0]}, copy)
    resumed = run_script(script, "--resume", str(copy), cwd=copy.parent.parent, launcher=launcher)
    progress = [line for line in resumed.stdout.splitlines() if line.startswith("step")]
    assert progress[0].endswith("mean return     5.00 (last 2 episodes)"), resumed.stdout
    assert torch.load(copy, weights_only=False)["recent_returns"][:2] == [4.0, 6.0]


def assert_core_optimizer_settings(run_dir: Path, checkpoint: dict) -> None:
    """[Core 3] Adam's epsilon is 1e-5, not PyTorch's 1e-8; [Core 4] the learning rate falls
    linearly from its start at the first of N iterations to 1/N of it at the last (it reaches 0 only
    after the run), as logged by the run in run_dir, which `checkpoint` ended."""
    import pytest

    assert checkpoint["optimizer"]["param_groups"][0]["eps"] == 1e-5
    logged = [value for _, value in read_scalars(run_dir)["charts/learning_rate"]]
    start, count = checkpoint["args"]["learning_rate"], len(logged)
    expected = ([start * (1 - i / count) for i in range(count)] if checkpoint["args"]["anneal_lr"]
                else [start] * count)
    assert logged == pytest.approx(expected, rel=1e-6)


def assert_same_logs(unbroken_run: Path, resumed_run: Path) -> None:
    """The TensorBoard log of a run that was interrupted and resumed reads as the unbroken run's:
    every scalar at the same steps, none lost or doubled where the run stopped, with the same values
    (charts/SPS, a rate of the wall clock, only at the same steps)."""
    expected, actual = read_scalars(unbroken_run), read_scalars(resumed_run)
    assert actual.keys() == expected.keys()
    for tag, points in expected.items():
        if tag == "charts/SPS":
            assert [step for step, _ in actual[tag]] == [step for step, _ in points], tag
        else:
            assert actual[tag] == points, tag


def assert_same_agent_state(expected: dict, actual: dict) -> None:
    """Two agents' state_dicts are bit-identical: every tensor, and every entry of extra state that
    is not a tensor (such as the observation statistics that ppo_continuous_action.py keeps
    there)."""
    import numpy as np
    import torch

    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, actual[name]), name
        else:
            for key in value:
                np.testing.assert_array_equal(actual[name][key], value[key],
                                              err_msg=f"{name}[{key!r}]")


def expect_usage_error(capsys, run, script: str, *fragments: str) -> str:
    """`run()`, as `python ppo/<script> ...` runs it (within exits.exit_codes), must stop with exit
    code 2 and one line on stderr, `<script>: error: ...`, that contains every fragment; returns
    that line."""
    from ppo_utils import exits

    with pytest.raises(SystemExit) as stop, exits.exit_codes(script):
        run()
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{script}: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@contextlib.contextmanager
def ctrl_c_during_step(env_class: type, step_number: int, stop_signal: int = signal.SIGINT):
    """Within the block, the `step_number`-th call of `env_class.step` first sends this process a
    SIGINT, as Ctrl-C would (or `stop_signal`, as `kill` or Slurm would), then steps: an in-process
    run sees the signal at a step it can't predict."""
    original_step, calls = env_class.step, 0

    def step_then_interrupt(self, actions):
        nonlocal calls
        calls += 1
        if calls == step_number:
            # Without a handler of the run's, SIGTERM or SIGUSR1 would end this whole test session.
            assert callable(signal.getsignal(stop_signal)), (
                f"no handler for {signal_name(stop_signal)}: the run dies")
            signal.raise_signal(stop_signal)
        return original_step(self, actions)

    env_class.step = step_then_interrupt
    try:
        yield
    finally:
        env_class.step = original_step


def assert_every_evaluated_episode_returns(script, args, capsys, expected: float,
                                           episodes: int = 3) -> None:
    """Train `args` with --save-model in the working directory, then evaluate the checkpoint for
    `episodes` episodes of an environment whose every episode returns `expected` whatever the
    policy: each episode's return, as main() returns it and as it is printed, must be `expected`,
    not a running total over episodes nor a sum of the training's scaled rewards."""
    from dataclasses import replace

    script.main(replace(args, save_model=True))
    capsys.readouterr()
    checkpoint_path = only_run_dir(Path.cwd()) / "checkpoint.pt"
    returns = script.evaluate(*parse_args(script, ["--evaluate", str(checkpoint_path),
                                                   "--eval-episodes", str(episodes), "--no-cuda"]))
    assert returns == [expected] * episodes
    assert (assert_evaluation_output(capsys.readouterr().out, args.env_id, episodes)
            == [expected] * episodes)


def assert_evaluation_output(output: str, env_id: str, episodes: int) -> list[float]:
    """What --evaluate prints: a line per episode, `episode K: return R ...`, then
    `<env_id>: mean return M +- S over N episodes`, with M and S the mean and standard deviation of
    the N returns (within the rounding of the episode lines). Returns the episodes' returns as
    printed."""
    import numpy as np

    returns = [float(value)
               for value in re.findall(r"^episode \d+: return (-?[\d.]+)", output, re.MULTILINE)]
    summary = re.search(rf"^{re.escape(env_id)}: mean return (-?[\d.]+) \+- ([\d.]+) over "
                        rf"{episodes} episodes$", output, re.MULTILINE)
    assert summary and len(returns) == episodes, output
    assert float(summary.group(1)) == pytest.approx(np.mean(returns), abs=0.05)
    assert float(summary.group(2)) == pytest.approx(np.std(returns), abs=0.05)
    return returns


def expect_missing_package_error(result: subprocess.CompletedProcess, script: str, *fragments: str,
                                 only_line: bool = True) -> str:
    """A run without one of its optional packages must end as expect_error_line says
    (only_line=False: some libraries warn before the script gets to speak). Returns the error
    line."""
    return expect_error_line(result, script, *fragments, only_line=only_line)


def expect_error_line(result: subprocess.CompletedProcess, script: str, *fragments: str,
                      only_line: bool = True) -> str:
    """A finished command must have ended with exit code 2, no traceback, and a last line
    `<script>: error: ...` containing every fragment (with only_line, the only line on stderr).
    Returns that line."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    if only_line:
        assert len(lines) == 1, lines
    assert lines[-1].startswith(f"{script}: error: "), lines[-1]
    for fragment in fragments:
        assert fragment in lines[-1], (fragment, lines[-1])
    return lines[-1]


def without_module(tmp_path: Path, module: str) -> dict:
    """Environment variables under which `import <module>` fails in a child process, as if the
    package were not installed."""
    blocker = tmp_path / "blocked" / module
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(f"raise ImportError('{module} is blocked by this test')\n")
    return {"PYTHONPATH": str(tmp_path / "blocked")}


# --------------------------------------------------------------------------------------------------
# The benchmark tools (tests/test_benchmark.py, tests/test_slurm.py)
# --------------------------------------------------------------------------------------------------


def run_tool(tool: str, *args: str, cwd: Path, timeout: float = HUNG_AFTER, env: dict | None = None
             ) -> subprocess.CompletedProcess:
    """Run `benchmark/<tool>` (python for .py, bash for .sh) in cwd; never raises on a non-zero
    exit."""
    interpreter = ["bash"] if tool.endswith(".sh") else [sys.executable]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHON": sys.executable, **(env or {})}
    return subprocess.run([*interpreter, str(REPO / "benchmark" / tool), *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def table_rows(markdown: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose first header cell is `first_header`, as dicts."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))))
    return rows


# A stand-in for a PPO script, for the runner: fast, and no training. It notes each call in
# calls.txt of the directory it runs in, and fails when a file fail-seed-<seed> is there.
FAKE_SCRIPT = """\
import argparse, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--env-id")
parser.add_argument("--seed", type=int)
parser.add_argument("--extra", default="")
parser.add_argument("--save-model", action="store_true")  # what the runner gives every run
parser.add_argument("--save-minutes", type=float)
parser.add_argument("--resume")
args = parser.parse_args()
with open("calls.txt", "a") as calls:
    calls.write(f"{args.env_id} {args.seed}\\n")
print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
if os.path.exists(f"fail-seed-{args.seed}"):
    print("failing on purpose", file=sys.stderr)
    # a crash's code of its own: 3 is a run that diverged, which the runner does not retry
    sys.exit(4)
"""


# A stand-in for ppo/ppo.py that runs ppo.py itself, each CartPole step first sleeping
# SLOW_STEP_SECONDS (0 if unset), until the run is resumed, which goes at full speed: a run long
# enough to be stopped mid-way, whose results are ppo.py's (a pause changes nothing a run computes).
# Written into a test's directory as slow_ppo.py; its runs are filed under "slow_ppo", named as
# ppo.py's.
SLOW_PPO = f"""\
import os, runpy, sys, time
import gymnasium.envs.classic_control.cartpole as cartpole
sys.path.insert(0, {str(REPO / "ppo")!r})
if "--resume" not in sys.argv:
    step, pause = cartpole.CartPoleEnv.step, float(os.environ.get("SLOW_STEP_SECONDS", "0"))
    def slow_step(self, action):
        time.sleep(pause)
        return step(self, action)
    cartpole.CartPoleEnv.step = slow_step
runpy.run_path({str(REPO / "ppo" / "ppo.py")!r}, run_name="__main__")
"""
# 32 iterations of 4 x 16 steps: at SLOW_STEP_SECONDS=0.06 an iteration takes 4 s, the run 2
# minutes.
SLOW_RUNS = ["--env-ids", "CartPole-v1",
             "--command", "python slow_ppo.py --total-timesteps 2048 --num-steps 16"]


@pytest.fixture(scope="session")
def unbroken_slow_runs(tmp_path_factory) -> Path:
    """The runner's runs of SLOW_RUNS, seeds 1 and 2, each to its end at full speed in
    <directory>/seed<S>: what runs of it that were stopped and continued must end as."""
    directory = tmp_path_factory.mktemp("unbroken")
    runners = []
    for seed in (1, 2):
        (directory / f"seed{seed}").mkdir()
        (directory / f"seed{seed}" / "slow_ppo.py").write_text(SLOW_PPO)
        runners.append(subprocess.Popen([sys.executable, str(REPO / "benchmark" / "run.py"),
                                         *SLOW_RUNS, "--num-seeds", "1", "--start-seed", str(seed)],
                                        cwd=directory / f"seed{seed}", stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True))
    for runner in runners:
        output = runner.communicate(timeout=HUNG_AFTER)[0]
        assert runner.returncode == 0 and "1 run(s): 1 ran ok" in output, output
    return directory


def calls(workdir: Path) -> list[str]:
    """The (env id, seed) calls of FAKE_SCRIPT in workdir, sorted."""
    path = workdir / "calls.txt"
    return sorted(path.read_text().splitlines()) if path.exists() else []


def assert_quick_runs_finished(directory: Path) -> None:
    """The quick family's 4 runs (CartPole-v1 and Acrobot-v1, seeds 1 and 2) each left a log ending
    in exit code 0, a .done marker and a run directory under `directory`."""
    for env_id in ("CartPole-v1", "Acrobot-v1"):
        for seed in (1, 2):
            log = directory / "logs" / "ppo" / f"{env_id}__seed{seed}.log"
            assert "# exit code 0" in log.read_text()
            assert log.with_suffix(".done").is_file()
    assert len(list((directory / "runs").iterdir())) == 4


@pytest.fixture(scope="session")
def quick_dir(tmp_path_factory) -> Path:
    """The quick benchmark run here, once per session: its logs, runs and report (the local runs the
    Slurm test compares its own with)."""
    workdir = tmp_path_factory.mktemp("quick")
    result = run_tool("run.py", "--quick", "--quick-dir", str(workdir),
                      "--workers", "1", cwd=workdir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "4 run(s): 4 ran ok, 0 skipped (finished earlier), 0 failed" in result.stdout
    return workdir


# --------------------------------------------------------------------------------------------------
# A real one-node Slurm cluster (tests/test_slurm.py, tests/test_tune.py)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A one-node cluster on this machine for the module's tests (tests/slurm_cluster.py), or a skip
    that says why there is none."""
    from slurm_cluster import OneNodeCluster, missing_programs

    missing = missing_programs()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): apt-get install "
                    "slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("the one-node Slurm cluster runs slurmd as root, to start jobs: run the "
                    "tests as root")
    cluster = OneNodeCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()


def wait_for_jobs(cluster, job_ids: list[str], limit: float = HUNG_AFTER) -> None:
    """Until none of the jobs is pending or running (a bound, so a stuck job fails the test)."""
    import time

    env = {**os.environ, **cluster.environment()}
    deadline = time.time() + limit
    while time.time() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids)], env=env,
                               capture_output=True, text=True)
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        time.sleep(1)
    pytest.fail(f"jobs {job_ids} still queued after {limit:.0f}s:\n"
                f"{queue.stdout}{cluster.log_tails()}")


# --------------------------------------------------------------------------------------------------
# The speed options (issue 12)
# --------------------------------------------------------------------------------------------------


def assert_compiles_whole(function, *inputs):
    """torch.compile takes `function` on `inputs` into one graph. Where a graph would break,
    --compile runs that part as plain PyTorch without a word (slower, and a split CUDA graph);
    fullgraph=True makes it an error here instead. Returns the compiled function's outputs, under
    inference mode as in a rollout."""
    import torch

    with torch.inference_mode():
        return torch.compile(function, fullgraph=True)(*inputs)


def assert_compiled_loss_matches_plain(minibatch_loss, agent, *data,
                                       fullgraph: bool = True) -> dict:
    """`torch.compile(minibatch_loss)` on the same agent and minibatch gives the plain function's
    loss, statistics and gradients within float tolerance (compiled kernels fuse and reorder float
    operations, so bit equality is not expected). With `fullgraph` it must also compile into one
    graph, as assert_compiles_whole checks. Returns the plain statistics for further checks."""
    import torch

    results = []
    for loss_function in (minibatch_loss, torch.compile(minibatch_loss, fullgraph=fullgraph)):
        agent.zero_grad()
        loss, stats = loss_function(agent, *data)
        loss.backward()
        results.append((loss.detach(), stats,
                        {name: p.grad.clone() for name, p in agent.named_parameters()}))
    (plain_loss, plain_stats, plain_grads), (compiled_loss, compiled_stats,
                                             compiled_grads) = results
    torch.testing.assert_close(compiled_loss, plain_loss, rtol=1e-5, atol=1e-6)
    for key, value in plain_stats.items():
        torch.testing.assert_close(compiled_stats[key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert plain_grads.keys() == compiled_grads.keys()
    for name, grad in plain_grads.items():
        assert grad.abs().sum() > 0, name  # every parameter takes part in the loss
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    return plain_stats
