"""Memory probe: the largest micro-batch per device that trains a step within memory.

    python trainers/probe.py --model resnet50 --image-size 224 --start 256 --device cuda

Tries one training step (forward, backward, optimizer step, at the trainer's precision and
memory format) at 2, 4, 8, ... images up to ``--start``, until one does not fit, and prints
one JSON line:
``{"micro_batch": N, "peak_bytes": B, "budget_bytes": L, "tried": [[N, B or null], ...]}``.
A step fits when its peak memory stays within the budget: 90% of the GPU's memory (an
out-of-memory error does not fit either), or on CPUs the process's resident memory within
half of the memory available now, shared by ``--ranks`` ranks; ``--budget-bytes`` sets it
instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from typing import Any

import torch


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class _PeakRss:
    """The process's largest resident memory while the block runs, sampled every ms."""

    def __enter__(self) -> _PeakRss:
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def step_peak(model: Any, micro: int, size: int, classes: int, device: torch.device,
              bf16: bool) -> int | None:
    """Peak bytes during one training step of ``micro`` images (on GPUs: allocated by torch;
    on CPUs: the process's resident memory); None if out of memory."""
    on_gpu = device.type == "cuda"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(micro, 3, size, size, device=device)
    y = torch.randint(0, classes, (micro,), device=device)
    if on_gpu:
        x = x.contiguous(memory_format=torch.channels_last)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu and bf16
                    else torch.autocast("cpu", enabled=False))
        with _PeakRss() as watched:
            with autocast:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if on_gpu:
            torch.cuda.synchronize(device)
            return int(torch.cuda.max_memory_allocated(device))
        return watched.peak
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if "out of memory" not in str(e).lower() and not isinstance(e, torch.OutOfMemoryError):
            raise
        return None
    finally:
        del x, y, optimizer
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()


def probe(model_name: str, classes: int, size: int, start: int, device_name: str,
          precision: str, ranks: int, budget: int | None) -> dict[str, Any]:
    import psutil
    import torchvision

    device = torch.device(device_name)
    model = getattr(torchvision.models, model_name)(num_classes=classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
        limit = budget or int(0.9 * torch.cuda.get_device_properties(device).total_memory)
    else:
        limit = budget or int(0.5 * psutil.virtual_memory().available / max(ranks, 1))
    model.train()
    sizes = [1 << i for i in range(1, max(int(start), 2).bit_length()) if 1 << i < start]
    tried: list[list[Any]] = []
    best: dict[str, Any] = {"micro_batch": 0, "peak_bytes": None}
    for micro in [*sizes, max(int(start), 2)]:  # BatchNorm needs 2 images to train
        peak = step_peak(model, micro, size, classes, device, precision == "bf16")
        tried.append([micro, peak])
        if peak is None or peak > limit:
            break
        best = {"micro_batch": micro, "peak_bytes": peak}
    return {**best, "budget_bytes": limit, "tried": tried}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--start", type=int, required=True, help="the largest micro-batch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--ranks", type=int, default=1, help="ranks sharing this memory")
    parser.add_argument("--budget-bytes", type=int, default=None)
    args = parser.parse_args(argv)
    result = probe(args.model, args.num_classes, args.image_size, args.start, args.device,
                   args.precision, args.ranks, args.budget_bytes)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
