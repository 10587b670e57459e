"""Metadata, virtual sensors, jobs, the write log and small state, kept in ClickHouse.

Every catalog table is a ReplacingMergeTree with a ``version`` column (the
writer's clock, :class:`Clock`), read with ``argMax(column, version) ... GROUP
BY key``: exact whatever the merges have done yet, on one server or through a
Distributed table (no ``FINAL``, whose interplay with ``PREWHERE`` on a
non-key ``deleted`` filter differs between versions). Deletion is a newer row
with ``deleted = 1``; virtual points are deleted by re-inserting the stored
rows of a range as such tombstones (``INSERT ... SELECT``, run by the server).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from services.common import names
from services.common.readings import Float64Array, Int64Array, Series
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.base import VirtualResults
from services.common.storage.clickhouse import native
from services.common.storage.clickhouse.http import ClickHouseHttp
from services.common.storage.clickhouse.native import literal, literals
from services.common.storage.clickhouse.schema import Schema


class Clock:
    """Versions for last-write-wins: wall-clock ns, strictly increasing per writer
    (a write of ``n`` rows reserves ``n`` values, one per row in write order)."""

    def __init__(self) -> None:
        self._last = 0

    def take(self, n: int = 1) -> int:
        first = max(time.time_ns(), self._last + 1)
        self._last = first + n - 1
        return first


def prefix_filter(column: str, prefix: str) -> str:
    """SQL condition: ``column`` is ``prefix`` or a name under it, as a key range (so the
    primary key of a table ordered by ``column`` serves it): ``'/'`` < ``'0'`` in bytes."""
    if prefix == "/":
        return "1"
    p = prefix.rstrip("/")
    return (
        f"({column} = {literal(p)} OR ({column} >= {literal(p + '/')} "
        f"AND {column} < {literal(p + '0')}))"
    )


IN_CHUNK = 500
"""Names per ``IN (...)`` list: the query text stays far below ``max_query_size`` (256 KiB)."""


def chunked(names: Sequence[str]) -> list[Sequence[str]]:
    return [names[i : i + IN_CHUNK] for i in range(0, len(names), IN_CHUNK)]


def json_rows(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line]


class Catalog:
    """The catalog tables of one :class:`Schema` over one :class:`ClickHouseHttp`."""

    def __init__(self, http: ClickHouseHttp, schema: Schema, clock: Clock, insert: dict[str, Any]):
        self.http = http
        self.t = schema
        self.clock = clock
        self.insert_settings = insert

    async def _rows(self, sql: str) -> list[dict[str, Any]]:
        return json_rows(await self.http.query(sql + " FORMAT JSONEachRow"))

    async def _insert_json(self, suffix: str, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            body = "".join(json.dumps(r) + "\n" for r in rows).encode()
            await self.http.insert(
                f"INSERT INTO {self.t.name(suffix)} FORMAT JSONEachRow",
                body,
                **self.insert_settings,
            )

    # ------------------------------------------------------------------ metadata
    async def get_metadata(self, sensor: str) -> SensorMetadata | None:
        found = await self._rows(
            f"SELECT argMax(json, version) AS j FROM {self.t.name('_meta')} "
            f"WHERE sensor = {literal(sensor)} GROUP BY sensor"
        )
        return SensorMetadata.model_validate_json(found[0]["j"]) if found else None

    async def put_metadata(self, meta: SensorMetadata) -> None:
        old = await self.get_metadata(meta.name)
        merged = old.merged(meta) if old else meta
        row = {"sensor": meta.name, "json": merged.model_dump_json(), "version": self.clock.take()}
        await self._insert_json("_meta", [row])

    async def list_metadata(self, prefix: str) -> list[SensorMetadata]:
        found = await self._rows(
            f"SELECT argMax(json, version) AS j FROM {self.t.name('_meta')} "
            f"WHERE {prefix_filter('sensor', prefix)} GROUP BY sensor"
        )
        metas = [SensorMetadata.model_validate_json(r["j"]) for r in found]
        return sorted((m for m in metas if names.is_under(m.name, prefix)), key=lambda m: m.name)

    async def names(self, where: str) -> list[str]:
        """Sensors with readings (as written: ``<p>_names``) or metadata matching ``where``."""
        found = await self._rows(
            f"SELECT DISTINCT sensor FROM (SELECT sensor FROM {self.t.name('_names')} WHERE "
            f"{where} UNION ALL SELECT sensor FROM {self.t.name('_meta')} WHERE {where})"
        )
        return sorted(r["sensor"] for r in found)

    async def add_names(self, names: Sequence[str]) -> None:
        if names:
            ver = self.clock.take()
            await self._insert_json("_names", [{"sensor": n, "version": ver} for n in names])

    # ------------------------------------------------------------------ virtual definitions
    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None:
        row = {"name": name, "json": json.dumps(definition), "deleted": 0}
        await self._insert_json("_vdef", [{**row, "version": self.clock.take()}])

    async def _vdefs(self, where: str) -> dict[str, dict[str, Any]]:
        found = await self._rows(
            f"SELECT name, argMax(json, version) AS j, argMax(deleted, version) AS d "
            f"FROM {self.t.name('_vdef')} WHERE {where} GROUP BY name"
        )
        return {r["name"]: json.loads(r["j"]) for r in found if not int(r["d"])}

    async def get_virtual(self, name: str) -> dict[str, Any] | None:
        return (await self._vdefs(f"name = {literal(name)}")).get(name)

    async def list_virtual(self) -> dict[str, dict[str, Any]]:
        return dict(sorted((await self._vdefs("1")).items()))

    async def delete_virtual(self, name: str) -> bool:
        existed = await self.get_virtual(name) is not None
        await self.drop_virtual(name, -(2**63), 2**63 - 1)
        row = {"name": name, "json": "{}", "deleted": 1, "version": self.clock.take()}
        await self._insert_json("_vdef", [row])
        return existed

    # ------------------------------------------------------------------ virtual results
    async def write_virtual_results(
        self, name: str, start_ns: int, end_ns: int, ts: Int64Array, vs: Float64Array, at: int
    ) -> None:
        await self.drop_virtual(name, start_ns, end_ns)
        inside = (ts >= start_ns) & (ts < end_ns)
        ts, vs = ts[inside], vs[inside]
        n = int(ts.shape[0])
        if n:
            first = self.clock.take(n)  # one version per point: a later duplicate wins
            versions = np.arange(first, first + n, dtype="<u8")
            body = native.block(
                n,
                [
                    native.column("name", "String", native.repeated([native.string(name)], [n])),
                    native.column("ts", "Int64", np.ascontiguousarray(ts, "<i8").tobytes()),
                    native.column("value", "Float64", np.ascontiguousarray(vs, "<f8").tobytes()),
                    native.column("deleted", "UInt8", bytes(n)),
                    native.column("version", "UInt64", versions.tobytes()),
                ],
            )
            await self.http.insert(
                f"INSERT INTO {self.t.name('_vpoints')} FORMAT Native", body, **self.insert_settings
            )
        row = {"name": name, "start_ns": start_ns, "end_ns": end_ns, "computed_at": at}
        await self._insert_json("_vranges", [{**row, "deleted": 0, "version": self.clock.take()}])

    async def _ranges(self, name: str, start_ns: int, end_ns: int) -> list[tuple[int, int, int]]:
        found = await self._rows(
            f"SELECT start_ns, argMax(end_ns, version) AS e, argMax(computed_at, version) AS c, "
            f"argMax(deleted, version) AS d FROM {self.t.name('_vranges')} "
            f"WHERE name = {literal(name)} AND start_ns < {end_ns} GROUP BY start_ns"
        )
        out = [
            (int(r["start_ns"]), int(r["e"]), int(r["c"]))
            for r in found
            if not int(r["d"]) and int(r["e"]) > start_ns
        ]
        return sorted(out)

    async def read_virtual_results(self, name: str, start_ns: int, end_ns: int) -> VirtualResults:
        ranges = await self._ranges(name, start_ns, end_ns)
        body = await self.http.select(
            f"SELECT ts, v FROM (SELECT ts, argMax(value, version) AS v, "
            f"argMax(deleted, version) AS d FROM {self.t.name('_vpoints')} "
            f"WHERE name = {literal(name)} AND ts >= {start_ns} AND ts < {end_ns} GROUP BY ts) "
            "WHERE d = 0 ORDER BY ts FORMAT RowBinary"
        )
        ts, vs = native.points(body)
        return VirtualResults(
            covered=[(s, e) for s, e, _ in ranges],
            series=Series(name, ts, vs),
            computed_at_ns=[c for _, _, c in ranges],
        )

    async def drop_virtual(self, name: str, start_ns: int, end_ns: int) -> None:
        """Forget points and coverage of ``name`` inside ``[start_ns, end_ns)``."""
        ver = self.clock.take()
        await self.http.request(
            f"INSERT INTO {self.t.name('_vpoints')} SELECT name, ts, value, 1, {ver} "
            f"FROM {self.t.name('_vpoints')} WHERE name = {literal(name)} "
            f"AND ts >= {start_ns} AND ts < {end_ns}",
            settings=self.insert_settings,
            what="insert",
        )
        rows = []
        for s, e, c in await self._ranges(name, start_ns, end_ns):
            rows.append({"name": name, "start_ns": s, "end_ns": e, "computed_at": c, "deleted": 1})
            if s < start_ns:
                rows.append({"name": name, "start_ns": s, "end_ns": start_ns, "computed_at": c})
            if e > end_ns:
                rows.append({"name": name, "start_ns": end_ns, "end_ns": e, "computed_at": c})
        if rows:
            # the tombstone of a range that starts where a trimmed part starts is replaced by it
            first = self.clock.take(len(rows))
            await self._insert_json(
                "_vranges",
                [{"deleted": 0, **r, "version": first + i} for i, r in enumerate(rows)],
            )

    # ------------------------------------------------------------------ jobs
    async def _jobs(self, where: str) -> list[JobRecord]:
        found = await self._rows(
            "SELECT domain_id, job_id, argMax(start_ns, version) AS s, argMax(end_ns, version) AS e, "
            "argMax(user_id, version) AS u, argMax(nodes, version) AS n "
            f"FROM {self.t.name('_jobs')} WHERE {where} GROUP BY domain_id, job_id"
        )
        return [
            JobRecord(
                domain_id=r["domain_id"],
                job_id=r["job_id"],
                user_id=r["u"],
                start_ns=int(r["s"]),
                end_ns=int(r["e"]) or None,
                nodes=tuple(json.loads(r["n"])),
            )
            for r in found
        ]

    async def get_job(self, job_id: str, domain_id: str) -> JobRecord | None:
        found = await self._jobs(f"domain_id = {literal(domain_id)} AND job_id = {literal(job_id)}")
        return found[0] if found else None

    async def put_job(self, job: JobRecord) -> None:
        old = await self._jobs(
            f"domain_id = {literal(job.domain_id)} AND job_id = {literal(job.job_id)}"
        )
        start, user, nodes = job.start_ns, job.user_id, list(job.nodes)
        if old:  # a job-end record may carry no start, user or node list; keep the start's
            start = old[0].start_ns if job.start_ns == 0 else job.start_ns
            user = user or old[0].user_id
            nodes = nodes or list(old[0].nodes)
        row = {
            "domain_id": job.domain_id,
            "job_id": job.job_id,
            "start_ns": start,
            "end_ns": job.end_ns or 0,
            "user_id": user,
            "nodes": json.dumps(nodes),
            "version": self.clock.take(),
        }
        await self._insert_json("_jobs", [row])

    async def jobs(
        self, start_ns: int | None, end_ns: int | None, node: str | None
    ) -> list[JobRecord]:
        out = [
            j
            for j in await self._jobs("1")
            if (end_ns is None or j.start_ns < end_ns)
            and (start_ns is None or j.end_ns is None or j.end_ns > start_ns)
            and (node is None or node in j.nodes)
        ]
        return sorted(out, key=lambda j: (j.start_ns, j.domain_id, j.job_id))

    # ------------------------------------------------------------------ write log
    async def log_writes(self, sensors: Sequence[str], mins: Int64Array, written_at: int) -> None:
        n = len(sensors)
        if not n:
            return
        body = native.block(
            n,
            [
                native.column("written_at", "Int64", np.full(n, written_at, "<i8").tobytes()),
                native.column("sensor", "String", b"".join(native.string(s) for s in sensors)),
                native.column("min_ts", "Int64", np.ascontiguousarray(mins, "<i8").tobytes()),
            ],
        )
        quick = {k: v for k, v in self.insert_settings.items() if not k.startswith("insert_quorum")}
        await self.http.insert(f"INSERT INTO {self.t.name('_writes')} FORMAT Native", body, **quick)

    async def written_since(self, sensors: Sequence[str], since_ns: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in chunked(sensors):
            found = await self._rows(
                f"SELECT sensor, min(min_ts) AS m FROM {self.t.name('_writes')} "
                f"WHERE written_at > {since_ns} AND sensor IN {literals(part)} GROUP BY sensor"
            )
            out.update((r["sensor"], int(r["m"])) for r in found)
        return out

    # ------------------------------------------------------------------ state
    async def get_state(self, key: str) -> int | None:
        found = await self._rows(
            f"SELECT argMax(value, version) AS v FROM {self.t.name('_state')} "
            f"WHERE key = {literal(key)} GROUP BY key"
        )
        return int(found[0]["v"]) if found else None

    async def set_state(self, key: str, value: int) -> None:
        await self._insert_json(
            "_state", [{"key": key, "value": value, "version": self.clock.take()}]
        )
