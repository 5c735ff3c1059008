"""autotune: find the training configuration that reaches a target accuracy fastest.

The public API is what search-space files use: the parameter types and :class:`SearchSpace`;
and :func:`load_model`, which loads the model a winning trial saved. Importing it stays light
(no Optuna, MLflow or torch), so trainers and spaces load quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .saved_model import SavedModel

__all__ = ["AutotuneError", "ConfigError", "LaunchError", "PlanError", "SpaceError",
           "Categorical", "Constraint", "DataInfo", "Derived", "Fixed", "Float",
           "InfeasiblePoint", "Int", "Param", "PowerOfTwo", "SearchSpace", "load_model",
           "__version__"]
__version__ = "0.1.0"


def load_model(path: Any) -> SavedModel:
    """The model a trial saved on reaching its target (``trial-N/model.pt``), rebuilt from
    torchvision in evaluation mode: ``.module``, ``.classes``, ``.transform`` (a PIL image
    prepared as the evaluation did), ``.predict(images)`` (see ``autotune.saved_model``)."""
    from .saved_model import load_model as load

    return load(path)
