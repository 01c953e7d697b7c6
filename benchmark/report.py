"""Turn the TensorBoard logs of benchmark runs into result tables and learning curves, offline.

    python benchmark/report.py                                    # benchmark/runs/ -> docs/results/
    python benchmark/report.py --runs-dir /data/runs --out-dir /tmp/results --variants ppo
    python benchmark/report.py --runs-dir benchmark/ablations/X --out-dir /tmp/X --compare   # an ablation

For every variant (a run's exp_name) it writes `<out-dir>/<variant>.md`: one row per environment with
the final return over seeds, throughput, wall time, the published numbers of
benchmark/baselines.toml and whether the result falls below, within or above the published band,
followed by learning curves `<out-dir>/<variant>/<env>.png` (return against global step) and
`<env>-time.png` (return against wall-clock time). `<out-dir>/index.md` links the variant pages.

How the numbers are made:
- A run is a directory of TensorBoard event files under --runs-dir. Its variant, env id, seed and
  budget come from the `hyperparameters` text summary the scripts write (or, failing that, from the
  run name `<env_id>__<exp_name>__<seed>__<unix time>`).
- A run is complete when its last logged global step is within one batch (at least 1% of the budget)
  of total_timesteps. Per (variant, env, seed) the complete run with the largest budget is used, the
  newest of those if there are several (so a later short trial does not displace a full run).
- Final return of a run: the mean of its `charts/episodic_return` points logged in the last 10% of
  the run's global steps (if no episode ended there, its last episode). Mean and standard deviation
  (numpy's, ddof=0) are then taken over seeds.
- SPS of a run: its last `charts/SPS` point (the scripts log the steps since they started, or since
  they resumed, over the time since then: the whole run's rate, or the last sitting's for a resumed
  run). Wall time: from the first event to the last of each event file, added up over the files; a
  resumed run writes one file per sitting, so the time it waited between sittings does not count.
- Progress: the steps are cut into ten equal spans; for each, the mean return of the episodes that
  ended in it, per seed, then averaged over the seeds that have one, and how many episodes that was.
- Software: the releases of Python and of the packages that can change what is learned (PyTorch,
  gymnasium, NumPy, the environments' own), from the `versions` text the scripts write.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_BASELINES = HERE / "baselines.toml"

FINAL_FRACTION = 0.1        # final return: episodes in the last 10% of a run's steps
COMPLETE_MIN_TOLERANCE = 0.01  # a run within max(batch, 1% of budget) of its budget is complete
CURVE_POINTS = 200          # points of each learning curve
CURVE_WINDOW = 0.05         # each curve point averages the episodes of the preceding 5% of the x range
PROGRESS_SPANS = 10         # the progress table: the mean return in each tenth of the runs' steps


def fail(message: str) -> NoReturn:
    """Wrong input: one line saying what to do, exit code 2."""
    print(f"report.py: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


# ---------------------------------------------------------------------------------------------------
# Reading runs
# ---------------------------------------------------------------------------------------------------


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
    return_steps: np.ndarray          # charts/episodic_return: global step of each finished episode,
    return_values: np.ndarray         # ... its return,
    return_seconds: np.ndarray        # ... and the run's wall time when it ended (see training_seconds)
    sps: float | None                 # last charts/SPS point
    wall_seconds: float               # the run's wall time: its sittings' spans, added up
    versions: list[dict[str, str]] = field(default_factory=list)  # each different `versions` table it
    #                                   logged: two for a run resumed on other releases

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
        return self.total_timesteps if self.complete and self.total_timesteps is not None else self.last_step

    def steps_label(self) -> str:
        """Its steps for a table: the budget, or `<reached> of <budget>` for an incomplete run."""
        if self.complete:
            return f"{self.total_timesteps:,}" if self.total_timesteps is not None else "?"
        return f"{self.last_step:,} of {self.total_timesteps:,}"

    def final_return(self) -> tuple[float, int, bool]:
        """(final return, number of episodes it averages, whether it fell back to the last episode)."""
        if len(self.return_values) == 0:
            return math.nan, 0, False
        in_window = self.return_steps > (1.0 - FINAL_FRACTION) * self.last_step
        if in_window.any():
            return float(self.return_values[in_window].mean()), int(in_window.sum()), False
        return float(self.return_values[-1]), 1, True


def parse_text_table(markdown: str) -> dict[str, str]:
    """The rows of a two-column table that the scripts log as text (`|param|value|` under
    `hyperparameters`, `|package|version|` under `versions`), below its header, as strings."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in markdown.splitlines()
            if line.strip()]
    rules = {index for index, cells in enumerate(rows) if all(set(cell) <= set("-:") for cell in cells)}
    headers = {index - 1 for index in rules}  # a header is the row above the |-|-| rule
    return {cells[0]: cells[1] for index, cells in enumerate(rows)
            if len(cells) == 2 and cells[0] and index not in rules | headers}


