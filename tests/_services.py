"""Real services for the integration tests: a PostgreSQL database and an `mlflow server`.

PostgreSQL: ``AUTOTUNE_TEST_POSTGRES_URL`` (a server URL; each test session creates and drops
its own database there), else a throwaway server started from the local PostgreSQL binaries
(``initdb``, ``pg_ctl``) in a temporary folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

__all__ = ["Background", "MlflowServer", "PostgresServer", "autotune", "free_port", "one_storage",
           "wait_for_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_storage(url: str) -> Any:
    """One Optuna storage for a test to poll a study through: ``optuna.load_study`` with a URL
    builds a new engine each call, whose pooled connection lingers until garbage collection,
    and a test polling five times a second held dozens of PostgreSQL connections."""
    import optuna

    from autotune.config import database_url

    return optuna.storages.RDBStorage(database_url(url), engine_kwargs={"pool_pre_ping": True})


def _as_postgres_user(command: list[str]) -> list[str]:
    """initdb and pg_ctl refuse to run as root: run them as the `postgres` user then."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


class PostgresServer:
    """A PostgreSQL server for one test session; ``database()`` makes throwaway databases."""

    def __init__(self, own: bool = False) -> None:
        self._folder: Path | None = None
        url = None if own else os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")
        if url:
            self.url = url.rstrip("/")
        else:
            self.url = self._start()
        self._made: list[str] = []

    def _start(self) -> str:
        initdb = shutil.which("initdb") or "/usr/lib/postgresql/15/bin/initdb"
        pg_ctl = shutil.which("pg_ctl") or "/usr/lib/postgresql/15/bin/pg_ctl"
        self._folder = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        data = self._folder / "data"
        if os.geteuid() == 0:
            shutil.chown(self._folder, "postgres", "postgres")
        port = free_port()
        subprocess.run(_as_postgres_user([initdb, "-D", str(data), "-A", "trust", "-U",
                                          "postgres"]), check=True, capture_output=True)
        subprocess.run(_as_postgres_user([
            pg_ctl, "-D", str(data), "-l", str(self._folder / "log"), "-w", "-o",
            f"-p {port} -h 127.0.0.1 -k {self._folder} -c max_connections=300", "start"]),
            check=True, capture_output=True)
        self._pg_ctl, self._data, self._port = pg_ctl, data, port
        return f"postgresql://postgres@127.0.0.1:{port}"

    def stop(self) -> None:
        """Stops a server this object started (fast shutdown: clients are cut off)."""
        subprocess.run(_as_postgres_user([self._pg_ctl, "-D", str(self._data), "-m", "fast",
                                          "-w", "stop"]), check=True, capture_output=True)

    def start(self) -> None:
        """Starts it again, on the same port and data."""
        assert self._folder is not None
        subprocess.run(_as_postgres_user([
            self._pg_ctl, "-D", str(self._data), "-l", str(self._folder / "log"), "-w", "-o",
            f"-p {self._port} -h 127.0.0.1 -k {self._folder} -c max_connections=300",
            "start"]), check=True, capture_output=True)

    def _admin(self, sql: str) -> None:
        import psycopg2

        conn = psycopg2.connect(f"{self.url}/postgres")
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    def database(self) -> str:
        """A new, empty database; its URL."""
        name = f"autotune_test_{uuid.uuid4().hex[:10]}"
        self._admin(f'CREATE DATABASE "{name}"')
        self._made.append(name)
        return f"{self.url}/{name}"

    def drop_databases(self) -> None:
        """Drops the databases made so far, cutting off their clients: the connections a test's
        storages and servers kept open do not pile up towards the server's max_connections."""
        made, self._made = self._made, []
        for name in made:
            try:
                self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception:  # noqa: BLE001 - best effort: the server may be gone already
                pass

    def close(self) -> None:
        self.drop_databases()
        if self._folder is not None:
            subprocess.run(_as_postgres_user([self._pg_ctl, "-D", str(self._data), "-m",
                                              "immediate", "stop"]), capture_output=True)
            shutil.rmtree(self._folder, ignore_errors=True)


