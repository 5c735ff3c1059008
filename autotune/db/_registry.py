"""The worker registry: who works on which study, their heartbeats, and each trial attempt.

Every write is keyed by a natural key (a worker's name; a study, trial number and attempt), so
a call can be repeated after a lost answer without harm: a worker that could not reach the
study server keeps its calls and sends them again later. Arguments and results are plain
JSON values, so the same calls travel over the study server's control channel.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, create_engine, delete, select, update
from sqlalchemy.orm import Session

from ..config import database_url, redact, sqlite_wal
from ..errors import ConfigError
from ._models import TrialAttempt, Worker

__all__ = ["Registry", "ensure_tables", "utcnow"]

_ENDED = ("finished", "interrupted", "lost", "abandoned")


def utcnow() -> datetime:
    """Now, as the naive UTC timestamps the registry stores."""
    return datetime.now(UTC).replace(tzinfo=None)


_OFFSET_EVERY_S = 600.0
# the server's UTC time, with microseconds, as each database says it
_SERVER_UTC = {"postgresql": "SELECT timezone('utc', clock_timestamp())",
               "mysql": "SELECT UTC_TIMESTAMP(6)"}


def _clock_offset(engine: Engine) -> timedelta | None:
    """How far the database server's clock is ahead of this machine's (0 for a database
    without a server: SQLite), from one query, taken at its midpoint; None if it cannot be
    asked now."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    query = _SERVER_UTC.get(engine.dialect.name)
    if query is None:
        return timedelta(0)
    try:
        with engine.connect() as conn:
            before = utcnow()
            server = conn.execute(text(query)).scalar()
            after = utcnow()
    except SQLAlchemyError:
        return None
    if not isinstance(server, datetime):
        return None
    offset = server.replace(tzinfo=None) - (before + (after - before) / 2)
    return offset if abs(offset) > timedelta(milliseconds=50) else timedelta(0)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(" ", "seconds")


def ensure_tables(url: str) -> None:
    """Creates autotune's tables in a database that has none yet; a database with an older
    revision is left alone with a one-line error that says to run ``autotune db upgrade``."""
    from ._migrate import current, head, upgrade

    have = current(url)
    if have == head():
        return
    if have:
        raise ConfigError(f"autotune's tables in {redact(url)} are at revision {have}, this "
                          f"autotune needs {head()}; run `autotune db upgrade --storage "
                          f"{redact(url)}`")
    try:
        upgrade(url)
    except ConfigError:
        if current(url) != head():  # not another process creating them at the same time
            raise


