"""Stored virtual-sensor results in the SQLite file: coverage ranges and columnar chunks.

``virtual_ranges`` holds what was computed (``[start_ns, end_ns)`` and when);
``virtual_chunks`` the points, as chunks of :mod:`.virtual_chunks` (grid
timestamps, raw values), at most ``CHUNK_POINTS`` each. Points only exist
inside covered ranges, and neither ranges nor chunks of one sensor overlap
(a write drops what it replaces first), so both are read in order of their
end with an index on ``(name, end)``, stopping at the first that starts past
the requested range. A small write next to a chunk that is not full extends
that chunk instead of adding one, so a dashboard that stores a few points per
refresh does not leave thousands of tiny chunks behind.

Functions take the connection and run inside the caller's transaction (see
:mod:`.sqlite`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import numpy as np

from services.common.readings import Float64Array, Int64Array, Series, sort_dedup
from services.common.storage import virtual_chunks as vc
from services.common.storage.base import VirtualResults

_MIN_I64, _MAX_I64 = -(2**63), 2**63 - 1

TABLES = [
    """CREATE TABLE IF NOT EXISTS virtual_chunks (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL, t0 INTEGER NOT NULL, t1 INTEGER NOT NULL,
        n INTEGER NOT NULL, enc INTEGER NOT NULL, ts BLOB NOT NULL, vs BLOB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS virtual_chunks_end ON virtual_chunks (name, t1)",
    "CREATE INDEX IF NOT EXISTS virtual_ranges_end ON virtual_ranges (name, end_ns)",
]
"""Schema version 3: what replaced the row-per-point ``virtual_points`` table."""

_INSERT = "INSERT INTO virtual_chunks (name, t0, t1, n, enc, ts, vs) VALUES (?,?,?,?,?,?,?)"


def _clamp(start_ns: int, end_ns: int) -> tuple[int, int]:
    return max(start_ns, _MIN_I64), min(end_ns, _MAX_I64)


def insert_chunks(con: sqlite3.Connection, name: str, ts: Int64Array, vs: Float64Array) -> None:
    """Store a sorted run (no stored chunk may overlap it) as chunks."""
    rows = []
    for c in vc.split(ts, vs):
        enc, tb, vb = vc.encode(c.ts, c.vs)
        rows.append((name, c.t0, c.t1, c.n, enc, tb, vb))
    con.executemany(_INSERT, rows)


def _chunks_from(
    con: sqlite3.Connection, name: str, start_ns: int, end_ns: int, columns: str
) -> Iterator[tuple[Any, ...]]:
    """Rows ``(t0, *columns)`` of the chunks intersecting ``[start_ns, end_ns)``, in time order."""
    cur = con.execute(
        f"SELECT t0, {columns} FROM virtual_chunks WHERE name=? AND t1>=? ORDER BY t1",
        (name, start_ns),
    )
    try:
        for row in cur:
            if row[0] >= end_ns:
                break
            yield row
    finally:
        cur.close()


def _ranges(
    con: sqlite3.Connection, name: str, start_ns: int, end_ns: int
) -> list[tuple[int, int, int]]:
    """Covered ranges ``(start, end, computed_at)`` intersecting ``[start_ns, end_ns)``."""
    out = []
    cur = con.execute(
        "SELECT start_ns, end_ns, computed_at FROM virtual_ranges "
        "WHERE name=? AND end_ns>? ORDER BY end_ns",
        (name, start_ns),
    )
    for a, b, c in cur:
        if a >= end_ns:
            break
        out.append((int(a), int(b), int(c)))
    cur.close()
    return out


def write_results(
    con: sqlite3.Connection,
    name: str,
    start_ns: int,
    end_ns: int,
    timestamps_ns: Int64Array,
    values: Float64Array,
    computed_at_ns: int,
) -> None:
    start_ns, end_ns = _clamp(start_ns, end_ns)
    if start_ns >= end_ns:
        return
    drop(con, name, start_ns, end_ns)
    ts = np.asarray(timestamps_ns, dtype=np.int64)
    vs = np.asarray(values, dtype=np.float64)
    if ts.shape[0] > 1 and not bool(np.all(ts[1:] > ts[:-1])):
        ts, vs = sort_dedup(ts, vs)  # the last of equal timestamps wins, as for readings
    a, b = int(np.searchsorted(ts, start_ns, "left")), int(np.searchsorted(ts, end_ns, "left"))
    ts, vs = ts[a:b], vs[a:b]
    if ts.shape[0]:
        prev = con.execute(
            "SELECT id, n, enc, ts, vs FROM virtual_chunks WHERE name=? AND t1<? "
            "ORDER BY t1 DESC LIMIT 1",
            (name, start_ns),
        ).fetchone()
        if prev is not None and prev[1] < vc.CHUNK_POINTS:
            pts, pvs = vc.decode(prev[2], prev[1], prev[3], prev[4])
            ts, vs = np.concatenate((pts, ts)), np.concatenate((pvs, vs))
            con.execute("DELETE FROM virtual_chunks WHERE id=?", (prev[0],))
        insert_chunks(con, name, ts, vs)
    con.execute(
        "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)",
        (name, start_ns, end_ns, computed_at_ns),
    )


