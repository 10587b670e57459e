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
from collections import deque
from collections.abc import AsyncIterator

import numpy as np
import orjson

from services.common.readings import Series
from services.query_api import csvfast, limits
from services.query_api.limits import Held
from services.query_api.query import Reader, Result, apply
from services.query_api.spec import Spec

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


READ_AHEAD = 2
"""Slices being read while one is encoded: storage decompresses without the GIL, so
two reads use both cores of a small machine."""


def is_plain(spec: Spec) -> bool:
    return not spec.operations and not spec.has_wildcard


async def pieces(
    reader: Reader, spec: Spec, start_ns: int, end_ns: int, count: int
) -> AsyncIterator[Result]:
    """The answer for a plain ``spec`` slice by slice, reading ``READ_AHEAD`` slices ahead.

    Under a memory budget a long range is probed first and cut into as many slices as
    keep each within it (services/query_api/limits.py).
    """
    unit = await reader.catalog.unit(spec.sensor) or ""
    origin = start_ns
    probe = limits.probe_end(start_ns, end_ns, READ_AHEAD)
    if probe is not None:
        first = await reader.series(spec.sensor, start_ns, probe, streamed=True)
        count = limits.stream_slices(
            len(first), probe - start_ns, end_ns - probe, count, READ_AHEAD
        )
        yield apply(spec, spec.sensor, unit, first, origin, None, "avg")
        del first
        start_ns = probe
    bounds = np.unique(np.linspace(start_ns, end_ns, count + 1).astype(np.int64)).tolist()
    bounds[0], bounds[-1] = start_ns, end_ns

    def read(i: int) -> asyncio.Future[Series]:
        return asyncio.ensure_future(
            reader.series(spec.sensor, bounds[i], bounds[i + 1], streamed=True)
        )

    slices = len(bounds) - 1
    ahead = deque(read(i) for i in range(min(READ_AHEAD, slices)))
    try:
        for i in range(slices):
            raw = await ahead.popleft()
            if i + READ_AHEAD < slices:
                ahead.append(read(i + READ_AHEAD))
                # let the read reach its storage thread before this slice is encoded,
                # which holds the event loop: else nothing overlaps
                await asyncio.sleep(0)
            yield apply(spec, spec.sensor, unit, raw, origin, None, "avg")
    finally:
        for fut in ahead:
            fut.cancel()


async def json_body(
    head: Result, parts: AsyncIterator[Result], start_ns: int, end_ns: int
) -> AsyncIterator[bytes | memoryview]:
    """The readings JSON object; ``head`` (an empty result) gives sensor, unit and label.

    Each slice's numbers are sent as orjson wrote them (a view without the
    brackets, no copy); the values wait for the end, encoded already.
    """
    meta = {
        "sensor": head.sensor,
        "unit": head.unit,
        "label": head.label,
        "start_ns": start_ns,
        "end_ns": end_ns,
    }
    yield orjson.dumps(meta)[:-1] + b',"timestamps_ns":['
    values = Held()  # bounded: beyond the request's budget they wait in a temporary file
    count = 0
    loop = asyncio.get_running_loop()
    async for part in parts:
        if len(part) == 0:
            continue
        if count:
            yield b","
        ts_body, vs_body = await loop.run_in_executor(None, _json_numbers, part)
        yield ts_body
        if count:
            await values.add(b",")
        await values.add(vs_body)
        count += len(part)
    yield b'],"values":['
    async for body in values.drain():
        yield body
    yield b'],"count":' + str(count).encode() + b"}"


def _json_numbers(part: Result) -> tuple[memoryview, memoryview]:
    """A slice's timestamps and values as JSON numbers without brackets (views, no copy)."""
    ts = orjson.dumps(part.timestamps_ns, option=_NUMPY)
    vs = orjson.dumps(part.values, option=_NUMPY)
    return memoryview(ts)[1:-1], memoryview(vs)[1:-1]


CSV_POINTS = 32_768
"""Readings per CSV piece: ~2 MB of text, small enough to stay in cache and for the
allocator to reuse its memory (8x larger pieces measured ~20 % slower)."""
CSV_AHEAD = 3
"""Pieces encoded at once on worker threads (numpy releases the GIL)."""


async def csv_lines(parts: AsyncIterator[Result], iso: bool) -> AsyncIterator[bytes]:
    """DCDB CSV lines of each slice, encoded on worker threads a few pieces ahead."""
    loop = asyncio.get_running_loop()
    pending: deque[asyncio.Future[bytes]] = deque()
    try:
        async for part in parts:
            for i in range(0, len(part), CSV_POINTS):
                ts, vs = part.timestamps_ns[i : i + CSV_POINTS], part.values[i : i + CSV_POINTS]
                # submitted now (a task would only start at the next await)
                pending.append(loop.run_in_executor(None, csvfast.lines, part.sensor, ts, vs, iso))
                if len(pending) >= CSV_AHEAD:
                    yield await pending.popleft()
        while pending:
            yield await pending.popleft()
    finally:
        for fut in pending:  # the client went away: nobody waits for these
            fut.cancel()
