"""The search-space API: declare the parameters a study searches, in Python.

    from autotune import SearchSpace, Float, PowerOfTwo, Categorical, Int

    space = SearchSpace(
        PowerOfTwo("global_batch", 16, 512),
        Float("lr_per_256", 0.01, 2.0, log=True),
        Categorical("decay", ["cosine", "linear", "step"]),
        Int("epochs", 3, 12),
    )

A space is validated when it is built, samples through an Optuna trial, serializes to JSON and
back, and prints as a table. Parameter names are the plan's (see ``autotune.plan.PARAMETERS``).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SpaceError

__all__ = ["Param", "Float", "Int", "PowerOfTwo", "Categorical", "Fixed", "SearchSpace",
           "load_space", "shipped_spaces"]


@dataclass(frozen=True)
class Param:
    """One searched parameter."""

    name: str

    def sample(self, trial: Any) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, **self.__dict__}

    def _check_name(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise SpaceError(f"parameter name {self.name!r} must be a Python identifier")


def _check_range(p: Param, low: Any, high: Any, log: bool, kind: type) -> None:
    p._check_name()
    for label, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, float) if kind is float else int):
            wanted = "a number" if kind is float else "an integer"
            raise SpaceError(f"{p.name}: {label} must be {wanted}, got {v!r}")
        if not math.isfinite(v):
            raise SpaceError(f"{p.name}: {label} must be finite, got {v!r}")
    if low >= high:
        raise SpaceError(f"{p.name}: low ({low}) must be below high ({high})")
    if log and low <= 0:
        raise SpaceError(f"{p.name}: a log range needs low > 0, got {low}")


@dataclass(frozen=True)
class Float(Param):
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        _check_range(self, self.low, self.high, self.log, float)

    def sample(self, trial: Any) -> float:
        return float(trial.suggest_float(self.name, self.low, self.high, log=self.log))

    def describe(self) -> str:
        return f"float [{self.low:g}, {self.high:g}]" + (" log" if self.log else "")


@dataclass(frozen=True)
class Int(Param):
    low: int
    high: int
    log: bool = False

    def __post_init__(self) -> None:
        _check_range(self, self.low, self.high, self.log, int)

    def sample(self, trial: Any) -> int:
        return int(trial.suggest_int(self.name, self.low, self.high, log=self.log))

    def describe(self) -> str:
        return f"int [{self.low}, {self.high}]" + (" log" if self.log else "")


@dataclass(frozen=True)
class PowerOfTwo(Param):
    """An integer power of two between ``low`` and ``high``, both powers of two."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _check_range(self, self.low, self.high, False, int)
        for label, v in (("low", self.low), ("high", self.high)):
            if v < 1 or v & (v - 1):
                raise SpaceError(f"{self.name}: {label} must be a power of two, got {v}")

    def sample(self, trial: Any) -> int:
        exponent = trial.suggest_int(f"{self.name}_log2", self.low.bit_length() - 1,
                                     self.high.bit_length() - 1)
        return 1 << int(exponent)

    def describe(self) -> str:
        return f"power of two [{self.low}, {self.high}]"


@dataclass(frozen=True)
class Categorical(Param):
    choices: tuple[Any, ...]

    def __init__(self, name: str, choices: Sequence[Any]) -> None:
        object.__setattr__(self, "name", name)
        if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
            raise SpaceError(f"{name}: choices must be a list, got {choices!r}")
        object.__setattr__(self, "choices", tuple(choices))
        self._check_name()
        if not self.choices:
            raise SpaceError(f"{name}: choices must not be empty")
        if len(set(map(repr, self.choices))) != len(self.choices):
            raise SpaceError(f"{name}: choices must be distinct, got {list(self.choices)}")
        for c in self.choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise SpaceError(f"{name}: choice {c!r} must be a bool, number, string or None")

    def sample(self, trial: Any) -> Any:
        return trial.suggest_categorical(self.name, list(self.choices))

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.choices))

    def to_dict(self) -> dict[str, Any]:
        return {"type": "Categorical", "name": self.name, "choices": list(self.choices)}


@dataclass(frozen=True)
class Fixed(Param):
    value: Any

    def __post_init__(self) -> None:
        self._check_name()

    def sample(self, trial: Any) -> Any:
        return self.value

    def describe(self) -> str:
        return f"fixed {self.value}"


_TYPES: dict[str, type[Param]] = {c.__name__: c for c in (Float, Int, PowerOfTwo, Categorical,
                                                          Fixed)}
