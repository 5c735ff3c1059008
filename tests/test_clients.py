"""Every client names the same best trial: plain Optuna, `optuna best-trial`, optuna-dashboard.

A study is written the way autotune's workers write it (`decisions.tell_result`): a trial that
reached the target at 12 s, one censored after 3 s and one diverged after 2.75 s. A client that
ignores constraints (optuna-dashboard takes the smallest value) must not take either of the
short ones for the best.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.decisions import TrialResult, elapsed_of, tell_result

optuna.logging.set_verbosity(optuna.logging.WARNING)
TARGET = 0.97


def _study(tmp_path, outcomes):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="clients", storage=storage, direction="minimize")
    for outcome, reason, value, best in outcomes:
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1.0, log=True)})
        tell_result(study, trial, TrialResult(trial.number, {}, outcome, reason, value=value,
                                              best_metric=best, evals=3), TARGET)
    return study, storage


MIXED = [("censored", "bound", 3.0, 0.6), ("reached", "reached", 12.0, 0.975),
         ("failed", "diverged", 2.75, 0.1)]


def _dashboard_best(storage: str, study_id: int) -> list[int]:
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    app = optuna_dashboard.wsgi(storage)
    status: list[str] = []
    body = app({"REQUEST_METHOD": "GET", "PATH_INFO": f"/api/studies/{study_id}",
                "QUERY_STRING": "", "SERVER_NAME": "test", "SERVER_PORT": "80",
                "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr,
                "wsgi.url_scheme": "http"},
               lambda s, headers, exc_info=None: status.append(s))
    assert status[0].startswith("200"), status
    detail = json.loads(b"".join(body))
    return [t["number"] for t in detail["best_trials"]]


def test_every_client_names_the_trial_that_reached(tmp_path):
    study, storage = _study(tmp_path, MIXED)
    assert study.best_trial.number == 1                              # plain Optuna
    optuna_cli = Path(sys.executable).with_name("optuna")     # Optuna's own command
    shown = subprocess.run([str(optuna_cli), "best-trial", "--study-name",
                            "clients", "--storage", storage, "-f", "json"],
                           capture_output=True, text=True, check=True)
    assert json.loads(shown.stdout)["number"] == 1                   # `optuna best-trial`
    assert _dashboard_best(storage, study._study_id) == [1]          # optuna-dashboard
    # a censored or diverged trial's value can never beat a TTA; its elapsed time is kept
    censored, _, diverged = study.trials
    assert censored.value == math.inf and diverged.value == math.inf
    assert elapsed_of(censored) == 3.0 and elapsed_of(diverged) == 2.75
    assert censored.constraints["reach_target"] > 0


def test_with_no_trial_reached_no_client_names_a_censored_trial_a_tta(tmp_path):
    study, storage = _study(tmp_path, [MIXED[0], MIXED[2]])
    with pytest.raises(ValueError, match="No feasible trials"):
        _ = study.best_trial
    best = _dashboard_best(storage, study._study_id)
    assert all(study.trials[n].value == math.inf for n in best)   # shown as inf, not 2.75 s


def _tracker(cfg, tmp_path):
    from autotune.tracking import Tracker

    tracker = Tracker(cfg.tracking_uri, cfg.study_name, tmp_path / "runs")
    tracker.start_study({}, {}, {}, resumed=False)
    return tracker


def test_a_trial_that_never_came_to_an_evaluation_holds_no_best_value(tmp_path):
    """A trial stopped before its first evaluation (budget.max_trial_s shorter than one) used
    to record the 0 its best started from, and the study's summary named it the closest with
    top1 0.000."""
    from autotune._console import summarize
    from autotune.config import StudyConfig

    study = optuna.create_study(study_name="clients", direction="minimize",
                                storage=f"sqlite:///{tmp_path / 'study.db'}")
    for evals, best in ((0, 0.0), (0, 0.0)):
        trial = study.ask()
        trial.set_user_attr("params", {"lr": 0.1})
        tell_result(study, trial, TrialResult(trial.number, {}, "censored", "max_seconds",
                                              value=0.2, best_metric=best, evals=evals),
                    TARGET)
    assert [t.user_attrs["best_metric"] for t in study.trials] == [None, None]
    cfg = StudyConfig(study_name="clients", tracking_uri=str(tmp_path / "mlruns"))
    lines: list[str] = []
    summarize(cfg, study, _tracker(cfg, tmp_path), lines.append)
    assert "no trial reached top1 >= 0.97 yet; no trial came to an evaluation" in lines

    trial = study.ask()
    trial.set_user_attr("params", {"lr": 0.2})
    tell_result(study, trial, TrialResult(trial.number, {}, "censored", "bound", value=3.0,
                                          best_metric=0.6, evals=2), TARGET)
    assert study.trials[-1].user_attrs["best_metric"] == 0.6
    lines.clear()
    summarize(cfg, study, _tracker(cfg, tmp_path), lines.append)
    assert "no trial reached top1 >= 0.97 yet; closest: trial 2 with top1 0.600" in lines
