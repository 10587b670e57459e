"""Everything in the SQLite file besides readings: metadata, virtual sensors, jobs.

Functions take the connection (and run inside the caller's transaction), so
that :mod:`.sqlite` decides threading and transactions in one place.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import numpy as np

from services.common.readings import Float64Array, Int64Array, Series
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.base import VirtualResults


# ---------------------------------------------------------------------- hierarchy
def sensor_names(con: sqlite3.Connection, prefix: str) -> list[str]:
    if prefix == "/":
        rows = con.execute("SELECT name FROM sensors ORDER BY name").fetchall()
    else:
        rows = con.execute(
            "SELECT name FROM sensors WHERE name=? OR (name>=? AND name<?) ORDER BY name",
            (prefix, prefix + "/", prefix + "0"),  # '0' sorts right after '/'
        ).fetchall()
    return [r[0] for r in rows]


# ---------------------------------------------------------------------- metadata
def get_metadata(con: sqlite3.Connection, sensor: str) -> SensorMetadata | None:
    row = con.execute("SELECT metadata FROM sensors WHERE name=?", (sensor,)).fetchone()
    if row is None or row[0] is None:
        return None
    return SensorMetadata.model_validate_json(row[0])


def put_metadata(con: sqlite3.Connection, meta: SensorMetadata) -> None:
    row = con.execute("SELECT metadata FROM sensors WHERE name=?", (meta.name,)).fetchone()
    merged = meta
    if row and row[0]:
        merged = SensorMetadata.model_validate_json(row[0]).merged(meta)
    text = merged.model_dump_json()
    if row is None:
        con.execute("INSERT INTO sensors(name, metadata) VALUES (?, ?)", (meta.name, text))
    else:
        con.execute("UPDATE sensors SET metadata=? WHERE name=?", (text, meta.name))


def list_metadata(con: sqlite3.Connection, prefix: str) -> list[SensorMetadata]:
    wanted = set(sensor_names(con, prefix))
    rows = con.execute(
        "SELECT name, metadata FROM sensors WHERE metadata IS NOT NULL ORDER BY name"
    )
    return [SensorMetadata.model_validate_json(m) for n, m in rows if n in wanted]


# ---------------------------------------------------------------------- virtual sensors
def put_virtual(con: sqlite3.Connection, name: str, definition: dict[str, Any]) -> None:
    con.execute("INSERT OR REPLACE INTO virtual_defs VALUES (?,?)", (name, json.dumps(definition)))


def get_virtual(con: sqlite3.Connection, name: str) -> dict[str, Any] | None:
    row = con.execute("SELECT definition FROM virtual_defs WHERE name=?", (name,)).fetchone()
    return None if row is None else dict(json.loads(row[0]))


def list_virtual(con: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    rows = con.execute("SELECT name, definition FROM virtual_defs ORDER BY name").fetchall()
    return {n: json.loads(d) for n, d in rows}


def delete_virtual(con: sqlite3.Connection, name: str) -> bool:
    n = con.execute("DELETE FROM virtual_defs WHERE name=?", (name,)).rowcount
    con.execute("DELETE FROM virtual_ranges WHERE name=?", (name,))
    con.execute("DELETE FROM virtual_points WHERE name=?", (name,))
    return bool(n > 0)


def write_virtual_results(
    con: sqlite3.Connection,
    name: str,
    start_ns: int,
    end_ns: int,
    timestamps_ns: Int64Array,
    values: Float64Array,
    computed_at_ns: int,
) -> None:
    drop_virtual(con, name, start_ns, end_ns)
    inside = (timestamps_ns >= start_ns) & (timestamps_ns < end_ns)
    ts, vs = timestamps_ns[inside], values[inside]
    con.executemany(
        "INSERT OR REPLACE INTO virtual_points VALUES (?,?,?)",
        zip([name] * len(ts), ts.tolist(), _nan_to_none(vs), strict=True),
    )
    con.execute(
        "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)",
        (name, start_ns, end_ns, computed_at_ns),
    )


def read_virtual_results(
    con: sqlite3.Connection, name: str, start_ns: int, end_ns: int
) -> VirtualResults:
    rng = con.execute(
        "SELECT start_ns, end_ns, computed_at FROM virtual_ranges "
        "WHERE name=? AND end_ns>? AND start_ns<? ORDER BY start_ns",
        (name, start_ns, end_ns),
    ).fetchall()
    pts = con.execute(
        "SELECT ts, value FROM virtual_points WHERE name=? AND ts>=? AND ts<? ORDER BY ts",
        (name, start_ns, end_ns),
    ).fetchall()
    ts = np.fromiter((p[0] for p in pts), dtype=np.int64, count=len(pts))
    vs = np.fromiter(
        (np.nan if p[1] is None else p[1] for p in pts), dtype=np.float64, count=len(pts)
    )
    return VirtualResults(
        covered=[(int(a), int(b)) for a, b, _ in rng],
        series=Series(name, ts, vs),
        computed_at_ns=[int(c) for _, _, c in rng],
    )


def drop_virtual(con: sqlite3.Connection, name: str, start_ns: int, end_ns: int) -> None:
    """Remove coverage and points in [start, end); trim ranges that straddle the edges."""
    con.execute(
        "DELETE FROM virtual_points WHERE name=? AND ts>=? AND ts<?", (name, start_ns, end_ns)
    )
    rows = con.execute(
        "SELECT start_ns, end_ns, computed_at FROM virtual_ranges "
        "WHERE name=? AND end_ns>? AND start_ns<?",
        (name, start_ns, end_ns),
    ).fetchall()
    for a, b, c in rows:
        con.execute("DELETE FROM virtual_ranges WHERE name=? AND start_ns=?", (name, a))
        if a < start_ns:
            con.execute(
                "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)", (name, a, start_ns, c)
            )
        if b > end_ns:
            con.execute(
                "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)", (name, end_ns, b, c)
            )


def _nan_to_none(values: Float64Array) -> list[float | None]:
    # SQLite stores NaN as NULL anyway; be explicit so reads map NULL back to NaN.
    vals: list[float | None] = values.tolist()
    if bool(np.isnan(values).any()):
        vals = [None if v != v else v for v in vals]
    return vals


# ---------------------------------------------------------------------- jobs
def put_job(con: sqlite3.Connection, job: JobRecord) -> None:
    row = con.execute(
        "SELECT start_ns, user_id, nodes FROM jobs WHERE domain_id=? AND job_id=?",
        (job.domain_id, job.job_id),
    ).fetchone()
    start, user, nodes = job.start_ns, job.user_id, list(job.nodes)
    if row is not None:
        # A job-end record may carry no start, user or node list; keep the start's.
        start = int(row[0]) if job.start_ns == 0 else job.start_ns
        user = user or (row[1] or "")
        nodes = nodes or json.loads(row[2])
    con.execute(
        "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?)",
        (job.domain_id, job.job_id, user, start, job.end_ns, json.dumps(nodes)),
    )


def jobs(
    con: sqlite3.Connection, start_ns: int | None, end_ns: int | None, node: str | None
) -> list[JobRecord]:
    rows = con.execute(
        "SELECT domain_id, job_id, user_id, start_ns, end_ns, nodes FROM jobs "
        "WHERE (? IS NULL OR start_ns < ?) AND (? IS NULL OR end_ns IS NULL OR end_ns > ?) "
        "ORDER BY start_ns, domain_id, job_id",
        (end_ns, end_ns, start_ns, start_ns),
    ).fetchall()
    out = []
    for d, j, u, s, e, n in rows:
        nodes = tuple(json.loads(n))
        if node is not None and node not in nodes:
            continue
        out.append(
            JobRecord(domain_id=d, job_id=j, user_id=u or "", start_ns=s, end_ns=e, nodes=nodes)
        )
    return out
