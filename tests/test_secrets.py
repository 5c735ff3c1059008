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
                  "http://mlflow:5000"):
        assert redact(plain) == plain


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
