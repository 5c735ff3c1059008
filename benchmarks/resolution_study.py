"""Progressive resizing on the quickstart, and what the noise-scale cap costs there.

    python benchmarks/resolution_study.py [--seeds 3] [--n-trials 12]

For each seed, the quickstart study (ResNet-18 on the digits at 32 px, 2 CPU ranks, 12 trials,
target top-1 0.97) runs twice in fresh folders, as a user would run it: with its own space
(the baseline), and with that space plus a training-resolution schedule (``res_start`` 16 or
24 px, ramped to 32 px by a searched share of the schedule, linear or in one step; its warm
start is the quickstart's, ramping from 24 px over the first half). Per study: the best TTA
found, the compute (summed trial elapsed seconds, setup included) until a trial first reached
the target, and the trials until then.

The noise-scale cap (``autotune.samplers.batch_cap``: once three trials that trained to the end
measured the gradient noise scale, proposals keep the global batch within 8 x the largest of
those): per study, the largest measured noise scale, the cap, and the reaching trials whose
global batch lies above it, which are the good configurations the cap would have cost.

Last line: ``res_best_tta_s=X base_best_tta_s=Y ratio=Y/X capped_good=N`` (medians over
seeds; ratio above 1: the schedule found a faster configuration).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
import yaml  # noqa: E402

from autotune import record  # noqa: E402
from autotune.samplers import batch_cap  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)

RESOLUTION_SPACE = '''
from autotune import Categorical, Fixed, Float, SearchSpace
from search_spaces.quickstart import space as quickstart


def space(world_size):
    base = quickstart(world_size)
    return SearchSpace(
        *base.items, Categorical("res_start", [16, 24]), Fixed("res_end", 32),
        Float("res_ramp_end", 0.2, 0.8), Categorical("res_mode", ["linear", "step"]),
        warm_starts=[{**w, "res_start": 24, "res_end": 32, "res_ramp_end": 0.5,
                      "res_mode": "linear"} for w in base.warm_starts],
        name="quickstart_res", world_size=world_size)
'''


def run(folder: Path, seed: int, n_trials: int, resolution: bool) -> dict:
    folder.mkdir(parents=True)
    study = yaml.safe_load((ROOT / "autotune" / "studies" / "quickstart.yaml").read_text())
    study.update({"study_name": "res" if resolution else "base", "seed": seed})
    study["budget"] = {**study["budget"], "n_trials": n_trials, "timeout_s": 1200}
    if resolution:
        (folder / "space.py").write_text(RESOLUTION_SPACE)
        study["search_space"] = "space.py"
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "autotune", "start", "study", "study.yaml"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the study in {folder} failed: {done.stderr[-2000:]}")
    trials = optuna.load_study(study_name=study["study_name"],
                               storage=f"sqlite:///{folder / 'autotune.db'}").trials
    finished = record.finished(trials)
    compute, to_first, first_at = 0.0, None, None
    for n, t in enumerate(finished, 1):
        compute += float(t.user_attrs.get(record.ELAPSED) or t.user_attrs.get("train_s") or 0)
        compute += float(t.user_attrs.get("setup_s") or 0)
        if to_first is None and t.user_attrs.get(record.OUTCOME) == "reached":
            to_first, first_at = compute, n
    reached = [t for t in finished if t.user_attrs.get(record.OUTCOME) == "reached"]
    noise = [float(t.user_attrs[record.NOISE_SCALE]) for t in finished
             if t.user_attrs.get(record.NOISE_SCALE)]
    cap = batch_cap(finished)
    batch = {t.number: int(t.user_attrs[record.PARAMS]["global_batch"]) for t in finished
             if record.PARAMS in t.user_attrs}
    capped = [t for t in reached if cap is not None and batch.get(t.number, 0) > cap]
    return {"best": min((t.value for t in reached), default=None), "to_first": to_first,
            "first_at": first_at, "noise": max(noise, default=None), "cap": cap,
            "capped": capped, "reached": len(reached), "trials": len(finished),
            "batches": sorted({batch[t.number] for t in reached if t.number in batch})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--n-trials", type=int, default=12)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"base": [], "res": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for kind in ("base", "res"):
                r = run(Path(tmp) / f"{kind}-{seed}", seed, args.n_trials, kind == "res")
                results[kind].append(r)
                cap = f"{r['cap']:.0f}" if r["cap"] else "none (fewer than 3 measured)"
                print(f"seed {seed} {kind:4s}: best TTA {r['best']} s, compute to first reach "
                      f"{r['to_first']} s (trial {r['first_at']}), reached {r['reached']} of "
                      f"{r['trials']} at batches {r['batches']}; largest noise scale "
                      f"{r['noise']}, cap {cap}, reaching trials above it "
                      f"{[t.number for t in r['capped']]}", flush=True)

    def median(kind: str, key: str) -> float:
        values = [r[key] for r in results[kind] if r[key] is not None]
        return statistics.median(values) if values else float("inf")

    for kind in ("base", "res"):
        print(f"{kind}: median best TTA {median(kind, 'best'):.2f} s, median compute to the "
              f"first reach {median(kind, 'to_first'):.1f} s")
    capped = sum(len(r["capped"]) for rs in results.values() for r in rs)
    res, base = median("res", "best"), median("base", "best")
    print(f"res_best_tta_s={res:.2f} base_best_tta_s={base:.2f} ratio={base / res:.3f} "
          f"capped_good={capped}")


if __name__ == "__main__":
    main()
