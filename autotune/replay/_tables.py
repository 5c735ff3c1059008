"""Curve tables: recorded (or surrogate) learning curves a replayed study trains from.

A table answers one question: what would training this configuration report? ``train(params)``
returns a ``Run``: the evaluations (elapsed seconds, the target metric, epochs done), the
planned epochs and how the run ended. Three sources:

* ``autotune:PATH``: a table recorded by ``benchmarks/search_efficiency.py record`` (the
  quickstart study's configurations; a proposal trains as its nearest recorded row);
* ``opda:PATH``: a JSON-lines file in the format of opda's tuning results (Lourie et al.,
  "Show Your Work with Confidence", 2023): one line a training run with its hyperparameters
  and ``learning_curve`` (after each epoch: cumulative ``time``, ``top_1``, ``top_5``), or
  the layouts of opda's language-model and fine-tuning tables (steps; curves by validation
  set, with no clock: compute is then counted in training examples); a proposal trains as
  its nearest recorded run;
* ``yahpo-lcbench:INSTANCE``: the YAHPO Gym LCBench surrogate (Pfisterer et al., 2022), queried
  at every epoch for the proposed configuration itself.
"""

from __future__ import annotations

import codecs
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from trainers.protocol import falling_name, reaches

from .._spread import Embedded

__all__ = ["Run", "Table", "TableError", "load_table"]


class TableError(ValueError):
    """A table that cannot be read: the message says what is wrong and what is expected."""


@dataclass(frozen=True)
class Run:
    """What training one configuration reports."""

    times: tuple[float, ...]          # elapsed seconds at each evaluation
    values: tuple[float, ...]         # the target metric at each evaluation (an accuracy's
                                      # 0-1, or a falling metric's value: Table.falls)
    epochs: tuple[float, ...]         # epochs done at each evaluation
    planned_epochs: float
    end: str = "planned_epochs"       # planned_epochs | diverged: how the run ended after them
    end_s: float | None = None        # elapsed seconds at its end (default: the last evaluation)
    losses: tuple[float | None, ...] = ()
    overhead_s: float = 0.0           # paid besides the training clock, every trial
    launch_s: float = 0.0             # paid at a worker's first trial (warm ranks after it)

    def reached_at(self, target: float, falls: bool = False) -> float | None:
        """The elapsed seconds of the first evaluation at or above ``target`` (at or below it
        where the metric ``falls``), None if none."""
        return next((t for t, v in zip(self.times, self.values, strict=True)
                     if reaches(v, target, falls)), None)

    @property
    def elapsed(self) -> float:
        if self.end_s is not None:
            return self.end_s
        return self.times[-1] if self.times else 0.0


# Without a --target, a table's target is the value its best TOP_SHARE of runs reach.
TOP_SHARE = 0.02


def top_share_target(runs: Sequence[Run], falls: bool = False,
                     share: float = TOP_SHARE) -> float:
    """The value the best ``share`` of ``runs`` reach by their end (their best evaluation):
    a target some runs reach and most do not, whatever the metric's scale."""
    finals = sorted((min(r.values) if falls else max(r.values) for r in runs if r.values),
                    reverse=not falls)
    if not finals:
        raise TableError("no run of the table has an evaluation")
    return finals[max(int(share * len(finals)) - 1, 0)]


# A clock's unit: (divisor, name after a figure, name in a key)
_SCALES = {"s": (3600.0, "h", "h"), "examples": (1e6, "M examples", "Mexamples"),
           "epochs": (1.0, "epochs", "epochs"), "steps": (1e3, "k steps", "ksteps"),
           "tokens": (1e9, "G tokens", "Gtokens")}


@dataclass
class Table:
    """A replay's source of training runs.

    ``space``: what the samplers search (Optuna distributions); ``sample(trial)`` draws a
    point from it (default: one suggestion a parameter); ``train(params)``: the run.
    ``runs``: the recorded runs, or a sample of the surrogate's, which set the goal.
    ``num_classes``: for the chance accuracy (None: unknown, the at-chance rule is off).
    """

    name: str
    target: float
    runs: list[Run]
    space: dict[str, BaseDistribution]
    train: Callable[[dict[str, Any]], Run]
    num_classes: int | None = None
    metric: str = "top1"              # the slot the trainer's reports fill: top1 or top5
    sample: Callable[[optuna.Trial], dict[str, Any]] | None = None
    credit: str = ""
    notes: list[str] = field(default_factory=list)
    metric_name: str = ""             # what the table calls it, when not top1 or top5
    falls: bool = False               # the metric falls to the target (a loss: --mode min)
    unit: str = "s"                   # what a run's clock counts: seconds, or where a table
                                      # records no time, examples, epochs or steps trained

    @property
    def shown(self) -> str:
        """The metric as the user named it."""
        return self.metric_name or self.metric

    @property
    def scale(self) -> tuple[float, str, str]:
        """How a report shows compute on this table's clock: the divisor, the unit's name
        after a figure, and its name in a key (``autotune_median_h``)."""
        return _SCALES[self.unit]

    def amount(self, compute: float, digits: int = 4) -> str:
        """``compute`` on this table's clock, as a report shows it (``8.2 h``)."""
        divisor, label, _ = self.scale
        return f"{compute / divisor:.{digits}g} {label}"

    def propose(self, trial: optuna.Trial) -> dict[str, Any]:
        if self.sample is not None:
            return self.sample(trial)
        return {name: trial._suggest(name, dist) for name, dist in self.space.items()}

    @property
    def best_tta(self) -> float:
        times = [t for t in (r.reached_at(self.target, self.falls) for r in self.runs)
                 if t is not None]
        if not times:
            bests = [min(r.values) if self.falls else max(r.values)
                     for r in self.runs if r.values]
            best = (min(bests) if self.falls else max(bests)) if bests else None
            reached = f" (the best reaches {best:.4g})" if best is not None else ""
            raise TableError(f"no run of table {self.name} reaches {self.shown} "
                             f"{'<=' if self.falls else '>='} {self.target}{reached}; give "
                             f"{'a higher' if self.falls else 'a lower'} --target"
                             + ("" if self.name.startswith("autotune:") else
                                f", or none for the value the best {100 * TOP_SHARE:g}% of "
                                "runs reach"))
        return min(times)

    @property
    def longest(self) -> float:
        return max(r.elapsed for r in self.runs)

    @property
    def first_units(self) -> int:
        """The schedule units (epochs, or a step table's steps) of the earliest first
        evaluation, at least 1: the smallest budget an epoch-step baseline can judge."""
        firsts = [r.epochs[0] for r in self.runs if r.epochs]
        return max(1, int(round(min(firsts)))) if firsts else 1


