"""Streaming plain readings: slices read and encoded on worker threads while earlier ones are sent.

A plain request (one stored sensor, no operation, no resampling; units and
factors allowed) is read in time slices: a short range in one, a longer one
probed first and cut into up to ``pieces`` equal slices (more when the memory
budget needs them; services/query_api/limits.py decides). Each slice is read by
storage and encoded (JSON numbers or CSV lines) on worker threads, a few slices
ahead of the one being written to the socket; none of that holds the GIL, so
the answer costs about its reading and encoding spread over the cores, not their
sum, and memory holds the slices in flight, not the whole answer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import orjson

from services.query_api import csvfast, encode, limits
from services.query_api.limits import Held
from services.query_api.query import Reader, Result, apply
from services.query_api.spec import Spec

AHEAD = 5
"""Slices in flight (being read, encoded, or waiting to be sent) beside the one being
sent. Reads and encodings hold no GIL (SQLite, zlib and the compiled encoders), so the
slices keep both cores of a small machine busy while the event loop writes to the
socket; new slices start as the sender takes finished ones, so the window must outlast
a slow send (3 left the cores idle while the sender waited for the socket: 1M points
measured ~15 % slower than 5; 8 no faster than 5)."""

INLINE_READINGS = 4096
"""Slices smaller than this are encoded on the event loop (~0.1 ms): cheaper than the
hand-off to a worker thread and back."""

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None


def _encoders() -> ThreadPoolExecutor:
    """Worker threads for encoding, one per core this process may use: more only compete
    with the storage reads and the sender for the same cores (the default executor's
    six measured 5-10 % slower on two cores)."""
    global _pool
    if _pool is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        _pool = ThreadPoolExecutor(cores or os.cpu_count() or 1, thread_name_prefix="encode")
    return _pool


def is_plain(spec: Spec) -> bool:
    return not spec.operations and not spec.has_wildcard


async def encoded(
    reader: Reader,
    spec: Spec,
    start_ns: int,
    end_ns: int,
    count: int,
    encode_slice: Callable[[Result], T],
    on_points: Callable[[int], None] = lambda n: None,
    stored_unit: str | None = None,
) -> AsyncIterator[T]:
    """``encode_slice`` of each slice of a plain ``spec``'s answer, in order.

    Each slice is read by storage and then encoded on a worker thread, ``AHEAD`` slices
    ahead of the one the caller is sending, so the answer costs about its reading and
    encoding spread over the cores, not their sum. Under a memory budget a long range is
    probed first and cut into as many slices as keep each within it
    (services/query_api/limits.py); ``on_points`` is told each slice's readings.
    ``stored_unit`` is the sensor's unit as stored when the caller has looked it up.
    """
    unit = stored_unit if stored_unit is not None else await reader.catalog.unit(spec.sensor)
    unit = unit or ""
    origin = start_ns
    loop = asyncio.get_running_loop()

    async def job(lo: int, hi: int) -> tuple[int, T]:
        raw = await reader.series(spec.sensor, lo, hi, streamed=True)

        def work() -> T:
            return encode_slice(apply(spec, spec.sensor, unit, raw, origin, None, "avg"))

        if len(raw) < INLINE_READINGS:
            return len(raw), work()
        return len(raw), await loop.run_in_executor(_encoders(), work)

    probe = limits.probe_end(start_ns, end_ns, AHEAD)
    cuts: list[int] = []
    if probe is None:
        count = 1
    else:
        # slices begin where stored blocks do: a cut inside one decodes it twice
        cuts = await reader.cut_points(spec.sensor, start_ns, end_ns)
        probe = limits.snap([start_ns, probe, end_ns], cuts)[1]
        n, first = await job(start_ns, probe)
        count = limits.stream_slices(n, probe - start_ns, end_ns - probe, count, AHEAD)
        on_points(n)
        yield first
        del first
        start_ns = probe
    bounds = np.unique(np.linspace(start_ns, end_ns, count + 1).astype(np.int64)).tolist()
    bounds[0], bounds[-1] = start_ns, end_ns
    todo = itertools.pairwise(limits.snap(bounds, cuts))
    pending: deque[asyncio.Future[tuple[int, T]]] = deque()

    def more() -> None:
        while len(pending) < AHEAD and (b := next(todo, None)) is not None:
            pending.append(asyncio.ensure_future(job(*b)))

    more()
    try:
        while pending:
            n, part = await pending.popleft()
            more()
            on_points(n)
            yield part
            del part
    finally:
        for fut in pending:  # the client went away: nobody waits for these
            fut.cancel()


async def json_body(
    reader: Reader,
    spec: Spec,
    head: Result,
    start_ns: int,
    end_ns: int,
    count: int,
    on_points: Callable[[int], None] = lambda n: None,
    stored_unit: str | None = None,
) -> AsyncIterator[bytes | memoryview]:
    """The readings JSON object; ``head`` (an empty result) gives sensor, unit and label.

    Each slice's numbers are sent as the encoder wrote them (a view without the
    brackets, no copy); the values wait for the end, encoded already. JSON keeps the
    contract's keys; ``count`` comes last because it is known only at the end.
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
    total = 0
    async for n, ts_body, vs_body in encoded(
        reader, spec, start_ns, end_ns, count, _json_numbers, on_points, stored_unit
    ):
        if n == 0:
            continue
        if total:
            yield b","
            await values.add(b",")
        yield ts_body
        await values.add(vs_body)
        total += n
    yield b'],"values":['
    async for body in values.drain():
        yield body
    yield b'],"count":' + str(total).encode() + b"}"


def _json_numbers(part: Result) -> tuple[int, memoryview, memoryview]:
    """A slice's timestamps and values as JSON numbers without brackets (views, no copy)."""
    return len(part), encode.numbers(part.timestamps_ns), encode.numbers(part.values)


CSV_POINTS = 32_768
"""Readings per CSV piece: ~2 MB of text, small enough to stay in cache and for the
allocator to reuse its memory (8x larger pieces measured ~20 % slower)."""


async def csv_lines(
    reader: Reader,
    spec: Spec,
    start_ns: int,
    end_ns: int,
    count: int,
    iso: bool,
    on_points: Callable[[int], None] = lambda n: None,
    stored_unit: str | None = None,
) -> AsyncIterator[bytes]:
    """DCDB CSV lines of a plain ``spec``, each slice encoded on a worker thread."""

    def lines(part: Result) -> list[bytes]:
        return [
            csvfast.lines(
                part.sensor,
                part.timestamps_ns[i : i + CSV_POINTS],
                part.values[i : i + CSV_POINTS],
                iso,
            )
            for i in range(0, len(part), CSV_POINTS)
        ]

    async for pieces in encoded(
        reader, spec, start_ns, end_ns, count, lines, on_points, stored_unit
    ):
        for piece in pieces:
            yield piece
