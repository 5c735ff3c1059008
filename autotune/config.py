"""Study configuration: a YAML or TOML study file, overridden by command-line flags.

Precedence: flag > study file > default. Every key is declared here; unknown keys are
rejected with the list of allowed ones. Validation is pure: it opens no database and writes
nothing, so a bad file leaves no trace.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from trainers.augment import AUGMENTATIONS

from .errors import ConfigError

__all__ = ["StudyConfig", "Target", "Budget", "TrainerConfig", "load", "shipped_studies",
           "resolve_tracking_uri", "cadence_warning", "default_space"]

_METRICS = ("top1", "top5")
_DEVICES = ("cpu", "cuda")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class Target:
    metric: str = "top1"             # top1 | top5: the validation metric to reach
    value: float = 0.97              # in (0, 1]


@dataclass(frozen=True)
class Budget:
    n_trials: int | None = 12        # finished trials the study should hold; None: no limit
    timeout_s: float | None = None   # seconds for this run of the study; None: no limit
    max_trial_s: float = 60.0        # training seconds after which a trial is stopped


@dataclass(frozen=True)
class TrainerConfig:
    program: str = "image_classifier"       # a bundled trainer (a module of trainers/), or
                                            # your own script: a .py path (relative to the
                                            # study file) or a module name (autotune.programs)
    program_sha256: str = ""                # set by autotune: the script's content, so every
                                            # worker runs what the study started with
    params: list[str] = field(default_factory=list)   # names your own script takes beyond
                                            # the plan's, which its search space may set
    model: str = "resnet18"                 # a torchvision model
    num_classes: int = 10
    data: dict[str, Any] = field(default_factory=lambda: {"kind": "digits", "image_size": 32})
    max_micro_batch: int = 64               # images per rank per forward pass
    probe_micro_batch: bool = False         # lower that cap to what a short memory probe
                                            # finds fits on this worker's devices
    eval_every_steps: int = 0               # evaluate every k optimizer steps; 0: off
    eval_every_s: float = 0.0               # evaluate every s training seconds; 0: off
                                            # (both off: at the end of every epoch)
    eval_batch: int = 256
    no_wd_on_bn_bias: bool = True
    zero_init_residual: bool = False
    precision: str = "bf16"                 # on GPUs: bf16 autocast or fp32; CPUs use fp32
    compile: bool = False                   # torch.compile the model
    setup_limit_s: float = 600.0            # launch to first step at most (model, data,
                                            # DeepSpeed); past it: failed as setup_timeout
    checkpoint_every_s: float = 60.0        # a checkpoint at the first evaluation after this
                                            # many training seconds, so a trial whose worker
                                            # dies resumes from there; 0: only on SIGTERM
    warm_ranks: bool = True                 # keep a worker's trainer ranks between its trials
                                            # (when the program serves plans: its start
                                            # report says so); false: a fresh launch each


@dataclass(frozen=True)
class StudyConfig:
    study_name: str = "quickstart"
    search_space: str = "quickstart"        # a shipped space or a path to a Python file;
                                            # unset: quickstart for digits, else images
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    target: Target = field(default_factory=Target)
    budget: Budget = field(default_factory=Budget)
    workers: int = 1                        # local workers, one trial at a time each; 0: none,
                                            # remote `autotune worker`s join the study
    ranks_per_trial: int = 2                # DeepSpeed ranks of each trial
    device: str = "cpu"                     # cpu | cuda
    storage: str = "sqlite:///autotune.db"  # Optuna storage URL
    tracking_uri: str = "mlruns"            # MLflow tracking URI, or a local store directory
    run_dir: str = "autotune-runs"          # each trial's plan, command and log go here
    seed: int = 0
    warm_start: bool = True                 # enqueue the space's known-good configurations
    pruner_margin: float = 1.0              # stop once elapsed > margin x best TTA
    pruner: str = "tta"                     # tta (autotune's); median or none: Optuna's
                                            # MedianPruner or no pruning, for comparisons
    oversubscribe: bool = False             # let local ranks outnumber this machine's cores
                                            # (or GPUs), on purpose
    heartbeat_s: float = 10.0               # workers beat this often; one silent for 1.5
                                            # beats is given up and its trial resumed elsewhere
    source: str = ""                        # where the config came from (file path or name)
    base_dir: str = "."                     # relative paths in the file are relative to this

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def public_dict(self) -> dict[str, Any]:
        """``to_dict`` with the storage URL's password left out: what the study store, MLflow
        and run folders keep (workers bring their own credentials)."""
        return {**self.to_dict(), "storage": redact(self.storage)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "stored config") -> StudyConfig:
        """The config stored with a study (``to_dict``), for workers that join it."""
        values = {k: v for k, v in data.items() if k not in ("source", "base_dir")}
        cfg: StudyConfig = _build(cls, values, where)
        return dataclasses.replace(cfg, source=str(data.get("source", where)),
                                   base_dir=str(data.get("base_dir", ".")))


_SECTIONS = {"trainer": TrainerConfig, "target": Target, "budget": Budget}


def shipped_studies() -> list[str]:
    """Names of the study files that ship with autotune."""
    folder = resources.files("autotune") / "studies"
    return sorted(p.name.rsplit(".", 1)[0] for p in folder.iterdir()
                  if p.name.endswith((".yaml", ".toml")))


def _read(source: str) -> tuple[dict[str, Any], str, Path]:
    path = Path(source)
    if not path.suffix and source in shipped_studies():
        path = Path(str(resources.files("autotune") / "studies" / f"{source}.yaml"))
    if not path.is_file():
        names = ", ".join(shipped_studies())
        raise ConfigError(f"study file {source!r} not found; give a YAML or TOML file or a "
                          f"shipped study ({names})")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"{path}: unknown file type {path.suffix!r}; use .yaml, .yml "
                              "or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        first = " ".join(str(e).split())
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {first}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the study file must be a mapping of keys to values")
    data = {str(k): v for k, v in data.items()}
    return data, str(path), path.resolve().parent


def _check_keys(data: dict[str, Any], cls: type, where: str, prefix: str) -> None:
    allowed = [f.name for f in dataclasses.fields(cls) if f.name not in ("source", "base_dir")]
    unknown = sorted(set(data) - set(allowed), key=str)
    if unknown:
        names = ", ".join(f"{prefix}{k}" for k in unknown)
        raise ConfigError(f"{where}: unknown key(s) {names}; allowed in "
                          f"{prefix.rstrip('.') or 'the study file'}: {', '.join(allowed)}")


def _typed(value: Any, kind: Any, where: str) -> Any:
    """``value`` converted to the field type ``kind`` (a string annotation), or an error."""
    optional = "None" in kind
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where} must be set")
    base = kind.replace(" | None", "")
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str), "bool": isinstance(value, bool)}
    if base in ok and not ok[base]:
        what = {"float": "a number", "int": "a whole number", "bool": "true or false",
                "str": "a string"}[base]
        raise ConfigError(f"{where} must be {what}, got {value!r}")
    if base.startswith("dict") and not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {value!r}")
    return float(value) if base == "float" else value


def _build(cls: type, data: dict[str, Any], where: str, prefix: str = "") -> Any:
    """``cls`` from ``data``; ``where`` names the file, ``prefix`` the section, in errors."""
    _check_keys(data, cls, where, prefix)
    kinds = {f.name: f.type for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key} must be a mapping, got {value!r}")
            values[key] = _build(_SECTIONS[key], value, where, f"{key}.")
        else:
            values[key] = _typed(value, str(kinds[key]), f"{where}: {prefix}{key}")
    return cls(**values)


# Command-line flags that override study-file keys, for error messages and the CLI.
FLAGS = {"budget.n_trials": "--n-trials", "budget.timeout_s": "--timeout",
         "budget.max_trial_s": "--max-trial-seconds", "storage": "--storage",
         "tracking_uri": "--tracking-uri", "workers": "--workers", "study_name": "--study-name",
         "ranks_per_trial": "--ranks", "seed": "--seed", "device": "--device",
         "run_dir": "--run-dir", "warm_start": "--no-warm-start",
         "oversubscribe": "--oversubscribe"}

# The keys of trainer.data each kind takes.
DATA_KEYS = {"digits": ("kind", "image_size", "augment"),
             "synthetic": ("kind", "image_size", "num_classes", "train_images", "val_images"),
             "imagefolder": ("kind", "path", "image_size", "eval_size", "loader_workers",
                             "augment")}
# (low, high) of each whole-number key of trainer.data.
_DATA_RANGES = {"image_size": (8, 4096), "eval_size": (8, 4096), "num_classes": (2, 100_000),
                "train_images": (1, 10**9), "val_images": (1, 10**9), "loader_workers": (0, 64)}


def _data_problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    kind = data.get("kind", "digits")
    if kind not in DATA_KEYS:
        return [("trainer.data.kind", f"{kind!r} is not allowed; use digits, imagefolder "
                 "(with path) or synthetic")]
    found = []
    unknown = sorted(set(map(str, data)) - set(DATA_KEYS[kind]))
    if unknown:
        found.append(("trainer.data", f"has unknown key(s) {', '.join(unknown)}; a {kind} "
                      f"source takes {', '.join(DATA_KEYS[kind])}"))
    for key, (low, high) in _DATA_RANGES.items():
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            found.append((f"trainer.data.{key}", f"must be a whole number from {low} to "
                          f"{high}, got {value!r}"))
    if "augment" in data and data["augment"] not in AUGMENTATIONS:
        found.append(("trainer.data.augment", f"{data['augment']!r} is not allowed; use one of "
                      f"{', '.join(AUGMENTATIONS)} (a search space may also search augment)"))
    if kind == "imagefolder" and not (isinstance(data.get("path"), str) and data["path"]):
        found.append(("trainer.data.path", "must name the ImageFolder root (with train/ and "
                      "val/) when kind is imagefolder"))
    return found


def _model_names() -> list[str]:
    """The torchvision classification models a trainer can build."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def _problems(cfg: StudyConfig) -> list[tuple[str, str]]:
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
    check(cfg.target.metric in _METRICS or (own and bool(_NAME.fullmatch(cfg.target.metric))),
          "target.metric", f"{cfg.target.metric!r} is not allowed; use one of "
          f"{', '.join(_METRICS)} (a script of your own may report any other name it gives "
          "trial.report)")
    check(0.0 < cfg.target.value <= 1.0, "target.value", f"{cfg.target.value} is outside (0, 1]")
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
    check(0.5 <= cfg.heartbeat_s <= 600, "heartbeat_s",
          f"must be within [0.5, 600] seconds, got {cfg.heartbeat_s}")
    check(cfg.trainer.checkpoint_every_s >= 0, "trainer.checkpoint_every_s",
          f"must be 0 (off) or positive, got {cfg.trainer.checkpoint_every_s}")
    check(cfg.trainer.max_micro_batch >= 1, "trainer.max_micro_batch",
          f"must be at least 1, got {cfg.trainer.max_micro_batch}")
    t = cfg.trainer
    check(0 <= t.eval_every_s < math.inf, "trainer.eval_every_s",
          f"must be 0 (off) or a positive number of seconds, got {t.eval_every_s}")
    check(t.eval_every_steps >= 0, "trainer.eval_every_steps",
          f"must be 0 (off) or a positive number of steps, got {t.eval_every_steps}")
    check(t.eval_batch >= 1, "trainer.eval_batch", f"must be at least 1, got {t.eval_batch}")
    check(t.num_classes >= 2, "trainer.num_classes", f"must be at least 2, got {t.num_classes}")
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
    found.extend(_data_problems(cfg.trainer.data))
    if not found:
        models = _model_names()
        check(cfg.trainer.model in models, "trainer.model",
              f"{cfg.trainer.model!r} is not a torchvision classification model; use for "
              "example resnet18, resnet50, convnext_tiny, efficientnet_b0 or vit_b_16")
    check(bool(re.match(r"^[a-z][a-z0-9+]*://", cfg.storage)), "storage",
          f"{cfg.storage!r} is not a database URL; use for example sqlite:///autotune.db or "
          "postgresql://user@host/db")
    return found


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
        if not _NAME.fullmatch(name):
            return [("trainer.params", f"{name!r} is not a parameter name; use letters, "
                     "digits and '_', starting with a letter")]
        if name in PARAMETERS:
            return [("trainer.params", f"{name!r} is a plan parameter already; declare only "
                     "the names your script takes beyond the plan's")]
    return []