def _nearest(space: dict[str, BaseDistribution], points: list[dict[str, Any]],
             runs: list[Run]) -> Callable[[dict[str, Any]], Run]:
    embedded = Embedded(space, points)

    def train(params: dict[str, Any]) -> Run:
        return runs[int(embedded.distances(params).argmin())]
    return train


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not str(path).strip() or str(path) == ".":
        raise TableError("no table path given: give the path of a JSON-lines file "
                         "(opda:PATH, autotune:PATH)")
    if path.is_dir():
        raise TableError(f"the table {path} is a folder: give the path of a JSON-lines file "
                         "in it")
    if not path.is_file():
        raise TableError(f"no table at {path}: give the path of a JSON-lines file")
    rows = []
    try:
        if path.suffix == ".gz":
            import gzip
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
        # A byte-order mark, as Windows tools write one (PowerShell's redirect: UTF-16)
        text = data.decode("utf-16" if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
                           else "utf-8-sig")
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise TableError(f"cannot read {path} as JSON-lines text ({e}); give a .jsonl file, "
                         "or one compressed with gzip (.jsonl.gz)") from None
    if text.lstrip().startswith("["):       # a JSON array of runs, as some tools save them
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as e:
            raise TableError(f"{path} starts as a JSON array but is not JSON ({e.msg} at line "
                             f"{e.lineno}); give one JSON object a line, or a JSON array of "
                             "them") from None
        if not all(isinstance(row, dict) for row in whole):
            raise TableError(f"{path} is a JSON array whose items are not all objects; each "
                             "run is one JSON object")
        text = "\n".join(json.dumps(row) for row in whole)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TableError(f"{path}, line {number}, is not JSON ({e.msg}); a table has one "
                             "JSON object a line") from None
        if not isinstance(row, dict):
            raise TableError(f"{path}, line {number}, is not a JSON object")
        rows.append(row)
    if not rows:
        raise TableError(f"{path} holds no runs")
    return rows


# -- opda ---------------------------------------------------------------------------------------
OPDA_SPACE: dict[str, BaseDistribution] = {
    # opda's ConvNeXt random search drew from these; a proposal trains as the nearest run.
    # Another table's values widen a range (never narrow it); its batch sizes are the choices.
    "epochs": IntDistribution(20, 100),
    "batch_size": CategoricalDistribution([128, 256, 512, 1024]),
    "lr": FloatDistribution(5e-3, 5e1, log=True),
    "lr_peak_share": FloatDistribution(0.0, 0.8),
    "momentum": FloatDistribution(0.7, 1.0),
    "weight_decay": FloatDistribution(1e-6, 1e-3, log=True),
    "label_smoothing": FloatDistribution(0.0, 0.5),
}
_OPDA_PARAMS = ("batch_size", "lr", "lr_peak_epoch", "momentum", "weight_decay",
                "label_smoothing")
# What opda's own hyperparameters may be, as a recorded run holds them
_OPDA_RANGES = {
    "lr": "a learning rate is a positive number",
    "momentum": "momentum is a number from 0 (none) up",
    "weight_decay": "weight decay is 0 (none) or a positive number",
    "label_smoothing": "label smoothing is a share from 0 (none) up",
    "lr_peak_epoch": "the warm-up's peak is an epoch from 0 (no warm-up) to the run's epochs",
}
# A schedule's length, and where each evaluation sits in it: opda's image tables count epochs
# (an entry's ``epoch`` 0-indexed), its language-model tables steps (``total_steps``; an
# entry's ``step``, the updates done).
_OPDA_LENGTHS = (("epochs", "epoch", 1), ("total_steps", "step", 0),
                 ("total_model_steps", "step", 0))
# An evaluation's seconds since the run began: the image tables' ``time``; the language-model
# tables' ``eval_end_time`` (its result known), else ``train_end_time``.
_OPDA_TIMES = ("time", "eval_end_time", "train_end_time")
# A step's training examples, where a table records no time (opda's fine-tuning tables)
_OPDA_BATCHES = ("batch_size", "train_batch_size")
# ... or an entry's own count of the data trained on so far, where every entry holds one
_OPDA_COUNTERS = ("tokens", "examples", "samples")
# A first evaluation later than this (about 3 years of training) is a clock's timestamp.
_TIMESTAMP_S = 1e8


