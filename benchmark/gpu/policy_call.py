"""What one call of the rollout's policy step costs the host, in each way the scripts could make it:
eager, torch.compile, torch.compile's reduce-overhead mode (--cudagraphs: CUDA-graph trees), and
one CUDA graph recorded by hand and replayed (torch.cuda.CUDAGraph), which the scripts do not use.

    python benchmark/gpu/policy_call.py --num-envs 8 --calls 2000

The network is ppo_atari_envpool.py's Agent on random frames of `--num-envs` games; each call is
followed by the copy of the actions to the host, as in the rollout, so each timing is the whole
round trip of one step's network call. benchmark/gpu/steady.py showed this call to be where the
rollout of the Pong row spends its time; this says how much of it each way of calling leaves.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ppo import ppo_atari_envpool as script


def milliseconds_per_call(call, frames: torch.Tensor, calls: int, rounds: int = 5) -> float:
    """The median over `rounds` of the mean wall time of a call and its copy of actions to host."""
    for _ in range(20):  # warm-up: compilation, recording
        call(frames)[0].cpu()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call(frames)[0].cpu()
        means.append((time.perf_counter() - start) / calls * 1000)
    return statistics.median(means)


def recorded_by_hand(function, frames: torch.Tensor):
    """`function` recorded once as a CUDA graph on a static copy of `frames`, then replayed: each
    call copies its frames into the static input and replays; the outputs are the static ones."""
    static_frames = frames.clone()
    side_stream = torch.cuda.Stream()
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream), torch.inference_mode():
        for _ in range(3):  # warm-up on a side stream, as recording requires
            function(static_frames)
    torch.cuda.current_stream().wait_stream(side_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        static_outputs = function(static_frames)

    def call(new_frames):
        static_frames.copy_(new_frames)
        graph.replay()
        return static_outputs

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=8, help="games per call (one envpool pool)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed round")
    parser.add_argument("--cpu", action="store_true", help="on the CPU (eager and compile only)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.cpu else "cuda")
    agent = script.Agent(6).to(device)
    frames = torch.randint(0, 256, (args.num_envs, 4, 84, 84), dtype=torch.uint8, device=device)

    def in_inference_mode(function):
        def call(frames):
            with torch.inference_mode():
                return function(frames)
        return call

    # each built only when it is measured, so that a failing one leaves the others' figures
    ways = {"eager": lambda: in_inference_mode(agent.get_action_and_value),
            "torch.compile": lambda: in_inference_mode(torch.compile(agent.get_action_and_value))}
    if not args.cpu:
        reduce_overhead = torch.compile(agent.get_action_and_value, mode="reduce-overhead")

        def marked(frames):
            torch.compiler.cudagraph_mark_step_begin()
            return reduce_overhead(frames)

        ways["reduce-overhead (--cudagraphs)"] = lambda: in_inference_mode(marked)
        ways["CUDA graph by hand, eager"] = lambda: recorded_by_hand(agent.get_action_and_value,
                                                                     frames)
        ways["CUDA graph by hand, compiled"] = lambda: recorded_by_hand(
            torch.compile(agent.get_action_and_value), frames)
    name = torch.cuda.get_device_name() if not args.cpu else "CPU"
    print(f"{time.strftime('%Y-%m-%d')}, {name}, torch {torch.__version__}, "
          f"{args.num_envs} games per call")
    print("| policy step | ms per call, actions on the host |")
    print("|---|---|")
    for way, make_call in ways.items():
        try:
            print(f"| {way} | {milliseconds_per_call(make_call(), frames, args.calls):.3f} |",
                  flush=True)
        except Exception as error:  # one way failing still leaves the others' figures
            print(f"| {way} | failed: {type(error).__name__}: {str(error).splitlines()[0]} |")


if __name__ == "__main__":
    main()
