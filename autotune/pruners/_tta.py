"""The Optuna pruner: the pure rules, fed from the study store so any worker decides alike."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import record
from ._curves import Curve
from ._rules import Rules, collapsed, decide

__all__ = ["TimeToAccuracyPruner", "best_tta", "CURVE_KEY", "ELAPSED_KEY", "OUTCOME_KEY"]

# The trial record's keys (autotune.record owns them), under the names this package exports.
OUTCOME_KEY, ELAPSED_KEY, CURVE_KEY = record.OUTCOME, record.ELAPSED, record.CURVE
_METRIC_INDEX = {"top1": 1, "top5": 2}


def best_tta(trials: Iterable[FrozenTrial]) -> float | None:
    """The smallest TTA among trials that reached the target, or None."""
    best = record.best_reached(trials)
    return None if best is None else best.value


class TimeToAccuracyPruner(optuna.pruners.BasePruner):
    """Stops trials that cannot beat the best time-to-accuracy (see ``_rules``).

    Everything it reads lives in the study store (each trial's curve and outcome), so every
    worker, and a restarted one, reaches the same decision.
    """

    def __init__(self, target: float = 1.0, *, metric: str = "top1",
                 num_classes: int | None = 10,
                 margin: float = 1.0, eta: float = 3.0, min_rung_s: float = 2.0,
                 min_peers: int = 3, rules: bool = True, falls: bool = False) -> None:
        if margin < 1.0:
            raise ValueError(f"margin must be >= 1.0, got {margin}")
        if metric not in _METRIC_INDEX:
            raise ValueError(f"metric must be top1 or top5, got {metric!r}")
        # Unknown classes (None): no chance level, so the at-chance rules never fire. A metric
        # that falls (a loss, ``falls``) has none either; the rules see it negated, so that
        # higher is better for every metric (``Rules.falls``).
        chance = 0.0 if num_classes is None else min(
            1.0, (1 if metric == "top1" else 5) / max(num_classes, 1))
        if falls:
            if not 0 < target < math.inf:
                raise ValueError(f"a target that falls must be above 0, got {target}")
            target, chance = -target, -math.inf
        self.rules = Rules(target=target, chance=chance, margin=margin, eta=eta,
                           min_rung_s=min_rung_s, min_peers=min_peers, falls=falls)
        self.metric = metric
        self.margin = margin
        self.full = rules  # False: the time bound only

    def deadline(self, study: optuna.Study) -> float | None:
        best = best_tta(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        return None if best is None else best * self.margin

    def _curve(self, trial: FrozenTrial) -> Curve:
        outcome = trial.user_attrs.get(OUTCOME_KEY)
        reached = trial.value if outcome == "reached" else None
        return Curve.of(trial.user_attrs.get(CURVE_KEY, []), _METRIC_INDEX[self.metric], reached,
                        running=trial.state == TrialState.RUNNING, failed=outcome == "failed",
                        sign=-1.0 if self.rules.falls else 1.0)

    def collapsed(self, rows: list[list[Any]]) -> bool:
        """Whether a curve of stored rows (``record.CURVE``'s) rose above chance and fell back
        to it for good (``_rules.collapsed``): what a ``diverged`` stop then says."""
        curve = Curve.of(rows, _METRIC_INDEX[self.metric],
                         sign=-1.0 if self.rules.falls else 1.0)
        return self.full and collapsed(curve, self.rules)

    def decide(self, study: optuna.Study, trial: FrozenTrial) -> str | None:
        """The reason to stop ``trial`` now (bound, projection, rung, diverged), or None."""
        trials = study.get_trials(deepcopy=False)
        best = best_tta(trials)
        curve = self._curve(trial)
        if not self.full:
            deadline = None if best is None else best * self.margin
            elapsed = float(trial.user_attrs.get(ELAPSED_KEY, curve.elapsed))
            return "bound" if deadline is not None and elapsed > deadline else None
        others = [self._curve(t) for t in trials if t.number != trial.number
                  and t.state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED)]
        return decide(curve, others, best, self.rules, record.last_loss(trial.user_attrs))

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.decide(study, trial) is not None
