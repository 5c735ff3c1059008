"""A full disk under the run folder: no configuration is blamed for it, a finished trial's
result is told to the study, and the user gets one line saying where and what to do."""

from __future__ import annotations

import dataclasses
import errno
import json
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune._process import ReportChannel
from autotune.config import StudyConfig
from autotune.errors import disk_full, is_disk_full
from autotune.space import load_space
from autotune.tracking import Tracker
from autotune.trial_runner import TrialRunner

from .test_decisions import PARAMS, PLAYER, _reports

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(),
                                reason="needs /dev/full, a device every write to fails with "
                                       "ENOSPC")


def _runner(tmp_path: Path, reports: list[dict], tracker: Tracker | None
            ) -> tuple[TrialRunner, optuna.Study]:
    cfg = StudyConfig()
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, warm_ranks=False))
    study = optuna.create_study(direction="minimize")
    study.enqueue_trial(PARAMS)
    played = tmp_path / "reports.json"
    played.write_text(json.dumps(reports))
    runner = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437,
                         run_dir=tmp_path / "runs", tracker=tracker)

    def command(plan_path: Path) -> tuple[ReportChannel, list[str]]:
        channel = ReportChannel()
        return channel, [sys.executable, str(PLAYER), channel.address, str(played),
                         str(tmp_path / "replies.json")]

    runner.ranks.command = command     # the stand-in trainer, launched as the real one is
    return runner, study


def test_a_full_disk_under_the_mlflow_outbox_leaves_the_trial_to_resume_not_failed(tmp_path):
    # the outbox's spool is a full device: recording the trial's start fails mid-trial
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "mlflow-outbox.jsonl").symlink_to("/dev/full")
    tracker = Tracker(str(tmp_path / "mlruns"), "s", folder)
    runner, study = _runner(tmp_path, _reports([(3.0, 0.5), (6.0, 0.98)], 4), tracker)
    with runner, pytest.raises(OSError) as raised:
        runner.run(study)
    assert is_disk_full(raised.value) and raised.value.filename == str(
        folder / "mlflow-outbox.jsonl")
    # not told as a failure of its configuration: left to be resumed as a lost worker's
    assert [t.state for t in study.trials] == [TrialState.RUNNING]
    assert disk_full(raised.value).startswith(
        f"no space left on the disk holding {folder} (")
    assert disk_full(raised.value).endswith(
        "free some there, or give run_dir, storage or tracking_uri on another disk; the same "
        "command resumes the study, and a trial that was running resumes from its latest "
        "checkpoint")


class _FullAtTheEnd:
    """A listener whose record of a trial's end meets a full disk (the MLflow outbox's
    write), as the stand-in for that disk: every other event passes."""

    def __getattr__(self, event: str):
        def listen(*args: object) -> None:
            if event == "ended":
                raise OSError(errno.ENOSPC, "No space left on device", "/full/outbox.jsonl")
        return listen


def test_a_trial_that_finished_is_told_to_the_study_though_its_record_meets_a_full_disk(
        tmp_path):
    runner, study = _runner(tmp_path, _reports([(3.0, 0.5), (6.0, 0.98)], 4), None)
    runner.listeners.append(_FullAtTheEnd())     # type: ignore[arg-type]
    with runner, pytest.raises(OSError):
        runner.run(study)
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["outcome"] == "reached"
    assert trial.value == pytest.approx(6.0, abs=0.5)


def test_a_model_that_meets_a_full_disk_leaves_no_half_written_file(tmp_path):
    import torch

    from trainers.models import save_model

    part = tmp_path / ".model.pt.part"
    part.symlink_to("/dev/full")            # the save's temporary file: on a full disk
    plan = {"model": "resnet18", "data": {"kind": "digits"}}
    with pytest.raises((OSError, RuntimeError)):
        save_model(tmp_path / "model.pt", torch.nn.Linear(2, 2), plan, ["a", "b"])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_study_database_whose_disk_is_full_is_said_so_at_once_not_waited_for(tmp_path):
    # SQLite's own full database (a page limit: what a full disk gives it), through the
    # storage every command opens: no outage to wait out, one line
    import time

    import sqlalchemy

    from autotune.store import open_storage

    path = tmp_path / "s.db"
    storage = open_storage(f"sqlite:///{path}")
    optuna.create_study(study_name="first", storage=storage)
    engine = storage.inner.engine
    sqlalchemy.event.listen(engine, "connect", lambda conn, _: conn.execute(
        "PRAGMA max_page_count = " + str(path.stat().st_size // 4096 + 1)))
    engine.dispose()
    began = time.monotonic()
    with pytest.raises(OSError) as raised:
        for i in range(200):
            optuna.create_study(study_name=f"more-{i}" + "x" * 2000, storage=storage)
    assert time.monotonic() - began < 30
    assert is_disk_full(raised.value) and raised.value.filename == str(path)
    assert disk_full(raised.value).startswith(
        f"no space left on the disk holding {tmp_path} (")
    assert f"the study database sqlite:///{path} cannot grow: its disk is full" in \
        disk_full(raised.value)
