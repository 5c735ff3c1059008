"""Images whose classes a table gives: a folder of images and a CSV file of (image, class)
rows, as Kaggle's and many labelling tools' data sets come (``train/*.jpg`` and
``train.csv``), read into the same layout as an ImageFolder tree's.

``spec`` keys: ``path`` (the folder the images lie under), ``labels`` (the CSV file),
``val_labels`` (a second one for validation; else ``val_split`` holds out a share of each
class, or the table's own split column says each row's part: train, val or test, the test
rows left out; ``val_labels`` without ``labels``: the training images are in class folders,
``path/train/<class>/*``, and the validation images in ``path/val/``, as Kaggle's ImageNet
comes), ``image_column``, ``label_column`` and ``split_column`` (else found by their names,
or the two columns of a two-column file). A class cell of detection boxes, each a class and
its 4 corners (``n01751748 111 82 342 240``), is that class. A row names an image by its path under
``path``, with or without its ending (``0a1b2c`` for ``0a1b2c.jpg``). Every problem is a
one-line ValueError that says what is wrong and what is allowed.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

__all__ = ["IMAGE_NAMES", "LABEL_NAMES", "SPLIT_NAMES", "labelled_layout"]

# Column names that hold the image, and the class, in the tables data sets come with (matched
# without regard to case, spaces or underscores), in order of preference.
IMAGE_NAMES = ("image", "imageid", "imagename", "imagepath", "img", "file", "filename",
               "filepath", "fname", "path", "id", "name")
LABEL_NAMES = ("label", "class", "classname", "labelname", "category", "target", "y")
# A column that says which part of the data a row is in, and what its values mean.
SPLIT_NAMES = ("split", "subset", "partition")
_PARTS = {"train": "train", "training": "train", "val": "val", "valid": "val",
          "validation": "val", "dev": "val", "test": None, "testing": None, "holdout": None}
_MAX_SHOWN = 3


def _key(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def _read_rows(path: Path, where: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the (line number, cells) of the CSV file ``path``; comma, semicolon or
    tab separated (as the first line shows), UTF-8 with or without a byte-order mark."""
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ValueError(f"{where} {path} {what}; give the CSV file of (image, class) rows")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{where} {path} cannot be read ({e.strerror or e})") from None
    if data.startswith(b"PK\x03\x04"):
        raise ValueError(f"{where} {path} is a zip file (an Excel workbook?); save the sheet "
                         "as a CSV file (UTF-8) and give that")
    # UTF-8 (with or without the byte-order mark Excel's "CSV UTF-8" writes), UTF-16 with its
    # mark (Excel's "Unicode text"), else Windows' own code page (Excel's plain "CSV")
    encodings = ("utf-16",) if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ("utf-8-sig",
                                                                           "cp1252")
    for encoding in encodings:
        try:
            text = data.decode(encoding)
            break
        except UnicodeDecodeError as e:
            problem = e
    else:
        raise ValueError(f"{where} {path} is not text in UTF-8, UTF-16 or Windows' code page "
                         f"({problem.reason} at byte {problem.start}); save it as a CSV file "
                         "in UTF-8") from None
    if "\x00" in text:
        raise ValueError(f"{where} {path} is not a text file (it holds NUL bytes: a "
                         "spreadsheet's own format?); save it as a CSV file in UTF-8")
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(f"{where} {path} is empty; it needs a header line naming its columns "
                         "(image,label) and a row per image")
    first = lines[0]
    delimiter = max((",", ";", "\t"), key=first.count)
    rows = list(csv.reader(lines, delimiter=delimiter))
    header = [h.strip() for h in rows[0]]
    stripped = ((n, [c.strip() for c in r]) for n, r in enumerate(rows[1:], start=2))
    body = [(n, cells) for n, cells in stripped if any(cells)]
    if len(header) < 2:
        raise ValueError(f"{where} {path} has one column ({header[0]!r}); it needs a column "
                         "naming each image and one naming its class")
    if not body:
        raise ValueError(f"{where} {path} has a header and no rows; give a row per image")
    return header, body


def _given(header: list[str], given: Any, key: str, where: str, path: Path) -> int:
    """The index of the column the study file's ``key`` names (``given``)."""
    if str(given) not in header:
        raise ValueError(f"{key} {given!r} is not a column of {where} {path}; its columns: "
                         f"{', '.join(header)}")
    return header.index(str(given))


