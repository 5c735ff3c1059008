"""MLflow records of a study: one experiment, a parent run, a nested child run per trial.

All writes go through ``MlflowClient`` with explicit run ids (no fluent run stack), queued in
an on-disk outbox (:mod:`autotune._outbox`) and delivered by a background thread, so many
workers can write at once and an MLflow outage never stops training: records wait on disk
and arrive, once each, when MLflow is back.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import record
from ._moved_store import follow_move
from ._outbox import Outbox
from .config import redact, resolve_tracking_uri, sqlite_file, without_credentials

__all__ = ["Tracker", "connect", "follow_moved_store", "leaderboard", "run_name", "ui_command",
           "STUDY_KEY", "trial_key"]

log = logging.getLogger(__name__)
STUDY_TAG = "autotune.study"
KIND_TAG = "autotune.kind"
STUDY_KEY = "study"
EVAL_METRICS = ("top1", "top5", "loss", "lr", "images_per_s", "elapsed_s", "epoch", "samples",
                "image_size", "noise_scale")
# The keys of an evaluation report that are no metric of the model's.
_NOT_METRICS = ("type", "index", "step", "reached")


def connect(uri: str) -> Any:
    """An ``MlflowClient`` on ``uri``.

    MLflow creates or upgrades an SQLite store's schema when a client first opens it; two
    processes doing so at once (a study and its workers starting together) leave it
    half-migrated for good. On an SQLite file that step is taken under a lock file beside the
    database, one process at a time.
    """
    from mlflow import MlflowClient

    db = sqlite_file(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / f"{db.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)        # released when the file closes
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # the schema is made by the first query
        return client


def follow_moved_store(tracking_uri: str) -> str | None:
    """A local store (``tracking_uri`` a folder) moved or copied from another folder gets
    its artifact paths pointed into the folder it is in now (``_moved_store``), under the
    lock ``connect`` takes; the line that says so, or None where nothing had moved."""
    uri, artifacts = resolve_tracking_uri(tracking_uri)
    db = sqlite_file(uri)
    if artifacts is None or db is None or not db.is_file():
        return None
    import sqlite3

    try:
        with open(db.parent / f"{db.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            moved = follow_move(db)
    except (OSError, sqlite3.Error):   # read-only, locked for a minute, damaged: MLflow says
        return None
    if not moved:
        return None
    from urllib.parse import unquote, urlparse

    before = ", ".join(str(Path(unquote(urlparse(m).path)).parent) for m in moved)
    return (f"the MLflow store {db.parent} was moved or copied from {before}: its records "
            "now find their files where it is")


def trial_key(number: int) -> str:
    return f"trial-{number}"


def ui_command(tracking_uri: str, study: str) -> str:
    """The shell command that opens the MLflow UI on this store, at this study."""
    uri, artifacts = resolve_tracking_uri(tracking_uri)
    where = uri if artifacts is None else str(Path(tracking_uri).expanduser().resolve())
    if redact(where) != where:   # a tracking server's page: the browser asks for the password
        where = without_credentials(where)
    return f"autotune ui --tracking-uri {shlex.quote(where)} --study {shlex.quote(study)}"


def run_name(key: str, outcome: str, reason: str, metrics: Mapping[str, Any]) -> str:
    """A finished trial's run name: ``trial-3 reached 12.41 s``, ``trial-4 censored (bound)
    after 9.80 s``, ``trial-5 failed (diverged)``."""
    if outcome == "reached" and metrics.get("tta_s") is not None:
        return f"{key} reached {float(metrics['tta_s']):.2f} s"
    elapsed = metrics.get("total_elapsed_s")
    after = f" after {float(elapsed):.2f} s" if elapsed is not None else ""
    if outcome == "censored":
        return f"{key} censored ({reason}){after}"
    return f"{key} {outcome} ({reason})"


def leaderboard(trials: Sequence[Any], metric: str, target: float, top: int = 10,
                falls: bool = False) -> str:
    """The study's leaderboard as Markdown (the parent run's description): the trials that
    reached the target, fastest first, and how the others ended. ``falls``: the metric falls
    to the target (a loss)."""
    reached = sorted((t for t in trials if t.user_attrs.get(record.OUTCOME) == "reached"
                      and t.value is not None), key=lambda t: float(t.value))
    lines = [f"**Time to {metric} {'<=' if falls else '>='} {target}**", ""]
    if reached:
        lines += ["| rank | trial | TTA (s) | parameters |", "|---|---|---|---|"]
        for rank, t in enumerate(reached[:top], start=1):
            params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in t.user_attrs.get(record.PARAMS, t.params).items())
            lines.append(f"| {rank} | {t.number} | {float(t.value):.2f} | {params} |")
    else:
        lines.append("No trial has reached the target yet.")
    ended: dict[str, int] = {}
    for t in trials:
        outcome = t.user_attrs.get(record.OUTCOME)
        if outcome and outcome != "infeasible":
            ended[outcome] = ended.get(outcome, 0) + 1
    if ended:
        lines += ["", "Trials: " + ", ".join(f"{n} {k}" for k, n in sorted(ended.items()))]
    return "\n".join(lines)


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = str(value)[:6000]


def _now_ms() -> int:
    return int(time.time() * 1000)


class Tracker:
    """Writes one study's records to MLflow, through an outbox in ``folder``."""

    def __init__(self, tracking_uri: str, study_name: str, folder: Path,
                 experiment_tags: Mapping[str, str] | None = None,
                 uid: str | None = None) -> None:
        # autotune retries on its own schedule; MLflow's own retries would block for minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        # MLflow prints "View run ... at URL" on stdout as each run ends on a tracking server:
        # a line between autotune's own for every trial, with any password in the URL
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.uri, artifacts = resolve_tracking_uri(tracking_uri)
        self.study_name = study_name
        self.folder = folder
        self.uid = uid
        self.outbox = Outbox(self._connect, folder / "mlflow-outbox.jsonl", study_name,
                             dict(experiment_tags or {}), artifacts, uid=uid, uri=self.uri)

    def _connect(self) -> Any:
        return connect(self.uri)

    def _file(self, relative: str, text: str) -> Path:
        path = self.folder / "mlflow-files" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _log(self, key: str, *, metrics: Mapping[str, Any] | None = None, step: int = 0,
             params: Mapping[str, Any] | None = None,
             tags: Mapping[str, Any] | None = None) -> None:
        stamp = _now_ms()
        rows = [[k, float(v), stamp, step] for k, v in (metrics or {}).items()
                if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))]
        self.outbox.submit({"op": "log", "run": key, "metrics": rows,
                            "params": {k: str(v)[:6000] for k, v in (params or {}).items()},
                            "tags": {k: str(v)[:5000] for k, v in (tags or {}).items()}})

    def start_study(self, tags: Mapping[str, str], config: Mapping[str, Any],
                    space: Mapping[str, Any], resumed: bool) -> None:
        """The study's parent run: created once, marked running again on resume."""
        self.outbox.submit({"op": "create_run", "key": STUDY_KEY, "name": self.study_name,
                            "tags": {KIND_TAG: "study", STUDY_TAG: self.study_name, **tags},
                            "start_ms": _now_ms()})
        if resumed:
            self.outbox.submit({"op": "status", "run": STUDY_KEY, "status": "RUNNING"})
            return
        flat: dict[str, str] = {}
        _flat("", {"config": config}, flat)
        self._log(STUDY_KEY, params=flat)
        for name, data in (("study_config.json", config), ("search_space.json", space)):
            path = self._file(f"study/{name}", json.dumps(data, indent=2, default=str))
            self.outbox.submit({"op": "artifact", "run": STUDY_KEY, "path": str(path)})

    def start_trial(self, number: int, params: Mapping[str, Any], derived: Mapping[str, Any],
                    plan: Mapping[str, Any], attempt: int = 1,
                    tags: Mapping[str, str] | None = None) -> str:
        key = trial_key(number)
        self.outbox.submit({"op": "create_run", "key": key, "name": key, "parent": STUDY_KEY,
                            "tags": {KIND_TAG: "trial", STUDY_TAG: self.study_name,
                                     "optuna.trial_number": str(number),
                                     "optuna.state": "RUNNING", "autotune.attempt": str(attempt),
                                     **(tags or {})},
                            "start_ms": _now_ms()})
        self._log(key, params={**params, **derived})
        path = self._file(f"{key}/plan.json", json.dumps(plan, indent=2))
        self.outbox.submit({"op": "artifact", "run": key, "path": str(path)})
        return key

    def log_start(self, key: str, report: Mapping[str, Any]) -> None:
        self._log(key, metrics={"setup_s": report.get("setup_s")},
                  tags={"autotune.hosts": ",".join(report.get("hosts", [])),
                        "autotune.ranks_trial": str(report.get("served", 1))})

    def log_eval(self, key: str, report: Mapping[str, Any]) -> None:
        """An evaluation's metrics: autotune's (``EVAL_METRICS``) and every other number a
        script of the user's own reported with them (its own target metric, an F1 score)."""
        own = {k: v for k, v in report.items() if k not in _NOT_METRICS
               and isinstance(v, int | float) and not isinstance(v, bool)
               and math.isfinite(v) and re.fullmatch(r"[A-Za-z0-9_.\-/ ]{1,250}", str(k))}
        self._log(key, metrics={**own, **{k: report[k] for k in EVAL_METRICS if k in report}},
                  step=int(report["index"]))

    def end_trial(self, key: str, *, state: str, outcome: str, reason: str,
                  metrics: Mapping[str, float], curve: Sequence[Sequence[Any]],
                  metric: str, target: float, detail: str = "") -> None:
        from .plots import learning_curve

        tags = {"optuna.state": state, "autotune.outcome": outcome,
                "autotune.stop_reason": reason,
                # the runs table lists runs by name: the outcome reads there at a glance
                "mlflow.runName": run_name(key, outcome, reason, metrics)}
        if metrics.get("tta_s") is not None:
            tags["autotune.tta_s"] = f"{float(metrics['tta_s']):.3f}"
        if detail:
            tags["autotune.detail"] = detail[:500]
        self._log(key, metrics=metrics, tags=tags)
        if curve:
            title = f"{key}: {outcome}" + (f" ({reason})" if reason != outcome else "")
            path = learning_curve(curve, metric, target, title,
                                  self.folder / "mlflow-files" / key / "learning_curve.png")
            self.outbox.submit({"op": "artifact", "run": key, "path": str(path)})
        self.outbox.submit({"op": "status", "run": key, "end_ms": _now_ms(),
                            "status": "FAILED" if outcome == "failed" else "FINISHED"})

    def lost_trial(self, key: str, worker: str, run_dir: Path) -> None:
        """Closes the run of a trial whose worker died: first what that worker left in its
        outbox is delivered (its run keys make a second delivery harmless), then the run is
        marked failed with the reason ``worker_lost``."""
        spool = run_dir / f"worker-{worker}" / "mlflow-outbox.jsonl"
        if spool.is_file():
            from ._outbox import Outbox

            left = Outbox(self._connect, spool, self.study_name, uid=self.uid, uri=self.uri)
            if not left.close(timeout_s=60):
                log.warning("MLflow records of lost worker %s are still in %s", worker, spool)
        self._log(key, tags={"optuna.state": "FAIL", "autotune.outcome": "failed",
                             "autotune.stop_reason": "worker_lost",
                             "autotune.detail": f"worker {worker} stopped sending heartbeats; "
                                                "the trial resumed in a new run"})
        self.outbox.submit({"op": "status", "run": key, "end_ms": _now_ms(),
                            "status": "FAILED"})

    def known_run_id(self, key: str) -> str | None:
        """The MLflow run id of ``key`` if its run has been created already."""
        return self.outbox.known_run_id(key)

    def study_plots(self, study: Any, metric: str, target: float, final: bool = False,
                    falls: bool = False) -> None:
        """Refreshes the study's overview plots on the parent run."""
        from .plots import study_plots

        try:
            files = study_plots(study, metric, target, self.folder / "mlflow-files" / "plots",
                                interactive=final)
        except Exception as e:  # noqa: BLE001 - a plot is never worth stopping a study for
            log.warning("could not draw the study plots: %s", e)
            return
        for path in files:
            self.outbox.submit({"op": "artifact", "run": STUDY_KEY, "path": str(path),
                                "folder": "plots"})
        trials = study.get_trials(deepcopy=False)
        self._log(STUDY_KEY, tags={"mlflow.note.content": leaderboard(trials, metric, target,
                                                                      falls=falls)})

    def end_study(self, summary: Mapping[str, Any], best_params: Mapping[str, Any],
                  best_model: str = "") -> None:
        tags = {f"best.{k}": v for k, v in best_params.items()}
        if best_model:
            tags["autotune.best_model_path"] = best_model
        self._log(STUDY_KEY, metrics=summary, tags=tags)
        self.outbox.submit({"op": "status", "run": STUDY_KEY, "status": "FINISHED",
                            "end_ms": _now_ms()})

    def close(self, timeout_s: float = 60.0) -> bool:
        """Delivers what is queued (waiting up to ``timeout_s``); False if some is left."""
        return self.outbox.close(timeout_s)

    def experiment_id(self) -> str | None:
        try:
            return self.outbox.experiment_id()
        except Exception:  # noqa: BLE001 - MLflow unreachable
            return None

    @property
    def experiment_name(self) -> str:
        """The study's MLflow experiment: its name, or ``NAME-2`` ... where another study's
        records hold that name (known once MLflow was reached; the study's name before)."""
        return self.outbox.experiment_name or self.study_name
