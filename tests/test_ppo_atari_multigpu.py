"""Tests of ppo/ppo_atari_multigpu.py: the claim that N ranks on 1/N of each minibatch take the same
step as one process on the whole of it, training under torchrun on one node and on two (loopback),
a group that resumes exactly after Ctrl-C, evaluation in one process, and the errors for wrong
input. Everything runs on the CPU with the gloo backend, as on a machine without GPUs."""

import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from conftest import (HUNG_AFTER, REPO, UNBROKEN_RUNS, script_command,  # noqa: E402
                      script_environment, assert_details_marked, assert_evaluation_output,
                      assert_logs_every_metric, assert_one_copy_to_the_host_per_step,
                      assert_resume_keeps_the_latest_scores, assert_same_final_weights,
                      expect_usage_error, only_run_dir, read_scalars, run_script,
                      run_unbroken_and_interrupted, torchrun,
                      assert_first_minibatch_replays_the_rollout,
                      assert_each_update_starts_at_ratio_one,
                      assert_anneal_clip_lowers_the_clipping_coefficient,
                      assert_progress_is_printed_within_a_rollout,
                      assert_stopped_with_its_logs_flushed)
from conftest import parse_args as parse_args_of  # noqa: E402
from ppo.ppo_atari_multigpu import (Agent, Args, evaluate, gradient_step, main,  # noqa: E402
                                    make_envs, minibatch_loss)
import ppo.ppo_atari_multigpu as script  # noqa: E402
from ppo_utils import exits  # noqa: E402


def parse_args(argv: list[str]):  # what `python ppo/ppo_atari_multigpu.py argv...` reads
    return parse_args_of(script, argv)

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--no-cuda"]
# PyTorch 2.6 and 2.7's gloo backend can leave one rank waiting forever in destroy_process_group at
# the end of a run on a loaded machine, its checkpoint and logs written, the other rank gone
# (2026-11-28, the resume test below beside two busy processes: 2.6 hung in 1 run of 4, 2.7 in 3 of
# 8, 2.13 in 0 of 9; a barrier first did not help). `nox -s floors` runs on 2.6, where the test's
# two groups would fail the suite at random: it skips there, below the first release seen without
# the hang, and says why.
GLOO_MAY_HANG_AT_EXIT = (tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
                         < (2, 13))
TWO_PROCESSES = torchrun("--standalone", "--nproc-per-node", "2")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_as_two_ranks(target, inputs_of_rank) -> None:
    """Run target(*inputs_of_rank(rank)) for ranks 0 and 1 in two spawned processes, at once (they
    may join one process group), and wait for both to succeed."""
    workers = [mp.get_context("spawn").Process(target=target, args=inputs_of_rank(rank))
               for rank in range(2)]
    for worker in workers:
        worker.start()
    for rank, worker in enumerate(workers):
        worker.join(timeout=HUNG_AFTER)
        if worker.is_alive():
            worker.kill()
        assert worker.exitcode == 0, f"rank {rank} " + ("hung" if worker.exitcode == -signal.SIGKILL
                                                        else f"exited {worker.exitcode}")


