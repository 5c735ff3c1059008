"""ResNet-18 on scikit-learn's digits (32x32), to 97% validation top-1, on CPUs.

The LR is searched per 256 images and scaled linearly with the global batch, so the sampler can
move the batch without silently changing the effective LR. The warm start is a configuration
measured to reach the target in about 9 s on 2 CPU cores (batch 128, LR 0.02, no warmup), so the
time-to-accuracy bound prunes from the first trials on.
"""

from autotune import Categorical, Float, Int, PowerOfTwo, SearchSpace


def space(world_size: int) -> SearchSpace:
    return SearchSpace(
        PowerOfTwo("global_batch", max(16, world_size), 512),
        Float("lr_per_256", 0.01, 2.0, log=True),
        Float("warmup_epochs", 0.0, 2.0),
        Categorical("decay", ["cosine", "linear", "step"]),
        Float("label_smoothing", 0.0, 0.2),
        Int("epochs", 3, 12),
        warm_starts=[{"global_batch": 128, "lr_per_256": 0.04, "warmup_epochs": 0.0,
                      "decay": "cosine", "label_smoothing": 0.0, "epochs": 8}],
        name="quickstart",
    )
