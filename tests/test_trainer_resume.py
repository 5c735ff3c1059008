"""Checkpoint and resume: a run stopped midway and resumed matches an uninterrupted one.

Tolerance for the final accuracy: 2 validation images of 360 (0.0056). On these CPUs the
kernels are deterministic for a fixed thread count, the data order is a function of the seed
and the epoch, and the checkpoint restores the model, the optimizer's momentum, the scheduler
and every rank's RNG state, so the resumed run is expected to repeat the uninterrupted one
exactly; the margin only absorbs a different summation order in gloo's all-reduce, which can
flip the prediction of an image sitting on a decision boundary.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from trainers.schedule import lr_at

from ._drive import drive, go, make_plan


def plan_for(tmp_path, **extra):
    plan = make_plan(epochs=4, warmup_epochs=1.0, decay="cosine", lr_per_256=0.08)
    plan["seed"] = 11
    plan["checkpoint_dir"] = str(tmp_path / "checkpoint")
    plan.update(extra)
    return plan


def evals(messages):
    return [m for m in messages if m["type"] == "eval"]


@pytest.mark.slow    # 50 s; stop --now (test_stop) and a lost worker's trial (test_crash_safety)
# resume from checkpoints in the default suite
def test_a_resumed_run_continues_the_schedule_and_clock_and_ends_where_the_full_one_does(
        tmp_path):
    full = evals(drive(plan_for(tmp_path), tmp_path / "full"))

    def periodic_after_first_eval(msg):  # save and go on, as a worker asks periodically
        if msg["type"] == "eval" and msg["index"] == 0:
            return {"action": "checkpoint", "reason": "", "deadline_s": None}
        return go(msg)

    def ask_after_second_eval(msg, channel, process):
        if msg["type"] == "eval" and msg["index"] == 1:
            channel.request("checkpoint")

    first = drive(plan_for(tmp_path), tmp_path / "first", answer=periodic_after_first_eval,
                  on_message=ask_after_second_eval)
    periodic = [m for m in first if m["type"] == "checkpoint"]
    assert [m["path"] for m in periodic] == [str(tmp_path / "checkpoint" / "step-11")]
    assert periodic[0]["elapsed_s"] == pytest.approx(evals(first)[0]["elapsed_s"], abs=0.5)
    end = first[-1]
    stopped_at = end["steps"]
    assert 22 <= stopped_at < 44                      # after the 2nd evaluation, mid-3rd epoch
    saved = tmp_path / "checkpoint" / f"step-{stopped_at}"
    assert end["reason"] == "checkpointed" and end["checkpoint"] == str(saved)
    assert (saved / "autotune-rank0.pt").is_file() and (saved / "autotune-rank1.pt").is_file()
    # Only the newest checkpoint is kept, once it is complete.
    assert [p.name for p in (tmp_path / "checkpoint").glob("step-*")] == [saved.name]

    resumed_plan = plan_for(tmp_path, resume_from=str(saved))
    second = drive(resumed_plan, tmp_path / "second")
    start = second[0]
    assert start["resumed_at_s"] == pytest.approx(end["checkpoint_elapsed_s"], abs=1e-9)
    combined = evals(first) + evals(second)
    # The same evaluations at the same steps, and the LR of each step is the planned one.
    assert [m["step"] for m in combined] == [m["step"] for m in full] == [11, 22, 33, 44]
    plan = plan_for(tmp_path)
    for m in combined:
        assert m["lr"] == pytest.approx(lr_at(m["step"], plan["peak_lr"], plan["schedule"]))
    # The clock continues: no reset, no jump beyond the training done after the checkpoint.
    times = [m["elapsed_s"] for m in combined]
    assert times == sorted(times)
    assert evals(second)[0]["elapsed_s"] > end["checkpoint_elapsed_s"]
    assert evals(second)[0]["elapsed_s"] - end["checkpoint_elapsed_s"] < 2 * (times[1] - times[0])
    assert second[-1]["steps"] == 44 and second[-1]["reason"] == "planned_epochs"
    assert combined[-1]["top1"] == pytest.approx(full[-1]["top1"], abs=2 / 360)
    assert combined[-1]["loss"] == pytest.approx(full[-1]["loss"], rel=0.05)


def test_sigterm_makes_every_rank_checkpoint_and_exit_cleanly(tmp_path):
    def terminate_after_first_eval(msg, channel, process):
        if msg["type"] == "eval" and msg["index"] == 0:
            for child in psutil.Process(process.proc.pid).children(recursive=True):
                if any(arg.startswith("--local_rank") for arg in child.cmdline()):  # ranks
                    os.kill(child.pid, signal.SIGTERM)

    messages = drive(plan_for(tmp_path), tmp_path / "run", on_message=terminate_after_first_eval)
    assert messages[-1]["reason"] == "checkpointed"
    assert messages[-1]["checkpoint"] == str(
        tmp_path / "checkpoint" / f"step-{messages[-1]['steps']}")
    saved = tmp_path / "checkpoint" / f"step-{messages[-1]['steps']}"
    assert (saved / "autotune-rank0.pt").is_file() and (saved / "autotune-rank1.pt").is_file()
