"""The trial record: what autotune keeps on each Optuna trial, in one place.

Everything autotune knows of a trial beyond its parameters and value lives in the trial's user
attributes in the study store, so any worker, the study server, ``autotune status``, the
replay and a restarted process read the same record. This module owns their names, the shape
of a learning-curve row, the questions asked of a study's trials (which finished, which
reached best), the record a resumption is queued with, and the one read of a live trial's
stored copy (Optuna's storage API, private on ``Study``).

Stored values stay as they always were (a curve row is a plain list), so studies written by
earlier versions load unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from optuna.trial import FrozenTrial, TrialState

__all__ = ["ASKED_BY", "OUTCOME", "STOP_REASON", "DETAIL", "PARAMS", "CURVE", "ELAPSED",
           "BEST_METRIC", "TTA", "LINEAGE", "CHECKPOINT", "CHECKPOINT_ELAPSED", "RESUME_FROM",
           "RESUME_OF",
           "RESUME_ELAPSED", "INTERRUPTED_AT", "DOWNTIME", "RUN_KEY", "WARM_START",
           "SETUP_PHASES", "AUGMENT", "SETUP_S", "HOSTS", "TRAINER_PID", "RANKS_TRIAL",
           "LOST_WORKER", "LOST_RUN_KEY", "STUDY_CONFIG", "STUDY_SPACE", "STUDY_STOP",
           "STUDY_UID", "STUDY_VERSION", "RESUMED_REASONS",
           "CurveRow", "curve_rows", "last_loss", "finished", "reached", "best_reached",
           "asked_elsewhere", "ended_by", "ended_elsewhere", "told_elsewhere",
           "resumption", "stored_trial", "MODEL", "stale_models"]

# -- keys of a trial's user attributes ----------------------------------------------------------
ASKED_BY = "asked_by"                # the autotune worker that asked for it (its first write)
OUTCOME = "outcome"                  # reached | censored | failed | infeasible
STOP_REASON = "stop_reason"          # reached, bound, projection, rung, follows_miss, oom, ...
DETAIL = "detail"                    # what went wrong, in words (failures)
PARAMS = "params"                    # the sampled point, with derived values, as planned
CURVE = "curve"                      # rows [elapsed_s, top1, top5, progress, loss(, noise)]
ELAPSED = "elapsed_s"                # latest elapsed seconds; the TTA once reached
BEST_METRIC = "best_metric"          # best value of the target metric
TTA = "tta_s"                        # time to accuracy, once reached
LINEAGE = "lineage"                  # numbers of the trials this one resumes, oldest first
CHECKPOINT = "checkpoint"            # the latest complete checkpoint's folder
CHECKPOINT_ELAPSED = "checkpoint_elapsed_s"   # elapsed seconds that checkpoint holds
RESUME_FROM = "resume_from"          # a resumption: the checkpoint it starts from
RESUME_OF = "resume_of"              # ... the trial it continues
RESUME_ELAPSED = "resume_elapsed_s"  # ... the elapsed seconds it starts at
INTERRUPTED_AT = "interrupted_at"    # ... when its predecessor stopped (epoch seconds)
DOWNTIME = "downtime_s"              # seconds between the interruption and the resumption
RUN_KEY = "mlflow_run_key"           # the trial's MLflow run, by autotune's key
WARM_START = "warm_start"            # enqueued from the space's warm starts
SETUP_PHASES = "setup_phases"        # setup phase -> seconds after the start it began
AUGMENT = "augment"                  # the augmentation the trainer used
UNREADABLE = "unreadable_images"      # image files its trainer could not decode and skipped
NOISE_SCALE = "noise_scale"          # the gradient noise scale it measured last (images)
SETUP_S = "setup_s"                  # seconds from the start (or the plan) to the first step
HOSTS = "hosts"                      # the machines its ranks ran on
MODEL = "model_path"                 # the model it saved on reaching the target (rank 0's host)
TRAINER_PID = "trainer_pid"          # rank 0's process
RANKS_TRIAL = "ranks_trial"          # the how-manieth trial of its ranks (1: launched for it)
LOST_WORKER = "lost_worker"          # a resumption of a lost worker's trial: that worker
LOST_RUN_KEY = "lost_run_key"        # ... and the lost trial's MLflow run key

# -- keys of the study's own user attributes ----------------------------------------------------
STUDY_CONFIG = "config"              # the study file as resolved (password redacted)
STUDY_SPACE = "search_space"         # the search space, serialized: workers rebuild it
STUDY_UID = "autotune_uid"           # the study's own id: its MLflow experiment and run folder
STUDY_VERSION = "autotune_version"   # the autotune release that wrote the config: workers check
STUDY_STOP = "stop_requested"        # `autotune stop study`: {"at", "now", "host"}; None: none

# Trials that end so that another goes on in their place (a resumption): not counted.
RESUMED_REASONS = ("interrupted", "worker_lost")


class CurveRow(NamedTuple):
    """One evaluation as stored (a list: ``[elapsed_s, top1, top5, progress, loss]``, and the
    gradient noise scale where the trainer measured one)."""

    elapsed_s: float
    top1: float | None
    top5: float | None
    progress: float          # share of the planned schedule done (0 where unknown)
    loss: float | None
    noise_scale: float | None = None   # images (trainers.noise); None: not measured


def curve_rows(attrs: dict[str, Any]) -> list[CurveRow]:
    """A trial's stored curve as named rows (rows of older studies, shorter, are padded)."""
    rows = []
    for row in attrs.get(CURVE) or []:
        padded = [*row, None, None, None, None, None][:6]
        rows.append(CurveRow(float(padded[0]), padded[1], padded[2],
                             float(padded[3]) if padded[3] is not None else 0.0, padded[4],
                             padded[5]))
    return rows


