"""The MLflow runs table reads at a glance: each trial's run is named for how it ended, and
the study's parent run holds the leaderboard as its description."""

from __future__ import annotations

import optuna
from mlflow.tracking import MlflowClient

from autotune.decisions import TrialResult, tell_result
from autotune.tracking import Tracker, leaderboard, run_name

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_run_names_say_how_each_trial_ended():
    assert run_name("trial-3", "reached", "reached", {"tta_s": 12.4123}) == \
        "trial-3 reached 12.41 s"
    assert run_name("trial-4", "censored", "bound", {"total_elapsed_s": 9.8}) == \
        "trial-4 censored (bound) after 9.80 s"
    assert run_name("trial-5", "failed", "diverged", {}) == "trial-5 failed (diverged)"


def _study() -> optuna.Study:
    study = optuna.create_study(direction="minimize")
    for outcome, reason, value, best in (("censored", "bound", 3.0, 0.6),
                                         ("reached", "reached", 12.0, 0.975),
                                         ("reached", "reached", 9.5, 0.98),
                                         ("failed", "diverged", 2.75, 0.1)):
        trial = study.ask()
        trial.set_user_attr("params", {"global_batch": 128 * (trial.number + 1)})
        tell_result(study, trial, TrialResult(trial.number, {}, outcome, reason, value=value,
                                              best_metric=best), 0.97)
    return study


def test_the_leaderboard_ranks_the_trials_that_reached():
    board = leaderboard(_study().trials, "top1", 0.97)
    lines = board.splitlines()
    assert lines[0] == "**Time to top1 >= 0.97**"
    assert "| 1 | 2 | 9.50 | global_batch=384 |" in lines
    assert lines.index("| 1 | 2 | 9.50 | global_batch=384 |") < lines.index(
        "| 2 | 1 | 12.00 | global_batch=256 |")
    assert lines[-1] == "Trials: 1 censored, 1 failed, 2 reached"
    assert "No trial has reached" in leaderboard(_study().trials[:1], "top1", 0.97)


def test_mlflow_shows_the_outcome_in_the_run_name_and_the_leaderboard_on_the_study(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "names", tmp_path / "runs")
    tracker.start_study({}, {"study_name": "names"}, {}, resumed=False)
    key = tracker.start_trial(0, {"global_batch": 128}, {}, {"epochs": 3})
    tracker.end_trial(key, state="COMPLETE", outcome="reached", reason="reached",
                      metrics={"tta_s": 9.5, "total_elapsed_s": 9.5}, curve=[], metric="top1",
                      target=0.97)
    tracker.study_plots(_study(), "top1", 0.97)
    assert tracker.close(timeout_s=60)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("names")
    runs = {r.data.tags.get("autotune.kind"): r for r in client.search_runs(
        [experiment.experiment_id])}
    assert runs["trial"].info.run_name == "trial-0 reached 9.50 s"
    assert runs["trial"].data.tags["autotune.tta_s"] == "9.500"
    assert "| 1 | 2 | 9.50 |" in runs["study"].data.tags["mlflow.note.content"]


def test_the_summary_names_the_fastest_reached_trial_not_a_value_another_client_told(
        tmp_path):
    """A trial a plain Optuna client told the study (value 1.0, no outcome) was Optuna's
    best, and the study's summary said no trial had reached the target."""
    from autotune._console import summarize
    from autotune.config import StudyConfig

    study = _study()
    study.add_trial(optuna.trial.create_trial(
        params={"x": 1.0}, distributions={"x": optuna.distributions.FloatDistribution(0, 2)},
        value=1.0))
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "names", tmp_path / "runs")
    tracker.start_study({}, {"study_name": "names"}, {}, resumed=False)
    lines: list[str] = []
    summarize(StudyConfig(study_name="names", run_dir=str(tmp_path / "runs")), study, tracker,
              lines.append)
    assert lines[1] == "best: trial 2, time to top1 >= 0.97: 9.50 s", lines
    # nor counts it among the study's trials, and says so
    assert lines[0].startswith("study 'names': 4 trials (2 reached, 1 censored, 1 failed)")
    assert lines[0].endswith("; 1 told by another Optuna client, not counted"), lines[0]


