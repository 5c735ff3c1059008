"""DeepSpeed's compiled op for CPU ranks, built once per Python environment, before a trial.

On CPUs DeepSpeed's communication backend compiles a small C++ op (``deepspeed_shm_comm``,
shared-memory all-reduce) the first time ranks start, about a minute on 2 cores. By default
torch keeps it under ``~/.cache/torch_extensions``, one folder that every Python environment
on the machine shares behind one lock, so a fresh environment's first trials wait there,
inside their setup time. autotune gives each environment its own folder (keyed by its prefix,
torch's and DeepSpeed's versions; ``TORCH_EXTENSIONS_DIR`` set by the user wins) and builds the
op there once, in the worker, before its first launch, saying so: no trial's setup pays it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["ensure_cpu_ops", "extensions_dir"]

_OP = "deepspeed_shm_comm"
_BUILD = (
    "from deepspeed.accelerator import get_accelerator\n"
    "builder = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
    "import deepspeed.ops\n"
    "if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):\n"
    "    builder.load(verbose=False)\n")


def extensions_dir() -> str:
    """This environment's folder for torch's compiled extensions: under autotune's cache
    folder, or, where that cannot be written (a container's read-only home), under the
    machine's temporary folder, so the ranks do not fail making it."""
    from trainers.data import cache_root

    chosen = os.environ.get("TORCH_EXTENSIONS_DIR")
    if chosen:
        return chosen
    folder = cache_root() / "torch_extensions" / _environment_key()
    if not _can_write(folder):
        own = _own_temp_folder()
        if own is not None:
            folder = own / "torch_extensions" / _environment_key()
    return str(folder)


def _own_temp_folder() -> Path | None:
    """``/tmp/autotune-UID``, made private to this user; None where it is not (another user
    made it first, or it is a link): the ranks load compiled code from it."""
    import stat

    folder = Path(tempfile.gettempdir()) / f"autotune-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return folder


def _can_write(folder: Path) -> bool:
    """Whether ``folder`` can be made and written in (``_preflight.check_writable``'s probe)."""
    from ._preflight import check_writable
    from .errors import ConfigError

    try:
        check_writable(str(folder), "the extension folder")
    except ConfigError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _environment_key() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "none"

    key = f"{sys.prefix}|{sys.version_info[:2]}|{of('torch')}|{of('deepspeed')}"
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def _built(folder: str) -> bool:
    return any(Path(folder).glob(f"*/{_OP}/{_OP}.so")) or any(
        Path(folder).glob(f"{_OP}/{_OP}.so"))


def ensure_cpu_ops(env: dict[str, str], echo: Callable[[str], None] = print,
                   timeout_s: float = 1800.0) -> float:
    """Builds the op into ``env``'s extension folder unless it is there; the seconds spent.
    A build that fails is left to the ranks (DeepSpeed then falls back to gloo's all-reduce
    or says why in the trial's log)."""
    folder = env.get("TORCH_EXTENSIONS_DIR") or extensions_dir()
    if _built(folder):
        return 0.0
    echo(f"building DeepSpeed's CPU communication op once for this environment, in {folder} "
         "(about a minute on 2 cores; later trials and workers reuse it)")
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-c", _BUILD], env={**env, "TORCH_EXTENSIONS_DIR":
                                                            folder},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass
    spent = time.monotonic() - started
    echo(f"DeepSpeed's CPU op {'is ready' if _built(folder) else 'did not build'} "
         f"({spent:.0f} s)")
    return spent
