"""A local MLflow store (``mlruns/``: ``mlflow.db`` and ``artifacts/``) that was moved or
copied keeps, in its database, the absolute artifact paths of the folder it was made in:
MLflow would write a resumed study's plots and curves back there (making that folder again
where the store was moved from) and its UI would look for the earlier ones there.
``follow_move`` repoints them to the store's own ``artifacts/`` folder."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["follow_move"]

# MLflow's tables that hold an experiment's artifact paths, and the column of each.
_LOCATIONS = (("runs", "artifact_uri"), ("logged_models", "artifact_location"))


def _old_root(location: str, root: Path) -> str | None:
    """The ``artifacts/`` folder URI that ``location`` (an experiment's artifact location)
    lies in, where that is another store's folder this store was moved or copied from; None
    where it is this store's own, or not a local store's layout (MLflow's default, an
    object store, a path a user set)."""
    if not location.startswith("file:"):
        return None
    path = Path(unquote(urlparse(location).path))
    old = path.parent
    if old.name != "artifacts" or old == root:
        return None
    prefix = old.as_uri()
    if not location.startswith(prefix + "/"):
        return None
    if (old.parent / "mlflow.db").exists() and not (root / path.name).is_dir():
        return None   # a store still there, whose artifacts were not copied here: its own
    return prefix


def follow_move(db: Path) -> list[str]:
    """Repoints the artifact paths of the local store whose database is ``db`` that name the
    folder it was moved or copied from to ``db``'s own ``artifacts/`` folder, in one
    transaction an experiment; returns the folders it was moved from (none: nothing done)."""
    if not db.is_file():
        return []
    root = db.parent / "artifacts"
    new = root.as_uri()
    moved: list[str] = []
    with closing(sqlite3.connect(db, timeout=60)) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return []
        for exp_id, location in con.execute(
                "SELECT experiment_id, artifact_location FROM experiments").fetchall():
            old = _old_root(str(location or ""), root)
            if old is None:
                continue
            cut = len(old) + 1
            with con:
                con.execute("UPDATE experiments SET artifact_location = ? || substr("
                            "artifact_location, ?) WHERE experiment_id = ?", (new, cut, exp_id))
                for table, column in _LOCATIONS:
                    if table in tables:
                        con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                                    f"WHERE experiment_id = ? AND substr({column}, 1, ?) = ?",
                                    (new, cut, exp_id, cut, old + "/"))
            if old not in moved:
                moved.append(old)
    return moved
