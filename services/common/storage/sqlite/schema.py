"""The SQLite file layout, its version, and the migrations between versions.

``meta_kv['schema_version']`` records the layout of a file. Opening a file of
an older version runs each migration in order, each in its own transaction
(a crash between two leaves a consistent file at the intermediate version);
a newer version than this Kelvin knows is refused.

Version 2 layout (readings):

- ``staged``: one row per write (the "head", as TSDBs call it): every
  reading of the batch, sorted by sensor id, as three blobs plus an index
  blob (sensor ids and offsets). One insert per batch whatever its width.
- ``chunks``: per-sensor columnar chunks (see :mod:`.chunks`) produced by
  compaction of ``staged``. ``level >= 0`` marks open chunks still merged by
  compaction; ``level = -1`` sealed (compressed) ones.
- ``writes``: one small row per write, for ``modified_since``.

Version 3 (virtual results): ``virtual_points`` (one row per point) became
``virtual_chunks`` (columnar chunks, :mod:`.virtual`), and
``virtual_ranges`` gained an index on its end.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import numpy as np

from services.common.errors import PermanentStorageError
from services.common.storage import chunks
from services.common.storage.sqlite import virtual as sqlite_virtual

SCHEMA_VERSION = 3
SEALED = -1
"""``chunks.level`` of a sealed chunk."""

_SHARED = [
    "CREATE TABLE IF NOT EXISTS virtual_defs (name TEXT PRIMARY KEY, definition TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS virtual_ranges (
        name TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
        computed_at INTEGER NOT NULL, PRIMARY KEY (name, start_ns))""",
    """CREATE TABLE IF NOT EXISTS jobs (
        domain_id TEXT NOT NULL, job_id TEXT NOT NULL, user_id TEXT,
        start_ns INTEGER NOT NULL, end_ns INTEGER, nodes TEXT NOT NULL,
        PRIMARY KEY (domain_id, job_id))""",
]
"""Tables whose layout is the same in every version."""

_VIRTUAL_POINTS = """CREATE TABLE IF NOT EXISTS virtual_points (
    name TEXT NOT NULL, ts INTEGER NOT NULL, value REAL,
    PRIMARY KEY (name, ts)) WITHOUT ROWID"""
"""Virtual results one row per point (versions 1 and 2)."""

