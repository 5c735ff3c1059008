"""Images whose classes a CSV file gives (Kaggle's `train/*.jpg` and `train.csv`): read into
the layout of an ImageFolder tree, checked before anything is written, and trained by a real
study."""

from __future__ import annotations

import csv
from pathlib import Path

import optuna
import pytest

from autotune import config
from autotune.errors import ConfigError
from trainers.sources import check_images, num_classes, open_source, read_layout, train_size

from .conftest import run_cli

CLASSES = ("tabby", "beagle", "parrot")


def _images(root: Path, per_class: int, size: int = 24) -> list[tuple[str, str]]:
    """``per_class`` images of each class lying loose in ``root`` (named by an id, as Kaggle's
    come), each class a color with noise; their (id, class) rows."""
    import torch
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for i in range(per_class * len(CLASSES)):
        c = i % len(CLASSES)
        img = torch.rand(size, size, 3, generator=gen) * 0.5
        img[..., c] += 0.5
        name = f"{i * 7919 % 100003:05x}"
        Image.fromarray((img.clamp(0, 1) * 255).byte().numpy()).save(root / f"{name}.jpg")
        rows.append((name, CLASSES[c]))
    return rows


def _table(path: Path, header: list[str], rows: list[tuple[str, ...]], delimiter: str = ",",
           encoding: str = "utf-8") -> Path:
    with open(path, "w", newline="", encoding=encoding) as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _spec(tmp_path: Path, **data: object) -> dict[str, object]:
    return {"kind": "imagefolder", "path": str(tmp_path / "train"), "image_size": 16,
            "loader_workers": 0, **data}


def test_a_table_of_ids_and_classes_is_read_as_a_split_layout(tmp_path):
    rows = _images(tmp_path / "train", per_class=10)
    Path(tmp_path / "train" / "unlabelled.jpg").write_bytes(
        (tmp_path / "train" / f"{rows[0][0]}.jpg").read_bytes())        # not in the table
    table = _table(tmp_path / "train.csv", ["id", "label", "source"],
                   [(n, c, "web") for n, c in rows])
    spec = _spec(tmp_path, labels=str(table), val_split=0.2)
    layout = read_layout(spec)
    assert layout.classes == sorted(CLASSES)                       # as ImageFolder sorts
    assert len(layout.train) == 24 and len(layout.val) == 6       # 20% of each class
    assert sorted(i for _, i in layout.val) == [0, 0, 1, 1, 2, 2]
    assert {p for p, _ in read_layout(spec).val} == {p for p, _ in layout.val}   # every time
    classes = dict(rows)
    for path, index in layout.train + layout.val:                  # each image its own class
        assert layout.classes[index] == classes[Path(path).stem]
    assert not any("unlabelled" in p for p, _ in layout.train + layout.val)
    assert train_size(spec) == 24 and num_classes(spec) == 3
    source = open_source(spec, on_gpu=False)
    assert source.class_names() == sorted(CLASSES) and source.val_len == 6
    x, y = next(source.train_batches(0, seed=1, rank=0, world=1, per_rank=24, micro=8))
    assert x.shape == (8, 3, 16, 16) and y.shape == (8,)
    assert check_images(spec).images == 30


def test_names_with_endings_and_folders_numbered_classes_and_another_validation_table(
        tmp_path):
    rows = _images(tmp_path / "train" / "part1", per_class=4)
    numbered = [(f"part1/{n}.jpg", str([2, 10, 1][CLASSES.index(c)])) for n, c in rows]
    numbered[0] = (numbered[0][0].replace("/", "\\"), numbered[0][1])   # as Windows writes
    train = _table(tmp_path / "train.csv", ["file_name", "category"], numbered[:9])
    val = _table(tmp_path / "val.csv", ["file_name", "category"], numbered[9:])
    layout = read_layout(_spec(tmp_path, labels=str(train), val_labels=str(val)))
    assert layout.classes == ["1", "2", "10"]                      # by number, not as text
    assert (len(layout.train), len(layout.val)) == (9, 3)
    given = {k.replace("\\", "/"): c for k, c in numbered}
    assert all(layout.classes[i] == given[str(Path(p).relative_to(tmp_path / "train"))]
               for p, i in layout.train + layout.val)


@pytest.mark.parametrize("delimiter, encoding", [(";", "utf-8"), ("\t", "utf-16"),
                                                 (",", "utf-8-sig"), (",", "cp1252")])
