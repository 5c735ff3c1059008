"""`autotune server`: serve a study database to many workers through one process.

* Optuna's gRPC storage proxy over a cached storage, so hundreds of workers share a handful of
  database connections. Calls that find the database away (PostgreSQL restarting) wait for it
  with backoff instead of failing the worker's call.
* A control channel on the same port: the worker registry and heartbeats
  (:mod:`autotune.control`), stored in autotune's tables beside Optuna's.
* A control loop that gives up silent workers and queues their trials to resume from their
  last checkpoint on another worker.

Every call, storage and control alike, must carry the server's secret when it has one, over
TLS when it is given a certificate; without a secret it binds loopback only unless told it is
insecure on purpose (``autotune._channel`` says how both ends agree).
"""

from __future__ import annotations

import copy
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from optuna.trial import TrialState

from ._channel import (
    LOOPBACK,
    STATES_KEY,
    Address,
    ServerSecurity,
    check_port,
    is_server_url,
)
from ._control_loop import ControlLoop
from ._retry import RetryingStorage
from .config import database_url, redact
from .errors import ConfigError
from .store import check_database, mysql_long_text, storage_problem

__all__ = ["serve", "open_database"]


def open_database(storage_url: str) -> Any:
    """Optuna's RDB storage for ``storage_url``, with the trial snapshots many workers share,
    riding out database restarts."""
    from optuna.storages import RDBStorage

    rdb = RDBStorage(database_url(storage_url),
                     engine_kwargs={"pool_pre_ping": True, "pool_size": 8, "max_overflow": 8})
    mysql_long_text(rdb.engine)
    # A short patience: a worker's call fails soon with "unavailable" and the worker keeps
    # what it wanted to write, instead of its trainer waiting on a call held here.
    return _Snapshots(rdb, f"the study database {redact(storage_url)}",  # type: ignore[abstract]
                      patience_s=2.0)


SNAPSHOT_S = 1.0    # how stale the other trials a worker sees (for its pruning decision) may be


class _Study:
    def __init__(self) -> None:
        self.trials: dict[int, Any] = {}           # number: frozen trial
        self.ordered: list[Any] = []
        self.unfinished: set[int] = set()          # trial ids
        self.last_finished = -1                    # highest finished trial id seen
        self.read_at = -1e9
        self.refresh = threading.Lock()


class _Snapshots(RetryingStorage):
    """The server's study store. One read of a study's changed trials serves every worker
    that asks within SNAPSHOT_S, so hundreds of workers polling for pruning decisions cost a
    few database reads a second, not hundreds; reads and writes run concurrently on a pool of
    connections (no lock is held over a database call). A finished trial, which never changes,
    is served from memory; a running one is read fresh by ``get_trial``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._studies: dict[int, _Study] = {}
        self._merge = threading.Lock()
        self._finished: dict[int, Any] = {}        # trial id: frozen trial
        self._directions: dict[int, Any] = {}
        self._ids: dict[str, int] = {}

    def _study(self, study_id: int) -> _Study:
        study = self._studies.get(study_id)
        if study is None:
            self._call("get_study_name_from_id", study_id)   # KeyError if there is none
            study = self._studies.setdefault(study_id, _Study())
        return study

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Any = None) -> list[Any]:
        study = self._study(study_id)
        # One refresh at a time; while it runs, the others are served the snapshot it will
        # replace (only the very first read waits for one).
        if (time.monotonic() - study.read_at > SNAPSHOT_S
                and study.refresh.acquire(blocking=study.read_at < 0)):
            try:
                if time.monotonic() - study.read_at > SNAPSHOT_S:
                    self._refresh(study_id, study)
            finally:
                study.refresh.release()
        trials = study.ordered
        if states is not None:
            trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else list(trials)

    def _refresh(self, study_id: int, study: _Study) -> None:
        started = time.monotonic()
        with self._merge:
            included, floor = set(study.unfinished), study.last_finished
        fresh = self._call("_get_trials", study_id, states=None, included_trial_ids=included,
                           trial_id_greater_than=floor)
        with self._merge:
            for trial in fresh:
                study.trials[trial.number] = trial
                if trial.state.is_finished():
                    study.unfinished.discard(trial._trial_id)
                    study.last_finished = max(study.last_finished, trial._trial_id)
                    self._finished[trial._trial_id] = trial
                else:
                    study.unfinished.add(trial._trial_id)
            if fresh:
                study.ordered = [study.trials[n] for n in sorted(study.trials)]
            study.read_at = started

    def get_study_directions(self, study_id: int) -> Any:   # never change: kept
        if study_id not in self._directions:
            self._directions[study_id] = self._call("get_study_directions", study_id)
        return self._directions[study_id]

    def get_study_id_from_name(self, study_name: str) -> int:
        if study_name not in self._ids:
            self._ids[study_name] = self._call("get_study_id_from_name", study_name)
        return self._ids[study_name]

    def delete_study(self, study_id: int) -> None:
        self._call("delete_study", study_id)
        self._studies.pop(study_id, None)
        self._directions.pop(study_id, None)
        self._ids = {k: v for k, v in self._ids.items() if v != study_id}

    def create_new_trial(self, study_id: int, template_trial: Any = None) -> int:
        # A worker's ask sends a RUNNING template that holds its mark (``_retry``), stamped
        # on the worker's clock; stamped here instead, as Optuna's own ask through this server
        # is, so a trial's start and its end (stamped here when it is told) share one clock.
        if template_trial is not None and template_trial.state == TrialState.RUNNING:
            template_trial = copy.deepcopy(template_trial)
            template_trial.datetime_start = datetime.now()
        return super().create_new_trial(study_id, template_trial)

    def get_trial(self, trial_id: int) -> Any:
        done = self._finished.get(trial_id)
        if done is not None:
            return done
        return self._call("get_trial", trial_id)


class _SaysUnavailable:
    """Optuna's storage service, answering UNAVAILABLE (which workers retry, or keep their
    writes for later) while the database is away, instead of an unknown error."""

    def __init__(self, service: Any, storage: Any) -> None:
        self._service = service
        self._storage = storage
        self._protos: dict[int, tuple[Any, Any]] = {}   # trial id: (frozen trial, its proto)

    def GetTrials(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's name
        """Optuna's GetTrials, converting each trial of a snapshot to its message once."""
        import grpc
        from optuna.storages._grpc.auto_generated import api_pb2
        from optuna.storages._grpc.servicer import _to_proto_trial

        from ._retry import StoreUnavailable

        try:
            trials = self._storage.get_all_trials(request.study_id, deepcopy=False)
        except KeyError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except StoreUnavailable as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e)[:300])
        wanted = set(request.included_trial_ids)
        floor = request.trial_id_greater_than
        # autotune's own clients name the states they want: they get those, the trials that
        # finished, and the trials new to them; not every running trial again.
        states = next((value for key, value in context.invocation_metadata() or ()
                       if key == STATES_KEY), None)
        keep = None if states is None else set(states.split(","))
        out = []
        for t in trials:
            if keep is not None and not t.state.is_finished() and t.state.name not in keep \
                    and (t._trial_id in wanted or t._trial_id <= floor):
                continue
            if t._trial_id > floor or t._trial_id in wanted:
                known = self._protos.get(t._trial_id)
                if known is None or known[0] is not t:
                    known = (t, _to_proto_trial(t))
                    self._protos[t._trial_id] = known
                out.append(known[1])
        return api_pb2.GetTrialsReply(trials=out)

    def __getattr__(self, name: str) -> Any:
        import grpc

        from ._retry import StoreUnavailable

        method = getattr(self._service, name)
        if not callable(method) or name.startswith("_"):
            return method

        def call(request: Any, context: Any) -> Any:
            try:
                return method(request, context)
            except StoreUnavailable as e:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(e)[:300])

        return call


