"""`autotune start study quickstart` end to end: real DeepSpeed trials, SQLite, MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient

import autotune
from autotune.config import resolve_tracking_uri
from autotune.replay import load_table

from .conftest import run_cli

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_quickstart_study_records_trials_in_optuna_and_mlflow_and_resumes(tmp_path):
    storage = f"sqlite:///{tmp_path / 'a.db'}"
    mlruns = tmp_path / "mlruns"
    args = ["start", "study", "quickstart", "--storage", storage, "--tracking-uri", str(mlruns),
            "--max-trial-seconds", "30"]
    # the registry's records of an earlier "quickstart" in this database, deleted since
    # with Optuna's `delete-study` (which leaves autotune's tables alone)
    from autotune.db import Registry

    earlier = Registry(storage)
    earlier.register(name="gone-1", study="quickstart", host="gone", pid=1)
    earlier.attempt(study="quickstart", trial_number=0, attempt=1, worker="gone-1",
                    status="finished")
    earlier.close()
    first = run_cli(*args, "--n-trials", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    out = first.stdout
    assert out.count("[trial ") == 2
    assert ("study 'quickstart' is new: the records of 1 worker(s) and 1 trial attempt(s) of "
            "an earlier study of that name, deleted since, are dropped") in out
    registry = Registry(storage, create=False)
    assert {a["worker"] for a in registry.attempts("quickstart")} != {"gone-1"}
    assert [w["host"] for w in registry.workers("quickstart")] != ["gone"]
    assert len(registry.attempts("quickstart")) == 2      # its own two trials' attempts
    registry.close()
    assert f"autotune ui --tracking-uri {mlruns} --study quickstart" in out

    study = optuna.load_study(study_name="quickstart", storage=storage)
    trials = study.trials
    # The warm start reaches 97% top-1 within its 30 s on a machine at its usual speed; on a
    # slower one (these CPUs have run at a seventh of it) no trial may reach.
    reaching = [t for t in trials if t.user_attrs["outcome"] == "reached"]
    best = min(reaching, key=lambda t: t.value) if reaching else None
    if best is not None:
        assert f"best: trial {best.number}" in out
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    # The best trial's model is kept, loadable without DeepSpeed; a slower one's is removed.
    folder = tmp_path / "autotune-runs" / "quickstart"
    models = sorted(path.parent.name for path in folder.glob("trial-*/model.pt"))
    assert models == ([f"trial-{best.number}"] if best is not None else [])
    if best is not None:
        path = (folder / f"trial-{best.number}" / "model.pt").resolve()
        assert best.user_attrs["model_path"] == str(path) and f"  model: {path}\n" in out
        saved = autotune.load_model(path)
        assert saved.classes == [str(i) for i in range(10)] and saved.info["tta_s"] == best.value
    for t in trials:
        # A drawn configuration may diverge on this machine; that is the configuration's fault,
        # told to the sampler as a violated constraint, never an Optuna failure.
        assert t.user_attrs["outcome"] in ("reached", "censored", "failed")
        if t.user_attrs["outcome"] == "reached":
            assert t.value == t.user_attrs["tta_s"] > 0 and t.constraints["reach_target"] <= 0
        else:
            assert t.user_attrs["stop_reason"] and t.constraints["reach_target"] > 0
        if t.user_attrs["outcome"] == "failed":
            assert t.user_attrs["stop_reason"] in ("diverged", "oom"), t.user_attrs
        # A blown-up loss fails a trial at its first evaluation; any other runs on past it.
        evaluations = 1 if t.user_attrs.get("stop_reason") == "diverged" else 2
        assert len(t.intermediate_values) >= evaluations
        assert len(t.user_attrs["curve"]) >= evaluations

    client = MlflowClient(resolve_tracking_uri(str(mlruns))[0])
    experiment = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("autotune.kind") == "study"]
    children = [r for r in runs if r.data.tags.get("autotune.kind") == "trial"]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    if best is not None:
        assert parent.data.metrics["best_tta_s"] == best.value
        assert parent.data.tags["autotune.best_model_path"] == best.user_attrs["model_path"]
    else:
        assert "best_tta_s" not in parent.data.metrics
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        number = int(run.data.tags["optuna.trial_number"])
        assert run.data.tags["optuna.state"] == "COMPLETE"
        assert run.data.tags["autotune.outcome"] == trials[number].user_attrs["outcome"]
        for name in ("global_batch", "lr_per_256", "micro_batch", "grad_accum", "peak_lr"):
            assert name in run.data.params
        history = client.get_metric_history(run.info.run_id, "top1")
        assert len(history) >= min(2, len(trials[number].user_attrs["curve"]))
        assert [m.step for m in history] == list(range(len(history)))
        assert len(client.get_metric_history(run.info.run_id, "elapsed_s")) == len(history)
        reached = run.data.metrics["reached_target"]
        assert reached == (1.0 if "tta_s" in run.data.metrics else 0.0)

    listed = run_cli("status", "--storage", storage, cwd=tmp_path, timeout=120)  # no name
    assert listed.returncode == 0, listed.stderr
    assert f"1 study in {storage}:\n  quickstart: 2 trial(s), {len(reaching)} reached" \
        in listed.stdout
    status = run_cli("status", "quickstart", "--storage", storage, cwd=tmp_path, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "2 trial(s)" in status.stdout
    assert (f"best: trial {best.number}, TTA" if best is not None
            else "best: no trial has reached the target yet") in status.stdout
    assert status.stdout.count("COMPLETE") == 2
    if best is not None:                  # the winning configuration, as start study prints it
        assert "\n  global_batch = " in status.stdout.split("best: trial")[1]
        assert f"\n  model: {best.user_attrs['model_path']}\n" in status.stdout

    # a study of the same name in another store, run from this folder, keeps its own trial
    # folders and MLflow experiment: the first study's models and runs stay as they are
    other = run_cli("start", "study", "quickstart", "--storage", f"sqlite:///{tmp_path / 'b.db'}",
                    "--tracking-uri", str(mlruns), "--max-trial-seconds", "5", "--n-trials", "1",
                    cwd=tmp_path)
    assert other.returncode == 0, other.stderr[-3000:]
    assert (f"{folder} holds another study's files (a study of that name in another store, or "
            f"one whose store was deleted): this study's go to {folder}-2") in other.stdout
    assert f"autotune ui --tracking-uri {mlruns} --study quickstart-2" in other.stdout
    assert sorted(p.name for p in folder.parent.iterdir()) == ["quickstart", "quickstart-2"]
    assert sorted(path.parent.name for path in folder.glob("trial-*/model.pt")) == models
    theirs = client.get_experiment_by_name("quickstart-2")
    assert len(client.search_runs([theirs.experiment_id])) == 2
    assert len(client.search_runs([experiment.experiment_id])) == 3

    again = run_cli(*args, "--n-trials", "3", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming study 'quickstart': 2 finished trial(s)" in again.stdout
    assert "is new" not in again.stdout                  # a resume keeps its records
    registry = Registry(storage, create=False)
    assert len(registry.attempts("quickstart")) == 3
    registry.close()
    assert again.stdout.count("[trial ") == 1
    assert len(optuna.load_study(study_name="quickstart", storage=storage).trials) == 3
    runs = client.search_runs([experiment.experiment_id])
    assert sum(r.data.tags.get("autotune.kind") == "study" for r in runs) == 1
    assert sum(r.data.tags.get("autotune.kind") == "trial" for r in runs) == 3

    # the study's curves, exported in opda's format, read back as a replay table
    table_file = tmp_path / "curves.jsonl"
    exported = run_cli("export", "curves", "quickstart", "--storage", storage, "--out",
                       str(table_file), "--all", cwd=tmp_path, timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert "wrote 3 trial curve(s)" in exported.stdout
    table = load_table(f"opda:{table_file}", 0.97)
    assert table.num_classes == 10 and len(table.runs) == 3
    assert sorted(json.loads(line)["iteration"] for line in
                  table_file.read_text().splitlines()) == [0, 1, 2]


@pytest.mark.slow    # 26 s; test_space checks the README's space loads, other studies run
def test_a_space_written_from_the_readme_runs_a_study(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    code = readme.split("## Writing a search space", 1)[1].split("```python\n", 1)[1]
    (tmp_path / "my_space.py").write_text(code.split("```", 1)[0])
    (tmp_path / "study.yaml").write_text(
        "study_name: mine\nsearch_space: my_space.py\nbudget: {n_trials: 1, max_trial_s: 8}\n")
    result = run_cli("start", "study", "study.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="mine", storage=f"sqlite:///{tmp_path / 'autotune.db'}")
    [trial] = study.trials
    assert trial.user_attrs["outcome"] in ("reached", "censored")
    params = trial.user_attrs["params"]               # the warm start, with its derived warmup
    assert params["global_batch"] == 128 and params["warmup_epochs"] == 0.5
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()


def _tinted_tree(root: Path, classes: int, per_class: int, val: int) -> None:
    """A user's own ImageFolder tree: each class a color, with noise, as JPEGs."""
    import torch
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", per_class), ("val", val)):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = torch.rand(40, 40, 3, generator=gen) * 0.5
                img[..., c % 3] += 0.5 if c < 3 else 0.25
                Image.fromarray((img.clamp(0, 1) * 255).byte().numpy()).save(
                    folder / f"{i}.JPEG")


