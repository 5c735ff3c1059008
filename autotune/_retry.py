"""A study store that rides out a restart: its server's, or its database's.

Every storage call that fails because the other end is gone for the moment (the study server
restarting: gRPC ``UNAVAILABLE``; PostgreSQL restarting: a dropped or refused connection) is
tried again with exponential backoff until ``patience_s`` runs out. Other errors pass through
at once. A thread that must not wait (a worker answering its trainer) lowers its patience with
``with storage.patience(0): ...`` and gets :class:`StoreUnavailable` instead.

A worker asking for a trial creates it already holding its mark (``with
storage.new_trials_hold({...}): study.ask()``): Optuna's ``ask`` writes a bare trial and the
caller writes its attributes after, so a worker killed between the two left a RUNNING trial
that held nothing of autotune's and looked like another Optuna client's forever.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

__all__ = ["RetryingStorage", "StoreUnavailable", "is_transient"]

log = logging.getLogger("autotune")
_FIRST_S, _MAX_S = 0.25, 5.0


class StoreUnavailable(ConnectionError):
    """The study store did not answer within the caller's patience."""


def is_transient(error: BaseException) -> bool:
    """True for errors that mean "the store is not reachable right now"."""
    seen: BaseException | None = error
    while seen is not None:
        code = getattr(seen, "code", None)
        if callable(code) and type(seen).__module__.startswith("grpc"):
            name = getattr(code(), "name", "")
            if name == "UNAVAILABLE":
                return True
            if name == "UNKNOWN" and "OperationalError" in str(seen):
                return True      # the server's own database went away
        module = type(seen).__module__
        if module.startswith("sqlalchemy") and type(seen).__name__ in (
                "OperationalError", "DisconnectionError", "InterfaceError"):
            return True
        if module.startswith("psycopg2") and type(seen).__name__ in (
                "OperationalError", "InterfaceError"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# What a database says when its disk is full: SQLite's, PostgreSQL's (SQLSTATE 53100, "could
# not extend file ... No space left on device"), also as the study server passes them on
_DISK_FULL = ("database or disk is full", "No space left on device", "could not extend file",
              "DiskFull")


def _disk_full(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}"
        if any(sign in text for sign in _DISK_FULL):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RetryingStorage(BaseStorage):
    """Wraps an Optuna storage; see the module docstring."""

    def __init__(self, inner: BaseStorage, where: str, patience_s: float = 1800.0,
                 file: str | None = None) -> None:
        """``where``: the store, in words; ``file``: its SQLite file, if it is one."""
        self._inner = inner
        self._where = where
        self._file = file
        self._patience_s = patience_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def inner(self) -> BaseStorage:
        return self._inner

    @contextlib.contextmanager
    def patience(self, seconds: float) -> Iterator[None]:
        """Within the block, this thread waits at most ``seconds`` for an unreachable store."""
        before = getattr(self._local, "patience", None)
        self._local.patience = seconds
        try:
            yield
        finally:
            self._local.patience = before

    @contextlib.contextmanager
    def new_trials_hold(self, user_attrs: dict[str, Any]) -> Iterator[None]:
        """Within the block, a trial this thread creates (``study.ask()``, where no queued
        trial is waiting) holds ``user_attrs`` from the one write that creates it."""
        before = getattr(self._local, "marks", None)
        self._local.marks = dict(user_attrs)
        try:
            yield
        finally:
            self._local.marks = before

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        marks = getattr(self._local, "marks", None)
        if marks and template_trial is None:
            # started now on this machine's clock, as Optuna's own ask on a database stamps it
            template_trial = FrozenTrial(
                number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
                datetime_complete=None, params={}, distributions={}, user_attrs=dict(marks),
                system_attrs={}, intermediate_values={}, trial_id=-1)
        return int(self._call("create_new_trial", study_id, template_trial))

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method: Callable[..., Any] = getattr(self._inner, name)
        patience = getattr(self._local, "patience", None)
        give_up = time.monotonic() + (self._patience_s if patience is None else patience)
        wait = _FIRST_S
        while True:
            try:
                result = method(*args, **kwargs)
            except Exception as e:
                if _disk_full(e):   # no outage: waiting frees no space
                    raise OSError(errno.ENOSPC, f"{self._where} cannot grow: its disk is full",
                                  self._file) from e
                if not is_transient(e):
                    raise
                self._went_down(e)
                if time.monotonic() + wait > give_up:
                    raise StoreUnavailable(f"{self._where} is unreachable: "
                                           f"{' '.join(str(e).split())[:160]}") from e
                time.sleep(wait)
                wait = min(wait * 2, _MAX_S)
                continue
            self._came_back()
            return result

    def _went_down(self, error: BaseException) -> None:
        with self._lock:
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("%s is unreachable (%s); retrying with backoff", self._where,
                            type(error).__name__)

    def _came_back(self) -> None:
        if self._down_since is None:
            return
        with self._lock:
            if self._down_since is not None:
                log.warning("%s is back after %.0f s", self._where,
                            time.monotonic() - self._down_since)
                self._down_since = None

    def __getattr__(self, name: str) -> Any:  # anything else the wrapped storage offers
        if name.startswith("__") or "_inner" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_local"], state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
        self._lock = threading.Lock()


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: RetryingStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(BaseStorage, name).__doc__
    return method


for _name in dir(BaseStorage):
    if (not _name.startswith("_") and callable(getattr(BaseStorage, _name))
            and _name not in RetryingStorage.__dict__):    # its own: create_new_trial
        setattr(RetryingStorage, _name, _delegate(_name))
RetryingStorage.__abstractmethods__ = frozenset()
