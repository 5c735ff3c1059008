"""Search efficiency: how much compute each tuner spends to find a fast configuration.

    python benchmarks/search_efficiency.py record [--n 60] [--max-seconds 60] [--resume] [--out F]
    python benchmarks/search_efficiency.py compare [--table T] [--target A]
        [--metric top1|top5|KEY] [--mode max|min] [--num-classes C] [--workers N]
        [--seeds 200] [--jobs N] [--methods M,...] [--goals 1.5,1.25]
    python benchmarks/search_efficiency.py paper [--instances 167168,189873,189906]
    python benchmarks/search_efficiency.py live [--seeds 3] [--budget 300] [--table F]
    python benchmarks/search_efficiency.py breakdown [--seeds 20] [--table T] [--target A]
        [--metric top1|top5|KEY] [--mode max|min] [--num-classes C]

``record`` trains a random sample of quickstart configurations for real (the deepspeed
launcher, 2 CPU ranks kept warm between configurations as a worker keeps them, digits, the
quickstart study's trainer settings: evaluations every 2 s), each over its whole planned
length with no pruning, and stores every learning curve
(accuracy against elapsed seconds at each evaluation) in
``benchmarks/data/quickstart_curves.jsonl`` (or ``--out``). Each row also carries the
machine's plain ResNet-18 speed (``machine_img_s``, which ``compare`` prints): this kind of
machine has run three times faster on some days than on others, and a table is comparable
only with itself. ``--resume`` keeps what an interrupted recording of the same sample wrote.
The committed tables: ``quickstart_curves.jsonl`` (the default: 60 configurations, sample
seed 8, recorded at 669 img/s, this machine's speed on a normal day),
``quickstart_curves_205img_s.jsonl`` (48 configurations, seed 7, at 205 img/s) and
``quickstart_curves_per_epoch.jsonl`` (60 configurations, one evaluation an epoch and a
launch at every trial, recorded before ``record`` took the study's settings).

``compare`` replays studies of each method on a table (``--table``: an opda-format file,
a YAHPO LCBench instance, or a table ``record`` wrote), one worker or ``--workers N``
asynchronous ones, through ``autotune.replay`` (autotune's method makes the worker's own
decisions, ``autotune.decisions``). Methods: autotune, random search, Optuna's TPE with
MedianPruner, SuccessiveHalving or Hyperband, ASHA on epochs (random + SuccessiveHalving),
ASHA on wall-clock rungs as Ray Tune runs it, DEHB, TPE without pruning (BENCHMARKS.md says
how each is set up). Metric: compute until a goal configuration (TTA within ``--goals``
factors of the table's best, 1.5 and 1.25 by default) has reached its target: median (a study
that never found one counts as infinite), p25 - p75, the share that never found one within
150 trials (or 30 x the best TTA of compute, if later), and the best TTA within 20 x the best
TTA of compute. Before the methods it prints what the table asks of any tuner: the share of
uniform proposals that train a goal configuration, and the median compute to the goal with
such proposals and an oracle pruner that stops every other trial at its first evaluation
(``autotune.replay.uniform_bound``). The last line: ``autotune_median_h=X random_ratio=R
best_baseline=NAME best_baseline_ratio=B``, each ratio a method's median over autotune's.

``paper`` runs random search, Hyperband and TPE + MedianPruner under the YAHPO Gym paper's
own protocol (best validation accuracy within 6,544 epochs) beside its published regrets: the
harness's check. ``breakdown`` shows where autotune's compute goes by how trials ended.
``live`` runs real quickstart studies beside the replay's prediction.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import io
import json
import math
import multiprocessing
import os
import random
import signal
import statistics
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from autotune.errors import path_refused  # noqa: E402
from autotune.replay import (  # noqa: E402
    METHODS,
    Outcome,
    Replay,
    Table,
    TableError,
    load_table,
    sh_budgets,
    uniform_bound,
)
from autotune.space import InfeasiblePoint, SearchSpace, load_space  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "quickstart_curves.jsonl"
# External data is read where it lies, never copied into the repository.
EXTERNAL = Path(os.environ.get("AUTOTUNE_EXTERNAL_DATA",
                               ROOT.parent / "shared" / "external")).expanduser()
# The surrogate's folder: --yahpo-data, which the pool's workers (spawned, so they import this
# module afresh) read back from the environment.
YAHPO_DATA = Path(os.environ.get("AUTOTUNE_YAHPO_DATA") or EXTERNAL / "yahpo-lcbench")
TARGET = 0.97
WORLD = 2
BUDGET_S = 300.0            # the live check's seconds per study
_J = TypeVar("_J")
_R = TypeVar("_R")
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore")


# -- record -------------------------------------------------------------------------------------
def _sample_configs(space: SearchSpace, n: int, seed: int) -> list[dict[str, Any]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    configs: list[dict[str, Any]] = []
    while len(configs) < n:
        trial = study.ask()
        try:
            configs.append(space.sample(trial))
            study.tell(trial, 0.0)
        except InfeasiblePoint:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return configs


def _plan(params: dict[str, Any], max_seconds: float) -> dict[str, Any]:
    from autotune.config import load as load_config
    from autotune.plan import Hardware, resolve

    trainer = load_config("quickstart").trainer  # the trainer as the quickstart runs it,
    #                                              evaluations every eval_every_s included
    return resolve(params, trainer=trainer.__dict__, train_size=1437,
                   hardware=Hardware(world_size=WORLD, max_micro_batch=trainer.max_micro_batch),
                   target={"metric": "top1", "value": 1.01}, max_seconds=max_seconds)


def _row(params: dict[str, Any], plan: dict[str, Any], messages: list[dict[str, Any]],
         wall: float) -> dict[str, Any]:
    """A recorded row: the curve, when it reached the target, and what the trial paid besides
    its training clock (``overhead_s``)."""
    curve = [[round(m["elapsed_s"], 3), m["top1"], m["top5"], round(m["epoch"] / plan["epochs"],
             4), m["loss"]] for m in messages if m["type"] == "eval"]
    end = next((m for m in messages if m["type"] == "end"), {})
    begun = next((m for m in messages if m["type"] == "start"), {})
    reached = next((row[0] for row in curve if row[1] >= TARGET), None)
    elapsed = float(end.get("elapsed_s", curve[-1][0] if curve else 0.0))
    return {"params": params, "curve": curve, "reached_at": reached, "end_reason": end.get(
        "reason", "crashed"), "elapsed_s": elapsed, "overhead_s": round(wall - elapsed, 3),
        "epochs": plan["epochs"], "ranks_trial": begun.get("served")}


def machine_speed() -> float:
    """This machine's plain PyTorch ResNet-18 training speed, images/s (32x32, batch 128, the
    trainer-throughput benchmark's baseline loop), so a table says how fast its machine was."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trainer_throughput import PlainLoop

    loop = PlainLoop("resnet18", 32, 128)
    return statistics.median(loop.window(5) for _ in range(3))


