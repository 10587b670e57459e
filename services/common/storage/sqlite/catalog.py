"""Everything in the SQLite file besides readings: metadata, virtual definitions, jobs.

Functions take the connection (and run inside the caller's transaction), so
that :mod:`.sqlite` decides threading and transactions in one place.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.sqlite import virtual as sqlite_virtual


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
    sqlite_virtual.delete_all(con, name)
    return bool(n > 0)


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


def get_job(con: sqlite3.Connection, job_id: str, domain_id: str) -> JobRecord | None:
    row = con.execute(  # the primary key (domain_id, job_id)
        "SELECT user_id, start_ns, end_ns, nodes FROM jobs WHERE domain_id=? AND job_id=?",
        (domain_id, job_id),
    ).fetchone()
    if row is None:
        return None
    u, s, e, n = row
    return JobRecord(
        domain_id=domain_id,
        job_id=job_id,
        user_id=u or "",
        start_ns=s,
        end_ns=e,
        nodes=tuple(json.loads(n)),
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