def parse_run_name(name: str) -> dict[str, str]:
    """Fields of a run name `<env_id>__<exp_name>__<seed>__<unix time>` (empty if it is not one)."""
    parts = name.split("__")
    if len(parts) < 4 or not parts[-1].isdigit() or not parts[-2].lstrip("-").isdigit():
        return {}
    return {"env_id": "__".join(parts[:-3]), "exp_name": parts[-3], "seed": parts[-2], "time": parts[-1]}


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


def training_seconds(times: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """The wall time a run had spent by each of `times`: the part of each sitting before it, added up,
    so that the hours a preempted run waited before it was resumed do not count."""
    starts, ends = spans[:, 0], spans[:, 1]
    return (np.clip(np.asarray(times, dtype=np.float64)[:, None], starts, ends) - starts).sum(axis=1)


def load_run(run_dir: Path, runs_dir: Path) -> RunData | None:
    """Read one run directory; None when it does not hold a recognizable run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    # A resumed run drops what its last sitting logged past the checkpoint (the scripts' purge_step);
    # TensorBoard does so as it reads, and would warn of each as of a crash.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    accumulator.Reload()
    tags = accumulator.Tags()

    def texts(tag: str) -> list[dict[str, str]]:  # every sitting's table of a text summary, in order
        if f"{tag}/text_summary" not in tags["tensors"]:
            return []
        cells = [tensor_util.make_ndarray(event.tensor_proto).flatten()[0]
                 for event in accumulator.Tensors(f"{tag}/text_summary")]
        return [parse_text_table(text.decode() if isinstance(text, bytes) else str(text)) for text in cells]

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
        total_timesteps=as_int(params.get("total_timesteps")), batch_size=as_int(params.get("batch_size")),
        last_step=last_step,
        return_steps=np.array([event.step for event in returns], dtype=np.int64),
        return_values=np.array([event.value for event in returns], dtype=np.float64),
        return_seconds=training_seconds([event.wall_time for event in returns], spans),
        sps=float(sps[-1].value) if sps else None, wall_seconds=float(training_seconds([np.inf], spans)[0]),
        versions=versions)


def find_run_dirs(runs_dir: Path) -> list[Path]:
    """Every directory under runs_dir that holds TensorBoard event files."""
    return sorted({path.parent for path in runs_dir.rglob("events.out.tfevents.*")})


def select_runs(runs: list[RunData], include_incomplete: bool = False
                ) -> tuple[dict[str, dict[str, list[RunData]]], list[tuple[RunData, str]]]:
    """Keep one complete run per (variant, env, seed): the largest budget, then the newest.

    Returns {variant: {env_id: [runs sorted by seed]}} and the runs left out, each with the reason."""
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


# ---------------------------------------------------------------------------------------------------
# Baselines and the comparison
# ---------------------------------------------------------------------------------------------------


def load_baselines(path: Path = DEFAULT_BASELINES) -> dict:
    """benchmark/baselines.toml as a dict: {"source": ..., "variants": {variant: {..., "envs": [...]}}}.
    A file that cannot be read, is not TOML or lacks a number the report uses is refused here, before
    anything is written. An empty file (`--baselines /dev/null`) means no published numbers."""
    try:
        with open(path, "rb") as file:
            baselines = tomllib.load(file)
    except OSError as error:
        fail(f"cannot read the baselines file {path} ({error.strerror}): give an existing TOML file to --baselines")
    except tomllib.TOMLDecodeError as error:
        fail(f"the baselines file {path} is not valid TOML ({error}): fix it, or give another to --baselines")
    for variant, entry in baselines.get("variants", {}).items():
        for number, env in enumerate(entry.get("envs", []), start=1):
            missing = [] if isinstance(env.get("env_id"), str) else ["env_id"]
            for column in ("ours", "reference"):
                numbers = env.get(column) if isinstance(env.get(column), dict) else {}
                missing += [f"{column}.{statistic}" for statistic in ("mean", "std")
                            if not isinstance(numbers.get(statistic), (int, float))]
            if missing:
                fail(f"the baselines file {path}: env {number} of variant {variant!r} "
                     f"({env.get('env_id', 'no env_id')}) lacks {', '.join(missing)}: give each env an env_id "
                     "and the mean and std of its ours and reference columns")
    return baselines


def find_baseline(baselines: dict, variant: str, env_id: str) -> tuple[dict, dict] | tuple[None, None]:
    """(variant entry, env entry) of the published numbers for this variant and env, if any.
    A run matches a row by our env id or by the name printed in the source table."""
    entry = baselines.get("variants", {}).get(variant)
    if entry is None:
        return None, None
    for env in entry.get("envs", []):
        if env_id in (env["env_id"], env.get("table_env")):
            return entry, env
    return entry, None


def classify(value: float, mean: float, std: float) -> str:
    """Where a measured mean falls against a published band mean ± std (bounds count as within)."""
    if math.isnan(value):
        return "no data"
    if value < mean - std:
        return "below"
    if value > mean + std:
        return "above"
    return "within"


@dataclass
class EnvSummary:
    """One row of a variant's table."""

    env_id: str
    runs: list[RunData]                 # one per seed, sorted by seed
    baseline_variant: dict | None = None  # the variant's entry in baselines.toml
    baseline: dict | None = None          # the env's row in it
    finals: list[tuple[float, int, bool]] = field(init=False)  # RunData.final_return() of each run

    def __post_init__(self):
        self.finals = [run.final_return() for run in self.runs]

    @property
    def values(self) -> np.ndarray:
        """The final returns of the seeds in which an episode ended at all."""
        return np.array([value for value, count, _ in self.finals if count > 0])

    @property
    def seeds_without_episodes(self) -> list[int]:
        return [run.seed for run, (_, count, _) in zip(self.runs, self.finals) if count == 0]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if len(self.values) else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.values)) if len(self.values) else math.nan

    @property
    def status(self) -> str:
        if self.baseline is None:
            return "no baseline"
        return classify(self.mean, self.baseline["ours"]["mean"], self.baseline["ours"]["std"])


