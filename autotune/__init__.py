"""autotune: find the training configuration that reaches a target accuracy fastest.

The public API is what search-space files use: the parameter types and :class:`SearchSpace`.
Importing it stays light (no Optuna, MLflow or torch), so trainers and spaces load quickly.
"""

from __future__ import annotations

from .errors import AutotuneError, ConfigError, LaunchError, PlanError, SpaceError
from .space import (
    Categorical,
    Constraint,
    DataInfo,
    Derived,
    Fixed,
    Float,
    InfeasiblePoint,
    Int,
    Param,
    PowerOfTwo,
    SearchSpace,
)

__all__ = ["AutotuneError", "ConfigError", "LaunchError", "PlanError", "SpaceError",
           "Categorical", "Constraint", "DataInfo", "Derived", "Fixed", "Float",
           "InfeasiblePoint", "Int", "Param", "PowerOfTwo", "SearchSpace", "__version__"]
__version__ = "0.1.0"
