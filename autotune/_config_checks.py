"""What is wrong with a study config: every value checked against what it may be, before
anything is opened or written (``config.load`` raises the first problem in one line)."""

from __future__ import annotations

import difflib
import math
import os
import re
from typing import Any

from trainers.augment import AUGMENTATIONS
from trainers.protocol import ZERO_INIT_MODELS, falling_name
from trainers.sources import image_size_of

from .config import NAME, StudyConfig, storage_url_problem
from .errors import ConfigError

__all__ = ["problems", "cadence_warning", "DATA_KEYS"]

_METRICS = ("top1", "top5")
_DEVICES = ("cpu", "cuda")
# Seeds the samplers and trainers all take (NumPy's legacy seeding stops at 2**32 - 1, and a
# sampler adds a few thousand to the study's seed for its second stream).
SEED_MAX = 2**31 - 1

# The keys of trainer.data each kind takes.
DATA_KEYS = {"digits": ("kind", "image_size", "augment"),
             "synthetic": ("kind", "image_size", "num_classes", "train_images", "val_images"),
             "imagefolder": ("kind", "path", "image_size", "eval_size", "loader_workers",
                             "augment", "val_split", "labels", "val_labels", "image_column",
                             "label_column", "split_column"),
             "examples": ("kind", "train_examples", "num_classes")}
# The keys of an ImageFolder source that name a table of classes, or its columns.
_LABEL_KEYS = ("labels", "val_labels", "image_column", "label_column", "split_column")
# (low, high) of each whole-number key of trainer.data.
_DATA_RANGES = {"image_size": (8, 4096), "eval_size": (8, 4096), "num_classes": (2, 100_000),
                "train_images": (1, 10**9), "val_images": (1, 10**9), "loader_workers": (0, 64),
                "train_examples": (1, 10**12)}


def _data_problems(data: dict[str, Any], own: bool) -> list[tuple[str, str]]:
    kind = data.get("kind", "digits")
    if kind not in DATA_KEYS:
        return [("trainer.data.kind", f"{kind!r} is not allowed; use digits, imagefolder "
                 "(with path) or synthetic, or, for a script of your own that loads its data "
                 "itself (text, tables, anything), examples (with train_examples)")]
    if kind == "examples" and not own:
        return [("trainer.data.kind", "examples describes data a script of your own loads "
                 "itself (trainer.program: train.py); the bundled image classifier trains on "
                 "digits, imagefolder (with path) or synthetic")]
    found = []
    unknown = sorted(set(map(str, data)) - set(DATA_KEYS[kind]))
    if unknown:
        near = [(k, difflib.get_close_matches(k.lower(), DATA_KEYS[kind], n=1, cutoff=0.7))
                for k in unknown]
        said = "; ".join(f"did you mean {m[0]}?" for _, m in near if m)
        if "path" in unknown and kind == "examples":
            said = "; ".join(filter(None, [said, "your script opens its data itself: give it "
                                           "the path as a Fixed parameter of its space, "
                                           "declared in trainer.params"]))
        elif "path" in unknown and kind != "imagefolder":
            said = "; ".join(filter(None, [said, "a folder of images is kind: imagefolder"]))
        found.append(("trainer.data", f"has unknown key(s) {', '.join(unknown)}"
                      + (f" ({said})" if said else "") + f"; {'an' if kind[0] in 'aeiou' else 'a'}"
                      f" {kind} source takes {', '.join(DATA_KEYS[kind])}"))
    for key, (low, high) in _DATA_RANGES.items():
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            found.append((f"trainer.data.{key}", f"must be a whole number from {low} to "
                          f"{high}, got {value!r}"))
    split = data.get("val_split")
    if "val_split" in data and (isinstance(split, bool) or not isinstance(split, (int, float))
                                or not 0 < split < 1):
        found.append(("trainer.data.val_split", f"must be a share between 0 and 1 (0.1 holds "
                      f"out 10% of each class for validation), got {split!r}"))
    if "augment" in data and data["augment"] not in AUGMENTATIONS:
        found.append(("trainer.data.augment", f"{data['augment']!r} is not allowed; use one of "
                      f"{', '.join(AUGMENTATIONS)} (a search space may also search augment)"))
    for key in _LABEL_KEYS:
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            what = "a column's name" if "column" in key else "the path of a CSV file"
            found.append((f"trainer.data.{key}", f"must be {what}, got {data[key]!r}"))
    given = [k for k in _LABEL_KEYS[2:] if k in data]
    if given and "labels" not in data and "val_labels" not in data:
        found.append(("trainer.data", f"has {', '.join(given)} without labels (the CSV file of "
                      "the training images' classes) or val_labels (the validation images')"))
    if "val_labels" in data and "labels" not in data and "val_split" in data:
        found.append(("trainer.data.val_labels", "gives the validation images' classes, and "
                      "val_split holds some training images out for it again: drop one"))
    if "labels" in data and "val_split" in data and "val_labels" in data:
        found.append(("trainer.data.labels", "takes one of val_split (0.1 holds out 10% of each "
                      "class for validation) and val_labels (a CSV file of the validation "
                      "images' classes), not both"))
    if kind == "examples" and "train_examples" not in data:
        found.append(("trainer.data.train_examples", "must be set when kind is examples: the "
                      "number of examples (rows, sentences, images) one epoch of your script "
                      "trains on, which autotune counts steps and epochs by"))
    if kind == "imagefolder" and not (isinstance(data.get("path"), str) and data["path"]):
        found.append(("trainer.data.path", "must name the ImageFolder root (with train/ and "
                      "val/, or class folders and val_split) when kind is imagefolder"))
    return found


