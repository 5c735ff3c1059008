"""The time-to-accuracy bound: a trial stops once it can no longer beat the best TTA."""

from __future__ import annotations

import optuna
import pytest

from autotune.pruners import TimeToAccuracyPruner, best_tta, bound_exceeded

optuna.logging.set_verbosity(optuna.logging.WARNING)


def finished(study: optuna.Study, value: float, outcome: str) -> None:
    trial = study.ask()
    trial.set_user_attr("outcome", outcome)
    study.tell(trial, value)


def test_bound_is_the_best_tta_times_the_margin():
    assert not bound_exceeded(10.0, None, 1.0)        # nothing reached yet: no bound
    assert not bound_exceeded(9.9, 10.0, 1.0)
    assert bound_exceeded(10.1, 10.0, 1.0)
    assert not bound_exceeded(10.1, 10.0, 1.2)
    assert bound_exceeded(12.1, 10.0, 1.2)


def test_only_trials_that_reached_the_target_set_the_bound():
    study = optuna.create_study()
    finished(study, 4.0, "censored")                  # stopped early: TTA > 4 s, not 4 s
    finished(study, 12.0, "reached")
    finished(study, 9.0, "reached")
    assert best_tta(study.trials) == 9.0


def test_pruner_reads_elapsed_time_and_best_tta_from_the_study_store():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, pruner=TimeToAccuracyPruner(margin=1.1))
    finished(study, 10.0, "reached")
    trial = study.ask()
    trial.report(0.5, step=0)
    trial.set_user_attr("elapsed_s", 10.5)
    assert not trial.should_prune()                   # within the 10% margin
    # Another process (a second Study object on the same store) makes the same decision.
    other = optuna.load_study(study_name=study.study_name, storage=storage,
                              pruner=TimeToAccuracyPruner(margin=1.1))
    trial.set_user_attr("elapsed_s", 11.5)
    assert trial.should_prune()
    assert other.pruner.prune(other, other.trials[-1])
    assert other.pruner.deadline(other) == pytest.approx(11.0)


def test_margin_below_one_is_refused():
    with pytest.raises(ValueError, match="margin must be >= 1.0"):
        TimeToAccuracyPruner(0.5)
