"""Where a trainer's images come from: the bundled digits, an ImageFolder tree, or synthetic
tensors (for throughput only). Every source shards the same way:

* training: each epoch, every rank draws the same permutation (seeded by the plan's seed and
  the epoch) and takes every ``world``-th index from its rank on, so ranks never share a
  sample; a resumed run skips the batches it already trained on;
* evaluation: rank r takes indices r, r + world, ... of the validation set, with no padding, so
  the sums over ranks count every validation image exactly once.

Training batches are augmented as the plan's ``augment`` says (:mod:`trainers.augment`).
An ImageFolder tree is read by loader processes that live as long as the source does
(persistent workers): an evaluation or a new epoch hands them new indices instead of starting
new processes.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from trainers import _shm
from trainers import data as digits
from trainers.augment import augment_batch, eval_transform, image_transform

__all__ = ["ImageCheck", "Source", "check_images", "decode_error", "image_size_default",
           "image_size_of", "kept_source", "num_classes", "open_source", "train_size",
           "unreadable_allowed"]

Batch = tuple[torch.Tensor, torch.Tensor]
# torchvision's ImageFolder extensions; hidden files (``.DS_Store``, macOS's ``._name.jpg``
# copies of each image's metadata) are not images, whatever their name ends with.
_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _is_image(path: str) -> bool:
    name = os.path.basename(path)
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in _EXTENSIONS


class Source:
    """A sharded training set and validation set."""

    num_classes: int
    train_len: int
    val_len: int

    def train_batches(self, epoch: int, seed: int, rank: int, world: int, per_rank: int,
                      micro: int, skip: int = 0, augment: str = "none",
                      size: int | None = None) -> Iterator[Batch]:
        """This rank's micro-batches of ``epoch``, after skipping ``skip`` of them, augmented
        as ``augment`` says, at ``size`` pixels (None: the source's own)."""
        order = digits.epoch_shard(self.train_len, epoch, seed, rank, world, per_rank)
        self.last_order = order[skip * micro:]  # what this rank is fed, for audits
        return self._load_train(self.last_order, micro, augment, size)

    def eval_batches(self, rank: int, world: int, batch: int, augment: str = "none",
                     size: int | None = None) -> Iterator[Batch]:
        """This rank's share of the validation set, prepared as training with ``augment``
        expects (never augmented), at ``size`` pixels (None: the source's own)."""
        return self._load_val(digits.eval_shard(self.val_len, rank, world), batch, augment,
                              size)

    def _load_train(self, indices: torch.Tensor, micro: int, augment: str,
                    size: int | None) -> Iterator[Batch]:
        raise NotImplementedError

    def _load_val(self, indices: torch.Tensor, batch: int, augment: str,
                  size: int | None) -> Iterator[Batch]:
        raise NotImplementedError

    def class_names(self) -> list[str]:
        """The classes' names in label order (a tree's folder names; else the labels)."""
        return [str(i) for i in range(self.num_classes)]

    def close(self) -> None:
        """Releases loader processes, if any."""


class InMemory(Source):
    """Tensors held in memory: the digits, or synthetic images."""

    def __init__(self, train: digits.Split, val: digits.Split, num_classes: int) -> None:
        self.train, self.val, self.num_classes = train, val, num_classes
        self.train_len, self.val_len = len(train), len(val)

    def _load_train(self, indices: torch.Tensor, micro: int, augment: str,
                    size: int | None) -> Iterator[Batch]:
        for idx in digits.batches(indices, micro):
            images = augment_batch(self.train.images[idx], augment)
            yield resized(images, size), self.train.labels[idx]

    def _load_val(self, indices: torch.Tensor, batch: int, augment: str,
                  size: int | None) -> Iterator[Batch]:
        for idx in digits.batches(indices, batch):
            yield resized(self.val.images[idx], size), self.val.labels[idx]


class Synthetic(Source):
    """Random images for throughput only: a small pool, reused, so memory stays small."""

    def __init__(self, spec: dict[str, Any], on_gpu: bool = False) -> None:
        size = int(spec.get("image_size", 224))
        self.num_classes = int(spec.get("num_classes", 1000))
        self.train_len = int(spec.get("train_images", 512))
        self.val_len = int(spec.get("val_images", 64))
        gen = torch.Generator().manual_seed(0)
        self._pool = torch.randn(64, 3, size, size, generator=gen)
        self._labels = torch.randint(0, self.num_classes, (64,), generator=gen)
        if on_gpu:  # kept on the device: a throughput test must not measure host copies
            self._pool = self._pool.cuda(torch.cuda.current_device())
            self._labels = self._labels.cuda(torch.cuda.current_device())
        self._pools: dict[int | None, torch.Tensor] = {None: self._pool}

    def _take(self, indices: torch.Tensor, batch: int, size: int | None) -> Iterator[Batch]:
        pool = self._pools.get(size)
        if pool is None:             # one resized pool per size: resizing costs nothing later
            pool = self._pools[size] = resized(self._pool, size)
        for idx in digits.batches(indices, batch):
            slot = (idx % pool.shape[0]).to(pool.device)
            yield pool[slot], self._labels[slot]

    def _load_train(self, indices: torch.Tensor, micro: int, augment: str,
                    size: int | None) -> Iterator[Batch]:
        return self._take(indices, micro, size)   # throughput only: never augmented

    def _load_val(self, indices: torch.Tensor, batch: int, augment: str,
                  size: int | None) -> Iterator[Batch]:
        return self._take(indices, batch, size)


def resized(images: torch.Tensor, size: int | None) -> torch.Tensor:
    """A batch of square images at ``size`` pixels (antialiased bilinear; None or the same
    size: as it is)."""
    if size is None or images.shape[-1] == size:
        return images
    return torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear",
                                           antialias=True, align_corners=False)


