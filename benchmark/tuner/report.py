"""The tuner's report: <study-dir>/report/index.md, the best settings as the command that
trains them, the best within the wall time of the script's defaults (or --max-seconds), the top
trials with their wall time and SPS, the failed and pruned ones with their reasons, and plots
of the optimization history, of score against wall time and of the parameters' importances.
Part of benchmark/tune.py.
"""

from __future__ import annotations

import math
import shlex
import warnings
from pathlib import Path

import numpy as np

from benchmark.report import format_duration
from benchmark.tuner.space import load_space_text


def best_commands(study, trial) -> list[str]:
    """A trial's settings as the commands that train them, one per env id."""
    definition = study.user_attrs["definition"]
    space = load_space_text(definition["space"])
    flags = space.arguments(trial.params)
    return [shlex.join([*definition["command"], "--env-id", env_id, "--total-timesteps",
                        str(definition["total_timesteps"]), *flags])
            for env_id in definition["env_ids"]]


def same_value(value, shown: str) -> bool:
    """Whether a trial's value is the default `shown` as the script's --help prints it."""
    if isinstance(value, bool) or shown in ("True", "False"):
        return str(value) == shown
    if isinstance(value, (int, float)):
        try:
            return math.isclose(float(shown), value, rel_tol=1e-9)
        except ValueError:
            return False
    return str(value) == shown


def defaults_trials(study, complete: list) -> list:
    """The complete trials of the script's defaults: each flag a trial passes (a flag its `when`
    leaves out takes the default anyway) equals the default the script's --help shows, which the
    study keeps as `script_defaults`."""
    defaults = study.user_attrs.get("script_defaults") or {}
    flags = {param.name for param in load_space_text(study.user_attrs["definition"]["space"]).params
             if param.flag}
    return [trial for trial in complete if defaults and all(
        name in defaults and same_value(value, defaults[name])
        for name, value in trial.params.items() if name in flags)]


def cost(trial) -> str:
    """A trial's wall time (its runs', added up) and mean SPS, for the report."""
    seconds, sps = trial.user_attrs.get("wall_seconds"), trial.user_attrs.get("sps")
    return (f"{format_duration(seconds) if seconds is not None else 'unknown wall time'}, "
            f"{f'{sps:,.0f}' if sps is not None else '?'} SPS")


# A trial of the same cost as the defaults' may time a little slower (other work on the machine, the
# disk): the report's budget from the defaults' wall time allows this much more.
TIMING_NOISE = 0.10


def within_budget(study, complete: list, max_seconds: float | None) -> tuple[list[str], dict]:
    """The report's section on the best settings within a time budget, for a researcher whose
    compute is fixed: the best overall may buy its score with many times the defaults' wall time.
    The budget is --max-seconds, else the wall time of the script's defaults (their trials' mean)
    plus TIMING_NOISE. Returns its lines, and what the plot of score against wall time marks."""
    defaults = defaults_trials(study, complete)
    timed = [trial.user_attrs["wall_seconds"] for trial in defaults
             if trial.user_attrs.get("wall_seconds") is not None]
    said = [f"The script's defaults, trial {trial.number}: score {trial.value:.4f}, {cost(trial)}."
            for trial in defaults]
    if max_seconds is not None:
        budget = max_seconds
        heading, limit = f"{format_duration(budget)} (--max-seconds)", format_duration(budget)
    elif timed:
        budget = float(np.mean(timed)) * (1 + TIMING_NOISE)
        heading = "the defaults' wall time"
        limit = (f"the defaults' wall time plus {TIMING_NOISE:.0%}, the noise of timing one trial: "
                 f"{format_duration(budget)}")
    else:
        why = ("the study keeps no defaults of the script (run the tuner's command once more to "
               "store them)" if not study.user_attrs.get("script_defaults") else
               "no trial of the script's defaults has completed (enqueue one: --enqueue with the "
               "defaults its --help shows)")
        return ["## Best within the defaults' wall time", "",
                f"Not known: {why}; or give --max-seconds.", ""], {"defaults": defaults}
    within = [trial for trial in complete if trial.user_attrs.get("wall_seconds") is not None
              and trial.user_attrs["wall_seconds"] <= budget]
    marks = {"defaults": defaults, "budget": budget, "best_within": within[0] if within else None,
             "budget_label": "--max-seconds" if max_seconds is not None else
             f"the defaults' wall time + {TIMING_NOISE:.0%}"}
    lines = [f"## Best within {heading}", "", *said]
    if not within:
        return [*lines, f"No complete trial took at most {limit}.", ""], marks
    best = within[0]
    lines.append(f"{len(within)} complete trial(s) took at most {limit}. The best of them is trial "
                 f"{best.number}: score {best.value:.4f}, {cost(best)}"
                 + (", the defaults themselves." if best in defaults else
                    ", the best overall too." if best.number == complete[0].number else "."))
    return [*lines, "", "```bash", *best_commands(study, best), "```", ""], marks