def metric_key(metric: str) -> str:
    """The learning-curve key a ``--metric`` reads: ``top1`` and ``top5`` are opda's
    ``top_1`` and ``top_5``; any other name is a key of the curves' entries as it stands."""
    return {"top1": "top_1", "top5": "top_5"}.get(metric, metric)


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the keys of a nested ``hyperparameters`` object lifted beside the others
    (opda's language-model tables nest them; a key on both levels keeps the outer value)."""
    nested = row.get("hyperparameters")
    if not isinstance(nested, dict):
        return row
    return {**nested, **{k: v for k, v in row.items() if k != "hyperparameters"}}


def _number(value: Any) -> float | None:
    """``value`` as a finite float; None for null, NaN, infinity or anything not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _shown(value: Any) -> str:
    """A value that is not a number, as an error names it: a number written as a string
    ("64", as a CSV converted to JSON holds it) is said to be one."""
    if isinstance(value, str):
        try:
            finite = math.isfinite(float(value))
        except ValueError:
            finite = False
        if finite:
            return f"the string {value!r:.40} (write numbers without quotes)"
    return f"{value!r:.40}"


def _merge_sets(row: dict[str, Any], where: str, key: str = "") -> dict[str, Any]:
    """``row`` with opda's ``learning_curves`` by validation set (its fine-tuning tables: each
    set a list of [step, accuracy] pairs) merged into one ``learning_curve``: an entry a
    step, holding each set's accuracy under the set's name; where ``key`` names one of the
    row's sets, only at the steps that set has (another set's evaluation without it is no
    evaluation of the replayed metric). A row with a ``learning_curve`` is left as it is."""
    sets = row.get("learning_curves")
    if "learning_curve" in row or sets is None:
        return row
    if not isinstance(sets, dict) or not sets:
        raise TableError(f"{where}: learning_curves must map each validation set's name to "
                         "its [step, accuracy] pairs")
    merged: dict[float, dict[str, Any]] = {}
    for name, pairs in sets.items():
        if not isinstance(pairs, list):
            raise TableError(f"{where}: learning_curves[{name!r}] must be a list of "
                             "[step, accuracy] pairs")
        for k, pair in enumerate(pairs):
            step = _number(pair[0]) if isinstance(pair, list | tuple) and len(pair) == 2 \
                else None
            if step is None or step < 0:
                raise TableError(f"{where}: learning_curves[{name!r}] entry {k + 1} is "
                                 f"{pair!r:.60}; each is a [step, accuracy] pair, the step "
                                 "the updates done (a number >= 0)")
            merged.setdefault(step, {"step": pair[0]})[str(name)] = pair[1]
    rest = {k: v for k, v in row.items() if k != "learning_curves"}
    return {**rest, "learning_curve": [merged[s] for s in sorted(merged)
                                       if key not in sets or key in merged[s]]}


def _opda_run(row: dict[str, Any], key: str, where: str, length: str = "epochs",
              offset: int | None = None, falls: bool = False,
              per_unit: float | None = None, counter: str | None = None,
              percent: bool = False) -> Run:
    """One run of an opda table: ``key`` the metric's entry key, ``length`` the key of the
    schedule's length (``_OPDA_LENGTHS``); ``offset``: what to add to an entry's count to get
    the units done (None: the layout's own, 1 for opda's 0-indexed epochs); ``falls``: the
    metric falls (a loss: 0 or more, any size), else it is an accuracy (0 to 1).
    ``per_unit``: where the table records no time, the clock is the units done times this
    (a step's examples; 1: the units themselves), or, given ``counter``, each entry's count of
    the data trained on so far (``tokens``); an evaluation at 0 is left out. ``percent``: the
    accuracy is recorded in percent (0 to 100, ``_in_percent``), read as a share."""
    curve = row["learning_curve"]
    if not isinstance(curve, list):
        raise TableError(f"{where}: learning_curve must be a list of evaluations")
    place, own = next((i, o) for n, i, o in _OPDA_LENGTHS if n == length)
    offset = own if offset is None else offset
    times, values, done, losses = [], [], [], []
    broke = False      # a metric of null or NaN: the run blew up there (its later entries too)
    for i, p in enumerate(curve):
        clock = place if per_unit is not None else next(
            (k for k in _OPDA_TIMES if isinstance(p, dict) and _number(p.get(k)) is not None),
            None)
        if not isinstance(p, dict) or clock is None:
            raise TableError(f"{where}: each learning_curve entry needs time (or "
                             f"eval_end_time) and {key} numbers (entry {i + 1} has "
                             f"{p!r:.80})")
        if key not in p:
            held = ", ".join(k for k in p if k not in _OPDA_TIMES)
            raise TableError(f"{where}: learning_curve entry {i + 1} has no {key} (it holds "
                             f"{held}); give --metric one of its accuracies")
        value = _number(p[key])
        if value is not None and falls and value < 0:
            raise TableError(f"{where}: learning_curve entry {i + 1}: {key} is {value:g}; a "
                             "metric that falls (--mode min: a loss) is 0 or more")
        if value is not None and not falls and percent and not 0 <= value <= 100:
            raise TableError(f"{where}: learning_curve entry {i + 1}: {key} is {value:g}; the "
                             "table records it in percent (most of its values are above 1), "
                             "from 0 to 100 (for a metric that falls, a loss, give --mode "
                             "min)")
        if value is not None and not falls and not percent and not 0 <= value <= 1:
            raise TableError(f"{where}: learning_curve entry {i + 1}: {key} is {value:g}; the "
                             "target's metric is an accuracy, a share from 0 to 1 (or a "
                             "percentage from 0 to 100 in every run; for a loss give --mode "
                             "min)")
        if value is not None and percent:
            value /= 100.0
        if value is None:
            if p[key] is not None and not (isinstance(p[key], float) and math.isnan(p[key])):
                raise TableError(f"{where}: learning_curve entry {i + 1}: {key} must be a "
                                 f"number, null or NaN, not {_shown(p[key])}")
            broke = True
            break
        at = _number(p.get(place))
        if at is None and per_unit is not None:
            raise TableError(f"{where}: learning_curve entry {i + 1} has neither time (or "
                             f"eval_end_time) nor {place}: a replay needs when each "
                             f"evaluation was taken, the seconds since the run began or the "
                             f"{place}s done")
        if at is None and offset == 0:
            raise TableError(f"{where}: learning_curve entry {i + 1} lacks {place}, the "
                             f"{place}s done when it was taken (the run plans {length})")
        units = (at if at is not None else i) + offset
        clock_s = (float(p[counter]) if counter else units * per_unit) \
            if per_unit is not None else float(p[clock])
        if per_unit is not None and (units <= 0 or clock_s <= 0):
            continue                  # before any training: nothing to reach it with
        if clock_s <= 0:
            raise TableError(f"{where}: learning_curve entry {i + 1}: {clock} is "
                             f"{p[clock]!r:.40}; it is the seconds since the run began, when "
                             "the evaluation's result was known: a positive number")
        times.append(clock_s)
        values.append(value)
        done.append(units)
        loss = p.get("train_loss", p.get("train_raw_loss"))  # NaN kept: the pruner stops it
        losses.append(float(loss) if isinstance(loss, int | float)
                      and not isinstance(loss, bool) else None)
    if per_unit is None and times and times[0] > _TIMESTAMP_S:
        raise TableError(f"{where}: learning_curve entry 1 is at {times[0]:.4g} s "
                         f"({times[0] / (365.25 * 86400):.0f} years): a clock's timestamp, "
                         "not the seconds since the run began; subtract each run's start time")
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise TableError(f"{where}: learning_curve times must not decrease: each is the "
                         "seconds since the run began (cumulative), not an epoch's own")
    planned = float(row[length])
    diverged = broke or (bool(row.get("nan_train_loss")) and (not done or done[-1] < planned))
    return Run(tuple(times), tuple(values), tuple(done), planned,
               "diverged" if diverged else "planned_epochs", losses=tuple(losses))


def _in_percent(rows: list[dict[str, Any]], key: str) -> bool:
    """Whether a table records its accuracy ``key`` in percent (0 to 100: BLEU, an accuracy
    in %): most of its finite values are above 1. A share table with a stray value above 1
    is not one (that value is refused, by its line)."""
    values = [v for row in rows if isinstance(row.get("learning_curve"), list)
              for p in row["learning_curve"] if isinstance(p, dict)
              for v in (_number(p.get(key)),) if v is not None]
    return 2 * sum(v > 1 for v in values) > len(values)


def _counts_from_one(rows: list[dict[str, Any]]) -> bool:
    """Whether a table's entries number epochs from 1, not from 0 as opda's do: no entry of
    any run is at epoch 0 and some entry is at its run's planned number of epochs (which a
    0-indexed count never reaches)."""
    seen_zero = reaches_end = False
    for row in rows:
        planned = _number(row.get("epochs"))
        curve = row.get("learning_curve")
        for entry in curve if isinstance(curve, list) else []:
            epoch = _number(entry.get("epoch")) if isinstance(entry, dict) else None
            if epoch is None:
                continue
            seen_zero = seen_zero or epoch == 0
            reaches_end = reaches_end or (planned is not None and epoch >= planned)
    return reaches_end and not seen_zero


def _opda_point(row: dict[str, Any], names: list[str]) -> dict[str, Any]:
    point: dict[str, Any] = {}
    for name in names:
        if name == "lr_peak_share":
            point[name] = float(row["lr_peak_epoch"]) / float(row["epochs"])
        elif name not in OPDA_SPACE:
            point[name] = row[name]
        elif isinstance(OPDA_SPACE[name], IntDistribution) or name == "batch_size":
            point[name] = int(row[name])
        else:
            point[name] = float(row[name])
    return point


def _opda_space(points: list[dict[str, Any]], names: list[str]) -> dict[str, BaseDistribution]:
    """The ranges the table's runs cover: a table is searched where it holds runs (a proposal
    outside them would only train the edge run again). opda's parameters keep their scale
    (``OPDA_SPACE``); another number is searched on a log scale where its values look drawn
    that way (``_looks_log``); a string or a flag is a choice among the values seen."""
    space: dict[str, BaseDistribution] = {}
    for name in names:
        values = [p[name] for p in points]
        dist = OPDA_SPACE.get(name)
        if isinstance(dist, CategoricalDistribution) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            space[name] = CategoricalDistribution(sorted(
                set(values), key=lambda v: (0, v, "") if _number(v) is not None else (1, 0,
                                                                                     repr(v))))
            continue
        low, high = min(values), max(values)
        log = dist.log if isinstance(dist, IntDistribution | FloatDistribution) \
            else _looks_log(values)
        if isinstance(dist, IntDistribution) or (dist is None and all(
                isinstance(v, int) for v in values)):
            space[name] = IntDistribution(int(low), int(high), log=log and low > 0)
        else:
            space[name] = FloatDistribution(float(low), float(high), log=log and low > 0)
    return space


def _classes_of(rows: list[dict[str, Any]], path: Path) -> int | None:
    """The number of classes the rows say (``num_classes``, the same in every run that has
    it), or None where none says."""
    values = [row["num_classes"] for row in rows if "num_classes" in row]
    if not values:
        return None
    said = {repr(v) for v in values}
    value = values[0]
    if len(said) > 1 or isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise TableError(f"{path}: num_classes must be one whole number >= 2 in every run that "
                         f"has it, got {', '.join(sorted(said)[:3])}")
    return int(value)


def _looks_log(values: list[float]) -> bool:
    """Whether positive ``values`` sit evenly on a log scale rather than a linear one: their
    median is nearer the middle of the range in log terms than in linear terms (a
    log-uniform draw over 1e-6 - 1e-3 has its median at 0.5 of the log range, 0.03 of the
    linear one; a uniform draw the other way round)."""
    low, high = min(values), max(values)
    if low <= 0 or high / low < 10:
        return False
    med = statistics.median(values)
    linear = (med - low) / (high - low)
    logged = math.log(med / low) / math.log(high / low)
    return abs(logged - 0.5) < abs(linear - 0.5)


# what an opda row holds besides hyperparameters; an id-like key is not searched
_OPDA_OTHER = {"iteration", "nan_train_loss", "learning_curve", "id", "index", "seed", "trial",
               "run", "num_classes", "stop_reason", "hyperparameters", "epochs",
               "total_steps", "total_model_steps", "learning_curves"}


def _opda_extras(rows: list[dict[str, Any]], length: str = "epochs"
                 ) -> tuple[list[str], list[str]]:
    """Hyperparameters a table holds beyond opda's own: keys every run has, numbers or a
    handful of strings or flags. Returns them and notes on the keys left out."""
    known = {length, *_OPDA_PARAMS}
    keys = [k for k in rows[0] if k not in known and k.lower() not in _OPDA_OTHER]
    extras, notes = [], []
    for key in keys:
        if not all(key in row for row in rows):
            continue                                       # noted with opda's own below
        values = [row[key] for row in rows]
        numbers = all(_number(v) is not None for v in values)
        choices = all(isinstance(v, str | bool) for v in values)
        distinct = {repr(v) for v in values}
        if numbers and all(isinstance(v, int) for v in values) and \
                sorted(values) == list(range(min(values), min(values) + len(values))):
            notes.append(f"{key} numbers the runs 1 by 1: not searched")
        elif numbers or (choices and len(distinct) <= 16):
            extras.append(key)
        else:
            notes.append(f"{key} is not a number or one of a few choices in every run: "
                         "not searched")
    return extras, notes


def _opda_clock(rows: list[dict[str, Any]], length: str, path: Path
                ) -> tuple[str, Callable[[dict[str, Any]], float | None], str | None,
                           list[str]]:
    """What a table's clock counts: each evaluation's recorded time (unit ``s``); where no
    evaluation records one, the compute done: the data each entry counts (``tokens``,
    ``examples``), else a step table's examples (steps x its batch size), else the epochs or
    steps themselves. Returns the unit, a run's multiplier of its units done (None: timed),
    the entries' counter key, and the note saying so."""
    timed = any(isinstance(p, dict) and any(_number(p.get(k)) is not None for k in _OPDA_TIMES)
                for row in rows if isinstance(row.get("learning_curve"), list)
                for p in row["learning_curve"])
    if timed:
        return "s", lambda row: None, None, []
    counter = next((c for c in _OPDA_COUNTERS if all(
        isinstance(p, dict) and _number(p.get(c)) is not None
        for row in rows if isinstance(row.get("learning_curve"), list)
        for p in row["learning_curve"])), None)
    batch = next((b for b in _OPDA_BATCHES if any(b in row for row in rows)), None)
    for number, row in enumerate(rows, start=1):
        if batch and not counter and length != "epochs" \
                and (_number(row.get(batch)) or 0) <= 0:
            raise TableError(f"{path}, line {number}: {batch} must be a positive number, "
                             f"not {_shown(row.get(batch))}; with no time recorded, a "
                             "run's compute is its steps x its batch size")
    unit = ("tokens" if counter == "tokens" else "examples") if counter else \
        "epochs" if length == "epochs" else "examples" if batch else "steps"
    counted = {"epochs": "epochs trained (each the same examples)",
               "examples": f"training examples ({counter} at each evaluation)" if counter
               else f"training examples (step x {batch})",
               "tokens": "tokens trained on (tokens at each evaluation)",
               "steps": "training steps (no run says its batch size)"}[unit]
    note = (f"no evaluation records its time: compute is counted in {counted}, and figures "
            f"are in {_SCALES[unit][1]}, not hours (a proxy for time: it leaves out that a "
            "larger batch trains each example faster, and the evaluations' own time)")
    steps_x_batch = batch is not None and not counter and unit == "examples"
    return (unit, lambda row: float(row[batch]) if steps_x_batch else 1.0, counter,
            [note])


