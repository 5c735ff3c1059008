"""`autotune status STUDY`: a study's trials, its workers and the best time-to-accuracy."""

from __future__ import annotations

import contextlib
import json
import shlex
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


def _study_line(name: str, study: optuna.Study) -> dict[str, Any]:
    """One study of a storage, as ``status`` lists it."""
    from .store import foreign_study

    trials = study.get_trials(deepcopy=False)
    foreign = foreign_study(study)
    if foreign:
        return {"study": name, "trials": len(trials), "not_autotune": foreign}
    best, halted = record.best_reached(trials), stop_requested(study)
    return {"study": name, "trials": len(trials), "not_autotune": None,
            "reached": len(record.reached(trials)),
            "running": sum(t.state.name == "RUNNING" and not record.asked_elsewhere(t)
                           for t in trials),
            "best_trial": None if best is None else best.number,
            "best_tta_s": None if best is None else float(best.value or 0.0),
            "stopped": None if halted is None else describe(halted)}


def list_studies(storage: str, echo: Callable[[str], None] = print,
                 as_json: bool = False) -> int:
    """Every study in ``storage``: its trials, how many reached the target, its best TTA, and
    whether it was stopped (``as_json``: one JSON object)."""
    from .store import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = open_storage(storage, create=False)
    summaries = optuna.get_all_study_summaries(store, include_best_trial=False)
    lines = [_study_line(s.study_name, optuna.load_study(study_name=s.study_name, storage=store))
             for s in sorted(summaries, key=lambda s: s.study_name)]
    if as_json:
        echo(json.dumps({"storage": redact(storage), "studies": lines}))
        return 0
    echo(f"{len(lines)} stud{'y' if len(lines) == 1 else 'ies'} in {redact(storage)}"
         + (":" if lines else ""))
    for one in lines:
        if one["not_autotune"]:
            echo(f"  {one['study']}: {one['trials']} trial(s), not made by autotune")
            continue
        line = (f"  {one['study']}: {one['trials']} trial(s), {one['reached']} reached"
                + (f", {one['running']} running" if one["running"] else "")
                + (f", best TTA {one['best_tta_s']:.2f} s (trial {one['best_trial']})"
                   if one["best_trial"] is not None else ""))
        echo(line + (", stopped" if one["stopped"] is not None else ""))
    if lines:
        flag = "" if storage == DEFAULT_STORAGE else f" --storage {shlex.quote(redact(storage))}"
        echo("details: autotune status STUDY" + flag)
    return 0


def _trial_row(t: optuna.trial.FrozenTrial, foreign: bool, on_record: dict[int, float],
               now: datetime) -> dict[str, Any]:
    """One trial as ``status`` shows it: its state, outcome and reason, its elapsed seconds
    (finished) or seconds on (running), and its configuration."""
    outcome = t.user_attrs.get(record.OUTCOME) or None
    if not foreign and (record.told_elsewhere(t) or record.asked_elsewhere(t)):
        outcome = "elsewhere"                        # a notebook's study.optimize, say
    reason = t.user_attrs.get(record.STOP_REASON) or (
        "ended_elsewhere" if not foreign and record.ended_elsewhere(t) else None)
    row: dict[str, Any] = {"number": t.number, "state": t.state.name, "outcome": outcome,
                           "reason": reason}
    if t.state.name == "RUNNING":
        seconds = on_record.get(t.number)
        if seconds is None:     # no attempt on record: Optuna's stamp
            seconds = (now - (t.datetime_start or now)).total_seconds()
        row["running_s"] = seconds
    else:
        row["elapsed_s"] = None if foreign or outcome == "elsewhere" else elapsed_of(t)
    shown = t.user_attrs.get(record.PARAMS, t.params)
    if t.state.name == "WAITING" and not shown:   # queued: the configuration it will try
        shown = t.system_attrs.get("fixed_params") or {}
    row["params"] = dict(shown)
    return row


def _snapshot(study_name: str, storage: str) -> dict[str, Any]:
    """What ``status STUDY`` reports, as data: the study's trials, workers and best."""
    from .store import foreign_study, load_existing_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_existing_study(study_name, storage)   # a missing study creates nothing
    trials = study.get_trials(deepcopy=False)
    now = datetime.now()    # Optuna stamps a trial's start in the local time, not UTC
    foreign = foreign_study(study)
    halted = stop_requested(study)
    workers, on_record = _registry_reads(storage, study_name)
    rows = [_trial_row(t, bool(foreign), on_record, now) for t in trials]
    snap: dict[str, Any] = {
        "study": study_name, "storage": redact(storage), "not_autotune": foreign,
        "stopped": None if halted is None else describe(halted), "trials": rows,
        "elsewhere": sum(r["outcome"] == "elsewhere" for r in rows),
        "workers": [{k: w[k] for k in ("name", "host", "status", "last_heartbeat")}
                    for w in workers], "best": None}
    best = None if foreign else record.best_reached(trials)
    if best is not None:
        stored = study.user_attrs.get(record.STUDY_CONFIG) or {}
        run_dir = Path(str(stored.get("run_dir") or "autotune-runs"))
        # the study's run folder, or one of its name here or beside its SQLite file (the
        # project moved since)
        db = sqlite_file(storage)
        snap["best"] = {
            "trial": best.number, "tta_s": float(best.value or 0.0),
            "params": dict(best.user_attrs.get(record.PARAMS, {})) or dict(best.params),
            "model": model_note(best, (str(run_dir), run_dir.name)
                                + (() if db is None else (str(db.parent / run_dir.name),)))
            or None}
    return snap


def show(study_name: str, storage: str, echo: Callable[[str], None] = print,
         as_json: bool = False) -> int:
    snap = _snapshot(study_name, storage)
    if as_json:
        echo(json.dumps(snap, default=str))
        return 0
    echo(f"study {study_name!r} in {snap['storage']}: {len(snap['trials'])} trial(s)")
    if snap["not_autotune"]:   # its values are not seconds: list its trials without them
        echo(f"not made by autotune ({snap['not_autotune']}): its trials are listed without "
             "times, and `autotune start study` will not add to it")
    if snap["stopped"] is not None:
        echo(f"{snap['stopped']}; `autotune start study` resumes it")
    echo(f"{'trial':>5}  {'state':8}  {'outcome':10}  {'reason':14}  {'seconds':>9}  params")
    for r in snap["trials"]:
        if "running_s" in r:
            value = f"{r['running_s']:.0f} s on"
        else:
            value = "" if r["elapsed_s"] is None else f"{r['elapsed_s']:.2f}"
        params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in r["params"].items())
        echo(f"{r['number']:>5}  {r['state']:8}  {r['outcome'] or '':10}  "
             f"{r['reason'] or '':14}  {value:>9}  {params}")
    if snap["elsewhere"]:
        echo(f"elsewhere: {snap['elsewhere']} trial(s) asked (and told, or still running) by "
             "another Optuna client (a notebook's study.optimize, say): no time to accuracy, "
             "not counted in the budget, never given up by autotune")
    if snap["workers"]:
        echo("workers:")
        for w in snap["workers"]:
            echo(f"  {w['name']} on {w['host']}: {w['status']}, last heartbeat "
                 f"{w['last_heartbeat']} UTC")
    best = snap["best"]
    if snap["not_autotune"]:
        pass
    elif best is None:
        echo("best: no trial has reached the target yet")
    else:
        echo(f"best: trial {best['trial']}, TTA {best['tta_s']:.2f} s")
        for key, value in best["params"].items():
            echo(f"  {key} = {short(value)}")
        if best["model"]:
            echo(f"  model: {best['model']}")
    return 0
