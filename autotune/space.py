"""The search-space API: declare what a study searches, in Python.

    from autotune import Categorical, Constraint, Derived, Float, Int, PowerOfTwo, SearchSpace

    space = SearchSpace(
        PowerOfTwo("global_batch", 256, 32768),
        Categorical("optimizer", ["sgd", "lars"]),
        Float("lars_trust_coefficient", 1e-4, 1e-2, log=True, condition="optimizer == 'lars'"),
        Float("lr_per_256", 0.05, 1.0, log=True),
        Int("epochs", 16, 90),
        Derived("warmup_epochs", "min(0.1 * epochs, 2 + global_batch / 4096)"),
        Constraint("warmup_epochs <= 0.5 * epochs"),
    )

Conditions, derived values and constraints are expressions over the parameters declared before
them (and ``world_size``), kept as text, so a space serializes to JSON without loss and any
worker rebuilds it. A space is validated when it is built: every problem is collected, and
:class:`~autotune.errors.SpaceError` lists them all. Parameter names are the training plan's
(see ``autotune.plan.PARAMETERS``).
"""

from __future__ import annotations

import importlib.util
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._expr import Expr
from .errors import SpaceError

__all__ = ["Param", "Float", "Int", "PowerOfTwo", "Categorical", "Fixed", "Derived",
           "Constraint", "SearchSpace", "InfeasiblePoint", "DataInfo", "load_space",
           "shipped_spaces", "check_space"]

_SCALARS = (bool, int, float, str, type(None))
_FEASIBILITY_SAMPLES = 2000


@dataclass(frozen=True)
class DataInfo:
    """What a study's data are, for a space that sizes itself to them: ``space(world_size,
    data)``. Counted from the data before anything is written (an ImageFolder's files are
    counted, no image is decoded)."""

    train_images: int
    num_classes: int
    image_size: int
    kind: str = "imagefolder"


class InfeasiblePoint(SpaceError):
    """A sampled point violates a constraint; the trial is dropped before any training."""


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