def test_tables_as_spreadsheets_save_them_are_read(tmp_path, delimiter, encoding):
    """Excel writes a CSV file in Windows' code page, "CSV UTF-8" with a byte-order mark,
    and "Unicode text" in UTF-16 with tabs; much of Europe separates with semicolons."""
    rows = _images(tmp_path / "train", per_class=3)
    named = [(n, f"{c}-café") for n, c in rows]
    table = _table(tmp_path / "t.csv", ["Image", "Class"], named, delimiter, encoding)
    layout = read_layout(_spec(tmp_path, labels=str(table), val_split=0.3))
    assert layout.classes == sorted(f"{c}-café" for c in CLASSES)
    assert len(layout.train) + len(layout.val) == 9


@pytest.mark.parametrize("header, rows, data, message", [
    (["id", "breed", "source"], "ok", {},
     "has columns id, breed, source: none is named as the class column usually is .*set "
     "trainer.data.label_column to the column's name"),
    (["id", "breed"], "ok", {"label_column": "kind"},
     "label_column 'kind' is not a column of labels file .*; its columns: id, breed"),
    (["id", "label"], "missing", {}, "names 2 image.s. that are not under .* .e.g. 'nope1', "
                                     "'nope2'; 9 images lie there.; give as trainer.data.path"),
    (["id", "label"], "twice", {}, "has two classes .* several labels an image is not"),
    (["id", "label"], "ids", {}, "9 of the labels file's 9 classes have fewer than 2 images .*"
                                 "if that column is not the class, set trainer.data.label_column"),
    (["id", "label"], "one", {}, "gives every image one class .'x'.; a classifier needs at "
                                 "least 2"),
    (["id", "label"], "blank", {}, "line 3: no id or no label; every row names an image"),
    (["id", "label"], "none", {}, "has a header and no rows"),
    (["id"], "ok", {}, "has one column .'id'.; it needs a column naming each image and one "
                       "naming its class"),
    (["id", "label"], "ok", {"val_labels": "same"}, "9 image.s. are in both the labels and the "
                                                    "val_labels file"),
])
def test_a_table_that_cannot_label_the_images_is_refused_with_what_is_wrong(
        tmp_path, header, rows, data, message):
    named = _images(tmp_path / "train", per_class=3)
    body = {"ok": named, "missing": [*named, ("nope1", "tabby"), ("nope2", "tabby")],
            "twice": [*named, (named[0][0], "other")], "ids": [(n, n) for n, _ in named],
            "one": [(n, "x") for n, _ in named], "none": [],
            "blank": [named[0], (named[1][0], ""), *named[2:]]}[rows]
    table = _table(tmp_path / "t.csv", header, [r[:len(header)] for r in body])
    if data.get("val_labels") == "same":
        data = {"val_labels": str(table)}
    spec = _spec(tmp_path, labels=str(table), **({"val_split": 0.3} | data
                                                 if "val_labels" not in data else data))
    with pytest.raises(ValueError, match=message):
        read_layout(spec)


