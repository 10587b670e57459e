"""Rollups: per-minute and per-hour min/max/sum/count, kept by ClickHouse itself.

Two materialized views aggregate every block inserted into the readings table
(NaN left out, as the query API's resampling leaves it out) into
AggregatingMergeTree tables ``<p>_1m`` and ``<p>_1h``. A resampled read whose
step is a multiple of a rollup's and whose range is aligned to it is answered
from the coarsest such rollup: the same buckets, min/max/count exactly, sums
and averages up to float rounding. The raw readings may expire long before
(``raw_ttl_s``); the rollups stay.

A rollup counts every reading as *inserted*: a block dropped as a duplicate by
a replicated table is not counted, but a reading inserted twice in different
blocks (an overwrite, or a redelivery on a single server) counts twice in
count/sum/avg until its minutes are rebuilt. ``delete_range`` rebuilds the
minutes and hours it touches from the raw readings; truncation drops the
rollup rows wholly before its cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from services.common.readings import Series
from services.common.storage.clickhouse.native import literal
from services.common.storage.clickhouse.schema import ROLLUPS, floor_to

if TYPE_CHECKING:
    from services.common.storage.clickhouse.backend import ClickHouseStorage

OPS = ("min", "max", "avg", "sum", "count")
_ROW = np.dtype([("t", "<i8"), ("mn", "<f8"), ("mx", "<f8"), ("sm", "<f8"), ("cnt", "<u8")])


def pick(start_ns: int, end_ns: int, interval_ns: int) -> str | None:
    """The coarsest rollup that answers buckets of ``interval_ns`` over the range exactly."""
    for suffix, step in sorted(ROLLUPS.items(), key=lambda kv: -kv[1]):
        if interval_ns % step == 0 and start_ns % step == 0 and end_ns % step == 0:
            return suffix
    return None


async def read(
    backend: ClickHouseStorage, sensor: str, start_ns: int, end_ns: int, interval_ns: int, op: str
) -> Series | None:
    suffix = pick(start_ns, end_ns, interval_ns) if op in OPS else None
    if suffix is None or start_ns >= end_ns:
        return None
    body = await backend.http.select(
        f"SELECT {floor_to('t', interval_ns)} AS b, minMerge(mn), maxMerge(mx), sumMerge(sm), "
        f"countMerge(cnt) FROM {backend.schema.name('_' + suffix)} WHERE sensor = {literal(sensor)} "
        f"AND t >= {start_ns} AND t < {end_ns} GROUP BY b ORDER BY b FORMAT RowBinary"
    )
    rows = np.frombuffer(body, dtype=_ROW)
    counts = rows["cnt"].astype(np.float64)
    keep = counts > 0
    rows, counts = rows[keep], counts[keep]
    values = {
        "min": rows["mn"],
        "max": rows["mx"],
        "sum": rows["sm"],
        "count": counts,
    }.get(op)
    if values is None:
        values = rows["sm"] / counts
    backend.metrics.read_points.labels(backend.kind).inc(rows.shape[0])
    return Series(sensor, rows["t"].copy(), np.ascontiguousarray(values, dtype=np.float64))


async def rebuild(backend: ClickHouseStorage, where: str, start_ns: int, end_ns: int) -> None:
    """Recompute the rollup rows overlapping ``[start_ns, end_ns)`` (sensors ``where``)
    from the raw readings, after they changed under them."""
    t = backend.schema
    for suffix, step in ROLLUPS.items():
        a = start_ns - start_ns % step
        b = end_ns if end_ns % step == 0 else end_ns - end_ns % step + step
        b = min(b, 2**63 - 1)
        await backend._delete(f"_{suffix}", f"{where} AND t >= {a} AND t < {b}")
        await backend.http.request(
            f"INSERT INTO {t.name('_' + suffix)} SELECT sensor, {floor_to('ts', step)} AS t, "
            "minState(value), maxState(value), sumState(value), countState() "
            f"FROM {t.name()} FINAL WHERE {where} AND ts >= {a} AND ts < {b} "
            "AND NOT isNaN(value) GROUP BY sensor, t",
            settings=backend.insert_settings or None,
            what="insert",
        )


async def truncate(backend: ClickHouseStorage, where: str, ts_ns: int) -> None:
    """Drop the rollup rows that lie wholly before ``ts_ns``."""
    for suffix, step in ROLLUPS.items():
        await backend._delete(f"_{suffix}", f"{where} AND t <= {ts_ns - step}")
