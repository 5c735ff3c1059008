"""Shared fixtures. Tests run from a temporary working directory so nothing lands in the repo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A study that names no MLflow store records where MLFLOW_TRACKING_URI says: the tests say
# where each records, whatever the shell that runs them exports.
os.environ.pop("MLFLOW_TRACKING_URI", None)


def run_cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` as a user would run it, in ``cwd``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the session (see ``_services``)."""
    from ._services import PostgresServer

    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _drop_test_databases(request: pytest.FixtureRequest):
    """A test's PostgreSQL databases are dropped when it ends, not when the session does."""
    yield
    if "postgres" in request.fixturenames:
        request.getfixturevalue("postgres").drop_databases()


@pytest.fixture
def mysql():
    """A new database on the MySQL or MariaDB server at ``AUTOTUNE_TEST_MYSQL_URL`` (default
    root on 127.0.0.1:3306, where one runs), dropped after the test; skipped where none
    answers or its driver (pymysql) is missing."""
    from ._services import MysqlDatabase

    database = MysqlDatabase.make()
    if isinstance(database, str):
        pytest.skip(database)
    yield database.url
    database.drop()


@pytest.fixture
def mlflow_server(postgres, tmp_path):
    """A real `mlflow server` on a fresh PostgreSQL database, stopped after the test."""
    from ._services import MlflowServer

    server = MlflowServer(postgres.database(), tmp_path / "mlflow-artifacts")
    server.start()
    yield server
    server.stop()
