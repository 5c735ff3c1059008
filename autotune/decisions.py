"""What a worker decides about a trial, as pieces free of processes and sockets.

The worker's trial runner (``trial_runner.TrialRunner``) and the replay (``autotune.replay``)
both call these, so a replayed study makes exactly the decisions a real one makes:

* ``curve_row`` and ``eval_writes``: what the study store records of an evaluation report;
* ``start_reply`` and ``eval_reply``: the answer to the trainer's start and evaluation
  reports (go on or stop, with the reason, and the deadline after which the trainer stops on
  its own between evaluations);
* ``classify``: the trial's outcome from the trainer's end report (or its absence);
* ``tell``: the outcome told to Optuna.

Outcomes (docs/DESIGN.md, "Rules of time-to-accuracy"):

* reached: value = TTA seconds, feasible;
* censored: stopped or ended without reaching the target. Its TTA is only known to exceed its
  elapsed time (the user attribute ``elapsed_s``): value = +inf, with the constraint
  ``reach_target`` = target - best metric > 0 (for a metric that falls, ``mode: min``: 1 -
  target / best metric, ``shortfall``), so Optuna's sampler ranks it behind every trial
  that reached the target and closer misses ahead of wider ones (it ranks infeasible trials by
  their violation, never by value), while a client that ignores constraints (optuna-dashboard,
  ``optuna best-trial`` on an old Optuna) can never take it for the best. Never a failure;
* failed: diverged, out of memory, crashed, launch or plan error, with the reason. Failures
  the configuration causes (diverged, oom) are told as complete with value +inf and maximally
  infeasible (``reach_target`` = 1 + target; 2 for a metric that falls), so the sampler
  steers away from them; the others are Optuna FAIL, which the sampler ignores.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import optuna
from optuna.trial import TrialState

from trainers import protocol

from . import record
from .pruners import TimeToAccuracyPruner
from .pruners._rules import Rules

__all__ = ["CONFIG_FAILURES", "CONSTRAINT", "TrialResult", "best_of", "classify",
           "curve_row", "elapsed_of", "eval_reply", "eval_writes", "optuna_state", "shortfall",
           "start_reply", "study_deadline", "systematic_failure", "tell", "tell_optuna_style",
           "tell_result"]

CONSTRAINT = "reach_target"
# Failures the configuration causes (not the machine): recorded as complete but maximally
# infeasible, so the sampler steers away from them instead of ignoring them.
CONFIG_FAILURES = ("diverged", "oom")

Reply = dict[str, Any]


@dataclass
class TrialResult:
    number: int
    params: dict[str, Any]
    outcome: str                    # reached | censored | failed
    reason: str                     # reached, bound, planned_epochs, max_seconds, diverged, ...
    value: float | None = None      # TTA (reached) or elapsed seconds (censored)
    best_metric: float = 0.0
    evals: int = 0
    detail: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    curve: list[list[Any]] = field(default_factory=list)


def best_of(result: TrialResult) -> float | None:
    """The best value of the target metric a trial showed; None when it showed none (no
    evaluation came, so the 0 or +inf it started from is no value it reached)."""
    return _finite_or_none(result.best_metric) if result.evals else None


def _finite_or_none(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _number_or_none(value: Any) -> float | None:
    """An accuracy as reported (NaN kept: the pruner reads it), None for what is no number."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


# -- an evaluation report -----------------------------------------------------------------------
def metric_slot(metric: str) -> str:
    """The curve row's slot a target metric is stored in: ``top5``'s own, else ``top1``'s
    (a script's own metric, such as ``accuracy`` or ``f1``, takes top-1's place)."""
    return "top5" if metric == "top5" else "top1"


