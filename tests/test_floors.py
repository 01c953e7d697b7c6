"""The lowest versions pyproject.toml admits for the core dependencies are versions the code runs
on.

FEATURES lists what the scripts need from a dependency that older releases lack, with the first
release that has it. The test fails when a floor in pyproject.toml drops below one of them, when an
installed version is below its floor, or when the installed package lacks the feature.

How the first versions were found (2026-11-23, with `pip download <package>==<version> --no-deps`):
- gymnasium: `class AutoresetMode` is in gymnasium/vector/vector_env.py of the 1.1.0 wheel and in no
  file of the 1.0.0 wheel. With 1.0.0's files first on PYTHONPATH, `python ppo/ppo.py` stops with
  "module 'gymnasium.vector' has no attribute 'AutoresetMode'"; with 1.1.0's it trains.
- torch: the floor is a release the scripts run on: `nox -s floors` installs every core dependency's
  floor (PyTorch 2.6.0 from PyPI) and runs each script's tiny run, evaluation and resumption (the
  smoke tests; CI runs it). On 2026-11-28 it failed at the first update: ppo_utils/adam.py handed
  torch.optim.adam.adam `decoupled_weight_decay`, an argument PyTorch 2.7 added. adam.py now leaves
  it out (False, its default, changes nothing without weight decay), so the floor stays at 2.6,
  whose `adam()` takes the arguments TORCH_2_6_ADAM lists (read off the 2.6.0 wheel).
  `Adam(..., fused=True)` accepts CPU tensors when "cpu" is among the devices of
  torch/utils/_foreach_utils.py:_get_fused_kernels_supported_devices: not in the 2.3.1 wheel, there
  in 2.4.0. (clip_grad_norm_(foreach=True) and torch.load(weights_only=...) are older.) And
  `aten.multinomial.default`, which the CNN scripts' action sampling runs (Categorical.sample), is
  in the set of ops that torch/_inductor/utils.py:get_first_incompatible_cudagraph_node refuses to
  record as a CUDA graph in the 2.5.0 wheel and not in the 2.6.0 wheel: before 2.6, --cudagraphs
  would silently leave the policy step out of the graph.
- tyro: with the 0.8.0 wheel (and its dependencies) first on PYTHONPATH, parse_args of ppo.py,
  ppo_continuous_action.py, ppo_procgen.py, ppo_atari_envpool.py and ppo_atari_multigpu.py (Literal,
  list[int], `float | None`, --no-cuda) and `--resume` (tyro.cli(..., default=...)) read their
  flags as the installed tyro does.
NumPy and tensorboard floors were not checked feature by feature: the scripts use only long-standing
NumPy calls and tensorboard through torch's SummaryWriter; here they must only be met by what is
installed.

EXCLUDED lists releases pyproject.toml must leave out, each with its reason; the test fails when an
extra admits one, or when one is installed. What was weighed and not excluded:
- MuJoCo 3.5.0 and later: they sum two geoms' contact margins where earlier releases took the
  larger, which changes Hopper's contacts (hopper.xml sets margins; walker2d.xml and
  half_cheetah.xml do not). ppo_continuous_action.py learns Hopper-v4 no worse on 3.17.0 than on
  3.4.0 (1M steps, five seeds a side: 2248.65 against 2042.58, Mann-Whitney U = 12, p = 1.00), so
  the range stays open (docs/notes/mujoco_versions.md).
"""

import ast
import re
import tomllib
from importlib.metadata import PackageNotFoundError, version

import pytest

from conftest import REPO

CORE = ["torch", "gymnasium", "numpy", "tyro", "tensorboard", "wandb"]

# (package, first version with the feature, the feature);
# test_the_installed_packages_have_the_features tries each one on what is installed.
FEATURES = [
    ("gymnasium", "1.1", "gym.vector.AutoresetMode (SAME_STEP autoreset)"),
    ("torch", "2.4", "Adam(fused=True) on CPU parameters"),
    ("torch", "2.6",
     "CUDA graphs that record torch.multinomial (--cudagraphs samples actions in the graph)"),
    ("tyro", "0.8",
     "tyro.cli(Args, args=..., default=...) with Literal, list[int] and X | None fields"),
]

# The arguments torch.optim.adam.adam takes in PyTorch 2.6.0, the floor, as inspect.signature read
# them off its wheel (2026-11-28). 2.7 added decoupled_weight_decay.
TORCH_2_6_ADAM = {
    "params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps", "foreach",
    "capturable", "differentiable", "fused", "grad_scale", "found_inf", "has_complex", "amsgrad",
    "beta1", "beta2", "lr", "weight_decay", "eps", "maximize"}

