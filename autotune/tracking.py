"""MLflow records of a study: one experiment, a parent run, a nested child run per trial.

All writes go through ``MlflowClient`` with explicit run ids (no fluent run stack), so many
workers can write at once. A failed write never stops the study: it is reported once as a
warning and the study goes on.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import Any

from .config import resolve_tracking_uri

__all__ = ["Tracker", "ui_command"]

log = logging.getLogger(__name__)
STUDY_TAG = "autotune.study"
KIND_TAG = "autotune.kind"
EVAL_METRICS = ("top1", "top5", "loss", "lr", "images_per_s", "elapsed_s", "epoch", "samples")


def ui_command(tracking_uri: str, port: int = 5000) -> str:
    """The shell command that opens the MLflow UI on this store."""
    uri, _ = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port {port}"


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = str(value)[:6000]


class Tracker:
    """Writes one study's records to MLflow."""

    def __init__(self, tracking_uri: str, study_name: str) -> None:
        from mlflow import MlflowClient

        self.uri, self._artifacts = resolve_tracking_uri(tracking_uri)
        self.study_name = study_name
        self._client = MlflowClient(tracking_uri=self.uri)
        self._lock = threading.Lock()
        self._warned = False
        self.experiment_id = ""
        self.parent_run_id = ""

    def _safe(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # MLflow down or refusing: the study goes on
            with self._lock:
                if not self._warned:
                    log.warning("MLflow write failed (%s): %s; the study goes on", what,
                                " ".join(str(e).split())[:300])
                    self._warned = True
            return None

    def start_study(self, tags: Mapping[str, str], params: Mapping[str, Any]) -> str:
        """Creates (or finds, on resume) the experiment and the study's parent run."""
        c = self._client
        exp = c.get_experiment_by_name(self.study_name)
        if exp is None:
            kwargs = {"artifact_location": f"{self._artifacts}/{self.study_name}"} \
                if self._artifacts else {}
            self.experiment_id = c.create_experiment(self.study_name, tags=dict(tags), **kwargs)
        else:
            self.experiment_id = exp.experiment_id
        found = c.search_runs([self.experiment_id],
                              filter_string=f"tags.`{KIND_TAG}` = 'study'", max_results=1)
        if found:
            self.parent_run_id = found[0].info.run_id
            c.update_run(self.parent_run_id, status="RUNNING")
        else:
            run = c.create_run(self.experiment_id, run_name=self.study_name,
                               tags={KIND_TAG: "study", STUDY_TAG: self.study_name, **tags})
            self.parent_run_id = run.info.run_id
            flat: dict[str, str] = {}
            _flat("", params, flat)
            self._log_params(self.parent_run_id, flat)
        return self.parent_run_id

    def _log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._client.log_batch(run_id, params=items[i:i + 100])

    def start_trial(self, number: int, params: Mapping[str, Any],
                    derived: Mapping[str, Any]) -> str | None:
        def create() -> str:
            run = self._client.create_run(
                self.experiment_id, run_name=f"trial-{number}",
                tags={"mlflow.parentRunId": self.parent_run_id, KIND_TAG: "trial",
                      STUDY_TAG: self.study_name, "optuna.trial_number": str(number),
                      "optuna.state": "RUNNING"})
            self._log_params(run.info.run_id, {**params, **derived})
            return run.info.run_id

        result: str | None = self._safe("start trial", create)
        return result

    def log_eval(self, run_id: str | None, report: Mapping[str, Any]) -> None:
        if not run_id:
            return
        from mlflow.entities import Metric

        step = int(report["index"])
        stamp = _now_ms()
        metrics = [Metric(k, float(report[k]), stamp, step) for k in EVAL_METRICS
                   if k in report and math.isfinite(float(report[k]))]
        self._safe("log evaluation", self._client.log_batch, run_id, metrics=metrics)

    def end_trial(self, run_id: str | None, *, state: str, outcome: str, reason: str,
                  metrics: Mapping[str, float], tags: Mapping[str, str] | None = None) -> None:
        if not run_id:
            return
        from mlflow.entities import Metric, RunTag

        stamp = _now_ms()
        all_tags = {"optuna.state": state, "autotune.outcome": outcome,
                    "autotune.stop_reason": reason, **(tags or {})}

        def write() -> None:
            self._client.log_batch(
                run_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in metrics.items()
                                 if v is not None and math.isfinite(float(v))],
                tags=[RunTag(k, str(v)) for k, v in all_tags.items()])
            self._client.set_terminated(run_id, "FAILED" if outcome == "failed" else "FINISHED")

        self._safe("end trial", write)

    def end_study(self, summary: Mapping[str, Any], best_params: Mapping[str, Any]) -> None:
        if not self.parent_run_id:
            return
        from mlflow.entities import Metric, RunTag

        stamp = _now_ms()

        def write() -> None:
            self._client.log_batch(
                self.parent_run_id,
                metrics=[Metric(k, float(v), stamp, 0) for k, v in summary.items()
                         if isinstance(v, (int, float)) and math.isfinite(float(v))],
                tags=[RunTag(f"best.{k}", str(v)) for k, v in best_params.items()])
            self._client.set_terminated(self.parent_run_id, "FINISHED")

        self._safe("end study", write)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
