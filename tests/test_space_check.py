"""`autotune space check`: every problem of a broken file, each with a precise message."""

from __future__ import annotations

import pytest

from autotune.cli import main

from .conftest import run_cli

HEADER = ("from autotune import Categorical, Constraint, Derived, Fixed, Float, Int, PowerOfTwo,"
          " SearchSpace\n")
GOOD = 'PowerOfTwo("global_batch", 64, 512), Float("lr_per_256", 0.01, 1.0), Int("epochs", 2, 8)'

CASES = {
    "low >= high": ('Float("label_smoothing", 0.3, 0.1)',
                    "label_smoothing: low (0.3) must be below high (0.1)"),
    "log with low <= 0": ('Float("weight_decay", 0.0, 1e-3, log=True)',
                          "weight_decay: a log range needs low > 0"),
    "empty categorical": ('Categorical("decay", [])', "decay: choices must not be empty"),
    "categorical not a list": ('Categorical("decay", "cosine")',
                               "decay: choices must be a list"),
    "duplicate categorical choices": ('Categorical("decay", ["cosine", "cosine"])',
                                      "decay: choices must be distinct"),
    "duplicate names": ('Int("epochs", 3, 9)', "parameter 'epochs' is declared twice"),
    "condition on unknown parameter": (
        'Float("lars_trust_coefficient", 1e-4, 1e-2, condition="optimzer == \'lars\'")',
        "'lars_trust_coefficient' refers to 'optimzer', which is not a parameter"),
    "condition on a later parameter": (
        'Float("momentum", 0.8, 0.95, condition="nesterov"), Categorical("nesterov", [True])',
        "'momentum' refers to 'nesterov', which is declared after it"),
    "unsatisfiable constraint": ('Constraint("epochs > 100")',
                                 "no point satisfies the constraints"),
    "batch not splittable": ('Categorical("label_smoothing", [0.0]), Fixed("decay", "cosine")',
                             None),
    "wrong type for a bound": ('Float("momentum", "0.8", 0.95)',
                               "momentum: low must be a number, got '0.8'"),
    "int with a float bound": ('Int("warmup_epochs", 0, 2.5)',
                               "warmup_epochs: high must be an integer, got 2.5"),
    "power of two bound": ('PowerOfTwo("decay_power", 3, 8)',
                           "decay_power: low must be a power of two, got 3"),
    "not a parameter": ('"lr"', "item 4 ('lr') is not a parameter"),
    "bad expression syntax": ('Constraint("epochs >")', "is not a valid expression"),
    "forbidden expression": ('Constraint("__import__(\'os\')")',
                             "only these functions may be called"),
    "bad name": ('Float("peak lr", 0.1, 1.0)', "parameter name 'peak lr' must be a Python"),
    "not a plan parameter": ('Float("lr", 0.1, 1.0)', "'lr' is not a plan parameter"),
    "warm start outside its range": (None, "warm start 1: epochs = 20 is outside int [2, 8]"),
    "int step that does not fit": ('Int("warmup_epochs", 0, 5, step=2)',
                                   "high - low (5) must be a multiple of step (2)"),
    "derived value out of range": ('Derived("warmup_epochs", "9**9**9")',
                                   "an exponent is at most 64"),
    "derived arithmetic on text": ("""Derived("warmup_epochs", "'a' * 10**13")""",
                                   "arithmetic takes numbers, got str and int"),
    "derived that always fails": ('Derived("warmup_epochs", "epochs / 0")',
                                  "none of 64 random points is feasible"),
    # ranges reaching past what the training plan takes: each would fail its trials one by one
    "label smoothing up to 1": ('Float("label_smoothing", 0.0, 1.0)',
                                "label_smoothing: 1.0 is outside what the training plan takes; "
                                "label_smoothing must be in [0, 1)"),
    "warmup below 0": ('Float("warmup_epochs", -1.0, 1.0)', "warmup_epochs must be >= 0"),
    "clipping norm a negative choice": ('Categorical("grad_clip_norm", [0.0, -1.0])',
                                        "grad_clip_norm: -1.0 is outside"),
    "smoothing written as text": ('Categorical("label_smoothing", ["0.1", "0.2"])',
                                  "label_smoothing: '0.1' is not a number; label_smoothing "
                                  "must be in [0, 1)"),
}