# ---------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------


def format_band(mean: float, std: float) -> str:
    return "n/a" if math.isnan(mean) else f"{mean:.2f} ± {std:.2f}"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def format_steps(steps: set[int | None]) -> str:
    return ", ".join(f"{step:,}" if step is not None else "?" for step in sorted(steps, key=lambda s: s or 0))


def format_run_steps(runs: list[RunData]) -> str:
    """The steps of a row's runs, each different one once, fewest first: `1,000` when all reached the
    same budget, `3,989,504 of 10,000,000` for a run that stopped before its budget."""
    labels = [run.steps_label() for run in sorted(runs, key=lambda run: (run.steps_run, run.complete))]
    return ", ".join(dict.fromkeys(labels))


def format_step_count(steps: float) -> str:
    """A step count, short, for a table: 0, 40k, 1M, 2.5M."""
    if steps >= 1e6:
        return f"{steps / 1e6:.3g}M"
    if steps >= 1e3:
        return f"{steps / 1e3:.3g}k"
    return f"{steps:.0f}"


def progress(row: EnvSummary, spans: int = PROGRESS_SPANS) -> list[tuple[float, float, float, int]]:
    """(first step, last step, mean return, episodes) for each of `spans` equal spans of the runs'
    steps (the budget, or the last step logged of a run that stopped before it): per seed, the mean
    return of the episodes that ended in the span, averaged over the seeds that have one (NaN where
    none has), and the number of those episodes summed over the seeds."""
    edges = np.linspace(0.0, max(run.steps_run for run in row.runs), spans + 1)
    per_seed_means = [[] for _ in range(spans)]
    episodes = [0] * spans
    for run in row.runs:
        # An episode that ended at step s belongs to the span (edges[i], edges[i + 1]] holding s.
        span_of_episode = np.clip(np.searchsorted(edges, run.return_steps, side="left") - 1, 0, spans - 1)
        for span in range(spans):
            returns = run.return_values[span_of_episode == span]
            if len(returns):
                per_seed_means[span].append(float(returns.mean()))
                episodes[span] += len(returns)
    return [(edges[span], edges[span + 1], float(np.mean(means)) if means else math.nan, episodes[span])
            for span, means in enumerate(per_seed_means)]


def file_stem(env_id: str) -> str:
    """An env id usable as a file name (`ALE/Breakout-v5` -> `ALE_Breakout-v5`)."""
    return env_id.replace("/", "_")