def opda(path: Path, target: float | None, metric: str = "top1",
         num_classes: int | None = None, falls: bool = False) -> Table:
    """A table of opda-format runs (``path``); the goal metric ``metric`` >= ``target`` (<=
    where it ``falls``: a loss, ``--mode min``; None: the value the best ``TOP_SHARE`` of its
    runs reach, said in a note).

    Each run needs ``learning_curve`` and its schedule's length: ``epochs`` (opda's image
    tables: each entry's ``epoch`` 0-indexed, its ``time``) or ``total_steps`` (opda's
    language-model tables: each entry's ``step`` and ``eval_end_time``; hyperparameters nested
    under ``hyperparameters``) or ``total_model_steps`` (opda's fine-tuning tables:
    ``learning_curves`` by validation set, each a list of [step, accuracy] pairs, merged by
    ``_merge_sets``; ``top1`` replays the first set). Where no evaluation records a time, the
    clock is the compute done: a step table's training examples (steps x ``batch_size`` or
    ``train_batch_size``), else the epochs or steps themselves (``Table.unit``).
    It is searched over the hyperparameters every run holds: those
    of opda's ConvNeXt search (``batch_size``, ``lr``, ``lr_peak_epoch``, ``momentum``,
    ``weight_decay``, ``label_smoothing``) and any others (``_opda_extras``). ``metric``:
    ``top1``, ``top5`` or the key of another accuracy in the entries (``val_raw_accuracy``).
    A metric of null or NaN ends a run there, as diverged. ``num_classes`` (for chance
    accuracy): given, else the rows' ``num_classes``, else 1000 for top-1 and top-5 (ImageNet's,
    opda's image tables), said in a note; unknown for another metric."""
    flat = [_flat(row) for row in _read_lines(path)]
    first = flat[0].get("learning_curves")
    sets = [str(n) for n in first] if isinstance(first, dict) \
        and "learning_curve" not in flat[0] else []
    notes: list[str] = []
    if sets and metric == "top1" and "top_1" not in sets:
        metric = sets[0]
        notes.append(f"the curves are by validation set ({', '.join(sets)}): replaying "
                     f"{metric}, the first; --metric NAME replays another")
    key = metric_key(metric)
    rows = [_merge_sets(row, f"{path}, line {number}", key)
            for number, row in enumerate(flat, 1)]
    length = next((n for n, _, _ in _OPDA_LENGTHS if n in rows[0]), "epochs")
    for number, row in enumerate(rows, start=1):
        missing = [k for k in (length, "learning_curve") if k not in row]
        if missing:
            raise TableError(f"{path}, line {number}, lacks {', '.join(missing)}; an opda run "
                             "has learning_curve, its schedule's length (epochs, "
                             "total_steps or total_model_steps) and hyperparameters (opda's "
                             "own: "
                             f"{', '.join(_OPDA_PARAMS)}, or any others)")
        for name in (length, *_OPDA_PARAMS):
            if name not in row:
                continue
            value = _number(row[name])
            if name in (length, "batch_size") and (value is None or value <= 0):
                raise TableError(f"{path}, line {number}: {name} must be a positive number, "
                                 f"not {_shown(row[name])}")
            if value is None:
                raise TableError(f"{path}, line {number}: {name} must be a number, not "
                                 f"{_shown(row[name])}")
            if value < 0 or (name == "lr" and value == 0):
                raise TableError(f"{path}, line {number}: {name} is {value:g}; "
                                 f"{_OPDA_RANGES.get(name, 'it cannot be negative')}")
        peak, planned = _number(row.get("lr_peak_epoch")), _number(row.get(length))
        if length == "epochs" and peak is not None and planned and peak > planned:
            raise TableError(f"{path}, line {number}: lr_peak_epoch is {peak:g}, beyond the "
                             f"run's {planned:g} epochs; the warm-up peaks within the schedule "
                             "(0 to epochs)")
    held = [k for k in _OPDA_PARAMS if all(k in row for row in rows)]
    extras, extra_notes = _opda_extras(rows, length)
    notes += extra_notes
    # the warm-up's end as a share of the schedule where both count epochs; a step table's
    # lr_peak_epoch is searched as the number it is
    names = [length, *("lr_peak_share" if k == "lr_peak_epoch" and length == "epochs" else k
                       for k in held), *extras]
    if length != "epochs" and "num_train_epochs" in extras:
        # the steps follow from the epochs and the batch size: searching both would only let
        # a proposal ask for steps its epochs do not have
        names.remove(length)
        notes.append(f"{length} follows from num_train_epochs and the batch size: not "
                     "searched")
    unit, per_unit, counter, clock_note = _opda_clock(rows, length, path)
    notes += clock_note
    points = [_opda_point(row, names) for row in rows]
    offset = None
    if length == "epochs" and _counts_from_one(rows):
        offset = 0
        notes.append("the entries count epochs from 1 (no entry at epoch 0, and some at a "
                     "run's last epoch): read as epochs done")
    percent = not falls and _in_percent(rows, key)
    if percent:
        notes.append(f"{metric} is recorded in percent (0 to 100): read as a share (/100), "
                     "and so is every figure; --target may be given either way")
    if target is not None and not falls and target > 1:
        if not percent:
            raise TableError(f"--target {target:g} is above 1, but {metric} in {path} is a "
                             "share from 0 to 1: give the target as one (0.7 for 70%)")
        target /= 100.0
    runs = [_opda_run(row, key, f"{path}, line {number}", length, offset, falls,
                      per_unit(row), counter, percent)
            for number, row in enumerate(rows, start=1)]
    fixed = [n for n in names if len({repr(p[n]) for p in points}) < 2]
    if fixed and len(fixed) == len(names):
        raise TableError(f"{path}: every run has the same hyperparameters; a table to search "
                         "needs runs that differ")
    notes += [f"{n} is {points[0][n]!r} in every run: not searched" for n in fixed]
    names = [n for n in names if n not in fixed]
    points = [{n: p[n] for n in names} for p in points]
    space = _opda_space(points, names)
    zeros = {n: sum(p[n] <= 0 for p in points) for n, d in space.items()
             if isinstance(d, FloatDistribution | IntDistribution) and not d.log
             and getattr(OPDA_SPACE.get(n), "log", False)}
    notes += [f"{n} is 0 in {k} run{'s' * (k != 1)}: searched on a linear scale (a log scale "
              "needs positive values)" for n, k in zeros.items()]
    notes += [f"{k} is not in every run: searched without it"
              for k in {k: None for row in rows for k in row}
              if k not in held and k.lower() not in _OPDA_OTHER
              and not all(k in row for row in rows)]
    searched = [e for e in extras if e in names]
    if searched:
        notes.append(f"searched besides opda's own hyperparameters: {', '.join(searched)}")
    if num_classes is None:
        num_classes = _classes_of(rows, path)
        if num_classes is None and metric in ("top1", "top5"):
            num_classes = 1000
            notes.append("1,000 classes assumed (ImageNet's) for chance accuracy; give "
                         "--num-classes for another data set")
        elif num_classes is None and not falls:
            notes.append(f"chance accuracy of {metric} unknown: the at-chance rules are off "
                         "(give --num-classes to set it)")
    # A run whose loss went NaN before its first evaluation: it cost about half an epoch.
    firsts = [r.times[0] for r in runs if r.times]
    if not firsts:
        raise TableError(f"{path}: no run has an evaluation")
    half_epoch = 0.5 * statistics.median(firsts)
    runs = [r if r.times else Run((), (), (), r.planned_epochs, "diverged", end_s=half_epoch)
            for r in runs]
    if target is None:
        target = top_share_target(runs, falls)
        notes.append(f"target {target:.4g}: the best {metric} the top {100 * TOP_SHARE:g}% of "
                     f"the {len(runs)} runs reach (give --target for another)")
    for i, r in enumerate(runs):
        if r.end == "diverged" and r.times:
            gap = r.times[-1] / max(len(r.times), 1)
            runs[i] = Run(r.times, r.values, r.epochs, r.planned_epochs, "diverged",
                          end_s=r.times[-1] + 0.5 * gap, losses=r.losses)
    return Table(f"opda:{path.name}", target, runs, space, _nearest(space, points, runs),
                 num_classes=num_classes, metric="top5" if metric == "top5" else "top1",
                 metric_name="" if metric in ("top1", "top5") else metric, notes=notes,
                 falls=falls, unit=unit,
                 credit="in opda's format (Lourie et al., arXiv 2311.09480); credit whoever "
                        "recorded it (opda's own ConvNeXt-tiny curves: CC BY-SA 4.0)")


