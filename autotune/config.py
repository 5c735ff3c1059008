"""Study configuration: a YAML or TOML study file, overridden by command-line flags.

Precedence: flag > study file > default. Every key is declared here; unknown keys are
rejected with the list of allowed ones. Validation is pure: it opens no database and writes
nothing, so a bad file leaves no trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, shipped_hint

__all__ = ["StudyConfig", "Target", "Budget", "TrainerConfig", "load", "shipped_studies",
           "resolve_tracking_uri", "default_space", "DEFAULT_STORAGE", "sqlite_file"]

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a metric or parameter of the user's own


@dataclass(frozen=True)
class Target:
    metric: str = "top1"             # top1 | top5 (or a script's own): the metric to reach
    value: float = 0.97              # in (0, 1] for an accuracy; > 0 for mode min
    mode: str = "max"                # max: an accuracy, reached at or above value; min: a
                                     # metric that falls (a loss), reached at or below it

    @property
    def falls(self) -> bool:
        return self.mode == "min"

    @property
    def text(self) -> str:
        """``top1 >= 0.97``, or ``loss <= 0.9`` for a metric that falls."""
        return f"{self.metric} {'<=' if self.falls else '>='} {self.value}"

    @property
    def tag(self) -> str:
        """The study's MLflow tag ``autotune.target``: ``top1>=0.97``, ``loss<=0.9``."""
        return self.text.replace(" ", "")


@dataclass(frozen=True)
class Budget:
    n_trials: int | None = 12        # finished trials the study should hold; None: no limit
    timeout_s: float | None = None   # seconds for this run of the study; None: no limit
    max_trial_s: float = 60.0        # training seconds after which a trial is stopped


