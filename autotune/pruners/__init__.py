"""Pruning on time-to-accuracy: stop a trial once it cannot win."""

from ._curves import Curve, interpolate
from ._rules import (
    Rules,
    collapsed,
    could_reach,
    decide,
    next_evaluation,
    optimistic_tta,
    rungs_crossed,
)
from ._tta import CURVE_KEY, ELAPSED_KEY, OUTCOME_KEY, TimeToAccuracyPruner, best_tta

__all__ = ["CURVE_KEY", "ELAPSED_KEY", "OUTCOME_KEY", "Curve", "Rules", "TimeToAccuracyPruner",
           "best_tta", "collapsed", "could_reach", "decide", "interpolate", "next_evaluation",
           "optimistic_tta", "rungs_crossed"]
