"""Any image-classification data on any number of ranks: the default space of an ImageFolder
study, sized from the study's data and ranks.

- ``global_batch``: powers of two (multiples of the ranks where those are not a power of two)
  from 16, or the ranks (or, for fewer than 16 training images, the largest power of two
  within them), up to the largest batch that still leaves an epoch MIN_STEPS
  optimizer steps (so a small data set is not searched at batches that make an epoch one
  step), and at most 1,024;
- ``lr_per_256`` (scaled linearly with the batch), warmup, decay, label smoothing;
- ``epochs``: 1 to 32 planned epochs, log-scaled: short schedules are as likely as long ones,
  and the time-to-accuracy pruner stops the long ones that cannot win;
- ``augment``: none, flip, crop, crop_flip or ImageNet's crop (see ``trainers/augment.py``):
  mirroring changes digits and text, ImageNet's crop loses small images' content, and no
  augmentation is often fastest in short schedules; the study finds which.

Warm starts: one short SGD recipe (LR 0.1 per 256 images, the rule of Goyal et al.; cosine, no
warmup, 4 epochs) at the batch that gives an epoch about 64 steps (within the range), without
augmentation and with crop-and-flip; on a data set so small that the smallest batch leaves
an epoch fewer steps, as many epochs as make about 4 x 64 steps (up to 32).
``autotune space show images`` (no data at hand) sizes it for 10,000 images.
"""

from __future__ import annotations

import math

from autotune import (
    Categorical,
    Constraint,
    DataInfo,
    Fixed,
    Float,
    Int,
    PowerOfTwo,
    SearchSpace,
)

MIN_STEPS = 32          # optimizer steps an epoch keeps at the largest batch searched
WARM_STEPS = 64         # optimizer steps of an epoch at the warm starts' batch
STAND_IN = DataInfo(train_images=10_000, num_classes=10, image_size=32)


Batch = PowerOfTwo | Categorical | Fixed


def _batch(world_size: int, train_images: int) -> Batch:
    top = max(min(1024, train_images // MIN_STEPS), 1)
    if world_size & (world_size - 1) == 0:   # a power of two: search log2 of the batch
        low = max(16, world_size)
        if low > train_images:               # fewer images than that: as many as fit
            low = max(world_size, 2 ** int(math.log2(max(train_images, 1))))
        high = 2 ** int(math.log2(top))
        if high <= low:                      # a data set this small: one batch
            return Fixed("global_batch", low)
        return PowerOfTwo("global_batch", low, high)
    multiples = [world_size * 2 ** k for k in range(12) if world_size * 2 ** k <= max(
        top, world_size)]
    return Categorical("global_batch", multiples)


def _nearest(param: Batch, batch: float) -> int:
    return min(param.values(), key=lambda b: abs(math.log2(b) - math.log2(max(batch, 1))))


def space(world_size: int, data: DataInfo | None = None) -> SearchSpace:
    data = data or STAND_IN
    batch = _batch(world_size, data.train_images)
    warm_batch = _nearest(batch, data.train_images / WARM_STEPS)
    # 4 epochs, or more where the smallest batch leaves an epoch fewer than WARM_STEPS steps:
    # a small data set's warm start still takes about 4 x WARM_STEPS optimizer steps
    per_epoch = max(data.train_images // warm_batch, 1)
    epochs = min(max(4, round(4 * WARM_STEPS / per_epoch)), 32)
    warm = {"global_batch": warm_batch, "lr_per_256": 0.1, "warmup_epochs": 0.0,
            "decay": "cosine", "label_smoothing": 0.0, "epochs": epochs}
    return SearchSpace(
        batch,
        Float("lr_per_256", 0.01, 2.0, log=True),
        Float("warmup_epochs", 0.0, 2.0),
        Categorical("decay", ["cosine", "linear", "step"]),
        Float("label_smoothing", 0.0, 0.2),
        Int("epochs", 1, 32, log=True),
        Categorical("augment", ["none", "flip", "crop", "crop_flip", "imagenet"]),
        Constraint("warmup_epochs <= 0.5 * epochs"),
        warm_starts=[{**warm, "augment": "none"}, {**warm, "augment": "crop_flip"}],
        name="images", world_size=world_size,
    )
