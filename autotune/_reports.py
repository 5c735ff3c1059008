"""A trial's reports, answered: what the worker records and replies for each message rank 0
sends (``start``, ``eval``, ``checkpoint``), apart from processes and sockets.

``ReportHandler`` keeps one trial's state (its curve, best value, deadline, last checkpoint,
the reason it was last told to stop) and answers each report through what it is given: the
trial to record on, a ``HeldWrites`` queue to the study store, and functions for the pruner's
deadline, its decision and the study's time limit (``Pruning`` gives them, minding the store's
absences). The trial runner (``trial_runner.py``) feeds it the channel's messages, within a
trial's setup and training ``Limits``; tests feed it scripted ones.

The rules it applies, in order, to an evaluation: record it (the curve row, the intermediate
value, the elapsed time); with the store reachable, ask the pruner (``decisions.eval_reply``),
else go on with the last deadline; a trial the registry gave up is stopped (``worker_lost``),
as is one another Optuna client ended (``ended_elsewhere``);
one that goes on and has trained ``checkpoint_every_s`` since its last checkpoint is asked to
save one and go on; every deadline is capped at the study's time limit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import optuna

from trainers import protocol

from . import record
from ._process import ReportChannel
from ._retry import StoreUnavailable
from .decisions import curve_row, eval_reply, eval_writes, study_deadline

__all__ = ["HeldWrites", "Limits", "Pruning", "ReportHandler", "STORE_RETRY_S",
           "setup_whereabouts"]

log = logging.getLogger("autotune")
STORE_RETRY_S = 3.0       # a trial's writes wait this long after the store failed to answer

Reply = dict[str, Any]
Listener = Callable[[str, dict[str, Any]], None]


class HeldWrites:
    """A trial's writes to the study store, in order, held while the store is out of reach (a
    restarting study server or database) and delivered when it is back; the trainer goes on
    meanwhile. ``patience(seconds)`` bounds each delivery; ``given_up`` says why once the
    store says the trial was ended elsewhere (``ended_by``: the registry gave its worker up,
    or another Optuna client ended it)."""

    def __init__(self, patience: Callable[[float | None], Any], number: int,
                 clock: Callable[[], float] = time.monotonic,
                 ended_by: Callable[[], str] = lambda: "worker_lost") -> None:
        self._patience, self._number, self._clock = patience, number, clock
        self._ended_by = ended_by
        self.pending: list[Callable[[], Any]] = []
        self.given_up = ""     # why it was ended elsewhere (record.ended_by); "": it was not
        self._retry_at = 0.0

    def add(self, *writes: Callable[[], Any]) -> None:
        self.pending.extend(writes)

    def flush(self, patience: float | None) -> bool:
        """Delivers what waits; False when the store did not answer (tried again only after
        STORE_RETRY_S). ``patience`` None: the store's own, which rides out a restart."""
        if patience is not None and self._clock() < self._retry_at:
            return False
        try:
            with self._patience(patience):
                while self.pending:
                    self.pending[0]()
                    self.pending.pop(0)
            return True
        except StoreUnavailable:
            self._retry_at = self._clock() + STORE_RETRY_S
            return False
        except optuna.exceptions.UpdateFinishedTrialError:
            # Failed and queued to resume elsewhere while this worker looked lost, or ended by
            # another Optuna client: its records end here; the trainer is stopped at its next
            # report.
            self.given_up = self._ended_by()
            log.warning("trial %d %s; stopping it here", self._number,
                        "was given up by the registry" if self.given_up == "worker_lost" else
                        "was ended by another Optuna client (optuna-dashboard, a study.tell)")
            self.pending.clear()
            return True


