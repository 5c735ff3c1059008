"""`autotune export curves STUDY`: a study's learning curves in opda's tuning-results format.

One JSON line a trial that ran: its sampled parameters, ``epochs`` (its planned schedule),
``nan_train_loss`` (it diverged), the data set's ``num_classes`` and ``learning_curve``: after
each evaluation the cumulative training ``time``, ``epoch`` (0-indexed: epochs done - 1, a
fraction where evaluations came between epochs, below 0 before the first epoch ended),
``top_1``, ``top_5`` and the validation ``loss``. A trial resumed from a checkpoint is one
run: its lineage's curves joined, under the number of the attempt that ended it. That is the
format ``benchmarks/search_efficiency.py compare --table opda:FILE`` replays, so a study can
be replayed under other tuners.

A trial a pruner stopped (bound, projection, rung, follows_miss) holds only the start of its
curve, and a trial that reached the target stopped there; a replay that trains one of them
again sees it end there. So by default only the trials whose curve is whole for a replay at
the study's target or below are written: those that reached, trained their whole schedule,
or diverged; ``every=True`` writes the stopped ones too.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from trainers.protocol import falls

from . import record
from .errors import ConfigError

__all__ = ["WHOLE", "curves", "export_curves"]

# How a trial ended when its curve is whole for a replay at the study's target or below.
WHOLE = ("reached", "planned_epochs", "diverged")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _joined_rows(trial: FrozenTrial, by_number: dict[int, FrozenTrial]) -> list[record.CurveRow]:
    """``trial``'s curve, after those of the attempts it resumes: each cut where the next
    one resumed from its checkpoint (one resumed without a checkpoint started afresh)."""
    chain = [by_number[n] for n in trial.user_attrs.get(record.LINEAGE, []) if n in by_number]
    rows: list[record.CurveRow] = []
    for i, attempt in enumerate([*chain, trial]):
        if i:
            start = _number(attempt.user_attrs.get(record.RESUME_ELAPSED))
            rows = [r for r in rows if start is not None and r.elapsed_s <= start]
        for r in record.curve_rows(attempt.user_attrs):
            if not rows or r.elapsed_s > rows[-1].elapsed_s:
                rows.append(r)
    return rows


def _scalar(value: Any) -> bool:
    return isinstance(value, str | bool) or _number(value) is not None


def curves(trials: Iterable[FrozenTrial], num_classes: int | None = None,
           every: bool = False, metric: str = "top1"
           ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The opda rows of ``trials`` (pure: no store), and the count of finished trials left
    out, by how they ended. A study's own target ``metric`` (a script's ``accuracy``, say),
    stored in top-1's place, is written under its own name, which ``--metric`` reads."""
    first = "top_1" if metric in ("top1", "top5") else metric
    trials = list(trials)
    by_number = {t.number: t for t in trials}
    rows: list[dict[str, Any]] = []
    left: dict[str, int] = {}
    for t in record.finished(trials):
        reason = str(t.user_attrs.get(record.STOP_REASON) or "unknown")
        planned = t.user_attrs.get(record.PARAMS) or {}
        epochs = _number(planned.get("epochs", t.params.get("epochs")))
        curve = _joined_rows(t, by_number)
        if (reason not in WHOLE and not every) or epochs is None or epochs <= 0 or not curve:
            left[reason] = left.get(reason, 0) + 1
            continue
        row: dict[str, Any] = {"iteration": t.number}
        row.update({k: v for k, v in t.params.items() if _scalar(v) and k != "epochs"})
        row.update(epochs=epochs if epochs != int(epochs) else int(epochs),
                   nan_train_loss=reason == "diverged", stop_reason=reason)
        if num_classes is not None:
            row["num_classes"] = num_classes
        row["learning_curve"] = [
            {"time": r.elapsed_s, "epoch": r.progress * epochs - 1.0,
             **{key: value for key, value in ((first, r.top1), ("top_5", r.top5),
                                               ("loss", r.loss)) if _number(value) is not None}}
            for r in curve if _number(r.top1) is not None or _number(r.top5) is not None]
        if not row["learning_curve"]:
            left[reason] = left.get(reason, 0) + 1
            continue
        rows.append(row)
    return rows, left


def export_curves(study_name: str, storage: str, out: Path | None, every: bool = False,
                  echo: Callable[[str], None] = print) -> int:
    """Writes the study's curves to ``out`` (stdout where None), whole or not at all."""
    from .store import foreign_study, load_existing_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if out is not None and out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the path of the .jsonl file to write")
    if out is not None and not out.parent.is_dir():
        raise ConfigError(f"--out {out}: no folder {out.parent}; create it first")
    study = load_existing_study(study_name, storage)
    foreign = foreign_study(study)
    if foreign:
        raise ConfigError(f"study {study_name!r} was not made by autotune ({foreign}): it "
                          "holds no learning curves to export")
    config = study.user_attrs.get(record.STUDY_CONFIG) or {}
    trainer = config.get("trainer") if isinstance(config, dict) else None
    classes = trainer.get("num_classes") if isinstance(trainer, dict) else None
    target = config.get("target") if isinstance(config, dict) else None
    metric = str(target.get("metric") or "top1") if isinstance(target, dict) else "top1"
    rows, left = curves(study.get_trials(deepcopy=False),
                        classes if isinstance(classes, int) and classes >= 2 else None, every,
                        metric)
    if not rows:
        if every:
            raise ConfigError(f"study {study_name!r} has no trial with an evaluation to "
                              f"export (finished: {_counts(left) or 'none'})")
        raise ConfigError(f"study {study_name!r} has no trial with a whole curve to export "
                          f"(finished: {_counts(left) or 'none'}); --all writes the trials "
                          "a pruner stopped too")
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if out is None:
        echo(text.rstrip("\n"))
        return 0
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, out)           # never a half-written table
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise ConfigError(f"cannot write --out {out}: {e.strerror or e}; give a file in a "
                          "folder you can write to") from None
    at = (f" --target {target['value']} --metric {shlex.quote(str(target.get('metric', 'top1')))}"
          if isinstance(target, dict) and "value" in target else "")
    echo(f"wrote {len(rows)} trial curve(s) of study {study_name!r} to {out}"
         + (f"; left out: {_counts(left)} (stopped early, or no evaluation; --all writes "
            "those with a curve)" if left else ""))
    if falls(target):
        at += " --mode min"
    echo("replay them, from autotune's source tree: python benchmarks/search_efficiency.py "
         f"compare --table {shlex.quote(f'opda:{out.resolve()}')}{at}")
    return 0


def _counts(left: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(left.items()))