def rows_to_keep(partial: Path, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of an interrupted recording that ``--resume`` keeps: they must be the first
    configurations of the same sample, in order."""
    lines = [line for line in partial.read_text().splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise SystemExit(f"{partial}, line {number}, is not a recorded row; delete the "
                                 "file and run record again to start afresh") from None
            # the last row, cut off by the interruption: it is recorded again
    if len(rows) > len(configs) or any(r["params"] != c for r, c in zip(rows, configs,
                                                                      strict=False)):
        raise SystemExit(f"{partial} holds configurations other than this sample's first "
                         f"{len(rows)} (another --n or --seed?); run record again without "
                         "--resume to start afresh")
    return rows


def record(n: int, max_seconds: float, seed: int, resume: bool = False,
           out: Path | None = None) -> None:
    path = out or DATA
    if path.is_dir():
        raise SystemExit(f"--out {path} is a folder; give the table's file name, e.g. "
                         f"{path / 'quickstart_curves.jsonl'}")
    space = load_space("quickstart", world_size=WORLD)
    configs = _sample_configs(space, n, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    if tmp.is_file() and not resume:
        raise SystemExit(f"an interrupted recording is at {tmp}; pass --resume to go on with "
                         "it, or delete it to start afresh")
    rows = rows_to_keep(tmp, configs) if resume and tmp.is_file() else []
    speed = machine_speed()
    print(f"this machine: plain ResNet-18 {speed:.0f} img/s; {len(rows)} of {n} "
          "configurations already recorded", flush=True)
    # The first launch on a machine builds DeepSpeed's shared-memory op (a minute): not a
    # trial's start-up, so it happens here, unrecorded.
    from autotune.ranks import run_plan, serve_plans

    folder = Path("/tmp/autotune-record")
    run_plan(_plan(configs[0], 2.0), folder / "warm-up", timeout_s=300)
    todo = configs[len(rows):]
    # As a worker runs them: in warm trainer ranks. The first plan, a short one, measures the
    # ranks' launch, which a replayed study pays once.
    plans = [_plan(configs[0], 2.0), *(_plan(p, max_seconds) for p in todo)]
    served = serve_plans(plans, folder / "ranks", timeout_s=max_seconds * 3 + 240)
    launch_s = _row(configs[0], plans[0], *next(served))["overhead_s"]
    print(f"launch of the trainer ranks: {launch_s:.1f} s", flush=True)
    with tmp.open("w") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
        for i, (params, plan, (messages, wall)) in enumerate(
                zip(todo, plans[1:], served, strict=False), start=len(rows)):
            row = {**_row(params, plan, messages, wall), "warm_ranks": True,
                   "launch_s": launch_s, "machine_img_s": round(speed, 1)}
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(f"[{i + 1}/{n}] {params} -> reached_at={row['reached_at']} "
                  f"elapsed={row['elapsed_s']:.1f}s overhead={row['overhead_s']:.1f}s",
                  flush=True)
        served.close()
    tmp.replace(path)
    print(f"recorded {n} configurations in {path}")


# -- replay -------------------------------------------------------------------------------------
_TABLES: dict[tuple[str, float | None, str, int | None, str], Table] = {}


def table_of(spec: str, target: float | None, metric: str = "top1",
             num_classes: int | None = None, mode: str = "max") -> Table:
    """The table ``spec`` names (opda:PATH, yahpo-lcbench:INSTANCE, autotune:PATH or a path),
    loaded once a process."""
    key = (spec, target, metric, num_classes, mode)
    if key not in _TABLES:
        with contextlib.redirect_stdout(io.StringIO()):   # yahpo-gym prints a citation
            try:
                table = load_table(spec, target, metric=metric, yahpo_data=YAHPO_DATA,
                                   num_classes=num_classes, mode=mode)
                _ = table.best_tta            # a target no run reaches: said now, in one line
                _TABLES[key] = table
            except TableError as e:
                raise SystemExit(str(e)) from None
    return _TABLES[key]


def _quiet_on_interrupt() -> None:
    """A pool worker's start: Ctrl-C ends it silently (the terminal sends it to every process
    of the command; the main process alone says so, in one line)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Pool:
    """A process per core, replaying studies; interrupted, it ends at once and quietly."""

    def __init__(self, jobs: int | None) -> None:
        # Worker processes started fresh (spawn), not forked: a fork copies the caller's
        # threads' locks held mid-operation (a test runner's, a tracking client's) and its
        # child can wait on them forever; and a worker that dies breaks the pool at once
        # instead of hanging it.
        self._executor = ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1,
                                             mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_quiet_on_interrupt)

    def map(self, fn: Callable[[_J], _R], jobs: Iterable[_J]) -> list[_R]:
        """``fn`` of every job, in order. Unlike the executor's own ``map``, an interrupt or
        a broken pool cancels nothing here: a future cancelled while the executor marks it
        failed (its workers ended by the same Ctrl-C) makes the executor's thread print a
        traceback (Python 3.11); ``stop`` ends the studies instead. A study's own error
        cancels the studies not started, so the error is not held back until they ran."""
        futures = [self._executor.submit(fn, job) for job in jobs]
        try:
            return [f.result() for f in futures]
        except (KeyboardInterrupt, BrokenProcessPool):
            raise       # the executor fails every study left itself (after ``stop``)
        except BaseException:
            for f in futures:      # a study's own error: the rest are not waited for
                f.cancel()
            raise

    def stop(self) -> None:
        """End the workers now: the executor then marks every study not done as failed, and
        its thread ends."""
        for child in multiprocessing.active_children():
            child.terminate()
        self._executor.shutdown(wait=True)


