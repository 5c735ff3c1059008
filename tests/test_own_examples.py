"""A script of the user's own on data that are not images (``trainer.data: {kind: examples,
train_examples: N}``): the README's tabular example (examples/own_tabular, scikit-learn's
breast-cancer table) tuned through the real launcher, what such a study makes of its classes,
and what is refused before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.cli import main

from .conftest import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "own_tabular"


def example_copy(tmp_path: Path, data: dict | None = None, **study_keys) -> Path:
    """The example's folder copied to ``tmp_path``, with ``data`` as its trainer.data."""
    folder = tmp_path / "tabular"
    shutil.copytree(EXAMPLE, folder)
    study = yaml.safe_load((folder / "study.yaml").read_text())
    if data is not None:
        study["trainer"]["data"] = data
    study.update(study_keys)
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder


def test_a_script_of_your_own_is_tuned_on_a_table_counted_as_examples(tmp_path):
    # the script reports its own target metric, `accuracy`: a name the study file allowed,
    # but the pruner, the learning-curve plot and MLflow knew only top1 and top5 (a traceback)
    folder = example_copy(tmp_path, target={"metric": "accuracy", "value": 0.97})
    script = folder / "train.py"
    script.write_text(script.read_text().replace("trial.report(top1=", "trial.report(accuracy="))
    done = run_cli("start", "study", str(folder / "study.yaml"), "--n-trials", "2",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    trials = optuna.load_study(study_name="own_tabular", storage=storage).trials
    assert len(trials) == 2
    for trial in trials:
        assert trial.user_attrs.get("outcome") in ("reached", "censored"), trial.user_attrs
        assert trial.intermediate_values, f"trial {trial.number} never evaluated"
        curve = trial.user_attrs["curve"]
        assert all(0 <= row[1] <= 1 for row in curve)          # accuracy, in top-1's place
        plan = json.loads((tmp_path / "autotune-runs" / "own_tabular" /
                           f"trial-{trial.number}" / "plan.json").read_text())
        # steps and epochs counted by the 455 rows the script trains on
        assert plan["train_size"] == 455 and plan["num_classes"] == 2
        assert plan["steps_per_epoch"] == 455 // plan["global_batch"]
        assert plan["params"]["width"] in (16, 64, 256)
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("own_tabular")
    runs = [r for r in client.search_runs([experiment.experiment_id])
            if r.info.run_name.startswith("trial-")]
    assert runs and all("accuracy" in r.data.metrics for r in runs)
    exported = run_cli("export", "curves", "own_tabular", "--all", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert rows and all("accuracy" in e for r in rows for e in r["learning_curve"])


def test_examples_of_no_stated_classes_have_no_chance_level(tmp_path):
    from autotune import config
    from autotune._study_setup import checked_space
    from autotune.modes import make_pruner

    folder = example_copy(tmp_path, data={"kind": "examples", "train_examples": 455})
    cfg, space, size = checked_space(config.load(str(folder / "study.yaml"), {}))
    assert size == 455 and cfg.trainer.num_classes is None
    assert make_pruner(cfg).rules.chance == 0.0        # the at-chance rules never fire
    folder = example_copy(tmp_path / "two", data={"kind": "examples", "train_examples": 455,
                                                  "num_classes": 2})
    cfg, _, _ = checked_space(config.load(str(folder / "study.yaml"), {}))
    assert make_pruner(cfg).rules.chance == 0.5


def test_a_scripts_own_target_metric_takes_top1s_place_with_no_chance_level(tmp_path):
    from autotune import config
    from autotune._study_setup import checked_space
    from autotune.decisions import curve_row
    from autotune.modes import make_pruner

    folder = example_copy(tmp_path, target={"metric": "f1", "value": 0.9})
    cfg, _, _ = checked_space(config.load(str(folder / "study.yaml"), {}))
    pruner = make_pruner(cfg)
    assert pruner.metric == "top1" and pruner.rules.chance == 0.0   # F1's chance: unknown
    row = curve_row({"elapsed_s": 2.0, "f1": 0.8, "top1": 0.95, "epoch": 1}, 4, "f1")
    assert row[:4] == [2.0, 0.8, None, 0.25]
    assert curve_row({"elapsed_s": 2.0, "top1": 0.95, "top5": 0.99, "epoch": 1}, 4,
                     "top5")[1:3] == [0.95, 0.99]


def test_a_space_sizes_itself_to_the_examples(tmp_path):
    from autotune import config
    from autotune._study_setup import checked_space

    folder = example_copy(tmp_path, data={"kind": "examples", "train_examples": 300})
    (folder / "space.py").write_text('''
from autotune import Float, Int, SearchSpace

def space(world_size, data):
    assert data.kind == "examples" and data.image_size is None and data.num_classes is None
    return SearchSpace(Int("global_batch", 8, data.train_images // 2, step=2),
                       Float("lr_per_256", 0.01, 1.0, log=True), Int("epochs", 2, 10),
                       name="sized",
                       world_size=world_size)
''')
    cfg, space, size = checked_space(config.load(str(folder / "study.yaml"), {}))
    assert size == 300 and space.name == "sized"


@pytest.mark.parametrize(("data", "program", "expected"), [
    ({"kind": "examples", "train_examples": 455}, "image_classifier",
     "trainer.data.kind examples describes data a script of your own loads itself"),
    ({"kind": "examples", "num_classes": 2}, None,
     "trainer.data.train_examples must be set when kind is examples"),
    ({"kind": "examples", "train_examples": 0}, None,
     "trainer.data.train_examples must be a whole number from 1 to"),
    ({"kind": "examples", "train_examples": "455 rows"}, None,
     "trainer.data.train_examples must be a whole number from 1 to"),
    ({"kind": "examples", "train_examples": 455, "path": "data.csv"}, None,
     "unknown key(s) path (your script opens its data itself: give it the path as a Fixed "
     "parameter of its space, declared in trainer.params); an examples source takes kind, "
     "train_examples, num_classes"),
    ({"kind": "examples", "train_examples": 455, "num_classes": 1}, None,
     "trainer.data.num_classes must be a whole number from 2 to"),
    ({"kind": "table", "train_examples": 455}, None,
     "'table' is not allowed; use digits, imagefolder (with path) or synthetic, or, for a "
     "script of your own that loads its data itself (text, tables, anything), examples"),
    ({"kind": "examples", "train_examples": 1}, None,
     "the 1 training examples cannot give each of 2 ranks an example a step"),
    ({"kind": "examples", "train_examples": 455}, "probe",
     "trainer.probe_micro_batch measures the bundled image classifier's model on images, not "
     "a script of your own's"),
])
def test_examples_refused_in_one_line_before_anything_is_written(workdir, capsys, data,
                                                                 program, expected):
    folder = example_copy(workdir, data=data)
    if program == "probe":
        study = yaml.safe_load((folder / "study.yaml").read_text())
        study["trainer"]["probe_micro_batch"] = True
        (folder / "study.yaml").write_text(yaml.safe_dump(study))
    elif program:
        study = yaml.safe_load((folder / "study.yaml").read_text())
        study["trainer"]["program"] = program
        study["trainer"].pop("params")
        study["search_space"] = "quickstart"
        (folder / "study.yaml").write_text(yaml.safe_dump(study))
    for command in (["space", "check"], ["start", "study"]):
        code = main([*command, str(folder / "study.yaml")])
        _, err = capsys.readouterr()
        assert code == 2 and "Traceback" not in err
        assert expected in err and err.count("\n") == 1, err
    assert sorted(p.name for p in workdir.iterdir()) == ["tabular"]      # nothing written


def test_a_worker_is_told_examples_need_no_data_path(workdir, capsys):
    folder = example_copy(workdir)
    storage = f"sqlite:///{workdir / 'study.db'}"
    code = main(["start", "study", str(folder / "study.yaml"), "--storage", storage,
                 "--workers", "0", "--timeout", "1"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    code = main(["worker", "--storage", storage, "--study", "own_tabular", "--data", "/data",
                 "--allow-program", str(folder)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "trains on examples data, which its own script loads itself: leave --data out" in err


def test_a_target_on_a_metric_that_falls_is_reached_at_or_below_it(tmp_path):
    # the validation loss, `mode: min`: reached at or below the value, its best the least,
    # the sampler's shortfall relative; before, the study file refused a target above 1 and
    # every report of a loss above 1 failed the trial ("an accuracy, a share from 0 to 1")
    folder = example_copy(tmp_path, target={"metric": "val_loss", "mode": "min",
                                            "value": 0.12})
    done = run_cli("start", "study", str(folder / "study.yaml"), "--n-trials", "2",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "val_loss <= 0.12" in done.stdout
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    trials = optuna.load_study(study_name="own_tabular", storage=storage).trials
    assert len(trials) == 2
    assert any(t.user_attrs["outcome"] == "reached" for t in trials)   # the first does
    for trial in trials:
        if not trial.user_attrs.get("curve"):
            # the first reached in a fraction of a second: a second trial whose clock passed
            # that before its first evaluation is stopped by the bound with nothing to record
            assert trial.user_attrs["stop_reason"] == "bound", trial.user_attrs
            assert trial.user_attrs["outcome"] == "censored" and not trial.intermediate_values
            continue
        curve = [row[1] for row in trial.user_attrs["curve"]]
        assert curve and all(v >= 0 for v in curve)           # the loss, in top-1's place
        best = trial.user_attrs["best_metric"]
        assert best == pytest.approx(min(curve))
        outcome = trial.user_attrs["outcome"]
        assert outcome in ("reached", "censored"), trial.user_attrs
        # reached: the first evaluation at or below the target, where the trainer stopped
        assert (outcome == "reached") == (best <= 0.12)
        # the sampler's constraint: the share of its best loss above the target
        assert trial.constraints["reach_target"] == pytest.approx(1 - 0.12 / best)
        if outcome == "reached":
            assert curve[-1] <= 0.12 and all(v > 0.12 for v in curve[:-1])
        # Optuna's pruners read the loss itself as the intermediate value (lower is better)
        assert list(trial.intermediate_values.values()) == pytest.approx(curve)
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("own_tabular")
    parent = [r for r in client.search_runs([experiment.experiment_id])
              if not r.info.run_name.startswith("trial-")]
    assert parent and parent[0].data.tags["autotune.target"] == "val_loss<=0.12"
    exported = run_cli("export", "curves", "own_tabular", "--all", "--out",
                       str(tmp_path / "curves.jsonl"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert "--target 0.12 --metric val_loss --mode min" in exported.stdout
    rows = [json.loads(line) for line in (tmp_path / "curves.jsonl").read_text().splitlines()]
    assert rows and all("val_loss" in e for r in rows for e in r["learning_curve"])
