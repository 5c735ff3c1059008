"""`autotune stop study NAME`: stopping a study on every machine at once, from any machine.

The request is a user attribute of the study (``record.STUDY_STOP``), so every worker sees it
through the study store it already reads, whatever machine it is on and whether it reaches the
database directly or through a study server. Each worker checks it before taking a trial and
starts no more; a running trial trains to its end, or, with ``--now``, saves a checkpoint and
stops (it is queued to resume, as on SIGTERM). `start study` on the same study clears the
request and resumes it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import optuna

from . import record
from .config import redact

__all__ = ["clear_stop", "describe", "request_stop", "stop_requested"]


def stop_requested(study: optuna.Study) -> dict[str, Any] | None:
    """The study's stop request (``at``: epoch seconds, ``now``, ``host``), or None."""
    request = study.user_attrs.get(record.STUDY_STOP)
    return request if isinstance(request, dict) else None


def describe(request: dict[str, Any]) -> str:
    """When and from where the study was stopped, and how."""
    at = datetime.fromtimestamp(float(request.get("at", 0.0)), UTC).strftime("%Y-%m-%d %H:%M:%S")
    how = "running trials checkpoint and stop" if request.get("now") else (
        "running trials finish")
    return f"stopped by `autotune stop study` at {at} UTC from {request.get('host', '?')} ({how})"


def clear_stop(study: optuna.Study) -> dict[str, Any] | None:
    """Removes the study's stop request (it is resumed); the request it had, or None."""
    request = stop_requested(study)
    if request is not None:
        study.set_user_attr(record.STUDY_STOP, None)
    return request


def request_stop(study_name: str, storage: str, now: bool,
                 echo: Callable[[str], None] = print) -> int:
    """Asks every worker of ``study_name`` to stop; returns an exit code."""
    from .errors import ConfigError
    from .store import foreign_study, load_existing_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_existing_study(study_name, storage)   # a missing study creates nothing
    foreign = foreign_study(study)
    if foreign:   # its own tool's workers would not read autotune's stop request
        raise ConfigError(f"study {study_name!r} was not made by autotune ({foreign}); it has "
                          "no autotune workers to stop, and it is left as it is")
    before = stop_requested(study)
    request = {"at": time.time(), "now": bool(now or (before or {}).get("now")),
               "host": os.uname().nodename}
    if before is not None and request["now"] == bool(before.get("now")):
        echo(f"study {study_name!r} was already {describe(before)}")
        return 0
    study.set_user_attr(record.STUDY_STOP, request)
    running = [t.number for t in study.get_trials(deepcopy=False,
                                                  states=(optuna.trial.TrialState.RUNNING,))
               if not record.asked_elsewhere(t)]                # a notebook's: not ours
    what = ("running trials save a checkpoint and stop (each is queued to resume)" if now
            else "running trials train to their end")
    echo(f"study {study_name!r} in {redact(storage)}: stop requested; its workers start no new "
         f"trial, and {what}"
         + (f" (running now: trial(s) {', '.join(map(str, running))})" if running else "")
         + "; `autotune start study` with its file resumes it")
    return 0