@contextlib.contextmanager
def _pool(jobs: int | None) -> Iterator[_Pool]:
    """Interrupted, the pool drops the studies not yet done instead of replaying them all
    before the interrupt reaches the user; any other error waits for the running studies, as
    the executor's own exit does."""
    pool = _Pool(jobs)
    try:
        yield pool
    except KeyboardInterrupt:
        pool.stop()
        raise
    finally:
        pool._executor.shutdown(wait=True)


def _replay_outcome(job: tuple[str, float | None, str, int, int, tuple[float, ...], str,
                               int | None, str]) -> Outcome:
    """One replayed study (in a pool worker)."""
    spec, target, method, seed, workers, goals, metric, classes, mode = job
    return Replay(table_of(spec, target, metric, classes, mode), method, seed, workers=workers,
                  goals=goals).run()


def _tta(table: Table, value: float) -> str:
    """A TTA as compare shows it: seconds on a timed table, else the table's own unit."""
    return f"{value:.5g} s" if table.unit == "s" else table.amount(value, 5)


def compare(seeds: int, spec: str = str(DATA), target: float | None = None,
            jobs: int | None = None, workers: int = 1,
            methods: tuple[str, ...] = METHODS, goals: tuple[float, ...] = (1.5, 1.25),
            metric: str = "top1", num_classes: int | None = None, mode: str = "max") -> None:
    table = table_of(spec, target, metric, num_classes, mode)
    best = table.best_tta
    reaching = [r.reached_at(table.target, table.falls) for r in table.runs]
    print(f"table {table.name}: {len(table.runs)} runs, "
          f"{sum(t is not None for t in reaching)} reach {table.shown} "
          f"{'<=' if table.falls else '>='} "
          f"{table.target:.4g}; best TTA {_tta(table, best)}; goals TTA <= "
          + ", ".join(f"{g} x best ({sum(t is not None and t <= g * best for t in reaching)}"
                      " runs)" for g in goals)
          + f"; {workers} worker{'s' if workers > 1 else ''}, {seeds} studies a method")
    if "dehb" in methods and not table.space:
        methods = tuple(m for m in methods if m != "dehb")
        print("  (DEHB left out: this table's search space has derived parameters and "
              "constraints, which DEHB's configuration space does not take)")
    for note in table.notes:
        print(f"  {note}")
    if table.credit:
        print(f"  data: {table.credit}")
    draws = 10_000
    bound = uniform_bound(table, goals[0], draws=draws)
    if bound is None:
        print(f"  what any tuner is up against: none of {draws:,} uniform proposals trains a "
              f"{goals[0]} x goal configuration")
    else:
        print(f"  what any tuner is up against: {100 * bound.hit_share:.2f}% of uniform "
              f"proposals train a {goals[0]} x goal configuration, so 150 of them hold none "
              f"in {100 * bound.miss_share:.1f}% of studies; with such proposals and an oracle "
              f"pruner (every other trial stopped at its first evaluation) the goal takes "
              f"{table.amount(bound.median_s)} median (p25 {table.amount(bound.p25_s)}, p75 "
              f"{table.amount(bound.p75_s)})")
    spent_by: dict[str, list[float]] = {}
    divisor, label, key = table.scale
    with _pool(jobs) as pool:
        for method in methods:
            outs = pool.map(_replay_outcome, [(spec, target, method, seed, workers, goals,
                                               metric, num_classes, mode)
                                              for seed in range(seeds)])
            # a study that never found the goal has no compute to it: infinite, so a method
            # that misses in half its studies has no finite median (not its cap's compute)
            spent_by[method] = [o.to_goal[goals[0]] if o.found[goals[0]] else math.inf
                                for o in outs]
            parts = []
            for g in goals:
                spent = [o.to_goal[g] / divisor if o.found[g] else math.inf for o in outs]
                missed = sum(not o.found[g] for o in outs)
                parts.append(f"{g} x: median {statistics.median(spent):9.4g} {label} (p25 "
                             f"{_q(spent, 0.25):.4g}, p75 {_q(spent, 0.75):.4g}; never "
                             f"{100 * missed / seeds:4.1f}%)")
            in_budget = statistics.median(o.best_in_budget for o in outs)
            trials = statistics.median(o.trials for o in outs)
            print(f"{method:14s} {'  '.join(parts)}  best TTA within 20 x best: "
                  f"{_tta(table, in_budget)}; {trials:.0f} trials", flush=True)
    base = statistics.median(spent_by["autotune"])
    baselines, best_baseline = best_of(spent_by)
    never = {m: _misses(v) for m, v in spent_by.items()}
    if seeds >= 40:
        for other in dict.fromkeys(("random", best_baseline)):
            low, high = ratio_interval(spent_by[other], spent_by["autotune"])
            print(f"{other}_ratio 90% bootstrap interval over the {seeds} seeds: "
                  f"{low:.2f} to {high:.2f}")
    if math.isinf(base) and math.isinf(statistics.median(spent_by[best_baseline])):
        print(f"neither autotune nor {best_baseline} found a goal configuration in half its "
              f"studies (ratio 1 by convention): never {100 * never['autotune'] / seeds:.0f}% "
              f"against {100 * never[best_baseline] / seeds:.0f}%")
    print(f"autotune_median_{key}={base / divisor:.4g} random_ratio={baselines['random']:.2f} "
          f"best_baseline={best_baseline} best_baseline_ratio={baselines[best_baseline]:.2f}")


