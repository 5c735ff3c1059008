"""The ranks' gradients in one flat buffer, all-reduced in place in buckets as backward goes.

DeepSpeed's stage-0 all-reduce (``engine.allreduce_gradients``) runs after backward and copies
every gradient into a flat bucket, all-reduces it and copies the result back: two extra passes
over the model's gradients each step, and none of the reduction hidden behind backward.
``FlatGrads`` does what PyTorch's DDP does (``gradient_as_bucket_view``): the parameters'
gradients are views of one buffer a dtype, laid out in the reverse of the parameters' order
(about the order backward produces them) and cut into buckets of ``bucket_mb``. A step starts
with no gradients; a parameter's first gradient of the step is copied into its view (one pass,
where zeroing the buffer and adding into it took three), and later micro-batches accumulate in
place. On an armed backward (a step's last micro-batch) each bucket's all-reduce starts, in
place and asynchronously, as soon as its last gradient is in, in bucket order on every rank.
The caller scales its loss by ``scale`` (one over the ranks), so that the reduced sum is the
ranks' mean with no pass over the buffer to divide it: DeepSpeed's result.

On a step that measures the gradient noise scale, each bucket's squared norm (this rank's own
gradient) is taken just before its all-reduce starts (``trainers.noise``).

It applies where the engine's optimizer is the plain one (fp32, ZeRO stage 0: the engine sets
every gradient to None after its step and leaves them to the parameters); with DeepSpeed's
bf16 or fp16 optimizers, or ZeRO, the engine reduces its own way (``usable``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["FlatGrads"]

BUCKET_MB = 25.0   # DDP's default bucket size


@dataclass
class _Bucket:
    tensor: torch.Tensor                    # a slice of a flat buffer
    size: int                               # parameters whose gradients it holds
    pending: int = 0
    work: Any = None
    norms: list[torch.Tensor] = field(default_factory=list)


class FlatGrads:
    """The gradients of ``params`` as views of one buffer a dtype (each view with its
    parameter's strides, so channels-last weights keep their layout), reduced in buckets."""

    def __init__(self, params: list[torch.nn.Parameter], world: int,
                 bucket_mb: float = BUCKET_MB) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.world = int(world)
        self.buffers: list[torch.Tensor] = []
        self.buckets: list[_Bucket] = []
        self._bucket_of: dict[int, int] = {}
        self.armed = self.measuring = False
        self._next = 0           # the next bucket to start, in order
        self._fresh: set[int] = set()   # parameters with no gradient yet this step
        self.scale = 1.0 / self.world   # the loss's factor: the reduced sum is the mean
        self.norm_s = 0.0        # seconds the armed backward spent on squared norms
        views: dict[int, torch.Tensor] = {}
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in reversed(self.params):
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        for (dtype, device), group in by_kind.items():
            buffer = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=device)
            limit = max(1, int(bucket_mb * 2**20 / buffer.element_size()))
            offset = start = 0
            members: list[torch.nn.Parameter] = []
            for p in group:
                views[id(p)] = buffer.as_strided(p.size(), p.stride(), offset)
                members.append(p)
                offset += p.numel()
                if offset - start >= limit or p is group[-1]:
                    for q in members:
                        self._bucket_of[id(q)] = len(self.buckets)
                    self.buckets.append(_Bucket(buffer[start:offset], len(members)))
                    start, members = offset, []
            self.buffers.append(buffer)
        self.views = [views[id(p)] for p in self.params]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._ready)

    @staticmethod
    def usable(engine: Any) -> bool:
        """Whether ``engine`` leaves its gradients in the parameters, unwrapped (fp32, no
        ZeRO), so that they can live in a flat buffer."""
        return not (engine.bfloat16_enabled() or engine.fp16_enabled()
                    or engine.zero_optimization_stage() > 0)

    def attach(self) -> None:
        """Before a step's first backward: no gradients yet; each one backward produces is
        copied into its view (a parameter the step does not use gets zero at ``finish``)."""
        for p in self.params:
            p.grad = None
        self._fresh = {id(p) for p in self.params}

    def grads(self) -> list[torch.Tensor]:
        return self.views

    def arm(self, measure: bool = False) -> None:
        """Before the backward of a step's last micro-batch: each bucket is all-reduced as
        soon as its gradients are in (``measure``: its squared norm taken first)."""
        self.armed, self.measuring, self.norm_s, self._next = True, measure, 0.0, 0
        for bucket in self.buckets:
            bucket.pending, bucket.work, bucket.norms = bucket.size, None, []

    def _ready(self, p: torch.Tensor) -> None:
        if id(p) in self._fresh:     # the step's first gradient: into the buffer
            self._fresh.discard(id(p))
            view = self.views[self._index[id(p)]]
            if p.grad is not None and p.grad is not view:
                view.copy_(p.grad)
                p.grad = view
        if not self.armed:
            return
        self.buckets[self._bucket_of[id(p)]].pending -= 1
        # in bucket order, as DDP does: every rank must issue its collectives in one order,
        # whatever order its backward finished the buckets in
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._start(self.buckets[self._next])
            self._next += 1

    def _start(self, bucket: _Bucket) -> None:
        if self.measuring:
            t = time.perf_counter()
            bucket.norms.append(torch.linalg.vector_norm(bucket.tensor, dtype=torch.float32)
                                .double().square())
            self.norm_s += time.perf_counter() - t
        bucket.work = dist.all_reduce(bucket.tensor, async_op=True)

    def all_reduce(self) -> None:
        """The ranks' mean gradient, in place, after a backward that was not armed."""
        self.arm()
        self.finish()

    def finish(self) -> float | None:
        """After the armed backward: every bucket reduced (one holding a parameter the step did
        not use, with zero for it, now), the ranks' mean when the loss was scaled by
        ``scale``. Returns this rank's own squared gradient norm when measuring, unscaled
        (None otherwise)."""
        for p, view in zip(self.params, self.views, strict=True):
            if id(p) in self._fresh:
                view.zero_()
                p.grad = view
        self._fresh = set()
        for bucket in self.buckets[self._next:]:
            self._start(bucket)
        self._next = len(self.buckets)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.work = None
        self.armed = False
        if not self.measuring:
            return None
        return float(sum(n for b in self.buckets for n in b.norms)) / self.scale**2
