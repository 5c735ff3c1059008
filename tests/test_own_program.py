"""A study of the user's own training script (``trainer.program: train.py``): the README's
example (examples/own_trainer) run through the real launcher, stopped and resumed, pruned and
recorded in MLflow; scripts that misbehave; and what is refused before anything is written."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from autotune.cli import main
from autotune.config import resolve_tracking_uri

from ._services import autotune
from .conftest import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "own_trainer"


def example_copy(tmp_path: Path, **changes) -> Path:
    """The example's folder copied to ``tmp_path``, its study file changed by ``changes``."""
    folder = tmp_path / "own"
    shutil.copytree(EXAMPLE, folder)
    study = yaml.safe_load((folder / "study.yaml").read_text())
    for key, value in changes.items():
        section, _, sub = key.partition(".")
        if value is None:
            (study[section] if sub else study).pop(sub or section, None)
        elif sub:
            study[section][sub] = value
        else:
            study[key] = value
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``autotune ARGS`` in this process (the refusals need no trial): code, out, err."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_space_check_on_the_study_file_checks_its_program_and_declared_parameters(
        workdir, capsys):
    code, out, err = cli(capsys, "space", "check", str(EXAMPLE / "study.yaml"))
    assert code == 0, err
    assert f"runs {EXAMPLE / 'train.py'}" in out and "its own parameters: dropout" in out

    undeclared = example_copy(workdir, **{"trainer.params": None})
    for command in (["space", "check"], ["start", "study"]):
        code, _, err = cli(capsys, *command, str(undeclared / "study.yaml"))
        assert code == 2 and "Traceback" not in err
        assert "'dropout' is not a plan parameter" in err
        assert "declare them in trainer.params" in err
    assert sorted(p.name for p in workdir.iterdir()) == ["own"]      # nothing written


@pytest.mark.parametrize(("program", "expected"), [
    ("missing.py", "trainer.program 'missing.py': no file at"),
    ("space.yaml", "is not a Python script (.py)"),
    ("broken.py", "is not valid Python (line 1"),
    ("no.such.module", "is not a bundled trainer, a .py file nor a module"),
])
def test_a_program_that_cannot_run_is_refused_in_one_line_before_anything_is_written(
        workdir, capsys, program, expected):
    folder = example_copy(workdir, **{"trainer.program": program})
    (folder / "space.yaml").write_text("a: 1\n")
    (folder / "broken.py").write_text("def (:\n")
    for command in (["space", "check"], ["start", "study"]):
        code, _, err = cli(capsys, *command, str(folder / "study.yaml"))
        assert code == 2
        assert expected in err and err.count("\n") == 1, err
    assert sorted(p.name for p in workdir.iterdir()) == ["own"]


def test_a_worker_runs_a_studys_own_script_only_where_allowed_and_unchanged(workdir, capsys):
    folder = example_copy(workdir)
    storage = f"sqlite:///{workdir / 'study.db'}"
    create = ("start", "study", str(folder / "study.yaml"), "--storage", storage,
              "--workers", "0", "--timeout", "1")
    code, _, err = cli(capsys, *create)
    assert code == 0, err
    join = ("worker", "--storage", storage, "--study", "own_trainer")
    code, _, err = cli(capsys, *join)
    assert code == 2 and err.count("\n") == 1, err
    assert f"runs its own script {folder / 'train.py'}" in err and "--allow-program" in err
    with (folder / "train.py").open("a") as f:
        f.write("# edited after the study started\n")
    code, _, err = cli(capsys, *join, "--allow-program", str(folder))
    assert code == 2 and "SHA-256 differs" in err, err
    code, _, err = cli(capsys, *create)
    assert code == 2 and "trainer.program_sha256" in err, err