def breakdown(seeds: int, proposals: str, spec: str = str(DATA),
              target: float | None = None, metric: str = "top1",
              num_classes: int | None = None, mode: str = "max") -> None:
    """Where autotune's compute goes until it finds the goal: seconds by how trials ended,
    launch overhead apart, with autotune's sampler or with random proposals."""
    table = table_of(spec, target, metric, num_classes, mode)
    phases: dict[str, dict[str, list[float]]] = {"until": {}, "after": {}}
    overhead = total = 0.0
    for seed in range(seeds):
        replay = Replay(table, "autotune", seed, goals=(1.5,), budget_factor=0.0)
        if proposals == "random":
            replay.study.sampler = optuna.samplers.RandomSampler(seed=seed)
        outcome = replay.run()
        first = len(outcome.spent) if outcome.first_reach is None else outcome.first_reach
        for i, (end, launch, seconds) in enumerate(outcome.spent):
            phase = phases["until" if i < first else "after"]
            phase.setdefault(end, []).append(launch + seconds)
            overhead += launch
        total += replay.compute
    ends: dict[str, list[float]] = {}
    for spent in phases.values():
        for end, costs in spent.items():
            ends.setdefault(end, []).extend(costs)
    count = sum(len(v) for v in ends.values())
    print(f"autotune ({proposals} proposals), {seeds} studies until each found the goal: "
          f"{count} trials, {total:.5g} {table.unit}")
    for end, costs in sorted(ends.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {end:16s} {len(costs):5d} trials  {sum(costs):9.5g} {table.unit} "
              f"({100 * sum(costs) / total:4.1f}%)  {statistics.mean(costs):8.4g} {table.unit} "
              "each")
    for phase, label in (("until", "until a first trial reached the target (it included)"),
                         ("after", "after it")):
        spent = phases[phase]
        n, seconds = sum(len(v) for v in spent.values()), sum(sum(v) for v in spent.values())
        parts = ", ".join(f"{end} {100 * sum(v) / total:.1f}%" for end, v in
                          sorted(spent.items(), key=lambda kv: -sum(kv[1])))
        print(f"  {label}: {n / seeds:.1f} trials a study, {100 * seconds / total:.1f}% of "
              f"compute" + (f" ({parts})" if parts else ""))
    print(f"launch_overhead_share={overhead / total:.2f} trials_per_study={count / seeds:.1f} "
          f"{'seconds' if table.unit == 's' else table.unit}_per_trial={total / count:.4g} "
          "diverged_share="
          f"{sum(ends.get('diverged', [])) / total:.3f}")


