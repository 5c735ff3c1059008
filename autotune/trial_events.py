"""Who hears of a trial besides the study store: listeners of the trial runner's events.

The runner announces each trial's life (``begun``, ``planned``, each ``report`` of its
trainer, ``ended``, and the study after it) and knows nothing of what listens:

* ``MlflowListener``: the trial's MLflow run (parameters, the plan, per-evaluation curves, the
  outcome) and the study's plots;
* ``RegistryListener``: the worker registry's attempt records (running, its checkpoints, how
  it ended), which let a resumption find a dead worker's latest checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from . import record
from .decisions import TrialResult, best_of, optuna_state
from .tracking import Tracker, trial_key

__all__ = ["MlflowListener", "RegistryListener", "TrialListener", "attempt_of"]

_TIMES = ("setup_s", "train_s", "eval_s", "control_s", "wall_s", "noise_scale",
          "unreadable_images")


def attempt_of(trial: optuna.Trial) -> int:
    """Which attempt at its configuration ``trial`` is (1, or more for a resumption)."""
    return len(trial.user_attrs.get(record.LINEAGE, [])) + 1


class TrialListener:
    """A listener hears what it overrides; every event is a no-op here."""

    def begun(self, trial: optuna.Trial, downtime: float | None) -> None:
        """The trial was asked for and is about to be planned."""

    def planned(self, trial: optuna.Trial, params: dict[str, Any], derived: dict[str, Any],
                plan: dict[str, Any]) -> None:
        """Its plan was resolved and written; its trainer starts next."""

    def report(self, trial: optuna.Trial, kind: str, msg: dict[str, Any]) -> None:
        """A ``start``, ``eval`` or ``checkpoint`` report of its trainer was recorded."""

    def ended(self, trial: optuna.Trial, result: TrialResult) -> None:
        """It ended with ``result`` (before the outcome is told to the study)."""

    def told(self, trial: optuna.Trial, result: TrialResult, told: bool) -> None:
        """Its outcome was told to the study (``told`` False: it had been ended elsewhere, and
        this outcome was not recorded)."""

    def aborted(self, trial: optuna.Trial) -> None:
        """The runner stopped with the trial unfinished (an exception, the worker stopping)."""

    def study_changed(self, study: optuna.Study) -> None:
        """A trial's outcome is in the study."""


class MlflowListener(TrialListener):
    """Each trial's MLflow run, and the study's plots on its parent run."""

    def __init__(self, tracker: Tracker, run_dir: Path, metric: str, target: float,
                 falls: bool = False) -> None:
        self.tracker, self.run_dir = tracker, run_dir
        self.metric, self.target, self.falls = metric, target, falls
        self._keys: dict[int, str] = {}

    def begun(self, trial: optuna.Trial, downtime: float | None) -> None:
        attrs = trial.user_attrs
        if attrs.get(record.LOST_RUN_KEY):
            self.tracker.lost_trial(str(attrs[record.LOST_RUN_KEY]),
                                    str(attrs.get(record.LOST_WORKER)), self.run_dir)

    def planned(self, trial: optuna.Trial, params: dict[str, Any], derived: dict[str, Any],
                plan: dict[str, Any]) -> None:
        lineage = list(trial.user_attrs.get(record.LINEAGE, []))
        key = self.tracker.start_trial(
            trial.number, params, derived, plan, attempt=len(lineage) + 1,
            tags={"autotune.resume_of": str(lineage[-1])} if lineage else None)
        self._keys[trial.number] = key
        trial.set_user_attr(record.RUN_KEY, key)

    def report(self, trial: optuna.Trial, kind: str, msg: dict[str, Any]) -> None:
        key = self._keys.get(trial.number)
        if key is None:
            return
        if kind == "start":
            self.tracker.log_start(key, msg)
        elif kind == "eval":
            self.tracker.log_eval(key, msg)

    def ended(self, trial: optuna.Trial, result: TrialResult) -> None:
        key = self._keys.pop(trial.number, None)
        if key is None:
            return
        final = {"reached_target": 1.0 if result.outcome == "reached" else 0.0}
        best = best_of(result)      # none before any evaluation
        if best is not None:
            final["best_" + self.metric] = best
        if result.outcome == "reached":
            final["tta_s"] = float(result.value or 0.0)
        final.update({k: result.summary[k] for k in _TIMES if k in result.summary})
        if "elapsed_s" in result.summary:  # the per-evaluation series keeps its own name
            final["total_elapsed_s"] = result.summary["elapsed_s"]
        self.tracker.end_trial(key, state=optuna_state(result), outcome=result.outcome,
                               reason=result.reason, metrics=final, curve=result.curve,
                               metric=self.metric, target=self.target, detail=result.detail)

    def aborted(self, trial: optuna.Trial) -> None:
        self._keys.pop(trial.number, None)

    def study_changed(self, study: optuna.Study) -> None:
        self.tracker.study_plots(study, self.metric, self.target, falls=self.falls)

    def run_id(self, trial: optuna.Trial) -> str | None:
        """The MLflow run id of the trial's run, once MLflow has it."""
        return self.tracker.known_run_id(trial_key(trial.number))


class RegistryListener(TrialListener):
    """The worker registry's record of each attempt (``control.WorkerSession``)."""

    def __init__(self, session: Any, mlflow: MlflowListener | None = None) -> None:
        self.session, self.mlflow = session, mlflow

    def _record(self, trial: optuna.Trial, **fields: Any) -> None:
        self.session.attempt(trial.number, attempt_of(trial), **fields)

    def begun(self, trial: optuna.Trial, downtime: float | None) -> None:
        lineage = trial.user_attrs.get(record.LINEAGE, [])
        self._record(trial, status="running", downtime_s=downtime,
                     resume_of=lineage[-1] if lineage else None,
                     mlflow_run_id=trial_key(trial.number) if self.mlflow else None)

    def report(self, trial: optuna.Trial, kind: str, msg: dict[str, Any]) -> None:
        if kind == "checkpoint":
            self._record(trial, checkpoint_path=str(msg["path"]),
                         elapsed_s=float(msg["elapsed_s"]))

    def told(self, trial: optuna.Trial, result: TrialResult, told: bool) -> None:
        status = "interrupted" if result.reason == "interrupted" else "finished"
        self._record(trial, status=status if told else "abandoned",
                     elapsed_s=result.summary.get("elapsed_s"),
                     mlflow_run_id=self.mlflow.run_id(trial) if self.mlflow else None)

    def aborted(self, trial: optuna.Trial) -> None:
        self._record(trial, status="finished")
