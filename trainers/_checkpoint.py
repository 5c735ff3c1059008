"""A trial's checkpoints: every rank's part (DeepSpeed's model, optimizer and scheduler state,
the trainer's own state as the client state, and each rank's RNG states) in a new folder
``step-N`` under the plan's ``checkpoint_dir``. Older folders are removed only once the new one
is complete and the worker knows of it, so a crash mid-save leaves the previous one intact."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["TAG", "load", "prune", "save"]

TAG = "step-{}"   # a checkpoint's folder under checkpoint_dir, by optimizer step


def save(engine: Any, folder: Path, state: dict[str, Any], rank: int, on_gpu: bool) -> str:
    """Saves this rank's part of a checkpoint of ``state`` (the trainer's own: step, data
    position, clock) at its step; returns the checkpoint's folder once every rank has saved."""
    tag = TAG.format(state["step"])
    engine.save_checkpoint(str(folder), tag=tag, client_state={"autotune": state})
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state_all() if on_gpu else None}
    torch.save(rng, folder / tag / f"rng-rank{rank}.pt")
    dist.barrier()
    return str(folder / tag)


def prune(folder: Path, keep: str) -> None:
    """Removes the checkpoints in ``folder`` other than ``keep`` (rank 0, once the worker has
    acknowledged ``keep``: until then the registry may still point a resumption at the
    previous one)."""
    for old in folder.glob(TAG.format("*")):
        if str(old) != keep and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def load(engine: Any, path: Path, rank: int, on_gpu: bool) -> dict[str, Any]:
    """Loads this rank's part of the checkpoint in ``path`` (a ``step-N`` folder) into
    ``engine`` and the RNGs; returns the trainer state it holds."""
    if not (path / f"rng-rank{rank}.pt").is_file():
        raise SystemExit(f"{path} holds no complete autotune checkpoint")
    _, client = engine.load_checkpoint(str(path.parent), tag=path.name)
    if not client or "autotune" not in client:
        raise SystemExit(f"{path} holds no autotune checkpoint")
    rng = torch.load(path / f"rng-rank{rank}.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if on_gpu and rng.get("cuda") is not None:
        torch.cuda.set_rng_state_all(rng["cuda"])
    return dict(client["autotune"])