class _Indices(torch.utils.data.Sampler[tuple[int, int]]):
    """What a persistent loader reads next, (index, size) pairs: set before each pass."""

    def __init__(self) -> None:
        self.indices: list[tuple[int, int]] = []

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


# Unreadable images: up to this share of a tree's images, and up to _UNREADABLE_FEW in any tree,
# are skipped (each named in the trial's log); more means the tree itself is wrong. A study
# checks the tree before its first trial (``check_images``); a trainer counts what it meets.
_UNREADABLE_SHARE = 0.01
_UNREADABLE_FEW = 10
_CHECK_SAMPLE = 1000    # images a study decodes before its first trial (all of a smaller tree)
_Z99 = 2.33             # one-sided 99%: a sample's count is refused only past its noise
_NEIGHBOURS = 8         # images on each side of an unreadable training image tried in its place


def unreadable_allowed(images: int) -> int:
    """How many unreadable files a tree of ``images`` images may hold and still be trained on:
    1% of them, and at least 10 (a small tree's few bad downloads)."""
    return max(_UNREADABLE_FEW, math.floor(_UNREADABLE_SHARE * images))


def decode_error(e: BaseException) -> str:
    """A decoder's error in one short line (PIL repeats the file's path in some)."""
    said = re.sub(r" <_io\.\w+ name=.*?>", "", str(e))
    return " ".join(f"{type(e).__name__}: {said}".split())[:200]


class _Sized(torch.utils.data.Dataset[Batch]):
    """An ImageFolder read by (index, size) pairs: the image at ``index`` prepared by
    ``transform(size)`` (each loader process builds a size's transform once).

    An item is ``(image, label, problem)``: ``problem`` is ``(path, error)`` when the file at
    ``index`` could not be decoded (a truncated download, an empty file, a text file named
    .jpg). In training (``replace``) the image is then the nearest readable one of its class,
    so batches keep their size; in evaluation it is None, and left out of the count."""

    def __init__(self, folder: Any, transform: Callable[[int], Any], replace: bool,
                 margin: float = 0.0) -> None:
        self.folder, self.transform, self.replace = folder, transform, replace
        self.margin = margin      # decode JPEGs to at least margin x the size (open_image)
        self._made: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.folder)

    def _decode(self, index: int, size: int) -> Any:
        return open_image(self.folder.samples[index][0], math.ceil(self.margin * size))

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, size = key
        path, label = self.folder.samples[index]
        prepare = self._made.get(size)
        if prepare is None:
            prepare = self._made[size] = self.transform(size)
        try:
            return prepare(self._decode(index, size)), label, None
        except Exception as e:  # noqa: BLE001 - any decoder error: the file, not the code
            problem = (path, decode_error(e))
        if self.replace:
            samples = self.folder.samples
            for step in (d for k in range(1, _NEIGHBOURS + 1) for d in (k, -k)):
                other = (index + step) % len(samples)   # a class's files sit together
                if samples[other][1] != label:
                    continue
                try:
                    return prepare(self._decode(other, size)), label, problem
                except Exception:  # noqa: BLE001, S112 - unreadable too: try the next
                    continue
        return None, label, problem


def _collate(items: list[Any]) -> tuple[Any, Any, list[tuple[str, str]]]:
    """A batch of ``_Sized`` items: (images, labels) of the readable ones (None, None if
    none is), and the problems met."""
    from torch.utils.data import default_collate

    problems = [p for _, _, p in items if p is not None]
    kept = [(x, y) for x, y, _ in items if x is not None]
    if not kept:
        return None, None, problems
    x, y = default_collate(kept)
    return x, y, problems