DEFAULT_STORAGE = "sqlite:///autotune.db"   # one machine's study store, in the working folder


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
    weights: str = ""                       # start from these weights (fine-tuning): a file
                                            # of the model's state dict (a torchvision .pth,
                                            # or a model.pt a trial saved; relative to the
                                            # study file), or imagenet (torchvision's, from
                                            # its cache), its classifier replaced where its
                                            # classes differ; "": from scratch
    num_classes: int | None = 10           # from the data; None: a script's own examples
                                            # of no stated classes (nothing is at chance)
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
    save_model: bool = True                 # a trial that reaches the target saves its model
                                            # (trial-N/model.pt); once a faster trial has, the
                                            # slower ones' are removed
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
    storage: str = DEFAULT_STORAGE          # Optuna storage URL
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
        """``to_dict`` with the storage URL's and the tracking URI's passwords left out: what
        the study store, MLflow and run folders keep (workers bring their own credentials)."""
        return {**self.to_dict(), "storage": redact(self.storage),
                "tracking_uri": redact(self.tracking_uri)}

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
    if not source.strip():
        raise ConfigError("no study file given (an empty name); give a YAML, TOML or JSON "
                          f"file or a shipped study ({', '.join(shipped_studies())})")
    path = Path(source).expanduser()
    if not path.suffix and source in shipped_studies():
        path = Path(str(resources.files("autotune") / "studies" / f"{source}.yaml"))
    if path.is_dir():
        raise ConfigError(f"study file {source!r} is a folder; give a YAML, TOML or JSON "
                          "file in it or a shipped study")
    if path.exists() and not path.is_file():
        raise ConfigError(f"study file {source!r} is not a regular file (a device or a pipe); "
                          "give a YAML, TOML or JSON file")
    if not path.is_file():
        shipped = shipped_studies()
        raise ConfigError(f"study file {source!r} not found"
                          f"{shipped_hint(source, shipped, 'study')}; give a YAML, TOML or "
                          f"JSON file or a shipped study ({', '.join(shipped)})")
    try:
        # utf-8-sig: a byte-order mark, as Notepad writes one, is read past (TOML refuses it);
        # UTF-16 with its mark, as PowerShell's `>` writes a file, is read as such
        raw = path.read_bytes()
        text = raw.decode("utf-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        reason = "not UTF-8 (or UTF-16) text" if isinstance(e, UnicodeDecodeError) else \
            (e.strerror or str(e))
        raise ConfigError(f"study file {source!r} cannot be read: {reason}") from None
    suffix = path.suffix.lower()        # STUDY.YAML, as some editors save it
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml", ".json"):   # JSON is YAML, and read as YAML reads it
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no tags run code
        elif suffix == ".py":
            raise ConfigError(f"{path} is a Python file; a study file is YAML or TOML (.yaml, "
                              f".yml, .toml, .json): name a search space in it as "
                              f"`search_space: {path.name}`, or a trainer as "
                              f"`trainer: {{program: {path.name}}}`")
        else:
            raise ConfigError(f"{path}: unknown file type {path.suffix!r}; use .yaml, .yml, "
                              ".toml or .json")
    except _DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    except RecursionError:      # the parsers recurse once a level: thousands of [[[...]]]
        raise ConfigError(f"{path}: nested too deeply to read; a study file's settings are "
                          f"at most {_MAX_DEPTH} levels deep") from None
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        first = " ".join(str(e).split())
        tabs = ("; indent with spaces, not tabs" if isinstance(e, yaml.YAMLError)
                and "'\\t'" in first else "")
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {first}{tabs}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the study file must be a mapping of keys to values")
    shape = _shape_problem(data)
    if shape is not None:
        raise ConfigError(f"{path}: {shape}")
    data = {str(k): v for k, v in data.items()}
    where = _holds_nul(data)
    if where is not None:
        raise ConfigError(f"{path}: {where} holds a NUL character (\\0, \\x00); no name, path "
                          "or value may hold one: remove it")
    return data, str(path), path.resolve().parent


_MAX_DEPTH = 32          # levels of mappings and lists in a study file
_MAX_VALUES = 100_000    # keys and values once YAML's aliases are expanded


def _shape_problem(data: Any) -> str | None:
    """What makes ``data`` no study file, whatever its keys say, or None: a mapping or list
    that holds itself (a YAML alias to a node it sits in: ``t: &t {self: *t}``), nesting past
    ``_MAX_DEPTH`` levels, or more than ``_MAX_VALUES`` values once YAML's aliases are expanded
    (nine lists of nine aliases of the list before, nine deep, are 9 ** 9 values: each later
    step would take hours). Iterative, so no input can exhaust the interpreter's stack."""
    count = 0
    on_path: set[int] = set()
    stack: list[tuple[Any, str, bool]] = [(data, "", False)]
    while stack:
        value, at, leaving = stack.pop()
        if leaving:
            on_path.discard(id(value))
            continue
        count += 1
        if count > _MAX_VALUES:
            return (f"holds more than {_MAX_VALUES:,} values once its YAML aliases (*name) "
                    "are expanded; a study file is a few dozen settings: write them out "
                    "without aliases")
        if not isinstance(value, dict | list):
            continue
        if id(value) in on_path:
            return (f"{at or 'the file'} holds itself (a YAML alias to a mapping or list it "
                    "sits in); write the values out instead")
        if at.count(".") + at.count("[") >= _MAX_DEPTH:
            return (f"{at} is nested more than {_MAX_DEPTH} levels deep; a study file's "
                    "settings are a few levels deep")
        on_path.add(id(value))
        stack.append((value, at, True))
        items = (value.items() if isinstance(value, dict) else enumerate(value))
        for k, v in items:
            key = (f"{at}[{k}]" if isinstance(value, list) else
                   f"{at}.{k}" if at else str(k))
            stack.append((v, key, False))
    return None


def _holds_nul(value: Any, at: str = "") -> str | None:
    """The key (``trainer.data.path``, ``augment[2]``) of the first key or string in ``value``
    that holds a NUL character, which no path or name can hold (Python refuses such a path with
    a traceback), or None."""
    if isinstance(value, str):
        return at if "\0" in value else None
    if isinstance(value, dict):
        for k, v in value.items():
            key = f"{at}.{k}" if at else str(k)
            if "\0" in str(k):
                return f"a key of {at}" if at else "a key"
            found = _holds_nul(v, key)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _holds_nul(v, f"{at}[{i}]")
            if found is not None:
                return found
    return None


class _DuplicateKey(Exception):
    """A key given twice in one YAML mapping."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML itself keeps the
    last silently, so ``target:`` written twice would run the study at the second one). A key
    that overrides one merged in with ``<<: *anchor`` is not a repeat."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or \
                    not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(f"key {key!r} is given twice (lines {seen[key]} and "
                                    f"{line}); keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.name not in ("source", "base_dir")]


# Names other tools' configs use for a key (Optuna's, Ray Tune's, MLflow's), and their place.
_ALIASES = {"name": "study_name", "study": "study_name", "space": "search_space",
            "storage_url": "storage", "database": "storage", "db": "storage",
            "mlflow_uri": "tracking_uri", "mlflow_tracking_uri": "tracking_uri",
            "tracking": "tracking_uri", "ranks": "ranks_per_trial",
            "n_workers": "workers", "num_workers": "workers", "trials": "budget.n_trials",
            "num_samples": "budget.n_trials", "timeout": "budget.timeout_s",
            "time_budget_s": "budget.timeout_s", "metric": "target.metric",
            "direction": "target.mode", "goal": "target.mode",
            "model_name": "trainer.model", "arch": "trainer.model",
            "dataset": "trainer.data", "data_dir": "trainer.data.path",
            "data_path": "trainer.data.path", "batch_size": "search_space",
            "lr": "search_space", "learning_rate": "search_space", "epochs": "search_space",
            "pretrained": "trainer.weights", "checkpoint": "trainer.weights",
            "init_weights": "trainer.weights", "pretrained_weights": "trainer.weights"}


def _where_key_goes(key: Any, cls: type, prefix: str) -> str | None:
    """The place (``budget.n_trials``) a misplaced or misnamed ``key`` of section ``prefix``
    most likely means, or None."""
    import difflib

    from ._config_checks import DATA_KEYS

    text = str(key)
    places = [f"{p}{f}" for p, c in (("", StudyConfig), *((f"{n}.", c) for n, c in
                                                        _SECTIONS.items())) for f in _fields(c)]
    places += sorted({f"trainer.data.{k}" for keys in DATA_KEYS.values() for k in keys})
    alias = _ALIASES.get(text.lower())
    if alias and alias != f"{prefix}{text}":
        return alias
    elsewhere = [p for p in places if p.rsplit(".", 1)[-1] == text and p != f"{prefix}{text}"]
    if elsewhere:
        return elsewhere[0]
    near = difflib.get_close_matches(text.lower(), _fields(cls), n=1, cutoff=0.75)
    return f"{prefix}{near[0]}" if near else None


def _check_keys(data: dict[str, Any], cls: type, where: str, prefix: str) -> None:
    allowed = _fields(cls)
    unknown = sorted(set(data) - set(allowed), key=str)
    if unknown:
        names = ", ".join(f"{prefix}{k}" for k in unknown)
        hints = [(k, _where_key_goes(k, cls, prefix)) for k in unknown]
        said = "; ".join(_hint(f"{prefix}{k}", place) for k, place in hints if place)
        raise ConfigError(f"{where}: unknown key(s) {names}"
                          + (f" ({said})" if said else "") + "; allowed in "
                          f"{prefix.rstrip('.') or 'the study file'}: {', '.join(allowed)}")


def _hint(key: str, place: str) -> str:
    """What to write for ``key`` where it belongs at ``place``."""
    if place == "search_space":
        return (f"{key} is a training parameter: the search space sets it (search_space: a "
                "Python file; autotune space show quickstart)")
    section, _, name = place.rpartition(".")
    if name == key.rpartition(".")[2]:
        return f"{name} goes under {section.replace('.', ': ')}:"
    return f"did you mean {place}?"


_DURATION = re.compile(r"\s*(?:(\d+(?:\.\d+)?)\s*d)?\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*"
                       r"(?:(\d+(?:\.\d+)?)\s*m(?:in)?)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*",
                       re.IGNORECASE)


def duration_s(text: str) -> float | None:
    """Seconds in a duration written with units (``1h``, ``30m``, ``1h30m``, ``90s``), or
    None: a ``*_s`` key takes seconds, and the refusal says how many."""
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        return None
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


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
        hint = ""
        if base in ("float", "int") and isinstance(value, str):
            try:
                float(value)
                hint = (" (YAML read it as text: write an exponent with a dot and a sign, "
                        "1.0e+12, or write the number out)"
                        if re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*", value)
                        else f" (it is text, in quotes: write {value.strip()} without them)")
            except ValueError:
                seconds = duration_s(value) if where.endswith("_s") else None
                if seconds is not None:
                    hint = (f" (a number of seconds: {seconds:g} for {value.strip()})")
                elif re.fullmatch(r"\s*\d+(\.\d+)?\s*%\s*", value):
                    share = float(value.strip().rstrip("%")) / 100
                    hint = f" (a share of 1: {share:g} for {value.strip()})"
        if isinstance(value, bool) and base == "str":   # yes, no, on, off: YAML's booleans
            hint = " (YAML read it as true or false: put it in quotes)"
        elif isinstance(value, int | float) and base == "str":
            hint = f" (YAML read it as a number: quote it, '{value}')"
        raise ConfigError(f"{where} must be {what}, got {value!r}{hint}")
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
                hint = (f" (target: {{metric: top1, value: {value:g}}})" if key == "target"
                        and isinstance(value, int | float) and not isinstance(value, bool)
                        else "")
                raise ConfigError(f"{where}: {key} must be a mapping, got {value!r}{hint}")
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

def _validate(cfg: StudyConfig, flagged: set[str], from_env: dict[str, str]) -> None:
    """The first problem of ``cfg``, named by the flag, environment variable or study-file
    key that set it."""
    from ._config_checks import problems as config_problems

    problems = config_problems(cfg)
    if problems:
        key, message = problems[0]
        where = (FLAGS[key] if key in flagged else from_env[key] if key in from_env
                 else f"{cfg.source}: {key}")
        raise ConfigError(f"{where} {message}")


def sqlite_file(url: str) -> Path | None:
    """The file an ``sqlite:///PATH`` URL names, its ``~`` expanded and its ``?query``
    (``?timeout=60``, which SQLAlchemy passes to SQLite) left off; None for any other URL
    and for ``sqlite:///:memory:``."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    if path in ("", ":memory:"):
        return None
    return Path(path).expanduser()


def _expand_home(url: str) -> str:
    """An ``sqlite:///~/...`` URL with the home folder written out, as a shell expands a
    path (SQLite would look for a folder named ``~``)."""
    file = sqlite_file(url)
    if file is None or not url.startswith("sqlite:///~"):
        return url
    _, mark, query = url.partition("?")
    return f"sqlite:///{file}{mark}{query}"


def database_url(url: str) -> str:
    """``url`` as SQLAlchemy opens it: PostgreSQL reached through psycopg2 (SQLAlchemy 2.1
    would pick psycopg 3), an SQLite path's ``~`` expanded."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix):]
    return _expand_home(url)


def sqlite_wal(url: str) -> None:
    """Puts the SQLite file behind ``url`` (if that is what it is) in write-ahead-log mode, as
    the file remembers: readers no longer hold off writers, so a worker's heartbeat is not
    kept waiting while another process reads a large study. Left as it is where the file
    cannot be switched now (another process writing) or its filesystem has no shared memory
    (the rollback journal still works there, only with more waiting)."""
    import sqlite3

    path = sqlite_file(url)
    if path is None or not path.is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=5)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error:
        pass


def sqlite_rows(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """The rows ``sql`` reads from the SQLite file ``path``, opened read-only (nothing is
    created or migrated); sqlite3.DatabaseError where it is no database or lacks a table."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro",
                                            uri=True)) as conn:
        return conn.execute(sql, params).fetchall()


