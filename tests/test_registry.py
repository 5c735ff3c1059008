"""The worker registry and recovery of lost trials, on a real (SQLite) study database."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import optuna
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from autotune.control import WorkerSession, recover
from autotune.db import Registry, Worker, current, head, utcnow


def make_study(url):
    """A study with one running trial, as an autotune worker asks it (its first record)."""
    from autotune import record

    study = optuna.create_study(study_name="s", storage=url, direction="minimize")
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr(record.ASKED_BY, "w")
    return study, trial


def silence(registry, name, seconds):
    """As if worker ``name`` last beat ``seconds`` ago."""
    with Session(registry.engine) as s, s.begin():
        s.execute(update(Worker).where(Worker.name == name)
                  .values(last_heartbeat=utcnow() - timedelta(seconds=seconds)))


def test_a_silent_workers_trial_is_failed_and_queued_with_its_checkpoint_once(tmp_path):
    a_silent_workers_trial_is_failed_and_queued(f"sqlite:///{tmp_path / 'study.db'}")


def test_on_mysql_too_the_registry_migrates_and_recovers_a_lost_trial(mysql):
    # Optuna's users keep studies on MySQL as often as on PostgreSQL: autotune's own tables,
    # their migrations and the recovery they serve work there as well
    from autotune.db import check

    a_silent_workers_trial_is_failed_and_queued(mysql)
    check(mysql)                                 # the models match the migrations there too


def test_on_mysql_a_long_curve_is_recorded(mysql):
    # MySQL's TEXT holds 64 KB: a trial of about 700 evaluations failed to record its
    # curve (Optuna: "exceeding max length"); opening the store widens Optuna's columns
    from autotune.store import open_storage

    study = optuna.create_study(study_name="long", storage=open_storage(mysql))
    trial = study.ask()
    curve = [[i * 2.0, 0.5 + i / 1e5, 0.7, 1.234567] for i in range(5_000)]   # about 150 KB
    trial.set_user_attr("curve", curve)
    assert optuna.load_study(study_name="long", storage=mysql).trials[0].user_attrs[
        "curve"] == curve


def a_silent_workers_trial_is_failed_and_queued(url: str) -> None:
    study, trial = make_study(url)
    registry = Registry(url)                      # creates autotune's tables on first use
    assert current(url) == head()
    registry.register(name="w1", study="s", host="h", pid=1)
    registry.attempt(study="s", trial_number=trial.number, attempt=1, worker="w1")
    registry.attempt(study="s", trial_number=trial.number, attempt=1, worker="w1",
                     checkpoint_path="/ckpt/step-11", elapsed_s=7.5)
    storage = study._storage

    # Alive: nothing to do. Silent but within 1.5 beats: nothing either.
    assert recover(registry, storage, "s", 10.0, datetime.min) == []
    silence(registry, "w1", 12)
    assert recover(registry, storage, "s", 10.0, datetime.min) == []
    # A recoverer that came up (or whose database came back) less than 1.5 beats ago waits.
    silence(registry, "w1", 20)
    assert recover(registry, storage, "s", 10.0, utcnow()) == []

    assert recover(registry, storage, "s", 10.0, datetime.min) == [trial.number]
    assert recover(registry, storage, "s", 10.0, datetime.min) == []     # claimed once
    lost = study.trials[trial.number]
    assert lost.state.name == "FAIL" and lost.user_attrs["stop_reason"] == "worker_lost"
    queued = [t for t in study.trials if t.state.name == "WAITING"]
    assert len(queued) == 1
    attrs = queued[0].user_attrs
    assert attrs["resume_from"] == "/ckpt/step-11" and attrs["resume_elapsed_s"] == 7.5
    assert attrs["lineage"] == [trial.number] and attrs["lost_worker"] == "w1"
    assert time.time() - attrs["interrupted_at"] >= 19          # the last heartbeat's time
    assert queued[0].system_attrs["fixed_params"] == lost.params   # the same configuration
    assert [w["status"] for w in registry.workers("s")] == ["lost"]
    assert [a["status"] for a in registry.attempts("s")] == ["lost"]
    # The lost worker, back from a network partition, learns it was given up.
    assert registry.heartbeat(name="w1") == {"status": "lost"}
    registry.close()


def test_a_trial_running_with_no_worker_on_record_is_queued_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study, trial = make_study(url)
    registry = Registry(url)
    assert recover(registry, study._storage, "s", 10.0, datetime.min) == []   # too recent
    time.sleep(0.2)
    assert recover(registry, study._storage, "s", 0.01, datetime.min) == [trial.number]
    assert study.trials[trial.number].state.name == "FAIL"
    assert [t.state.name for t in study.trials] == ["FAIL", "WAITING"]
    assert "resume_from" not in study.trials[1].user_attrs     # from the start
    registry.close()


def test_a_worker_session_keeps_its_records_while_the_registry_is_away(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    make_study(url)
    registry = Registry(url)

    class Flaky:
        """The registry behind a study server that is down until ``up`` is set."""

        up = False

        def __getattr__(self, name):
            def call(**args):
                if not Flaky.up:
                    raise ConnectionError("study server is restarting")
                return getattr(registry, name)(**args)
            return call

    session = WorkerSession(Flaky(), "s", heartbeat_s=3600, name="w9")
    session.attempt(0, 1, status="running")
    session.attempt(0, 1, checkpoint_path="/c/step-4", elapsed_s=3.0)
    assert registry.workers("s") == []                        # nothing arrived yet
    Flaky.up = True
    session.beat_once()
    assert [w["name"] for w in registry.workers("s")] == ["w9"]
    attempts = registry.attempts("s")
    assert [(a["status"], a["checkpoint_path"]) for a in attempts] == [("running",
                                                                        "/c/step-4")]
    session.attempt(0, 1, status="finished", elapsed_s=9.0)
    assert session.close(timeout_s=5)
    assert [(a["status"], a["elapsed_s"]) for a in registry.attempts("s")] == [
        ("finished", 9.0)]
    assert [w["status"] for w in registry.workers("s")] == ["stopped"]
    registry.close()


def test_heartbeats_keep_their_cadence_while_a_registry_call_is_slow():
    """A worker's record that takes long to arrive (a loaded study server) must not hold its
    heartbeats back: late beats make a live worker look lost."""
    import threading

    beats: list[float] = []
    slow = threading.Event()

    class Slow:
        def register(self, **args):
            return {}

        def heartbeat(self, **args):
            beats.append(time.monotonic())
            return {"status": "running"}

        def attempt(self, **args):
            slow.set()
            time.sleep(1.5)
            return {}

        def stop_worker(self, **args):
            return {}

    session = WorkerSession(Slow(), "s", heartbeat_s=0.2, name="w1")
    started = time.monotonic()
    session.attempt(0, 1, status="running")             # the main thread: 1.5 s in the call
    assert slow.is_set()
    during = [b for b in beats if started <= b <= started + 1.5]
    assert len(during) >= 5, during                     # about 7 at 0.2 s
    assert session.close(timeout_s=5)


def test_shared_memory_buffers_no_process_maps_are_swept_and_mapped_ones_kept(tmp_path):
    import mmap

    from autotune._process import sweep_orphaned_shm_buffers

    orphan = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_40001_0"
    orphan.write_bytes(b"\0" * 4096)
    live = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_40002_0"
    live.write_bytes(b"\0" * 4096)
    other = tmp_path / "not_deepspeed"
    other.write_bytes(b"x")
    with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096):   # as a running rank maps it
        assert sweep_orphaned_shm_buffers(tmp_path) == [orphan]
        assert live.exists() and other.exists() and not orphan.exists()


def test_a_worker_given_up_while_alive_registers_again_and_its_next_trial_is_kept(tmp_path):
    """A live worker whose beats came late is given up and its trial resumes elsewhere; its
    next trial must not be given up too (it was, while its record still said lost)."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study, trial = make_study(url)
    registry = Registry(url)
    session = WorkerSession(registry, "s", heartbeat_s=3600, name="w1")
    session.attempt(trial.number, 1, status="running")
    silence(registry, "w1", 20)
    assert recover(registry, study._storage, "s", 10.0, datetime.min) == [trial.number]
    session.beat_once()                                  # learns it was given up
    assert session.lost.is_set()
    assert [w["status"] for w in registry.workers("s")] == ["running"]
    nxt = study.ask()                                    # the resumption, or any next trial
    session.attempt(nxt.number, 1, status="running")
    assert recover(registry, study._storage, "s", 10.0, datetime.min) == []
    assert [(a["trial_number"], a["status"]) for a in registry.attempts("s")] == [
        (trial.number, "lost"), (nxt.number, "running")]
    assert session.close(timeout_s=5)
    registry.close()


