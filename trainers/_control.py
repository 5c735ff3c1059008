"""A trial's dealings with its worker, agreed by every rank: the start report and the deadline
it brings, the checks after each optimizer step (the trial's cap, the deadline, the worker's
checkpoint request, SIGTERM, an evaluation due), each evaluation's report and the worker's
answer, and the checkpoint and end reports. Rank 0 talks to the worker; every rank learns the
outcome through an all-reduce or a broadcast, so all leave a loop at the same step.

Time spent waiting for the worker's reply is control time, kept out of the clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from trainers._rank import Clock, agree, broadcast
from trainers.reporter import Reporter

__all__ = ["CHECKPOINT", "DEADLINE", "DIVERGED", "GO", "MAX_SECONDS", "OOM", "REASONS",
           "STOPPED", "Control"]

# Stop codes, agreed across ranks with an all-reduce(MAX) after each optimizer step.
GO, DEADLINE, MAX_SECONDS, STOPPED, CHECKPOINT, DIVERGED, OOM = range(7)
REASONS = {DEADLINE: "bound", MAX_SECONDS: "max_seconds", STOPPED: "stopped",
           CHECKPOINT: "checkpointed", DIVERGED: "diverged", OOM: "oom"}
_ACTIONS = {0.0: "go", 1.0: "stop", 2.0: "reached", 3.0: "checkpoint"}


class Control:
    """One trial's side of the report channel on every rank. ``state`` is the trainer's
    checkpointed state (``elapsed``, ``deadline``, ``last_eval_at`` are read and kept there);
    ``max_seconds``: the trial's cap on elapsed seconds (0: none)."""

    def __init__(self, reporter: Reporter, rank: int, state: dict[str, Any],
                 max_seconds: float) -> None:
        self.reporter, self.rank, self.state = reporter, rank, state
        self.max_seconds = float(max_seconds)
        self.terminate = False      # SIGTERM: save a checkpoint at the next step and leave

    def on_sigterm(self, signum: int, frame: Any) -> None:
        self.terminate = True

    def start(self, info: dict[str, Any]) -> Clock:
        """Sends the start report (rank 0); every rank takes the deadline of the reply. The
        clock starts here, where a resumed run's checkpoint left it."""
        st = self.state
        if self.rank == 0:
            reply = self.reporter.send({"type": "start", **info})
            st["deadline"] = float(reply.get("deadline_s") or -1.0)
        st["deadline"] = broadcast([st["deadline"]])[0]
        dist.barrier()
        return Clock(st["elapsed"])

    def after_step(self, code: int, clock: Clock, eval_gap: float) -> tuple[int, bool]:
        """The stop code every rank agrees on after a step (``code``: this rank's own), and
        whether an evaluation is due (``eval_gap`` seconds after the last; 0: by steps)."""
        due = 0
        if self.rank == 0 and code == GO:
            now = clock.elapsed()
            if 0 < self.max_seconds < now:
                code = MAX_SECONDS
            elif self.state["deadline"] > 0 and now > self.state["deadline"]:
                code = DEADLINE
            elif self.reporter.asked("checkpoint"):
                code = CHECKPOINT
            due = int(eval_gap > 0 and now - self.state["last_eval_at"] >= eval_gap)
        if self.terminate:
            code = max(code, CHECKPOINT)
        code, due = agree(code, due)
        return code, bool(due)

    def report_eval(self, clock: Clock, fields: dict[str, Any], reached: bool) -> str:
        """Reports an evaluation (rank 0: ``fields`` with the elapsed time added) and returns
        the action every rank takes: go, stop, reached or checkpoint."""
        st = self.state
        decision = [0.0, st["deadline"]]
        if self.rank == 0:
            st["last_eval_at"] = clock.elapsed()
            report = {"type": "eval", "elapsed_s": st["last_eval_at"], **fields}
            if reached:
                report["reached"] = True
            waited = time.perf_counter()
            reply = self.reporter.send(report)
            clock.control_s += time.perf_counter() - waited
            action = str(reply.get("action"))
            decision = [2.0 if reached else {"stop": 1.0, "checkpoint": 3.0}.get(action, 0.0),
                        float(reply.get("deadline_s") or -1.0)]
        code, st["deadline"] = broadcast(decision)
        return _ACTIONS[code]

    def checkpoint(self, clock: Clock, save: Callable[[], tuple[float, str]],
                   prune: Callable[[str], None]) -> None:
        """A checkpoint saved and reported, and the trial goes on; its time is control time."""
        t = time.perf_counter()
        elapsed, path = save()
        if self.rank == 0:
            self.reporter.send({"type": "checkpoint", "path": path, "elapsed_s": elapsed})
            prune(path)
        dist.barrier()
        clock.control_s += time.perf_counter() - t

    def end(self, summary: dict[str, Any], prune: Callable[[str], None]) -> None:
        """Sends the end report (rank 0); a checkpoint it names replaces the older ones."""
        if self.rank == 0:
            self.reporter.send({"type": "end", **summary})
            if summary.get("checkpoint"):
                prune(summary["checkpoint"])
        dist.barrier()
