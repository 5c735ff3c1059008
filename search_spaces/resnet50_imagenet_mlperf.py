"""ResNet-50 on ImageNet to 75.9% top-1 validation accuracy (MLPerf), on any number of GPUs.

Same parameters and warm starts as the DAWNBench space; planned epochs 30-90, since MLPerf's
LARS results needed about 35 epochs up to 4k images per batch and 41-56 at 8-32k.
"""

from autotune import SearchSpace
from search_spaces._imagenet import imagenet_space


def space(world_size: int) -> SearchSpace:
    return imagenet_space(world_size, name="resnet50_imagenet_mlperf", epochs=(30, 90))
