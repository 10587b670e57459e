"""Streaming plain readings: the next time slice is read while the current one is sent.

A plain request (one stored sensor, no operation, no resampling; units and
factors allowed) is split into ``pieces`` equal time slices. Storage reads
slice *k+1* on its own thread while slice *k* is encoded (CSV on a worker
thread, where numpy releases the GIL) and written to the socket, so the
response costs about the larger of reading and encoding, not their sum, and
memory holds two slices, not the whole answer. JSON keeps the contract's
keys; ``count`` comes last because it is known only at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import orjson

from services.common.readings import Series
from services.query_api import csvfast
from services.query_api.query import Reader, Result, apply
from services.query_api.spec import Spec

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def is_plain(spec: Spec) -> bool:
    return not spec.operations and not spec.has_wildcard


async def pieces(
    reader: Reader, spec: Spec, start_ns: int, end_ns: int, count: int
) -> AsyncIterator[Result]:
    """The answer for a plain ``spec`` slice by slice, reading one slice ahead."""
    unit = await reader.catalog.unit(spec.sensor) or ""
    bounds = np.unique(np.linspace(start_ns, end_ns, count + 1).astype(np.int64)).tolist()
    bounds[0], bounds[-1] = start_ns, end_ns

    def read(i: int) -> asyncio.Future[Series]:
        return asyncio.ensure_future(reader.series(spec.sensor, bounds[i], bounds[i + 1]))

    ahead = read(0)
    try:
        for i in range(len(bounds) - 1):
            raw = await ahead
            if i + 2 < len(bounds):
                ahead = read(i + 1)
            yield apply(spec, spec.sensor, unit, raw, start_ns, None, "avg")
    finally:
        if not ahead.done():
            ahead.cancel()


async def json_body(
    head: Result, parts: AsyncIterator[Result], start_ns: int, end_ns: int
) -> AsyncIterator[bytes]:
    """The readings JSON object; ``head`` (an empty result) gives sensor, unit and label."""
    meta = {
        "sensor": head.sensor,
        "unit": head.unit,
        "label": head.label,
        "start_ns": start_ns,
        "end_ns": end_ns,
    }
    yield orjson.dumps(meta)[:-1] + b',"timestamps_ns":['
    values = []
    count = 0
    async for part in parts:
        if len(part) == 0:
            continue
        body = orjson.dumps(part.timestamps_ns, option=_NUMPY)[1:-1]
        yield body if count == 0 else b"," + body
        count += len(part)
        values.append(orjson.dumps(part.values, option=_NUMPY)[1:-1])
    yield b'],"values":[' + b",".join(values) + b'],"count":' + str(count).encode() + b"}"


async def csv_lines(parts: AsyncIterator[Result], iso: bool) -> AsyncIterator[bytes]:
    """DCDB CSV lines of each slice, encoded on worker threads, two slices at a time."""
    pending: asyncio.Future[bytes] | None = None
    async for part in parts:
        if len(part) == 0:
            continue
        nxt = asyncio.ensure_future(
            asyncio.to_thread(csvfast.lines, part.sensor, part.timestamps_ns, part.values, iso)
        )
        if pending is not None:
            yield await pending
        pending = nxt
    if pending is not None:
        yield await pending
