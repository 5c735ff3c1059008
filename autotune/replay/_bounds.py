"""What a table asks of any tuner: how often a uniform proposal trains a goal configuration,
and the least compute a study with uniform proposals could spend to find one.

The bound takes the best pruner there could be, an oracle that knows each configuration's
curve: every trial that is not a goal is stopped at its first evaluation (no pruner judges a
trial before its first report), and the goal trial trains to its target. A study draws
proposals until one trains a goal configuration; its compute is the first evaluations of the
misses (and each trial's recorded overhead) plus the goal's TTA. A tuner whose median lies
far above the bound loses compute in its pruner; one near it can only gain by proposing goal
configurations more often than uniform draws do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import optuna

from ..space import InfeasiblePoint
from ._tables import Run, Table

__all__ = ["UniformBound", "uniform_bound"]

_EXACT = 2000          # misses summed one by one up to this many, by their mean and spread past it


@dataclass(frozen=True)
class UniformBound:
    draws: int              # uniform proposals drawn from the table's space
    hit_share: float        # the share of them that trained a goal configuration
    median_s: float         # compute to the goal with the oracle pruner: median over studies
    p25_s: float
    p75_s: float
    miss_share: float       # studies whose first ``max_trials`` proposals hold no goal


def _first_cost(run: Run) -> float:
    """What a trial costs when stopped at its first evaluation (one that ended before any
    evaluation, diverged, costs what it ran)."""
    first = run.times[0] if run.times else run.elapsed
    return min(first, run.elapsed) + run.overhead_s


def uniform_bound(table: Table, goal: float = 1.5, *, draws: int = 10_000,
                  studies: int = 4_000, max_trials: int = 150,
                  seed: int = 0) -> UniformBound | None:
    """The bound for goal configurations with a TTA within ``goal`` x the table's best;
    None when none of ``draws`` uniform proposals trains one."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    finally:
        optuna.logging.set_verbosity(verbosity)
    deadline = goal * table.best_tta * (1 + 1e-9)
    hits: list[float] = []
    misses: list[float] = []
    dropped = 0
    while len(hits) + len(misses) < draws and dropped < 1000:
        trial = study.ask()
        try:   # a point a constraint drops is no proposal, as in a study (and the replay)
            params = table.propose(trial)
        except InfeasiblePoint:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            dropped += 1
            continue
        dropped = 0
        study.tell(trial, 0.0)
        run = table.train(params)
        tta = run.reached_at(table.target, table.falls)
        if tta is not None and tta <= deadline:
            hits.append(tta + run.overhead_s)
        else:
            misses.append(_first_cost(run))
    if not hits:
        return None
    p = len(hits) / (len(hits) + len(misses))
    rng = np.random.default_rng(seed)
    miss_costs = np.asarray(misses or [0.0])
    mean, spread = float(miss_costs.mean()), float(miss_costs.std())
    counts = rng.geometric(p, size=studies) - 1          # proposals before the first goal
    totals = np.empty(studies)
    for i, n in enumerate(counts):
        if n <= _EXACT:
            spent = float(rng.choice(miss_costs, size=n).sum()) if n else 0.0
        else:
            spent = n * mean + math.sqrt(n) * spread * float(rng.standard_normal())
        totals[i] = spent + hits[int(rng.integers(len(hits)))]
    p25, median, p75 = np.quantile(totals, [0.25, 0.5, 0.75])
    return UniformBound(len(hits) + len(misses), p, float(median), float(p25), float(p75),
                        (1 - p) ** max_trials)
