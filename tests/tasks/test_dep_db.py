"""tasks/dep_db.py: doit's sqlite3 file, every record read when it is opened."""

from __future__ import annotations

import pytest
from doit.dependency import DatabaseException, JSONCodec, SqliteDB
from kiln.tasks.dep_db import PreloadedSqliteDB


def written(path, records: dict[str, dict]) -> None:
    db = SqliteDB(str(path), JSONCodec())
    for task, values in records.items():
        for key, value in values.items():
            db.set(task, key, value)
    db.dump()


def test_it_reads_what_doits_own_backend_wrote_and_writes_what_it_reads(tmp_path):
    path = tmp_path / "doit.sqlite3"
    written(path, {"compile:a.trace": {"_values_:": {"cache": "hit"}, "f": [1, 2]}, "b": {"x": 1}})
    db = PreloadedSqliteDB(str(path), JSONCodec())
    assert db.get("compile:a.trace", "f") == [1, 2]
    assert db.get("b", "x") == 1
    assert db.get("missing", "x") is None
    assert db.in_("b") and not db.in_("never-ran")
    db.set("c", "y", {"z": 3})
    db.dump()
    again = SqliteDB(str(path), JSONCodec())  # doit's own backend reads the file back
    assert again.get("c", "y") == {"z": 3} and again.get("b", "x") == 1


def test_it_asks_the_file_once_not_once_per_task(tmp_path):
    path = tmp_path / "doit.sqlite3"
    written(path, {f"t{i}": {"k": i} for i in range(50)})
    db = PreloadedSqliteDB(str(path), JSONCodec())
    queries: list[str] = []
    db._conn.set_trace_callback(queries.append)
    assert [db.get(f"t{i}", "k") for i in range(50)] == list(range(50))
    assert db.get("t-new", "k") is None
    assert queries == []


def test_a_file_damaged_past_its_header_is_doits_database_error(tmp_path):
    path = tmp_path / "doit.sqlite3"
    written(path, {f"t{i}": {"k": "v" * 200} for i in range(200)})
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)  # the table's pages: the header stays
    path.write_bytes(bytes(data))
    with pytest.raises(DatabaseException, match="corrupted"):
        PreloadedSqliteDB(str(path), JSONCodec())
