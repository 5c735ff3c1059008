"""SQLAlchemy models of autotune's tables. Change them only together with a migration."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Integer, MetaData, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "Worker", "TrialAttempt"]

NAMING = {"ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
          "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
          "pk": "pk_%(table_name)s"}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Worker(Base):
    """A worker process that takes trials of a study; alive while its heartbeat is fresh."""

    __tablename__ = "autotune_workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    study_name: Mapped[str] = mapped_column(String(512), index=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32))          # running | stopped | lost
    started_at: Mapped[datetime] = mapped_column(DateTime)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime)


class TrialAttempt(Base):
    """One run of a trial's configuration; a trial resumed after a crash has several."""

    __tablename__ = "autotune_trial_attempts"
    __table_args__ = (UniqueConstraint("study_name", "trial_number", "attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_name: Mapped[str] = mapped_column(String(512), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("autotune_workers.id"))
    status: Mapped[str] = mapped_column(String(32))   # running | finished | interrupted | lost
    started_at: Mapped[datetime] = mapped_column(DateTime)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    checkpoint_path: Mapped[str | None] = mapped_column(String(1024))
    elapsed_s: Mapped[float] = mapped_column(Float, default=0.0)     # the trial's clock
    downtime_s: Mapped[float] = mapped_column(Float, default=0.0)    # recorded, not counted
    resumed_from: Mapped[int | None] = mapped_column(ForeignKey("autotune_trial_attempts.id"))
