"""The per-report decision piece (autotune/_reports.py), driven by scripted messages: no
trainer, no socket, no study store (a stand-in trial and store record what they are given)."""

from __future__ import annotations

import contextlib
from typing import Any

import optuna
import pytest

from autotune import record
from autotune._reports import STORE_RETRY_S, HeldWrites, ReportHandler
from autotune._retry import StoreUnavailable
from trainers import protocol


class Trial:
    """What the handler writes through: user attributes and intermediate values."""

    number = 7

    def __init__(self, **attrs: Any) -> None:
        self.user_attrs: dict[str, Any] = dict(attrs)
        self.reported: list[tuple[float, int]] = []
        self.ended = False

    def set_user_attr(self, key: str, value: Any) -> None:
        if self.ended:
            raise optuna.exceptions.UpdateFinishedTrialError("ended elsewhere")
        self.user_attrs[key] = value

    def report(self, value: float, step: int) -> None:
        self.reported.append((value, step))


class Store:
    """A study store that may be away; a clock the test moves."""

    def __init__(self) -> None:
        self.away = False
        self.now = 100.0

    @contextlib.contextmanager
    def patience(self, seconds: float | None):
        if self.away:
            raise StoreUnavailable("away")
        yield


def _eval(index: int, elapsed: float, top1: float) -> dict[str, Any]:
    return {"type": "eval", "index": index, "elapsed_s": elapsed, "epoch": index + 1.0,
            "top1": top1, "top5": min(1.0, top1 + 0.2), "loss": 1.0}


def _handler(trial: Trial, store: Store, decide=None, every: float = 0.0, cap=None,
             heard: list | None = None) -> ReportHandler:
    writes = HeldWrites(store.patience, trial.number, clock=lambda: store.now)
    return ReportHandler(
        trial, writes, metric="top1", planned_epochs=4, checkpoint_every_s=every,
        deadline=lambda last: 30.0,
        decide=decide or (lambda msg, last: protocol.go(30.0)),
        cap=cap or (lambda reply, elapsed: reply),
        listeners=(lambda kind, msg: heard.append(kind),) if heard is not None else ())


def test_start_records_the_setup_and_goes_with_the_studys_deadline():
    trial, store, heard = Trial(), Store(), []
    handler = _handler(trial, store, heard=heard)
    reply = handler.answer({"type": "start", "setup_s": 2.5, "hosts": ["a"], "pid": 9,
                            "served": 3, "serves": False,
                            "setup_phases": {"data": 0.1}, "augment": "flip"})
    assert reply == protocol.go(30.0)
    assert trial.user_attrs[record.SETUP_S] == 2.5
    assert trial.user_attrs[record.RANKS_TRIAL] == 3
    assert trial.user_attrs[record.SETUP_PHASES] == {"data": 0.1}
    assert trial.user_attrs[record.AUGMENT] == "flip"
    assert handler.serves is False and heard == ["start"]


def test_while_the_store_is_away_the_trial_goes_on_and_its_writes_wait_in_order():
    trial, store = Trial(), Store()
    asked = []
    handler = _handler(trial, store, decide=lambda msg, last: asked.append(msg) or
                       protocol.stop("bound", 30.0))
    store.away = True
    reply = handler.answer(_eval(0, 5.0, 0.3))
    assert reply == protocol.go(None) and not asked          # no decision without the store
    assert record.CURVE not in trial.user_attrs and handler.writes.pending
    store.away = False
    assert handler.answer(_eval(1, 10.0, 0.4)) == protocol.go(None)   # retried only later
    store.now += STORE_RETRY_S + 0.1
    reply = handler.answer(_eval(2, 15.0, 0.5))
    assert reply == protocol.stop("bound", 30.0) and handler.stop_reason == "bound"
    assert [row[0] for row in trial.user_attrs[record.CURVE]] == [5.0, 10.0, 15.0]
    assert [step for _, step in trial.reported] == [0, 1, 2]