def test_a_study_on_an_imagefolder_tree_runs_without_a_line_of_code(tmp_path):
    _tinted_tree(tmp_path / "my_images", classes=4, per_class=150, val=25)
    val = tmp_path / "my_images" / "val" / "class_0"
    for name in ("0.JPEG", "1.JPEG"):       # the first two: one in each rank's share
        (val / name).write_bytes((val / name).read_bytes()[:200])   # cut short in transit
    (val / "._2.JPEG").write_bytes(b"\x00\x05\x16\x07")          # macOS's metadata copy
    (tmp_path / "study.yaml").write_text(
        "study_name: my-images\n"
        "trainer:\n"
        "  data: {kind: imagefolder, path: my_images, image_size: 32, loader_workers: 1}\n"
        "target: {metric: top1, value: 0.9}\n"
        "budget: {n_trials: 2, max_trial_s: 30}\n")
    result = run_cli("start", "study", "study.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="my-images",
                              storage=f"sqlite:///{tmp_path / 'autotune.db'}")
    assert len(study.trials) == 2
    first = study.trials[0]
    assert first.user_attrs["outcome"] in ("reached", "censored")
    # evaluated within its cap (every epoch and every max_trial_s / 8 s): twice at least,
    # unless it reached at its first (on a fast day these images take 4 s)
    assert len(first.user_attrs["curve"]) >= (1 if first.user_attrs["outcome"] == "reached"
                                              else 2)
    assert first.user_attrs["best_metric"] > 0.35         # 4 classes: chance is 0.25
    # No search_space: the `images` space, sized from the data, whose warm starts train
    # without augmentation and with crop-and-flip; each trial says how its setup went.
    assert "search space images" in result.stdout
    assert [t.user_attrs["augment"] for t in study.trials] == ["none", "crop_flip"]
    assert {"distributed", "data", "model", "engine"} <= set(first.user_attrs["setup_phases"])
    # The two broken files are skipped and named, not fatal; the hidden one is not an image.
    assert first.user_attrs["unreadable_images"] == 2       # one in each rank's share
    assert "2 unreadable image(s) skipped" in result.stdout
    log = (tmp_path / "autotune-runs" / "my-images" / "trial-0" / "trainer.log").read_text()
    assert f"unreadable image {val / '0.JPEG'} " in log and "._2.JPEG" not in log


