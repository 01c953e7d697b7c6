"""Tests of benchmark/speed.py's machinery (with speed_clocks.py and speed_parts.py): which option
combinations it measures, how it reads settings, that its training measurement skips the warm-up,
and how it reads the clocks beside a run without replacing anything. No timing is checked."""

import cProfile
import importlib
import os
import pstats
import subprocess
import sys
import time
import types

import pytest
import torch

import ppo.ppo as classic
import ppo.ppo_atari_envpool as envpool_script
from benchmark import speed
from benchmark.timer import speed_clocks, speed_parts
from conftest import HUNG_AFTER, REPO, expect_usage_error, table_rows


def test_option_sets_are_plain_each_option_and_all_together_where_the_script_has_them():
    assert speed.option_sets(classic, "cpu", None) == [(), ("numpy_policy",), ("compile",),
                                                       ("numpy_policy", "compile")]
    assert speed.option_sets(envpool_script, "cpu", None) == [(), ("async_envs",), ("compile",),
                                                              ("async_envs", "compile")]
    assert speed.option_sets(envpool_script, "cuda", None) == [
        (), ("async_envs",), ("compile",), ("cudagraphs",), ("async_envs", "compile", "cudagraphs")]
    # Requested sets are kept in order; those a script or device cannot run are left out.
    requested = ["plain", "async_envs+compile", "cudagraphs"]
    assert speed.option_sets(envpool_script, "cpu", requested) == [(), ("async_envs", "compile")]
    assert speed.option_sets(classic, "cpu", requested) == [()]


def test_settings_take_the_type_of_the_field(capsys):
    values = speed.field_values(envpool_script, ["clip_coef=0.2", "num_minibatches=8",
                                                 "anneal_lr=false", "target_kl=0.015"])
    assert values == {"clip_coef": 0.2, "num_minibatches": 8, "anneal_lr": False,
                      "target_kl": 0.015}
    assert type(values["num_minibatches"]) is int
    assert speed.field_values(envpool_script, ["target_kl=None"]) == {"target_kl": None}
    for assignment, fragment in [("clip=0.2", "has no setting 'clip'"),
                                 ("anneal_lr=flase", "true or false"),
                                 ("num_minibatches=8.5", "not a valid int")]:
        expect_usage_error(capsys, lambda: speed.field_values(envpool_script, [assignment]),
                           "speed.py", f"--set {assignment}", fragment)


# --raw-seconds 0.01: were a wrong value not refused, the test would not wait 10 s for the raw
# speed.
@pytest.mark.parametrize("argv, fragments", [
    (["--raw-seconds", "0"], ["--raw-seconds 0.0: give a positive number"]),
    (["--raw-seconds", "-1"], ["--raw-seconds -1.0"]),
    (["--num-envs", "0", "--raw-seconds", "0.01"], ["--num-envs 0: give at least 1"]),
    (["--total-timesteps", "0", "--raw-seconds", "0.01"], ["--total-timesteps 0: give at least 1"]),
    (["--warmup-iterations", "-1", "--raw-seconds", "0.01"],
     ["--warmup-iterations -1: give at least 0"]),
    (["--scripts", "ppo_nope.py"], ["unknown script 'ppo_nope.py'", "ppo_atari_envpool.py"]),
    (["--options", "compyle", "--raw-seconds", "0.01"],
     ["--options compyle: ppo.py has no speed option 'compyle'",
      "it has: plain, numpy_policy, compile, cudagraphs"]),
    (["--options", "plain", "async_envs+compile", "--raw-seconds", "0.01"],
     ["--options async_envs+compile: ppo.py has no speed option 'async_envs'"]),
    (["--options", "compile+cudagraphs", "--devices", "cpu", "--raw-seconds", "0.01"],
     ["--cudagraphs needs CUDA", "--devices cuda"]),
])
def test_wrong_input_is_refused_before_anything_is_measured(capsys, argv, fragments):
    argv = argv if "--scripts" in argv else ["--scripts", "ppo.py", *argv]
    expect_usage_error(capsys, lambda: speed.main(argv), "speed.py", *fragments)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused(capsys):
    expect_usage_error(capsys, lambda: speed.main(["--scripts", "ppo.py", "--devices", "cuda"]),
                       "speed.py", "PyTorch sees no CUDA device")


