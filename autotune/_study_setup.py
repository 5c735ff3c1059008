"""Everything ``start study`` checks and settles before a study store is touched: paths made
absolute, this machine's folders and ranks, the data counted (``DataInfo``) and an ImageFolder
tree's images decoded (all, or a sample of a large tree), the search space
loaded and checked with its warm starts resolved; and, on a resume, the stored config
compared with this one."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import optuna

from . import __version__, record
from ._console import Print
from ._preflight import check_ranks, check_tracking_access, check_writable
from .config import (
    StudyConfig,
    config_changes,
    redact,
    resolve_tracking_uri,
    sqlite_file,
    sqlite_rows,
    sqlite_tables,
)
from .errors import ConfigError, PlanError, SpaceError
from .plan import Hardware, examples_noun, resolve, too_few_to_split
from .space import DataInfo, SearchSpace, check_space, load_space
from .store import foreign_study

__all__ = ["check_experiment", "check_resumed_config", "checked_space", "prepare"]


def _check_warm_starts(space: SearchSpace, cfg: StudyConfig, train_size: int) -> None:
    too_few = too_few_to_split(train_size, cfg.ranks_per_trial,     # no configuration
                               examples_noun(cfg.trainer.data))     # trains: not the warm
    if too_few:                                                     # start's fault
        raise ConfigError(f"ranks_per_trial {cfg.ranks_per_trial}: {too_few}")
    hardware = Hardware(world_size=cfg.ranks_per_trial, device=cfg.device,
                        max_micro_batch=cfg.trainer.max_micro_batch)
    for point in space.warm_starts:
        try:
            resolve(point, trainer=cfg.trainer.__dict__, train_size=train_size,
                    hardware=hardware, target=cfg.target.__dict__,
                    max_seconds=cfg.budget.max_trial_s)
        except PlanError as e:
            raise ConfigError(f"warm start {point} of space {space.name!r}: {e}") from e


def _absolute_data(cfg: StudyConfig) -> StudyConfig:
    """``cfg`` with an ImageFolder path and a weights file made absolute (``~`` the home
    folder, as a shell reads it; otherwise relative to the study file)."""
    if cfg.trainer.weights and cfg.trainer.weights.lower() != "imagenet" \
            and not Path(cfg.trainer.weights).is_absolute():
        given = Path(cfg.trainer.weights).expanduser()
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, weights=str(
            given if given.is_absolute() else (Path(cfg.base_dir) / given).resolve())))
    data = dict(cfg.trainer.data)
    if data.get("kind") != "imagefolder":
        return cfg
    for key in ("path", "labels", "val_labels"):   # the tree, and a table of its classes
        if not isinstance(data.get(key), str) or Path(data[key]).is_absolute():
            continue     # as written: a study started with it resumes without a change
        path = Path(data[key]).expanduser()
        data[key] = str(path if path.is_absolute() else (Path(cfg.base_dir) / path).resolve())
    if data == cfg.trainer.data:
        return cfg
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, data=data))


def _absolute_paths(cfg: StudyConfig) -> StudyConfig:
    """Local paths made absolute, so workers started elsewhere find the same folders."""
    _, artifacts = resolve_tracking_uri(cfg.tracking_uri)
    tracking = cfg.tracking_uri if artifacts is None else str(
        Path(cfg.tracking_uri).expanduser().resolve())
    return dataclasses.replace(cfg, tracking_uri=tracking,
                               run_dir=str(Path(cfg.run_dir).expanduser().resolve()))


def prepare(cfg: StudyConfig, echo: Print = lambda _: None
            ) -> tuple[StudyConfig, SearchSpace, int]:
    """Everything that can be checked before a store is touched: the config (paths absolute,
    its data's number of classes), the search space and the number of training images;
    ``echo`` says what the user should know (ranks that share cores on purpose)."""
    cfg = _absolute_paths(_absolute_data(cfg))
    _check_stores_apart(cfg)
    _check_outputs_outside_tree(cfg)
    check_writable(cfg.tracking_uri, "tracking_uri")
    check_writable(cfg.run_dir, "run_dir")
    check_tracking_access(resolve_tracking_uri(cfg.tracking_uri)[0])
    if cfg.workers >= 1:
        shared = check_ranks(cfg.device, cfg.ranks_per_trial, cfg.workers, cfg.oversubscribe,
                             "oversubscribe: true (or --oversubscribe)")
        if shared:
            echo(shared)
    checked = checked_space(cfg)
    _check_images(checked[0])
    return checked


def _check_outputs_outside_tree(cfg: StudyConfig) -> None:
    """Refuses a run folder or local MLflow store inside the folders an ImageFolder tree's
    classes are read from (a tree at the project folder itself, ``path: .`` with
    ``val_split``): the trainers would take them for classes without images, and the
    study's plots (.png) for training images."""
    data = cfg.trainer.data
    if data.get("kind") != "imagefolder" or data.get("labels"):
        return      # a table of classes names its images: no folder is read as a class
    root = Path(str(data.get("path", ""))).resolve()
    read = [root / "train" if (root / "train").is_dir() or data.get("val_split") is None
            else root]
    read += [root / name for name in ("val", "valid", "validation") if (root / name).is_dir()]
    _, artifacts = resolve_tracking_uri(cfg.tracking_uri)
    outputs = [("run_dir", cfg.run_dir)] + (
        [("tracking_uri", cfg.tracking_uri)] if artifacts is not None else [])
    for key, path in outputs:
        where = Path(path).resolve()
        inside = next((folder for folder in read if where.is_relative_to(folder)), None)
        if inside is not None:
            raise ConfigError(
                f"{key} {where} lies inside the ImageFolder tree's class folders ({inside}), "
                "where the study's own folders would be read as classes and its plots as "
                f"images: give {key} outside {inside}, or move the class folders into a "
                "folder of their own and give that as trainer.data.path")


def _check_stores_apart(cfg: StudyConfig) -> None:
    """Refuses a tracking URI that names the study database, or another study database:
    MLflow would create its tables in it, beside Optuna's, and both keep their schema version
    in a table of one name (``alembic_version``), so the first to write it breaks the other."""
    import sqlite3

    tracking, _ = resolve_tracking_uri(cfg.tracking_uri)
    mine, theirs = sqlite_file(cfg.storage), sqlite_file(tracking)
    if mine is not None and theirs is not None:
        same = mine.resolve() == theirs.resolve()
    else:   # one database server's URLs, the driver (postgresql+psycopg2) and options aside
        same = _bare(cfg.storage) == _bare(tracking)
    study_db = False
    if not same and theirs is not None and theirs.is_file():
        try:
            study_db = "studies" in sqlite_tables(theirs)
        except sqlite3.DatabaseError:   # not a database MLflow could use either: its own say
            study_db = False
    if same or study_db:
        what = "the study database (storage)" if same else "a study database"
        raise ConfigError(f"tracking_uri {redact(cfg.tracking_uri)} is {what}; "
                          "MLflow keeps its records in a database of its own: leave "
                          "tracking_uri at mlruns (the default) or name another")


def check_experiment(cfg: StudyConfig, uid: str | None, new: bool) -> None:
    """Refuses to resume a study whose MLflow experiment is in MLflow's trash (deleted in its
    UI), where a local store says so at once (read-only, without MLflow): MLflow takes no run
    in it, and the study's records would wait for good. A new study takes another name where
    its own is in the trash (``_outbox``), and a tracking server is asked by the records' own
    delivery, which says the same. The experiment is the one tagged with the study's ``uid``,
    or, for a study begun before autotune kept one, the one of its name."""
    import sqlite3

    from ._outbox import UID_TAG, deleted_experiment

    if new:
        return
    uri = resolve_tracking_uri(cfg.tracking_uri)[0]
    db = sqlite_file(uri)
    if db is None or not db.is_file():
        return
    try:
        if uid is None:
            rows = sqlite_rows(db, "SELECT experiment_id, lifecycle_stage, name FROM "
                                   "experiments WHERE name = ?", cfg.study_name)
        else:
            rows = sqlite_rows(db, "SELECT e.experiment_id, e.lifecycle_stage, e.name FROM "
                                   "experiments e JOIN experiment_tags t ON t.experiment_id = "
                                   "e.experiment_id WHERE t.key = ? AND t.value = ?", UID_TAG,
                               uid)
    except sqlite3.Error:
        return   # not readable so: MLflow's own client says what is wrong, when it records
    if rows and rows[0][1] == "deleted":
        raise ConfigError(deleted_experiment(str(rows[0][2]), str(rows[0][0]), uri))


def _bare(url: str) -> str:
    return re.sub(r"^([a-z]+)\+[a-z0-9]+://", r"\1://", url).split("?")[0].rstrip("/")


def _check_images(cfg: StudyConfig) -> None:
    """Refuses an ImageFolder tree with more unreadable files than a trainer skips
    (``trainers.sources.check_images``: every image of a tree of up to 1,000, else 1,000
    drawn), before any trial starts, instead of failing trials one by one."""
    if cfg.trainer.data.get("kind") != "imagefolder":
        return
    from trainers.sources import check_images

    check = check_images(cfg.trainer.data)
    if check.too_many:
        raise ConfigError(f"{cfg.source}: trainer.data: {check.error()}")


def checked_space(cfg: StudyConfig) -> tuple[StudyConfig, SearchSpace, int]:
    """The study's search space, loaded for its data and ranks and checked (names, values,
    feasibility, warm starts), with the config given its data's number of classes, and the
    number of training images; SpaceError or ConfigError at the first problem."""
    cfg = _absolute_data(cfg)
    from trainers.sources import (
        Layout,
        class_entropy,
        constant_answer,
        image_size_of,
        num_classes,
        read_layout,
        train_size,
    )

    from .programs import is_bundled

    layout: Layout | None = None
    classes: int | None
    try:
        if cfg.trainer.data.get("kind") == "imagefolder":
            layout = read_layout(cfg.trainer.data)     # the tree listed once
            size, classes = len(layout.train), len(layout.classes)
        else:
            size, classes = train_size(cfg.trainer.data), num_classes(cfg.trainer.data)
    except ValueError as e:
        raise ConfigError(f"{cfg.source}: trainer.data: {e}") from e
    if cfg.target.metric == "top5" and classes is not None and classes <= 5:
        raise ConfigError(f"{cfg.source}: target.metric top5 on data of {classes} classes: "
                          "the label is always among the top 5, so top-5 accuracy is 1 from "
                          "the first step; use metric: top1")
    if layout is not None and cfg.target.metric in ("top1", "top5"):  # a script's own metric
        _check_target_above_counts(cfg, *constant_answer(                # (an F1) scores a
            layout, 5 if cfg.target.metric == "top5" else 1))            # constant otherwise
    if cfg.target.metric == "loss" and is_bundled(cfg.trainer.program) and classes:
        _check_loss_below_prior(cfg, math.log(classes) if layout is None
                                else class_entropy(layout))
    kind = str(cfg.trainer.data.get("kind", "digits"))
    data = DataInfo(train_images=size, num_classes=classes,
                    image_size=None if kind == "examples" else image_size_of(cfg.trainer.data),
                    kind=kind)
    space = load_space(cfg.search_space, base_dir=cfg.base_dir, world_size=cfg.ranks_per_trial,
                       data=data)
    problems = [f"{space.source_file}: {p}" for p in check_space(space, own=cfg.trainer.params)]
    if problems:
        raise SpaceError(problems[0], problems=problems)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, num_classes=classes))
    _check_weights(cfg)
    _check_warm_starts(space, cfg, size)
    return cfg, space, size


