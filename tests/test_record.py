"""The trial record (autotune/record.py): its queries on hand-made trials, and that no other
module spells a record key out."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
from optuna.trial import TrialState, create_trial

from autotune import record

ROOT = Path(__file__).resolve().parent.parent


def _trial(number: int, state: TrialState = TrialState.COMPLETE, value: float | None = None,
           **attrs: object) -> optuna.trial.FrozenTrial:
    trial = create_trial(state=state, value=value if state == TrialState.COMPLETE else None,
                         user_attrs=attrs)
    trial.number = number
    return trial


def test_curve_rows_are_named_and_older_shorter_rows_still_load():
    attrs = {record.CURVE: [[1.0, 0.2, 0.6, 0.25, 2.1], [2.0, 0.4, 0.8]]}
    rows = record.curve_rows(attrs)
    assert rows[0].elapsed_s == 1.0 and rows[0].loss == 2.1 and rows[0].progress == 0.25
    assert rows[1].top5 == 0.8 and rows[1].progress == 0.0 and rows[1].loss is None
    assert record.last_loss(attrs) is None
    assert record.last_loss({}) is None


def test_finished_leaves_out_dropped_points_and_trials_that_go_on_elsewhere():
    trials = [_trial(0, value=5.0, **{record.OUTCOME: "reached"}),
              _trial(1, TrialState.FAIL, **{record.OUTCOME: "infeasible"}),
              _trial(2, TrialState.FAIL, **{record.OUTCOME: "failed",
                                            record.STOP_REASON: "worker_lost"}),
              _trial(3, TrialState.FAIL, **{record.OUTCOME: "failed",
                                            record.STOP_REASON: "interrupted"}),
              _trial(4, TrialState.FAIL, **{record.OUTCOME: "failed",
                                            record.STOP_REASON: "crashed"}),
              _trial(5, TrialState.RUNNING)]
    assert [t.number for t in record.finished(trials)] == [0, 4]


def test_the_best_reached_trial_is_never_a_censored_or_failed_one():
    trials = [_trial(0, value=float("inf"), **{record.OUTCOME: "censored"}),
              _trial(1, value=9.0, **{record.OUTCOME: "reached"}),
              _trial(2, value=float("inf"), **{record.OUTCOME: "failed"}),
              _trial(3, value=7.5, **{record.OUTCOME: "reached"})]
    assert record.best_reached(trials).number == 3
    assert record.best_reached(trials[:1]) is None


def test_one_resumption_record_for_a_checkpointed_and_a_lost_trial():
    saved = record.resumption([1], 4, "/ck/step-9", 12.5, 100.0)
    assert saved == {record.RESUME_OF: 4, record.LINEAGE: [1, 4], record.INTERRUPTED_AT: 100.0,
                     record.RESUME_FROM: "/ck/step-9", record.RESUME_ELAPSED: 12.5}
    lost = record.resumption([], 4, None, None, 100.0)   # lost before its first checkpoint
    assert lost == {record.RESUME_OF: 4, record.LINEAGE: [4], record.INTERRUPTED_AT: 100.0}


def test_no_other_module_spells_a_record_key_or_reads_optunas_private_trial_store():
    spelled = re.compile(r"""(user_attrs\.get\(|user_attrs\[|set_user_attr\()\s*["']""")
    found = []
    for path in sorted((ROOT / "autotune").rglob("*.py")):
        if path.name == "record.py":
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in spelled.finditer(text)]
        if "_storage.get_trial(" in text:
            found.append(f"{path.relative_to(ROOT)}: _storage.get_trial(")
    assert not found, found
