"""`autotune server`: serve a study database to many workers through one process.

Optuna's gRPC storage proxy over a cached storage (``optuna.storages.get_storage``), so
hundreds of workers share a handful of database connections. The channel is plain gRPC with
no TLS and no authentication: it binds 127.0.0.1 unless told otherwise, and warns when it is
told otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from .config import database_url
from .errors import ConfigError

__all__ = ["serve"]

_LOCAL = ("127.0.0.1", "localhost", "::1")


def serve(storage_url: str, host: str, port: int, echo: Callable[[str], None] = print) -> int:
    import optuna
    from optuna.storages import get_storage, run_grpc_proxy_server

    if storage_url.startswith("autotune://"):
        raise ConfigError("--storage must be a database URL, not another study server")
    if host not in _LOCAL:
        print(f"autotune: warning: the study server at {host}:{port} has no authentication "
              "and no TLS; anyone who reaches it can read and change every study in "
              f"{storage_url}. Expose it only on a trusted network.", file=sys.stderr)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = get_storage(database_url(storage_url))
    except Exception as e:
        first = " ".join(str(e).split())[:200]
        raise ConfigError(f"cannot open storage {storage_url!r}: {first}") from e
    echo(f"study server for {storage_url} on {host}:{port}; workers use --storage "
         f"autotune://{host}:{port}")
    try:
        run_grpc_proxy_server(storage, host=host, port=port)
    except KeyboardInterrupt:
        pass
    return 0
