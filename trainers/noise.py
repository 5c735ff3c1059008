"""The gradient noise scale, measured online from what data-parallel training computes anyway.

McCandlish et al., "An Empirical Model of Large-Batch Training" (2018): the simple noise scale
``B_simple = tr(Sigma) / |G|^2`` (Sigma: the per-image gradient covariance; G: the true
gradient) is about the batch beyond which more images per step buy little: steps to a target
go as ``S_min (1 + B_noise / B)``. Its appendix A estimates both terms from two batch sizes:
each rank's gradient over its own ``b`` images before the all-reduce, and the all-reduced one
over all ``B = b x world`` images::

    |G|^2    ~ (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

each smoothed (their mean over the first 20 measurements, then an exponential moving average
over about 20) before the ratio is taken, since either can be negative for a single step.
``|G_b|^2`` is the ranks' mean. With one rank there is no second batch size, and no estimate.
In bf16 training (ZeRO stage 0: DeepSpeed's bf16 data-parallel optimizer, whose gradients stay
in the parameters and are all-reduced there) the norms are taken in fp32.

The measurement is one more pass over the gradients on each rank and a scalar all-reduce
(fp32 on several ranks: this rank's norm is taken bucket by bucket as the trainer's flat buffer
starts each bucket's all-reduce, ``trainers._grads``, then ``record``; otherwise around
DeepSpeed's held-back all-reduce, ``measure``); it is taken every ``every`` steps, chosen
from its measured cost so that it stays within ``budget`` (2%) of the training time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["NoiseScale"]


class NoiseScale:
    """Online estimate of ``B_simple`` for per-rank batch ``b`` over ``world`` ranks."""

    def __init__(self, b: int, world: int, smoothing: float = 0.95, budget: float = 0.02
                 ) -> None:
        self.b, self.B, self.world = int(b), int(b) * int(world), int(world)
        self.smoothing, self.budget = smoothing, budget
        self.g2: float | None = None         # EMA of |G|^2
        self.trace: float | None = None      # EMA of tr(Sigma)
        self.measurements = 0
        self.every, self._next = 1, 0
        self.cost_s = 0.0                    # seconds all measurements took, in all

    @property
    def possible(self) -> bool:
        return self.B > self.b

    def add(self, small_sq: float, big_sq: float) -> None:
        """One step's squared gradient norms: ``small_sq`` over ``b`` images (the ranks'
        mean), ``big_sq`` over ``B`` images."""
        if not self.possible or not (math.isfinite(small_sq) and math.isfinite(big_sq)):
            return
        b, B = self.b, self.B
        g2 = (B * big_sq - b * small_sq) / (B - b)
        trace = (small_sq - big_sq) / (1.0 / b - 1.0 / B)
        self.measurements += 1
        # the mean of the measurements so far, until it is an average over the window the
        # smoothing factor gives (1 / (1 - smoothing) measurements); then an EMA
        weight = max(1.0 / self.measurements, 1.0 - self.smoothing)
        self.g2 = g2 if self.g2 is None else (1 - weight) * self.g2 + weight * g2
        self.trace = trace if self.trace is None else (1 - weight) * self.trace + weight * trace

    @property
    def value(self) -> float | None:
        """``B_simple`` in images, once both smoothed terms are positive (None before)."""
        if self.g2 is None or self.trace is None or self.g2 <= 0 or self.trace <= 0:
            return None
        return self.trace / self.g2

    def due(self, step: int) -> bool:
        """Whether optimizer step ``step`` is measured."""
        return self.possible and step >= self._next

    def pace(self, seconds: float, step_s: float) -> int:
        """After a measurement that took ``seconds`` in a step of ``step_s``: every how many
        steps to measure so that measuring stays within the budget (every rank must then
        agree on one pace: :meth:`schedule`)."""
        self.cost_s += seconds
        return max(1, math.ceil(seconds / (self.budget * step_s))) if step_s > 0 else 1

    def schedule(self, step: int, every: int) -> None:
        """The next measurement comes ``every`` steps after ``step``."""
        self.every = max(1, int(every))
        self._next = step + self.every


def squared_norm(grads: Iterable[torch.Tensor]) -> float:
    """The squared L2 norm of all of ``grads`` together, taken in fp32 whatever their type."""
    tensors = [g.detach() for g in grads]
    if not tensors:
        return 0.0
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    return float(torch.stack(norms).double().pow(2).sum())


def reduced_grads(engine: Any) -> list[torch.Tensor]:
    """The gradients ``engine.allreduce_gradients`` averages over the ranks: the parameters'
    own, in fp32 and in bf16 alike (ZeRO stage 0, as plans set it)."""
    return [p.grad for p in engine.module.parameters() if p.grad is not None]


def measure(noise: NoiseScale, grads: Callable[[], list[torch.Tensor]],
            all_reduce: Callable[[], None]) -> float:
    """Between a rank's backward (its all-reduce held back) and the step: this rank's squared
    gradient norm over ``grads()``, ``all_reduce()`` (the ranks' mean gradient, in place), the
    averaged gradient's norm; added to ``noise``. Returns the seconds the extra work took (the
    all-reduce itself is training's)."""
    t = time.perf_counter()
    own = squared_norm(grads())
    extra = time.perf_counter() - t
    all_reduce()
    return extra + record(noise, own, grads())


def record(noise: NoiseScale, own_sq: float, averaged: list[torch.Tensor]) -> float:
    """This rank's squared gradient norm ``own_sq``, taken before the all-reduce, and the
    ``averaged`` gradients after it: the ranks' mean of the first and the norm of the second,
    added to ``noise``. Returns the seconds that took."""
    t = time.perf_counter()
    small = torch.tensor(own_sq, dtype=torch.float64)
    dist.all_reduce(small)
    noise.add(float(small) / noise.world, squared_norm(averaged))
    return time.perf_counter() - t
