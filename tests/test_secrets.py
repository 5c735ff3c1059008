"""A storage URL's password never reaches the output, MLflow, run folders or the stored study
config: what autotune keeps says ``postgresql://user:***@host/db``."""

from __future__ import annotations

import optuna
import pytest

from autotune.config import database_url, redact

from .conftest import run_cli

SECRET = "s3cret-Pa55"


def test_redact_hides_every_urls_password_and_nothing_else():
    assert redact(f"postgresql://bob:{SECRET}@db:5432/studies") == \
        "postgresql://bob:***@db:5432/studies"
    assert redact(f"cannot open postgresql+psycopg2://u:{SECRET}@h/d; retry") == \
        "cannot open postgresql+psycopg2://u:***@h/d; retry"
    for plain in ("sqlite:///autotune.db", "postgresql://bob@db/studies", "autotune://h:13000",
                  "http://mlflow:5000", "postgresql://bob@/db?host=/var/run/postgresql",
                  "mysql+pymysql://bob@db/studies?charset=utf8mb4&ssl_ca=/etc/ca.pem"):
        assert redact(plain) == plain


def test_redact_hides_a_password_given_as_a_query_parameter():
    # libpq and the MySQL drivers take ?password= as well: it was printed and stored as given
    assert redact(f"postgresql://bob@db/studies?password={SECRET}") == \
        "postgresql://bob@db/studies?password=***"
    assert redact(f"postgresql://db/s?sslmode=require&PASSWORD={SECRET}&connect_timeout=5 x") \
        == "postgresql://db/s?sslmode=require&PASSWORD=***&connect_timeout=5 x"
    assert redact(f"mysql+pymysql://bob@db/s?passwd={SECRET}&charset=utf8mb4") == \
        "mysql+pymysql://bob@db/s?passwd=***&charset=utf8mb4"
    assert redact(f"postgresql://db/s?sslpassword={SECRET}") == "postgresql://db/s?sslpassword=***"


@pytest.mark.postgres
def test_a_query_parameter_password_stays_out_of_outputs_and_the_study(postgres, tmp_path):
    plain = postgres.database()                       # trust authentication: any password
    url = f"{plain}?password={SECRET}"
    shown = run_cli("status", "--storage", url, cwd=tmp_path, timeout=120)
    upgraded = run_cli("db", "upgrade", "--storage", url, cwd=tmp_path, timeout=120)
    assert upgraded.returncode == 0, upgraded.stderr
    for out in (shown.stdout, shown.stderr, upgraded.stdout, upgraded.stderr):
        assert SECRET not in out, out
    assert "?password=***" in upgraded.stdout, upgraded.stdout


def test_a_password_written_with_an_at_sign_is_hidden_whole_and_told_how_to_write(
        tmp_path, capsys):
    # redact cut the password at its own "@" and printed the rest ("bob:***@Pa55@db"), in the
    # error psycopg2 gave for the host it then read ("Pa55@db")
    from autotune.cli import main

    assert redact("postgresql://bob:s3cret@Pa55@db:5432/studies") == \
        "postgresql://bob:***@db:5432/studies"
    url = "postgresql://bob:s3cret@Pa55@127.0.0.1:1/studies"
    assert main(["status", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert "Pa55" not in err and "s3cret" not in err, err
    assert "the URL's password holds an '@' (or its user name does): write it " \
        "percent-encoded, '@' as %40" in err, err


@pytest.mark.postgres
def test_no_output_record_or_stored_config_holds_the_password(postgres, tmp_path):
    plain = postgres.database()                       # trust authentication: any password
    url = plain.replace("://postgres@", f"://postgres:{SECRET}@", 1)
    assert SECRET in url
    started = run_cli("start", "study", "quickstart", "--storage", url, "--workers", "0",
                      "--timeout", "3", "--tracking-uri", "mlruns", cwd=tmp_path, timeout=300)
    shown = run_cli("status", "quickstart", "--storage", url, cwd=tmp_path, timeout=120)
    assert started.returncode == 0, started.stderr
    assert shown.returncode == 0, shown.stderr
    for out in (started.stdout, started.stderr, shown.stdout, shown.stderr):
        assert SECRET not in out
    assert "postgres:***@" in started.stdout              # said, without the password
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in written)
    for path in written:                              # MLflow store, artifacts, run folders
        assert SECRET.encode() not in path.read_bytes(), path
    study = optuna.load_study(study_name="quickstart", storage=database_url(plain))
    assert study.user_attrs["config"]["storage"].startswith("postgresql://postgres:***@")


@pytest.mark.mlflow_server
def test_a_tracking_uris_password_is_kept_out_of_outputs_records_and_the_study(
        mlflow_server, tmp_path, monkeypatch):
    """An MLflow URI with a password (http://bob:PASSWORD@host): the study records through it,
    and neither the terminal, the run folders, the study's stored config nor MLflow's own
    records hold the password; a worker elsewhere, which the study cannot hand it to, is
    told to set MLflow's own variable."""
    import json

    from mlflow import MlflowClient

    url = mlflow_server.url.replace("http://", f"http://bob:{SECRET}@", 1)
    started = run_cli("start", "study", "quickstart", "--workers", "0", "--timeout", "3",
                      "--tracking-uri", url, cwd=tmp_path, timeout=300)
    assert started.returncode == 0, started.stderr
    for out in (started.stdout, started.stderr):
        assert SECRET not in out
    assert f"--tracking-uri http://127.0.0.1:{mlflow_server.port} --study" in started.stdout
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):
        assert SECRET.encode() not in path.read_bytes(), path
    study = optuna.load_study(study_name="quickstart", storage="sqlite:///" + str(
        tmp_path / "autotune.db"))
    assert study.user_attrs["config"]["tracking_uri"] == redact(url)
    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([experiment.experiment_id])
    assert runs and all(SECRET not in json.dumps(r.to_dictionary(), default=str) for r in runs)
    page = run_cli("ui", "--tracking-uri", url, "--study", "quickstart", cwd=tmp_path,
                   timeout=120)       # a tracking server: autotune ui prints its study's page
    assert page.returncode == 0, page.stderr
    assert page.stdout.strip() == (f"http://127.0.0.1:{mlflow_server.port}/#/experiments/"
                                   f"{experiment.experiment_id}/runs")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    joined = run_cli("worker", "--storage", "sqlite:///autotune.db", cwd=tmp_path, timeout=120)
    assert joined.returncode == 2
    assert joined.stderr.strip().endswith(
        f"records to MLflow at http://bob:***@127.0.0.1:{mlflow_server.port}, whose password the "
        "study does not keep: set MLFLOW_TRACKING_PASSWORD (MLflow's own variable) on this "
        "machine and start the worker again")


def test_a_worker_takes_the_tracking_password_from_mlflows_own_variables(monkeypatch):
    from autotune import config
    from autotune.worker import _tracking_credentials

    cfg = config.load("quickstart", {"tracking_uri": "https://bob%40corp:***@mlflow.corp:443"})
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    assert _tracking_credentials(cfg).tracking_uri == "https://mlflow.corp:443"
    import os

    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "bob@corp"
    plain = config.load("quickstart", {"tracking_uri": "http://mlflow.corp"})
    assert _tracking_credentials(plain) is plain


def test_ui_on_a_tracking_server_that_does_not_answer_names_it_without_the_password(capsys):
    from autotune.cli import main

    assert main(["ui", "--tracking-uri", f"http://bob:{SECRET}@127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert SECRET not in err and err.count("\n") == 1
    assert "the MLflow server at http://bob:***@127.0.0.1:1 does not answer (" in err
    assert "Name or service not known" not in err     # probed without the credentials
