"""The replay's tables and harness: opda and YAHPO loaders, asynchronous workers, the
baselines' rules. Checks the harness, not a ratio."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import optuna
import pytest

from autotune.replay import METHODS, Replay, TableError, WallClockASHA, load_table
from autotune.replay._tables import increasing

optuna.logging.set_verbosity(optuna.logging.WARNING)
EXTERNAL = Path(os.environ.get("AUTOTUNE_EXTERNAL_DATA",
                               Path(__file__).resolve().parents[2] / "shared" / "external"))


def _opda_line(i: int, epochs: int, batch: int, lr: float, tops: list[float],
               epoch_s: float, nan: bool = False) -> dict:
    return {"iteration": i, "nan_train_loss": nan, "epochs": epochs, "batch_size": batch,
            "lr": lr, "lr_peak_epoch": epochs // 4, "momentum": 0.9, "weight_decay": 5e-5,
            "label_smoothing": 0.1,
            "learning_curve": [{"time": epoch_s * (k + 1), "epoch": k, "top_1": top,
                                "top_5": min(top + 0.2, 1.0), "train_loss": 5.0 - 4 * top}
                               for k, top in enumerate(tops)]}


def _opda_file(tmp_path: Path) -> Path:
    """Six runs written here in opda's format: a fast one that reaches 0.7 late, slower ones,
    one that diverged after two epochs and one whose loss went NaN before any evaluation."""
    lines = [
        _opda_line(1, 20, 1024, 0.8, [0.01 + 0.0365 * k for k in range(20)], 600.0),
        _opda_line(2, 30, 512, 0.3, [0.02 + 0.0243 * k for k in range(30)], 900.0),
        _opda_line(3, 40, 256, 0.1, [0.05 + 0.018 * k for k in range(40)], 1300.0),
        _opda_line(4, 25, 128, 0.05, [0.01 + 0.01 * k for k in range(25)], 2000.0),
        _opda_line(5, 60, 1024, 30.0, [0.001, 0.001], 600.0, nan=True),
        _opda_line(6, 50, 512, 40.0, [], 900.0, nan=True),
    ]
    path = tmp_path / "tuning.results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_an_opda_file_becomes_a_table_of_runs(tmp_path):
    table = load_table(f"opda:{_opda_file(tmp_path)}", 0.70)
    assert len(table.runs) == 6 and table.num_classes == 1000
    fast = table.runs[0]
    assert fast.times[:2] == (600.0, 1200.0) and fast.epochs[:2] == (1.0, 2.0)
    assert fast.planned_epochs == 20 and fast.end == "planned_epochs"
    assert table.best_tta == pytest.approx(600.0 * 20)       # 0.01 + 0.0365 * 19 >= 0.70
    diverged, empty = table.runs[4], table.runs[5]
    assert diverged.end == "diverged" and diverged.elapsed == pytest.approx(1200 + 300)
    assert empty.end == "diverged" and empty.times == () and empty.elapsed > 0
    # a proposal trains as its nearest recorded run
    assert table.train({"epochs": 21, "batch_size": 1024, "lr": 0.7, "lr_peak_share": 0.25,
                        "momentum": 0.9, "weight_decay": 5e-5, "label_smoothing": 0.1}) is fast


def test_an_opda_table_with_no_weight_decay_in_some_runs_is_searched_on_a_linear_scale(
        tmp_path):
    """Weight decay 0 (none) is a value runs are recorded with; opda's log scale cannot hold
    it, so the range turns linear, and the note says so (not a log range silently lost)."""
    path = _opda_file(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["weight_decay"] = 0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = load_table(f"opda:{path}", 0.70)
    assert not table.space["weight_decay"].log and table.space["lr"].log
    assert any(n.startswith("weight_decay is 0 in 1 run: searched on a linear scale")
               for n in table.notes)
    assert not any("linear scale" in n for n in load_table(
        f"opda:{_opda_file(tmp_path)}", 0.70).notes)


def test_a_table_path_in_the_home_folder_or_missing_or_a_folder_is_read_or_named(
        tmp_path, monkeypatch):
    """`--table opda:~/curves.jsonl`: the shell leaves a `~` after `opda:` as it is, so the
    loader reads it as the home folder; an empty path and a folder are named as such."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _opda_file(tmp_path)
    name = _opda_file(tmp_path).name
    assert len(load_table(f"opda:~/{name}", 0.70).runs) == 6
    with pytest.raises(TableError, match="no table path given"):
        load_table("opda:", 0.70)
    with pytest.raises(TableError, match=f"the table {tmp_path} is a folder"):
        load_table(f"opda:{tmp_path}", 0.70)


