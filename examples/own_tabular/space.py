"""The search space of examples/own_tabular: the plan's batch, LR, schedule and epochs, and
the script's own width and dropout (declared in study.yaml's trainer.params)."""

from autotune import Categorical, Float, Int, PowerOfTwo, SearchSpace


def space(world_size: int) -> SearchSpace:
    return SearchSpace(
        PowerOfTwo("global_batch", max(8, world_size), 128),
        Float("lr_per_256", 0.01, 4.0, log=True),
        Categorical("decay", ["cosine", "linear"]),
        Int("epochs", 2, 30),
        Categorical("width", [16, 64, 256]),
        Float("dropout", 0.0, 0.5),
        name="own_tabular", world_size=world_size,
    )
