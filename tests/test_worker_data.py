"""A worker on a machine where the study's ImageFolder tree lies elsewhere: ``--data PATH``
names it there; without it, or with another tree, the worker refuses in one line before it
runs anything."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from PIL import Image

from autotune import config, record
from autotune._study_setup import prepare
from autotune.cli import main

from .conftest import run_cli


def _tree(root: Path, classes: int) -> None:
    for split, n in (("train", 6), ("val", 2)):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (12, 12), (40 * c, 10 * i, 0)).save(folder / f"{i}.png")


@pytest.fixture
def started(tmp_path: Path) -> Path:
    """A study on tmp_path/here/images, created as `start study` creates it, whose one trial
    is done (a worker that joins has nothing left to run)."""
    _tree(tmp_path / "here" / "images", classes=3)
    (tmp_path / "study.yaml").write_text(
        "study_name: far\n"
        "trainer: {data: {kind: imagefolder, path: here/images, image_size: 16}}\n"
        "target: {metric: top1, value: 0.9}\n"
        "budget: {n_trials: 1}\n"
        f"run_dir: {tmp_path / 'runs'}\n"
        f"tracking_uri: {tmp_path / 'mlruns'}\n")
    cfg, space, _ = prepare(config.load(str(tmp_path / "study.yaml")))
    study = optuna.create_study(study_name="far", storage=f"sqlite:///{tmp_path / 's.db'}")
    study.set_user_attr(record.STUDY_SPACE, space.to_dict())
    study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())
    study.add_trial(optuna.trial.create_trial(      # an autotune trial's record, not a notebook's
        state=optuna.trial.TrialState.FAIL, user_attrs={record.OUTCOME: "failed"}))
    # on the worker's machine the tree is mounted elsewhere
    shutil.move(tmp_path / "here" / "images", tmp_path / "mnt-images")
    return tmp_path


def _worker(folder: Path, *args: str):
    return run_cli("worker", "--storage", f"sqlite:///{folder / 's.db'}", "--study", "far",
                   *args, cwd=folder, timeout=300)


def test_a_worker_finds_the_tree_where_data_says(started):
    result = _worker(started, "--data", str(started / "mnt-images"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "joined study 'far'" in result.stdout
    # the trials it runs read the tree there: the config its runner gets names it
    from autotune.worker import _local_data

    cfg = config.StudyConfig.from_dict(optuna.load_study(
        study_name="far", storage=f"sqlite:///{started / 's.db'}").user_attrs[
        record.STUDY_CONFIG])
    local, size = _local_data(cfg, str(started / "mnt-images"))
    assert local.trainer.data["path"] == str(started / "mnt-images") and size == 18


@pytest.mark.parametrize(("args", "says"), [
    ((), "its data on this machine: ImageFolder {here} does not exist; give the root of a "
         "tree of class folders"),
    (("--data", "nowhere"), "its data on this machine: ImageFolder {nowhere} does not exist"),
    (("--data", "other"), "{other} holds 2 classes, but study 'far' was started on a tree of "
                          "3 ({here}); give a copy of that tree"),
])
def test_a_worker_without_the_studys_tree_refuses_in_one_line(started, args, says):
    _tree(started / "other", classes=2)
    result = _worker(started, *args)
    assert result.returncode == 2, result.stdout[-2000:]
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("autotune: error: "), error
    assert says.format(here=started / "here" / "images", nowhere=started / "nowhere",
                       other=started / "other") in error[0]
    if not args:
        assert error[0].endswith("if the tree lies elsewhere on this machine, give its path "
                                 "with --data PATH")
    assert "joined" not in result.stdout and not (started / "runs").exists()


def test_a_study_files_home_folder_paths_are_the_users_home(tmp_path, monkeypatch):
    """`path: ~/images` and `search_space: ~/space.py` in a study file are the files in the
    home folder, as a shell reads them (not a folder named `~` beside the study file)."""
    home = tmp_path / "home"
    _tree(home / "images", classes=3)
    (home / "space.py").write_text(
        "from autotune import Float, Int, PowerOfTwo, SearchSpace\n"
        "space = SearchSpace(PowerOfTwo('global_batch', 16, 32), Float('lr_per_256', 0.05, "
        "0.5, log=True), Int('epochs', 1, 2))\n")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "study.yaml").write_text(
        "trainer: {data: {kind: imagefolder, path: ~/images, image_size: 16}}\n"
        "search_space: ~/space.py\n"
        "target: {metric: top1, value: 0.9}\n"
        f"run_dir: {tmp_path / 'runs'}\n"
        f"tracking_uri: {tmp_path / 'mlruns'}\n")
    cfg, space, size = prepare(config.load(str(tmp_path / "study.yaml")))
    assert cfg.trainer.data["path"] == str(home / "images")
    assert [p.name for p in space.params] == ["global_batch", "lr_per_256", "epochs"]
    assert size > 0 and not (tmp_path / "~").exists()


def test_a_tree_at_the_project_folder_is_refused_while_the_studys_folders_would_be_in_it(
        workdir, capsys):
    # `path: .` with val_split: the run folder and the MLflow store became class folders
    # without images (the first trial crashed, the resume was refused) and the study's
    # plots would have been read as images
    for name in ("cats", "dogs"):
        (workdir / name).mkdir()
        for i in range(3):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(workdir / name / f"{i}.png")
    (workdir / "study.yaml").write_text(
        "trainer:\n  model: resnet18\n  data: {kind: imagefolder, path: ., image_size: 32, "
        "val_split: 0.3}\ntarget: {metric: top1, value: 0.9}\n")
    assert main(["start", "study", "study.yaml"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"autotune: error: run_dir {workdir / 'autotune-runs'} lies inside the ImageFolder "
        f"tree's class folders ({workdir}), where the study's own folders would be read as "
        f"classes and its plots as images: give run_dir outside {workdir}, or move the class "
        "folders into a folder of their own and give that as trainer.data.path")
    assert main(["start", "study", "study.yaml", "--run-dir", str(workdir.parent / "runs")]) \
        == 2
    assert f"tracking_uri {workdir / 'mlruns'} lies inside" in capsys.readouterr().err
    assert sorted(p.name for p in workdir.iterdir()) == ["cats", "dogs", "study.yaml"]