def baselines_name(path: Path) -> str:
    """How a page names the baselines file it compares with: the repository's by its path in the
    repository, another (--baselines) as it was given."""
    return "benchmark/baselines.toml" if path.resolve() == DEFAULT_BASELINES else str(path)


def format_versions(versions: list[dict[str, str]]) -> str:
    """`python 3.11.7, torch 2.13.0+cpu, ...`; a run resumed on other releases: `..., then ...`."""
    return ", then ".join(", ".join(f"{package} {release}" for package, release in table.items())
                          for table in versions)


def software_lines(runs: list[RunData], runs_dir: Path) -> list[str]:
    """What the runs ran on, from the `versions` text each script logs: one line when they all agree,
    else a line per set of releases with its runs. A package's release can change what is learned
    (MuJoCo 3.5.0 changed Hopper's contacts), so a table of results names them."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(format_versions(run.versions), []).append(run)
    if list(groups) == [""]:
        return ["Not recorded: these runs predate the `versions` text the scripts log."]
    if len(groups) == 1:
        return [f"Every run above: {next(iter(groups))}."]
    lines = ["The runs above ran on more than one set of releases:" if "" not in groups else
             "The releases each run logged (runs from before the scripts logged them have none):", ""]
    for described, members in groups.items():
        names = ", ".join(f"`{run.path.relative_to(runs_dir).as_posix()}`" for run in members)
        lines.append(f"- {described or 'not recorded'}: {names}")
    return lines


def variant_markdown(variant: str, rows: list[EnvSummary], baselines: dict, runs_dir: Path,
                     left_out: list[tuple[RunData, str]], baselines_path: Path = DEFAULT_BASELINES) -> str:
    """The markdown page of one variant: its table against the baselines and how to read it, the runs
    used, the software, the progress per span and the learning curves."""
    entry = baselines.get("variants", {}).get(variant, {})
    ours_label = entry.get("ours_label", "published")
    reference_label = entry.get("reference_label", "comparison")
    lines = [
        f"# Benchmark results: {variant}",
        "",
        f"Made by `benchmark/report.py` from the TensorBoard logs in `{runs_dir}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')}.",
        "",
        *results_table(rows, ours_label, reference_label),
        "",
        *how_to_read(rows, ours_label),
        *baselines_notes(entry, baselines, rows, baselines_path),
        "",
        *runs_used(rows, runs_dir, left_out),
        "", "## Software", "", *software_lines([run for row in rows for run in row.runs], runs_dir),
        "",
        *progress_sections(rows),
        *curve_sections(variant, rows),
    ]
    return "\n".join(lines).rstrip() + "\n"


def results_table(rows: list[EnvSummary], ours_label: str, reference_label: str) -> list[str]:
    """A row per env: the final return over seeds, the runs' steps, SPS and wall time, the baselines
    and where the return falls against them."""
    lines = [
        "| env | final return, mean ± std over seeds (last 10% of steps) | seeds | steps per run | mean SPS "
        f"| wall time per run | baseline: {ours_label} | {reference_label} | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        fallback = "*" if any(used_last for _, _, used_last in row.finals) else ""
        fallback += "†" if row.seeds_without_episodes else ""
        sps = [run.sps for run in row.runs if run.sps is not None]
        ours = format_band(row.baseline["ours"]["mean"], row.baseline["ours"]["std"]) if row.baseline else "n/a"
        reference = (format_band(row.baseline["reference"]["mean"], row.baseline["reference"]["std"])
                     if row.baseline else "n/a")
        lines.append(
            f"| {row.env_id} | {format_band(row.mean, row.std)}{fallback} | {len(row.runs)} "
            f"| {format_run_steps(row.runs)} "
            f"| {f'{np.mean(sps):,.0f}' if sps else 'n/a'} "
            f"| {format_duration(float(np.mean([run.wall_seconds for run in row.runs])))} "
            f"| {ours} | {reference} | {row.status} |")
    return lines


def how_to_read(rows: list[EnvSummary], ours_label: str) -> list[str]:
    """What the table's columns mean, with the marks it uses (* and †) where it uses them."""
    return [
        "How to read this table:",
        "",
        f"- **Final return** of a run: the mean of its `charts/episodic_return` points logged in the last "
        f"{FINAL_FRACTION:.0%} of its global steps. The table gives the mean and the standard deviation "
        "(numpy, ddof=0) of that number over seeds."
        + (" Values marked * include a run in which no episode ended in that window: its last episode counts instead."
           if any(used_last for row in rows for _, _, used_last in row.finals) else "")
        + (" Values marked † leave out a run in which no episode ended at all (n/a below); n/a alone: "
           "no run of the row had one." if any(row.seeds_without_episodes for row in rows) else ""),
        "- **Mean SPS** and **wall time**: each run's last `charts/SPS` point and its training time, first "
        "event to last (a resumed run's sittings added up), averaged over seeds.",
        f"- **Status**: where the final return's mean falls against the band mean ± std of the "
        f"\"{ours_label}\" column: below, within (bounds included) or above.",
    ]


