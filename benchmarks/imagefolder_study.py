"""A newcomer's own images: the README's "Your own images" recipe on a data set made here.

    python benchmarks/imagefolder_study.py [--data DIR] [--timeout 1800] [--old-recipe]

Draws the shapes ImageFolder (``examples/make_shapes.py``: 8 classes, 10,000 training and
2,000 validation PNGs at 32 px) unless ``--data`` names one, and runs ``autotune start study
examples/shapes.yaml`` on it as a user would, in a fresh folder (SQLite, a local MLflow store,
2 CPU ranks). It prints the study's own lines, then per trial its outcome, and the figures:
the best TTA found, the compute (summed trial wall time) until a trial first reached the
target, trials until then, and the first trial's setup and its phases.

Baseline, in the same run: the study's first warm start (the `images` space's fixed recipe,
no tuning) when it reached; ``--old-recipe`` also runs the recipe a newcomer got before
(the `quickstart` space, sized for the digits, and ImageNet's augmentation fixed; evaluation
at today's cadence), for as long, and reports its best TTA (or that none reached).

Last line: ``best_tta_s=X baseline_tta_s=Y ratio=Y/X`` (higher: tuning gained more).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import optuna  # noqa: E402
import yaml  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def run_study(folder: Path, data: Path, timeout: float, old: bool) -> dict:
    folder.mkdir(parents=True)
    study = yaml.safe_load((ROOT / "examples" / "shapes.yaml").read_text())
    study["trainer"]["data"]["path"] = str(data)
    study["budget"]["timeout_s"] = timeout
    if old:
        study["study_name"] = "shapes-old-recipe"
        study["search_space"] = "quickstart"
        study["trainer"]["data"]["augment"] = "imagenet"
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autotune", "start", "study", "study.yaml"],
                          cwd=folder, text=True, capture_output=True,
                          timeout=timeout + 600)
    wall = time.perf_counter() - started
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"the study failed (exit code {done.returncode}): "
                         f"{done.stderr.strip()[-2000:]}")
    trials = optuna.load_study(study_name=study["study_name"],
                               storage=f"sqlite:///{folder / 'autotune.db'}").get_trials()
    compute, first_reach, best, n_to_reach = 0.0, None, math.inf, None
    for t in sorted(trials, key=lambda t: t.number):
        if t.datetime_complete is None or t.datetime_start is None:
            continue
        compute += (t.datetime_complete - t.datetime_start).total_seconds()
        if t.user_attrs.get("outcome") == "reached":
            best = min(best, float(t.value))
            if first_reach is None:
                first_reach, n_to_reach = compute, t.number + 1
    first = trials[0] if trials else None
    warm = first.value if first is not None and first.user_attrs.get("outcome") == "reached" \
        else math.inf
    return {"wall_s": wall, "trials": len(trials), "best_tta_s": best,
            "compute_to_first_reach_s": first_reach, "trials_to_first_reach": n_to_reach,
            "warm_start_tta_s": warm,
            "first_setup_s": first.user_attrs.get("setup_s") if first else None,
            "first_setup_phases": first.user_attrs.get("setup_phases") if first else None,
            "outcomes": [(t.number, t.user_attrs.get("outcome"), t.user_attrs.get("augment"),
                          t.value) for t in trials]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="an ImageFolder tree (default: draw shapes)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per study")
    parser.add_argument("--old-recipe", action="store_true",
                        help="also run the recipe before the images space, for as long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autotune-imagefolder-") as tmp:
        data = args.data
        if data is None:
            from make_shapes import make

            data = make(Path(tmp) / "shapes")
        os.environ.setdefault("AUTOTUNE_CACHE_DIR", str(Path(tmp) / "cache"))
        new = run_study(Path(tmp) / "recipe", data.resolve(), args.timeout, old=False)
        print(json.dumps(new, default=str))
        baseline, name = new["warm_start_tta_s"], "warm start"
        if args.old_recipe:
            old = run_study(Path(tmp) / "old-recipe", data.resolve(), args.timeout, old=True)
            print(json.dumps(old, default=str))
            baseline, name = old["best_tta_s"], "old recipe"
    best = new["best_tta_s"]
    print(f"recipe: best TTA {best:.1f} s after {new['trials']} trials; first reach after "
          f"{new['compute_to_first_reach_s']} s of compute; baseline ({name}): {baseline:.1f} s")
    print(f"best_tta_s={best:.2f} baseline_tta_s={baseline:.2f} "
          f"ratio={baseline / best if math.isfinite(best) else math.nan:.2f}")


if __name__ == "__main__":
    main()
