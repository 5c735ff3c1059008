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
    box = Outbox(lambda: down, spool, "study-x")
    for op in ops(5):
        box.submit(op)
    assert not box.close(timeout_s=2)                      # undeliverable: kept
    kept = [json.loads(line) for line in spool.read_text().splitlines()]
    assert len(kept) == 8

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    up = MlflowClient(tracking_uri=store)
    # A new process for the same study picks the spool up and delivers it.
    box = Outbox(lambda: up, spool, "study-x")
    assert box.close(timeout_s=60)
    assert spool.read_text() == ""
    # Deliver the very same operations again, as after an answer lost in transit.
    replay = Outbox(lambda: up, tmp_path / "again.jsonl", "study-x")
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
    box = Outbox(lambda: up, spool, "study-y")
    assert box.close(timeout_s=60)
    exp = up.get_experiment_by_name("study-y")
    assert len(up.search_runs([exp.experiment_id])) == 1
    assert os.path.getsize(spool) == 0


def test_a_client_that_cannot_be_made_yet_is_retried_and_nothing_is_lost(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tries = []

    def connect():               # the tracking database is down for the first two tries
        tries.append(1)
        if len(tries) <= 2:
            raise ConnectionError("tracking database refused the connection")
        return MlflowClient(tracking_uri=store)

    box = Outbox(connect, tmp_path / "outbox.jsonl", "study-z")   # never raises here
    for op in ops(3):
        box.submit(op)
    assert box.close(timeout_s=60)
    assert len(tries) == 3
    up = MlflowClient(tracking_uri=store)
    exp = up.get_experiment_by_name("study-z")
    trial = next(r for r in up.search_runs([exp.experiment_id])
                 if r.data.tags[RUN_KEY_TAG] == "trial-0")
    assert [m.step for m in up.get_metric_history(trial.info.run_id, "top1")] == [0, 1, 2]


OPEN_AT_ONCE = """
import sys, time
from autotune.tracking import connect
start_at = float(sys.argv[2])
time.sleep(max(0.0, start_at - time.time()))      # every process opens the store together
client = connect(sys.argv[1])
client.create_experiment(sys.argv[3])
"""


@pytest.mark.slow
def test_processes_that_open_a_new_local_store_at_once_all_get_it_whole(tmp_path):
    # MLflow makes an SQLite store's schema on first use; unguarded, processes that start
    # together (a study and its workers) fail or leave the store half-migrated for good.
    import subprocess
    import sys
    import time

    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    start_at = time.time() + 15
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, store, str(start_at),
                               f"study-{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-800:] for _, err in results]
    names = {e.name for e in MlflowClient(tracking_uri=store).search_experiments()}
    assert {f"study-{i}" for i in range(4)} <= names


def test_an_experiment_in_mlflows_trash_keeps_the_records_and_says_why(tmp_path):
    # a deleted experiment takes no run: the records waited, and the study called MLflow
    # "unreachable" while it answered every call
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    client.delete_experiment(client.create_experiment("study-x"))
    spool = tmp_path / "outbox.jsonl"
    box = Outbox(lambda: client, spool, "study-x")
    for op in ops(2):
        box.submit(op)
    assert not box.close(timeout_s=3)
    assert len(spool.read_text().splitlines()) == 5
    assert box.last_error is not None and box.last_error.startswith(
        "the MLflow experiment 'study-x' is deleted (in MLflow's trash): restore it (mlflow "
        "experiments restore -x 1)"), box.last_error
    client.restore_experiment("1")                      # restored: the next run delivers
    assert Outbox(lambda: client, spool, "study-x").close(timeout_s=60)
    assert len(client.search_runs(["1"])) == 2


def test_a_record_mlflow_refuses_for_good_is_set_aside_and_the_rest_delivered(tmp_path, caplog):
    # a param MLflow will not change (a second study's trial logged onto the first's run)
    # was retried forever as "MLflow is unreachable", holding every later record
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    spool = tmp_path / "outbox.jsonl"
    box = Outbox(lambda: client, spool, "study-x")
    for op in ops(1):
        box.submit(op)
    box.submit({"op": "log", "run": "trial-0", "params": {"global_batch": "256"}})  # changed
    box.submit({"op": "log", "run": "trial-0", "metrics": [["top1", 0.9, 9_000, 5]]})
    assert box.close(timeout_s=60)
    assert box.refused == 1 and spool.read_text() == ""
    aside = [json.loads(line) for line in (tmp_path / "mlflow-refused.jsonl").read_text()
             .splitlines()]
    assert [a["op"]["params"] for a in aside] == [{"global_batch": "256"}]
    assert "INVALID_PARAMETER_VALUE" in aside[0]["error"] or "Changing param" in aside[0]["error"]
    run = client.search_runs(["1"], filter_string=f"tags.`{RUN_KEY_TAG}` = 'trial-0'")[0]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "top1")] == [0.0, 0.9]
    assert any("MLflow refuses a record" in r.getMessage() for r in caplog.records)


def test_artifacts_for_a_store_this_machine_cannot_write_are_set_aside(tmp_path, caplog):
    # a tracking server started without --serve-artifacts hands out a path on its own
    # machine; here an experiment whose artifact root cannot be made
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    client.create_experiment("study-x", artifact_location="/proc/no-such/artifacts")
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    spool = tmp_path / "outbox.jsonl"
    box = Outbox(lambda: client, spool, "study-x")
    for op in ops(0)[:2]:
        box.submit(op)
    box.submit({"op": "artifact", "run": "trial-0", "path": str(plan)})
    box.submit({"op": "log", "run": "trial-0", "metrics": [["top1", 0.5, 9_000, 0]]})
    assert box.close(timeout_s=60) and box.refused == 1
    assert any("MLflow's artifact store cannot be written from this machine" in r.getMessage()
               for r in caplog.records)
    run = client.search_runs(["1"], filter_string=f"tags.`{RUN_KEY_TAG}` = 'trial-0'")[0]
    assert run.data.metrics["top1"] == 0.5


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (ENOSPC)")
def test_a_full_disk_stops_no_delivery_and_loses_no_record(tmp_path, caplog):
    # rewriting the spool, or setting a refused record aside, on a full disk raised in the
    # delivery thread: it died, and every later record waited until the command's timeout
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    spool = tmp_path / "outbox.jsonl"
    (tmp_path / "outbox.tmp").symlink_to("/dev/full")          # the spool's rewrite
    (tmp_path / "mlflow-refused.jsonl").symlink_to("/dev/full")
    box = Outbox(lambda: client, spool, "study-x")
    for op in ops(2):
        box.submit(op)
    box.submit({"op": "log", "run": "trial-0", "params": {"global_batch": "256"}})  # refused
    box.submit({"op": "log", "run": "trial-0", "metrics": [["top1", 0.9, 9_000, 5]]})
    assert not box.flush(timeout_s=5) and box.pending == 2      # it waits, as for an outage
    assert any("cannot be rewritten" in r.getMessage() for r in caplog.records)
    assert "setting it aside failed" in (box.last_error or "")
    (tmp_path / "mlflow-refused.jsonl").unlink()                # room again
    assert box.close(timeout_s=60) and box.refused == 1 and spool.read_text() == ""
    run = client.search_runs(["1"], filter_string=f"tags.`{RUN_KEY_TAG}` = 'trial-0'")[0]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "top1")] == \
        [0.0, 0.1, 0.9]
