"""Study files and flags: precedence, and a one-line error for each bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import config
from autotune._config_checks import cadence_warning
from autotune.cli import main
from autotune.errors import ConfigError

from .conftest import ROOT, run_cli

QUICKSTART_SPACE = "search_space: quickstart\n"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_flags_override_the_file_which_overrides_defaults(tmp_path):
    study = write(tmp_path / "s.yaml", "study_name: mine\nbudget: {n_trials: 5, max_trial_s: 9}\n")
    cfg = config.load(study, {"budget.n_trials": 2, "workers": None})
    assert cfg.study_name == "mine"                      # file
    assert cfg.budget.n_trials == 2                      # flag beats file
    assert cfg.budget.max_trial_s == 9.0                 # file, other key of the same section
    assert cfg.workers == 1                              # default, flag unset
    assert cfg.storage == "sqlite:///autotune.db"


def test_toml_and_yaml_give_the_same_config(tmp_path):
    y = config.load(write(tmp_path / "a.yaml", "target: {metric: top5, value: 0.93}\n"))
    t = config.load(write(tmp_path / "a.toml", "[target]\nmetric = 'top5'\nvalue = 0.93\n"))
    assert y.target == t.target == config.Target("top5", 0.93)


def test_a_study_file_saved_with_a_byte_order_mark_loads(tmp_path):
    """Notepad saves UTF-8 with a BOM; TOML's parser refuses it at line 1, column 1."""
    for name, text in (("b.toml", "[target]\nmetric = 'top5'\nvalue = 0.93\n"),
                       ("b.yaml", "target: {metric: top5, value: 0.93}\n")):
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8-sig"))
        assert config.load(str(path)).target == config.Target("top5", 0.93)


def test_a_study_file_written_as_utf16_loads(tmp_path):
    """PowerShell's `>` writes UTF-16 with a byte-order mark (`echo "..." > study.yaml`)."""
    for name, text, order in (("c.yaml", "target: {metric: top5, value: 0.93}\r\n", "utf-16"),
                              ("c.toml", "[target]\nmetric = 'top5'\nvalue = 0.93\n",
                               "utf-16-be")):
        data = text.encode(order)
        if order == "utf-16-be":
            data = b"\xfe\xff" + data
        (tmp_path / name).write_bytes(data)
        assert config.load(str(tmp_path / name)).target == config.Target("top5", 0.93)


def test_a_json_study_file_and_an_upper_case_suffix_load(tmp_path):
    """JSON is YAML (a study file a script wrote with json.dump), and STUDY.YAML is a YAML
    file whatever the case of its suffix; its name is the study's."""
    (tmp_path / "s.json").write_text('{"target": {"metric": "top5", "value": 0.93}}')
    (tmp_path / "UPPER.YAML").write_text("target: {metric: top5, value: 0.93}\n")
    for name in ("s.json", "UPPER.YAML"):
        assert config.load(str(tmp_path / name)).target == config.Target("top5", 0.93)
    (tmp_path / "tabs.yaml").write_text("budget:\n\tn_trials: 3\n")
    with pytest.raises(ConfigError, match="not valid YAML: .*; indent with spaces, not tabs$"):
        config.load(str(tmp_path / "tabs.yaml"))


def test_the_shipped_quickstart_loads():
    cfg = config.load("quickstart")
    assert cfg.search_space == "quickstart"
    assert cfg.trainer.model == "resnet18"
    assert cfg.target.value == 0.97 and cfg.budget.n_trials >= 12
    assert "quickstart" in config.shipped_studies()


def test_a_local_store_directory_becomes_sqlite_plus_artifacts(tmp_path):
    uri, artifacts = config.resolve_tracking_uri(str(tmp_path / "mlruns"))
    assert uri == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    assert artifacts == (tmp_path / "mlruns" / "artifacts").as_uri()
    assert config.resolve_tracking_uri("http://127.0.0.1:5000") == ("http://127.0.0.1:5000",
                                                                      None)


