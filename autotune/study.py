"""`autotune start study`: open the study, run its trials with local workers (or wait for
remote ones), summarize.

What is checked before the store is touched is ``_study_setup``; what the study prints and
records at its end, ``_console``; one trial, ``trial_runner``."""

from __future__ import annotations

import shlex
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from . import __version__, record
from ._channel import is_server_url
from ._config_checks import cadence_warning
from ._console import Print, budget_left, finished, format_result, result_of, summarize
from ._study_folder import hold, new_uid, study_folder, study_uid
from ._study_setup import check_experiment, check_resumed_config, prepare
from .config import StudyConfig, redact
from .control import RECONNECT_GRACE, StallGuard, WorkerSession, recover, registry_for, stall_grace
from .db import utcnow
from .decisions import TrialResult, systematic_failure
from .errors import Stopped, StudyFailing, Terminated
from .modes import make_pruner, make_sampler
from .space import SearchSpace
from .stopping import clear_stop, describe, stop_requested
from .store import open_storage
from .tracking import Tracker, follow_moved_store
from .trial_runner import TrialRunner

__all__ = ["run_study"]


def _print(line: str) -> None:
    print(line, flush=True)  # a line per trial, live, even into a pipe or a file


def run_study(cfg: StudyConfig, echo: Print = _print, accept_changes: bool = False) -> int:
    """Runs the study ``cfg`` describes until its budget is spent; returns an exit code.

    A study that exists already is resumed; if its stored config differs from ``cfg`` in
    more than how long and where it runs (``config.RESUMABLE``), it is refused with what
    changed, unless ``accept_changes``."""
    cfg, space, size = prepare(cfg, echo)
    moved = follow_moved_store(cfg.tracking_uri)
    if moved:
        echo(moved)
    storage = open_storage(cfg.storage)
    study = optuna.create_study(
        study_name=cfg.study_name, storage=storage, direction="minimize", load_if_exists=True,
        sampler=make_sampler(cfg, cfg.seed),
        pruner=make_pruner(cfg))
    check_experiment(cfg, study_uid(study), new=record.STUDY_CONFIG not in study.user_attrs)
    check_resumed_config(cfg, study, accept_changes, echo)
    # a study under way: its folder is taken before anything is written to the study
    early = None if study_uid(study) is None else hold(
        study_folder(Path(cfg.run_dir), cfg.study_name, study_uid(study)))
    try:
        halted = clear_stop(study)
        if halted is not None:
            echo(f"study {cfg.study_name!r} was {describe(halted)}; resuming it")
        existing = study.get_trials(deepcopy=False)
        if existing:   # a resume draws on from where the study is, not the first run's draws again
            study.sampler = make_sampler(cfg, cfg.seed + 1_000_003 * len(existing))
        if not existing and cfg.warm_start:
            for point in space.warm_starts:
                study.enqueue_trial(space.encode(point), user_attrs={"warm_start": True})
        if record.STUDY_CONFIG not in study.user_attrs:  # workers wait for it before joining
            _forget_earlier(cfg, echo)
            study.set_user_attr(record.STUDY_UID, new_uid())
            study.set_user_attr(record.STUDY_SPACE, space.to_dict())
            study.set_user_attr(record.STUDY_VERSION, __version__)
            study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())
        uid = study_uid(study)
        folder = study_folder(Path(cfg.run_dir), cfg.study_name, uid)
    except BaseException:
        if early is not None:
            early.close()
        raise
    with early if early is not None else hold(folder):   # held while the file is open
        if folder.name != cfg.study_name:
            echo(f"{Path(cfg.run_dir) / cfg.study_name} holds another study's files (a study of "
                 "that name in another store, or one whose store was deleted): this study's go to "
                 f"{folder}")
        tracker = Tracker(cfg.tracking_uri, cfg.study_name, folder,
                          {"autotune.target": cfg.target.tag,
                           "autotune.search_space": space.name,
                           "autotune.storage": cfg.storage.split(":", 1)[0],
                           "autotune.study": cfg.study_name}, uid=uid)
        registry = registry_for(cfg.storage)
        if not is_server_url(cfg.storage):  # trials of workers that died meanwhile
            recover(registry, storage, cfg.study_name, cfg.heartbeat_s, datetime.min, echo)
        tracker.start_study({"autotune.target": cfg.target.tag},
                            cfg.public_dict(), space.to_dict(), resumed=bool(existing))
        done = len(finished(study))
        todo = None if cfg.budget.n_trials is None else max(cfg.budget.n_trials - done, 0)
        if existing:
            echo(f"resuming study {cfg.study_name!r}: {done} finished trial(s) in "
                 f"{redact(cfg.storage)}")
        failing = None
        if todo == 0:
            echo(f"study {cfg.study_name!r} already has {done} finished trials; raise --n-trials "
                 "to run more")
        elif cfg.workers == 0:
            failing = _wait_for_remote_workers(cfg, study, registry, storage, echo)
        else:
            session = WorkerSession(registry, cfg.study_name, cfg.heartbeat_s,
                                    recover_with=None if is_server_url(cfg.storage)
                                    else storage)
            try:
                failing = _run_workers(cfg, space, size, tracker, study, storage, session, todo,
                                       echo)
            finally:
                session.close()
        code = summarize(cfg, study, tracker, echo)
        registry.close()
        if failing:
            raise StudyFailing(failing)
        return code


