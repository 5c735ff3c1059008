"""A study database shared with the user's own Optuna studies: autotune lists them, and never
adds to, stops, exports or misreads a study it did not make."""

from __future__ import annotations

import optuna
import pytest

from autotune.cli import main
from autotune.decisions import elapsed_of
from autotune.store import foreign_study

from .conftest import run_cli


@pytest.fixture
def foreign(tmp_path, monkeypatch):
    """A SQLite database holding three plain Optuna studies: 'mine' (minimize, 4 trials),
    'multi' (two objectives, 2 trials) and 'up' (maximize, none)."""
    monkeypatch.chdir(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{tmp_path}/shared.db"
    optuna.create_study(study_name="mine", storage=url).optimize(
        lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=4)
    optuna.create_study(study_name="multi", storage=url, directions=["minimize", "maximize"]
                        ).optimize(lambda t: (t.suggest_float("x", 0, 1), 0.5), n_trials=2)
    optuna.create_study(study_name="up", storage=url, direction="maximize")
    return url


def _snapshot(url: str, name: str) -> tuple:
    study = optuna.load_study(study_name=name, storage=url)
    return (dict(study.user_attrs),
            [(t.number, t.state, t.values, t.params, t.user_attrs) for t in study.trials])


def test_the_rule_names_what_makes_a_study_another_tools(foreign):
    said = {name: foreign_study(optuna.load_study(study_name=name, storage=foreign))
            for name in ("mine", "multi", "up")}
    assert said == {
        "mine": "it holds 4 finished trial(s) and no autotune settings",
        "multi": "it has 2 objectives (minimize, maximize); autotune's have one",
        "up": "it maximizes its value; autotune's minimize the time to the target"}
    # a study autotune created and left before writing its config is autotune's to resume
    fresh = optuna.create_study(study_name="half-made", storage=foreign)
    fresh.enqueue_trial({"x": 0.5})
    assert foreign_study(fresh) is None


@pytest.mark.parametrize("name", ["mine", "multi", "up"])
def test_start_study_refuses_another_tools_study_and_writes_nothing(foreign, tmp_path, name,
                                                                   capsys):
    # it resumed 'mine' as its own: its objective values read as seconds, autotune's trials
    # and settings added to the user's study
    (tmp_path / "s.yaml").write_text(f"study_name: {name}\nstorage: {foreign}\n"
                                     "budget: {n_trials: 1}\n")
    before = _snapshot(foreign, name)
    assert main(["start", "study", "s.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"study {name!r} in {foreign} was not made by autotune (it " in err
    assert err.rstrip().endswith("; set another study_name, or another storage"), err
    assert _snapshot(foreign, name) == before
    # (SQLite's write-ahead log beside the database, as any command that opens it leaves)
    assert sorted(p.name for p in tmp_path.iterdir()
                  if not p.name.endswith(("-wal", "-shm"))) == ["s.yaml", "shared.db"]


def test_stop_and_export_leave_another_tools_study_alone(foreign, capsys):
    before = _snapshot(foreign, "mine")
    assert main(["stop", "study", "mine", "--storage", foreign]) == 2
    assert "it has no autotune workers to stop, and it is left as it is" in \
        capsys.readouterr().err
    assert main(["export", "curves", "mine", "--storage", foreign]) == 2
    assert "it holds no learning curves to export" in capsys.readouterr().err
    assert _snapshot(foreign, "mine") == before


def test_status_lists_another_tools_studies_without_reading_their_values_as_times(foreign,
                                                                                 capsys):
    # a two-objective study ended `autotune status` with a traceback from Optuna
    assert main(["status", "--storage", foreign]) == 0
    out = capsys.readouterr().out
    assert "  mine: 4 trial(s), not made by autotune" in out
    assert "  multi: 2 trial(s), not made by autotune" in out
    for name, trials in (("mine", 4), ("multi", 2)):
        assert main(["status", name, "--storage", foreign]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[1].startswith("not made by autotune (it ")
        rows = [line.split() for line in lines[3:]]
        assert len(rows) == trials and all(row[1] == "COMPLETE" and row[2].startswith("x=")
                                           for row in rows), lines
        assert not any(line.startswith("best:") for line in lines)
    multi = optuna.load_study(study_name="multi", storage=foreign).trials[0]
    assert elapsed_of(multi) is None


def test_a_worker_refuses_another_tools_study_at_once(foreign, tmp_path):
    # it waited 30 s for autotune's config to appear, then called the study half-created
    result = run_cli("worker", "--storage", foreign, "--study", "mine", cwd=tmp_path,
                     timeout=25)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "autotune: error: study 'mine' was not made by autotune (it holds 4 finished "
        "trial(s) and no autotune settings); join a study `autotune start study` created")