def test_a_trial_given_up_by_the_registry_is_stopped_as_worker_lost():
    trial, store = Trial(), Store()
    handler = _handler(trial, store)
    assert handler.answer(_eval(0, 5.0, 0.3))["action"] == "continue"
    trial.ended = True                           # failed and queued elsewhere meanwhile
    reply = handler.answer(_eval(1, 10.0, 0.4))
    assert reply == protocol.stop("worker_lost", 30.0)
    assert handler.writes.given_up and not handler.writes.pending


def test_a_trial_another_optuna_client_ended_is_stopped_as_ended_elsewhere():
    # optuna-dashboard's Fail button on a trial a worker trains: it was said to be given up by
    # the registry, stopped as worker_lost, and so shown
    trial, store = Trial(), Store()
    handler = _handler(trial, store)
    handler.writes = HeldWrites(store.patience, trial.number, clock=lambda: store.now,
                                ended_by=lambda: "ended_elsewhere")
    assert handler.answer(_eval(0, 5.0, 0.3))["action"] == "continue"
    trial.ended = True
    assert handler.answer(_eval(1, 10.0, 0.4)) == protocol.stop("ended_elsewhere", 30.0)
    assert handler.writes.given_up == "ended_elsewhere"


def test_who_ended_a_trial_is_read_off_its_record():
    from optuna.trial import TrialState, create_trial

    lost = create_trial(state=TrialState.FAIL, user_attrs={
        record.ASKED_BY: "w", record.OUTCOME: "failed", record.STOP_REASON: "worker_lost"})
    clicked = create_trial(state=TrialState.FAIL, user_attrs={record.ASKED_BY: "w",
                                                              record.PARAMS: {"x": 1}})
    notebook = create_trial(state=TrialState.COMPLETE, value=1.0)
    assert record.ended_by(lost) == "worker_lost" and not record.ended_elsewhere(lost)
    assert record.ended_by(clicked) == "ended_elsewhere" and record.ended_elsewhere(clicked)
    assert not record.ended_elsewhere(notebook) and record.told_elsewhere(notebook)


def test_a_checkpoint_is_asked_for_every_checkpoint_every_s_of_training():
    trial, store, heard = Trial(**{record.RESUME_ELAPSED: 4.0}), Store(), []
    handler = _handler(trial, store, every=10.0, heard=heard)
    assert handler.answer(_eval(0, 12.0, 0.3))["action"] == "continue"   # 8 s since 4.0
    assert handler.answer(_eval(1, 14.5, 0.4))["action"] == "checkpoint"
    assert handler.answer({"type": "checkpoint", "path": "/ck/step-9",
                           "elapsed_s": 14.5}) == protocol.ACK
    assert trial.user_attrs[record.CHECKPOINT] == "/ck/step-9"
    assert handler.answer(_eval(2, 20.0, 0.5))["action"] == "continue"
    assert heard == ["eval", "eval", "checkpoint", "eval"]


def test_every_deadline_is_capped_at_the_studys_time_limit_and_its_stop_is_kept():
    trial, store = Trial(), Store()
    stop_at = 18.0   # the study's limit, in this trial's elapsed seconds

    def cap(reply, elapsed):
        return {**reply, "deadline_s": min(reply["deadline_s"] or stop_at, stop_at)}

    def decide(msg, last):
        if msg["elapsed_s"] > stop_at:
            return protocol.stop("study_timeout", 30.0)
        return protocol.go(30.0)

    handler = _handler(trial, store, decide=decide, cap=cap)
    assert handler.answer({"type": "start"})["deadline_s"] == stop_at
    assert handler.answer(_eval(0, 10.0, 0.3)) == protocol.go(stop_at)
    assert handler.answer(_eval(1, 19.0, 0.4)) == protocol.stop("study_timeout", stop_at)
    assert handler.stop_reason == "study_timeout" and handler.best == pytest.approx(0.4)
    assert handler.answer({"type": "ready"}) is None          # not a trial report
