"""doit's sqlite3 dependency database, every task's record read in one query.

doit's backend asks the database once per task, on first use: a SELECT
for each of a build's thousands of tasks, most of them answered "no
record" in a cold build. Kiln's builds check every task of the project,
so reading all records when the file is opened costs one query instead.
The file is doit's own, unchanged: plain `doit` and `kiln dumpdb` read it.
"""

from __future__ import annotations

from doit.dependency import DatabaseException, SqliteDB

BACKEND_PLUGIN = {"BACKEND": {"sqlite3": "kiln.tasks.dep_db:PreloadedSqliteDB"}}


class PreloadedSqliteDB(SqliteDB):
    """doit's SqliteDB with its cache filled from the file when opened."""

    desc = "sqlite3, every record read at once"

    def __init__(self, name, codec, *, module_name=None):
        import sqlite3

        super().__init__(name, codec, module_name=module_name)
        try:
            rows = self._conn.execute("select task_id, task_data from doit").fetchall()
        except (sqlite3.DatabaseError, ValueError) as exc:  # damaged past its header
            raise DatabaseException(
                f"Dependencies file in {name!r} seems to use a bad format or is corrupted: {exc}"
            ) from None
        self._cache = {row["task_id"]: row["task_data"] or {} for row in rows}

    def _get_task_data(self, task_id):
        return {}  # not in the cache: not in the file either

    def in_(self, task_id):
        return task_id in self._cache
