"""autotune's own tables (workers, trial attempts), beside Optuna's in the study database.

Migrations live in the top-level ``alembic/`` folder with the version table
``autotune_alembic_version``; Optuna keeps ``alembic_version`` for its own schema.
"""

from ._migrate import VERSION_TABLE, check, current, downgrade, head, upgrade
from ._models import Base, TrialAttempt, Worker
from ._registry import Registry, ensure_tables, utcnow

__all__ = ["VERSION_TABLE", "Base", "Registry", "TrialAttempt", "Worker", "check", "current",
           "downgrade", "ensure_tables", "head", "upgrade", "utcnow"]