def baselines_notes(entry: dict, baselines: dict, rows: list[EnvSummary], baselines_path: Path) -> list[str]:
    """Where the baselines come from and what limits the comparison, or why there is none."""
    if not entry:
        if not baselines.get("variants"):  # --baselines /dev/null: a report of runs, no comparison asked for
            return [f"- No comparison: made with `--baselines {baselines_name(baselines_path)}`, which holds no "
                    "published numbers."]
        return [f"- No published numbers for this variant in `{baselines_name(baselines_path)}`."]
    source = baselines.get("source", {})
    lines = [f"- **Baselines** from `{baselines_name(baselines_path)}`: {source.get('document', '')}, section "
             f"\"{entry.get('section', '')}\"; {source.get('citation', '')}."]
    if entry.get("note"):
        lines.append(f"- {entry['note']}")
    budget = entry.get("total_timesteps")
    budgets = {run.total_timesteps for row in rows for run in row.runs}
    if budget and budgets != {budget}:
        lines.append(f"- The published numbers were measured after {budget:,} steps; these runs used "
                     f"{format_steps(budgets)}, so the comparison is indicative only.")
    renamed = [f"{row.env_id} against the row \"{row.baseline['table_env']}\"" for row in rows
               if row.baseline and row.baseline.get("table_env") not in (None, row.env_id)]
    if renamed:
        lines.append(f"- Compared: {'; '.join(renamed)}.")
    return lines