def _validate(cfg: StudyConfig, flagged: set[str]) -> None:
    problems = _problems(cfg)
    if problems:
        key, message = problems[0]
        where = FLAGS[key] if key in flagged else f"{cfg.source}: {key}"
        raise ConfigError(f"{where} {message}")


def database_url(url: str) -> str:
    """``url`` with PostgreSQL reached through psycopg2 (SQLAlchemy 2.1 would pick psycopg 3)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix):]
    return url


def validate_storage_url(url: str, where: str) -> None:
    """A one-line error unless ``url`` looks like a database URL."""
    if not re.match(r"^[a-z][a-z0-9+]*://", url):
        raise ConfigError(f"{where} {url!r} is not a database URL; use for example "
                          "sqlite:///autotune.db or postgresql://user@host/db")


def load(source: str, overrides: dict[str, Any] | None = None) -> StudyConfig:
    """The study config from ``source`` (a file or a shipped name), with ``overrides``.

    ``overrides`` uses dotted keys for sections (``budget.n_trials``); ``None`` values are
    ignored, so unset flags never override the file.
    """
    data, where, base = _read(source)
    if "study_name" not in data and source not in shipped_studies():
        # a study file without a name is its own study, never the quickstart's
        data["study_name"] = _name_of(Path(where).stem)
    flagged = set()
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        flagged.add(key)
        section, _, sub = key.partition(".")
        if sub:
            if data.get(section) is not None and not isinstance(data[section], dict):
                continue    # not a mapping: refused below, in the file's own words
            data[section] = {**(data.get(section) or {}), sub: value}
        else:
            data[key] = value
    if "search_space" not in data:
        data["search_space"] = default_space(data.get("trainer"))
    cfg = _build(StudyConfig, data, where)
    cfg = dataclasses.replace(cfg, source=where, base_dir=str(base))
    _validate(cfg, flagged)
    return _with_program(cfg)


def _with_program(cfg: StudyConfig) -> StudyConfig:
    """``cfg`` with its own script (if any) as an absolute path and its content's digest."""
    from .programs import digest, is_bundled, resolve_program

    program = resolve_program(cfg.trainer.program, cfg.base_dir)
    sha = "" if is_bundled(program) else digest(Path(program))
    trainer = dataclasses.replace(cfg.trainer, program=program, program_sha256=sha)
    return dataclasses.replace(cfg, trainer=trainer)


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


