"""The search space of examples/own_trainer: the plan's batch, LR, schedule and epochs, and
the script's own dropout (declared in study.yaml's trainer.params)."""

from autotune import Categorical, Float, Int, PowerOfTwo, SearchSpace


def space(world_size: int) -> SearchSpace:
    return SearchSpace(
        PowerOfTwo("global_batch", max(16, world_size), 256),
        Float("lr_per_256", 0.05, 2.0, log=True),
        Categorical("decay", ["cosine", "linear"]),
        Int("epochs", 4, 20),
        Float("dropout", 0.0, 0.5),
        warm_starts=[{"global_batch": 64, "lr_per_256": 0.5, "decay": "cosine",
                      "epochs": 10, "dropout": 0.1}],
        name="own_trainer", world_size=world_size,
    )