class MysqlDatabase:
    """A throwaway database on a running MySQL or MariaDB server."""

    def __init__(self, server: str, name: str) -> None:
        self.server, self.name = server, name
        self.url = f"{server.rstrip('/')}/{name}"

    @classmethod
    def make(cls) -> MysqlDatabase | str:
        """A new database, or why none can be made here."""
        import sqlalchemy as sa

        try:
            import pymysql  # noqa: F401
        except ImportError:
            return "pymysql is not installed"
        server = os.environ.get("AUTOTUNE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")
        name = f"autotune_test_{uuid.uuid4().hex[:10]}"
        try:
            engine = sa.create_engine(server, connect_args={"connect_timeout": 3})
            with engine.connect() as conn:
                conn.execute(sa.text(f"CREATE DATABASE `{name}`"))
            engine.dispose()
        except sa.exc.SQLAlchemyError as e:
            return f"no MySQL server answers at {server} ({str(e).splitlines()[0][:120]})"
        return cls(server, name)

    def drop(self) -> None:
        import sqlalchemy as sa

        engine = sa.create_engine(self.server)
        with engine.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{self.name}`"))
        engine.dispose()


class MlflowServer:
    """`mlflow server` with a PostgreSQL backend store and a local artifact root."""

    def __init__(self, backend_url: str, artifacts: Path,
                 admin_password: str | None = None) -> None:
        """``admin_password``: MLflow's basic-auth app, whose admin user ``admin`` has it."""
        self.backend = backend_url.replace("postgresql://", "postgresql+psycopg2://", 1)
        self.artifacts = artifacts
        self.admin_password = admin_password
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120) -> None:
        log = open(self.artifacts.parent / "mlflow-server.log", "ab")  # noqa: SIM115
        auth: list[str] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
        if self.admin_password is not None:   # its users' database lands in the cwd
            auth = ["--app-name", "basic-auth"]
            env.update(MLFLOW_AUTH_ADMIN_PASSWORD=self.admin_password,
                       MLFLOW_FLASK_SERVER_SECRET_KEY="autotune-tests")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend,
             "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1", *auth],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
            cwd=self.artifacts.parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: see {log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer within {timeout_s} s")

    def stop(self) -> None:
        """Down now: SIGTERM, then SIGKILL after 5 s. Uvicorn's graceful shutdown waits for
        open connections to close, and a client that keeps its keep-alive connection busy
        (autotune's tracker, delivering a trial's records) kept it serving for over 30 s."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)


class Background(subprocess.Popen):  # type: ignore[type-arg]
    """A process whose output goes to files, not pipes: nobody has to read it while it runs
    (a pipe nobody reads fills at 64 KiB and stops a chatty server or worker mid-test).
    ``communicate`` waits and returns what it wrote; ``output()`` reads it so far."""

    def __init__(self, args: list[str], **kwargs: Any) -> None:
        self._files = (tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+"))
        super().__init__(args, stdout=self._files[0], stderr=self._files[1], text=True,
                         **kwargs)

    def output(self) -> tuple[str, str]:
        if self._files[0].closed:
            return self._final
        texts = []
        for f in self._files:
            f.flush()
            f.seek(0)
            texts.append(f.read())
        return texts[0], texts[1]

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        self._final = self.output()
        for f in self._files:
            f.close()
        return self._final


def autotune(*args: str, cwd: Path) -> Background:
    """``autotune ARGS`` started in the background, as a user would in another terminal."""
    root = str(Path(__file__).resolve().parent.parent)
    return Background([sys.executable, "-m", "autotune", *args], cwd=cwd,
                      env={**os.environ, "PYTHONPATH": root})


def wait_for_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise AssertionError(f"nothing listens on {port}")
