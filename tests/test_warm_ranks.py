"""Warm trainer ranks: a worker's trials run one after another in the same trainer processes,
and ranks that are gone are replaced by a fresh launch without failing a trial."""

from __future__ import annotations

import dataclasses
import os
import signal

import optuna
import psutil
import pytest

from autotune.config import StudyConfig
from autotune.modes import make_pruner, make_sampler
from autotune.space import load_space
from autotune.trial_runner import TrialRunner

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _runner(tmp_path, warm=True):
    cfg = StudyConfig()
    # No pruning: these tests are about the ranks, not about which configurations learn (the
    # default cadence evaluates every 0.5 s of a 4 s cap, often enough for the at-chance rule
    # to judge a slow learner by half its schedule).
    cfg = dataclasses.replace(
        cfg, pruner="none",
        trainer=dataclasses.replace(cfg.trainer, warm_ranks=warm, eval_every_s=0.0),
        budget=dataclasses.replace(cfg.budget, max_trial_s=4.0))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}",
                                direction="minimize", sampler=make_sampler(cfg, 3),
                                pruner=make_pruner(cfg))
    for batch in (128, 256, 128):    # short, known configurations: three real trials
        study.enqueue_trial({"global_batch": batch, "lr_per_256": 0.05, "warmup_epochs": 0.0,
                             "decay": "cosine", "label_smoothing": 0.0, "epochs": 3})
    runner = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437,
                         run_dir=tmp_path / "runs")
    return runner, study


def _alive(process):
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_workers_trials_run_in_the_same_warm_ranks_which_leave_when_it_closes(tmp_path):
    runner, study = _runner(tmp_path)
    with runner:
        results = [runner.run(study) for _ in range(3)]
        launcher = psutil.Process(runner.ranks.warm.process.proc.pid)
        ranks = launcher.children(recursive=True)
        assert len(ranks) == 2 and all(_alive(p) for p in ranks)     # waiting for a plan
    assert all(r.outcome != "failed" for r in results), [r.detail for r in results]
    trials = study.trials
    assert [t.user_attrs["ranks_trial"] for t in trials] == [1, 2, 3]
    assert len({t.user_attrs["trainer_pid"] for t in trials}) == 1
    # each trial keeps its own share of the ranks' log, and says where the whole log is
    assert "warm ranks started for trial 0" in (tmp_path / "runs" / "trial-2" /
                                                 "trainer.log").read_text()
    # closing the runner let the ranks leave; the launcher follows them out
    assert not any(_alive(p) for p in ranks)
    psutil.wait_procs([launcher], timeout=30)
    assert not _alive(launcher)


@pytest.mark.slow
def test_warm_ranks_that_died_between_trials_are_replaced_by_a_fresh_launch(tmp_path):
    runner, study = _runner(tmp_path)
    with runner:
        first = runner.run(study)
        os.killpg(runner.ranks.warm.process.proc.pid, signal.SIGKILL)   # a lost node
        runner.ranks.warm.process.proc.wait()
        second = runner.run(study)
    assert first.outcome != "failed" and second.outcome != "failed", second.detail
    a, b = study.trials[:2]
    assert b.user_attrs["ranks_trial"] == 1                       # launched anew
    assert a.user_attrs["trainer_pid"] != b.user_attrs["trainer_pid"]


@pytest.mark.slow
def test_without_warm_ranks_every_trial_is_a_fresh_launch(tmp_path):
    runner, study = _runner(tmp_path, warm=False)
    with runner:
        for _ in range(2):
            assert runner.run(study).outcome != "failed"
        assert runner.ranks.warm is None
    assert [t.user_attrs["ranks_trial"] for t in study.trials[:2]] == [1, 1]
    assert study.trials[0].user_attrs["trainer_pid"] != study.trials[1].user_attrs[
        "trainer_pid"]


def test_a_trainer_program_that_does_not_serve_plans_runs_each_trial_in_a_fresh_launch(tmp_path):
    import trainers

    program = f"noserve_{os.getpid()}"     # a runnable module of trainers/: a worker runs it
    script = os.path.join(os.path.dirname(trainers.__file__), f"{program}.py")
    with open(script, "w") as f:   # a trainer of the user's own that knows nothing of serving
        f.write("import argparse, os\nfrom trainers.reporter import connect\n"
                "p = argparse.ArgumentParser()\n"
                "for a in ('--plan', '--report-to', '--local_rank'):\n    p.add_argument(a)\n"
                "if __name__ == '__main__':\n    a = p.parse_args()\n"
                "    if os.environ.get('RANK', '0') == '0':\n"
                "        r = connect(a.report_to)\n"
                "        r.send({'type': 'start', 'pid': os.getpid()})\n"
                "        r.send({'type': 'end', 'reason': 'planned_epochs', 'elapsed_s': 0.5})\n"
                "        r.close()\n")
    try:
        runner, study = _runner(tmp_path)          # warm ranks asked for
        runner.cfg = dataclasses.replace(runner.cfg, trainer=dataclasses.replace(
            runner.cfg.trainer, program=program))
        with runner:
            results = [runner.run(study) for _ in range(2)]
            assert runner.ranks.warm is None       # nothing kept: the ranks did not serve
    finally:
        os.remove(script)
    assert [(r.outcome, r.reason) for r in results] == [("censored", "planned_epochs")] * 2, \
        [r.detail for r in results]
    pids = [t.user_attrs["trainer_pid"] for t in study.trials[:2]]
    assert pids[0] != pids[1]