# -- the YAHPO Gym paper's protocol: the harness checks itself ---------------------------------
PAPER_BUDGET = 6544        # epochs a run may spend (the paper's budget on LCBench)
# Mean normalized regret at the full budget, read off the paper's figure (about +-20%):
# YAHPO Gym (Pfisterer et al., AutoML-Conf 2022, arXiv 2109.03670).
PAPER_REGRET = {
    "167168": {"random": 0.12, "hyperband": 0.085, "tpe_median": 0.058},
    "189873": {"random": 0.18, "hyperband": 0.125, "tpe_median": 0.06},
    "189906": {"random": 0.075, "hyperband": 0.065, "tpe_median": 0.026},
}


def _value_range(instance: str) -> tuple[float, float]:
    """The instance's val_accuracy minimum and maximum (YAHPO's global statistics), 0-1."""
    found: dict[str, float] = {}
    with (YAHPO_DATA / "global_statistics" / "instance_target_statistics.csv").open() as f:
        for row in csv.DictReader(f):
            if (row["scenario"], row["instance"], row["metric"]) == ("lcbench", instance,
                                                                     "val_accuracy"):
                found[row["statistic"]] = float(row["value"]) / 100
    return found["min"], found["max"]


def _paper_run(job: tuple[str, str, int]) -> tuple[float, float]:
    """One run of a method under the paper's protocol: the normalized regret after
    ``PAPER_BUDGET`` epochs of its best full-length configuration, and of the best
    validation accuracy it saw at any epoch (pruned trials included).

    Random search and Hyperband train a configuration epoch by epoch (Hyperband reporting
    every epoch to Optuna's HyperbandPruner). TPE + MedianPruner is set up as the paper's
    authors ran it (YAHPO Gym's Optuna benchmark script): TPESampler(n_startup_trials=5),
    MedianPruner(n_startup_trials=5, n_warmup_steps=0), a configuration evaluated afresh at
    each successive-halving budget (``sh_budgets``), each evaluation costing its epochs,
    reported at step = the budget's index and pruned there."""
    instance, method, seed = job
    table = table_of(f"yahpo-lcbench:{instance}", None)
    sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=seed)
    pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
    if method == "hyperband":
        pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=52,
                                                reduction_factor=3)
    elif method == "tpe_median":
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
        pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    spent = 0
    while spent < PAPER_BUDGET:
        trial = study.ask()
        run = table.train(table.propose(trial))
        epochs = len(run.values)
        # (step reported, epoch whose accuracy it reports, epochs it costs)
        if method == "tpe_median":
            steps = [(i, b, b) for i, b in enumerate(sh_budgets(1, epochs, 3))]
        else:
            steps = [(e, e, 1) for e in range(1, epochs + 1)]
        for step, epoch, cost in steps:
            spent += cost
            trial.report(run.values[epoch - 1], step)
            last = step == steps[-1][0]
            if spent >= PAPER_BUDGET and not last:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)   # cut by the budget
                break
            if not last and trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, run.values[-1])
    low, high = _value_range(instance)
    complete = [t.value for t in study.trials if t.value is not None]
    seen = [v for t in study.trials for v in t.intermediate_values.values()]
    incumbent = max(complete) if complete else low
    anywhere = max(seen) if seen else low
    return (high - incumbent) / (high - low), (high - anywhere) / (high - low)


