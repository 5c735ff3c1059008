"""autotune's sampler: space-filling proposals, with TPE for a share of them after a start.

With time-to-accuracy pruning a losing trial costs little (it stops at the best TTA so far,
often at its first evaluations), so covering the space is cheap, while TPE settles on the
first good region it finds and proposes its neighbours again and again. So the first
``n_startup_trials`` trials, and after them all but every ``tpe_every``-th, are spread points:
of ``candidates`` uniform draws, the one farthest from every configuration the study has tried
or is trying (greedy maximin, in the unit cube of the search space: ``_spread``). TPE (with
Optuna 5's constraints, so censored and failed trials count) proposes the rest, which keeps
some refinement near the best configurations for long studies.

How it was chosen (``benchmarks/search_efficiency.py``, 200 replayed studies on each of the two
tables recorded then, now ``quickstart_curves_205img_s.jsonl`` and
``quickstart_curves_per_epoch.jsonl``; BENCHMARKS.md): against the earlier scrambled Sobol
start (32 points, then TPE alternating with Sobol), spread points cut the median compute to the
goal by 13% and 18% and the mean by a quarter to a third: in the replay a Sobol point often
lands on a configuration the study already ran (8 of the first 32 trials), where a spread point
lands farthest from them. More TPE did worse on both tables (TPE one trial in two: mean +14%
and +23%), and TPE's own start-up tuning, multivariate TPE and local search around the best did
not help. On the default table, recorded after these choices were made, the shipped sampler and
pruner need 1.95 x less compute than random search (2.78 x on the table they were chosen on).

Workers need no coordination beyond the study store: running trials count as tried, so two
workers asking one after the other spread apart (each worker draws its own candidates).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.trial import FrozenTrial, TrialState

from ._spread import farthest

__all__ = ["ExploringTPESampler", "SpreadSampler"]

_TRIED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


class SpreadSampler(optuna.samplers.BaseSampler):
    """Each point the farthest of ``candidates`` uniform draws from the configurations the study
    has tried (complete, pruned) or is trying (running, in any worker). Parameters that not every
    trial has (conditional ones), and those of the first trial, are drawn at random."""

    def __init__(self, seed: int | None = None, candidates: int = 8) -> None:
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        self.candidates = candidates
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._space = IntersectionSearchSpace(include_pruned=True)

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {name: dist for name, dist in self._space.calculate(study).items()
                if not dist.single()}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        tried = [t.params for t in study.get_trials(deepcopy=False, states=_TRIED)
                 if t.number != trial.number]
        return farthest(search_space, tried, self._rng, self.candidates)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self._rng = random.Random()
        self._random.reseed_rng()


class ExploringTPESampler(optuna.samplers.BaseSampler):
    """Spread points (``SpreadSampler``) for the first ``n_startup_trials`` trials and then for
    all but every ``tpe_every``-th trial (0: never TPE); TPE for those."""

    def __init__(self, seed: int | None = None, n_startup_trials: int = 32,
                 tpe_every: int = 4, candidates: int = 8) -> None:
        """``seed``: every draw's (a worker without one draws its own)."""
        if tpe_every < 0:
            raise ValueError(f"tpe_every must be >= 0, got {tpe_every}")
        if n_startup_trials < 0:
            raise ValueError(f"n_startup_trials must be >= 0, got {n_startup_trials}")
        self._tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8)
        self._spread = SpreadSampler(seed=None if seed is None else seed + 7919,
                                     candidates=candidates)
        self.n_startup_trials = n_startup_trials
        self.tpe_every = tpe_every

    def _for(self, study: optuna.Study, trial: FrozenTrial) -> optuna.samplers.BaseSampler:
        k, n = self.tpe_every, trial.number
        if n >= self.n_startup_trials and k and n % k == k - 1:
            return self._tpe
        return self._spread

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._for(study, trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._for(study, trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._for(study, trial).sample_independent(study, trial, param_name,
                                                          param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._for(study, trial).before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._for(study, trial).after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()
        self._spread.reseed_rng()
