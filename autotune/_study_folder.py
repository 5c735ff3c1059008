"""Which run folder is a study's own: ``RUN_DIR/NAME``, unless another study's files are there.

A study's trial folders, models and MLflow outbox live under ``RUN_DIR/NAME``. Two studies of
one name meet there when a study's store is deleted to start over, or a study of that name
runs in another store from the same folder; the second would overwrite the first's trial
folders and models and deliver its MLflow records. So a folder carries the id of the study
that made it (``.autotune-study``), and a study whose id is not there takes ``NAME-2``,
``NAME-3``, ... instead. Every process of a study (local workers, ``autotune worker`` on the
same machine) finds the same folder.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from . import record

__all__ = ["LOCK", "MARKER", "hold", "new_uid", "study_folder", "study_uid"]

MARKER = ".autotune-study"
log = logging.getLogger("autotune")


def new_uid() -> str:
    """A new study's id."""
    return uuid.uuid4().hex


def study_uid(study: Any) -> str | None:
    """The id ``study`` keeps (``record.STUDY_UID``); None for a study begun before autotune
    kept one, or a value that is not one of its ids."""
    value = study.user_attrs.get(record.STUDY_UID)
    return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value) else None


def _owner(folder: Path) -> str | None:
    try:
        return (folder / MARKER).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def study_folder(run_dir: Path, name: str, uid: str | None) -> Path:
    """The run folder of the study ``name`` whose id is ``uid``, made with its marker where
    it is new. Without a uid (a study begun before autotune kept one): ``run_dir/name``, as
    it was. A folder appears with its marker in it (made aside, then renamed into place), so
    two processes of one study never take a half-made folder for another study's."""
    if uid is None:
        return run_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    for number in range(1, 10_000):
        folder = run_dir / (name if number == 1 else f"{name}-{number}")
        owner = _owner(folder)
        if owner == uid:
            return folder
        if owner is not None or (folder.exists() and not _empty_dir(folder)):
            continue                # another study's, or files of a study before markers
        aside = run_dir / f".{folder.name}.{uuid.uuid4().hex[:8]}"
        aside.mkdir()
        (aside / MARKER).write_text(uid + "\n")
        try:
            os.rename(aside, folder)   # replaces an empty folder; fails on one with files
        except OSError:
            shutil.rmtree(aside, ignore_errors=True)
            if _owner(folder) == uid:  # a process of this study made it meanwhile
                return folder
            continue
        return folder
    raise RuntimeError(f"no free run folder for study {name!r} in {run_dir}")


def _empty_dir(folder: Path) -> bool:
    try:
        return folder.is_dir() and not any(folder.iterdir())
    except OSError:
        return False


LOCK = ".autotune-running"


def hold(folder: Path) -> Any:
    """Takes ``folder`` for this process's ``start study``: an exclusive lock on its
    ``.autotune-running`` file, which the system releases when the process ends, however it
    ends. Two ``start study`` of one study from one folder would share its MLflow outbox (each
    rewriting the file the other appends to, so a crash could lose records), its plots and its
    best model. Returns the open file, to keep while the study runs; a one-line ConfigError,
    with the holder's process id, where another process holds it. ``autotune worker`` keeps
    its own files under the folder and takes no lock."""
    import fcntl

    from .errors import ConfigError

    folder.mkdir(parents=True, exist_ok=True)
    held = (folder / LOCK).open("a+")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        pid = held.read().strip() or "another process"
        held.close()
        raise ConfigError(f"the study's run folder {folder} is in use by another `start study` "
                          f"of it (process {pid}): wait for that one to end, or run more trials "
                          "at once with an `autotune worker` beside it (or --workers when "
                          "starting)") from None
    except OSError as e:    # a filesystem without locks (Lustre mounted without -o flock)
        log.warning("the study's run folder %s cannot be locked (%s): a second `start study` "
                    "of this study from it would not be refused", folder, e.strerror or e)
    held.seek(0)
    held.truncate()
    held.write(str(os.getpid()))
    held.flush()
    return held
