"""Trainer throughput: the DeepSpeed trainer against a plain PyTorch loop, and its data loader.

    python benchmarks/trainer_throughput.py [--model resnet50] [--size 32] [--batch 64]
                                            [--ranks 2]

1. The trainer (trainers/image_classifier.py under the deepspeed launcher, one rank with all
   cores, or ``--ranks N`` ranks sharing them over gloo, a fixed plan, synthetic data):
   images/s over each training window, as it reports them at its evaluations. With two ranks
   or more it also measures the gradient noise scale (fp32), and reports what that cost it
   (``noise_cost_s``): its overhead is inside the ratio below.
2. A plain PyTorch loop written here: same model, global batch, threads and precision (fp32 on
   CPUs), SGD with momentum and the same loss; with ``--ranks N``, N processes under plain
   ``DistributedDataParallel`` over gloo, each with its share of the batch and of the cores
   (no noise scale); with several ranks also the same loop all-reducing once after backward,
   as DeepSpeed's stage 0 does (``ratio_after``), which tells DeepSpeed's form from the
   trainer's own costs. Warmed up, then timed. It runs interleaved with the
   trainer: at each evaluation the trainer waits, idle, for the benchmark's reply, and the
   benchmark times one plain window before replying. Each trainer window after the first
   (warm-up) is compared with the mean of the plain windows on either side of it, so the
   machine's drift (this one's speed moves by a fifth within minutes) cancels; the ratio is
   the median over windows.
3. The trainer's ImageFolder loader alone (default loader workers) over a tree of JPEGs this
   benchmark generates, at the same resolution.

Last line: trainer_img_s=X plain_img_s=Y ratio=X/Y [ratio_after=A noise_share=S] loader_img_s=Z
loader_ratio=Z/X
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from autotune.plan import Hardware, resolve  # noqa: E402
from autotune.ranks import keep_going, run_plan  # noqa: E402

THREADS = os.cpu_count() or 1


class PlainLoop:
    """The baseline: the same model, batch, threads and precision in a plain PyTorch loop."""

    def __init__(self, model: str, size: int, batch: int) -> None:
        import torchvision

        torch.set_num_threads(THREADS)
        torch.manual_seed(0)
        self.net = getattr(torchvision.models, model)(num_classes=1000)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9,
                                   weight_decay=5e-5)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.x = torch.randn(batch, 3, size, size)
        self.y = torch.randint(0, 1000, (batch,))
        self.batch = batch
        self.warm = False
        self.net.train()

    def _step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.net(self.x), self.y)
        loss.backward()
        self.opt.step()
        loss.item()

    def window(self, steps: int) -> float:
        """Images/s over ``steps`` steps (after three warm-up steps, the first time)."""
        if not self.warm:
            for _ in range(3):
                self._step()
            self.warm = True
        start = time.perf_counter()
        for _ in range(steps):
            self._step()
        return self.batch * steps / (time.perf_counter() - start)


def _ddp_rank(rank: int, world: int, port: int, model: str, size: int, batch: int,
              threads: int, pipe: Any) -> None:
    """One rank of the plain DDP baseline: runs a timed window each time it is asked."""
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    net = DistributedDataParallel(getattr(torchvision.models, model)(num_classes=1000))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = torch.randn(batch // world, 3, size, size), torch.randint(0, 1000, (batch // world,))
    net.train()

    grads: list[torch.Tensor] = []

    def step(after: bool) -> None:
        opt.zero_grad(set_to_none=True)
        if not after:     # DDP's own: buckets all-reduced while backward goes on
            loss = loss_fn(net(x), y)
            loss.backward()
        else:             # one flat all-reduce after backward, as DeepSpeed's stage 0 does
            with net.no_sync():
                loss = loss_fn(net(x), y)
                loss.backward()
            grads[:] = [q.grad for q in net.module.parameters() if q.grad is not None]
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat /= world
            for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads),
                                  strict=True):
                g.copy_(reduced)
        opt.step()
        loss.item()

    for _ in range(3):
        step(False)
    pipe.send("ready")
    while (asked := pipe.recv()) is not None:
        steps, after = asked
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step(after)
        dist.barrier()
        pipe.send(time.perf_counter() - start)
    dist.destroy_process_group()


class PlainDDP:
    """The baseline for N ranks: N processes under plain DistributedDataParallel (gloo), each
    with its share of the batch and the cores, idle between windows."""

    def __init__(self, model: str, size: int, batch: int, world: int) -> None:
        import multiprocessing as mp

        from tests._services import free_port

        ctx = mp.get_context("spawn")
        port, self.batch, self.pipes, self.procs = free_port(), batch, [], []
        for rank in range(world):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_ddp_rank, daemon=True,
                               args=(rank, world, port, model, size, batch,
                                     max(THREADS // world, 1), theirs))
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)
        for pipe in self.pipes:
            if pipe.recv() != "ready":
                raise SystemExit("the plain DDP baseline failed to start")

    def window(self, steps: int, after: bool = False) -> float:
        """Images/s over ``steps`` steps; ``after``: all-reduce after backward, not during."""
        for pipe in self.pipes:
            pipe.send((steps, after))
        return self.batch * steps / max(pipe.recv() for pipe in self.pipes)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for proc in self.procs:
            proc.join(30)


def interleaved(model: str, size: int, batch: int, windows: int, steps: int,
                folder: Path, world: int = 1
                ) -> tuple[list[float], list[float], list[float], float]:
    """(trainer, plain, plain with the all-reduce after backward) images/s per window (trainer
    window k runs before plain window k; the third list is empty for one rank), and the share
    of the trainer's training time its noise-scale measurements took."""
    plain = PlainLoop(model, size, batch) if world == 1 else PlainDDP(model, size, batch, world)
    data = {"kind": "synthetic", "image_size": size, "num_classes": 1000,
            "train_images": batch * steps * windows, "val_images": 8 * world}
    threads = max(THREADS // world, 1)
    plan = resolve({"global_batch": batch, "lr_per_256": 0.1, "epochs": 1},
                   trainer={"model": model, "num_classes": 1000, "data": data,
                            "eval_every_steps": steps, "eval_batch": 8},
                   train_size=data["train_images"],
                   hardware=Hardware(world_size=world, max_micro_batch=batch // world,
                                     threads_per_rank=threads),
                   target={"metric": "top1", "value": 1.0}, max_seconds=0)
    trainer_rates: list[float] = []
    plain_rates: list[float] = []
    after_rates: list[float] = []

    def answer(message: dict[str, Any]) -> dict[str, Any]:
        if message.get("type") == "eval":   # the trainer waits, idle, for this reply
            trainer_rates.append(float(message["images_per_s"]))
            plain_rates.append(plain.window(steps))
            if isinstance(plain, PlainDDP):
                after_rates.append(plain.window(steps, after=True))
        return keep_going(message)

    try:
        messages, process = run_plan(plan, folder, answer=answer, threads_per_rank=threads)
    finally:
        if isinstance(plain, PlainDDP):
            plain.close()
    if process.returncode != 0 or len(trainer_rates) < 2:
        raise SystemExit(f"the trainer failed: {process.tail(20)}")
    end = next(m for m in messages if m.get("type") == "end")
    if world > 1 and "noise_cost_s" not in end:
        raise SystemExit("the trainer measured no gradient noise scale on several ranks")
    share = float(end.get("noise_cost_s", 0.0)) / max(float(end["train_s"]), 1e-9)
    return trainer_rates, plain_rates, after_rates, share


def paired(trainer: list[float], plain: list[float]) -> tuple[float, float, float]:
    """Median trainer and bracketing-plain images/s over the windows after the first, and
    the median of their per-window ratios."""
    pairs = [(trainer[k], (plain[k - 1] + plain[k]) / 2) for k in range(1, len(trainer))]
    return (statistics.median(t for t, _ in pairs), statistics.median(p for _, p in pairs),
            statistics.median(t / p for t, p in pairs))


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
    parser.add_argument("--windows", type=int, default=5, help="timed windows (after one "
                        "warm-up window)")
    parser.add_argument("--steps", type=int, default=8, help="steps per window")
    parser.add_argument("--ranks", type=int, default=1, help="trainer ranks (and plain DDP "
                        "processes) sharing the cores; 2 or more measures the noise scale")
    args = parser.parse_args()
    if args.ranks < 1 or args.batch % args.ranks:
        parser.error(f"--ranks must be 1 or more and divide --batch {args.batch}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        trainer_rates, plain_rates, after_rates, noise_share = interleaved(
            args.model, args.size, args.batch, args.windows + 1, args.steps, folder, args.ranks)
        trainer, plain, ratio = paired(trainer_rates, plain_rates)
        shown = zip(trainer_rates, plain_rates, strict=True)
        print("windows (trainer / plain img/s): "
              + ", ".join(f"{t:.1f}/{p:.1f}" for t, p in shown), flush=True)
        ranks = f"{args.ranks} rank(s) of {max(THREADS // args.ranks, 1)} thread(s)"
        baseline = "plain PyTorch loop" if args.ranks == 1 else "plain DDP loop (gloo)"
        print(f"trainer: {trainer:.1f} img/s ({args.model}, {args.size}px, batch {args.batch}, "
              f"{ranks}, fp32); {baseline}: {plain:.1f} img/s (same model, batch, ranks, "
              "threads, precision)", flush=True)
        extra = ""
        if args.ranks > 1:
            _, after, after_ratio = paired(trainer_rates, after_rates)
            print(f"plain DDP loop with one all-reduce after backward (DeepSpeed's stage-0 "
                  f"form): {after:.1f} img/s, trainer ratio {after_ratio:.3f}", flush=True)
            print(f"gradient noise scale measured in the trainer: {100 * noise_share:.2f}% of "
                  "its training time (its own accounting)", flush=True)
            extra = f" ratio_after={after_ratio:.3f} noise_share={noise_share:.4f}"
        make_jpegs(folder / "jpegs", classes=10, per_class=100, size=160)
        loader = loader_rate(folder / "jpegs", args.size, args.batch)
        print(f"ImageFolder loader alone: {loader:.1f} img/s (1,000 JPEGs of 160px, "
              f"random-resized-crop to {args.size}px, default workers)", flush=True)
    print(f"trainer_img_s={trainer:.1f} plain_img_s={plain:.1f} ratio={ratio:.3f}{extra} "
          f"loader_img_s={loader:.1f} loader_ratio={loader / trainer:.2f}")


if __name__ == "__main__":
    main()