def read_results(con: sqlite3.Connection, name: str, start_ns: int, end_ns: int) -> VirtualResults:
    start_ns, end_ns = _clamp(start_ns, end_ns)
    ranges = _ranges(con, name, start_ns, end_ns) if start_ns < end_ns else []
    ts, vs = vc.assemble(
        (
            vc.decode(enc, n, tb, vb)
            for _, n, enc, tb, vb in (
                _chunks_from(con, name, start_ns, end_ns, "n, enc, ts, vs") if ranges else ()
            )
        ),
        start_ns,
        end_ns,
    )
    return VirtualResults(
        covered=[(a, b) for a, b, _ in ranges],
        series=Series(name, ts, vs),
        computed_at_ns=[c for _, _, c in ranges],
    )


def drop(con: sqlite3.Connection, name: str, start_ns: int, end_ns: int) -> None:
    """Remove coverage and points in ``[start, end)``; trim what straddles the edges."""
    start_ns, end_ns = _clamp(start_ns, end_ns)
    if start_ns >= end_ns:
        return
    found = list(_chunks_from(con, name, start_ns, end_ns, "id, t1"))
    # at most the first and the last chunk straddle an edge: only those are decoded
    edges = [cid for t0, cid, t1 in found if t0 < start_ns or t1 >= end_ns]
    kept = [
        con.execute(
            "SELECT t0, t1, n, enc, ts, vs FROM virtual_chunks WHERE id=?", (cid,)
        ).fetchone()
        for cid in edges
    ]
    con.executemany("DELETE FROM virtual_chunks WHERE id=?", [(cid,) for _, cid, _ in found])
    for t0, t1, n, enc, tb, vb in kept:
        ts, vs = vc.decode(enc, n, tb, vb)
        for part in vc.outside(vc.Chunk(t0, t1, ts, vs), start_ns, end_ns):
            insert_chunks(con, name, part.ts, part.vs)
    for a, b, c in _ranges(con, name, start_ns, end_ns):
        con.execute("DELETE FROM virtual_ranges WHERE name=? AND start_ns=?", (name, a))
        if a < start_ns:
            con.execute(
                "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)", (name, a, start_ns, c)
            )
        if b > end_ns:
            con.execute(
                "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)", (name, end_ns, b, c)
            )


def delete_all(con: sqlite3.Connection, name: str) -> None:
    con.execute("DELETE FROM virtual_ranges WHERE name=?", (name,))
    con.execute("DELETE FROM virtual_chunks WHERE name=?", (name,))


def points_to_chunks(con: sqlite3.Connection) -> None:
    """Schema 2 -> 3: the row-per-point ``virtual_points`` table into chunks, sensor by sensor."""
    for stmt in TABLES:
        con.execute(stmt)
    names = [r[0] for r in con.execute("SELECT DISTINCT name FROM virtual_points").fetchall()]
    for name in names:
        cur = con.execute("SELECT ts, value FROM virtual_points WHERE name=? ORDER BY ts", (name,))
        while rows := cur.fetchmany(vc.CHUNK_POINTS):
            ts = np.fromiter((r[0] for r in rows), np.int64, len(rows))
            # SQLite stored NaN as NULL
            vs = np.fromiter(
                (np.nan if r[1] is None else r[1] for r in rows), np.float64, len(rows)
            )
            insert_chunks(con, name, ts, vs)
    con.execute("DROP TABLE virtual_points")


def stored_points(con: sqlite3.Connection) -> int:
    return int(con.execute("SELECT COALESCE(SUM(n), 0) FROM virtual_chunks").fetchone()[0])
