"""Augmentation by name (trainers/augment.py), the evaluation cadence rule, and how a plan
picks its augmentation: pure pieces, no launch."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

from autotune.errors import PlanError
from autotune.plan import Hardware, resolve, value_problems
from trainers.augment import (
    AUGMENTATIONS,
    augment_batch,
    eval_transform,
    image_transform,
)
from trainers.schedule import EVAL_SHARE, EVALS_PER_CAP, eval_interval


def _batch(n: int = 16, size: int = 8) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(n, 3, size, size)


def test_none_leaves_the_batch_alone():
    x = _batch()
    assert augment_batch(x, "none") is x


def test_flip_mirrors_about_half_the_images_and_nothing_else():
    x = _batch(64)
    torch.manual_seed(1)
    y = augment_batch(x, "flip")
    mirrored = [bool(torch.equal(y[i], x[i].flip(-1))) for i in range(64)]
    kept = [bool(torch.equal(y[i], x[i])) for i in range(64)]
    assert all(m or k for m, k in zip(mirrored, kept, strict=True))
    assert 16 < sum(mirrored) < 48


def test_crop_moves_each_image_by_at_most_an_eighth_of_its_side():
    x = _batch(32, size=16)
    torch.manual_seed(2)
    y = augment_batch(x, "crop")
    assert y.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), mode="reflect")
    shifted = 0
    for i in range(32):   # each output is one 16x16 window of the reflected padding
        found = [(dy, dx) for dy in range(5) for dx in range(5)
                 if torch.equal(y[i], padded[i, :, dy:dy + 16, dx:dx + 16])]
        assert found, f"image {i} is not a shifted window of its input"
        shifted += found[0] != (2, 2)
    assert shifted > 16


@pytest.mark.parametrize("augment", ["crop_flip", "imagenet"])
def test_every_choice_keeps_the_batch_shape(augment):
    x = _batch(8, size=12)
    y = augment_batch(x, augment)
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert not torch.equal(x, y)


def test_an_unknown_augmentation_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="allowed: none, flip, crop, crop_flip, imagenet"):
        augment_batch(_batch(), "mixup")


@pytest.mark.parametrize("augment", AUGMENTATIONS)
def test_image_transforms_give_the_planned_sizes(augment):
    image = Image.new("RGB", (50, 40), (10, 200, 30))
    assert image_transform(augment, 24)(image).shape == (3, 24, 24)
    assert eval_transform(augment, 28)(image).shape == (3, 28, 28)


def test_only_imagenet_evaluates_a_center_crop_of_a_larger_resize():
    image = Image.new("RGB", (32, 32), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 2, 32))   # a white stripe along the left edge
    assert eval_transform("none", 32)(image)[0, :, 0].mean() > 1.0     # the stripe stays
    assert eval_transform("imagenet", 32)(image)[0, :, 0].mean() < 0.0  # cropped away


def test_the_cadence_fits_the_cap_unless_evaluating_would_cost_more_than_its_share():
    assert eval_interval(80.0, 0.5) == pytest.approx(80.0 / EVALS_PER_CAP)
    assert eval_interval(80.0, 5.0) == pytest.approx(5.0 / EVAL_SHARE)
    assert eval_interval(0.0, 1.0) == math.inf      # no cap: once an epoch


def _plan(trainer_data: dict, **params) -> dict:
    sampled = {"global_batch": 32, "lr_per_256": 0.1, "epochs": 1, **params}
    return resolve(sampled, trainer={"model": "resnet18", "data": trainer_data},
                   train_size=1437, hardware=Hardware(world_size=2),
                   target={"metric": "top1", "value": 0.9}, max_seconds=10)


def test_the_space_wins_over_the_data_which_wins_over_the_source_default():
    assert _plan({"kind": "digits"})["augment"] == "none"
    assert _plan({"kind": "imagefolder", "path": "x"})["augment"] == "imagenet"
    assert _plan({"kind": "imagefolder", "path": "x", "augment": "flip"})["augment"] == "flip"
    assert _plan({"kind": "digits", "augment": "flip"}, augment="crop")["augment"] == "crop"


def test_a_plan_and_a_space_refuse_an_unknown_augmentation():
    with pytest.raises(PlanError, match="unknown augment 'cutout'"):
        _plan({"kind": "digits"}, augment="cutout")
    assert value_problems("augment", ["none", "cutout"]) == [
        "augment: 'cutout' is not allowed; use one of none, flip, crop, crop_flip, imagenet"]