def test_training_speed_is_measured_after_the_warmup_iterations(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = classic.Args(total_timesteps=6 * 64, num_envs=2, num_steps=32, cuda=False)
    wall, cpu, steps = speed.training_speed(classic, args, warmup_iterations=1)
    assert wall > 0 and cpu > 0
    assert steps == 5 * 64  # the last 5 of the 6 iterations
    assert speed.training_speed(classic, args, warmup_iterations=0)[2] == 6 * 64
    assert not (tmp_path / "runs").exists()  # the run went to a temporary directory
    expect_usage_error(capsys, lambda: speed.training_speed(classic, args, warmup_iterations=6),
                       "speed.py", "too few to measure", "raise --total-timesteps")


def test_the_cpu_time_of_a_span_is_the_rate_of_the_samples_within_it():
    """The CPU time from one of the log's times to another is the CPU rate between the first and the
    last sample within them, over the span: not a reading between the samples around its end, which
    would take in the slower pace after it (here 0.1 s of CPU in the last second, the run closing).
    With fewer than two samples within, it is read between those around it."""
    sampler = speed_clocks.Sampler(speed_clocks.CPU_PERIOD)
    sampler.samples = [(100.0, 5.0), (100.5, 5.2), (101.0, 5.8), (102.0, 5.9)]
    # 0.6 s of CPU in 0.5 s, over 1 s
    assert sampler.cpu_seconds(100.2, 101.2) == pytest.approx(1.2)
    assert sampler.cpu_seconds(100.1, 100.4) == pytest.approx(5.16 - 5.04)


def test_table_divides_training_by_raw_speed_and_leaves_out_the_cpu_time_of_worker_processes(
        monkeypatch, capsys):
    """Each measured option set is a row, whose ratio is training over raw SPS by the wall clock and
    whose CPU-time ratio is the same by CPU time; where the games play in worker processes
    (--async-envs of ppo_atari.py) this process's CPU time leaves theirs out, so that ratio is n/a,
    while envpool's threads are this process's. The measurements return fixed numbers here: the rows
    and the arithmetic are checked, no timing."""
    trained = []

    def train(script, args, warmup_iterations):
        trained.append((script.__name__, args.async_envs, args.compile))
        return 2000.0, 100.0, 1000

    monkeypatch.setattr(speed, "raw_env_speed",
                        lambda script, env_id, num_envs, seconds: (8000.0, 2000.0))
    monkeypatch.setattr(speed, "training_speed", train)
    speed.main(["--scripts", "ppo_atari.py", "ppo_atari_envpool.py", "--devices", "cpu"])
    rows = table_rows(capsys.readouterr().out, "script")
    options = ["plain", "async_envs", "compile", "async_envs+compile"]
    assert [(row["script"], row["options"]) for row in rows] == [
        (script, option) for script in ("ppo_atari.py", "ppo_atari_envpool.py")
        for option in options]
    assert trained == [(f"ppo.{script}", "async_envs" in option, "compile" in option)
                       for script in ("ppo_atari", "ppo_atari_envpool") for option in options]
    for row in rows:
        assert [row[column] for column in ("device", "raw env SPS", "training SPS", "ratio")] == [
            "cpu", "8,000", "2,000", "0.25"]
        in_workers = row["script"] == "ppo_atari.py" and "async_envs" in row["options"]
        assert row["CPU-time ratio"] == ("n/a" if in_workers else "0.05"), row


def test_raw_speed_counts_the_steps_of_every_environment(monkeypatch):
    """The raw speed is environment steps, num_envs per step of the vector env, over the clocks:
    counting the vector env's steps alone would make it num_envs times too slow, and the ratio of
    training to raw speed num_envs times too high. The clocks are fixed (2 s wall, 4 s CPU); the
    steps are counted on the script's own vector env."""
    stepped = []

    def counted_envs(env_id, num_envs):
        envs = classic.make_envs(env_id, num_envs)
        step = envs.step

        def counted_step(actions):
            stepped.append(len(actions))
            return step(actions)

        envs.step = counted_step
        return envs

    monkeypatch.setattr(speed_parts, "timed", lambda function: (function(), (2.0, 4.0))[1])
    wall, cpu = speed_parts.raw_env_speed(types.SimpleNamespace(make_envs=counted_envs),
                                          "CartPole-v1", 3, seconds=1e-3)
    # whole passes over the 256 actions drawn beforehand
    assert set(stepped) == {3} and len(stepped) % 256 == 0
    assert (wall, cpu) == (sum(stepped) / 2.0, sum(stepped) / 4.0)


def test_a_real_measurement_prints_a_row_whose_ratio_is_its_two_speeds_divided(capsys):
    """ppo.py measured for real, briefly: one row for the one option set asked for, with both
    ratios, the first being the printed training SPS over the printed raw SPS (to the rounding of
    the printed figures)."""
    speed.main(["--scripts", "ppo.py", "--devices", "cpu", "--options", "plain",
                "--raw-seconds", "0.2", "--set", "num_steps=16", "--total-timesteps",
                str(4 * 4 * 16)])
    (row,) = table_rows(capsys.readouterr().out, "script")
    assert [row[column] for column in ("script", "env", "envs", "device", "options")] == [
        "ppo.py", "CartPole-v1", "4", "cpu", "plain"]
    raw, training = (float(row[column].replace(",", ""))
                     for column in ("raw env SPS", "training SPS"))
    # The ratio has 3 significant digits, the speeds are rounded to whole steps per second.
    assert float(row["ratio"]) == pytest.approx(training / raw,
                                                rel=0.005 + 0.5 / training + 0.5 / raw)
    assert float(row["CPU-time ratio"]) > 0


def test_each_rollout_ends_after_the_iterations_last_sample_before_the_value_call():
    """speed_clocks.rollout_ends (--parts, and benchmark/gpu/steady.py): an iteration runs from one
    charts/SPS point to the next, and its rollout ends halfway between its last sample in a line of
    `main` before the value call and the sample after it. The samples just after an iteration
    starts, in the line of run.end_iteration (the end of the previous iteration's call, past the
    value call), are not the rollout's end. Stand-in samples, one a second: the split is exact."""
    split, loop, rollout, end_iteration = 50, 30, 40, 70
    seen, ends = [], [(0.0, 0)]
    for iteration in range(3):
        start = 10.0 * iteration
        lines = [end_iteration, loop, rollout, rollout, rollout, rollout, split, 60,
                 60, end_iteration]
        seen += [(start + 0.5 + second, line) for second, line in enumerate(lines)]
        ends.append((start + 10.0, 10 * (iteration + 1)))
    # between x5.5 and x6.5
    assert speed_clocks.rollout_ends(seen, ends, split) == [6.0, 16.0, 26.0]
    # with no sample before the value call, halfway to the iteration's first sample
    assert speed_clocks.rollout_ends([(1.0, 60)], [(0.0, 0), (10.0, 10)], split) == [0.5]


def test_the_split_is_the_value_call_of_every_scripts_iteration_loop():
    """Each script's rollout hands over to its update at `next_value = agent.get_value(...)`, the
    last value call of main's iteration loop (a time limit's bootstrap values elsewhere)."""
    for path in sorted((REPO / "ppo").glob("ppo*.py")):
        # (a loop: a test named ppo_procgen is Procgen's)
        script = importlib.import_module(f"ppo.{path.stem}")
        line = path.read_text().splitlines()[speed_clocks.value_call_line(script) - 1]
        assert line.strip().startswith("next_value = agent.get_value("), (path.name, line)


def test_the_sampler_reads_the_line_the_watched_function_is_at():
    """Sampler(watch=code) reads, from its own thread, where the function is in the thread that
    started it, and finds the lines after (None before it runs). The function waits for samples, not
    for time."""
    def watched(sampler):
        taken = len(sampler.samples)
        while len(sampler.samples) < taken + 3:
            time.sleep(0.001)

    sampler = speed_clocks.Sampler(0.001, watch=watched.__code__)
    with sampler:
        watched(sampler)
    lines = [line for _, line in sampler.lines()]
    body = {watched.__code__.co_firstlineno + offset for offset in (1, 2, 3)}
    assert lines[0] is None
    assert ({line for line in lines if line is not None} <= body
            and sum(line in body for line in lines) >= 3)


def stand_in_script(iterations: int):
    """A script's shape: main opens a SummaryWriter, and each iteration takes the value of the last
    observations, then logs charts/SPS with its step."""
    from torch.utils.tensorboard import SummaryWriter

    class Agent:
        def get_value(self, obs):
            return obs

    def work():
        return sum(range(1000))

    def main(args):
        writer = SummaryWriter("runs/stand-in")
        agent = Agent()
        for iteration in range(iterations):
            work()
            agent.get_value(0)
            work()
            writer.add_scalar("charts/SPS", 1.0, 10 * (iteration + 1))
        writer.close()

    return types.SimpleNamespace(Agent=Agent, main=main, work=work)


def test_the_parts_of_a_run_come_from_its_log_and_the_samples(tmp_path, monkeypatch, capsys):
    """iteration_parts on a stand-in script: one (rollout, update, steps) per iteration after the
    warm-up, with the steps of its charts/SPS points; with a profiler (steady.py --profile), the
    profile holds the iterations after the warm-up and no other, and nothing is left watching."""
    monkeypatch.chdir(tmp_path)
    script = stand_in_script(4)
    parts = speed_clocks.iteration_parts(script, None, warmup_iterations=1)
    assert [steps for _, _, steps in parts] == [10, 10, 10]
    assert all(rollout > 0 and update > 0 for rollout, update, _ in parts)
    profiler = cProfile.Profile()
    assert len(speed_clocks.iteration_parts(script, None, warmup_iterations=2,
                                            profiler=profiler)) == 2
    calls = {function[2]: count
             for function, (_, count, *_) in pstats.Stats(profiler).stats.items()}
    assert calls["work"] == 2 * 2  # twice in each of the last two iterations
    assert sys.getprofile() is None

    def profile_of_a_debugger(frame, event, argument):
        pass

    # a profile function set before (a debugger's, a tool's) is there again after, warm-up over or
    # not
    for warmup_iterations in (1, 3):
        sys.setprofile(profile_of_a_debugger)
        try:
            speed_clocks.iteration_parts(stand_in_script(2), None, warmup_iterations,
                                         profiler=cProfile.Profile())
            assert sys.getprofile() is profile_of_a_debugger
        finally:
            sys.setprofile(None)
    assert "steady state from" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()


def test_parts_replay_the_policy_step_and_the_minibatch_loss_of_a_real_run(tmp_path, monkeypatch):
    """--parts times the script's own calls: the arguments recorded are those of one iteration's
    first policy step (one observation per environment) and first minibatch (minibatch_size of
    them), seen with sys.setprofile through the decorator around both (speed.compiled), and the
    script is left as it was."""
    monkeypatch.chdir(tmp_path)
    args = classic.Args(num_envs=2, num_steps=32, num_minibatches=4, cuda=False)
    policy_step, loss = classic.Agent.get_action, classic.minibatch_loss
    recorded = speed_parts.record_first_calls(classic, args)
    (agent, obs), _ = recorded["policy"]
    assert isinstance(agent, classic.Agent) and tuple(obs.shape) == (2, 4)
    (loss_agent, minibatch_obs, minibatch_actions, *_), _ = recorded["loss"]
    assert (loss_agent is agent and tuple(minibatch_obs.shape) == (16, 4)
            and tuple(minibatch_actions.shape) == (16,))
    # nothing replaced
    assert (classic.Agent.get_action, classic.minibatch_loss) == (policy_step, loss)
    assert sys.getprofile() is None  # nothing left watching
    with speed_parts.first_calls_noted({"loss": classic.minibatch_loss}, {}):
        pass  # a function never called: the watcher goes when the run ends
    assert sys.getprofile() is None
    policy_seconds, gradient_seconds = speed_parts.part_floors(classic, args)
    assert 0 < policy_seconds < gradient_seconds  # a gradient step is forward, backward and Adam


def test_parts_table_turns_each_part_into_steps_per_second_and_adds_their_times(
        monkeypatch, capsys):
    """Fixed measurements, checked arithmetic: ppo.py's defaults (4 envs x 128 steps, 4 epochs of 4
    minibatches) with a policy step of 100 µs serve 40,000 steps a second, gradient steps of 1 ms
    512 / (16 x 1 ms) = 32,000; with the raw 8,000 the floor is 1 / (1/8,000 + 1/40,000 +
    1/32,000)."""
    monkeypatch.setattr(speed, "raw_env_speed",
                        lambda script, env_id, num_envs, seconds: (8000.0, 2000.0))
    monkeypatch.setattr(speed, "training_speed",
                        lambda script, args, warmup_iterations: (2000.0, 100.0, 1000))
    monkeypatch.setattr(speed, "part_floors", lambda script, run_args: (1e-4, 1e-3))
    monkeypatch.setattr(speed, "start_seconds", lambda script_file: 3.25)
    # the rollout took 30 µs and the update 60 µs per environment step
    monkeypatch.setattr(speed, "loop_split",
                        lambda script, run_args, warmup_iterations: (30e-6, 60e-6))
    speed.main(["--scripts", "ppo.py", "--devices", "cpu", "--options", "plain", "--parts"])
    out = capsys.readouterr().out
    (split,) = table_rows(out[out.index("The same run split in two"):], "script")
    rollout_floor = 1 / (1 / 8000 + 1 / 40000)
    assert {column: split[column] for column in ("rollout floor SPS", "rollout SPS",
                                                 "rollout, x floor", "update floor SPS",
                                                 "update SPS", "update, x floor")} == {
        "rollout floor SPS": f"{rollout_floor:,.0f}", "rollout SPS": "33,333",
        "rollout, x floor": f"{30e-6 * rollout_floor:.2f}", "update floor SPS": "32,000",
        "update SPS": "16,667", "update, x floor": "1.92"}
    (row,) = table_rows(out[out.index("Each part alone"):], "script")
    assert {column: row[column]
            for column in ("policy step", "policy SPS", "gradient step (minibatch)", "gradient SPS",
                           "floor SPS", "training SPS (plain)", "of the floor", "start")} == {
        "policy step": "100 µs", "policy SPS": "40,000",
        "gradient step (minibatch)": "1.00 ms (128)", "gradient SPS": "32,000",
        "floor SPS": f"{1 / (1 / 8000 + 1 / 40000 + 1 / 32000):,.0f}",
        "training SPS (plain)": "2,000",
        "of the floor": f"{2000 * (1 / 8000 + 1 / 40000 + 1 / 32000):.2f}", "start": "3.25 s"}


def test_the_start_is_timed_in_processes_that_import_the_script_as_a_run_does():
    """`--parts`' start column: fresh processes import the script by its file name from ppo/, as
    `python ppo/ppo.py` finds the modules beside it (ppo/ is no package: imported as `ppo.ppo` from
    the repository, the script's `import adam` would not be found)."""
    assert 0 < speed_parts.start_seconds("ppo.py") < 60


def test_speed_py_measures_a_script_whose_games_play_in_worker_processes(tmp_path):
    """As a user runs it: `--async-envs` of ppo_atari.py plays in processes that multiprocessing's
    forkserver starts, and each runs speed.py's top again with this process's path, ppo/ on it. The
    name `ppo` must be bound to the folder there before anything imports `ppo.exits`, or ppo/ppo.py
    takes it and the workers die at their first import."""
    result = subprocess.run([sys.executable, str(REPO / "benchmark" / "speed.py"),
                             "--scripts", "ppo_atari.py", "--options", "async_envs",
                             "--devices", "cpu", "--num-envs", "2", "--total-timesteps", "512",
                             "--set", "num_steps=64", "--raw-seconds", "0.2"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=HUNG_AFTER,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    [row] = [row for row in table_rows(result.stdout, "script") if row["options"] == "async_envs"]
    assert row["script"] == "ppo_atari.py"