def test_a_recoverer_that_was_stalled_itself_holds_its_judgement_for_a_grace():
    """Decided on the times given: on schedule it may recover; after waking more than a
    second after it was due (the machine stalled, heartbeats are still on their way) it
    waits; however long a pass itself takes (many studies) counts for nothing."""
    from autotune.control import StallGuard, stall_grace

    guard = StallGuard()
    assert guard.may_recover(100.0, None, 2.0)            # no schedule: nothing to be late for
    assert guard.may_recover(101.1, 101.0, 2.0)           # on time
    assert guard.may_recover(103.9, 103.0, 2.0)           # 0.9 s late: within the tolerance
    assert not guard.may_recover(107.0, 104.0, 2.0)       # 3 s late: held until 109
    assert not guard.may_recover(108.0, 108.0, 2.0)
    assert guard.may_recover(109.0, 109.0, 2.0)
    assert stall_grace(4.0) == 2.0 and stall_grace(10.0) == 5.0


def test_the_server_control_loop_says_when_it_ran_late_and_gives_no_one_up_then(tmp_path):
    from autotune._control_loop import ControlLoop

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study, trial = make_study(url)
    registry = Registry(url)
    registry.register(name="w1", study="s", host="h", pid=1)
    registry.attempt(study="s", trial_number=trial.number, attempt=1, worker="w1")
    silence(registry, "w1", 20)                         # silent for 2 beats of 10 s
    said: list[str] = []
    loop = ControlLoop(registry, study._storage, said.append)
    loop.started = datetime.min                         # past the start-up grace
    loop.once(due=time.monotonic() - 3.0)               # woke 3 s late
    assert any("ran 3.0 s late" in line for line in said), said
    assert study.trials[trial.number].state.name == "RUNNING"
    loop.once(due=time.monotonic())                     # on time, but within the grace
    assert study.trials[trial.number].state.name == "RUNNING"
    loop._guards["s"]._hold_until = time.monotonic()    # the grace is over
    loop.once(due=time.monotonic())
    assert study.trials[trial.number].state.name == "FAIL"
    assert any("worker w1 is lost" in line for line in said), said
    registry.close()