class SearchSpace:
    """An ordered set of parameters, derived values and constraints, plus known-good points.

    ``warm_starts``: complete points a study enqueues as its first trials. ``define_by_run``:
    an escape hatch, a function that receives the Optuna trial and the values so far and
    returns more. ``world_size``: the ranks the space is built for (a name in expressions).
    """

    def __init__(self, *items: Item, warm_starts: Sequence[Mapping[str, Any]] = (),
                 define_by_run: DefineByRun | None = None, name: str = "",
                 world_size: int = 1) -> None:
        self.items = tuple(items)
        self.params = tuple(i for i in items if isinstance(i, Param))
        self.derived = tuple(i for i in items if isinstance(i, Derived))
        self.constraints = tuple(i for i in items if isinstance(i, Constraint))
        self.name = name
        self.world_size = world_size
        self.define_by_run = define_by_run
        self.source_file: str | None = None
        self.warm_starts = [dict(w) if isinstance(w, Mapping) else w for w in warm_starts]
        problems = self._problems()
        if problems:
            raise SpaceError(problems[0], problems=problems)

    # -- validation ---------------------------------------------------------------------------
    def _problems(self) -> list[str]:
        found: list[str] = []
        declared: set[str] = set()
        later = {getattr(i, "name", None) for i in self.items}
        for position, item in enumerate(self.items, 1):
            if not isinstance(item, (Param, Derived, Constraint)):
                found.append(f"item {position} ({item!r}) is not a parameter; use Float, Int, "
                             "PowerOfTwo, Categorical, Fixed, Derived or Constraint")
                continue
            found += item.problems()
            label = f"constraint {item.expr!r}" if isinstance(item, Constraint) \
                else f"{item.name!r}"
            for ref in sorted(_item_names(item) - declared - {"world_size"}):
                where = "is declared after it" if ref in later else "is not a parameter"
                found.append(f"{label} refers to {ref!r}, which {where}")
            if not isinstance(item, Constraint):
                if item.name in declared:
                    found.append(f"parameter {item.name!r} is declared twice")
                declared.add(item.name)
        if not _number(self.world_size, True) or self.world_size < 1:
            found.append(f"world_size must be a positive integer, got {self.world_size!r}")
        elif not found:
            found += self._batch_problems()
        if callable(self.define_by_run) is False and self.define_by_run is not None:
            found.append(f"define_by_run must be a function, got {self.define_by_run!r}")
        if not found:
            found += self._warm_start_problems()
        if not found and self.constraints:
            found += self._feasibility_problems()
        return found

    def _batch_problems(self) -> list[str]:
        batch = next((p for p in self.params if p.name == "global_batch"), None)
        if batch is None:
            return []
        values = batch.values()
        if values is None:
            return [f"global_batch: a log-scaled Int cannot be checked against {self.world_size}"
                    " ranks; use PowerOfTwo or Int with a step"]
        bad = [v for v in values if not _number(v, True) or v < 1 or v % self.world_size]
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
            return [f"global_batch: {shown} cannot be split evenly over {self.world_size} ranks;"
                    f" use multiples of {self.world_size}"]
        return []

    def _warm_start_problems(self) -> list[str]:
        found = []
        for n, point in enumerate(self.warm_starts, 1):
            if not isinstance(point, Mapping):
                found.append(f"warm start {n} must be a mapping of parameter to value")
                continue
            env: dict[str, Any] = {"world_size": self.world_size}
            for p in self.params:
                active = p.condition is None or _safe_eval(p.condition, env) is True
                if not active:
                    continue
                if p.name not in point:
                    found.append(f"warm start {n} lacks {p.name}")
                elif not p.contains(point[p.name]):
                    found.append(f"warm start {n}: {p.name} = {point[p.name]!r} is outside "
                                 f"{p.describe()}")
                env[p.name] = point.get(p.name)
            known = {p.name for p in self.params} | {d.name for d in self.derived}
            extra = sorted(set(point) - known)
            if extra and self.define_by_run is None:
                found.append(f"warm start {n} sets unknown parameter(s) {', '.join(extra)}")
            if not found:
                try:
                    self._complete(dict(point))
                except InfeasiblePoint as e:
                    found.append(f"warm start {n}: {e}")
        return found

    def _feasibility_problems(self) -> list[str]:
        rng = random.Random(0)
        feasible = 0
        failures: dict[str, int] = {}
        for _ in range(_FEASIBILITY_SAMPLES):
            try:
                self._complete(self._draw(rng))
                feasible += 1
            except InfeasiblePoint as e:
                failures[e.constraint] = failures.get(e.constraint, 0) + 1
        if feasible:
            return []
        worst = ", ".join(f"{c!r} failed {k} times" for c, k in failures.items())
        return [f"no point satisfies the constraints: none of {_FEASIBILITY_SAMPLES} random "
                f"points did ({worst})"]

    # -- sampling -----------------------------------------------------------------------------
    def _draw(self, rng: random.Random) -> dict[str, Any]:
        values: dict[str, Any] = {}
        env: dict[str, Any] = {"world_size": self.world_size}
        for p in self.params:
            if p.condition is None or _safe_eval(p.condition, env) is True:
                values[p.name] = env[p.name] = p.draw(rng)
        return values

    def _complete(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with derived values added; raises InfeasiblePoint on a violation."""
        env = {"world_size": self.world_size, **values}
        for d in self.derived:
            if d.condition is not None and _safe_eval(d.condition, env) is not True:
                continue
            try:
                values[d.name] = env[d.name] = Expr(d.expr)(env)
            except KeyError as e:
                raise InfeasiblePoint(f"{d.name} = {d.expr} needs {e.args[0]}, which is not "
                                      "set here", constraint=d.expr) from e
            except (ArithmeticError, TypeError, ValueError) as e:
                raise InfeasiblePoint(f"{d.name} = {d.expr} failed: {e}",
                                      constraint=d.expr) from e
        for c in self.constraints:
            if _safe_eval(c.expr, env) is not True:
                raise InfeasiblePoint(f"violates constraint {c.expr!r}", constraint=c.expr)
        return values

    def sample(self, trial: Any) -> dict[str, Any]:
        """The parameters of ``trial``, drawn through Optuna's suggest API.

        Raises :class:`InfeasiblePoint` when the point violates a constraint."""
        values: dict[str, Any] = {}
        env: dict[str, Any] = {"world_size": self.world_size}
        for p in self.params:
            if p.condition is None or _safe_eval(p.condition, env) is True:
                values[p.name] = env[p.name] = p.sample(trial)
        if self.define_by_run is not None:
            values.update(self.define_by_run(trial, dict(values)))
        return self._complete(values)

    def encode(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """``point`` as Optuna parameters (for enqueueing): powers of two become exponents."""
        out: dict[str, Any] = {}
        for p in self.params:
            if p.name not in point:
                continue
            if isinstance(p, PowerOfTwo):
                out[f"{p.name}_log2"] = int(point[p.name]).bit_length() - 1
            elif not isinstance(p, Fixed):
                out[p.name] = point[p.name]
        return out

    # -- serialization and display ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        dbr = None
        if self.define_by_run is not None:
            dbr = {"function": getattr(self.define_by_run, "__name__", ""),
                   "file": self.source_file}
        return {"name": self.name, "world_size": self.world_size,
                "items": [i.to_dict() for i in self.items],
                "warm_starts": self.warm_starts, "define_by_run": dbr}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        items = []
        for d in data["items"]:
            d = dict(d)
            kind = _TYPES.get(d.pop("type", ""))
            if kind is None:
                raise SpaceError(f"unknown item type in a stored search space: {d!r}")
            items.append(kind(**d))
        dbr = None
        ref = data.get("define_by_run")
        if ref:
            dbr = _load_function(ref.get("file"), ref.get("function", ""))
        space = cls(*items, warm_starts=data.get("warm_starts", ()), define_by_run=dbr,
                    name=data.get("name", ""), world_size=data.get("world_size", 1))
        space.source_file = ref.get("file") if ref else None
        return space

    def table(self) -> str:
        rows = []
        for item in self.items:
            if isinstance(item, Param):
                rows.append((item.name, item.describe(), item.condition))
            elif isinstance(item, Derived):
                rows.append((item.name, f"= {item.expr}", item.condition))
        width = max((len(n) for n, _, _ in rows), default=4)
        lines = [f"search space {self.name} (world size {self.world_size})"]
        for n, d, cond in rows:
            lines.append(f"  {n:<{width}}  {d}" + (f"   if {cond}" if cond else ""))
        if self.define_by_run is not None:
            lines.append(f"  {'...':<{width}}  more, from define-by-run function "
                         f"{getattr(self.define_by_run, '__name__', '?')}")
        for c in self.constraints:
            lines.append(f"  constraint: {c.expr}")
        lines.append(f"  {len(self.warm_starts)} warm-start configuration(s)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _safe_eval(text: str, env: Mapping[str, Any]) -> Any:
    try:
        return Expr(text)(env)
    except (KeyError, ArithmeticError, TypeError, ValueError):
        return None


def _load_function(file: str | None, name: str) -> DefineByRun:
    if not file or not Path(file).is_file():
        raise SpaceError(f"the define-by-run function {name!r} lives in {file!r}, which is not "
                         "on this machine; copy the search-space file to the same path")
    module = _import_file(Path(file))
    func = getattr(module, name, None)
    if not callable(func):
        raise SpaceError(f"{file} no longer defines the function {name!r}")
    return func  # type: ignore[no-any-return]


def _takes_data(function: Callable[..., Any]) -> bool:
    """Whether a space function takes the data as well as the world size."""
    import inspect

    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _import_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"autotune_space_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SpaceError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SpaceError as e:
        raise SpaceError(f"{path}: {e.problems[0]}",
                         problems=[f"{path}: {p}" for p in e.problems]) from e
    except Exception as e:  # the user's code: report what it raised, in one line
        raise SpaceError(f"{path}: raised {type(e).__name__}: {e}") from e
    return module


def check_space(space: SearchSpace, points: int = 64) -> list[str]:
    """Problems a built space can still have: names the training plan does not know, and a
    space none of ``points`` random points of which is feasible (a derived value that always
    fails, such as one out of range, or constraints nothing meets): found here, before a
    study is written, not after its first hundred draws."""
    import optuna

    from .plan import name_problems, value_problems

    if space.define_by_run is not None:  # it may set any name; the plan checks each trial
        return []
    problems = name_problems([p.name for p in space.params] + [d.name for d in space.derived])
    for p in space.params:
        if isinstance(p, Categorical):
            problems.extend(value_problems(p.name, p.choices))
        elif isinstance(p, Fixed):
            problems.extend(value_problems(p.name, [p.value]))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)   # no "study created" line
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    finally:
        optuna.logging.set_verbosity(verbosity)
    why = None
    for _ in range(points):
        trial = study.ask()
        try:
            space.sample(trial)
            why = None
            break
        except InfeasiblePoint as e:
            why = str(e)
        except SpaceError as e:
            problems.append(str(e))
            break
        except (ValueError, ArithmeticError, TypeError, KeyError) as e:
            problems.append(f"evaluating the space at a sampled point failed: "
                            f"{type(e).__name__}: {e}")
            break
        finally:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    if why is not None:
        problems.append(f"none of {points} random points is feasible; the last: {why}")
    return problems


def shipped_spaces() -> list[str]:
    """Names of the spaces in ``search_spaces/``."""
    import search_spaces

    folder = Path(search_spaces.__file__).parent
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def load_space(ref: str, *, base_dir: str = ".", world_size: int = 1,
               data: DataInfo | None = None) -> SearchSpace:
    """The space ``ref`` names: a shipped space or a Python file defining ``space``.

    ``space`` is a :class:`SearchSpace`, or a function that returns one, of the world size, or
    of the world size and the study's data (a :class:`DataInfo`; None where no study is at
    hand, as in ``autotune space show``, when the space picks its own stand-in).
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
    module = _import_file(path)
    space = getattr(module, "space", None)
    if callable(space) and not isinstance(space, SearchSpace):
        try:
            space = space(world_size, data) if _takes_data(space) else space(world_size)
        except SpaceError as e:
            raise SpaceError(f"{path}: {e}",
                             problems=[f"{path}: {p}" for p in e.problems]) from e
        except Exception as e:
            raise SpaceError(f"{path}: space({world_size}) raised {type(e).__name__}: {e}") from e
    if not isinstance(space, SearchSpace):
        raise SpaceError(f"{path}: must define `space`, a SearchSpace or a function of the world"
                         " size returning one")
    if not space.name:
        space.name = path.stem
    space.source_file = str(path.resolve())
    if space.world_size != world_size:  # built without it: validate for the real ranks
        space.world_size = world_size
        problems = space._problems()
        if problems:
            raise SpaceError(f"{path}: {problems[0]}", problems=[f"{path}: {p}" for p in problems])
    return space
