"""A worker killed while asking Optuna for a trial: the trial it leaves RUNNING holds the
worker's mark (``asked_by``) from the write that created it, so it is known for autotune's own
and the sweep queues it afresh, instead of it passing for another Optuna client's trial and
staying RUNNING forever. The worker really dies (SIGKILL, in the middle of ``study.ask()``),
on SQLite and through a real `autotune server` over PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest

from autotune import control, record
from autotune.db import Registry

from .test_server_auth import _start_server, _stop

# A worker process: asks for a trial as the trial runner does, with a sampler that kills the
# process inside Optuna's ask (after the trial is created, before ask returns).
_KILLED_WHILE_ASKING = textwrap.dedent("""
    import os, signal, sys, types
    import optuna
    from autotune.store import open_storage
    from autotune.trial_runner import TrialRunner

    class Killing(optuna.samplers.RandomSampler):
        def before_trial(self, study, trial):
            os.kill(os.getpid(), signal.SIGKILL)

    storage = open_storage(sys.argv[1], create=False)
    study = optuna.load_study(study_name="s", storage=storage, sampler=Killing())
    TrialRunner._ask_marked(types.SimpleNamespace(storage=storage, asker="w1"), study)
    print("not killed")
""")


def _killed_while_asking(url: str, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(_KILLED_WHILE_ASKING)
    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == -9, done.stderr[-2000:]      # SIGKILL, inside the ask


def _left_running(url: str) -> optuna.trial.FrozenTrial:
    study = optuna.load_study(study_name="s", storage=url)
    running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert len(running) == 1
    return running[0]


def _swept(url: str, registry_url: str) -> None:
    """The recoverer's sweep takes the killed worker's trial for autotune's: failed, queued."""
    clock = [1000.0]
    registry = Registry(registry_url)
    storage = optuna.storages.RDBStorage(url)
    try:
        sweep = lambda: control._sweep_orphans(registry, storage, "s", 60.0,  # noqa: E731
                                               clock=lambda: clock[0])
        assert sweep() == []
        clock[0] += 61.0
        assert sweep() == [0]
        study = optuna.load_study(study_name="s", storage=storage)
        assert [t.state.name for t in study.trials] == ["FAIL", "WAITING"]
        assert study.trials[0].user_attrs[record.STOP_REASON] == "worker_lost"
        assert study.trials[0].user_attrs[record.DETAIL] == (
            "worker w1 took it and recorded no attempt of it within 60 s (a worker records "
            "one as it starts a trial); the trial starts afresh")
    finally:
        registry.close()


def test_a_worker_killed_while_asking_leaves_a_trial_known_for_its_own(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=url, direction="minimize")
    _killed_while_asking(url, tmp_path)
    trial = _left_running(url)
    assert trial.user_attrs.get(record.ASKED_BY) == "w1"
    assert not record.asked_elsewhere(trial)
    _swept(url, url)


def test_a_queued_trial_is_popped_as_queued_and_marked_after(tmp_path):
    # a waiting trial (a resumption, a user's enqueued point) is taken as Optuna takes it; the
    # mark follows at once, and its own records stay
    from types import SimpleNamespace

    from autotune.store import open_storage
    from autotune.trial_runner import TrialRunner

    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name="s", storage=storage, direction="minimize")
    study.enqueue_trial({"x": 1.0}, user_attrs={record.WARM_START: "w"})
    runner = SimpleNamespace(storage=storage, asker="w2")
    queued = TrialRunner._ask_marked(runner, study)
    fresh = TrialRunner._ask_marked(runner, study)
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.user_attrs.get(record.ASKED_BY) for t in trials] == ["w2", "w2"]
    assert trials[0].user_attrs[record.WARM_START] == "w"
    assert trials[0].system_attrs["fixed_params"] == {"x": 1.0}
    assert (queued.number, fresh.number) == (0, 1)
    assert [t.state.name for t in trials] == ["RUNNING", "RUNNING"]


@pytest.mark.postgres
def test_through_the_study_server_too(postgres, tmp_path):
    from autotune.config import database_url

    db_url = postgres.database()
    optuna.create_study(study_name="s", storage=database_url(db_url), direction="minimize")
    server, port = _start_server(db_url, tmp_path)
    try:
        _killed_while_asking(f"autotune://127.0.0.1:{port}", tmp_path)
    finally:
        _stop(server)
    trial = _left_running(database_url(db_url))
    assert trial.user_attrs.get(record.ASKED_BY) == "w1"
    assert not record.asked_elsewhere(trial)
    _swept(database_url(db_url), db_url)


def test_the_study_server_stamps_a_workers_new_trial_on_its_own_clock(tmp_path):
    # the mark rides on a template trial, which carries the worker's clock: a worker whose
    # clock runs an hour behind would start its trials an hour early, and their compute (end,
    # stamped by the server, minus start) would be an hour too long
    from datetime import datetime, timedelta

    from optuna.trial import FrozenTrial, TrialState

    from autotune.server import open_database

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="minimize")
    behind = datetime.now() - timedelta(hours=1)
    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None,
                           datetime_start=behind, datetime_complete=None, params={},
                           distributions={}, user_attrs={record.ASKED_BY: "w"},
                           system_attrs={}, intermediate_values={}, trial_id=-1)
    served = open_database(url)
    trial_id = served.create_new_trial(study._study_id, template_trial=template)
    trial = served.get_trial(trial_id)
    assert abs((trial.datetime_start - datetime.now()).total_seconds()) < 60
    assert trial.user_attrs == {record.ASKED_BY: "w"} and trial.state == TrialState.RUNNING
    queued = served.create_new_trial(study._study_id, template_trial=FrozenTrial(
        number=-1, state=TrialState.WAITING, value=None, datetime_start=None,
        datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={},
        intermediate_values={}, trial_id=-1))
    assert served.get_trial(queued).datetime_start is None     # a queued trial: as sent