class ImageFolderSource(Source):
    """``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG``, as ImageNet is laid out.

    Training images at ``image_size`` (or the plan's size of the epoch), augmented as the plan
    says; evaluation at ``eval_size`` (default ``image_size``; or the plan's), prepared to
    match (:func:`trainers.augment.eval_transform`).
    Images are decoded by ``loader_workers`` processes per rank and loader, kept alive between
    epochs, evaluations and trials (one training and one evaluation loader at a time).
    """

    def __init__(self, spec: dict[str, Any], on_gpu: bool) -> None:
        # Imported here, once: the loader processes fork from this one and inherit them, where
        # each would otherwise spend a second or more importing them at its first image.
        import PIL.Image  # noqa: F401
        import torchvision.transforms  # noqa: F401

        root = Path(spec["path"])
        self.size = int(spec.get("image_size", 224))
        self.eval_size = int(spec.get("eval_size", self.size))
        layout = read_layout(spec)
        self.train, self.val = _Folder(layout.train, layout.classes), _Folder(layout.val,
                                                                            layout.classes)
        self.num_classes = len(layout.classes)
        self.train_len, self.val_len = len(self.train), len(self.val)
        self.workers = int(spec.get("loader_workers", min(4, os.cpu_count() or 1)))
        self.pin = on_gpu
        self._loaders: dict[str, tuple[Any, Any, _Indices]] = {}  # train, val: key, loader
        self.root = root
        self.unreadable: dict[str, str] = {}  # path -> the decoder's error, each named once

    def class_names(self) -> list[str]:
        return list(self.train.classes)     # label i is the folder classes[i]

    def _loader(self, part: str, dataset: Any, transform: Callable[[int], Any], key: Any,
                indices: Sequence[int], batch: int, size: int,
                margin: float) -> Iterator[Batch]:
        """Batches of ``indices`` at ``size`` pixels from this part's loader, made anew only
        when ``key`` (the preparation and batch size) changed; its worker processes persist,
        whatever the size: each index travels with its size (``_Sized``)."""
        from torch.utils.data import DataLoader

        held = self._loaders.get(part)
        if held is None or held[0] != key:
            self._loaders.pop(part, None)   # the old loader's workers end with it
            free = _shm.free_bytes()
            if self.workers and free is not None:   # their batches come through /dev/shm
                note = _shm.loader_note(free, _shm.local_ranks(), self.workers, batch, size)
                if note:
                    self.workers = 0
                    if os.environ.get("RANK", "0") == "0":
                        print(f"autotune: {note}", file=sys.stderr, flush=True)
            sampler = _Indices()
            loader = DataLoader(_Sized(dataset, transform, replace=part == "train",
                                       margin=margin),
                                batch_size=batch, sampler=sampler, collate_fn=_collate,
                                num_workers=self.workers, pin_memory=self.pin,
                                drop_last=False, persistent_workers=self.workers > 0,
                                prefetch_factor=_PREFETCH if self.workers else None)
            held = self._loaders[part] = (key, loader, sampler)
        _, loader, sampler = held
        sampler.indices = [(int(i), size) for i in indices]
        for x, y, problems in loader:
            self._count(part, problems, whole=x is None)
            if x is not None:
                yield x, y

    def _count(self, part: str, problems: list[tuple[str, str]], whole: bool) -> None:
        """Counts a batch's unreadable images; names each unreadable file once on stderr (the
        trial's log); raises once they are more than ``unreadable_allowed`` of the tree, or
        none of a training batch could be read."""
        for path, error in problems:
            if path not in self.unreadable:
                self.unreadable[path] = error
                kept = ("another image of its class trained in its place" if part == "train"
                        else "left out of the evaluation")
                print(f"autotune: unreadable image {path} ({error}); {kept}. Repair or "
                      "remove it", file=sys.stderr, flush=True)
        # Judged on distinct files against the whole tree, not on reads: every trial on one
        # tree decides alike, however long it trains.
        images = self.train_len + self.val_len
        many = len(self.unreadable) > unreadable_allowed(images)
        if many or (whole and part == "train"):
            path, error = next(iter(self.unreadable.items()))
            raise ValueError(
                f"ImageFolder {self.root}: {len(self.unreadable)} of its {images} images could "
                f"not be decoded so far (e.g. {path}: {error}); up to "
                f"{unreadable_allowed(images)} (1%, at least {_UNREADABLE_FEW}) are skipped, "
                "more means the tree itself is wrong: repair or remove those files (each is "
                "named in this log)")

    def _load_train(self, indices: torch.Tensor, micro: int, augment: str,
                    size: int | None) -> Iterator[Batch]:
        # a random-resized crop may take a twelfth of the image: decode 4 x the size
        return self._loader("train", self.train, partial(image_transform, augment),
                            (augment, micro), indices.tolist(), micro, size or self.size,
                            margin=4.0 if augment == "imagenet" else 2.0)

    def _load_val(self, indices: torch.Tensor, batch: int, augment: str,
                  size: int | None) -> Iterator[Batch]:
        prepare = "imagenet" if augment == "imagenet" else "none"  # the rest: alike
        return self._loader("val", self.val, partial(eval_transform, prepare),
                            (prepare, batch), indices.tolist(), batch, size or self.eval_size,
                            margin=EVAL_MARGIN)

    def close(self) -> None:
        self._loaders.clear()


