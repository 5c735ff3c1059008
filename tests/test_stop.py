"""`autotune stop study`: every worker of a study, wherever it runs, starts no new trial; a
running trial finishes (or, with --now, checkpoints and is queued to resume); `start study`
resumes the study where it stopped."""

from __future__ import annotations

import time

import optuna
import pytest
from optuna.trial import TrialState

from ._services import autotune
from .conftest import run_cli

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _wait_for_running(storage: str, finished: int = 0, timeout_s: float = 240) -> int:
    """The number of a trial running (evaluated once) once ``finished`` trials have ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            trials = optuna.load_study(study_name="quickstart", storage=storage).trials
        except KeyError:
            trials = []
        ended = [t for t in trials if t.state.is_finished()]
        running = [t for t in trials if t.state == TrialState.RUNNING
                   and len(t.user_attrs.get("curve", [])) >= 1]
        if len(ended) >= finished and running:
            return running[0].number
        time.sleep(0.3)
    raise AssertionError(f"no trial was running after {finished} ended")


@pytest.mark.slow     # the default suite stops a local worker (--now, below): the same request
def test_a_stop_reaches_a_worker_on_another_terminal_which_finishes_its_trial(tmp_path):
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    waiting = autotune("start", "study", "quickstart", "--workers", "0", "--n-trials", "30",
                       "--max-trial-seconds", "20", cwd=tmp_path)
    worker = None
    try:
        while not (tmp_path / "autotune.db").exists() and waiting.poll() is None:
            time.sleep(0.2)
        time.sleep(1)
        worker = autotune("worker", "--storage", storage, "--study", "quickstart", cwd=tmp_path)
        _wait_for_running(storage)
        stop = run_cli("stop", "study", "quickstart", "--storage", storage, cwd=tmp_path,
                       timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert "stop requested; its workers start no new trial, and running trials train " \
               "to their end (running now: trial(s) " in stop.stdout
        running = int(stop.stdout.split("running now: trial(s) ")[1].split(")")[0])
        begun = len(optuna.load_study(study_name="quickstart", storage=storage).trials)
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-2000:]
        assert "the study was stopped by `autotune stop study`" in out
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err[-2000:]
        assert "was stopped by `autotune stop study`" in out
        assert f"study 'quickstart': {begun} trials (" in out       # then its summary
    finally:
        for p in (waiting, worker):
            if p is not None and p.poll() is None:
                p.kill()
    trials = optuna.load_study(study_name="quickstart", storage=storage).trials
    assert len(trials) == begun < 30                        # no trial began after the stop
    assert trials[running].state == TrialState.COMPLETE     # ... and the running one finished
    assert trials[running].user_attrs["stop_reason"] != "interrupted"

    # A worker started later has nothing to do; status says why.
    late = run_cli("worker", "--storage", storage, "--study", "quickstart", cwd=tmp_path,
                   timeout=120)
    assert late.returncode == 0 and "nothing to do until `autotune start study` resumes it" \
        in late.stdout, late.stderr
    status = run_cli("status", "quickstart", "--storage", storage, cwd=tmp_path, timeout=60)
    assert "stopped by `autotune stop study`" in status.stdout
    again = run_cli("stop", "study", "quickstart", "--storage", storage, cwd=tmp_path,
                    timeout=60)
    assert again.returncode == 0 and "was already stopped" in again.stdout
    missing = run_cli("stop", "study", "nosuch", "--storage", storage, cwd=tmp_path,
                      timeout=60)
    assert missing.returncode == 2 and "no study 'nosuch'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_stop_now_checkpoints_the_running_trial_and_start_study_resumes_it(tmp_path):
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    # The running trial's limit leaves room for `stop study --now` to start and be seen on a
    # loaded machine (at 12 s the trial sometimes ended on its limit first, as max_seconds).
    study = autotune("start", "study", "quickstart", "--n-trials", "30",
                     "--max-trial-seconds", "40", cwd=tmp_path)
    try:
        _wait_for_running(storage)
        stop = run_cli("stop", "study", "quickstart", "--storage", storage, "--now",
                       cwd=tmp_path, timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert "running trials save a checkpoint and stop" in stop.stdout
        running = int(stop.stdout.split("running now: trial(s) ")[1].split(")")[0])
        out, err = study.communicate(timeout=120)
    finally:
        if study.poll() is None:
            study.kill()
    assert study.returncode == 0, err[-2000:]
    assert "(running trials checkpoint and stop); the same command resumes it" in out
    trials = optuna.load_study(study_name="quickstart", storage=storage).trials
    assert trials[running].user_attrs["stop_reason"] == "interrupted"
    assert trials[running].user_attrs["checkpoint"]
    [queued] = [t for t in trials if t.state == TrialState.WAITING]
    assert queued.user_attrs["resume_of"] == running

    finished = len([t for t in trials if t.state.is_finished()
                    and t.user_attrs.get("stop_reason") != "interrupted"])
    resumed = run_cli("start", "study", "quickstart", "--n-trials", str(finished + 1),
                      "--max-trial-seconds", "40", cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "was stopped by `autotune stop study`" in resumed.stdout
    assert "resuming it" in resumed.stdout
    trials = optuna.load_study(study_name="quickstart", storage=storage).trials
    again = trials[queued.number]
    assert again.state == TrialState.COMPLETE and again.user_attrs["resume_of"] == running
    assert again.user_attrs["resume_from"] == trials[running].user_attrs["checkpoint"]
