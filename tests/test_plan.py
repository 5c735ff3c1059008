"""The training plan: batch decomposition, LR scaling, warmup and decay schedules."""

from __future__ import annotations

import math

import pytest

from autotune.errors import PlanError
from autotune.plan import Hardware, resolve, scale_lr, split_batch
from trainers.schedule import lr_at, lr_factor

TRAINER = {"model": "resnet18", "data": {"kind": "digits", "image_size": 32}}
TARGET = {"metric": "top1", "value": 0.97}


def plan_for(world: int = 2, cap: int = 64, train_size: int = 1437, **params):
    sampled = {"global_batch": 128, "lr_per_256": 0.1, "epochs": 4, **params}
    return resolve(sampled, trainer=TRAINER, train_size=train_size,
                   hardware=Hardware(world_size=world, max_micro_batch=cap), target=TARGET,
                   max_seconds=30)


@pytest.mark.parametrize(("batch", "world", "cap", "expected"), [
    (128, 2, 64, (64, 1)),
    (512, 2, 64, (64, 4)),
    (96, 2, 16, (16, 3)),       # 48 per rank: 2 x 24 exceeds 16, 3 x 16 fits
    (8192, 256, 32, (32, 1)),
    (8192, 64, 48, (32, 4)),    # 128 per rank: 3 does not divide it, 4 x 32 fits
    (7, 1, 64, (7, 1)),
    (14, 2, 3, (1, 7)),         # 7 per rank only splits as 7 x 1
])
def test_split_batch_multiplies_back_to_the_global_batch(batch, world, cap, expected):
    micro, accum = split_batch(batch, world, cap)
    assert (micro, accum) == expected
    assert micro * accum * world == batch
    assert micro <= cap


def test_split_batch_rejects_a_batch_the_ranks_cannot_share():
    with pytest.raises(PlanError, match="cannot be split evenly over 3 ranks"):
        split_batch(128, 3, 64)


@pytest.mark.parametrize(("rule", "expected"), [
    ("linear", 0.1 * 8192 / 256), ("sqrt", 0.1 * math.sqrt(32)), ("none", 0.1)])
def test_scaling_rules(rule, expected):
    assert scale_lr(0.1, 8192, rule) == pytest.approx(expected)


def test_unknown_scaling_rule_names_the_allowed_ones():
    with pytest.raises(PlanError, match="allowed: linear, sqrt, none"):
        scale_lr(0.1, 256, "cubic")


def test_plan_derives_steps_warmup_and_peak_lr():
    plan = plan_for(global_batch=256, lr_per_256=0.2, epochs=5, warmup_epochs=1.5)
    assert plan["steps_per_epoch"] == 1437 // 256 == 5
    assert plan["total_steps"] == 25
    assert plan["schedule"]["warmup_steps"] == round(1.5 * 5)
    assert plan["peak_lr"] == pytest.approx(0.2)
    assert plan["micro_batch"] * plan["grad_accum"] * plan["world_size"] == 256
    ds = plan["deepspeed"]
    assert ds["train_batch_size"] == 256
    assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2 == 256
    assert ds["zero_optimization"]["stage"] == 0


def test_gradient_clipping_is_the_plans_alone():
    # DeepSpeed clips at norm 1.0 when its config says nothing: the plan always says.
    assert plan_for(global_batch=128, lr_per_256=0.1, epochs=2)["deepspeed"][
        "gradient_clipping"] == 0.0
    assert plan_for(global_batch=128, lr_per_256=0.1, epochs=2, grad_clip_norm=2.5)[
        "deepspeed"]["gradient_clipping"] == 2.5
    with pytest.raises(PlanError, match=r"grad_clip_norm: -1 is outside .* >= 0 \(0: no clip"):
        plan_for(global_batch=128, lr_per_256=0.1, epochs=2, grad_clip_norm=-1)


@pytest.mark.parametrize(("params", "message"), [
    ({"epochs": 0}, "epochs: 0 is outside what the training plan takes; epochs must be >= 1"),
    ({"warmup_epochs": -0.5}, "warmup_epochs must be >= 0"),
    ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\)"),
    ({"lr_per_256": 0.0}, "lr_per_256 must be > 0"),
    ({"lr_per_256": float("nan")}, "lr_per_256: nan is outside"),
    ({"lr_per_256": "0.1"}, "lr_per_256: '0.1' is not a number; lr_per_256 must be > 0"),
])
def test_plan_refuses_values_outside_its_limits(params, message):
    # The plan checks against the same limits `space check` reads (plan.LIMITS).
    with pytest.raises(PlanError, match=message):
        plan_for(**{"global_batch": 128, "lr_per_256": 0.1, "epochs": 2, **params})


