"""Space-filling proposals, as pure functions: draw candidates, keep the one farthest from
every configuration the study has tried (greedy maximin).

Distances are taken in the unit cube of the search space: each numeric parameter scaled to
[0, 1] over its range (log range for a log parameter), a categorical one 0 when equal, 1 when
not. A parameter one of the two points lacks (a conditional one) does not count.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

__all__ = ["distance", "draw", "farthest", "unit"]


def unit(dist: BaseDistribution, value: Any) -> float | None:
    """``value``'s place in ``dist``'s range, 0 to 1 (None for a categorical parameter)."""
    if not isinstance(dist, FloatDistribution | IntDistribution):
        return None
    low, high, v = float(dist.low), float(dist.high), float(value)
    if dist.log:
        low, high, v = math.log(low), math.log(high), math.log(max(v, dist.low))
    return 0.0 if high <= low else min(max((v - low) / (high - low), 0.0), 1.0)


def distance(space: Mapping[str, BaseDistribution], a: Mapping[str, Any],
             b: Mapping[str, Any]) -> float:
    """Euclidean distance of two points in the unit cube of ``space``."""
    total = 0.0
    for name, dist in space.items():
        if name not in a or name not in b:
            continue
        if isinstance(dist, CategoricalDistribution):
            total += 0.0 if a[name] == b[name] else 1.0
        else:
            ua, ub = unit(dist, a[name]), unit(dist, b[name])
            if ua is not None and ub is not None:
                total += (ua - ub) ** 2
    return math.sqrt(total)


def draw(dist: BaseDistribution, rng: random.Random) -> Any:
    """One value of ``dist`` drawn uniformly over its (log) range, on its step grid."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[rng.randrange(len(dist.choices))]
    if not isinstance(dist, FloatDistribution | IntDistribution):
        raise TypeError(f"cannot draw from {type(dist).__name__}")
    u = rng.random()
    if dist.log:
        value = math.exp(math.log(dist.low) + u * (math.log(dist.high) - math.log(dist.low)))
    else:
        value = dist.low + u * (dist.high - dist.low)
    step = dist.step
    if isinstance(dist, IntDistribution):
        step = step or 1
    if step:
        value = dist.low + round((value - dist.low) / step) * step
    value = min(max(value, dist.low), dist.high)
    return int(round(value)) if isinstance(dist, IntDistribution) else float(value)


def farthest(space: Mapping[str, BaseDistribution], tried: Iterable[Mapping[str, Any]],
             rng: random.Random, candidates: int) -> dict[str, Any]:
    """Of ``candidates`` uniform draws from ``space``, the one whose nearest tried point is the
    farthest away (the first draw when nothing was tried)."""
    points = list(tried)
    best: dict[str, Any] = {}
    best_gap = -1.0
    for _ in range(max(candidates, 1)):
        point = {name: draw(dist, rng) for name, dist in space.items()}
        gap = min((distance(space, point, p) for p in points), default=math.inf)
        if gap > best_gap:
            best, best_gap = point, gap
        if not points:
            break
    return best
