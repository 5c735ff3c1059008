"""The search-space items: parameter types, derived values and constraints (see
``autotune.space`` for the API), and the expression helpers they share."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._expr import Expr
from .errors import SpaceError

_SCALARS = (bool, int, float, str, type(None))


class InfeasiblePoint(SpaceError):
    """A sampled point violates a constraint; the trial is dropped before any training."""


class SpaceCodeError(SpaceError):
    """The space's own code (its define-by-run function) raised, or returned no mapping, while
    a point was sampled."""


def _number(value: Any, integer: bool) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if integer else isinstance(value, (int, float))


@dataclass(frozen=True)
class Param:
    """One searched parameter. ``condition``: an expression; the parameter exists only where
    it is true."""

    name: str
    condition: str | None = field(default=None, kw_only=True)

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.name, str) or not self.name.isidentifier():
            found.append(f"parameter name {self.name!r} must be a Python identifier")
        if self.condition is not None:
            try:
                Expr(self.condition)
            except ValueError as e:
                found.append(f"{self.name}: condition {e}")
        return found

    def sample(self, trial: Any) -> Any:
        raise NotImplementedError

    def draw(self, rng: random.Random) -> Any:
        """A uniform random value of the domain (Optuna-free, for feasibility checks)."""
        raise NotImplementedError

    def contains(self, value: Any) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def values(self) -> list[Any] | None:
        """Every value of a finite domain, or None for a continuous one."""
        return None

    def to_dict(self) -> dict[str, Any]:
        data = {"type": type(self).__name__, **self.__dict__}
        if data.get("condition") is None:
            data.pop("condition", None)
        return data


def _range_problems(p: Param, low: Any, high: Any, log: bool, integer: bool) -> list[str]:
    found = []
    for label, v in (("low", low), ("high", high)):
        if not _number(v, integer):
            found.append(f"{p.name}: {label} must be {'an integer' if integer else 'a number'}"
                         f", got {v!r}")
        elif not math.isfinite(v):
            found.append(f"{p.name}: {label} must be finite, got {v!r}")
    if found:
        return found
    if low >= high:
        found.append(f"{p.name}: low ({low}) must be below high ({high}); use Fixed for a "
                     "single value")
    if log and low <= 0:
        found.append(f"{p.name}: a log range needs low > 0, got low = {low}")
    return found


@dataclass(frozen=True)
class Float(Param):
    low: float
    high: float
    log: bool = False

    def problems(self) -> list[str]:
        return super().problems() + _range_problems(self, self.low, self.high, self.log, False)

    def sample(self, trial: Any) -> float:
        return float(trial.suggest_float(self.name, self.low, self.high, log=self.log))

    def draw(self, rng: random.Random) -> float:
        if self.log:
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

    def contains(self, value: Any) -> bool:
        return _number(value, False) and self.low <= value <= self.high

    def describe(self) -> str:
        return f"float [{self.low:g}, {self.high:g}]" + (" log" if self.log else "")


@dataclass(frozen=True)
class Int(Param):
    low: int
    high: int
    log: bool = False
    step: int = 1

    def problems(self) -> list[str]:
        found = super().problems() + _range_problems(self, self.low, self.high, self.log, True)
        if not _number(self.step, True) or self.step < 1:
            found.append(f"{self.name}: step must be a positive integer, got {self.step!r}")
        elif self.log and self.step != 1:
            found.append(f"{self.name}: a log range cannot have a step; use PowerOfTwo")
        elif not found and (self.high - self.low) % self.step:
            found.append(f"{self.name}: high - low ({self.high - self.low}) must be a multiple "
                         f"of step ({self.step})")
        return found

    def sample(self, trial: Any) -> int:
        return int(trial.suggest_int(self.name, self.low, self.high, log=self.log,
                                     step=self.step))

    def draw(self, rng: random.Random) -> int:
        if self.log:
            return min(self.high, max(self.low, round(math.exp(
                rng.uniform(math.log(self.low), math.log(self.high))))))
        return rng.randrange(self.low, self.high + 1, self.step)

    def contains(self, value: Any) -> bool:
        return (_number(value, True) and self.low <= value <= self.high
                and (value - self.low) % self.step == 0)

    def describe(self) -> str:
        step = f" step {self.step}" if self.step != 1 else ""
        return f"int [{self.low}, {self.high}]{step}" + (" log" if self.log else "")

    def values(self) -> list[Any] | None:
        return None if self.log else list(range(self.low, self.high + 1, self.step))


@dataclass(frozen=True)
class PowerOfTwo(Param):
    """An integer power of two between ``low`` and ``high``, both powers of two."""

    low: int
    high: int

    def problems(self) -> list[str]:
        found = super().problems() + _range_problems(self, self.low, self.high, False, True)
        for label, v in (("low", self.low), ("high", self.high)):
            if _number(v, True) and (v < 1 or v & (v - 1)):
                found.append(f"{self.name}: {label} must be a power of two, got {v}")
        return found

    def sample(self, trial: Any) -> int:
        exponent = trial.suggest_int(f"{self.name}_log2", self.low.bit_length() - 1,
                                     self.high.bit_length() - 1)
        return 1 << int(exponent)

    def draw(self, rng: random.Random) -> int:
        return rng.choice(self.values())

    def contains(self, value: Any) -> bool:
        return value in self.values()

    def values(self) -> list[Any]:
        return [1 << e for e in range(self.low.bit_length() - 1, self.high.bit_length())]

    def describe(self) -> str:
        return f"power of two [{self.low}, {self.high}]"


@dataclass(frozen=True, init=False)
class Categorical(Param):
    choices: tuple[Any, ...]

    def __init__(self, name: str, choices: Sequence[Any], *, condition: str | None = None):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "condition", condition)
        ok = isinstance(choices, Sequence) and not isinstance(choices, (str, bytes))
        object.__setattr__(self, "choices", tuple(choices) if ok else choices)

    def problems(self) -> list[str]:
        found = super().problems()
        if not isinstance(self.choices, tuple):
            return found + [f"{self.name}: choices must be a list, got {self.choices!r}"]
        if not self.choices:
            found.append(f"{self.name}: choices must not be empty")
        if len(set(map(repr, self.choices))) != len(self.choices):
            found.append(f"{self.name}: choices must be distinct, got {list(self.choices)}")
        for c in self.choices:
            if not isinstance(c, _SCALARS):
                found.append(f"{self.name}: choice {c!r} must be a bool, number, string or "
                             "None")
        return found

    def sample(self, trial: Any) -> Any:
        return trial.suggest_categorical(self.name, list(self.choices))

    def draw(self, rng: random.Random) -> Any:
        return rng.choice(self.choices)

    def contains(self, value: Any) -> bool:
        return any(value == c and type(value) is type(c) for c in self.choices) or (
            _number(value, False) and value in self.choices)

    def values(self) -> list[Any]:
        return list(self.choices)

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.choices))

    def to_dict(self) -> dict[str, Any]:
        data = {"type": "Categorical", "name": self.name, "choices": list(self.choices)}
        if self.condition is not None:
            data["condition"] = self.condition
        return data


@dataclass(frozen=True)
class Fixed(Param):
    value: Any

    def problems(self) -> list[str]:
        found = super().problems()
        if not isinstance(self.value, _SCALARS):
            found.append(f"{self.name}: a fixed value must be a bool, number, string or None, "
                         f"got {self.value!r}")
        return found

    def sample(self, trial: Any) -> Any:
        return self.value

    def draw(self, rng: random.Random) -> Any:
        return self.value

    def contains(self, value: Any) -> bool:
        return bool(value == self.value)

    def values(self) -> list[Any]:
        return [self.value]

    def describe(self) -> str:
        return f"fixed {self.value}"


@dataclass(frozen=True)
class Derived:
    """A value computed from the parameters before it: ``Derived("warmup_epochs",
    "0.1 * epochs")``."""

    name: str
    expr: str
    condition: str | None = field(default=None, kw_only=True)

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.name, str) or not self.name.isidentifier():
            found.append(f"derived name {self.name!r} must be a Python identifier")
        for label, text in (("expression", self.expr), ("condition", self.condition)):
            if text is None and label == "condition":
                continue
            try:
                Expr(text)  # type: ignore[arg-type]
            except ValueError as e:
                found.append(f"{self.name}: {label} {e}")
        return found

    def to_dict(self) -> dict[str, Any]:
        data = {"type": "Derived", "name": self.name, "expr": self.expr}
        if self.condition is not None:
            data["condition"] = self.condition
        return data


@dataclass(frozen=True)
class Constraint:
    """An expression every trained point satisfies: ``Constraint("warmup_epochs <= epochs / 2")``.
    Points that violate it are dropped before training."""

    expr: str

    def problems(self) -> list[str]:
        try:
            Expr(self.expr)
        except ValueError as e:
            return [f"constraint {e}"]
        return []

    def to_dict(self) -> dict[str, Any]:
        return {"type": "Constraint", "expr": self.expr}


Item = Param | Derived | Constraint
DefineByRun = Callable[[Any, dict[str, Any]], Mapping[str, Any]]
_TYPES: dict[str, type] = {c.__name__: c for c in (Float, Int, PowerOfTwo, Categorical, Fixed,
                                                   Derived, Constraint)}


def _item_names(item: Any) -> set[str]:
    texts = [getattr(item, "condition", None), getattr(item, "expr", None)]
    names: set[str] = set()
    for text in texts:
        if text is not None:
            try:
                names |= Expr(text).names
            except ValueError:
                pass  # reported by the item's own problems()
    return names


def _safe_eval(text: str, env: Mapping[str, Any]) -> Any:
    try:
        return Expr(text)(env)
    except (KeyError, ArithmeticError, TypeError, ValueError):
        return None