def test_plan_rejects_unknown_and_missing_parameters():
    with pytest.raises(PlanError, match="unknown plan parameter.*lr;"):
        plan_for(lr=0.1)
    with pytest.raises(PlanError, match="must set epochs"):
        resolve({"global_batch": 64, "lr_per_256": 0.1}, trainer=TRAINER, train_size=100,
                hardware=Hardware(), target=TARGET, max_seconds=1)


def test_plan_rejects_a_batch_larger_than_the_data():
    with pytest.raises(PlanError, match="exceeds the 1437 training images"):
        plan_for(global_batch=2048)


def test_more_ranks_than_images_is_said_as_such_for_any_space(tmp_path):
    # 32 ranks on a 20-image tree were refused as "warm start {...} of space 'images': global
    # batch 32 exceeds the 20 training images", a warm start the user never wrote
    from autotune import config
    from autotune._study_setup import _check_warm_starts
    from autotune.errors import ConfigError
    from autotune.space import load_space

    with pytest.raises(PlanError, match="the 20 training images cannot give each of 21 ranks "
                                        "an image a step; run on at most 20 ranks"):
        resolve({"global_batch": 21, "lr_per_256": 0.1, "epochs": 2}, trainer=TRAINER,
                train_size=20, hardware=Hardware(world_size=21), target=TARGET, max_seconds=1)
    cfg = config.load("quickstart", {"ranks_per_trial": 32, "oversubscribe": True})
    with pytest.raises(ConfigError) as raised:
        _check_warm_starts(load_space("quickstart", world_size=32), cfg, 20)
    assert str(raised.value) == ("ranks_per_trial 32: the 20 training images cannot give each "
                                 "of 32 ranks an image a step; run on at most 20 ranks "
                                 "(ranks_per_trial), or train on more images")
    # a script's own examples (text, tables) are called so
    with pytest.raises(PlanError, match="the 20 training examples cannot give each of 21 ranks "
                                        "an example a step"):
        resolve({"global_batch": 21, "lr_per_256": 0.1, "epochs": 2},
                trainer={**TRAINER, "data": {"kind": "examples", "train_examples": 20}},
                train_size=20, hardware=Hardware(world_size=21), target=TARGET, max_seconds=1)


SCHED = {"warmup_steps": 4, "total_steps": 20, "warmup_start_factor": 0.0, "decay": "cosine"}


def test_warmup_rises_linearly_to_the_peak_on_its_last_step():
    factors = [lr_factor(s, SCHED) for s in range(4)]
    assert factors == pytest.approx([0.25, 0.5, 0.75, 1.0])
    start = {**SCHED, "warmup_start_factor": 0.2}
    assert lr_factor(0, start) == pytest.approx(0.2 + 0.8 / 4)
    assert lr_factor(3, start) == pytest.approx(1.0)


@pytest.mark.parametrize(("decay", "midpoint"), [
    ("cosine", 0.5), ("linear", 0.5), ("poly", 0.25), ("constant", 1.0), ("step", 0.1)])
def test_decays_start_at_the_peak_and_pass_the_expected_midpoint(decay, midpoint):
    sched = {**SCHED, "decay": decay, "power": 2.0}
    assert lr_factor(4, sched) == pytest.approx(1.0)            # first step after warmup
    assert lr_factor(12, sched) == pytest.approx(midpoint)      # halfway through the decay
    values = [lr_factor(s, sched) for s in range(4, 20)]
    assert all(a >= b - 1e-12 for a, b in zip(values, values[1:], strict=False))


def test_step_decay_drops_tenfold_at_each_milestone():
    sched = {**SCHED, "warmup_steps": 0, "decay": "step", "milestones": [0.5, 0.75]}
    assert [lr_factor(s, sched) for s in (0, 9, 10, 14, 15, 19)] == pytest.approx(
        [1.0, 1.0, 0.1, 0.1, 0.01, 0.01])


def test_decay_ends_at_the_final_factor():
    sched = {**SCHED, "decay": "linear", "final_lr_factor": 0.1}
    assert lr_factor(20, sched) == pytest.approx(0.1)
    assert lr_at(20, 2.0, sched) == pytest.approx(0.2)
