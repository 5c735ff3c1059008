"""The study store, as every command opens it: a database URL (SQLite, PostgreSQL through
psycopg2) or a study server (``autotune://HOST:PORT``, Optuna's gRPC storage proxy with
autotune's trial cache and reconnection), either way wrapped so that it rides out a restart of
the other end (``_retry.RetryingStorage``). The server's address, channels, secret and TLS are
``_channel``'s; the server itself is ``server.py``.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any
from urllib.parse import urlparse

import optuna
from optuna.trial import FrozenTrial, TrialState

from ._channel import STATES_KEY, Address, is_server_url, open_channel, parse_address, refused
from .config import database_url, redact, sqlite_file, sqlite_wal
from .errors import ConfigError
from .record import STUDY_CONFIG

__all__ = ["check_database", "foreign_study", "load_existing_study", "mysql_long_text",
           "open_storage"]
log = logging.getLogger("autotune")


def load_existing_study(study_name: str, storage: str) -> optuna.Study:
    """The study ``study_name`` in ``storage``, which it must hold already: a one-line error
    naming the studies there otherwise, and nothing created."""
    store = open_storage(storage, create=False)
    try:
        return optuna.load_study(study_name=study_name, storage=store)
    except KeyError as e:
        names = [s.study_name for s in optuna.get_all_study_summaries(store)]
        raise ConfigError(f"no study {study_name!r} in {redact(storage)}; studies there: "
                          f"{', '.join(names) or 'none'}") from e


def foreign_study(study: optuna.Study) -> str | None:
    """Why ``study`` is another tool's (an Optuna study of the user's own that shares the name
    and the database), or None: autotune's studies minimize one value, and once they hold a
    finished trial they hold autotune's config. A study autotune created and left before
    writing its config holds no finished trial, so it is autotune's to resume."""
    if len(study.directions) != 1:
        directions = ", ".join(d.name.lower() for d in study.directions)
        return f"it has {len(study.directions)} objectives ({directions}); autotune's have one"
    if study.direction != optuna.study.StudyDirection.MINIMIZE:
        return "it maximizes its value; autotune's minimize the time to the target"
    if STUDY_CONFIG in study.user_attrs:
        return None
    ended = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    if ended:
        return f"it holds {len(ended)} finished trial(s) and no autotune settings"
    return None


# the package that brings a database driver SQLAlchemy asks for (the module is not its name)
_DRIVERS = {"pymysql": "pymysql", "MySQLdb": "mysqlclient", "mysql": "mysql-connector-python",
            "psycopg": "psycopg", "psycopg2": "psycopg2-binary", "asyncpg": "asyncpg",
            "oracledb": "oracledb", "pyodbc": "pyodbc", "pymssql": "pymssql"}


def storage_problem(error: BaseException, url: str) -> str:
    """What went wrong opening the database at ``url``, in one line: a database driver that is
    not installed is named, with what to do (SQLAlchemy says only "install appropriate one"),
    and so is a database the server does not have yet."""
    missing = error if isinstance(error, ModuleNotFoundError) else error.__cause__
    if isinstance(missing, ModuleNotFoundError) and missing.name:
        scheme = url.partition(":")[0]
        package = _DRIVERS.get(missing.name.partition(".")[0])
        install = (f"pip install {package}" if package
                   else f"install the driver {scheme} URLs need")
        if missing.name == "MySQLdb":     # mysqlclient compiles against MySQL's C library
            install += " (it builds against MySQL's client library; mysql+pymysql:// URLs " \
                       "need only pip install pymysql)"
        return (f"its database driver (Python module {missing.name}) is not installed; "
                f"{install}, or use sqlite:///PATH (the default) or postgresql://USER@HOST/DB "
                "(psycopg2, installed with autotune)")
    if error.__cause__ is not None and str(error).startswith("An exception is raised during"):
        error = error.__cause__     # Optuna's word for any failed commit: the database's own
    text = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", " ".join(str(error).split()))
    if "Can't load plugin: sqlalchemy.dialects:" in text:   # a scheme no database has
        scheme = url.partition(":")[0]
        return (f"{scheme}:// is not a database autotune can keep studies in; give "
                "sqlite:///PATH (the default), postgresql://USER@HOST/DB, mysql://USER@HOST/DB "
                "(with its driver) or a study server (autotune://HOST:PORT)")
    user = urlparse(url).username or "the user"
    database = urlparse(url).path.lstrip("/") or "the database"
    if re.search(r"permission denied for schema public", text):
        return (f"{user} may not create tables in {database}'s public schema (PostgreSQL 15 "
                "and later let only the database's owner): make it the owner (ALTER DATABASE "
                f"{database} OWNER TO {user}) or grant it (GRANT CREATE ON SCHEMA public TO "
                f"{user}), as a role that may")
    denied = re.search(r"permission denied for (table|sequence) (\w+)", text)
    if denied:
        return (f"{user} may not use the {denied.group(1)} {denied.group(2)} of {database}: "
                "grant it (GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                f"public TO {user}; GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {user}), "
                "as a role that may")
    role = re.search(r'role "([^"]+)" does not exist', text)
    if role:
        return (f'the server has no role "{role.group(1)}"; give a user it has '
                "(postgresql://USER@HOST/DB), or create it (createuser "
                f"{role.group(1)}, as a role that may)")
    if "file is not a database" in text or "database disk image is malformed" in text:
        path = sqlite_file(url)
        shown = path if path is not None else redact(url)
        what = "is not an SQLite database" if "not a database" in text else \
            "is an SQLite database that is damaged (malformed)"
        return (f"{shown} {what}; give the path of a study database autotune or Optuna wrote, "
                "or a new file name for a new study")
    authority = url.partition("://")[2].partition("/")[0]
    if authority.count("@") > 1:   # p@ss written as it is: the host became "ss@host"
        return ("the URL's password holds an '@' (or its user name does): write it "
                "percent-encoded, '@' as %40 (postgresql://user:p%40ss@host/db), as URLs "
                "take it")
    missing_db = re.search(r'database "([^"]+)" does not exist', text)
    if missing_db:   # PostgreSQL's server is up; the study's database is not made yet
        name = missing_db.group(1)
        return (f'the server has no database "{name}"; create it first (createdb {name}, '
                f'or CREATE DATABASE "{name}" as a role that may), or name one it has')
    return _mysql_problem(text, user, database) or redact(text[:300])