def test_an_opda_table_counting_epochs_from_one_is_read_as_epochs_done(tmp_path):
    """Another tool's export may number its entries 1, 2, ... E: an entry at a run's last
    epoch, none at 0. Read as opda's 0-indexed count, every run would overshoot its schedule."""
    path = _opda_file(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        for entry in row["learning_curve"]:
            entry["epoch"] += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = load_table(f"opda:{path}", 0.70)
    fast = table.runs[0]
    assert fast.epochs[:2] == (1.0, 2.0) and fast.epochs[-1] == fast.planned_epochs == 20
    assert any("count epochs from 1" in n for n in table.notes)
    assert not any("count epochs from 1" in n
                   for n in load_table(f"opda:{_opda_file(tmp_path)}", 0.70).notes)


@pytest.mark.parametrize("content, message", [
    ("not json\n", "line 1, is not JSON"),
    ('{"epochs": 3}\n', "lacks learning_curve"),
    ('{"epochs": 3, "lr": "fast", "learning_curve": []}\n', "lr must be a number"),
    ('{"epochs": 0, "learning_curve": []}\n', "epochs must be a positive number"),
    ('{"epochs": 3, "batch_size": "64", "learning_curve": []}\n',
     "batch_size must be a positive number, not the string '64' .write numbers without quotes"),
    ('{"epochs": 3, "lr": "0.1", "learning_curve": []}\n',
     "lr must be a number, not the string '0.1' .write numbers without quotes"),
    ('{"epochs": 3, "learning_curve": [{"time": 1.0, "top_1": "x"}]}\n',
     "top_1 must be a number, null or NaN"),
    ('{"epochs": 3, "learning_curve": [{"top_1": 0.5}]}\n',
     "entry 1 has neither time .* nor epoch: a replay needs when each evaluation was taken"),
    ('{"epochs": 3, "learning_curve": [{"time": 1.0, "top_1": 0.5}, {"time": 2.0, "top_1": '
     '0.6}, {"time": 3.0, "top_1": 76.1}]}\n',
     "entry 3: top_1 is 76.1; the target's metric is an accuracy, a share from 0 to 1 .or a "
     "percentage from 0 to 100 in every run"),
    ('{"epochs": 3, "learning_curve": [{"time": 1.0, "top_1": 50}, {"time": 2.0, "top_1": '
     '60}, {"time": 3.0, "top_1": 130}]}\n',
     "entry 3: top_1 is 130; the table records it in percent .most of its values are above "
     "1., from 0 to 100"),
    ('{"epochs": 3, "learning_curve": [{"time": 9.0, "top_1": 0.1}, {"time": 8.5, "top_1": 0.2}'
     ']}\n', "times must not decrease: each is the seconds since the run began"),
    ('{"epochs": 3, "learning_curve": [{"time": -5.0, "top_1": 0.9}]}\n',
     "entry 1: time is -5.0; it is the seconds since the run began"),
    ('{"epochs": 3, "learning_curve": [{"time": 0, "top_1": 0.9}]}\n',
     "entry 1: time is 0; .* a positive number"),
    ('{"epochs": 3, "learning_curve": [{"time": 1764900000.0, "top_1": 0.5}]}\n',
     "entry 1 is at 1.765e.09 s .* a clock's timestamp, not the seconds since the run began"),
    ('{"epochs": 3, "lr": -0.1, "learning_curve": []}\n',
     "lr is -0.1; a learning rate is a positive number"),
    ('{"epochs": 3, "weight_decay": -1e-05, "learning_curve": []}\n',
     "weight_decay is -1e-05; weight decay is 0 .none. or a positive number"),
    ('{"epochs": 30, "lr_peak_epoch": 500, "learning_curve": []}\n',
     "lr_peak_epoch is 500, beyond the run's 30 epochs"),
    ("", "holds no runs"),
])
def test_a_broken_opda_file_is_refused_with_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TableError, match=message):
        load_table(f"opda:{path}", 0.7)


def test_an_opda_table_may_come_compressed_and_a_binary_file_is_refused(tmp_path):
    import gzip

    plain = _opda_file(tmp_path)
    packed = tmp_path / "tuning.results.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert len(load_table(f"opda:{packed}", 0.7).runs) == 6
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(TableError, match="cannot read .* as JSON-lines text"):
        load_table(f"opda:{broken}", 0.7)
    array = tmp_path / "tuning.results.json"      # one JSON array of runs, as some tools save
    array.write_text(json.dumps([json.loads(line) for line in plain.read_text().splitlines()],
                                indent=2))
    assert len(load_table(f"opda:{array}", 0.7).runs) == 6
    array.write_text('[{"epochs": 3, "learning_curve": []}, 7]')
    with pytest.raises(TableError, match="JSON array whose items are not all objects"):
        load_table(f"opda:{array}", 0.7)
    array.write_text('[{"epochs": 3,')
    with pytest.raises(TableError, match="starts as a JSON array but is not JSON"):
        load_table(f"opda:{array}", 0.7)
    binary = tmp_path / "weights.jsonl"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(TableError, match="cannot read .* as JSON-lines text"):
        load_table(f"opda:{binary}", 0.7)


def test_an_opda_table_replays_top5_as_dawnbench_measures(tmp_path):
    path = _opda_file(tmp_path)
    top5 = load_table(f"opda:{path}", 0.85, metric="top5")
    assert top5.metric == "top5" and top5.runs[0].values[0] == pytest.approx(0.21)
    assert top5.best_tta == pytest.approx(600.0 * 19)        # 0.01 + 0.0365 * 18 + 0.2 >= 0.85
    outcome = Replay(top5, "autotune", seed=0, max_trials=10, min_compute_factor=0.0).run()
    assert outcome.trials == 10 and "reached" in {r for r, _, _ in outcome.spent}
    # the first reach splits the study's compute for `breakdown`: the trials up to it
    reasons = [r for r, _, _ in outcome.spent]
    assert outcome.first_reach == reasons.index("reached") + 1
    with pytest.raises(TableError, match="--metric top5 needs an opda table"):
        load_table(str(path), 0.85, metric="top5")
    with pytest.raises(TableError, match="entry 1 has no top3 .it holds epoch, top_1, top_5, "
                                         "train_loss.; give --metric one of its accuracies"):
        load_table(f"opda:{path}", 0.85, metric="top3")
    with pytest.raises(TableError, match="--metric must be top1, top5 or the name of"):
        load_table(f"opda:{path}", 0.85, metric="top 5; rm")