def open_image(path: str, least: int = 0) -> Any:
    """The image at ``path`` as an RGB PIL image, as torchvision's ImageFolder loads it; a JPEG
    larger than ``least`` pixels on its shorter side is decoded at a reduced scale (1/2 to
    1/8, JPEG's own) that keeps at least ``least``: a 12-megapixel photo trained at 224
    pixels decodes several times faster, with no fewer pixels than its transform uses."""
    from PIL import Image

    with open(path, "rb") as f:
        try:
            image = Image.open(f)
        except Image.DecompressionBombError:
            image = _open_large(f)
        if least and image.format == "JPEG":
            image.draft("RGB", (least, least))
        width, height = image.size
        if width * height > _MAX_DECODED_PIXELS:
            raise ImageTooLarge(
                f"{width} x {height} pixels ({width * height / 1e6:.0f} megapixels), more than "
                f"an image may decode to ({_MAX_DECODED_PIXELS / 1e6:.0f}): resize or tile the "
                f"images{f' (training reads them at {least} px)' if least else ''}")
        return as_rgb(image)


# Evaluation decodes a JPEG to at least this many times its size (its resize goes to 8/7 of
# the size at most); ``SavedModel.predict`` reads files the same way.
EVAL_MARGIN = 2.5


# batches each loader worker prepares ahead
_PREFETCH = 4


class ImageTooLarge(ValueError):
    """An image that would decode to more pixels than ``_MAX_DECODED_PIXELS``."""


def _open_large(f: Any) -> Any:
    """The image in ``f`` opened past PIL's decompression-bomb check (the file is the user's
    own data; a JPEG is decoded at a reduced scale): ``open_image`` checks the pixels that
    will be decoded instead."""
    import warnings

    from PIL import Image

    f.seek(0)
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(f)
    finally:
        Image.MAX_IMAGE_PIXELS = limit


# PIL refuses to open an image of more pixels than this (twice its MAX_IMAGE_PIXELS, where
# it only warns): a 13,400 px square. autotune applies it to what is decoded instead.
_MAX_DECODED_PIXELS = 178_956_970


def as_rgb(image: Any) -> Any:
    """A PIL image in RGB, as the trainer reads every image (deep ones scaled to 8 bits)."""
    if image.mode in _DEEP_MODES:
        image = _to_8_bits(image)
    return image.convert("RGB")


# Integer and floating-point images deeper than 8 bits (16-bit PNG and TIFF, as microscopes,
# X-ray and thermal cameras write them): PIL's own conversion to RGB clips them to 255 or 1,
# leaving a white or black image.
_DEEP_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def _to_8_bits(image: Any) -> Any:
    """A grayscale 8-bit copy of a 16-bit (or 32-bit integer) image, each value x 255 / 65535;
    of a floating-point one, its [0, 1] range (or [0, 255] when it holds larger values)
    x 255 / 1 (or as it is), clipped."""
    import numpy as np
    from PIL import Image

    values = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        top = np.nanmax(values) if values.size else 0.0
        values = values * (255.0 if top <= 1.0 else 1.0)
    else:
        values = values * (255.0 / 65535.0)
    return Image.fromarray(np.nan_to_num(values).clip(0, 255).round().astype(np.uint8), "L")


class _Folder:
    """One part of an ImageFolder tree: ``samples`` (path, class index) and the classes."""

    def __init__(self, samples: list[tuple[str, int]], classes: list[str]) -> None:
        self.samples, self.classes = samples, classes

    def __len__(self) -> int:
        return len(self.samples)


class Layout:
    """An ImageFolder tree's classes and its training and validation images (path, class
    index), listed without decoding any."""

    def __init__(self, classes: list[str], train: list[tuple[str, int]],
                 val: list[tuple[str, int]]) -> None:
        self.classes, self.train, self.val = classes, train, val


