"""autotune's own tables (workers, trial attempts), beside Optuna's in the study database.

Migrations live in the top-level ``alembic/`` folder with the version table
``autotune_alembic_version``; Optuna keeps ``alembic_version`` for its own schema.
"""

from ._migrate import VERSION_TABLE, check, current, downgrade, upgrade
from ._models import Base, TrialAttempt, Worker

__all__ = ["VERSION_TABLE", "Base", "TrialAttempt", "Worker", "check", "current", "downgrade",
           "upgrade"]
