"""Tests of benchmark/speed.py's machinery: which option combinations it measures, how it reads
settings, and that its training measurement skips the warm-up. No timing is checked."""

import types

import pytest
import torch

import ppo.ppo as classic
import ppo.ppo_atari_envpool as envpool_script
from benchmark import speed
from conftest import expect_usage_error, table_rows


def test_option_sets_are_plain_each_option_and_all_together_where_the_script_has_them():
    assert speed.option_sets(classic, "cpu", None) == [(), ("numpy_policy",), ("compile",), ("numpy_policy", "compile")]
    assert speed.option_sets(envpool_script, "cpu", None) == [(), ("async_envs",), ("compile",),
                                                              ("async_envs", "compile")]
    assert speed.option_sets(envpool_script, "cuda", None) == [
        (), ("async_envs",), ("compile",), ("cudagraphs",), ("async_envs", "compile", "cudagraphs")]
    # Requested sets are kept in order; those a script or device cannot run are left out.
    requested = ["plain", "async_envs+compile", "cudagraphs"]
    assert speed.option_sets(envpool_script, "cpu", requested) == [(), ("async_envs", "compile")]
    assert speed.option_sets(classic, "cpu", requested) == [()]


def test_settings_take_the_type_of_the_field(capsys):
    values = speed.field_values(envpool_script, ["clip_coef=0.2", "num_minibatches=8", "anneal_lr=false",
                                                 "target_kl=0.015"])
    assert values == {"clip_coef": 0.2, "num_minibatches": 8, "anneal_lr": False, "target_kl": 0.015}
    assert type(values["num_minibatches"]) is int
    assert speed.field_values(envpool_script, ["target_kl=None"]) == {"target_kl": None}
    for assignment, fragment in [("clip=0.2", "has no setting 'clip'"), ("anneal_lr=flase", "true or false"),
                                 ("num_minibatches=8.5", "not a valid int")]:
        expect_usage_error(capsys, lambda: speed.field_values(envpool_script, [assignment]), "speed.py",
                           f"--set {assignment}", fragment)