def test_an_opda_table_needs_a_target_that_some_run_reaches(tmp_path):
    """Without a target, the table's is what its best 2% of runs reach (of 6 runs: the best
    one's best); a target no run reaches is refused with the best any run reached."""
    path = _opda_file(tmp_path)
    table = load_table(f"opda:{path}")
    assert table.target == pytest.approx(0.05 + 0.018 * 39)
    assert any("the best top1 the top 2% of the 6 runs reach" in n for n in table.notes)
    assert table.best_tta == pytest.approx(1300.0 * 40)
    with pytest.raises(TableError, match=r"no run of table .* reaches top1 >= 0.9 \(the best "
                                         r"reaches 0.752\); give a lower --target, or none"):
        _ = load_table(f"opda:{path}", 0.9).best_tta
    with pytest.raises(TableError, match="no table at"):
        load_table(f"opda:{tmp_path / 'missing.jsonl'}", 0.7)
    with pytest.raises(TableError, match="unknown table kind 'odpa'"):
        load_table(f"odpa:{path}", 0.7)


def test_an_opda_table_recorded_in_percent_is_read_as_shares(tmp_path):
    """A table whose accuracy is in percent (BLEU, an accuracy in %: most values above 1)
    replays as shares, its target given either way; a share table's target above 1, or an
    LCBench accuracy's share target above 1, is refused, and LCBench's val_accuracy (which
    the surrogate gives in percent) takes a target in percent."""
    rows = [json.loads(line) for line in _opda_file(tmp_path).read_text().splitlines()]
    for row in rows:
        for entry in row["learning_curve"]:
            entry["bleu"] = round(100 * entry.pop("top_1"), 2)
    path = tmp_path / "percent.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shares = load_table(f"opda:{_opda_file(tmp_path)}", 0.70)
    for target in (70, 0.7):
        table = load_table(f"opda:{path}", target, metric="bleu")
        assert table.target == pytest.approx(0.7)
        assert table.runs[0].values == pytest.approx(shares.runs[0].values)
        assert table.best_tta == shares.best_tta
        assert any("bleu is recorded in percent (0 to 100): read as a share" in n
                   for n in table.notes)
    assert load_table(f"opda:{path}", metric="bleu").target == pytest.approx(
        load_table(f"opda:{_opda_file(tmp_path)}").target)
    assert not any("percent" in n for n in shares.notes)
    with pytest.raises(TableError, match=r"--target 70 is above 1, but top1 in .* is a share "
                                         r"from 0 to 1: give the target as one \(0.7 for 70%"):
        load_table(f"opda:{_opda_file(tmp_path)}", 70)
    with pytest.raises(TableError, match="--target 70 is above 1, but val_balanced_accuracy of "
                                         "yahpo-lcbench:167168 is a share"):
        load_table("yahpo-lcbench:167168", 70, metric="val_balanced_accuracy")


def test_an_opda_table_from_another_search_is_searched_over_what_it_holds(tmp_path):
    """A table the project does not have: other ranges (5 to 300 epochs, lr down to 1e-4,
    batch 64), no momentum or label smoothing searched, a run logged to NaN accuracy and one
    to null. The space covers its runs, the run that went NaN ended there as diverged, and
    autotune replays it unchanged."""
    lines = []
    for i, (epochs, batch, lr, epoch_s) in enumerate([(5, 64, 1e-4, 40.0), (300, 2048, 0.4, 9.0),
                                                      (40, 256, 0.05, 20.0), (80, 64, 0.01, 30.0),
                                                      (120, 2048, 3.0, 9.0)]):
        line = _opda_line(i, epochs, batch, lr, [min(0.02 + 0.9 * (k + 1) / epochs, 0.9)
                                                 for k in range(epochs)], epoch_s)
        del line["momentum"], line["label_smoothing"]
        lines.append(line)
    lines[4]["learning_curve"][3]["top_1"] = float("nan")     # blew up at its fourth epoch
    lines[3]["learning_curve"][10]["top_1"] = None
    lines[0]["extra"] = "ignored"
    path = tmp_path / "other.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))   # NaN as JSON allows
    table = load_table(f"opda:{path}", 0.60)
    assert set(table.space) == {"epochs", "batch_size", "lr", "lr_peak_share"}
    assert "weight_decay is 5e-05 in every run: not searched" in table.notes
    assert "extra is not in every run: searched without it" in table.notes
    assert table.space["epochs"].low == 5 and table.space["epochs"].high == 300
    assert table.space["lr"].low == pytest.approx(1e-4) and table.space["lr"].log
    assert table.space["batch_size"].choices == (64, 256, 2048)
    nan, null = table.runs[4], table.runs[3]
    assert nan.end == "diverged" and len(nan.times) == 3
    assert null.end == "diverged" and len(null.times) == 10
    assert table.train({"epochs": 6, "batch_size": 64, "lr": 1.2e-4,
                        "lr_peak_share": 0.2}) is table.runs[0]
    assert table.train({"epochs": 118, "batch_size": 2048, "lr": 2.5,
                        "lr_peak_share": 0.2}) is nan
    outcome = Replay(table, "autotune", seed=0, max_trials=12, min_compute_factor=0.0).run()
    assert outcome.trials == 12 and "reached" in {reason for reason, _, _ in outcome.spent}


