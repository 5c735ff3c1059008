"""``SearchSpace``: an ordered set of parameters, derived values and constraints, with its
checks, sampling and serialization (see ``autotune.space`` for the API)."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._expr import Expr
from ._params import (
    _TYPES,
    Categorical,
    Constraint,
    DefineByRun,
    Derived,
    Fixed,
    InfeasiblePoint,
    Item,
    Param,
    PowerOfTwo,
    SpaceCodeError,
    _item_names,
    _number,
    _safe_eval,
)
from .errors import SpaceError

_FEASIBILITY_SAMPLES = 2000


class SearchSpace:
    """An ordered set of parameters, derived values and constraints, plus known-good points.
    The items are given as arguments (``SearchSpace(Float(...), Int(...))``) or as one list.

    ``warm_starts``: complete points a study enqueues as its first trials. ``define_by_run``:
    an escape hatch, a function that receives the Optuna trial and the values so far and
    returns more. ``world_size``: the ranks the space is built for (a name in expressions).
    """

    def __init__(self, *items: Item, warm_starts: Sequence[Mapping[str, Any]] = (),
                 define_by_run: DefineByRun | None = None, name: str = "",
                 world_size: int = 1) -> None:
        if len(items) == 1 and isinstance(items[0], list | tuple):   # SearchSpace([...])
            items = tuple(items[0])
        self.items = tuple(items)
        self.params = tuple(i for i in self.items if isinstance(i, Param))
        self.derived = tuple(i for i in self.items if isinstance(i, Derived))
        self.constraints = tuple(i for i in self.items if isinstance(i, Constraint))
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
            if isinstance(item, list | tuple):
                found.append(f"item {position} is a {type(item).__name__}; give SearchSpace "
                             "its items as arguments, or all of them in one list")
                continue
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
        words = [v for v in values if not _number(v, True)]
        if words:
            shown = ", ".join(map(repr, words[:5])) + (", ..." if len(words) > 5 else "")
            return [f"global_batch: {shown} is not an integer; write batch sizes as integers "
                    "(256, not '256', 256.0 or True)"]
        bad = [v for v in values if v < 1 or v % self.world_size]
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
        # A configuration enqueued by hand (Optuna's ``study.enqueue_trial``): its values,
        # Optuna's "fixed params", are checked against the space before any is used.
        fixed = getattr(trial, "_fixed_params", None)
        if isinstance(fixed, dict) and fixed:
            self.settle_enqueued(fixed)
        values: dict[str, Any] = {}
        env: dict[str, Any] = {"world_size": self.world_size}
        for p in self.params:
            if p.condition is None or _safe_eval(p.condition, env) is True:
                values[p.name] = env[p.name] = p.sample(trial)
        if self.define_by_run is not None:
            values.update(self._run_define_by_run(self.define_by_run, trial, values))
        return self._complete(values)

    def settle_enqueued(self, fixed: dict[str, Any]) -> None:
        """Checks an enqueued configuration (parameter name to value, as Optuna holds it),
        taking a power of two by its own name (``global_batch: 256``) as well as by the
        exponent the study stores (``global_batch_log2: 8``; ``fixed`` is rewritten to that).
        A value outside the space, a parameter it does not have, or a derived or fixed one
        given another value raise ``InfeasiblePoint`` with every problem: the trial is dropped
        and recorded with why, instead of trained on values the space never allows."""
        problems: list[str] = []
        for p in self.params:
            if isinstance(p, PowerOfTwo) and p.name in fixed:
                value = fixed.pop(p.name)
                if f"{p.name}_log2" in fixed:
                    continue
                if p.contains(value) and not isinstance(value, bool):
                    fixed[f"{p.name}_log2"] = int(value).bit_length() - 1
                else:
                    problems.append(f"{p.name} {value!r} is not a {p.describe()}")
        names = {f"{p.name}_log2" if isinstance(p, PowerOfTwo) else p.name: p
                 for p in self.params}
        derived = {d.name: d for d in self.derived}
        for name, value in fixed.items():
            param = names.get(name)
            if name in derived:
                problems.append(f"{name} is derived ({derived[name].expr}); leave it out")
            elif param is None:
                if self.define_by_run is None:
                    problems.append(f"{name} is not a parameter of space {self.name!r} (its "
                                    f"parameters: {', '.join(q.name for q in self.params)})")
            elif isinstance(param, Fixed):
                if not param.contains(value):
                    problems.append(f"{name} is fixed at {param.value!r} in this space, not "
                                    f"{value!r}")
            elif isinstance(param, PowerOfTwo):
                if not param.contains(1 << value if isinstance(value, int) and not isinstance(
                        value, bool) and 0 <= value < 64 else None):
                    problems.append(f"{name} {value!r} is not an exponent of a "
                                    f"{param.describe()}")
            elif not param.contains(value):
                problems.append(f"{name} {value!r} is " + (
                    f"not {param.describe()}" if isinstance(param, Categorical)
                    else f"outside {param.describe()}"))
        if problems:
            raise InfeasiblePoint(f"the enqueued configuration is not in the search space: "
                                  f"{'; '.join(problems)}", constraint="enqueued")

    @staticmethod
    def _run_define_by_run(function: DefineByRun, trial: Any,
                           values: dict[str, Any]) -> Mapping[str, Any]:
        """What the define-by-run function adds; what it raises (other than a constraint the
        point violates, or a study store that cannot be reached) as a ``SpaceCodeError``."""
        name = getattr(function, "__name__", "?")
        try:
            more = function(trial, dict(values))
        except (SpaceError, ConnectionError):
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: one line, not a traceback
            raise SpaceCodeError(f"define-by-run function {name} raised "
                                 f"{type(e).__name__}: {e}") from e
        if not isinstance(more, Mapping):
            raise SpaceCodeError(f"define-by-run function {name} returned "
                                 f"{type(more).__name__}; it returns a dict of parameter names "
                                 "to values")
        return more

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
        for number, point in enumerate(self.warm_starts, 1):
            if isinstance(point, Mapping):
                shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in point.items())
                lines.append(f"    {number}. {shown}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _load_function(file: str | None, name: str) -> DefineByRun:
    if not file or not Path(file).is_file():
        raise SpaceError(f"the define-by-run function {name!r} lives in {file!r}, which is not "
                         "on this machine; copy the search-space file to the same path")
    module = _import_file(Path(file))
    func = getattr(module, name, None)
    if not callable(func):
        raise SpaceError(f"{file} no longer defines the function {name!r}")
    return func  # type: ignore[no-any-return]


def _import_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"autotune_space_{path.stem}", path)
    if spec is None or spec.loader is None:
        if path.suffix.lower() in (".yaml", ".yml", ".toml", ".json"):
            raise SpaceError(f"{path} is a study file, not a search space: a search space is "
                             "a Python file (.py) defining `space`, or a shipped space's name")
        raise SpaceError(f"{path}: cannot be imported as a Python file; a search space is a "
                         ".py file defining `space`, or a shipped space's name")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SpaceError as e:
        raise SpaceError(f"{path}: {e.problems[0]}",
                         problems=[f"{path}: {p}" for p in e.problems]) from e
    except SystemExit as e:  # sys.exit() in the user's file must not end autotune quietly
        raise SpaceError(f"{path}: called sys.exit({e.code!r}) while being imported; a space "
                         "file defines `space` and does not exit (guard a script's own run "
                         "with `if __name__ == \"__main__\":`)") from None
    except Exception as e:  # the user's code: report what it raised, in one line
        raise SpaceError(f"{path}: raised {type(e).__name__}: {e}") from e
    return module
