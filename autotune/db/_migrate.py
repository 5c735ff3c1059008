"""Applying autotune's migrations (``alembic/``) to a study database."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ..config import database_url, redact
from ..errors import ConfigError
from ..store import storage_problem

__all__ = ["VERSION_TABLE", "head", "upgrade", "downgrade", "current", "check", "script_location"]

VERSION_TABLE = "autotune_alembic_version"


def script_location() -> Path:
    """The ``alembic/`` folder that ships beside the ``autotune`` package."""
    folder = Path(__file__).resolve().parent.parent.parent / "alembic"
    if not (folder / "env.py").is_file():
        raise ConfigError(f"autotune's migrations are not at {folder}; install autotune from "
                          "its source tree (pip install -e .)")
    return folder


def _config(url: str, output: io.StringIO | None = None) -> Any:
    from alembic.config import Config

    config = Config(stdout=output) if output is not None else Config()
    config.set_main_option("script_location", str(script_location()))
    config.set_main_option("sqlalchemy.url", database_url(url).replace("%", "%%"))
    return config


def _run(action: str, url: str, *args: Any) -> str:
    from alembic import command
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    out = io.StringIO()
    try:
        getattr(command, action)(_config(url, out), *args)
    except CommandError as e:
        from ..config import redact

        raise ConfigError(f"migrations of {redact(url)}: {e}") from e
    except SQLAlchemyError as e:
        from ..config import redact
        from ..store import storage_problem

        # the database's own answer, said as what to do (a role that may not create tables)
        raise ConfigError(f"cannot migrate {redact(url)}: {storage_problem(e, url)}") from e
    return out.getvalue()


def head() -> str:
    """The newest revision of autotune's migrations."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(_config("sqlite://")).get_current_head())


def upgrade(url: str, revision: str = "head") -> None:
    """Brings autotune's tables in ``url`` to ``revision``."""
    _run("upgrade", url, revision)


def downgrade(url: str, revision: str) -> None:
    _run("downgrade", url, revision)


def current(url: str) -> str:
    """The applied revision of autotune's tables, or '' when none is."""
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        engine = create_engine(database_url(url))
    except ModuleNotFoundError as e:    # a URL whose driver is not installed
        raise ConfigError(f"cannot open {redact(url)}: {storage_problem(e, url)}") from None
    except SQLAlchemyError as e:
        raise ConfigError(f"cannot open {redact(url)}: {storage_problem(e, url)}") from None
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return ""
            row = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).first()
            return str(row[0]) if row else ""
    except SQLAlchemyError as e:
        raise ConfigError(f"cannot reach {redact(url)}: {storage_problem(e, url)}") from None
    finally:
        engine.dispose()


def check(url: str) -> None:
    """Raises unless the models match the applied migrations (``alembic check``)."""
    _run("check", url)
