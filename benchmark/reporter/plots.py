"""The report's learning curves: each seed's returns smoothed onto one grid, against global steps or
wall time, and the plots drawn with matplotlib (a variant's on each environment, and the variants
side by side for an ablation's page), with the file names the pages link to."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from benchmark.reporter.results import EnvSummary

CURVE_POINTS = 200          # points of each learning curve
CURVE_WINDOW = 0.05         # a curve point averages the episodes of the preceding 5% of the x range
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def file_stem(env_id: str) -> str:
    """An env id usable as a file name (`ALE/Breakout-v5` -> `ALE_Breakout-v5`)."""
    return env_id.replace("/", "_")


def curve_on_grid(x: np.ndarray, y: np.ndarray, grid: np.ndarray, window: float,
                  x_end: float) -> np.ndarray:
    """A run's returns smoothed onto `grid`: the mean of the points with x in (g - window, g],
    carried forward across gaps; NaN before the first point and after the run's end `x_end`."""
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
    """The curve of each seed on one grid, against global steps or wall time (in units of
    `time_scale` seconds): returns (grid, mean, min, max over the seeds)."""
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
        return (grid, np.nanmean(curves, axis=0), np.nanmin(curves, axis=0),
                np.nanmax(curves, axis=0))


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
        axes.fill_between(grid, low, high, color="tab:blue", alpha=0.2, linewidth=0,
                          label="min–max over seeds")
        if row.baseline:
            label = row.baseline_variant.get("ours_label", "published")
            axes.axhline(row.baseline["ours"]["mean"], color="black", linestyle="--", linewidth=1,
                         label=f"{label}: {row.baseline['ours']['mean']:.2f}")
            label = row.baseline_variant.get("reference_label", "comparison")
            axes.axhline(row.baseline["reference"]["mean"], color="gray", linestyle=":",
                         linewidth=1, label=f"{label}: {row.baseline['reference']['mean']:.2f}")
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