def curve_row(msg: dict[str, Any], planned_epochs: float, metric: str = "top1") -> list[Any]:
    """The stored row of an evaluation: ``[elapsed_s, top1, top5, progress, loss]``, progress
    being the share of the planned schedule done (epochs done / planned epochs), and the
    gradient noise scale after them when the trainer measured one. A target ``metric`` other
    than top1 and top5 (a script's own) is stored in top-1's place (``metric_slot``)."""
    first = msg.get("top1") if metric in ("top1", "top5") else msg.get(metric)
    row = [round(float(msg["elapsed_s"]), 3), _number_or_none(first),
           _number_or_none(msg.get("top5")),
           round(float(msg["epoch"]) / planned_epochs, 4), _finite_or_none(msg.get("loss"))]
    noise = _finite_or_none(msg.get("noise_scale"))
    return row if noise is None else [*row, round(noise, 1)]


def eval_writes(trial: optuna.Trial, msg: dict[str, Any], metric: str,
                curve: list[list[Any]], falls: bool = False) -> list[Callable[[], Any]]:
    """The study-store writes of an evaluation (``curve`` already holds its row), in order; the
    worker may hold them while the store is out of reach. ``falls``: the target metric falls
    to its value (``mode: min``, a loss)."""
    value = float(msg[metric])
    # Optuna's pruners read intermediate values as "lower is better": an accuracy's error, a
    # loss as it is.
    return [partial(trial.report, value if falls else 1.0 - value, int(msg["index"])),
            partial(trial.set_user_attr, record.ELAPSED, msg["elapsed_s"]),
            partial(trial.set_user_attr, record.CURVE, list(curve))]


def study_deadline(pruner: optuna.pruners.BasePruner, study: optuna.Study) -> float | None:
    """The elapsed seconds past which a trial of ``study`` cannot win (None: no bound yet, or a
    comparison mode whose pruner has none)."""
    if not isinstance(pruner, TimeToAccuracyPruner):
        return None
    return pruner.deadline(study)


def start_reply(pruner: optuna.pruners.BasePruner, study: optuna.Study) -> Reply:
    """The answer to the trainer's start report: go, with the study's deadline."""
    return protocol.go(study_deadline(pruner, study))


def eval_reply(pruner: optuna.pruners.BasePruner, study: optuna.Study, trial: optuna.Trial,
               msg: dict[str, Any], *, now: float | None = None,
               stop_at: float | None = None) -> Reply:
    """The answer to an evaluation report (its writes already made): go on, or stop with the
    reason (``study_timeout`` when ``now`` has passed ``stop_at``, else the pruner's)."""
    deadline = study_deadline(pruner, study)
    if msg.get("reached"):
        return protocol.go(deadline)
    if stop_at is not None and now is not None and now > stop_at:
        return protocol.stop("study_timeout", deadline)
    if isinstance(pruner, TimeToAccuracyPruner):
        reason = pruner.decide(study, record.stored_trial(study, trial))
    else:
        reason = "median" if trial.should_prune() else None
    return protocol.stop(reason, deadline) if reason else protocol.go(deadline)


# -- the end of a trial -------------------------------------------------------------------------
# argparse's answer to the arguments autotune's launch gives a script of the user's own.
_ARGUMENTS_REFUSED = re.compile(r"unrecognized arguments:.*--(plan|report-to|local_rank)\b")


