"""The MLflow outbox: writes wait on disk while MLflow is unreachable, and arrive once each."""

from __future__ import annotations

import json
import os

import pytest
from mlflow import MlflowClient

from autotune._outbox import RUN_KEY_TAG, Outbox

from ._services import free_port


@pytest.fixture(autouse=True)
def _fail_fast(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")


def ops(n_metrics: int) -> list[dict]:
    return [
        {"op": "create_run", "key": "study", "name": "s", "tags": {"autotune.kind": "study"}},
        {"op": "create_run", "key": "trial-0", "name": "trial-0", "parent": "study"},
        *[{"op": "log", "run": "trial-0", "metrics": [["top1", i / 10, 1_000 + i, i]],
           "params": {"global_batch": "128"}, "tags": {"optuna.state": "RUNNING"}}
          for i in range(n_metrics)],
        {"op": "status", "run": "trial-0", "status": "FINISHED"},
    ]


def test_writes_wait_on_disk_while_mlflow_is_down_then_arrive_once(tmp_path):
    spool = tmp_path / "outbox.jsonl"
    down = MlflowClient(tracking_uri=f"http://127.0.0.1:{free_port()}")  # nothing listens
    box = Outbox(down, spool, "study-x")
    for op in ops(5):
        box.submit(op)
    assert not box.close(timeout_s=2)                      # undeliverable: kept
    kept = [json.loads(line) for line in spool.read_text().splitlines()]
    assert len(kept) == 8

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    up = MlflowClient(tracking_uri=store)
    # A new process for the same study picks the spool up and delivers it.
    box = Outbox(up, spool, "study-x")
    assert box.close(timeout_s=60)
    assert spool.read_text() == ""
    # Deliver the very same operations again, as after an answer lost in transit.
    replay = Outbox(up, tmp_path / "again.jsonl", "study-x")
    for op in ops(5):
        replay.submit(op)
    assert replay.close(timeout_s=60)

    exp = up.get_experiment_by_name("study-x")
    runs = up.search_runs([exp.experiment_id])
    assert sorted(r.data.tags[RUN_KEY_TAG] for r in runs) == ["study", "trial-0"]
    trial = next(r for r in runs if r.data.tags[RUN_KEY_TAG] == "trial-0")
    study = next(r for r in runs if r.data.tags[RUN_KEY_TAG] == "study")
    assert trial.data.tags["mlflow.parentRunId"] == study.info.run_id
    history = up.get_metric_history(trial.info.run_id, "top1")
    assert [m.step for m in history] == [0, 1, 2, 3, 4]     # none lost, none twice
    assert trial.info.status == "FINISHED"


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path):
    spool = tmp_path / "outbox.jsonl"
    spool.write_text(json.dumps(ops(1)[0]) + "\n" + '{"op": "log", "ru')
    up = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    box = Outbox(up, spool, "study-y")
    assert box.close(timeout_s=60)
    exp = up.get_experiment_by_name("study-y")
    assert len(up.search_runs([exp.experiment_id])) == 1
    assert os.path.getsize(spool) == 0
