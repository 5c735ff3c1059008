"""Shared builder of the ResNet-50/ImageNet spaces, with the published configurations as warm
starts (each entry of ``PUBLISHED`` names its source: the paper, benchmark or submission),
each with its image-size schedule: progressive resizing is searched (start and end size,
linear or stepped, where the ramp starts and ends, the evaluation size).

Global batches are multiples of the world size (32 to 1,024 images per rank, 256 to 65,536 in
all), so every proposal splits evenly over the ranks. LRs are per 256 images with linear
scaling; LARS is searched above the batches where momentum SGD stops scaling.
"""

from __future__ import annotations

import math
from typing import Any

from autotune import Categorical, Constraint, Float, Int, SearchSpace

# The image-size schedule of a recipe that trained at 224 px throughout.
AT_224: dict[str, Any] = {"res_start": 224, "res_end": 224, "res_mode": "linear",
                          "res_ramp_start": 0.0, "res_ramp_end": 1.0, "eval_res": 224}
# fast.ai's DAWNBench steps (and the DAWNBench seed's, which took them): 128 px for the first
# 14 of 38 epochs, 224 px to epoch 32, 288 px for the last ones.
STEPS_128_224_288: dict[str, Any] = {"res_start": 128, "res_mid": 224, "res_end": 288,
                                     "res_mode": "step", "res_ramp_start": 14 / 38,
                                     "res_ramp_end": 32 / 38, "eval_res": 288}

# Published configurations. lr_per_256 = published peak LR x 256 / published global batch.
PUBLISHED: list[dict[str, Any]] = [
    {   # Goyal et al. 2017, "ImageNet in 1 Hour": 76.3% top-1
        "source": "goyal_8k", "global_batch": 8192, "optimizer": "sgd", "nesterov": False,
        "momentum": 0.9, "lr_per_256": 0.1, "warmup_epochs": 5.0, "epochs": 90,
        "decay": "step", "label_smoothing": 0.0, "weight_decay": 1e-4, "final_lr_factor": 0.0,
        **AT_224},
    {   # FFCV ResNet-50, 40 epochs: 93.2% top-5 in 35.6 min on 8 A100s
        "source": "ffcv_4k", "global_batch": 4096, "optimizer": "sgd", "nesterov": False,
        "momentum": 0.9, "lr_per_256": 1.7 * 256 / 4096, "warmup_epochs": 2.0, "epochs": 40,
        "decay": "linear", "label_smoothing": 0.1, "weight_decay": 1e-4,
        "final_lr_factor": 0.0,
        # 160 px, ramped linearly to 192 px over epochs 29-34 of 40; evaluated at 256 px
        "res_start": 160, "res_end": 192, "res_mode": "linear", "res_ramp_start": 29 / 40,
        "res_ramp_end": 34 / 40, "eval_res": 256},
    {   # MLPerf v4.0, 8 H200: 75.9% top-1 in 12.03 min (batch 3,200; poly power 2)
        "source": "mlperf_h200_3k", "global_batch": 3200, "optimizer": "lars",
        "lars_trust_coefficient": 0.001, "momentum": 0.9, "lr_per_256": 11.0 * 256 / 3200,
        "warmup_epochs": 2.0, "epochs": 35, "decay": "poly", "decay_power": 2.0,
        "label_smoothing": 0.1, "weight_decay": 5e-5, "final_lr_factor": 0.0, **AT_224},
    {   # Alibaba AIACC, DAWNBench #1: 93% top-5 in 2:38 on 128 V100s (LARS, batch 32k)
        "source": "dawnbench_lars_32k", "global_batch": 32768, "optimizer": "lars",
        "lars_trust_coefficient": 0.001, "momentum": 0.9, "lr_per_256": 25.0 * 256 / 32768,
        "warmup_epochs": 14.0, "epochs": 27, "decay": "linear", "label_smoothing": 0.1,
        "weight_decay": 1e-4, "final_lr_factor": 0.2 / 25.0, **AT_224},
    {   # Alibaba AIACC, cheapest DAWNBench: 93% top-5 in 21:38 on 8 V100s
        "source": "dawnbench_sgd_2k", "global_batch": 2048, "optimizer": "sgd",
        "nesterov": False, "momentum": 0.93, "lr_per_256": 1.2 * 256 / 2048,
        "warmup_epochs": 5.0, "epochs": 20, "decay": "linear", "label_smoothing": 0.0,
        "weight_decay": 1e-4, "final_lr_factor": 1e-4 / 1.2, **AT_224},
    {   # fast.ai, DAWNBench Sep 2018: 93% top-5 in 18:05 on 128 V100s (batch 8k at its
        # start; warmup 1.88 -> 3.76 over 6 epochs, then steps), progressive resizing
        "source": "fastai_dawnbench_8k", "global_batch": 8192, "optimizer": "sgd",
        "nesterov": False, "momentum": 0.9, "lr_per_256": 3.76 * 256 / 8192,
        "warmup_epochs": 6.0, "epochs": 38, "decay": "step", "label_smoothing": 0.0,
        "weight_decay": 1e-4, "final_lr_factor": 0.0, **STEPS_128_224_288},
    {   # Huawei MoXing, the DAWNBench seed: 93.01% top-5 in 10:28 on 128 V100s (batch 28,672,
        # peak LR 8.5, linear-cosine decay to 0.05, warmup a tenth of 43 epochs), with
        # fast.ai's resizing steps
        "source": "moxing_seed_28k", "global_batch": 28672, "optimizer": "sgd",
        "nesterov": True, "momentum": 0.9, "lr_per_256": 8.5 * 256 / 28672,
        "warmup_epochs": 4.3, "epochs": 43, "decay": "cosine", "label_smoothing": 0.0,
        "weight_decay": 1e-4, "final_lr_factor": 0.05 / 8.5, **STEPS_128_224_288},
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
        # Progressive resizing (trainers.schedule.image_sizes): small images first.
        Categorical("res_start", [128, 160, 192, 224]),
        Categorical("res_end", [192, 224, 256, 288]),
        Categorical("res_mode", ["linear", "step"]),
        Categorical("res_mid", [0, 160, 192, 224, 256], condition="res_mode == 'step'"),
        Float("res_ramp_start", 0.0, 1.0),
        Float("res_ramp_end", 0.0, 1.0),
        Categorical("eval_res", [224, 256, 288]),
        Constraint("res_start <= res_end and res_ramp_start <= res_ramp_end"),
        Constraint("res_mode != 'step' or res_mid == 0 or res_start <= res_mid <= res_end"),
        # Warmup grows with the batch but never takes most of the schedule.
        Constraint("warmup_epochs <= 0.6 * epochs"),
        # Momentum SGD scales to about 8-16k; above that only LARS is worth a trial.
        Constraint("optimizer == 'lars' or global_batch <= 16384"),
        warm_starts=warm, name=name, world_size=world_size,
    )