MISBEHAVING = '''
import sys
from trainers import api

for trial in api.trials():
    mode = trial.params["mode"]
    if mode == "silent":
        sys.exit(0)                                   # leaves without a word
    trial.start()
    if mode == "crash":
        raise RuntimeError("boom in the script's own loop")
    if mode == "garbage":
        trial.step_done()
        trial.reporter.send({"type": "eval", "elapsed_s": 0.5, "top1": "very high"})
    if mode == "percent":                             # 85.3 for 85.3%: would "reach" at once
        trial.step_done()
        trial.reporter.send({"type": "eval", "elapsed_s": 0.5, "top1": 85.3, "epoch": 0.1,
                             "index": 0})
    while trial.running:
        if trial.step_done(0.1):
            trial.report(top1=0.99)
'''

MODES_SPACE = '''
from autotune import Categorical, SearchSpace

def space(world_size):
    modes = ["silent", "garbage", "crash", "percent", "fine"]
    base = {"global_batch": 64, "lr_per_256": 0.1, "epochs": 2}
    return SearchSpace(Categorical("global_batch", [64]), Categorical("lr_per_256", [0.1]),
                       Categorical("epochs", [2]), Categorical("mode", modes),
                       warm_starts=[{**base, "mode": m} for m in modes], name="modes",
                       world_size=world_size)
'''


