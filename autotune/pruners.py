"""Pruning on time-to-accuracy: stop a trial once it cannot win.

The decision is a pure function of the trial's elapsed time and the study's best TTA; the
Optuna pruner reads both from the study store, so any worker reaches the same decision.
"""

from __future__ import annotations

from collections.abc import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = ["TimeToAccuracyPruner", "best_tta", "bound_deadline", "bound_exceeded"]

OUTCOME_KEY = "outcome"          # user attr: reached | censored | failed
ELAPSED_KEY = "elapsed_s"        # user attr: the trial's latest elapsed seconds


def best_tta(trials: Iterable[FrozenTrial]) -> float | None:
    """The smallest TTA among trials that reached the target, or None."""
    values = [t.value for t in trials if t.state == TrialState.COMPLETE
              and t.user_attrs.get(OUTCOME_KEY) == "reached" and t.value is not None]
    return min(values) if values else None


def bound_deadline(best: float | None, margin: float) -> float | None:
    """Elapsed seconds after which a trial cannot beat ``best`` (None: no bound yet)."""
    return None if best is None else best * margin


def bound_exceeded(elapsed_s: float, best: float | None, margin: float) -> bool:
    """True once ``elapsed_s`` passes the bound: the trial can no longer win."""
    deadline = bound_deadline(best, margin)
    return deadline is not None and elapsed_s > deadline


class TimeToAccuracyPruner(optuna.pruners.BasePruner):
    """Stops a trial whose elapsed time has passed ``margin`` x the best TTA so far."""

    def __init__(self, margin: float = 1.0) -> None:
        if margin < 1.0:
            raise ValueError(f"margin must be >= 1.0, got {margin}")
        self.margin = margin

    def deadline(self, study: optuna.Study) -> float | None:
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return bound_deadline(best_tta(trials), self.margin)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        elapsed = trial.user_attrs.get(ELAPSED_KEY)
        if elapsed is None:
            return False
        deadline = self.deadline(study)
        return deadline is not None and float(elapsed) > deadline
