"""A tracking server that asks for credentials (MLflow's basic-auth app, really served): a
study without ones it accepts is refused before anything is written, and records refused for
credentials mid-study wait and are delivered once a run has them; they were told as "MLflow is
unreachable" and the records waited for good."""

from __future__ import annotations

import logging
import time

import pytest
from mlflow import MlflowClient

from autotune._outbox import RUN_KEY_TAG, Outbox
from autotune._preflight import check_tracking_access
from autotune.errors import ConfigError

from .conftest import run_cli

pytestmark = pytest.mark.mlflow_server
PASSWORD = "autotune-admin-pw"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """One server for the module, on an SQLite store (a test's PostgreSQL database is dropped
    when the test ends)."""
    from ._services import MlflowServer

    folder = tmp_path_factory.mktemp("auth-server")
    server = MlflowServer(f"sqlite:///{folder / 'mlflow.db'}", folder / "artifacts",
                          admin_password=PASSWORD)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def no_credentials(monkeypatch):
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def test_a_study_without_credentials_the_server_accepts_is_refused_before_it_starts(
        auth_server, no_credentials, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    storage = f"sqlite:///{work / 'study.db'}"
    args = ("start", "study", "quickstart", "--n-trials", "1", "--storage", storage,
            "--tracking-uri", auth_server.url)
    result = run_cli(*args, cwd=work, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]   # a config error
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "401" in lines[0] and "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" \
        in lines[0]
    assert sorted(p.name for p in work.iterdir()) == []   # no study, no run folder
    # `autotune ui` gives the server's page (the browser asks for credentials) and says why
    # not the study's own: it ended in MLflow's traceback
    ui = run_cli("ui", "--tracking-uri", auth_server.url, "--study", "quickstart", cwd=work,
                 timeout=120)
    assert ui.returncode == 0 and "Traceback" not in ui.stderr, ui.stderr[-2000:]
    assert ui.stdout.splitlines()[-1] == auth_server.url
    assert "401" in ui.stdout and "for autotune ui to find the study's page" in ui.stdout

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password")
    result = run_cli(*args, cwd=work, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "does not accept user 'admin' (401" in result.stderr
    assert "check MLFLOW_TRACKING_PASSWORD" in result.stderr
    assert "not-the-password" not in result.stderr
    assert sorted(p.name for p in work.iterdir()) == []

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    check_tracking_access(auth_server.url)    # accepted: no error

    # the user and password written in the tracking URI instead
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    check_tracking_access(auth_server.url.replace("http://", f"http://admin:{PASSWORD}@"))
    with pytest.raises(ConfigError) as raised:
        check_tracking_access(auth_server.url.replace("http://", "http://admin:nope-pw@"))
    said = str(raised.value)
    assert "does not accept user 'admin' of the tracking URI (401" in said
    assert "check the password in it" in said and "nope-pw" not in said


def test_records_refused_for_credentials_wait_and_arrive_with_them(
        auth_server, no_credentials, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    spool = tmp_path / "outbox.jsonl"
    box = Outbox(lambda: MlflowClient(tracking_uri=auth_server.url), spool, "study-auth")
    box.submit({"op": "create_run", "key": "trial-0", "name": "trial-0"})
    box.submit({"op": "log", "run": "trial-0", "metrics": [["top1", 0.5, 1_000, 0]]})
    deadline = time.monotonic() + 60
    while box.denied is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert box.denied == 401 and box.pending == 2 and box.refused == 0
    said = [r.getMessage() for r in caplog.records]
    assert any("does not accept a client with no credentials (401" in m and str(spool) in m
               for m in said), said
    assert not any("unreachable" in m for m in said)

    # MLflow's client reads the credentials at each request: a run that has them delivers
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    assert box.close(timeout_s=90) and box.pending == 0 and box.denied is None
    client = MlflowClient(tracking_uri=auth_server.url)
    exp = client.get_experiment_by_name("study-auth")
    [run] = client.search_runs([exp.experiment_id],
                               filter_string=f"tags.`{RUN_KEY_TAG}` = 'trial-0'")
    assert run.data.metrics["top1"] == 0.5


def test_a_denial_names_who_was_denied_and_what_to_do(monkeypatch):
    import requests
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

    from autotune._outbox import denied
    from autotune._preflight import access_advice

    response = requests.models.Response()
    response.status_code = 403
    assert denied(requests.HTTPError("403 Forbidden", response=response)) == 403  # artifacts
    assert denied(MlflowException("no", error_code=PERMISSION_DENIED)) == 403
    assert denied(MlflowException("unreachable")) is None and denied(OSError("x")) is None
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ana")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw-never-said")
    said = access_advice(403)
    assert "denies user 'ana' (403" in said and "ask its administrator" in said
    assert "pw-never-said" not in said + access_advice(401)


def test_a_web_server_that_is_not_mlflow_is_refused_as_the_tracking_uri(tmp_path):
    # another server on that port (a typo, a proxy's path left out): the study ran and its
    # records waited for good as "MLflow is unreachable"; `autotune ui` ended in a traceback
    import sys

    from ._services import Background, free_port

    port = free_port()
    web = Background([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                     cwd=tmp_path)
    try:
        from ._services import wait_for_port

        wait_for_port(port)
        url = f"http://127.0.0.1:{port}"
        for args in (("start", "study", "quickstart", "--tracking-uri", url),
                     ("ui", "--tracking-uri", url, "--study", "quickstart")):
            result = run_cli(*args, cwd=tmp_path, timeout=300)
            assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
            assert result.stderr.count("\n") == 1, result.stderr
            assert "not as an MLflow tracking server (HTTP 404" in result.stderr or \
                "did not answer as MLflow does" in result.stderr, result.stderr
        assert not (tmp_path / "autotune.db").exists()
    finally:
        web.kill()
        web.wait(10)
