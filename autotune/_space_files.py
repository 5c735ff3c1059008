"""Search spaces as files: loading a shipped space or a user's Python file (sized to the
ranks and, where its function takes them, the study's data), and the checks a built space gets
before a study is written (see ``autotune.space`` for the API)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._params import Categorical, Fixed, Float, InfeasiblePoint, Int
from ._searchspace import SearchSpace, _import_file
from .errors import SpaceError, shipped_hint


@dataclass(frozen=True)
class DataInfo:
    """What a study's data are, for a space that sizes itself to them: ``space(world_size,
    data)``. Counted from the data before anything is written (an ImageFolder's files are
    counted, no image is decoded)."""

    train_images: int            # a script's own examples (kind examples): train_examples
    num_classes: int | None      # None: examples of no stated classes
    image_size: int | None       # None: examples, which are no images
    kind: str = "imagefolder"


def _takes_data(function: Callable[..., Any]) -> bool:
    """Whether a space function takes the data as well as the world size."""
    import inspect

    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def check_space(space: SearchSpace, points: int = 64, own: Iterable[str] = ()) -> list[str]:
    """Problems a built space can still have: names the training plan does not know, and a
    space none of ``points`` random points of which is feasible (a derived value that always
    fails, such as one out of range, or constraints nothing meets): found here, before a
    study is written, not after its first hundred draws. ``own``: the names the study's own
    script takes beyond the plan's (``trainer.params``)."""
    import optuna

    from .plan import name_problems, schedule_problems, value_problems

    problems: list[str] = []
    if space.define_by_run is None:  # that code may add any name: the plan checks those
        problems = name_problems([p.name for p in space.params] +
                                 [d.name for d in space.derived], own)
    for p in space.params:
        if isinstance(p, Categorical):
            problems.extend(value_problems(p.name, p.choices))
        elif isinstance(p, Fixed):
            problems.extend(value_problems(p.name, [p.value]))
        elif isinstance(p, Float | Int):     # a range's ends: the plan's limits are intervals
            problems.extend(value_problems(p.name, [p.low, p.high]))
    for n, point in enumerate(space.warm_starts, 1):
        if isinstance(point, dict):
            problems.extend(f"warm start {n}: {why}" for why in schedule_problems(point))
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


_WRITE_AS = ("define `space = SearchSpace(Float(\"lr_per_256\", 0.01, 1, log=True), ...)` "
             "(from autotune import SearchSpace, Float, Int, Categorical), or `space` as a dict "
             "of Optuna distributions; code that needs the trial itself goes in "
             "SearchSpace(..., define_by_run=function)")


def _is_distribution(value: Any) -> bool:
    from optuna.distributions import BaseDistribution

    return isinstance(value, BaseDistribution)


