"""Write a synthetic fine-tuning table in opda's DeBERTa layout, to replay tuners on the kind
of study where the top configurations differ by less than an evaluation's own noise:

    python benchmarks/finetune_table.py /tmp/finetune.jsonl
    python benchmarks/search_efficiency.py compare --table opda:/tmp/finetune.jsonl \\
        --target 0.88 --methods autotune,random,asha_wallclock

The curves are drawn, not recorded: a model of a pretrained transformer fine-tuned on a
3-class entailment task (393k training examples), its shape set by eye to the first runs of
opda's DeBERTa-base random search (Lourie et al., arXiv 2311.09480), whose search it repeats:
1-4 epochs, batch 16-64, LR 1e-6 - 1e-3 (log), warm-up over 0-60% of the first epoch, dropout
0-0.3; linear warm-up, then linear decay to 0. Accuracy rises with the learning done (LR x
examples) from chance to about 0.84, then by a log-linear tail up to a ceiling of 0.887,
which a high LR per example lowers for good (and dips while the LR is high); an LR past a
threshold drawn per run (1.5e-4 - 3e-4) collapses the model to predicting one class (the
class shares, as opda's diverged runs show); each evaluation carries binomial-like noise
(sd 0.0025) and each run a seed offset (sd 0.002). Evaluations every 1,000 steps, at each
epoch's end and at the last step, on a matched and a mismatched set; no clock is recorded, so
a replay counts compute in training examples. Figures from it are about this model, not about
any recorded study: BENCHMARKS.md says so where it reports them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRAIN = 392_702                     # training examples (MultiNLI's size)
SHARES = (0.3182, 0.3274, 0.3545)   # the accuracy of a model that answers one class
CEILING, KNEE, KNEE_Q, TAIL = 0.887, 0.84, 0.15, 0.0124
DIP = 16_000                        # accuracy lost per unit of LR / batch while it is that high
STEP = 50                           # steps integrated at a time


def _lr(peak: float, step: int, warm: int, total: int) -> float:
    if step < warm:
        return peak * step / warm
    return peak * max(0.0, (total - step) / max(total - warm, 1))


def run(rng: random.Random, iteration: int) -> dict[str, Any]:
    """One configuration of the random search and its two learning curves."""
    epochs, batch = rng.randint(1, 4), rng.randint(16, 64)
    peak, warm_share, dropout = 10 ** rng.uniform(-6, -3), rng.uniform(0, 0.6), rng.uniform(0, 0.3)
    per_epoch = math.ceil(TRAIN / batch)
    total, warm = epochs * per_epoch, int(warm_share * per_epoch)
    collapse_at = 10 ** rng.uniform(math.log10(1.5e-4), math.log10(3e-4))
    offset = rng.gauss(0, 0.002)
    steps = sorted({*range(1000, total, 1000), *(per_epoch * e for e in range(1, epochs)), total})
    learned, damage, done, collapsed = 0.0, 0.0, 0, False
    matched: list[list[float]] = []
    mismatched: list[list[float]] = []
    for step in steps:
        for t in range(done, step, STEP):
            lr = _lr(peak, t, warm, total)
            learned += lr * batch * min(STEP, step - t)
            damage = max(damage, DIP * 0.45 * lr / batch)
            collapsed = collapsed or lr > collapse_at
        done = step
        if collapsed:
            share = rng.choice(SHARES)
            matched.append([step, share])
            mismatched.append([step, share + 0.001])
            continue
        q = max(learned, 1e-9)
        if q < KNEE_Q:
            rise = (1 - math.exp(-(q / 0.06) ** 1.6)) / (1 - math.exp(-(KNEE_Q / 0.06) ** 1.6))
            base = 0.33 + (KNEE - 0.33) * rise
        else:
            base = KNEE + TAIL * math.log(q / KNEE_Q)
        accuracy = (min(base, CEILING - damage) - DIP * _lr(peak, step, warm, total) / batch
                    - 0.01 * (dropout - 0.15) ** 2 + offset + rng.gauss(0, 0.0025))
        accuracy = min(max(accuracy, 0.3), 0.95)
        matched.append([step, accuracy])
        mismatched.append([step, min(accuracy + rng.gauss(0, 0.003), 0.95)])
    return {"iteration": iteration, "num_train_epochs": epochs, "train_batch_size": batch,
            "total_model_steps": total, "learning_rate": peak, "warmup_steps": warm,
            "cls_drop_out": dropout,
            "learning_curves": {"matched": matched, "mismatched": mismatched}}


def main(draw: Callable[[random.Random, int], dict[str, Any]] = run,
         doc: str | None = __doc__, what: str = "synthetic fine-tuning runs",
         runs: int = 1024) -> None:
    """Writes ``--runs`` runs that ``draw`` makes (one random stream, ``--seed``) to the file
    given, whole or not at all."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the JSON-lines file to write")
    parser.add_argument("--runs", type=int, default=runs, help=f"configurations (default {runs})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.runs < 2:
        parser.error(f"--runs must be at least 2, got {args.runs}")
    try:
        if args.out.is_dir():
            parser.error(f"{args.out} is a folder; give the path of the JSON-lines file to write")
        if not args.out.parent.is_dir():
            parser.error(f"no folder {args.out.parent} to write {args.out.name} in; create it "
                         "first")
    except OSError as e:                        # a name too long, a folder it may not read
        parser.error(f"cannot write {args.out}: {e.strerror or e}")
    rng = random.Random(args.seed)
    partial = args.out.with_name(args.out.name + ".partial")
    try:
        with partial.open("w") as f:
            for i in range(1, args.runs + 1):
                f.write(json.dumps(draw(rng, i)) + "\n")
        partial.replace(args.out)
    except (KeyboardInterrupt, OSError) as e:   # nothing half-written is left behind
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else \
            f"cannot write it: {e.strerror or e}"
        parser.exit(130 if isinstance(e, KeyboardInterrupt) else 1,
                    f"{parser.prog}: {args.out} not written: {why}\n")
    print(f"{args.out}: {args.runs} {what} (seed {args.seed})")


if __name__ == "__main__":
    main()
