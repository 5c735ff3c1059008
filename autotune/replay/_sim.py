"""A replayed study: a tuner driven on a simulated clock against a curve table.

Each of ``workers`` simulated workers asks the study for a trial, trains the proposed
configuration by reading what the table says it reports, and handles every evaluation the
way its method does. autotune's method goes through the worker's own decision pieces
(``autotune.decisions``: the curve row and store writes of a report, the reply to it, the
outcome of the end report and how it is told to Optuna), with the trainer's one rule of its
own applied here as the trainer applies it: between evaluations it stops at the deadline of
the last reply. Workers run asynchronously: the next event of the study is the earliest
evaluation or end of any running trial, and running trials are in the study store, as in a
real study, when a worker asks for its next trial.

The baselines are set up as their users would set them up (BENCHMARKS.md says how): Optuna's
pruners report once an epoch (at the first evaluation after an epoch ends) and prune through
``trial.should_prune()`` (``tpe_median_sh``: only at the successive-halving epochs, as the
YAHPO Gym authors ran TPE + MedianPruner); wall-clock ASHA is Ray Tune's asynchronous
successive halving with ``time_attr`` the elapsed seconds. Every method stops a trial once
it reaches the target (a time-to-accuracy study has nothing to gain from training on).
"""

from __future__ import annotations

import heapq
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from trainers.protocol import reaches

from ..decisions import (
    TrialResult,
    classify,
    curve_row,
    eval_reply,
    eval_writes,
    shortfall,
    start_reply,
    tell,
)
from ..pruners import TimeToAccuracyPruner
from ..samplers import ExploringTPESampler, accuracy_target
from ..space import InfeasiblePoint
from ._tables import Run, Table

__all__ = ["METHODS", "Outcome", "Replay", "WallClockASHA", "sh_budgets"]

ETA = 3     # the reduction factor every successive-halving baseline uses, as autotune's rungs

METHODS = ("autotune", "random", "tpe_median", "tpe_median_sh", "tpe_sha", "tpe_hyperband",
           "random_asha", "asha_wallclock", "dehb", "tpe_nopruning")


def sh_budgets(low: float, high: float, eta: float = ETA) -> list[int]:
    """The successive-halving budgets from ``low`` to ``high`` epochs, eta apart, rounded to
    whole epochs, as YAHPO Gym's own Optuna runs compute them (1-52 epochs, eta 3: 2, 6, 17,
    52)."""
    levels = -int(math.log(low / high) / math.log(eta)) + 1
    return [int(round(high * eta ** -(levels - 1 - i))) for i in range(levels)]


class WallClockASHA:
    """Ray Tune's ASHAScheduler (``time_attr`` elapsed seconds, mode max): rungs at
    ``grace`` x eta^k seconds; a trial that passes a rung it has no record at is stopped when
    its metric is below the (1 - 1/eta) percentile of those recorded there, then recorded.
    ``grace``: None takes the study's first report (a user sets the grace period to about one
    epoch, which a first run shows)."""

    def __init__(self, eta: float = ETA, grace: float | None = None) -> None:
        self.eta, self.grace = eta, grace
        self.rungs: dict[int, dict[int, float]] = {}

    def on_result(self, trial: int, elapsed: float, value: float) -> bool:
        if self.grace is None:
            self.grace = max(elapsed, 1e-9)
        top = int(math.floor(math.log(max(elapsed / self.grace, 1.0)) / math.log(self.eta)
                             + 1e-9)) if elapsed >= self.grace else -1
        for k in range(top, -1, -1):    # the highest rung passed first, as Ray walks them
            recorded = self.rungs.setdefault(k, {})
            if trial in recorded:
                return False
            cutoff = (float(np.percentile(list(recorded.values()), (1 - 1 / self.eta) * 100))
                      if recorded else None)
            recorded[trial] = value
            return cutoff is not None and value < cutoff
        return False


