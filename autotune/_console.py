"""What a study says on the terminal and records at its end: a line per trial, the summary,
the best trial and where to review it; and the libraries' own logs kept off the terminal."""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from . import record
from ._preflight import access_advice
from .config import StudyConfig, redact
from .decisions import TrialResult, elapsed_of
from .tracking import Tracker, ui_command

__all__ = ["Print", "finished", "format_result", "quiet_libraries", "result_of", "short",
           "summarize"]

Print = Callable[[str], None]


def short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_result(r: TrialResult, metric: str) -> str:
    """The terminal line of a finished trial."""
    params = " ".join(f"{k}={short(v)}" for k, v in r.params.items())
    if r.outcome == "reached":
        tail = f"reached   TTA {r.value:.2f} s ({metric} {r.best_metric:.3f})"
    elif r.outcome == "censored":
        best = f"best {metric} {r.best_metric:.3f}" if r.evals else (
            "no evaluation yet" if r.reason != "max_seconds" else
            "no evaluation within budget.max_trial_s: evaluate more often (trainer."
            "eval_every_s or eval_every_steps) or raise the cap")
        tail = f"censored  ({r.reason}) after {r.value:.2f} s, {best}"
    else:
        tail = f"failed    ({r.reason}) {r.detail}"[:200]
    skipped = r.summary.get(record.UNREADABLE)
    if skipped:
        tail += f" ({skipped} unreadable image(s) skipped: named in the trial's log)"
    return f"[trial {r.number:3d}] {params} | {tail}"


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that ran and ended (``record.finished``)."""
    return record.finished(study.get_trials(deepcopy=False))


def budget_left(study: optuna.Study, n_trials: int | None) -> bool:
    """Whether the study holds fewer than ``n_trials`` finished and running trials, counted
    over every worker, local or remote (None: no trial budget)."""
    if n_trials is None:
        return True
    trials = study.get_trials(deepcopy=False)
    running = sum(t.state == TrialState.RUNNING and not record.asked_elsewhere(t)
                  for t in trials)
    return len(record.finished(trials)) + running < n_trials


def _counts(trials: list[FrozenTrial]) -> dict[str, int]:
    counts = {"reached": 0, "censored": 0, "failed": 0}
    for t in trials:
        outcome = t.user_attrs.get(record.OUTCOME,
                                   "failed" if t.state == TrialState.FAIL else "")
        if outcome in counts:
            counts[outcome] += 1
    return counts


def result_of(trial: FrozenTrial) -> TrialResult:
    """A finished trial's result, as recorded in the study store."""
    attrs = trial.user_attrs
    return TrialResult(trial.number, dict(attrs.get(record.PARAMS, trial.params)),
                       str(attrs.get(record.OUTCOME, "failed")),
                       str(attrs.get(record.STOP_REASON, "")), value=elapsed_of(trial),
                       best_metric=float(attrs.get(record.BEST_METRIC) or 0.0),
                       evals=len(attrs.get(record.CURVE, [])),
                       detail=str(attrs.get(record.DETAIL, "")),
                       summary={k: attrs[k] for k in (record.UNREADABLE,) if k in attrs})


def _closest(trials: list[FrozenTrial], falls: bool) -> FrozenTrial | None:
    """The trial whose best value of the target metric came nearest to it: the highest
    accuracy, or the lowest value of a metric that falls (None: no trial evaluated)."""
    scored = [t for t in trials if isinstance(t.user_attrs.get(record.BEST_METRIC), int | float)
              and math.isfinite(t.user_attrs[record.BEST_METRIC])]
    pick = min if falls else max
    return pick(scored, key=lambda t: t.user_attrs[record.BEST_METRIC], default=None)