def space_file(tmp_path, case: str) -> str:
    extra, _ = CASES[case]
    if case == "batch not splittable":
        body = ('SearchSpace(Int("global_batch", 64, 512), Float("lr_per_256", 0.01, 1.0), '
                'Int("epochs", 2, 8), world_size=world_size)')
    elif case == "warm start outside its range":
        body = (f'SearchSpace({GOOD}, warm_starts=[{{"global_batch": 64, "lr_per_256": 0.1, '
                '"epochs": 20}], world_size=world_size)')
    else:
        body = f"SearchSpace({GOOD}, {extra}, world_size=world_size)"
    path = tmp_path / "space.py"
    path.write_text(HEADER + f"\ndef space(world_size):\n    return {body}\n")
    return str(path)


CASES["batch not splittable"] = (None, "global_batch: 64, 65, 67, 68, 70, ... cannot be split "
                                       "evenly over 3 ranks")


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bad_space_gets_its_message_and_exit_code_2(case, tmp_path, capsys):
    path = space_file(tmp_path, case)
    code = main(["space", "check", path, "--world-size", "3" if "batch" in case else "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert CASES[case][1] in err, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("autotune: error: ")


def test_check_lists_every_problem_not_just_the_first(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text(HEADER + 'space = SearchSpace(Float("lr_per_256", 1.0, 0.1), '
                    'Categorical("decay", []), Int("epochs", 0, 5, log=True), '
                    'Float("momentum", 0.9, 0.95, condition="optimizer == \'lars\'"))\n')
    assert main(["space", "check", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 5 and lines[-1] == (
        f"autotune: error: 4 problem(s) in search space {str(path)!r}")
    assert all(line.startswith(str(path)) for line in lines[:-1])


def test_a_good_file_passes_and_prints_its_table(tmp_path):
    path = space_file(tmp_path, "low >= high").replace("space.py", "good.py")
    (tmp_path / "good.py").write_text(HEADER + f"space = SearchSpace({GOOD})\n")
    result = run_cli("space", "check", path, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "global_batch" in result.stdout and "ok: " in result.stdout


def test_start_study_with_a_broken_space_points_to_space_check(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space_file(tmp_path, "empty categorical")
    (tmp_path / "s.yaml").write_text("search_space: space.py\n")
    assert main(["start", "study", "s.yaml"]) == 2
    err = capsys.readouterr().err
    assert "decay: choices must not be empty" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml", "space.py"]


@pytest.mark.parametrize("name", ["quickstart", "resnet50_imagenet_dawnbench",
                                  "resnet50_imagenet_mlperf"])
def test_space_show_prints_each_shipped_space(name, capsys):
    assert main(["space", "show", name, "--world-size", "16"]) == 0
    out = capsys.readouterr().out
    assert f"search space {name} (world size 16)" in out and "warm-start" in out


def _check(tmp_path, body: str) -> tuple[int, str]:
    path = tmp_path / "space.py"
    path.write_text(HEADER + body)
    code = main(["space", "check", str(path)])
    return code, path.name


@pytest.mark.parametrize("body, expected", [
    ("import sys\nsys.exit(0)\n", "called sys.exit(0) while being imported"),
    ("import sys\ndef space(world_size):\n    sys.exit()\n", "space(2) called sys.exit(None)"),
])
def test_a_space_file_that_exits_is_refused_not_obeyed(body, expected, tmp_path, capsys):
    # sys.exit(0) in the user's file ended `space check` (and `start study`) quietly, exit 0
    code, _ = _check(tmp_path, body)
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err, err


def test_the_items_may_come_as_one_list(tmp_path, capsys):
    code, _ = _check(tmp_path, f"space = SearchSpace([{GOOD}])\n")
    assert code == 0, capsys.readouterr().err
    assert "global_batch" in capsys.readouterr().out


def test_lists_beside_other_items_are_named_as_lists(tmp_path, capsys):
    code, _ = _check(tmp_path, 'space = SearchSpace([Float("lr_per_256", 0.1, 1.0)], '
                               '[Int("epochs", 1, 3)])\n')
    err = capsys.readouterr().err
    assert code == 2 and "item 2 is a list; give SearchSpace its items as arguments" in err, err


def test_a_batch_written_as_text_is_named_as_text(tmp_path, capsys):
    code, _ = _check(tmp_path, 'space = SearchSpace(Categorical("global_batch", [64, "128"]), '
                               'Float("lr_per_256", 0.1, 1.0), Int("epochs", 1, 3))\n')
    err = capsys.readouterr().err
    assert code == 2 and "global_batch: '128' is not an integer" in err, err
    assert "split evenly" not in err


DEFINE_BY_RUN = HEADER + '''
calls = []


def extra(trial, values):
    calls.append(1)
    if len(calls) > {ok_calls}:
        raise RuntimeError("my code broke")
    return {returned}


space = SearchSpace(PowerOfTwo("global_batch", 64, 256), Float("lr_per_256", 0.1, 1.0),
                    Int("epochs", 1, 3), define_by_run=extra)
'''


@pytest.mark.parametrize("ok_calls, returned, expected", [
    (0, "{}", "define-by-run function extra raised RuntimeError: my code broke"),
    (99, "[('momentum', 0.9)]", "define-by-run function extra returned list; it returns a dict"),
])
def test_a_define_by_run_function_that_fails_is_found_by_the_check(ok_calls, returned,
                                                                   expected, tmp_path, capsys):
    # space check skipped spaces with define-by-run code, and a study crashed on it with a
    # traceback, leaving its first trial RUNNING
    code, _ = _check(tmp_path, DEFINE_BY_RUN.removeprefix(HEADER).format(
        ok_calls=ok_calls, returned=returned))
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err, err


def test_a_study_whose_define_by_run_code_breaks_stops_in_one_line_and_fails_its_trials(
        tmp_path):
    # the check's one call passes; the worker's samples raise from then on
    (tmp_path / "space.py").write_text(DEFINE_BY_RUN.format(ok_calls=1, returned="{}"))
    (tmp_path / "s.yaml").write_text("search_space: space.py\nbudget: {n_trials: 2}\n")
    result = run_cli("start", "study", "s.yaml", "--no-warm-start", cwd=tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "autotune: error: the search space's define-by-run function extra raised "
        "RuntimeError: my code broke (3 points in a row); fix it and check the space with "
        "`autotune space check FILE`")
    import optuna
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/autotune.db"
                               ).trials
    assert [(t.state.name, t.user_attrs.get("outcome")) for t in trials] == \
        [("FAIL", "infeasible")] * 3
    assert "my code broke" in trials[0].user_attrs["detail"]


OPTUNA_HEADER = ("from optuna.distributions import CategoricalDistribution, FloatDistribution, "
                 "IntDistribution\n")


def test_a_dict_of_optuna_distributions_is_a_space(tmp_path, capsys):
    # a user coming from Optuna writes the space as Optuna's distributions
    code, _ = _check(tmp_path, OPTUNA_HEADER + (
        'space = {"global_batch": CategoricalDistribution([64, 128]),\n'
        '         "lr_per_256": FloatDistribution(0.01, 1.0, log=True),\n'
        '         "epochs": IntDistribution(2, 8, step=2)}\n'))
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()[1:4]]
    assert rows == [["global_batch", "one", "of", "64,", "128"],
                    ["lr_per_256", "float", "[0.01,", "1]", "log"],
                    ["epochs", "int", "[2,", "8]", "step", "2"]], out


@pytest.mark.parametrize("body, expected", [
    ('def search_space(trial):\n    return {"lr": trial.suggest_float("lr", 0.01, 1)}\n',
     "it defines search_space(trial), Optuna's define-by-run style: define `space = "
     "SearchSpace("),
    ('def space(trial):\n    return {"lr": trial.suggest_float("lr", 0.01, 1)}\n',
     "space(trial) is written as Optuna's define-by-run objective; define `space = "),
    ('def space(x):\n    return {"lr": x.suggest_float("lr", 0.01, 1)}\n',
     "space() calls an Optuna trial's suggest methods, but autotune calls it with the world "
     "size"),
    (f"my_space = SearchSpace({GOOD})\n",
     "it defines the SearchSpace `my_space`: name it `space`"),
    (OPTUNA_HEADER + 'SPACE = {"lr_per_256": FloatDistribution(0.01, 1.0)}\n',
     "it defines the Optuna distributions `SPACE`: name the dict `space`"),
    ('space = {"lr_per_256": [0.01, 0.1], "epochs": (1, 8)}\n',
     "its `space` is a dict of other values than Optuna distributions"),
    (OPTUNA_HEADER + 'space = {"lr_per_256": FloatDistribution(0.01, 1.0, step=0.01)}\n',
     "lr_per_256: FloatDistribution(step=0.01) has no autotune equivalent"),
    (OPTUNA_HEADER + 'space = {"epochs": IntDistribution(8, 2)}\n', "ValueError"),
])
def test_a_space_written_for_optuna_or_misnamed_is_told_what_to_write(body, expected, tmp_path,
                                                                      capsys):
    code, _ = _check(tmp_path, body)
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err, err


def test_a_study_file_or_a_space_file_given_for_the_other_is_named(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.py").write_text(HEADER + f"space = SearchSpace({GOOD})\n")
    (tmp_path / "inner.yaml").write_text("budget: {n_trials: 1}\n")
    (tmp_path / "s.yaml").write_text("search_space: inner.yaml\n")
    assert main(["start", "study", "space.py"]) == 2
    assert ("space.py is a Python file; a study file is YAML or TOML (.yaml, .yml, .toml, "
            ".json): name a search space in it as `search_space: space.py`"
            ) in capsys.readouterr().err
    assert main(["start", "study", "s.yaml"]) == 2
    assert ("inner.yaml is a study file, not a search space: a search space is a Python file "
            "(.py) defining `space`") in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inner.yaml", "s.yaml", "space.py"]


@pytest.mark.parametrize("ref, said", [
    ("quickstart.py", "(did you mean the shipped space quickstart?)"),
    ("Quickstart", "(did you mean the shipped space quickstart?)"),
    ("resnet50_imagenet", "(did you mean the shipped space resnet50_imagenet_"),
])
def test_a_shipped_space_named_almost_right_is_told_its_name(ref, said, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["space", "show", ref]) == 2
    err = capsys.readouterr().err
    assert f"search space {ref!r} not found {said}" in err, err


@pytest.mark.parametrize("name, text", [
    ("study.json", '{"trainer": {"model": "resnet18"}, "target": {"metric": "top1", '
                   '"value": 0.9}}'),
    ("STUDY.YML", "trainer: {model: resnet18}\ntarget: {metric: top1, value: 0.9}\n"),
])
def test_space_check_and_show_take_a_study_file_of_any_format(name, text, tmp_path, capsys,
                                                              monkeypatch):
    # JSON study files were read by start study but refused by space check as "a study file,
    # not a search space"; space show refused every study file
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(text)
    assert main(["space", "check", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith("search space quickstart (world size 2)\n")
    assert out.endswith(f"ok: {name} runs image_classifier on a valid search space for 2 "
                        "rank(s)\n")
    assert main(["space", "show", name]) == 0
    assert capsys.readouterr().out.startswith("search space quickstart (world size 2)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
