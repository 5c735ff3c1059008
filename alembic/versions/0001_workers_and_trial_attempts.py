"""Workers and trial attempts.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autotune_workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("study_name", sa.String(length=512), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("last_heartbeat", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_workers")),
        sa.UniqueConstraint("name", name=op.f("uq_autotune_workers_name")),
    )
    op.create_index(op.f("ix_autotune_workers_study_name"), "autotune_workers", ["study_name"])
    op.create_table(
        "autotune_trial_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_name", sa.String(length=512), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("last_heartbeat", sa.DateTime(), nullable=False),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.Column("checkpoint_path", sa.String(length=1024), nullable=True),
        sa.Column("elapsed_s", sa.Float(), nullable=False),
        sa.Column("downtime_s", sa.Float(), nullable=False),
        sa.Column("resumed_from", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["worker_id"], ["autotune_workers.id"],
                                name=op.f("fk_autotune_trial_attempts_worker_id_autotune_workers")),
        sa.ForeignKeyConstraint(
            ["resumed_from"], ["autotune_trial_attempts.id"],
            name=op.f("fk_autotune_trial_attempts_resumed_from_autotune_trial_attempts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_trial_attempts")),
        sa.UniqueConstraint("study_name", "trial_number", "attempt",
                            name=op.f("uq_autotune_trial_attempts_study_name")),
    )
    op.create_index(op.f("ix_autotune_trial_attempts_study_name"), "autotune_trial_attempts",
                    ["study_name"])


def downgrade() -> None:
    op.drop_index(op.f("ix_autotune_trial_attempts_study_name"),
                  table_name="autotune_trial_attempts")
    op.drop_table("autotune_trial_attempts")
    op.drop_index(op.f("ix_autotune_workers_study_name"), table_name="autotune_workers")
    op.drop_table("autotune_workers")
