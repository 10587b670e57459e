"""Metadata, virtual sensors, jobs and the write log, kept inside InfluxDB itself.

Everything lives in the same database as the readings, so a site with one
InfluxDB (or one per shard) has one thing to back up. Records that must never
expire (metadata, virtual definitions, jobs, a few state values) are points
at fixed times in the *catalog* retention policy (``autogen`` by default,
infinite in 1.x); an update rewrites the same point (same series, same time),
so the newest write wins. Virtual results and the write log are data: they
live in the readings' policy and expire with it.

| measurement          | tags                 | fields                         | time         |
|----------------------|----------------------|--------------------------------|--------------|
| ``<m>_meta``         | sensor               | json                           | 0            |
| ``<m>_vdef``         | name                 | json                           | 0            |
| ``<m>_vpoints``      | name                 | value                          | reading time |
| ``<m>_vranges``      | name                 | end_ns, computed_at            | range start  |
| ``<m>_jobs``         | domain_id, job_id    | end_ns (0 running), user_id, nodes | job start |
| ``<m>_writes``       | writer               | base_min, bloom, late          | write time   |
| ``<m>_state``        | key                  | value                          | 0            |

The write log summarises each write in one point: the earliest reading per
sensor is the write's ``base_min`` except for "late" sensors listed with their
own minimum, and membership is a 65536-bit filter of name hashes (exact list
of bits for small writes). ``modified_since`` therefore never misses a write
but may, rarely, report a sensor that shares a bit with a written one.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common import names
from services.common.readings import Float64Array, Int64Array, Series
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.base import VirtualResults
from services.common.storage.influxdb.http import InfluxHttp, rows
from services.common.storage.influxdb.protocol import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    field_string,
    head,
    identifier,
    line_tag,
    lines,
    name_of_tag,
    prefix_regex,
    read_csv_stream,
    string_literal,
    tag_value,
)

LATE_NS = 10_000_000_000
"""Sensors of a write whose earliest reading is this much older than the
write's newest per-sensor minimum get their own entry in the write log."""
_BITS = 1 << 16


def name_hash(name: str) -> int:
    return zlib.crc32(name.encode("utf-8", "surrogatepass"))


@dataclass(slots=True)
class WriteSummary:
    """The write-log record of one write."""

    base_min: int
    bloom: str
    late: str

    def fields(self) -> str:
        return f'base_min={self.base_min}i,bloom="{self.bloom}",late="{self.late}"'


def summarise(hashes: Int64Array, mins: Int64Array) -> WriteSummary:
    """One record for a write touching sensors ``hashes`` with earliest readings ``mins``."""
    late = mins < int(mins.max()) - LATE_NS
    base = int(mins[~late].min())
    bits = np.unique((hashes & (_BITS - 1)).astype("<u2"))
    if bits.shape[0] * 2 < _BITS // 8:
        bloom = "i" + _b64(bits.tobytes())
    else:
        bitmap = np.zeros(_BITS, dtype=bool)
        bitmap[bits] = True
        bloom = "b" + _b64(np.packbits(bitmap).tobytes())
    pairs = np.stack([hashes[late], mins[late]], axis=1).astype("<i8")
    return WriteSummary(base, bloom, _b64(pairs.tobytes()))


def earliest_written(
    records: Sequence[tuple[int, str, str]], wanted: Sequence[str]
) -> dict[str, int]:
    """Per wanted name, the earliest reading among the writes ``records`` may include."""
    hashes = {n: name_hash(n) for n in wanted}
    best: dict[str, int] = {}
    for base_min, bloom, late_text in records:
        members = _members(bloom)
        late_pairs = np.frombuffer(_unb64(late_text), "<i8").reshape(-1, 2)
        late = dict(zip(late_pairs[:, 0].tolist(), late_pairs[:, 1].tolist(), strict=True))
        for name, h in hashes.items():
            if members[h & (_BITS - 1)]:
                m = late.get(h, int(base_min))
                best[name] = min(best.get(name, m), m)
    return best


def _members(bloom: str) -> np.ndarray:
    data = _unb64(bloom[1:])
    if bloom[0] == "i":
        out = np.zeros(_BITS, dtype=bool)
        out[np.frombuffer(data, "<u2")] = True
        return out
    return np.unpackbits(np.frombuffer(data, np.uint8)).astype(bool)


def _b64(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 1)).decode("ascii")