def _column(header: list[str], given: Any, names: tuple[str, ...], what: str, key: str,
            where: str, path: Path, other: int | None = None) -> int:
    """The index of the column ``given`` names, else of the first whose name is one of
    ``names``, else the one column left of a two-column file (``other`` taken)."""
    if given:
        return _given(header, given, key, where, path)
    keys = [_key(h) for h in header]
    for name in names:
        if name in keys and keys.index(name) != other:
            return keys.index(name)
    if len(header) == 2 and other is not None:
        return 1 - other
    if len(header) == 2:
        return 0
    raise ValueError(f"{where} {path} has columns {', '.join(header)}: none is named as the "
                     f"{what} column usually is ({', '.join(names[:4])}, ...); set "
                     f"trainer.data.{key} to the column's name")


def _images_under(root: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Every image under ``root`` (links followed, each folder once) by its path relative to
    ``root``, and by that path without its ending (the paths it may stand for)."""
    from trainers.sources import _EXTENSIONS, _walk

    by_path: dict[str, str] = {}
    by_stem: dict[str, list[str]] = {}
    endings = set(_EXTENSIONS)
    for top, files in _walk(root):
        rel_top = os.path.relpath(top, root)
        prefix = "" if rel_top == "." else rel_top + os.sep
        for name in files:          # as _is_image judges a name, without a call per file
            stem, dot, ending = name.rpartition(".")
            if name.startswith(".") or not dot or "." + ending.lower() not in endings:
                continue
            full = os.path.join(top, name)
            by_path[prefix + name] = full
            by_stem.setdefault(prefix + stem, []).append(full)
    return by_path, by_stem


def _split_column(header: list[str], given: Any, where: str, path: Path,
                  taken: tuple[int, int]) -> int | None:
    """The column that says each row's part of the data (``split_column``, else one named
    split, subset or partition), or None."""
    if given:
        return _given(header, given, "split_column", where, path)
    keys = [_key(h) for h in header]
    return next((i for i, k in enumerate(keys) if k in SPLIT_NAMES and i not in taken), None)


def _named(table: Path, where: str, root: Path, spec: dict[str, Any],
           found: tuple[dict[str, str], dict[str, list[str]]]
           ) -> tuple[list[tuple[str, str]], dict[str, str] | None]:
    """The (image path, class name) rows of the table ``table``, each image found under
    ``root``, and where the table has a split column, each image's part (train or val; rows
    of the test part are left out)."""
    header, body = _read_rows(table, where)
    image = _column(header, spec.get("image_column"), IMAGE_NAMES, "image", "image_column",
                    where, table)
    label = _column(header, spec.get("label_column"), LABEL_NAMES, "class", "label_column",
                    where, table, other=image)
    if image == label:
        raise ValueError(f"image_column and label_column name the same column "
                         f"({header[image]!r}) of {where} {table}")
    split = _split_column(header, spec.get("split_column"), where, table, (image, label))
    parts: dict[str, str] | None = None if split is None else {}
    by_path, by_stem = found
    rows: dict[str, str] = {}
    missing: list[str] = []
    for line, cells in body:
        if len(cells) <= max(image, label) or not cells[image] or not cells[label]:
            raise ValueError(f"{where} {table}, line {line}: no {header[image]} or no "
                             f"{header[label]}; every row names an image and its class")
        part = None
        if split is not None:
            said = cells[split].lower() if len(cells) > split else ""
            if said not in _PARTS:
                raise ValueError(f"{where} {table}, line {line}: {header[split]} is "
                                 f"{said!r}; it says a row's part of the data: train, val "
                                 "(valid, validation, dev) or test (left out)")
            part = _PARTS[said]
            if part is None:
                continue                      # a test image: never trained nor validated
        name, cls = cells[image], cells[label]
        boxed = _box_classes(cls)
        if boxed is not None and len(boxed) > 1:
            raise ValueError(f"{where} {table}, line {line}: {name!r} has boxes of "
                             f"{len(boxed)} classes ({', '.join(sorted(boxed)[:_MAX_SHOWN])}); "
                             "a classifier takes one class an image (data with several "
                             "labels an image is not supported)")
        cls = cls if boxed is None else boxed.pop()
        rel = name if name in by_path or name in by_stem else os.path.normpath(name)
        if rel not in by_path and rel not in by_stem and "\\" in name:   # written on Windows
            rel = os.path.normpath(name.replace("\\", "/"))
        full = by_path.get(rel) or by_stem.get(rel, (None,))[0] or (
            name if os.path.isabs(name) and os.path.isfile(name) else None)
        if full is None:
            missing.append(name)
            continue
        if len(by_stem.get(rel, [])) > 1 and rel not in by_path:
            raise ValueError(f"{where} {table}, line {line}: {name!r} stands for several "
                             f"images under {root} ({', '.join(sorted(by_stem[rel])[:2])}); "
                             "name each with its ending")
        if rows.get(full, cls) != cls:
            raise ValueError(f"{where} {table}: {name!r} has two classes ({rows[full]!r} and "
                             f"{cls!r}); a classifier takes one class an image (data with "
                             "several labels an image is not supported)")
        rows[full] = cls
        if parts is not None and part is not None:
            parts[full] = part
    others = [m for m in missing if (root / m.replace("\\", "/")).is_file()]
    if others:
        from trainers.sources import _allowed

        shown = ", ".join(repr(m) for m in others[:_MAX_SHOWN])
        raise ValueError(f"{where} {table} names {len(others)} file(s) that are not images "
                         f"autotune reads (e.g. {shown}); allowed: {_allowed()}: convert them")
    if missing:
        shown = ", ".join(repr(m) for m in missing[:_MAX_SHOWN])
        beside = table.parent.resolve()      # names relative to the table's own folder?
        hint = (f": they lie under {beside}, give that" if beside != root.resolve() and all(
            (beside / m.replace("\\", "/")).is_file() for m in missing[:_MAX_SHOWN]) else "")
        raise ValueError(f"{where} {table} names {len(missing)} image(s) that are not under "
                         f"{root} (e.g. {shown}; {len(by_path)} images lie there); give as "
                         f"trainer.data.path the folder its image names are relative to{hint}")
    return list(rows.items()), parts


def _number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _box_classes(cell: str) -> set[str] | None:
    """The classes of a cell that holds detection boxes, each a class and its 4 corners
    (``n01751748 111 82 342 240 n01751748 9 12 40 80``, as Kaggle's ImageNet tables give an
    image's class), or None for any other cell (a class name, spaces and all)."""
    tokens = cell.split()
    if len(tokens) < 5 or len(tokens) % 5:
        return None
    if any(_number(t) == (i % 5 == 0) for i, t in enumerate(tokens)):
        return None
    return set(tokens[::5])


def _class_order(names: set[str]) -> list[str]:
    """The classes in label order: numerically where every name is a whole number (class 2
    before class 10), else alphabetically, as ImageFolder sorts its folders."""
    if all(n.lstrip("-").isdigit() for n in names):
        return sorted(names, key=int)
    return sorted(names)


def _folders_and_table(root: Path, spec: dict[str, Any]
                       ) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """Training images in class folders (``root/train/<class>/*``) and validation images in
    one folder (``root/val/``, else ``root``) whose classes the ``val_labels`` table gives, as
    Kaggle's ImageNet comes (``ILSVRC/Data/CLS-LOC`` and ``LOC_val_solution.csv``)."""
    from trainers.sources import _class_folders, _images, _val_folder

    if not (root / "train").is_dir():
        raise ValueError(f"val_labels without labels reads the training images from class "
                         f"folders, {root}/train/<class>/*, and {root}/train is not there; give "
                         "labels (the CSV file of the training images' classes) too")
    classes = _class_folders(root / "train")
    if len(classes) < 2:
        raise ValueError(f"{root}/train holds {len(classes)} class folder(s); a classifier "
                         "needs at least 2")
    lists = [_images(root / "train" / c) for c in classes]
    train = [(p, i) for i, files in enumerate(lists) for p in files]
    empty = [c for c, files in zip(classes, lists, strict=True) if not files]
    if empty:
        raise ValueError(f"{root}/train: {len(empty)} class folder(s) hold no images "
                         f"({', '.join(empty[:_MAX_SHOWN])})")
    val_root = _val_folder(root) or root
    table = Path(str(spec["val_labels"]))
    by_path, by_stem = _images_under(val_root)
    if val_root != root:      # names written from the root (val/x.JPEG) are found too
        prefix = val_root.name + os.sep
        by_path.update({prefix + k: v for k, v in list(by_path.items())})
        by_stem.update({prefix + k: v for k, v in list(by_stem.items())})
    named, _ = _named(table, "val_labels file", val_root, spec, (by_path, by_stem))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({c for _, c in named} - set(index))
    if unknown:
        raise ValueError(f"val_labels file {table} gives class(es) that are no folder of "
                         f"{root}/train: {', '.join(unknown[:_MAX_SHOWN])}; its classes are "
                         "the training folders' names")
    inside = {p for p, _ in train} & {p for p, _ in named}
    if inside:
        raise ValueError(f"{len(inside)} image(s) of the val_labels file lie in {root}/train "
                         f"(e.g. {sorted(inside)[0]}); an image trains or validates")
    return classes, train, [(p, index[c]) for p, c in named]


def labelled_layout(spec: dict[str, Any]) -> tuple[list[str], list[tuple[str, int]],
                                                     list[tuple[str, int]]]:
    """The classes and the training and validation (image path, class index) lists of the
    images under ``spec['path']`` that the CSV file ``spec['labels']`` gives classes
    (validation: ``val_labels``, else each class's ``val_split`` share, held out as a tree's)."""
    from trainers.sources import _held_out

    root = Path(str(spec.get("path", "")))
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise ValueError(f"the images' folder {root} {what}; give as path the folder the "
                         "labels file's image names are relative to")
    if not spec.get("labels"):
        return _folders_and_table(root, spec)
    found = _images_under(root)
    train, parts = _named(Path(str(spec["labels"])), "labels file", root, spec, found)
    val: list[tuple[str, str]] = []
    if parts is not None and "val" in parts.values():    # the table's own split
        if spec.get("val_labels") or spec.get("val_split") is not None:
            given = "val_labels" if spec.get("val_labels") else "val_split"
            raise ValueError(f"the labels file says each image's part (a split column with "
                             f"val rows) and {given} says it again: drop {given}")
        val = [(p, c) for p, c in train if parts[p] == "val"]
        train = [(p, c) for p, c in train if parts[p] == "train"]
    elif spec.get("val_labels"):
        val, _ = _named(Path(str(spec["val_labels"])), "val_labels file", root, spec, found)
        both = {p for p, _ in train} & {p for p, _ in val}
        if both:
            raise ValueError(f"{len(both)} image(s) are in both the labels and the val_labels "
                             f"file (e.g. {sorted(both)[0]}); an image trains or validates")
    elif spec.get("val_split") is None:
        raise ValueError("a labels file needs val_split (0.1 holds out 10% of each class for "
                         "validation), val_labels (a CSV file of the validation images) or a "
                         "split column with val rows")
    classes = _class_order({c for _, c in train})
    unknown = sorted({c for _, c in val} - set(classes))
    if unknown:
        raise ValueError(f"the validation images have class(es) no training image has: "
                         f"{', '.join(unknown[:_MAX_SHOWN])}; validation needs the training "
                         "classes")
    index = {c: i for i, c in enumerate(classes)}
    if len(classes) < 2:
        raise ValueError(f"the labels file gives every image one class ({classes[0]!r}); a "
                         "classifier needs at least 2")
    if val:
        return (classes, [(p, index[c]) for p, c in train], [(p, index[c]) for p, c in val])
    members: dict[str, list[str]] = {c: [] for c in classes}
    for p, c in train:
        members[c].append(p)
    few = [c for c in classes if len(members[c]) < 2]
    if few:
        raise ValueError(f"{len(few)} of the labels file's {len(classes)} classes have fewer "
                         f"than 2 images (one trains, one validates): "
                         f"{', '.join(repr(c) for c in few[:_MAX_SHOWN])}; if that column is "
                         "not the class, set trainer.data.label_column")
    held: set[str] = set()
    for c in classes:
        held |= _held_out(members[c], float(spec["val_split"]))
    return (classes, [(p, index[c]) for p, c in train if p not in held],
            [(p, index[c]) for p, c in train if p in held])
