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


def test_loader_workers_are_left_out_only_where_their_batches_do_not_fit():
    from trainers._shm import loader_note

    assert loader_note(2**30, 2, 2, 16, 64) is None      # 3 MiB of batches in 1 GiB
    assert loader_note(8 * 2**20, 2, 2, 8, 224) == (
        "/dev/shm has 8 MiB free, less than the data loaders need to pass batches of 8 images "
        "at 224 px from 2 worker process(es) (18 MiB for 2 rank(s)): images are read in the "
        "ranks themselves, slower; give the machine more shared memory (docker run "
        "--shm-size=2g) to read them in worker processes")


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


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_a_private_shm(),
                    reason="needs root and unshare to give one process a small /dev/shm")
def test_a_study_on_a_machine_with_a_1_mib_dev_shm_trains(tmp_path):
    # before, both ranks died (SIGSEGV) initializing DeepSpeed's op, and then the loaders'
    # workers could not hand over a batch: every trial failed "crashed"
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for part, count in (("train", 24), ("val", 8)):
        for label in ("dark", "light"):
            folder = tmp_path / "data" / part / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 120, (64, 64, 3), dtype=np.uint8)
                Image.fromarray(pixels + (120 if label == "light" else 0)).save(
                    folder / f"{i}.png")
    (tmp_path / "s.yaml").write_text(
        "trainer:\n  model: resnet18\n  data: {kind: imagefolder, path: data, image_size: 64, "
        "loader_workers: 2}\ntarget: {metric: top1, value: 0.9}\nbudget: {n_trials: 1, "
        "max_trial_s: 20}\n")
    root = Path(__file__).resolve().parents[1]
    command = (f"mount -t tmpfs -o size=1M tmpfs /dev/shm && exec {sys.executable} -m autotune "
               "start study s.yaml")
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(["unshare", "-m", "sh", "-c", command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    trial = optuna.load_study(study_name="s",
                              storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials[0]
    assert trial.user_attrs["outcome"] in ("reached", "censored"), trial.user_attrs
    log = (tmp_path / "autotune-runs" / "s" / "trial-0" / "trainer.log").read_text()
    assert "autotune: /dev/shm has 1 MiB free, less than DeepSpeed's shared-memory op" in log
    assert log.count("autotune: /dev/shm has 1 MiB free, less than the data loaders need") == 1
