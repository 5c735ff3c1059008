"""Learning curves as the pruner sees them: accuracy (or a falling metric, negated) against
elapsed seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Curve", "interpolate"]


@dataclass(frozen=True)
class Curve:
    """One trial's evaluations, in time order.

    ``progress`` is the fraction of the trial's planned schedule done at each evaluation
    (epochs done / planned epochs), so the planned end is about ``times[-1] / progress[-1]``.
    ``reached_at`` is the TTA of a trial that reached the target. ``running``: the trial goes
    on (False once it ended); ``failed``: it ended failed (diverged, out of memory, crashed).
    """

    times: tuple[float, ...]
    values: tuple[float, ...]
    progress: tuple[float, ...] = ()
    reached_at: float | None = None
    running: bool = True
    failed: bool = False

    @classmethod
    def of(cls, points: Sequence[Sequence[float]], metric_index: int = 1,
           reached_at: float | None = None, running: bool = True,
           failed: bool = False, sign: float = 1.0) -> Curve:
        """From stored rows ``[elapsed, top1, top5, progress, ...]``; ``sign`` -1 negates the
        values (a metric that falls, so that higher is better)."""
        rows = [p for p in points if p[metric_index] is not None]
        return cls(tuple(float(p[0]) for p in rows),
                   tuple(sign * float(p[metric_index]) for p in rows),
                   tuple(float(p[3]) if len(p) > 3 and p[3] is not None else 0.0 for p in rows),
                   reached_at, running, failed)

    @property
    def best(self) -> float:
        """The best value so far (0 before any evaluation)."""
        return max(self.values, default=0.0)

    @property
    def elapsed(self) -> float:
        return self.times[-1] if self.times else 0.0

    def planned_end(self) -> float:
        """Elapsed seconds at the end of the planned schedule, at the pace so far."""
        if not self.progress or self.progress[-1] <= 0:
            return math.inf
        return self.times[-1] / min(self.progress[-1], 1.0)


def interpolate(curve: Curve, t: float) -> float | None:
    """The curve's value at ``t`` (linear between evaluations; before the first, None).

    After a trial's last evaluation its value stays at the last one: a trial that reached the
    target keeps counting as having reached it.
    """
    if not curve.times or t < curve.times[0]:
        return None
    for (t0, v0), (t1, v1) in zip(zip(curve.times, curve.values, strict=True),
                                  zip(curve.times[1:], curve.values[1:], strict=True),
                                  strict=False):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return curve.values[-1]
