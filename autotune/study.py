"""`autotune start study`: open the study, run its trials with local workers, summarize."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from . import record
from ._channel import is_server_url
from ._preflight import check_ranks, check_writable
from .config import (
    StudyConfig,
    cadence_warning,
    config_changes,
    redact,
    resolve_tracking_uri,
)
from .control import RECONNECT_GRACE, StallGuard, WorkerSession, recover, registry_for, stall_grace
from .db import utcnow
from .decisions import TrialResult, elapsed_of
from .errors import ConfigError, PlanError, SpaceError
from .modes import make_pruner, make_sampler
from .plan import Hardware, resolve
from .space import DataInfo, SearchSpace, check_space, load_space
from .store import open_storage
from .tracking import Tracker, ui_command
from .trial_runner import TrialRunner

__all__ = ["run_study", "open_storage", "format_result"]   # open_storage: from .store

Print = Callable[[str], None]


def _check_warm_starts(space: SearchSpace, cfg: StudyConfig, train_size: int) -> None:
    hardware = Hardware(world_size=cfg.ranks_per_trial, device=cfg.device,
                        max_micro_batch=cfg.trainer.max_micro_batch)
    for point in space.warm_starts:
        try:
            resolve(point, trainer=cfg.trainer.__dict__, train_size=train_size,
                    hardware=hardware, target=cfg.target.__dict__,
                    max_seconds=cfg.budget.max_trial_s)
        except PlanError as e:
            raise ConfigError(f"warm start {point} of space {space.name!r}: {e}") from e


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_result(r: TrialResult, metric: str) -> str:
    """The terminal line of a finished trial."""
    params = " ".join(f"{k}={_short(v)}" for k, v in r.params.items())
    if r.outcome == "reached":
        tail = f"reached   TTA {r.value:.2f} s ({metric} {r.best_metric:.3f})"
    elif r.outcome == "censored":
        best = f"best {metric} {r.best_metric:.3f}" if r.evals else (
            "no evaluation yet" if r.reason != "max_seconds" else
            "no evaluation within budget.max_trial_s: evaluate more often (trainer."
            "eval_every_s or eval_every_steps) or raise the cap")
        tail = f"censored  ({r.reason}) after {r.value:.2f} s, {best}"
    else:
        tail = f"failed    ({r.reason}) {r.detail}"[:200]
    return f"[trial {r.number:3d}] {params} | {tail}"


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that ran and ended (``record.finished``)."""
    return record.finished(study.get_trials(deepcopy=False))


def _counts(trials: list[FrozenTrial]) -> dict[str, int]:
    counts = {"reached": 0, "censored": 0, "failed": 0}
    for t in trials:
        outcome = t.user_attrs.get(record.OUTCOME,
                                   "failed" if t.state == TrialState.FAIL else "")
        if outcome in counts:
            counts[outcome] += 1
    return counts


def _absolute_data(cfg: StudyConfig) -> StudyConfig:
    """``cfg`` with an ImageFolder path made absolute (relative to the study file)."""
    data = dict(cfg.trainer.data)
    if data.get("kind") == "imagefolder" and not Path(str(data["path"])).is_absolute():
        data["path"] = str((Path(cfg.base_dir) / str(data["path"])).resolve())
        trainer = dataclasses.replace(cfg.trainer, data=data)
        return dataclasses.replace(cfg, trainer=trainer)
    return cfg


def _absolute_paths(cfg: StudyConfig) -> StudyConfig:
    """Local paths made absolute, so workers started elsewhere find the same folders."""
    _, artifacts = resolve_tracking_uri(cfg.tracking_uri)
    tracking = cfg.tracking_uri if artifacts is None else str(
        Path(cfg.tracking_uri).expanduser().resolve())
    return dataclasses.replace(cfg, tracking_uri=tracking,
                               run_dir=str(Path(cfg.run_dir).expanduser().resolve()))


