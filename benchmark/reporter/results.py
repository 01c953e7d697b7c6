"""What a report states of each environment: the published numbers (benchmark/baselines.toml, read
and checked), and a variant's row on an environment against them (`EnvSummary`: the final returns
over seeds, where their mean falls against the published band, the mean return per span of the
steps). Also the report's wrong input (`fail`: one line, exit 2)."""

from __future__ import annotations

import math
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np

from benchmark.reporter.run_data import RunData

DEFAULT_BASELINES = Path(__file__).resolve().parents[1] / "baselines.toml"
PROGRESS_SPANS = 10         # the progress table: the mean return in each tenth of the runs' steps


def fail(message: str) -> NoReturn:
    """Wrong input: one line saying what to do, exit code 2."""
    print(f"report.py: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def load_baselines(path: Path = DEFAULT_BASELINES) -> dict:
    """benchmark/baselines.toml as a dict:
    {"source": ..., "variants": {variant: {..., "envs": [...]}}}. A file that cannot be read, is
    not TOML or lacks a number the report uses is refused here, before anything is written. An empty
    file (`--baselines /dev/null`) means no published numbers."""
    try:
        with open(path, "rb") as file:
            baselines = tomllib.load(file)
    except OSError as error:
        fail(f"cannot read the baselines file {path} ({error.strerror}): "
             "give an existing TOML file to --baselines")
    except tomllib.TOMLDecodeError as error:
        fail(f"the baselines file {path} is not valid TOML ({error}): "
             "fix it, or give another to --baselines")
    for variant, entry in baselines.get("variants", {}).items():
        for number, env in enumerate(entry.get("envs", []), start=1):
            missing = [] if isinstance(env.get("env_id"), str) else ["env_id"]
            for column in ("ours", "reference"):
                numbers = env.get(column) if isinstance(env.get(column), dict) else {}
                missing += [f"{column}.{statistic}" for statistic in ("mean", "std")
                            if not isinstance(numbers.get(statistic), (int, float))]
            if missing:
                fail(f"the baselines file {path}: env {number} of variant {variant!r} "
                     f"({env.get('env_id', 'no env_id')}) lacks {', '.join(missing)}: "
                     "give each env an env_id and the mean and std of its ours and reference "
                     "columns")
    return baselines


def find_baseline(baselines: dict, variant: str,
                  env_id: str) -> tuple[dict, dict] | tuple[None, None]:
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
        span_of_episode = np.clip(np.searchsorted(edges, run.return_steps, side="left") - 1,
                                  0, spans - 1)
        for span in range(spans):
            returns = run.return_values[span_of_episode == span]
            if len(returns):
                per_seed_means[span].append(float(returns.mean()))
                episodes[span] += len(returns)
    return [(edges[span], edges[span + 1], float(np.mean(means)) if means else math.nan,
             episodes[span]) for span, means in enumerate(per_seed_means)]