_CHUNKED = [
    "CREATE TABLE IF NOT EXISTS meta_kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS sensors (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, metadata TEXT,
        max_span INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS staged (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, written_at INTEGER NOT NULL,
        n INTEGER NOT NULL, k INTEGER NOT NULL, min_ts INTEGER NOT NULL, max_ts INTEGER NOT NULL,
        idx BLOB NOT NULL, ts BLOB NOT NULL, vs BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS chunks (
        id INTEGER PRIMARY KEY, sid INTEGER NOT NULL, t0 INTEGER NOT NULL, t1 INTEGER NOT NULL,
        n INTEGER NOT NULL, seq INTEGER NOT NULL, level INTEGER NOT NULL, enc INTEGER NOT NULL,
        ts BLOB NOT NULL, vs BLOB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS chunks_time ON chunks (sid, t0)",
    "CREATE INDEX IF NOT EXISTS chunks_open ON chunks (sid, seq) WHERE level >= 0",
    """CREATE TABLE IF NOT EXISTS writes (
        seq INTEGER PRIMARY KEY, written_at INTEGER NOT NULL, base_min INTEGER NOT NULL,
        sids BLOB NOT NULL, late BLOB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS writes_at ON writes (written_at)",
    *_SHARED,
]
"""Chunked readings: version 2 without its virtual results, which version 3 keeps."""

TABLES_V3 = [*_CHUNKED, *sqlite_virtual.TABLES]
"""The current layout (new files)."""
TABLES_V2 = [*_CHUNKED, _VIRTUAL_POINTS]
"""Kept for the migration from version 1 and to test the one from version 2."""

TABLES_V1 = [
    "CREATE TABLE IF NOT EXISTS meta_kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS sensors (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, metadata TEXT)""",
    """CREATE TABLE IF NOT EXISTS readings (
        sid INTEGER NOT NULL, ts INTEGER NOT NULL, value REAL,
        PRIMARY KEY (sid, ts)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS writes (
        sid INTEGER NOT NULL, written_at INTEGER NOT NULL, min_ts INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS writes_at ON writes (written_at)",
    *_SHARED,
    _VIRTUAL_POINTS,
]
"""The placeholder layout (one row per reading); kept to test the migration."""

SEAL_POINTS = 8192
"""Readings per sealed chunk (about 128 KiB raw, 30-60 KiB compressed)."""


def _v1_to_v2(con: sqlite3.Connection) -> None:
    """Row-per-reading -> sealed chunks, sensor by sensor (bounded memory)."""
    con.execute("ALTER TABLE sensors ADD COLUMN max_span INTEGER NOT NULL DEFAULT 0")
    con.execute("DROP TABLE writes")  # per-sensor rows; v2 keeps one row per write
    for stmt in TABLES_V2:
        con.execute(stmt)
    sids = [r[0] for r in con.execute("SELECT DISTINCT sid FROM readings")]
    for sid in sids:
        max_span = 0
        cur = con.execute("SELECT ts, value FROM readings WHERE sid=? ORDER BY ts", (sid,))
        while rows := cur.fetchmany(SEAL_POINTS):
            ts = np.fromiter((r[0] for r in rows), np.int64, len(rows))
            # v1 stored NaN as NULL.
            vs = np.fromiter(
                (np.nan if r[1] is None else r[1] for r in rows), np.float64, len(rows)
            )
            tb, vb = chunks.encode(ts, vs, chunks.ZLIB)
            con.execute(
                "INSERT INTO chunks (sid, t0, t1, n, seq, level, enc, ts, vs) "
                "VALUES (?,?,?,?,0,?,?,?,?)",
                (sid, int(ts[0]), int(ts[-1]), len(rows), SEALED, chunks.ZLIB, tb, vb),
            )
            max_span = max(max_span, int(ts[-1] - ts[0]))
        con.execute("UPDATE sensors SET max_span=? WHERE id=?", (max_span, sid))
    con.execute("DROP TABLE readings")


def _v2_to_v3(con: sqlite3.Connection) -> None:
    """Virtual results one row per point -> columnar chunks (ranges stay as they are)."""
    sqlite_virtual.points_to_chunks(con)


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {2: _v1_to_v2, 3: _v2_to_v3}
"""Target version -> migration from the version before it."""


def ensure_schema(con: sqlite3.Connection, path: str) -> int:
    """Create or migrate the layout on ``con`` (autocommit mode); returns the version found."""
    con.execute("BEGIN IMMEDIATE")
    try:
        con.execute(TABLES_V3[0])
        row = con.execute("SELECT value FROM meta_kv WHERE key='schema_version'").fetchone()
        found = int(row[0]) if row else 0
        if found == 0:
            for stmt in TABLES_V3:
                con.execute(stmt)
            _set_version(con, SCHEMA_VERSION)
        elif found > SCHEMA_VERSION:
            raise PermanentStorageError(
                f"sqlite: {path} has schema version {found}, newer than this Kelvin's "
                f"({SCHEMA_VERSION}); upgrade Kelvin or point storage.sqlite.path elsewhere"
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    version = found or SCHEMA_VERSION
    while version < SCHEMA_VERSION:
        con.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated meanwhile: re-read inside the lock.
            version = int(
                con.execute("SELECT value FROM meta_kv WHERE key='schema_version'").fetchone()[0]
            )
            if version < SCHEMA_VERSION:
                MIGRATIONS[version + 1](con)
                version += 1
                _set_version(con, version)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return found


def _set_version(con: sqlite3.Connection, version: int) -> None:
    con.execute("INSERT OR REPLACE INTO meta_kv VALUES ('schema_version', ?)", (str(version),))
