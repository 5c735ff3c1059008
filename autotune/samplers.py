"""autotune's sampler: cost-aware spread points, with TPE for a share of them after a start.

With time-to-accuracy pruning a losing trial costs little (it stops at the best TTA so far,
often at its first evaluations), so covering the space is cheap, while TPE settles on the first
good region it finds and proposes its neighbours again and again. So the first
``n_startup_trials`` trials, and after them all but every ``tpe_every``-th, are spread points:
of ``candidates`` uniform draws, the one with the largest distance to the nearest configuration
the study has tried or is trying (greedy maximin, in the unit cube of the search space:
``_spread``) divided by the square root (``cost_weight``) of what the tried configurations
nearest to it cost: their geometric mean planned duration, of the 3 nearest, one that failed
(diverged, out of memory) counted 4 x (``failed_cost``). Every trial's curve gives its planned
duration (elapsed seconds over the share of its schedule done), pruned or not, and a TTA can
never exceed it: of two equally unexplored regions, the study first tries the one whose
neighbours are quick. A trial that reached the target counts its TTA, what reaching took there
(a long schedule that reached early is a quick neighbour, not a long one). Given the study's
accuracy target, a trial that ended without reaching it counts the longer of its planned
duration and the time its curve would need to reach the target at its average pace
(``pace_need``), at most 4 x its planned duration: a short schedule that ran out far below the
target is no cheap neighbour, a narrow miss counts about its own length. TPE as Optuna 5 sets
it up (multivariate, constant liar, 8 start-up trials), with its constraints so censored and
failed trials count, proposes the rest, which keeps some refinement near the best
configurations for long studies. Once a trial has reached the target, one spread point in each
``tpe_every`` after the start is local: its candidates are drawn within ``LOCAL_HALF_WIDTH``
(0.4) of the fastest configuration so far in the unit cube, its categorical choices kept, so
the study also tries the least explored configurations near its best (TuRBO's initial trust
region, a box of side 0.8: Eriksson et al., NeurIPS 2019), which TPE, refining where it has
already been, rarely proposes.

How it was chosen (``benchmarks/search_efficiency.py``; BENCHMARKS.md has the figures): spread
points beat a scrambled Sobol start (in the replay a Sobol point often lands on a configuration
the study already ran), and more TPE, TPE's own start-up tuning and local search around the
best did worse; univariate TPE does as well as multivariate within the spread of 100 replayed
studies, and keeping TPE's proposals away from tried configurations helps ConvNeXt and costs
LCBench (BENCHMARKS.md). Cost-aware spread points need fewer trials than plain ones on
all three recorded tables (1000 replayed studies each), the more so the more candidates they
weigh (8, 16, 32, 64; plain spread points gain nothing from 16); without the failed-trial guard
they pull toward large batches, which diverge on the slower machine's table. TPE after the
start leaves the medians as they are (a median study finds the goal within its first 32
trials) and adds to the means in the replay, where refining a good configuration returns its
recorded curve again; in a real study it tunes near the best. Local spread points cut the
replayed ConvNeXt studies' compute and misses at top-1 0.70 and LCBench 167168's misses, the
other tables within their seed-to-seed spread; put in TPE's place instead, they cost LCBench
the refinement that finds its goals (BENCHMARKS.md).

Once three trials that trained to the end (reached the target, or trained their whole
schedule) have measured their gradient noise scale (the trainer's ``noise_scale``,
:mod:`trainers.noise`), spread points keep their global batch within ``BATCH_FACTOR`` (8) x the
largest of those (``batch_cap``): beyond it a batch buys almost no fewer steps for its
images. TPE's proposals are held to the same cap (a batch above it becomes the largest one
within it); a space without ``global_batch``, or a study whose trainers measure nothing (one
rank), is never capped.

Workers need no coordination beyond the study store: running trials count as tried, so two
workers asking one after the other spread apart (each worker draws its own candidates).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.search_space import intersection_search_space
from optuna.trial import FrozenTrial, TrialState

from . import record
from ._spread import farthest

__all__ = ["BATCH_FACTOR", "LOCAL_HALF_WIDTH", "ExploringTPESampler", "SpreadSampler",
           "accuracy_target", "batch_cap", "incumbent", "pace_need", "planned_seconds",
           "within_cap"]

_TRIED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)

# Global batches above this many times the largest measured gradient noise scale are not
# proposed: epochs to a target grow as E_min (1 + B / B_noise) (McCandlish et al. 2018), so
# such a batch needs over 9 x the fewest epochs, and the largest measurement so far errs low
# (the noise scale grows as training goes on).
BATCH_FACTOR = 8.0
NOISE_TRIALS = 3    # trials that measured a noise scale before the cap applies
# Local spread points: a box of side 0.8 of the unit cube around the fastest configuration,
# TuRBO's initial trust region (Eriksson et al., NeurIPS 2019: L_init = 0.8).
LOCAL_HALF_WIDTH = 0.4


def batch_cap(trials: Sequence[FrozenTrial]) -> float | None:
    """The largest global batch worth proposing: ``BATCH_FACTOR`` x the largest noise scale
    measured by the study's trials that trained to the end (reached the target, or trained
    their whole planned schedule), once ``NOISE_TRIALS`` have (None before: no cap). A trial
    stopped early measured the noise scale of early training, which grows as the loss falls
    (McCandlish et al. 2018), so it would cap the batches that pay near the target."""
    measured = []
    for t in trials:
        if not (t.user_attrs.get(record.OUTCOME) == "reached"
                or t.user_attrs.get(record.STOP_REASON) == "planned_epochs"):
            continue
        value = t.user_attrs.get(record.NOISE_SCALE)
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            measured.append(float(value))
    return BATCH_FACTOR * max(measured) if len(measured) >= NOISE_TRIALS else None


def capped(space: dict[str, BaseDistribution], cap: float | None
           ) -> dict[str, BaseDistribution]:
    """``space`` with ``global_batch`` kept to values up to ``cap`` (its smallest at least)."""
    dist = space.get("global_batch")
    if cap is None or dist is None:
        return space
    if isinstance(dist, CategoricalDistribution):
        numbers = [c for c in dist.choices if isinstance(c, int | float)]
        kept = [c for c in numbers if c <= cap] or ([min(numbers)] if numbers else [])
        if kept and len(kept) < len(dist.choices):
            return {**space, "global_batch": CategoricalDistribution(kept)}
    elif isinstance(dist, IntDistribution | FloatDistribution) and dist.high > cap:
        high = max(dist.low, cap)
        if isinstance(dist, IntDistribution):
            step = dist.step or 1
            high = dist.low + int((high - dist.low) // step) * step
            return {**space, "global_batch": IntDistribution(int(dist.low), int(high),
                                                               log=dist.log, step=dist.step)}
        return {**space, "global_batch": FloatDistribution(dist.low, high, log=dist.log)}
    return space


def within_cap(name: str, value: Any, dist: BaseDistribution, cap: float | None) -> Any:
    """``value`` proposed for ``name``, moved to the largest ``global_batch`` within ``cap``
    when it lies above it (any other parameter, or a value within the cap, as it is)."""
    if name != "global_batch" or cap is None or not isinstance(value, int | float) \
            or value <= cap:
        return value
    kept = capped({name: dist}, cap)[name]
    if isinstance(kept, CategoricalDistribution):
        numbers = [c for c in kept.choices if isinstance(c, int | float)]
        return max(numbers) if numbers else value
    if isinstance(kept, IntDistribution | FloatDistribution):
        return min(value, kept.high)
    return value


def planned_seconds(trial: FrozenTrial) -> float | None:
    """How long ``trial``'s whole schedule takes, from its last evaluation: elapsed seconds over
    the share of the planned schedule done (None before a first evaluation). Known for pruned
    and reached trials too, not only for those that trained to their end. Whatever the
    target's metric: a schedule's length does not depend on which accuracy an evaluation
    reported (a study on top-5 may hold rows without top-1)."""
    try:
        rows = [r for r in record.curve_rows(trial.user_attrs)
                if r.top1 is not None or r.top5 is not None]
    except (TypeError, ValueError, IndexError):
        return None
    if not rows or rows[-1].progress <= 0:
        return None
    end = rows[-1].elapsed_s / min(rows[-1].progress, 1.0)
    return end if 0 < end < math.inf else None


def _check_target(target: float | None, metric: str) -> None:
    if target is not None and not 0.0 < target < 1.0:
        raise ValueError(f"target must be an accuracy between 0 and 1 (exclusive), got {target}"
                         "; give None for a metric on another scale or one that falls")
    if metric not in ("top1", "top5"):
        raise ValueError(f"metric must be top1 or top5 (the curve's slot), got {metric!r}")


def accuracy_target(value: float, falls: bool) -> float | None:
    """The target the spread points weigh misses against (``pace_need``): ``value`` where it is
    an accuracy between 0 and 1 reached from below, else None (a metric that falls, or one on
    another scale, is weighed by planned durations alone)."""
    return value if not falls and 0.0 < value < 1.0 else None


def pace_need(trial: FrozenTrial, target: float, metric: str = "top1") -> float | None:
    """The elapsed seconds ``trial``'s curve would need to reach ``target`` (an accuracy, in
    the ``metric`` slot) at its average pace so far: log error falling linearly in time from
    1 at the start (the pruner's projection model, without its optimism) to its best so far,
    ``elapsed x log(1 - target) / log(1 - best)``; infinite for one still at an error of 1,
    None where it reached the target or has no evaluation. A run that ended at 0.60 after
    10 h needs 13 h for 0.70; one at 0.30, 34 h."""
    try:
        rows = [(r.elapsed_s, r.top5 if metric == "top5" else r.top1)
                for r in record.curve_rows(trial.user_attrs)]
    except (TypeError, ValueError, IndexError):
        return None
    values = [(t, float(v)) for t, v in rows if v is not None]
    if not values:
        return None
    best = max(v for _, v in values)
    error, goal = 1.0 - min(best, 1.0), 1.0 - target
    if error <= goal:
        return None
    if error >= 1.0:
        return math.inf
    return values[-1][0] * math.log(goal) / math.log(error)


def _tta(trial: FrozenTrial) -> float | None:
    """A reached trial's time-to-accuracy: its value (``record.reached``), None without one."""
    return float(trial.values[0]) if record.reached([trial]) and trial.values[0] > 0 else None


def _study_cap(study: optuna.Study, trial: FrozenTrial) -> float | None:
    """``batch_cap`` over the trials ``study`` has tried or is trying, ``trial`` aside."""
    return batch_cap([t for t in study.get_trials(deepcopy=False, states=_TRIED)
                      if t.number != trial.number])


def _own_trials(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """``trials`` less those that hold none of the parameters at least half the complete and
    pruned trials hold: a trial another client added with other parameters or none (``add_trial``
    with a value of its own) would empty the space the spread points are drawn in and sit at
    distance 0 from every draw, leaving the study to seeded random draws that repeat on
    every resume. Running trials are kept (their parameters come as they are drawn)."""
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    counts: dict[str, int] = {}
    for t in finished:
        for name in t.distributions:
            counts[name] = counts.get(name, 0) + 1
    common = {name for name, n in counts.items() if 2 * n >= len(finished)}
    return [t for t in trials if not t.state.is_finished() or common & t.distributions.keys()]


class SpreadSampler(optuna.samplers.BaseSampler):
    """Each point the best of ``candidates`` uniform draws: farthest from the configurations the
    study has tried (complete, pruned) or is trying (running, in any worker), that distance
    divided by (the geometric mean planned duration of the ``neighbours`` nearest tried trials)
    ** ``cost_weight``. A trial that reached the target counts its TTA (what reaching took,
    at most its planned duration). A trial that failed for its configuration (diverged, out
    of memory) counts ``failed_cost`` times its planned duration (times the median one when
    it failed before a first evaluation), so the study keeps away from regions that only look
    cheap because their trials blow up early. ``cost_weight=0``: plain maximin.
    With ``target`` (an accuracy between 0 and 1, held in the curves' ``metric`` slot), a
    trial that ended without reaching it counts at least the time its curve would need to get
    there at its average pace so far (``pace_need``), at most ``failed_cost`` times its
    planned duration: a short schedule that ran out far below the target only looks cheap.
    Parameters that not every trial has (conditional ones), and those of the first trial, are
    drawn at random."""

    def __init__(self, seed: int | None = None, candidates: int = 64, cost_weight: float = 0.5,
                 failed_cost: float = 4.0, neighbours: int = 3, target: float | None = None,
                 metric: str = "top1") -> None:
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        if cost_weight < 0:
            raise ValueError(f"cost_weight must be >= 0, got {cost_weight}")
        if failed_cost <= 0:
            raise ValueError(f"failed_cost must be > 0, got {failed_cost}")
        if neighbours < 1:
            raise ValueError(f"neighbours must be >= 1, got {neighbours}")
        _check_target(target, metric)
        self.target, self.metric = target, metric
        self.candidates = candidates
        self.cost_weight, self.failed_cost, self.neighbours = cost_weight, failed_cost, neighbours
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        ours = _own_trials(study.get_trials(deepcopy=False))
        return {name: dist for name, dist in intersection_search_space(
            ours, include_pruned=True).items() if not dist.single()}

    def _costs(self, tried: list[FrozenTrial]) -> list[float | None]:
        """Each tried trial's cost: its planned duration, its TTA for one that reached (where
        that is less), ``failed_cost`` times its planned duration for one that failed for its
        configuration; one that failed before a first evaluation (out of memory at its first
        step) counts ``failed_cost`` times the median known duration.
        With a target, one that ended without reaching it counts the longer of its planned
        duration and ``pace_need`` (at most ``failed_cost`` times its planned duration); one
        interrupted so that a resumption goes on in its place is no miss."""
        planned = [planned_seconds(t) for t in tried]
        known = [p for p in planned if p is not None]
        typical = statistics.median(known) if known else None
        costs: list[float | None] = []
        for t, seconds in zip(tried, planned, strict=True):
            outcome = t.user_attrs.get(record.OUTCOME)
            if outcome == "reached":
                tta = _tta(t)
                if tta is not None and (seconds is None or tta < seconds):
                    seconds = tta
            elif outcome == "failed":
                seconds = seconds if seconds is not None else typical
                seconds = None if seconds is None else seconds * self.failed_cost
            elif (seconds is not None and self.target is not None
                  and t.state != TrialState.RUNNING
                  and t.user_attrs.get(record.STOP_REASON) not in record.RESUMED_REASONS):
                need = pace_need(t, self.target, self.metric)
                if need is not None:
                    seconds = min(max(seconds, need), self.failed_cost * seconds)
            costs.append(seconds)
        return costs

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution],
                        center: dict[str, Any] | None = None,
                        half_width: float = 0.5) -> dict[str, Any]:
        """The spread point; with ``center``, drawn within ``half_width`` of it in the unit
        cube (``_spread.farthest``)."""
        if not search_space:
            return {}
        tried = [t for t in _own_trials(study.get_trials(deepcopy=False, states=_TRIED))
                 if t.number != trial.number]
        costs = self._costs(tried) if self.cost_weight > 0 else None
        allowed = capped(search_space, batch_cap(tried))
        return farthest(allowed, [t.params for t in tried], self._rng, self.candidates,
                        costs=costs, cost_weight=self.cost_weight, neighbours=self.neighbours,
                        center=center, half_width=half_width)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        value = self._random.sample_independent(study, trial, param_name, param_distribution)
        if param_name != "global_batch":
            return value
        return within_cap(param_name, value, param_distribution, _study_cap(study, trial))

    def reseed_rng(self) -> None:
        self._rng = random.Random()
        self._random.reseed_rng()


