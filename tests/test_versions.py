"""Machines running different autotune releases on one study: the study records the release
that wrote its settings; a worker of another release says so, and one that cannot read them
names the release to install instead of "unknown key" in settings the user never wrote."""

from __future__ import annotations

import tomllib
from pathlib import Path

import optuna
import pytest

from autotune import __version__, config, record
from autotune._study_setup import prepare

from .conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_release_autotune_says_is_the_one_it_installs_as():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__


@pytest.fixture
def started(tmp_path: Path) -> Path:
    """A quickstart study as `start study` writes it, with its one trial done."""
    cfg, space, _ = prepare(config.load("quickstart", {
        "budget.n_trials": 1, "run_dir": str(tmp_path / "runs"),
        "tracking_uri": str(tmp_path / "mlruns")}))
    study = optuna.create_study(study_name="quickstart",
                                storage=f"sqlite:///{tmp_path / 'autotune.db'}")
    study.set_user_attr(record.STUDY_SPACE, space.to_dict())
    study.set_user_attr(record.STUDY_VERSION, __version__)
    study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())
    study.add_trial(optuna.trial.create_trial(      # an autotune trial's record, not a notebook's
        state=optuna.trial.TrialState.FAIL, user_attrs={record.OUTCOME: "failed"}))
    return tmp_path


def _rewrite(folder: Path, version: str, **extra: object) -> None:
    study = optuna.load_study(study_name="quickstart",
                              storage=f"sqlite:///{folder / 'autotune.db'}")
    study.set_user_attr(record.STUDY_VERSION, version)
    study.set_user_attr(record.STUDY_CONFIG, {**study.user_attrs[record.STUDY_CONFIG], **extra})


def _worker(folder: Path):
    return run_cli("worker", "--storage", "sqlite:///autotune.db", cwd=folder, timeout=300)


def test_a_worker_that_cannot_read_a_newer_releases_settings_names_the_release(started):
    _rewrite(started, "9.1.0", early_stop={"patience": 3})
    result = _worker(started)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"autotune: error: study 'quickstart' was started with autotune 9.1.0, whose settings "
        f"this worker's autotune {__version__} cannot read (stored config: unknown key(s) "
        "early_stop; allowed in the study file: study_name, search_space, trainer, target, "
        "budget, workers, ranks_per_trial, device, storage, tracking_uri, run_dir, seed, "
        "warm_start, pruner_margin, pruner, oversubscribe, heartbeat_s); install autotune "
        "9.1.0 on this machine and start the worker again")


def _attrs(folder: Path) -> dict:
    return optuna.load_study(study_name="quickstart",
                             storage=f"sqlite:///{folder / 'autotune.db'}").user_attrs


def test_a_worker_of_another_release_that_can_read_the_settings_says_so(started):
    from autotune.worker import _settings

    said: list[str] = []
    cfg, space = _settings("quickstart", _attrs(started), said.append)
    assert cfg.study_name == "quickstart" and space.items and said == []  # same release
    _rewrite(started, "0.0.9")
    cfg, _ = _settings("quickstart", _attrs(started), said.append)
    assert cfg.study_name == "quickstart"
    assert said == [f"study 'quickstart' was started with autotune 0.0.9 and this worker runs "
                    f"{__version__}: use one release on every machine, or its trials are "
                    "judged by different rules"]


def test_resuming_with_another_release_says_so_and_records_this_one(started):
    _rewrite(started, "0.0.9")
    result = run_cli("start", "study", "quickstart", "--n-trials", "1", "--run-dir",
                     str(started / "runs"), "--tracking-uri", str(started / "mlruns"),
                     cwd=started, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (f"study 'quickstart' was last started with autotune 0.0.9; resuming it with "
            f"autotune {__version__} (workers that join need {__version__} too)") in result.stdout
    study = optuna.load_study(study_name="quickstart",
                              storage=f"sqlite:///{started / 'autotune.db'}")
    assert study.user_attrs[record.STUDY_VERSION] == __version__


def test_resuming_a_newer_releases_study_names_that_release(started):
    from autotune._study_setup import check_resumed_config
    from autotune.errors import ConfigError

    _rewrite(started, "9.1.0", early_stop={"patience": 3})
    study = optuna.load_study(study_name="quickstart",
                              storage=f"sqlite:///{started / 'autotune.db'}")
    cfg = config.StudyConfig.from_dict({k: v for k, v in _attrs(started)["config"].items()
                                        if k != "early_stop"})
    with pytest.raises(ConfigError) as raised:
        check_resumed_config(cfg, study, False, print)
    assert str(raised.value) == (
        "study 'quickstart' exists and was started by autotune 9.1.0 (this is "
        f"{__version__}: a setting it has that this release lacks is a change; install 9.1.0 "
        "to resume it as it was) with another config (early_stop: {'patience': 3} -> None); "
        "pass --accept-changes to resume it with these, or set another study_name")
