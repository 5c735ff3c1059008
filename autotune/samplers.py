"""autotune's sampler: a space-filling start, then TPE that keeps exploring.

With time-to-accuracy pruning a losing trial costs little (it stops at the best TTA so far,
often at its first evaluations), so covering the space is cheap, while TPE settles on the
first good region it finds and proposes its neighbours again and again. So the first
``n_startup_trials`` trials, and after them every ``explore_every``-th, are points of one
scrambled Sobol sequence (even coverage, no two alike), and the rest are TPE's (with Optuna 5's
constraints, so censored and failed trials count). On the recorded quickstart curves
(``benchmarks/search_efficiency.py``, 40 replayed studies on each of two recorded tables) this
halved the median compute to the goal on the table in use (939 s to 475 s) against TPE
alternating with random draws from the first trial, and cut it by 7% on the older one (434 s to
402 s); a start of 16 instead of 32 Sobol points did worse on the newer table (BENCHMARKS.md).

Which sampler draws a trial depends only on its number, and every worker of a study walks the
same Sobol sequence (seeded from the study's configured seed, or its name) through a counter
in the study store, so workers agree and do not repeat each other's points (Optuna's counter
is not atomic: two asks at the same instant may get the same point, which costs a trial, not
a result).
"""

from __future__ import annotations

import logging
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

__all__ = ["ExploringTPESampler"]


class ExploringTPESampler(optuna.samplers.BaseSampler):
    """Sobol points for the first ``n_startup_trials`` trials and every ``explore_every``-th
    trial after them (0: never); TPE for the others."""

    def __init__(self, seed: int | None = None, n_startup_trials: int = 32,
                 explore_every: int = 2, sequence_seed: int | None = None) -> None:
        """``seed``: TPE's and the fallback draws' (a worker without one draws its own).
        ``sequence_seed``: the Sobol sequence's, the same in every worker of a study (default:
        ``seed``, or else one derived from the study's name)."""
        if explore_every < 0:
            raise ValueError(f"explore_every must be >= 0, got {explore_every}")
        if n_startup_trials < 0:
            raise ValueError(f"n_startup_trials must be >= 0, got {n_startup_trials}")
        self._seed = seed
        self._sequence_seed = seed if sequence_seed is None else sequence_seed
        self._tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8)
        self._sobol: dict[str, optuna.samplers.QMCSampler] = {}
        self.n_startup_trials = n_startup_trials
        self.explore_every = explore_every

    def _qmc(self, study: optuna.Study) -> optuna.samplers.QMCSampler:
        """The study's Sobol sampler: one seed for every worker of the study."""
        name = study.study_name
        if name not in self._sobol:
            seed = (self._sequence_seed if self._sequence_seed is not None
                    else zlib.crc32(name.encode()))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self._sobol[name] = optuna.samplers.QMCSampler(
                    qmc_type="sobol", scramble=True, seed=seed + 7919,
                    independent_sampler=optuna.samplers.RandomSampler(
                        seed=None if self._seed is None else self._seed + 7919),
                    warn_independent_sampling=False)
        return self._sobol[name]

    def _for(self, study: optuna.Study, trial: FrozenTrial) -> optuna.samplers.BaseSampler:
        k, n = self.explore_every, trial.number
        if n < self.n_startup_trials or (k and n % k == k - 1):
            return self._qmc(study)
        return self._tpe

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        sampler = self._for(study, trial)
        if sampler is self._tpe:
            return sampler.infer_relative_search_space(study, trial)
        qmc_log = logging.getLogger("optuna.samplers._qmc")
        level = qmc_log.level
        qmc_log.setLevel(logging.ERROR)  # its note on conditional parameters: they are drawn
        try:                             # at random, which is what autotune wants for them
            return sampler.infer_relative_search_space(study, trial)
        finally:
            qmc_log.setLevel(level)

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
        for sampler in self._sobol.values():
            sampler.reseed_rng()