def test_a_heartbeat_is_not_held_up_by_a_long_read_of_the_study_database(tmp_path):
    """The default SQLite store keeps a write-ahead log: a worker's heartbeat commits while
    another process is in the middle of reading the study (in the rollback journal a reader
    holds off every commit until it is done)."""
    import sqlite3

    from autotune.store import open_storage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    open_storage(url)
    optuna.create_study(study_name="s", storage=url)
    registry = Registry(url)
    registry.register(name="w1", study="s", host="h", pid=1)
    reader = sqlite3.connect(tmp_path / "study.db", timeout=0.5)
    try:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        reader.execute("BEGIN")
        reader.execute("SELECT * FROM trials").fetchall()   # a read transaction, left open
        start = time.monotonic()
        assert registry.heartbeat(name="w1") == {"status": "running"}
        assert time.monotonic() - start < 5
    finally:
        reader.close()
        registry.close()


def test_on_mysql_a_database_or_user_the_server_lacks_is_said_with_what_to_do(mysql):
    import pytest

    from autotune.errors import ConfigError
    from autotune.store import open_storage

    server = mysql.rsplit("/", 1)[0]
    host = server.partition("@")[2] or server.partition("://")[2]
    cases = {f"{server}/autotune_no_such_db": "the MySQL server has no database "
                                              "autotune_no_such_db; create it first",
             f"mysql+pymysql://autotune_nobody:pw@{host}/x": "the MySQL server refuses "
                                                             "autotune_nobody (wrong password"}
    for url, says in cases.items():
        with pytest.raises(ConfigError) as raised:
            open_storage(url)
        assert says in str(raised.value) and "\n" not in str(raised.value), raised.value


