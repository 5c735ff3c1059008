"""ResNet-18 on scikit-learn's digits (32x32), to 97% validation top-1, on CPUs.

The LR is searched per 256 images and scaled linearly with the global batch, so the sampler can
move the batch without silently changing the effective LR. The warm start is a configuration
measured to reach the target in about 9 s on 2 CPU cores (batch 128, LR 0.02, no warmup), so the
time-to-accuracy bound prunes from the first trials on.
"""

import math

from autotune import Categorical, Constraint, Float, Int, PowerOfTwo, SearchSpace

TRAIN_IMAGES = 1437   # the digits' training split


def _batch(world_size: int) -> PowerOfTwo | Categorical:
    if world_size > TRAIN_IMAGES:
        raise ValueError(f"the digits' {TRAIN_IMAGES} training images cannot give each of "
                         f"{world_size} ranks an image a step; run the quickstart on at most "
                         f"{TRAIN_IMAGES} ranks")
    if world_size & (world_size - 1) == 0 and world_size < 512:  # search log2 of the batch
        return PowerOfTwo("global_batch", max(16, world_size), 512)
    multiples = [world_size * k for k in (1, 2, 4, 8, 16, 32) if world_size * k <= TRAIN_IMAGES]
    return Categorical("global_batch", multiples)


def _nearest(param: PowerOfTwo | Categorical, batch: int) -> int:
    return min(param.values(), key=lambda b: abs(math.log2(b) - math.log2(batch)))


def space(world_size: int) -> SearchSpace:
    batch = _batch(world_size)
    return SearchSpace(
        batch,
        Float("lr_per_256", 0.01, 2.0, log=True),
        Float("warmup_epochs", 0.0, 2.0),
        Categorical("decay", ["cosine", "linear", "step"]),
        Float("label_smoothing", 0.0, 0.2),
        Int("epochs", 3, 12),
        Constraint("warmup_epochs <= 0.5 * epochs"),
        warm_starts=[{"global_batch": _nearest(batch, 128), "lr_per_256": 0.04,
                      "warmup_epochs": 0.0, "decay": "cosine", "label_smoothing": 0.0,
                      "epochs": 8}],
        name="quickstart", world_size=world_size,
    )
