"""`autotune worker`: join a study from any machine and run its trials one after another.

The study carries everything a worker needs: its config and its search space (JSON, stored
when the study was created), so a worker only needs the storage (a database URL, or a study
server's ``autotune://HOST:PORT``) and the study's name.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from . import __version__, record
from ._channel import is_server_url
from ._console import budget_left, format_result, quiet_libraries
from ._preflight import check_ranks, check_tracking_access, check_writable
from ._study_folder import study_folder, study_uid
from .config import StudyConfig, redact, resolve_tracking_uri, without_credentials
from .control import WorkerSession, registry_for, worker_name
from .decisions import TrialResult, systematic_failure
from .errors import ConfigError, SpaceError, StudyFailing
from .modes import make_pruner, make_sampler
from .programs import check_allowed
from .space import SearchSpace
from .stopping import describe, stop_requested
from .store import foreign_study, open_storage
from .tracking import Tracker, follow_moved_store
from .trial_runner import TrialRunner

__all__ = ["run_worker"]

# How long a worker waits for a study found half-created, its config not yet written.
CREATION_WAIT_S = 30.0


def _load(storage: Any, study_name: str, echo: Callable[[str], None] = print
          ) -> tuple[optuna.Study, StudyConfig, SearchSpace]:
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError as e:
        raise ConfigError(f"no study {study_name!r} there; create it with `autotune start "
                          "study FILE --workers 0`") from e
    foreign = foreign_study(study)
    if foreign:
        raise ConfigError(f"study {study_name!r} was not made by autotune ({foreign}); join a "
                          "study `autotune start study` created")
    attrs = study.user_attrs
    waited_until = time.monotonic() + CREATION_WAIT_S
    if record.STUDY_CONFIG not in attrs:   # `start study` writes it just after creating it
        echo(f"study {study_name!r} has no autotune config yet: waiting up to "
             f"{CREATION_WAIT_S:.0f} s for `autotune start study` to write it")
    while record.STUDY_CONFIG not in attrs and time.monotonic() < waited_until:
        time.sleep(0.5)
        attrs = optuna.load_study(study_name=study_name, storage=storage).user_attrs
    if record.STUDY_CONFIG not in attrs or record.STUDY_SPACE not in attrs:
        raise ConfigError(f"study {study_name!r} holds no autotune config after "
                          f"{CREATION_WAIT_S:.0f} s: it was not created by `autotune start "
                          "study`, or its creation was interrupted (run that command again)")
    cfg, space = _settings(study_name, attrs, echo)
    study = optuna.load_study(study_name=study_name, storage=storage,
                              # no seed: it draws its own; running trials keep workers apart
                              sampler=make_sampler(cfg, None),
                              pruner=make_pruner(cfg))
    return study, cfg, space


def _settings(study_name: str, attrs: dict[str, Any], echo: Callable[[str], None]
              ) -> tuple[StudyConfig, SearchSpace]:
    """The study's stored config and search space, as the autotune release that wrote them
    meant them: where it is another release than this worker's, that is said, and settings
    this release cannot read are refused in one line naming the release to install."""
    written = attrs.get(record.STUDY_VERSION)
    other = written is not None and written != __version__
    try:
        settings = (StudyConfig.from_dict(attrs[record.STUDY_CONFIG]),
                    SearchSpace.from_dict(attrs[record.STUDY_SPACE]))
    except (ConfigError, SpaceError, KeyError, TypeError, ValueError) as e:
        if not other:
            raise
        raise ConfigError(f"study {study_name!r} was started with autotune {written}, whose "
                          f"settings this worker's autotune {__version__} cannot read ({e}); "
                          f"install autotune {written} on this machine and start the worker "
                          "again") from None
    if other:
        echo(f"study {study_name!r} was started with autotune {written} and this worker runs "
             f"{__version__}: use one release on every machine, or its trials are judged by "
             "different rules")
    return settings


def _tracking_credentials(cfg: StudyConfig) -> StudyConfig:
    """``cfg`` with an MLflow tracking URI whose password the study did not keep
    (``http://bob:***@host``) turned into one without it, the password coming from this
    machine's MLFLOW_TRACKING_PASSWORD (and the user name from MLFLOW_TRACKING_USERNAME, or
    the URI), as MLflow's client reads them; a one-line ConfigError where it is not set."""
    import os
    from urllib.parse import unquote, urlparse

    if ":***@" not in cfg.tracking_uri:      # no password, or redact() did not hide one
        return cfg
    if not os.environ.get("MLFLOW_TRACKING_PASSWORD"):
        raise ConfigError(f"study {cfg.study_name!r} records to MLflow at {cfg.tracking_uri}, "
                          "whose password the study does not keep: set "
                          "MLFLOW_TRACKING_PASSWORD (MLflow's own variable) on this machine "
                          "and start the worker again")
    user = urlparse(cfg.tracking_uri).username
    if user:
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", unquote(user))
    return dataclasses.replace(cfg, tracking_uri=without_credentials(cfg.tracking_uri))


