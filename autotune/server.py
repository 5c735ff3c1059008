"""`autotune server`: serve a study database to many workers through one process.

* Optuna's gRPC storage proxy over a cached storage, so hundreds of workers share a handful of
  database connections. Calls that find the database away (PostgreSQL restarting) wait for it
  with backoff instead of failing the worker's call.
* A control channel on the same port: the worker registry and heartbeats
  (:mod:`autotune.control`), stored in autotune's tables beside Optuna's.
* A control loop that gives up silent workers and queues their trials to resume from their
  last checkpoint on another worker.

The channel is plain gRPC with no TLS and no authentication: it binds 127.0.0.1 unless told
otherwise, and warns when it is told otherwise.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from .config import database_url
from .errors import ConfigError

__all__ = ["serve", "open_database"]

_LOCAL = ("127.0.0.1", "localhost", "::1")
DEFAULT_HEARTBEAT_S = 10.0
# After the server starts, or its database comes back, workers get this long (besides the
# usual 1.5 heartbeats) to reconnect and beat before any is given up.
RECONNECT_GRACE = timedelta(seconds=10)


def open_database(storage_url: str) -> Any:
    """Optuna's cached RDB storage for ``storage_url``, riding out database restarts."""
    import optuna
    from optuna.storages import RDBStorage

    from ._retry import RetryingStorage

    try:
        from optuna.storages._cached_storage import _CachedStorage

        rdb = RDBStorage(database_url(storage_url), engine_kwargs={"pool_pre_ping": True})
        storage: Any = _CachedStorage(rdb)
    except ImportError:  # a future Optuna without the private class: its public cache
        storage = optuna.storages.get_storage(database_url(storage_url))
    # A short patience: a worker's call fails soon with "unavailable" and the worker keeps
    # what it wanted to write, instead of its trainer waiting on a call held here.
    return RetryingStorage(storage, f"the study database {storage_url}",  # type: ignore[abstract]
                           patience_s=2.0)


class ControlLoop:
    """Recovers the trials of silent workers, study by study, every fraction of a beat."""

    def __init__(self, registry: Any, storage: Any, echo: Callable[[str], None]) -> None:
        from .db import utcnow

        self.registry = registry
        self.storage = storage
        self.echo = echo
        self.started = utcnow() + RECONNECT_GRACE
        self._beats: dict[str, float] = {}
        self._outage = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="autotune-control")

    def heartbeat_s(self, study: str) -> float:
        if study not in self._beats:
            try:
                study_id = self.storage.get_study_id_from_name(study)
                config = self.storage.get_study_user_attrs(study_id).get("config", {})
                self._beats[study] = float(config.get("heartbeat_s", DEFAULT_HEARTBEAT_S))
            except KeyError:
                return DEFAULT_HEARTBEAT_S
        return self._beats[study]

    def once(self) -> float:
        """One pass over the live studies; the seconds until the next one."""
        from .control import recover
        from .db import utcnow

        period = 1.0
        studies = self.registry.live_studies()
        if self._outage:  # the database is back: heartbeats sent meanwhile were lost, so
            self._outage = False          # every worker gets time to beat again
            self.started = utcnow() + RECONNECT_GRACE
            return period
        for study in studies:
            beat = self.heartbeat_s(study)
            period = min(period, beat / 4)
            recover(self.registry, self.storage, study, beat, self.started, self.echo)
        return max(period, 0.1)

    def _run(self) -> None:
        wait = 1.0
        while not self._stop.wait(wait):
            try:
                wait = self.once()
            except Exception as e:  # noqa: BLE001 - the database is away; try again soon
                self._outage = True
                self.echo(f"autotune server: control loop: {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}")
                wait = 2.0

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()


class _SaysUnavailable:
    """Optuna's storage service, answering UNAVAILABLE (which workers retry, or keep their
    writes for later) while the database is away, instead of an unknown error."""

    def __init__(self, service: Any) -> None:
        self._service = service

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


def serve(storage_url: str, host: str, port: int, echo: Callable[[str], None] = print) -> int:
    import grpc
    import optuna
    from optuna.storages._grpc.auto_generated import api_pb2_grpc
    from optuna.storages._grpc.servicer import OptunaStorageProxyService

    from .control import add_control_service
    from .db import Registry

    if storage_url.startswith("autotune://"):
        raise ConfigError("--storage must be a database URL, not another study server")
    if host not in _LOCAL:
        print(f"autotune: warning: the study server at {host}:{port} has no authentication "
              "and no TLS; anyone who reaches it can read and change every study in "
              f"{storage_url}. Expose it only on a trusted network.", file=sys.stderr)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = open_database(storage_url)
        storage.get_all_studies()
        registry = Registry(storage_url)
    except ConfigError:
        raise
    except Exception as e:
        first = " ".join(str(e).split())[:200]
        raise ConfigError(f"cannot open storage {storage_url!r}: {first}") from e
    server = grpc.server(ThreadPoolExecutor(max_workers=32))
    api_pb2_grpc.add_StorageServiceServicer_to_server(
        _SaysUnavailable(OptunaStorageProxyService(storage)), server)
    server.add_insecure_port(f"{host}:{port}")
    add_control_service(server, registry)
    server.start()
    loop = ControlLoop(registry, storage, lambda line: print(line, flush=True))
    loop.start()
    echo(f"study server for {storage_url} on {host}:{port}; workers use --server "
         f"{host}:{port} (or --storage autotune://{host}:{port})")
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
