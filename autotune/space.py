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

from ._params import (
    Categorical,
    Constraint,
    Derived,
    Fixed,
    Float,
    InfeasiblePoint,
    Int,
    Param,
    PowerOfTwo,
    SpaceCodeError,
)
from ._searchspace import SearchSpace
from ._space_files import DataInfo, check_space, load_space, shipped_spaces

__all__ = ["Param", "Float", "Int", "PowerOfTwo", "Categorical", "Fixed", "Derived",
           "Constraint", "SearchSpace", "InfeasiblePoint", "SpaceCodeError", "DataInfo",
           "load_space", "shipped_spaces", "check_space"]
