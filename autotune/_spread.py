"""Space-filling proposals, as pure functions: draw candidates, keep the one farthest from
every configuration the study has tried (greedy maximin), optionally discounted by what the
tried configurations nearest to it cost.

Distances are taken in the unit cube of the search space: each numeric parameter scaled to
[0, 1] over its range (log range for a log parameter), a categorical one 0 when equal, 1 when
not. A parameter one of the two points lacks (a conditional one) does not count.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

__all__ = ["Embedded", "distance", "draw", "draw_near", "farthest", "nearby_cost", "unit"]


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


class Embedded:
    """Points placed in the unit cube of ``space`` once, for many distance queries:
    ``distances(point)`` equals ``[distance(space, point, p) for p in points]``."""

    def __init__(self, space: Mapping[str, BaseDistribution],
                 points: Sequence[Mapping[str, Any]]) -> None:
        self.space = space
        self.numeric = [n for n, d in space.items()
                        if isinstance(d, FloatDistribution | IntDistribution)]
        self.categorical = [n for n, d in space.items() if isinstance(d, CategoricalDistribution)]
        self._codes: dict[str, dict[Any, int]] = {n: {} for n in self.categorical}
        self.x, self.c = self._embed(points)

    def _code(self, name: str, value: Any) -> int:
        codes = self._codes[name]
        return codes.setdefault(value, len(codes))

    def _embed(self, points: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        x = np.full((len(points), len(self.numeric)), np.nan)
        c = np.full((len(points), len(self.categorical)), -1, dtype=np.int64)
        for i, p in enumerate(points):
            for j, name in enumerate(self.numeric):
                if name in p:
                    u = unit(self.space[name], p[name])
                    x[i, j] = np.nan if u is None else u
            for j, name in enumerate(self.categorical):
                if name in p:
                    c[i, j] = self._code(name, p[name])
        return x, c

    def distances(self, point: Mapping[str, Any]) -> np.ndarray:
        x, c = self._embed([point])
        squares = np.nan_to_num((self.x - x) ** 2, nan=0.0).sum(axis=1)
        mismatch = ((self.c != c) & (self.c >= 0) & (c >= 0)).sum(axis=1)
        return np.sqrt(squares + mismatch)


def draw(dist: BaseDistribution, rng: random.Random) -> Any:
    """One value of ``dist`` drawn uniformly over its (log) range, then rounded to its step
    grid. The grid's two end values come half as often as the others (1 - 4 epochs: 1 and 4 one
    draw in six each), on purpose: greedy maximin prefers a range's ends, and drawing them as
    often as the values between (as Optuna's RandomSampler does) sent more trials to them and
    cost the replayed ConvNeXt studies a sixth of their compute (BENCHMARKS.md)."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[rng.randrange(len(dist.choices))]
    if not isinstance(dist, FloatDistribution | IntDistribution):
        raise TypeError(f"cannot draw from {type(dist).__name__}")
    return _on_grid(dist, _at(dist, rng.random()))


def _on_grid(dist: FloatDistribution | IntDistribution, value: float) -> Any:
    """``value`` rounded to ``dist``'s step grid and kept within its range."""
    step = dist.step
    if isinstance(dist, IntDistribution):
        step = step or 1
    if step:
        value = dist.low + round((value - dist.low) / step) * step
    value = min(max(value, dist.low), dist.high)
    return int(round(value)) if isinstance(dist, IntDistribution) else float(value)


def _at(dist: FloatDistribution | IntDistribution, u: float) -> float:
    """The value at ``u`` (0 to 1) of ``dist``'s (log) range: ``unit``'s inverse."""
    if dist.log:
        return math.exp(math.log(dist.low) + u * (math.log(dist.high) - math.log(dist.low)))
    return dist.low + u * (dist.high - dist.low)


def draw_near(dist: BaseDistribution, center: Any, half_width: float,
              rng: random.Random) -> Any:
    """One value of ``dist`` drawn uniformly within ``half_width`` of ``center`` in the unit
    cube (the box clipped to the range), then rounded as ``draw`` rounds; a categorical
    parameter keeps ``center``'s choice (every choice from a half-width of 0.5 up, where the
    box spans the whole range)."""
    if isinstance(dist, CategoricalDistribution):
        if half_width >= 0.5 or center not in dist.choices:
            return draw(dist, rng)
        return center
    if not isinstance(dist, FloatDistribution | IntDistribution):
        raise TypeError(f"cannot draw from {type(dist).__name__}")
    u0 = unit(dist, center)
    if u0 is None:
        return draw(dist, rng)
    low, high = max(0.0, u0 - half_width), min(1.0, u0 + half_width)
    return _on_grid(dist, _at(dist, low + rng.random() * (high - low)))


def nearby_cost(distances: Sequence[float], costs: Sequence[float | None],
                neighbours: int) -> float | None:
    """The geometric mean of the costs of the ``neighbours`` nearest points whose cost is known
    (``distances[i]`` and ``costs[i]`` are point i's); None when no cost is known."""
    known = sorted((d, c) for d, c in zip(distances, costs, strict=True)
                   if c is not None and c > 0)[:max(neighbours, 1)]
    if not known:
        return None
    return math.exp(sum(math.log(c) for _, c in known) / len(known))


def _nearby_cost(distances: np.ndarray, costs: np.ndarray, neighbours: int) -> float:
    """``nearby_cost`` on arrays, ``costs`` NaN where unknown (at least one known)."""
    ok = ~np.isnan(costs)
    d, c = distances[ok], costs[ok]
    nearest = np.lexsort((c, d))[:max(neighbours, 1)]
    return float(np.exp(np.log(c[nearest]).mean()))


def farthest(space: Mapping[str, BaseDistribution], tried: Iterable[Mapping[str, Any]],
             rng: random.Random, candidates: int, costs: Sequence[float | None] | None = None,
             cost_weight: float = 0.0, neighbours: int = 3,
             center: Mapping[str, Any] | None = None, half_width: float = 0.5
             ) -> dict[str, Any]:
    """Of ``candidates`` uniform draws from ``space``, the one whose nearest tried point is the
    farthest away (the first draw when nothing was tried).

    With ``costs`` (one per tried point, None where unknown) and ``cost_weight`` w > 0, a draw's
    gap is divided by ``nearby_cost`` ** w: of two draws equally far from what was tried, the
    one among cheaper configurations wins, so a study spends its trials where they are short.

    With ``center``, the draws come from the box of ``half_width`` around it (``draw_near``;
    a parameter ``center`` lacks is drawn from its whole range), distances still in the whole
    space's unit cube: the least explored point near a configuration.
    """
    points = list(tried)
    if costs is not None and len(costs) != len(points):
        raise ValueError(f"{len(costs)} costs for {len(points)} tried points")
    embedded = Embedded(space, points)
    known = None
    if costs is not None and cost_weight > 0 and points:
        known = np.array([c if c is not None and c > 0 else np.nan for c in costs])
        known = None if np.isnan(known).all() else known
    best: dict[str, Any] = {}
    best_score = -1.0
    for _ in range(max(candidates, 1)):
        point = {name: draw(dist, rng) if center is None or name not in center
                 else draw_near(dist, center[name], half_width, rng)
                 for name, dist in space.items()}
        gaps = embedded.distances(point)
        score = float(gaps.min()) if points else math.inf
        if known is not None:
            score /= _nearby_cost(gaps, known, neighbours) ** cost_weight
        if score > best_score:
            best, best_score = point, score
        if not points:
            break
    return best