def _forget_earlier(cfg: StudyConfig, echo: Print) -> None:
    """Drops the worker registry's records of an earlier study of this name (deleted since,
    as `optuna delete-study` does, leaving autotune's tables alone) before a new one starts:
    its attempts carry the trial numbers the new study reuses, and would pass for the new
    trials' records (a lost worker's trial never resumed, an attempt never recorded)."""
    from .control import NoControlChannel

    registry = registry_for(cfg.storage)
    try:
        dropped = registry.forget(study=cfg.study_name)
    except NoControlChannel:
        return                     # a plain Optuna proxy keeps no registry to forget
    except Exception as e:  # noqa: BLE001 - a study server of an older release: no such call
        code = getattr(e, "code", None)
        if not callable(code) or code().name != "INVALID_ARGUMENT":
            raise
        echo(f"the study server at {redact(cfg.storage)} (another autotune release) cannot "
             "drop the records of an earlier study of this name; if one was deleted, give this "
             "study another name")
        return
    finally:
        registry.close()
    if dropped.get("attempts") or dropped.get("workers"):
        echo(f"study {cfg.study_name!r} is new: the records of {dropped['workers']} worker(s) "
             f"and {dropped['attempts']} trial attempt(s) of an earlier study of that name, "
             "deleted since, are dropped")


def _wait_for_remote_workers(cfg: StudyConfig, study: optuna.Study, registry: Any,
                             storage: Any, echo: Print) -> str | None:
    """No local worker: report trials as remote workers finish them, until the budget (or
    until every trial finished since it started failed alike: ``systematic_failure``, whose
    reason it returns). With a direct database URL this process also recovers the trials of
    workers that die (a study server does that itself)."""
    stop_at = None if cfg.budget.timeout_s is None else time.monotonic() + cfg.budget.timeout_s
    direct = not is_server_url(cfg.storage)
    since = utcnow()
    echo(f"study {cfg.study_name!r} waits for workers: autotune worker --storage "
         f"{shlex.quote(redact(cfg.storage))} --study {cfg.study_name}")
    shown: set[int] = {t.number for t in finished(study)}
    results: list[TrialResult] = []     # of the trials finished since it started
    pause, guard, due = min(2.0, cfg.heartbeat_s / 4), StallGuard(), None
    while stop_at is None or time.monotonic() < stop_at:
        ended = finished(study)
        for t in sorted(ended, key=lambda t: t.number):
            if t.number not in shown:
                shown.add(t.number)
                results.append(result_of(t))
                echo(format_result(results[-1], cfg.target.metric))
        failing = systematic_failure(results)
        if failing:
            return failing
        if cfg.budget.n_trials is not None and len(ended) >= cfg.budget.n_trials:
            return None
        halted = stop_requested(study)
        if halted is not None and not [t for t in study.get_trials(
                deepcopy=False, states=(TrialState.RUNNING,)) if not record.asked_elsewhere(t)]:
            echo(f"study {cfg.study_name!r} was {describe(halted)}; the same command resumes "
                 "it")
            return None
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
    return None


