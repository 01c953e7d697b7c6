"""The rollout's policy network in NumPy (--numpy-policy), for the small MLPs of a CPU run.

On a CPU, a policy step of a 64-64 MLP is mostly PyTorch's fixed cost per operator call, some ten
calls of several microseconds each, and in the rollout it alternates with the environments' own
code, which makes it slower still (docs/notes/speed.md). The same layers as NumPy matrix products,
on a copy of the weights taken when the rollout starts, cost a fraction of that. The script draws
its actions from NumPy's generator then, which the checkpoints save with the others: such a run is
reproducible and resumes exactly, but its random numbers, and so its results, are not those of a run
without the option. The log-probabilities and values that the update uses still come from the
PyTorch network, in the batched pass after the rollout.
"""

from typing import Callable

import numpy as np
import torch
import torch.nn as nn


class NumpyMLP:
    """A copy of `network`, an nn.Sequential of Linear and Tanh layers, as NumPy arrays: called on a
    float32 batch of observations, it returns what the network would (up to rounding)."""

    def __init__(self, network: nn.Sequential):
        self.layers = []
        for layer in network:
            if isinstance(layer, nn.Linear):
                # transposed once here, so that each call is observations @ weight + bias
                self.layers.append((layer.weight.detach().cpu().numpy().T.copy(),
                                    layer.bias.detach().cpu().numpy().copy()))
            elif isinstance(layer, nn.Tanh):
                self.layers.append(np.tanh)
            else:
                raise TypeError(f"--numpy-policy copies Linear and Tanh layers only, not {layer}")

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            obs = layer(obs) if callable(layer) else obs @ layer[0] + layer[1]
        return obs


def categorical_draw(actor: nn.Sequential) -> Callable[[np.ndarray], np.ndarray]:
    """The policy step of a categorical policy whose logits `actor` gives, on a NumPy copy of it as
    it is now: the draw the scripts' get_action makes (the softmax's probabilities divided by
    exponential noise, the largest taken), with NumPy's random numbers. The softmax's sum is left
    out: it divides every probability alike, and the draw only compares them."""
    logits_of = NumpyMLP(actor)

    def get_action(obs: np.ndarray) -> np.ndarray:
        logits = logits_of(obs)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return (probs / np.random.standard_exponential(probs.shape)).argmax(axis=-1)

    return get_action


def gaussian_draw(actor_mean: nn.Sequential,
                  actor_logstd: torch.Tensor) -> Callable[[np.ndarray], np.ndarray]:
    """The policy step of a Gaussian policy whose means `actor_mean` gives and whose log standard
    deviations are `actor_logstd`, on a NumPy copy of both as they are now: the mean plus std x
    normal noise, as the scripts' get_action draws, with NumPy's random numbers."""
    mean_of = NumpyMLP(actor_mean)
    std = actor_logstd.detach().exp().cpu().numpy()

    def get_action(obs: np.ndarray) -> np.ndarray:
        mean = mean_of(obs)
        return mean + std * np.random.standard_normal(mean.shape).astype(np.float32)

    return get_action
