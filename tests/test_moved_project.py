"""A project folder moved (or copied) since its study started: the MLflow store's files, the
study's images, its saved model and what workers take from the study follow it there."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState, create_trial

from autotune import config, record
from autotune._console import model_note
from autotune._study_setup import check_resumed_config
from autotune.errors import ConfigError
from autotune.tracking import Tracker, follow_moved_store, resolve_tracking_uri


def _store_with_a_trial(project: Path) -> None:
    """A local store made the way a study makes it, with one trial's plan as an artifact."""
    tracker = Tracker(str(project / "mlruns"), "moved", project / "runs")
    tracker.start_study({}, {"study_name": "moved"}, {}, resumed=False)
    tracker.start_trial(0, {"global_batch": 128}, {}, {"epochs": 3})
    assert tracker.close(timeout_s=60)


def _plans(project: Path) -> dict[str, list[str]]:
    """Each run's artifact folder and the files MLflow lists in it."""
    uri = resolve_tracking_uri(str(project / "mlruns"))[0]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("moved")
    return {run.info.artifact_uri: sorted(a.path for a in client.list_artifacts(run.info.run_id))
            for run in client.search_runs([experiment.experiment_id])}


def test_a_moved_store_finds_its_files_and_writes_no_more_where_it_was(tmp_path):
    _store_with_a_trial(tmp_path / "a")
    assert follow_moved_store(str(tmp_path / "a" / "mlruns")) is None   # where it was made
    shutil.move(tmp_path / "a", tmp_path / "b")
    line = follow_moved_store(str(tmp_path / "b" / "mlruns"))
    assert line == (f"the MLflow store {tmp_path / 'b' / 'mlruns'} was moved or copied from "
                    f"{tmp_path / 'a' / 'mlruns'}: its records now find their files where it is")
    plans = _plans(tmp_path / "b")
    assert all(uri.startswith((tmp_path / "b" / "mlruns" / "artifacts").as_uri())
               for uri in plans)
    assert sorted(plans.values()) == [["plan.json"], ["search_space.json", "study_config.json"]]
    assert follow_moved_store(str(tmp_path / "b" / "mlruns")) is None   # done once
    # a resumed study's next records go into the store where it lies now
    tracker = Tracker(str(tmp_path / "b" / "mlruns"), "moved", tmp_path / "b" / "runs")
    tracker.start_trial(1, {"global_batch": 256}, {}, {"epochs": 3})
    assert tracker.close(timeout_s=60)
    assert len(_plans(tmp_path / "b")) == 3
    assert not (tmp_path / "a").exists()


def test_a_copied_store_writes_into_its_own_folder_and_the_original_keeps_its_own(tmp_path):
    _store_with_a_trial(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert follow_moved_store(str(tmp_path / "b" / "mlruns")) is not None
    assert all(uri.startswith((tmp_path / "b").as_uri()) for uri in _plans(tmp_path / "b"))
    assert all(uri.startswith((tmp_path / "a").as_uri()) for uri in _plans(tmp_path / "a"))
    assert follow_moved_store(str(tmp_path / "a" / "mlruns")) is None


def test_a_store_whose_experiment_lies_in_another_live_store_is_left_as_it_is(tmp_path):
    """An experiment pointing at another store that is still there, whose files were not
    copied here, is that store's: nothing is repointed."""
    _store_with_a_trial(tmp_path / "a")
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "mlruns", tmp_path / "b" / "mlruns",
                    ignore=shutil.ignore_patterns("artifacts"))
    assert follow_moved_store(str(tmp_path / "b" / "mlruns")) is None
    assert all(uri.startswith((tmp_path / "a").as_uri()) for uri in _plans(tmp_path / "b"))
    # a tracking URI (not a folder) has no store folder of autotune's to follow
    assert follow_moved_store(resolve_tracking_uri(str(tmp_path / "b" / "mlruns"))[0]) is None


