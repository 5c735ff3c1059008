"""A careless or hostile user's inputs, table-driven: study files, flags, search spaces and CLI
verbs. Each must end with exit code 2 and one line on stderr that says what was wrong (the
expected words), with no traceback and no file, folder or database created in the working
folder. (The study server's own bad inputs are in test_server_auth.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main

from .conftest import run_cli

HEADER = "from autotune import Categorical, Derived, Fixed, Float, Int, PowerOfTwo, SearchSpace\n"
GOOD = ('PowerOfTwo("global_batch", 64, 256), Float("lr_per_256", 0.01, 1.0), '
        'Int("epochs", 2, 8)')


def _space(extra: str) -> str:
    return (f"{HEADER}\ndef space(world_size):\n"
            f"    return SearchSpace({GOOD}, {extra}, world_size=world_size)\n")


LONG = "z" * 300
TOO_LONG = "a name in this path is longer than the file system allows (255 bytes on most)"

# name: (study file text, expected words). Each file also gets `study_name: bad`.
STUDY_FILES: dict[str, tuple[str, str]] = {
    "unknown model": ("trainer: {model: resnet9000}\n", "not a torchvision classification"),
    "model written as a paper writes it": ("trainer: {model: ResNet-50}\n",
                                           "model 'ResNet-50' is not a torchvision "
                                           "classification model; did you mean resnet50?"),
    "model misspelt": ("trainer: {model: convnxt_tiny}\n", "did you mean convnext_tiny"),
    "model unlike any": ("trainer: {model: mymodel}\n", "use for example resnet18, resnet50"),
    "a key given twice": ("target: {metric: top1, value: 0.9}\ntarget: {metric: top1, "
                          "value: 0.8}\n", "key 'target' is given twice (lines 2 and 3); "
                          "keep one"),
    "a nested key given twice": ("budget:\n  n_trials: 3\n  n_trials: 4\n",
                                 "key 'n_trials' is given twice (lines 3 and 4)"),
    "model not a string": ("trainer: {model: 5}\n", "trainer.model must be a string"),
    # YAML's "\0" escape: Python refuses a path holding one with a traceback
    "a run folder holding a NUL": ('run_dir: "runs\\0x"\n', "run_dir holds a NUL character"),
    "a data path holding a NUL": ('trainer: {data: {kind: imagefolder, path: "/d\\0"}}\n',
                                  "trainer.data.path holds a NUL character (\\0, \\x00); no "
                                  "name, path or value may hold one: remove it"),
    "a key holding a NUL": ('"budget\\0": 3\n', "a key holds a NUL character"),
    # aliases nine deep of nine each (9 ** 9 values): every later step took hours
    "YAML aliases that expand past any study file": (
        "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)),
        "holds more than 100,000 values once its YAML aliases (*name) are expanded"),
    "a mapping that holds itself": ("trainer: &t {model: resnet18, self: *t}\n",
                                    "trainer.self holds itself (a YAML alias to a mapping"),
    "nesting deeper than the parser reads": ("x: " + "[" * 3000 + "]" * 3000 + "\n",
                                             "nested too deeply to read"),
    "nesting deeper than settings go": ("x: " + "[" * 40 + "]" * 40 + "\n",
                                        "is nested more than 32 levels deep"),
    "model that cannot take the images": (
        "trainer: {model: alexnet}\n", "alexnet cannot take 32-px images (Given input size"),
    "ViT evaluated at another size than it trains at": (
        "trainer: {model: vit_b_16, data: {kind: imagefolder, path: imgs, image_size: 32, "
        "eval_size: 48}}\n", "vit_b_16 cannot take 48-px images (Wrong image height!"),
    "ViT whose patches do not tile the images": (
        "trainer: {model: vit_b_16, data: {kind: digits, image_size: 40}}\n",
        "vit_b_16 cannot take 40-px images"),
    "a target that answering the most common class reaches": (
        "trainer: {data: {kind: imagefolder, path: skewed}}\ntarget: {metric: top1, value: "
        "0.85}\n", "target.value 0.85 (top1) is reached by a model that always answers 'a': "
        "that class is 90.0% of the validation images; set target.value above 0.9"),
    "a top-5 target that answering the 5 most common classes reaches": (
        "trainer: {data: {kind: imagefolder, path: skewed6}}\ntarget: {metric: top5, value: "
        "0.9}\n", "always answers its 5 most common classes: they are 90.0% of the validation "
        "images; set target.value above 0.9"),
    "unknown data kind": ("trainer: {data: {kind: parquet}}\n", "'parquet' is not allowed"),
    "unknown data key": ("trainer: {data: {kind: digits, imagesize: 64}}\n",
                         "unknown key(s) imagesize (did you mean image_size?); a digits source "
                         "takes kind, image_size"),
    "image_size zero": ("trainer: {data: {kind: digits, image_size: 0}}\n", "from 8 to 4096"),
    "image_size negative": ("trainer: {data: {kind: digits, image_size: -5}}\n",
                            "from 8 to 4096, got -5"),
    "image_size text": ("trainer: {data: {kind: digits, image_size: abc}}\n", "got 'abc'"),
    "image_size huge": ("trainer: {data: {kind: digits, image_size: 100000}}\n",
                        "from 8 to 4096"),
    "image_size bool": ("trainer: {data: {kind: digits, image_size: true}}\n", "got True"),
    "image_size float": ("trainer: {data: {kind: digits, image_size: 32.5}}\n", "got 32.5"),
    "synthetic one class": ("trainer: {data: {kind: synthetic, num_classes: 1}}\n",
                            "num_classes must be a whole number from 2"),
    "synthetic no images": ("trainer: {data: {kind: synthetic, train_images: 0}}\n",
                            "train_images must be"),
    "synthetic unknown key": ("trainer: {data: {kind: synthetic, path: x}}\n",
                              "unknown key(s) path"),
    "imagefolder without path": ("trainer: {data: {kind: imagefolder}}\n",
                                 "must name the ImageFolder root"),
    "imagefolder path not text": ("trainer: {data: {kind: imagefolder, path: 5}}\n",
                                  "must name the ImageFolder root"),
    "imagefolder missing": ("trainer: {data: {kind: imagefolder, path: /nonexistent}}\n",
                            "/nonexistent does not exist"),
    "imagefolder a file": ("trainer: {data: {kind: imagefolder, path: afile}}\n",
                           "afile is not a folder; give the root of a tree of class folders"),
    "imagefolder of phone photos": (
        "trainer: {data: {kind: imagefolder, path: phone}}\n",
        "1 class folder(s) hold no images (a); they hold 2 .heic files instead: convert the "
        ".heic files to .jpg or .png; allowed: .bmp"),
    "imagefolder an archive": (
        "trainer: {data: {kind: imagefolder, path: ILSVRC2012_img_val.tar}}\n",
        "ILSVRC2012_img_val.tar is a .tar archive, not a folder: extract it (tar xf "
        "ILSVRC2012_img_val.tar) and give the folder it makes"),
    "imagefolder negative workers": (
        "trainer: {data: {kind: imagefolder, path: imgs, loader_workers: -1}}\n",
        "loader_workers must be a whole number from 0 to 64"),
    "imagefolder eval_size zero": (
        "trainer: {data: {kind: imagefolder, path: imgs, eval_size: 0}}\n", "eval_size"),
    "imagefolder no class folders": ("trainer: {data: {kind: imagefolder, path: noclass}}\n",
                                     "has no class folders"),
    "imagefolder classes differ": ("trainer: {data: {kind: imagefolder, path: mismatch}}\n",
                                   "only in train/: b; only in val/: c"),
    "imagefolder flat val (as ImageNet's comes)": (
        "trainer: {data: {kind: imagefolder, path: flatval}}\n",
        "val/ holds 3 images but no class folders (as ImageNet's validation set comes); give "
        "val_labels"),
    "imagefolder empty val class": ("trainer: {data: {kind: imagefolder, path: emptyval}}\n",
                                    "val: 1 class folder(s) hold no images (b)"),
    "imagefolder empty train class": (
        "trainer: {data: {kind: imagefolder, path: emptytrain}}\n",
        "train: 1 class folder(s) hold no images (a)"),
    "imagefolder one class": ("trainer: {data: {kind: imagefolder, path: oneclass}}\n",
                              "needs at least 2"),
    "imagefolder val_split zero": (
        "trainer: {data: {kind: imagefolder, path: flat, val_split: 0}}\n",
        "val_split must be a share between 0 and 1"),
    "imagefolder val_split percent": (
        "trainer: {data: {kind: imagefolder, path: flat, val_split: 10}}\n",
        "val_split must be a share between 0 and 1 (0.1 holds out 10% of each class"),
    "imagefolder val_split text": (
        "trainer: {data: {kind: imagefolder, path: flat, val_split: ten}}\n", "got 'ten'"),
    "imagefolder val_split on a split tree": (
        "trainer: {data: {kind: imagefolder, path: imgs, val_split: 0.1}}\n",
        "has val/ already; val_split holds out a share of the training images only where"),
    "imagefolder flat tree without val_split": (
        "trainer: {data: {kind: imagefolder, path: flat}}\n",
        "it holds 2 folder(s) (a, b): if those are the classes, add val_split: 0.1"),
    "imagefolder val_split, a class of one image": (
        "trainer: {data: {kind: imagefolder, path: flatone, val_split: 0.2}}\n",
        "1 class folder(s) hold fewer than 2 images (one trains, one validates) (b)"),
    "imagefolder val missing": ("trainer: {data: {kind: imagefolder, path: noval}}\n",
                                "has train/ but no val/ (nor valid/ or validation/): add "
                                "val_split: 0.1"),
    "device cuda without a GPU": ("device: cuda\n", "no CUDA GPU"),
    "device tpu": ("device: tpu\n", "'tpu' is not allowed; use one of cpu, cuda"),
    "ranks beyond the cores": ("ranks_per_trial: 1000\n", "1000 ranks, but this machine has"),
    "workers x ranks beyond the cores": ("workers: 64\n", "128 ranks, but this machine has"),
    "ranks zero": ("ranks_per_trial: 0\n", "ranks_per_trial must be at least 1"),
    "ranks negative": ("ranks_per_trial: -1\n", "ranks_per_trial must be at least 1"),
    "ranks absurd": ("ranks_per_trial: 100000\n", "up to 4096"),
    "workers negative": ("workers: -1\n", "workers must be 0 or more"),
    "workers absurd": ("workers: 100000\n", "up to 1024"),
    "workers text": ("workers: many\n", "workers must be a whole number, got 'many'"),
    "oversubscribe text": ("oversubscribe: maybe\n", "oversubscribe must be true or false"),
    "tracking_uri in /proc": ("tracking_uri: /proc/nope/mlruns\n", "cannot be written"),
    "tracking_uri under a file": ("tracking_uri: afile/mlruns\n", "is a file, not a folder"),
    "run_dir in /proc": ("run_dir: /proc/nope/runs\n", "run_dir '/proc/nope/runs' cannot be"),
    "run_dir under a file": ("run_dir: afile/runs\n", "is a file, not a folder"),
    "run_dir a file": ("run_dir: afile\n", "is a file, not a folder"),
    "eval_every_s negative": ("trainer: {eval_every_s: -1}\n", "trainer.eval_every_s must be 0"),
    "eval_every_s infinite": ("trainer: {eval_every_s: .inf}\n", "trainer.eval_every_s"),
    "eval_every_steps negative": ("trainer: {eval_every_steps: -1}\n", "eval_every_steps must"),
    "eval_batch zero": ("trainer: {eval_batch: 0}\n", "eval_batch must be at least 1"),
    "num_classes one": ("trainer: {num_classes: 1}\n", "num_classes must be at least 2"),
    "checkpoint_every_s negative": ("trainer: {checkpoint_every_s: -1}\n",
                                    "checkpoint_every_s must be 0 (off) or positive"),
    "checkpoint_every_s nan": ("trainer: {checkpoint_every_s: .nan}\n", "checkpoint_every_s"),
    "max_micro_batch zero": ("trainer: {max_micro_batch: 0}\n", "max_micro_batch must be at"),
    "precision fp8": ("trainer: {precision: fp8}\n", "'fp8' is not allowed; use bf16 or fp32"),
    "warm_ranks text": ("trainer: {warm_ranks: maybe}\n", "warm_ranks must be true or false"),
    "probe_micro_batch number": ("trainer: {probe_micro_batch: 3}\n", "must be true or false"),
    "compile text": ("trainer: {compile: yes please}\n", "compile must be true or false"),
    "unknown trainer key": ("trainer: {modle: resnet18}\n", "unknown key(s) trainer.modle"),
    "trainer not a mapping": ("trainer: 5\n", "trainer must be a mapping"),
    "program not there": ("trainer: {program: ../../../../tmp/x/evil}\n",
                          "no file at /tmp/x/evil; name a bundled trainer"),
    "program a missing script": ("trainer: {program: /nonexistent/train.py}\n",
                                 "no file at /nonexistent/train.py"),
    "program not a trainer": ("trainer: {program: sources}\n", "is not a bundled trainer"),
    "own params not a list": ("trainer: {params: dropout}\n", "must be a list of parameter"),
    "metric top3": ("target: {metric: top3}\n", "'top3' is not allowed; use one of top1, top5"),
    "top5 on five classes": (
        "target: {metric: top5}\ntrainer: {data: {kind: synthetic, num_classes: 5}}\n",
        "target.metric top5 on data of 5 classes: the label is always among the top 5"),
    "target above 1": ("target: {value: 1.5}\n", "outside (0, 1]"),
    "target a percentage": ("target: {value: 70}\n", "outside (0, 1]; give the accuracy as a "
                            "share of 1 (0.7 for 70%)"),
    "target negative": ("target: {value: -0.1}\n", "outside (0, 1]"),
    "mode min on an accuracy": ("target: {metric: top1, mode: min, value: 0.5}\n",
                                "min is for a metric that falls (a loss); top1 is an accuracy"),
    "a loss without mode min": ("target: {metric: loss, value: 0.5}\n",
                                "loss is a metric that falls; give mode: min"),
    "mode not max or min": ("target: {metric: loss, mode: minimize, value: 0.5}\n",
                            "'minimize' is not allowed; use max"),
    "a falling target of 0": ("target: {metric: loss, mode: min, value: 0}\n",
                              "must be above 0 for a metric that falls"),
    "a loss the class shares meet": ("target: {metric: loss, mode: min, value: 2.4}\n",
                                     "is met by a model that gives every image the class "
                                     "shares, whose validation cross-entropy is 2.303"),
    "seed negative": ("seed: -1\n", "seed must be from 0 to 2147483647, got -1"),
    "zero_init_residual without residual blocks": (
        "trainer: {model: vit_b_16, zero_init_residual: true}\n",
        "trainer.zero_init_residual applies to the ResNet family"),
    "seed beyond 32 bits": ("seed: 5000000000\n", "seed must be from 0 to 2147483647"),
    "number YAML reads as text": ("budget: {max_trial_s: 1e12}\n",
                                  "got '1e12' (YAML read it as text: write an exponent with a "
                                  "dot and a sign, 1.0e+12"),
    "target infinite": ("target: {value: .inf}\n", "outside (0, 1]"),
    "target nan": ("target: {value: .nan}\n", "outside (0, 1]"),
    "target text": ("target: {value: high}\n", "target.value must be a number"),
    "target a list": ("target: [0.9]\n", "target must be a mapping"),
    "target a number": ("target: 0.9\n", "target must be a mapping, got 0.9 (target: "
                        "{metric: top1, value: 0.9})"),
    "target value quoted": ("target: {metric: top1, value: '0.9'}\n",
                            "target.value must be a number, got '0.9' (it is text, in quotes: "
                            "write 0.9 without them)"),
    "n_trials zero": ("budget: {n_trials: 0}\n", "budget.n_trials must be a positive integer"),
    "n_trials negative": ("budget: {n_trials: -3}\n", "budget.n_trials must be a positive"),
    "n_trials fraction": ("budget: {n_trials: 2.5}\n", "must be a whole number, got 2.5"),
    "n_trials absurd": ("budget: {n_trials: 100000000000000000000}\n", "up to 1000000"),
    "n_trials text": ("budget: {n_trials: all}\n", "must be a whole number, got 'all'"),
    "no end to the study": ("budget: {n_trials: null}\n", "needs n_trials or timeout_s"),
    "timeout negative": ("budget: {timeout_s: -1}\n", "budget.timeout_s must be positive"),
    "a name read as a number": ("search_space: 2024\n", "search_space must be a string, got "
                                "2024 (YAML read it as a number: quote it, '2024')"),
    "a name read as a boolean": ("trainer: {model: no}\n", "trainer.model must be a string, "
                                 "got False (YAML read it as true or false: put it in quotes)"),
    "target as a percentage": ("target: {value: 93%}\n", "target.value must be a number, "
                               "got '93%' (a share of 1: 0.93 for 93%)"),
    "timeout with a unit": ("budget: {timeout_s: 2h}\n", "budget.timeout_s must be a number, "
                            "got '2h' (a number of seconds: 7200 for 2h)"),
    "trial cap with a unit": ("budget: {max_trial_s: 90 s}\n", "(a number of seconds: 90 for "
                              "90 s)"),
    "timeout zero": ("budget: {timeout_s: 0}\n", "budget.timeout_s must be positive"),
    "timeout infinite": ("budget: {timeout_s: .inf}\n", "budget.timeout_s must be positive"),
    "max_trial_s zero": ("budget: {max_trial_s: 0}\n", "budget.max_trial_s must be positive"),
    "max_trial_s nan": ("budget: {max_trial_s: .nan}\n", "budget.max_trial_s must be positive"),
    "max_trial_s infinite": ("budget: {max_trial_s: .inf}\n", "budget.max_trial_s must be"),
    "budget a list": ("budget: [1]\n", "budget must be a mapping"),
    "unknown budget key": ("budget: {trials: 3}\n", "unknown key(s) budget.trials"),
    "heartbeat zero": ("heartbeat_s: 0\n", "heartbeat_s must be within [0.5, 600]"),
    "heartbeat an hour": ("heartbeat_s: 3600\n", "heartbeat_s must be within [0.5, 600]"),
    "seed text": ("seed: x\n", "seed must be a whole number, got 'x'"),
    "seed fraction": ("seed: 1.5\n", "seed must be a whole number, got 1.5"),
    "pruner unknown": ("pruner: asha\n", "'asha' is not allowed; use tta (autotune's sampler"),
    "pruner margin below 1": ("pruner_margin: 0.5\n", "pruner_margin must be >= 1.0"),
    "warm_start text": ("warm_start: maybe\n", "warm_start must be true or false"),
    "unknown top key": ("studyname: x\n", "unknown key(s) studyname"),
    "storage not a URL": ("storage: study.db\n", "is a file's path, not a database URL; for "
                          "an SQLite file write sqlite:///study.db"),
    "storage unknown scheme": ("storage: nosuch://x\n", "cannot open storage 'nosuch://x'"),
    "storage server without port": ("storage: autotune://host\n", "must be HOST:PORT"),
    "storage server port too high": ("storage: autotune://127.0.0.1:70000\n",
                                     "is not a port; use 1 to 65535"),
    "storage server down": ("storage: autotune://127.0.0.1:1\n",
                            "cannot reach the study server at 127.0.0.1:1: failed to connect"
                            " to all addresses"),   # gRPC's words, not its error object's
    "storage sqlite folder missing": ("storage: sqlite:////nonexistent/dir/a.db\n",
                                      "no folder /nonexistent/dir; create it first"),
    "storage postgres down": ("storage: postgresql://u:pw@127.0.0.1:1/x\n",
                              "cannot open storage 'postgresql://u:***@127.0.0.1:1/x'"),
    "space file missing": ("search_space: nowhere.py\n", "search space 'nowhere.py' not found"),
    "space syntax error": ("search_space: syntax.py\n", "raised SyntaxError"),
    "space file without space": ("search_space: nospace.py\n", "must define `space`"),
    "space with an unknown name": ("search_space: unknown.py\n", "'dropout' is not a plan"),
    "space with an unknown decay": ("search_space: zigzag.py\n", "zigzag"),
    "space with an unknown optimizer": ("search_space: adamw.py\n", "adamw"),
    "space with a runaway expression": ("search_space: runaway.py\n", "an exponent is at most"),
    "space with a text blow-up": ("search_space: textbomb.py\n", "arithmetic takes numbers"),
    "unknown augmentation": ("trainer: {data: {kind: digits, augment: mixup}}\n",
                             "'mixup' is not allowed; use one of none, flip, crop"),
    "augmentation of synthetic data": ("trainer: {data: {kind: synthetic, augment: flip}}\n",
                                       "unknown key(s) augment"),
    "space with an unknown augmentation": ("search_space: cutout.py\n",
                                           "augment: 'cutout' is not allowed"),
}

SPACES = {
    "syntax.py": "space = (\n",
    "nospace.py": "x = 1\n",
    "unknown.py": _space('Float("dropout", 0.0, 0.5)'),
    "zigzag.py": _space('Categorical("decay", ["cosine", "zigzag"])'),
    "adamw.py": _space('Fixed("optimizer", "adamw")'),
    "cutout.py": _space('Categorical("augment", ["none", "cutout"])'),
    "runaway.py": _space('Derived("warmup_epochs", "9**9**9")'),
    "textbomb.py": _space("""Derived("warmup_epochs", "'a' * 10**13")"""),
}


def _images(root: Path, train: dict[str, int], val: dict[str, int]) -> None:
    from PIL import Image

    for part, classes in (("train", train), ("val", val)):
        (root / part).mkdir(parents=True, exist_ok=True)
        for name, count in classes.items():
            (root / part / name).mkdir()
            for i in range(count):
                image = Image.new("RGB", (8, 8), (i * 30 % 255, 0, 0))
                image.save(root / part / name / f"{i}.png")


def _lay_out(folder: Path) -> None:
    """What the study files above refer to: spaces, a file, ImageFolder trees."""
    for name, text in SPACES.items():
        (folder / name).write_text(text)
    (folder / "afile").write_text("not a folder")
    (folder / "ILSVRC2012_img_val.tar").write_bytes(b"ustar")
    _images(folder / "phone", {"a": 0, "b": 2}, {"a": 1, "b": 1})
    for i in range(2):
        (folder / "phone" / "train" / "a" / f"IMG_{i}.HEIC").write_bytes(b"ftypheic")
    _images(folder / "imgs", {"a": 2, "b": 2}, {"a": 1, "b": 1})
    (folder / "noclass" / "train").mkdir(parents=True)
    (folder / "noclass" / "val").mkdir()
    _images(folder / "mismatch", {"a": 2, "b": 2}, {"a": 1, "c": 1})
    _images(folder / "emptyval", {"a": 2, "b": 2}, {"a": 1, "b": 0})
    _images(folder / "flatval", {"a": 2, "b": 2}, {})
    for i in range(3):
        (folder / "flatval" / "val" / f"ILSVRC2012_val_{i}.JPEG").write_bytes(b"\xff\xd8")
    _images(folder / "emptytrain", {"a": 0, "b": 2}, {"a": 1, "b": 1})
    _images(folder / "oneclass", {"a": 2}, {"a": 1})
    _images(folder / "skewed", {"a": 2, "b": 2}, {"a": 9, "b": 1})
    _images(folder / "skewed6", dict.fromkeys("abcdef", 1), {"a": 5, **dict.fromkeys("bcdef", 1)})
    _images(folder / "noval", {"a": 1, "b": 1}, {})
    (folder / "noval" / "val").rmdir()
    for name, counts in (("flat", {"a": 3, "b": 3}), ("flatone", {"a": 3, "b": 1})):
        _images(folder / name, counts, {})       # class folders right under the root
        (folder / name / "val").rmdir()
        for c in counts:
            (folder / name / "train" / c).rename(folder / name / c)
        (folder / name / "train").rmdir()


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _refused(argv: list[str], expected: str, folder: Path, capsys: pytest.CaptureFixture[str]
             ) -> None:
    before = _snapshot(folder)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("autotune: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert expected in err, err
    assert _snapshot(folder) == before, sorted(_snapshot(folder) - before)


@pytest.mark.parametrize("case", sorted(STUDY_FILES))
def test_a_bad_study_file_is_refused_in_one_line_before_anything_is_written(case, workdir,
                                                                            capsys):
    text, expected = STUDY_FILES[case]
    _lay_out(workdir)
    (workdir / "study.yaml").write_text("study_name: bad\n" + text)
    _refused(["start", "study", "study.yaml"], expected, workdir, capsys)


FLAGS = {
    "n-trials zero": (["--n-trials", "0"], "--n-trials must be a positive integer"),
    "timeout negative": (["--timeout", "-5"], "--timeout must be positive"),
    "max-trial-seconds zero": (["--max-trial-seconds", "0"], "--max-trial-seconds must be"),
    "workers negative": (["--workers", "-1"], "--workers must be 0 or more"),
    "workers beyond the cores": (["--workers", "64"], "or --oversubscribe"),
    "study-name with a space": (["--study-name", "a b"], "--study-name 'a b' must be"),
    "study-name too long": (["--study-name", "x" * 101], "must be 1-100 letters"),
    "storage a path": (["--storage", "study.db"],
                       "--storage 'study.db' is a file's path, not a database"),
    "storage in a missing folder": (["--storage", "sqlite:///nofolder/study.db"],
                                    "no folder nofolder; create it first"),
    "storage server without port": (["--storage", "autotune://h"], "must be HOST:PORT"),
    "storage whose driver is missing": (["--storage", "mysql://u@h/db"],
                                        "its database driver (Python module MySQLdb) is not "
                                        "installed; pip install mysqlclient"),
    "storage whose driver autotune cannot name": (
        ["--storage", "mysql+mariadbconnector://u@h/db"],
        "(Python module mariadb) is not installed; install the driver "
        "mysql+mariadbconnector URLs need"),
    "storage of a scheme no database has": (["--storage", "redis://localhost"],
                                            "redis:// is not a database autotune can keep "
                                            "studies in; give sqlite:///PATH (the default), "
                                            "postgresql://USER@HOST/DB"),
    "storage on a database that is down": (["--storage", "postgresql://u@127.0.0.1:1/x"],
                                           "Connection refused"),
    "ranks zero": (["--ranks", "0"], "--ranks must be at least 1"),
    "seed negative": (["--seed", "-5"], "seed must be from 0 to 2147483647, got -5"),
    "ranks beyond the cores": (["--ranks", "64"], "64 ranks, but this machine has"),
    "tracking-uri in /proc": (["--tracking-uri", "/proc/x/mlruns"], "cannot be written"),
    "tracking-uri MLflow's file store": (["--tracking-uri", "file:./mlr"],
                                         "--tracking-uri file:./mlr is MLflow's file store, "
                                         "which MLflow 3"),
    "tracking-uri of a scheme MLflow has no store for": (
        ["--tracking-uri", "ftp://x"], "tracking_uri ftp://x is not a store MLflow records to "
                                       "(ftp://); give http(s)://HOST:PORT"),
    "tracking-uri without a host": (["--tracking-uri", "http://:5000"],
                                    "tracking_uri http://:5000 names no host; give"),
    "tracking-uri on Databricks": (["--tracking-uri", "databricks"],
                                   "--tracking-uri databricks is Databricks' hosted MLflow"),
    "run-dir in /proc": (["--run-dir", "/proc/x/runs"], "cannot be written"),
    "seed huge is fine but n-trials text": (["--n-trials", "0", "--seed", "3"],
                                            "--n-trials must be"),
}


def test_a_flags_duration_with_a_unit_is_refused_with_its_seconds(workdir):
    result = run_cli("start", "study", "quickstart", "--timeout", "1h30m", cwd=workdir)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "argument --timeout: '1h30m' is not a number of seconds (5400 for 1h30m)" in \
        result.stderr, result.stderr
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("case", sorted(FLAGS))
def test_a_bad_flag_is_refused_in_one_line_naming_it(case, workdir, capsys):
    flags, expected = FLAGS[case]
    _refused(["start", "study", "quickstart", *flags], expected, workdir, capsys)


VERBS = {
    "missing study file": (["start", "study", "nope.yaml"], "study file 'nope.yaml' not found"),
    "study file of unknown type": (["start", "study", "afile"], "unknown file type"),
    "study file a folder": (["start", "study", "adir.yaml"], "'adir.yaml' is a folder"),
    "study file empty name": (["start", "study", ""], "no study file given (an empty name)"),
    "study file a device": (["start", "study", "/dev/null"],
                            "'/dev/null' is not a regular file (a device or a pipe)"),
    "study file not UTF-8": (["start", "study", "latin.yaml"], "cannot be read: not UTF-8"),
    "db upgrade of a missing SQLite file": (["db", "upgrade", "--storage", "sqlite:///n.db"],
                                            "no database at"),
    "status of a missing database": (["status", "nosuch"], "no study database at"),
    "status of a missing database, the study as a flag": (["status", "--study", "nosuch"],
                                                          "no study database at"),
    "status of two study names": (["status", "a", "--study", "b"],
                                  "two study names, 'a' and --study 'b'; give one"),
    "stop study of no study": (["stop", "study"], "which study? give its name: autotune stop "
                                                  "study STUDY"),
    "status on a server without port": (["status", "x", "--storage", "autotune://h"],
                                        "must be HOST:PORT"),
    "status on a server that is down": (["status", "x", "--storage", "autotune://127.0.0.1:1"],
                                        "cannot reach the study server"),
    "status on a path": (["status", "x", "--storage", "study.db"], "write sqlite:///study.db"),
    "status on a database whose driver is missing": (
        ["status", "x", "--storage", "postgresql+pg8000://u@h/db"],
        "(Python module pg8000) is not installed"),
    "worker on a missing database": (["worker", "--storage", "sqlite:///w.db", "--study", "x"],
                                     "no study database at"),
    "worker on a bad server address": (["worker", "--server", "nohost", "--study", "x"],
                                       "--server 'nohost' must be HOST:PORT"),
    "worker on a port too high": (["worker", "--server", "127.0.0.1:70000", "--study", "x"],
                                  "is not a port; use 1 to 65535"),
    "worker on a server that is down": (["worker", "--server", "127.0.0.1:1", "--study", "x"],
                                        "cannot reach the study server"),
    "worker with a missing hostfile": (["worker", "--storage", "sqlite:///w.db", "--study", "x",
                                        "--hostfile", "nohosts"], "--hostfile nohosts: no such"),
    "worker ranks per node zero": (["worker", "--storage", "sqlite:///w.db", "--study", "x",
                                    "--ranks-per-node", "0"], "--ranks-per-node must be at"),
    "db upgrade of a study server": (["db", "upgrade", "--storage", "autotune://127.0.0.1:1"],
                                     "is a study server: db upgrade needs a database"),
    "db upgrade of a path": (["db", "upgrade", "--storage", "study.db"], "not a database URL"),
    "db upgrade of a database whose driver is missing": (
        ["db", "upgrade", "--storage", "mysql://u@h/db"],
        "(Python module MySQLdb) is not installed"),
    "db upgrade of an unknown scheme": (["db", "upgrade", "--storage", "nosuch://x"],
                                        "cannot open nosuch://x: nosuch:// is not a database "
                                        "autotune can keep studies in; give sqlite:///PATH"),
    "db upgrade of a database that is down": (
        ["db", "upgrade", "--storage", "postgresql://u:pw@127.0.0.1:1/x"], "u:***@"),
    "space show of a missing file": (["space", "show", "nowhere.py"], "not found"),
    "space show for zero ranks": (["space", "show", "quickstart", "--world-size", "0"],
                                  "--world-size must be at least 1"),
    "space check for zero ranks": (["space", "check", "quickstart", "--world-size", "0"],
                                   "--world-size must be at least 1"),
    "ui on a port too high": (["ui", "--port", "70000"], "is not a port; use 1 to 65535"),
    "ui on a store that is not there": (["ui", "--tracking-uri", "nostore"], "nostore"),
    "ui on a scheme MLflow has no store for": (["ui", "--tracking-uri", "s3://b/x"],
                                               "--tracking-uri s3://b/x is not a store MLflow "
                                               "records to (s3://)"),
    "ui on a tracking server that is down": (["ui", "--tracking-uri", "http://127.0.0.1:1"],
                                             "the MLflow server at http://127.0.0.1:1 does "
                                             "not answer"),
    "start without study": (["start"], "the command is 'autotune start study'"),
    "start --help without study": (["start", "--help"], "'start' alone is not a command"),
    "space with an unknown verb": (["space", "list"], "'space list' is not a command; the "
                                   "commands are 'autotune space show' and 'autotune space "
                                   "check'"),
    "db without upgrade": (["db", "--storage", "sqlite:///x.db"], "'autotune db upgrade'"),
    # a name past the file system's 255 bytes: Python's path checks raise on it
    "a study file's name too long": (["start", "study", LONG + ".yaml"], TOO_LONG),
    "a study database's name too long": (["status", "--storage", f"sqlite:///{LONG}.db"],
                                         TOO_LONG),
    "a new study database's name too long": (["start", "study", "quickstart", "--storage",
                                              f"sqlite:///{LONG}.db"], TOO_LONG),
    "a run folder's name too long": (["start", "study", "quickstart", "--run-dir", LONG],
                                     TOO_LONG),
    "a space file's name too long": (["space", "check", LONG + ".py"], TOO_LONG),
    "an export file's name too long": (["export", "curves", "s", "--out", LONG + ".jsonl"],
                                       TOO_LONG),
    "an MLflow store's name too long": (["ui", "--tracking-uri", LONG], TOO_LONG),
}


@pytest.mark.parametrize("case", sorted(VERBS))
def test_a_bad_command_is_refused_in_one_line_and_writes_nothing(case, workdir, capsys):
    argv, expected = VERBS[case]
    (workdir / "afile").write_text("x")
    (workdir / "adir.yaml").mkdir()
    (workdir / "latin.yaml").write_bytes(b"study_name: caf\xe9\n")
    _refused(argv, expected, workdir, capsys)


def test_the_tables_hold_over_a_hundred_bad_inputs():
    assert len(STUDY_FILES) + len(FLAGS) + len(VERBS) >= 100


USAGE_MISTAKES = {
    "a flag given text for a number": (["start", "study", "quickstart", "--timeout", "abc"],
                                       "autotune start study: error: argument --timeout: "
                                       "'abc' is not a number of seconds"),
    "a flag without its value": (["status", "--storage"],
                                 "autotune status: error: argument --storage: expected one"),
    "a missing argument": (["space", "check"], "autotune space check: error: the following "
                                               "arguments are required: space"),
    "an unknown command": (["bogus"], "autotune: error: argument COMMAND: invalid choice"),
    "an unknown flag": (["start", "study", "quickstart", "--trials", "3"],
                        "autotune: error: unrecognized arguments: --trials 3"),
}


@pytest.mark.parametrize("case", sorted(USAGE_MISTAKES))
def test_a_usage_mistake_is_told_in_one_line_that_points_at_help(case, workdir, capsys):
    argv, expected = USAGE_MISTAKES[case]
    before = _snapshot(workdir)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(expected) and err.rstrip().endswith("--help)"), err
    assert _snapshot(workdir) == before


@pytest.mark.parametrize("what", ["study database", "not a database", "another application"])
def test_ui_on_a_database_that_is_no_mlflow_store_names_it_and_leaves_it_alone(what, workdir,
                                                                             capsys):
    # MLflow's UI migrated the study database (its tables beside Optuna's), then ended in a
    # traceback: "Can't locate revision identified by ..."
    import sqlite3

    import optuna

    from autotune import record

    path = workdir / "a.db"
    if what == "study database":
        study = optuna.create_study(study_name="s", storage=f"sqlite:///{path}")
        study.set_user_attr(record.STUDY_CONFIG, {"tracking_uri": "/srv/records/mlruns"})
        said = ("is a study database, not an MLflow store; its studies' records are at "
                "/srv/records/mlruns: autotune ui --tracking-uri /srv/records/mlruns")
    elif what == "not a database":
        path.write_text("step,top1\n")
        said = "is not an MLflow store (file is not a database)"
    else:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        said = "holds another application's tables, no MLflow records"
    before = path.read_bytes()
    assert main(["ui", "--tracking-uri", "sqlite:///a.db"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--tracking-uri sqlite:///a.db {said}" in err, err
    assert path.read_bytes() == before
    assert sorted(p.name for p in workdir.iterdir()) == ["a.db"]


def test_an_interrupt_before_any_trial_says_no_trial_was_failed(workdir, capsys):
    """Ctrl-C while the study is set up (here: a search space file that is interrupted as it
    is imported) names no running trial: there is none to fail or resume."""
    (workdir / "slow.py").write_text("raise KeyboardInterrupt\n")
    (workdir / "s.yaml").write_text("search_space: slow.py\n")
    assert main(["start", "study", "s.yaml"]) == 130
    assert capsys.readouterr().err == "autotune: interrupted\n"


@pytest.mark.parametrize("weights, says", [
    ("gone.pth", "trainer.weights {dir}/gone.pth: no such file"),
    ("notes.pth", "trainer.weights {dir}/notes.pth cannot be read as a state dict"),
    ("numbers.pth", "trainer.weights {dir}/numbers.pth hold no state dict (a list)"),
    ("squeezenet.pth", "trainer.weights {dir}/squeezenet.pth: do not fit resnet18 (missing: "
                       "conv1.weight, bn1.weight, bn1.bias, ...; not in it: features.0.weight"),
    ("saved34.pt", "trainer.weights {dir}/saved34.pt are a resnet34 model a trial saved; set "
                   "trainer.model: resnet34, or give weights of resnet18"),
])
def test_weights_that_cannot_start_the_model_are_refused_before_anything_is_written(
        weights, says, workdir, capsys):
    import torch
    import torchvision

    (workdir / "notes.pth").write_text("not weights")
    torch.save([1, 2, 3], workdir / "numbers.pth")
    torch.save(torchvision.models.squeezenet1_1().state_dict(), workdir / "squeezenet.pth")
    from trainers.models import MODEL_FORMAT

    torch.save({"format": MODEL_FORMAT, "model": "resnet34",
                "state_dict": {"fc.bias": torch.zeros(3)}}, workdir / "saved34.pt")
    (workdir / "study.yaml").write_text(f"study_name: bad\ntrainer: {{weights: {weights}}}\n")
    _refused(["start", "study", "study.yaml"], says.format(dir=workdir), workdir, capsys)


def test_a_path_the_system_refuses_is_named_with_what_to_do():
    # permission and read-only file systems cannot be staged as root: the decision alone
    import errno

    from autotune.errors import path_refused

    def said(code: int, path: str | None = "/srv/studies/a.db") -> str | None:
        return path_refused(OSError(code, "refused", path))

    assert said(errno.EACCES) == ("/srv/studies/a.db: permission denied; give a path this "
                                  "user may read and write, or change its permissions")
    assert said(errno.EPERM) == said(errno.EACCES)
    assert said(errno.EROFS) == ("/srv/studies/a.db: the file system is read-only; give a "
                                 "path on a writable one")
    assert said(errno.ENAMETOOLONG, "/x").startswith("/x: a name in this path is longer")
    assert said(errno.EACCES, None) is None          # no path to name: not this kind
    assert said(errno.EIO) is None                   # another error: its own traceback
    assert path_refused(ValueError("x")) is None
