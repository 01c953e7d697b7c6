"""adam.Adam, every script's optimizer: torch.optim.Adam's update without torch.optim.Optimizer,
whose methods import the compiler. What it must keep: torch.optim.Adam's numbers, bit for bit; its
checkpoint format, both ways (checkpoints written before it existed resume); and a start that does
not load torch._dynamo, which is why it exists."""

import copy
import subprocess
import sys

import pytest
import torch

from conftest import HUNG_AFTER, REPO

from ppo_utils import adam


def twin_networks() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    return network, copy.deepcopy(network)


def train(network: torch.nn.Module, optimizer, steps: int, seed: int) -> None:
    """Gradient steps on random inputs, the learning rate annealed between them as the scripts
    do."""
    inputs = torch.Generator().manual_seed(seed)
    for step in range(steps):
        optimizer.param_groups[0]["lr"] = 1e-3 * (1.0 - step / steps)
        optimizer.zero_grad()
        network(torch.randn(16, 8, generator=inputs)).pow(2).mean().backward()
        optimizer.step()


def assert_same(first: torch.nn.Module, second: torch.nn.Module, first_optimizer, second_optimizer):
    for a, b in zip(first.parameters(), second.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    first_state, second_state = first_optimizer.state_dict(), second_optimizer.state_dict()
    assert first_state["param_groups"] == second_state["param_groups"]
    assert first_state["state"].keys() == second_state["state"].keys()
    for index, state in first_state["state"].items():
        assert state.keys() == second_state["state"][index].keys()
        for key, value in state.items():
            torch.testing.assert_close(value, second_state["state"][index][key], rtol=0, atol=0)


@pytest.mark.parametrize("fused", [True, None], ids=["fused, as the scripts ask", "default"])
def test_its_steps_are_torch_adams_bit_for_bit(fused):
    ours, theirs = twin_networks()
    our_optimizer = adam.Adam(ours.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    their_optimizer = torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    train(ours, our_optimizer, 20, seed=1)
    train(theirs, their_optimizer, 20, seed=1)
    assert_same(ours, theirs, our_optimizer, their_optimizer)


@pytest.mark.parametrize("saver", ["torch.optim.Adam", "adam.Adam"])
def test_either_adam_resumes_what_the_other_saved(saver, tmp_path):
    """A checkpoint's optimizer, written by one class and read by the other, goes on as the writer
    would have: the weights and the moments after 10 more steps are the same."""
    classes = {"torch.optim.Adam": torch.optim.Adam, "adam.Adam": adam.Adam}
    reader = next(name for name in classes if name != saver)
    network, _ = twin_networks()
    optimizer = classes[saver](network.parameters(), lr=1e-3, eps=1e-5, fused=True)
    train(network, optimizer, 10, seed=1)
    torch.save({"model": network.state_dict(), "optimizer": optimizer.state_dict()},
               tmp_path / "ckpt.pt")

    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    resumed = copy.deepcopy(network)
    resumed.load_state_dict(saved["model"])
    resumed_optimizer = classes[reader](resumed.parameters(), lr=1e-3, eps=1e-5, fused=True)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    train(network, optimizer, 10, seed=2)
    train(resumed, resumed_optimizer, 10, seed=2)
    assert_same(network, resumed, optimizer, resumed_optimizer)


def test_a_training_run_does_not_import_the_compiler(tmp_path):
    """torch.optim.Optimizer's methods import torch._dynamo (and SymPy behind it), 1 to 2 seconds of
    every run's start; only --compile needs it. A plain run of ppo.py, start to end, must not."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ppo; "
            "ppo.main(ppo.Args(total_timesteps=256, num_steps=32, cuda=False)); "
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(REPO / "ppo")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=HUNG_AFTER)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False False", result.stdout
