"""The micro-batch memory probe: real training steps on this machine, measured."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from autotune._preflight import probe_micro_batch
from autotune.config import StudyConfig
from autotune.errors import AutotuneError
from autotune.launch import trainer_env, trainer_path
from autotune.space import load_space
from autotune.trial_runner import TrialRunner


def probe(*args):
    done = subprocess.run([sys.executable, str(trainer_path("probe")), "--model", "resnet18",
                           "--num-classes", "10", "--image-size", "96", "--device", "cpu",
                           "--precision", "fp32", *args], env=trainer_env("cpu", 1),
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_probe_picks_the_largest_micro_batch_whose_step_fits_the_budget():
    free = probe("--start", "32")
    assert free["micro_batch"] == 32                     # a small model fits in host memory
    peaks = dict(free["tried"])
    assert list(peaks) == [2, 4, 8, 16, 32]
    assert peaks[32] > peaks[2]                          # activations grow with the batch
    budget = (peaks[8] + peaks[32]) // 2                  # room for 8 images, not for 32
    tight = probe("--start", "32", "--budget-bytes", str(budget))
    assert 8 <= tight["micro_batch"] < 32
    assert tight["peak_bytes"] <= budget < tight["tried"][-1][1]


def test_a_worker_caps_its_micro_batch_at_what_the_probe_found(tmp_path):
    cfg = StudyConfig()
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer,
                                                               probe_micro_batch=True))
    runner = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437, run_dir=tmp_path)
    assert runner.hardware.max_micro_batch == 64             # resnet18 at 32 px fits


def test_a_model_that_does_not_fit_at_all_is_a_clear_error():
    cfg = StudyConfig()
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, data={"kind": "digits", "image_size": 64}, max_micro_batch=8))
    with pytest.raises(AutotuneError, match="not even 2 images of resnet18 at 64 px"):
        probe_micro_batch(cfg, ranks=10**6)       # a budget of a millionth of free memory