def runs_used(rows: list[EnvSummary], runs_dir: Path, left_out: list[tuple[RunData, str]]) -> list[str]:
    """Each run behind the table, with its final return, and the runs left out with the reason."""
    lines = ["## Runs used", "", "| env | seed | run | final return | episodes averaged | SPS | wall time |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        for run, (value, count, _) in zip(row.runs, row.finals):
            lines.append(f"| {row.env_id} | {run.seed} | `{run.path.relative_to(runs_dir).as_posix()}` "
                         f"| {'n/a' if count == 0 else f'{value:.2f}'} | {count} | {f'{run.sps:,.0f}' if run.sps is not None else 'n/a'} "
                         f"| {format_duration(run.wall_seconds)} |")
    if left_out:
        lines += ["", "Runs left out:", ""]
        lines += [f"- `{run.path.relative_to(runs_dir).as_posix()}`: {reason}" for run, reason in left_out]
    return lines


def progress_sections(rows: list[EnvSummary]) -> list[str]:
    """Per env, the mean return of the episodes that ended in each span of the runs' steps."""
    lines = ["## Progress", "",
             f"The runs' steps cut into {PROGRESS_SPANS} equal spans: the mean return of the episodes that ended "
             "in each, per seed, averaged over the seeds (n/a: no episode ended there), and how many episodes "
             "that was in all.", ""]
    for row in rows:
        lines += [f"### {row.env_id}", "", "| steps | mean return | episodes |", "| --- | --- | --- |"]
        for first, last, mean, episodes in progress(row):
            shown = "n/a" if math.isnan(mean) else f"{mean:.2f}"
            lines.append(f"| {format_step_count(first)}-{format_step_count(last)} | {shown} | {episodes:,} |")
        lines.append("")
    return lines


def curve_sections(variant: str, rows: list[EnvSummary]) -> list[str]:
    """Per env, the two plots of its learning curves: against steps and against wall time."""
    lines = ["## Learning curves", "",
             "Mean over seeds of the episodic return (each point averages the episodes of the preceding "
             f"{CURVE_WINDOW:.0%} of the axis), with the min–max range over seeds shaded; dashed: the "
             "published mean.", ""]
    for row in rows:
        stem = file_stem(row.env_id)
        lines += [f"### {row.env_id}", "",
                  f"![{row.env_id}: return against global step]({variant}/{stem}.png) "
                  f"![{row.env_id}: return against wall time]({variant}/{stem}-time.png)", ""]
    return lines


# ---------------------------------------------------------------------------------------------------
# Learning curves
# ---------------------------------------------------------------------------------------------------


def curve_on_grid(x: np.ndarray, y: np.ndarray, grid: np.ndarray, window: float, x_end: float) -> np.ndarray:
    """A run's returns smoothed onto `grid`: the mean of the points with x in (g - window, g], carried
    forward across gaps; NaN before the first point and after the run's end `x_end`."""
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    cumulative = np.concatenate([[0.0], np.cumsum(y)])
    high = np.searchsorted(x, grid, side="right")
    low = np.searchsorted(x, grid - window, side="right")
    counts = high - low
    values = np.full(len(grid), np.nan)
    has_points = counts > 0
    values[has_points] = (cumulative[high] - cumulative[low])[has_points] / counts[has_points]
    last = np.nan
    for i in range(len(values)):  # carry the last value across windows without episodes
        if np.isnan(values[i]) and high[i] > 0:
            values[i] = last
        last = values[i]
    values[grid > x_end] = np.nan
    return values


def curve_label(variant: str, row: EnvSummary) -> str:
    """The legend of the mean curve: it averages only the seeds in which an episode ended."""
    label = f"{variant}, mean of {len(row.runs) - len(row.seeds_without_episodes)} seed(s)"
    if row.seeds_without_episodes:
        label += f" ({len(row.seeds_without_episodes)} without an episode left out)"
    return label


def seed_curves(row: EnvSummary, against_time: bool, time_scale: float = 1.0):
    """The curve of each seed on one grid, against global steps or wall time (in units of `time_scale`
    seconds): returns (grid, mean, min, max over the seeds)."""
    if against_time:
        xs = [run.return_seconds / time_scale for run in row.runs]
        ends = [run.wall_seconds / time_scale for run in row.runs]
    else:
        xs = [run.return_steps.astype(np.float64) for run in row.runs]
        ends = [float(run.last_step) for run in row.runs]
    grid = np.linspace(0.0, max(ends), CURVE_POINTS)
    window = CURVE_WINDOW * max(ends)
    curves = np.array([curve_on_grid(x, run.return_values, grid, window, end)
                       for x, run, end in zip(xs, row.runs, ends)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before the first episode
        return grid, np.nanmean(curves, axis=0), np.nanmin(curves, axis=0), np.nanmax(curves, axis=0)


def time_unit(rows: list[EnvSummary]) -> tuple[float, str]:
    """Minutes when some run took over 3 minutes, else seconds: (seconds per unit, its name)."""
    longest = max(run.wall_seconds for row in rows for run in row.runs)
    return (60.0, "minutes") if longest > 180 else (1.0, "seconds")


def plot_env(variant: str, row: EnvSummary, out_dir: Path) -> list[Path]:
    """Write `<env>.png` (return against global step) and `<env>-time.png` (against wall time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for suffix in ("", "-time"):
        scale, unit = time_unit([row])
        grid, mean, low, high = seed_curves(row, against_time=bool(suffix), time_scale=scale)
        xlabel = f"wall time ({unit})" if suffix else "global step"

        figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
        axes.plot(grid, mean, color="tab:blue", label=curve_label(variant, row))
        axes.fill_between(grid, low, high, color="tab:blue", alpha=0.2, linewidth=0, label="min–max over seeds")
        if row.baseline:
            label = row.baseline_variant.get("ours_label", "published")
            axes.axhline(row.baseline["ours"]["mean"], color="black", linestyle="--", linewidth=1,
                         label=f"{label}: {row.baseline['ours']['mean']:.2f}")
            label = row.baseline_variant.get("reference_label", "comparison")
            axes.axhline(row.baseline["reference"]["mean"], color="gray", linestyle=":", linewidth=1,
                         label=f"{label}: {row.baseline['reference']['mean']:.2f}")
        axes.set_xlim(left=0)
        axes.set_xlabel(xlabel)
        axes.set_ylabel("episodic return")
        axes.set_title(f"{variant} on {row.env_id}")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small", loc="best")
        figure.tight_layout()
        path = out_dir / variant / f"{file_stem(row.env_id)}{suffix}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------------
# Variants side by side: an ablation's page
# ---------------------------------------------------------------------------------------------------

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def mann_whitney(first: np.ndarray, second: np.ndarray) -> tuple[float, float]:
    """The two-sided Mann-Whitney U test of two samples: (U of `first`, p). U counts the pairs in which
    `first` is the larger (ties count a half). p is exact, from every way of splitting the pooled
    values into groups of those sizes, which is what a benchmark's handful of seeds needs; it is not
    offered past 20 values in all (nan), where the enumeration grows too long."""
    from itertools import combinations

    def u_of(a, b) -> float:
        return float(sum((x > y) + 0.5 * (x == y) for x in a for y in b))

    u = u_of(first, second)
    pooled, size = np.concatenate([first, second]), len(first)
    if len(pooled) > 20 or size == 0 or len(second) == 0:
        return u, math.nan
    centre = size * len(second) / 2
    splits = [u_of(pooled[list(chosen)], np.delete(pooled, list(chosen)))
              for chosen in combinations(range(len(pooled)), size)]
    p = np.mean([abs(other - centre) >= abs(u - centre) - 1e-9 for other in splits])
    return u, float(p)


def plot_comparison(env_id: str, rows: dict[str, EnvSummary], out_dir: Path) -> list[Path]:
    """`comparison/<env>.png` and `<env>-time.png`: every variant's mean curve and min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    scale, unit = time_unit(list(rows.values()))
    for suffix in ("", "-time"):
        figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
        for color, (variant, row) in zip(COLORS, rows.items()):
            grid, mean, low, high = seed_curves(row, against_time=bool(suffix), time_scale=scale)
            axes.plot(grid, mean, color=color, label=curve_label(variant, row))
            axes.fill_between(grid, low, high, color=color, alpha=0.15, linewidth=0)
        axes.set_xlim(left=0)
        axes.set_xlabel(f"wall time ({unit})" if suffix else "global step")
        axes.set_ylabel("episodic return")
        axes.set_title(f"{env_id}: mean over seeds, min–max shaded")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small", loc="best")
        figure.tight_layout()
        path = out_dir / "comparison" / f"{file_stem(env_id)}{suffix}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def comparison_markdown(report: dict[str, list[EnvSummary]], out_dir: Path) -> str | None:
    """The page that sets the variants side by side on each environment that two or more of them ran:
    the final returns of the seeds they share, a Mann-Whitney U test when there are two variants, and
    both curves in one plot. None when no environment has two variants."""
    by_env: dict[str, dict[str, EnvSummary]] = {}
    for variant, rows in report.items():
        for row in rows:
            by_env.setdefault(row.env_id, {})[variant] = row
    shared = {env_id: rows for env_id, rows in sorted(by_env.items()) if len(rows) > 1}
    if not shared:
        return None
    variants = sorted({variant for rows in shared.values() for variant in rows})
    lines = ["# Variants compared", "",
             "Final return (the mean of the episodes in the last 10% of a run's steps), mean ± std over the "
             "seeds that every variant of the row ran."
             + (" U and p: two-sided Mann-Whitney U test of the first variant's seeds against the second's, "
                "p exact." if len(variants) == 2 else ""), "",
             "| env | seeds | " + " | ".join(variants) + (" | U | p |" if len(variants) == 2 else " |"),
             "|---|---|" + "---|" * len(variants) + ("---|---|" if len(variants) == 2 else "")]
    for env_id, rows in shared.items():
        seeds = sorted(set.intersection(*({run.seed for run in row.runs} for row in rows.values())))
        finals = {variant: np.array([value for run, (value, count, _) in zip(row.runs, row.finals)
                                     if run.seed in seeds and count > 0]) for variant, row in rows.items()}
        cells = [format_band(float(np.mean(finals[v])), float(np.std(finals[v]))) if v in finals and len(finals[v])
                 else "-" for v in variants]
        test = ""
        if len(variants) == 2 and all(v in finals and len(finals[v]) for v in variants):
            u, p = mann_whitney(finals[variants[0]], finals[variants[1]])
            test = f" {u:g} | {p:.3f} |" if not math.isnan(p) else f" {u:g} | - |"
        elif len(variants) == 2:
            test = " - | - |"
        lines.append(f"| {env_id} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |" + test)
    for env_id, rows in shared.items():
        plot_comparison(env_id, rows, out_dir)
        stem = file_stem(env_id)
        lines += ["", f"## {env_id}", "", f"![{env_id}, return against steps](comparison/{stem}.png)",
                  f"![{env_id}, return against wall time](comparison/{stem}-time.png)"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------


def build_report(runs_dir: Path, out_dir: Path, baselines_path: Path = DEFAULT_BASELINES,
                 variants: list[str] | None = None, include_incomplete: bool = False,
                 compare: bool = False) -> dict[str, list[EnvSummary]]:
    """Read every run under runs_dir and write the markdown pages and plots to out_dir (with `compare`,
    also the page that sets the variants side by side, `comparison_markdown`). Returns the table rows
    per variant; without a run to report, nothing is written and it is empty."""
    # Wrong input is refused before the runs, which may be many, are read.
    if out_dir.exists() and not out_dir.is_dir():
        fail(f"--out-dir {out_dir} is a file: give a directory (it is made if it does not exist)")
    baselines = load_baselines(baselines_path)
    runs = [run for run in (load_run(path, runs_dir) for path in find_run_dirs(runs_dir)) if run is not None]
    if variants:
        runs = [run for run in runs if run.variant in variants]
    chosen, left_out = select_runs(runs, include_incomplete)
    if not chosen:
        return {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"cannot make the directory {out_dir} (--out-dir): {error.strerror}; give one you can write to")
    report = {}
    for variant, envs in sorted(chosen.items()):
        rows = []
        for env_id, env_runs in envs.items():
            baseline_variant, baseline = find_baseline(baselines, variant, env_id)
            rows.append(EnvSummary(env_id, sorted(env_runs, key=lambda run: run.seed),
                                   baseline_variant=baseline_variant, baseline=baseline))
        # Keep the order of the baselines file (the source's table order), other envs after it.
        order = [env["env_id"] for env in baselines.get("variants", {}).get(variant, {}).get("envs", [])]
        rows.sort(key=lambda row: (order.index(row.baseline["env_id"]) if row.baseline else len(order), row.env_id))
        for row in rows:
            plot_env(variant, row, out_dir)
        variant_left_out = [(run, reason) for run, reason in left_out if run.variant == variant]
        (out_dir / f"{variant}.md").write_text(
            variant_markdown(variant, rows, baselines, runs_dir, variant_left_out, baselines_path))
        report[variant] = rows
    # The index links every variant page in out_dir: those left out of this report (--variants) keep
    # their lines of the index as it was.
    lines = {variant: f"- [{variant}]({variant}.md): " + ", ".join(f"{row.env_id} {row.status}" for row in rows)
             for variant, rows in report.items()}
    comparison = comparison_markdown(report, out_dir) if compare else None
    if comparison:
        (out_dir / "comparison.md").write_text(comparison)
        lines["~comparison"] = "- [the variants compared](comparison.md): the environments two or more of them ran"
    index_path = out_dir / "index.md"
    if index_path.exists():
        for line in index_path.read_text().splitlines():
            variant = line.partition("- [")[2].partition("](")[0]
            if variant and variant not in lines and (out_dir / f"{variant}.md").exists():
                lines[variant] = line
    index_path.write_text("\n".join(["# Benchmark results", ""] + [lines[name] for name in sorted(lines)]) + "\n")
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", type=Path, default=HERE / "runs",
                        help="TensorBoard runs (default benchmark/runs/, where benchmark/ppo.sh puts them)")
    parser.add_argument("--out-dir", type=Path, default=HERE.parent / "docs" / "results",
                        help="where the markdown and plots go (default docs/results/)")
    parser.add_argument("--baselines", type=Path, default=DEFAULT_BASELINES, help="published numbers (TOML)")
    parser.add_argument("--variants", nargs="+", metavar="NAME", help="only these variants (exp_name)")
    parser.add_argument("--compare", action="store_true",
                        help="also write comparison.md: the variants side by side on each env that two or more "
                             "of them ran (an ablation's flag on and off), with a Mann-Whitney U test and both "
                             "curves in one plot")
    parser.add_argument("--include-incomplete", action="store_true",
                        help="also use runs that stopped before their budget "
                             "(per seed, the largest budget, then the newest)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401  (the plots need it; check before any work is done)
    except ImportError:
        fail('matplotlib is not installed, and the report draws its plots with it: pip install -e ".[benchmark]"')
    if not args.runs_dir.is_dir():
        fail(f"no runs directory {args.runs_dir}: give the directory the runs wrote their TensorBoard logs "
             "to (--runs-dir)")
    report = build_report(args.runs_dir, args.out_dir, args.baselines, args.variants, args.include_incomplete,
                          args.compare)
    if not report:
        fail(f"no complete runs{' of ' + ', '.join(args.variants) if args.variants else ''} under "
             f"{args.runs_dir}, nothing written"
             + ("" if args.include_incomplete else " (--include-incomplete uses unfinished ones too)"))
    for variant, rows in report.items():
        print(f"{args.out_dir / (variant + '.md')}")
        for row in rows:
            print(f"  {row.env_id:<28} {format_band(row.mean, row.std):>20}  {len(row.runs)} seed(s)  {row.status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
