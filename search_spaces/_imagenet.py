"""Shared builder of the ResNet-50/ImageNet spaces, with the published configurations as warm
starts (each entry of ``PUBLISHED`` names its source: the paper, benchmark or submission).

Global batches are multiples of the world size (32 to 1,024 images per rank, 256 to 65,536 in
all), so every proposal splits evenly over the ranks. LRs are per 256 images with linear
scaling; LARS is searched above the batches where momentum SGD stops scaling.
"""

from __future__ import annotations

import math
from typing import Any

from autotune import Categorical, Constraint, Float, Int, SearchSpace

# Published configurations. lr_per_256 = published peak LR x 256 / published global batch.
PUBLISHED: list[dict[str, Any]] = [
    {   # Goyal et al. 2017, "ImageNet in 1 Hour": 76.3% top-1
        "source": "goyal_8k", "global_batch": 8192, "optimizer": "sgd", "nesterov": False,
        "momentum": 0.9, "lr_per_256": 0.1, "warmup_epochs": 5.0, "epochs": 90,
        "decay": "step", "label_smoothing": 0.0, "weight_decay": 1e-4, "final_lr_factor": 0.0},
    {   # FFCV ResNet-50, 40 epochs: 93.2% top-5 in 35.6 min on 8 A100s
        "source": "ffcv_4k", "global_batch": 4096, "optimizer": "sgd", "nesterov": False,
        "momentum": 0.9, "lr_per_256": 1.7 * 256 / 4096, "warmup_epochs": 2.0, "epochs": 40,
        "decay": "linear", "label_smoothing": 0.1, "weight_decay": 1e-4,
        "final_lr_factor": 0.0},
    {   # MLPerf v4.0, 8 H200: 75.9% top-1 in 12.03 min (batch 3,200; poly power 2)
        "source": "mlperf_h200_3k", "global_batch": 3200, "optimizer": "lars",
        "lars_trust_coefficient": 0.001, "momentum": 0.9, "lr_per_256": 11.0 * 256 / 3200,
        "warmup_epochs": 2.0, "epochs": 35, "decay": "poly", "decay_power": 2.0,
        "label_smoothing": 0.1, "weight_decay": 5e-5, "final_lr_factor": 0.0},
    {   # Alibaba AIACC, DAWNBench #1: 93% top-5 in 2:38 on 128 V100s (LARS, batch 32k)
        "source": "dawnbench_lars_32k", "global_batch": 32768, "optimizer": "lars",
        "lars_trust_coefficient": 0.001, "momentum": 0.9, "lr_per_256": 25.0 * 256 / 32768,
        "warmup_epochs": 14.0, "epochs": 27, "decay": "linear", "label_smoothing": 0.1,
        "weight_decay": 1e-4, "final_lr_factor": 0.2 / 25.0},
    {   # Alibaba AIACC, cheapest DAWNBench: 93% top-5 in 21:38 on 8 V100s
        "source": "dawnbench_sgd_2k", "global_batch": 2048, "optimizer": "sgd",
        "nesterov": False, "momentum": 0.93, "lr_per_256": 1.2 * 256 / 2048,
        "warmup_epochs": 5.0, "epochs": 20, "decay": "linear", "label_smoothing": 0.0,
        "weight_decay": 1e-4, "final_lr_factor": 1e-4 / 1.2},
]


def batch_choices(world_size: int) -> list[int]:
    """Global batches for ``world_size`` ranks: 32-1,024 per rank, 256-65,536 in all."""
    choices = [world_size * b for b in (32, 64, 128, 256, 512, 1024)]
    kept = [b for b in choices if 256 <= b <= 65536]
    return kept or [choices[0]]


def adapt(point: dict[str, Any], world_size: int) -> dict[str, Any]:
    """A published configuration moved to the nearest global batch this world size allows.
    The LR per 256 images is kept, so the linear rule rescales the peak LR."""
    choices = batch_choices(world_size)
    batch = min(choices, key=lambda b: abs(math.log2(b) - math.log2(point["global_batch"])))
    adapted = {k: v for k, v in point.items() if k != "source"}
    adapted["global_batch"] = batch
    if batch > 16384 and adapted["optimizer"] == "sgd":
        adapted.update(optimizer="lars", lars_trust_coefficient=0.001)
        adapted.pop("nesterov", None)
    return adapted


def imagenet_space(world_size: int, *, name: str, epochs: tuple[int, int]) -> SearchSpace:
    warm: list[dict[str, Any]] = []
    for point in PUBLISHED:
        adapted = adapt(point, world_size)
        adapted["epochs"] = min(max(adapted["epochs"], epochs[0]), epochs[1])
        if adapted not in warm:
            warm.append(adapted)
    return SearchSpace(
        Categorical("global_batch", batch_choices(world_size)),
        Categorical("optimizer", ["sgd", "lars"]),
        Categorical("nesterov", [False, True], condition="optimizer == 'sgd'"),
        Float("lars_trust_coefficient", 1e-4, 1e-2, log=True, condition="optimizer == 'lars'"),
        Float("momentum", 0.85, 0.95),
        Float("lr_per_256", 0.02, 2.0, log=True),
        Int("epochs", *epochs),
        Float("warmup_epochs", 0.0, 16.0),
        Categorical("decay", ["cosine", "linear", "poly", "step"]),
        Float("decay_power", 1.0, 3.0, condition="decay == 'poly'"),
        Float("final_lr_factor", 0.0, 0.05),
        Float("label_smoothing", 0.0, 0.2),
        Float("weight_decay", 1e-5, 2e-4, log=True),
        # Warmup grows with the batch but never takes most of the schedule.
        Constraint("warmup_epochs <= 0.6 * epochs"),
        # Momentum SGD scales to about 8-16k; above that only LARS is worth a trial.
        Constraint("optimizer == 'lars' or global_batch <= 16384"),
        warm_starts=warm, name=name, world_size=world_size,
    )