def test_a_tables_own_split_column_says_what_trains_validates_and_is_left_out(tmp_path):
    """Tables that come with their split (a `split` column of train, valid and test rows, as
    many exported data sets do): the test rows never train nor validate."""
    rows = _images(tmp_path / "train", per_class=6)
    parts = ["train", "train", "train", "valid", "Test", "train"]
    split = [(n, c, parts[i // 3 % 6]) for i, (n, c) in enumerate(rows)]
    table = _table(tmp_path / "t.csv", ["image", "label", "split"], split)
    layout = read_layout(_spec(tmp_path, labels=str(table)))
    part = {n: p for n, _, p in split}
    assert sorted(part[Path(p).stem] for p, _ in layout.train) == ["train"] * 12
    assert sorted(part[Path(p).stem] for p, _ in layout.val) == ["valid"] * 3
    assert layout.classes == sorted(CLASSES)
    with pytest.raises(ValueError, match="a split column with val rows. and val_split says it "
                                         "again: drop val_split"):
        read_layout(_spec(tmp_path, labels=str(table), val_split=0.2))
    # a split of train and test rows only: val_split holds out a share of the train rows
    no_val = _table(tmp_path / "n.csv", ["image", "label", "subset"],
                    [(n, c, "test" if p == "Test" else "train") for n, c, p in split])
    layout = read_layout(_spec(tmp_path, labels=str(no_val), val_split=0.25))
    assert len(layout.train) + len(layout.val) == 15 and len(layout.val) == 6
    with pytest.raises(ValueError, match="needs val_split .*, val_labels .* or a split column "
                                         "with val rows"):
        read_layout(_spec(tmp_path, labels=str(no_val)))
    odd = _table(tmp_path / "o.csv", ["image", "label", "partition"],
                 [(n, c, "fold3") for n, c, _ in split])
    with pytest.raises(ValueError, match="line 2: partition is 'fold3'; it says a row's part of "
                                         "the data: train, val .* or test .left out."):
        read_layout(_spec(tmp_path, labels=str(odd), val_split=0.2))
    named = _table(tmp_path / "x.csv", ["image", "label", "where"], split)
    layout = read_layout(_spec(tmp_path, labels=str(named), split_column="where"))
    assert len(layout.val) == 3
    with pytest.raises(ValueError, match="split_column 'part' is not a column"):
        read_layout(_spec(tmp_path, labels=str(named), split_column="part"))


def test_a_table_that_is_no_csv_text_is_named_as_what_it_is(tmp_path):
    _images(tmp_path / "train", per_class=2)
    (tmp_path / "train" / "anim.gif").write_bytes(b"GIF89a")      # a format not read
    for name, content, message in (
            ("book.xlsx", b"PK\x03\x04\x14\x00rest", "is a zip file .an Excel workbook.*save"),
            ("empty.csv", b"", "is empty; it needs a header line"),
            ("nul.csv", b"id,label\n\x00\x00", "is not a text file"),
            ("gif.csv", b"id,label\nanim.gif,a\n", "names 1 file.s. that are not images "
                                                   "autotune reads .e.g. 'anim.gif'.; allowed")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=message):
            read_layout(_spec(tmp_path, labels=str(tmp_path / name), val_split=0.3))
    # names relative to the table's folder (train/ID.jpg), the images' folder given as path
    rows = [(f"train/{p.name}", "a" if i % 2 else "b")
            for i, p in enumerate(sorted((tmp_path / "train").glob("*.jpg")))]
    beside = _table(tmp_path / "beside.csv", ["image", "label"], rows)
    with pytest.raises(ValueError, match=f"relative to: they lie under {tmp_path}, give that$"):
        read_layout(_spec(tmp_path, labels=str(beside), val_split=0.3))
    assert len(read_layout(_spec(tmp_path, labels=str(beside), val_split=0.3,
                                 path=str(tmp_path))).classes) == 2
    with pytest.raises(ValueError, match="labels file .*gone.csv does not exist"):
        read_layout(_spec(tmp_path, labels=str(tmp_path / "gone.csv"), val_split=0.3))


def _kaggle_imagenet(tmp_path: Path) -> tuple[Path, list[tuple[str, str]]]:
    """ImageNet as Kaggle gives it: ``ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG``, the
    validation images loose in ``val/``, and ``LOC_val_solution.csv`` of ImageId and
    PredictionString (each box a class and 4 corners, a trailing space); the validation
    images' ids and classes (CLASSES as wnids)."""
    root = tmp_path / "ILSVRC" / "Data" / "CLS-LOC"
    wnid = {c: f"n0{1440764 + 1000 * i}" for i, c in enumerate(CLASSES)}
    for name, c in _images(root / "train" / "all", per_class=4):
        (root / "train" / wnid[c]).mkdir(exist_ok=True)
        (root / "train" / "all" / f"{name}.jpg").rename(root / "train" / wnid[c] /
                                                       f"{wnid[c]}_{name}.JPEG")
    (root / "train" / "all").rmdir()
    rows = []
    for k, (name, c) in enumerate(_images(root / "val", per_class=2)):
        val_name = f"ILSVRC2012_val_{k:08d}"
        (root / "val" / f"{name}.jpg").rename(root / "val" / f"{val_name}.JPEG")
        boxes = " ".join(f"{wnid[c]} {3 + b} {4 + b} {20 + b} {21 + b}" for b in range(1 + k % 2))
        rows.append((val_name, boxes + " "))
    _table(tmp_path / "LOC_val_solution.csv", ["ImageId", "PredictionString"], rows)
    return root, [(n, b.split()[0]) for n, b in rows]


def test_imagenet_as_kaggle_gives_it_class_folders_and_a_table_of_boxes(tmp_path):
    # train/ in class folders, val/ loose with a table whose class cell holds detection boxes:
    # "val/ holds 6 images but no class folders" was all autotune said
    root, val_rows = _kaggle_imagenet(tmp_path)
    table = tmp_path / "LOC_val_solution.csv"
    plain = {"kind": "imagefolder", "path": str(root), "image_size": 16, "loader_workers": 0}
    with pytest.raises(ValueError, match="give val_labels: the CSV file of their classes"):
        read_layout(plain)
    spec = {**plain, "val_labels": str(table)}
    layout = read_layout(spec)
    assert layout.classes == sorted(f"n0{1440764 + 1000 * i}" for i in range(3))
    assert len(layout.train) == 12 and len(layout.val) == 6 and num_classes(spec) == 3
    assert sorted((Path(p).stem, layout.classes[i]) for p, i in layout.val) == sorted(val_rows)
    # names written from the root (val/ILSVRC2012_val_....) are found as well
    rows = [(f"val/{n}", f"{c} 1 2 3 4") for n, c in val_rows]
    from_root = _table(tmp_path / "from_root.csv", ["ImageId", "PredictionString"], rows)
    assert len(read_layout({**plain, "val_labels": str(from_root)}).val) == 6
    # a class name of words and a number ("grade 1") is no box: kept whole, so unknown here
    graded = _table(tmp_path / "graded.csv", ["image", "label"],
                    [(n, "grade 1") for n, _ in val_rows])
    with pytest.raises(ValueError, match="class.*that are no folder of .*train: grade 1"):
        read_layout({**plain, "val_labels": str(graded)})
    # boxes of two classes on one image: several labels, refused
    mixed = _table(tmp_path / "mixed.csv", ["ImageId", "PredictionString"],
                   [(val_rows[0][0], "n01440764 1 2 3 4 n01441764 5 6 7 8")])
    with pytest.raises(ValueError, match="has boxes of 2 classes .*several labels an image"):
        read_layout({**plain, "val_labels": str(mixed)})
    # without train/, there are no class folders to train from
    with pytest.raises(ValueError, match="val_labels without labels reads the training images "
                                         "from class folders"):
        read_layout({**plain, "path": str(root / "val"), "val_labels": str(table)})
    # and a study file takes it as it is
    (tmp_path / "study.yaml").write_text(
        f"trainer: {{data: {{kind: imagefolder, path: {root}, val_labels: {table}}}}}\n")
    assert config.load(str(tmp_path / "study.yaml")).trainer.data["val_labels"] == str(table)


@pytest.mark.parametrize("data, message", [
    ("labels: t.csv, val_split: 0.1, val_labels: v.csv",
     "trainer.data.labels takes one of val_split .* and val_labels .*, not both"),
    ("labels: t.csv, val_split: 0.1, split_column: ''", "split_column must be a column's name"),
    ("val_labels: v.csv, val_split: 0.1", "val_labels gives the validation images' classes, "
                                          "and val_split holds some .* again: drop one"),
    ("split_column: s", "has split_column without labels .* or val_labels"),
    ("labels: t.csv, val_split: 0.1, label_column: 3", "label_column must be a column's name"),
    ("labels: '', val_split: 0.1", "labels must be the path of a CSV file, got ''"),
])
def test_a_study_files_table_keys_are_checked(tmp_path, data, message):
    (tmp_path / "study.yaml").write_text(
        f"trainer: {{data: {{kind: imagefolder, path: train, {data}}}}}\n")
    with pytest.raises(ConfigError, match=message):
        config.load(str(tmp_path / "study.yaml"))


def test_a_worker_elsewhere_reads_the_table_that_moved_with_the_images(tmp_path):
    from autotune.worker import _local_data

    rows = _images(tmp_path / "here" / "train", per_class=3)      # Kaggle's: beside the
    _table(tmp_path / "here" / "train.csv", ["id", "label"], rows[3:])   # images' folder
    _table(tmp_path / "here" / "train" / "val.csv", ["id", "label"], rows[:3])   # or in it
    cfg = config.StudyConfig.from_dict({"study_name": "s", "trainer": {
        "num_classes": 3, "data": {"kind": "imagefolder", "path": str(tmp_path / "here/train"),
                                   "labels": str(tmp_path / "here" / "train.csv"),
                                   "val_labels": str(tmp_path / "here/train/val.csv"),
                                   "image_size": 16}}})
    (tmp_path / "here").rename(tmp_path / "mnt")       # mounted elsewhere on the worker
    local, size = _local_data(cfg, str(tmp_path / "mnt" / "train"))
    assert local.trainer.data["labels"] == str(tmp_path / "mnt" / "train.csv")
    assert local.trainer.data["val_labels"] == str(tmp_path / "mnt" / "train" / "val.csv")
    assert size == 6


def test_a_study_trains_on_images_a_table_labels(tmp_path):
    """Kaggle's layout (`train/ID.jpg` and `train.csv` of id and breed) trained by a real
    study, with the table named in the study file: no folders to make."""
    rows = _images(tmp_path / "data" / "train", per_class=60, size=32)
    _table(tmp_path / "data" / "train.csv", ["id", "breed"], rows)
    (tmp_path / "study.yaml").write_text(
        "study_name: pets\n"
        "trainer:\n"
        "  data: {kind: imagefolder, path: data/train, labels: data/train.csv, "
        "label_column: breed, val_split: 0.2, image_size: 32, loader_workers: 0}\n"
        "target: {metric: top1, value: 0.9}\n"
        "budget: {n_trials: 1, max_trial_s: 20}\n")
    result = run_cli("start", "study", "study.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    trial = optuna.load_study(study_name="pets",
                              storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials[0]
    assert trial.user_attrs["outcome"] in ("reached", "censored")
    assert trial.user_attrs["best_metric"] > 0.5          # 3 classes: chance is 1/3
    assert "search space images" in result.stdout