def _class_folders(folder: Path) -> list[str]:
    """The class folders of ``folder``, sorted; hidden ones (``.ipynb_checkpoints``) are not
    classes."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _walk(folder: Path) -> list[tuple[str, list[str]]]:
    """(folder, file names) of ``folder`` and every folder under it, symbolic links followed,
    each folder once: a link back to the folder or one above it (a loop, which would list the
    tree's other classes under this one, dozens of times over) or a second link to a folder
    already read is not followed. In os.walk's order."""
    root = os.path.realpath(folder)
    seen = {root}
    walked = []
    for top, dirs, files in os.walk(folder, followlinks=True):
        kept = []
        for name in dirs:
            real = os.path.realpath(os.path.join(top, name))
            if real not in seen and not root.startswith(real + os.sep):
                seen.add(real)
                kept.append(name)
        dirs[:] = kept
        walked.append((top, files))
    return walked


def _images(folder: Path) -> list[str]:
    """The images under ``folder``, in the order torchvision's ImageFolder lists them
    (``_walk``: linked folders followed, each once)."""
    return [os.path.join(top, name) for top, files in sorted(_walk(folder))
            for name in sorted(files) if _is_image(name)]


def _held_out(paths: list[str], share: float) -> set[str]:
    """The ``share`` of ``paths`` (rounded up; at least one, and one left to train on) that
    validation gets: those whose names hash lowest, so the same files every time, on every
    machine, and a file added later moves at most one other."""
    import hashlib

    k = min(max(1, math.ceil(share * len(paths))), len(paths) - 1)
    ranked = sorted(paths, key=lambda p: hashlib.sha1(os.fsencode(os.path.basename(p))).digest())
    return set(ranked[:k])


def _allowed() -> str:
    return ", ".join(sorted(_EXTENSIONS))


# Photo formats a phone or camera writes that torchvision's ImageFolder does not read.
_CONVERT = (".heic", ".heif", ".avif", ".dng", ".cr2", ".nef", ".arw", ".jfif", ".jxl")


def _held_instead(folder: Path, classes: list[str]) -> str:
    """What the class folders ``classes`` under ``folder`` hold instead of images: their files'
    most common endings, with what to do about photo formats ImageFolder does not read."""
    counts: dict[str, int] = {}
    for name in classes:
        for _, files in _walk(folder / name):
            for f in files:
                if not f.startswith("."):
                    ext = os.path.splitext(f)[1].lower() or "(no ending)"
                    counts[ext] = counts.get(ext, 0) + 1
    if not counts:
        return ""
    common = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    said = ", ".join(f"{n} {ext}" for ext, n in common)
    convert = [ext for ext, _ in common if ext in _CONVERT]
    todo = (f": convert the {'/'.join(convert)} files to .jpg or .png" if convert else "")
    return f"; they hold {said} files instead{todo}"


# Archives a data set comes as (ImageNet's ILSVRC2012_img_train.tar, Kaggle's .zip).
_ARCHIVES = (".tar.gz", ".tar.xz", ".tar.bz2", ".tgz", ".tar", ".zip")
# What a validation folder is called: ImageNet's val/, and the Kaggle and Roboflow names.
_VAL_NAMES = ("val", "valid", "validation")


def _val_folder(root: Path) -> Path | None:
    return next((root / n for n in _VAL_NAMES if (root / n).is_dir()), None)


def _holds_tree(folder: Path) -> bool:
    """Whether ``folder`` looks like the root of an ImageFolder tree: a train/ in it, or at
    least two class folders with images in them (the first 20 looked at)."""
    if (folder / "train").is_dir():
        return True
    classes = _class_folders(folder)
    return len(classes) >= 2 and all(any(_is_image(n) for n in os.listdir(folder / c))
                                     for c in classes[:20])


def _tree_below(folder: Path) -> Path | None:
    """The tree a wrapping folder holds (``folder``/dataset/data/train/...): down through
    folders with no images and one folder each, the first that holds a tree."""
    for _ in range(8):
        if _holds_tree(folder):
            return folder
        inside = _class_folders(folder)
        if len(inside) != 1 or any(_is_image(n) for n in os.listdir(folder)):
            return None
        folder = folder / inside[0]
    return None


def _loose_hint(top: Path, root: Path) -> str:
    """What to do with images that lie in ``top`` itself, not in class folders."""
    names = os.listdir(top)
    loose = sum(1 for n in names if _is_image(n))
    if not loose:
        return ""
    tables = [n for n in sorted(names) if n.lower().endswith(".csv")]
    hint = (f"; it holds {loose} images directly: autotune takes an image's class from its "
            f"folder's name, so move them into one folder per class ({top}/<class>/*.jpg)"
            + (f", or name the table of their classes as trainer.data.labels ({tables[0]}) "
               "with val_split" if tables else
               ", or give a CSV file of their classes as trainer.data.labels"))
    up = root.parent.parent if root.parent.name == "train" else root.parent
    if up != root and _holds_tree(up):
        hint += f"; or, if {root.name} is one class of a tree, give the tree's root: {up}"
    return hint


def _class_root(root: Path, share: Any) -> Path:
    """Where the class folders are: ``train/``, or with ``val_split`` the root itself when it
    has no ``train/``."""
    return root / "train" if share is None or (root / "train").is_dir() else root


def read_layout(spec: dict[str, Any]) -> Layout:
    """The layout of the ImageFolder tree ``spec`` names, or a one-line ValueError saying what
    is wrong with it: ``path/train/<class>/*`` and ``path/val/<class>/*`` (or ``valid/``,
    ``validation/``) with the same class folders; or, with ``val_split``, ``path/<class>/*``
    (or ``path/train/<class>/*`` alone), each class's ``val_split`` share held out for
    validation (:func:`_held_out`). At least 2 classes, images in every one. With ``labels``
    (a CSV file of image and class), the images under ``path`` that it names, in its classes;
    with ``val_labels`` alone, ``path/train/<class>/*`` and the images of ``path/val/`` that
    it names, as Kaggle's ImageNet comes (:mod:`trainers._labels`)."""
    if spec.get("labels") or spec.get("val_labels"):
        from trainers._labels import labelled_layout

        return Layout(*labelled_layout(spec))
    root = Path(str(spec.get("path", "")))
    share = spec.get("val_split")
    if not root.is_dir():
        name = root.name.lower()
        archive = next((a for a in _ARCHIVES if name.endswith(a)), None)
        if archive is not None and root.is_file():
            raise ValueError(f"ImageFolder {root} is a {archive} archive, not a folder: extract "
                             f"it ({'unzip' if archive == '.zip' else 'tar xf'} {root.name}) and "
                             "give the folder it makes, whose train/ and val/ hold the class "
                             "folders")
        what = "is not a folder" if root.exists() else "does not exist"
        raise ValueError(f"ImageFolder {root} {what}; give the root of a tree of class "
                         f"folders ({root}/train/<class>/*.JPEG and {root}/val/<class>/*.JPEG)")
    val_dir = _val_folder(root)
    has_train = (root / "train").is_dir()
    if share is not None:
        if val_dir is not None:
            raise ValueError(f"ImageFolder {root} has {val_dir.name}/ already; val_split "
                             "holds out a share of the training images only where there is "
                             "no validation folder: drop val_split, or the folder")
        top = _class_root(root, share)
        classes = _class_folders(top)
        parts: dict[str, list[list[str]]] = {
            "train" if has_train else "": [_images(top / c) for c in classes]}
    else:
        expected = f"expected {root}/train/<class>/*.JPEG and {root}/val/<class>/*.JPEG"
        if not has_train:
            found = _class_folders(root)
            below = _tree_below(root / found[0]) if len(found) == 1 else None
            hint = (f"; it holds {len(found)} folder(s) ({', '.join(found[:3])}"
                    f"{', ...' if len(found) > 3 else ''}): if those are the classes, add "
                    "val_split: 0.1 to trainer.data to hold out 10% of each for validation"
                    if found and val_dir is None and below is None else "")
            if below is not None:
                hint = f"; its one folder holds the tree: give path: {below}"
            elif not found:
                hint = _loose_hint(root, root)
            raise ValueError(f"ImageFolder {root}: missing train/ ({expected}){hint}")
        if val_dir is None:
            test = " (test/ is there: a test set is not for tuning)" if (
                root / "test").is_dir() else ""
            raise ValueError(f"ImageFolder {root} has train/ but no val/ (nor valid/ or "
                             f"validation/){test}: add val_split: 0.1 to trainer.data to hold "
                             "out 10% of each training class for validation, or add "
                             f"{root}/val/<class>/*.JPEG")
        train_classes, classes = _class_folders(root / "train"), _class_folders(val_dir)
        loose = [n for n in os.listdir(val_dir) if _is_image(n)] if not classes else []
        if train_classes and loose:
            raise ValueError(f"ImageFolder {root}: {val_dir.name}/ holds {len(loose)} images "
                             "but no class folders (as ImageNet's validation set comes); give "
                             "val_labels: the CSV file of their classes (image, class; "
                             "Kaggle's LOC_val_solution.csv), or move each into "
                             f"{val_dir.name}/<class>/ by its label, or drop "
                             f"{val_dir.name}/ and add val_split: 0.1 to trainer.data")
        if train_classes != classes:
            only_train = sorted(set(train_classes) - set(classes))
            only_val = sorted(set(classes) - set(train_classes))
            raise ValueError(f"ImageFolder {root}: train/ and {val_dir.name}/ must hold the same "
                             "class folders; only in train/: "
                             f"{', '.join(only_train[:5]) or 'none'}; only in {val_dir.name}/: "
                             f"{', '.join(only_val[:5]) or 'none'}")
        parts = {part: [_images(folder / c) for c in classes]
                 for part, folder in (("train", root / "train"), (val_dir.name, val_dir))}
    where = "train/" if has_train else ""
    if not classes:
        raise ValueError(f"ImageFolder {root}/{where} has no class folders (expected "
                         f"{root}/{where}<class>/*.JPEG){_loose_hint(root / where, root)}")
    if len(classes) < 2:
        below = _tree_below(root / where / classes[0])
        hint = "" if below is None else f"; that folder holds the tree: give path: {below}"
        raise ValueError(f"ImageFolder {root} has one class ({classes[0]}); a classifier needs "
                         f"at least 2{hint}")
    for part, lists in parts.items():
        few = 2 if share is not None else 1       # a split class needs one image each side
        empty = [c for c, files in zip(classes, lists, strict=True) if len(files) < few]
        if empty:
            what = "fewer than 2 images (one trains, one validates)" if few == 2 else "no images"
            instead = _held_instead(root / part, empty)
            raise ValueError(f"ImageFolder {root / part}: {len(empty)} class folder(s) hold "
                             f"{what} ({', '.join(empty[:5])}){instead}; allowed: {_allowed()}")
    if share is None:
        return Layout(classes, *([(p, i) for i, files in enumerate(lists) for p in files]
                                 for lists in parts.values()))
    train: list[tuple[str, int]] = []
    val: list[tuple[str, int]] = []
    for i, files in enumerate(next(iter(parts.values()))):
        held = _held_out(files, float(share))
        for p in files:
            (val if p in held else train).append((p, i))
    return Layout(classes, train, val)


@dataclass(frozen=True)
class ImageCheck:
    """What ``check_images`` found: ``checked`` of the tree's ``images`` decoded, and the
    ``unreadable`` ones among them as (path, error)."""

    root: str
    images: int
    checked: int
    unreadable: tuple[tuple[str, str], ...]

    @property
    def too_many(self) -> bool:
        """More unreadable files than ``unreadable_allowed``: for a whole tree, counted; for a
        sample, when even the low end of its count's noise (one-sided 99%) is past the share
        allowed, so a tree near the limit is left to the trainers' own count."""
        found, allowed = len(self.unreadable), unreadable_allowed(self.images)
        if self.checked >= self.images:
            return found > allowed
        return found - _Z99 * math.sqrt(found) > allowed * self.checked / self.images

    def error(self) -> str:
        """The one-line refusal, naming a few of the files."""
        shown = "; ".join(f"{p}: {e}" for p, e in self.unreadable[:3])
        whole = self.checked >= self.images
        found = (f"{len(self.unreadable)} of its {self.images} images" if whole else
                 f"{len(self.unreadable)} of {self.checked} images drawn from its "
                 f"{self.images}")
        if all(e.startswith(f"{ImageTooLarge.__name__}:") for _, e in self.unreadable[:3]):
            return (f"ImageFolder {self.root}: {found} are too large to decode (e.g. {shown}); "
                    "resize or tile them to a few times the training size, then start the "
                    "study again")
        return (f"ImageFolder {self.root}: {found} could not be decoded (e.g. {shown}); up to "
                f"{unreadable_allowed(self.images)} (1%, at least {_UNREADABLE_FEW}) are "
                "skipped, more means the tree itself is wrong (web pages or text saved under "
                "image names, cut-off downloads): repair or remove those files, then start "
                "the study again")


def check_images(spec: dict[str, Any], sample: int = _CHECK_SAMPLE, seed: int = 0
                 ) -> ImageCheck:
    """Decodes the ImageFolder tree ``spec`` names as a trainer will (every image of a tree of
    up to ``sample``, else ``sample`` drawn with ``seed``, the same each time), so a study
    refuses a tree that is mostly not images before its first trial instead of failing trials
    one by one. JPEGs decode at the training size's scale (``open_image``): no slower than a
    trainer reads them."""
    layout = read_layout(spec)
    paths = [p for p, _ in (*layout.train, *layout.val)]
    chosen = paths if len(paths) <= sample else random.Random(seed).sample(paths, sample)
    least = image_size_of(spec)
    bad = []
    for path in chosen:
        try:
            open_image(path, least)
        except Exception as e:  # noqa: BLE001 - any decoder error: the file, not the code
            bad.append((path, decode_error(e)))
    return ImageCheck(str(spec.get("path", "")), len(paths), len(chosen), tuple(bad))


def _val_counts(layout: Layout) -> list[int]:
    """The validation images of each class, in class order."""
    counts = [0] * len(layout.classes)
    for _, label in layout.val:
        counts[label] += 1
    return counts


def constant_answer(layout: Layout, k: int) -> tuple[float, list[str]]:
    """The top-``k`` validation accuracy of a model that answers the same ``k`` classes for
    every image (the most common ones in the validation set), and those classes: what a model
    that learnt nothing but the class counts scores. On balanced data, k / classes."""
    counts = _val_counts(layout)
    largest = sorted(range(len(counts)), key=lambda i: (-counts[i], i))[:k]
    share = sum(counts[i] for i in largest) / max(len(layout.val), 1)
    return share, [layout.classes[i] for i in largest]


def class_entropy(layout: Layout) -> float:
    """The validation cross-entropy (nats) of a model that gives every image the validation
    set's class shares: what a model that learnt nothing but the class counts scores (the
    classes' entropy; on balanced data, ln classes)."""
    counts = _val_counts(layout)
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts if c) if total else 0.0


