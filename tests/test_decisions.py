"""One decision path: the worker's trial runner and the replay make the same decisions.

The same recorded curve is fed (a) through the real worker path, `TrialRunner.run` with its
report channel and a stand-in trainer process that plays the reports, and (b) through the
replay (`autotune.replay`), each into a study holding the same earlier trials. Every reply,
the outcome and what the study store holds must agree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune._process import ReportChannel, first_error
from autotune.config import StudyConfig
from autotune.decisions import TrialResult, classify, curve_row
from autotune.errors import LaunchError
from autotune.modes import make_pruner, make_sampler
from autotune.programs import check_allowed, digest
from autotune.replay import Replay, Run, Table
from autotune.space import load_space
from autotune.trial_runner import TrialRunner

optuna.logging.set_verbosity(optuna.logging.WARNING)
PLAYER = Path(__file__).resolve().parent / "_report_player.py"
PARAMS = {"global_batch": 128, "lr_per_256": 0.05, "warmup_epochs": 0.0, "decay": "cosine",
          "label_smoothing": 0.0, "epochs": 4}


def _earlier_trials(study: optuna.Study) -> None:
    """A trial that reached 0.97 at 9 s and two that were stopped, as a study would hold."""
    rising = [[3.0 * k, min(0.3 * k, 0.975), 0.9, k / 4, 1.0] for k in range(1, 5)]
    slow = [[3.0 * k, 0.2 + 0.05 * k, 0.6, k / 8, 2.0] for k in range(1, 4)]
    for value, outcome, curve in ((9.0, "reached", rising[:3]), (9.0, "censored", slow),
                                  (6.0, "censored", slow[:2])):
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=value,
            user_attrs={"outcome": outcome, "curve": curve, "elapsed_s": curve[-1][0]},
            system_attrs={"constraints": [0.0 if outcome == "reached" else 0.5]}))


def _reports(points: list[tuple[float, float]], epochs: int) -> list[dict]:
    reports = []
    for i, (t, top1) in enumerate(points):
        msg = {"index": i, "elapsed_s": t, "epoch": epochs * (i + 1) / len(points),
               "top1": top1, "top5": min(top1 + 0.2, 1.0), "loss": 1.0 - top1}
        if top1 >= 0.97:
            msg["reached"] = True
        reports.append(msg)
    return reports


def _through_the_worker(tmp_path: Path, reports: list[dict], stop_at: float | None = None
                        ) -> tuple[TrialResult, list, optuna.Study]:
    cfg = StudyConfig()
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, warm_ranks=False))
    study = optuna.create_study(direction="minimize", sampler=make_sampler(cfg, 0),
                                pruner=make_pruner(cfg))
    _earlier_trials(study)
    study.enqueue_trial(PARAMS)
    played = tmp_path / "reports.json"
    played.write_text(json.dumps(reports))
    replies = tmp_path / "replies.json"
    runner = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437,
                         run_dir=tmp_path / "runs", stop_at=stop_at)

    def command(plan_path: Path) -> tuple[ReportChannel, list[str]]:
        channel = ReportChannel()
        return channel, [sys.executable, str(PLAYER), channel.address, str(played),
                         str(replies)]

    runner.ranks.command = command  # the stand-in trainer, launched as the real one is
    with runner:
        result = runner.run(study)
    return result, json.loads(replies.read_text()), study


def _through_the_replay(reports: list[dict], epochs: int) -> tuple[TrialResult, list,
                                                                   optuna.Study]:
    run = Run(tuple(r["elapsed_s"] for r in reports), tuple(r["top1"] for r in reports),
              tuple(r["epoch"] for r in reports), float(epochs),
              losses=tuple(r["loss"] for r in reports))
    space = load_space("quickstart", world_size=2)
    reaches = Run((5.0,), (0.98,), (4.0,), 4.0)     # a goal for the table; never trained
    table = Table("one curve", 0.97, [run, reaches], {}, lambda params: run, num_classes=10,
                  sample=space.sample)
    replay = Replay(table, "autotune", seed=0)
    _earlier_trials(replay.study)
    replay.study.enqueue_trial(PARAMS)
    result, replies = replay.one_trial()
    return result, replies, replay.study


CURVES = {
    # slow: stopped once it cannot beat the best TTA (9 s)
    "stopped": [(2.0, 0.3), (4.0, 0.4), (6.0, 0.45), (8.0, 0.5), (10.0, 0.55), (12.0, 0.6)],
    # fast: reaches 0.97 at 6 s, a new best
    "reached": [(2.0, 0.5), (4.0, 0.85), (6.0, 0.975), (8.0, 0.98)],
    # promising until its next evaluation comes late: the trainer stops at the deadline
    "deadline": [(2.0, 0.5), (4.0, 0.8), (6.0, 0.9), (10.0, 0.96)],
    # at chance past half its schedule: diverged
    "diverged": [(1.0, 0.1), (2.0, 0.1), (3.0, 0.1), (4.0, 0.1), (5.0, 0.1)],
}


@pytest.mark.parametrize("name", list(CURVES))
def test_the_worker_and_the_replay_make_the_same_decisions_on_a_curve(tmp_path, name):
    reports = _reports(CURVES[name], PARAMS["epochs"])
    real, real_replies, real_study = _through_the_worker(tmp_path, reports)
    replayed, replay_replies, replay_study = _through_the_replay(reports, PARAMS["epochs"])
    assert real.outcome != "failed" or real.reason == "diverged", real.detail
    assert real_replies == replay_replies
    assert (real.outcome, real.reason, real.value, real.evals) == \
        (replayed.outcome, replayed.reason, replayed.value, replayed.evals)
    mine, theirs = real_study.trials[-1], replay_study.trials[-1]
    assert mine.state == theirs.state and mine.value == theirs.value
    for key in ("outcome", "stop_reason", "best_metric", "elapsed_s"):
        assert mine.user_attrs.get(key) == theirs.user_attrs.get(key), key
    # a table holds the target metric only: the replay's rows leave top5 out
    assert [r[:2] + r[3:] for r in mine.user_attrs["curve"]] == \
        [r[:2] + r[3:] for r in theirs.user_attrs["curve"]]
    assert mine.system_attrs.get("constraints") == theirs.system_attrs.get("constraints")
    expected = {"stopped": ("censored", "projection"), "reached": ("reached", "reached"),
                "deadline": ("censored", "bound"), "diverged": ("failed", "diverged")}[name]
    assert (real.outcome, real.reason) == expected


def test_the_curve_row_is_progress_through_the_planned_schedule():
    row = curve_row({"elapsed_s": 3.14159, "top1": 0.5, "top5": 0.9, "epoch": 1.5,
                     "loss": float("nan")}, planned_epochs=6)
    assert row == [3.142, 0.5, 0.9, 0.25, None]
    # a metric beside the target that is no number (a script's own report) is stored as none
    assert curve_row({"elapsed_s": 1, "top1": 0.5, "top5": "high", "epoch": 3},
                     planned_epochs=6)[2] is None


def test_an_end_report_is_classified_by_its_reason():
    end = {"reason": "stopped", "elapsed_s": 7.0}
    assert classify(1, end, 0, "", 0.5, 3, "projection").reason == "projection"
    assert classify(1, end, 0, "", 0.5, 3, "projection").outcome == "censored"
    assert classify(1, None, -9, "killed", 0.5, 3, "").reason == "hung"
    crashed = classify(1, None, 1, "Traceback ...", 0.5, 3, "")
    assert crashed.outcome == "failed" and "Traceback" in crashed.detail
    assert "parse_known_args" not in crashed.detail
    # a script of the user's own whose argparse refuses the launch's arguments is told how
    refused = classify(1, None, 2, "usage: train.py [-h] [--local_rank LOCAL_RANK] | train.py: "
                       "error: unrecognized arguments: --plan /r/plan.json --report-to "
                       "127.0.0.1:4000", 0.0, 0, "")
    assert refused.reason == "crashed" and refused.detail.startswith(
        "trainer exited with code 2 (the script's own argument parser refuses the arguments")
    assert "parse with parser.parse_known_args()" in refused.detail
    assert "unrecognized arguments: --plan" in refused.detail
    assert classify(1, {"reason": "diverged", "elapsed_s": 2.0}, 0, "", 0.1, 2,
                    "diverged").detail == "accuracy still at chance"
    # a trainer says how many steps it took: a tiny data set's few steps show in the line
    assert classify(1, {"reason": "diverged", "elapsed_s": 2.0, "steps": 3}, 0, "", 0.1, 2,
                    "diverged").detail == "accuracy still at chance after 3 optimizer step(s)"
    assert classify(1, {"reason": "diverged", "elapsed_s": 2.0, "steps": 3}, 0, "", 0.1, 2,
                    "").detail == "loss became NaN or infinite"
    # one that rose, then fell back to chance for good (the pruner's collapse rule)
    assert classify(1, {"reason": "diverged", "elapsed_s": 5.0, "steps": 40}, 0, "", 0.782, 5,
                    "diverged", loss=1.1, collapsed=True).detail == \
        "accuracy fell back to chance after 40 optimizer step(s), from a best of 0.782"
    assert classify(1, {"reason": "diverged", "elapsed_s": 2.0, "steps": 1}, 0, "", 0.1, 1,
                    "diverged", loss=1.06e24).detail == \
        "the weights blew up: validation loss 1.06e+24 at chance after 1 optimizer step(s)"


def test_the_studys_timeout_reaches_the_trainer_as_its_deadline(tmp_path):
    # the study's timeout_s has run out: the trainer is told at its start and stops on its
    # own before its first evaluation; the trial says why
    reports = _reports(CURVES["stopped"], PARAMS["epochs"])
    result, replies, _ = _through_the_worker(tmp_path, reports, stop_at=time.monotonic())
    assert replies[0]["deadline_s"] == pytest.approx(1e-3)
    assert (result.outcome, result.reason) == ("censored", "study_timeout")
    assert result.evals == 0


def test_a_worker_refuses_a_program_outside_trainers_whatever_the_stored_config_says(
        tmp_path):
    # a study config rewritten in the store (or a study file from elsewhere) names a path
    # that is no script: the worker fails the trial as a launch error and runs nothing; a
    # script it names runs on an `autotune worker` only where its operator allowed it
    evil = tmp_path / "evil.py"
    evil.write_text("open(__file__ + '.ran', 'w').write('ran')\n")
    cfg = StudyConfig()
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, warm_ranks=False, program=str(evil.with_suffix(""))))
    study = optuna.create_study(direction="minimize", sampler=make_sampler(cfg, 0),
                                pruner=make_pruner(cfg))
    runner = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437,
                         run_dir=tmp_path / "runs")
    with runner:
        result = runner.run(study)
    assert (result.outcome, result.reason) == ("failed", "launch_error")
    assert "is neither a bundled trainer" in result.detail
    assert not (tmp_path / "evil.py.ran").exists()
    for allowed in ([], [tmp_path / "elsewhere"]):
        with pytest.raises(LaunchError, match="runs its own script .*--allow-program"):
            check_allowed(str(evil), digest(evil), allowed, "s")
    check_allowed(str(evil), digest(evil), [tmp_path], "s")      # allowed: no error
    assert not (tmp_path / "evil.py.ran").exists()


def test_a_crashed_trainer_is_described_by_its_first_error_not_its_peers_echoes():
    log = ["ValueError: retrying the download (a script's own log line, no traceback)",
           "[rank1]: Traceback (most recent call last):",
           "[rank1]:   File \"train.py\", line 3, in <module>",
           "[rank1]: OSError: Caught OSError in DataLoader worker process 0.",
           "[rank1]: Original Traceback (most recent call last):",
           "[rank1]: OSError: image file is truncated (12 bytes not processed)",
           "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer",
           "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero "
           "exit status 1."]
    assert first_error(log) == "OSError: image file is truncated (12 bytes not processed)"
    assert first_error(["[rank0]: Traceback (most recent call last):",
                        "[rank0]: torch.OutOfMemoryError: CUDA out of memory."]) == \
        "torch.OutOfMemoryError: CUDA out of memory."
    assert first_error(["Traceback (most recent call last):", "  File \"t.py\", line 1",
                        "RuntimeError: Connection reset by peer", "just text"]) is None


def test_a_process_stops_taking_trials_once_every_one_failed_alike_for_no_configurations_sake():
    from autotune.decisions import systematic_failure

    def failed(number, reason="crashed", error="ValueError: ImageFolder /d: 23 of the 56"):
        return TrialResult(number, {"lr": number}, "failed", reason,
                           detail=f"trainer exited with code 1: {error} (log: /r/trial-{number})")

    same = [failed(0), failed(1, error="ValueError: ImageFolder /d: 25 of the 60"), failed(2)]
    why = systematic_failure(same)
    assert why and why.startswith("trials 0, 1, 2 all failed alike (crashed: trainer exited")
    assert "resume the study" in why
    assert systematic_failure(same[:2]) is None                         # too few to tell
    assert systematic_failure([*same[:2], failed(2, error="KeyError: 'x'")]) is None
    assert systematic_failure([*same[:2], failed(2, "launch_error")]) is None   # not alike
    trained = TrialResult(5, {}, "censored", "bound", value=3.0)
    assert systematic_failure([trained, *same]) is None   # the data trained once: a trial's own
    oom = TrialResult(3, {}, "failed", "oom", value=1.0)
    assert systematic_failure([oom, *same]) is None       # a configuration's failure
    timeouts = [TrialResult(i, {}, "failed", "setup_timeout",
                            detail=f"the trainer did not finish setting up within {60 + i} s")
                for i in range(3)]
    assert systematic_failure(timeouts)                   # numbers aside, alike
    infeasible = TrialResult(4, {}, "infeasible", "constraint")
    assert systematic_failure([infeasible, *same])        # a point never trained says nothing


def test_a_trial_line_printed_from_the_store_says_how_many_images_were_skipped():
    from autotune._console import format_result, result_of

    stored = create_trial(value=3.0, params={}, distributions={},
                          user_attrs={"outcome": "reached", "stop_reason": "reached",
                                      "elapsed_s": 3.0, "unreadable_images": 2})
    line = format_result(result_of(stored), "top1")    # as start study --workers 0 prints it
    assert line.endswith("(2 unreadable image(s) skipped: named in the trial's log)")


def test_a_shortfall_is_a_gap_for_an_accuracy_and_a_share_for_a_metric_that_falls():
    from autotune.decisions import shortfall

    assert shortfall(0.6, 0.7) == pytest.approx(0.1)
    assert shortfall(0.75, 0.7) == pytest.approx(-0.05)          # reached: feasible
    # a loss of 0.5 against 0.25 is twice its target: half of it is above; any unit alike
    assert shortfall(0.5, 0.25, True) == pytest.approx(0.5)
    assert shortfall(50.0, 25.0, True) == pytest.approx(0.5)
    assert shortfall(0.2, 0.25, True) < 0                         # reached
    assert shortfall(0.0, 0.25, True) < 0                         # a perfect 0 reached too
    assert shortfall(math.inf, 0.25, True) == 1.0                 # never evaluated
    # every miss stays below a failed configuration's constraint (2 for a metric that falls)
    assert all(shortfall(v, 0.25, True) < 2 for v in (0.3, 3.0, 3e9))
