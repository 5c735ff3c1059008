"""A study recorded on a real `mlflow server` (PostgreSQL backend), through an MLflow outage."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient

from ._services import Background
from .conftest import ROOT, run_cli

pytestmark = [pytest.mark.mlflow_server, pytest.mark.postgres]


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.5)


@pytest.mark.slow
def test_a_study_survives_mlflow_going_down_and_loses_no_record(mlflow_server, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study_proc = Background(
        [sys.executable, "-m", "autotune", "start", "study", "quickstart", "--n-trials", "3",
         "--max-trial-seconds", "30", "--storage", storage,
         "--tracking-uri", mlflow_server.url],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # MLflow goes down while the first trial trains, and stays down for a minute.
    _wait_for(tmp_path / "autotune-runs" / "quickstart" / "trial-0" / "trainer.log", 120)
    mlflow_server.stop()
    time.sleep(60)
    mlflow_server.start()
    out, err = study_proc.communicate(timeout=600)
    assert study_proc.returncode == 0, err[-3000:]
    assert "MLflow is unreachable" in err and out.count("[trial ") == 3

    study = optuna.load_study(study_name="quickstart", storage=storage)
    client = MlflowClient(tracking_uri=mlflow_server.url)
    exp = client.get_experiment_by_name("quickstart")
    assert exp.tags["autotune.target"] == "top1>=0.97"
    assert exp.tags["autotune.search_space"] == "quickstart"
    assert exp.tags["autotune.storage"] == "sqlite"
    runs = client.search_runs([exp.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("autotune.kind") == "study"]
    children = [r for r in runs if r.data.tags.get("autotune.kind") == "trial"]
    assert len(children) == 3
    assert parent.info.status == "FINISHED"
    for key in ("trials_reached", "trials_censored", "trials_failed", "compute_s"):
        assert key in parent.data.metrics
    # The best trial's configuration, whichever trial it is, is tagged on the parent run (on a
    # machine far below its usual speed no trial may reach 97% top-1 within its 30 s).
    reached = [t for t in study.trials if t.user_attrs.get("outcome") == "reached"]
    if reached:
        best = min(reached, key=lambda t: t.value)
        assert parent.data.metrics["best_tta_s"] == pytest.approx(best.value)
        assert parent.data.metrics["best_trial"] == best.number
        assert parent.data.tags["best.global_batch"] == str(
            best.user_attrs["params"]["global_batch"])
    else:
        assert "best_tta_s" not in parent.data.metrics
    parent_files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"study_config.json", "search_space.json", "plots"} <= parent_files
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/tta_vs_batch.png", "plots/optimization_history.png",
            "plots/accuracy_vs_time.png", "plots/optimization_history.html"} <= plots

    for run in children:
        trial = study.trials[int(run.data.tags["optuna.trial_number"])]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["optuna.state"] == trial.state.name
        assert run.data.tags["autotune.stop_reason"] == trial.user_attrs["stop_reason"]
        assert run.data.tags["autotune.hosts"] and run.data.tags["autotune.attempt"] == "1"
        for name in ("global_batch", "micro_batch", "grad_accum", "world_size", "peak_lr",
                     "warmup_steps"):
            assert name in run.data.params
        # Every evaluation arrived exactly once, the outage notwithstanding.
        for metric in ("top1", "top5", "loss", "lr", "images_per_s", "elapsed_s"):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, metric)]
            assert sorted(steps) == sorted(trial.intermediate_values), metric
        files = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"plan.json", "learning_curve.png"} <= files
        final = "tta_s" if trial.user_attrs["outcome"] == "reached" else "reached_target"
        assert final in run.data.metrics

    # `autotune ui` on the server: the study's page at once (the server answers); on a server
    # that is down, one line at once, not MLflow's client retrying for minutes
    shown = run_cli("ui", "--tracking-uri", mlflow_server.url, "--study", "quickstart",
                    cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"{mlflow_server.url}/#/experiments/{exp.experiment_id}/runs"
    mlflow_server.stop()
    down = run_cli("ui", "--tracking-uri", mlflow_server.url, cwd=tmp_path, timeout=60)
    assert down.returncode == 2 and down.stderr.count("\n") == 1, down.stderr
    assert f"the MLflow server at {mlflow_server.url} does not answer" in down.stderr