def sqlite_tables(path: Path) -> set[str]:
    """The tables of the SQLite file ``path`` (read-only, as ``sqlite_rows``)."""
    return {r[0] for r in sqlite_rows(path, "SELECT name FROM sqlite_master WHERE type = "
                                            "'table'")}


def storage_url_problem(url: str) -> str | None:
    """Why ``url`` is not a database URL (None when it looks like one); a path to an SQLite
    file is told its URL."""
    if re.match(r"^[a-z][a-z0-9+]*://", url):
        return None
    if url.lower().endswith((".db", ".sqlite", ".sqlite3")) or Path(url).expanduser().is_file():
        return (f"{url!r} is a file's path, not a database URL; for an SQLite file write "
                f"sqlite:///{url}")
    return (f"{url!r} is not a database URL; use for example sqlite:///autotune.db or "
            "postgresql://user@host/db")


def validate_storage_url(url: str, where: str) -> None:
    """A one-line error unless ``url`` looks like a database URL."""
    problem = storage_url_problem(url)
    if problem:
        raise ConfigError(f"{where} {problem}")


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
    env = tracking_uri_from_env()
    from_env = {"tracking_uri": TRACKING_ENV} if "tracking_uri" not in data and env else {}
    if from_env:                     # neither the file nor a flag names one: MLflow's own
        data["tracking_uri"] = env
    cfg = _build(StudyConfig, data, where)
    cfg = dataclasses.replace(cfg, source=where, base_dir=str(base))
    _validate(cfg, flagged, from_env)
    return _with_program(cfg)


