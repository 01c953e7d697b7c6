"""Tests of benchmark/speed.py's machinery: which option combinations it measures, how it reads
settings, and that its training measurement skips the warm-up. No timing is checked."""

import pytest

import ppo.ppo as classic
import ppo.ppo_atari_envpool as envpool_script
from benchmark import speed


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


def test_settings_take_the_type_of_the_field():
    values = speed.field_values(envpool_script, ["clip_coef=0.2", "num_minibatches=8", "anneal_lr=false",
                                                 "target_kl=0.015"])
    assert values == {"clip_coef": 0.2, "num_minibatches": 8, "anneal_lr": False, "target_kl": 0.015}
    assert type(values["num_minibatches"]) is int
    assert speed.field_values(envpool_script, ["target_kl=None"]) == {"target_kl": None}
    with pytest.raises(SystemExit, match="has no setting 'clip'"):
        speed.field_values(envpool_script, ["clip=0.2"])
    with pytest.raises(SystemExit, match="true or false"):
        speed.field_values(envpool_script, ["anneal_lr=flase"])
    with pytest.raises(SystemExit, match="not a valid int"):
        speed.field_values(envpool_script, ["num_minibatches=8.5"])


def test_training_speed_is_measured_after_the_warmup_iterations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = classic.Args(total_timesteps=6 * 64, num_envs=2, num_steps=32, cuda=False)
    wall, cpu, steps = speed.training_speed(classic, args, warmup_iterations=1)
    assert wall > 0 and cpu > 0
    assert steps == 5 * 64  # the last 5 of the 6 iterations
    assert speed.training_speed(classic, args, warmup_iterations=0)[2] == 6 * 64
    assert classic.SummaryWriter is not None and classic.SummaryWriter.__name__ == "SummaryWriter"  # restored
    assert not (tmp_path / "runs").exists()  # the run went to a temporary directory
    with pytest.raises(SystemExit, match="too few to measure"):
        speed.training_speed(classic, args, warmup_iterations=6)