# -- autotune's own recorded tables --------------------------------------------------------------
def autotune_table(path: Path, target: float = 0.97, world_size: int = 2) -> Table:
    """A table recorded by ``benchmarks/search_efficiency.py record`` (quickstart study)."""
    from ..space import load_space

    rows = _read_lines(path)
    space = load_space("quickstart", world_size=world_size)
    runs, points = [], []
    for number, row in enumerate(rows, start=1):
        try:
            curve, params = row["curve"], row["params"]
            planned = float(row["epochs"])
            runs.append(Run(tuple(float(p[0]) for p in curve), tuple(float(p[1]) for p in curve),
                            tuple(float(p[3]) * planned for p in curve), planned,
                            "diverged" if row.get("end_reason") == "diverged"
                            else "planned_epochs", end_s=float(row["elapsed_s"]),
                            losses=tuple(p[4] if len(p) > 4 else None for p in curve),
                            overhead_s=float(row.get("overhead_s", 0.0)),
                            launch_s=float(row.get("launch_s", 0.0))
                            if row.get("warm_ranks") else 0.0))
            points.append(params)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            if isinstance(row, dict) and ("learning_curve" in row or "learning_curves" in row):
                raise TableError(f"{path} holds opda-format runs (learning_curve), not rows "
                                 f"`record` wrote: give --table opda:{path}") from None
            raise TableError(f"{path}, line {number}, is not a recorded autotune row "
                             f"({type(e).__name__}: {e}); an opda-format table is given as "
                             "opda:PATH, a YAHPO one as yahpo-lcbench:INSTANCE") from None

    def features(p: dict[str, Any]) -> list[float]:
        return [math.log2(p["global_batch"]) / 5, math.log10(p["lr_per_256"]) / 2.3,
                p["warmup_epochs"] / 2, p["label_smoothing"] / 0.2, (p["epochs"] - 3) / 9]

    def train(params: dict[str, Any]) -> Run:
        f = features(params)
        return runs[min(range(len(points)), key=lambda i: math.dist(f, features(points[i]))
                        + (0.0 if points[i]["decay"] == params["decay"] else 0.5))]

    return Table(f"autotune:{path.name}", target, runs, {}, train, num_classes=10,
                 sample=space.sample)