def write_report(study, out_dir: Path, top: int = 10, max_seconds: float | None = None) -> str:
    """<out_dir>/index.md and its plots; returns the markdown, which is printed too."""
    import optuna

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    replaced = {number for trial in trials
                for number in trial.system_attrs.get("retry_history", [])}
    complete = sorted((trial for trial in trials if trial.state == states.COMPLETE),
                      key=lambda trial: trial.value, reverse=True)
    lines = [f"# Tuning study `{study.study_name}`", "", *summary_lines(study, trials, replaced)]
    marks: dict = {}
    if complete:
        best = complete[0]
        returns = ", ".join(f"{label} {value:.2f}"
                            for label, value in best.user_attrs.get("returns", {}).items())
        lines += ["## Best settings", "",
                  f"Trial {best.number}, score {best.value:.4f}, {cost(best)}; "
                  f"final returns: {returns}.",
                  "", "```bash", *best_commands(study, best), "```", ""]
        budget_lines, marks = within_budget(study, complete, max_seconds)
        lines += budget_lines
        lines += top_trials_lines(trials, complete[:top], marks)
    else:
        lines += ["No trial has completed yet.", ""]
    lines += ended_early_lines(trials, replaced)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [plot_history(study, out_dir), plot_cost(study, out_dir, complete, marks),
             plot_importances(study, out_dir)]
    lines += ["## Plots", "", *[f"![{alt}]({name})" if name else alt for alt, name in plots], ""]
    text = "\n".join(lines)
    (out_dir / "index.md").write_text(text)
    return text


def summary_lines(study, trials: list, replaced: set[int]) -> list[str]:
    """What the study asks (the command, envs, steps, seeds, the score) and how far it is."""
    import optuna

    states = optuna.trial.TrialState
    definition = study.user_attrs["definition"]
    counted = [trial for trial in trials if trial.number not in replaced]
    count = {state: sum(trial.state == state for trial in counted) for state in states}
    starts = [trial.datetime_start for trial in trials if trial.datetime_start]
    ends = [trial.datetime_complete for trial in trials if trial.datetime_complete]
    wall = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    seeds = ", ".join(map(str, definition["seeds"]))
    about = (f"`{shlex.join(definition['command'])}` on {', '.join(definition['env_ids'])}, "
             f"{definition['total_timesteps']:,} steps per run, seeds {seeds} in every trial. "
             "Score: the mean over the (env, seed) runs of the final return (the mean return of "
             "the episodes in the last 10% of a run's steps), min-max normalized per env by the "
             "space's bounds.")
    unfinished = count[states.RUNNING] + count[states.WAITING]
    tally = (f"{len(counted)} trials: {count[states.COMPLETE]} complete, "
             f"{count[states.PRUNED]} pruned, {count[states.FAIL]} failed, "
             f"{unfinished} running or waiting; {len(replaced)} lost or stopped "
             "and retried. Wall time, first trial's start to last trial's end: "
             f"{format_duration(wall)}.")
    return [about, "", tally, ""]