def incumbent(trials: Sequence[FrozenTrial]) -> dict[str, Any] | None:
    """The parameters of the trial with the best (least) time-to-accuracy among ``trials`` that
    reached the target, or None while none has."""
    reached = [t for t in trials if t.state == TrialState.COMPLETE and t.values
               and t.user_attrs.get(record.OUTCOME) == "reached"]
    return dict(min(reached, key=lambda t: (t.values[0], t.number)).params) if reached else None


class ExploringTPESampler(optuna.samplers.BaseSampler):
    """Spread points (``SpreadSampler``) for the first ``n_startup_trials`` trials and then for
    all but every ``tpe_every``-th trial (0: never TPE), which TPE proposes. Once a trial has
    reached the target, the second trial of each ``tpe_every`` after the start (where
    ``tpe_every`` is 3 or more) is a local spread point: the least explored of the spread
    sampler's candidates drawn within ``local_half_width`` of the fastest configuration so far
    (in the unit cube, its categorical choices kept; None: no local points)."""

    def __init__(self, seed: int | None = None, n_startup_trials: int = 32,
                 tpe_every: int = 4, candidates: int = 64, cost_weight: float = 0.5,
                 failed_cost: float = 4.0, local_half_width: float | None = LOCAL_HALF_WIDTH,
                 target: float | None = None, metric: str = "top1") -> None:
        """``seed``: every draw's (a worker without one draws its own).
        ``local_half_width`` None: spread points stay global after a first reach.
        ``target``, ``metric``: the study's accuracy target and its curve slot, for the
        spread points' costs (``SpreadSampler``; None: planned durations alone)."""
        if tpe_every < 0:
            raise ValueError(f"tpe_every must be >= 0, got {tpe_every}")
        if n_startup_trials < 0:
            raise ValueError(f"n_startup_trials must be >= 0, got {n_startup_trials}")
        if local_half_width is not None and not 0 < local_half_width <= 1:
            raise ValueError(f"local_half_width must be in (0, 1], got {local_half_width}")
        self.local_half_width = local_half_width
        self._centers: dict[int, dict[str, Any] | None] = {}
        self._tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8)
        self._spread = SpreadSampler(seed=None if seed is None else seed + 7919,
                                     candidates=candidates, cost_weight=cost_weight,
                                     failed_cost=failed_cost, target=target, metric=metric)
        self.n_startup_trials = n_startup_trials
        self.tpe_every = tpe_every

    def _center(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
        """The local spread point's center for ``trial`` (None: a spread point over the whole
        space), decided once a trial."""
        if self.local_half_width is None:
            return None
        if trial.number not in self._centers:
            tried = _own_trials(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            self._centers[trial.number] = incumbent(tried)
        return self._centers[trial.number]

    def _for(self, study: optuna.Study, trial: FrozenTrial) -> optuna.samplers.BaseSampler:
        k, n = self.tpe_every, trial.number
        if n < self.n_startup_trials or not k:
            return self._spread
        if n % k == k - 1:
            return self._tpe
        if k >= 3 and n % k == 1:
            self._center(study, trial)      # a local spread point once a trial has reached
        return self._spread

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._for(study, trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        sampler = self._for(study, trial)
        center = self._centers.get(trial.number)
        if sampler is self._spread and center is not None:
            return self._spread.sample_relative(study, trial, search_space, center=center,
                                                half_width=self.local_half_width or 0.5)
        params = sampler.sample_relative(study, trial, search_space)
        if sampler is self._tpe and "global_batch" in params:   # spread points cap themselves
            cap = _study_cap(study, trial)
            params["global_batch"] = within_cap("global_batch", params["global_batch"],
                                                search_space["global_batch"], cap)
        return params

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        sampler = self._for(study, trial)
        value = sampler.sample_independent(study, trial, param_name, param_distribution)
        if sampler is not self._tpe or param_name != "global_batch":   # spread caps itself
            return value
        return within_cap(param_name, value, param_distribution, _study_cap(study, trial))

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._for(study, trial).before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._for(study, trial).after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()
        self._spread.reseed_rng()
