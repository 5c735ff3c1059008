"""Study plots: what is drawn when there is too little to show."""

from __future__ import annotations

import warnings

import optuna
import pytest

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


def test_the_batch_picture_and_the_learning_curve_show_the_noise_scale(tmp_path):
    from autotune.plots import _tta_vs_batch, learning_curve

    trials = [optuna.trial.create_trial(
        params={"x": 0.5}, distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
        value=10.0 + b, user_attrs={"outcome": "reached", "elapsed_s": 10.0 + b,
                                    "params": {"global_batch": b}, "noise_scale": 40.0 * k})
        for k, b in enumerate((32, 64, 128), 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _tta_vs_batch(trials, tmp_path / "batch.png").stat().st_size > 0
        rows = [[1.0, 0.2, 0.5, 0.25, 2.0, 900.0], [2.0, 0.6, 0.9, 0.5, 1.0, 1200.0],
                [3.0, 0.8, 0.95, 0.75, 0.5]]     # an older row, without the noise scale
        path = learning_curve(rows, "top1", 0.9, "trial 0", tmp_path / "curve.png")
        assert path.stat().st_size > 0


def test_a_loss_is_drawn_on_a_log_axis_and_an_accuracy_on_0_to_1():
    import matplotlib.pyplot as plt

    from autotune.plots import _limits

    fig, ax = plt.subplots()
    _limits(ax, [0.2, 0.9, None, float("nan")], 0.97)
    assert ax.get_yscale() == "linear" and ax.get_ylim() == pytest.approx((0, 1.02))
    # a blown-up trial at 1.6e9 beside others falling from 15 to a target of 0.15 (mode min)
    _limits(ax, [1.6e9, 15.0, 0.09, 0.0], 0.15)
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log" and low < 0.09 and high > 1.6e9
    plt.close(fig)
