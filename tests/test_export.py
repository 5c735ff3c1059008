"""`autotune export curves`: a study's curves in opda's format, which the replay reads back."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from autotune import record
from autotune.cli import main
from autotune.export import curves
from autotune.replay import Replay, load_table

optuna.logging.set_verbosity(optuna.logging.WARNING)

DISTS = {"global_batch": CategoricalDistribution([64, 128, 256]),
         "lr_per_256": FloatDistribution(0.01, 1.0, log=True),
         "epochs": IntDistribution(4, 12), "decay": CategoricalDistribution(["cosine", "step"])}


def _trial(number: int, reason: str, rows: list[list[float]], epochs: int = 8,
           lr: float = 0.1, **attrs: object) -> optuna.trial.FrozenTrial:
    outcome = {"reached": "reached", "diverged": "failed"}.get(reason, "censored")
    trial = create_trial(
        state=TrialState.COMPLETE, value=rows[-1][0] if outcome == "reached" else 1e6,
        params={"global_batch": 128, "lr_per_256": lr, "epochs": epochs, "decay": "cosine"},
        distributions=DISTS,
        user_attrs={record.OUTCOME: outcome, record.STOP_REASON: reason,
                    record.PARAMS: {"epochs": epochs, "peak_lr": lr / 2},
                    record.CURVE: rows, **attrs})
    trial.number = number
    return trial


def _rows(n: int, epochs: int, step_s: float = 2.0, start: float = 0.0, rise: float = 0.1
          ) -> list[list[float]]:
    return [[start + step_s * (k + 1), min(0.1 + rise * (k + 1), 1.0), 0.9,
             (k + 1) / epochs * (step_s / 2.0), 2.0 - 0.1 * k] for k in range(n)]


def test_whole_curves_are_written_and_a_resumed_trial_is_one_run():
    resumed_from = _trial(2, "interrupted", _rows(3, 8))
    resumed = _trial(3, "planned_epochs", [[5.0, 0.45, 0.9, 0.3, 1.5], [7.0, 0.6, 0.9, 0.45, 1.3]],
                     **{record.LINEAGE: [2], record.RESUME_OF: 2,
                        record.RESUME_ELAPSED: 4.0})
    trials = [_trial(0, "reached", _rows(9, 8)), _trial(1, "rung", _rows(2, 8)),
              resumed_from, resumed, _trial(4, "diverged", _rows(1, 8, rise=0.0))]
    rows, left = curves(trials, num_classes=10)
    assert [r["iteration"] for r in rows] == [0, 3, 4] and left == {"rung": 1}
    first = rows[0]
    assert first["epochs"] == 8 and first["global_batch"] == 128 and first["decay"] == "cosine"
    assert first["num_classes"] == 10 and first["nan_train_loss"] is False
    assert "peak_lr" not in first                      # what was sampled, not what it derives
    point = first["learning_curve"][0]
    assert point == {"time": 2.0, "epoch": 0.0, "top_1": pytest.approx(0.2), "top_5": 0.9,
                     "loss": 2.0}
    # an evaluation before the first epoch ended: a fraction of an epoch done
    assert curves([_trial(5, "reached", [[1.0, 0.3, 0.9, 0.05, 2.0]])])[0][0][
        "learning_curve"][0]["epoch"] == pytest.approx(0.05 * 8 - 1)
    # the interrupted attempt's curve up to its checkpoint (4 s), then the resumption's
    assert [p["time"] for p in rows[1]["learning_curve"]] == [2.0, 4.0, 5.0, 7.0]
    assert rows[2]["nan_train_loss"] is True
    top5_only = _trial(6, "planned_epochs", [[2.0, None, 0.5, 0.125, 2.0],
                                              [4.0, None, 0.7, 0.25, 1.5]])
    assert curves([top5_only])[0][0]["learning_curve"][1] == {
        "time": 4.0, "epoch": 1.0, "top_5": 0.7, "loss": 1.5}
    every, left = curves(trials, every=True)
    assert [r["iteration"] for r in every] == [0, 1, 3, 4] and left == {}
    assert "num_classes" not in every[0]


def _study_file(tmp_path: Path, trials: list[optuna.trial.FrozenTrial]) -> str:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="mine", storage=storage)
    study.set_user_attr(record.STUDY_CONFIG, {"trainer": {"num_classes": 10},
                                              "target": {"metric": "top1", "value": 0.9}})
    for t in trials:
        study.add_trial(t)
    return storage


def test_an_exported_study_replays_under_every_tuner(tmp_path, capsys, monkeypatch):
    trials = [_trial(i, "reached" if i % 3 == 0 else "planned_epochs",
                     _rows(8 + i % 4, 8 + i % 4, rise=0.1 + 0.01 * i), epochs=8 + i % 4,
                     lr=0.02 * (i + 1)) for i in range(12)]
    storage = _study_file(tmp_path, trials)
    out = tmp_path / "mine.jsonl"
    monkeypatch.setenv("HOME", str(tmp_path))     # --out ~/mine.jsonl: the home folder's
    assert main(["export", "curves", "mine", "--storage", storage, "--out",
                 "~/mine.jsonl"]) == 0
    said = capsys.readouterr().out
    assert "wrote 12 trial curve(s)" in said
    assert f"--table opda:{out} --target 0.9 --metric top1" in said
    table = load_table(f"opda:{out}", 0.9)
    assert table.num_classes == 10 and len(table.runs) == 12
    assert {"epochs", "lr_per_256"} <= set(table.space)      # batch 128 in every run: left out
    assert "stop_reason" not in table.space and "iteration" not in table.space
    outcome = Replay(table, "autotune", seed=0, max_trials=8, min_compute_factor=0.0).run()
    assert outcome.trials == 8
    assert main(["export", "curves", "mine", "--storage", storage]) == 0   # to stdout
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["iteration"] == 0
    spaced = tmp_path / "my curves" / "été.jsonl"      # the hint pastes into a shell as is
    spaced.parent.mkdir()
    assert main(["export", "curves", "mine", "--storage", storage, "--out", str(spaced)]) == 0
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    words = shlex.split(hint.split(": ", 1)[1])
    assert words[words.index("--table") + 1] == f"opda:{spaced}"


@pytest.mark.parametrize("case, expected", [
    ("no study", "no study 'other' in"),
    ("out a folder", "is a folder; give the path of the .jsonl file"),
    ("out in a missing folder", "no folder"),
    ("nothing whole", "has no trial with a whole curve to export (finished: 1 rung)"),
    ("out not writable", "cannot write --out /proc/curves.jsonl"),
    ("nothing evaluated, --all", "has no trial with an evaluation to export (finished: 1 "
                                 "study_timeout)"),
])
def test_export_refuses_in_one_line_and_writes_nothing(tmp_path, capsys, case, expected):
    whole = case == "out not writable"           # one trial to write, nowhere to write it
    every = case.endswith("--all")           # a trial stopped before its first evaluation
    storage = _study_file(tmp_path, [_trial(0, "study_timeout", []) if every else
                                     _trial(0, "reached" if whole else "rung",
                                            _rows(9 if whole else 2, 8))])
    out = {"out a folder": tmp_path, "out in a missing folder": tmp_path / "no" / "c.jsonl",
           "out not writable": Path("/proc/curves.jsonl")}.get(case, tmp_path / "c.jsonl")
    def written() -> list[str]:           # the store's own WAL files aside
        return sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("study.db"))

    before = written()
    code = main(["export", "curves", "other" if case == "no study" else "mine",
                 "--storage", storage, "--out", str(out), *(["--all"] if every else [])])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert written() == before


def test_a_command_autotune_prints_for_a_path_with_spaces_pastes_into_a_shell(tmp_path):
    # `autotune status` (no study) ends with the command for one study's details; its
    # --storage must come back whole from a shell however the folder is named
    from autotune.status import list_studies

    folder = tmp_path / "my studies" / "été"
    folder.mkdir(parents=True)
    storage = f"sqlite:///{folder / 'a.db'}"
    optuna.create_study(study_name="s", storage=storage)
    said: list[str] = []
    assert list_studies(storage, echo=said.append) == 0
    words = shlex.split(said[-1].split(": ", 1)[1])
    assert words[words.index("--storage") + 1] == storage
