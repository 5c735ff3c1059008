#!/usr/bin/env bash
# GPU check: ResNet-50 at 224x224, bf16 autocast, channels_last, synthetic data, on one GPU,
# through the real trainer under the deepspeed launcher. Tries a few micro-batches, keeps the
# best; prints images/s and TFLOP/s (24.6 GFLOP per training image). At most ~5 minutes.
#   bash benchmarks/gpu_check.sh [micro-batches...]      (default: 128 192 256)
set -euo pipefail
cd "$(dirname "$0")/.."
python - "$@" <<'PY'
import statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, ".")
import torch
from autotune.launch import run_plan
from autotune.plan import Hardware, resolve

if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA GPU here")
batches = [int(b) for b in sys.argv[1:]] or [128, 192, 256]
results = {}
for batch in batches:
    steps, windows = 20, 4
    data = {"kind": "synthetic", "image_size": 224, "num_classes": 1000,
            "train_images": batch * steps * (windows + 1), "val_images": 256}
    plan = resolve({"global_batch": batch, "lr_per_256": 0.1, "epochs": 1},
                   trainer={"model": "resnet50", "num_classes": 1000, "data": data,
                            "eval_every_steps": steps, "eval_batch": 256},
                   train_size=data["train_images"],
                   hardware=Hardware(world_size=1, device="cuda", max_micro_batch=batch),
                   target={"metric": "top1", "value": 1.0}, max_seconds=0)
    messages, proc = run_plan(plan, Path(tempfile.mkdtemp()), device="cuda",
                              threads_per_rank=8, timeout_s=240)
    rates = [m["images_per_s"] for m in messages if m["type"] == "eval"]
    end = next((m for m in messages if m["type"] == "end"), {})
    if end.get("reason") == "oom" or len(rates) < 2:
        print(f"micro-batch {batch}: {end.get('reason', 'failed')} ({proc.tail(3)})", flush=True)
        continue
    results[batch] = statistics.median(rates[1:])
    print(f"micro-batch {batch}: {results[batch]:.0f} img/s", flush=True)
if not results:
    sys.exit("gpu_check: no micro-batch ran")
best = max(results, key=results.get)
rate = results[best]
print(f"gpu={torch.cuda.get_device_name(0)} best_micro_batch={best} img_s={rate:.0f} "
      f"tflop_s={rate * 24.6e9 / 1e12:.1f}")
PY