_KINDS = "digits, imagefolder, synthetic, examples (a script of your own's data)"


def train_size(spec: dict[str, Any]) -> int:
    """Number of training images of ``spec``, without decoding any."""
    kind = spec.get("kind", "digits")
    if kind == "digits":
        return digits.DIGITS_TRAIN
    if kind == "synthetic":
        return int(spec.get("train_images", 512))
    if kind == "imagefolder":
        return len(read_layout(spec).train)
    if kind == "examples":
        return int(spec["train_examples"])
    raise ValueError(f"unknown data kind {kind!r}; allowed: {_KINDS}")


def image_size_default(spec: dict[str, Any]) -> int:
    """The training resolution of ``spec`` when it names none: the digits' 32 px, else 224."""
    return 32 if spec.get("kind", "digits") == "digits" else 224


def image_size_of(spec: dict[str, Any]) -> int:
    """The training resolution of ``spec``: its image_size, else ``image_size_default``."""
    return int(spec.get("image_size") or image_size_default(spec))


def num_classes(spec: dict[str, Any]) -> int | None:
    """Number of classes of ``spec``, without decoding any image; None for a script's own
    examples whose study file gives none (then nothing is at chance)."""
    kind = spec.get("kind", "digits")
    if kind == "examples":
        return int(spec["num_classes"]) if spec.get("num_classes") else None
    if kind == "imagefolder" and (spec.get("labels") or spec.get("val_labels")):
        return len(read_layout(spec).classes)
    if kind == "imagefolder":
        return len(_class_folders(_class_root(Path(str(spec["path"])), spec.get("val_split"))))
    if kind == "synthetic":
        return int(spec.get("num_classes", 1000))
    return 10