def default_space(trainer: Any) -> str:
    """The search space of a study file that names none: the quickstart's for the digits,
    ``images`` (sized from the data and ranks) for any other data."""
    source = trainer.get("data") if isinstance(trainer, dict) else None
    kind = source.get("kind", "digits") if isinstance(source, dict) else "digits"
    return "quickstart" if kind == "digits" else "images"


_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*):(?P<secret>[^@/\s]+)@")


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``
    (``postgresql://user:***@host/db``): what autotune prints, logs and records."""
    return _PASSWORD.sub(lambda m: f"{m.group('head')}:***@", text)


def _name_of(stem: str) -> str:
    """A valid study name from a file name: other characters become '-'."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")[:100]
    return name or "study"


# What a resumed study may change without being told: how long and where this run goes on.
RESUMABLE = ("budget.n_trials", "budget.timeout_s", "workers", "storage", "tracking_uri",
             "run_dir", "warm_start", "source", "base_dir", "seed", "oversubscribe",
             "trainer.setup_limit_s")


def config_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a study's stored config and the one it is resumed with, as
    ``key: old -> new`` (dotted keys), leaving out the ``RESUMABLE`` ones."""
    def flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict) and key in _SECTIONS:
                out.update(flat(value, f"{name}."))
            else:
                out[name] = value
        return out

    old, new = flat(stored), flat(current)
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if key not in RESUMABLE and old.get(key) != new.get(key)]


def resolve_tracking_uri(uri: str) -> tuple[str, str | None]:
    """(tracking URI, artifact location) for a tracking URI or a local store directory.

    A plain path is a local store: an SQLite database ``mlflow.db`` and an ``artifacts``
    folder inside that directory.
    """
    if re.match(r"^[a-z][a-z0-9+.-]*:", uri) and not re.match(r"^[A-Za-z]:[\\/]", uri):
        return uri, None
    folder = Path(uri).expanduser().resolve()
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()