def test_trials_another_optuna_client_told_are_not_counted_and_are_named_in_status(tmp_path):
    """A notebook that asks and tells the study's trials (`study.optimize` on a plain
    objective) used up the study's trial budget, and `status` showed its values as seconds."""
    from autotune import record
    from autotune._console import budget_left
    from autotune.status import show

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = _study()
    stored = optuna.create_study(study_name="s", storage=url, direction="minimize")
    stored.add_trials(study.trials)
    stored.set_user_attr(record.STUDY_CONFIG, {"study_name": "s"})
    assert budget_left(stored, 5)
    other = optuna.load_study(study_name="s", storage=url)      # another client
    other.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    failing = other.ask()
    other.tell(failing, state=optuna.trial.TrialState.FAIL)
    other.ask({"x": optuna.distributions.FloatDistribution(0, 1)})   # its objective runs
    trials = stored.get_trials()
    assert [record.told_elsewhere(t) for t in trials] == [False] * 4 + [True] * 3 + [False]
    assert [record.asked_elsewhere(t) for t in trials] == [False] * 7 + [True]
    assert len(record.finished(trials)) == 4 and budget_left(stored, 5)
    said: list[str] = []
    show("s", url, said.append)
    row = next(line.split() for line in said if line.split()[:1] == ["4"])
    assert row[1:3] == ["COMPLETE", "elsewhere"] and row[3].startswith("x="), row  # no seconds
    running = next(line.split() for line in said if line.split()[:1] == ["7"])
    assert running[1:3] == ["RUNNING", "elsewhere"], running
    assert any(line.startswith("elsewhere: 4 trial(s) asked (and told, or still running) by "
                               "another Optuna client") for line in said), said


def test_status_prints_one_json_object_for_scripts(tmp_path):
    """`autotune status --json`: what the table shows, as data a script reads (a pipeline
    that waits for a study's best TTA, say), for one study and for a storage's list."""
    import json
    import subprocess
    import sys

    from autotune import record
    from autotune.status import list_studies, show

    url = f"sqlite:///{tmp_path / 'study.db'}"
    stored = optuna.create_study(study_name="s", storage=url, direction="minimize")
    stored.add_trials(_study().trials)
    stored.set_user_attr(record.STUDY_CONFIG, {"study_name": "s"})
    optuna.load_study(study_name="s", storage=url).enqueue_trial({"global_batch": 64})
    said: list[str] = []
    show("s", url, said.append, as_json=True)
    assert len(said) == 1
    snap = json.loads(said[0])
    assert snap["study"] == "s" and snap["not_autotune"] is None and snap["elsewhere"] == 0
    assert [(t["number"], t["state"], t["outcome"], t["reason"]) for t in snap["trials"]] == [
        (0, "COMPLETE", "censored", "bound"), (1, "COMPLETE", "reached", "reached"),
        (2, "COMPLETE", "reached", "reached"), (3, "COMPLETE", "failed", "diverged"),
        (4, "WAITING", None, None)]
    assert snap["trials"][2]["elapsed_s"] == 9.5 and snap["trials"][4]["params"] == {
        "global_batch": 64}
    assert snap["best"] == {"trial": 2, "tta_s": 9.5, "params": {"global_batch": 384},
                            "model": None}
    listed: list[str] = []
    list_studies(url, listed.append, as_json=True)
    assert json.loads(listed[0])["studies"] == [
        {"study": "s", "trials": 5, "not_autotune": None, "reached": 2, "running": 0,
         "best_trial": 2, "best_tta_s": 9.5, "stopped": None}]
    cli = subprocess.run([sys.executable, "-m", "autotune", "status", "s", "--storage", url,
                          "--json"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and json.loads(cli.stdout) == snap, cli.stderr