def _run_workers(cfg: StudyConfig, space: SearchSpace, size: int, tracker: Tracker,
                 study: optuna.Study, storage: Any, session: WorkerSession,
                 todo: int | None, echo: Print) -> str | None:
    """Runs ``cfg.workers`` local workers until the budget; returns why they stopped early
    when every trial they ran failed alike (``systematic_failure``), else None."""
    stop_at = None if cfg.budget.timeout_s is None else time.monotonic() + cfg.budget.timeout_s
    folder = tracker.folder
    runner = TrialRunner(cfg, space, size, run_dir=folder, tracker=tracker, stop_at=stop_at,
                         storage=storage, session=session)
    lock = threading.Lock()
    left = [todo]
    stopping: list[int] = []     # the first Ctrl-C or SIGTERM: checkpoint, then stop
    results: list[TrialResult] = []
    failing: list[str] = []      # every trial failed alike: start no more
    halted: list[dict[str, Any]] = []   # `autotune stop study`: start no more

    def take() -> bool:
        with lock:
            if stopping or failing or halted:
                return False
            try:
                request = stop_requested(study)
            except Exception:  # noqa: BLE001 - the store is away: asked again next trial
                request = None
            if request is not None:
                halted.append(request)
                return False
            if stop_at is not None and time.monotonic() > stop_at:
                return False
            if left[0] is not None and left[0] <= 0:
                return False
            try:     # workers elsewhere (autotune worker, another start study) count too
                more = budget_left(study, cfg.budget.n_trials)
            except Exception:  # noqa: BLE001 - the store is away: this process's count
                more = True
            if not more:
                return False
            if left[0] is not None:
                left[0] -= 1
            return True

    errors: list[BaseException] = []   # a side thread's: raised where the main one returns

    def side_work() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)
            failing.append(f"a worker thread stopped: {type(e).__name__}: {e}")

    def work() -> None:
        try:
            while take():
                result = runner.run(study)
                with lock:
                    echo(format_result(result, cfg.target.metric))
                    results.append(result)
                    why = systematic_failure(results)
                    if why and not failing:
                        failing.append(why)
        finally:
            runner.close()   # this thread's warm trainer ranks leave

    target = cfg.target.text
    echo(f"study {cfg.study_name!r}: search space {space.name}, target {target}, "
         f"{cfg.workers} worker(s) x {cfg.ranks_per_trial} rank(s); trial files in {folder}")
    warning = cadence_warning(cfg)
    if warning:
        echo(warning)
    def on_stop(signum: int, frame: Any) -> None:
        if stopping:          # a second time: stop at once (the running trials are failed)
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        stopping.append(signum)
        runner.interrupt()
        print("autotune: stopping: the running trial saves a checkpoint to resume from "
              "(Ctrl-C again stops at once)", file=sys.stderr, flush=True)

    graceful = threading.current_thread() is threading.main_thread()
    before = {sig: signal.signal(sig, on_stop) for sig in (signal.SIGINT, signal.SIGTERM)
              } if graceful else {}
    try:
        threads = [threading.Thread(target=side_work, daemon=True)
                   for _ in range(cfg.workers - 1)]
        for t in threads:
            t.start()
        work()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if stopping:
        raise Stopped(stopping[0])
    if halted:
        echo(f"study {cfg.study_name!r} was {describe(halted[0])}; the same command resumes it")
    if stop_at is not None and time.monotonic() >= stop_at - 1.0:
        cut = [t.number for t in study.get_trials(deepcopy=False)
               if t.user_attrs.get(record.STOP_REASON) == "study_timeout"]
        echo(f"study {cfg.study_name!r}: timeout_s ({cfg.budget.timeout_s:g} s) reached; "
             + (f"trial(s) {', '.join(map(str, cut))} were stopped at it (study_timeout)"
                if cut else "no trial was running past it"))
    return failing[0] if failing else None
