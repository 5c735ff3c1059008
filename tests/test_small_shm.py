"""A machine whose /dev/shm is small (a container's: Docker gives 64 MiB): the CPU ranks
leave out DeepSpeed's shared-memory op, whose buffers would not fit, instead of dying of a bus
error before their first step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from trainers._shm import BUFFER_BYTES, room_note


def test_the_op_is_left_out_only_where_its_buffers_do_not_fit():
    assert room_note(10 * BUFFER_BYTES, 2) is None
    assert room_note(64 * 2**20, 1) == (
        "/dev/shm has 64 MiB free, less than DeepSpeed's shared-memory op needs for 1 rank(s) "
        "(83 MiB): it is left out (training does not use it)")
    assert room_note(0, 2) is not None


def _can_mount_a_private_shm() -> bool:
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=1M tmpfs /dev/shm"],
                           capture_output=True, timeout=30, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_a_private_shm(),
                    reason="needs root and unshare to give one process a small /dev/shm")
def test_a_trial_on_a_machine_with_a_2_mib_dev_shm_trains(tmp_path):
    # before, both ranks died (SIGSEGV) initializing the op and every trial failed "crashed"
    root = Path(__file__).resolve().parents[1]
    command = (f"mount -t tmpfs -o size=2M tmpfs /dev/shm && exec {sys.executable} -m autotune "
               "start study quickstart --n-trials 1 --max-trial-seconds 20")
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(["unshare", "-m", "sh", "-c", command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    trial = optuna.load_study(study_name="quickstart",
                              storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials[0]
    assert trial.user_attrs["outcome"] in ("reached", "censored"), trial.user_attrs
    assert trial.user_attrs.get("stop_reason") != "crashed"
    log = (tmp_path / "autotune-runs" / "quickstart" / "trial-0" / "trainer.log").read_text()
    assert "autotune: /dev/shm has 2 MiB free, less than DeepSpeed's shared-memory op" in log