def _check_weights(cfg: StudyConfig) -> None:
    """The weights file a study starts its models from: read, and loaded into the model
    built for the data's classes (the classifier replaced where they differ), once before
    any trial, so a file of another architecture is one line, not a failed trial each."""
    if not cfg.trainer.weights or cfg.trainer.program != "image_classifier":
        return    # a program of the user's own reads the plan's weights as it likes
    import torchvision

    from trainers.models import fit_weights, model_kwargs, read_weights, weights_file
    from trainers.sources import image_size_of

    try:
        state = read_weights(weights_file(cfg.trainer.weights, cfg.trainer.model),
                             cfg.trainer.model)
    except ValueError as e:
        raise ConfigError(f"{cfg.source}: trainer.{e}") from None
    classes = cfg.trainer.num_classes or 10     # the bundled trainer's data always have some
    model = getattr(torchvision.models, cfg.trainer.model)(**model_kwargs(
        cfg.trainer.model, classes, image_size_of(cfg.trainer.data)))
    try:
        fit_weights(model, state, cfg.trainer.model)
    except ValueError as e:
        raise ConfigError(f"{cfg.source}: trainer.weights {cfg.trainer.weights}: "
                          f"{str(e).removeprefix('weights ')}") from None


def _check_target_above_counts(cfg: StudyConfig, share: float, answer: list[str]) -> None:
    """A target that a model answering the most common class (classes, for top-5) for every
    validation image reaches measures nothing: on imbalanced data (most images one class) it
    is met at the first evaluation by a model that learnt only the class counts."""
    if cfg.target.value > share:
        return
    said = (f"always answers {answer[0]!r}: that class is" if len(answer) == 1 else
            f"always answers its {len(answer)} most common classes: they are")
    raise ConfigError(f"{cfg.source}: target.value {cfg.target.value:g} ({cfg.target.metric}) "
                      f"is reached by a model that {said} {share:.1%} of the validation "
                      f"images; set target.value above {share:.4g} (the accuracy that "
                      "counts is what a model adds to that)")