def summarize(cfg: StudyConfig, study: optuna.Study, tracker: Tracker, echo: Print) -> int:
    trials = finished(study)
    counts = _counts(trials)
    compute = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials
                  if t.datetime_complete and t.datetime_start)
    summary: dict[str, Any] = {**{f"trials_{k}": v for k, v in counts.items()},
                               "trials": len(trials), "compute_s": compute}
    others = sum(record.told_elsewhere(t) for t in study.get_trials(deepcopy=False))
    elsewhere = f"; {others} told by another Optuna client, not counted" if others else ""
    echo(f"study {cfg.study_name!r}: {len(trials)} trials ({counts['reached']} reached, "
         f"{counts['censored']} censored, {counts['failed']} failed), {compute:.0f} s of "
         f"compute{elsewhere}")
    best_params: dict[str, Any] = {}
    # the fastest trial that reached, not Optuna's best value: a trial another client told
    # the study (a plain Optuna objective's value) is no time to accuracy
    best = record.best_reached(trials)
    if best is None:
        closest = _closest(trials, cfg.target.falls)
        note = "" if closest is None else (
            f"; closest: trial {closest.number} with {cfg.target.metric} "
            f"{closest.user_attrs[record.BEST_METRIC]:.3f}")
        if closest is None and trials:
            note = "; no trial came to an evaluation"
        echo(f"no trial reached {cfg.target.text} yet{note}")
    else:
        best_params = dict(best.user_attrs.get(record.PARAMS, {})) or dict(best.params)
        summary["best_tta_s"] = best.value
        summary["best_trial"] = best.number
        echo(f"best: trial {best.number}, time to {cfg.target.text}: "
             f"{best.value:.2f} s")
        for key, value in best_params.items():
            echo(f"  {key} = {short(value)}")
        model = model_note(best, (cfg.run_dir,))
        if model:
            echo(f"  model: {model}")
    tracker.study_plots(study, cfg.target.metric, cfg.target.value, final=True,
                        falls=cfg.target.falls)
    tracker.end_study(summary, best_params,
                      best_model="" if best is None or best.user_attrs.get(record.OUTCOME)
                      != "reached" else str(best.user_attrs.get(record.MODEL) or ""))
    delivered = tracker.close(timeout_s=60)
    if tracker.outbox.refused:
        echo(f"MLflow refused {tracker.outbox.refused} record(s) for good; they are in "
             f"{tracker.outbox.spool.with_name('mlflow-refused.jsonl')} with the reasons")
    if not delivered:
        why = tracker.outbox.last_error or ""
        if tracker.outbox.denied is not None:
            advice = access_advice(tracker.outbox.denied, uri=tracker.uri)
            echo(f"MLflow at {redact(tracker.uri)}: {advice}; {tracker.outbox.pending} "
                 f"record(s) wait in {tracker.outbox.spool} for a run of this study that it "
                 "accepts")
        else:
            state = (f"did not take the records ({why})" if "MLflow's trash" in why
                     else "is unreachable")
            echo(f"MLflow at {redact(tracker.uri)} {state}: {tracker.outbox.pending} record(s) "
                 f"wait in {tracker.outbox.spool}; the next run of this study delivers them")
    experiment = tracker.experiment_name
    if experiment != cfg.study_name:
        echo(f"review the study in the MLflow UI (experiment {experiment!r}: "
             f"{cfg.study_name!r} holds another study's records):")
    else:
        echo("review the study in the MLflow UI:")
    echo(f"  {ui_command(cfg.tracking_uri, experiment)}")
    return 0


def model_note(trial: FrozenTrial, run_dirs: tuple[str, ...] = ()) -> str:
    """Where ``trial``'s saved model is (``autotune.load_model`` reads it): its path, or
    where it lies now in one of ``run_dirs`` (the study's run folder, moved with its project
    since), with the machine it is on where that is not this one or the file is gone; "" if
    it saved none."""
    path = trial.user_attrs.get(record.MODEL)
    if not path:
        return ""
    if Path(path).is_file():
        return str(path)
    tail = Path(*Path(path).parts[-3:])     # STUDY/trial-N/model.pt under the run folder
    for folder in run_dirs:
        if (Path(folder) / tail).is_file():
            return str((Path(folder) / tail).resolve())
    hosts = trial.user_attrs.get(record.HOSTS) or []
    here = os.uname().nodename
    if hosts and hosts[0] != here:
        return f"{path} (on {hosts[0]})"
    return f"{path} (removed since)"


def quiet_libraries() -> None:
    """Keeps Optuna's and MLflow's own progress logs off the terminal."""
    import mlflow  # noqa: F401 - configures its loggers on import; quiet them afterwards

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
