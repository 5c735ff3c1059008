"""Crash safety on real PostgreSQL: a study server and two workers (separate processes) run a
4-trial study; one worker is killed with SIGKILL mid-trial. Its trial must be detected within
2 heartbeats, resume from its last checkpoint on the other worker (same parameters, lineage,
its clock continuing, the downtime recorded), and every record must agree: Optuna, autotune's
tables and MLflow, with no evaluation lost or counted twice."""

from __future__ import annotations

import os
import signal
import time

import optuna
import psutil
import pytest
import yaml
from mlflow import MlflowClient

from autotune.db import Registry

from ._services import autotune, free_port, one_storage, wait_for_port
from .conftest import run_cli

pytestmark = pytest.mark.postgres

HEARTBEAT_S = 4.0  # production default 10 s; short, so detection within 2 beats is tested tightly


def study_file(tmp_path, **extra):
    config = {
        "study_name": "crash", "search_space": "quickstart", "heartbeat_s": HEARTBEAT_S,
        "trainer": {"model": "resnet18", "data": {"kind": "digits", "image_size": 32},
                    "eval_every_s": 2.0, "checkpoint_every_s": 3.0},
        "target": {"metric": "top1", "value": 0.97},
        "budget": {"n_trials": 4, "max_trial_s": 30, "timeout_s": 900},
        "ranks_per_trial": 1, "tracking_uri": str(tmp_path / "mlruns"), "seed": 5,
        # Trials run on past the first TTA (up to 3 x it), so some trial is still running with
        # a checkpoint and a few evaluations when the test looks for one to kill, however fast
        # the first trial reaches and however loaded the machine is.
        "pruner_margin": 3.0,
        **extra}
    path = tmp_path / "crash.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def trainer_processes(plan_folder):
    """Processes still running a trial whose files are in ``plan_folder``."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(plan_folder) in arg for arg in p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def test_a_killed_workers_trial_resumes_from_its_checkpoint_on_the_other_worker(postgres,
                                                                               tmp_path):
    url = postgres.database()
    upgraded = run_cli("db", "upgrade", "--storage", url, cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    port = free_port()
    server = autotune("server", "--storage", url, "--port", str(port), cwd=tmp_path)
    workers = []
    try:
        wait_for_port(port)
        address = f"127.0.0.1:{port}"
        study = autotune("start", "study", str(study_file(tmp_path)), "--storage",
                         f"autotune://{address}", "--workers", "0", cwd=tmp_path)
        storage = one_storage(url)        # polled: one engine, not one per poll
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                optuna.load_study(study_name="crash", storage=storage)
                break
            except KeyError:
                time.sleep(1)
        workers = [autotune("worker", "--server", address, "--study", "crash", cwd=tmp_path)
                   for _ in range(2)]
        registry = Registry(url, create=False)

        # Wait for a trial that has saved a periodic checkpoint, then kill its worker.
        victim_trial, victim = None, None
        deadline = time.monotonic() + 300
        while victim is None and time.monotonic() < deadline:
            running = [t for t in optuna.load_study(study_name="crash", storage=storage).trials
                       if t.state.name == "RUNNING" and t.user_attrs.get("checkpoint")
                       and len(t.user_attrs.get("curve", [])) >= 3]
            attempts = {a["trial_number"]: a for a in registry.attempts("crash")}
            for t in running:
                if t.number in attempts and attempts[t.number]["status"] == "running":
                    pid = int(attempts[t.number]["worker"].rsplit("-", 1)[1])
                    victim_trial = t
                    victim = next(w for w in workers if w.pid == pid)
                    break
            if victim is None and (study.poll() is not None
                                   or any(w.poll() is not None for w in workers)):
                break                   # something ended before any trial could be caught
            time.sleep(0.2)
        if victim is None:
            trials = optuna.load_study(study_name="crash", storage=storage).trials
            seen = [(t.number, t.state.name, t.user_attrs.get("outcome"),
                     len(t.user_attrs.get("curve", [])), bool(t.user_attrs.get("checkpoint")))
                    for t in trials]
            tails = [p.output()[1][-1500:] for p in (server, study, *workers)]
            raise AssertionError(f"no running trial with a checkpoint was caught; trials "
                                 f"{seen}; study exit {study.poll()}, workers' "
                                 f"{[w.poll() for w in workers]}; stderr tails {tails}")
        killed_at = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)

        out, err = study.communicate(timeout=900)
        assert study.returncode == 0, err[-3000:]
        survivor = next(w for w in workers if w is not victim)
        _, w_err = survivor.communicate(timeout=180)
        assert survivor.returncode == 0, w_err[-2000:]
        shown = run_cli("status", "crash", "--storage", f"autotune://{address}", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        server.terminate()
        server.wait(30)

    trials = optuna.load_study(study_name="crash", storage=storage).trials
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in trials)      # none left RUNNING
    lost = trials[victim_trial.number]
    assert lost.state.name == "FAIL" and lost.user_attrs["stop_reason"] == "worker_lost"
    # Detected within 2 heartbeats of the kill.
    detected = lost.datetime_complete.timestamp()   # naive local time
    assert detected - killed_at <= 2 * HEARTBEAT_S, detected - killed_at
    resumed = [t for t in trials if t.user_attrs.get("resume_of") == lost.number]
    assert len(resumed) == 1
    resumed = resumed[0]
    assert resumed.params == lost.params
    assert resumed.user_attrs["lineage"] == [lost.number]
    assert resumed.user_attrs["resume_from"] == lost.user_attrs["checkpoint"]
    assert resumed.user_attrs["downtime_s"] >= 1.5 * HEARTBEAT_S
    saved_at = lost.user_attrs["checkpoint_elapsed_s"]
    # The clock continued from there: its first evaluation, or, when the best TTA had already
    # passed by then (the bound stops it at its first step), its elapsed time at the end.
    assert resumed.state.name == "COMPLETE", resumed.user_attrs
    curve = resumed.user_attrs.get("curve")
    first = curve[0][0] if curve else resumed.user_attrs["elapsed_s"]
    assert saved_at < first < saved_at + 10
    # It ends on its own merits: reached, censored, or, for a configuration still at chance
    # (the kill can hit one on its way to diverging), failed as diverged; never a crash.
    ending = (resumed.user_attrs["outcome"], resumed.user_attrs["stop_reason"])
    assert ending[0] in ("reached", "censored") or ending == ("failed", "diverged"), ending
    counted = [t for t in trials if t.user_attrs.get("outcome") != "infeasible"
               and t.user_attrs.get("stop_reason") not in ("worker_lost", "interrupted")]
    assert len(counted) == 4
    assert out.count("[trial ") == 4
    assert not trainer_processes(tmp_path / "autotune-runs" / "crash" /
                                 f"trial-{lost.number}" / "plan.json")

    # `autotune status`, through the server: trials, both workers and their last beats.
    assert "worker_lost" in shown.stdout and ": lost, last heartbeat" in shown.stdout
    assert ": stopped, last heartbeat" in shown.stdout and "best: " in shown.stdout

    # autotune's tables: the lost worker and attempt, the resumption that followed it.
    workers_on_record = {w["name"]: w["status"] for w in registry.workers("crash")}
    assert sorted(workers_on_record.values()) == ["lost", "stopped"]
    attempts = registry.attempts("crash")
    registry.close()
    by_trial = {a["trial_number"]: a for a in attempts}
    assert by_trial[lost.number]["status"] == "lost"
    assert by_trial[lost.number]["checkpoint_path"] == lost.user_attrs["checkpoint"]
    assert by_trial[resumed.number]["resumes_trial"] == lost.number
    assert by_trial[resumed.number]["status"] == "finished"
    assert by_trial[resumed.number]["attempt"] == 2
    assert by_trial[resumed.number]["downtime_s"] == pytest.approx(
        resumed.user_attrs["downtime_s"])
    for t in counted:
        assert by_trial[t.number]["status"] == "finished"

    # MLflow: the lost run says what happened; every evaluation is there exactly once.
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crash")
    runs = {r.data.tags.get("optuna.trial_number"): r for r in client.search_runs(
        [experiment.experiment_id], filter_string="tags.`autotune.kind` = 'trial'")}
    lost_run = runs[str(lost.number)]
    assert lost_run.info.status == "FAILED"
    assert lost_run.data.tags["autotune.stop_reason"] == "worker_lost"
    assert runs[str(resumed.number)].data.tags["autotune.resume_of"] == str(lost.number)
    for t in [*counted, lost]:
        history = client.get_metric_history(runs[str(t.number)].info.run_id, "top1")
        steps = [m.step for m in history]
        assert len(set(steps)) == len(steps), t.number          # nothing counted twice
        if t is lost:  # the worker spooled its last report to MLflow just before Optuna's
            assert len(t.user_attrs["curve"]) <= len(steps) <= len(t.user_attrs["curve"]) + 1
        else:  # a trial the bound stopped at its first step has no evaluation, nor curve
            assert len(steps) == len(t.user_attrs.get("curve", [])), t.number
    assert os.path.isdir(lost.user_attrs["checkpoint"])