def _prepare(cfg: StudyConfig) -> tuple[StudyConfig, SearchSpace, int]:
    """Everything that can be checked before a store is touched; the config with its data's
    number of classes."""
    from trainers.sources import image_size_default, num_classes, train_size

    check_writable(cfg.tracking_uri, "tracking_uri")
    check_writable(cfg.run_dir, "run_dir")
    if cfg.workers >= 1:
        check_ranks(cfg.device, cfg.ranks_per_trial, cfg.workers, cfg.oversubscribe,
                    "oversubscribe: true (or --oversubscribe)")
    try:
        size = train_size(cfg.trainer.data)
        classes = num_classes(cfg.trainer.data)
    except ValueError as e:
        raise ConfigError(f"{cfg.source}: trainer.data: {e}") from e
    data = DataInfo(train_images=size, num_classes=classes,
                    image_size=int(cfg.trainer.data.get("image_size", image_size_default(
                        cfg.trainer.data))), kind=str(cfg.trainer.data.get("kind", "digits")))
    space = load_space(cfg.search_space, base_dir=cfg.base_dir, world_size=cfg.ranks_per_trial,
                       data=data)
    problems = check_space(space)
    if problems:
        raise SpaceError(f"{space.source_file}: {problems[0]}", problems=problems)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, num_classes=classes))
    _check_warm_starts(space, cfg, size)
    return cfg, space, size


def _check_resumed_config(cfg: StudyConfig, study: optuna.Study, accept: bool,
                          echo: Print) -> None:
    """Refuses to resume ``study`` with a config that changes what it measures."""
    stored = study.user_attrs.get(record.STUDY_CONFIG)
    if not isinstance(stored, dict):
        return
    changes = config_changes(stored, cfg.to_dict())
    if not changes:
        return
    if not accept:
        raise ConfigError(f"study {cfg.study_name!r} exists and was started with another "
                          f"config ({'; '.join(changes)}); pass --accept-changes to resume it "
                          "with these, or set another study_name")
    echo(f"resuming study {cfg.study_name!r} with changes: {'; '.join(changes)}")
    study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())


def _print(line: str) -> None:
    print(line, flush=True)  # a line per trial, live, even into a pipe or a file


def run_study(cfg: StudyConfig, echo: Print = _print, accept_changes: bool = False) -> int:
    """Runs the study ``cfg`` describes until its budget is spent; returns an exit code.

    A study that exists already is resumed; if its stored config differs from ``cfg`` in
    more than how long and where it runs (``config.RESUMABLE``), it is refused with what
    changed, unless ``accept_changes``."""
    cfg = _absolute_paths(_absolute_data(cfg))
    cfg, space, size = _prepare(cfg)
    storage = open_storage(cfg.storage)
    study = optuna.create_study(
        study_name=cfg.study_name, storage=storage, direction="minimize", load_if_exists=True,
        sampler=make_sampler(cfg, cfg.seed),
        pruner=make_pruner(cfg))
    _check_resumed_config(cfg, study, accept_changes, echo)
    folder = Path(cfg.run_dir) / cfg.study_name
    tracker = Tracker(cfg.tracking_uri, cfg.study_name, folder,
                      {"autotune.target": f"{cfg.target.metric}>={cfg.target.value}",
                       "autotune.search_space": space.name,
                       "autotune.storage": cfg.storage.split(":", 1)[0]})
    registry = registry_for(cfg.storage)
    if not is_server_url(cfg.storage):  # trials of workers that died meanwhile
        recover(registry, storage, cfg.study_name, cfg.heartbeat_s, datetime.min, echo)
    existing = study.get_trials(deepcopy=False)
    tracker.start_study({"autotune.target": f"{cfg.target.metric}>={cfg.target.value}"},
                        cfg.public_dict(), space.to_dict(), resumed=bool(existing))
    if not existing:
        study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())
        study.set_user_attr(record.STUDY_SPACE, space.to_dict())
        if cfg.warm_start:
            for point in space.warm_starts:
                study.enqueue_trial(space.encode(point), user_attrs={"warm_start": True})
    done = len(_finished(study))
    todo = None if cfg.budget.n_trials is None else max(cfg.budget.n_trials - done, 0)
    if existing:
        echo(f"resuming study {cfg.study_name!r}: {done} finished trial(s) in "
             f"{redact(cfg.storage)}")
    if todo == 0:
        echo(f"study {cfg.study_name!r} already has {done} finished trials; raise --n-trials "
             "to run more")
    elif cfg.workers == 0:
        _wait_for_remote_workers(cfg, study, registry, storage, echo)
    else:
        session = WorkerSession(registry, cfg.study_name, cfg.heartbeat_s,
                                recover_with=None if is_server_url(cfg.storage)
                                else storage)
        try:
            _run_workers(cfg, space, size, tracker, study, storage, session, todo, echo)
        finally:
            session.close()
    code = _summarize(cfg, study, tracker, echo)
    registry.close()
    return code