def test_an_opda_table_with_hyperparameters_of_its_own_searches_them_too(tmp_path):
    """Another search's own knobs (a dropout drawn log-uniformly, an optimizer, a flag) are
    searched as the runs show them; a run number and a key that holds lists are not."""
    import random as _random
    rng = _random.Random(3)
    lines = []
    for i in range(40):
        line = _opda_line(i, 10 + i % 7, 256, 0.1 * (1 + i % 5), [0.1 + 0.06 * k
                                                                  for k in range(10 + i % 7)],
                          30.0 + i)
        line.update(run_id=i + 1, dropout=10 ** rng.uniform(-4, -1),
                    warmup=rng.uniform(0.0, 0.3), optimizer=rng.choice(["sgd", "lars"]),
                    nesterov=rng.choice([True, False]), layers=rng.randint(2, 6),
                    tags=["a", "b"])
        lines.append(line)
    path = tmp_path / "own.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = load_table(f"opda:{path}", 0.6)
    assert {"dropout", "warmup", "optimizer", "nesterov", "layers"} <= set(table.space)
    assert "run_id" not in table.space and "tags" not in table.space
    assert "batch_size" not in table.space            # 256 in every run
    assert table.space["dropout"].log and not table.space["warmup"].log
    assert table.space["optimizer"].choices == ("lars", "sgd")
    assert table.space["layers"].low == min(line["layers"] for line in lines)
    assert any("run_id numbers the runs" in n for n in table.notes)
    assert any("tags is not a number" in n for n in table.notes)
    params = {k: v for k, v in lines[7].items() if k in table.space}
    params["lr_peak_share"] = lines[7]["lr_peak_epoch"] / lines[7]["epochs"]
    assert table.train(params) is table.runs[7]
    outcome = Replay(table, "autotune", seed=0, max_trials=10, min_compute_factor=0.0).run()
    assert outcome.trials == 10


def _steps_line(i: int, lr: float, warmup: int, accs: list[float], step_s: float) -> dict:
    """A run in the layout of opda's language-model tables: hyperparameters nested, a
    schedule counted in steps, evaluations every 500 steps timed by eval_end_time."""
    return {"iteration": i, "nan_train_loss": False,
            "hyperparameters": {"n_embd": 384, "total_steps": 500 * len(accs),
                                "warmup_steps": warmup, "lr": lr, "beta1": 0.9 - i / 100,
                                "dropout": 0.01 * i},
            "learning_curve": [{"step": 500 * (k + 1), "lr": lr,
                                "train_end_time": step_s * (k + 1) - 3.0,
                                "eval_end_time": step_s * (k + 1), "train_raw_loss": 6 - 9 * a,
                                "val_raw_accuracy": a} for k, a in enumerate(accs)]}


