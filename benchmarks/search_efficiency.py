"""Search efficiency: how much compute each tuner spends to find a fast configuration.

    python benchmarks/search_efficiency.py record [--n 60] [--max-seconds 60] [--resume] [--out F]
    python benchmarks/search_efficiency.py compare [--seeds 1000] [--jobs N] [--table F]
    python benchmarks/search_efficiency.py live [--seeds 3] [--budget 300] [--table F]
    python benchmarks/search_efficiency.py breakdown [--seeds 20] [--proposals random]

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
seed 8, recorded at 669 img/s, the speed DESIGN.md records for these machines),
``quickstart_curves_205img_s.jsonl`` (48 configurations, seed 7, at 205 img/s) and
``quickstart_curves_per_epoch.jsonl`` (60 configurations, one evaluation an epoch and a
launch at every trial, recorded before ``record`` took the study's settings).

``compare`` replays studies on a simulated clock against those curves: a proposed
configuration trains as its nearest recorded one, and its training returns the recorded
evaluations up to the moment a pruner stops it; each trial also pays its recorded overhead
(in a table recorded in warm trainer ranks, as workers run trials now, the hand-over and
set-up, and the ranks' launch once a study; in the per-epoch table, recorded before, a launch
at every trial). Methods: autotune (its sampler: spread points, each the best of 64 draws:
far from the configurations tried, discounted where those nearest plan long schedules or failed;
TPE with constraints for one trial in four after the first 32;
and the TimeToAccuracyPruner), TPE + MedianPruner and TPE +
SuccessiveHalvingPruner (both on epoch steps: they report and may prune at the first
evaluation after each epoch ends), TPE without pruning, random search without pruning. The
baselines tell a trial that missed the target the documented penalty value (twice the longest
recorded trial), and pruned trials as PRUNED.

Metric: compute seconds spent until a trial has reached the target within 10% of the best TTA
in the table (median over seeds), and the best TTA found within a fixed compute budget. The
median of 20 studies swings widely (random_ratio from 1.0 to 2.7 between blocks of 20 seeds
on the default table, 1.5 to 5.1 on the 205 img/s one), and even the median of 200 moved by up
to 15% with other seeds, so ``compare`` replays 1000 studies a method by default (on a process
a CPU core), and prints the ratio's range over its blocks of 20 seeds and a 90% bootstrap
interval of random_ratio and tpe_median_ratio.
The last line: ``autotune_median_s=X random_ratio=R tpe_median_ratio=T tpe_sha_ratio=S
tpe_nopruning_ratio=U``, each ratio a method's median compute over autotune's.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from autotune.objective import TrialResult, tell_result  # noqa: E402
from autotune.pruners import CURVE_KEY, ELAPSED_KEY, TimeToAccuracyPruner  # noqa: E402
from autotune.samplers import ExploringTPESampler  # noqa: E402
from autotune.space import InfeasiblePoint, SearchSpace, load_space  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "quickstart_curves.jsonl"
TARGET = 0.97
WORLD = 2
MAX_TRIALS = 120            # a replayed study that has not found a good config by then stops
BUDGET_S = 300.0            # compute budget for "best TTA found within a budget"
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
    from autotune.launch import run_plan, serve_plans

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
def load_table(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or DATA
    if not path.is_file():
        raise SystemExit(f"no recorded curves at {path}; record them with `python {__file__} "
                         f"record --out {path}`")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path} is not a table of recorded curves (JSON lines): {e}") from None


def _features(p: dict[str, Any]) -> list[float]:
    return [math.log2(p["global_batch"]) / 5, math.log10(p["lr_per_256"]) / 2.3,
            p["warmup_epochs"] / 2, p["label_smoothing"] / 0.2, (p["epochs"] - 3) / 9]


def nearest(table: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """The recorded configuration closest to ``params`` (same decay shape preferred)."""
    f = _features(params)

    def distance(row: dict[str, Any]) -> float:
        g = _features(row["params"])
        decay = 0.0 if row["params"]["decay"] == params["decay"] else 0.5
        return math.dist(f, g) + decay

    return min(table, key=distance)


class Replay:
    """One simulated study of one method on the recorded table."""

    def __init__(self, method: str, seed: int, table: list[dict[str, Any]],
                 budget: float = BUDGET_S) -> None:
        self.method, self.table, self.budget = method, table, budget
        self.space = load_space("quickstart", world_size=WORLD)
        self.best_table = min(r["reached_at"] for r in table if r["reached_at"] is not None)
        self.penalty = 2 * max(r["elapsed_s"] for r in table)
        sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=5)
        pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
        if method == "autotune":
            sampler = ExploringTPESampler(seed=seed)
            pruner = TimeToAccuracyPruner(TARGET, num_classes=10)
        elif method == "tpe_median":
            pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
        elif method == "tpe_sha":
            pruner = optuna.pruners.SuccessiveHalvingPruner()
        elif method == "random":
            sampler = optuna.samplers.RandomSampler(seed=seed)
        self.pruner = pruner
        direction = "minimize"
        self.study = optuna.create_study(direction=direction, sampler=sampler, pruner=pruner)
        self.compute = 0.0
        self.found_at: float | None = None
        self.best_in_budget = math.inf
        self.spent: list[tuple[str, float, float]] = []  # each trial: how it ended, launch
        #                                                  overhead, training seconds

    def _ask(self) -> tuple[optuna.Trial, dict[str, Any]]:
        while True:
            trial = self.study.ask()
            try:
                return trial, self.space.sample(trial)
            except InfeasiblePoint:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def step(self) -> None:
        trial, params = self._ask()
        row = nearest(self.table, params)
        best_before = self.best_tta()
        cost, tta = self._train(trial, row)
        overhead = self._overhead(row)
        self.compute += overhead + cost
        self.spent.append((self._ending(trial, row, best_before), overhead, cost))
        if tta is not None:
            if self.compute <= self.budget:
                self.best_in_budget = min(self.best_in_budget, tta)
            if self.found_at is None and tta <= 1.1 * self.best_table:
                self.found_at = self.compute

    def _overhead(self, row: dict[str, Any]) -> float:
        """What a trial pays besides its training clock: its recorded overhead, plus, in a
        table recorded in warm trainer ranks, their launch at the study's first trial."""
        launch = row.get("launch_s", 0.0) if row.get("warm_ranks") and not self.spent else 0.0
        return float(row["overhead_s"]) + float(launch)

    def _train(self, trial: optuna.Trial, row: dict[str, Any]) -> tuple[float, float | None]:
        """Replays ``row`` on the simulated clock; returns (training seconds, TTA or None)."""
        curve, rows = row["curve"], []
        best, reported = 0.0, 0
        for point in curve:
            t, top1 = point[0], point[1]
            if self.method == "autotune":
                deadline = self.pruner.deadline(self.study)
                if deadline is not None and t > deadline:  # the trainer stops at the deadline
                    self._tell_autotune(trial, "censored", "bound", deadline, best)
                    return deadline, None
            rows.append(point)
            best = max(best, top1)
            epochs_done = int(point[3] * row["epochs"] + 1e-3)  # progress is rounded
            at_epoch_end = epochs_done > reported  # the baselines report once an epoch
            if at_epoch_end:
                reported = epochs_done
                trial.report(1.0 - top1, step=epochs_done - 1)  # error: the study minimizes
            if top1 >= TARGET:
                if self.method == "autotune":
                    self._tell_autotune(trial, "reached", "reached", t, best)
                else:
                    self.study.tell(trial, t)
                return t, t
            if self.method == "autotune":
                trial.set_user_attr(CURVE_KEY, rows)
                trial.set_user_attr(ELAPSED_KEY, t)
                frozen = self.study._storage.get_trial(trial._trial_id)
                reason = self.pruner.decide(self.study, frozen)
                if reason:
                    outcome = "failed" if reason == "diverged" else "censored"
                    self._tell_autotune(trial, outcome, reason, t, best)
                    return t, None
            elif at_epoch_end and trial.should_prune():
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                return t, None
        end = row["elapsed_s"]
        if self.method == "autotune":
            self._tell_autotune(trial, "censored", "planned_epochs", end, best)
        else:
            self.study.tell(trial, self.penalty)
        return end, None

    @property
    def to_goal(self) -> float:
        """The metric: compute until the goal was found, or all of it when it never was."""
        return self.found_at if self.found_at is not None else self.compute

    def best_tta(self) -> float:
        """The best TTA the study has found so far (inf before any trial reached)."""
        values = [t.value for t in self.study.get_trials(deepcopy=False)
                  if t.state.name == "COMPLETE" and t.user_attrs.get("outcome", "reached")
                  == "reached" and t.value is not None and t.value < self.penalty]
        return min(values, default=math.inf)

    def _ending(self, trial: optuna.Trial, row: dict[str, Any], best_before: float) -> str:
        """How the trial ended: its stop reason; for ``reached``, whether it bettered the best
        or tied it (a configuration already run); for ``bound``, whether its recorded
        configuration reaches the target at all, and within 1.5 x the deadline."""
        frozen = self.study._storage.get_trial(trial._trial_id)
        reason = str(frozen.user_attrs.get("stop_reason") or frozen.state.name.lower())
        if reason == "reached":
            return "reached (new best)" if frozen.value < best_before else "reached (ties best)"
        if reason != "bound":
            return reason
        if row["reached_at"] is None:
            return "bound (never reaches)"
        return "bound (reaches < 1.5 x deadline)" if row["reached_at"] < 1.5 * best_before \
            else "bound (reaches later)"

    def _tell_autotune(self, trial: optuna.Trial, outcome: str, reason: str, t: float,
                       best: float) -> None:
        tell_result(self.study, trial, TrialResult(trial.number, {}, outcome, reason, value=t,
                                                   best_metric=best), TARGET)

    def run(self) -> Replay:
        for _ in range(MAX_TRIALS):
            self.step()
            if self.found_at is not None and self.compute > BUDGET_S:
                break
        return self


