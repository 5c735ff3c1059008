"""`autotune status STUDY`: a study's trials, its workers and the best time-to-accuracy."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna

from . import record
from ._channel import is_server_url
from ._console import model_note, short
from .config import DEFAULT_STORAGE, database_url, redact, sqlite_file
from .decisions import elapsed_of
from .stopping import describe, stop_requested

__all__ = ["list_studies", "show"]


def _registry_reads(url: str, study: str) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """The study's registered workers (name, host, status, last heartbeat), and for each trial
    with an attempt on record, the seconds since its latest attempt started (on the
    registry's clock: Optuna's own start stamps come from the clock of whichever machine took
    the trial)."""
    from sqlalchemy import create_engine, inspect

    from .control import registry_for
    from .db import Registry, Worker, utcnow

    if is_server_url(url):
        client: Any = registry_for(url)       # the study server's control channel
        try:
            workers, attempts = list(client.workers(study=study)), client.attempts(study=study)
        finally:
            client.close()
        now = utcnow()
    else:
        engine = create_engine(database_url(url))
        try:
            if not inspect(engine).has_table(Worker.__tablename__):
                return [], {}
        finally:
            engine.dispose()
        registry = Registry(url, create=False)
        try:
            workers, attempts = registry.workers(study), registry.attempts(study)
            now = utcnow() + timedelta(seconds=registry.offset_s())
        finally:
            registry.close()
    since: dict[int, float] = {}
    for attempt in attempts:        # in the order recorded: the latest attempt last
        with contextlib.suppress(KeyError, TypeError, ValueError):
            started = datetime.fromisoformat(str(attempt["started_at"]))
            since[int(attempt["trial_number"])] = max((now - started).total_seconds(), 0.0)
    return workers, since


def list_studies(storage: str, echo: Callable[[str], None] = print) -> int:
    """Every study in ``storage``: its trials, how many reached the target, its best TTA, and
    whether it was stopped."""
    from .store import foreign_study, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = open_storage(storage, create=False)
    summaries = optuna.get_all_study_summaries(store, include_best_trial=False)
    echo(f"{len(summaries)} stud{'y' if len(summaries) == 1 else 'ies'} in {redact(storage)}"
         + (":" if summaries else ""))
    for summary in sorted(summaries, key=lambda s: s.study_name):
        study = optuna.load_study(study_name=summary.study_name, storage=store)
        trials = study.get_trials(deepcopy=False)
        if foreign_study(study):
            echo(f"  {summary.study_name}: {len(trials)} trial(s), not made by autotune")
            continue
        best = record.best_reached(trials)
        running = sum(t.state.name == "RUNNING" for t in trials)
        line = (f"  {summary.study_name}: {len(trials)} trial(s), "
                f"{len(record.reached(trials))} reached"
                + (f", {running} running" if running else "")
                + (f", best TTA {best.value:.2f} s (trial {best.number})" if best else ""))
        echo(line + (", stopped" if stop_requested(study) is not None else ""))
    if summaries:
        echo("details: autotune status STUDY" + ("" if storage == DEFAULT_STORAGE
                                                  else f" --storage {redact(storage)}"))
    return 0


def show(study_name: str, storage: str, echo: Callable[[str], None] = print) -> int:
    from .store import foreign_study, load_existing_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_existing_study(study_name, storage)   # a missing study creates nothing
    trials = study.get_trials(deepcopy=False)
    now = datetime.now()    # Optuna stamps a trial's start in the local time, not UTC
    echo(f"study {study_name!r} in {redact(storage)}: {len(trials)} trial(s)")
    foreign = foreign_study(study)
    if foreign:   # its values are not seconds: list its trials without them
        echo(f"not made by autotune ({foreign}): its trials are listed without times, and "
             "`autotune start study` will not add to it")
    halted = stop_requested(study)
    if halted is not None:
        echo(f"{describe(halted)}; `autotune start study` resumes it")
    workers, on_record = _registry_reads(storage, study_name)
    echo(f"{'trial':>5}  {'state':8}  {'outcome':10}  {'reason':14}  {'seconds':>9}  params")
    best = None
    for t in trials:
        outcome = t.user_attrs.get(record.OUTCOME, "")
        if not foreign and record.told_elsewhere(t):   # a notebook's study.tell(), say
            outcome = "elsewhere"
        if t.state.name == "RUNNING":
            seconds = on_record.get(t.number)
            if seconds is None:     # no attempt on record: Optuna's stamp
                seconds = (now - (t.datetime_start or now)).total_seconds()
            value = f"{seconds:.0f} s on"
        else:
            elapsed = None if foreign or outcome == "elsewhere" else elapsed_of(t)
            value = "" if elapsed is None else f"{elapsed:.2f}"
        if outcome == "reached" and t.value is not None and (
                best is None or t.value < float(best.value or 0.0)):
            best = t
        shown = t.user_attrs.get(record.PARAMS, t.params)
        if t.state.name == "WAITING" and not shown:   # queued: the configuration it will try
            shown = t.system_attrs.get("fixed_params") or {}
        params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in shown.items())
        echo(f"{t.number:>5}  {t.state.name:8}  {outcome:10}  "
             f"{t.user_attrs.get(record.STOP_REASON, ''):14}  {value:>9}  {params}")
    others = 0 if foreign else sum(record.told_elsewhere(t) for t in trials)
    if others:
        echo(f"elsewhere: {others} trial(s) asked and told by another Optuna client (a "
             "notebook's study.tell, say): no time to accuracy, not counted in the budget")
    if workers:
        echo("workers:")
        for w in workers:
            echo(f"  {w['name']} on {w['host']}: {w['status']}, last heartbeat "
                 f"{w['last_heartbeat']} UTC")
    if foreign:
        pass
    elif best is None:
        echo("best: no trial has reached the target yet")
    else:
        echo(f"best: trial {best.number}, TTA {best.value:.2f} s")
        for key, value in (dict(best.user_attrs.get(record.PARAMS, {})) or best.params).items():
            echo(f"  {key} = {short(value)}")
        stored = study.user_attrs.get(record.STUDY_CONFIG) or {}
        run_dir = Path(str(stored.get("run_dir") or "autotune-runs"))
        # the study's run folder, or one of its name here or beside its SQLite file (the
        # project moved since)
        db = sqlite_file(storage)
        model = model_note(best, (str(run_dir), run_dir.name)
                           + (() if db is None else (str(db.parent / run_dir.name),)))
        if model:
            echo(f"  model: {model}")
    return 0
