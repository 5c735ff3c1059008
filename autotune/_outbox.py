"""Delivers MLflow writes in order, surviving an MLflow that is down for a while.

Every write is an operation (a JSON-ready dict) appended to a spool file on disk before any
delivery is tried; a background thread delivers operations in order and removes them from the
spool only once MLflow has accepted them. If MLflow is unreachable, the thread backs off and
tries again; if the process dies, the next one for the same study delivers what is left.

Nothing is lost and nothing is written twice: runs are created under a key (the tag
``autotune.run_key``) and found again by it before any new run is created, metrics carry their
own timestamps (MLflow stores an identical metric once), and params and tags are idempotent.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._preflight import access_advice
from .config import redact

__all__ = ["Outbox", "RUN_KEY_TAG", "UID_TAG", "denied", "refused"]

log = logging.getLogger(__name__)
RUN_KEY_TAG = "autotune.run_key"
UID_TAG = "autotune.study_uid"     # the study an experiment records (``record.STUDY_UID``)
_MAX_BACKOFF_S = 30.0


# MLflow's answers that no retry changes (a request it judged wrong, a run no longer active)
_REFUSALS = ("INVALID_PARAMETER_VALUE", "BAD_REQUEST", "INVALID_STATE")
# what writing a local artifact path answers where this machine cannot write it
_NO_LOCAL_WRITE = (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS)


def refused(op: dict[str, Any], error: BaseException) -> str | None:
    """Why MLflow will never take ``op`` (None: retry it, MLflow may be away): a request it
    refuses as wrong (a param changed, a run ended or deleted in its UI), or an artifact for a
    store this machine cannot write: a tracking server started without --serve-artifacts hands
    its clients a path on its own machine."""
    code = getattr(error, "error_code", None)
    if type(error).__module__.startswith("mlflow") and code in _REFUSALS:
        return f"MLflow refuses a record ({code})"
    if op.get("op") == "artifact" and isinstance(error, OSError) and \
            error.errno in _NO_LOCAL_WRITE and not type(error).__module__.startswith(
                ("requests", "urllib3")):
        return ("MLflow's artifact store cannot be written from this machine: the study's "
                "files stay in its run folder (mlflow-files) and are not uploaded; start "
                "`mlflow server` with --serve-artifacts (its default), or an artifact root "
                "this machine can write")
    return None


def denied(error: BaseException) -> int | None:
    """401 or 403 where the tracking server refused this client (its credentials, or their
    rights), not a record: the records wait, as for an outage, until one that it accepts runs
    the study (MLflow's client reads them from the environment). None for any other error."""
    if type(error).__module__.startswith("mlflow") and hasattr(error, "get_http_status_code"):
        status = error.get_http_status_code()
    else:   # an artifact upload raises the HTTP error of ``requests``
        status = getattr(getattr(error, "response", None), "status_code", None)
    return status if status in (401, 403) else None


class DeletedExperiment(RuntimeError):
    """The study's MLflow experiment is in MLflow's trash."""


def deleted_experiment(name: str, experiment_id: str, uri: str | None = None) -> str:
    """What to do about the study's experiment ``name`` found in MLflow's trash, with the
    commands for the store at ``uri`` where it is known."""
    env = f"MLFLOW_TRACKING_URI={shlex.quote(uri)} " if uri else ""
    store = f" --backend-store-uri {shlex.quote(uri)}" if uri else ""
    return (f"the MLflow experiment {name!r} is deleted (in MLflow's trash): restore it "
            f"({env}mlflow experiments restore -x {experiment_id}), delete it for good "
            f"({env}mlflow gc{store} --experiment-ids {experiment_id}), or give the study "
            "another study_name")


class Outbox:
    """An ordered, persistent queue of MLflow operations, delivered by a background thread."""

    def __init__(self, connect: Callable[[], Any], spool: Path, experiment: str,
                 experiment_tags: dict[str, str] | None = None,
                 artifact_location: str | None = None, uid: str | None = None,
                 uri: str = "") -> None:
        """``uri``: the tracking URI ``connect`` uses, for what a refusal of its credentials
        says (``_preflight.access_advice``)."""
        self._connect = connect             # makes the MlflowClient, in the delivery thread
        self._uri = uri
        self._connected: Any = None
        self._spool = spool
        self._experiment = experiment
        self._uid = uid
        self._experiment_tags = dict(experiment_tags or {})
        if uid is not None:
            self._experiment_tags[UID_TAG] = uid
        self.experiment_name: str | None = None   # the experiment's name, once found or made
        self.refused = 0                   # records MLflow refused for good, set aside
        self._told: set[str] = set()
        self._refused_runs: set[str] = set()
        self._artifact_location = artifact_location
        self._experiment_id: str | None = None
        self._lock = threading.Condition()
        self._pending: list[dict[str, Any]] = self._load()
        self._runs: dict[str, str] = {}
        self._failing_since: float | None = None
        self.last_error: str | None = None   # why the latest delivery failed
        self.denied: int | None = None       # 401 / 403: the server refuses this client
        self._unsaved = False                # the spool could not be rewritten (said once)
        self._closed = False
        self._thread = threading.Thread(target=self._deliver_forever, daemon=True,
                                        name="autotune-mlflow")
        self._thread.start()

    # -- queue --------------------------------------------------------------------------------
    def _load(self) -> list[dict[str, Any]]:
        if not self._spool.is_file():
            return []
        ops = []
        for line in self._spool.read_text().splitlines():
            try:
                ops.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash mid-write: its operation never returned
        return ops

    def _save(self) -> None:
        """Rewrites the spool to what is left. Where that cannot be written (a full disk), the
        delivered records stay in it, said once: the next run of the study delivers them
        again, which changes nothing (each record is idempotent), and none is lost."""
        tmp = self._spool.with_suffix(".tmp")
        try:
            self._spool.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text("".join(json.dumps(op) + "\n" for op in self._pending))
            os.replace(tmp, self._spool)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if not self._unsaved:
                log.warning("the MLflow outbox %s cannot be rewritten (%s): the records "
                            "delivered stay in it, and the next run of the study delivers "
                            "them again, harmlessly", self._spool, e.strerror or e)
            self._unsaved = True

    def submit(self, op: dict[str, Any]) -> None:
        """Queues ``op``; it is on disk when this returns."""
        with self._lock:
            self._pending.append(op)
            self._spool.parent.mkdir(parents=True, exist_ok=True)
            try:
                with self._spool.open("a") as f:
                    f.write(json.dumps(op) + "\n")
            except OSError as e:    # a write names no file: the error the user sees does
                raise OSError(e.errno, e.strerror, str(self._spool)) from e
            self._lock.notify_all()

    @property
    def spool(self) -> Path:
        return self._spool

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self, timeout_s: float) -> bool:
        """Waits until everything is delivered or ``timeout_s`` passes; True when delivered."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._lock.notify_all()
            while self._pending and time.monotonic() < deadline:
                self._lock.wait(min(0.2, max(deadline - time.monotonic(), 0.01)))
            return not self._pending

    def close(self, timeout_s: float = 30.0) -> bool:
        delivered = self.flush(timeout_s)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(5)
        return delivered

    # -- delivery -----------------------------------------------------------------------------
    def _deliver_forever(self) -> None:
        backoff = 0.5
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if self._closed and not self._pending:
                    return
                op = self._pending[0]
            try:
                self._apply(op)
            except Exception as e:  # noqa: BLE001 - MLflow down or refusing: retry later
                # MLflow's errors quote the URL, with any password in it
                said = redact(" ".join(str(e).split()))
                refusal = refused(op, e)
                if refusal is None and isinstance(e, LookupError) and \
                        op.get("run") in self._refused_runs:
                    refusal = "MLflow refused to create a run, so its records are set aside"
                if refusal is not None:    # no outage: waiting would hold every later record
                    try:
                        self._set_aside(op, refusal, said)
                        continue
                    except OSError as kept:   # a full disk: it waits, as for an outage
                        said = f"{said}; setting it aside failed: {kept.strerror or kept}"
                self.last_error = said[:300]
                self.denied = denied(e)
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    if self.denied is not None:
                        log.warning("%s; records are kept in %s and delivered by a run of the "
                                    "study that it accepts",
                                    access_advice(self.denied, uri=self._uri), self._spool)
                    else:
                        log.warning("MLflow is unreachable (%s); records are kept in %s and "
                                    "delivered when it is back", said[:200], self._spool)
                with self._lock:
                    if self._closed:
                        return
                    self._lock.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            if self._failing_since is not None:
                log.warning("MLflow is back after %.0f s; delivering the kept records",
                            time.monotonic() - self._failing_since)
                self._failing_since = None
            self.last_error = None
            self.denied = None
            backoff = 0.5
            with self._lock:
                self._pending.pop(0)
                self._save()
                self._lock.notify_all()

    def _set_aside(self, op: dict[str, Any], refusal: str, said: str) -> None:
        """Moves ``op``, which MLflow refused for good, from the queue to
        ``mlflow-refused.jsonl`` beside it (with why), saying so once per kind of refusal."""
        aside = self._spool.with_name("mlflow-refused.jsonl")
        with self._lock:
            with aside.open("a") as f:
                f.write(json.dumps({"op": op, "error": said[:500]}) + "\n")
            self._pending.pop(0)
            self._save()
            self._lock.notify_all()
        if op.get("op") == "create_run":
            self._refused_runs.add(str(op.get("key")))
        self.refused += 1
        if refusal not in self._told:
            self._told.add(refusal)
            log.warning("%s (%s); such records are set aside in %s, the others delivered",
                        refusal, said[:200], aside)

    @property
    def _client(self) -> Any:
        """The MLflow client, made on first delivery: making one may reach a database that is
        down, which is retried like any other delivery, never raised where training runs."""
        if self._connected is None:
            self._connected = self._connect()
        return self._connected

    def known_run_id(self, key: str) -> str | None:
        """The run id of ``key`` if this outbox created or found it already; no MLflow call."""
        return self._runs.get(key)

    def run_id(self, key: str) -> str:
        """The MLflow run id of run ``key`` (created by an earlier ``create_run``)."""
        if key not in self._runs:
            found = self._client.search_runs(
                [self.experiment_id()], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                max_results=1)
            if not found:
                raise LookupError(f"no MLflow run with key {key!r} yet")
            self._runs[key] = found[0].info.run_id
        return self._runs[key]

    def experiment_id(self) -> str:
        """The study's experiment, created on first use. One in MLflow's trash (deleted in
        its UI) takes no run: ``DeletedExperiment`` says so, and the records wait.

        A study with a ``uid`` records to the experiment tagged with it; where there is none
        yet, to a new one named after the study, or, where that name is taken by another
        study's experiment (a study of the same name in another store, or one whose store was
        deleted to start over), ``NAME-2``, ``NAME-3``, ...: its records never land in another
        study's runs. Without a uid (a study begun before autotune kept one), the experiment
        of the study's name."""
        if self._experiment_id is None:
            if self._uid is None:
                exp = self._client.get_experiment_by_name(self._experiment)
                if exp is None:
                    self._experiment_id = self._create(self._experiment)
                else:
                    self._experiment_id = self._usable(exp)
                self.experiment_name = self._experiment
            else:
                self._experiment_id = self._own_experiment()
        return self._experiment_id

    def _usable(self, exp: Any) -> str:
        if getattr(exp, "lifecycle_stage", "active") == "deleted":
            raise DeletedExperiment(deleted_experiment(exp.name, str(exp.experiment_id)))
        return str(exp.experiment_id)

    def _create(self, name: str) -> str:
        kwargs = {}
        if self._artifact_location:
            kwargs["artifact_location"] = f"{self._artifact_location}/{name}"
        return str(self._client.create_experiment(name, tags=self._experiment_tags, **kwargs))

    def _own_experiment(self) -> str:
        from mlflow.entities import ViewType

        for _ in range(100):
            found = self._client.search_experiments(
                view_type=ViewType.ALL, filter_string=f"tags.`{UID_TAG}` = '{self._uid}'")
            if found:
                exp = min(found, key=lambda e: int(e.experiment_id) if str(
                    e.experiment_id).isdigit() else 0)
                self.experiment_name = str(exp.name)
                return self._usable(exp)
            number = 1
            name = self._experiment
            while self._client.get_experiment_by_name(name) is not None:  # deleted ones too
                number += 1
                name = f"{self._experiment}-{number}"
            try:
                made = self._create(name)
            except Exception:  # noqa: BLE001 - made meanwhile (by a worker of this study?)
                if self._client.get_experiment_by_name(name) is None:
                    raise                   # not a name taken: MLflow's own error stands
                continue
            if name != self._experiment:
                log.warning("the MLflow experiment %r holds another study's records (a study "
                            "of that name in another store, or one whose store was deleted); "
                            "this study records to %r", self._experiment, name)
            self.experiment_name = name
            return made
        raise RuntimeError(f"no free MLflow experiment name after {self._experiment!r}")

    def _apply(self, op: dict[str, Any]) -> None:
        handler: Callable[[dict[str, Any]], None] = getattr(self, f"_op_{op['op']}")
        handler(op)

    def _op_create_run(self, op: dict[str, Any]) -> None:
        key = op["key"]
        try:
            self.run_id(key)
            return  # created before (perhaps by a delivery whose answer was lost)
        except LookupError:
            pass
        tags = dict(op.get("tags") or {})
        parent = op.get("parent")
        if parent:
            tags["mlflow.parentRunId"] = self.run_id(parent)
        tags[RUN_KEY_TAG] = key
        run = self._client.create_run(self.experiment_id(), run_name=op.get("name"),
                                      tags=tags, start_time=op.get("start_ms"))
        self._runs[key] = run.info.run_id

    def _op_log(self, op: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.run_id(op["run"])
        metrics = [Metric(k, v, ts, step) for k, v, ts, step in op.get("metrics", [])]
        params = [Param(k, v) for k, v in op.get("params", {}).items()]
        tags = [RunTag(k, v) for k, v in op.get("tags", {}).items()]
        for i in range(0, max(len(metrics), len(params), len(tags), 1), 100):
            self._client.log_batch(run_id, metrics=metrics[i:i + 100],
                                   params=params[i:i + 100], tags=tags[i:i + 100])

    def _op_artifact(self, op: dict[str, Any]) -> None:
        path = Path(op["path"])
        if path.is_file():
            self._client.log_artifact(self.run_id(op["run"]), str(path), op.get("folder"))

    def _op_status(self, op: dict[str, Any]) -> None:
        run_id = self.run_id(op["run"])
        if op["status"] == "RUNNING":
            self._client.update_run(run_id, status="RUNNING")
        else:
            self._client.set_terminated(run_id, op["status"], end_time=op.get("end_ms"))