_SKEWED_WORKER = """
import sys
from datetime import timedelta

from autotune.db import _registry

real = _registry.utcnow
_registry.utcnow = lambda: real() - timedelta(seconds=90)   # this machine's clock is behind
registry = _registry.Registry(sys.argv[1], create=False)
registry.register(name="behind", study="s", host="h", pid=1)
registry.attempt(study="s", trial_number=0, attempt=1, worker="behind")
registry.heartbeat(name="behind")
print(registry.offset_s())
"""


def test_a_worker_whose_clock_runs_behind_is_not_given_up_while_it_beats(postgres, tmp_path):
    # heartbeats were stamped with the worker's clock and judged on the recoverer's: a clock
    # 90 s behind made a beating worker look silent, and its running trial was taken from it
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    url = postgres.database()
    registry = Registry(url)
    script = tmp_path / "worker.py"
    script.write_text(_SKEWED_WORKER)
    done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 85 < float(done.stdout.split()[-1]) < 95      # it measured the server 90 s ahead
    assert registry.claim_lost("s", 15.0, datetime.min) == []
    assert [w["status"] for w in registry.workers("s")] == ["running"]
    registry.close()


def take_trial(study, skew_s, by="w"):
    """A RUNNING trial as a worker whose clock is ``skew_s`` off this machine's takes it
    (Optuna stamps its start with the taking machine's clock): an autotune worker ``by``'s,
    or (``by`` None) another Optuna client's, which holds none of autotune's records."""
    from optuna.trial import FrozenTrial, TrialState

    from autotune import record

    template = FrozenTrial(number=0, state=TrialState.RUNNING, value=None,
                           datetime_start=datetime.now() + timedelta(seconds=skew_s),
                           datetime_complete=None, params={}, distributions={},
                           user_attrs={record.ASKED_BY: by} if by else {},
                           system_attrs={}, intermediate_values={}, trial_id=0)
    return study._storage.create_new_trial(study._study_id, template_trial=template)


@pytest.mark.parametrize("skew_s", [-300.0, 0.0, 300.0])
def test_a_trial_nobody_recorded_is_swept_after_a_while_on_the_recoverers_clock(tmp_path,
                                                                               skew_s):
    # Optuna stamps a trial's start with the clock of the machine that took it. Judged on
    # that stamp, a trial taken by a worker whose clock ran behind looked old and was swept
    # as an orphan before its worker could record it (and was trained twice); one whose
    # clock ran ahead stayed RUNNING that much longer if its worker died
    from autotune import control

    clock = [1000.0]
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="minimize")
    registry = Registry(url)
    orphan_id, recorded_id = take_trial(study, skew_s), take_trial(study, skew_s)
    number = {t._trial_id: t.number for t in study.trials}
    registry.register("w", "s", "host", 1)
    registry.attempt("s", number[recorded_id], 0, "w", status="running")

    def sweep():
        return control._sweep_orphans(registry, study._storage, "s", 60.0,
                                      clock=lambda: clock[0])

    assert sweep() == []                                 # first seen now
    clock[0] += 59.0
    assert sweep() == []
    assert study.trials[number[orphan_id]].state.name == "RUNNING"
    clock[0] += 2.0
    assert sweep() == [number[orphan_id]]                # seen so for 61 s: queued afresh
    assert study.trials[number[orphan_id]].state.name == "FAIL"
    assert study.trials[number[recorded_id]].state.name == "RUNNING"
    assert [t.state.name for t in study.trials[2:]] == ["WAITING"]
    clock[0] += 1000.0
    assert sweep() == []                                  # the recorded one, never
    registry.close()