def test_an_opda_table_counted_in_steps_replays_any_accuracy_it_holds(tmp_path):
    """opda's language-model layout: nested hyperparameters, total_steps, step and
    eval_end_time in each entry, and an accuracy named as the table names it."""
    lines = [_steps_line(i, 10 ** (-4 + i / 4), 100 * i,
                         [min(0.05 + (0.03 + 0.01 * (i % 4)) * (k + 1), 0.5) for k in range(12)],
                         60.0 + 5 * (i % 3))
             for i in range(12)]
    path = tmp_path / "llama.results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = load_table(f"opda:{path}", 0.40, metric="val_raw_accuracy")
    assert set(table.space) == {"warmup_steps", "lr", "beta1", "dropout"}
    assert "n_embd is 384 in every run: not searched" in table.notes
    assert "total_steps is 6000 in every run: not searched" in table.notes
    assert any("chance accuracy of val_raw_accuracy unknown" in n for n in table.notes)
    assert table.num_classes is None and table.shown == "val_raw_accuracy"
    run = table.runs[3]
    assert run.planned_epochs == 6000 and run.epochs[:2] == (500.0, 1000.0)
    assert run.times[:2] == (60.0, 120.0)                          # eval_end_time
    assert table.first_units == 500
    for method in ("autotune", "tpe_hyperband", "tpe_median_sh", "dehb"):
        outcome = Replay(table, method, seed=0, max_trials=12, min_compute_factor=0.0).run()
        # every trial trains at least its first evaluation: no baseline's budget is below it
        assert outcome.trials == 12 and min(s for _, _, s in outcome.spent) >= 60.0
    with pytest.raises(TableError, match="no run of table .* reaches val_raw_accuracy >= 0.9"):
        _ = load_table(f"opda:{path}", 0.9, metric="val_raw_accuracy").best_tta
    # a warm-up counted in epochs beside a schedule counted in steps: searched as it is
    peaked = [{**line, "hyperparameters": {**line["hyperparameters"], "lr_peak_epoch": i % 5}}
              for i, line in enumerate(lines)]
    path.write_text("".join(json.dumps(line) + "\n" for line in peaked))
    table = load_table(f"opda:{path}", 0.40, metric="val_raw_accuracy")
    assert "lr_peak_epoch" in table.space and "lr_peak_share" not in table.space
    assert (table.space["lr_peak_epoch"].low, table.space["lr_peak_epoch"].high) == (0, 4)
    del lines[2]["learning_curve"][1]["step"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(TableError, match="line 3: learning_curve entry 2 lacks step"):
        load_table(f"opda:{path}", 0.40, metric="val_raw_accuracy")


def _sets_line(i: int, epochs: int, batch: int, lr: float, accs: list[float]) -> dict:
    """A run in the layout of opda's fine-tuning tables: no clock, curves of [step, accuracy]
    pairs by validation set, evaluations every 1,000 steps and at each epoch's end."""
    per_epoch = 40_000 // batch
    total = epochs * per_epoch
    steps = sorted({*range(1000, total, 1000), *(per_epoch * e for e in range(1, epochs + 1))})
    acc = [min(accs[0] + (accs[1] - accs[0]) * s / total, 0.95) for s in steps]
    return {"iteration": i, "num_train_epochs": epochs, "train_batch_size": batch,
            "total_model_steps": total, "learning_rate": lr, "warmup_steps": 50 * i,
            "cls_drop_out": 0.02 * i,
            "learning_curves": {"matched": [[s, a] for s, a in zip(steps, acc, strict=True)],
                                "mismatched": [[s, a - 0.01] for s, a in zip(steps, acc,
                                                                             strict=True)]}}


def test_an_opda_table_without_times_replays_on_the_examples_it_trained(tmp_path):
    """opda's fine-tuning layout keeps curves of [step, accuracy] by validation set and no
    clock: the replay counts compute in training examples (steps x batch size), says so,
    replays the first set unless --metric names another, and does not search the steps
    that the epochs and the batch size fix."""
    lines = [_sets_line(i, 1 + i % 3, 16 + 4 * i, 10 ** (-5 + i / 6), [0.4 + 0.02 * i, 0.9])
             for i in range(12)]
    path = tmp_path / "deberta.results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = load_table(f"opda:{path}", 0.85)
    assert table.unit == "examples" and table.shown == "matched"
    assert any("replaying matched, the first" in n for n in table.notes)
    assert any("training examples (step x train_batch_size)" in n for n in table.notes)
    assert set(table.space) == {"num_train_epochs", "train_batch_size", "learning_rate",
                                "warmup_steps", "cls_drop_out"}
    run, line = table.runs[5], lines[5]
    pairs = line["learning_curves"]["matched"]
    assert run.epochs == tuple(float(s) for s, _ in pairs)
    assert run.times == tuple(float(s) * line["train_batch_size"] for s, _ in pairs)
    assert run.values == tuple(a for _, a in pairs)
    assert run.planned_epochs == line["total_model_steps"]
    assert table.amount(2.5e6) == "2.5 M examples" and table.scale[2] == "Mexamples"
    other = load_table(f"opda:{path}", 0.85, metric="mismatched")
    assert other.runs[5].values == tuple(a for _, a in line["learning_curves"]["mismatched"])
    # a step one set lacks: no evaluation of the other set's metric there, not a refusal
    del lines[5]["learning_curves"]["mismatched"][2]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert load_table(f"opda:{path}", 0.85).runs[5].values == run.values
    assert len(load_table(f"opda:{path}", 0.85, metric="mismatched").runs[5].values) == \
        len(pairs) - 1
    for method in ("autotune", "asha_wallclock", "tpe_median"):
        outcome = Replay(table, method, seed=0, max_trials=8, min_compute_factor=0.0).run()
        assert outcome.trials == 8
    # a pair that is not [step, accuracy]: refused in one line that says what a pair is
    lines[3]["learning_curves"]["matched"][1] = {"step": 2000, "acc": 0.5}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(TableError, match=r"line 4: learning_curves\['matched'\] entry 2 .*"
                                         r"\[step, accuracy\] pair"):
        load_table(f"opda:{path}", 0.85)


def test_a_table_without_times_that_counts_its_tokens_replays_on_them(tmp_path):
    """A language-model table whose entries count the tokens trained on and record no time:
    the tokens are the clock (a step's tokens need no batch size)."""
    lines = [_steps_line(i, 10 ** (-4 + i / 4), 100 * i,
                         [min(0.05 + (0.03 + 0.01 * (i % 4)) * (k + 1), 0.5) for k in range(12)],
                         60.0) for i in range(8)]
    for line in lines:
        for entry in line["learning_curve"]:
            del entry["eval_end_time"], entry["train_end_time"]
            entry["tokens"] = entry["step"] * 64 * 512
    path = tmp_path / "llama.results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = load_table(f"opda:{path}", 0.40, metric="val_raw_accuracy")
    assert table.unit == "tokens" and table.scale[2] == "Gtokens"
    assert any("counted in tokens trained on" in n for n in table.notes)
    assert table.runs[2].times[:2] == (500 * 64 * 512.0, 1000 * 64 * 512.0)
    assert table.runs[2].epochs[:2] == (500.0, 1000.0)
    assert Replay(table, "autotune", seed=0, max_trials=6, min_compute_factor=0.0).run() \
        .trials == 6


def test_an_epoch_table_without_times_replays_on_the_epochs_it_trained(tmp_path):
    """An image table whose evaluations record no time: compute is the epochs trained."""
    path = _opda_file(tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        for entry in line["learning_curve"]:
            del entry["time"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = load_table(f"opda:{path}", 0.7)
    assert table.unit == "epochs" and table.amount(12.0) == "12 epochs"
    run = next(r for r in table.runs if r.times)
    assert run.times == run.epochs and run.epochs[0] == 1.0


def test_an_opda_tables_classes_set_chance_accuracy(tmp_path):
    """Chance accuracy follows the data set: the rows' num_classes, a given number, or
    ImageNet's 1,000 with a note saying so; a table saying two numbers is refused."""
    path = _opda_file(tmp_path)
    table = load_table(f"opda:{path}", 0.7)
    assert table.num_classes == 1000 and any("1,000 classes assumed" in n for n in table.notes)
    assert load_table(f"opda:{path}", 0.7, num_classes=10).num_classes == 10
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "num_classes": 10}) + "\n" for r in rows))
    table = load_table(f"opda:{path}", 0.7)
    assert table.num_classes == 10 and not any("classes" in n for n in table.notes)
    assert "num_classes" not in table.space
    rows[2]["num_classes"] = 100
    path.write_text("".join(json.dumps({**r, "num_classes": r.get("num_classes", 10)}) + "\n"
                            for r in rows))
    with pytest.raises(TableError, match="num_classes must be one whole number >= 2"):
        load_table(f"opda:{path}", 0.7)
    with pytest.raises(TableError, match="--num-classes must be at least 2"):
        load_table(f"opda:{path}", 0.7, num_classes=1)
    with pytest.raises(TableError, match="--num-classes is for opda tables"):
        load_table(str(path), 0.7, num_classes=10)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("workers", [1, 8])
