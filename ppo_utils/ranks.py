"""torchrun's processes, for ppo_atari_multigpu.py: who this one is among them (World), its device,
the sizes they can share and what they gather once an iteration."""

import os

import numpy as np
import torch

from ppo_utils.exits import WrongInput


def check_world_sizes(args, world_size: int) -> None:
    """Refuse sizes the processes cannot share evenly: the environments, each one's minibatches."""
    if args.num_envs % world_size != 0:
        raise WrongInput(f"--num-envs {args.num_envs} does not split evenly between {world_size} "
                         f"processes: make it a multiple of {world_size} or start another number "
                         "of processes")
    local_batch_size = args.num_envs // world_size * args.num_steps
    if local_batch_size % args.num_minibatches != 0:
        raise WrongInput(f"each process's share of the batch, --num-envs / {world_size} processes "
                         f"x --num-steps = {local_batch_size}, does not divide into "
                         f"--num-minibatches {args.num_minibatches} equal minibatches: pick sizes "
                         "for which it does")


def device_of_rank(cuda: bool, device_ids: list[int], backend: str, local_rank: int,
                   local_world_size: int) -> torch.device:
    """The GPU `device_ids` gives this process (or local_rank's, modulo the GPUs), else the CPU."""
    if device_ids and len(device_ids) != local_world_size:
        raise WrongInput(f"--device-ids names {len(device_ids)} GPUs for the {local_world_size} "
                         f"processes of this node: give one id per process (torchrun "
                         f"--nproc-per-node {len(device_ids)}, or {local_world_size} ids)")
    use_cuda = cuda and torch.cuda.is_available()
    if backend == "nccl" and not use_cuda:
        why = "--no-cuda was given" if not cuda else "no CUDA GPU is available"
        raise WrongInput(f"--backend nccl needs a CUDA GPU per process, but {why}: use --backend "
                         "gloo")
    if not use_cuda:
        return torch.device("cpu")
    device_ids = device_ids or [i % torch.cuda.device_count() for i in range(local_world_size)]
    if max(device_ids) >= torch.cuda.device_count() or min(device_ids) < 0:
        raise WrongInput(f"--device-ids {' '.join(map(str, device_ids))}: this node has GPUs 0 to "
                         f"{torch.cuda.device_count() - 1}")
    if backend == "nccl" and len(set(device_ids)) < len(device_ids):
        raise WrongInput(f"nccl cannot run two processes on one GPU (GPUs "
                         f"{' '.join(map(str, device_ids))}): use --backend gloo to share GPUs, "
                         "or one process per GPU")
    return torch.device("cuda", device_ids[local_rank])


class World:
    """This process among those torchrun started (its variables say which): its rank on all nodes
    and on its own, their numbers, its device. Without torchrun, a world of one."""

    gathers = True

    def __init__(self, args, checkpoint):
        self.rank, self.world_size = int(os.environ.get("RANK", "0")), int(
            os.environ.get("WORLD_SIZE", "1"))
        if checkpoint and len(checkpoint.processes) != self.world_size:
            written = len(checkpoint.processes)
            raise WrongInput(f"the checkpoint was written by {written} processes, not "
                             f"{self.world_size}: resume it with as many (torchrun "
                             f"--nproc-per-node {written} on one node)")
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        check_world_sizes(args, self.world_size)
        self.device = device_of_rank(args.cuda, args.device_ids, args.backend, self.local_rank,
                                     self.local_world_size)

    def gathered(self, item) -> list:
        """[rank 0's item, rank 1's, ...] on every rank: once an iteration, never per step."""
        if self.world_size == 1:
            return [item]
        items = [None] * self.world_size
        torch.distributed.all_gather_object(items, item)
        return items

    def gathered_iteration(self, update_means: dict, values, returns, episodes: list, stop: bool,
                           save: bool) -> tuple:
        """The world's figures of an iteration: the ranks' mean means, all values, returns and
        episodes, and whether any rank would stop, or save (a rank that saved alone would wait
        forever)."""
        reports = self.gathered({"means": update_means, "values": values, "returns": returns,
                                 "episodes": episodes, "stop": stop, "save": save})
        return ({key: np.mean([report["means"][key] for report in reports])
                 for key in update_means},
                np.concatenate([report["values"] for report in reports]),
                np.concatenate([report["returns"] for report in reports]),
                sorted(episode for report in reports for episode in report["episodes"]),
                any(report["stop"] for report in reports),
                any(report["save"] for report in reports))
