"""Study plots: what is drawn when there is too little to show."""

from __future__ import annotations

import warnings

import optuna

from autotune.plots import _importance

optuna.logging.set_verbosity(optuna.logging.ERROR)


def _study(values):
    study = optuna.create_study()
    for v in values:
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        trial.suggest_float("y", 0.0, 1.0)
        study.tell(trial, v)
    return study


def test_no_importance_plot_and_no_warning_from_a_single_trial(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the user would see Optuna's warning in the output
        assert _importance(_study([1.0]), tmp_path / "importance.png") is None
    assert not (tmp_path / "importance.png").exists()


def test_importance_plot_once_trials_differ(tmp_path):
    path = _importance(_study([float(i % 5) for i in range(20)]), tmp_path / "importance.png")
    assert path is not None and path.is_file()