def test_every_method_replays_an_opda_table_with_one_or_eight_workers(tmp_path, method,
                                                                      workers):
    table = load_table(f"opda:{_opda_file(tmp_path)}", 0.60)
    replay = Replay(table, method, seed=1, workers=workers, max_trials=24,
                    min_compute_factor=2.0)
    outcome = replay.run()
    trials = replay.study.trials
    assert outcome.trials == len(outcome.spent) == len([t for t in trials
                                                         if t.state.is_finished()])
    assert outcome.compute == pytest.approx(sum(o + s for _, o, s in outcome.spent))
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in trials)
    for goal, found in outcome.found.items():
        if found:   # found within what the workers had spent by then
            assert 0 < outcome.to_goal[goal] <= workers * outcome.compute
            assert outcome.to_goal[goal] >= table.best_tta   # it trained that long at least
        else:
            assert outcome.to_goal[goal] == outcome.compute


def test_eight_workers_run_trials_side_by_side(tmp_path):
    table = load_table(f"opda:{_opda_file(tmp_path)}", 0.60)
    replay = Replay(table, "random", seed=0, workers=8, max_trials=16, min_compute_factor=0.0)
    replay.run()
    starts = sorted(t.datetime_start for t in replay.study.trials)
    # the first eight trials were asked for before any of them ended
    first_end = min(t.datetime_complete for t in replay.study.trials)
    assert sum(s <= first_end for s in starts) >= 8


def test_autotune_stops_losing_trials_on_an_opda_table(tmp_path):
    table = load_table(f"opda:{_opda_file(tmp_path)}", 0.60)
    outcome = Replay(table, "autotune", seed=0, max_trials=30, min_compute_factor=0.0).run()
    reasons = {reason for reason, _, _ in outcome.spent}
    assert "reached" in reasons and reasons & {"bound", "projection", "rung"}
    assert outcome.found[1.5]


def test_wall_clock_asha_stops_the_bottom_of_each_rung_as_ray_tune_does():
    asha = WallClockASHA(eta=3, grace=10.0)       # rungs at 10, 30, 90 s
    assert not asha.on_result(0, 5.0, 0.1)        # before the grace period
    assert not asha.on_result(0, 10.0, 0.5)       # first at the rung: recorded
    assert not asha.on_result(1, 11.0, 0.6)       # above the 67th percentile of [0.5]
    assert asha.on_result(2, 12.0, 0.4)           # below it: stopped
    assert not asha.on_result(1, 20.0, 0.1)       # already recorded at that rung: goes on
    assert not asha.on_result(1, 32.0, 0.6)       # first at the next rung: recorded
    assert asha.on_result(3, 31.0, 0.05)          # the highest rung it passed decides alone
    assert set(asha.rungs[1]) == {1, 3} and set(asha.rungs[0]) == {0, 1, 2}


def test_the_grace_period_is_the_studys_first_report():
    asha = WallClockASHA(eta=3)
    asha.on_result(0, 600.0, 0.01)
    assert asha.grace == 600.0