METHODS = ("autotune", "tpe_median", "tpe_sha", "tpe_nopruning", "random")


_TABLES: dict[Path | None, list[dict[str, Any]]] = {}


def _replay_outcome(job: tuple[str, int, Path | None]) -> tuple[float, bool, float]:
    """One replayed study (in a pool worker): compute to the goal, whether it found the goal,
    the best TTA within the budget."""
    method, seed, path = job
    if path not in _TABLES:
        _TABLES[path] = load_table(path)
    replay = Replay(method, seed, _TABLES[path]).run()
    return replay.to_goal, replay.found_at is not None, replay.best_in_budget


def compare(seeds: int, path: Path | None = None, jobs: int | None = None) -> None:
    table = load_table(path)
    best = min(r["reached_at"] for r in table if r["reached_at"] is not None)
    reached = sum(r["reached_at"] is not None for r in table)
    speeds = {r["machine_img_s"] for r in table if "machine_img_s" in r}
    machine = (f"; recorded at {', '.join(f'{v:.0f}' for v in sorted(speeds))} img/s "
               "(plain ResNet-18)" if speeds else "")
    print(f"table: {len(table)} recorded configurations, {reached} reach top1 >= {TARGET}; "
          f"best TTA {best:.2f} s; goal: TTA <= {1.1 * best:.2f} s{machine}")
    medians: dict[str, float] = {}
    spent_by: dict[str, list[float]] = {}
    with multiprocessing.Pool(jobs) as pool:
        for method in METHODS:
            runs = pool.map(_replay_outcome, [(method, seed, path) for seed in range(seeds)])
            spent = spent_by[method] = [to_goal for to_goal, _, _ in runs]
            misses = sum(not found for _, found, _ in runs)
            medians[method] = statistics.median(spent)
            in_budget = statistics.median(best for _, _, best in runs)
            print(f"{method:14s} median compute to goal {medians[method]:8.1f} s  (p25 "
                  f"{_q(spent, 0.25):7.1f}, p75 {_q(spent, 0.75):7.1f}; {misses} of {seeds} "
                  f"never found it)  median best TTA within {BUDGET_S:.0f} s: {in_budget:.2f} s",
                  flush=True)
    base = medians["autotune"]
    if seeds >= 40:
        blocks = [statistics.median(spent_by["random"][i:i + 20])
                  / statistics.median(spent_by["autotune"][i:i + 20])
                  for i in range(0, seeds - 19, 20)]
        print(f"random_ratio over blocks of 20 seeds: {min(blocks):.2f} to {max(blocks):.2f} "
              f"(median {statistics.median(blocks):.2f})")
        for other in ("random", "tpe_median"):
            low, high = ratio_interval(spent_by[other], spent_by["autotune"])
            print(f"{other}_ratio 90% bootstrap interval over the {seeds} seeds: "
                  f"{low:.2f} to {high:.2f}")
    print(f"autotune_median_s={base:.1f} random_ratio={medians['random'] / base:.2f} "
          f"tpe_median_ratio={medians['tpe_median'] / base:.2f} "
          f"tpe_sha_ratio={medians['tpe_sha'] / base:.2f} "
          f"tpe_nopruning_ratio={medians['tpe_nopruning'] / base:.2f}")


