"""Processes that die with their parent: the launcher with its worker, each rank with its
launcher. Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) delivers SIGKILL to a
process the moment its parent exits, however the parent ended (kill -9 included), so nothing
a dead worker started lingers: not ranks still building or loading, nor ranks waiting for the
next plan. Elsewhere it does nothing (the worker's process group and the report channel's
end still stop them)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> bool:
    """Asks the kernel to SIGKILL this process when its parent exits; True where it can.
    ``parent``: the parent's pid as seen at start, to catch a parent that died before."""
    if not sys.platform.startswith("linux"):
        return False
    expected = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != expected:     # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    return True