def test_a_trial_left_running_long_ago_is_swept_at_once(tmp_path):
    # a study resumed hours after its workers died: its orphans need no minute of watching
    from autotune import control

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="minimize")
    registry = Registry(url)
    old, new = take_trial(study, -2 * 3600.0), take_trial(study, -120.0)
    number = {t._trial_id: t.number for t in study.trials}
    assert control._sweep_orphans(registry, study._storage, "s", 60.0) == [number[old]]
    assert study.trials[number[new]].state.name == "RUNNING"
    registry.close()


def test_a_trial_another_optuna_client_is_running_is_never_swept(tmp_path):
    # a notebook's study.optimize on an autotune study, its objective running for minutes:
    # the sweep took its trial for a lost autotune trial, failed it under the notebook (whose
    # tell then raised) and queued its parameters for autotune's workers to train
    from autotune import control, record
    from autotune._console import budget_left

    clock = [1000.0]
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="minimize")
    registry = Registry(url)
    notebook = optuna.load_study(study_name="s", storage=url).ask()   # Optuna's own ask
    old_notebook = take_trial(study, -2 * 3600.0, by=None)
    ours = take_trial(study, 0.0)
    number = {t._trial_id: t.number for t in study.trials}
    running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert [record.asked_elsewhere(t) for t in running] == [True, True, False]
    assert budget_left(study, 2)            # the notebook's two trials use none of it

    def sweep():
        return control._sweep_orphans(registry, study._storage, "s", 60.0,
                                      clock=lambda: clock[0])

    assert sweep() == []
    clock[0] += 61.0
    assert sweep() == [number[ours]]                     # autotune's own, lost: queued
    notebook_trial = optuna.load_study(study_name="s", storage=url)
    notebook_trial.tell(notebook, 0.5)                   # the notebook tells it, as ever
    states = {t.number: t.state.name for t in study.trials}
    assert states[notebook.number] == "COMPLETE" and states[number[old_notebook]] == "RUNNING"
    assert [t.params for t in study.trials if t.state.name == "WAITING"] == [{}]
    registry.close()


def test_status_counts_a_running_trials_seconds_from_its_attempt_on_record(tmp_path):
    # a trial another machine took is stamped with that machine's clock: `autotune status`
    # showed its skew as running time; its attempt on record (the registry's clock) tells
    from autotune.status import show

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="minimize")
    elsewhere, here = take_trial(study, -7200.0), take_trial(study, 0.0)
    number = {t._trial_id: t.number for t in study.trials}
    registry = Registry(url)
    registry.register("w", "s", "host", 1)
    registry.attempt("s", number[elsewhere], 0, "w", status="running")
    registry.close()
    said: list[str] = []
    show("s", url, said.append)
    running = [line for line in said if " s on" in line]
    assert [int(line.split()[0]) for line in running] == [number[elsewhere], number[here]]
    for line in running:
        seconds = float(line.split(" s on")[0].split()[-1])
        assert 0 <= seconds < 60, line