def breakdown(seeds: int, proposals: str, path: Path | None = None) -> None:
    """Where autotune's compute goes until it finds the goal: seconds by how trials ended,
    launch overhead apart, with autotune's sampler or with random proposals."""
    table = load_table(path)
    ends: dict[str, list[float]] = {}
    overhead = total = 0.0
    perfect = []   # each study's compute had every trial but the goal's cost only its launch
    for seed in range(seeds):
        replay = Replay("autotune", seed, table)
        if proposals == "random":
            replay.study.sampler = optuna.samplers.RandomSampler(seed=seed)
        while replay.found_at is None and len(replay.spent) < MAX_TRIALS:
            replay.step()
        for end, launch, seconds in replay.spent:
            ends.setdefault(end, []).append(launch + seconds)
            overhead += launch
        total += replay.compute
        perfect.append(sum(launch for _, launch, _ in replay.spent) + replay.spent[-1][2])
    random_search = [Replay("random", seed, table).run().to_goal for seed in range(seeds)]
    print(f"autotune ({proposals} proposals), {seeds} studies until each found the goal: "
          f"{sum(len(v) for v in ends.values())} trials, {total:.0f} s")
    for end, costs in sorted(ends.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {end:34s} {len(costs):5d} trials  {sum(costs):7.0f} s "
              f"({100 * sum(costs) / total:4.1f}%)  {statistics.mean(costs):5.1f} s each")
    print("the same proposals with a perfect pruner (every trial but the goal's stopped "
          f"at its launch): median {statistics.median(perfect):.0f} s; random search "
          f"without pruning: median {statistics.median(random_search):.0f} s")
    print(f"launch_overhead_share={overhead / total:.2f} trials_per_study="
          f"{sum(len(v) for v in ends.values()) / seeds:.1f} seconds_per_trial="
          f"{total / sum(len(v) for v in ends.values()):.1f} perfect_pruner_random_ratio="
          f"{statistics.median(random_search) / statistics.median(perfect):.2f}")


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
    table = load_table(path)
    goal = 1.1 * min(r["reached_at"] for r in table if r["reached_at"] is not None)
    medians, best = {}, {}
    for method in ("autotune", "tpe_median"):
        replays = [_replay_in_budget(method, seed, table, budget) for seed in range(20)]
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