def paper(instances: list[str], seeds: int, jobs: int) -> None:
    """The baselines under the YAHPO Gym paper's protocol, beside its published regrets."""
    for instance in instances:   # a bad instance is refused here, not in the pool's workers
        table_of(f"yahpo-lcbench:{instance}", None)
        try:
            _value_range(instance)
        except (OSError, KeyError):
            raise SystemExit(f"no val_accuracy statistics for LCBench instance {instance!r} "
                             f"in {YAHPO_DATA / 'global_statistics'}; the paper's regret "
                             "needs them") from None
    print(f"YAHPO Gym LCBench, the paper's protocol: best val_accuracy of a full-length "
          f"configuration within {PAPER_BUDGET} epochs, {seeds} seeds; normalized regret "
          "(max - incumbent) / (max - min), the instance's global statistics")
    with _pool(jobs) as pool:
        for instance in instances:
            published = PAPER_REGRET.get(instance, {})
            for method in ("random", "hyperband", "tpe_median"):
                runs = pool.map(_paper_run, [(instance, method, s) for s in range(seeds)])
                full = [r[0] for r in runs]
                seen = [r[1] for r in runs]
                paper_value = published.get(method)
                print(f"{instance} {method:11s} mean regret {statistics.mean(full):.3f} "
                      f"(median {statistics.median(full):.3f}; best seen at any epoch "
                      f"{statistics.mean(seen):.3f}); published "
                      f"{'-' if paper_value is None else f'{paper_value:.3f}'}", flush=True)


LIVE_STUDY = """study_name: live
search_space: quickstart
trainer: {{eval_every_s: {every}}}
target: {{metric: top1, value: {target}}}
budget: {{n_trials: 200, timeout_s: {budget}, max_trial_s: {max_trial_s}}}
warm_start: false
pruner: {pruner}
"""


def _live_study(method: str, seed: int, budget: float, goal: float) -> tuple[float, float]:
    """Runs one real study; returns (compute seconds to the goal or the budget, best TTA)."""
    import subprocess
    import tempfile

    from autotune.config import load as load_config

    pruner = {"autotune": "tta", "tpe_median": "median"}[method]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        quickstart = load_config("quickstart")   # the settings the table was recorded with
        (folder / "study.yaml").write_text(LIVE_STUDY.format(
            target=TARGET, budget=budget, pruner=pruner, every=quickstart.trainer.eval_every_s,
            max_trial_s=quickstart.budget.max_trial_s))
        subprocess.run([sys.executable, "-m", "autotune", "start", "study", "study.yaml",
                        "--seed", str(seed)], cwd=folder, check=True, capture_output=True)
        study = optuna.load_study(study_name="live", storage=f"sqlite:///{folder}/autotune.db")
    ran = sorted((t for t in study.trials if t.datetime_complete is not None
                  and t.user_attrs.get("outcome") != "infeasible"),
                 key=lambda t: t.datetime_complete)
    compute, found, best = 0.0, None, math.inf
    for t in ran:
        compute += (t.datetime_complete - t.datetime_start).total_seconds()
        if t.user_attrs.get("outcome") == "reached":
            best = min(best, t.value)
            if found is None and t.value <= goal:
                found = compute
    return (found if found is not None else compute), best


def live(seeds: int, budget: float, path: Path | None = None) -> None:
    """The reality check: the real quickstart, autotune against TPE + MedianPruner, each
    study ``budget`` seconds, beside what the replay predicts for the same budget on the
    table at ``path`` (it is a check only on the machine and day the table was recorded)."""
    table = table_of(str(path or DATA), None)
    goal = 1.5 * table.best_tta
    medians, best = {}, {}
    for method in ("autotune", "tpe_median"):
        replays = [Replay(table, method, seed, budget_factor=budget / table.best_tta).run()
                   for seed in range(20)]
        predicted = statistics.median(r.best_in_budget for r in replays)
        runs = [_live_study(method, seed, budget, goal) for seed in range(seeds)]
        spent = [r[0] for r in runs]
        medians[method] = statistics.median(spent)
        best[method] = statistics.median(r[1] for r in runs)
        print(f"{method:11s} live, per seed: compute to TTA <= {goal:.2f} s (or the budget) "
              f"{', '.join(f'{c:.0f}' for c in spent)} s; best TTA "
              f"{', '.join(f'{b:.2f}' for b in (r[1] for r in runs))} s (median "
              f"{best[method]:.2f} s); the replay's median best TTA within {budget:.0f} s: "
              f"{predicted:.2f} s", flush=True)
    print(f"live_autotune_best_tta_s={best['autotune']:.2f} "
          f"live_tpe_median_best_tta_s={best['tpe_median']:.2f} "
          f"live_autotune_median_s={medians['autotune']:.1f} "
          f"live_tpe_median_median_s={medians['tpe_median']:.1f} "
          f"live_tpe_median_ratio={medians['tpe_median'] / medians['autotune']:.2f}")