def _unb64(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


class InfluxCatalog:
    """Metadata, virtual sensors and jobs over one :class:`InfluxHttp` (layout above)."""

    def __init__(self, http: InfluxHttp, measurement: str, catalog_rp: str, data_rp: str) -> None:
        self.http = http
        self.m = measurement
        self.catalog_rp = catalog_rp
        self.data_rp = data_rp
        db = identifier(http.settings.database)
        self._cat = f"{db}.{identifier(catalog_rp) if catalog_rp else ''}."
        self._data = f"{db}.{identifier(data_rp) if data_rp else ''}."

    def cat(self, suffix: str) -> str:
        """Fully qualified catalog measurement ``<m>_<suffix>``."""
        return self._cat + identifier(f"{self.m}_{suffix}")

    def data(self, suffix: str) -> str:
        return self.data_qualified(f"{self.m}_{suffix}")

    def data_qualified(self, measurement: str) -> str:
        """``measurement`` in the readings' policy, fully qualified."""
        return self._data + identifier(measurement)

    async def _put(self, line: str) -> None:
        await self.http.write(line.encode(), self.catalog_rp or None, strict=True)

    # ------------------------------------------------------------------ metadata
    async def get_metadata(self, sensor: str) -> SensorMetadata | None:
        res = await self.http.query(
            f'SELECT "json" FROM {self.cat("meta")} WHERE "sensor" = {string_literal(tag_value(sensor))}'
        )
        found = rows(res)
        return SensorMetadata.model_validate_json(found[-1][1]["json"]) if found else None

    async def put_metadata(self, meta: SensorMetadata) -> None:
        old = await self.get_metadata(meta.name)
        merged = old.merged(meta) if old else meta
        await self._put(
            f"{self.m}_meta,sensor={line_tag(meta.name)} "
            f"json={field_string(merged.model_dump_json())} 0"
        )

    async def list_metadata(self, prefix: str) -> list[SensorMetadata]:
        where = "" if prefix == "/" else f' WHERE "sensor" =~ {prefix_regex(prefix)}'
        res = await self.http.query(f'SELECT "json" FROM {self.cat("meta")}{where}')
        metas = [SensorMetadata.model_validate_json(r["json"]) for _, r in rows(res)]
        return sorted((m for m in metas if names.is_under(m.name, prefix)), key=lambda m: m.name)

    # ------------------------------------------------------------------ virtual definitions
    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None:
        await self._put(
            f"{self.m}_vdef,name={line_tag(name)} json={field_string(json.dumps(definition))} 0"
        )

    async def get_virtual(self, name: str) -> dict[str, Any] | None:
        res = await self.http.query(
            f'SELECT "json" FROM {self.cat("vdef")} WHERE "name" = {string_literal(tag_value(name))}'
        )
        found = rows(res)
        return dict(json.loads(found[-1][1]["json"])) if found else None

    async def list_virtual(self) -> dict[str, dict[str, Any]]:
        res = await self.http.query(f'SELECT "json", "name" FROM {self.cat("vdef")}')
        return {name_of_tag(r["name"]): json.loads(r["json"]) for _, r in sorted_rows(res, "name")}

    async def delete_virtual(self, name: str) -> bool:
        existed = await self.get_virtual(name) is not None
        lit = string_literal(tag_value(name))
        await self.http.query(
            f'DROP SERIES FROM "{self.m}_vdef", "{self.m}_vpoints", "{self.m}_vranges" '
            f'WHERE "name" = {lit}',
            mutate=True,
        )
        return existed

    # ------------------------------------------------------------------ virtual results
    async def write_virtual_results(
        self, name: str, start_ns: int, end_ns: int, ts: Int64Array, vs: Float64Array, at: int
    ) -> None:
        await self.drop_virtual(name, start_ns, end_ns)
        inside = (ts >= start_ns) & (ts < end_ns)
        tag = line_tag(name)
        body = lines(
            [head(f"{self.m}_vpoints", "name", name)], [int(inside.sum())], ts[inside], vs[inside]
        )
        body.append(f"{self.m}_vranges,name={tag} end_ns={end_ns}i,computed_at={at}i {start_ns}\n")
        await self.http.write("".join(body).encode(), self.data_rp or None)

    async def _ranges(self, name: str, start_ns: int, end_ns: int) -> list[tuple[int, int, int]]:
        res = await self.http.query(
            f'SELECT "end_ns", "computed_at" FROM {self.data("vranges")} '
            f'WHERE "name" = {string_literal(tag_value(name))} AND time < {min(end_ns, MAX_TIME_NS)}'
        )
        return [
            (int(r["time"]), int(r["end_ns"]), int(r["computed_at"]))
            for _, r in rows(res)
            if int(r["end_ns"]) > start_ns
        ]

    async def read_virtual_results(self, name: str, start_ns: int, end_ns: int) -> VirtualResults:
        ranges = await self._ranges(name, start_ns, end_ns)
        a, b = max(start_ns, MIN_TIME_NS), min(end_ns, MAX_TIME_NS + 1)
        ts, vs = await self.http.query_csv(
            f'SELECT "value" FROM {self.data("vpoints")} WHERE "name" = '
            f"{string_literal(tag_value(name))} AND time >= {a} AND time < {b}",
            lambda r: read_csv_stream(r.aiter_raw()),
        )
        return VirtualResults(
            covered=[(s, e) for s, e, _ in ranges],
            series=Series(name, ts, vs),
            computed_at_ns=[c for _, _, c in ranges],
        )

    async def drop_virtual(self, name: str, start_ns: int, end_ns: int) -> None:
        lit = string_literal(tag_value(name))
        a, b = max(start_ns, MIN_TIME_NS), min(end_ns, MAX_TIME_NS + 1)
        await self.http.query(
            f'DELETE FROM "{self.m}_vpoints" WHERE "name" = {lit} AND time >= {a} AND time < {b}',
            mutate=True,
        )
        trimmed = []
        tag = line_tag(name)
        for s, e, c in await self._ranges(name, start_ns, end_ns):
            await self.http.query(
                f'DELETE FROM "{self.m}_vranges" WHERE "name" = {lit} AND time = {s}', mutate=True
            )
            if s < start_ns:
                trimmed.append(
                    f"{self.m}_vranges,name={tag} end_ns={start_ns}i,computed_at={c}i {s}\n"
                )
            if e > end_ns:
                trimmed.append(
                    f"{self.m}_vranges,name={tag} end_ns={e}i,computed_at={c}i {end_ns}\n"
                )
        if trimmed:
            await self.http.write("".join(trimmed).encode(), self.data_rp or None)

    # ------------------------------------------------------------------ jobs
    async def _job_rows(self, where: str) -> list[JobRecord]:
        res = await self.http.query(
            f'SELECT "end_ns", "user_id", "nodes", "domain_id", "job_id" FROM {self.cat("jobs")}{where}'
        )
        return [
            JobRecord(
                domain_id=name_of_tag(r["domain_id"]),
                job_id=name_of_tag(r["job_id"]),
                user_id=r["user_id"] or "",
                start_ns=int(r["time"]),
                end_ns=int(r["end_ns"]) or None,
                nodes=tuple(json.loads(r["nodes"])),
            )
            for _, r in rows(res)
        ]

    @staticmethod
    def _job_key(domain_id: str, job_id: str) -> str:
        return (
            f'"domain_id" = {string_literal(tag_value(domain_id))} '
            f'AND "job_id" = {string_literal(tag_value(job_id))}'
        )

    async def get_job(self, job_id: str, domain_id: str) -> JobRecord | None:
        found = await self._job_rows(f" WHERE {self._job_key(domain_id, job_id)}")  # by its tags
        return found[-1] if found else None

    async def put_job(self, job: JobRecord) -> None:
        key = self._job_key(job.domain_id, job.job_id)
        old = await self._job_rows(f" WHERE {key}")
        start, user, nodes = job.start_ns, job.user_id, list(job.nodes)
        if old:
            # A job-end record may carry no start, user or node list; keep the start's.
            start = old[-1].start_ns if job.start_ns == 0 else job.start_ns
            user = user or old[-1].user_id
            nodes = nodes or list(old[-1].nodes)
            if start != old[-1].start_ns:
                await self.http.query(f'DROP SERIES FROM "{self.m}_jobs" WHERE {key}', mutate=True)
        tags = f"domain_id={line_tag(job.domain_id)},job_id={line_tag(job.job_id)}"
        await self._put(
            f"{self.m}_jobs,{tags} end_ns={job.end_ns or 0}i,user_id={field_string(user)},"
            f"nodes={field_string(json.dumps(nodes))} {start}"
        )

    async def jobs(
        self, start_ns: int | None, end_ns: int | None, node: str | None
    ) -> list[JobRecord]:
        where = f" WHERE time < {min(end_ns, MAX_TIME_NS)}" if end_ns is not None else ""
        out = [
            j
            for j in await self._job_rows(where)
            if (start_ns is None or j.end_ns is None or j.end_ns > start_ns)
            and (node is None or node in j.nodes)
        ]
        return sorted(out, key=lambda j: (j.start_ns, j.domain_id, j.job_id))

    # ------------------------------------------------------------------ state
    async def get_state(self, key: str) -> int | None:
        res = await self.http.query(
            f'SELECT "value" FROM {self.cat("state")} WHERE "key" = {string_literal(tag_value(key))}'
        )
        found = rows(res)
        return int(found[-1][1]["value"]) if found else None

    async def set_state(self, key: str, value: int) -> None:
        await self._put(f"{self.m}_state,key={line_tag(key)} value={value}i 0")


def sorted_rows(
    res: list[dict[str, Any]], column: str
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    return sorted(rows(res), key=lambda r: str(r[1][column]))