def _model_size_problem(model: str, size: int, eval_size: int | None = None) -> str | None:
    """Why torchvision's ``model``, built as the trainer builds it for ``size``-px training
    images, cannot take them (or ``eval_size``-px evaluation images), found by a forward pass
    on PyTorch's meta device (no memory, no arithmetic: well under a second), or None: it
    can, or the meta device cannot tell (a model whose set-up reads its weights)."""
    import torch
    import torchvision

    from trainers.models import model_kwargs

    try:
        with torch.device("meta"):    # built for these images (ViT checks its patches here)
            net = getattr(torchvision.models, model)(**model_kwargs(model, 2, size))
            net.train()(torch.empty(2, 3, size, size))
    except (RuntimeError, ValueError, AssertionError) as e:
        return _cannot_take(model, size, e)
    except Exception:  # noqa: BLE001 - an operation the meta device lacks: no verdict
        return None
    if eval_size is None or eval_size == size:
        return None
    try:
        with torch.device("meta"), torch.no_grad():
            net.eval()(torch.empty(2, 3, eval_size, eval_size))
    except (RuntimeError, ValueError, AssertionError) as e:
        return _cannot_take(model, eval_size, e)
    except Exception:  # noqa: BLE001 - an operation the meta device lacks: no verdict
        return None
    return None


def _cannot_take(model: str, size: int, e: BaseException) -> str | None:
    """The problem a meta forward pass at ``size`` px raised, None where it was the meta
    device's own limit."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if "meta" in first.lower():   # a step the meta device cannot take: no verdict
        return None
    return (f"{model} cannot take {size}-px images ({first[:140]}); set "
            "trainer.data.image_size (and eval_size) to a size it takes (224 suits every "
            "torchvision classification model) or choose another model")


def _model_names() -> list[str]:
    """The torchvision classification models a trainer can build."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def _closest_models(name: str, models: Any) -> str:
    """What to write instead of the model ``name``: the names it is closest to as written
    (ResNet-50 -> resnet50), else a few common ones."""

    squeezed = {re.sub(r"[^a-z0-9]", "", m.lower()): m for m in models}
    exact = squeezed.get(re.sub(r"[^a-z0-9]", "", name.lower()))
    near = [exact] if exact else difflib.get_close_matches(name.lower(), sorted(models), n=3,
                                                            cutoff=0.75)
    if near:
        return f"did you mean {', '.join(near[:-1])}{' or ' if len(near) > 1 else ''}{near[-1]}?"
    return "use for example resnet18, resnet50, convnext_tiny, efficientnet_b0 or vit_b_16"


