"""Trial start-up: what a worker pays around each trial's training, against a baseline.

    python benchmarks/trial_startup.py [--pairs 4]

Runs a short quickstart trial (ResNet-18 on digits, 2 CPU ranks under the DeepSpeed launcher,
batch 512, stopped after 3 s of training) through autotune's worker loop (``TrialRunner``),
``--pairs`` times as the worker runs it now, in warm trainer ranks that a worker keeps between
its trials, and as many times launched afresh for every trial (the baseline,
``trainer.warm_ranks: false``: the launcher, interpreters, imports and process group at every
trial), interleaved so the machine's drift hits both alike. Start-up = the trial's wall time
in the worker, from asking the study for the trial to its result told, less its training clock
(first training step to the end). Also printed: rank 0's set-up (from the plan's arrival, or
the process start, to the first step).

Last line: ``startup_s=X baseline_startup_s=Y ratio=X/Y`` (medians; lower is better).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from autotune.config import load as load_config  # noqa: E402
from autotune.modes import make_pruner, make_sampler  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.trial_runner import TrialRunner  # noqa: E402

PARAMS = {"global_batch": 512, "lr_per_256": 0.05, "warmup_epochs": 0.0, "decay": "cosine",
          "label_smoothing": 0.0, "epochs": 3}
optuna.logging.set_verbosity(optuna.logging.WARNING)


class Worker:
    """A worker's trial loop on its own study, with or without warm ranks."""

    def __init__(self, folder: Path, warm: bool) -> None:
        folder.mkdir(parents=True)
        cfg = load_config("quickstart")
        self.cfg = dataclasses.replace(
            cfg, pruner="none", target=dataclasses.replace(cfg.target, value=1.0),
            trainer=dataclasses.replace(cfg.trainer, warm_ranks=warm, checkpoint_every_s=0),
            budget=dataclasses.replace(cfg.budget, max_trial_s=3.0))
        self.study = optuna.create_study(storage=f"sqlite:///{folder / 'study.db'}",
                                         sampler=make_sampler(self.cfg, 0),
                                         pruner=make_pruner(self.cfg))
        self.runner = TrialRunner(self.cfg, load_space("quickstart", world_size=2), 1437,
                                  run_dir=folder / "runs")

    def trial(self) -> tuple[float, float]:
        """Runs one trial; returns (start-up seconds, rank 0's set-up seconds)."""
        self.study.enqueue_trial(PARAMS)
        start = time.perf_counter()
        result = self.runner.run(self.study)
        wall = time.perf_counter() - start
        if "elapsed_s" not in result.summary:
            raise SystemExit(f"the trial did not run to its end: {result.outcome} "
                             f"({result.reason}) {result.detail}")
        return wall - float(result.summary["elapsed_s"]), float(result.summary["setup_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="trials of each kind")
    args = parser.parse_args()
    if args.pairs <= 0:
        parser.error(f"--pairs must be positive, got {args.pairs}")
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        workers = {warm: Worker(Path(tmp) / ("warm" if warm else "fresh"), warm)
                   for warm in (True, False)}
        # The warm worker's first trial is its launch; the first launch on a machine also
        # builds DeepSpeed's op. Neither is what later trials pay.
        first, _ = workers[True].trial()
        print(f"warm ranks' first trial (their launch): start-up {first:5.2f} s", flush=True)
        try:
            for i in range(args.pairs):
                for warm in ((True, False) if i % 2 == 0 else (False, True)):
                    startup, setup = workers[warm].trial()
                    runs[warm].append((startup, setup))
                    print(f"pair {i + 1}: {'warm ranks ' if warm else 'fresh launch'} "
                          f"start-up {startup:5.2f} s, rank 0 set-up {setup:5.2f} s",
                          flush=True)
        finally:
            for worker in workers.values():
                worker.runner.close()
    ours = statistics.median(s for s, _ in runs[True])
    base = statistics.median(s for s, _ in runs[False])
    print(f"median start-up: warm ranks {ours:.2f} s (rank 0 set-up "
          f"{statistics.median(s for _, s in runs[True]):.2f} s), a fresh launch per trial "
          f"{base:.2f} s (set-up {statistics.median(s for _, s in runs[False]):.2f} s)")
    print(f"startup_s={ours:.2f} baseline_startup_s={base:.2f} ratio={ours / base:.2f}")


if __name__ == "__main__":
    main()
