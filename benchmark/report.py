"""Turn the TensorBoard logs of benchmark runs into result tables and learning curves, offline.

    python benchmark/report.py                      # benchmark/logs/runs/ -> docs/results/
    python benchmark/report.py --runs-dir /data/runs --out-dir /tmp/results --variants ppo
    python benchmark/report.py --runs-dir benchmark/logs/ablations/X \\
        --out-dir /tmp/X --compare                  # an ablation

For every variant (a run's exp_name) it writes `<out-dir>/<variant>.md`: one row per environment
with the final return over seeds, throughput, wall time, the published numbers of
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
import sys
from pathlib import Path

# The report's parts, one concern a module, in benchmark/reporter/: run_data.py (a run's TensorBoard
# logs, the runs kept), results.py (the baselines, each environment's row against them), plots.py
# (the learning curves), pages.py (the markdown). This file is the command: build_report, its
# options and main. Imports go one way: run_data, results, plots, pages, then this file. The names
# other code reads from the report (the tuner: load_run, find_run_dirs, format_duration; the tests)
# are imported here for it, hence the F401 waivers.
from benchmark.reporter.pages import (comparison_markdown, format_band,  # noqa: F401
                                      format_duration, mann_whitney, variant_markdown)  # noqa: F401
from benchmark.reporter.plots import CURVE_POINTS, plot_env  # noqa: F401
from benchmark.reporter.results import (DEFAULT_BASELINES, EnvSummary, classify,  # noqa: F401
                                        fail, find_baseline, load_baselines, progress)  # noqa: F401
from benchmark.reporter.run_data import (RunData, find_run_dirs, load_run,  # noqa: F401
                                         select_runs)  # noqa: F401

HERE = Path(__file__).resolve().parent


def build_report(runs_dir: Path, out_dir: Path, baselines_path: Path = DEFAULT_BASELINES,
                 variants: list[str] | None = None, include_incomplete: bool = False,
                 compare: bool = False) -> dict[str, list[EnvSummary]]:
    """Read every run under runs_dir and write the markdown pages and plots to out_dir (with
    `compare`, also the page that sets the variants side by side, `comparison_markdown`). Returns
    the table rows per variant; without a run to report, nothing is written and it is empty."""
    # Wrong input is refused before the runs, which may be many, are read.
    if out_dir.exists() and not out_dir.is_dir():
        fail(f"--out-dir {out_dir} is a file: give a directory (it is made if it does not exist)")
    baselines = load_baselines(baselines_path)
    runs = [run for run in (load_run(path, runs_dir) for path in find_run_dirs(runs_dir))
            if run is not None]
    if variants:
        runs = [run for run in runs if run.variant in variants]
    chosen, left_out = select_runs(runs, include_incomplete)
    if not chosen:
        return {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"cannot make the directory {out_dir} (--out-dir): {error.strerror}; "
             "give one you can write to")
    report = {}
    for variant, envs in sorted(chosen.items()):
        rows = []
        for env_id, env_runs in envs.items():
            baseline_variant, baseline = find_baseline(baselines, variant, env_id)
            rows.append(EnvSummary(env_id, sorted(env_runs, key=lambda run: run.seed),
                                   baseline_variant=baseline_variant, baseline=baseline))
        # Keep the order of the baselines file (the source's table order), other envs after it.
        order = [env["env_id"]
                 for env in baselines.get("variants", {}).get(variant, {}).get("envs", [])]
        rows.sort(key=lambda row: (order.index(row.baseline["env_id"]) if row.baseline
                                   else len(order), row.env_id))
        for row in rows:
            plot_env(variant, row, out_dir)
        variant_left_out = [(run, reason) for run, reason in left_out if run.variant == variant]
        (out_dir / f"{variant}.md").write_text(
            variant_markdown(variant, rows, baselines, runs_dir, variant_left_out, baselines_path))
        report[variant] = rows
    # The index links every variant page in out_dir: those left out of this report (--variants) keep
    # their lines of the index as it was.
    lines = {variant: f"- [{variant}]({variant}.md): "
             + ", ".join(f"{row.env_id} {row.status}" for row in rows)
             for variant, rows in report.items()}
    comparison = comparison_markdown(report, out_dir) if compare else None
    if comparison:
        (out_dir / "comparison.md").write_text(comparison)
        lines["~comparison"] = ("- [the variants compared](comparison.md): "
                                "the environments two or more of them ran")
    index_path = out_dir / "index.md"
    if index_path.exists():
        for line in index_path.read_text().splitlines():
            variant = line.partition("- [")[2].partition("](")[0]
            if variant and variant not in lines and (out_dir / f"{variant}.md").exists():
                lines[variant] = line
    index_path.write_text("\n".join(["# Benchmark results", ""]
                                    + [lines[name] for name in sorted(lines)]) + "\n")
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", type=Path, default=HERE / "logs" / "runs",
                        help="TensorBoard runs (default benchmark/logs/runs/, "
                             "where benchmark/ppo.sh puts them)")
    parser.add_argument("--out-dir", type=Path, default=HERE.parent / "docs" / "results",
                        help="where the markdown and plots go (default docs/results/)")
    parser.add_argument("--baselines", type=Path, default=DEFAULT_BASELINES,
                        help="published numbers (TOML)")
    parser.add_argument("--variants", nargs="+", metavar="NAME",
                        help="only these variants (exp_name)")
    parser.add_argument("--compare", action="store_true",
                        help="also write comparison.md: the variants side by side on each env that "
                             "two or more of them ran (an ablation's flag on and off), with a "
                             "Mann-Whitney U test and both curves in one plot")
    parser.add_argument("--include-incomplete", action="store_true",
                        help="also use runs that stopped before their budget "
                             "(per seed, the largest budget, then the newest)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401  (the plots need it; check before any work is done)
    except ImportError:
        fail("matplotlib is not installed, and the report draws its plots with it: "
             'pip install -e ".[benchmark]"')
    if not args.runs_dir.is_dir():
        fail(f"no runs directory {args.runs_dir}: give the directory the runs wrote their "
             "TensorBoard logs to (--runs-dir)")
    report = build_report(args.runs_dir, args.out_dir, args.baselines, args.variants,
                          args.include_incomplete, args.compare)
    if not report:
        fail(f"no complete runs{' of ' + ', '.join(args.variants) if args.variants else ''} under "
             f"{args.runs_dir}, nothing written"
             + ("" if args.include_incomplete
                else " (--include-incomplete uses unfinished ones too)"))
    for variant, rows in report.items():
        print(f"{args.out_dir / (variant + '.md')}")
        for row in rows:
            print(f"  {row.env_id:<28} {format_band(row.mean, row.std):>20}  "
                  f"{len(row.runs)} seed(s)  {row.status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