# -- YAHPO Gym LCBench -------------------------------------------------------------------------
def increasing(times: Sequence[float]) -> tuple[float, ...]:
    """Cumulative epoch times, repaired where a surrogate's prediction dips below an earlier
    epoch's (each epoch's time is predicted on its own): a real epoch takes time, so the
    epochs between two record highs share the time between them evenly, and epochs after the
    last record high go on at the run's average pace up to it. Keeping the running maximum
    instead would leave flat stretches, several evaluations at one second: a run that looks
    as if it reached its target in no time (on LCBench's smaller tasks half the runs have
    one)."""
    out = [float(t) for t in times]
    highs, top = [], -math.inf
    for i, t in enumerate(out):
        if t > top:
            highs.append(i)
            top = t
    for a, b in zip(highs, highs[1:], strict=False):
        for i in range(a + 1, b):
            out[i] = out[a] + (out[b] - out[a]) * (i - a) / (b - a)
    if highs:
        last = highs[-1]
        pace = out[last] / (last + 1)
        for i in range(last + 1, len(out)):
            out[i] = out[last] + pace * (i - last)
    return tuple(out)


# The LCBench surrogate's validation metrics a replay may target: its name there, whether it
# falls (a loss), and what it is divided by to be a share (its accuracy is in percent, its
# balanced accuracy a share already).
_YAHPO_METRICS = {"top1": ("val_accuracy", False, 100.0),
                  "val_balanced_accuracy": ("val_balanced_accuracy", False, 1.0),
                  "val_cross_entropy": ("val_cross_entropy", True, 1.0)}