def last_loss(attrs: dict[str, Any]) -> float | None:
    """The validation loss of a trial's latest evaluation, if it reported one."""
    rows = curve_rows(attrs)
    return rows[-1].loss if rows else None


def told_elsewhere(trial: FrozenTrial) -> bool:
    """Whether a finished trial was asked and told by another Optuna client (a notebook's
    ``study.ask()``, ``study.optimize``): it holds none of autotune's records, so its value is
    no time to accuracy and it trained nothing of this study's."""
    return trial.state.is_finished() and OUTCOME not in trial.user_attrs \
        and PARAMS not in trial.user_attrs


# What only autotune writes on a trial: asked for by a worker, or queued by autotune (a
# resumption, a warm start, a lost worker's trial).
_AUTOTUNE_MARKS = (ASKED_BY, PARAMS, OUTCOME, LINEAGE, RESUME_FROM, WARM_START, LOST_WORKER)


def asked_elsewhere(trial: FrozenTrial) -> bool:
    """Whether a running trial was asked by another Optuna client (a notebook's
    ``study.optimize`` still in its objective): it holds none of autotune's records, which an
    autotune worker writes first thing (``ASKED_BY``). Such a trial is left to its client: not
    counted, nor given up when no attempt of it is on record."""
    return trial.state == TrialState.RUNNING and not any(
        key in trial.user_attrs for key in _AUTOTUNE_MARKS)


def ended_by(trial: FrozenTrial) -> str:
    """Why an autotune trial its worker still trains is finished in the store: the registry
    gave its worker up (``worker_lost``: failed and queued to resume elsewhere) or another
    Optuna client ended it (``ended_elsewhere``: optuna-dashboard's Fail or Complete button,
    a notebook's ``study.tell``), which is left as that client said."""
    return "worker_lost" if trial.user_attrs.get(STOP_REASON) == "worker_lost" \
        else "ended_elsewhere"


def ended_elsewhere(trial: FrozenTrial) -> bool:
    """Whether an autotune trial was ended by another Optuna client while it trained: it is
    finished, autotune asked for it, and it holds no outcome (autotune writes one before the
    state whenever it ends a trial)."""
    return trial.state.is_finished() and OUTCOME not in trial.user_attrs and (
        ASKED_BY in trial.user_attrs or PARAMS in trial.user_attrs)


def finished(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that ran and ended. Points dropped for violating a constraint, trials
    interrupted or lost to resume elsewhere (their resumption counts), and trials another
    Optuna client told (``told_elsewhere``) do not count."""
    return [t for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
            and t.user_attrs.get(OUTCOME) != "infeasible"
            and t.user_attrs.get(STOP_REASON) not in RESUMED_REASONS
            and not told_elsewhere(t)]


def reached(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """Complete trials that reached the target, with their TTA as value."""
    return [t for t in trials if t.state == TrialState.COMPLETE
            and t.user_attrs.get(OUTCOME) == "reached" and t.value is not None
            and math.isfinite(t.value)]


def best_reached(trials: Iterable[FrozenTrial]) -> FrozenTrial | None:
    """The trial with the smallest TTA, or None when none reached."""
    return min(reached(trials), key=lambda t: float(t.value or 0.0), default=None)


def stale_models(trials: Iterable[FrozenTrial]) -> list[str]:
    """The saved models to remove: those of trials that reached the target more slowly than
    the fastest trial that saved one (which is kept, whatever came after it)."""
    saved = [t for t in reached(trials) if t.user_attrs.get(MODEL)]
    best = min(saved, key=lambda t: (float(t.value or 0.0), t.number), default=None)
    return [str(t.user_attrs[MODEL]) for t in saved if best is not None and t is not best]


def resumption(lineage: Sequence[int], number: int, checkpoint: str | None,
               elapsed_s: float | None, interrupted_at: float) -> dict[str, Any]:
    """The user attributes a resumption of trial ``number`` is queued with: one record
    whether its worker checkpointed on purpose or was given up for lost."""
    record: dict[str, Any] = {RESUME_OF: number, LINEAGE: [*lineage, number],
                              INTERRUPTED_AT: interrupted_at}
    if checkpoint:
        record[RESUME_FROM] = checkpoint
        record[RESUME_ELAPSED] = elapsed_s
    return record


def stored_trial(study: Any, trial: Any) -> FrozenTrial:
    """The store's current copy of a live ``optuna.Trial`` (its state, its attributes as other
    workers wrote them). Optuna exposes no public read of one trial by id; this is autotune's
    one use of its storage API."""
    return study._storage.get_trial(trial._trial_id)