def serve(storage_url: str, host: str, port: int, echo: Callable[[str], None] = print,
          security: ServerSecurity | None = None) -> int:
    """Serves ``storage_url`` on ``host:port`` until SIGTERM or Ctrl-C. ``security``: its
    secret and TLS key pair (``_channel``); None: neither, which binds loopback only."""
    import grpc
    import optuna
    from optuna.storages._grpc.auto_generated import api_pb2_grpc
    from optuna.storages._grpc.servicer import OptunaStorageProxyService

    from .control import add_control_service
    from .db import Registry

    if is_server_url(storage_url):
        raise ConfigError("--storage must be a database URL, not another study server")
    address = Address(host, check_port(port, "--port"))
    security = security or ServerSecurity()
    if security.token is None and host not in LOOPBACK:
        if not security.insecure:
            raise ConfigError(f"--host {host} without a secret is refused: give the server "
                              "one (AUTOTUNE_SERVER_TOKEN_FILE) or pass --insecure")
        print(f"autotune: warning: the study server at {address} has no secret (--insecure): "
              "anyone who reaches it can read and change every study in "
              f"{redact(storage_url)} and run trials on its workers", file=sys.stderr)
    elif security.token is not None and security.cert is None and host not in LOOPBACK:
        print(f"autotune: warning: the study server at {address} checks its secret but has "
              "no TLS: the secret and the studies cross the network in the clear; give it "
              "--tls-cert and --tls-key", file=sys.stderr)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_database(storage_url, create=True)   # MLflow's database given as the storage
    try:
        storage = open_database(storage_url)
        storage.get_all_studies()
        registry = Registry(storage_url)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"cannot open storage {redact(storage_url)!r}: "
                          f"{storage_problem(e, storage_url)}") from e
    # No SO_REUSEPORT: a second server on a port in use must fail, not share the port.
    server = grpc.server(ThreadPoolExecutor(max_workers=32),
                         interceptors=security.interceptors(),
                         options=[("grpc.so_reuseport", 0)])
    api_pb2_grpc.add_StorageServiceServicer_to_server(
        _SaysUnavailable(OptunaStorageProxyService(storage), storage), server)
    try:
        security.add_port(server, address)
    except ConfigError:
        registry.close()
        raise
    add_control_service(server, registry)
    server.start()
    loop = ControlLoop(registry, storage, lambda line: print(line, flush=True))
    loop.start()
    guard = ("secret required" + (", TLS" if security.cert is not None else "")
             if security.token is not None else "no secret: loopback only")
    echo(f"study server for {redact(storage_url)} on {address} ({guard}); workers use "
         f"--server {address} (or --storage autotune://{address})")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    loop.stop()
    server.stop(grace=5).wait()
    registry.close()
    return 0
