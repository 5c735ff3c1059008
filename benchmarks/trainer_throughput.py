"""Trainer throughput: the DeepSpeed trainer against a plain PyTorch loop, and its data loader.

    python benchmarks/trainer_throughput.py [--model resnet50] [--size 32] [--batch 64]

1. The trainer (trainers/image_classifier.py under the deepspeed launcher, one rank, all
   cores, a fixed plan, synthetic data): images/s over its training windows after the first
   (warm), as it reports them.
2. A plain PyTorch loop written here: same model, batch, threads and precision (fp32 on CPUs),
   SGD with momentum, the same label-smoothed loss; warmed up, then timed.
3. The trainer's ImageFolder loader alone (default loader workers) over a tree of JPEGs this
   benchmark generates, at the same resolution.

Last line: trainer_img_s=X plain_img_s=Y ratio=X/Y loader_img_s=Z loader_ratio=Z/X
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from autotune.launch import run_plan  # noqa: E402
from autotune.plan import Hardware, resolve  # noqa: E402

THREADS = os.cpu_count() or 1


def trainer_rate(model: str, size: int, batch: int, windows: int, folder: Path) -> float:
    steps = 8
    data = {"kind": "synthetic", "image_size": size, "num_classes": 1000,
            "train_images": batch * steps * (windows + 1), "val_images": 8}
    plan = resolve({"global_batch": batch, "lr_per_256": 0.1, "epochs": 1},
                   trainer={"model": model, "num_classes": 1000, "data": data,
                            "eval_every_steps": steps, "eval_batch": 8},
                   train_size=data["train_images"],
                   hardware=Hardware(world_size=1, max_micro_batch=batch,
                                     threads_per_rank=THREADS),
                   target={"metric": "top1", "value": 1.0}, max_seconds=0)
    messages, process = run_plan(plan, folder, threads_per_rank=THREADS)
    rates = [m["images_per_s"] for m in messages if m["type"] == "eval"]
    if process.proc.returncode != 0 or len(rates) < 2:
        raise SystemExit(f"the trainer failed: {process.tail(20)}")
    return statistics.median(rates[1:])  # the first window includes warm-up


def plain_rate(model: str, size: int, batch: int, steps: int) -> float:
    import torchvision

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    net = getattr(torchvision.models, model)(num_classes=1000)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 1000, (batch,))
    net.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        loss.item()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - start)


def make_jpegs(root: Path, classes: int, per_class: int, size: int) -> None:
    """A small ImageNet-layout tree of smooth random JPEGs (train/ and val/)."""
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", per_class), ("val", 2)):
        for c in range(classes):
            folder = root / split / f"class{c:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                low = torch.rand(3, 8, 8, generator=gen)
                img = torch.nn.functional.interpolate(low[None], size=(size, size),
                                                      mode="bicubic")[0].clamp(0, 1)
                pixels = (img.permute(1, 2, 0) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"img{i:04d}.JPEG", quality=90)


def loader_rate(root: Path, size: int, batch: int) -> float:
    from trainers.sources import open_source

    source = open_source({"kind": "imagefolder", "path": str(root), "image_size": size}, False)
    n = source.train_len // batch * batch
    start = time.perf_counter()
    seen = 0
    for x, _ in source.train_batches(1, 0, 0, 1, n, batch):
        seen += len(x)
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=64, help="images per step")
    parser.add_argument("--windows", type=int, default=4, help="timed trainer windows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        trainer = trainer_rate(args.model, args.size, args.batch, args.windows, folder)
        print(f"trainer: {trainer:.1f} img/s ({args.model}, {args.size}px, batch {args.batch}, "
              f"1 rank, {THREADS} threads, fp32)", flush=True)
        plain = plain_rate(args.model, args.size, args.batch, steps=8 * args.windows)
        print(f"plain PyTorch loop: {plain:.1f} img/s (same model, batch, threads, precision)",
              flush=True)
        make_jpegs(folder / "jpegs", classes=10, per_class=100, size=160)
        loader = loader_rate(folder / "jpegs", args.size, args.batch)
        print(f"ImageFolder loader alone: {loader:.1f} img/s (1,000 JPEGs of 160px, "
              f"random-resized-crop to {args.size}px, default workers)", flush=True)
    print(f"trainer_img_s={trainer:.1f} plain_img_s={plain:.1f} ratio={trainer / plain:.3f} "
          f"loader_img_s={loader:.1f} loader_ratio={loader / trainer:.2f}")


if __name__ == "__main__":
    main()