DefineByRun = Callable[[Any, dict[str, Any]], Mapping[str, Any]]


class SearchSpace:
    """An ordered set of parameters, plus known-good points to try first.

    ``warm_starts`` are complete parameter sets (before any ``PowerOfTwo`` encoding) that a
    study enqueues as its first trials. ``define_by_run`` is an escape hatch: a function that
    receives the Optuna trial and the parameters sampled so far and returns more of them.
    """

    def __init__(self, *params: Param, warm_starts: Sequence[Mapping[str, Any]] = (),
                 define_by_run: DefineByRun | None = None, name: str = "") -> None:
        seen: set[str] = set()
        for p in params:
            if not isinstance(p, Param):
                raise SpaceError(f"{p!r} is not a parameter; use Float, Int, PowerOfTwo, "
                                 "Categorical or Fixed")
            if p.name in seen:
                raise SpaceError(f"parameter {p.name!r} is declared twice")
            seen.add(p.name)
        self.params = tuple(params)
        self.name = name
        self.define_by_run = define_by_run
        self.warm_starts = [dict(w) for w in warm_starts]
        for w in self.warm_starts:
            missing = sorted(seen - set(w))
            if missing:
                raise SpaceError(f"warm start {w} lacks {', '.join(missing)}")

    def sample(self, trial: Any) -> dict[str, Any]:
        """The parameters of ``trial``, drawn through Optuna's suggest API."""
        values = {p.name: p.sample(trial) for p in self.params}
        if self.define_by_run is not None:
            values.update(self.define_by_run(trial, dict(values)))
        return values

    def encode(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """``point`` as Optuna parameters (for enqueueing): powers of two become exponents."""
        out: dict[str, Any] = {}
        for p in self.params:
            if isinstance(p, PowerOfTwo):
                out[f"{p.name}_log2"] = int(point[p.name]).bit_length() - 1
            elif not isinstance(p, Fixed):
                out[p.name] = point[p.name]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": [p.to_dict() for p in self.params],
                "warm_starts": self.warm_starts, "define_by_run": self.define_by_run is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        params = []
        for d in data["params"]:
            d = dict(d)
            kind = _TYPES.get(d.pop("type"))
            if kind is None:
                raise SpaceError(f"unknown parameter type in {data!r}")
            params.append(kind(**d))
        return cls(*params, warm_starts=data.get("warm_starts", ()), name=data.get("name", ""))

    def table(self) -> str:
        rows = [(p.name, p.describe()) for p in self.params]
        width = max((len(n) for n, _ in rows), default=4)
        lines = [f"search space {self.name}".rstrip()]
        lines += [f"  {n:<{width}}  {d}" for n, d in rows]
        if self.define_by_run is not None:
            lines.append(f"  {'...':<{width}}  more, from a define-by-run function")
        lines.append(f"  {len(self.warm_starts)} warm-start configuration(s)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def shipped_spaces() -> list[str]:
    """Names of the spaces in ``search_spaces/``."""
    import search_spaces

    folder = Path(search_spaces.__file__).parent
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def load_space(ref: str, *, base_dir: str = ".", world_size: int = 1) -> SearchSpace:
    """The space ``ref`` names: a shipped space or a Python file defining ``space``.

    ``space`` is a :class:`SearchSpace`, or a function of the world size that returns one.
    """
    import search_spaces

    path = Path(ref)
    if ref in shipped_spaces():
        path = Path(search_spaces.__file__).parent / f"{ref}.py"
    elif not path.is_absolute():
        path = Path(base_dir) / path
    if not path.is_file():
        raise SpaceError(f"search space {ref!r} not found; give a Python file or a shipped "
                         f"space ({', '.join(shipped_spaces())})")
    spec = importlib.util.spec_from_file_location(f"autotune_space_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SpaceError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SpaceError as e:
        raise SpaceError(f"{path}: {e}") from e
    except Exception as e:  # the user's code: report what it raised, in one line
        raise SpaceError(f"{path}: raised {type(e).__name__}: {e}") from e
    space = getattr(module, "space", None)
    if callable(space) and not isinstance(space, SearchSpace):
        try:
            space = space(world_size)
        except SpaceError as e:
            raise SpaceError(f"{path}: {e}") from e
        except Exception as e:
            raise SpaceError(f"{path}: space({world_size}) raised {type(e).__name__}: {e}") from e
    if not isinstance(space, SearchSpace):
        raise SpaceError(f"{path}: must define `space`, a SearchSpace or a function of the world"
                         " size returning one")
    if not space.name:
        space.name = path.stem
    return space
