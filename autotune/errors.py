"""autotune's exceptions: one root, so the CLI can turn any of them into a one-line error."""

from __future__ import annotations

__all__ = ["AutotuneError", "ConfigError", "PlanError", "SpaceError", "LaunchError",
           "StudyFailing", "disk_full", "is_disk_full", "path_refused", "shipped_hint"]


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is a write that found its disk (or the user's quota) full."""
    import errno

    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(error: OSError) -> str:
    """The one line for a full disk: where, how much is free there, and what to do."""
    import os
    import shutil
    from pathlib import Path

    notes = []
    where = ""
    if error.filename:
        folder = Path(str(error.filename)).parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        where = f" holding {folder}"
        try:
            notes.append(f"{shutil.disk_usage(folder).free / 2**20:.0f} MiB free")
        except OSError:
            pass
    if error.strerror and error.strerror != os.strerror(error.errno or 0):
        notes.append(error.strerror)      # whose disk, where the error says so
    said = f" ({'; '.join(notes)})" if notes else ""
    return (f"no space left on the disk{where}{said}: free some there, or give run_dir, "
            "storage or tracking_uri on another disk; the same command resumes the study, and "
            "a trial that was running resumes from its latest checkpoint")


def path_refused(error: BaseException) -> str | None:
    """The one line for a path the system refuses to open (a name too long for the file
    system, no permission, a read-only file system), or None for any other error."""
    import errno

    if not isinstance(error, OSError) or not error.filename:
        return None
    path = str(error.filename)
    if error.errno == errno.ENAMETOOLONG:
        return (f"{path}: a name in this path is longer than the file system allows (255 bytes "
                "on most); give a shorter one")
    if error.errno in (errno.EACCES, errno.EPERM):
        return (f"{path}: permission denied; give a path this user may read and write, or "
                "change its permissions")
    if error.errno == errno.EROFS:
        return f"{path}: the file system is read-only; give a path on a writable one"
    return None


def shipped_hint(ref: str, shipped: list[str], what: str) -> str:
    """`` (did you mean the shipped WHAT NAME?)`` for ``ref``, a name almost one of
    ``shipped`` (another case, a file suffix, a typo), or ""."""
    import difflib
    from pathlib import PurePath

    stem = PurePath(ref).name.lower().split(".", 1)[0]
    near = [stem] if stem in shipped else difflib.get_close_matches(stem, shipped, n=2)
    return f" (did you mean the shipped {what} {' or '.join(near)}?)" if near else ""


class AutotuneError(Exception):
    """Root of autotune's errors. Its message says what was wrong and what is allowed."""


class ConfigError(AutotuneError):
    """A study file or a command-line flag is invalid."""


class SpaceError(AutotuneError):
    """A search space is invalid or cannot be loaded. ``problems`` lists every problem found;
    the message is the first, with a count of the others."""

    def __init__(self, message: str, *, problems: list[str] | None = None,
                 constraint: str = "") -> None:
        self.problems = list(problems) if problems else [message]
        self.constraint = constraint
        more = len(self.problems) - 1
        if more:
            message = (f"{message} (and {more} more problem(s); `autotune space check` lists "
                       "them all)")
        super().__init__(message)


class PlanError(AutotuneError):
    """Sampled parameters cannot be turned into a training plan on this hardware."""


class LaunchError(AutotuneError):
    """A trainer could not be started."""


class StudyFailing(AutotuneError):
    """Every trial a process ran failed alike, in a way no configuration causes
    (``decisions.systematic_failure``): it stops taking trials until that is fixed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: the running trial is ended and recorded, nothing is left
    running, and the study can be resumed."""


class Stopped(KeyboardInterrupt):
    """``start study`` stopped on a first Ctrl-C or SIGTERM (``signum``) after its running
    trials saved checkpoints they resume from when the study is resumed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