def open_source(spec: dict[str, Any], on_gpu: bool) -> Source:
    """The data source ``spec`` describes (``kind``: digits, imagefolder, synthetic)."""
    kind = spec.get("kind", "digits")
    if kind == "digits":
        train, val = digits.load(spec)
        return InMemory(train, val, 10)
    if kind == "synthetic":
        return Synthetic(spec, on_gpu)
    if kind == "imagefolder":
        return ImageFolderSource(spec, on_gpu)
    if kind == "examples":
        raise ValueError("data of kind examples are loaded by a script of your own "
                         "(trainer.program); the bundled trainer has no source for them")
    raise ValueError(f"unknown data kind {kind!r}; allowed: {_KINDS}")


_KEPT: dict[str, Source] = {}   # the source a process keeps across the trials of warm ranks


def kept_source(spec: dict[str, Any], on_gpu: bool) -> Source:
    """The data source ``spec`` describes, opened once per process and kept while trials use
    the same data (an ImageFolder tree is scanned once, its loader processes persist); another
    spec closes the kept one."""
    key = json.dumps([spec, on_gpu], sort_keys=True)
    if key not in _KEPT:
        for old in _KEPT.values():
            old.close()
        _KEPT.clear()
        _KEPT[key] = open_source(spec, on_gpu)
    return _KEPT[key]