def classify(number: int, end: dict[str, Any] | None, code: int, tail: str, best: float,
             evals: int, stop_reason: str, loss: float | None = None,
             collapsed: bool = False) -> TrialResult:
    """The outcome of trial ``number`` from the trainer's end report (None: it sent none and
    exited with ``code``, ``tail`` the end of its log), ``best`` its best metric, ``evals`` its
    evaluations, ``stop_reason`` the reason the worker last gave it to stop, ``loss`` the
    validation loss of its last evaluation (None: not reported) and ``collapsed`` whether its
    accuracy fell back to chance after rising (the pruner's ``collapsed`` rule)."""
    if end is None:
        why = "hung" if code in (-9, -15) else "crashed"
        said = ("trainer exited with code 0 without reporting its end (a script reports "
                "through trainers.api: trial.start(), trial.report(), trial.end())"
                if code == 0 else f"trainer exited with code {code}")
        if _ARGUMENTS_REFUSED.search(tail):
            said += (" (the script's own argument parser refuses the arguments each rank is "
                     "launched with, --plan and --report-to for trainers.api and DeepSpeed's "
                     "--local_rank: parse with parser.parse_known_args(), which leaves them "
                     "to trainers.api)")
        return TrialResult(number, {}, "failed", why, best_metric=best, evals=evals,
                           detail=f"{said}: {tail}")
    reason = str(end["reason"])
    if reason == "stopped":  # stopped by the worker: say why
        reason = stop_reason or "stopped"
    if reason == "reached":
        return TrialResult(number, {}, "reached", reason, value=float(end["tta_s"]),
                           best_metric=best, evals=evals, summary=end)
    if reason == "oom":
        return TrialResult(number, {}, "failed", reason, value=float(end["elapsed_s"]),
                           best_metric=best, evals=evals, summary=end,
                           detail=f"out of memory at micro-batch {end.get('micro_batch')}")
    if reason == "checkpointed":
        return TrialResult(number, {}, "failed", "interrupted", best_metric=best,
                           evals=evals, summary=end,
                           detail=f"checkpoint saved in {end.get('checkpoint')}")
    if reason == "diverged":
        steps = end.get("steps")
        after = f" after {steps} optimizer step(s)" if isinstance(steps, int) else ""
        if stop_reason != "diverged":
            detail = "loss became NaN or infinite"
        elif loss is not None and loss > Rules.blowup_loss:
            detail = f"the weights blew up: validation loss {loss:.3g} at chance{after}"
        elif collapsed:
            detail = f"accuracy fell back to chance{after}, from a best of {best:.3g}"
        else:
            detail = f"accuracy still at chance{after}"
        return TrialResult(number, {}, "failed", reason, value=float(end["elapsed_s"]),
                           best_metric=best, evals=evals, detail=detail, summary=end)
    return TrialResult(number, {}, "censored", reason, value=float(end["elapsed_s"]),
                       best_metric=best, evals=evals, summary=end)


# Failures that say nothing about a configuration: the trainer could not start, crashed,
# hung, sent garbage or never finished its setup.
_NOT_CONFIG = ("crashed", "hung", "launch_error", "bad_report", "setup_timeout")
SYSTEMATIC_AFTER = 3


def _cause(result: TrialResult) -> str:
    """What a failure was, for comparing failures: its reason and the exception it names (or
    its detail, numbers left out)."""
    detail = result.detail.split(" (log: ", 1)[0]
    named = re.search(r"\b((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))\b", detail)
    return f"{result.reason}: {named.group(1) if named else re.sub(r'[0-9.]+', '#', detail)[:80]}"


def systematic_failure(results: list[TrialResult],
                       after: int = SYSTEMATIC_AFTER) -> str | None:
    """Why a process should stop taking trials, or None: every trial it ran failed in a way
    no configuration causes (``_NOT_CONFIG``), and its last ``after`` alike (the data, the
    environment or the training script, not the parameters, is at fault). Once any trial has
    trained, a failure is a trial's own, as before."""
    results = [r for r in results if r.outcome != "infeasible"]   # never trained: no sign
    if len(results) < after or any(r.outcome != "failed" or r.reason not in _NOT_CONFIG
                                   for r in results):
        return None
    last = results[-after:]
    if len({_cause(r) for r in last}) != 1:
        return None
    numbers = ", ".join(str(r.number) for r in last)
    return (f"trials {numbers} all failed alike ({last[-1].reason}: {last[-1].detail[:700]}); "
            "no configuration causes that, so no more trials are started "
            "until it is fixed: fix it, then resume the study with the same command (the "
            "failed trials stay recorded)")


def elapsed_of(trial: Any) -> float | None:
    """A finished trial's elapsed seconds (its TTA once it reached): what ``tell_result``
    recorded (a non-reaching trial's Optuna value is +inf); older studies' value."""
    elapsed = trial.user_attrs.get(record.ELAPSED)
    if elapsed is not None:
        return float(elapsed)
    values = getattr(trial, "values", None)    # a multi-objective study (not autotune's): none
    value = values[0] if values is not None and len(values) == 1 else None
    return None if value is None or not math.isfinite(value) else float(value)


