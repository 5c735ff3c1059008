"""A trial's checkpoints: a new folder ``step-N`` under the plan's ``checkpoint_dir`` holds the
script's own state (its ``save`` hook: the bundled trainer's is DeepSpeed's model, optimizer
and scheduler) and, per rank, the trial's state (step, data position, clock, best metrics) with
that rank's RNG states. Older folders are removed only once the new one is complete and the
worker knows of it, so a crash mid-save leaves the previous one intact."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["TAG", "load_state", "prune", "save_state"]

TAG = "step-{}"   # a checkpoint's folder under checkpoint_dir, by optimizer step
_STATE = "autotune-rank{}.pt"


def save_state(folder: Path, state: dict[str, Any], rank: int, on_gpu: bool) -> None:
    """Saves this rank's part of the trial's state and its RNG states in ``folder``."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state_all() if on_gpu else None}
    torch.save({"state": state, "rng": rng}, folder / _STATE.format(rank))


def load_state(folder: Path, rank: int, on_gpu: bool) -> dict[str, Any]:
    """This rank's part of the trial's state saved in ``folder`` (a ``step-N`` folder), its
    RNG states restored."""
    own = folder / _STATE.format(rank)
    if not own.is_file():
        raise SystemExit(f"{folder} holds no complete autotune checkpoint (no {own.name})")
    saved = torch.load(own, weights_only=False)
    rng = saved["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if on_gpu and rng.get("cuda") is not None:
        torch.cuda.set_rng_state_all(rng["cuda"])
    return dict(saved["state"])


def prune(folder: Path, keep: str) -> None:
    """Removes the checkpoints in ``folder`` other than ``keep`` (rank 0, once the worker has
    acknowledged ``keep``: until then the registry may still point a resumption at the
    previous one)."""
    for old in folder.glob(TAG.format("*")):
        if str(old) != keep and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
