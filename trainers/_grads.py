"""The ranks' gradients in one flat buffer, all-reduced in place after backward.

DeepSpeed's stage-0 all-reduce (``engine.allreduce_gradients``) copies every gradient into a
flat bucket, all-reduces it and copies the result back: two extra passes over the model's
gradients each step (``benchmarks/trainer_throughput.py --ranks 2`` measured them at about 4%
of a ResNet-50 step on 2 CPU ranks). ``FlatGrads`` lays the parameters' gradients out as views
of one buffer a dtype, as PyTorch's DDP does with ``gradient_as_bucket_view``, so backward
accumulates straight into it and the all-reduce runs on it in place. The result is what
DeepSpeed's gives: the sum over the ranks times one over their number.

It applies where the engine's optimizer is the plain one (fp32, ZeRO stage 0: the engine sets
every gradient to None after its step and leaves them to the parameters); with DeepSpeed's
bf16 or fp16 optimizers, or ZeRO, the engine reduces its own way (``usable``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["FlatGrads"]


class FlatGrads:
    """The gradients of ``params`` as views of one buffer a dtype (each view with its
    parameter's strides, so channels-last weights keep their layout)."""

    def __init__(self, params: list[torch.nn.Parameter], world: int) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.world = int(world)
        self.buffers: list[torch.Tensor] = []
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in self.params:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        views: dict[int, torch.Tensor] = {}
        for (dtype, device), group in by_kind.items():
            buffer = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=device)
            offset = 0
            for p in group:
                views[id(p)] = buffer.as_strided(p.size(), p.stride(), offset)
                offset += p.numel()
            self.buffers.append(buffer)
        self.views = [views[id(p)] for p in self.params]

    @staticmethod
    def usable(engine: Any) -> bool:
        """Whether ``engine`` leaves its gradients in the parameters, unwrapped (fp32, no
        ZeRO), so that they can live in a flat buffer."""
        return not (engine.bfloat16_enabled() or engine.fp16_enabled()
                    or engine.zero_optimization_stage() > 0)

    def attach(self) -> None:
        """Before a step's first backward: every gradient zero, in the buffer."""
        for buffer in self.buffers:
            buffer.zero_()
        for p, view in zip(self.params, self.views, strict=True):
            p.grad = view

    def grads(self) -> list[torch.Tensor]:
        return self.views

    def all_reduce(self) -> None:
        """The ranks' mean gradient, in place."""
        for buffer in self.buffers:
            dist.all_reduce(buffer)
            buffer.mul_(1.0 / self.world)