def top_trials_lines(trials: list, top: list, marks: dict) -> list[str]:
    """The table of the best complete trials: score, cost and every parameter."""
    names = list(dict.fromkeys(name for trial in trials for name in trial.params))
    lines = ["## Top trials", "", "Wall time: the trial's runs', added up (they run one after the "
             "other); SPS: their mean.", "",
             "| trial | score | wall time | SPS | " + " | ".join(names) + " | state |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " | --- |"]
    for trial in top:
        cells = " | ".join(format_value(trial.params.get(name)) for name in names)
        seconds, sps = trial.user_attrs.get("wall_seconds"), trial.user_attrs.get("sps")
        state = "complete, the defaults" if trial in marks.get("defaults", []) else "complete"
        lines.append(f"| {trial.number} | {trial.value:.4f} "
                     f"| {format_duration(seconds) if seconds is not None else '-'} "
                     f"| {f'{sps:,.0f}' if sps is not None else '-'} | {cells} | {state} |")
    return [*lines, ""]


def ended_early_lines(trials: list, replaced: set[int]) -> list[str]:
    """The failed and pruned trials, each with its reason."""
    import optuna

    states = optuna.trial.TrialState
    others = [trial for trial in trials if trial.state in (states.FAIL, states.PRUNED)]
    if not others:
        return []
    lines = ["## Failed and pruned trials", ""]
    for trial in others:
        key = "failure" if trial.state == states.FAIL else "pruned"
        why = trial.user_attrs.get(key, "no reason stored")
        again = " (retried)" if trial.number in replaced else ""
        lines.append(f"- trial {trial.number}: {trial.state.name.lower()}{again}: {why}")
    return [*lines, ""]


def format_value(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(6, 4), dpi=100)
    return plt, fig, axes


def save_figure(plt, fig, axes, path: Path, title: str, legend: bool = True) -> None:
    """Title, grid (and legend), then the figure to `path`, closed."""
    axes.set_title(title, fontsize="medium")
    axes.grid(alpha=0.3, **({} if legend else {"axis": "x"}))
    if legend:
        axes.legend(fontsize="small", loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_history(study, out_dir: Path) -> tuple[str, str | None]:
    """Each complete trial's score against its number, the best so far as a line; pruned trials at
    their last reported value, in gray."""
    import optuna

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    complete = [trial for trial in trials if trial.state == states.COMPLETE]
    if not complete:
        return "No optimization history yet: no trial has completed.", None
    plt, fig, axes = figure()
    numbers = np.array([trial.number for trial in complete])
    values = np.array([trial.value for trial in complete])
    axes.scatter(numbers, values, color="tab:blue", s=18, label="complete trial")
    axes.step(numbers, np.maximum.accumulate(values), where="post", color="tab:blue", alpha=0.6,
              label="best so far")
    pruned = [(trial.number, trial.intermediate_values[trial.last_step]) for trial in trials
              if trial.state == states.PRUNED and trial.last_step is not None]
    if pruned:
        axes.scatter(*zip(*pruned), color="gray", marker="x", s=18,
                     label="pruned (last reported value)")
    axes.set_xlabel("trial")
    axes.set_ylabel("score (normalized final return)")
    save_figure(plt, fig, axes, out_dir / "history.png",
                f"optimization history: {study.study_name}")
    return "optimization history", "history.png"


def plot_cost(study, out_dir: Path, complete: list, marks: dict) -> tuple[str, str | None]:
    """Each complete trial's score against its wall time, the trade-off the best overall may hide:
    the defaults, the time budget, the best within it and the best overall marked."""
    timed = [trial for trial in complete if trial.user_attrs.get("wall_seconds") is not None]
    if not timed:
        return "No plot of score against wall time: no complete trial has a wall time.", None
    plt, fig, axes = figure()

    def point(trial):
        return trial.user_attrs["wall_seconds"], trial.value

    axes.scatter(*zip(*map(point, timed)), color="tab:blue", s=18, label="complete trial")
    defaults = [trial for trial in marks.get("defaults", []) if trial in timed]
    if defaults:
        axes.scatter(*zip(*map(point, defaults)), facecolors="none", edgecolors="black",
                     marker="s", s=70, label="the defaults")
    if marks.get("budget") is not None:
        axes.axvline(marks["budget"], color="gray", linestyle="--", label=marks["budget_label"])
    best_within = marks.get("best_within")
    if best_within is not None and best_within in timed:
        axes.scatter(*point(best_within), facecolors="none", edgecolors="tab:green", s=160,
                     linewidths=2, label=f"best within the budget (trial {best_within.number})")
    if complete[0] in timed:
        axes.scatter(*point(complete[0]), color="tab:red", marker="*", s=140,
                     label=f"best overall (trial {complete[0].number})")
    axes.set_xlim(left=0)
    axes.set_xlabel("wall time of the trial's runs, added up (s)")
    axes.set_ylabel("score (normalized final return)")
    save_figure(plt, fig, axes, out_dir / "cost.png",
                f"score against wall time: {study.study_name}")
    return "score against wall time", "cost.png"


def plot_importances(study, out_dir: Path) -> tuple[str, str | None]:
    """optuna.importance.get_param_importances over the complete trials, as horizontal bars."""
    import optuna

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError) as error:
        return f"No parameter importances: {error}", None
    if not importances:
        return "No parameter importances: no parameter varies over the complete trials.", None
    plt, fig, axes = figure()
    names = list(importances)[::-1]
    axes.barh(names, [importances[name] for name in names], color="tab:blue")
    axes.set_xlabel("importance (optuna.importance, normalized to sum to 1)")
    save_figure(plt, fig, axes, out_dir / "importances.png",
                f"parameter importances: {study.study_name}", legend=False)
    return "parameter importances", "importances.png"
