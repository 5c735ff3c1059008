"""Learning-rate and image-size schedules as pure functions of the step or epoch.

The worker uses these to preview a plan; the trainer uses them to drive its optimizer. Keeping
one implementation guarantees that what MLflow shows as the planned schedule is what ran.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DECAYS", "EVALS_PER_CAP", "EVAL_SHARE", "RESOLUTION_MODES", "eval_interval",
           "image_sizes", "lr_factor", "lr_at"]

DECAYS = ("cosine", "linear", "poly", "step", "constant")


def _decay_factor(progress: float, decay: str, power: float, milestones: Sequence[float],
                  gamma: float) -> float:
    """Factor in [0, 1] for ``progress`` in [0, 1] through the decay phase."""
    progress = min(max(progress, 0.0), 1.0)
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if decay == "linear":
        return 1.0 - progress
    if decay == "poly":
        return (1.0 - progress) ** power
    if decay == "step":
        return gamma ** sum(1 for m in milestones if progress >= m)
    if decay == "constant":
        return 1.0
    raise ValueError(f"unknown decay {decay!r}; allowed: {', '.join(DECAYS)}")


def lr_factor(step: int, schedule: Mapping[str, Any]) -> float:
    """Multiplier of the peak LR for optimizer step ``step`` (0-based).

    ``schedule`` holds ``warmup_steps``, ``total_steps``, ``warmup_start_factor``, ``decay``,
    ``final_lr_factor`` and, for some decays, ``power``, ``milestones`` (fractions of the decay
    phase) and ``gamma``. Warmup rises linearly from the start factor and reaches 1.0 on the
    last warmup step; decay then runs from 1.0 down to ``final_lr_factor`` at ``total_steps``.
    """
    warmup = int(schedule["warmup_steps"])
    total = int(schedule["total_steps"])
    start = float(schedule.get("warmup_start_factor", 0.0))
    if step < warmup:
        return start + (1.0 - start) * (step + 1) / warmup
    decay_steps = max(total - warmup, 1)
    progress = (step - warmup) / decay_steps
    final = float(schedule.get("final_lr_factor", 0.0))
    factor = _decay_factor(progress, str(schedule["decay"]), float(schedule.get("power", 2.0)),
                           schedule.get("milestones", (0.5, 0.75)),
                           float(schedule.get("gamma", 0.1)))
    if schedule["decay"] == "step":
        return factor
    return final + (1.0 - final) * factor


def lr_at(step: int, peak_lr: float, schedule: Mapping[str, Any]) -> float:
    """The learning rate of optimizer step ``step``."""
    return peak_lr * lr_factor(step, schedule)


# Evaluation cadence when a study sets none: after every epoch, and between epochs often
# enough that a trial's cap holds EVALS_PER_CAP evaluations, but never so often that evaluating
# takes more than EVAL_SHARE of the training time between two of them.
EVALS_PER_CAP = 8
EVAL_SHARE = 0.25


def eval_interval(max_seconds: float, eval_cost_s: float) -> float:
    """Training seconds between evaluations inside an epoch, when the study sets no cadence:
    ``max_seconds`` / EVALS_PER_CAP, or ``eval_cost_s`` / EVAL_SHARE when an evaluation costs
    more than that allows; infinite (once an epoch) when trials have no cap."""
    if not max_seconds > 0 or not math.isfinite(max_seconds):
        return math.inf
    return max(max_seconds / EVALS_PER_CAP, eval_cost_s / EVAL_SHARE)


RESOLUTION_MODES = ("linear", "step")
SIZE_STEP = 8          # a linear ramp's sizes are multiples of this many pixels


def image_sizes(epochs: int, start: int, end: int, *, mid: int = 0, ramp_start: float = 0.0,
                ramp_end: float = 1.0, mode: str = "linear") -> list[int]:
    """The training resolution of each epoch (0-based) of a progressive-resizing schedule.

    Epoch ``e`` is at ``e / epochs`` of the planned schedule. ``linear`` (FFCV's form): ``start``
    until ``ramp_start``, then rising linearly to ``end`` at ``ramp_end`` (rounded down to a
    multiple of ``SIZE_STEP`` pixels, never below ``start``), ``end`` after. ``step`` (fast.ai's
    and the DAWNBench seed's form): ``start`` until ``ramp_start``, then ``mid`` (or ``end``
    when there is no middle size) until ``ramp_end``, then ``end``."""
    if mode not in RESOLUTION_MODES:
        raise ValueError(f"unknown resolution mode {mode!r}; allowed: "
                         f"{', '.join(RESOLUTION_MODES)}")
    sizes = []
    for epoch in range(epochs):
        share = epoch / epochs
        if share < ramp_start:
            size = start
        elif share >= ramp_end:
            size = end
        elif mode == "step":
            size = mid or end
        else:
            rising = start + (end - start) * (share - ramp_start) / (ramp_end - ramp_start)
            size = max(start, int(rising) // SIZE_STEP * SIZE_STEP)
        sizes.append(int(size))
    return sizes
