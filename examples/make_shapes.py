"""Draw a shapes data set as an ImageFolder tree in ImageNet's layout, to try autotune on
images nobody tuned it for:

    python examples/make_shapes.py shapes-data            # 10,000 train + 2,000 val images
    autotune start study examples/shapes.yaml

Eight classes of filled shapes (circle, square, triangle, star, cross, ring, crescent, bar),
each image one shape of random size, place, rotation and colour on a
background of another colour with noise, saved as PNG under ``ROOT/train/<class>/`` and
``ROOT/val/<class>/``. The same seed draws the same images.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle", "star", "cross", "ring", "crescent", "bar")


def _polygon(cx: float, cy: float, r: float, sides: int, turn: float) -> list[tuple[float, float]]:
    return [(cx + r * math.cos(turn + 2 * math.pi * k / sides),
             cy + r * math.sin(turn + 2 * math.pi * k / sides)) for k in range(sides)]


def _star(cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    points = []
    for k in range(10):
        radius = r if k % 2 == 0 else r * 0.45
        angle = turn + math.pi * k / 5
        points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    return points


def _color(rng: random.Random) -> tuple[int, int, int]:
    return (rng.randrange(256), rng.randrange(256), rng.randrange(256))


def _distinct(rng: random.Random, other: tuple[int, int, int]) -> tuple[int, int, int]:
    while True:
        color = _color(rng)
        if sum(abs(a - b) for a, b in zip(color, other, strict=True)) > 200:
            return color


def draw(shape: str, size: int, rng: random.Random) -> Image.Image:
    """One image of ``shape``, ``size`` pixels square."""
    scale = 4   # drawn larger, then reduced: smooth edges
    side = size * scale
    background = _color(rng)
    fill = _distinct(rng, background)
    image = Image.new("RGB", (side, side), background)
    pen = ImageDraw.Draw(image)
    r = side * rng.uniform(0.25, 0.45)
    cx = rng.uniform(r, side - r)
    cy = rng.uniform(r, side - r)
    turn = rng.uniform(0, 2 * math.pi)
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape in ("square", "triangle"):
        pen.polygon(_polygon(cx, cy, r, 4 if shape == "square" else 3, turn), fill=fill)
    elif shape == "bar":      # a long thin rectangle
        dx, dy, w = math.cos(turn), math.sin(turn), r * 0.22
        pen.polygon([(cx + r * dx - w * dy, cy + r * dy + w * dx),
                     (cx + r * dx + w * dy, cy + r * dy - w * dx),
                     (cx - r * dx + w * dy, cy - r * dy - w * dx),
                     (cx - r * dx - w * dy, cy - r * dy + w * dx)], fill=fill)
    elif shape == "star":
        pen.polygon(_star(cx, cy, r, turn), fill=fill)
    elif shape == "cross":
        w = r * 0.35
        for angle in (turn, turn + math.pi / 2):
            dx, dy = math.cos(angle), math.sin(angle)
            pen.polygon([(cx + r * dx - w * dy, cy + r * dy + w * dx),
                         (cx + r * dx + w * dy, cy + r * dy - w * dx),
                         (cx - r * dx + w * dy, cy - r * dy - w * dx),
                         (cx - r * dx - w * dy, cy - r * dy + w * dx)], fill=fill)
    elif shape == "ring":
        pen.ellipse(box, fill=fill)
        inner = r * 0.55
        pen.ellipse((cx - inner, cy - inner, cx + inner, cy + inner), fill=background)
    elif shape == "crescent":
        pen.ellipse(box, fill=fill)
        shift = r * 0.55
        ox, oy = cx + shift * math.cos(turn), cy + shift * math.sin(turn)
        pen.ellipse((ox - r, oy - r, ox + r, oy + r), fill=background)
    else:
        raise ValueError(f"unknown shape {shape!r}; allowed: {', '.join(CLASSES)}")
    image = image.resize((size, size), Image.Resampling.LANCZOS)
    noise = Image.effect_noise((size, size), rng.uniform(5, 30)).convert("RGB")
    return Image.blend(image, noise, 0.1)


def make(root: Path, train: int = 10_000, val: int = 2_000, size: int = 32,
         seed: int = 0) -> Path:
    """Writes the tree under ``root`` (``train`` and ``val`` images over the classes) and
    returns ``root``."""
    rng = random.Random(seed)
    for part, count in (("train", train), ("val", val)):
        for c in CLASSES:
            (root / part / c).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            shape = CLASSES[i % len(CLASSES)]
            draw(shape, size, rng).save(root / part / shape / f"{i:06d}.png")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder to write train/ and val/ into")
    parser.add_argument("--train", type=int, default=10_000, help="training images")
    parser.add_argument("--val", type=int, default=2_000, help="validation images")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if min(args.train, args.val) < len(CLASSES) or not 8 <= args.size <= 1024:
        parser.error(f"--train and --val must be at least {len(CLASSES)} (one per class) and "
                     "--size within 8-1024")
    make(args.root, args.train, args.val, args.size, args.seed)
    print(f"{args.train} training and {args.val} validation images of {len(CLASSES)} shapes "
          f"in {args.root}")


if __name__ == "__main__":
    main()
