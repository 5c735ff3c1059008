"""Reading a newcomer's photos: images per second through the ImageFolder source's loader.

    python benchmarks/photo_decode.py [--data DIR] [--images 48] [--size 224] [--augment none]

Draws ``--images`` camera-sized JPEGs (4,000 x 3,000, smooth shapes and sensor noise, quality
90) unless ``--data`` names an ImageFolder tree, and times what a training rank's loader does
with each (decode, the plan's augmentation, to a tensor at ``--size`` pixels), in this process
(no loader processes, so the figure is one core's):

- autotune: the source as it ships, which decodes a JPEG at the reduced scale (1/2 to 1/8) that
  keeps at least 2 x the size (4 x for ``imagenet``'s random-resized crops);
- baseline: the same transform on the full decode, as torchvision's ImageFolder loads images.

Each is timed over every image twice, alternating, and the faster pass kept. Last line:
``autotune_images_per_s=X baseline_images_per_s=Y ratio=X/Y``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainers.augment import image_transform  # noqa: E402
from trainers.sources import _Folder, _Sized, read_layout  # noqa: E402


def draw_photos(root: Path, n: int) -> None:
    """``n`` camera-sized JPEGs in two class folders, split 1 in 8 for validation."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    h, w = 3000, 4000
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    for i in range(n):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(300, 1500)
        disc = ((xx - cx) ** 2 + (yy - cy) ** 2 < r * r)[..., None]
        base = np.stack([xx / w, yy / h, (xx + yy) / (w + h)], -1) * rng.uniform(80, 200, 3)
        pixels = base + disc * rng.uniform(-60, 60, 3) + rng.normal(0, 6, (h, w, 3))
        folder = root / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"IMG_{i:04d}.jpg",
                                                                  quality=90)


def images_per_s(dataset: _Sized, indices: list[int], size: int) -> float:
    start = time.perf_counter()
    for i in indices:
        image, _, problem = dataset[(i, size)]
        if problem is not None:
            raise SystemExit(f"{problem[0]}: {problem[1]}")
    return len(indices) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, help="an ImageFolder tree of your own (default: draw)")
    p.add_argument("--images", type=int, default=48)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--augment", default="none")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            root = Path(tmp) / "photos"
            t = time.perf_counter()
            draw_photos(root, args.images)
            print(f"drew {args.images} 4000x3000 JPEGs in {time.perf_counter() - t:.0f} s")
        spec = {"kind": "imagefolder", "path": str(root)}
        if not (root / "train").is_dir():
            spec["val_split"] = 0.125
        folder = read_layout(spec)
        train = _Folder(folder.train, folder.classes)
        indices = list(range(len(train)))[:args.images]
        transform = partial(image_transform, args.augment)
        margin = 4.0 if args.augment == "imagenet" else 2.0
        shipped = _Sized(train, transform, replace=True, margin=margin)
        full = _Sized(train, transform, replace=True, margin=0.0)
        best = {"autotune": 0.0, "baseline": 0.0}
        for _ in range(2):
            best["autotune"] = max(best["autotune"], images_per_s(shipped, indices, args.size))
            best["baseline"] = max(best["baseline"], images_per_s(full, indices, args.size))
        print(f"{len(indices)} images from {root}, augment {args.augment}, {args.size} px, "
              "one core")
        print(f"autotune (reduced-scale JPEG decode): {best['autotune']:.1f} images/s")
        print(f"baseline (full decode, torchvision's loader): {best['baseline']:.1f} images/s")
        print(f"autotune_images_per_s={best['autotune']:.2f} "
              f"baseline_images_per_s={best['baseline']:.2f} "
              f"ratio={best['autotune'] / best['baseline']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