def yahpo_lcbench(instance: str, data_path: Path, target: float | None = None,
                  top_share: float = 0.02, sample_size: int = 2000, seed: int = 0,
                  metric: str = "top1") -> Table:
    """The LCBench surrogate for OpenML task ``instance`` (``data_path`` holds YAHPO's
    ``lcbench`` folder). Without ``target``, the target is the validation accuracy the best
    ``top_share`` of ``sample_size`` random configurations reach by their last epoch.
    ``metric``: ``top1`` (the validation accuracy), ``val_balanced_accuracy`` or
    ``val_cross_entropy`` (the validation loss, which falls: its target is the least value
    that share reaches)."""
    name, falls, per_share = _YAHPO_METRICS[metric]
    try:
        from yahpo_gym import BenchmarkSet, local_config
    except ImportError:
        raise TableError("yahpo-lcbench tables need the yahpo-gym package: "
                         "pip install yahpo-gym") from None
    if not (data_path / "lcbench" / "model.onnx").is_file():
        raise TableError(f"no YAHPO LCBench surrogate under {data_path} (expected "
                         f"{data_path / 'lcbench' / 'model.onnx'})")
    # yahpo-gym keeps its settings in one file under the home folder: processes that load a
    # table at once (compare's pool) take turns writing it
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "autotune-yahpo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        local_config.init_config()
        local_config.set_data_path(str(data_path))
        bench = BenchmarkSet("lcbench", check=False)
    if instance not in bench.instances:
        ids = sorted(bench.instances, key=lambda i: (len(i), i))   # by number where numeric
        raise TableError(f"LCBench has no instance {instance!r}; its {len(ids)} are "
                         f"{', '.join(ids)}")
    bench.set_instance(instance)
    cs = bench.get_opt_space(drop_fidelity_params=True)
    space: dict[str, BaseDistribution] = {}
    for hp in cs.values():
        if hp.name == "OpenML_task_id":
            continue
        if hasattr(hp, "choices"):
            space[hp.name] = CategoricalDistribution(list(hp.choices))
        elif type(hp).__name__.startswith("Integer"):
            space[hp.name] = IntDistribution(int(hp.lower), int(hp.upper), log=bool(hp.log))
        else:
            space[hp.name] = FloatDistribution(float(hp.lower), float(hp.upper),
                                               log=bool(hp.log))
    epochs = 52
    cache: dict[tuple[Any, ...], Run] = {}

    def train(params: dict[str, Any]) -> Run:
        key = tuple(sorted(params.items()))
        if key not in cache:
            queries = [{**params, "OpenML_task_id": instance, "epoch": e}
                       for e in range(1, epochs + 1)]
            out = bench.objective_function(queries)
            times = tuple(float(o["time"]) for o in out)
            values = tuple(max(float(o[name]), 0.0) if falls else
                           min(max(float(o[name]) / per_share, 0.0), 1.0) for o in out)
            cache[key] = Run(increasing(times), values,
                             tuple(float(e) for e in range(1, epochs + 1)), float(epochs))
        return cache[key]

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    runs = []
    for _ in range(sample_size):
        trial = study.ask()
        runs.append(train({n: trial._suggest(n, d) for n, d in space.items()}))
        study.tell(trial, 0.0)
    notes = []
    if target is None:
        target = top_share_target(runs, falls, top_share)
        notes.append(f"target {target:.4f}: the best {name} the top {100 * top_share:g}% of "
                     f"{sample_size} random configurations reach")
    return Table(f"yahpo-lcbench:{instance}", float(target), runs, space, train,
                 num_classes=None, metric="top1", falls=falls,
                 metric_name="" if metric == "top1" else metric,
                 credit="YAHPO Gym LCBench surrogate (Pfisterer et al., arXiv 2109.03670; "
                        "Apache-2.0)", notes=notes)