def _mysql_problem(text: str, user: str, database: str) -> str | None:
    """What MySQL's or MariaDB's answer (its error number) says to do, or None."""
    code = re.search(r"\((\d{4}), ", text)
    if code is None or "mysql" not in text.lower():
        return None
    number = int(code.group(1))
    if number == 1049:
        return (f"the MySQL server has no database {database}; create it first (CREATE "
                f"DATABASE `{database}`, as a user who may), or name one it has")
    if number in (1044, 1045, 1698):
        why = f"no rights on {database}" if number == 1044 else "wrong password or no such user"
        return (f"the MySQL server refuses {user} ({why}); "
                "give a user and password it accepts (mysql+pymysql://USER:PASSWORD@HOST/DB), "
                f"or grant it (GRANT ALL ON `{database}`.* TO '{user}'@'%', as a user who "
                "may)")
    if number in (1142, 1227):
        return (f"{user} may not create or change tables in {database}: grant it (GRANT ALL "
                f"ON `{database}`.* TO '{user}'@'%', as a user who may)")
    if number == 2003:
        return ("no MySQL server answers there (connection refused or timed out): start it, or "
                "give the host and port where it runs (mysql+pymysql://USER@HOST:3306/DB)")
    return None


def _tables(url: str) -> set[str]:
    """The tables of the database at ``url`` (a one-line ConfigError if it cannot be read)."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(database_url(url))
        try:
            return set(sqlalchemy.inspect(engine).get_table_names())
        finally:
            engine.dispose()
    except Exception as e:  # noqa: BLE001 - any driver error: say it in one line
        raise ConfigError(f"cannot open storage {redact(url)!r}: {storage_problem(e, url)}") from e


# Tables that say a database is MLflow's tracking store.
_MLFLOW_TABLES = {"experiments", "runs", "metrics", "params"}


def check_database(url: str, create: bool) -> None:
    """A one-line error, and nothing created, when the database at ``url`` holds no studies
    and ``create`` is off (an SQLite file that is not there, or a database without Optuna's
    tables), and when it is another application's: one that keeps an ``alembic_version``
    table of its own (MLflow's tracking database, given as the storage by mistake), where
    Optuna's tables would be created beside it and then refused."""
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        if create:
            return
        raise ConfigError(f"no study database at {path}; start a study there first "
                          "(autotune start study FILE --storage ...)")
    tables = _tables(url)
    if "studies" not in tables and "alembic_version" in tables:
        whose = ("MLflow's tracking database (experiments, runs)"
                 if _MLFLOW_TABLES <= tables else "another application's database (it keeps "
                 "an alembic_version table of its own)")
        raise ConfigError(f"{redact(url)} is {whose}, not a study database; give the studies a "
                          "database of their own (sqlite:///autotune.db, the default)")
    if not create and "studies" not in tables:
        raise ConfigError(f"no autotune studies in {redact(url)} (it has no study tables); "
                          "start a study there first (autotune start study FILE --storage "
                          "...)")


def open_storage(url: str, create: bool = True) -> Any:
    """Optuna's storage for ``url``: a database, or a study server (``autotune://HOST:PORT``,
    Optuna's gRPC proxy); either way riding out a restart of the other end. A one-line error
    if it cannot be reached now. ``create=False`` (joining or reading a study): a database
    that holds no studies is refused before anything is created in it."""
    from ._retry import RetryingStorage

    if is_server_url(url):
        address = parse_address(url)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                proxy = _ServerProxy(host=address.host, port=address.port)
                proxy.get_all_studies()  # fails now, not in the middle of a study
        except ConfigError:
            raise
        except Exception as e:
            why = refused(e)
            if why:
                raise ConfigError(f"the study server at {address} {why}") from None
            details = getattr(e, "details", None)     # gRPC's error: its own words only
            first = " ".join(str(details() if callable(details) else e).split())[:200]
            raise ConfigError(f"cannot reach the study server at {address}: {first}; is "
                              "`autotune server` running there?") from e
        return RetryingStorage(proxy,  # type: ignore[abstract]
                               f"the study server at {address}")
    check_database(url, create)
    path = sqlite_file(url)
    if path is not None:
        folder = path.parent
        if not folder.is_dir():
            raise ConfigError(f"cannot open storage {redact(url)!r}: no folder {folder}; "
                              "create it first, or give a path in a folder that exists")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rdb = optuna.storages.RDBStorage(database_url(url),
                                             engine_kwargs={"pool_pre_ping": True})
    except Exception as e:
        raise ConfigError(f"cannot open storage {redact(url)!r}: {storage_problem(e, url)}") from e
    sqlite_wal(url)
    mysql_long_text(rdb.engine)
    return RetryingStorage(rdb, f"the study database {redact(url)}",  # type: ignore[abstract]
                           file=None if path is None else str(path))


# Optuna's JSON columns: MySQL's TEXT holds 64 KB, a trial's curve of about 700 evaluations
# (about 90 bytes each; PostgreSQL's and SQLite's have no such limit)
_JSON_COLUMNS = ("trial_user_attributes", "trial_system_attributes", "study_user_attributes",
                 "study_system_attributes")


def mysql_long_text(engine: Any) -> None:
    """On MySQL or MariaDB, widens Optuna's attribute columns from TEXT (64 KB: a trial with
    more than about 700 evaluations could not record its curve, and failed) to
    MEDIUMTEXT (16 MB), once; where the user may not ALTER them, says the statements to run.
    Optuna reads and writes the wider column as it did the narrow one."""
    import sqlalchemy as sa

    if engine.dialect.name != "mysql":
        return
    try:
        with engine.connect() as conn:
            narrow = [row[0] for row in conn.execute(sa.text(
                "SELECT table_name FROM information_schema.columns WHERE table_schema = "
                "DATABASE() AND column_name = 'value_json' AND data_type IN ('tinytext', "
                "'text')"))]
    except sa.exc.SQLAlchemyError:
        return
    statements = [f"ALTER TABLE {table} MODIFY value_json MEDIUMTEXT" for table in narrow
                  if table in _JSON_COLUMNS]
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
    except sa.exc.SQLAlchemyError as e:
        log.warning("MySQL's TEXT columns hold 64 KB: a trial's curve of more than about "
                    "700 evaluations cannot be recorded, and could not widen them (%s); "
                    "run as a user who may: %s", " ".join(str(e.orig if hasattr(e, "orig")
                                                              else e).split())[:160],
                    "; ".join(statements))


class _ServerProxy(optuna.storages.GrpcStorageProxy):
    """Optuna's gRPC client, reconnecting within 2 s once a restarted server is back (gRPC's
    default backoff grows to 2 minutes), with a trial cache that asks only for the states its
    caller wants (finished trials for a pruning decision, waiting ones for the next trial):
    Optuna's own cache fetches every running trial of the study on every call, which grows as
    the square of the number of workers."""

    def _setup(self) -> None:
        from optuna.storages._grpc.auto_generated import api_pb2_grpc

        self._channel = open_channel(Address(self._host, self._port))
        self._stub = api_pb2_grpc.StorageServiceStub(self._channel)
        self._cache = _FinishedFirstCache(self._stub)


def _finished_first_cache() -> type:
    from optuna.storages._grpc.auto_generated import api_pb2
    from optuna.storages._grpc.client import GrpcClientCache, GrpcClientCacheEntry
    from optuna.storages._grpc.servicer import _from_proto_trial

    class FinishedFirstCache(GrpcClientCache):
        def get_all_trials(self, study_id: int, states: Any) -> list[FrozenTrial]:
            with self.lock:
                fresh = self._read(study_id, states)
                study = self.studies[study_id]
                if states is None:
                    trials = list(study.trials.values())
                else:  # finished ones from the cache; others as the server has them now
                    trials = [t for t in study.trials.values()
                              if t.state.is_finished() and t.state in states]
                    trials += [t for t in fresh if not t.state.is_finished()
                               and t.state in states]
                return sorted(trials, key=lambda t: t.number)

        def _read(self, study_id: int, states: Any) -> list[FrozenTrial]:
            import grpc

            if study_id not in self.studies:
                self.studies[study_id] = GrpcClientCacheEntry()
            study = self.studies[study_id]
            request = api_pb2.GetTrialsRequest(
                study_id=study_id, included_trial_ids=study.unfinished_trial_ids,
                trial_id_greater_than=study.last_finished_trial_id)
            metadata = None if states is None else [
                (STATES_KEY, ",".join(TrialState(s).name for s in states))]
            try:
                reply = self.grpc_client.GetTrials(request, metadata=metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    self.studies.pop(study_id, None)
                    raise KeyError from e
                raise
            fresh = [_from_proto_trial(proto) for proto in reply.trials]
            for trial in fresh:
                self._add_trial_to_cache(study_id, trial)
            return fresh

    return FinishedFirstCache


_FinishedFirstCache = _finished_first_cache()
