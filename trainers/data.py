"""Data sources for the trainers: scikit-learn's bundled digits, sharded per rank.

The digits (1,797 8x8 images, 10 classes) are split once, with a fixed seed, into 1,437
training and 360 validation images, upsampled to the plan's resolution and kept in memory.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["DIGITS_TRAIN", "DIGITS_VAL", "Split", "cache_root", "load", "epoch_shard",
           "eval_shard",
           "batches"]

DIGITS_TRAIN = 1437
DIGITS_VAL = 360
_SPLIT_SEED = 0


class Split:
    """Images (N, 3, H, W) float32 and labels (N,) int64, in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def cache_root() -> Path:
    """autotune's cache folder: ``AUTOTUNE_CACHE_DIR``, else ``~/.cache/autotune``."""
    return Path(os.environ.get("AUTOTUNE_CACHE_DIR") or Path.home() / ".cache" / "autotune"
                ).expanduser()


def _cache_path() -> Path:
    return cache_root() / f"digits-split{_SPLIT_SEED}.pt"


def _digits_split() -> tuple[Any, Any, Any, Any]:
    """The digits split once into training and validation arrays.

    Importing scikit-learn costs every rank of every trial most of a second, so the split is
    kept in a small cache file after the first load (written whole, then renamed)."""
    cache = _cache_path()
    try:
        saved = torch.load(cache, weights_only=True)
        return saved["x_train"], saved["x_val"], saved["y_train"], saved["y_val"]
    except (OSError, KeyError, RuntimeError, EOFError, pickle.UnpicklingError):
        pass
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x_train, x_val, y_train, y_val = (torch.tensor(a) for a in train_test_split(
        bunch.images, bunch.target, test_size=DIGITS_VAL, random_state=_SPLIT_SEED,
        stratify=bunch.target))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.partial")
        torch.save({"x_train": x_train, "x_val": x_val, "y_train": y_train, "y_val": y_val},
                   partial)
        partial.replace(cache)
    except OSError:
        pass  # no cache where the home folder is read-only: load from scikit-learn each time
    return x_train, x_val, y_train, y_val


def _digits(image_size: int) -> tuple[Split, Split]:
    x_train, x_val, y_train, y_val = _digits_split()

    def to_split(images: Any, labels: Any) -> Split:
        x = images.to(torch.float32).unsqueeze(1) / 16.0
        x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bilinear",
                                            align_corners=False)
        x = (x - 0.3) / 0.4
        return Split(x.expand(-1, 3, -1, -1).contiguous(), labels.long())

    return to_split(x_train, y_train), to_split(x_val, y_val)


def load(spec: dict[str, Any]) -> tuple[Split, Split]:
    """The (train, validation) splits that ``spec`` names."""
    kind = spec.get("kind", "digits")
    if kind == "digits":
        return _digits(int(spec.get("image_size", 32)))
    raise ValueError(f"unknown data kind {kind!r}; allowed: digits")


def epoch_shard(n: int, epoch: int, seed: int, rank: int, world: int,
                per_rank: int) -> torch.Tensor:
    """This rank's sample indices for ``epoch``: a disjoint slice of one shared permutation.

    Every rank draws the same permutation (same seed and epoch), takes every ``world``-th index
    from its rank on, and keeps the first ``per_rank`` of them, so ranks never share a sample.
    """
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n, generator=generator)
    return order[rank::world][:per_rank]


def eval_shard(n: int, rank: int, world: int) -> torch.Tensor:
    """This rank's validation indices: every sample exactly once across the ranks."""
    return torch.arange(rank, n, world)


def batches(indices: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
    """Consecutive slices of ``indices`` of ``size`` (the last may be shorter)."""
    for start in range(0, len(indices), size):
        yield indices[start:start + size]