def ratio_interval(spent: list[float], base: list[float], resamples: int = 1000,
                   seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of median(spent) / median(base) over bootstrap resamples of
    the seeds (each list resampled on its own): how far the ratio could move with other seeds."""
    rng = random.Random(seed)
    ratios = sorted(_ratio(statistics.median(rng.choices(spent, k=len(spent))),
                           statistics.median(rng.choices(base, k=len(base))))
                    for _ in range(resamples))
    return _q(ratios, 0.05), _q(ratios, 0.95)


def best_of(spent_by: dict[str, list[float]]) -> tuple[dict[str, float], str]:
    """Each baseline's ratio (its median compute over autotune's, never-found studies
    infinite) and the best baseline: the lowest ratio, ties (medians that are all never-found)
    going to the one that missed in fewest studies."""
    base = statistics.median(spent_by["autotune"])
    ratios = {m: _ratio(statistics.median(v), base) for m, v in spent_by.items()
              if m != "autotune"}
    best = min(ratios, key=lambda m: (ratios[m], _misses(spent_by[m])))
    return ratios, best


def _misses(spent: list[float]) -> int:
    """Studies that never found the goal (their compute to it infinite)."""
    return sum(math.isinf(x) for x in spent)


def _ratio(other: float, base: float) -> float:
    """``other / base`` with never-found (infinite) medians: inf / x = inf, x / inf = 0, and
    inf / inf = 1 (neither found it in half its studies)."""
    if math.isinf(base):
        return 1.0 if math.isinf(other) else 0.0
    return other / base


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="train sampled configurations for real, record curves")
    rec.add_argument("--n", type=int, default=60, help="configurations to record")
    rec.add_argument("--max-seconds", type=float, default=60.0,
                     help="training seconds cap (the quickstart study's max_trial_s)")
    rec.add_argument("--seed", type=int, default=7)
    rec.add_argument("--resume", action="store_true",
                     help="keep what an interrupted recording of the same sample wrote")
    rec.add_argument("--out", type=Path, default=None,
                     help=f"the table to write (default: {DATA.relative_to(ROOT)})")
    table_help = ("the table: opda:PATH (an opda-format JSON-lines file), "
                  "yahpo-lcbench:INSTANCE (the surrogate in --yahpo-data), or the path of a "
                  f"table `record` wrote (default: {DATA.relative_to(ROOT)})")
    yahpo_help = ("the YAHPO Gym data folder holding lcbench/ and global_statistics/ "
                  "(default: $AUTOTUNE_EXTERNAL_DATA/yahpo-lcbench, else "
                  "../shared/external/yahpo-lcbench beside the repository)")
    cmp = sub.add_parser("compare", help="replay studies of each method on a table")
    cmp.add_argument("--seeds", type=int, default=200, help="studies per method")
    cmp.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                     help="processes replaying studies (default: one a CPU core)")
    cmp.add_argument("--table", default=str(DATA), help=table_help)
    cmp.add_argument("--yahpo-data", type=Path, default=None, help=yahpo_help)
    cmp.add_argument("--target", type=float, default=None,
                     help="the accuracy to reach (0-1), or with --mode min the value of a "
                          "falling metric to get down to (default: the value the best 2%% "
                          "of the table's runs, or of 2,000 YAHPO configurations, reach)")
    metric_help = ("the accuracy the target is on: top1, or top5 (opda tables, whose curves "
                   "hold top_5: DAWNBench's 93%% top-5), or the key of another accuracy in an "
                   "opda table's curves (val_raw_accuracy)")
    cmp.add_argument("--metric", default="top1", help=metric_help)
    mode_help = ("max: the metric is an accuracy, reached at or above --target; min: it falls "
                 "(an opda table's val_loss, say), reached at or below it")
    cmp.add_argument("--mode", choices=("max", "min"), default="max", help=mode_help)
    classes_help = ("an opda table's number of classes, for chance accuracy (default: its "
                    "rows' num_classes, else 1000, ImageNet's)")
    cmp.add_argument("--num-classes", type=int, default=None, help=classes_help)
    cmp.add_argument("--workers", type=int, default=1,
                     help="asynchronous workers a study runs (default 1)")
    cmp.add_argument("--goals", default="1.5,1.25",
                     help="goal factors: a goal configuration has a TTA within FACTOR x the "
                          "table's best; the first decides the ratios (default 1.5,1.25)")
    cmp.add_argument("--methods", default=",".join(METHODS),
                     help=f"comma-separated, of {','.join(METHODS)} (autotune always runs)")
    bd = sub.add_parser("breakdown", help="where autotune's compute goes, by how trials end")
    bd.add_argument("--seeds", type=int, default=20)
    bd.add_argument("--proposals", choices=("autotune", "random"), default="autotune")
    bd.add_argument("--table", default=str(DATA), help=table_help)
    bd.add_argument("--yahpo-data", type=Path, default=None, help=yahpo_help)
    bd.add_argument("--target", type=float, default=None)
    bd.add_argument("--metric", default="top1", help=metric_help)
    bd.add_argument("--mode", choices=("max", "min"), default="max", help=mode_help)
    bd.add_argument("--num-classes", type=int, default=None, help=classes_help)
    pp = sub.add_parser("paper", help="the YAHPO Gym paper's own protocol (best validation "
                                      "accuracy within 6,544 epochs): the harness's check")
    pp.add_argument("--instances", default="167168,189873,189906")
    pp.add_argument("--yahpo-data", type=Path, default=None, help=yahpo_help)
    pp.add_argument("--seeds", type=int, default=30)
    pp.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    lv = sub.add_parser("live", help="the reality check: real studies, autotune against TPE + "
                                     "MedianPruner, on the same budget")
    lv.add_argument("--seeds", type=int, default=3)
    lv.add_argument("--budget", type=float, default=BUDGET_S, help="seconds per study")
    lv.add_argument("--table", type=Path, default=None,
                    help="the table recorded on this machine (its goal, and the replay's "
                         "prediction)")
    args = parser.parse_args(argv)
    if getattr(args, "yahpo_data", None) is not None:
        global YAHPO_DATA
        YAHPO_DATA = args.yahpo_data.expanduser().absolute()
        os.environ["AUTOTUNE_YAHPO_DATA"] = str(YAHPO_DATA)
    if (args.command == "paper" or str(getattr(args, "table", "")).startswith("yahpo-lcbench:")) \
            and not (YAHPO_DATA / "lcbench" / "model.onnx").is_file():
        raise SystemExit(f"no YAHPO LCBench surrogate in {YAHPO_DATA} (no lcbench/model.onnx "
                         "there): give the folder that holds YAHPO Gym's lcbench/ and "
                         "global_statistics/ with --yahpo-data DIR")
    for name in ("seeds", "n", "budget", "max_seconds", "jobs", "workers"):
        if getattr(args, name, 1) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got "
                         f"{getattr(args, name)}")
    falling = getattr(args, "mode", "max") == "min"
    if getattr(args, "target", None) is not None and not falling \
            and not 0 < args.target <= 100:
        parser.error(f"--target must be an accuracy in (0, 1] (or a percentage up to 100 for "
                     f"an opda table recorded in percent), got {args.target} (for a metric "
                     "that falls, a loss, give --mode min)")
    if falling and args.target is not None and not 0 < args.target < math.inf:
        parser.error(f"--target must be above 0 for a metric that falls, got {args.target}")
    try:
        _run(args, parser)
    except OSError as e:
        refused = path_refused(e)
        if refused is None:
            raise
        parser.exit(2 if e.errno == errno.ENAMETOOLONG else 1,    # as autotune's CLI
                    f"search_efficiency.py {args.command}: error: {refused}\n")
    except KeyboardInterrupt:
        # compare, breakdown and paper print a method's figures once all its studies are done;
        # record keeps the configurations it recorded in its .partial file
        hint = (": pass --resume to go on with the configurations recorded so far"
                if args.command == "record" else "")
        print(f"search_efficiency.py {args.command}: interrupted{hint}", file=sys.stderr)
        sys.exit(130)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The command ``args`` names, its arguments checked."""
    if args.command == "record":
        record(args.n, args.max_seconds, args.seed, args.resume, args.out)
    elif args.command == "breakdown":
        breakdown(args.seeds, args.proposals, args.table, args.target, args.metric,
                  args.num_classes, args.mode)
    elif args.command == "live":
        live(args.seeds, args.budget, args.table)
    elif args.command == "paper":
        paper(args.instances.split(","), args.seeds, args.jobs)
    else:
        methods = tuple(m for m in args.methods.split(",") if m)
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            parser.error(f"unknown method {unknown[0]!r}; the methods: {', '.join(METHODS)}")
        methods = tuple(dict.fromkeys(("autotune", "random", *methods)))
        bad_goals = (f"--goals must be finite numbers >= 1 separated by commas (1.5: a TTA "
                     f"within 1.5 x the table's best), got {args.goals}")
        try:
            goals = tuple(float(g) for g in args.goals.split(",") if g)
        except ValueError:
            parser.error(bad_goals)
        if not goals or not all(1 <= g < math.inf for g in goals):
            parser.error(bad_goals)
        compare(args.seeds, args.table, args.target, args.jobs, args.workers, methods, goals,
                args.metric, args.num_classes, args.mode)


if __name__ == "__main__":
    main()
