"""`autotune ui`: the MLflow UI on a study's store, bound to 127.0.0.1."""

from __future__ import annotations

import re
import shlex
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .config import (
    redact,
    resolve_tracking_uri,
    sqlite_file,
    sqlite_rows,
    sqlite_tables,
    without_credentials,
)
from .errors import ConfigError
from .record import STUDY_CONFIG
from .tracking import follow_moved_store

__all__ = ["experiment_url", "serve"]


def experiment_url(base: str, experiment_id: str) -> str:
    """The page of an experiment's runs (MLflow 3 opens experiments in another view)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"


def _experiment_id(uri: str, study: str | None,
                   echo: Callable[[str], None] = print) -> str | None:
    from .tracking import connect

    client = connect(uri)
    if study:
        exp = client.get_experiment_by_name(study)
        if exp is None:
            names = [e.name for e in client.search_experiments() if e.name != "Default"]
            raise ConfigError(f"no study {study!r} in {redact(uri)}; studies there: "
                              f"{', '.join(names) or 'none'}")
        # other studies of this name record beside it (NAME-2, ...: _outbox.Outbox)
        others = [e.name for e in client.search_experiments(
            filter_string=f"tags.`autotune.study` = '{study}'") if e.name != study] \
            if re.fullmatch(r"[A-Za-z0-9._-]+", study) else []
        if others:
            echo(f"other studies named {study!r} recorded to experiment(s) "
                 f"{', '.join(repr(n) for n in others)}: give --study with that name")
        return str(exp.experiment_id)
    studies = [e for e in client.search_experiments() if e.name != "Default"]
    return str(studies[0].experiment_id) if len(studies) == 1 else None


def _require_answer(uri: str, timeout_s: float = 5.0) -> None:
    """A one-line error now, not MLflow's client retrying for minutes, when the tracking
    server at ``uri`` does not answer."""
    try:   # without credentials: urllib cannot read them from a URL; /health needs none
        with urllib.request.urlopen(f"{without_credentials(uri).rstrip('/')}/health",
                                    timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return      # it answered (a server behind a proxy may have no /health): MLflow judges
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ssl.SSLError):
            return  # it answered; trusting its certificate is MLflow's (MLFLOW_TRACKING_*)
        raise ConfigError(f"the MLflow server at {redact(uri)} does not answer ({reason}); "
                          "start it, or give --tracking-uri the folder of a local store"
                          ) from None


def _require_mlflow_store(store: Path, tracking_uri: str) -> None:
    """A one-line error, before MLflow opens (and would migrate) it, when the SQLite file
    ``store`` is not an MLflow store: a study database (the study's own tracking URI named,
    where it says one), another application's database, or no database at all."""
    import sqlite3

    try:
        tables = sqlite_tables(store)
        kept: list[str] = []
        if "studies" in tables and "study_user_attributes" in tables:
            kept = [r[0] for r in sqlite_rows(
                store, "SELECT value_json FROM study_user_attributes WHERE key = ?",
                STUDY_CONFIG)]
    except sqlite3.DatabaseError as e:
        raise ConfigError(f"--tracking-uri {tracking_uri} is not an MLflow store ({e}); give "
                          "the study's tracking_uri (mlruns, the default)") from None
    if not tables or "experiments" in tables:
        return
    if "studies" in tables:
        uris = sorted({str(c.get("tracking_uri")) for c in map(_json, kept)
                       if isinstance(c, dict) and c.get("tracking_uri")})
        hint = (f"its studies' records are at {uris[0]}: autotune ui --tracking-uri "
                f"{shlex.quote(uris[0])}"
                if len(uris) == 1 else "give the study's tracking_uri (mlruns, the default)")
        raise ConfigError(f"--tracking-uri {tracking_uri} is a study database, not an MLflow "
                          f"store; {hint}")
    raise ConfigError(f"--tracking-uri {tracking_uri} holds another application's tables, no "
                      "MLflow records; give the study's tracking_uri (mlruns, the default)")


def _json(text: str) -> object:
    import json

    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError(f"the MLflow UI exited with code {process.returncode}; is port "
                              f"{url.rsplit(':', 1)[-1]} taken? Try --port")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise ConfigError(f"the MLflow UI did not answer at {url} within {timeout_s:.0f} s")


def serve(tracking_uri: str, study: str | None, host: str, port: int,
          echo: Callable[[str], None] = print) -> int:
    """Starts the MLflow UI and prints the study's page; runs until interrupted."""
    from ._preflight import tracking_uri_problem

    uri, _ = resolve_tracking_uri(tracking_uri)
    problem = None if uri.startswith(("http://", "https://")) else tracking_uri_problem(uri)
    if problem:
        raise ConfigError(f"--tracking-uri {redact(tracking_uri)} {problem}")
    if uri.startswith(("http://", "https://")):
        _require_answer(uri)
        page = without_credentials(uri)       # the browser asks for them
        try:
            exp = _experiment_id(uri, study, echo)
        except Exception as e:
            from ._outbox import denied
            from ._preflight import access_advice

            status = denied(e)
            if isinstance(e, ConfigError):
                raise
            if status is None:    # a server that answers, but not as MLflow (a proxy's page)
                said = " ".join(str(e).split())[:200]
                raise ConfigError(f"the MLflow server at {redact(uri)} did not answer as MLflow "
                                  f"does ({redact(said)}); check --tracking-uri") from None
            echo(access_advice(status, "for autotune ui to find the study's page; the MLflow "
                               "UI asks the browser for them", uri=uri) + ":")
            exp = None
        echo(experiment_url(page, exp) if exp else page)
        return 0
    store = sqlite_file(uri)
    if store is not None and not store.is_file():
        raise ConfigError(f"no MLflow store at {tracking_uri}; run a study first, or give "
                          "--tracking-uri")
    if store is not None:
        _require_mlflow_store(store, tracking_uri)
        moved = follow_moved_store(tracking_uri)
        if moved:
            echo(moved)
    exp = _experiment_id(uri, study, echo)
    base = f"http://{host}:{port}"
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", host, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(*_: object) -> None:  # SIGTERM stops the UI as Ctrl-C does: no orphan left
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        _wait_healthy(base, process, 120)
        echo(f"MLflow UI for {redact(tracking_uri)}: "
             f"{experiment_url(base, exp) if exp else base}")
        echo("press Ctrl-C to stop it")
        process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:   # a browser's open connection holds it up
                process.kill()
                process.wait()
    return 0