@pytest.mark.skipif(not (EXTERNAL / "yahpo-lcbench" / "lcbench" / "model.onnx").is_file(),
                    reason="the YAHPO LCBench surrogate is not beside the repository")
def test_a_yahpo_instance_replays_through_the_surrogate():
    pytest.importorskip("yahpo_gym")
    table = load_table("yahpo-lcbench:167168", yahpo_data=EXTERNAL / "yahpo-lcbench")
    assert table.num_classes is None and 0.3 < table.target < 1.0
    assert table.notes and "top 2%" in table.notes[0]
    run = table.runs[0]
    assert run.planned_epochs == 52 and len(run.times) == 52
    assert all(b > a for a, b in zip(run.times, run.times[1:], strict=False))
    for method in ("autotune", "asha_wallclock"):
        outcome = Replay(table, method, seed=0, max_trials=20, min_compute_factor=0.0).run()
        # it stops at 20 trials, or sooner once both goals were found and 20 x the best TTA
        # of compute spent
        assert outcome.compute > 0 and (outcome.trials >= 20 or (
            all(outcome.found.values()) and outcome.compute >= 20 * table.best_tta))
    with pytest.raises(TableError, match="LCBench has no instance"):
        load_table("yahpo-lcbench:nosuch", yahpo_data=EXTERNAL / "yahpo-lcbench")
    # the surrogate gives val_accuracy in percent: a target may be given so
    percent = load_table("yahpo-lcbench:167168", 100 * table.target,
                         yahpo_data=EXTERNAL / "yahpo-lcbench")
    assert percent.target == pytest.approx(table.target)


def test_surrogate_epoch_times_that_dip_are_spread_between_record_highs():
    # each epoch's cumulative time is predicted on its own and may dip below an earlier one
    assert increasing([4.0, 3.0, 3.5, 7.0, 8.0]) == (4.0, 5.0, 6.0, 7.0, 8.0)
    # after the last record high, the run's average pace up to it
    assert increasing([2.0, 4.0, 3.0, 3.9]) == (2.0, 4.0, 6.0, 8.0)
    assert increasing([1.0, 2.0, 3.0]) == (1.0, 2.0, 3.0)    # nothing to repair
    assert increasing([]) == ()


def test_dehb_trains_each_job_up_to_its_fidelity(tmp_path):
    pytest.importorskip("dehb")
    table = load_table(f"opda:{_opda_file(tmp_path)}", 0.60)
    replay = Replay(table, "dehb", seed=0, max_trials=12, min_compute_factor=0.0)
    outcome = replay.run()
    assert outcome.trials >= 12
    cut = [seconds for reason, _, seconds in outcome.spent if reason == "fidelity"]
    # Hyperband's first bracket gives jobs a few epochs of schedules up to 60 epochs long
    assert cut and min(cut) < max(r.elapsed for r in table.runs)


def test_an_opda_file_given_without_its_kind_says_to_name_it(tmp_path):
    """A bare path is read as a table `record` wrote; an opda file there is named as such."""
    path = _opda_file(tmp_path)
    with pytest.raises(TableError, match=r"holds opda-format runs .* give --table opda:"):
        load_table(str(path), 0.7)
    other = tmp_path / "other.jsonl"
    other.write_text('{"step": 1}\n')
    with pytest.raises(TableError, match=r"line 1, is not a recorded autotune row .* opda:PATH"):
        load_table(str(other))


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_an_opda_table_saved_with_a_byte_order_mark_reads(tmp_path, encoding):
    """Windows tools write one: Notepad's UTF-8 with a BOM, PowerShell's redirect UTF-16."""
    plain = _opda_file(tmp_path)
    marked = tmp_path / f"marked-{encoding}.jsonl"
    marked.write_bytes(plain.read_text(encoding="utf-8").encode(encoding))
    assert marked.read_bytes()[:2] != plain.read_bytes()[:2]
    table = load_table(f"opda:{marked}", 0.7)
    assert [r.times for r in table.runs] == [r.times for r in load_table(f"opda:{plain}",
                                                                           0.7).runs]


def test_the_uniform_bound_counts_goal_proposals_and_an_oracle_pruners_compute():
    """A space of one number in [0, 1): below 0.25 trains the goal run (it reaches at 10 s),
    above it a run whose first evaluation comes at 1 s (and never reaches). A quarter of
    uniform proposals are goals; the oracle stops every other run at 1 s, so a study spends
    N s on the N misses before its first goal (geometric, p = 1/4: median N = 2), then 10 s."""
    from optuna.distributions import FloatDistribution

    from autotune.replay import Run, Table, uniform_bound

    goal = Run((5.0, 10.0), (0.5, 0.9), (1.0, 2.0), 2.0)
    slow = Run((1.0, 20.0), (0.2, 0.6), (1.0, 2.0), 2.0)
    table = Table("two runs", 0.8, [goal, slow], {"x": FloatDistribution(0.0, 1.0)},
                  lambda params: goal if params["x"] < 0.25 else slow)
    bound = uniform_bound(table, 1.5, draws=4000, studies=4000)
    assert bound is not None
    assert 0.23 < bound.hit_share < 0.27
    assert bound.median_s == 12.0
    assert 10.0 <= bound.p25_s <= 11.0 and 13.0 <= bound.p75_s <= 15.0
    assert bound.miss_share == pytest.approx((1 - bound.hit_share) ** 150)
    never = Table("no goal drawn", 0.8, [goal, slow], table.space, lambda params: slow)
    assert uniform_bound(never, 1.5, draws=200) is None


