"""Alembic environment for autotune's own tables (never Optuna's).

The version table is ``autotune_alembic_version``, so Optuna's ``alembic_version`` in the same
database is left alone, and only tables of autotune's models are compared or migrated.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from autotune.db import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def include_object(obj, name, type_, reflected, compare_to):  # noqa: ANN001, ANN201
    """Only autotune's tables: Optuna's live in the same database."""
    if type_ == "table":
        return name in target_metadata.tables
    table = getattr(obj, "table", None)
    return table is None or table.name in target_metadata.tables


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"),
                      target_metadata=target_metadata, literal_binds=True,
                      version_table=VERSION_TABLE, include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = engine_from_config(config.get_section(config.config_ini_section, {}),
                                prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          version_table=VERSION_TABLE, include_object=include_object)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
