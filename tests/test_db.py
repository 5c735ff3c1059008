"""autotune's migrations on real PostgreSQL, beside Optuna's own tables."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy as sa

from autotune import db
from autotune.cli import main
from autotune.config import database_url

pytestmark = pytest.mark.postgres


def tables(url: str) -> set[str]:
    engine = sa.create_engine(database_url(url))
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def optuna_revision(url: str) -> str:
    engine = sa.create_engine(database_url(url))
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar())
    finally:
        engine.dispose()


def test_upgrade_from_empty_creates_autotune_tables_with_their_own_version_table(postgres):
    url = postgres.database()
    assert db.current(url) == ""
    db.upgrade(url)
    assert db.current(url) == "0001"
    assert {"autotune_workers", "autotune_trial_attempts", db.VERSION_TABLE} <= tables(url)
    assert "alembic_version" not in tables(url)          # that name is Optuna's
    db.check(url)                                        # the models match the migrations


def test_beside_optuna_downgrade_and_upgrade_round_trip(postgres):
    url = postgres.database()
    optuna.storages.RDBStorage(database_url(url))         # Optuna migrates its own schema
    before = optuna_revision(url)
    db.upgrade(url)
    db.downgrade(url, "base")
    assert not {"autotune_workers", "autotune_trial_attempts"} & tables(url)
    assert db.current(url) == ""
    db.upgrade(url)
    assert db.current(url) == "0001"
    db.check(url)
    assert optuna_revision(url) == before
    study = optuna.create_study(storage=database_url(url), study_name="still-works")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(study.trials) == 2


def test_db_upgrade_command(postgres, capsys):
    url = postgres.database()
    assert main(["db", "upgrade", "--storage", url]) == 0
    assert "revision none -> 0001" in capsys.readouterr().out
    assert main(["db", "upgrade", "--storage", url]) == 0
    assert "up to date (0001)" in capsys.readouterr().out


def test_db_upgrade_on_an_unreachable_database_is_one_line(capsys):
    code = main(["db", "upgrade", "--storage", "postgresql://nobody@127.0.0.1:1/none"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("autotune: error: ") and err.count("\n") == 1


def test_a_user_the_database_server_lacks_is_named_with_what_to_do(postgres, capsys):
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(postgres.database())
    host = parts.netloc.rpartition("@")[2]
    url = urlunsplit(parts._replace(netloc=f"nosuchrole@{host}"))
    assert main(["status", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(
        'the server has no role "nosuchrole"; give a user it has '
        "(postgresql://USER@HOST/DB), or create it (createuser nosuchrole, as a role that "
        "may)"), err


def test_a_user_without_rights_on_the_database_is_told_the_grant_that_gives_them(
        postgres, capsys, workdir):
    # PostgreSQL 15 gives the public schema's CREATE to the database's owner only; a user
    # without rights on existing tables got Optuna's "an exception is raised during the
    # commit ... invalid data"
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    owner_url = postgres.database()
    role = f"autotune_user_{uuid.uuid4().hex[:8]}"
    postgres._admin(f'CREATE ROLE "{role}" LOGIN')
    try:
        parts = urlsplit(owner_url)
        host = parts.netloc.rpartition("@")[2]
        url = urlunsplit(parts._replace(netloc=f"{role}@{host}"))
        database = parts.path.lstrip("/")
        assert main(["start", "study", "quickstart", "--storage", url]) == 2
        assert (f"{role} may not create tables in {database}'s public schema (PostgreSQL 15 "
                f"and later let only the database's owner): make it the owner (ALTER DATABASE "
                f"{database} OWNER TO {role}) or grant it (GRANT CREATE ON SCHEMA public TO "
                f"{role}), as a role that may") in capsys.readouterr().err
        # `db upgrade` says the same, and keeps a password out of its line (it printed
        # SQLAlchemy's own text, and the URL as given)
        secret = urlunsplit(parts._replace(netloc=f"{role}:s3cret@{host}"))
        assert main(["db", "upgrade", "--storage", secret]) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines() == [
            f"autotune: error: cannot migrate {secret.replace('s3cret', '***')}: {role} may not "
            f"create tables in {database}'s public schema (PostgreSQL 15 and later let only the "
            f"database's owner): make it the owner (ALTER DATABASE {database} OWNER TO {role}) "
            f"or grant it (GRANT CREATE ON SCHEMA public TO {role}), as a role that may"], err
        optuna.create_study(study_name="theirs", storage=database_url(owner_url))
        assert main(["status", "--storage", url]) == 2
        err = capsys.readouterr().err
        assert f"{role} may not use the table " in err and (
            f"grant it (GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "
            f"{role}; GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role})") in err, err
    finally:
        postgres.drop_databases()
        postgres._admin(f'DROP ROLE IF EXISTS "{role}"')