def _loss_file(tmp_path: Path) -> Path:
    """The six runs of ``_opda_file`` with a validation loss falling as their top-1 rises
    (val_loss = 3 - 2.9 x top-1), as a study of a loss target exports them."""
    path = _opda_file(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        for entry in row["learning_curve"]:
            entry["val_loss"] = 3.0 - 2.9 * entry["top_1"]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("method", METHODS)
def test_a_table_of_a_metric_that_falls_replays_with_mode_min(tmp_path, method):
    path = _loss_file(tmp_path)
    table = load_table(f"opda:{path}", 1.26, metric="val_loss", mode="min")
    accuracy = load_table(f"opda:{path}", 0.60)
    # val_loss <= 1.26 where top-1 >= 0.60: the same runs reach, at the same times
    assert table.falls and table.best_tta == pytest.approx(accuracy.best_tta)
    assert [r.reached_at(1.26, True) for r in table.runs] == \
        [r.reached_at(0.60) for r in accuracy.runs]
    replay = Replay(table, method, seed=1, max_trials=24, min_compute_factor=2.0)
    outcome = replay.run()
    assert outcome.trials == len(outcome.spent) > 0
    for trial in replay.study.trials:
        best = trial.user_attrs.get("best_metric")
        if best is not None and method == "autotune":
            curve = [row[1] for row in trial.user_attrs["curve"]]
            assert best == pytest.approx(min(curve))            # a loss's best: its least
    if method == "autotune":
        assert outcome.found[1.5]


def test_a_falling_metric_needs_mode_min_and_an_accuracy_refuses_it(tmp_path):
    path = _loss_file(tmp_path)
    with pytest.raises(TableError, match="val_loss is a metric that falls.*give --mode min"):
        load_table(f"opda:{path}", 0.5, metric="val_loss")
    with pytest.raises(TableError, match="--mode min is for a metric that falls"):
        load_table(f"opda:{path}", 0.5, mode="min")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["learning_curve"][0]["val_loss"] = -1.0
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(TableError, match="val_loss is -1; a metric that falls"):
        load_table(f"opda:{path}", 0.5, metric="val_loss", mode="min")


@pytest.mark.skipif(not (EXTERNAL / "yahpo-lcbench" / "lcbench" / "model.onnx").is_file(),
                    reason="the YAHPO LCBench surrogate is not beside the repository")
def test_a_yahpo_instance_replays_its_validation_loss_with_mode_min():
    pytest.importorskip("yahpo_gym")
    table = load_table("yahpo-lcbench:167168", yahpo_data=EXTERNAL / "yahpo-lcbench",
                       metric="val_cross_entropy", mode="min")
    assert table.falls and table.target > 0 and "val_cross_entropy" in table.notes[0]
    # the best 2% of the sample reach at or below the target by their end; the rest do not
    reach = [r.reached_at(table.target, True) is not None for r in table.runs]
    assert 0.015 <= sum(reach) / len(reach) <= 0.03
    for method in ("autotune", "asha_wallclock"):
        outcome = Replay(table, method, seed=0, max_trials=20, min_compute_factor=0.0).run()
        # it stops at 20 trials, or sooner once both goals were found and 20 x the best TTA
        # of compute spent
        assert outcome.compute > 0 and (outcome.trials >= 20 or (
            all(outcome.found.values()) and outcome.compute >= 20 * table.best_tta))
    with pytest.raises(TableError, match="give --mode min"):
        load_table("yahpo-lcbench:167168", yahpo_data=EXTERNAL / "yahpo-lcbench",
                   metric="val_cross_entropy")
    balanced = load_table("yahpo-lcbench:167168", yahpo_data=EXTERNAL / "yahpo-lcbench",
                          metric="val_balanced_accuracy")
    assert not balanced.falls and 0.3 < balanced.target < 1.0
    assert all(0 <= v <= 1 for r in balanced.runs[:50] for v in r.values)
    with pytest.raises(TableError, match="replays top1 .*val_balanced_accuracy"):
        load_table("yahpo-lcbench:167168", yahpo_data=EXTERNAL / "yahpo-lcbench",
                   metric="test_balanced_accuracy")


@pytest.mark.parametrize("batch, shown", [
    (0, "0"), ("32", "the string '32' (write numbers without quotes)"), (None, "None")])
def test_a_timeless_step_table_needs_every_runs_batch_size(tmp_path, batch, shown):
    """Without time, a step run's compute is its steps x its batch size: a run whose batch
    size is missing or not a positive number is refused in one line, not read in steps."""
    lines = [_sets_line(i, 1, 16 + 4 * i, 10 ** (-5 + i / 6), [0.4, 0.9]) for i in range(4)]
    if batch is None:
        del lines[2]["train_batch_size"]
    else:
        lines[2]["train_batch_size"] = batch
    path = tmp_path / "deberta.results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(TableError, match=rf"line 3: train_batch_size must be a positive number, "
                                         rf"not {re.escape(shown)}; with no time recorded"):
        load_table(f"opda:{path}", 0.85)