class ReportHandler:
    """One trial's answers to its reports (see the module docstring).

    ``deadline(last)``: the pruner's deadline, ``last`` while the store is away;
    ``decide(msg, last)``: the pruner's reply to an evaluation; ``cap(reply, elapsed)``: the
    reply with its deadline no later than the study's time limit; ``listeners``: called with
    ``(kind, message)`` for each start, eval and checkpoint report (MLflow, the registry)."""

    def __init__(self, trial: Any, writes: HeldWrites, *, metric: str, planned_epochs: float,
                 falls: bool = False,
                 checkpoint_every_s: float, deadline: Callable[[float | None], float | None],
                 decide: Callable[[dict[str, Any], float | None], Reply],
                 cap: Callable[[Reply, float], Reply],
                 listeners: tuple[Listener, ...] = ()) -> None:
        self.trial, self.writes = trial, writes
        self.metric, self.planned_epochs, self.falls = metric, planned_epochs, falls
        self.every = float(checkpoint_every_s)
        self._deadline_of, self._decide, self._cap = deadline, decide, cap
        self.listeners = listeners
        # the best value of the target metric so far: an accuracy's highest, a loss's lowest
        self.best, self.evals = (math.inf if falls else 0.0), 0
        self.curve: list[list[Any]] = []
        self.stop_reason = ""
        self.deadline: float | None = None
        self.serves = False       # the start report says whether the ranks wait for a plan
        self.saved_at = float(trial.user_attrs.get(record.RESUME_ELAPSED) or 0.0)

    def _tell(self, kind: str, msg: dict[str, Any]) -> None:
        for listener in self.listeners:
            listener(kind, msg)

    def start(self, msg: dict[str, Any]) -> Reply:
        """The start report: record how setup went; go, with the study's deadline."""
        self.serves = bool(msg.get("serves", False))
        attr = partial(partial, self.trial.set_user_attr)
        self.writes.add(attr(record.SETUP_S, msg.get("setup_s")),
                        attr(record.HOSTS, msg.get("hosts", [])),
                        attr(record.TRAINER_PID, msg.get("pid")),
                        attr(record.RANKS_TRIAL, msg.get("served", 1)))
        if msg.get("setup_phases"):
            self.writes.add(attr(record.SETUP_PHASES, msg["setup_phases"]))
        if msg.get("augment"):
            self.writes.add(attr(record.AUGMENT, msg["augment"]))
        self._tell("start", msg)
        if self.writes.flush(0):
            self.deadline = self._deadline_of(self.deadline)
        return self._cap(protocol.go(self.deadline), float(msg.get("resumed_at_s") or 0.0))

    def eval(self, msg: dict[str, Any]) -> Reply:
        """An evaluation report: record it, then go on, stop, or checkpoint and go on."""
        self.evals += 1
        value = float(msg[self.metric])
        better = min if self.falls else max
        self.best = better(self.best, value) if math.isfinite(value) else self.best
        self.curve.append(curve_row(msg, self.planned_epochs, self.metric))
        self.writes.add(*eval_writes(self.trial, msg, self.metric, self.curve, self.falls))
        self._tell("eval", msg)
        if self.writes.flush(0):
            reply = self._decide(msg, self.deadline)
        else:   # the study store is away: no decision without it; go on
            reply = protocol.go(self.deadline)
        if self.writes.given_up:
            reply = protocol.stop(self.writes.given_up, self.deadline)
        self.deadline = reply["deadline_s"]
        self.stop_reason = reply["reason"] or self.stop_reason
        elapsed = float(msg["elapsed_s"])
        if protocol.goes_on(reply) and self.every > 0 and elapsed - self.saved_at >= self.every:
            reply = protocol.and_checkpoint(reply)   # saved, and the trial goes on
        return self._cap(reply, elapsed)

    def checkpoint(self, msg: dict[str, Any]) -> Reply:
        """A periodic checkpoint was saved: record where, and acknowledge."""
        self.saved_at = float(msg["elapsed_s"])
        self.writes.add(partial(self.trial.set_user_attr, record.CHECKPOINT, msg["path"]),
                        partial(self.trial.set_user_attr, record.CHECKPOINT_ELAPSED,
                                self.saved_at))
        self._tell("checkpoint", msg)
        self.writes.flush(0)
        return protocol.ACK

    def answer(self, msg: dict[str, Any]) -> Reply | None:
        """The reply to any report but the end (None for a type it does not know)."""
        handler = {"start": self.start, "eval": self.eval,
                   "checkpoint": self.checkpoint}.get(str(msg.get("type")))
        return None if handler is None else handler(msg)


