"""Tests of benchmark/speed.py's machinery: which option combinations it measures, how it reads
settings, and that its training measurement skips the warm-up. No timing is checked."""

import pytest
import torch

import ppo.ppo as classic
import ppo.ppo_atari_envpool as envpool_script
from benchmark import speed
from conftest import expect_usage_error


def test_option_sets_are_plain_each_option_and_all_together_where_the_script_has_them():
    assert speed.option_sets(classic, "cpu", None) == [(), ("compile",)]
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
     ["--options compyle: ppo.py has no speed option 'compyle'", "it has: plain, compile, cudagraphs"]),
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
    assert classic.SummaryWriter is not None and classic.SummaryWriter.__name__ == "SummaryWriter"  # restored
    assert not (tmp_path / "runs").exists()  # the run went to a temporary directory
    expect_usage_error(capsys, lambda: speed.training_speed(classic, args, warmup_iterations=6), "speed.py",
                       "too few to measure", "raise --total-timesteps")
