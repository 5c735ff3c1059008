"""Data sources: ImageFolder trees, synthetic images and the digits, sharded per rank."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch

from trainers.sources import check_images, open_source, train_size, unreadable_allowed


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
    ({"kind": "imagefolder", "path": "/nonexistent"}, "/nonexistent does not exist"),
    ({"kind": "parquet"}, "unknown data kind 'parquet'"),
])
def test_bad_data_specs_say_what_is_expected(spec, message):
    with pytest.raises(ValueError, match=message):
        train_size(spec)


def _worker_pids(source, part: str) -> set[int]:
    _, loader, _ = source._loaders[part]
    return {w.pid for w in loader._iterator._workers}


def test_imagefolder_loader_processes_outlive_epochs_and_evaluations(tmp_path):
    root = make_tree(tmp_path / "tree", train=10, val=4)
    source = open_source({"kind": "imagefolder", "path": str(root), "image_size": 16,
                          "loader_workers": 1}, on_gpu=False)
    try:
        labels = []
        for epoch in range(2):
            labels.append([y for _, y in source.train_batches(epoch, 0, 0, 1, 30, 6,
                                                              augment="crop_flip")])
            evaluated = sum(len(y) for _, y in source.eval_batches(0, 1, 5, "crop_flip"))
            assert evaluated == 12
            if epoch == 0:
                train_pids, val_pids = _worker_pids(source, "train"), _worker_pids(source, "val")
        assert _worker_pids(source, "train") == train_pids          # the same processes
        assert _worker_pids(source, "val") == val_pids
        assert not torch.equal(torch.cat(labels[0]), torch.cat(labels[1]))  # a new order
        # An epoch cut short (a stopped trial) leaves the next one whole.
        partial = source.train_batches(2, 0, 0, 1, 30, 6, augment="crop_flip")
        next(partial)
        assert sum(len(y) for _, y in source.train_batches(3, 0, 0, 1, 30, 6,
                                                          augment="crop_flip")) == 30
        # Another augmentation is another transform: a new loader.
        x, _ = next(source.train_batches(0, 0, 0, 1, 30, 6, augment="none"))
        assert x.shape == (6, 3, 16, 16) and _worker_pids(source, "train") != train_pids
    finally:
        source.close()


def test_digits_are_augmented_as_the_plan_says():
    source = open_source({"kind": "digits", "image_size": 16}, on_gpu=False)
    plain, _ = next(source.train_batches(0, 0, 0, 1, 64, 64))
    torch.manual_seed(0)
    flipped, _ = next(source.train_batches(0, 0, 0, 1, 64, 64, augment="flip"))
    same = [torch.equal(a, b) for a, b in zip(plain, flipped, strict=True)]
    assert any(same) and not all(same)


def _spoil(root: Path) -> list[Path]:
    """Files a user's tree really holds: a truncated download, an empty file, a text file named
    .jpg, macOS's hidden ``._`` copies and ``.DS_Store``. Returns the unreadable visible ones."""
    folder = root / "train" / "n00000000"
    good = (folder / "img_0.JPEG").read_bytes()
    bad = [folder / "cut.JPEG", folder / "empty.JPEG", root / "val" / "n00000001" / "notes.jpg"]
    bad[0].write_bytes(good[: len(good) // 3])
    bad[1].write_bytes(b"")
    bad[2].write_text("not an image")
    (folder / "._img_0.JPEG").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    return bad


def test_unreadable_images_are_skipped_named_once_and_hidden_files_are_not_images(tmp_path,
                                                                                  capfd):
    root = make_tree(tmp_path / "tree", train=40, val=10)
    bad = _spoil(root)
    spec = {"kind": "imagefolder", "path": str(root), "image_size": 16, "loader_workers": 0}
    assert train_size(spec) == 3 * 40 + 2                   # the hidden files are not counted
    source = open_source(spec, on_gpu=False)
    assert source.train_len == 122 and source.val_len == 31
    for epoch in range(2):
        sizes = [len(y) for _, y in source.train_batches(epoch, seed=0, rank=0, world=1,
                                                         per_rank=120, micro=8)]
        assert sizes == [8] * 15        # an unreadable image's place is taken: batches keep
    # in its place: a readable image of the same class, with that class's label
    from trainers.augment import image_transform
    from trainers.sources import _Sized

    index = [p for p, _ in source.train.samples].index(str(bad[0]))
    image, label, problem = _Sized(source.train, partial(image_transform, "none"),
                                   replace=True)[(index, 16)]
    assert image.shape == (3, 16, 16) and label == 0 and problem[0] == str(bad[0])
    labels = [y for _, y in source.eval_batches(0, 1, 31)]
    assert sum(len(y) for y in labels) == 30                 # the unreadable one left out
    assert set(source.unreadable) <= {str(p) for p in bad}
    assert str(bad[2]) in source.unreadable
    said = capfd.readouterr().err
    for path in source.unreadable:
        assert said.count(f"unreadable image {path} ") == 1, said   # named once, not per read


def test_a_tree_with_many_unreadable_images_fails_in_one_line_naming_one(tmp_path):
    root = make_tree(tmp_path / "tree", train=30, val=3)
    for i in range(12):                 # 12 of 90 training images: not a few bad files
        (root / "train" / "n00000002" / f"img_{i}.JPEG").write_text("<html>404</html>")
    source = open_source({"kind": "imagefolder", "path": str(root), "image_size": 16,
                          "loader_workers": 0}, on_gpu=False)
    with pytest.raises(ValueError, match=r"1[12] of its 99 images could not be decoded so far "
                                         r"\(e\.g\. .*n00000002.*up to 10 \(1%, at least 10\)"
                                         r".*repair or remove those files"):
        for epoch in range(4):
            list(source.train_batches(epoch, seed=0, rank=0, world=1, per_rank=90, micro=6))


def test_a_few_unreadable_images_are_judged_by_files_not_reads_so_long_trials_go_on(tmp_path):
    """5 bad files of 99 (under the 10 any tree may hold): skipped in every epoch, however
    often they are read (read by read they pass 20 reads, 5% of all, by the fourth epoch)."""
    root = make_tree(tmp_path / "tree", train=30, val=3)
    for i in range(5):
        (root / "train" / "n00000001" / f"img_{i}.JPEG").write_text("<html>404</html>")
    source = open_source({"kind": "imagefolder", "path": str(root), "image_size": 16,
                          "loader_workers": 0}, on_gpu=False)
    for epoch in range(6):
        sizes = [len(y) for _, y in source.train_batches(epoch, seed=0, rank=0, world=1,
                                                         per_rank=90, micro=6)]
        assert sizes == [6] * 15
    assert len(source.unreadable) == 5


def test_unreadable_allowed_is_one_percent_of_a_tree_and_ten_in_any():
    assert [unreadable_allowed(n) for n in (0, 50, 999, 1000, 1100, 1_281_167)] == \
        [10, 10, 10, 10, 11, 12811]


def test_a_study_checks_every_image_of_a_small_tree_and_counts_exactly(tmp_path):
    root = make_tree(tmp_path / "tree", train=30, val=4, size=24)     # 102 images
    spec = {"kind": "imagefolder", "path": str(root), "image_size": 16}
    clean = check_images(spec)
    assert (clean.images, clean.checked, clean.unreadable, clean.too_many) == (102, 102, (), False)
    folder = root / "train" / "n00000002"
    for i in range(10):                                   # 10: as many as a tree may hold
        (folder / f"img_{i}.JPEG").write_text("<html>403 Forbidden</html>")
    check = check_images(spec)
    assert len(check.unreadable) == 10 and not check.too_many
    cut = (root / "val" / "n00000000" / "img_0.JPEG")
    cut.write_bytes(cut.read_bytes()[:100])               # the eleventh: a cut-off download
    check = check_images(spec)
    assert len(check.unreadable) == 11 and check.too_many
    assert str(cut) in dict(check.unreadable)
    error = check.error()
    assert "\n" not in error and error.startswith(f"ImageFolder {root}: 11 of its 102 images "
                                                  "could not be decoded (e.g. ")
    assert "up to 10 (1%, at least 10) are skipped" in error and "repair or remove" in error


def test_a_large_tree_is_judged_on_a_seeded_sample_past_its_noise(tmp_path):
    root = make_tree(tmp_path / "tree", classes=2, train=60, val=10, size=16)   # 140 images
    spec = {"kind": "imagefolder", "path": str(root), "image_size": 16}
    for i in range(8):          # 8 of 140: within what a tree of 140 may hold (10)
        (root / "train" / "n00000000" / f"img_{i}.JPEG").write_text("not an image")
    few = check_images(spec, sample=40)
    assert few.checked == 40 and few.images == 140 and not few.too_many
    assert few == check_images(spec, sample=40)           # the same sample every time
    for i in range(60):         # the whole class is text: 68 of 140
        (root / "train" / "n00000001" / f"img_{i}.JPEG").write_text("not an image")
    many = check_images(spec, sample=40)
    assert many.too_many and "of 40 images drawn from its 140 could not be decoded" in \
        many.error()


def test_tif_and_pgm_trees_are_counted_as_imagefolder_reads_them(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            Image.new("L", (8, 8)).save(tmp_path / split / c / "x.tif")
            Image.new("L", (8, 8)).save(tmp_path / split / c / "y.pgm")
    spec = {"kind": "imagefolder", "path": str(tmp_path), "image_size": 8, "loader_workers": 0}
    assert train_size(spec) == 4 == open_source(spec, on_gpu=False).train_len


def test_a_tree_of_class_folders_is_split_by_val_split_the_same_way_every_time(tmp_path):
    from PIL import Image

    from trainers.sources import num_classes, read_layout

    for c, n in (("cat", 20), ("dog", 9)):
        (tmp_path / c).mkdir()
        for i in range(n):
            Image.new("RGB", (8, 8), (i * 10, 0, 0)).save(tmp_path / c / f"{c}{i}.jpg")
    (tmp_path / ".ipynb_checkpoints").mkdir()          # a notebook's folder: not a class
    spec = {"kind": "imagefolder", "path": str(tmp_path), "image_size": 8, "loader_workers": 0,
            "val_split": 0.2}
    assert train_size(spec) == 16 + 7 and num_classes(spec) == 2
    source = open_source(spec, on_gpu=False)
    assert (source.train_len, source.val_len, source.num_classes) == (23, 6, 2)
    layout = read_layout(spec)
    val = {p for p, _ in layout.val}
    assert {p for p, _ in read_layout(spec).val} == val              # the same every time
    assert not val & {p for p, _ in layout.train}                    # never both
    assert sorted(i for _, i in layout.val) == [0, 0, 0, 0, 1, 1]    # 20% of each, rounded up
    Image.new("RGB", (8, 8)).save(tmp_path / "cat" / "cat_new.jpg")  # a file added later
    assert len(val - {p for p, _ in read_layout(spec).val}) <= 1     # moves at most one
    xs = [x for x, _ in source.eval_batches(0, 1, 4)]
    assert sum(len(x) for x in xs) == 6


def test_a_large_jpeg_is_decoded_at_a_reduced_scale_that_keeps_the_pixels_its_transform_uses(
        tmp_path):
    import numpy as np
    from PIL import Image

    from trainers.augment import eval_transform
    from trainers.sources import open_image

    h, w = 1200, 1600                     # a photo: smooth shapes and a little noise
    yy, xx = np.mgrid[0:h, 0:w]
    pixels = np.stack([(xx * 255 // w), (yy * 255 // h), ((xx + yy) // 7 % 256)], -1)
    pixels = (pixels + np.random.default_rng(0).integers(0, 8, pixels.shape)).clip(0, 255)
    Image.fromarray(pixels.astype("uint8")).save(tmp_path / "photo.jpg", quality=90)
    Image.fromarray(pixels[..., 0].astype("uint8"), "L").save(tmp_path / "gray.jpg")
    Image.new("CMYK", (900, 700), (10, 200, 30, 0)).save(tmp_path / "print.jpg")
    Image.fromarray(pixels.astype("uint8")).save(tmp_path / "photo.png")

    full, reduced = open_image(str(tmp_path / "photo.jpg")), open_image(
        str(tmp_path / "photo.jpg"), 250)
    assert full.size == (1600, 1200) and reduced.size == (400, 300)   # 1/4: 300 >= 250
    prepare = eval_transform("none", 100)
    assert (prepare(full) - prepare(reduced)).abs().mean() < 0.05    # what training sees
    for name in ("gray.jpg", "print.jpg"):
        image = open_image(str(tmp_path / name), 100)
        assert image.mode == "RGB" and min(image.size) >= 100
    assert open_image(str(tmp_path / "photo.png"), 100).size == (1600, 1200)  # JPEG only


def test_16_bit_and_floating_point_images_keep_their_contrast(tmp_path):
    import numpy as np
    from PIL import Image

    from trainers.sources import open_image

    ramp = np.linspace(0, 1, 64 * 64).reshape(64, 64)
    Image.fromarray((ramp * 65535).astype(np.uint16)).save(tmp_path / "scan.png")   # I;16
    Image.fromarray(ramp.astype(np.float32)).save(tmp_path / "map.tif")              # F
    for name in ("scan.png", "map.tif"):
        pixels = np.asarray(open_image(str(tmp_path / name)), dtype=np.float64)
        assert pixels.shape == (64, 64, 3)
        # PIL alone clips these to white (16-bit) or black (float): mean 254.5 or 0.0002
        assert abs(pixels.mean() - 127.5) < 1 and pixels.min() == 0 and pixels.max() == 255


def test_kaggle_layouts_valid_folders_and_a_train_folder_alone_are_read(tmp_path):
    from trainers.sources import read_layout

    kaggle = make_tree(tmp_path / "kaggle", classes=2, train=4, val=2)
    (kaggle / "val").rename(kaggle / "valid")
    (kaggle / "test").mkdir()                      # held out by its makers: never read
    layout = read_layout({"kind": "imagefolder", "path": str(kaggle)})
    assert (len(layout.train), len(layout.val)) == (8, 4)
    assert all("/valid/" in p for p, _ in layout.val)

    alone = make_tree(tmp_path / "alone", classes=2, train=10, val=1)
    for c in (alone / "val").iterdir():
        for f in c.iterdir():
            f.unlink()
        c.rmdir()
    (alone / "val").rmdir()
    (alone / "test").mkdir()
    with pytest.raises(ValueError, match=r"has train/ but no val/ \(nor valid/ or validation/\) "
                                         r"\(test/ is there: a test set is not for tuning\): "
                                         r"add val_split: 0\.1"):
        read_layout({"kind": "imagefolder", "path": str(alone)})
    split = read_layout({"kind": "imagefolder", "path": str(alone), "val_split": 0.2})
    assert (len(split.train), len(split.val)) == (16, 4)   # 2 of each class's 10 held out
    assert all("/train/" in p for p, _ in split.val)


def test_a_path_one_level_off_the_tree_says_which_path_holds_it(tmp_path):
    """A tree inside a wrapping folder (an archive extracted as dataset/imagenet/train/...),
    a class folder given as the root, and images with no class folders (labels in a CSV)
    are each refused with the path or the move that makes them a tree."""
    import re

    from trainers.sources import read_layout

    tree = make_tree(tmp_path / "wrap" / "dataset" / "imagenet", classes=2, train=3, val=1)
    for spec in ({"path": str(tmp_path / "wrap")},
                 {"path": str(tmp_path / "wrap"), "val_split": 0.2}):
        with pytest.raises(ValueError, match=f"give path: {re.escape(str(tree))}$"):
            read_layout({"kind": "imagefolder", **spec})
    one_class = tree / "train" / "n00000000"
    with pytest.raises(ValueError, match=r"it holds 3 images directly: .* or, if n00000000 is "
                                         f"one class of a tree, give the tree's root: "
                                         f"{re.escape(str(tree))}$"):
        read_layout({"kind": "imagefolder", "path": str(one_class), "val_split": 0.2})
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in one_class.iterdir():
        (flat / f.name).write_bytes(f.read_bytes())
    (flat / "labels.csv").write_text("file,label\n")
    with pytest.raises(ValueError, match=r"holds 3 images directly: autotune takes an image's "
                                         r"class from its folder's name, so move them into one "
                                         r"folder per class .*, or name the table of their "
                                         r"classes as trainer.data.labels \(labels\.csv\)"):
        read_layout({"kind": "imagefolder", "path": str(flat), "val_split": 0.2})
    # a tree of classes with no split is still told to add val_split, not to look deeper
    classes = make_tree(tmp_path / "plain", classes=2, train=3, val=1) / "train"
    with pytest.raises(ValueError, match="if those are the classes, add val_split"):
        read_layout({"kind": "imagefolder", "path": str(classes)})


def test_linked_folders_are_followed_once_and_a_loop_back_up_is_not(tmp_path):
    root = make_tree(tmp_path / "tree", train=6, val=2, size=16)
    plain = train_size({"kind": "imagefolder", "path": str(root)})
    extra = make_tree(tmp_path / "more", classes=1, train=4, val=0, size=16)
    cat = root / "train" / "n00000000"
    (cat / "more").symlink_to(extra / "train" / "n00000000")   # a subset built of links
    (cat / "again").symlink_to(extra / "train" / "n00000000")  # ... linked twice: read once
    (cat / "loop").symlink_to(root / "train")                  # back up: every class again
    (cat / "self").symlink_to(cat)
    spec = {"kind": "imagefolder", "path": str(root), "image_size": 16, "loader_workers": 0}
    assert train_size(spec) == plain + 4
    source = open_source(spec, on_gpu=False)
    labels = [label for _, label in source.train.samples]
    assert labels.count(0) == 10 and labels.count(1) == labels.count(2) == 6


def test_file_names_that_are_not_utf8_are_split_and_read_like_any_other(tmp_path):
    """A tree unpacked from an archive made on Windows names files in its own code page
    (`caf\\xe9.jpg`, Latin-1): Python lists them with escaped bytes, which hashing for
    val_split refused ("'utf-8' codec can't encode character '\\udce9'"): the study ended
    before it began."""
    import os

    from PIL import Image

    from trainers.sources import read_layout

    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(4):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / c / f"{c}{i}.png")
    odd = os.path.join(os.fsencode(tmp_path), b"a", b"caf\xe9.png")
    Image.new("RGB", (8, 8)).save(odd, format="PNG")
    spec = {"kind": "imagefolder", "path": str(tmp_path), "image_size": 8, "loader_workers": 0,
            "val_split": 0.5}
    layout = read_layout(spec)
    assert len(layout.train) + len(layout.val) == 9
    assert os.fsdecode(odd) in {p for p, _ in layout.train + layout.val}
    source = open_source(spec, on_gpu=False)
    assert sum(len(x) for x, _ in source.eval_batches(0, 1, 8)) == len(layout.val)


def test_an_image_larger_than_pil_opens_is_read_at_its_decoded_scale_or_named(tmp_path):
    # PIL refuses to open more than 179 megapixels (its guard against decompression bombs):
    # a large JPEG (a panorama, a scan) trained at 32 px decodes at 1/8 of that; a PNG as
    # large is named as too large, with what to do, not as a file that cannot be decoded
    from PIL import Image

    from trainers.sources import decode_error, open_image

    big = Image.new("L", (13500, 13500), 90)
    big.save(tmp_path / "scan.jpg", quality=30)
    big.save(tmp_path / "scan.png")
    assert open_image(str(tmp_path / "scan.jpg"), 64).size == (1688, 1688)
    with pytest.raises(ValueError) as raised:
        open_image(str(tmp_path / "scan.png"), 64)
    assert decode_error(raised.value) == (
        "ImageTooLarge: 13500 x 13500 pixels (182 megapixels), more than an image may decode "
        "to (179): resize or tile the images (training reads them at 64 px)")
    # a tree of them is refused at the start with that advice
    for part in ("train", "val"):
        for name in ("a", "b"):
            (tmp_path / "tree" / part / name).mkdir(parents=True)
            for i in range(3):
                (tmp_path / "tree" / part / name / f"scan{i}.png").symlink_to(
                    tmp_path / "scan.png")
    check = check_images({"kind": "imagefolder", "path": str(tmp_path / "tree"),
                          "image_size": 32})
    assert check.too_many and check.error().startswith(
        f"ImageFolder {tmp_path / 'tree'}: 12 of its 12 images are too large to decode (e.g. ")
    assert check.error().endswith("resize or tile them to a few times the training size, "
                                  "then start the study again")


def test_the_class_shares_loss_is_the_entropy_of_the_validation_classes():
    # what a model that learnt only the class counts scores on the validation cross-entropy
    from trainers.sources import Layout, class_entropy, constant_answer

    balanced = Layout(["a", "b", "c", "d"], [], [(f"{i}.png", i % 4) for i in range(40)])
    assert class_entropy(balanced) == pytest.approx(math.log(4))
    skewed = Layout(["a", "b"], [], [("x.png", 0)] * 9 + [("y.png", 1)])
    assert class_entropy(skewed) == pytest.approx(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)))
    assert constant_answer(skewed, 1) == (pytest.approx(0.9), ["a"])
    assert class_entropy(Layout(["a"], [], [])) == 0.0