@pytest.mark.slow
def test_a_script_that_exits_silently_reports_garbage_or_crashes_fails_its_trial_only(
        tmp_path):
    (tmp_path / "train.py").write_text(MISBEHAVING)
    (tmp_path / "space.py").write_text(MODES_SPACE)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "study_name": "modes", "search_space": "space.py",
        "trainer": {"program": "train.py", "params": ["mode"], "eval_every_steps": 5},
        "budget": {"n_trials": 5, "max_trial_s": 30}, "ranks_per_trial": 1}))
    done = run_cli("start", "study", "study.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = optuna.load_study(study_name="modes",
                               storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials
    ends = {t.params["mode"]: t for t in trials}
    assert [t.params["mode"] for t in trials] == ["silent", "garbage", "crash", "percent",
                                                  "fine"]
    for mode, reason, said in [("silent", "crashed", "trainer exited with code 0"),
                               ("garbage", "bad_report", "without the target metric 'top1' as "
                                                         "a number (got 'very high'"),
                               ("crash", "crashed", "boom in the script's own loop"),
                               ("percent", "bad_report", "top1 is 85.3; the target metric is "
                                                         "an accuracy, a share from 0 to 1")]:
        attrs = ends[mode].user_attrs
        assert ends[mode].state.name == "FAIL", mode
        assert (attrs["outcome"], attrs["stop_reason"]) == ("failed", reason), attrs
        assert said in attrs["detail"], attrs["detail"]
    assert ends["fine"].user_attrs["outcome"] == "reached"


def test_the_readme_example_is_tuned_stopped_resumed_pruned_and_recorded(tmp_path):
    """The example's script and declared dropout, run by `autotune worker`s allowed to run it,
    with a slow configuration first (its worker stopped by SIGTERM mid-trial: the trial
    checkpoints, and the next worker resumes it) and the example's fast one second."""
    folder = example_copy(tmp_path, **{"trainer.eval_every_s": 0.5,
                                       "trainer.checkpoint_every_s": 1.0,
                                       "budget": {"n_trials": 4, "max_trial_s": 20},
                                       "target": {"metric": "top1", "value": 0.97},
                                       "search_space": "test_space.py"})
    (folder / "test_space.py").write_text((folder / "space.py").read_text().replace(
        "warm_starts=[", 'warm_starts=[{"global_batch": 16, "lr_per_256": 0.1, '
        '"decay": "linear", "epochs": 12, "dropout": 0.3}, '))
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    study = autotune("start", "study", str(folder / "study.yaml"), "--storage", storage,
                     "--workers", "0", cwd=tmp_path)
    join = ("worker", "--storage", storage, "--study", "own_trainer",
            "--allow-program", str(folder))
    victim, workers = None, []
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "autotune.db").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        workers.append(autotune(*join, cwd=tmp_path))
        deadline = time.monotonic() + 240
        while victim is None and time.monotonic() < deadline and workers[0].poll() is None:
            time.sleep(0.2)
            try:
                trials = optuna.load_study(study_name="own_trainer", storage=storage).trials
            except KeyError:
                continue
            victim = next((t for t in trials if t.state.name == "RUNNING"
                           and t.user_attrs.get("checkpoint")
                           and len(t.user_attrs.get("curve", [])) >= 2), None)
        assert victim is not None, f"no trial was caught with a checkpoint: {workers[0].output()}"
        workers[0].send_signal(signal.SIGTERM)
        _, err = workers[0].communicate(timeout=120)
        assert workers[0].returncode == 0, err[-2000:]
        workers.append(autotune(*join, cwd=tmp_path))
        out, err = study.communicate(timeout=400)
        assert study.returncode == 0, err[-2000:]
        _, err = workers[1].communicate(timeout=120)
        assert workers[1].returncode == 0, err[-2000:]
    finally:
        for p in (study, *workers):
            if p.poll() is None:
                p.kill()

    trials = optuna.load_study(study_name="own_trainer", storage=storage).trials
    lost = trials[victim.number]
    assert lost.user_attrs["stop_reason"] == "interrupted"
    [resumed] = [t for t in trials if t.user_attrs.get("resume_of") == lost.number]
    assert resumed.params == lost.params and resumed.state.name == "COMPLETE"
    assert resumed.user_attrs["resume_from"] == lost.user_attrs["checkpoint"]
    saved_at = lost.user_attrs["checkpoint_elapsed_s"]
    curve = resumed.user_attrs.get("curve")
    assert saved_at < (curve[0][0] if curve else resumed.user_attrs["elapsed_s"])

    counted = [t for t in trials if t.user_attrs.get("stop_reason") != "interrupted"]
    assert len(counted) == 4 and all(t.state.name == "COMPLETE" for t in counted), [
        (t.number, t.state.name, t.user_attrs.get("stop_reason")) for t in trials]
    outcomes = [(t.user_attrs["outcome"], t.user_attrs["stop_reason"]) for t in counted]
    assert ("reached", "reached") in outcomes, outcomes
    # the script saved its model where the plan said; the study keeps the fastest one's
    best = min((t for t in counted if t.user_attrs["outcome"] == "reached"),
               key=lambda t: t.value)
    assert best.user_attrs["model_path"] == str(
        (tmp_path / "autotune-runs" / "own_trainer" / f"trial-{best.number}" / "model.pt")
        .resolve())
    assert sorted((tmp_path / "autotune-runs" / "own_trainer").glob("trial-*/model.pt")) == [
        Path(best.user_attrs["model_path"])]
    assert f"  model: {best.user_attrs['model_path']}\n" in out
    assert any(o == "censored" and r not in ("planned_epochs", "max_seconds")
               for o, r in outcomes), outcomes                 # stopped by the pruner
    plan = (tmp_path / "autotune-runs" / "own_trainer" / f"trial-{lost.number}" / "plan.json")
    assert '"dropout": 0.3' in plan.read_text()               # the script's own parameter

    client = MlflowClient(resolve_tracking_uri(str(tmp_path / "mlruns"))[0])
    experiment = client.get_experiment_by_name("own_trainer")
    runs = {r.data.tags.get("optuna.trial_number"): r for r in client.search_runs(
        [experiment.experiment_id], filter_string="tags.`autotune.kind` = 'trial'")}
    assert runs[str(resumed.number)].data.tags["autotune.resume_of"] == str(lost.number)
    for t in counted:
        run = runs[str(t.number)]
        assert run.data.params["dropout"] == str(t.params["dropout"])
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "top1")]
        assert len(steps) == len(set(steps)) == len(t.user_attrs.get("curve", [])), t.number
