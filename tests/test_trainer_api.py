"""trainers.api in one process (a world of one over gloo), its worker scripted: what a script
of the user's own gets: the clock, the evaluation cadence, stops, the target, checkpoints and
resumption. The real launcher and worker run it in tests/test_own_program.py."""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainers import api, protocol
from trainers.reporter import Reporter

from ._drive import make_plan


class Worker(Reporter):
    """The worker's side, scripted: ``answer(report)`` gives each reply; ``wait_s`` is how long
    each reply takes; ``requests`` what it has asked the trainer for."""

    def __init__(self, answer: Any = None, wait_s: float = 0.0) -> None:
        self.reports: list[dict[str, Any]] = []
        self.answer = answer or (lambda report: protocol.go())
        self.wait_s, self.requests = wait_s, set()

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        self.reports.append(message)
        time.sleep(self.wait_s)
        if message["type"] in ("checkpoint", "end"):
            return protocol.ACK
        return self.answer(message)

    def note(self, message: dict[str, Any]) -> None:
        self.reports.append(message)

    def asked(self, request: str) -> bool:
        return request in self.requests

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.reports if r["type"] == kind]


@pytest.fixture(autouse=True)
def world_of_one():
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)
    if dist.is_initialized():
        dist.destroy_process_group()


def plan_for(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    plan = make_plan(world=1, trainer={"eval_every_steps": 2}, epochs=2, global_batch=256,
                     warmup_epochs=0.0)
    return {**plan, "checkpoint_dir": str(tmp_path / "checkpoint"), **extra}


def train(trial: api.Trial, metric: Any = lambda step: 0.05 * step,
          step_s: float = 0.0) -> list[int]:
    """A stand-in training loop: each step sleeps ``step_s``; evaluations report
    ``metric(step)``; returns the steps at which it evaluated."""
    evaluated = []
    while trial.running:
        time.sleep(step_s)
        if trial.step_done(0.5):
            evaluated.append(trial.step)
            trial.report(top1=metric(trial.step))
    return evaluated


def test_a_trial_reports_its_start_evaluations_and_end_and_follows_the_plans_cadence(tmp_path):
    plan = plan_for(tmp_path)           # 1437 // 256 = 5 steps an epoch, 10 in all
    worker = Worker()
    trial = api.Trial(plan, worker)
    trial.note("model")
    trial.start(extra_field=1)
    assert trial.lr(0) == pytest.approx(plan["peak_lr"])
    evaluated = train(trial)
    summary = trial.end(custom=3)
    assert evaluated == [2, 4, 6, 8, 10]                # every 2 steps, and the last
    assert [r["type"] for r in worker.reports] == ["setup", "start", *["eval"] * 5, "end"]
    start = worker.of("start")[0]
    assert start["extra_field"] == 1 and start["serves"] is False and start["world_size"] == 1
    first = worker.of("eval")[0]
    assert first["step"] == 2 and first["epoch"] == pytest.approx(0.4)
    assert first["samples"] == 512 and first["index"] == 0 and math.isfinite(first["lr"])
    assert summary["reason"] == "planned_epochs" and summary["steps"] == 10
    assert summary["custom"] == 3 and summary["best_top1"] == pytest.approx(0.5)
    assert trial.end() is summary                       # once only
    assert len(worker.of("end")) == 1


def test_the_target_ends_a_trial_with_its_time_to_accuracy(tmp_path):
    worker = Worker()
    trial = api.Trial(plan_for(tmp_path, target={"metric": "top1", "value": 0.15}), worker)
    trial.start()
    train(trial)
    summary = trial.end()
    assert summary["reason"] == "reached" and trial.step == 4
    assert worker.of("eval")[-1]["reached"] is True
    assert summary["tta_s"] == pytest.approx(worker.of("eval")[-1]["elapsed_s"])


def test_waiting_for_the_worker_is_kept_out_of_the_clock(tmp_path):
    worker = Worker(wait_s=0.3)
    trial = api.Trial(plan_for(tmp_path), worker)
    trial.start()
    train(trial, step_s=0.01)
    summary = trial.end()
    # 5 evaluations' replies of 0.3 s waited for (the clock starts after the start's reply);
    # 10 steps of 0.01 s trained
    assert summary["control_s"] >= 1.45
    assert summary["elapsed_s"] < 1.0, summary


def test_the_worker_stops_a_trial_and_its_deadline_stops_one_between_evaluations(tmp_path):
    worker = Worker(answer=lambda r: protocol.stop("bound") if r["type"] == "eval"
                    else protocol.go())
    trial = api.Trial(plan_for(tmp_path), worker)
    trial.start()
    assert train(trial) == [2]
    assert trial.end()["reason"] == "stopped"

    worker = Worker(answer=lambda r: protocol.go(deadline_s=0.05))
    trial = api.Trial(plan_for(tmp_path), worker)
    trial.start()
    train(trial, step_s=0.03)
    summary = trial.end()
    assert summary["reason"] == "bound" and summary["steps"] < 10


def test_a_non_finite_loss_or_the_scripts_own_stop_ends_the_trial(tmp_path):
    trial = api.Trial(plan_for(tmp_path), Worker())
    trial.start()
    assert trial.step_done(float("nan")) is False
    assert not trial.running and trial.end()["reason"] == "diverged"

    trial = api.Trial(plan_for(tmp_path), Worker())
    trial.start()
    trial.stop("oom")
    trial.step_done()
    assert trial.end()["reason"] == "oom"
    with pytest.raises(ValueError, match="unknown stop reason 'tired'; use one of diverged"):
        trial.stop("tired")


def test_a_report_without_the_target_metric_or_before_start_says_what_to_do(tmp_path):
    trial = api.Trial(plan_for(tmp_path), Worker())
    with pytest.raises(RuntimeError, match="call trial.start"):
        trial.step_done()
    trial.start()
    trial.step_done()
    with pytest.raises(ValueError, match="needs the study's target metric 'top1'; it got acc"):
        trial.report(acc=0.5)
    with pytest.raises(ValueError, match="got top1=85.3; the target metric is an accuracy, "
                                         "a share from 0 to 1"):
        trial.report(top1=85.3)
    with pytest.raises(ValueError, match="got top1 with 3 values; report one number"):
        trial.report(top1=torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="got top1='0.5', a str; report numbers"):
        trial.report(top1="0.5")


def test_a_report_of_tensors_and_numpy_numbers_goes_as_plain_numbers(tmp_path):
    """What a training loop computes (`correct / total` of tensors, a NumPy mean) is reported
    by its value; it used to end the script in the report's JSON ("Object of type Tensor is not
    JSON serializable"), and a tensor of 85.3 slipped past the share check."""
    import numpy as np

    worker = Worker()
    trial = api.Trial(plan_for(tmp_path), worker)
    trial.start()
    trial.step_done()
    trial.report(top1=torch.tensor(3) / torch.tensor(4), loss=np.float32(0.25))
    report = worker.of("eval")[-1]
    assert report["top1"] == 0.75 and type(report["top1"]) is float
    assert report["loss"] == 0.25 and type(report["loss"]) is float
    with pytest.raises(ValueError, match="a share from 0 to 1"):
        trial.report(top1=torch.tensor(85.3))


def test_a_script_that_leaves_its_loop_early_ends_as_such(tmp_path):
    trial = api.Trial(plan_for(tmp_path), Worker())
    trial.start()
    trial.step_done()
    assert trial.end()["reason"] == "script_ended"


class Model:
    """The script's state: a tensor, saved and loaded by its own hooks."""

    def __init__(self) -> None:
        self.weight = torch.zeros(3)

    def save(self, folder: Path) -> None:
        torch.save(self.weight, folder / "weight.pt")

    def load(self, folder: Path) -> None:
        self.weight = torch.load(folder / "weight.pt")


def test_checkpoints_on_the_workers_answer_and_request_and_a_resume_continues(tmp_path):
    worker = Worker(answer=lambda r: {**protocol.go(), "action": "checkpoint"}
                    if r["type"] == "eval" and r["step"] == 4 else protocol.go())
    model, trial = Model(), api.Trial(plan_for(tmp_path), worker)
    trial.checkpointing(save=model.save, load=model.load)
    trial.start()
    while trial.running:
        model.weight += 1
        time.sleep(0.01)
        if trial.step_done():
            trial.report(top1=0.1)
        if trial.step == 7:
            worker.requests.add("checkpoint")          # the worker is going away
    summary = trial.end()
    saved = worker.of("checkpoint")[0]
    assert Path(saved["path"]).name == "step-4"
    assert summary["reason"] == "checkpointed" and Path(summary["checkpoint"]).name == "step-8"
    assert not Path(saved["path"]).exists()             # the older one removed
    random_after_save = torch.rand(1)

    resumed_worker, resumed = Worker(), Model()
    plan = plan_for(tmp_path, resume_from=summary["checkpoint"])
    trial = api.Trial(plan, resumed_worker)
    trial.checkpointing(save=resumed.save, load=resumed.load)
    trial.start()
    assert torch.equal(resumed.weight, torch.full((3,), 8.0))    # the script's state
    assert trial.step == 8 and trial.epoch == 1 and trial.step_in_epoch == 3
    assert torch.equal(torch.rand(1), random_after_save)         # the RNG continues
    assert resumed_worker.of("start")[0]["resumed_at_s"] == pytest.approx(
        summary["checkpoint_elapsed_s"])
    train(trial)
    first = resumed_worker.of("eval")[0]
    assert first["step"] == 10 and first["elapsed_s"] > summary["checkpoint_elapsed_s"]
    assert trial.end()["reason"] == "planned_epochs"


def test_a_resumed_plan_without_load_hooks_is_refused_in_one_line(tmp_path):
    trial = api.Trial(plan_for(tmp_path, resume_from=str(tmp_path / "step-3")), Worker())
    with pytest.raises(SystemExit, match="gave no way to load it: call trial.checkpointing"):
        trial.start()


def test_a_target_that_falls_is_reached_at_or_below_it_and_its_best_is_the_least(tmp_path):
    # target mode min (a loss): 2.0, 1.5, 1.0, ... reaches 1.0 at its third evaluation
    worker = Worker()
    target = {"metric": "val_loss", "value": 1.0, "mode": "min"}
    trial = api.Trial(plan_for(tmp_path, target=target), worker)
    trial.start()
    while trial.running:
        if trial.step_done(0.5):
            trial.report(val_loss=2.5 - 0.25 * trial.step, top1=0.1 * trial.step)
    summary = trial.end()
    assert summary["reason"] == "reached" and trial.step == 6
    assert summary["best_val_loss"] == pytest.approx(1.0)       # the least, not the first
    assert summary["best_top1"] == pytest.approx(0.6)           # an accuracy's: the most
    # a loss above 1 is no percentage; a negative one is no loss
    again = api.Trial(plan_for(tmp_path, target=target), Worker())
    again.start()
    again.step_done()
    again.report(val_loss=2.3)
    with pytest.raises(ValueError, match="got val_loss=-0.5; a target metric that falls"):
        again.report(val_loss=-0.5)
