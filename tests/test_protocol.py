"""The worker-trainer contract (trainers/protocol.py): one place for the plan's keys, the
replies and the warm ranks' leave rule."""

from __future__ import annotations

import math
import typing

from autotune.plan import Hardware, resolve
from trainers import protocol


def test_the_typed_plan_names_every_key_the_worker_writes_and_no_other():
    plan = resolve({"global_batch": 64, "lr_per_256": 0.1, "epochs": 2},
                   trainer={"model": "resnet18", "data": {"kind": "digits"}}, train_size=1437,
                   hardware=Hardware(world_size=2), target={"metric": "top1", "value": 0.9},
                   max_seconds=10)
    assert set(plan) == set(typing.get_type_hints(protocol.Plan))
    assert set(plan["schedule"]) == set(typing.get_type_hints(protocol.Schedule))
    assert set(plan["optimizer"]) == set(typing.get_type_hints(protocol.Optimizer))


def test_replies_have_one_shape():
    assert protocol.go() == {"action": "continue", "reason": "", "deadline_s": None}
    assert protocol.go(3.5)["deadline_s"] == 3.5
    assert protocol.stop("bound", 2.0) == {"action": "stop", "reason": "bound",
                                           "deadline_s": 2.0}
    assert protocol.plan_reply({"seed": 1}) == {"action": "plan", "plan": {"seed": 1}}


def test_warm_ranks_leave_after_a_checkpointed_or_out_of_memory_end_only():
    assert protocol.leaves_after("checkpointed") and protocol.leaves_after("oom")
    for reason in ("reached", "bound", "planned_epochs", "diverged", None):
        assert not protocol.leaves_after(reason)


def test_ranks_stay_only_when_they_serve_and_the_trial_ended_well():
    assert protocol.ranks_stay(True, {"reason": "bound"})
    assert not protocol.ranks_stay(False, {"reason": "bound"})      # the program does not serve
    assert not protocol.ranks_stay(True, None)                       # no end report
    assert not protocol.ranks_stay(True, {"reason": "oom"})


def test_an_evaluation_is_checked_for_its_target_metric_as_a_share():
    """A trainer reporting a percentage (85.3 for 85.3%) would 'reach' any target at its first
    evaluation and win the study; it fails its trial with what to send instead."""
    ok = {"type": "eval", "elapsed_s": 3.0, "top1": 0.853, "epoch": 1.5, "index": 2}
    assert protocol.report_problem(ok, "top1") is None
    assert protocol.report_problem({**ok, "top1": float("nan")}, "top1") is None
    for bad in (85.3, -0.1):
        problem = protocol.report_problem({**ok, "top1": bad}, "top1")
        assert problem is not None and "a share from 0 to 1" in problem, problem
    assert "without the target metric" in protocol.report_problem({**ok, "top1": "x"}, "top1")
    # what the worker stores of each evaluation: a report lacking it fails its trial only
    no_epoch = {k: v for k, v in ok.items() if k != "epoch"}
    assert "epoch (epochs done" in protocol.report_problem(no_epoch, "top1")
    assert "index (0, 1, 2" in protocol.report_problem({**ok, "index": -1}, "top1")
    start = {"type": "start", "setup_s": 0.1}
    assert protocol.report_problem(start, "top1") is None
    assert "resumed_at_s is 'x'" in protocol.report_problem({**start, "resumed_at_s": "x"},
                                                           "top1")


def test_a_target_that_falls_is_checked_as_0_or_more_and_reached_at_or_below():
    ok = {"type": "eval", "elapsed_s": 3.0, "wer": 0.31, "epoch": 1.5, "index": 2}
    for value in (0.31, 2.3, 1e4, float("nan")):      # a loss or perplexity may pass 1
        assert protocol.report_problem({**ok, "wer": value}, "wer", True) is None
    problem = protocol.report_problem({**ok, "wer": -0.1}, "wer", True)
    assert problem is not None and "is 0 or more" in problem
    # without mode min a loss above 1 is refused, saying how to give one
    assert "mode: min" in protocol.report_problem({**ok, "wer": 2.3}, "wer")
    assert protocol.reaches(0.2, 0.25, True) and protocol.reaches(0.25, 0.25, True)
    assert not protocol.reaches(0.3, 0.25, True) and not protocol.reaches(math.nan, 0.25, True)
    assert protocol.reaches(0.9, 0.8, False) and not protocol.reaches(0.7, 0.8, False)
    assert protocol.falls({"metric": "wer", "value": 0.2, "mode": "min"})
    assert not protocol.falls({"metric": "top1", "value": 0.9})
    assert all(map(protocol.falling_name, ("loss", "val_loss", "eval_loss", "wer",
                                           "perplexity", "top1_error", "FID")))
    assert not any(map(protocol.falling_name, ("top1", "accuracy", "f1", "bleu", "lossy")))
