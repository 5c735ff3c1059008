"""Write a synthetic image-classification table in opda's ConvNeXt layout, where the runs
that win are long schedules that trail shorter ones for their first epochs:

    python benchmarks/trailing_table.py /tmp/trailing.jsonl --seed 1
    python benchmarks/search_efficiency.py compare --table opda:/tmp/trailing.jsonl \\
        --methods autotune,random,asha_wallclock

The curves are drawn, not recorded, to test a tuner on a trait that opda's ConvNeXt curves
lack: there the goal runs lead the whole population from their third epoch on; here a run's
accuracy is held down while its learning rate is high, by a share (drawn per table, 0.1 -
0.35) that falls linearly to nothing at the end of its schedule, so at equal elapsed time a
long schedule trails a short one until late. The search repeats opda's image search over
shorter schedules: 10 - 60 epochs, batch 128 - 1024 (log), LR 1e-3 - 3 (log), warm-up over up
to half the schedule, momentum, weight decay, label smoothing (momentum and weight decay
without effect on the curves). Each run rises as a (1 - e^-kt) curve to a
ceiling set by how far its LR per 256 images is from an optimum drawn per table (a Gaussian
of 0.6 decades in log LR) and by its label smoothing; a run whose LR per 256 images passes
about 8 x the optimum diverges within its first 5 epochs (NaN loss). Epochs take about 60 s at
batch 256 (larger batches a little less) on a machine drawn per run (0.8, 1, 1 or 1.3 x: mixed
hardware), each evaluation carries noise (sd 0.004). Figures from it are about this model, not
about any recorded study: BENCHMARKS.md says so where it reports them.
"""

from __future__ import annotations

import math
import random
from typing import Any

from finetune_table import main


class Trailing:
    """Draws a table's runs; the table's own constants come from the stream's first draws."""

    def __init__(self) -> None:
        self.constants: tuple[float, float, float] | None = None

    def __call__(self, rng: random.Random, iteration: int) -> dict[str, Any]:
        if self.constants is None:      # the best LR per 256 images, ceiling, high-LR penalty
            self.constants = (10 ** rng.uniform(-1.5, -0.5), rng.uniform(0.75, 0.92),
                              rng.uniform(0.1, 0.35))
        best_lr, ceiling, penalty = self.constants
        epochs, batch = rng.randint(10, 60), int(2 ** rng.uniform(7, 10))
        lr, peak = 10 ** rng.uniform(-3, 0.5), rng.randint(0, epochs // 2)
        momentum, smoothing = rng.uniform(0.8, 0.99), rng.uniform(0, 0.3)
        decay = 10 ** rng.uniform(-6, -3)       # searched, and without effect here
        per_256 = lr / (batch / 256)
        quality = (math.exp(-0.5 * (math.log10(per_256 / best_lr) / 0.6) ** 2)
                   * (1 - 0.3 * abs(smoothing - 0.1)))
        top = ceiling * (0.55 + 0.45 * quality)
        rate = rng.uniform(0.06, 0.12) * (256 / batch) ** 0.3 * (0.6 + 0.4 * quality)
        epoch_s = (60 * (batch / 256) ** -0.15 * rng.choice((1.0, 1.0, 1.3, 0.8))
                   * rng.uniform(0.95, 1.05))
        diverges = per_256 > best_lr * 8 * rng.uniform(0.7, 1.4)
        elapsed, curve = 0.0, []
        for epoch in range(1, epochs + 1):
            elapsed += epoch_s * rng.uniform(0.97, 1.03)
            warm = min(1.0, epoch / peak) if peak else 1.0
            accuracy = (top * (1 - math.exp(-rate * epoch * (0.5 + 0.5 * warm)))
                        * (1 - penalty * (1 - epoch / epochs)) + rng.gauss(0, 0.004))
            if diverges and epoch >= 2 + rng.randint(0, 3):
                break
            accuracy = max(0.001, accuracy)
            curve.append({"epoch": epoch, "time": round(elapsed, 2), "top_1": accuracy,
                          "top_5": min(1.0, accuracy + 0.12), "train_loss": 3 * (1 - accuracy)})
        return {"iteration": iteration, "nan_train_loss": diverges, "epochs": epochs,
                "batch_size": batch, "lr": lr, "lr_peak_epoch": peak, "momentum": momentum,
                "weight_decay": decay, "label_smoothing": smoothing, "learning_curve": curve}


if __name__ == "__main__":
    main(Trailing(), __doc__, "synthetic image-classification runs", runs=300)