# (package, release, why it is left out)
EXCLUDED = [
    ("mujoco", "4.0.0", "its Newton solver's sparse Cholesky factorization gives wrong "
                        "accelerations and divergence; fixed in 4.0.1 "
                        "(google-deepmind/mujoco#3767)"),
]


def as_tuple(text: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0): the release numbers, enough to order the versions used here."""
    return tuple(int(part) for part in re.match(r"\d+(\.\d+)*", text).group(0).split("."))


def declared_floors() -> dict[str, str]:
    """{package: lowest version} from pyproject.toml's dependencies and extras (`name>=X` only)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    floors = {}
    for requirement in requirements:
        match = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([\d.]+)", requirement)
        if match:
            name = match.group(1).lower()
            floors[name] = min(floors.get(name, match.group(3)), match.group(3), key=as_tuple)
    return floors


def test_every_core_dependency_declares_a_floor():
    floors = declared_floors()
    assert [name for name in CORE if name not in floors] == []


@pytest.mark.parametrize("package,first,feature", FEATURES, ids=[row[0] for row in FEATURES])
def test_no_floor_is_below_the_first_version_with_what_the_code_uses(package, first, feature):
    # the lowest one, also over the extras (gymnasium[mujoco]>=...)
    floor = declared_floors()[package]
    assert as_tuple(floor) >= as_tuple(first), (
        f"pyproject.toml admits {package} {floor}, but the scripts need {feature}, first in "
        f"{package} {first}")


@pytest.mark.parametrize("package", CORE)
def test_the_installed_versions_meet_the_floors(package):
    assert as_tuple(version(package)) >= as_tuple(declared_floors()[package])


def test_the_installed_packages_have_the_features():
    import gymnasium as gym
    import torch
    import tyro
    from ppo import ppo_atari_multigpu

    assert hasattr(gym.vector, "AutoresetMode") and hasattr(gym.vector.AutoresetMode, "SAME_STEP")
    from ppo_utils.adam import Adam
    parameter = torch.nn.Parameter(torch.zeros(3))
    # the scripts' optimizer, as they build it
    optimizer = Adam([parameter], lr=0.1, eps=1e-5, fused=True)
    parameter.grad = torch.ones(3)
    optimizer.step()
    assert torch.all(parameter < 0)
    from torch._inductor.utils import get_first_incompatible_cudagraph_node
    from torch.fx.experimental.proxy_tensor import make_fx
    sampling = make_fx(lambda probs: torch.multinomial(probs, 1))(torch.ones(2, 3))
    assert get_first_incompatible_cudagraph_node(sampling) is None
    saved = ppo_atari_multigpu.Args(seed=5)
    args = tyro.cli(ppo_atari_multigpu.Args,
                    args=["--device-ids", "0", "1", "--target-kl", "0.02"], default=saved)
    assert (args.seed, args.device_ids, args.target_kl) == (5, [0, 1], 0.02)


def test_adam_hands_torch_only_what_the_floor_takes():
    """ppo_utils/adam.py calls torch.optim.adam.adam with arguments that PyTorch's floor takes: a
    newer one (decoupled_weight_decay, from 2.7) stops every script at its first update on 2.6.
    `nox -s floors` runs that update; this reads the call, on whatever PyTorch is installed."""
    call = next(node for node in ast.walk(ast.parse((REPO / "ppo_utils" / "adam.py").read_text()))
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "adam")
    assert {keyword.arg for keyword in call.keywords} - TORCH_2_6_ADAM == set()
    assert declared_floors()["torch"] == "2.6", ("TORCH_2_6_ADAM is the floor's signature: read it "
                                                 "off the new floor")


@pytest.mark.parametrize("package,release,reason", EXCLUDED,
                         ids=[f"{row[0]}-{row[1]}" for row in EXCLUDED])
def test_excluded_releases_are_left_out_and_not_installed(package, release, reason):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [requirement.replace(" ", "")
                    for extra in project["optional-dependencies"].values() for requirement in extra]
    assert f"{package}!={release}" in requirements, (f"pyproject.toml should leave out {package} "
                                                     f"{release}: {reason}")
    try:
        installed = version(package)
    except PackageNotFoundError:
        return
    assert as_tuple(installed) != as_tuple(release), f"{package} {installed} is installed: {reason}"