def problems(cfg: StudyConfig) -> list[tuple[str, str]]:
    """(key, problem) for every invalid value of ``cfg``."""
    b, found = cfg.budget, []

    def check(ok: bool, key: str, message: str) -> None:
        if not ok:
            found.append((key, message))

    check(bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", cfg.study_name)), "study_name",
          f"{cfg.study_name!r} must be 1-100 letters, digits, '.', '_' or '-', starting with a "
          "letter or digit")
    from .programs import is_bundled

    own = not is_bundled(cfg.trainer.program)
    metric = cfg.target.metric
    check(metric in (*_METRICS, "loss") or (own and bool(NAME.fullmatch(metric))),
          "target.metric", f"{metric!r} is not allowed; use one of "
          f"{', '.join(_METRICS)}, or loss with mode: min (a script of your own may report any "
          "other name it gives trial.report)")
    check(cfg.target.mode != "max" or not falling_name(metric), "target.mode",
          f"{metric} is a metric that falls; give mode: min (reached at or below the value)")
    check(cfg.target.mode in ("max", "min"), "target.mode",
          f"{cfg.target.mode!r} is not allowed; use max (an accuracy, reached at or above the "
          "value) or min (a metric that falls, such as a loss, reached at or below it)")
    check(not (cfg.target.mode == "min" and cfg.target.metric in _METRICS), "target.mode",
          f"min is for a metric that falls (a loss); {cfg.target.metric} is an accuracy, which "
          "rises: leave mode out (max)")
    if cfg.target.mode == "min":
        check(0.0 < cfg.target.value < math.inf, "target.value",
              f"{cfg.target.value} must be above 0 for a metric that falls (mode: min): the "
              "loss, error rate or perplexity to get down to")
    else:
        check(0.0 < cfg.target.value <= 1.0, "target.value",
              f"{cfg.target.value} is outside (0, 1]"
              + ("; give the accuracy as a share of 1 (0.7 for 70%), or for a metric that "
                 "falls (a loss) give mode: min" if 1.0 < cfg.target.value < math.inf else ""))
    check(b.n_trials is None or 1 <= b.n_trials <= 1_000_000, "budget.n_trials",
          f"must be a positive integer up to 1000000, got {b.n_trials}")
    check(b.timeout_s is None or 0 < b.timeout_s < math.inf, "budget.timeout_s",
          f"must be positive, got {b.timeout_s}")
    check(0 < b.max_trial_s < math.inf, "budget.max_trial_s",
          f"must be positive, got {b.max_trial_s}")
    check(b.n_trials is not None or b.timeout_s is not None, "budget",
          "needs n_trials or timeout_s (or both), or the study never ends")
    check(0 <= cfg.workers <= 1024, "workers", f"must be 0 or more (up to 1024), got "
          f"{cfg.workers}")
    check(1 <= cfg.ranks_per_trial <= 4096, "ranks_per_trial",
          f"must be at least 1 (up to 4096), got {cfg.ranks_per_trial}")
    check(cfg.device in _DEVICES, "device",
          f"{cfg.device!r} is not allowed; use one of {', '.join(_DEVICES)}")
    check(0 <= cfg.seed <= SEED_MAX, "seed", f"must be from 0 to {SEED_MAX}, got {cfg.seed}")
    check(0.5 <= cfg.heartbeat_s <= 600, "heartbeat_s",
          f"must be within [0.5, 600] seconds, got {cfg.heartbeat_s}")
    check(cfg.trainer.checkpoint_every_s >= 0, "trainer.checkpoint_every_s",
          f"must be 0 (off) or positive, got {cfg.trainer.checkpoint_every_s}")
    check(cfg.trainer.max_micro_batch >= 1, "trainer.max_micro_batch",
          f"must be at least 1, got {cfg.trainer.max_micro_batch}")
    check(not cfg.trainer.probe_micro_batch or is_bundled(cfg.trainer.program),
          "trainer.probe_micro_batch", "measures the bundled image classifier's model on "
          "images, not a script of your own's: set trainer.max_micro_batch to what your "
          "script's step fits on one device, and drop probe_micro_batch")
    t = cfg.trainer
    check(0 <= t.eval_every_s < math.inf, "trainer.eval_every_s",
          f"must be 0 (off) or a positive number of seconds, got {t.eval_every_s}")
    check(t.eval_every_steps >= 0, "trainer.eval_every_steps",
          f"must be 0 (off) or a positive number of steps, got {t.eval_every_steps}")
    check(t.eval_batch >= 1, "trainer.eval_batch", f"must be at least 1, got {t.eval_batch}")
    check(t.num_classes is None or t.num_classes >= 2, "trainer.num_classes",
          f"must be at least 2, got {t.num_classes}")
    check(1 <= t.setup_limit_s <= 86400, "trainer.setup_limit_s",
          f"must be within [1, 86400] seconds, got {t.setup_limit_s}")
    check(math.isfinite(t.checkpoint_every_s), "trainer.checkpoint_every_s",
          f"must be a number of seconds, got {t.checkpoint_every_s}")
    check(cfg.pruner_margin >= 1.0, "pruner_margin", f"must be >= 1.0, got {cfg.pruner_margin}")
    from .modes import MODES

    check(cfg.pruner in MODES, "pruner",
          f"{cfg.pruner!r} is not allowed; use " + ", ".join(
              f"{name} ({mode.about})" for name, mode in MODES.items()))
    check(cfg.trainer.precision in ("bf16", "fp32"), "trainer.precision",
          f"{cfg.trainer.precision!r} is not allowed; use bf16 or fp32")
    found.extend(_program_problems(cfg))
    found.extend(_data_problems(cfg.trainer.data, own))
    if not found:
        models = _model_names()
        check(cfg.trainer.model in models, "trainer.model",
              f"{cfg.trainer.model!r} is not a torchvision classification model; "
              + _closest_models(str(cfg.trainer.model), models))
        if not own and cfg.trainer.model in models:
            data = cfg.trainer.data
            why = _model_size_problem(cfg.trainer.model, image_size_of(data),
                                      int(data["eval_size"]) if data.get("eval_size") else None)
            check(why is None, "trainer.model", str(why))
        check(not cfg.trainer.zero_init_residual
              or cfg.trainer.model.startswith(ZERO_INIT_MODELS), "trainer.zero_init_residual",
              f"applies to the ResNet family (resnet*, resnext*, wide_resnet*); "
              f"{cfg.trainer.model} has no residual blocks to zero-initialize: set it false")
    storage = storage_url_problem(cfg.storage)
    check(storage is None, "storage", str(storage))
    hosted = re.match(r"^(databricks|databricks-uc|uc)(:|$)", cfg.tracking_uri.strip(), re.I)
    check(hosted is None, "tracking_uri",
          f"{cfg.tracking_uri} is Databricks' hosted MLflow, which autotune does not record to "
          "(its experiments are workspace paths, and autotune names each after its study); "
          "give http(s)://HOST:PORT of an `mlflow server`, a database URL or a local folder")
    if cfg.tracking_uri.lower().startswith("file:") and os.environ.get(
            "MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        # MLflow 3 refuses its file store: every record would wait in the outbox for good
        folder = re.sub(r"^file:(//)?", "", cfg.tracking_uri) or "."
        check(False, "tracking_uri",
              f"{cfg.tracking_uri} is MLflow's file store, which MLflow {_mlflow_version()} "
              f"refuses; give the folder as a path ({folder}) for an SQLite store in it, or "
              "turn an existing file store into a database with `mlflow migrate-filestore`")
    return found


def _mlflow_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlflow")
    except PackageNotFoundError:
        return "3"


def _program_problems(cfg: StudyConfig) -> list[tuple[str, str]]:
    """What is wrong with the program a study runs and the parameters it declares."""
    from .plan import PARAMETERS
    from .programs import is_bundled, resolve_program

    t = cfg.trainer
    try:
        resolve_program(t.program, cfg.base_dir)
    except ConfigError as e:
        return [("trainer.program", str(e).removeprefix("trainer.program "))]
    if not isinstance(t.params, list) or not all(isinstance(n, str) for n in t.params):
        return [("trainer.params", f"must be a list of parameter names, got {t.params!r}")]
    if t.params and is_bundled(t.program):
        return [("trainer.params", f"declares parameters of your own script, but the program "
                 f"is the bundled {t.program!r}, which takes only the plan's; set "
                 "trainer.program to your script")]
    for name in t.params:
        if not NAME.fullmatch(name):
            return [("trainer.params", f"{name!r} is not a parameter name; use letters, "
                     "digits and '_', starting with a letter")]
        if name in PARAMETERS:
            return [("trainer.params", f"{name!r} is a plan parameter already; declare only "
                     "the names your script takes beyond the plan's")]
    return []


def cadence_warning(cfg: StudyConfig) -> str | None:
    """One line when the evaluation cadence the study sets cannot fit its trials' cap: a trial
    must evaluate to reach its target, and twice for the pruner to judge it."""
    every, cap = cfg.trainer.eval_every_s, cfg.budget.max_trial_s
    if every <= 0 or every * 2 <= cap:
        return None
    how = ("no trial evaluates before its cap, so none can reach" if every >= cap else
           "a trial evaluates once at most before its cap, too rarely to be judged")
    return (f"warning: trainer.eval_every_s {every:g} s against budget.max_trial_s {cap:g} s: "
            f"{how}; lower eval_every_s, or leave it and eval_every_steps unset for a cadence "
            "that fits (every epoch, and within epochs every max_trial_s / 8 s)")
