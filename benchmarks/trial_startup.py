"""Trial start-up: what a trial pays before and after its training, against a baseline.

    python benchmarks/trial_startup.py [--pairs 4]

Runs a short quickstart trial (ResNet-18 on digits, 2 CPU ranks under the DeepSpeed launcher,
one epoch at batch 512) ``--pairs`` times as the worker starts it, and as many times with
MLflow importable in the trainer processes (the baseline: DeepSpeed then imports it in the
launcher and in every rank), interleaved so the machine's drift hits both alike. Start-up =
the trial's wall time from the launch to the return, less its training clock (the time
from the first training step to the end). Also printed: rank 0's set-up (from its process
start to the first step).

Last line: ``startup_s=X baseline_startup_s=Y ratio=X/Y`` (medians; lower is better).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import load as load_config  # noqa: E402
from autotune.launch import run_plan  # noqa: E402
from autotune.plan import Hardware, resolve  # noqa: E402

PARAMS = {"global_batch": 512, "lr_per_256": 0.05, "warmup_epochs": 0.0, "decay": "cosine",
          "label_smoothing": 0.0, "epochs": 1}


def one_trial(folder: Path, shadow_mlflow: bool) -> tuple[float, float]:
    """Runs the trial once; returns (start-up seconds, rank 0's set-up seconds)."""
    trainer = load_config("quickstart").trainer
    plan = resolve(PARAMS, trainer=trainer.__dict__, train_size=1437,
                   hardware=Hardware(world_size=2, max_micro_batch=trainer.max_micro_batch),
                   target={"metric": "top1", "value": 1.01}, max_seconds=60)
    start = time.perf_counter()
    messages, process = run_plan(plan, folder, timeout_s=300, shadow_mlflow=shadow_mlflow)
    wall = time.perf_counter() - start
    end = next((m for m in messages if m.get("type") == "end"), None)
    begun = next((m for m in messages if m.get("type") == "start"), None)
    if end is None or begun is None:
        raise SystemExit(f"the trial did not run to its end (exit code {process.returncode}); "
                         f"see {folder / 'trainer.log'}")
    return wall - float(end["elapsed_s"]), float(begun["setup_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="trials of each kind")
    args = parser.parse_args()
    if args.pairs <= 0:
        parser.error(f"--pairs must be positive, got {args.pairs}")
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        one_trial(Path(tmp) / "warm-up", True)  # first launch on a machine builds an op
        for i in range(args.pairs):
            for shadow in ((True, False) if i % 2 == 0 else (False, True)):
                startup, setup = one_trial(Path(tmp) / f"t{i}-{shadow}", shadow)
                runs[shadow].append((startup, setup))
                print(f"pair {i + 1}: {'shipped ' if shadow else 'baseline'} start-up "
                      f"{startup:5.2f} s, rank 0 set-up {setup:5.2f} s", flush=True)
    ours = statistics.median(s for s, _ in runs[True])
    base = statistics.median(s for s, _ in runs[False])
    print(f"median start-up: shipped {ours:.2f} s (rank 0 set-up "
          f"{statistics.median(s for _, s in runs[True]):.2f} s), MLflow importable "
          f"{base:.2f} s (set-up {statistics.median(s for _, s in runs[False]):.2f} s)")
    print(f"startup_s={ours:.2f} baseline_startup_s={base:.2f} ratio={ours / base:.2f}")


if __name__ == "__main__":
    main()
