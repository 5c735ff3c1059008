"""Which trainer program a study runs, and whether a worker runs it.

``trainer.program`` names a bundled trainer (a runnable module of ``trainers/``, such as
``image_classifier``), a script of the user's own (a ``.py`` path, relative to the study file),
or an importable module (``mypackage.train``), whose file is then the script. A script is
written into the study as its absolute path with the SHA-256 of its content
(``trainer.program_sha256``), so every worker runs exactly the code the study was started
with, and the study refuses to resume with an edited script unless told to.

Who may run what: the workers ``autotune start study`` starts run the study file's program
(the user who wrote the file started them). An ``autotune worker`` joining a study from its
store runs the bundled trainers, and a script of a study's own only when its operator allowed
it (``--allow-program PATH``: the script or a folder above it): a study's config comes from its
store, which must not be enough to make a machine run a file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path

from .errors import ConfigError, LaunchError

__all__ = ["bundled", "check_allowed", "digest", "is_bundled", "resolve_program",
           "script_of"]


def bundled() -> list[str]:
    """The bundled trainer programs: the runnable modules of ``trainers/``."""
    import trainers

    return sorted(p.stem for p in Path(trainers.__file__).parent.glob("*.py")
                  if not p.stem.startswith("_") and "__main__" in p.read_text())


def is_bundled(program: str) -> bool:
    return program in bundled()


def digest(path: Path) -> str:
    """The SHA-256 of a script's content, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def resolve_program(program: str, base_dir: str | Path) -> str:
    """The program as a worker runs it: a bundled trainer's name unchanged, else the absolute
    path of the script (``program`` a path relative to ``base_dir``, or a module name).
    ConfigError, one line, when there is no readable script there."""
    if is_bundled(program):
        return program
    allowed = (f"name a bundled trainer ({', '.join(bundled())}), a .py script (relative to "
               "the study file) or an importable module")
    if not program.strip():
        raise ConfigError(f"trainer.program is empty; {allowed}")
    path = (Path(base_dir) / Path(program).expanduser()).resolve()
    if path.is_file() or program.endswith(".py") or os.sep in program or "/" in program:
        if not path.is_file():
            raise ConfigError(f"trainer.program {program!r}: no file at {path}; {allowed}")
    else:
        found = _module_file(program)
        if found is None:
            raise ConfigError(f"trainer.program {program!r} is not a bundled trainer, a .py "
                              f"file nor a module with a .py file here; {allowed}")
        path = found.resolve()
    if path.suffix != ".py":
        raise ConfigError(f"trainer.program {program!r}: {path} is not a Python script (.py)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"trainer.program {program!r}: {path} cannot be read ({e})") from e
    try:
        compile(text, str(path), "exec")
    except SyntaxError as e:
        raise ConfigError(f"trainer.program {program!r}: {path} is not valid Python (line "
                          f"{e.lineno}: {e.msg})") from e
    return str(path)


def script_of(program: str) -> Path:
    """The file a worker launches for ``program`` (a bundled name or an absolute path)."""
    if is_bundled(program):
        import trainers

        return Path(trainers.__file__).parent / f"{program}.py"
    path = Path(program)
    if not path.is_absolute() or path.suffix != ".py":
        raise LaunchError(f"trainer.program {program!r} is neither a bundled trainer "
                          f"({', '.join(bundled())}) nor the absolute path of a script")
    return path


def check_allowed(program: str, sha256: str, allowed: Iterable[str | Path],
                  study: str) -> None:
    """Whether this worker may run the study's ``program`` (LaunchError, one line, if not):
    bundled trainers always; a script when it lies in one of ``allowed`` (files or folders)
    and still has the content the study was started with."""
    if is_bundled(program):
        return
    path = script_of(program)
    roots = [Path(a).expanduser().resolve() for a in allowed]
    if not any(path == root or root in path.parents for root in roots):
        raise LaunchError(f"study {study!r} runs its own script {path}; this worker runs only "
                          f"the bundled trainers unless started with --allow-program {path} "
                          "(or a folder holding it)")
    if not path.is_file():
        raise LaunchError(f"study {study!r} runs {path}, which is not on this machine; copy "
                          "it to the same path (as its data) or run the worker where it is")
    if sha256 and digest(path) != sha256:
        raise LaunchError(f"study {study!r} was started with another version of {path} (its "
                          "SHA-256 differs); run the worker with the script the study was "
                          "started with, or resume the study with `autotune start study "
                          "--accept-changes` to record this one")
