"""Restarts mid-study: the study server, then PostgreSQL itself. The worker keeps its trial
running, reconnects with backoff, and delivers what it kept meanwhile; the trial is neither
given up for lost nor run twice, and no evaluation is missing or doubled."""

from __future__ import annotations

import time

import optuna
import pytest
import yaml

from autotune.db import Registry

from ._services import PostgresServer, autotune, free_port, one_storage, wait_for_port

pytestmark = pytest.mark.postgres

HEARTBEAT_S = 1.0


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test's own, which it may stop and start."""
    server = PostgresServer(own=True)
    yield server
    server.close()


def study_file(tmp_path):
    config = {
        "study_name": "restart", "search_space": "quickstart", "heartbeat_s": HEARTBEAT_S,
        "trainer": {"model": "resnet18", "data": {"kind": "digits", "image_size": 32},
                    "eval_every_s": 1.0},
        "target": {"metric": "top1", "value": 0.999},        # not reached: a full trial
        "budget": {"n_trials": 1, "max_trial_s": 25, "timeout_s": 600},
        "ranks_per_trial": 1, "tracking_uri": str(tmp_path / "mlruns"), "seed": 2,
        "warm_start": True}     # the space's known-good configuration: it trains to the end
    path = tmp_path / "restart.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def feasible(study):
    """The trials that ran (a sampled point that violates the space's constraints is
    recorded, but never trained)."""
    return [t for t in study.trials if t.user_attrs.get("outcome") != "infeasible"]


def run_through_an_outage(url, tmp_path, outage):
    """A 1-trial study on a server and one worker; ``outage()`` is called after the trial's
    third evaluation. Returns the study's trial."""
    storage = one_storage(url)        # polled: one engine, not one per poll
    port = free_port()
    server = autotune("server", "--storage", url, "--port", str(port), cwd=tmp_path)
    servers = [server]
    worker = study = None
    try:
        wait_for_port(port)
        address = f"127.0.0.1:{port}"
        study = autotune("start", "study", str(study_file(tmp_path)), "--storage",
                         f"autotune://{address}", "--workers", "0", cwd=tmp_path)
        worker = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                trials = feasible(optuna.load_study(study_name="restart", storage=storage))
            except KeyError:
                time.sleep(0.5)
                continue
            if worker is None:
                worker = autotune("worker", "--server", address, "--study", "restart",
                                  cwd=tmp_path)
            if trials and len(trials[0].user_attrs.get("curve", [])) >= 3:
                before = len(trials[0].user_attrs["curve"])
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the trial made no progress")
        restarted = outage(server, port)
        if restarted is not None:
            servers.append(restarted)
        out, err = study.communicate(timeout=400)
        assert study.returncode == 0, err[-3000:]
        assert worker is not None
        _, w_err = worker.communicate(timeout=120)
        assert worker.returncode == 0, w_err[-3000:]
    finally:
        for p in (worker, study):
            if p is not None and p.poll() is None:
                p.kill()
        for s in servers:
            if s.poll() is None:
                s.terminate()
                s.wait(30)
    trials = feasible(optuna.load_study(study_name="restart", storage=storage))
    assert len(trials) == 1, [t.user_attrs.get("stop_reason") for t in trials]
    trial = trials[0]
    assert trial.state.name == "COMPLETE"
    assert trial.user_attrs["outcome"] == "censored"
    # Ran to its end, not lost: its time cap, or its schedule's last epoch on a fast machine.
    assert trial.user_attrs["stop_reason"] in ("max_seconds", "planned_epochs")
    # Every evaluation once, in order: none lost while the store was away, none doubled.
    curve = trial.user_attrs["curve"]
    assert sorted(trial.intermediate_values) == list(range(len(curve)))
    assert [row[0] for row in curve] == sorted(row[0] for row in curve)
    assert len(curve) >= before + 3                     # it went on training through it
    if trial.user_attrs["stop_reason"] == "max_seconds":
        assert curve[-1][0] >= 20.0
    registry = Registry(url, create=False)
    attempts = registry.attempts("restart")
    workers = registry.workers("restart")
    registry.close()
    assert [(a["trial_number"], a["attempt"], a["status"]) for a in attempts] == [
        (trial.number, 1, "finished")]
    assert [w["status"] for w in workers] == ["stopped"]
    return trial


def test_the_study_server_restarts_mid_trial_and_the_worker_carries_on(postgres, tmp_path):
    def restart_server(server, port):
        server.kill()                                   # as a crash would
        server.wait(30)
        time.sleep(5 * HEARTBEAT_S)                     # evaluations and beats pile up
        again = autotune("server", "--storage", url, "--port", str(port), cwd=tmp_path)
        wait_for_port(port)
        return again

    url = postgres.database()
    trial = run_through_an_outage(url, tmp_path, restart_server)
    assert trial.user_attrs["control_s"] < 5.0          # the trainer did not wait it out


@pytest.mark.slow    # a minute; the study server's restart (default suite) rides out the same
def test_postgresql_restarts_mid_trial_and_the_study_carries_on(own_postgres, tmp_path):
    def restart_database(server, port):
        own_postgres.stop()
        time.sleep(5 * HEARTBEAT_S)
        own_postgres.start()

    url = own_postgres.database()
    trial = run_through_an_outage(url, tmp_path, restart_database)
    assert trial.user_attrs["control_s"] < 10.0