def load_table(spec: str, target: float | None = None, *, metric: str = "top1",
               yahpo_data: Path | None = None, num_classes: int | None = None,
               mode: str = "max") -> Table:
    """``spec``: ``opda:PATH``, ``yahpo-lcbench:INSTANCE``, ``autotune:PATH`` or a bare path
    (an autotune-recorded table). ``metric``: ``top1``, or ``top5`` (opda tables only: their
    curves hold ``top_5``; DAWNBench's metric). ``num_classes``: the classes of an opda
    table's data set (chance accuracy; default: what its rows say, else 1000). ``mode``:
    max (an accuracy, reached at or above ``target``) or min (a metric that falls, a loss,
    reached at or below it; opda tables' own metrics only)."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("opda", "yahpo-lcbench", "autotune"):
        if sep and len(kind) > 1 and not Path(spec).exists():   # C:\... is a path
            raise TableError(f"unknown table kind {kind!r} in {spec!r}: give opda:PATH, "
                             "yahpo-lcbench:INSTANCE, autotune:PATH or the path of a table "
                             "that `record` wrote")
        kind, rest = "autotune", spec
    if kind == "yahpo-lcbench" and metric not in _YAHPO_METRICS:
        raise TableError(f"--metric {metric}: a yahpo-lcbench table replays top1 (the "
                         "validation accuracy), val_balanced_accuracy, or val_cross_entropy "
                         "(with --mode min)")
    if kind == "autotune" and metric != "top1":
        raise TableError(f"--metric {metric} needs an opda table (its curves hold top_5 and "
                         f"may hold others); {spec} has one accuracy: leave --metric at top1")
    if mode not in ("max", "min"):
        raise TableError(f"--mode must be max (an accuracy) or min (a metric that falls, a "
                         f"loss), got {mode!r}")
    if mode == "min" and (kind == "autotune" or metric in ("top1", "top5")):
        raise TableError(f"--mode min is for a metric that falls in an opda table's curves "
                         f"(--metric val_loss, say) or LCBench's val_cross_entropy; {metric} "
                         f"of {spec} is an accuracy")
    if mode == "max" and falling_name(metric):
        raise TableError(f"--metric {metric} is a metric that falls (a loss, an error rate); "
                         "give --mode min")
    if not metric or not all(c.isalnum() or c in "_-." for c in metric):
        raise TableError(f"--metric must be top1, top5 or the name of an accuracy in an opda "
                         f"table's learning curves, got {metric!r}")
    if num_classes is not None and kind != "opda":
        raise TableError(f"--num-classes is for opda tables; {spec} knows its own classes "
                         "(or has none to give): leave it out")
    if num_classes is not None and num_classes < 2:
        raise TableError(f"--num-classes must be at least 2, got {num_classes}")
    if mode == "max" and target is not None and target > 1 and kind != "opda":
        # a share's target given in percent: LCBench records its accuracy so
        if kind == "autotune" or _YAHPO_METRICS[metric][2] != 100.0:
            raise TableError(f"--target {target:g} is above 1, but {metric} of {spec} is a "
                             "share from 0 to 1: give the target as one (0.7 for 70%)")
        target /= 100.0
    if kind == "opda":
        return opda(Path(rest).expanduser(), target, metric, num_classes, mode == "min")
    if kind == "yahpo-lcbench":
        data = yahpo_data or Path(__file__).resolve().parents[3] / "shared" / "external" \
            / "yahpo-lcbench"
        return yahpo_lcbench(rest, data, target, metric=metric)
    return autotune_table(Path(rest).expanduser(), 0.97 if target is None else target)