SETUP_PHASES = {"distributed": "starting the process group",
                "data": "opening the data source", "model": "building the model",
                "engine": "setting up DeepSpeed's engine",
                "resume": "loading the checkpoint it resumes from"}


def setup_whereabouts(channel: ReportChannel, launched_at: float) -> str:
    """Where a trainer's setup was, from its last setup note: for a setup_timeout's detail."""
    note, at = channel.setup_note, channel.setup_note_at
    if note is None or at is None:
        return ("it never reported a setup phase (still launching: the launcher starting its "
                "ranks, or their imports)")
    phase = str(note.get("phase"))
    return (f"it was {SETUP_PHASES.get(phase, phase)} (phase {phase!r}, entered "
            f"{at - launched_at:.0f} s after the launch)")


class Pruning:
    """The pruner's side of a trial's replies, minding the study store: its deadline and its
    decision on an evaluation (``decisions.study_deadline``, ``decisions.eval_reply``), or,
    while the store is away, the last deadline and go on; and every reply's deadline capped
    at the study's end (``stop_at``, a ``time.monotonic()`` value), where the trainer then
    stops on its own between evaluations."""

    def __init__(self, pruner: Any, study: Any, trial: Any,
                 patience: Callable[[float | None], Any], stop_at: float | None) -> None:
        self.pruner, self.study, self.trial = pruner, study, trial
        self._patience, self.stop_at = patience, stop_at

    def deadline(self, last: float | None) -> float | None:
        try:
            with self._patience(0):
                return study_deadline(self.pruner, self.study)
        except StoreUnavailable:
            return last

    def decide(self, msg: dict[str, Any], last: float | None) -> Reply:
        try:
            with self._patience(0):
                return eval_reply(self.pruner, self.study, self.trial, msg,
                                  now=time.monotonic(), stop_at=self.stop_at)
        except StoreUnavailable:
            return protocol.go(last)

    def within_timeout(self, reply: Reply, elapsed: float) -> Reply:
        if self.stop_at is None:
            return reply
        cap = max(elapsed + self.stop_at - time.monotonic(), 1e-3)
        deadline = reply.get("deadline_s")
        return {**reply, "deadline_s": cap if deadline is None else min(float(deadline), cap)}


class Limits:
    """A trial's two limits: its setup's, from the launch; its training's, without a report
    for that long (from the start report on). ``until``: the ``time.monotonic()`` the one in
    force ends at."""

    def __init__(self, setup_s: float, training_s: float) -> None:
        self.setup_s, self.training_s = setup_s, training_s
        self.phase = "setup"
        self.until = time.monotonic() + setup_s

    def training(self) -> None:
        """The start report came: training's limit from now."""
        self.phase, self.until = "training", time.monotonic() + self.training_s

    def explain(self, result: Any, channel: ReportChannel, launched_at: float) -> None:
        """Says on ``result`` that its trainer was killed at the limit in force, and which:
        setup's (and where the setup was) or training's (hung)."""
        if self.phase == "setup":
            result.reason = "setup_timeout"
            result.detail = (f"the trainer did not finish setting up within {self.setup_s:.0f}"
                             f" s of its launch (trainer.setup_limit_s); "
                             f"{setup_whereabouts(channel, launched_at)}; raise the limit "
                             f"where a first setup is slow. {result.detail}")
        else:
            result.detail = (f"no report for {self.training_s:.0f} s of training (2 x "
                             f"max_trial_s + 60 s): stopped as hung. {result.detail}")
