"""DeepSpeed's shared-memory op on CPU ranks, left out where ``/dev/shm`` cannot hold it.

When a CPU process group opens through DeepSpeed, every rank maps a buffer of about 66 MiB in
``/dev/shm`` for DeepSpeed's shared-memory all-reduce, which only its inference kernels use
(training's gradients go through torch.distributed). A container's ``/dev/shm`` is often
small (Docker's default is 64 MiB): the ranks then die of a bus error or a segmentation fault
before their first step, and every trial fails alike. Where the free space cannot hold one
buffer per rank on this machine, the op is marked unusable, as DeepSpeed itself marks it off
Linux, and the rank says so in its log.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["BUFFER_BYTES", "free_bytes", "leave_out_if_no_room", "loader_note",
           "local_ranks", "room_note"]

# the op's workspace: 2 x 1 MiB (its naive all-reduce) + 2 x 32 MiB (chunks), with its flags
BUFFER_BYTES = 69_206_024
_OP = "deepspeed_shm_comm"


def room_note(free_bytes: int, local_ranks: int) -> str | None:
    """Why the op cannot be used with ``free_bytes`` free in /dev/shm for ``local_ranks``
    ranks on this machine (a quarter more than their buffers, for the loaders' batches);
    None where it fits."""
    need = int(local_ranks * BUFFER_BYTES * 1.25)
    if free_bytes >= need:
        return None
    return (f"/dev/shm has {free_bytes / 2**20:.0f} MiB free, less than DeepSpeed's "
            f"shared-memory op needs for {local_ranks} rank(s) ({need / 2**20:.0f} MiB): it is "
            "left out (training does not use it)")


def leave_out_if_no_room() -> str | None:
    """Marks DeepSpeed's shared-memory op unusable in this process where /dev/shm cannot hold
    this machine's ranks' buffers; returns the note it made, or None. Call it before
    DeepSpeed opens the process group."""
    free = free_bytes()
    note = None if free is None else room_note(free, local_ranks())
    if note is None:
        return None
    try:
        import deepspeed.ops
    except ImportError:
        return None
    deepspeed.ops.__compatible_ops__[_OP] = False
    return note


def local_ranks() -> int:
    """The ranks on this machine, as the launcher's environment says (all of them where it
    does not: a bound from above)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)


def free_bytes() -> int | None:
    """Free bytes in /dev/shm; None where there is none (not Linux)."""
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return None


def loader_note(free: int, ranks: int, workers: int, batch: int, size: int) -> str | None:
    """Why a data loader's worker processes cannot hand their batches over through /dev/shm
    (``free`` bytes free): ``ranks`` ranks here, each with ``workers`` processes that hold at
    least one batch of ``batch`` float32 images of ``size`` pixels at a time (more when they
    run ahead of training: a shortage short of this bound is left to PyTorch's own error, so a
    machine whose loaders would manage is never slowed); None where they fit."""
    need = ranks * workers * batch * 3 * size * size * 4
    if free >= need:
        return None
    return (f"/dev/shm has {free / 2**20:.0f} MiB free, less than the data loaders need to "
            f"pass batches of {batch} images at {size} px from {workers} worker process(es) "
            f"({need / 2**20:.0f} MiB for {ranks} rank(s)): images are read in the ranks "
            "themselves, slower; give the machine more shared memory (docker run "
            "--shm-size=2g) to read them in worker processes")
