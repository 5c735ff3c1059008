"""Nothing outlives its worker: a worker killed with SIGKILL while its trial trains takes the
launcher and every rank with it (the kernel's parent-death signal), and ranks started from a
folder holding a stray module of a standard name (inspect.py) do not import it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ._services import Background

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import sys, json
sys.path.insert(0, {root!r})
from tests._drive import make_plan
from autotune.ranks import run_plan, keep_going

def on_message(msg, channel, process):
    if msg["type"] == "eval":
        print(json.dumps({{"launcher": process.proc.pid}}), flush=True)

run_plan(make_plan(epochs=200), __import__("pathlib").Path("run"), answer=keep_going,
         on_message=on_message, timeout_s=600)
"""


CHAIN = """
import sys, json, time
sys.path.insert(0, {root!r})
from pathlib import Path
from autotune._process import TrainerProcess
from autotune.launch import deepspeed_command, trainer_env
command = deepspeed_command(Path({rank!r}), Path("plan.json"), "127.0.0.1:1", ranks=2,
                            master_port=29999)
process = TrainerProcess(command, trainer_env("cpu", 1), Path("launch.log"))
print(json.dumps({{"launcher": process.proc.pid}}), flush=True)
time.sleep(600)
"""

# A rank that never talks to the worker (as ranks still building or loading do), tied to
# its launcher by the trainers' own lifeline.
RANK = """
import sys, time
sys.path.insert(0, {root!r})
from trainers._lifeline import die_with_parent
die_with_parent()
time.sleep(600)
"""


def test_ranks_that_never_report_die_with_the_launcher_which_dies_with_its_worker(tmp_path):
    rank = tmp_path / "rank.py"
    rank.write_text(RANK.format(root=str(ROOT)))
    script = tmp_path / "chain.py"
    script.write_text(CHAIN.format(root=str(ROOT), rank=str(rank)))
    worker = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = worker.stdout.readline()
        assert line, worker.stderr.read()[-3000:]
        launcher = psutil.Process(int(__import__("json").loads(line)["launcher"]))
        deadline = time.monotonic() + 60
        while len(launcher.children(recursive=True)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = [p.pid for p in launcher.children(recursive=True)]
        assert len(ranks) == 2, (ranks, (tmp_path / "launch.log").read_text()[-2000:])
        time.sleep(1.0)                           # the ranks have armed their lifeline
        _kill_and_expect_gone(worker, [launcher.pid, *ranks])
    finally:
        if worker.poll() is None:
            worker.kill()
        for pid in _alive(locals().get("ranks", [])):
            os.kill(pid, signal.SIGKILL)


def _kill_and_expect_gone(worker: subprocess.Popen[str], trainers: list[int]) -> None:
    """SIGKILLs ``worker``; its ``trainers`` must be gone within 15 s."""
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    deadline = time.monotonic() + 15
    while _alive(trainers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(trainers), "launcher or ranks outlived their worker"


def _alive(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_killed_worker_takes_its_launcher_and_ranks_with_it(tmp_path):
    (tmp_path / "inspect.py").write_text("raise SystemExit('a stray inspect.py was imported')\n")
    (tmp_path / "run").mkdir()
    script = tmp_path / "worker_stand_in.py"
    script.write_text(WORKER.format(root=str(ROOT)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-P", str(script)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = worker.stdout.readline()           # the first evaluation: ranks are training
        assert line, worker.stderr.read()[-3000:]
        launcher = psutil.Process(int(__import__("json").loads(line)["launcher"]))
        ranks = [p.pid for p in launcher.children(recursive=True)]
        assert len(ranks) == 2, ranks
        _kill_and_expect_gone(worker, [launcher.pid, *ranks])
    finally:
        if worker.poll() is None:
            worker.kill()


def _trainers_under(folder: Path) -> list[list[str]]:
    return [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and any(str(folder) in a for a in p.info["cmdline"])
            and any("image_classifier" in a or "trainers._launch" in a
                    for a in p.info["cmdline"])]


@pytest.mark.parametrize("signals", [
    [signal.SIGINT],
    pytest.param([signal.SIGTERM], marks=pytest.mark.slow),   # Ctrl-C's path, another code
    pytest.param([signal.SIGINT, signal.SIGINT], marks=pytest.mark.slow)])   # Ctrl-C twice
def test_ctrl_c_or_sigterm_to_start_study_ends_its_trial_and_leaves_nothing_running(
        tmp_path, signals):
    """`autotune start study` stopped by Ctrl-C (SIGINT) or a SIGTERM while a trial trains:
    the trial saves a checkpoint and is queued to resume from it; a line saying so and how to
    resume, exit 130 or 143, and no launcher or rank left behind. Ctrl-C twice stops at once:
    the trial is recorded as failed."""
    import optuna

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    study = Background(
        [sys.executable, "-m", "autotune", "start", "study", "quickstart", "--n-trials", "3",
         "--max-trial-seconds", "120"], cwd=tmp_path, env=env, start_new_session=True,
        # Ctrl-C reaches it as in a terminal, even when these tests run with SIGINT ignored
        # (a shell's background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not _trainers_under(tmp_path):
            time.sleep(0.5)
        assert _trainers_under(tmp_path), "no trial started"
        time.sleep(2)
        for sig in signals:
            study.send_signal(sig)
            time.sleep(0.3)
        _, err = study.communicate(timeout=120)
    finally:
        if study.poll() is None:
            study.kill()
    assert study.returncode == (130 if signals[0] == signal.SIGINT else 143), err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.endswith("the study can be resumed with the same command"), err[-2000:]
    time.sleep(2)
    assert not _trainers_under(tmp_path)
    trials = optuna.load_study(study_name="quickstart",
                               storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials
    if len(signals) == 2:                  # at once: the trial failed, nothing to resume
        assert "marked failed" in last
        assert trials and trials[-1].state.name == "FAIL"
        # autotune's own end, told as such (not a trial another client ended)
        assert trials[-1].user_attrs.get("stop_reason") == "aborted", trials[-1].user_attrs
        return
    assert "saved a checkpoint it resumes from" in last
    interrupted, queued = trials[-2], trials[-1]
    assert interrupted.state.name == "FAIL", interrupted.user_attrs
    assert interrupted.user_attrs["stop_reason"] == "interrupted"
    assert queued.state.name == "WAITING"
    assert queued.user_attrs["resume_of"] == interrupted.number
    assert queued.user_attrs["resume_from"] == interrupted.user_attrs["checkpoint"]
    assert Path(queued.user_attrs["resume_from"]).is_dir()
