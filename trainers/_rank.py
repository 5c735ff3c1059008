"""What one rank shares with the others and keeps for itself: the training clock, flags
every rank agrees on (an all-reduce of the maximum), rank 0's values given to all, an
out-of-memory error told apart, and, for warm ranks, the next plan."""

from __future__ import annotations

import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from trainers import protocol
from trainers.reporter import Reporter

__all__ = ["Clock", "agree", "broadcast", "is_oom", "next_plan"]


class Clock:
    """Elapsed training time on rank 0, excluding time spent waiting for the worker; a resumed
    run starts from the checkpoint's elapsed time."""

    def __init__(self, offset: float = 0.0) -> None:
        self.start = time.perf_counter()
        self.offset = offset
        self.control_s = 0.0

    def elapsed(self) -> float:
        return self.offset + time.perf_counter() - self.start - self.control_s


def agree(*codes: int) -> list[int]:
    """The element-wise maximum of ``codes`` over all ranks: any rank can raise a flag."""
    flags = torch.tensor(codes, dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [int(v) for v in flags.tolist()]


def broadcast(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.broadcast(t, src=0)
    return [float(v) for v in t.tolist()]


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def next_plan(reporter: Reporter, summary: dict[str, Any]) -> dict[str, Any] | None:
    """Warm ranks: the next trial's plan from the worker, the same on every rank, or None to
    leave (the worker said exit or is gone, the trial ended checkpointed or out of memory, or
    a rank got SIGTERM)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # waiting: SIGTERM ends the process at once
    leave = agree(int(protocol.leaves_after(summary["reason"])))[0]
    box: list[Any] = [None]
    if dist.get_rank() == 0 and not leave:
        try:
            reply = reporter.send({"type": "ready"})
        except (OSError, ValueError):  # the worker closed the channel, or is gone
            reply = protocol.EXIT
        if reply.get("action") == "plan" and isinstance(reply.get("plan"), dict):
            box[0] = reply["plan"]
    dist.broadcast_object_list(box, src=0)
    return box[0]
