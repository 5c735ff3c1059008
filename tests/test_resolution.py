"""Progressive resizing: the image size of each epoch, the plan's checks, and the sources that
switch size between epochs (the ImageFolder loader in the same processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.errors import PlanError
from autotune.plan import Hardware, resolve
from trainers.schedule import image_sizes
from trainers.sources import open_source

from .test_sources import _worker_pids, make_tree


def test_a_linear_ramp_holds_then_rises_in_whole_steps_then_holds():
    # FFCV's form: 160 px, ramped to 192 px over epochs 29-34 of 40
    sizes = image_sizes(40, 160, 192, ramp_start=29 / 40, ramp_end=34 / 40)
    assert sizes[:29] == [160] * 29 and sizes[34:] == [192] * 6
    assert sizes[29:34] == [160, 160, 168, 176, 184]     # rounded down to 8 px steps
    assert all(s % 8 == 0 for s in sizes) and sizes == sorted(sizes)
    assert image_sizes(10, 16, 32, ramp_end=0.5) == [16, 16, 16, 24, 24, 32, 32, 32, 32, 32]


def test_steps_go_start_middle_end_at_the_ramps_shares():
    # fast.ai's form: 128 px for 14 of 38 epochs, 224 px to epoch 32, then 288 px
    sizes = image_sizes(38, 128, 288, mid=224, ramp_start=14 / 38, ramp_end=32 / 38,
                        mode="step")
    assert sizes == [128] * 14 + [224] * 18 + [288] * 6
    assert image_sizes(4, 16, 32, ramp_start=0.5, ramp_end=0.5, mode="step") == [16, 16, 32, 32]
    with pytest.raises(ValueError, match="unknown resolution mode 'cubic'"):
        image_sizes(4, 16, 32, mode="cubic")


def _plan(**params):
    return resolve({"global_batch": 64, "lr_per_256": 0.1, "epochs": 4, **params},
                   trainer={"model": "resnet18", "data": {"kind": "digits"}}, train_size=1437,
                   hardware=Hardware(world_size=2), target={"metric": "top1", "value": 0.9},
                   max_seconds=10)


def test_the_plan_holds_each_epochs_size_and_the_evaluation_size():
    plan = _plan(res_start=16, res_end=32, res_ramp_start=0.25, res_ramp_end=0.75,
                 eval_res=32)
    assert plan["image_sizes"] == [16, 16, 24, 32] and plan["eval_size"] == 32
    assert _plan()["image_sizes"] == [] and _plan()["eval_size"] == 0      # the data's own
    assert _plan(res_start=24)["image_sizes"] == [24] * 4                 # one size, held


@pytest.mark.parametrize(("params", "message"), [
    ({"res_start": 32, "res_end": 16}, "res_start 32 is above res_end 16"),
    ({"res_start": 4}, "res_start 4 is not a size in pixels"),
    ({"res_start": 16.5}, "res_start 16.5 is not a size in pixels"),
    ({"eval_res": 4096}, "eval_res 4096 is not a size in pixels"),
    ({"res_end": 32}, "res_end and res_mid need res_start"),
    ({"res_start": 16, "res_end": 32, "res_mid": 24}, "res_mid 24 needs res_mode 'step'"),
    ({"res_start": 16, "res_end": 32, "res_mid": 48, "res_mode": "step"},
     "res_mid 48 needs res_mode 'step' and a size from res_start 16 to res_end 32"),
    ({"res_start": 16, "res_ramp_start": 0.8, "res_ramp_end": 0.2},
     "0 <= res_ramp_start <= res_ramp_end <= 1"),
    ({"res_start": 16, "res_mode": "cubic"}, "unknown res_mode 'cubic'; allowed: linear, step"),
])
def test_a_schedule_that_cannot_run_is_refused_in_one_line(params, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        _plan(**params)
    assert "\n" not in str(e.value)


def test_a_model_of_one_input_size_takes_no_schedule():
    with pytest.raises(PlanError, match="model vit_b_16 takes images of one size only"):
        resolve({"global_batch": 64, "lr_per_256": 0.1, "epochs": 4, "res_start": 128},
                trainer={"model": "vit_b_16", "data": {"kind": "digits"}}, train_size=1437,
                hardware=Hardware(world_size=2), target={"metric": "top1", "value": 0.9},
                max_seconds=10)


@pytest.mark.parametrize("kind", ["digits", "synthetic"])
def test_in_memory_sources_train_and_evaluate_at_the_size_asked(kind):
    source = open_source({"kind": kind, "image_size": 32, "train_images": 64,
                          "val_images": 8}, on_gpu=False)
    for size in (16, 24, 32):
        x, _ = next(source.train_batches(0, 0, 0, 1, 32, 8, size=size))
        assert x.shape[-2:] == (size, size)
    x, _ = next(source.eval_batches(0, 1, 8, size=48))
    assert x.shape[-2:] == (48, 48)


def test_an_imagefolder_switches_size_between_epochs_in_the_same_loader_processes(tmp_path):
    root = make_tree(tmp_path / "tree", train=10, val=4)
    source = open_source({"kind": "imagefolder", "path": str(root), "image_size": 32,
                          "loader_workers": 1}, on_gpu=False)
    try:
        shapes, pids = [], []
        for epoch, size in enumerate((16, 24, 32)):
            x, _ = next(source.train_batches(epoch, 0, 0, 1, 30, 6, augment="crop_flip",
                                             size=size))
            shapes.append(tuple(x.shape[-2:]))
            pids.append(_worker_pids(source, "train"))
        assert shapes == [(16, 16), (24, 24), (32, 32)]
        assert pids[0] == pids[1] == pids[2]                       # no new loader processes
        x, _ = next(source.eval_batches(0, 1, 5, "crop_flip", size=40))
        assert x.shape[-2:] == (40, 40)
    finally:
        source.close()


def test_space_show_lists_the_resolution_parameters_and_the_warm_starts_schedules():
    out = subprocess.run([sys.executable, "-m", "autotune", "space", "show",
                          "resnet50_imagenet_dawnbench", "--world-size", "8"],
                         capture_output=True, text=True, check=True).stdout
    for name in ("res_start", "res_end", "res_mid", "res_mode", "res_ramp_start",
                 "res_ramp_end", "eval_res"):
        assert f"\n  {name} " in out
    assert "res_start=160, res_end=192, res_mode=linear" in out              # FFCV
    assert "res_start=128, res_mid=224, res_end=288, res_mode=step" in out   # fast.ai, seed


def test_the_digits_space_checks_a_schedule_it_searches(tmp_path):
    space = tmp_path / "resize.py"
    space.write_text(
        "from autotune import Categorical, Float, Int, SearchSpace\n"
        "def space(world_size):\n"
        "    return SearchSpace(Categorical('global_batch', [64, 128]),\n"
        "                       Float('lr_per_256', 0.05, 0.4, log=True), Int('epochs', 4, 8),\n"
        "                       Categorical('res_start', [16, 24, 32]),\n"
        "                       Categorical('res_mode', ['linear', 'cubic']),\n"
        "                       Float('res_ramp_end', 0.2, 0.8), name='resize')\n")
    out = subprocess.run([sys.executable, "-m", "autotune", "space", "check", str(space)],
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "res_mode: 'cubic' is not allowed; use one of linear, step" in out.stdout + out.stderr


def test_space_check_refuses_a_size_out_of_range_and_a_warm_start_that_shrinks():
    from autotune import Categorical, Float, Int, SearchSpace
    from autotune.space import check_space

    space = SearchSpace(Categorical("global_batch", [64, 128]),
                        Float("lr_per_256", 0.05, 0.4, log=True), Int("epochs", 4, 8),
                        Categorical("res_start", [4, 32]), Categorical("res_end", [16]),
                        warm_starts=[{"global_batch": 64, "lr_per_256": 0.1, "epochs": 4,
                                      "res_start": 32, "res_end": 16}], name="bad")
    problems = check_space(space)
    assert any(p.startswith("res_start: 4 is not a size in pixels") for p in problems)
    assert any(p.startswith("warm start 1: res_start 32 is above res_end 16") for p in problems)