def _study(tmp_path: Path, cfg: config.StudyConfig) -> optuna.Study:
    study = optuna.create_study(study_name=cfg.study_name,
                                storage=f"sqlite:///{tmp_path / 'studies.db'}")
    study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())
    return study


def _images_config(path: Path, **budget: int) -> config.StudyConfig:
    cfg = config.load("quickstart", {"budget.n_trials": budget.get("n_trials", 12)})
    trainer = cfg.trainer.__class__(**{**cfg.trainer.__dict__, "num_classes": 3,
                                       "data": {"kind": "imagefolder", "path": str(path)}})
    return cfg.__class__(**{**cfg.__dict__, "trainer": trainer})


def test_a_resume_after_the_images_moved_takes_them_where_they_are_now(tmp_path):
    study = _study(tmp_path, _images_config(tmp_path / "a" / "data"))
    (tmp_path / "b" / "data").mkdir(parents=True)
    lines: list[str] = []
    check_resumed_config(_images_config(tmp_path / "b" / "data", n_trials=20), study, False,
                         lines.append)
    assert lines == [f"study 'quickstart': its images moved from {tmp_path / 'a' / 'data'} (no "
                     f"longer there) to {tmp_path / 'b' / 'data'}; resuming with the tree there"]
    stored = optuna.load_study(study_name="quickstart",
                               storage=f"sqlite:///{tmp_path / 'studies.db'}").user_attrs[
        record.STUDY_CONFIG]
    # workers that join now take the tree where it is and the budget this start set
    assert stored["trainer"]["data"]["path"] == str(tmp_path / "b" / "data")
    assert stored["budget"]["n_trials"] == 20


def test_another_tree_where_the_first_is_still_there_needs_accept_changes(tmp_path):
    (tmp_path / "a" / "data").mkdir(parents=True)
    study = _study(tmp_path, _images_config(tmp_path / "a" / "data"))
    with pytest.raises(ConfigError, match=(
            r"started with another config \(trainer.data.path: '.*/a/data' -> '.*/b/data'\); "
            "pass --accept-changes")):
        check_resumed_config(_images_config(tmp_path / "b" / "data"), study, False, print)
    assert study.user_attrs[record.STUDY_CONFIG]["trainer"]["data"]["path"] == str(
        tmp_path / "a" / "data")


def test_a_resume_with_a_new_budget_is_what_joining_workers_take(tmp_path):
    study = _study(tmp_path, config.load("quickstart"))
    lines: list[str] = []
    check_resumed_config(config.load("quickstart", {"budget.n_trials": 40,
                                                    "run_dir": str(tmp_path / "runs")}),
                         study, False, lines.append)
    assert lines == []      # how long and where a study runs change without a word
    stored = config.StudyConfig.from_dict(study.user_attrs[record.STUDY_CONFIG])
    assert stored.budget.n_trials == 40 and stored.run_dir == str(tmp_path / "runs")


def test_the_best_model_is_found_in_the_run_folder_it_moved_with(tmp_path):
    saved = tmp_path / "b" / "autotune-runs" / "exp" / "trial-3" / "model.pt"
    saved.parent.mkdir(parents=True)
    saved.write_bytes(b"weights")
    trial = create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs={
        record.MODEL: str(tmp_path / "a" / "autotune-runs" / "exp" / "trial-3" / "model.pt")})
    assert model_note(trial, (str(tmp_path / "b" / "autotune-runs"),)) == str(saved)
    assert model_note(trial, (str(tmp_path / "c"),)).endswith("model.pt (removed since)")


def test_a_store_that_cannot_be_read_is_left_to_mlflow_to_report(tmp_path):
    (tmp_path / "mlruns").mkdir()
    (tmp_path / "mlruns" / "mlflow.db").write_text("not a database")
    assert follow_moved_store(str(tmp_path / "mlruns")) is None
    assert (tmp_path / "mlruns" / "mlflow.db").read_text() == "not a database"