def test_a_tree_that_is_mostly_not_images_is_refused_before_any_trial(tmp_path):
    # A tree where a whole class is web pages saved as .JPEG: no configuration can train on it.
    _tinted_tree(tmp_path / "my_images", classes=3, per_class=40, val=8)
    for image in (tmp_path / "my_images" / "train" / "class_2").iterdir():
        image.write_text("<html>403 Forbidden</html>")
    (tmp_path / "study.yaml").write_text(
        "study_name: broken\n"
        "trainer:\n"
        "  data: {kind: imagefolder, path: my_images, image_size: 16, loader_workers: 0}\n"
        "target: {metric: top1, value: 0.9}\n"
        "budget: {n_trials: 8, max_trial_s: 30}\n")
    result = run_cli("start", "study", "study.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(
        f"autotune: error: study.yaml: trainer.data: ImageFolder {tmp_path / 'my_images'}: 40 "
        "of its 144 images could not be decoded (e.g. "), error
    assert "up to 10 (1%, at least 10) are skipped" in error[0] and "repair or remove" in error[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_images", "study.yaml"]  # nothing


@pytest.mark.slow    # 26 s; decisions.systematic_failure is unit-tested (test_decisions)
def test_a_study_whose_every_trial_fails_alike_stops_after_three_and_says_why(tmp_path):
    # A training script whose own data file is not there: no configuration can run it.
    (tmp_path / "train.py").write_text(
        "from trainers import api\n\n"
        "for trial in api.trials():\n"
        "    labels = open('labels.csv').read()\n")
    (tmp_path / "study.yaml").write_text(
        "study_name: broken\n"
        "search_space: quickstart\n"
        "trainer: {program: train.py, data: {kind: digits}}\n"
        "target: {metric: top1, value: 0.9}\n"
        "budget: {n_trials: 8, max_trial_s: 30}\n"
        "warm_start: false\n")
    result = run_cli("start", "study", "study.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("autotune: error: trials 0, 1, 2 all failed "
                                                   "alike (crashed: trainer exited with code 1: "
                                                   "FileNotFoundError: "), error
    assert "labels.csv" in error[0] and "resume the study" in error[0]
    assert "3 trials (0 reached, 0 censored, 3 failed)" in result.stdout   # summarized first
    study = optuna.load_study(study_name="broken",
                              storage=f"sqlite:///{tmp_path / 'autotune.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL"] * 3


@pytest.mark.slow    # half a minute; the timeout's reply and record are unit-tested
def test_a_study_keeps_its_timeout_and_says_which_trial_it_stopped(tmp_path):
    """timeout_s is kept between evaluations: the running trial is stopped at the study's
    deadline (study_timeout), not at its next evaluation or its cap, and the summary says so."""
    (tmp_path / "timed.yaml").write_text(
        "search_space: quickstart\n"
        "trainer: {data: {kind: digits, image_size: 32}, eval_every_s: 20}\n"
        "target: {metric: top1, value: 1.0}\n"
        "budget: {n_trials: 50, timeout_s: 15, max_trial_s: 120}\n"
        "warm_start: false\n")
    result = run_cli("start", "study", "timed.yaml", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "timeout_s (15 s) reached; trial(s) 0 were stopped at it" in result.stdout, \
        result.stdout
    trial = optuna.load_study(study_name="timed",
                              storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials[0]
    assert trial.user_attrs["stop_reason"] == "study_timeout"
    # stopped between evaluations, well before its 20 s cadence would have told it
    assert trial.user_attrs["elapsed_s"] < 20


@pytest.mark.slow    # 35 s; what counts toward the budget is record.finished (test_record)
def test_a_study_counts_trials_that_workers_elsewhere_finish_toward_its_budget(tmp_path):
    """`n_trials` is what the study should hold, whoever ran them: trials another worker
    finishes while `start study` runs its own local worker count, so it starts no more once
    the study holds them (it used to run its own n_trials regardless)."""
    import os
    import subprocess
    import sys
    import time

    from .conftest import ROOT

    storage = f"sqlite:///{tmp_path / 'a.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "start", "study", "quickstart",
                             "--storage", storage, "--tracking-uri", str(tmp_path / "mlruns"),
                             "--n-trials", "2", "--max-trial-seconds", "20"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        running = None
        until = time.monotonic() + 300
        while running is None and time.monotonic() < until and proc.poll() is None:
            time.sleep(0.5)
            try:
                study = optuna.load_study(study_name="quickstart", storage=storage)
            except KeyError:
                continue
            running = next((t for t in study.get_trials(deepcopy=False)
                            if t.state == optuna.trial.TrialState.RUNNING), None)
        assert running is not None, "the study's first trial never started"
        for _ in range(2):            # what a worker on another machine finished meanwhile
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=float("inf"),
                params=running.params, distributions=running.distributions,
                user_attrs={"outcome": "censored", "stop_reason": "planned_epochs",
                            "elapsed_s": 1.0}))
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert out.count("[trial ") == 1, out          # its own first trial, then no more
    finished = [t for t in optuna.load_study(study_name="quickstart", storage=storage).trials
                if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == 3, [t.user_attrs.get("outcome") for t in finished]
