"""ResNet-50 on ImageNet to 93% top-5 validation accuracy (DAWNBench), on any number of GPUs.

Warm starts: the published large-batch recipes (Goyal 8k, FFCV 4k with its 160 -> 192 px
ramp, MLPerf H200 3.2k, AIACC's DAWNBench 32k with LARS and 2k with SGD, fast.ai's DAWNBench
8k and the MoXing seed's 28k with their 128 -> 224 -> 288 px steps), moved to the nearest batch
this world size allows.
Planned epochs 16-90: DAWNBench entries reached 93% top-5 in 20-43 epochs.
"""

from autotune import SearchSpace
from search_spaces._imagenet import imagenet_space


def space(world_size: int) -> SearchSpace:
    return imagenet_space(world_size, name="resnet50_imagenet_dawnbench", epochs=(16, 90))
