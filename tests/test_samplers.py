"""autotune's sampler: Sobol start, TPE after it, one sequence shared by a study's workers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import optuna
import pytest

from autotune.samplers import ExploringTPESampler

optuna.logging.set_verbosity(optuna.logging.ERROR)


def _draw(trial: optuna.Trial) -> tuple[float, float]:
    return trial.suggest_float("x", 0.0, 1.0), trial.suggest_float("lr", 0.01, 2.0, log=True)


def _run(study: optuna.Study, n: int) -> list[tuple[float, float]]:
    points = []
    for _ in range(n):
        trial = study.ask()
        x, lr = _draw(trial)
        points.append((x, lr))
        study.tell(trial, (x - 0.3) ** 2 + math.log(lr) ** 2)
    return points


def test_which_sampler_draws_each_trial():
    sampler = ExploringTPESampler(seed=1, n_startup_trials=4, explore_every=3)
    study = optuna.create_study(sampler=sampler)
    kinds = []
    for number in range(10):
        trial = SimpleNamespace(number=number)  # the choice reads the number alone
        kinds.append("tpe" if sampler._for(study, trial) is sampler._tpe else "sobol")
    assert kinds == ["sobol"] * 4 + ["tpe", "sobol", "tpe", "tpe", "sobol", "tpe"]


def test_the_start_covers_each_parameter_evenly():
    # Trial 0 is drawn at random (the sequence needs the search space first); trials 1-16 are
    # the first 16 Sobol points: each parameter has exactly one point in each 16th of its range
    # (log range for a log parameter), which 16 random draws almost never do.
    study = optuna.create_study(sampler=ExploringTPESampler(seed=3))
    points = _run(study, 17)[1:]
    xs = sorted(int(x * 16) for x, _ in points)
    lrs = sorted(int(math.log(lr / 0.01) / math.log(200) * 16) for _, lr in points)
    assert xs == list(range(16))
    assert lrs == list(range(16))


@pytest.mark.parametrize("seed", [None, 5])
def test_workers_of_a_study_share_one_sequence(tmp_path, seed):
    """Two workers, each with its own sampler and no seed of their own (as ``autotune
    worker`` runs), asking in turn on one stored study, draw the same points the study's own
    process alone would (seeded with the study's seed), none twice."""
    alone = optuna.create_study(study_name="s", sampler=ExploringTPESampler(seed=seed),
                                storage=f"sqlite:///{tmp_path}/alone.db")
    expected = _run(alone, 12)
    url = f"sqlite:///{tmp_path}/shared.db"
    optuna.create_study(study_name="s", storage=url)
    workers = [optuna.load_study(study_name="s", storage=url,
                                 sampler=ExploringTPESampler(seed=None, sequence_seed=seed))
               for _ in range(2)]
    drawn = [_run(workers[i % 2], 1)[0] for i in range(12)]
    assert len(set(drawn[1:])) == 11
    assert drawn[1:] == pytest.approx(expected[1:])


def test_tpe_takes_over_after_the_start():
    study = optuna.create_study(sampler=ExploringTPESampler(seed=0, n_startup_trials=8))
    values = [(x - 0.3) ** 2 + math.log(lr) ** 2 for x, lr in _run(study, 40)]
    # TPE's trials (even numbers from 8 on) gather near the optimum (x = 0.3, lr = 1.0);
    # the Sobol trials keep spreading out.
    tpe = sorted(v for n, v in enumerate(values) if n >= 20 and n % 2 == 0)
    sobol = sorted(v for n, v in enumerate(values) if n >= 20 and n % 2 == 1)
    assert tpe[5] < 0.25 * sobol[5]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="explore_every"):
        ExploringTPESampler(explore_every=-1)
    with pytest.raises(ValueError, match="n_startup_trials"):
        ExploringTPESampler(n_startup_trials=-1)