def _replay_in_budget(method: str, seed: int, table: list[dict[str, Any]],
                      budget: float) -> Replay:
    replay = Replay(method, seed, table, budget=budget)
    while replay.compute < budget and len(replay.study.trials) < MAX_TRIALS:
        replay.step()
    return replay


def ratio_interval(spent: list[float], base: list[float], resamples: int = 1000,
                   seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of median(spent) / median(base) over bootstrap resamples of
    the seeds (each list resampled on its own): how far the ratio could move with other seeds."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(spent, k=len(spent)))
                    / statistics.median(rng.choices(base, k=len(base)))
                    for _ in range(resamples))
    return _q(ratios, 0.05), _q(ratios, 0.95)


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
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
    cmp = sub.add_parser("compare", help="replay studies of each method on the recorded curves")
    cmp.add_argument("--seeds", type=int, default=1000, help="studies per method")
    cmp.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                     help="processes replaying studies (default: one a CPU core)")
    cmp.add_argument("--table", type=Path, default=None,
                     help="another recorded table, e.g. benchmarks/data/"
                          "quickstart_curves_205img_s.jsonl (default: quickstart_curves.jsonl)")
    bd = sub.add_parser("breakdown", help="where autotune's compute goes, by how trials end")
    bd.add_argument("--seeds", type=int, default=20)
    bd.add_argument("--proposals", choices=("autotune", "random"), default="autotune")
    bd.add_argument("--table", type=Path, default=None, help="another recorded table")
    lv = sub.add_parser("live", help="the reality check: real studies, autotune against TPE + "
                                     "MedianPruner, on the same budget")
    lv.add_argument("--seeds", type=int, default=3)
    lv.add_argument("--budget", type=float, default=BUDGET_S, help="seconds per study")
    lv.add_argument("--table", type=Path, default=None,
                    help="the table recorded on this machine (its goal, and the replay's "
                         "prediction)")
    args = parser.parse_args()
    for name in ("seeds", "n", "budget", "max_seconds", "jobs"):
        if getattr(args, name, 1) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got "
                         f"{getattr(args, name)}")
    if args.command == "record":
        record(args.n, args.max_seconds, args.seed, args.resume, args.out)
    elif args.command == "breakdown":
        breakdown(args.seeds, args.proposals, args.table)
    elif args.command == "live":
        live(args.seeds, args.budget, args.table)
    else:
        compare(args.seeds, args.table, args.jobs)


if __name__ == "__main__":
    main()
