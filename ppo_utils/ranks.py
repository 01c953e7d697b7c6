"""The processes and the device a run runs on: the device it picks, and torchrun's world of ranks
(who this process is, the sizes the ranks can share, each rank's device, what they gather)."""

import os

import numpy as np
import torch

from ppo_utils.exits import fail


def choose_device(args, variant: str, device: torch.device | None = None) -> torch.device:
    """`device`, or else CUDA when it is there and --cuda allows it, else the CPU; --cudagraphs
    needs CUDA."""
    device = device or torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        fail(variant, "--cudagraphs needs a CUDA device: drop it, or run on a GPU (and without "
                      "--no-cuda)")
    return device


def all_gathered(item, world_size: int) -> list:
    """[item of rank 0, item of rank 1, ...] on every rank of a torchrun world (any picklable item).
    Used once per iteration, for what is logged and for the checkpoint, never per step."""
    if world_size == 1:
        return [item]
    items = [None] * world_size
    torch.distributed.all_gather_object(items, item)
    return items


def torchrun_process() -> tuple[int, int, int, int]:
    """Who this process is, as torchrun tells it in environment variables: its rank among all the
    processes (on all nodes), their number, its rank among those of its node, and their number.
    Without torchrun a script is a world of one process."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def check_world_sizes(args, variant: str, world_size: int) -> None:
    """Refuse sizes that the `world_size` processes of a data-parallel run cannot share: the world's
    --num-envs environments split evenly between them, and each one's share of the batch into
    --num-minibatches equal minibatches."""
    if args.num_envs % world_size != 0:
        fail(variant, f"--num-envs {args.num_envs} does not split evenly between {world_size} "
                      f"processes: make it a multiple of {world_size} or start another number of "
                      "processes")
    local_batch_size = args.num_envs // world_size * args.num_steps
    if local_batch_size % args.num_minibatches != 0:
        fail(variant, f"each process's share of the batch, --num-envs / {world_size} processes x "
                      f"--num-steps = {local_batch_size}, does not divide into --num-minibatches "
                      f"{args.num_minibatches} equal minibatches: pick sizes for which it does")


def device_of_rank(variant: str, cuda: bool, device_ids: list[int], backend: str, local_rank: int,
                   local_world_size: int) -> torch.device:
    """The device of a torchrun process: a GPU from `device_ids` (or GPU local_rank, modulo the GPUs
    there are) when CUDA is there and wanted, else the CPU. Refuses settings that cannot work."""
    if device_ids and len(device_ids) != local_world_size:
        fail(variant, f"--device-ids names {len(device_ids)} GPUs for the {local_world_size} "
                      f"processes of this node: give one id per process (torchrun "
                      f"--nproc-per-node {len(device_ids)}, or {local_world_size} ids)")
    use_cuda = cuda and torch.cuda.is_available()
    if backend == "nccl" and not use_cuda:
        why = "--no-cuda was given" if not cuda else "no CUDA GPU is available"
        fail(variant, f"--backend nccl needs a CUDA GPU per process, but {why}: use --backend gloo")
    if not use_cuda:
        return torch.device("cpu")
    device_ids = device_ids or [i % torch.cuda.device_count() for i in range(local_world_size)]
    if max(device_ids) >= torch.cuda.device_count() or min(device_ids) < 0:
        fail(variant, f"--device-ids {' '.join(map(str, device_ids))}: this node has GPUs 0 to "
                      f"{torch.cuda.device_count() - 1}")
    if backend == "nccl" and len(set(device_ids)) < len(device_ids):
        fail(variant, f"nccl cannot run two processes on one GPU (GPUs "
                      f"{' '.join(map(str, device_ids))}): use --backend gloo to share GPUs, or "
                      "one process per GPU")
    return torch.device("cuda", device_ids[local_rank])


class World:
    """This process among the `world_size` processes a torchrun script runs as (None for a script
    that runs in one process): what a checkpoint saved of each rank, and what the ranks gather."""

    def __init__(self, args, variant: str, rank: int = 0, world_size: int | None = None):
        if world_size:  # --num-envs counts the world's environments, each rank steps its share
            check_world_sizes(args, variant, world_size)
        self.variant, self.rank, self.world_size = variant, rank, world_size

    def check_checkpoint(self, checkpoint: dict | None) -> None:
        """Refuse a checkpoint that another number of processes wrote."""
        if checkpoint and self.world_size and checkpoint["world_size"] != self.world_size:
            fail(self.variant, f"the checkpoint was written by {checkpoint['world_size']} "
                               f"processes, not {self.world_size}: resume it with as many "
                               f"(torchrun --nproc-per-node {checkpoint['world_size']} on one "
                               "node)")

    def this_ranks(self, saved):
        """What the checkpoint saved of this process: its own entry under torchrun, else all of
        it."""
        return saved[self.rank] if self.world_size and saved is not None else saved

    def gathered(self, item) -> list:
        """[item of rank 0, item of rank 1, ...] under torchrun (all_gathered), else [item]."""
        return all_gathered(item, self.world_size) if self.world_size else [item]

    def gathered_iteration(self, update_means: dict, values, returns, episodes: list, stop: bool,
                           save: bool) -> tuple:
        """Every rank's figures of an iteration, once an iteration: the means of the ranks' means,
        the values and returns of every rank's batch, the episodes that ended on any rank, and
        whether any rank would stop, or save (a signal that reaches one rank late, or clocks a
        moment apart, must not split them: a rank that saved alone would wait forever)."""
        reports = self.gathered({"means": update_means, "values": values, "returns": returns,
                                 "episodes": episodes, "stop": stop, "save": save})
        return ({key: np.mean([report["means"][key] for report in reports])
                 for key in update_means},
                np.concatenate([report["values"] for report in reports]),
                np.concatenate([report["returns"] for report in reports]),
                sorted(episode for report in reports for episode in report["episodes"]),
                any(report["stop"] for report in reports),
                any(report["save"] for report in reports))