def test_status_counts_a_running_trials_seconds_in_any_time_zone(tmp_path, monkeypatch):
    # Optuna's start stamps are naive local times: `autotune status` once read them as UTC,
    # and west of UTC a trial that had just started showed as running for hours
    from autotune.status import show

    monkeypatch.setenv("TZ", "Etc/GMT+5")       # UTC-5
    time.tzset()
    try:
        url = f"sqlite:///{tmp_path / 'study.db'}"
        make_study(url)
        said: list[str] = []
        show("s", url, said.append)
        [running] = [line for line in said if " s on" in line]
        seconds = float(running.split(" s on")[0].split()[-1])
        assert 0 <= seconds < 60, running
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_study_made_again_under_a_deleted_ones_name_starts_with_no_records(tmp_path):
    """`optuna delete-study` leaves autotune's tables alone: a new study of the name reused
    the old attempts' (study, trial number, attempt) keys, so its first trials' attempts were
    taken for late repeats of the old ones (never recorded as running: a lost worker's trial
    never resumed) until a new study drops them."""
    from autotune.config import StudyConfig
    from autotune.study import _forget_earlier

    url = f"sqlite:///{tmp_path / 'study.db'}"
    registry = Registry(url)
    registry.register(name="w1", study="s", host="h", pid=1)
    registry.attempt(study="s", trial_number=0, attempt=1, worker="w1", status="finished")
    registry.register(name="w9", study="other", host="h", pid=9)
    registry.attempt(study="other", trial_number=0, attempt=1, worker="w9", status="running")
    registry.register(name="w2", study="s", host="h", pid=2)
    assert registry.attempt(study="s", trial_number=0, attempt=1, worker="w2",
                            status="running") == {"status": "finished"}     # the defect
    said: list[str] = []
    _forget_earlier(StudyConfig(study_name="s", storage=url), said.append)
    assert said == ["study 's' is new: the records of 2 worker(s) and 1 trial attempt(s) of an "
                    "earlier study of that name, deleted since, are dropped"]
    assert registry.workers("s") == [] and registry.attempts("s") == []
    assert len(registry.attempts("other")) == 1                          # another study's kept
    registry.register(name="w2", study="s", host="h", pid=2)
    assert registry.attempt(study="s", trial_number=0, attempt=1, worker="w2",
                            status="running") == {"status": "running"}
    said.clear()
    _forget_earlier(StudyConfig(study_name="t", storage=url), said.append)
    assert said == []                                   # nothing to drop: nothing said
    registry.close()


def test_a_worker_name_used_again_for_another_study_is_that_studys_worker(tmp_path):
    """A container restarted with its host name and process id (`worker1-7`) joins a new
    study under the name its predecessor registered for the old one: the row kept the old
    study, so the new study never saw the worker, nor gave it up when it died."""
    registry = Registry(f"sqlite:///{tmp_path / 'study.db'}")
    registry.register(name="worker1-7", study="old", host="worker1", pid=7)
    registry.stop_worker(name="worker1-7")
    registry.register(name="worker1-7", study="new", host="worker1", pid=7)
    assert [w["status"] for w in registry.workers("new")] == ["running"]
    assert registry.workers("old") == []
    silence(registry, "worker1-7", 3600)
    registry.attempt(study="new", trial_number=4, attempt=1, worker="worker1-7",
                     status="running")
    silence(registry, "worker1-7", 3600)
    lost = registry.claim_lost("new", 60, datetime.min)
    assert [(c["trial_number"], c["worker"]) for c in lost] == [(4, "worker1-7")]
    registry.close()


def test_a_study_server_of_an_older_release_without_the_call_is_said_and_the_study_goes_on(
        monkeypatch):
    """A study server of an earlier release answers an unknown control call with
    INVALID_ARGUMENT: the new study starts, saying what it could not drop."""
    import grpc

    from autotune import study as study_module
    from autotune.config import StudyConfig

    class OlderServer(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.INVALID_ARGUMENT

    class Client:
        closed = False

        def forget(self, study: str) -> dict:
            raise OlderServer()

        def close(self) -> None:
            Client.closed = True

    monkeypatch.setattr(study_module, "registry_for", lambda url: Client())
    said: list[str] = []
    study_module._forget_earlier(StudyConfig(study_name="s", storage="autotune://h:1"),
                                 said.append)
    assert Client.closed and said == [
        "the study server at autotune://h:1 (another autotune release) cannot drop the records "
        "of an earlier study of this name; if one was deleted, give this study another name"]

    class Down(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    Client.forget = lambda self, study: (_ for _ in ()).throw(Down())   # type: ignore
    with pytest.raises(Down):
        study_module._forget_earlier(StudyConfig(study_name="s", storage="autotune://h:1"),
                                     said.append)
