"""The runs a report reads: each run directory's TensorBoard logs as a `RunData` (its variant, env
id, seed and budget from the `hyperparameters` text, its episodes' returns with their steps and
training time, its SPS, wall time and `versions`), whether it reached its budget and its final
return, and the one complete run kept per (variant, env, seed). benchmark/report.py is the command;
the tuner reads its objective through `load_run` and `RunData.final_return`, benchmark/speed.py a
run's times through `logged_times`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FINAL_FRACTION = 0.1        # final return: episodes in the last 10% of a run's steps
COMPLETE_MIN_TOLERANCE = 0.01  # a run within max(batch, 1% of budget) of its budget is complete


@dataclass
class RunData:
    """What the report needs from one run's TensorBoard logs."""

    path: Path
    variant: str
    env_id: str
    seed: int
    started: float                    # unix time the run began (run name suffix, else first event)
    total_timesteps: int | None
    batch_size: int | None
    last_step: int                    # largest global step of any scalar
    return_steps: np.ndarray          # charts/episodic_return: each finished episode's global step,
    return_values: np.ndarray         # ... its return,
    return_seconds: np.ndarray        # ... and the run's wall time when it ended (training_seconds)
    sps: float | None                 # last charts/SPS point
    wall_seconds: float               # the run's wall time: its sittings' spans, added up
    # each different `versions` table it logged: two for a run resumed on other releases
    versions: list[dict[str, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Did the run reach its budget (within one batch, or 1% of the budget)?"""
        if self.total_timesteps is None:
            return True  # nothing to compare with: trust the run
        tolerance = max(self.batch_size or 0, COMPLETE_MIN_TOLERANCE * self.total_timesteps)
        return self.last_step >= self.total_timesteps - tolerance

    @property
    def steps_run(self) -> int:
        """The steps this run covers: its budget when it reached it, else the last step it logged
        (a run used with --include-incomplete)."""
        return (self.total_timesteps if self.complete and self.total_timesteps is not None
                else self.last_step)

    def steps_label(self) -> str:
        """Its steps for a table: the budget, or `<reached> of <budget>` for an incomplete run."""
        if self.complete:
            return f"{self.total_timesteps:,}" if self.total_timesteps is not None else "?"
        return f"{self.last_step:,} of {self.total_timesteps:,}"

    def final_return(self) -> tuple[float, int, bool]:
        """(final return, episodes it averages, whether it fell back to the last episode)."""
        if len(self.return_values) == 0:
            return math.nan, 0, False
        in_window = self.return_steps > (1.0 - FINAL_FRACTION) * self.last_step
        if in_window.any():
            return float(self.return_values[in_window].mean()), int(in_window.sum()), False
        return float(self.return_values[-1]), 1, True


def parse_text_table(markdown: str) -> dict[str, str]:
    """The rows of a two-column table that the scripts log as text (`|param|value|` under
    `hyperparameters`, `|package|version|` under `versions`), below its header, as strings."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in markdown.splitlines() if line.strip()]
    rules = {index for index, cells in enumerate(rows)
             if all(set(cell) <= set("-:") for cell in cells)}
    headers = {index - 1 for index in rules}  # a header is the row above the |-|-| rule
    return {cells[0]: cells[1] for index, cells in enumerate(rows)
            if len(cells) == 2 and cells[0] and index not in rules | headers}


def parse_run_name(name: str) -> dict[str, str]:
    """Fields of a run name `<env_id>__<exp_name>__<seed>__<unix time>` (empty if it is not one)."""
    parts = name.split("__")
    if len(parts) < 4 or not parts[-1].isdigit() or not parts[-2].lstrip("-").isdigit():
        return {}
    return {"env_id": "__".join(parts[:-3]), "exp_name": parts[-3], "seed": parts[-2],
            "time": parts[-1]}


def as_int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def sittings(run_dir: Path) -> np.ndarray:
    """(first, last) event time of each of a run's event files, one row per file. Each sitting of a
    resumed run (--resume) writes a file of its own, so the rows are its sittings."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    spans = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        times = [event.wall_time for event in EventFileLoader(str(path)).Load()]
        if times:
            spans.append((min(times), max(times)))
    return np.array(spans, dtype=np.float64).reshape(-1, 2)


def logged_times(run_dir: Path, tag: str) -> tuple[float, list[tuple[int, float]]]:
    """When a run's TensorBoard log opened (its first event, which the writer writes as it opens)
    and the (step, wall time) of each point of the scalar `tag`, in the order logged
    (benchmark/speed.py times a run by them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    points = accumulator.Scalars(tag) if tag in accumulator.Tags()["scalars"] else []
    return accumulator.FirstEventTimestamp(), [(point.step, point.wall_time) for point in points]


def training_seconds(times: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """The wall time a run had spent by each of `times`: the part of each sitting before it, added
    up, so that the hours a preempted run waited before it was resumed do not count."""
    starts, ends = spans[:, 0], spans[:, 1]
    return (np.clip(np.asarray(times, dtype=np.float64)[:, None], starts, ends)
            - starts).sum(axis=1)


def load_run(run_dir: Path, runs_dir: Path) -> RunData | None:
    """Read one run directory; None when it does not hold a recognizable run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    # A resumed run drops what its last sitting logged past the checkpoint (the scripts'
    # purge_step); TensorBoard does so as it reads, and would warn of each as of a crash.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    accumulator.Reload()
    tags = accumulator.Tags()

    def texts(tag: str) -> list[dict[str, str]]:  # each sitting's table of a text summary, in order
        if f"{tag}/text_summary" not in tags["tensors"]:
            return []
        cells = [tensor_util.make_ndarray(event.tensor_proto).flatten()[0]
                 for event in accumulator.Tensors(f"{tag}/text_summary")]
        return [parse_text_table(text.decode() if isinstance(text, bytes) else str(text))
                for text in cells]

    params = (texts("hyperparameters") or [{}])[-1]
    versions = list({tuple(table.items()): table for table in texts("versions")}.values())
    # An env id with a slash (ALE/Pong-v5) puts the run one directory deeper: name it from runs_dir.
    named = parse_run_name(run_dir.relative_to(runs_dir).as_posix())
    variant = params.get("exp_name") or named.get("exp_name")
    env_id = params.get("env_id") or named.get("env_id")
    seed = as_int(params.get("seed") or named.get("seed"))
    if not variant or not env_id or seed is None:
        return None

    scalars = {tag: accumulator.Scalars(tag) for tag in tags["scalars"]}
    try:
        first_time = accumulator.FirstEventTimestamp()
    except ValueError:
        return None
    all_events = [event for events in scalars.values() for event in events]
    last_step = max((event.step for event in all_events), default=0)
    spans = sittings(run_dir)
    returns = scalars.get("charts/episodic_return", [])
    sps = scalars.get("charts/SPS", [])
    return RunData(
        path=run_dir, variant=variant, env_id=env_id, seed=seed,
        started=float(named["time"]) if "time" in named else first_time,
        total_timesteps=as_int(params.get("total_timesteps")),
        batch_size=as_int(params.get("batch_size")),
        last_step=last_step,
        return_steps=np.array([event.step for event in returns], dtype=np.int64),
        return_values=np.array([event.value for event in returns], dtype=np.float64),
        return_seconds=training_seconds([event.wall_time for event in returns], spans),
        sps=float(sps[-1].value) if sps else None,
        wall_seconds=float(training_seconds([np.inf], spans)[0]),
        versions=versions)


def find_run_dirs(runs_dir: Path) -> list[Path]:
    """Every directory under runs_dir that holds TensorBoard event files."""
    return sorted({path.parent for path in runs_dir.rglob("events.out.tfevents.*")})


def select_runs(runs: list[RunData], include_incomplete: bool = False
                ) -> tuple[dict[str, dict[str, list[RunData]]], list[tuple[RunData, str]]]:
    """Keep one complete run per (variant, env, seed): the largest budget, then the newest.

    Returns {variant: {env_id: [runs sorted by seed]}} and the runs left out, each with
    the reason."""
    groups: dict[tuple[str, str, int], list[RunData]] = {}
    for run in runs:
        groups.setdefault((run.variant, run.env_id, run.seed), []).append(run)
    chosen: dict[str, dict[str, list[RunData]]] = {}
    left_out = []
    for (variant, env_id, seed), group in sorted(groups.items()):
        group.sort(key=lambda run: (run.total_timesteps or 0, run.started), reverse=True)
        usable = [run for run in group if include_incomplete or run.complete]
        if usable:
            chosen.setdefault(variant, {}).setdefault(env_id, []).append(usable[0])
        for run in group:
            if usable and run is usable[0]:
                continue
            if not run.complete:
                reason = "incomplete"
            elif (run.total_timesteps or 0) < (usable[0].total_timesteps or 0):
                reason = "a complete run of the same seed with a larger budget exists"
            else:
                reason = "a newer complete run of the same seed exists"
            if not run.complete and run.total_timesteps:
                reason += f" (reached step {run.last_step:,} of {run.total_timesteps:,})"
            left_out.append((run, reason))
    return chosen, left_out