class _DEHB:
    """DEHB (the ``dehb`` package: differential evolution over Hyperband brackets, Awad et
    al., IJCAI 2021) through its ask/tell interface: fidelity = epochs trained (1 to the
    longest planned schedule, eta 3); a job trains its configuration's own schedule up to
    that many epochs. Fitness, minimized: the TTA when the target is reached, else ``miss`` x
    (2 - best accuracy), so every miss ranks behind every reach and closer misses first;
    cost: the elapsed seconds."""

    def __init__(self, table: Table, seed: int, miss: float) -> None:
        try:
            import ConfigSpace as CS
            from dehb import DEHB
        except ImportError:
            raise RuntimeError("the dehb baseline needs the dehb package: "
                               "pip install dehb") from None
        if not table.space:
            raise RuntimeError(f"table {table.name} has no plain search space for DEHB")
        cs = CS.ConfigurationSpace(seed=seed)
        for name, dist in table.space.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                cs.add_hyperparameter(CS.CategoricalHyperparameter(name, list(dist.choices)))
            elif isinstance(dist, optuna.distributions.IntDistribution):
                cs.add_hyperparameter(CS.UniformIntegerHyperparameter(
                    name, dist.low, dist.high, log=dist.log))
            elif isinstance(dist, optuna.distributions.FloatDistribution):
                cs.add_hyperparameter(CS.UniformFloatHyperparameter(
                    name, dist.low, dist.high, log=dist.log))
            else:
                raise RuntimeError(f"DEHB cannot search {name}: {type(dist).__name__}")
        self._folder = tempfile.mkdtemp(prefix="autotune-dehb-")
        longest = max(r.planned_epochs for r in table.runs)
        self.dehb = DEHB(cs=cs, dimensions=len(table.space), min_fidelity=table.first_units,
                         max_fidelity=longest, eta=ETA, n_workers=1, seed=seed,
                         output_path=self._folder, save_freq="end")
        self.miss = miss

    def ask(self) -> tuple[dict[str, Any], dict[str, Any]]:
        job = self.dehb.ask()
        return job, dict(job["config"])

    def tell(self, job: dict[str, Any], result: TrialResult, elapsed: float,
             table: Table) -> None:
        missed = (1.0 + shortfall(result.best_metric, table.target, True) if table.falls
                  else 2.0 - result.best_metric)          # in [1, 2]: closer misses first
        fitness = (float(result.value) if result.outcome == "reached" and result.value
                   is not None else self.miss * missed)
        self.dehb.tell(job, {"fitness": fitness, "cost": elapsed})

    def close(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)


@dataclass
class Outcome:
    """What one replayed study spent and found."""

    to_goal: dict[float, float]        # goal factor -> compute until found (or all compute)
    found: dict[float, bool]
    best_in_budget: float
    trials: int
    compute: float
    spent: list[tuple[str, float, float]] = field(default_factory=list)  # ending, overhead, s
    first_reach: int | None = None     # trials ended (in ``spent``) when the first one reached


@dataclass
class _Running:
    trial: optuna.Trial
    run: Run
    start: float                       # wall time the trial began (its overhead first)
    train_start: float
    overhead: float
    k: int = 0
    deadline: float | None = None
    best: float = 0.0                  # the best value so far (a falling metric's least)
    stop_reason: str = ""
    curve: list[list[Any]] = field(default_factory=list)
    reported_epoch: int = 0
    sh_next: int = 0              # the next successive-halving budget to report at
    replies: list[dict[str, Any]] = field(default_factory=list)   # autotune's, in order
    result: TrialResult | None = None
    job: dict[str, Any] | None = None     # DEHB's job: its configuration and fidelity