def _takes_trial(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is an Optuna objective (its first parameter named ``trial``)."""
    import inspect

    try:
        params = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] in ("trial", "optuna_trial")


def _from_optuna(space: dict[Any, Any], path: Path) -> SearchSpace:
    """The SearchSpace a dict of Optuna distributions (``{"lr_per_256":
    FloatDistribution(0.01, 1, log=True)}``) says, its parameters in the dict's order."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    items: list[Any] = []
    for name, dist in space.items():
        if not isinstance(name, str):
            raise SpaceError(f"{path}: `space` has the key {name!r}; name each parameter with a "
                             "string")
        if isinstance(dist, FloatDistribution):
            if dist.step is not None:
                raise SpaceError(f"{path}: {name}: FloatDistribution(step={dist.step:g}) has no "
                                 "autotune equivalent; drop the step, or list the values as a "
                                 "CategoricalDistribution")
            items.append(Float(name, dist.low, dist.high, log=dist.log))
        elif isinstance(dist, IntDistribution):
            items.append(Int(name, dist.low, dist.high, log=dist.log, step=dist.step))
        elif isinstance(dist, CategoricalDistribution):
            items.append(Categorical(name, list(dist.choices)))
        else:
            raise SpaceError(f"{path}: {name}: {type(dist).__name__} is not one autotune reads; "
                             "use FloatDistribution, IntDistribution or "
                             "CategoricalDistribution")
    try:
        return SearchSpace(*items)
    except SpaceError as e:
        raise SpaceError(f"{path}: {e.problems[0]}",
                         problems=[f"{path}: {p}" for p in e.problems]) from e


def _instead(module: Any, space: Any) -> str:
    """What ``module`` defines in place of a usable ``space``, for the error that says so."""
    if isinstance(space, dict):
        return ("; its `space` is a dict of other values than Optuna distributions: give each "
                "parameter one (\"lr_per_256\": FloatDistribution(0.01, 1, log=True), "
                "\"global_batch\": CategoricalDistribution([128, 256])), or build a SearchSpace")
    if space is not None:
        return f"; its `space` is a {type(space).__name__}"
    names = [n for n in vars(module) if not n.startswith("_")]
    spaces = [n for n in names if isinstance(getattr(module, n), SearchSpace)]
    if spaces:
        return f"; it defines the SearchSpace `{spaces[0]}`: name it `space`"
    dicts = [n for n in names if isinstance(getattr(module, n), dict) and getattr(module, n)
             and all(_is_distribution(d) for d in getattr(module, n).values())]
    if dicts:
        return f"; it defines the Optuna distributions `{dicts[0]}`: name the dict `space`"
    own = getattr(module, "__name__", None)
    functions = [n for n in names if callable(getattr(module, n))
                 and getattr(getattr(module, n), "__module__", None) == own]
    objectives = [n for n in functions if _takes_trial(getattr(module, n))]
    if objectives:
        return (f"; it defines {objectives[0]}(trial), Optuna's define-by-run style: "
                f"{_WRITE_AS}")
    if functions:
        return f"; it defines {', '.join(functions[:3])}: is one of them the space?"
    return ""


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

    path = Path(ref).expanduser()
    if ref in shipped_spaces():
        path = Path(search_spaces.__file__).parent / f"{ref}.py"
    elif not path.is_absolute():
        path = Path(base_dir) / path
    if not path.is_file():
        shipped = shipped_spaces()
        raise SpaceError(f"search space {ref!r} not found{shipped_hint(ref, shipped, 'space')};"
                         f" give a Python file or a shipped space ({', '.join(shipped)})")
    module = _import_file(path)
    space = getattr(module, "space", None)
    if isinstance(space, dict) and space and all(_is_distribution(d) for d in space.values()):
        space = _from_optuna(space, path)
    if callable(space) and not isinstance(space, SearchSpace):
        if _takes_trial(space):
            raise SpaceError(f"{path}: space(trial) is written as Optuna's define-by-run "
                             f"objective; {_WRITE_AS}")
        try:
            space = space(world_size, data) if _takes_data(space) else space(world_size)
        except SpaceError as e:
            raise SpaceError(f"{path}: {e}",
                             problems=[f"{path}: {p}" for p in e.problems]) from e
        except SystemExit as e:
            raise SpaceError(f"{path}: space({world_size}) called sys.exit({e.code!r}); it "
                             "returns a SearchSpace") from None
        except AttributeError as e:
            if ".suggest_" in str(e) or "'suggest_" in str(e):   # trial.suggest_float(...)
                raise SpaceError(f"{path}: space() calls an Optuna trial's suggest methods, but"
                                 f" autotune calls it with the world size; {_WRITE_AS}") from None
            raise SpaceError(f"{path}: space({world_size}) raised {type(e).__name__}: {e}") from e
        except Exception as e:
            raise SpaceError(f"{path}: space({world_size}) raised {type(e).__name__}: {e}") from e
    if not isinstance(space, SearchSpace):
        raise SpaceError(f"{path}: must define `space`, a SearchSpace or a function of the world"
                         f" size returning one{_instead(module, space)}")
    if not space.name:
        space.name = path.stem
    space.source_file = str(path.resolve())
    if space.world_size != world_size:  # built without it: validate for the real ranks
        space.world_size = world_size
        problems = space._problems()
        if problems:
            raise SpaceError(f"{path}: {problems[0]}", problems=[f"{path}: {p}" for p in problems])
    return space