BAD = {
    "missing file": ([], "nope.yaml", "study file 'nope.yaml' not found"),
    "yaml syntax": (["s.yaml", "study_name: x\n  bad: [\n"], "s.yaml", "not valid YAML"),
    "a shipped study named almost right": (
        [], "Quickstart.yaml", "study file 'Quickstart.yaml' not found (did you mean the shipped "
        "study quickstart?)"),
    "toml syntax": (["s.toml", "x = [\n"], "s.toml", "not valid TOML"),
    "toml nested past what its parser reads": (["s.toml", "x = " + "[" * 3000 + "]" * 3000],
                                                "s.toml", "nested too deeply to read"),
    "json nested past what its parser reads": (
        ["s.json", '{"x": ' + "[" * 3000 + "]" * 3000 + "}"], "s.json",
        "nested too deeply to read"),
    "unknown key": (["s.yaml", "study_name: x\nfoo: 1\n"], "s.yaml", "unknown key(s) foo"),
    "unknown nested key": (["s.yaml", "budget: {n_trials: 2, trials: 3}\n"], "s.yaml",
                           "unknown key(s) budget.trials (did you mean budget.n_trials?); "
                           "allowed in budget: n_trials, timeout_s, max_trial_s"),
    # keys written where another section takes them, or as other tools name them
    "a budget key at the top": (["s.yaml", "n_trials: 3\n"], "s.yaml",
                                "unknown key(s) n_trials (n_trials goes under budget:)"),
    "a data key in trainer": (["s.yaml", "trainer: {path: images}\n"], "s.yaml",
                              "unknown key(s) trainer.path (path goes under trainer: data:)"),
    "Optuna's name": (["s.yaml", "name: x\n"], "s.yaml",
                      "unknown key(s) name (did you mean study_name?)"),
    "Ray Tune's sample count": (["s.yaml", "num_samples: 20\n"], "s.yaml",
                                "unknown key(s) num_samples (did you mean budget.n_trials?)"),
    "a training parameter": (["s.yaml", "batch_size: 256\n"], "s.yaml",
                             "unknown key(s) batch_size (batch_size is a training parameter: "
                             "the search space sets it"),
    "a misspelt key": (["s.yaml", "trainer: {modle: resnet18}\n"], "s.yaml",
                       "unknown key(s) trainer.modle (did you mean trainer.model?)"),
    "a path for the digits": (["s.yaml", "trainer: {data: {path: images}}\n"], "s.yaml",
                              "unknown key(s) path (a folder of images is kind: imagefolder); "
                              "a digits source takes"),
    "space raises": (["s.yaml", "search_space: space.py\n"], "s.yaml",
                     "raised RuntimeError: boom"),
    "space missing": (["s.yaml", "search_space: nowhere.py\n"], "s.yaml",
                      "search space 'nowhere.py' not found"),
    "target above 1": (["s.yaml", "target: {value: 1.5}\n"], "s.yaml",
                       "target.value 1.5 is outside (0, 1]"),
    "target zero": (["s.yaml", "target: {value: 0}\n"], "s.yaml",
                    "target.value 0.0 is outside (0, 1]"),
    "target not a number": (["s.yaml", "target: {value: high}\n"], "s.yaml",
                            "target.value must be a number"),
    "zero trials": (["s.yaml", "budget: {n_trials: 0}\n"], "s.yaml",
                    "budget.n_trials must be a positive integer"),
    "negative timeout": (["s.yaml", "budget: {timeout_s: -1}\n"], "s.yaml",
                         "budget.timeout_s must be positive"),
    "zero trial seconds": (["s.yaml", "budget: {max_trial_s: 0}\n"], "s.yaml",
                           "budget.max_trial_s must be positive"),
    "not a mapping": (["s.yaml", "- 1\n"], "s.yaml", "must be a mapping"),
    "program that is not there": (["s.yaml", "trainer: {program: ../../../../tmp/x/evil}\n"],
                                  "s.yaml", "trainer.program '../../../../tmp/x/evil': no file "
                                  "at /tmp/x/evil; name a bundled trainer (image_classifier, "
                                  "probe), a .py script"),
    "program that is no trainer": (["s.yaml", "trainer: {program: reporter}\n"], "s.yaml",
                                   "trainer.program 'reporter' is not a bundled trainer, a .py "
                                   "file nor a module"),
    "program not Python": (["s.yaml", "trainer: {program: s.yaml}\n"], "s.yaml",
                           "is not a Python script (.py)"),
    "own params for the bundled trainer": (["s.yaml", "trainer: {params: [dropout]}\n"],
                                           "s.yaml", "trainer.params declares parameters of "
                                           "your own script, but the program is the bundled"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_creates_nothing(case, workdir, capsys):
    files, arg, expected = BAD[case]
    if files:
        write(workdir / files[0], files[1])
    write(workdir / "space.py", "raise RuntimeError('boom')\n")
    code = main(["start", "study", arg])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert err.startswith("autotune: error: ") and err.count("\n") == 1
    assert "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == sorted({"space.py", *files[:1]})


@pytest.mark.parametrize(("flags", "expected"), [
    (["--n-trials", "0"], "--n-trials must be a positive integer up to 1000000, got 0"),
    (["--timeout", "-5"], "--timeout must be positive, got -5.0"),
    (["--max-trial-seconds", "0"], "--max-trial-seconds must be positive"),
    (["--workers", "-1"], "--workers must be 0 or more"),
    (["--study-name", "a b"], "--study-name 'a b' must be"),
    (["--storage", "study.db"], "--storage 'study.db' is a file's path, not a database URL; "
                                  "for an SQLite file write sqlite:///study.db"),
    (["--storage", "studies"], "--storage 'studies' is not a database URL; use for example"),
])
def test_bad_flags_name_the_flag(flags, expected, workdir, capsys):
    assert main(["start", "study", "quickstart", *flags]) == 2
    assert expected in capsys.readouterr().err
    assert list(workdir.iterdir()) == []


def test_the_real_command_prints_no_traceback(tmp_path):
    write(tmp_path / "s.yaml", "target: {value: 2}\n")
    result = run_cli("start", "study", "s.yaml", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("autotune: error: s.yaml: target.value 2.0 is outside "
                                     "(0, 1]; give the accuracy as a share of 1 (0.7 for 70%), "
                                     "or for a metric that falls (a loss) give mode: min")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_config_errors_are_autotune_errors(tmp_path):
    with pytest.raises(ConfigError):
        config.load(write(tmp_path / "s.yaml", "workers: many\n"))


def test_a_study_file_without_a_name_is_named_after_the_file(workdir):
    write(workdir / "my images (v2).yaml", "budget: {n_trials: 3}\n")
    assert config.load(str(workdir / "my images (v2).yaml")).study_name == "my-images--v2-"
    write(workdir / "named.yaml", "study_name: other\n")
    assert config.load(str(workdir / "named.yaml")).study_name == "other"
    assert config.load("quickstart").study_name == "quickstart"


def test_what_a_resume_may_change_and_what_it_may_not():
    stored = config.load("quickstart").to_dict()
    edited = config.load("quickstart", {"budget.n_trials": 40, "workers": 2,
                                        "budget.max_trial_s": 30.0}).to_dict()
    edited["target"]["value"] = 0.9
    assert config.config_changes(stored, edited) == [
        "budget.max_trial_s: 60.0 -> 30.0", "target.value: 0.97 -> 0.9"]
    assert config.config_changes(stored, stored) == []


def test_a_study_stored_before_a_key_existed_resumes_with_that_keys_default():
    """A study an earlier autotune started has no `trainer.weights` in its stored config: it
    held the default then, so a resume is no change; another value is."""
    stored = config.load("quickstart").to_dict()
    del stored["trainer"]["weights"]
    assert config.config_changes(stored, config.load("quickstart").to_dict()) == []
    tuned = config.load("quickstart").to_dict()
    tuned["trainer"]["weights"] = "/w/resnet18.pth"
    assert config.config_changes(stored, tuned) == ["trainer.weights: '' -> '/w/resnet18.pth'"]


def test_resuming_a_study_with_a_changed_file_is_refused_before_anything_is_written(
        workdir, capsys):
    import optuna

    from autotune import _study_setup

    write(workdir / "exp.yaml", "target: {metric: top1, value: 0.97}\n")
    cfg = config.load(str(workdir / "exp.yaml"))
    prepared = _study_setup.prepare(cfg)[0]
    stored = optuna.create_study(study_name="exp", storage="sqlite:///autotune.db")
    stored.set_user_attr("config", prepared.to_dict())        # as its first run stored it
    before = sorted(p.name for p in workdir.iterdir())
    write(workdir / "exp.yaml", "target: {metric: top1, value: 0.9}\n")
    assert main(["start", "study", "exp.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "study 'exp' exists and was started with another config (target.value: 0.97 -> " \
           "0.9); pass --accept-changes" in err
    # no run folder, no mlruns (the database's write-ahead log is the database's own)
    assert sorted(p.name for p in workdir.iterdir()
                  if not p.name.endswith(("-wal", "-shm"))) == before
    assert optuna.load_study(study_name="exp", storage="sqlite:///autotune.db").user_attrs[
        "config"]["target"]["value"] == 0.97


def test_resuming_a_study_to_another_mlflow_store_says_where_its_records_were(workdir):
    # the tracking URI may change on a resume (MLflow moved), but a shell without the
    # MLFLOW_TRACKING_URI the study started with split its records in silence
    import optuna

    from autotune import _study_setup

    first = _study_setup.prepare(config.load("quickstart", {"tracking_uri": "team"}))[0]
    study = optuna.create_study(study_name="quickstart", storage="sqlite:///autotune.db")
    study.set_user_attr("config", first.public_dict())
    said: list[str] = []
    again = _study_setup.prepare(config.load("quickstart", {"tracking_uri": "team"}))[0]
    _study_setup.check_resumed_config(again, study, False, said.append)
    assert not [line for line in said if "MLflow" in line]
    moved = _study_setup.prepare(config.load("quickstart"))[0]
    _study_setup.check_resumed_config(moved, study, False, said.append)
    assert [line for line in said if "MLflow" in line] == [
        f"study 'quickstart' recorded to MLflow at {workdir / 'team'} until now; this run "
        f"records to {workdir / 'mlruns'} (give that store as --tracking-uri to keep its "
        "records in one place)"]


@pytest.mark.parametrize("argv", [
    ["status", "nosuch"],
    ["status", "nosuch", "--storage", "sqlite:///elsewhere.db"],
    ["worker", "--storage", "sqlite:///w.db", "--study", "x"],
])
def test_reading_or_joining_a_missing_study_database_creates_nothing(argv, workdir, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no study database at" in err
    assert list(workdir.iterdir()) == []


def test_sqlite_urls_with_a_home_folder_or_a_query_name_the_file_they_mean(workdir, monkeypatch,
                                                                           capsys):
    """`sqlite:///~/studies/a.db` is the file in the home folder, as a shell reads the path
    (SQLite would look for a folder named `~`; so for an MLflow store's URI), and
    `?timeout=60` is SQLite's option, not part of the file's name: status and the existence
    checks read the same file."""
    import optuna

    from autotune.config import database_url, sqlite_file

    home = workdir / "home"
    (home / "studies").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert sqlite_file("sqlite:///~/studies/a.db?timeout=60") == home / "studies" / "a.db"
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql://u@h/db") is None
    assert database_url("sqlite:///~/studies/a.db?timeout=60") == \
        f"sqlite:///{home}/studies/a.db?timeout=60"
    assert database_url("sqlite:///a.db") == "sqlite:///a.db"
    assert config.resolve_tracking_uri("sqlite:///~/ml.db") == (f"sqlite:///{home}/ml.db", None)
    optuna.create_study(study_name="s", storage=f"sqlite:///{home}/studies/a.db")
    for url in ("sqlite:///~/studies/a.db", "sqlite:///~/studies/a.db?timeout=60"):
        assert main(["status", "--storage", url]) == 0
        assert "s: 0 trial(s)" in capsys.readouterr().out
    assert main(["status", "--storage", "sqlite:///~/nope/a.db"]) == 2
    assert f"no study database at {home}/nope/a.db;" in capsys.readouterr().err
    assert not (workdir / "~").exists() and not (home / "nope").exists()


@pytest.mark.postgres
def test_status_on_a_database_without_studies_creates_no_tables(postgres, workdir, capsys):
    import sqlalchemy

    from autotune.config import database_url

    url = postgres.database()
    assert main(["status", "nosuch", "--storage", url]) == 2
    assert "no autotune studies in" in capsys.readouterr().err
    engine = sqlalchemy.create_engine(database_url(url))
    try:
        assert sqlalchemy.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_a_study_file_without_a_space_takes_the_one_for_its_data(workdir):
    (workdir / "digits.yaml").write_text("budget: {n_trials: 1}\n")
    (workdir / "mine.yaml").write_text(
        "trainer: {data: {kind: imagefolder, path: imgs}}\nbudget: {n_trials: 1}\n")
    (workdir / "named.yaml").write_text(
        "search_space: quickstart\ntrainer: {data: {kind: imagefolder, path: imgs}}\n")
    assert config.load(str(workdir / "digits.yaml")).search_space == "quickstart"
    assert config.load(str(workdir / "mine.yaml")).search_space == "images"
    assert config.load(str(workdir / "named.yaml")).search_space == "quickstart"


def test_a_cadence_that_cannot_fit_the_trial_cap_is_warned_of(workdir):
    def cfg(every: float, cap: float):
        (workdir / "c.yaml").write_text(
            f"trainer: {{eval_every_s: {every}}}\nbudget: {{n_trials: 1, max_trial_s: {cap}}}\n")
        return config.load(str(workdir / "c.yaml"))

    assert cadence_warning(cfg(0, 60)) is None          # the default cadence always fits
    assert cadence_warning(cfg(10, 60)) is None
    assert "once at most" in cadence_warning(cfg(40, 60))
    line = cadence_warning(cfg(90, 60))
    assert "no trial evaluates before its cap" in line and "\n" not in line


def test_a_key_may_override_one_merged_in_from_an_anchor(tmp_path):
    # YAML's merge key is no repeat: the mapping's own key wins, as YAML defines it
    (tmp_path / "s.yaml").write_text("budget:\n  <<: {n_trials: 3, timeout_s: 60}\n"
                                     "  n_trials: 4\n")
    cfg = config.load(str(tmp_path / "s.yaml"))
    assert (cfg.budget.n_trials, cfg.budget.timeout_s) == (4, 60)


@pytest.mark.postgres
@pytest.mark.parametrize("argv", [["start", "study", "quickstart"], ["status", "x"],
                                  ["db", "upgrade"]])
def test_a_database_the_server_lacks_is_named_with_how_to_make_it(argv, postgres, workdir,
                                                                    capsys):
    url = f"{postgres.database().rpartition('/')[0]}/autotune_never_made"
    assert main([*argv, "--storage", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert ('the server has no database "autotune_never_made"; create it first (createdb '
            'autotune_never_made') in err, err
    assert list(workdir.iterdir()) == []


def _mlflow_database(path) -> None:
    """A database laid out as MLflow's tracking store keeps it (alembic's version table,
    experiments, runs, metrics, params)."""
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        db.execute("INSERT INTO alembic_version VALUES ('dc11669786a5')")
        for table in ("experiments", "runs", "metrics", "params"):
            db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")


def _tables_of(path) -> set[str]:
    import sqlite3

    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


@pytest.mark.parametrize("argv", [["start", "study", "quickstart"], ["status"], ["status", "x"],
                                  ["worker", "--study", "x"], ["server"]])
def test_mlflows_database_given_as_the_storage_is_named_and_left_alone(argv, workdir, capsys):
    # Optuna created its tables inside MLflow's database, then refused it: "the runtime optuna
    # version 5.1.0 is no longer compatible ... pip install -U optuna"
    _mlflow_database(workdir / "mlflow.db")
    before = _tables_of(workdir / "mlflow.db")
    assert main([*argv, "--storage", "sqlite:///mlflow.db"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("autotune: error: sqlite:///mlflow.db is MLflow's tracking database "
                           "(experiments, runs), not a study database; give the studies a "
                           "database of their own (sqlite:///autotune.db, the default)"), err
    assert _tables_of(workdir / "mlflow.db") == before
    assert sorted(p.name for p in workdir.iterdir()) == ["mlflow.db"]


def _cut_database(folder) -> bytes:
    """The first two pages of an SQLite database of many: damaged, as a copy cut short is."""
    import sqlite3

    with sqlite3.connect(folder / "whole.db") as db:
        db.execute("PRAGMA page_size = 4096")
        for n in range(20):
            db.execute(f"CREATE TABLE t{n} (x TEXT)")
            db.executemany(f"INSERT INTO t{n} VALUES (?)", [("x" * 200,)] * 100)
    content = (folder / "whole.db").read_bytes()[:8192]
    (folder / "whole.db").unlink()
    return content


@pytest.mark.parametrize("made, said", [
    (lambda folder: b"name,accuracy\n",
     "a.db is not an SQLite database; give the path of a study database"),
    (_cut_database, "a.db is an SQLite database that is damaged (malformed)"),
])
def test_a_file_that_is_no_database_is_named_as_such(made, said, workdir, capsys):
    content = made(workdir)
    (workdir / "a.db").write_bytes(content)
    assert main(["status", "--storage", "sqlite:///a.db"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "[SQL:" not in err, err
    assert (workdir / "a.db").read_bytes() == content


@pytest.mark.parametrize("tracking, said", [
    ("sqlite:///autotune.db", "is the study database (storage)"),
    ("sqlite:///./autotune.db?timeout=5", "is the study database (storage)"),
    ("sqlite:///other.db", "is a study database"),
    ("postgresql+psycopg2://u@127.0.0.1:1/studies?sslmode=disable",
     "is the study database (storage)"),
])
def test_a_tracking_uri_naming_a_study_database_is_refused(tracking, said, workdir, capsys):
    # MLflow created its tables in the study database, failed on Optuna's schema version,
    # and the study's records went to the outbox
    import optuna

    optuna.create_study(study_name="other", storage=f"sqlite:///{workdir}/other.db")
    storage = (["--storage", "postgresql://u@127.0.0.1:1/studies"]
               if tracking.startswith("postgresql") else [])
    assert main(["start", "study", "quickstart", "--tracking-uri", tracking, *storage]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"autotune: error: tracking_uri {tracking} {said}; MLflow keeps its "
                           "records in a database of its own: leave tracking_uri at mlruns "
                           "(the default) or name another"), err
    assert sorted(p.name for p in workdir.iterdir()) == ["other.db"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_ranks_that_share_a_core_on_purpose_are_said_and_never_unasked(tmp_path):
    # on a 1-core machine the quickstart's 2 ranks are refused with what to do; asked with
    # --oversubscribe, they share the core and the study says so when it starts
    code = ("import os, sys\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "from autotune import _study_setup, config\n"
            "from autotune.errors import ConfigError\n"
            "over = {'oversubscribe': True} if sys.argv[1:] else None\n"
            "try:\n    _study_setup.prepare(config.load('quickstart', over), print)\n"
            "except ConfigError as e:\n    print('refused:', e)\n")
    said = []
    for asked in ([], ["--oversubscribe"]):
        done = subprocess.run([sys.executable, "-c", code, *asked], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        said.append(done.stdout)
    assert "refused: 1 local worker(s) x 2 rank(s) = 2 ranks, but this machine has 1 CPU " \
        "core(s)" in said[0] and "or --oversubscribe" in said[0]
    assert "2 ranks share this machine's 1 CPU core(s) (oversubscribe)" in said[1] and \
        "refused" not in said[1]


def test_a_study_that_names_no_mlflow_store_records_where_mlflows_own_variable_says(
        tmp_path, monkeypatch):
    # MLflow's clients, Optuna's MLflowCallback and Ray Tune record where MLFLOW_TRACKING_URI
    # says; autotune recorded to ./mlruns instead, and a team's server never saw the study
    from autotune import config as cfgs

    (tmp_path / "named.yaml").write_text(f"tracking_uri: {tmp_path / 'own'}\n")
    (tmp_path / "plain.yaml").write_text("budget: {n_trials: 3}\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.corp:5000")
    assert cfgs.load(str(tmp_path / "plain.yaml")).tracking_uri == "http://mlflow.corp:5000"
    assert cfgs.load("quickstart").tracking_uri == "http://mlflow.corp:5000"
    assert cfgs.load(str(tmp_path / "named.yaml")).tracking_uri == str(tmp_path / "own")
    assert cfgs.load("quickstart", {"tracking_uri": "mine"}).tracking_uri == "mine"
    # the start says the store came from the variable only where it did
    assert cfgs.tracking_from_env(str(tmp_path / "plain.yaml"))
    assert cfgs.tracking_from_env("quickstart")
    (tmp_path / "same.yaml").write_text("tracking_uri: http://mlflow.corp:5000\n")
    assert not cfgs.tracking_from_env(str(tmp_path / "same.yaml"))
    assert not cfgs.tracking_from_env("quickstart", "http://mlflow.corp:5000")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "  ")
    assert cfgs.load("quickstart").tracking_uri == "mlruns"
    assert not cfgs.tracking_from_env("quickstart")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert cfgs.load("quickstart").tracking_uri == "mlruns"


def test_a_bad_mlflow_tracking_uri_variable_is_named_as_the_variable(tmp_path, monkeypatch):
    from autotune import config as cfgs

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path / 'mlruns'}")
    with pytest.raises(ConfigError) as raised:
        cfgs.load("quickstart")
    assert str(raised.value).startswith(f"MLFLOW_TRACKING_URI file://{tmp_path / 'mlruns'} is "
                                        "MLflow's file store"), raised.value


@pytest.mark.parametrize("uri, problem", [
    ("postgresql+psycopg2://u@h/db", None), ("mysql+pymysql://u@h/db", None),
    ("sqlite:////tmp/x/mlflow.db", None), ("http://h:5000", None), ("HTTPS://H", None),
    ("gs://bucket/runs", "is not a store MLflow records to (gs://)"),
    ("http:///path", "names no host"),
])
def test_tracking_uris_are_judged_by_mlflows_own_store_registry(uri, problem):
    from autotune._preflight import tracking_uri_problem

    found = tracking_uri_problem(uri)
    assert found is None if problem is None else found.startswith(problem), found