class Registry:
    """autotune's tables in one study database."""

    def __init__(self, url: str, create: bool = True) -> None:
        if create:
            ensure_tables(url)
        sqlite_wal(url)
        self.url = url
        self.engine: Engine = create_engine(database_url(url), pool_pre_ping=True,
                                            **_pool_options(url))
        self._offset = timedelta(0)
        self._offset_at: float | None = None

    def close(self) -> None:
        self.engine.dispose()

    def _now(self) -> datetime:
        """The database server's UTC time, as this machine's clock corrected by their offset
        (measured on first use and every 10 minutes): heartbeats written on one machine are
        judged on another, and a worker whose clock runs behind looked silent and was given
        up while it trained. An SQLite file lives on this machine: no offset."""
        if self._offset_at is None or time.monotonic() - self._offset_at > _OFFSET_EVERY_S:
            measured = _clock_offset(self.engine)
            if measured is not None:
                self._offset = measured
            self._offset_at = time.monotonic()   # not asked again at every call while away
        return utcnow() + self._offset

    def offset_s(self) -> float:
        """How far the database server's clock is ahead of this machine's, in seconds."""
        self._now()
        return self._offset.total_seconds()

    # -- workers ------------------------------------------------------------------------------
    def register(self, name: str, study: str, host: str, pid: int) -> dict[str, Any]:
        now = self._now()
        with Session(self.engine) as s, s.begin():
            worker = s.scalars(select(Worker).where(Worker.name == name)).first()
            if worker is None:
                s.add(Worker(name=name, study_name=study, host=host, pid=pid, status="running",
                             started_at=now, last_heartbeat=now))
            else:   # the same process again, or a later one with the name (a container
                # restarted with its host name and process id): this one's study
                if worker.study_name != study:
                    worker.study_name, worker.started_at = study, now
                worker.host, worker.pid = host, pid
                worker.status, worker.last_heartbeat = "running", now
        return {"status": "running"}

    def heartbeat(self, name: str) -> dict[str, Any]:
        """Marks ``name`` and its running attempts alive; its status ("lost" if the registry
        gave it up for dead: its trial was resumed elsewhere)."""
        now = self._now()
        with Session(self.engine) as s, s.begin():
            worker = s.scalars(select(Worker).where(Worker.name == name)).first()
            if worker is None:
                return {"status": "unknown"}
            if worker.status == "running":
                worker.last_heartbeat = now
                s.execute(update(TrialAttempt)
                          .where(TrialAttempt.worker_id == worker.id,
                                 TrialAttempt.status == "running")
                          .values(last_heartbeat=now))
            return {"status": worker.status}

    def stop_worker(self, name: str) -> dict[str, Any]:
        with Session(self.engine) as s, s.begin():
            s.execute(update(Worker).where(Worker.name == name, Worker.status == "running")
                      .values(status="stopped", last_heartbeat=self._now()))
        return {}

    # -- attempts -----------------------------------------------------------------------------
    def attempt(self, study: str, trial_number: int, attempt: int, worker: str,
                **fields: Any) -> dict[str, Any]:
        """Creates or updates the attempt ``(study, trial_number, attempt)``. Fields: status,
        checkpoint_path, elapsed_s, downtime_s, mlflow_run_id, resume_of (the trial number of
        the attempt this one resumes)."""
        now = self._now()
        with Session(self.engine) as s, s.begin():
            row = s.scalars(select(TrialAttempt).where(
                TrialAttempt.study_name == study, TrialAttempt.trial_number == trial_number,
                TrialAttempt.attempt == attempt)).first()
            if row is None:
                owner = s.scalars(select(Worker).where(Worker.name == worker)).first()
                row = TrialAttempt(study_name=study, trial_number=trial_number,
                                   attempt=attempt, worker_id=owner.id if owner else None,
                                   status="running", started_at=now, last_heartbeat=now,
                                   elapsed_s=0.0, downtime_s=0.0)
                resume_of = fields.get("resume_of")
                if resume_of is not None:
                    row.resumed_from = s.scalars(
                        select(TrialAttempt.id).where(TrialAttempt.study_name == study,
                                                      TrialAttempt.trial_number == resume_of)
                        .order_by(TrialAttempt.attempt.desc())).first()
                s.add(row)
            if row.status in _ENDED and fields.get("status", row.status) == "running":
                return {"status": row.status}         # a late repeat of an earlier call
            for key in ("status", "checkpoint_path", "elapsed_s", "downtime_s",
                        "mlflow_run_id"):
                if fields.get(key) is not None:
                    setattr(row, key, fields[key])
            row.last_heartbeat = now
            if row.status in _ENDED and row.ended_at is None:
                row.ended_at = now
            return {"status": row.status}

    # -- recovery -----------------------------------------------------------------------------
    def claim_lost(self, study: str, stale_s: float,
                   alive_since: datetime) -> list[dict[str, Any]]:
        """Gives up ``study``'s workers silent for ``stale_s`` (counted from ``alive_since`` at the
        earliest: a restarted server gives every worker time to reconnect) and claims their
        running attempts, each exactly once across every caller."""
        cutoff = self._now() - timedelta(seconds=stale_s)
        if alive_since > cutoff - self._offset:     # alive_since: this machine's clock
            return []
        claimed = []
        with Session(self.engine) as s, s.begin():
            for worker in s.scalars(select(Worker).where(Worker.study_name == study,
                                                         Worker.status == "running",
                                                         Worker.last_heartbeat < cutoff)):
                worker.status = "lost"
            rows = [(row.id, name, beat) for row, name, beat in s.execute(
                select(TrialAttempt, Worker.name, Worker.last_heartbeat)
                .join(Worker, TrialAttempt.worker_id == Worker.id)
                .where(TrialAttempt.study_name == study, TrialAttempt.status == "running",
                       Worker.status.in_(("lost", "stopped")))).all()]
        for attempt_id, worker_name, last_beat in rows:
            with Session(self.engine) as s, s.begin():
                done = s.execute(update(TrialAttempt)
                                 .where(TrialAttempt.id == attempt_id,
                                        TrialAttempt.status == "running")
                                 .values(status="lost", ended_at=self._now()))
                won = int(getattr(done, "rowcount", 0))
                if not won:
                    continue                      # another recoverer was first
                row = s.get(TrialAttempt, attempt_id)
                if row is None:
                    continue
                claimed.append({"study": row.study_name, "trial_number": row.trial_number,
                                "attempt": row.attempt, "worker": worker_name,
                                "checkpoint_path": row.checkpoint_path,
                                "elapsed_s": row.elapsed_s,
                                "last_heartbeat": (min(last_beat, row.last_heartbeat)
                                                   - self._offset).replace(
                                    tzinfo=UTC).timestamp()})   # on this machine's clock
        return claimed

    def forget(self, study: str) -> dict[str, Any]:
        """Drops ``study``'s workers and attempts: those of an earlier study of that name,
        deleted since (``optuna delete-study``), whose trial numbers a new study reuses."""
        with Session(self.engine) as s, s.begin():
            attempts = s.execute(delete(TrialAttempt).where(TrialAttempt.study_name == study))
            workers = s.execute(delete(Worker).where(Worker.study_name == study))
        return {"attempts": int(getattr(attempts, "rowcount", 0) or 0),
                "workers": int(getattr(workers, "rowcount", 0) or 0)}

    def live_studies(self) -> list[str]:
        """Studies with workers on record as running."""
        with Session(self.engine) as s:
            return sorted(set(s.scalars(select(Worker.study_name)
                                        .where(Worker.status == "running"))))

    def attempt_numbers(self, study: str) -> set[int]:
        """Trial numbers of ``study`` that have an attempt on record."""
        with Session(self.engine) as s:
            return set(s.scalars(select(TrialAttempt.trial_number)
                                 .where(TrialAttempt.study_name == study)))

    # -- reading ------------------------------------------------------------------------------
    def workers(self, study: str) -> list[dict[str, Any]]:
        with Session(self.engine) as s:
            return [{"name": w.name, "host": w.host, "pid": w.pid, "status": w.status,
                     "started_at": _iso(w.started_at), "last_heartbeat": _iso(w.last_heartbeat)}
                    for w in s.scalars(select(Worker).where(Worker.study_name == study)
                                       .order_by(Worker.id))]

    def attempts(self, study: str) -> list[dict[str, Any]]:
        with Session(self.engine) as s:
            rows = s.execute(
                select(TrialAttempt, Worker.name)
                .join(Worker, TrialAttempt.worker_id == Worker.id, isouter=True)
                .where(TrialAttempt.study_name == study).order_by(TrialAttempt.id)).all()
            ids = {row.id: row.trial_number for row, _ in rows}
            return [{"trial_number": r.trial_number, "attempt": r.attempt, "worker": name,
                     "status": r.status, "checkpoint_path": r.checkpoint_path,
                     "elapsed_s": r.elapsed_s, "downtime_s": r.downtime_s,
                     "mlflow_run_id": r.mlflow_run_id,
                     "resumes_trial": ids.get(r.resumed_from) if r.resumed_from else None,
                     "started_at": _iso(r.started_at), "ended_at": _iso(r.ended_at)}
                    for r, name in rows]


def _pool_options(url: str) -> dict[str, Any]:
    if database_url(url).startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    return {"pool_size": 2, "max_overflow": 4}
