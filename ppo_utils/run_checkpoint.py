"""What a run saves and takes back: its checkpoint (the settings, weights, optimizer, random
generators, environments, the script's running statistics and its Resumable; under torchrun each
rank's own), and a resumed run's restoring of them."""

import os
from dataclasses import asdict

import numpy as np
import torch

from ppo_utils import checkpoint as checkpoints
from ppo_utils import environments
from ppo_utils.ranks import World


def kept(value):
    """`value` as a checkpoint keeps it: arrays copied, tensors (alone or in a tuple) on the CPU."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if torch.is_tensor(value):
        return value.cpu()
    return tuple(map(kept, value)) if isinstance(value, tuple) else value


class RunCheckpoint:
    """The checkpoint of one run: runs/<name>/checkpoint.pt, which rank 0 writes; the `checkpoint`
    a resumed run was given; and the newest good one on disk (`last_good`: its path and step), what
    a diverged run leaves behind. A resumed run goes on with the saved environments, the very
    episodes it left (`saved_envs`); they cannot record video, so a run that records
    (`records_video`) starts new ones instead, and no longer ends exactly as an unbroken one
    would."""

    def __init__(self, args, variant: str, checkpoint: dict | None, world: World, folder: str,
                 name: str, records_video: bool):
        self.args, self.variant, self.checkpoint, self.world, self.name = \
            args, variant, checkpoint, world, name
        self.path = os.path.join(folder, "checkpoint.pt")
        # None where the checkpoint holds none
        self.saved_envs = (world.this_ranks(checkpoint.get("envs"))
                           if checkpoint and not records_video else None)
        self.last_good = (args.resume, checkpoint["global_step"]) if checkpoint else None

    def resumed(self, resumable: type[tuple], device: torch.device) -> tuple | None:
        """Where the rollout stood when the checkpoint was written, as the script's `resumable`
        NamedTuple (this rank's, tensors on `device`), whose fields name what the checkpoint holds.
        None for a new run, or one that starts new episodes."""
        if self.saved_envs is None:
            return None

        def on_device(value):
            return value.to(device) if torch.is_tensor(value) else value

        values = [self.world.this_ranks(self.checkpoint[name]) for name in resumable._fields]
        return resumable._make(tuple(map(on_device, value)) if isinstance(value, tuple)
                               else on_device(value) for value in values)

    def restore(self, agent: torch.nn.Module, optimizer, statistics: dict,
                device: torch.device) -> tuple[int, int]:
        """Put a resumed run's weights, optimizer, running `statistics` (by name) and random
        generators back. Returns the checkpoint's iteration and step: (0, 0) for a new run."""
        if not self.checkpoint:
            return 0, 0
        agent.load_state_dict(self.checkpoint["model"])
        optimizer.load_state_dict(self.checkpoint["optimizer"])
        for name, statistic in statistics.items():
            checkpoints.restore_statistics(statistic, self.world.this_ranks(self.checkpoint[name]))
        rng = self.checkpoint["rng"]
        checkpoints.restore_rng(rng[self.world.rank] if isinstance(rng, list) else rng, device)
        return self.checkpoint["iteration"], self.checkpoint["global_step"]

    def save(self, iteration: int, global_step: int, agent: torch.nn.Module, optimizer, envs,
             statistics: dict, rollout_state: dict, recent_returns, device: torch.device) -> None:
        """Write what resuming needs: the settings, the weights, the optimizer, the random
        generators, the environments (`envs`; None where they cannot be saved), the script's running
        `statistics` and its `rollout_state`, copied; under torchrun the ranks' own (their
        generators, environments and rollout state) gathered into lists, which rank 0 writes."""
        state = {"rng": checkpoints.rng_state(device),
                 **({} if envs is None else {"envs": environments.save_envs(envs)}),
                 **{name: checkpoints.statistics_state(statistic)
                    for name, statistic in statistics.items()},
                 **{name: kept(value) for name, value in rollout_state.items()}}
        if self.world.world_size:
            ranks = self.world.gathered(state)
            state = {"world_size": self.world.world_size,
                     **{name: [rank[name] for rank in ranks] for name in state}}
        if self.world.rank == 0:
            self.last_good = (self.path, global_step)
            checkpoints.save_checkpoint(self.path, {
                "format": checkpoints.CHECKPOINT_FORMAT, "variant": self.variant,
                "args": asdict(self.args), "run_name": self.name, "iteration": iteration,
                "global_step": global_step, "model": agent.state_dict(),
                "optimizer": optimizer.state_dict(),
                "recent_returns": list(recent_returns), **state})
