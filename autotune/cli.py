"""The ``autotune`` command line: plain argparse, one small function per command.

Any :class:`~autotune.errors.AutotuneError` becomes a one-line ``autotune: error: ...`` on
stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .errors import AutotuneError, Stopped, Terminated, disk_full, path_refused

__all__ = ["main"]

Command = Callable[[argparse.Namespace], int]


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated




def _start_study(args: argparse.Namespace) -> int:
    from . import _console, config, study

    _console.quiet_libraries()
    overrides = {"budget.n_trials": args.n_trials, "budget.timeout_s": args.timeout,
                 "budget.max_trial_s": args.max_trial_seconds, "storage": args.storage,
                 "tracking_uri": args.tracking_uri, "workers": args.workers,
                 "study_name": args.study_name, "ranks_per_trial": args.ranks,
                 "seed": args.seed, "device": args.device, "run_dir": args.run_dir,
                 "warm_start": False if args.no_warm_start else None,
                 "oversubscribe": True if args.oversubscribe else None}
    cfg = config.load(args.config, overrides)
    if config.tracking_from_env(args.config, args.tracking_uri):
        print(f"recording to MLflow at {config.redact(cfg.tracking_uri)}, from "
              f"{config.TRACKING_ENV} (--tracking-uri records elsewhere)", flush=True)
    signal.signal(signal.SIGTERM, _on_sigterm)
    return study.run_study(cfg, accept_changes=args.accept_changes)


def _space_show(args: argparse.Namespace) -> int:
    from .space import load_space

    _check_world_size(args)
    if _is_study_file(args.space):          # the space that study searches, for its data
        from . import config
        from ._study_setup import checked_space

        _, space, _ = checked_space(config.load(args.space))
        print(space.table())
        return 0
    print(load_space(args.space, world_size=args.world_size).table())
    return 0


def _is_study_file(name: str) -> bool:
    return name.lower().endswith((".yaml", ".yml", ".toml", ".json"))


def _space_check(args: argparse.Namespace) -> int:
    from .errors import SpaceError
    from .space import check_space, load_space

    _check_world_size(args)
    if _is_study_file(args.space):   # a study file: its space and program
        from . import config
        from ._study_setup import checked_space

        cfg = config.load(args.space)
        try:
            _, space, _ = checked_space(cfg)
        except SpaceError as e:
            problems = e.problems or [str(e)]
        else:
            print(space.table())
            program = cfg.trainer.program
            print(f"ok: {args.space} runs {program} on a valid search space for "
                  f"{cfg.ranks_per_trial} rank(s)"
                  + (f"; its own parameters: {', '.join(cfg.trainer.params)}"
                     if cfg.trainer.params else ""))
            return 0
    else:
        try:
            space = load_space(args.space, world_size=args.world_size)
            problems = [f"{space.source_file}: {p}" for p in check_space(space)]
        except SpaceError as e:
            problems = e.problems
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"autotune: error: {len(problems)} problem(s) in search space {args.space!r}",
              file=sys.stderr)
        return 2
    print(space.table())
    print(f"ok: {args.space} is a valid search space for {args.world_size} rank(s)")
    return 0


def _ui(args: argparse.Namespace) -> int:
    from ._channel import check_port
    from .ui import serve

    check_port(args.port, "--port")
    if args.host != "127.0.0.1":
        print(f"autotune: warning: the MLflow UI has no authentication; anyone who reaches "
              f"{args.host}:{args.port} can read and change this study's records",
              file=sys.stderr)
    from .config import tracking_uri_from_env

    return serve(args.tracking_uri or tracking_uri_from_env() or "mlruns", args.study,
                 args.host, args.port)


def _add_ui(sub: Any) -> None:
    p = sub.add_parser("ui", help="open the MLflow UI on a study's records",
                       description="Start the MLflow UI on the study's store and print the "
                                   "page of the study's runs.")
    p.add_argument("--tracking-uri",
                   help="MLflow tracking URI or local store directory (default "
                        "$MLFLOW_TRACKING_URI where set, else ./mlruns)")
    p.add_argument("--study", help="study name (default: the only study in the store)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    p.set_defaults(func=_ui)


def _seconds(text: str) -> float:
    """A flag's number of seconds; a duration written with units is refused with its seconds
    (``1h``: 3600)."""
    from .config import duration_s

    try:
        return float(text)
    except ValueError:
        seconds = duration_s(text)
        hint = f" ({seconds:g} for {text.strip()})" if seconds is not None else ""
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds{hint}") from None


def _require_sqlite_file(url: str) -> None:
    """db upgrade migrates a database; it does not make an SQLite file that is not there."""
    from .config import sqlite_file
    from .errors import ConfigError

    path = sqlite_file(url)
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"no database at {path}; a study creates it with its tables "
                              "(autotune start study FILE --storage ...)")


def _check_world_size(args: argparse.Namespace) -> None:
    from .errors import ConfigError

    if args.world_size < 1:
        raise ConfigError(f"--world-size must be at least 1, got {args.world_size}")


def _db_upgrade(args: argparse.Namespace) -> int:
    from . import db
    from ._channel import is_server_url
    from .config import redact, validate_storage_url
    from .errors import ConfigError

    if is_server_url(args.storage):
        raise ConfigError(f"--storage {args.storage} is a study server: db upgrade needs a "
                          "database URL (the one the server was started with)")
    validate_storage_url(args.storage, "--storage")
    _require_sqlite_file(args.storage)
    before = db.current(args.storage)
    db.upgrade(args.storage)
    after = db.current(args.storage)
    where = redact(args.storage)
    print(f"autotune tables in {where}: revision {before or 'none'} -> {after}"
          if before != after else f"autotune tables in {where} are up to date ({after})")
    return 0


def _add_db_upgrade(sub: Any) -> None:
    p = sub.add_parser("db upgrade", help="create or migrate autotune's tables in a database",
                       description="Apply autotune's migrations (workers, trial attempts) to a "
                                   "study database; Optuna's own tables are left alone.")
    p.add_argument("--storage", required=True, help="database URL (postgresql://... or sqlite)")
    p.set_defaults(func=_db_upgrade)


def _study_in_storage(p: argparse.ArgumentParser, optional: bool = False) -> None:
    """A command's study name and ``--storage`` (SQLite in the working directory by default);
    ``optional``: the name may be left out."""
    p.add_argument("study", nargs="?", default=None,
                   help="study name" + (" (none: every study in the storage, a line each)"
                                        if optional else ""))
    p.add_argument("--study", dest="study_flag", metavar="STUDY",
                   help="the study name as a flag, as worker and ui take it")
    p.set_defaults(study_required=not optional)
    from .config import DEFAULT_STORAGE

    p.add_argument("--storage", default=DEFAULT_STORAGE,
                   help=f"Optuna storage URL (default {DEFAULT_STORAGE})")


def _status(args: argparse.Namespace) -> int:
    from .config import validate_storage_url
    from .status import list_studies, show

    validate_storage_url(args.storage, "--storage")
    if args.study is None:
        return list_studies(args.storage, as_json=args.json)
    return show(args.study, args.storage, as_json=args.json)


def _add_status(sub: Any) -> None:
    p = sub.add_parser("status", help="show a study's trials, workers and best TTA (no study: "
                                      "list the studies)")
    _study_in_storage(p, optional=True)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (for scripts): each trial's state, outcome, "
                        "reason, seconds and parameters, the workers and the best trial")
    p.set_defaults(func=_status)


def _stop_study(args: argparse.Namespace) -> int:
    from .config import validate_storage_url
    from .stopping import request_stop

    validate_storage_url(args.storage, "--storage")
    return request_stop(args.study, args.storage, args.now)


def _add_stop_study(sub: Any) -> None:
    p = sub.add_parser("stop study", help="stop a study's workers, on every machine",
                       description="Ask every worker of a study, on any machine, to start no "
                                   "new trial; running trials train to their end (or, with "
                                   "--now, save a checkpoint and stop, queued to resume). "
                                   "`autotune start study` with the study's file resumes it.")
    _study_in_storage(p)
    p.add_argument("--now", action="store_true",
                   help="running trials save a checkpoint and stop instead of finishing")
    p.set_defaults(func=_stop_study)


def _export_curves(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .config import validate_storage_url
    from .export import export_curves

    validate_storage_url(args.storage, "--storage")
    out = Path(args.out).expanduser() if args.out else None
    return export_curves(args.study, args.storage, out, every=args.all)


def _add_export_curves(sub: Any) -> None:
    p = sub.add_parser("export curves", help="write a study's learning curves in opda's "
                                             "format, to replay them under other tuners",
                       description="Write one JSON line a trial (its parameters, planned "
                                   "epochs and learning curve) in opda's tuning-results "
                                   "format, which `benchmarks/search_efficiency.py compare "
                                   "--table opda:FILE` replays. Trials a pruner stopped are "
                                   "left out (their curves end early) unless --all.")
    _study_in_storage(p)
    p.add_argument("--out", help="the .jsonl file to write (default: print the lines)")
    p.add_argument("--all", action="store_true",
                   help="write the trials a pruner stopped too (bound, projection, rung, "
                        "follows_miss)")
    p.set_defaults(func=_export_curves)


def _worker(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ._channel import SCHEME, parse_address
    from .config import validate_storage_url
    from .errors import ConfigError
    from .launch import read_hostfile
    from .worker import run_worker

    if args.server:
        parse_address(args.server, "--server")
    storage = f"{SCHEME}{args.server}" if args.server else args.storage
    validate_storage_url(storage, "--server" if args.server else "--storage")
    hostfile = None
    if args.hostfile:
        hostfile = Path(args.hostfile).expanduser().resolve()
        if not hostfile.is_file():
            raise ConfigError(f"--hostfile {args.hostfile}: no such file; write one "
                              "'HOST slots=N' line per node")
        read_hostfile(hostfile)  # a malformed line: a one-line error now
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise ConfigError(f"--ranks-per-node must be at least 1, got {args.ranks_per_node}")
    if args.ranks_per_node is not None and hostfile is None:
        raise ConfigError("--ranks-per-node needs --hostfile; without one, the study's "
                          "ranks_per_trial decides")
    return run_worker(storage, args.study, hostfile=hostfile,
                      ranks_per_node=args.ranks_per_node, oversubscribe=args.oversubscribe,
                      allow_programs=tuple(args.allow_program or ()), data_path=args.data)


def _add_worker(sub: Any) -> None:
    p = sub.add_parser("worker", help="join a study and run its trials, one after another")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="HOST:PORT of an `autotune server`")
    where.add_argument("--storage", help="the study's database URL, reached directly")
    p.add_argument("--study", help="study name (default: the only autotune study there)")
    p.add_argument("--allow-program", action="append", metavar="PATH",
                   help="run a study's own training script when it lies at PATH or under it "
                        "(repeatable; without it, only the bundled trainers run)")
    p.add_argument("--data", metavar="PATH",
                   help="where the study's ImageFolder tree lies on this machine (and its "
                        "nodes), when not at the path the study was started with")
    p.add_argument("--hostfile", help="DeepSpeed hostfile: run each trial across its nodes "
                                      "(over ssh, from this machine)")
    p.add_argument("--ranks-per-node", type=int, help="ranks on each node of the hostfile "
                                                      "(default: each line's slots)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="run a study whose ranks per trial outnumber this machine's cores or "
                        "GPUs")
    p.set_defaults(func=_worker)


def _server(args: argparse.Namespace) -> int:
    from ._channel import ServerSecurity
    from .config import validate_storage_url
    from .server import serve

    validate_storage_url(args.storage, "--storage")
    security = ServerSecurity.from_options(args.host, args.token_file, args.tls_cert,
                                           args.tls_key, args.insecure)
    return serve(args.storage, args.host, args.port, security=security)


def _add_server(sub: Any) -> None:
    p = sub.add_parser(
        "server", help="serve a study database to many workers",
        description="Serve a study database to workers. With a secret (the first line of "
                    "--token-file, or AUTOTUNE_SERVER_TOKEN / AUTOTUNE_SERVER_TOKEN_FILE in "
                    "the environment) every call must carry it; workers, start study and "
                    "status send theirs from the same variables. Without one the server "
                    "binds loopback only.")
    p.add_argument("--storage", required=True, help="database URL (postgresql://...)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=13000, help="port (default 13000)")
    p.add_argument("--token-file", help="a file whose first line is the secret every client "
                                        "must send (never the secret itself on the command "
                                        "line)")
    p.add_argument("--tls-cert", help="PEM certificate: serve over TLS (with --tls-key); "
                                      "clients trust it through AUTOTUNE_SERVER_CA")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--insecure", action="store_true",
                   help="bind an address beyond loopback without a secret, on purpose")
    p.set_defaults(func=_server)


def _add_start_study(sub: Any) -> None:
    p = sub.add_parser("start study", help="run a time-to-accuracy study",
                       description="Run a study: trials are proposed, trained with DeepSpeed and "
                                   "recorded in the study store and MLflow. Flags override the "
                                   "study file.")
    p.add_argument("config", help="a study file (.yaml, .toml, .json) or a shipped study "
                                  "(quickstart)")
    p.add_argument("--n-trials", type=int, help="finished trials the study should hold")
    p.add_argument("--timeout", type=_seconds, help="seconds for this run of the study")
    p.add_argument("--max-trial-seconds", type=_seconds,
                   help="training seconds per trial at most")
    p.add_argument("--storage", help="Optuna storage URL (default sqlite:///autotune.db)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI or a local store directory "
                                          "(default: the study file's, else "
                                          "$MLFLOW_TRACKING_URI where set, else ./mlruns)")
    p.add_argument("--workers", type=int, help="local workers, one trial at a time each")
    p.add_argument("--ranks", type=int, help="DeepSpeed ranks per trial")
    p.add_argument("--study-name", help="study name; an existing study is resumed")
    p.add_argument("--seed", type=int, help="sampler and training seed")
    p.add_argument("--device", choices=("cpu", "cuda"), help="where the trainers run")
    p.add_argument("--run-dir", help="folder for each trial's plan and log")
    p.add_argument("--no-warm-start", action="store_true",
                   help="do not enqueue the search space's known-good configurations")
    p.add_argument("--oversubscribe", action="store_true",
                   help="let the local workers' ranks outnumber this machine's cores or GPUs")
    p.add_argument("--accept-changes", action="store_true",
                   help="resume an existing study although its study file changed (target, "
                        "trainer, search space, ...); without it such a resume is refused")
    p.set_defaults(func=_start_study)


def _add_space_show(sub: Any) -> None:
    p = sub.add_parser("space show", help="print a search space")
    p.add_argument("space", help="a shipped space name, a Python file, or a study file (its "
                                 "space, sized for its data and ranks)")
    p.add_argument("--world-size", type=int, default=2, help="ranks the space is built for")
    p.set_defaults(func=_space_show)


def _add_space_check(sub: Any) -> None:
    p = sub.add_parser("space check", help="validate a search-space file, listing every problem")
    p.add_argument("space", help="a Python file defining `space`, a shipped space name, or a "
                                 "study file (YAML, TOML or JSON: its space, program and "
                                 "declared parameters)")
    p.add_argument("--world-size", type=int, default=2, help="ranks the space is built for")
    p.set_defaults(func=_space_check)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake told in one line that says where the options are
    (argparse's own prints the whole usage first: eight lines for ``start study``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autotune", description="Find the training configuration that reaches a target "
                                     "accuracy in the least wall-clock time.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_start_study(sub)
    _add_space_show(sub)
    _add_space_check(sub)
    _add_ui(sub)
    _add_db_upgrade(sub)
    _add_status(sub)
    _add_stop_study(sub)
    _add_export_curves(sub)
    _add_worker(sub)
    _add_server(sub)
    return parser


_TWO_WORD = ("start study", "stop study", "space show", "space check", "db upgrade",
             "export curves")


def _join_two_word_commands(argv: list[str]) -> list[str]:
    """``start study`` and ``space show`` are single commands to argparse."""
    if len(argv) >= 2 and f"{argv[0]} {argv[1]}" in _TWO_WORD:
        return [f"{argv[0]} {argv[1]}", *argv[2:]]
    return argv


def _incomplete_command(argv: list[str]) -> str | None:
    """What is wrong when ``argv`` begins with the first word of a two-word command but not
    the command (``autotune start``, ``autotune space list``), else None."""
    if not argv or any(argv[0] == c for c in _TWO_WORD):
        return None
    begun = [c for c in _TWO_WORD if c.split()[0] == argv[0]]
    if not begun:
        return None
    given = (f"'{argv[0]} {argv[1]}'" if len(argv) >= 2 and not argv[1].startswith("-")
             else f"'{argv[0]}' alone")
    named = " and ".join(f"'autotune {c}'" for c in begun)
    return (f"{given} is not a command; the command{'s are' if len(begun) > 1 else ' is'} "
            f"{named} (add --help to see the options)")


def _one_study_name(args: argparse.Namespace) -> str | None:
    """The study named once, as a word or with --study (``args.study``), or what is wrong."""
    if not hasattr(args, "study_flag"):
        return None
    word, flag = args.study, args.study_flag
    if word is not None and flag is not None and word != flag:
        return (f"two study names, {word!r} and --study {flag!r}; give one (see autotune "
                f"{args.command} --help)")
    args.study = word if word is not None else flag
    if args.study is None and args.study_required:
        return (f"which study? give its name: autotune {args.command} STUDY (see autotune "
                f"{args.command} --help)")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = _join_two_word_commands(list(sys.argv[1:] if argv is None else argv))
    problem = _incomplete_command(args_list)
    if problem is not None:
        print(f"autotune: error: {problem}", file=sys.stderr)
        return 2
    args = _parser().parse_args(args_list)
    problem = _one_study_name(args)
    if problem is not None:
        print(f"autotune: error: {problem}", file=sys.stderr)
        return 2
    try:
        code: int = args.func(args)
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the output went to a pipe that closed (| head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        refused = path_refused(e)
        if refused is not None:
            print(f"autotune: error: {refused}", file=sys.stderr)
            return 2 if e.errno == errno.ENAMETOOLONG else 1
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"autotune: error: {disk_full(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        sigterm = isinstance(e, Terminated) or (isinstance(e, Stopped)
                                                and e.signum == signal.SIGTERM)
        how = "terminated (SIGTERM)" if sigterm else "interrupted"
        failed = getattr(e, "failed_trial", None)
        if isinstance(e, Stopped):
            trial = "the running trial saved a checkpoint it resumes from"
        elif failed is not None:
            trial = f"trial {failed}, running, is marked failed"
        else:   # before or between trials: nothing of a trial to say
            trial = ""
        print(f"autotune: {how}" + (f"; {trial}, and the study can be resumed with the same "
                                    "command" if trial else ""), file=sys.stderr)
        return 143 if sigterm else 130
    return code


if __name__ == "__main__":
    sys.exit(main())