TRACKING_ENV = "MLFLOW_TRACKING_URI"


def tracking_uri_from_env() -> str | None:
    """MLflow's own default tracking URI (``MLFLOW_TRACKING_URI``), where set: a study whose
    file and flags name none records there, as MLflow's clients do."""
    import os

    return os.environ.get(TRACKING_ENV, "").strip() or None


def tracking_from_env(source: str, flagged: str | None = None) -> bool:
    """Whether the study of ``source`` records where ``MLFLOW_TRACKING_URI`` says: the
    variable is set and neither the file nor a flag (``flagged``) names a store."""
    if flagged is not None or tracking_uri_from_env() is None:
        return False
    return "tracking_uri" not in _read(source)[0]


def _with_program(cfg: StudyConfig) -> StudyConfig:
    """``cfg`` with its own script (if any) as an absolute path and its content's digest."""
    from .programs import digest, is_bundled, resolve_program

    program = resolve_program(cfg.trainer.program, cfg.base_dir)
    sha = "" if is_bundled(program) else digest(Path(program))
    trainer = dataclasses.replace(cfg.trainer, program=program, program_sha256=sha)
    return dataclasses.replace(cfg, trainer=trainer)


def default_space(trainer: Any) -> str:
    """The search space of a study file that names none: the quickstart's for the digits,
    ``images`` (sized from the data and ranks) for any other data."""
    source = trainer.get("data") if isinstance(trainer, dict) else None
    kind = source.get("kind", "digits") if isinstance(source, dict) else "digits"
    return "quickstart" if kind == "digits" else "images"