def _check_loss_below_prior(cfg: StudyConfig, prior: float) -> None:
    """A target on the bundled trainer's validation loss (cross-entropy, mode min) that a
    model answering every image with the class shares meets measures nothing either: that
    model's loss is the classes' entropy (ln 10 on ten balanced classes)."""
    if cfg.target.value < prior:
        return
    raise ConfigError(f"{cfg.source}: target.value {cfg.target.value:g} (loss) is met by a "
                      "model that gives every image the class shares, whose validation "
                      f"cross-entropy is {prior:.4g} (the classes' entropy); set "
                      f"target.value below {prior:.4g}")


def check_resumed_config(cfg: StudyConfig, study: optuna.Study, accept: bool,
                          echo: Print) -> None:
    """Refuses to resume ``study`` with a config that changes what it measures, and a study
    that is not autotune's (``foreign_study``)."""
    foreign = foreign_study(study)
    if foreign:
        raise ConfigError(f"study {cfg.study_name!r} in {redact(cfg.storage)} was not made by "
                          f"autotune ({foreign}); set another study_name, or another storage")
    stored = study.user_attrs.get(record.STUDY_CONFIG)
    if not isinstance(stored, dict):
        return
    changes = config_changes(stored, cfg.to_dict())
    moved = _moved_data(stored, cfg)
    if moved:
        changes = [c for c in changes if not c.startswith("trainer.data.path:")]
    written = study.user_attrs.get(record.STUDY_VERSION)
    if changes and not accept:
        release = ("" if written in (None, __version__) else
                   f" by autotune {written} (this is {__version__}: a setting it has that this "
                   f"release lacks is a change; install {written} to resume it as it was)")
        raise ConfigError(f"study {cfg.study_name!r} exists and was started{release} with "
                          f"another config ({'; '.join(changes)}); pass --accept-changes to "
                          "resume it with these, or set another study_name")
    if moved:
        echo(f"study {cfg.study_name!r}: its images moved from {moved} (no longer there) to "
             f"{cfg.trainer.data['path']}; resuming with the tree there")
    if changes:
        echo(f"resuming study {cfg.study_name!r} with changes: {'; '.join(changes)}")
    before, now = stored.get("tracking_uri"), redact(cfg.tracking_uri)
    if isinstance(before, str) and before and before != now:
        echo(f"study {cfg.study_name!r} recorded to MLflow at {before} until now; this run "
             f"records to {now} (give that store as --tracking-uri to keep its records in "
             "one place)")
    if written != __version__:
        if written is not None:
            echo(f"study {cfg.study_name!r} was last started with autotune {written}; resuming "
                 f"it with autotune {__version__} (workers that join need {__version__} too)")
        study.set_user_attr(record.STUDY_VERSION, __version__)
    if stored != cfg.public_dict():
        # Workers that join take the latest start's settings: its budget, folders and
        # MLflow store, the tree where it lies now.
        study.set_user_attr(record.STUDY_CONFIG, cfg.public_dict())


def _moved_data(stored: dict[str, Any], cfg: StudyConfig) -> str | None:
    """The stored ImageFolder path when the study's tree has moved to ``cfg``'s: the path
    the study was started with holds nothing now, and the tree at the new one has the study's
    number of classes (a path change that is not a move needs --accept-changes)."""
    trainer = stored.get("trainer")
    if not isinstance(trainer, dict):
        return None
    data = trainer.get("data")
    if not isinstance(data, dict) or data.get("kind") != "imagefolder":
        return None
    old, new = str(data.get("path", "")), str(cfg.trainer.data.get("path", ""))
    if not old or old == new or Path(old).exists() or trainer.get("num_classes") != (
            cfg.trainer.num_classes):
        return None
    return old


