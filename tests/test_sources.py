"""Data sources: ImageFolder trees, synthetic images and the digits, sharded per rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainers.sources import open_source, train_size


def make_tree(root: Path, classes: int = 3, train: int = 8, val: int = 3, size: int = 40) -> Path:
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = (torch.rand(size, size, 3, generator=gen) * 255).to(torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / f"img_{i}.JPEG")
    return root


def test_imagefolder_tree_in_imagenet_layout(tmp_path):
    root = make_tree(tmp_path / "tree")
    spec = {"kind": "imagefolder", "path": str(root), "image_size": 32, "loader_workers": 0}
    assert train_size(spec) == 24
    source = open_source(spec, on_gpu=False)
    assert source.num_classes == 3 and source.val_len == 9
    x, y = next(source.train_batches(0, seed=1, rank=0, world=1, per_rank=24, micro=8))
    assert x.shape == (8, 3, 32, 32) and y.shape == (8,)
    xs = [x for x, _ in source.eval_batches(0, 1, 4)]
    assert sum(len(x) for x in xs) == 9 and xs[0].shape[-1] == 32


@pytest.mark.parametrize("kind", ["digits", "synthetic"])
def test_ranks_train_on_disjoint_shards_and_evaluate_every_image_once(kind):
    spec = {"kind": kind, "image_size": 16, "train_images": 100, "val_images": 37}
    source = open_source(spec, on_gpu=False)
    n, world = source.train_len, 3
    per_rank = n // world
    seen = []
    for rank in range(world):
        list(source.train_batches(4, seed=7, rank=rank, world=world, per_rank=per_rank, micro=5))
        seen.append(set(source.last_order.tolist()))
        assert len(seen[-1]) == per_rank
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])
    counted = sum(len(y) for r in range(world) for _, y in source.eval_batches(r, world, 8))
    assert counted == source.val_len


def test_a_resumed_epoch_skips_what_it_already_trained():
    source = open_source({"kind": "digits"}, on_gpu=False)
    full = list(source.train_batches(2, seed=3, rank=1, world=2, per_rank=640, micro=64))
    rest = list(source.train_batches(2, seed=3, rank=1, world=2, per_rank=640, micro=64, skip=4))
    assert len(rest) == len(full) - 4
    assert torch.equal(rest[0][1], full[4][1])


@pytest.mark.parametrize(("spec", "message"), [
    ({"kind": "imagefolder", "path": "/nonexistent"}, "missing train/"),
    ({"kind": "parquet"}, "unknown data kind 'parquet'"),
])
def test_bad_data_specs_say_what_is_expected(spec, message):
    with pytest.raises(ValueError, match=message):
        train_size(spec)
