"""The search-efficiency benchmark's own logic: resuming a recording, epoch-step baselines."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

from autotune.replay import Replay, load_table

# compare's worker processes are started fresh and import the benchmark by name, from the
# search path they inherit
_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "search_efficiency.py"
sys.path.insert(0, str(_PATH.parent))
import search_efficiency as se  # noqa: E402

CONFIGS = [{"global_batch": 64 * (i + 1), "lr_per_256": 0.1, "warmup_epochs": 0.0,
            "decay": "cosine", "label_smoothing": 0.0, "epochs": 4} for i in range(3)]


def test_resume_keeps_the_rows_of_the_same_sample(tmp_path):
    partial = tmp_path / "curves.partial"
    partial.write_text("".join(json.dumps({"params": c, "curve": []}) + "\n"
                               for c in CONFIGS[:2]))
    assert [r["params"] for r in se.rows_to_keep(partial, CONFIGS)] == CONFIGS[:2]


def test_resume_refuses_another_sample(tmp_path):
    partial = tmp_path / "curves.partial"
    partial.write_text(json.dumps({"params": CONFIGS[1], "curve": []}) + "\n")
    with pytest.raises(SystemExit, match="without --resume"):
        se.rows_to_keep(partial, CONFIGS)


def test_resume_records_again_a_last_row_cut_off_by_the_interruption(tmp_path):
    partial = tmp_path / "curves.partial"
    partial.write_text(json.dumps({"params": CONFIGS[0], "curve": []}) + '\n{"params": {"glo')
    assert [r["params"] for r in se.rows_to_keep(partial, CONFIGS)] == CONFIGS[:1]
    partial.write_text('{"par\n' + json.dumps({"params": CONFIGS[0], "curve": []}) + "\n")
    with pytest.raises(SystemExit, match="line 1, is not a recorded row"):
        se.rows_to_keep(partial, CONFIGS)


def test_record_does_not_overwrite_an_interrupted_recording(tmp_path, monkeypatch):
    monkeypatch.setattr(se, "DATA", tmp_path / "curves.jsonl")
    partial = tmp_path / "curves.partial"
    partial.write_text(json.dumps({"params": CONFIGS[0], "curve": []}) + "\n")
    with pytest.raises(SystemExit, match="pass --resume"):
        se.record(2, 5.0, seed=7)
    assert partial.read_text() == json.dumps({"params": CONFIGS[0], "curve": []}) + "\n"


def test_record_refuses_a_folder_as_its_table_before_training(tmp_path):
    with pytest.raises(SystemExit, match="is a folder; give the table's file name"):
        se.record(2, 5.0, seed=7, out=tmp_path)
    assert list(tmp_path.iterdir()) == []


def _table_file(tmp_path, rows) -> str:
    path = tmp_path / "table.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_baselines_report_once_an_epoch_whatever_the_evaluation_pace(tmp_path):
    # Two evaluations an epoch, never reaching the target: TPE + MedianPruner must see one
    # report an epoch (steps 0-3), at the evaluation that ends it.
    curve = [[2.0 * k, 0.2 + 0.05 * k, 0.5, k / 8, 1.0] for k in range(1, 9)]
    rows = [{"params": {**c, "decay": "cosine"}, "curve": curve, "reached_at": None,
             "end_reason": "planned_epochs", "elapsed_s": 16.0, "overhead_s": 1.0,
             "epochs": 4} for c in CONFIGS]
    rows[0]["curve"] = [[16.0, 0.98, 1.0, 1.0, 0.1]]  # the table needs a run that reaches
    table = load_table(_table_file(tmp_path, rows))
    replay = Replay(table, "tpe_median", seed=0)
    replay.study.enqueue_trial(CONFIGS[1] | {"decay": "cosine"})
    replay.one_trial()
    frozen = replay.study.trials[-1]
    assert sorted(frozen.intermediate_values) == [0, 1, 2, 3]
    assert frozen.intermediate_values[1] == pytest.approx(1 - curve[3][1])  # 2nd epoch's end


def test_a_table_recorded_in_warm_ranks_charges_their_launch_once_a_worker(tmp_path):
    curve = [[2.0 * k, 0.2 + 0.1 * k, 0.9, k / 8, 1.0] for k in range(1, 9)]
    rows = [{"params": c, "curve": curve, "reached_at": None, "end_reason": "planned_epochs",
             "elapsed_s": 16.0, "overhead_s": 0.5, "epochs": 4, "warm_ranks": True,
             "launch_s": 8.0} for c in CONFIGS]
    table = load_table(_table_file(tmp_path, rows))
    replay = Replay(table, "random", seed=0)
    replay.one_trial()
    replay.one_trial()
    assert [launch for _, launch, _ in replay.spent] == [8.5, 0.5]
    # a table recorded before warm ranks: its overhead is a launch at every trial
    cold = [{k: v for k, v in row.items() if k not in ("warm_ranks", "launch_s")}
            for row in rows]
    replay = Replay(load_table(_table_file(tmp_path, cold)), "random", seed=0)
    replay.one_trial()
    replay.one_trial()
    assert [launch for _, launch, _ in replay.spent] == [0.5, 0.5]


@pytest.mark.slow
def test_record_trains_each_configuration_in_the_same_warm_ranks(tmp_path, monkeypatch):
    monkeypatch.setattr(se, "DATA", tmp_path / "committed.jsonl")
    se.record(2, 3.0, seed=7, out=tmp_path / "curves.jsonl")
    assert not (tmp_path / "committed.jsonl").exists()       # --out leaves the default alone
    rows = [json.loads(line) for line in (tmp_path / "curves.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    # the ranks' launch was measured on a short first plan; the configurations came after it
    assert [row["ranks_trial"] for row in rows] == [2, 3]
    for row in rows:
        assert row["warm_ranks"] is True and row["curve"] and row["elapsed_s"] >= 3.0
        assert row["end_reason"] in ("max_seconds", "planned_epochs")
        assert row["overhead_s"] > 0 and row["launch_s"] > 0 and row["machine_img_s"] > 0


def test_the_ratio_interval_brackets_the_ratio_and_narrows_with_more_seeds():
    rng = random.Random(4)

    def draws(mean: float, n: int) -> list[float]:
        return [rng.expovariate(1 / mean) for _ in range(n)]

    few = se.ratio_interval(draws(400.0, 40), draws(200.0, 40))
    many = se.ratio_interval(draws(400.0, 2000), draws(200.0, 2000))
    assert few[0] < 2.0 < few[1]                  # the true ratio of the medians: 2
    assert 1.7 < many[0] < 2.1 and 1.9 < many[1] < 2.4    # within about 10% of 2
    assert many[1] - many[0] < 0.5 * (few[1] - few[0])
    same = draws(300.0, 200)
    assert se.ratio_interval(same, same, seed=1) == se.ratio_interval(same, same, seed=1)


def test_compare_replays_every_method_in_worker_processes_and_ends_with_the_ratios(tmp_path,
                                                                                   capsys):
    fast = [[2.0 * k, 0.1 + 0.12 * k, 0.9, k / 8, 1.0] for k in range(1, 9)]     # 97% at 16 s
    slow = [[2.0 * k, 0.1 + 0.05 * k, 0.9, k / 8, 1.0] for k in range(1, 9)]
    rows = [{"params": {**c, "decay": "cosine"}, "curve": fast if i == 0 else slow,
             "reached_at": 16.0 if i == 0 else None, "end_reason": "planned_epochs",
             "elapsed_s": 16.0, "overhead_s": 0.5, "epochs": 4} for i, c in enumerate(CONFIGS)]
    se.compare(seeds=2, spec=_table_file(tmp_path, rows), jobs=2)
    lines = capsys.readouterr().out.strip().splitlines()
    shown = [line.split()[0] for line in lines if line.split()[0] in se.METHODS]
    assert shown == [m for m in se.METHODS if m != "dehb"]    # DEHB: plain spaces only
    last = dict(field.split("=") for field in lines[-1].split())
    assert list(last) == ["autotune_median_h", "random_ratio", "best_baseline",
                          "best_baseline_ratio"]
    assert last["best_baseline"] in se.METHODS and last["best_baseline"] != "autotune"
    assert float(last["autotune_median_h"]) > 0 and float(last["random_ratio"]) > 0
    # what the table asks of any tuner, before the methods: one of its 3 runs is the goal,
    # and proposals train the nearest run (cells of unequal size), so some share between
    at = next(i for i, line in enumerate(lines) if "what any tuner is up against" in line)
    assert at < next(i for i, line in enumerate(lines) if line.split()[0] in se.METHODS)
    share = float(lines[at].split("against: ")[1].split("%")[0])
    assert 0 < share < 100 and "oracle pruner" in lines[at]


def test_a_method_that_misses_in_half_its_studies_has_no_finite_median():
    inf = float("inf")
    assert se._ratio(inf, 10.0) == inf and se._ratio(5.0, inf) == 0.0
    assert se._ratio(inf, inf) == 1.0 and se._ratio(30.0, 10.0) == 3.0
    import statistics
    assert statistics.median([1.0, inf, inf]) == inf      # what compare's medians rest on


def test_the_paper_protocols_budgets_are_the_successive_halving_levels():
    # YAHPO Gym's own Optuna runs evaluate LCBench's 1-52 epochs at 2, 6, 17 and 52
    from autotune.replay import sh_budgets

    assert sh_budgets(1, 52, 3) == [2, 6, 17, 52]
    assert sh_budgets(1, 81, 3) == [1, 3, 9, 27, 81]
    assert sh_budgets(1, 1, 3) == [1]


def test_the_yahpo_authors_median_pruner_sees_only_the_successive_halving_epochs(tmp_path):
    # Four epochs planned, the table's longest: successive halving (eta 3) reports at epochs
    # 1 and 4 only, as steps 0 and 1, whatever the evaluation pace.
    curve = [[2.0 * k, 0.2 + 0.05 * k, 0.5, k / 8, 1.0] for k in range(1, 9)]
    rows = [{"params": {**c, "decay": "cosine"}, "curve": curve, "reached_at": None,
             "end_reason": "planned_epochs", "elapsed_s": 16.0, "overhead_s": 1.0,
             "epochs": 4} for c in CONFIGS]
    rows[0]["curve"] = [[16.0, 0.98, 1.0, 1.0, 0.1]]
    table = load_table(_table_file(tmp_path, rows))
    replay = Replay(table, "tpe_median_sh", seed=0)
    replay.study.enqueue_trial(CONFIGS[1] | {"decay": "cosine"})
    replay.one_trial()
    frozen = replay.study.trials[-1]
    assert frozen.intermediate_values == {0: pytest.approx(1 - curve[1][1]),
                                          1: pytest.approx(1 - curve[7][1])}


def test_paper_refuses_an_unknown_instance_at_once(tmp_path):
    # refused in the main process, before the pool (whose workers would die and hang it)
    import subprocess

    done = subprocess.run([sys.executable, str(_PATH), "paper", "--instances", "12",
                           "--seeds", "2", "--jobs", "2"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "'12'" in lines[0] or "yahpo" in lines[0].lower()   # the instance, or no surrogate


def test_breakdown_splits_the_compute_at_the_first_reach(tmp_path, capsys):
    miss = [[2.0 * k, 0.2 + 0.05 * k, 0.5, k / 8, 1.0] for k in range(1, 9)]
    rows = [{"params": c, "curve": miss, "reached_at": None, "end_reason": "planned_epochs",
             "elapsed_s": 16.0, "overhead_s": 0.0, "epochs": 4} for c in CONFIGS]
    rows[2]["curve"] = [[4.0 * k, 0.9 + 0.04 * k, 1.0, k / 2, 0.1] for k in range(1, 3)]
    rows[2] |= {"reached_at": 8.0, "end_reason": "reached", "elapsed_s": 8.0}
    se.breakdown(2, "random", spec=_table_file(tmp_path, rows), target=0.97)
    lines = capsys.readouterr().out.splitlines()
    until = next(line for line in lines if "until a first trial reached" in line)
    after = next(line for line in lines if line.strip().startswith("after it"))
    share = [float(line.split(" trials a study, ")[1].split("%")[0]) for line in (until, after)]
    assert sum(share) == pytest.approx(100.0, abs=0.2)
    assert "reached" in until and "reached" not in after      # the study stops at the goal


def test_the_best_baseline_among_never_found_medians_is_the_one_that_missed_least():
    inf = float("inf")
    spent_by = {"autotune": [1.0, inf, inf], "random": [inf, inf, inf],
                "tpe_hyperband": [2.0, inf, inf], "tpe_median": [inf, inf, inf]}
    ratios, best = se.best_of(spent_by)
    assert ratios == {"random": 1.0, "tpe_hyperband": 1.0, "tpe_median": 1.0}
    assert best == "tpe_hyperband"     # not the first listed, nor one that always missed
    spent_by["autotune"] = [1.0, 1.0, inf]
    ratios, best = se.best_of(spent_by)
    assert best == "tpe_hyperband" and ratios["random"] == inf


def test_a_target_no_run_reaches_is_refused_in_one_line_before_any_replay(tmp_path):
    curve = [[2.0 * k, 0.2 + 0.05 * k, 0.5, k / 8, 1.0] for k in range(1, 9)]
    rows = [{"params": {**c, "decay": "cosine"}, "curve": curve, "reached_at": None,
             "end_reason": "planned_epochs", "elapsed_s": 16.0, "overhead_s": 0.5,
             "epochs": 4} for c in CONFIGS]
    with pytest.raises(SystemExit, match=r"no run of table .* reaches top1 >= 0.97 \(the best "
                                         r"reaches 0.6\); give a lower --target$"):
        se.compare(seeds=2, spec=_table_file(tmp_path, rows), jobs=1)


@pytest.mark.parametrize("flags, message", [
    (["--goals", "1.5,inf"], "--goals must be finite numbers >= 1"),
    (["--goals", "0.5"], "--goals must be finite numbers >= 1"),
    (["--seeds", "0"], "--seeds must be positive"),
    (["--target", "150"], r"--target must be an accuracy in \(0, 1\] \(or a percentage up "
                          r"to 100 for an opda table recorded in percent\)"),
    (["--table", "opda:" + "z" * 300 + ".jsonl"], r"^search_efficiency.py compare: error: z+"
                                                  r"\.jsonl: a name in this path is longer"),
])
def test_compare_refuses_a_bad_flag_in_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        se.main(["compare", *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(message, err) and "Traceback" not in err, err


def test_compare_on_a_table_without_times_names_its_unit_in_every_figure(tmp_path, capsys):
    """A table that records steps and no clock (opda's fine-tuning layout): compute is in
    training examples, and no figure calls it hours."""
    rng = random.Random(0)
    lines = []
    for i in range(10):
        batch, rate = 16 + 6 * i, rng.uniform(0.5, 1.5)
        steps = list(range(500, 6001, 500))
        lines.append({"iteration": i + 1, "train_batch_size": batch, "total_model_steps": 6000,
                      "learning_rate": 10 ** rng.uniform(-6, -3),
                      "learning_curves": {"matched": [[s, min(0.9, 0.3 + rate * s / 8000)]
                                                      for s in steps]}})
    path = tmp_path / "finetune.results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    se.compare(seeds=2, spec=f"opda:{path}", target=0.8, jobs=1, methods=("autotune", "random"))
    out = capsys.readouterr().out.strip().splitlines()
    assert "compute is counted in training examples" in "\n".join(out)
    assert "best TTA" in out[0] and " M examples" in out[0] and " h" not in out[0]
    rows = [line for line in out if line.split()[0] in ("autotune", "random")]
    assert len(rows) == 2 and all("M examples" in r and " h " not in r for r in rows)
    assert out[-1].startswith("autotune_median_Mexamples=")


def test_the_synthetic_fine_tuning_table_replays_in_opdas_fine_tuning_layout(tmp_path):
    """`benchmarks/finetune_table.py` writes runs the opda loader reads as a fine-tuning table
    (curves by validation set, compute in training examples); the same seed writes the same
    runs; a learning rate high enough collapses a run to a class's share, as a diverged
    model answers one class; and a study replays on it."""
    import subprocess

    script = _PATH.parent / "finetune_table.py"
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path in paths:
        done = subprocess.run([sys.executable, str(script), str(path), "--runs", "80"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert paths[0].read_bytes() == paths[1].read_bytes()
    rows = [json.loads(line) for line in paths[0].read_text().splitlines()]
    assert len(rows) == 80
    collapsed = [r for r in rows if max(a for _, a in r["learning_curves"]["matched"]) < 0.4]
    assert collapsed and all(r["learning_rate"] > 1.5e-4 for r in collapsed)
    table = load_table(f"opda:{paths[0]}", 0.86)
    assert table.unit == "examples" and table.shown == "matched"
    assert any(r.reached_at(0.86) is not None for r in table.runs)
    outcome = Replay(table, "autotune", seed=0, max_trials=10, min_compute_factor=0.0).run()
    assert outcome.trials == 10
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "c.jsonl"), "--runs", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--runs must be at least 2" in bad.stderr
    assert not (tmp_path / "c.jsonl").exists()
    for out, says in ((tmp_path, "is a folder"), (tmp_path / "no" / "d.jsonl", "no folder")):
        bad = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]
    assert not (tmp_path.parent / f"{tmp_path.name}.partial").exists()


def test_the_trailing_table_writes_long_schedules_that_trail_early_and_win(tmp_path):
    """`benchmarks/trailing_table.py` writes runs in opda's image layout that the loader reads;
    the same seed writes the same runs; a run whose LR per 256 images is far too high diverges
    within its first epochs; the run with the best TTA trails, at its second evaluation, a
    shorter schedule that was ahead earlier in time (the trait the table is for); and a study
    replays on it."""
    import subprocess

    script = _PATH.parent / "trailing_table.py"
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path in paths:
        done = subprocess.run([sys.executable, str(script), str(path), "--runs", "150",
                               "--seed", "1"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "150 synthetic image-classification runs (seed 1)" in done.stdout
    assert paths[0].read_bytes() == paths[1].read_bytes()
    rows = [json.loads(line) for line in paths[0].read_text().splitlines()]
    assert len(rows) == 150 and {len(r["learning_curve"]) for r in rows} - {1, 2, 3, 4}
    diverged = [r for r in rows if r["nan_train_loss"]]
    assert diverged and all(len(r["learning_curve"]) <= 5 for r in diverged)
    table = load_table(f"opda:{paths[0]}")          # target: what the best 2% reach
    winner = min((r for r in table.runs if r.reached_at(table.target) is not None),
                 key=lambda r: r.reached_at(table.target))
    assert any(o.planned_epochs < winner.planned_epochs and len(o.times) > 1
               and any(t <= winner.times[1] and v > winner.values[1]
                       for t, v in zip(o.times, o.values, strict=True))
               for o in table.runs)
    outcome = Replay(table, "autotune", seed=0, max_trials=10, min_compute_factor=0.0).run()
    assert outcome.trials == 10


@pytest.mark.parametrize("who", ["terminal", "main process"])
def test_an_interrupted_compare_says_so_in_one_line_and_leaves_no_worker(tmp_path, who):
    # Ctrl-C at a terminal reaches every process of the command; `kill -INT` the main one
    # alone. Either way: one line, exit 130, and the studies not started are dropped (a full
    # run of these 2,000 studies a method would take many minutes).
    import os
    import signal
    import subprocess
    import time

    import psutil

    proc = subprocess.Popen([sys.executable, "-u", str(_PATH), "compare", "--seeds", "2000",
                             "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:                 # the table's lines come before the pool
            if "what any tuner is up against" in line:
                break
        workers: list[psutil.Process] = []
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:
            workers = []
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:                             # a child may end while it is looked at
                    if "spawn_main" in " ".join(child.cmdline()):
                        workers.append(child)
                except psutil.Error:
                    pass
            time.sleep(0.2)
        assert len(workers) >= 2, "compare's worker processes never started"
        time.sleep(3)                            # they import and take their first studies
        if who == "terminal":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip() == "search_efficiency.py compare: interrupted", err[-2000:]
    assert "autotune_median_h" not in out
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive, [p.pid for p in alive]


def test_the_fine_tuning_table_writer_leaves_nothing_half_written(tmp_path):
    # interrupted, or a file it cannot write (a name too long for the file system): one line,
    # and no .partial file beside the table
    import os
    import signal
    import subprocess
    import time

    script = _PATH.parent / "finetune_table.py"
    out = tmp_path / "big.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(out), "--runs", "5000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not out.with_name(out.name + ".partial").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err == f"finetune_table.py: {out} not written: interrupted\n"
    assert list(tmp_path.iterdir()) == []

    for name, code, said in (("x" * 245 + ".jsonl", 1, "not written: cannot write it"),
                             ("x" * 260 + ".jsonl", 2, "cannot write")):
        # the first name fits and its .partial name passes 255 bytes; the second does not fit
        done = subprocess.run([sys.executable, str(script), str(tmp_path / name), "--runs",
                               "4"], capture_output=True, text=True, timeout=120)
        assert done.returncode == code, done.stderr
        lines = done.stderr.strip().splitlines()
        assert "Traceback" not in done.stderr and said in lines[-1], done.stderr
        assert code == 2 or len(lines) == 1
        assert list(tmp_path.iterdir()) == []


def test_a_studys_own_error_ends_the_pool_without_running_the_studies_left():
    # 1 job that fails and 60 that take a second each on 2 processes: 30 s if the rest were
    # run before the error came back; the error comes back as itself
    import time

    started = time.monotonic()
    with pytest.raises(ValueError, match="non-negative"):
        with se._pool(2) as pool:
            pool.map(time.sleep, [-1.0] + [1.0] * 60)
    assert time.monotonic() - started < 20


def test_the_yahpo_data_folder_is_an_argument_and_a_wrong_one_is_refused_in_one_line(tmp_path):
    import subprocess

    for command in (["compare", "--table", "yahpo-lcbench:167168"], ["paper"],
                    ["breakdown", "--table", "yahpo-lcbench:167168"]):
        done = subprocess.run([sys.executable, str(_PATH), *command, "--seeds", "1",
                               "--yahpo-data", str(tmp_path)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert str(tmp_path) in lines[0] and "--yahpo-data" in lines[0]


@pytest.mark.slow
def test_a_yahpo_data_folder_given_reaches_the_pools_workers(tmp_path):
    # the pool's workers are spawned afresh: they must see the folder given, not the default
    import os
    import subprocess

    surrogate = Path(os.environ.get("AUTOTUNE_EXTERNAL_DATA", _PATH.parents[2] / "shared" /
                                    "external")) / "yahpo-lcbench"
    if not (surrogate / "lcbench" / "model.onnx").is_file():
        pytest.skip("the YAHPO LCBench surrogate is not beside the repository")
    done = subprocess.run([sys.executable, str(_PATH), "compare", "--table",
                           "yahpo-lcbench:167168", "--seeds", "2", "--jobs", "2", "--methods",
                           "random", "--yahpo-data", str(surrogate)], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path,
                          env=os.environ | {"AUTOTUNE_EXTERNAL_DATA": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("autotune_median_h=")