def optuna_state(result: TrialResult) -> str:
    """The Optuna state a result is told with (see ``tell_result``)."""
    if result.outcome == "failed" and result.reason not in CONFIG_FAILURES:
        return "FAIL"
    return "COMPLETE"


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult, *, autotune: bool,
         target: float, penalty: float, falls: bool = False) -> None:
    """Records ``result`` and tells Optuna: autotune's way (``tell_result``), or Optuna's usual
    one for the comparison modes (``tell_optuna_style``, a missed target told as ``penalty``)."""
    if result.summary.get("checkpoint"):   # saved at its end: where it resumes from
        trial.set_user_attr(record.CHECKPOINT, result.summary["checkpoint"])
        trial.set_user_attr(record.CHECKPOINT_ELAPSED, result.summary.get(
            "checkpoint_elapsed_s"))
    if result.outcome == "reached" and result.summary.get("model_path"):
        trial.set_user_attr(record.MODEL, str(result.summary["model_path"]))
    if result.summary.get(record.UNREADABLE):   # skipped by the trainer, named in its log
        trial.set_user_attr(record.UNREADABLE, int(result.summary[record.UNREADABLE]))
    if autotune:
        tell_result(study, trial, result, target, falls)
    else:
        tell_optuna_style(study, trial, result, penalty)


def tell_optuna_style(study: optuna.Study, trial: optuna.Trial, result: TrialResult,
                      penalty: float) -> None:
    """Optuna's usual conventions, for comparisons: pruned trials PRUNED, a missed target the
    penalty value, failures FAIL."""
    trial.set_user_attr(record.OUTCOME, result.outcome)
    trial.set_user_attr(record.STOP_REASON, result.reason)
    trial.set_user_attr(record.BEST_METRIC, best_of(result))
    if result.outcome == "reached":
        trial.set_user_attr(record.TTA, result.value)
        study.tell(trial, result.value)
    elif result.outcome == "failed":
        study.tell(trial, state=TrialState.FAIL)
    elif result.reason == "median":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, penalty)


def shortfall(best: float, target: float, falls: bool = False) -> float:
    """How far a trial's best value of the target metric stayed from the target (0 or less:
    reached): an accuracy's gap, ``target - best``, at most 1; for a metric that falls (a
    loss), the share of its best value above the target, ``1 - target / best``, below 1 too,
    so a failed configuration's constraint (2, or 1 + target) is worse than any."""
    if falls:
        if not math.isfinite(best):     # no evaluation: as far off as a miss can be
            return 1.0
        return 1.0 - target / best if best > 0 else -1.0     # 0: a perfect score, reached
    return target - best


def tell_result(study: optuna.Study, trial: optuna.Trial, result: TrialResult,
                target: float, falls: bool = False) -> None:
    """Records ``result`` on ``trial`` and tells Optuna, as the module docstring describes.
    ``falls``: the target metric falls to ``target`` (``mode: min``)."""
    trial.set_user_attr(record.OUTCOME, result.outcome)
    trial.set_user_attr(record.STOP_REASON, result.reason)
    trial.set_user_attr(record.BEST_METRIC, best_of(result))
    for key in ("setup_s", "train_s", "eval_s", "control_s", "wall_s", "steps",
                record.NOISE_SCALE):
        if key in result.summary:
            trial.set_user_attr(key, result.summary[key])
    if result.detail:
        trial.set_user_attr(record.DETAIL, result.detail[:1000])
    if result.outcome == "failed" and result.reason not in CONFIG_FAILURES:
        study.tell(trial, state=TrialState.FAIL)
        return
    if result.value is not None:
        trial.set_user_attr(record.ELAPSED, result.value)
    if result.outcome == "failed":  # the configuration's fault: teach the sampler
        trial.set_constraint(CONSTRAINT, 2.0 if falls else 1.0 + target)
        study.tell(trial, math.inf)
        return
    violation = shortfall(result.best_metric, target, falls)
    trial.set_constraint(CONSTRAINT, violation if result.outcome == "reached"
                         else max(violation, 1e-9))
    if result.outcome == "reached":
        trial.set_user_attr(record.TTA, result.value)
        study.tell(trial, result.value)
    else:
        study.tell(trial, math.inf)