# The secret runs to the authority's last "@": a password written with an "@" of its own
# (p@ss, not percent-encoded) is hidden whole, not cut at its own "@".
_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*):(?P<secret>[^/\s]+)@")


def without_credentials(url: str) -> str:
    """``url`` without its user name and password (``http://bob:pw@host`` -> ``http://host``):
    a page to open in a browser, which asks for them, or to probe without them."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@", r"\1", url)


# A secret given as a URL's query parameter (libpq's and the MySQL drivers'
# ``?password=``, a token): its value, up to the next parameter.
_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:ssl)?(?:password|passwd|pwd|passphrase|secret|"
                           r"token|access_token|api_key|apikey)=)(?P<secret>[^&#\s]+)",
                           re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``
    (``postgresql://user:***@host/db``, ``...?password=***``): what autotune prints, logs and
    records."""
    text = _PASSWORD.sub(lambda m: f"{m.group('head')}:***@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m.group('head')}***", text)


def _name_of(stem: str) -> str:
    """A valid study name from a file name: other characters become '-'."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")[:100]
    return name or "study"


# What a resumed study may change without being told: how long and where this run goes on.
RESUMABLE = ("budget.n_trials", "budget.timeout_s", "workers", "storage", "tracking_uri",
             "run_dir", "warm_start", "source", "base_dir", "seed", "oversubscribe",
             "trainer.setup_limit_s", "trainer.save_model")


def config_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a study's stored config and the one it is resumed with, as
    ``key: old -> new`` (dotted keys, the trainer's data by its own keys), leaving out the
    ``RESUMABLE`` ones."""
    def flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict) and (key in _SECTIONS or name == "trainer.data"):
                out.update(flat(value, f"{name}."))
            else:
                out[name] = value
        return out

    # a key a study's stored config lacks (an earlier autotune had no such key) held its
    # default there; the data's keys are the source's own, with no defaults of this kind
    defaults = {k: v for k, v in flat(StudyConfig().to_dict()).items()
                if not k.startswith("trainer.data.")}
    old = {**defaults, **flat(stored)}
    new = flat(current)
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if key not in RESUMABLE and old.get(key) != new.get(key)]


def resolve_tracking_uri(uri: str) -> tuple[str, str | None]:
    """(tracking URI, artifact location) for a tracking URI or a local store directory.

    A plain path is a local store: an SQLite database ``mlflow.db`` and an ``artifacts``
    folder inside that directory.
    """
    if re.match(r"^[a-z][a-z0-9+.-]*:", uri) and not re.match(r"^[A-Za-z]:[\\/]", uri):
        return _expand_home(uri), None
    folder = Path(uri).expanduser().resolve()
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()
