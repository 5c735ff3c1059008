"""Two studies of one name (a study store deleted to start over, or a study of that name in
another store, run from the same folder) keep their own run folders and MLflow experiments:
the second never writes into the first's trial folders, models or MLflow runs."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import optuna
from mlflow import MlflowClient

from autotune import record
from autotune._outbox import UID_TAG, Outbox
from autotune._study_folder import MARKER, new_uid, study_folder, study_uid
from autotune.cli import main
from autotune.config import resolve_tracking_uri
from autotune.tracking import Tracker

from .conftest import run_cli
from .test_outbox import ops

A, B = "a" * 32, "b" * 32


def test_a_new_study_makes_its_folder_and_finds_it_again(tmp_path):
    folder = study_folder(tmp_path / "runs", "quickstart", A)
    assert folder == tmp_path / "runs" / "quickstart"
    assert (folder / MARKER).read_text() == A + "\n"
    (folder / "trial-0").mkdir()
    assert study_folder(tmp_path / "runs", "quickstart", A) == folder
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["quickstart"]


def test_another_studys_folder_of_the_same_name_is_left_alone(tmp_path):
    runs = tmp_path / "runs"
    theirs = study_folder(runs, "quickstart", A)
    (theirs / "trial-0").mkdir()
    (theirs / "trial-0" / "model.pt").write_text("their model")
    mine = study_folder(runs, "quickstart", B)
    assert mine == runs / "quickstart-2"
    assert study_folder(runs, "quickstart", B) == mine          # found again, not -3
    assert (theirs / "trial-0" / "model.pt").read_text() == "their model"
    assert (theirs / MARKER).read_text() == A + "\n"
    # a folder of files without a marker (a study begun before autotune kept ids) is not
    # taken by a new study either; an empty one is
    (runs / "legacy").mkdir()
    (runs / "legacy" / "trial-0").mkdir()
    assert study_folder(runs, "legacy", A) == runs / "legacy-2"
    (runs / "empty").mkdir()
    assert study_folder(runs, "empty", A) == runs / "empty"
    # a study begun before autotune kept ids (no uid) keeps its folder as it was
    assert study_folder(runs, "legacy", None) == runs / "legacy"
    assert not list(runs.glob(".*"))                             # nothing left aside


def _resolve(args: tuple[str, str, str]) -> str:
    return str(study_folder(Path(args[0]), args[1], args[2]))


def test_processes_of_one_study_starting_together_find_one_folder(tmp_path):
    runs = tmp_path / "runs"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        found = pool.map(_resolve, [(str(runs), "s", A)] * 4 + [(str(runs), "s", B)] * 4)
    assert len(set(found[:4])) == 1 and len(set(found[4:])) == 1
    assert {found[0], found[4]} == {str(runs / "s"), str(runs / "s-2")}


def test_a_study_keeps_an_id_that_no_other_study_has(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    assert study_uid(study) is None                 # begun before autotune kept one
    uid = new_uid()
    study.set_user_attr(record.STUDY_UID, uid)
    assert study_uid(optuna.load_study(study_name="s", storage=storage)) == uid
    assert uid != new_uid()
    study.set_user_attr(record.STUDY_UID, "x' OR '1'='1")   # not an id: not used as one
    assert study_uid(study) is None


def _experiments(store: str) -> dict[str, tuple[str, str | None, int]]:
    client = MlflowClient(tracking_uri=store)
    from mlflow.entities import ViewType

    return {e.name: (e.lifecycle_stage, e.tags.get(UID_TAG),
                     len(client.search_runs([e.experiment_id], run_view_type=ViewType.ALL)))
            for e in client.search_experiments(view_type=ViewType.ALL) if e.name != "Default"}


def test_records_of_a_second_study_of_one_name_go_to_an_experiment_of_their_own(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    first = Outbox(lambda: client, tmp_path / "a.jsonl", "quickstart", uid=A)
    for op in ops(2):
        first.submit(op)
    assert first.close(timeout_s=60) and first.experiment_name == "quickstart"
    second = Outbox(lambda: client, tmp_path / "b.jsonl", "quickstart", uid=B)
    for op in ops(3):
        second.submit(op)
    assert second.close(timeout_s=60) and second.experiment_name == "quickstart-2"
    assert _experiments(store) == {"quickstart": ("active", A, 2),
                                   "quickstart-2": ("active", B, 2)}
    history = client.get_metric_history(
        client.search_runs([client.get_experiment_by_name("quickstart").experiment_id],
                           filter_string="tags.`autotune.run_key` = 'trial-0'")[0].info.run_id,
        "top1")
    assert len(history) == 2                            # the first study's curve alone
    # each study finds its own again, whatever its name (a worker, a resume)
    again = Outbox(lambda: client, tmp_path / "c.jsonl", "quickstart", uid=B)
    again.submit({"op": "log", "run": "trial-0", "metrics": [["top1", 0.9, 5_000, 9]]})
    assert again.close(timeout_s=60) and again.experiment_name == "quickstart-2"
    assert _experiments(store)["quickstart-2"] == ("active", B, 2)
    # a study begun before autotune kept ids records to the experiment of its name
    legacy = Outbox(lambda: client, tmp_path / "d.jsonl", "quickstart")
    legacy.submit({"op": "log", "run": "trial-0", "metrics": [["top1", 0.95, 6_000, 9]]})
    assert legacy.close(timeout_s=60) and legacy.experiment_name == "quickstart"
    assert len(client.get_metric_history(client.search_runs(
        [client.get_experiment_by_name("quickstart").experiment_id],
        filter_string="tags.`autotune.run_key` = 'trial-0'")[0].info.run_id, "top1")) == 3


def test_a_new_study_whose_name_is_in_mlflows_trash_records_beside_it(tmp_path):
    # an experiment deleted in MLflow's UI keeps its name there: a study started over after
    # deleting its store and its experiment records under the next name, not in the trash
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    client.delete_experiment(client.create_experiment("quickstart", tags={UID_TAG: A}))
    box = Outbox(lambda: client, tmp_path / "b.jsonl", "quickstart", uid=B)
    for op in ops(1):
        box.submit(op)
    assert box.close(timeout_s=60) and box.experiment_name == "quickstart-2"
    # the deleted study itself, resumed, is told its experiment is in the trash
    own = Outbox(lambda: client, tmp_path / "a.jsonl", "quickstart", uid=A)
    own.submit(ops(1)[0])
    assert not own.close(timeout_s=3)
    assert own.last_error is not None and own.last_error.startswith(
        "the MLflow experiment 'quickstart' is deleted (in MLflow's trash)"), own.last_error


def test_a_resumed_study_whose_experiment_is_in_the_trash_is_refused_before_it_runs(
        workdir, capsys):
    storage = f"sqlite:///{workdir / 'autotune.db'}"
    tracker = Tracker(str(workdir / "mlruns"), "quickstart", workdir / "runs", uid=A)
    tracker.start_study({}, {"study_name": "quickstart"}, {}, resumed=False)
    assert tracker.close(timeout_s=60)
    study = optuna.create_study(study_name="quickstart", storage=storage)
    study.set_user_attr(record.STUDY_UID, A)
    study.set_user_attr(record.STUDY_CONFIG, {"study_name": "quickstart"})
    store = resolve_tracking_uri(str(workdir / "mlruns"))[0]
    client = MlflowClient(tracking_uri=store)
    client.delete_experiment(client.get_experiment_by_name("quickstart").experiment_id)
    before = sorted(str(p) for p in workdir.rglob("*") if "-wal" not in p.name
                    and "-shm" not in p.name)
    capsys.readouterr()
    assert main(["start", "study", "quickstart"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "autotune: error: the MLflow experiment 'quickstart' is deleted (in MLflow's trash): "
        f"restore it (MLFLOW_TRACKING_URI={store} mlflow experiments restore -x 1), delete it "
        f"for good (MLFLOW_TRACKING_URI={store} mlflow gc --backend-store-uri {store} "
        "--experiment-ids 1), or give the study another study_name"), err
    assert sorted(str(p) for p in workdir.rglob("*") if "-wal" not in p.name
                  and "-shm" not in p.name) == before
    assert optuna.load_study(study_name="quickstart", storage=storage).trials == []


def test_the_ui_of_a_study_name_tells_of_the_other_studies_recorded_under_it(tmp_path):
    from autotune.ui import _experiment_id

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    for uid, spool in ((A, "a.jsonl"), (B, "b.jsonl")):
        box = Outbox(lambda: client, tmp_path / spool, "quickstart",
                     {"autotune.study": "quickstart"}, uid=uid)
        box.submit(ops(0)[0])
        assert box.close(timeout_s=60)
    said: list[str] = []
    first = _experiment_id(store, "quickstart", said.append)
    assert first == client.get_experiment_by_name("quickstart").experiment_id
    assert said == ["other studies named 'quickstart' recorded to experiment(s) "
                    "'quickstart-2': give --study with that name"]
    said.clear()
    assert _experiment_id(store, "quickstart-2", said.append) == \
        client.get_experiment_by_name("quickstart-2").experiment_id
    assert said == []


def test_a_second_start_study_of_one_study_from_one_folder_is_refused(tmp_path, monkeypatch):
    # it shared the first's MLflow outbox (each process rewriting the file the other appends
    # to), plots and best model; a worker beside it, or --workers, is the way to run more
    from autotune import _study_setup, config
    from autotune._study_folder import LOCK, hold

    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    cfg, space, _ = _study_setup.prepare(config.load("quickstart", {"storage": storage}))
    study = optuna.create_study(study_name="quickstart", storage=storage, direction="minimize")
    uid = new_uid()                         # as the first `start study` made it
    study.set_user_attr(record.STUDY_UID, uid)
    study.set_user_attr(record.STUDY_SPACE, space.to_dict())
    study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())
    folder = study_folder(tmp_path / "autotune-runs", "quickstart", uid)
    with hold(folder):                      # as the first holds it while it runs
        second = run_cli("start", "study", "quickstart", "--storage", storage, cwd=tmp_path,
                         timeout=300)
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert f"the study's run folder {folder} is in use by another `start study` of it " \
               f"(process {os.getpid()})" in second.stderr
        assert (folder / LOCK).read_text() == str(os.getpid())
    assert study.trials == [] and sorted(p.name for p in folder.iterdir()) == [LOCK, MARKER]
    hold(folder).close()                    # free again once the first has ended


def test_a_run_folder_on_a_filesystem_without_locks_is_used_and_said(tmp_path, monkeypatch,
                                                                    caplog):
    # Lustre mounted without -o flock answers ENOSYS: that is no other study holding it
    import errno
    import fcntl

    from autotune._study_folder import hold

    def no_locks(*_):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with hold(tmp_path / "runs" / "s"):
        pass
    assert any("cannot be locked (Function not implemented)" in r.getMessage()
               for r in caplog.records)
