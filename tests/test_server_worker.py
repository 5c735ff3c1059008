"""`autotune server`, `autotune worker` and `start study --workers 0` on real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import optuna
import pytest

from autotune.config import database_url

from ._services import autotune, free_port, one_storage, wait_for_port
from .conftest import ROOT

pytestmark = pytest.mark.postgres


@pytest.mark.slow  # test_crash_safety runs a server, workers and start study --workers 0 too
def test_a_remote_worker_runs_a_study_created_through_the_server(postgres, tmp_path):
    url = postgres.database()
    port = free_port()
    server = autotune("server", "--storage", url, "--port", str(port), cwd=tmp_path)
    try:
        wait_for_port(port)
        study = autotune("start", "study", "quickstart", "--storage",
                         f"autotune://127.0.0.1:{port}", "--workers", "0", "--n-trials", "2",
                         "--max-trial-seconds", "60", cwd=tmp_path)
        time.sleep(3)
        worker = autotune("worker", "--server", f"127.0.0.1:{port}", "--study", "quickstart",
                          cwd=tmp_path)
        out, err = study.communicate(timeout=400)
        assert study.returncode == 0, err[-2000:]
        w_out, w_err = worker.communicate(timeout=120)
        assert worker.returncode == 0, w_err[-2000:]
    finally:
        server.terminate()
        server.wait(20)
    assert "waits for workers" in out and out.count("[trial ") == 2
    assert "joined study 'quickstart'" in w_out and "budget is spent" in w_out
    trials = optuna.load_study(study_name="quickstart", storage=database_url(url)).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert trials[0].user_attrs["outcome"] == "reached"     # the warm start, on the worker


def test_a_worker_for_an_unknown_study_is_one_line(tmp_path):
    def join() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "autotune", "worker", "--storage",
                               f"sqlite:///{tmp_path / 'x.db'}", "--study", "nope"],
                              cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    result = join()
    assert result.returncode == 2
    assert result.stderr.strip().startswith("autotune: error: no study database at")
    assert not (tmp_path / "x.db").exists()                  # joining creates nothing
    optuna.create_study(study_name="other", storage=f"sqlite:///{tmp_path / 'x.db'}")
    result = join()
    assert result.returncode == 2
    assert result.stderr.strip().startswith("autotune: error: no study 'nope'")


def test_a_worker_waits_for_a_study_start_study_is_still_creating(tmp_path, monkeypatch):
    """Workers started with `start study` may find its study before its config is written:
    they wait for it (the last CI failure: both workers quit at once), and only a study that
    never gets one is refused, in one line."""
    import threading

    from autotune import record, worker
    from autotune.config import StudyConfig
    from autotune.errors import ConfigError
    from autotune.space import load_space

    storage = f"sqlite:///{tmp_path / 'x.db'}"
    bare = optuna.create_study(study_name="half", storage=storage)
    cfg = StudyConfig.from_dict({"study_name": "half", "search_space": "quickstart"})
    space = load_space("quickstart", world_size=1)

    said: list[str] = []
    waiting = threading.Event()

    def echo(line: str) -> None:
        said.append(line)
        waiting.set()

    # The config comes a second after the worker said it waits (a fixed sleep from the start
    # raced the worker's own first read on a loaded machine: the config was there by then).
    def finish_creating() -> None:
        waiting.wait(timeout=30)
        time.sleep(1.0)
        bare.set_user_attr(record.STUDY_SPACE, space.to_dict())
        bare.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())

    writer = threading.Thread(target=finish_creating)
    writer.start()
    started = time.monotonic()
    _, joined_cfg, joined_space = worker._load(storage, "half", echo)
    writer.join()
    assert time.monotonic() - started >= 0.9
    assert joined_cfg.study_name == "half" and joined_space.to_dict() == space.to_dict()
    assert said == ["study 'half' has no autotune config yet: waiting up to 30 s for "
                    "`autotune start study` to write it"]

    optuna.create_study(study_name="never", storage=storage)
    monkeypatch.setattr(worker, "CREATION_WAIT_S", 1.0)
    with pytest.raises(ConfigError, match="holds no autotune config after 1 s.*start study"):
        worker._load(storage, "never", said.append)


@pytest.mark.slow  # 2 minutes; test_crash_safety resumes a lost trial elsewhere, and
# test_trainer_resume checks the trainer's checkpoint on SIGTERM
def test_sigterm_checkpoints_the_running_trial_and_another_worker_resumes_it(postgres,
                                                                             tmp_path):
    url = postgres.database()
    storage = one_storage(url)        # polled: one engine, not one per poll
    study = autotune("start", "study", "quickstart", "--storage", url, "--workers", "0",
                     "--n-trials", "1", "--max-trial-seconds", "60", "--no-warm-start",
                     "--seed", "3", cwd=tmp_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            optuna.load_study(study_name="quickstart", storage=storage)
            break
        except KeyError:
            time.sleep(1)
    first = autotune("worker", "--storage", url, "--study", "quickstart", cwd=tmp_path)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:                     # until its first evaluation
        trials = optuna.load_study(study_name="quickstart", storage=storage).trials
        if any(t.user_attrs.get("curve") for t in trials):
            break
        time.sleep(0.5)
    first.send_signal(15)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-2000:]
    second = autotune("worker", "--storage", url, "--study", "quickstart", cwd=tmp_path)
    out, err = study.communicate(timeout=400)
    assert study.returncode == 0, err[-2000:]
    second.communicate(timeout=120)

    interrupted, resumed = [t for t in optuna.load_study(study_name="quickstart",
                                                         storage=storage).trials
                            if t.user_attrs.get("outcome") != "infeasible"]
    assert interrupted.state.name == "FAIL"
    assert interrupted.user_attrs["stop_reason"] == "interrupted"
    assert resumed.state.name == "COMPLETE" and resumed.params == interrupted.params
    assert resumed.user_attrs["lineage"] == [interrupted.number]
    assert resumed.user_attrs["downtime_s"] > 0
    before = interrupted.user_attrs["curve"][-1][0]
    after = resumed.user_attrs["curve"][0][0]
    assert after > before                                  # the clock continued
    assert resumed.user_attrs["curve"][0][3] > interrupted.user_attrs["curve"][0][3]


def test_a_worker_on_a_plain_optuna_proxy_says_its_trials_will_not_be_recovered(tmp_path,
                                                                               caplog):
    # Optuna's own gRPC proxy serves the study, not `autotune server`: the worker ran its
    # trials and its heartbeats failed in silence, so its trials could never be recovered
    from optuna.storages import RDBStorage
    from optuna.storages._grpc.server import make_server

    from autotune.control import ControlClient, WorkerSession

    port = free_port()
    server = make_server(RDBStorage(f"sqlite:///{tmp_path}/plain.db"), "127.0.0.1", port)
    server.start()
    try:
        caplog.set_level("WARNING", logger="autotune")
        session = WorkerSession(ControlClient("127.0.0.1", port), "s", heartbeat_s=0.2)
        time.sleep(1.0)                                      # a few beats
        session.close(timeout_s=0.5)
    finally:
        server.stop(None)
    said = [r.getMessage() for r in caplog.records if "control channel" in r.getMessage()]
    assert said == [
        f"autotune: warning: the server at 127.0.0.1:{port} answers Optuna's storage calls but "
        "has no control channel: it is a plain Optuna storage proxy, not `autotune server`; "
        "this worker's heartbeats are not recorded, so a trial it leaves when it dies is not "
        "resumed elsewhere: serve the study with `autotune server --storage URL`"], said


def test_a_worker_without_study_joins_the_only_one_and_names_them_when_there_are_more(
        tmp_path, monkeypatch, capsys):
    from autotune import _study_setup, config, record
    from autotune.cli import main

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    optuna.create_study(study_name="plain", storage=url)      # a user's own: not counted
    assert main(["worker", "--storage", url]) == 2
    assert capsys.readouterr().err == (
        f"autotune: error: no autotune study in {url}; create one with `autotune start study "
        "FILE --workers 0`, then start workers\n")
    cfg, space, _ = _study_setup.prepare(config.load("quickstart", {"budget.n_trials": 1}))
    for name in ("digits-a", "digits-b"):
        study = optuna.create_study(study_name=name, storage=url)
        study.set_user_attr(record.STUDY_SPACE, space.to_dict())
        study.set_user_attr(record.STUDY_CONFIG, {**cfg.public_dict(), "study_name": name})
        study.add_trial(optuna.trial.create_trial(     # its budget is spent, by an autotune
            value=1.0, user_attrs={record.OUTCOME: "censored"}))  # trial (not a notebook's)
        if name == "digits-a":
            assert main(["worker", "--storage", url]) == 0
            out = capsys.readouterr().out
            assert out.startswith(f"joining study 'digits-a', the only autotune study in {url}\n")
            assert "the study's budget is spent" in out
    assert main(["worker", "--storage", url]) == 2
    assert capsys.readouterr().err == (
        f"autotune: error: {url} holds 2 autotune studies (digits-a, digits-b); name one with "
        "--study NAME\n")


def test_a_worker_where_the_studys_weights_are_not_is_told_in_one_line(tmp_path, monkeypatch,
                                                                       capsys):
    """A study that starts its models from a file (`trainer.weights`) needs it on every
    worker's machine: a worker where it is not says so before it takes a trial."""
    import dataclasses

    from autotune import _study_setup, config, record
    from autotune.cli import main

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    cfg, space, _ = _study_setup.prepare(config.load("quickstart"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, weights=str(tmp_path / "elsewhere" / "resnet18.pth")))
    study = optuna.create_study(study_name="tuned", storage=url)
    study.set_user_attr(record.STUDY_SPACE, space.to_dict())
    study.set_user_attr(record.STUDY_CONFIG, {**cfg.public_dict(), "study_name": "tuned"})
    assert main(["worker", "--storage", url, "--study", "tuned"]) == 2
    assert capsys.readouterr().err == (
        f"autotune: error: study 'tuned' starts its models from {tmp_path}/elsewhere/"
        "resnet18.pth, which is not on this machine; copy the file to that path here\n")
    assert study.trials == []