def result_of(trial: FrozenTrial) -> TrialResult:
    """A finished trial's result, as recorded in the study store."""
    attrs = trial.user_attrs
    return TrialResult(trial.number, dict(attrs.get(record.PARAMS, trial.params)),
                       str(attrs.get(record.OUTCOME, "failed")),
                       str(attrs.get(record.STOP_REASON, "")), value=elapsed_of(trial),
                       best_metric=float(attrs.get(record.BEST_METRIC, 0.0)),
                       evals=len(attrs.get(record.CURVE, [])),
                       detail=str(attrs.get(record.DETAIL, "")))


def _wait_for_remote_workers(cfg: StudyConfig, study: optuna.Study, registry: Any,
                             storage: Any, echo: Print) -> None:
    """No local worker: report trials as remote workers finish them, until the budget. With
    a direct database URL this process also recovers the trials of workers that die (a
    study server does that itself)."""
    stop_at = None if cfg.budget.timeout_s is None else time.monotonic() + cfg.budget.timeout_s
    direct = not is_server_url(cfg.storage)
    since = utcnow()
    echo(f"study {cfg.study_name!r} waits for workers: autotune worker --storage "
         f"{redact(cfg.storage)} --study {cfg.study_name}")
    shown: set[int] = {t.number for t in _finished(study)}
    pause, guard, due = min(2.0, cfg.heartbeat_s / 4), StallGuard(), None
    while stop_at is None or time.monotonic() < stop_at:
        finished = _finished(study)
        for t in sorted(finished, key=lambda t: t.number):
            if t.number not in shown:
                shown.add(t.number)
                echo(format_result(result_of(t), cfg.target.metric))
        if cfg.budget.n_trials is not None and len(finished) >= cfg.budget.n_trials:
            return
        if direct and guard.may_recover(time.monotonic(), due, stall_grace(cfg.heartbeat_s)):
            try:
                with storage.patience(0):
                    recover(registry, storage, cfg.study_name, cfg.heartbeat_s, since, echo)
            except Exception as e:  # noqa: BLE001 - the database is away; next round
                echo(f"could not check for lost workers: {type(e).__name__}")
                since = datetime.max           # until it is back, and a while after
            else:
                if since == datetime.max:
                    since = utcnow() + RECONNECT_GRACE
        due = time.monotonic() + pause
        time.sleep(pause)