class Replay:
    """One study of ``method`` on ``table`` with ``workers`` asynchronous workers.

    It stops taking new trials once every goal was found and ``budget_factor`` x the table's
    best TTA of compute is spent, or once it has started ``max_trials`` trials and spent
    ``min_compute_factor`` x the best TTA (whichever of those two is later)."""

    def __init__(self, table: Table, method: str, seed: int, workers: int = 1,
                 goals: tuple[float, ...] = (1.5, 1.25), max_trials: int = 150,
                 min_compute_factor: float = 30.0, budget_factor: float = 20.0) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.table, self.method, self.workers = table, method, workers
        self.goals, self.max_trials = goals, max_trials
        self.best = table.best_tta
        self.min_compute = min_compute_factor * self.best
        self.budget = budget_factor * self.best
        self.penalty = 2 * table.longest
        self.autotune = method == "autotune"
        self.pruner = self._pruner()
        self.study = optuna.create_study(direction="minimize", sampler=self._sampler(seed),
                                         pruner=self.pruner)
        self.asha = WallClockASHA() if method == "asha_wallclock" else None
        self.sh_steps = (sh_budgets(table.first_units, max(r.planned_epochs for r in table.runs))
                         if method == "tpe_median_sh" else None)
        self.dehb = _DEHB(table, seed, self.penalty) if method == "dehb" else None
        self.found_at: dict[float, float] = {}
        self.best_in_budget = math.inf
        self.spent: list[tuple[str, float, float]] = []
        self.first_reach: int | None = None
        self.compute = 0.0
        self._launched: set[int] = set()

    def _sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        if self.autotune:
            t = self.table                  # as the worker sets it up (``modes``)
            return ExploringTPESampler(seed=seed, target=accuracy_target(t.target, t.falls),
                                       metric=t.metric)
        if self.method.startswith("random") or self.method == "asha_wallclock":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)

    def _pruner(self) -> optuna.pruners.BasePruner:
        t = self.table
        if self.autotune:
            return TimeToAccuracyPruner(t.target, metric=t.metric, num_classes=t.num_classes,
                                        falls=t.falls)
        if self.method == "tpe_median":
            return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
        if self.method == "tpe_median_sh":
            return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
        if self.method == "tpe_sha":
            return optuna.pruners.SuccessiveHalvingPruner()
        if self.method == "random_asha":
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=t.first_units,
                                                          reduction_factor=ETA)
        if self.method == "tpe_hyperband":
            longest = int(max(r.planned_epochs for r in t.runs))
            return optuna.pruners.HyperbandPruner(min_resource=t.first_units, max_resource=longest,
                                                  reduction_factor=ETA)
        return optuna.pruners.NopPruner()

    # -- the study's loop ---------------------------------------------------------------------
    def run(self) -> Outcome:
        events: list[tuple[float, int, int]] = []   # (wall time, tie-breaker, worker)
        running: dict[int, _Running | None] = {w: None for w in range(self.workers)}
        counter = 0
        for w in range(self.workers):
            events.append((0.0, w, w))
        heapq.heapify(events)
        while events:
            now, _, w = heapq.heappop(events)
            state = running[w]
            if state is None:
                if self._done():
                    continue
                state = running[w] = self._start(w, now)
            elif self._advance(state, now):
                running[w] = None
                counter += 1
                heapq.heappush(events, (now, self.workers + counter, w))
                continue
            counter += 1
            heapq.heappush(events, (self._next(state), self.workers + counter, w))
        if self.dehb is not None:
            self.dehb.close()
        return Outcome({g: self.found_at.get(g, self.compute) for g in self.goals},
                       {g: g in self.found_at for g in self.goals}, self.best_in_budget,
                       len(self.spent), self.compute, self.spent, self.first_reach)

    def one_trial(self, worker: int = 0) -> tuple[TrialResult, list[dict[str, Any]]]:
        """Runs the study's next trial alone, from now to its end: its result and the replies
        its reports got (autotune's method)."""
        state = self._start(worker, self.compute)
        while not self._advance(state, self._next(state)):
            pass
        if state.result is None:  # _end sets it; unreachable
            raise RuntimeError(f"trial {state.trial.number} ended without a result")
        return state.result, state.replies

    def _done(self) -> bool:
        started = len(self.study.get_trials(deepcopy=False))
        if started >= self.max_trials and self.compute >= self.min_compute:
            return True
        return len(self.found_at) == len(self.goals) and self.compute >= self.budget

    def _ask(self) -> tuple[optuna.Trial, dict[str, Any]]:
        for _ in range(1000):
            trial = self.study.ask()
            try:
                return trial, self.table.propose(trial)
            except InfeasiblePoint:
                self.study.tell(trial, state=TrialState.FAIL)
        raise RuntimeError("1000 proposals in a row were infeasible")

    def _start(self, worker: int, now: float) -> _Running:
        job = None
        if self.dehb is not None:
            trial = self.study.ask()
            job, params = self.dehb.ask()
        else:
            trial, params = self._ask()
        run = self.table.train(params)
        overhead = run.overhead_s + (run.launch_s if worker not in self._launched else 0.0)
        self._launched.add(worker)
        state = _Running(trial, run, now, now + overhead, overhead, job=job,
                         best=math.inf if self.table.falls else 0.0)
        if self.autotune:
            reply = start_reply(self.pruner, self.study)
            state.replies.append(reply)
            state.deadline = reply["deadline_s"]
        return state

    def _next(self, s: _Running) -> float:
        """Wall time of the trial's next event: an evaluation, the deadline, or its end."""
        run = s.run
        t = run.times[s.k] if s.k < len(run.times) else run.elapsed
        if s.deadline is not None and s.deadline < t:
            t = max(s.deadline, run.times[s.k - 1] if s.k else 0.0)
        return s.train_start + t

    def _advance(self, s: _Running, now: float) -> bool:
        """Handles the trial's next event at wall time ``now``; True when it ended."""
        run, elapsed = s.run, now - s.train_start
        upcoming = run.times[s.k] if s.k < len(run.times) else run.elapsed
        if s.deadline is not None and upcoming > s.deadline:
            # the trainer stops on its own once its elapsed time passes the deadline
            return self._end(s, now, {"reason": "bound", "elapsed_s": elapsed})
        if s.k >= len(run.times):
            return self._end(s, now, {"reason": run.end, "elapsed_s": run.elapsed})
        if s.job is not None and run.epochs[s.k] > s.job["fidelity"] + 1e-9:
            # DEHB's job ends at its fidelity: the epochs it was given
            return self._end(s, now, {"reason": "fidelity", "elapsed_s": run.times[s.k - 1]
                                      if s.k else 0.0})
        k, value = s.k, run.values[s.k]
        s.k += 1
        falls = self.table.falls
        s.best = min(s.best, value) if falls else max(s.best, value)
        loss = run.losses[k] if k < len(run.losses) else None
        msg: dict[str, Any] = {"type": "eval", "index": k, "elapsed_s": run.times[k],
                               "epoch": run.epochs[k], "top1": None, "top5": None,
                               self.table.metric: value, "loss": loss}
        reached = reaches(value, self.table.target, falls)
        if reached:
            msg["reached"] = True
        if self.autotune:
            s.curve.append(curve_row(msg, run.planned_epochs))
            for write in eval_writes(s.trial, msg, self.table.metric, s.curve, falls):
                write()
            reply = eval_reply(self.pruner, self.study, s.trial, msg)
            s.replies.append(reply)
            s.deadline = reply["deadline_s"]
            if not reached and reply["action"] == "stop":
                s.stop_reason = reply["reason"]
                return self._end(s, now, {"reason": "stopped", "elapsed_s": run.times[k]})
        if reached:
            return self._end(s, now, {"reason": "reached", "tta_s": run.times[k],
                                      "elapsed_s": run.times[k]})
        if not self.autotune and s.job is None and self._baseline_prunes(s, k, value):
            s.stop_reason = "median"    # told as PRUNED (decisions.tell_optuna_style)
            return self._end(s, now, {"reason": "stopped", "elapsed_s": run.times[k]})
        return False

    def _baseline_prunes(self, s: _Running, k: int, value: float) -> bool:
        # the baselines' conventions: ASHA's metric higher is better (mode max), Optuna's
        # intermediate values lower (an accuracy's error); a falling metric as it is
        falls = self.table.falls
        if self.asha is not None:
            return self.asha.on_result(s.trial.number, s.run.times[k], -value if falls else value)
        error = value if falls else 1.0 - value
        done = int(s.run.epochs[k] + 1e-6)
        if done <= s.reported_epoch:
            return False            # Optuna's pruners see one report an epoch, at its end
        s.reported_epoch = done
        if self.sh_steps is not None:   # reports only at the successive-halving epochs
            # (the first evaluation at or past each: a step table evaluates every k steps)
            passed = [i for i, b in enumerate(self.sh_steps) if b <= done]
            if not passed or passed[-1] < s.sh_next:
                return False
            s.sh_next = passed[-1] + 1
            s.trial.report(error, step=passed[-1])
            return s.trial.should_prune()
        s.trial.report(error, step=done - 1)
        return s.trial.should_prune()

    def _end(self, s: _Running, now: float, end: dict[str, Any]) -> bool:
        result = s.result = classify(s.trial.number, end, 0, "", s.best, s.k, s.stop_reason)
        tell(self.study, s.trial, result, autotune=self.autotune, target=self.table.target,
             penalty=self.penalty, falls=self.table.falls)
        seconds = float(end["elapsed_s"])
        if self.dehb is not None and s.job is not None:
            self.dehb.tell(s.job, result, seconds, self.table)
        self.compute += s.overhead + seconds
        self.spent.append((result.reason, s.overhead, seconds))
        if result.outcome == "reached" and self.first_reach is None:
            self.first_reach = len(self.spent)
        if result.outcome == "reached" and result.value is not None:
            spent_by_now = self.workers * now   # every worker busy since the study began
            if spent_by_now <= self.budget:
                self.best_in_budget = min(self.best_in_budget, result.value)
            for g in self.goals:
                if g not in self.found_at and result.value <= g * self.best * (1 + 1e-9):
                    self.found_at[g] = spent_by_now
        return True
