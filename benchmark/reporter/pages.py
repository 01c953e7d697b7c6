"""The report's markdown pages: a variant's page (its table against the baselines and how to read
it, where the baselines come from, the runs used and left out, the software, the progress per span,
the curves) and the page that sets variants side by side (with the Mann-Whitney U test), and the
numbers formatted for them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmark.common import REPO
from benchmark.reporter.plots import CURVE_WINDOW, file_stem, plot_comparison
from benchmark.reporter.results import DEFAULT_BASELINES, PROGRESS_SPANS, EnvSummary, progress
from benchmark.reporter.run_data import FINAL_FRACTION, RunData


def format_band(mean: float, std: float) -> str:
    return "n/a" if math.isnan(mean) else f"{mean:.2f} ± {std:.2f}"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def format_steps(steps: set[int | None]) -> str:
    return ", ".join(f"{step:,}" if step is not None else "?"
                     for step in sorted(steps, key=lambda s: s or 0))


def format_run_steps(runs: list[RunData]) -> str:
    """The steps of a row's runs, each different one once, fewest first: `1,000` when all reached
    the same budget, `3,989,504 of 10,000,000` for a run that stopped before its budget."""
    labels = [run.steps_label()
              for run in sorted(runs, key=lambda run: (run.steps_run, run.complete))]
    return ", ".join(dict.fromkeys(labels))


def format_step_count(steps: float) -> str:
    """A step count, short, for a table: 0, 40k, 1M, 2.5M."""
    if steps >= 1e6:
        return f"{steps / 1e6:.3g}M"
    if steps >= 1e3:
        return f"{steps / 1e3:.3g}k"
    return f"{steps:.0f}"


def repository_name(path: Path) -> str:
    """How a page names a file or folder it was made from (the logs, the baselines): by its path in
    the repository when it lies there, so that the page reads the same wherever the repository is
    checked out; one outside it, as it was given."""
    resolved = path.resolve()
    return resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(path)


def format_versions(versions: list[dict[str, str]]) -> str:
    """`python 3.11.7, torch 2.13.0+cpu, ...`; a run resumed on other releases: `..., then ...`."""
    return ", then ".join(", ".join(f"{package} {release}" for package, release in table.items())
                          for table in versions)


def software_lines(runs: list[RunData], runs_dir: Path) -> list[str]:
    """What the runs ran on, from the `versions` text each script logs: one line when they all
    agree, else a line per set of releases with its runs. A package's release can change what is
    learned (MuJoCo 3.5.0 changed Hopper's contacts), so a table of results names them."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(format_versions(run.versions), []).append(run)
    if list(groups) == [""]:
        return ["Not recorded: these runs predate the `versions` text the scripts log."]
    if len(groups) == 1:
        return [f"Every run above: {next(iter(groups))}."]
    lines = ["The runs above ran on more than one set of releases:" if "" not in groups else
             "The releases each run logged (runs from before the scripts logged them have none):",
             ""]
    for described, members in groups.items():
        names = ", ".join(f"`{run.path.relative_to(runs_dir).as_posix()}`" for run in members)
        lines.append(f"- {described or 'not recorded'}: {names}")
    return lines


def variant_markdown(variant: str, rows: list[EnvSummary], baselines: dict, runs_dir: Path,
                     left_out: list[tuple[RunData, str]],
                     baselines_path: Path = DEFAULT_BASELINES) -> str:
    """The markdown page of one variant: its table against the baselines and how to read it, the
    runs used, the software, the progress per span and the learning curves."""
    entry = baselines.get("variants", {}).get(variant, {})
    ours_label = entry.get("ours_label", "published")
    reference_label = entry.get("reference_label", "comparison")
    lines = [
        f"# Benchmark results: {variant}",
        "",
        # Nothing of the machine or the moment: the same logs make the same page, byte for byte.
        "Made by `benchmark/report.py` from the TensorBoard logs in "
        f"`{repository_name(runs_dir)}`.",
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
        "| env | final return, mean ± std over seeds (last 10% of steps) | seeds | steps per run "
        f"| mean SPS | wall time per run | baseline: {ours_label} | {reference_label} | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        fallback = "*" if any(used_last for _, _, used_last in row.finals) else ""
        fallback += "†" if row.seeds_without_episodes else ""
        sps = [run.sps for run in row.runs if run.sps is not None]
        ours = (format_band(row.baseline["ours"]["mean"], row.baseline["ours"]["std"])
                if row.baseline else "n/a")
        reference = (format_band(row.baseline["reference"]["mean"],
                                 row.baseline["reference"]["std"]) if row.baseline else "n/a")
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
        "- **Final return** of a run: the mean of its `charts/episodic_return` points logged in "
        f"the last {FINAL_FRACTION:.0%} of its global steps. The table gives the mean and the "
        "standard deviation (numpy, ddof=0) of that number over seeds."
        + (" Values marked * include a run in which no episode ended in that window: its last "
           "episode counts instead."
           if any(used_last for row in rows for _, _, used_last in row.finals) else "")
        + (" Values marked † leave out a run in which no episode ended at all (n/a below); "
           "n/a alone: no run of the row had one."
           if any(row.seeds_without_episodes for row in rows) else ""),
        "- **Mean SPS** and **wall time**: each run's last `charts/SPS` point and its training "
        "time, first event to last (a resumed run's sittings added up), averaged over seeds.",
        f"- **Status**: where the final return's mean falls against the band mean ± std of the "
        f"\"{ours_label}\" column: below, within (bounds included) or above.",
    ]


def baselines_notes(entry: dict, baselines: dict, rows: list[EnvSummary],
                    baselines_path: Path) -> list[str]:
    """Where the baselines come from and what limits the comparison, or why there is none."""
    if not entry:
        # --baselines /dev/null: a report of runs, no comparison asked for
        if not baselines.get("variants"):
            return ["- No comparison: made with "
                    f"`--baselines {repository_name(baselines_path)}`, which holds no "
                    "published numbers."]
        return [f"- No published numbers for this variant in `{repository_name(baselines_path)}`."]
    source = baselines.get("source", {})
    lines = [f"- **Baselines** from `{repository_name(baselines_path)}`: "
             f"{source.get('document', '')}, section \"{entry.get('section', '')}\"; "
             f"{source.get('citation', '')}."]
    if entry.get("note"):
        lines.append(f"- {entry['note']}")
    budget = entry.get("total_timesteps")
    budgets = {run.total_timesteps for row in rows for run in row.runs}
    if budget and budgets != {budget}:
        lines.append(f"- The published numbers were measured after {budget:,} steps; "
                     f"these runs used {format_steps(budgets)}, so the comparison is indicative "
                     "only.")
    renamed = [f"{row.env_id} against the row \"{row.baseline['table_env']}\"" for row in rows
               if row.baseline and row.baseline.get("table_env") not in (None, row.env_id)]
    if renamed:
        lines.append(f"- Compared: {'; '.join(renamed)}.")
    return lines


def runs_used(rows: list[EnvSummary], runs_dir: Path,
              left_out: list[tuple[RunData, str]]) -> list[str]:
    """Each run behind the table, with its final return, and the runs left out with the reason."""
    lines = ["## Runs used", "",
             "| env | seed | run | final return | episodes averaged | SPS | wall time |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        for run, (value, count, _) in zip(row.runs, row.finals):
            lines.append(f"| {row.env_id} | {run.seed} "
                         f"| `{run.path.relative_to(runs_dir).as_posix()}` "
                         f"| {'n/a' if count == 0 else f'{value:.2f}'} | {count} "
                         f"| {f'{run.sps:,.0f}' if run.sps is not None else 'n/a'} "
                         f"| {format_duration(run.wall_seconds)} |")
    if left_out:
        lines += ["", "Runs left out:", ""]
        lines += [f"- `{run.path.relative_to(runs_dir).as_posix()}`: {reason}"
                  for run, reason in left_out]
    return lines


def progress_sections(rows: list[EnvSummary]) -> list[str]:
    """Per env, the mean return of the episodes that ended in each span of the runs' steps."""
    lines = ["## Progress", "",
             f"The runs' steps cut into {PROGRESS_SPANS} equal spans: the mean return of the "
             "episodes that ended in each, per seed, averaged over the seeds (n/a: no episode "
             "ended there), and how many episodes that was in all.", ""]
    for row in rows:
        lines += [f"### {row.env_id}", "", "| steps | mean return | episodes |",
                  "| --- | --- | --- |"]
        for first, last, mean, episodes in progress(row):
            shown = "n/a" if math.isnan(mean) else f"{mean:.2f}"
            lines.append(f"| {format_step_count(first)}-{format_step_count(last)} | {shown} "
                         f"| {episodes:,} |")
        lines.append("")
    return lines


def curve_sections(variant: str, rows: list[EnvSummary]) -> list[str]:
    """Per env, the two plots of its learning curves: against steps and against wall time."""
    lines = ["## Learning curves", "",
             "Mean over seeds of the episodic return (each point averages the episodes of the "
             f"preceding {CURVE_WINDOW:.0%} of the axis), with the min–max range over seeds "
             "shaded; dashed: the published mean.", ""]
    for row in rows:
        stem = file_stem(row.env_id)
        lines += [f"### {row.env_id}", "",
                  f"![{row.env_id}: return against global step]({variant}/{stem}.png) "
                  f"![{row.env_id}: return against wall time]({variant}/{stem}-time.png)", ""]
    return lines


def mann_whitney(first: np.ndarray, second: np.ndarray) -> tuple[float, float]:
    """The two-sided Mann-Whitney U test of two samples: (U of `first`, p). U counts the pairs in
    which `first` is the larger (ties count a half). p is exact, from every way of splitting the
    pooled values into groups of those sizes, which is what a benchmark's handful of seeds needs; it
    is not offered past 20 values in all (nan), where the enumeration grows too long."""
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


def comparison_markdown(report: dict[str, list[EnvSummary]], out_dir: Path) -> str | None:
    """The page that sets the variants side by side on each environment that two or more of them
    ran: the final returns of the seeds they share, a Mann-Whitney U test when there are two
    variants, and both curves in one plot. None when no environment has two variants."""
    by_env: dict[str, dict[str, EnvSummary]] = {}
    for variant, rows in report.items():
        for row in rows:
            by_env.setdefault(row.env_id, {})[variant] = row
    shared = {env_id: rows for env_id, rows in sorted(by_env.items()) if len(rows) > 1}
    if not shared:
        return None
    variants = sorted({variant for rows in shared.values() for variant in rows})
    lines = ["# Variants compared", "",
             "Final return (the mean of the episodes in the last 10% of a run's steps), mean ± std "
             "over the seeds that every variant of the row ran."
             + (" U and p: two-sided Mann-Whitney U test of the first variant's seeds against the "
                "second's, p exact." if len(variants) == 2 else ""), "",
             "| env | seeds | " + " | ".join(variants)
             + (" | U | p |" if len(variants) == 2 else " |"),
             "|---|---|" + "---|" * len(variants) + ("---|---|" if len(variants) == 2 else "")]
    for env_id, rows in shared.items():
        seeds = sorted(set.intersection(*({run.seed for run in row.runs} for row in rows.values())))
        finals = {variant: np.array([value for run, (value, count, _) in zip(row.runs, row.finals)
                                     if run.seed in seeds and count > 0])
                  for variant, row in rows.items()}
        cells = [format_band(float(np.mean(finals[v])), float(np.std(finals[v])))
                 if v in finals and len(finals[v]) else "-" for v in variants]
        test = ""
        if len(variants) == 2 and all(v in finals and len(finals[v]) for v in variants):
            u, p = mann_whitney(finals[variants[0]], finals[variants[1]])
            test = f" {u:g} | {p:.3f} |" if not math.isnan(p) else f" {u:g} | - |"
        elif len(variants) == 2:
            test = " - | - |"
        lines.append(f"| {env_id} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |"
                     + test)
    for env_id, rows in shared.items():
        plot_comparison(env_id, rows, out_dir)
        stem = file_stem(env_id)
        lines += ["", f"## {env_id}", "",
                  f"![{env_id}, return against steps](comparison/{stem}.png)",
                  f"![{env_id}, return against wall time](comparison/{stem}-time.png)"]
    return "\n".join(lines) + "\n"