def _only_study(storage: Any, storage_url: str, echo: Callable[[str], None]) -> str:
    """The name of the one autotune study in ``storage`` (a worker started without --study);
    a one-line ConfigError naming them when there are none or several."""
    names = [s.study_name for s in optuna.get_all_study_summaries(storage,
                                                                  include_best_trial=False)
             if record.STUDY_CONFIG in s.user_attrs]
    where = redact(storage_url)
    if not names:
        raise ConfigError(f"no autotune study in {where}; create one with `autotune start "
                          "study FILE --workers 0`, then start workers")
    if len(names) > 1:
        raise ConfigError(f"{where} holds {len(names)} autotune studies "
                          f"({', '.join(sorted(names))}); name one with --study NAME")
    echo(f"joining study {names[0]!r}, the only autotune study in {where}")
    return names[0]


def _local_data(cfg: StudyConfig, data_path: str | None) -> tuple[StudyConfig, int]:
    """``cfg`` with its ImageFolder tree where it lies on this machine (``data_path``, else
    where the study was started with it), and its number of training images; a one-line
    ConfigError when it is not there, or is not the study's tree (another number of
    classes)."""
    from trainers.sources import num_classes, train_size

    data = dict(cfg.trainer.data)
    kind = str(data.get("kind", "digits"))
    started_at = data.get("path")
    if data_path is not None:
        if kind != "imagefolder":
            made = ("its own script loads itself" if kind == "examples"
                    else "its trainers make themselves")
            raise ConfigError(f"--data is for a study on an ImageFolder tree; study "
                              f"{cfg.study_name!r} trains on {kind} data, which {made}: "
                              "leave --data out")
        data["path"] = str(Path(data_path).expanduser().resolve())
        for key in ("labels", "val_labels"):   # a table not where it was moved with the tree
            if started_at and data.get(key) and not Path(data[key]).is_file():
                moved = os.path.normpath(os.path.join(data["path"], os.path.relpath(
                    data[key], started_at)))
                data[key] = moved if Path(moved).is_file() else data[key]
    try:
        size, classes = train_size(data), num_classes(data)
    except ValueError as e:
        hint = ("; if the tree lies elsewhere on this machine, give its path with --data PATH"
                if kind == "imagefolder" and data_path is None else "")
        raise ConfigError(f"study {cfg.study_name!r}: its data on this machine: {e}{hint}"
                          ) from None
    if kind == "imagefolder" and classes != cfg.trainer.num_classes:
        raise ConfigError(f"{data['path']} holds {classes} classes, but study "
                          f"{cfg.study_name!r} was started on a tree of "
                          f"{cfg.trainer.num_classes} ({started_at}); give a copy of that tree")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, data=data)), size


