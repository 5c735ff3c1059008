"""Pictures for the MLflow review: a trial's learning curve, and the study's overview plots.

Pure functions from data to files (matplotlib, Agg backend); Optuna's interactive plotly
pages as well where plotly is installed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from optuna.trial import FrozenTrial, TrialState  # noqa: E402

from . import record  # noqa: E402
from .decisions import elapsed_of, metric_slot  # noqa: E402

__all__ = ["learning_curve", "study_plots"]

_INDEX = {"top1": 1, "top5": 2}


def learning_curve(rows: Sequence[Sequence[Any]], metric: str, target: float, title: str,
                   path: Path) -> Path:
    """Accuracy against elapsed seconds, with the target line, and the gradient noise scale
    where the rows carry it."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    times = [r[0] for r in rows]
    ax.plot(times, [r[_INDEX[metric_slot(metric)]] for r in rows], marker="o",
            label=f"validation {metric}")
    ax.axhline(target, color="tab:red", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("elapsed seconds (training + evaluation)")
    ax.set_ylabel(metric)
    _limits(ax, [r[_INDEX[metric_slot(metric)]] for r in rows], target)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    noise = [(r[0], r[5]) for r in rows if len(r) > 5 and r[5]]
    if noise:   # the gradient noise scale the trainer measured, on its own axis
        right = ax.twinx()
        right.plot(*zip(*noise, strict=True), color="tab:purple", linestyle=":", marker=".",
                   label="gradient noise scale")
        right.set_ylabel("gradient noise scale (images)")
        right.set_yscale("log")
        right.legend(loc="center right")
    ax.legend(loc="best")
    return _save(fig, path)


def _limits(ax: Any, values: Sequence[Any], target: float) -> None:
    """The value axis: 0 to 1 for an accuracy; for a metric past 1 (a loss), a log scale over
    the values shown, so a blown-up trial's 10^9 leaves the others' fall to the target in
    view."""
    shown = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    top = max([*shown, target], default=1.0)
    if top <= 1.0:
        ax.set_ylim(0, 1.02)
        return
    low = min([v for v in (*shown, target) if v > 0], default=target)
    ax.set_yscale("log")
    ax.set_ylim(low / 1.5, top * 1.5)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _ran(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if t.state == TrialState.COMPLETE
            and t.user_attrs.get(record.OUTCOME) in ("reached", "censored", "failed")]


def _tta_vs_batch(trials: Sequence[FrozenTrial], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    styles = {"reached": ("o", "tab:green", "reached: TTA"),
              "censored": ("^", "tab:gray", "censored: TTA > elapsed"),
              "failed": ("x", "tab:red", "failed")}
    for outcome, (marker, color, label) in styles.items():
        pts = [(t.user_attrs.get(record.PARAMS, {}).get("global_batch"), elapsed_of(t))
               for t in trials if t.user_attrs.get(record.OUTCOME) == outcome]
        pts = [(b, v) for b, v in pts if v is not None]
        pts = [(b, v) for b, v in pts if b]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=marker, color=color, label=label)
    measured = [float(t.user_attrs[record.NOISE_SCALE]) for t in trials
                if isinstance(t.user_attrs.get(record.NOISE_SCALE), int | float)]
    if measured:   # the gradient noise scale the trials measured (trainers.noise)
        ax.axvspan(min(measured), max(measured), color="tab:purple", alpha=0.15,
                   label=f"gradient noise scale measured ({len(measured)} trials)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch")
    ax.set_ylabel("seconds")
    ax.set_title("time to accuracy against batch size")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def _legend(ax: Any) -> None:
    """A legend of what the picture shows, or a word that it shows nothing yet (only failed
    trials, which have no time to plot)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no trial with a time to show yet", ha="center",
                transform=ax.transAxes, color="gray")


def _history(trials: Sequence[FrozenTrial], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    reached = [(t.number, float(t.value)) for t in trials
               if t.user_attrs.get(record.OUTCOME) == "reached" and t.value is not None]
    if reached:
        ax.scatter(*zip(*reached, strict=True), color="tab:green", label="reached")
        best, xs, ys = math.inf, [], []
        for n, v in sorted(reached):
            best = min(best, v)
            xs.append(n)
            ys.append(best)
        ax.step(xs, ys, where="post", color="black", label="best so far")
    censored = [(t.number, elapsed_of(t)) for t in trials
                if t.user_attrs.get(record.OUTCOME) == "censored" and elapsed_of(t) is not None]
    if censored:
        ax.scatter(*zip(*censored, strict=True), marker="^", color="tab:gray",
                   label="censored (TTA > elapsed)")
    ax.set_xlabel("trial")
    ax.set_ylabel("seconds")
    ax.set_title("optimization history")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def _overlay(trials: Sequence[FrozenTrial], metric: str, target: float, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for t in trials:
        rows = t.user_attrs.get(record.CURVE) or []
        if rows:
            outcome = t.user_attrs.get(record.OUTCOME)
            ax.plot([r[0] for r in rows], [r[_INDEX[metric_slot(metric)]] for r in rows],
                    color="tab:green" if outcome == "reached" else "tab:gray",
                    alpha=0.9 if outcome == "reached" else 0.5, linewidth=1.2)
    ax.axhline(target, color="tab:red", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("elapsed seconds")
    ax.set_ylabel(metric)
    _limits(ax, [r[_INDEX[metric_slot(metric)]] for t in trials
                 for r in t.user_attrs.get(record.CURVE) or []], target)
    ax.set_title(f"{metric} against time, all trials (green: reached)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(fig, path)


def _importance(study: optuna.Study, path: Path) -> Path | None:
    """Parameter importance for the trials' values (TTA or censored elapsed)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            importances = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError):
        return None  # too few trials, or no variation yet
    if not importances or any("too small" in str(w.message) for w in caught):
        return None  # Optuna warns and calls every parameter equal: nothing to draw
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    names = list(importances)[::-1]
    ax.barh(names, [importances[n] for n in names], color="tab:blue")
    ax.set_xlabel("importance (fANOVA) for the trial value")
    ax.set_title("parameter importance")
    return _save(fig, path)


def study_plots(study: optuna.Study, metric: str, target: float, folder: Path,
                interactive: bool = False) -> list[Path]:
    """Writes the study's overview plots into ``folder``; returns the files written.

    ``interactive`` adds Optuna's plotly pages (self-contained, so they open offline; a few
    MB each, hence only at the end of a study)."""
    trials = _ran(study.get_trials(deepcopy=False))
    if not trials:
        return []
    files = [_tta_vs_batch(trials, folder / "tta_vs_batch.png"),
             _history(trials, folder / "optimization_history.png"),
             _overlay(trials, metric, target, folder / "accuracy_vs_time.png")]
    importance = _importance(study, folder / "param_importance.png")
    if importance:
        files.append(importance)
    if interactive:
        files += _plotly_pages(study, folder)
    return files


def _plotly_pages(study: optuna.Study, folder: Path) -> list[Path]:
    try:
        import plotly  # noqa: F401
    except ImportError:
        return []
    pages = []
    vis = optuna.visualization
    # Trials that did not reach the target have the value +inf: Optuna's pages leave them out
    # (they plot TTAs), and say so once a trial; those lines are not for the user's terminal.
    # Nor is Optuna's warning that too few trials make every importance equal.
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for name, make in (("optimization_history.html", vis.plot_optimization_history),
                               ("param_importances.html", vis.plot_param_importances)):
                try:
                    make(study).write_html(str(folder / name), include_plotlyjs=True)
                except (ValueError, RuntimeError):
                    continue
                pages.append(folder / name)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return pages