def _run_workers(cfg: StudyConfig, space: SearchSpace, size: int, tracker: Tracker,
                 study: optuna.Study, storage: Any, session: WorkerSession,
                 todo: int | None, echo: Print) -> None:
    stop_at = None if cfg.budget.timeout_s is None else time.monotonic() + cfg.budget.timeout_s
    folder = tracker.folder
    runner = TrialRunner(cfg, space, size, run_dir=folder, tracker=tracker, stop_at=stop_at,
                         storage=storage, session=session)
    lock = threading.Lock()
    left = [todo]

    def take() -> bool:
        with lock:
            if stop_at is not None and time.monotonic() > stop_at:
                return False
            if left[0] is None:
                return True
            if left[0] <= 0:
                return False
            left[0] -= 1
            return True

    def work() -> None:
        try:
            while take():
                result = runner.run(study)
                with lock:
                    echo(format_result(result, cfg.target.metric))
        finally:
            runner.close()   # this thread's warm trainer ranks leave

    target = f"{cfg.target.metric} >= {cfg.target.value}"
    echo(f"study {cfg.study_name!r}: search space {space.name}, target {target}, "
         f"{cfg.workers} worker(s) x {cfg.ranks_per_trial} rank(s); trial files in {folder}")
    warning = cadence_warning(cfg)
    if warning:
        echo(warning)
    threads = [threading.Thread(target=work, daemon=True) for _ in range(cfg.workers - 1)]
    for t in threads:
        t.start()
    work()
    for t in threads:
        t.join()
    if stop_at is not None and time.monotonic() >= stop_at - 1.0:
        cut = [t.number for t in study.get_trials(deepcopy=False)
               if t.user_attrs.get(record.STOP_REASON) == "study_timeout"]
        echo(f"study {cfg.study_name!r}: timeout_s ({cfg.budget.timeout_s:g} s) reached; "
             + (f"trial(s) {', '.join(map(str, cut))} were stopped at it (study_timeout)"
                if cut else "no trial was running past it"))


def _summarize(cfg: StudyConfig, study: optuna.Study, tracker: Tracker, echo: Print) -> int:
    trials = _finished(study)
    counts = _counts(trials)
    compute = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials
                  if t.datetime_complete and t.datetime_start)
    summary: dict[str, Any] = {**{f"trials_{k}": v for k, v in counts.items()},
                               "trials": len(trials), "compute_s": compute}
    echo(f"study {cfg.study_name!r}: {len(trials)} trials ({counts['reached']} reached, "
         f"{counts['censored']} censored, {counts['failed']} failed), {compute:.0f} s of compute")
    best_params: dict[str, Any] = {}
    try:
        best = study.best_trial
    except ValueError:
        best = None
    if best is None or best.user_attrs.get(record.OUTCOME) != "reached":
        closest = max(trials, key=lambda t: t.user_attrs.get(record.BEST_METRIC, 0.0),
                      default=None)
        note = "" if closest is None else (
            f"; closest: trial {closest.number} with {cfg.target.metric} "
            f"{closest.user_attrs.get(record.BEST_METRIC, 0.0):.3f}")
        echo(f"no trial reached {cfg.target.metric} >= {cfg.target.value} yet{note}")
    else:
        best_params = dict(best.user_attrs.get(record.PARAMS, {})) or dict(best.params)
        summary["best_tta_s"] = best.value
        summary["best_trial"] = best.number
        echo(f"best: trial {best.number}, time to {cfg.target.metric} >= {cfg.target.value}: "
             f"{best.value:.2f} s")
        for key, value in best_params.items():
            echo(f"  {key} = {_short(value)}")
    tracker.study_plots(study, cfg.target.metric, cfg.target.value, final=True)
    tracker.end_study(summary, best_params)
    if not tracker.close(timeout_s=60):
        echo(f"MLflow at {tracker.uri} is unreachable: {tracker.outbox.pending} record(s) wait "
             f"in {tracker.outbox.spool}; the next run of this study delivers them")
    echo("review the study in the MLflow UI:")
    echo(f"  {ui_command(cfg.tracking_uri, cfg.study_name)}")
    return 0


def quiet_libraries() -> None:
    """Keeps Optuna's and MLflow's own progress logs off the terminal."""
    import mlflow  # noqa: F401 - configures its loggers on import; quiet them afterwards

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