def hyperparameters(run_dir) -> str:
    """The `|param|value|` table a run logged to TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return (accumulator.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0]
            .decode())


# --------------------------------------------------------------------------------------------------
# No loss of sample efficiency: the update of N ranks is the update of one process
# --------------------------------------------------------------------------------------------------

MINIBATCH_SIZE = 64
# How far the two ways' weights may drift apart. Adam divides each gradient by the root of its
# running square, so where a gradient is near zero the step magnifies the rounding by which the two
# ways' averaged gradients differ (seen: 1.3e-7 on one weight in 8,192 after 3 steps). 1e-6 is 0.4%
# of the largest step Adam takes (the learning rate, 2.5e-4): a real difference in the update, such
# as unaveraged gradients, shows in the gradients compared just before and far beyond this.
WEIGHT_ATOL = 1e-6
# A gradient norm cap the test's gradients never reach: clipping would hide a gradient that is twice
# too large, and so would Adam's first step, whose size hardly depends on the gradient's.
ARGS = Args(max_grad_norm=1e6)


def fixed_minibatches(agent: Agent, count: int) -> list[tuple[torch.Tensor, ...]]:
    """`count` minibatches as a rollout would store them: frames, actions, and old log-probs and
    values near the agent's own, so that some ratios are clipped; advantages with a mean far from
    zero, so that normalizing each half by its own statistics would show."""
    generator = torch.Generator().manual_seed(123)
    minibatches = []
    for _ in range(count):
        obs = torch.randint(0, 256, (MINIBATCH_SIZE, 4, 84, 84), dtype=torch.uint8,
                            generator=generator)
        actions = torch.randint(0, 4, (MINIBATCH_SIZE,), generator=generator)
        with torch.no_grad():
            _, logprobs, _, values = agent.get_action_and_value(obs, actions)
        logprobs = logprobs + 0.2 * torch.randn(MINIBATCH_SIZE, generator=generator)
        values = values.flatten() + torch.randn(MINIBATCH_SIZE, generator=generator)
        advantages = (2.0 + torch.randn(MINIBATCH_SIZE, generator=generator)
                      * torch.linspace(0.1, 3, MINIBATCH_SIZE))
        returns = values + advantages
        minibatches.append((obs, actions, logprobs, values, advantages, returns))
    return minibatches


def train_on_fixed_minibatches(rank: int, world_size: int, port: int, out_dir,
                               compiled: bool = False) -> None:
    """Three gradient steps of ppo_atari_multigpu.py on the fixed minibatches, rank `rank` of
    `world_size` taking its contiguous 1/world_size of each, with the minibatch loss compiled by
    torch.compile if `compiled`; saves the weights and last gradients to
    out_dir/world<world_size>_rank<rank>.pt."""
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
    torch.manual_seed(0)
    agent = Agent(num_actions=4)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    share = MINIBATCH_SIZE // world_size
    import ppo.ppo_atari_multigpu as script

    if compiled:  # the loss gradient_step calls, compiled as one graph (in this rank's process)
        script.minibatch_loss = torch.compile(minibatch_loss, fullgraph=True)
    for minibatch in fixed_minibatches(agent, 3):
        gradient_step(agent, optimizer,
                      tuple(t[rank * share:(rank + 1) * share] for t in minibatch), ARGS.clip_coef,
                      ARGS, world_size)
    torch.save({"weights": {name: p.detach() for name, p in agent.named_parameters()},
                "grads": {name: p.grad for name, p in agent.named_parameters()}},
               out_dir / f"world{world_size}_rank{rank}.pt")
    if world_size > 1:
        dist.destroy_process_group()


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_two_ranks_on_half_minibatches_take_the_same_steps_as_one_process_on_whole_ones(
        tmp_path, compiled):
    """With the same data, 2 ranks on half of each minibatch end with the same gradients and weights
    as 1 process on the whole minibatch (to float rounding), and the 2 ranks' copies are identical;
    also with the ranks' minibatch loss compiled (--compile) into one graph, against the plain loss
    of the one process. (The advantages' all-reduce runs before the loss, in gradient_step.)"""
    train_on_fixed_minibatches(0, 1, 0, tmp_path)
    port = free_port()
    run_as_two_ranks(train_on_fixed_minibatches, lambda rank: (rank, 2, port, tmp_path, compiled))
    one, rank0, rank1 = (torch.load(tmp_path / name)
                         for name in ("world1_rank0.pt", "world2_rank0.pt", "world2_rank1.pt"))

    torch.manual_seed(0)
    initial = dict(Agent(num_actions=4).named_parameters())
    for name, weight in one["weights"].items():
        assert torch.equal(rank0["weights"][name],
                           rank1["weights"][name]), f"the ranks' copies of {name} differ"
        torch.testing.assert_close(rank0["grads"][name], one["grads"][name], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(rank0["weights"][name], weight, rtol=1e-5, atol=WEIGHT_ATOL)
        # The steps were real: every tensor moved well beyond the tolerance.
        assert (weight - initial[name]).abs().max() > 1e-5, name


# --------------------------------------------------------------------------------------------------
# Training under torchrun
# --------------------------------------------------------------------------------------------------


def test_two_processes_train_and_only_rank_0_logs_the_worlds_figures(tmp_path):
    result = run_script("ppo_atari_multigpu.py", "--total-timesteps", "768", "--seed", "2", *TINY,
                        cwd=tmp_path, launcher=TWO_PROCESSES)
    progress = [line for line in result.stdout.splitlines() if line.startswith("step")]
    assert progress and progress[-1].startswith("step       768/768")
    run_dir = only_run_dir(tmp_path)  # one run directory: rank 1 wrote nothing
    table = hyperparameters(run_dir)
    assert ("|world_size|2|" in table and "|batch_size|32|" in table
            and "|local_batch_size|16|" in table)
    scalars = assert_logs_every_metric(run_dir)
    # 24 iterations of 32 world steps each, logged at the world's step counts.
    assert [step for step, _ in scalars["charts/SPS"]] == list(range(32, 769, 32))


@pytest.mark.smoke
@pytest.mark.skipif(GLOO_MAY_HANG_AT_EXIT, reason=f"torch {torch.__version__}'s gloo can hang a "
                                                  "rank in destroy_process_group at exit "
                                                  "(GLOO_MAY_HANG_AT_EXIT)")
def test_an_interrupted_group_resumes_to_the_same_weights_and_evaluates_in_one_process(tmp_path):
    """SIGTERM to torchrun (`kill`, or Slurm at a task's time limit; Ctrl-C takes the same way:
    torchrun passes the signal on to each worker) stops both ranks after the same iteration; rank 0
    writes one checkpoint with both ranks' games and generators, and the logs up to it; the resumed
    group ends bit-identical to an unbroken one. Both save every iteration by the clock
    (--save-minutes), which the ranks must agree on, or one would wait forever for the other's
    games."""
    flags = ["--seed", "3", "--total-timesteps", "320", "--save-model",
             "--save-minutes", "0.0001", *TINY]
    # torchrun itself reports the signal it got by exiting 1, after its workers have finished.
    unbroken, interrupted, output = run_unbroken_and_interrupted(
        "ppo_atari_multigpu.py", flags, tmp_path, launcher=TWO_PROCESSES, exit_code=1,
        stop_signal=signal.SIGTERM)
    checkpoint_path = only_run_dir(interrupted) / "checkpoint.pt"
    assert 0 < assert_stopped_with_its_logs_flushed(checkpoint_path) < 320, output
    stopped = torch.load(checkpoint_path, weights_only=False)
    assert_resume_keeps_the_latest_scores("ppo_atari_multigpu.py", checkpoint_path,
                                          tmp_path, TWO_PROCESSES)
    assert len(stopped["processes"]) == 2 and all(rank["envs"] is not None
                                                  for rank in stopped["processes"])
    assert f"stopped at step {stopped['global_step']:,}" in output

    resumed = run_script("ppo_atari_multigpu.py", "--resume", str(checkpoint_path), cwd=interrupted,
                         launcher=TWO_PROCESSES)
    assert (f"resuming {checkpoint_path.parent.name} at step {stopped['global_step']:,}"
            in resumed.stdout)
    expected, actual = assert_same_final_weights(unbroken, checkpoint_path, 320)
    for rank in range(2):
        assert np.array_equal(expected["processes"][rank]["rollout"]["next_obs"],
                              actual["processes"][rank]["rollout"]["next_obs"])

    evaluation = run_script("ppo_atari_multigpu.py", "--evaluate", str(checkpoint_path),
                            "--eval-episodes", "1", cwd=interrupted)
    assert_evaluation_output(evaluation.stdout, "BreakoutNoFrameskip-v4", 1)

    other_world = run_script("ppo_atari_multigpu.py", "--resume", str(checkpoint_path),
                             cwd=interrupted, check=False)
    assert other_world.returncode == 2
    assert "written by 2 processes, not 1" in other_world.stderr


def test_a_stop_signal_to_one_rank_stops_the_group_after_that_iteration(tmp_path):
    """A stop signal that reaches one rank only (a `kill` of its process id; torchrun's own is
    passed on to all) stops every rank after the iteration it came in: the ranks agree at the
    iteration's end, and no rank is left waiting for another. One checkpoint, both ranks' exit code
    130, and the resumed group ends bit-identical to an unbroken one. The two ranks are launched by
    hand, with the variables torchrun gives them, so that each one's exit code and process id are
    the test's to read."""
    flags = ["--seed", "3", "--total-timesteps", "320", "--save-model",
             "--save-minutes", "0.0001", *TINY]
    unbroken = UNBROKEN_RUNS.get(("ppo_atari_multigpu.py", tuple(flags), tuple(TWO_PROCESSES)))
    if unbroken is None:
        unbroken = tmp_path / "unbroken"
        unbroken.mkdir()
        run_script("ppo_atari_multigpu.py", *flags, cwd=unbroken, launcher=TWO_PROCESSES)
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    port, world_batch = free_port(), 2 * 16
    logs = [(interrupted / f"rank{rank}.log").open("w") for rank in range(2)]
    ranks = [subprocess.Popen(script_command("ppo_atari_multigpu.py", flags), cwd=interrupted,
                              text=True, stdout=logs[rank], stderr=subprocess.STDOUT,
                              env=script_environment({
                                  "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                  "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": str(port)}))
             for rank in range(2)]
    try:
        deadline = time.monotonic() + HUNG_AFTER
        # Rank 0 prints the progress line; one at an iteration's end means that both ranks passed
        # that iteration's agreement, their stop handlers long in place.
        while not [step for step in map(int, re.findall(r"^step +(\d+)/",
                                                        (interrupted / "rank0.log").read_text(),
                                                        re.MULTILINE)) if step % world_batch == 0]:
            assert (ranks[0].poll() is None
                    and time.monotonic() < deadline), (interrupted / "rank0.log").read_text()
            time.sleep(0.05)
        ranks[1].send_signal(signal.SIGINT)
        codes = [rank.wait(timeout=HUNG_AFTER) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
        for log in logs:
            log.close()
    output = (interrupted / "rank0.log").read_text()
    assert codes == [130, 130], output + (interrupted / "rank1.log").read_text()
    run_dir = only_run_dir(interrupted)
    assert ([path.name for path in run_dir.iterdir() if "checkpoint" in path.name]
            == ["checkpoint.pt"])
    stopped_at = assert_stopped_with_its_logs_flushed(run_dir / "checkpoint.pt")
    assert 0 < stopped_at < 320 and stopped_at % world_batch == 0
    assert (f"stopped at step {stopped_at:,}; resume with: the same torchrun command with --resume"
            in output)

    run_script("ppo_atari_multigpu.py", "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted,
               launcher=TWO_PROCESSES)
    assert_same_final_weights(unbroken, run_dir / "checkpoint.pt", 320)


def test_two_processes_train_with_async_envs(tmp_path):
    """--async-envs under torchrun: each rank steps its games in its own worker processes."""
    result = run_script("ppo_atari_multigpu.py", "--total-timesteps", "128", "--async-envs", *TINY,
                        cwd=tmp_path, launcher=TWO_PROCESSES)
    assert "step       128/128" in result.stdout
    assert_logs_every_metric(only_run_dir(tmp_path),
                             except_for=("charts/episodic_return", "charts/episodic_length"))


def record_first_frames(rank: int, port: int, out_dir) -> None:
    """Run rank `rank` of a 2-process world of ppo_atari_multigpu.py for one iteration, in this
    process, and save the frames its environments' first reset returned to
    out_dir/rank<rank>.npy."""
    import os

    import ppo.ppo_atari_multigpu as script

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.chdir(out_dir)
    make_envs = script.make_envs

    def recording_make_envs(*args, **kwargs):
        envs = make_envs(*args, **kwargs)
        reset = envs.reset

        def recording_reset(**reset_kwargs):
            frames, infos = reset(**reset_kwargs)
            if not (out_dir / f"rank{rank}.npy").exists():
                np.save(out_dir / f"rank{rank}.npy", frames)
            return frames, infos

        envs.reset = recording_reset
        return envs

    script.make_envs = recording_make_envs
    script.main(Args(seed=5, num_envs=4, num_steps=8, num_minibatches=2,
                     total_timesteps=32, cuda=False))


def test_the_ranks_play_the_games_one_process_would_play_with_all_the_environments(tmp_path):
    """[Multi-GPU 2] Rank r's environments are seeded seed + r x local_num_envs + i, so the 2 ranks'
    first frames, side by side, are those of one process's 4 environments with the same seed, and
    the ranks do not replay each other's games. (Breakout's first frames hardly depend on the seed:
    with seed 5, the [Atari 1] no-ops start the third game on a frame of its own, the others on the
    same.)"""
    port = free_port()
    run_as_two_ranks(record_first_frames, lambda rank: (rank, port, tmp_path))
    world = np.concatenate([np.load(tmp_path / f"rank{rank}.npy") for rank in range(2)])
    envs = make_envs("BreakoutNoFrameskip-v4", 4)
    one_process, _ = envs.reset(seed=5)
    envs.close()
    assert np.array_equal(world, one_process)
    assert not np.array_equal(world[:2], world[2:]), "the ranks start the same games"


def record_draws_on_a_blank_frame(rank: int, port: int, out_dir) -> None:
    """Rank `rank` of a 2-process world of ppo_atari_multigpu.py, in this process, for 2 iterations,
    its policy shown a blank frame at every step of the rollouts, as the other rank's is: the
    actions it drew and the orders its minibatches took go to out_dir/rank<rank>.npz."""
    import os

    import ppo.ppo_atari_multigpu as script

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.chdir(out_dir)
    drawn, orders = [], []
    act, shuffle = script.Agent.get_action_and_value, np.random.shuffle

    def on_a_blank_frame(self, obs, action=None):
        if action is not None:  # the update's scoring of the batch
            return act(self, obs, action)
        decided = act(self, torch.zeros_like(obs))
        drawn.append(decided[0].numpy())
        return decided

    def recording_shuffle(indices):
        shuffle(indices)
        orders.append(indices.copy())

    script.Agent.get_action_and_value, np.random.shuffle = on_a_blank_frame, recording_shuffle
    script.main(Args(seed=1, num_envs=4, num_steps=8, num_minibatches=2,
                     total_timesteps=64, cuda=False))
    np.savez(out_dir / f"rank{rank}.npz", drawn=np.concatenate(drawn), orders=np.stack(orders))


def test_each_rank_draws_from_a_random_stream_of_its_own(tmp_path):
    """[Multi-GPU 2] The ranks hold the same weights, always: shown the same frame, only their
    random streams can make them act differently, and they must, or the world would collect one
    rank's experience N times over. So must their minibatch orders differ."""
    port = free_port()
    run_as_two_ranks(record_draws_on_a_blank_frame, lambda rank: (rank, port, tmp_path))
    ranks = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(2)]
    # iterations x steps x games
    assert ranks[0]["drawn"].shape == ranks[1]["drawn"].shape == (2 * 8 * 2,)
    assert not np.array_equal(ranks[0]["drawn"], ranks[1]["drawn"])
    assert not np.array_equal(ranks[0]["orders"], ranks[1]["orders"])


def train_with_a_game_ending_every_step(rank: int, port: int, out_dir) -> None:
    """Rank `rank` of a 2-process world of ppo_atari_multigpu.py, in this process, for 4 iterations
    of 4 steps, each step of its games reporting one finished game whose score names the rank and
    the step: 1000 x rank + the step's number (1, 2, ...)."""
    import itertools
    import os

    import ppo.ppo_atari_multigpu as script
    from ppo_utils import environments  # where the script reads the episodes that ended

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.chdir(out_dir)
    step_numbers = itertools.count(1)
    environments.finished_episodes = lambda infos: [(float(1000 * rank + next(step_numbers)), 7)]
    script.main(Args(seed=1, num_envs=4, num_steps=4, num_minibatches=2,
                     total_timesteps=64, cuda=False))


def test_rank_0_logs_the_games_of_every_rank_at_the_steps_they_ended(tmp_path):
    """The world's figures include every rank's games: rank 0 logs its own and rank 1's finished
    games, each once, at the world step in which it ended (4 world steps of 4 environments each
    iteration)."""
    port = free_port()
    run_as_two_ranks(train_with_a_game_ending_every_step, lambda rank: (rank, port, tmp_path))
    scalars = read_scalars(only_run_dir(tmp_path))
    expected = sorted((4 * step, float(1000 * rank + step)) for rank in range(2)
                      for step in range(1, 17))
    assert sorted(scalars["charts/episodic_return"]) == expected
    assert [length for _, length in scalars["charts/episodic_length"]] == [7] * 32


def test_the_first_minibatch_of_each_update_replays_the_rollout(workdir, monkeypatch):
    """In one process (a world of one), with the advantages normalized in gradient_step."""
    import ppo.ppo_atari_multigpu as script

    assert_first_minibatch_replays_the_rollout(script, Args(num_envs=2, num_steps=16,
                                                            num_minibatches=2, total_timesteps=96,
                                                            cuda=False), monkeypatch)


def train_checking_each_update_starts_at_ratio_one(rank: int, port: int, out_dir) -> None:
    """Rank `rank` of a 2-process world of ppo_atari_multigpu.py, in this process, for 3 iterations,
    with each update's first minibatch checked for ratios of 1 on this rank's share (an
    AssertionError makes the process exit 1)."""
    import os

    import ppo.ppo_atari_multigpu as script

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.chdir(out_dir)
    assert_each_update_starts_at_ratio_one(
        script, lambda: script.main(Args(seed=2, num_envs=4, num_steps=8, num_minibatches=2,
                                         total_timesteps=96, cuda=False)))


def test_two_ranks_start_each_update_at_ratio_one(tmp_path):
    """Each rank's share of the first minibatch of every update is scored by the network that acted:
    its stored frames, actions and log-probs belong together on both ranks."""
    port = free_port()
    run_as_two_ranks(train_checking_each_update_starts_at_ratio_one,
                     lambda rank: (rank, port, tmp_path))


def test_anneal_clip_lowers_the_clipping_coefficient_with_each_iteration(workdir, monkeypatch):
    import ppo.ppo_atari_multigpu as script

    assert_anneal_clip_lowers_the_clipping_coefficient(
        script, Args(num_envs=2, num_steps=16, num_minibatches=2, total_timesteps=96, cuda=False),
        monkeypatch)


def test_the_progress_line_speaks_within_long_rollouts_too(workdir, capsys):
    """In one process (a world of one)."""
    import gymnasium as gym

    import ppo.ppo_atari_multigpu as script

    assert_progress_is_printed_within_a_rollout(
        script, Args(num_envs=2, num_steps=16, num_minibatches=2, total_timesteps=64, cuda=False),
        capsys, gym.vector.SyncVectorEnv)


def test_the_rollout_copies_only_the_actions_to_the_host(workdir, monkeypatch):
    """In one process (a world of one): the rollout is the single-GPU script's."""
    import gymnasium as gym

    import ppo.ppo_atari_multigpu as script

    assert_one_copy_to_the_host_per_step(script, Args(num_envs=2, num_steps=16, num_minibatches=2,
                                                      total_timesteps=64, cuda=False), monkeypatch,
                                         gym.vector.SyncVectorEnv, action_shape=(2,))


def test_cudagraphs_without_cuda_is_a_one_line_error(capsys, workdir):
    if torch.cuda.is_available():
        pytest.skip("checks the error on a machine without CUDA")
    expect_usage_error(capsys, lambda: main(Args(cudagraphs=True, cuda=False)),
                       "ppo_atari_multigpu.py", "--cudagraphs needs a CUDA device")


def test_two_launches_on_loopback_train_as_two_nodes(tmp_path):
    """The multi-node commands of docs/ppo_atari_multigpu.md, with both nodes on this machine."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = []
    for node_rank in range(2):
        workdir = tmp_path / f"node{node_rank}"
        workdir.mkdir()
        command = torchrun("--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "1",
                           "--rdzv-endpoint", endpoint)
        nodes.append(subprocess.Popen([*command, str(REPO / "ppo" / "ppo_atari_multigpu.py"),
                                       "--total-timesteps", "128", *TINY], cwd=workdir, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [node.communicate(timeout=HUNG_AFTER)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert "step       128/128" in outputs[0] and "step" not in outputs[1]
    assert "|world_size|2|" in hyperparameters(only_run_dir(tmp_path / "node0"))
    assert not (tmp_path / "node1" / "runs").exists()


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


def as_rank(monkeypatch, rank: int, world_size: int, local_world_size: int | None = None) -> None:
    """Make this process look like rank `rank` of a torchrun world; every check below fails before
    the process group is joined, so no other process is needed."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size or world_size))


def test_sizes_that_do_not_split_between_the_processes(capsys, monkeypatch, workdir):
    as_rank(monkeypatch, 0, 3)
    expect_usage_error(capsys, lambda: main(Args(cuda=False)),
                       "ppo_atari_multigpu.py", "--num-envs 8", "3 processes")
    as_rank(monkeypatch, 0, 2)
    expect_usage_error(capsys,
                       lambda: main(Args(num_envs=2, num_steps=6, num_minibatches=4, cuda=False)),
                       "ppo_atari_multigpu.py", "--num-minibatches 4")


def test_device_ids_must_name_one_gpu_per_process_and_nccl_needs_cuda(capsys, monkeypatch, workdir):
    as_rank(monkeypatch, 0, 2)
    expect_usage_error(capsys, lambda: main(Args(device_ids=[0, 0, 1, 1])), "ppo_atari_multigpu.py",
                       "--device-ids names 4 GPUs for the 2 processes", "--nproc-per-node 4")
    expect_usage_error(capsys, lambda: main(Args(device_ids=[0])), "ppo_atari_multigpu.py",
                       "names 1 GPUs")
    expect_usage_error(capsys, lambda: main(Args(backend="nccl", cuda=False)),
                       "ppo_atari_multigpu.py", "--backend nccl", "--no-cuda", "--backend gloo")
    if not torch.cuda.is_available():
        expect_usage_error(capsys, lambda: main(Args(backend="nccl")), "ppo_atari_multigpu.py",
                           "no CUDA GPU is available", "--backend gloo")


def test_only_the_first_process_of_each_node_prints_the_error(capsys, monkeypatch, workdir):
    as_rank(monkeypatch, 1, 3)
    with pytest.raises(SystemExit) as stop, exits.exit_codes("ppo_atari_multigpu.py"):
        main(Args(cuda=False))
    assert stop.value.code == 2 and capsys.readouterr().err == ""
    # Rank 2 of 4, the first process of the second node (2 per node): the checkpoint may be missing
    # on that node only, so it says so itself.
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    expect_usage_error(capsys, lambda: parse_args(["--resume", "missing.pt"]),
                       "ppo_atari_multigpu.py", "no checkpoint at 'missing.pt'",
                       "every node needs it")


@pytest.mark.parametrize("rank_0_late", [False, True], ids=["together", "rank-0-late"])
def test_under_torchrun_the_error_is_one_line_from_rank_0_and_the_workers_exit_2(
        tmp_path, rank_0_late):
    """Every process finds the mistake; the first of the node says it. On a loaded machine that one
    may come last (`rank-0-late`: it starts 3 s after the other, by a sitecustomize): the other then
    waits for it, so that torchrun, which ends every worker once one has failed, cannot end it
    first."""
    env = None
    if rank_0_late:
        (tmp_path / "late").mkdir()
        (tmp_path / "late" / "sitecustomize.py").write_text(
            "import os, time\nif os.environ.get('LOCAL_RANK') == '0':\n    time.sleep(3)\n")
        env = {"PYTHONPATH": str(tmp_path / "late")}
    result = run_script("ppo_atari_multigpu.py", "--num-envs", "3", "--no-cuda", cwd=tmp_path,
                        launcher=TWO_PROCESSES, check=False, env=env)
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if "ppo_atari_multigpu.py: error:" in line]
    assert ours == ["ppo_atari_multigpu.py: error: --num-envs 3 does not split evenly between 2 "
                    "processes: make it a multiple of 2 or start another number of processes"]
    # torchrun's report names the worker whose exit it saw first and then stops the other one, so
    # the other may be reported with exit code 2 or with the SIGTERM (-15) it got, or not at all.
    # What must never be there: a worker that crashed (exit code 1) or a traceback from the script.
    exit_codes = re.findall(r"exitcode\s*:\s*(-?\d+)", result.stderr)
    assert "2" in exit_codes and set(exit_codes) <= {"2", "-15"}, exit_codes
    assert 'ppo_atari_multigpu.py", line' not in result.stderr, result.stderr


def test_evaluation_is_refused_under_torchrun_and_other_scripts_checkpoints(
        capsys, monkeypatch, workdir):
    main(Args(total_timesteps=32, save_model=True, num_envs=2, num_steps=16,
              num_minibatches=2, cuda=False))
    checkpoint_path = str(only_run_dir(workdir) / "checkpoint.pt")
    as_rank(monkeypatch, 0, 2)
    expect_usage_error(capsys, lambda: evaluate(*parse_args(["--evaluate", checkpoint_path])),
                       "ppo_atari_multigpu.py", "--evaluate plays in one process",
                       f"python ppo/ppo_atari_multigpu.py --evaluate {checkpoint_path}")
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    checkpoint["variant"] = "ppo_atari"
    torch.save(checkpoint, "atari.pt")
    expect_usage_error(capsys, lambda: parse_args(["--resume", "atari.pt"]),
                       "ppo_atari_multigpu.py", "ppo/ppo_atari.py")


def test_every_core_atari_and_multi_gpu_detail_is_marked_in_the_script():
    assert_details_marked("ppo_atari_multigpu.py", {"Core": 13, "Atari": 9, "Multi-GPU": 3})


def test_help_says_num_envs_counts_all_processes(capsys):
    """--num-envs is the world's total (CleanRL's 2022 docs' reading), not the reference's per
    process count: --help must say so, with the batch it implies."""
    with pytest.raises(SystemExit) as stop:
        parse_args(["--help"])
    assert stop.value.code == 0
    help_text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "over ALL processes" in help_text and "counts them per process" in help_text, help_text