# --raw-seconds 0.01: were a wrong value not refused, the test would not wait 10 s for the raw speed.
@pytest.mark.parametrize("argv, fragments", [
    (["--raw-seconds", "0"], ["--raw-seconds 0.0: give a positive number"]),
    (["--raw-seconds", "-1"], ["--raw-seconds -1.0"]),
    (["--num-envs", "0", "--raw-seconds", "0.01"], ["--num-envs 0: give at least 1"]),
    (["--total-timesteps", "0", "--raw-seconds", "0.01"], ["--total-timesteps 0: give at least 1"]),
    (["--warmup-iterations", "-1", "--raw-seconds", "0.01"], ["--warmup-iterations -1: give at least 0"]),
    (["--scripts", "ppo_nope.py"], ["unknown script 'ppo_nope.py'", "ppo_atari_envpool.py"]),
    (["--options", "compyle", "--raw-seconds", "0.01"],
     ["--options compyle: ppo.py has no speed option 'compyle'", "it has: plain, numpy_policy, compile, cudagraphs"]),
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
    expect_usage_error(capsys, lambda: speed.main(["--scripts", "ppo.py", "--devices", "cuda"]), "speed.py",
                       "PyTorch sees no CUDA device")


def test_training_speed_is_measured_after_the_warmup_iterations(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = classic.Args(total_timesteps=6 * 64, num_envs=2, num_steps=32, cuda=False)
    wall, cpu, steps = speed.training_speed(classic, args, warmup_iterations=1)
    assert wall > 0 and cpu > 0
    assert steps == 5 * 64  # the last 5 of the 6 iterations
    assert speed.training_speed(classic, args, warmup_iterations=0)[2] == 6 * 64
    import run_logs  # where the scripts open their writer

    assert run_logs.SummaryWriter.__name__ == "SummaryWriter"  # restored
    assert not (tmp_path / "runs").exists()  # the run went to a temporary directory
    expect_usage_error(capsys, lambda: speed.training_speed(classic, args, warmup_iterations=6), "speed.py",
                       "too few to measure", "raise --total-timesteps")


def test_table_divides_training_by_raw_speed_and_leaves_out_the_cpu_time_of_worker_processes(monkeypatch, capsys):
    """Each measured option set is a row, whose ratio is training over raw SPS by the wall clock and whose CPU-time
    ratio is the same by CPU time; where the games play in worker processes (--async-envs of ppo_atari.py) this
    process's CPU time leaves theirs out, so that ratio is n/a, while envpool's threads are this process's. The
    measurements return fixed numbers here: the rows and the arithmetic are checked, no timing."""
    trained = []

    def train(script, args, warmup_iterations):
        trained.append((script.__name__, args.async_envs, args.compile))
        return 2000.0, 100.0, 1000

    monkeypatch.setattr(speed, "raw_env_speed", lambda script, env_id, num_envs, seconds: (8000.0, 2000.0))
    monkeypatch.setattr(speed, "training_speed", train)
    speed.main(["--scripts", "ppo_atari.py", "ppo_atari_envpool.py", "--devices", "cpu"])
    rows = table_rows(capsys.readouterr().out, "script")
    options = ["plain", "async_envs", "compile", "async_envs+compile"]
    assert [(row["script"], row["options"]) for row in rows] == [
        (script, option) for script in ("ppo_atari.py", "ppo_atari_envpool.py") for option in options]
    assert trained == [(f"ppo.{script}", "async_envs" in option, "compile" in option)
                       for script in ("ppo_atari", "ppo_atari_envpool") for option in options]
    for row in rows:
        assert [row[column] for column in ("device", "raw env SPS", "training SPS", "ratio")] == [
            "cpu", "8,000", "2,000", "0.25"]
        in_workers = row["script"] == "ppo_atari.py" and "async_envs" in row["options"]
        assert row["CPU-time ratio"] == ("n/a" if in_workers else "0.05"), row


def test_raw_speed_counts_the_steps_of_every_environment(monkeypatch):
    """The raw speed is environment steps, num_envs per step of the vector env, over the clocks: counting the vector
    env's steps alone would make it num_envs times too slow, and the ratio of training to raw speed num_envs times
    too high. The clocks are fixed (2 s wall, 4 s CPU); the steps are counted on the script's own vector env."""
    stepped = []

    def counted_envs(env_id, num_envs):
        envs = classic.make_envs(env_id, num_envs)
        step = envs.step

        def counted_step(actions):
            stepped.append(len(actions))
            return step(actions)

        envs.step = counted_step
        return envs

    monkeypatch.setattr(speed, "timed", lambda function: (function(), (2.0, 4.0))[1])
    wall, cpu = speed.raw_env_speed(types.SimpleNamespace(make_envs=counted_envs), "CartPole-v1", 3, seconds=1e-3)
    assert set(stepped) == {3} and len(stepped) % 256 == 0  # whole passes over the 256 actions drawn beforehand
    assert (wall, cpu) == (sum(stepped) / 2.0, sum(stepped) / 4.0)


def test_a_real_measurement_prints_a_row_whose_ratio_is_its_two_speeds_divided(capsys):
    """ppo.py measured for real, briefly: one row for the one option set asked for, with both ratios, the first
    being the printed training SPS over the printed raw SPS (to the rounding of the printed figures)."""
    speed.main(["--scripts", "ppo.py", "--devices", "cpu", "--options", "plain", "--raw-seconds", "0.2",
                "--set", "num_steps=16", "--total-timesteps", str(4 * 4 * 16)])
    (row,) = table_rows(capsys.readouterr().out, "script")
    assert [row[column] for column in ("script", "env", "envs", "device", "options")] == [
        "ppo.py", "CartPole-v1", "4", "cpu", "plain"]
    raw, training = (float(row[column].replace(",", "")) for column in ("raw env SPS", "training SPS"))
    # The ratio has 3 significant digits, the speeds are rounded to whole steps per second.
    assert float(row["ratio"]) == pytest.approx(training / raw, rel=0.005 + 0.5 / training + 0.5 / raw)
    assert float(row["CPU-time ratio"]) > 0


def test_steady_state_splits_each_iteration_at_the_last_value_call_before_the_update(monkeypatch):
    """speed.iteration_parts (--parts, and benchmark/gpu/steady.py): the rollout ends at the iteration's
    last Agent.get_value call (the last observations' value), not at an earlier one (a time limit's
    bootstrap), and the update ends when charts/SPS is logged. A stand-in script advances a stand-in
    clock, so the split is exact."""
    import run_logs  # where the scripts open their writer

    now = [0.0]
    monkeypatch.setattr(speed.time, "perf_counter", lambda: now[0])

    class Agent:
        def get_value(self, obs, *lstm_state):
            return obs

    def main(args):
        writer = run_logs.SummaryWriter(args.log_dir)
        agent = Agent()
        for iteration in range(3):
            now[0] += 1.0
            agent.get_value(0, "a bootstrap mid-rollout")
            now[0] += 2.0
            agent.get_value(0)  # the last observations': the rollout ends here
            now[0] += 0.5  # the update
            writer.add_scalar("charts/SPS", 1.0, 10 * (iteration + 1))
        writer.close()

    script = types.SimpleNamespace(Agent=Agent, main=main)
    parts = speed.iteration_parts(script, types.SimpleNamespace(log_dir="runs/x"), warmup_iterations=1)
    assert parts == [(3.0, 0.5, 10), (3.0, 0.5, 10)]
    assert Agent.get_value.__name__ == "get_value"  # restored
    assert run_logs.SummaryWriter.__name__ == "SummaryWriter"


def test_parts_replay_the_policy_step_and_the_minibatch_loss_of_a_real_run(tmp_path, monkeypatch):
    """--parts times the script's own calls: the arguments recorded are those of one iteration's first
    policy step (one observation per environment) and first minibatch (minibatch_size of them), and the
    script is left as it was."""
    monkeypatch.chdir(tmp_path)
    args = classic.Args(num_envs=2, num_steps=32, num_minibatches=4, cuda=False)
    policy_step, loss = classic.Agent.get_action, classic.minibatch_loss
    recorded = speed.record_first_calls(classic, args)
    (agent, obs), _ = recorded["policy"]
    assert isinstance(agent, classic.Agent) and tuple(obs.shape) == (2, 4)
    (loss_agent, minibatch_obs, minibatch_actions, *_), _ = recorded["loss"]
    assert loss_agent is agent and tuple(minibatch_obs.shape) == (16, 4) and tuple(minibatch_actions.shape) == (16,)
    assert (classic.Agent.get_action, classic.minibatch_loss) == (policy_step, loss)  # restored
    policy_seconds, gradient_seconds = speed.part_floors(classic, args)
    assert 0 < policy_seconds < gradient_seconds  # a gradient step is forward, backward and Adam


def test_parts_table_turns_each_part_into_steps_per_second_and_adds_their_times(monkeypatch, capsys):
    """Fixed measurements, checked arithmetic: ppo.py's defaults (4 envs x 128 steps, 4 epochs of 4
    minibatches) with a policy step of 100 µs serve 40,000 steps a second, gradient steps of 1 ms
    512 / (16 x 1 ms) = 32,000; with the raw 8,000 the floor is 1 / (1/8,000 + 1/40,000 + 1/32,000)."""
    monkeypatch.setattr(speed, "raw_env_speed", lambda script, env_id, num_envs, seconds: (8000.0, 2000.0))
    monkeypatch.setattr(speed, "training_speed", lambda script, args, warmup_iterations: (2000.0, 100.0, 1000))
    monkeypatch.setattr(speed, "part_floors", lambda script, run_args: (1e-4, 1e-3))
    monkeypatch.setattr(speed, "start_seconds", lambda script_file: 3.25)
    # the rollout took 30 µs and the update 60 µs per environment step
    monkeypatch.setattr(speed, "loop_split", lambda script, run_args, warmup_iterations: (30e-6, 60e-6))
    speed.main(["--scripts", "ppo.py", "--devices", "cpu", "--options", "plain", "--parts"])
    out = capsys.readouterr().out
    (split,) = table_rows(out[out.index("The same run split in two"):], "script")
    rollout_floor = 1 / (1 / 8000 + 1 / 40000)
    assert {column: split[column] for column in ("rollout floor SPS", "rollout SPS", "rollout, x floor",
                                                 "update floor SPS", "update SPS", "update, x floor")} == {
        "rollout floor SPS": f"{rollout_floor:,.0f}", "rollout SPS": "33,333",
        "rollout, x floor": f"{30e-6 * rollout_floor:.2f}", "update floor SPS": "32,000", "update SPS": "16,667",
        "update, x floor": "1.92"}
    (row,) = table_rows(out[out.index("Each part alone"):], "script")
    assert {column: row[column] for column in ("policy step", "policy SPS", "gradient step (minibatch)",
                                                "gradient SPS", "floor SPS", "training SPS (plain)",
                                                "of the floor", "start")} == {
        "policy step": "100 µs", "policy SPS": "40,000", "gradient step (minibatch)": "1.00 ms (128)",
        "gradient SPS": "32,000",
        "floor SPS": f"{1 / (1 / 8000 + 1 / 40000 + 1 / 32000):,.0f}", "training SPS (plain)": "2,000",
        "of the floor": f"{2000 * (1 / 8000 + 1 / 40000 + 1 / 32000):.2f}", "start": "3.25 s"}