def run_worker(storage_url: str, study_name: str | None, echo: Callable[[str], None] = print,
               hostfile: Path | None = None, ranks_per_node: int | None = None,
               oversubscribe: bool = False, allow_programs: tuple[str, ...] = (),
               data_path: str | None = None) -> int:
    """Takes trials of ``study_name`` until its budget is spent or SIGTERM arrives. With a
    ``hostfile``, each trial runs across its nodes (``ranks_per_node`` ranks each, or each
    line's slots), started over ssh from this machine. A study that runs a script of its own
    is joined only when ``allow_programs`` (files or folders) holds it
    (``programs.check_allowed``). ``data_path``: where the study's ImageFolder tree lies on
    this machine (and its nodes), when not where the study was started with it."""
    from ._process import sweep_orphaned_shm_buffers

    quiet_libraries()
    sweep_orphaned_shm_buffers()  # left by an earlier worker on this machine killed with -9
    storage = open_storage(storage_url, create=False)   # joins a study; creates nothing
    if study_name is None:
        study_name = _only_study(storage, storage_url, echo)
    study, cfg, space = _load(storage, study_name, echo)
    halted = stop_requested(study)
    if halted is not None:
        echo(f"study {study_name!r} was {describe(halted)}; nothing to do until `autotune "
             "start study` resumes it")
        return 0
    check_allowed(cfg.trainer.program, cfg.trainer.program_sha256, allow_programs, study_name)
    cfg, size = _local_data(cfg, data_path)
    cfg = _tracking_credentials(cfg)
    if cfg.trainer.weights:
        from trainers.models import weights_file

        try:
            found = weights_file(cfg.trainer.weights, cfg.trainer.model)
        except ValueError as e:
            raise ConfigError(f"study {cfg.study_name!r}: trainer.{e}") from None
        if not found.is_file():
            raise ConfigError(f"study {cfg.study_name!r} starts its models from {found}, "
                              "which is not on this machine; copy the file to that path here")
    check_writable(cfg.run_dir, "the study's run_dir")
    check_writable(cfg.tracking_uri, "the study's tracking_uri")
    check_tracking_access(resolve_tracking_uri(cfg.tracking_uri)[0], "the study's tracking_uri")
    moved = follow_moved_store(cfg.tracking_uri)
    if moved:
        echo(moved)
    if hostfile is None:   # this machine's ranks; a hostfile's nodes say their own slots
        shared = check_ranks(cfg.device, cfg.ranks_per_trial, 1, oversubscribe,
                             "--oversubscribe")
        if shared:
            echo(shared)
    name = worker_name()
    folder = study_folder(Path(cfg.run_dir), cfg.study_name, study_uid(study))
    registry = registry_for(storage_url)
    session = WorkerSession(registry, study_name, cfg.heartbeat_s, name=name,
                            recover_with=None if is_server_url(storage_url)
                            else storage)
    tracker = Tracker(cfg.tracking_uri, cfg.study_name, folder / f"worker-{name}",
                      {"autotune.target": cfg.target.tag,
                       "autotune.study": cfg.study_name}, uid=study_uid(study))
    runner = TrialRunner(cfg, space, size, run_dir=folder,
                         tracker=tracker, storage=storage, session=session, hostfile=hostfile,
                         ranks_per_node=ranks_per_node)
    stopping = []

    def on_sigterm(*_: Any) -> None:  # checkpoint the running trial; it resumes elsewhere
        stopping.append(True)
        runner.interrupt()

    signal.signal(signal.SIGTERM, on_sigterm)
    echo(f"worker {name} joined study {study_name!r} ({redact(storage_url)})")
    results: list[TrialResult] = []
    failing = None
    try:
        while not stopping and not failing and budget_left(study, cfg.budget.n_trials):
            halted = stop_requested(study)
            if halted is not None:
                break
            results.append(runner.run(study))
            echo(format_result(results[-1], cfg.target.metric))
            failing = systematic_failure(results)
    finally:
        runner.close()
        tracker.close(timeout_s=60)
        session.close()
        registry.close()
    if failing:
        raise StudyFailing(f"worker {name}: {failing}")
    why = ("stopped by SIGTERM" if stopping else f"the study was {describe(halted)}"
           if halted is not None else "the study's budget is spent")
    echo(f"worker {name}: {why}")
    return 0
