"""The fast tier of virtual-sensor write-back: recent results in memory, stores in the background.

Storing results costs more than computing them for small ranges on a remote
backend (InfluxDB writes each point as a line), so a query does not wait for
the store: the results go to a bounded background writer, and to an in-memory
LRU of settled segments that the next query over the same range is answered
from. Segments share their (read-only) arrays with the answers they came from. Storage
stays the durable tier (other replicas, restarts); the memory tier obeys the
same late-data rule (each segment keeps the time its computation started).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from services.common.readings import Float64Array, Int64Array
from services.common.storage.base import StorageBackend
from services.common.tasks import stop_task, wait_for

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Segment:
    """Settled results of ``[start, end)`` of one definition version."""

    start: int
    end: int
    computed_at: int
    version: int
    timestamps_ns: Int64Array
    values: Float64Array


class MemoryTier:
    """Per virtual sensor, non-overlapping segments; least recently used dropped past a budget."""

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self._segments: OrderedDict[tuple[str, int], Segment] = OrderedDict()
        self._points = 0

    def covering(self, name: str, version: int, start: int, end: int) -> list[Segment] | None:
        """Segments that together cover ``[start, end)`` exactly, or None if any part is missing."""
        mine = sorted(
            (s for (n, _), s in self._segments.items() if n == name and s.version == version),
            key=lambda s: s.start,
        )
        out, at = [], start
        for s in mine:
            if s.end <= at or s.start >= end:
                continue
            if s.start > at:
                return None
            out.append(s)
            at = s.end
            if at >= end:
                break
        if at < end:
            return None
        for s in out:
            self._segments.move_to_end((name, s.start))
        return out

    def put(self, name: str, seg: Segment) -> None:
        if seg.end <= seg.start or seg.timestamps_ns.shape[0] > self.max_points:
            return
        self.drop(name, seg.start, seg.end)
        self._segments[(name, seg.start)] = seg
        self._points += seg.timestamps_ns.shape[0]
        while self._points > self.max_points and self._segments:
            _, old = self._segments.popitem(last=False)
            self._points -= old.timestamps_ns.shape[0]

    def drop(self, name: str, start: int, end: int) -> None:
        """Forget ``[start, end)`` of ``name``; segments straddling an edge are trimmed."""
        for key in [k for k in self._segments if k[0] == name]:
            s = self._segments[key]
            if s.end <= start or s.start >= end:
                continue
            del self._segments[key]
            self._points -= s.timestamps_ns.shape[0]
            for a, b in ((s.start, min(s.end, start)), (max(s.start, end), s.end)):
                if b > a:
                    keep = (s.timestamps_ns >= a) & (s.timestamps_ns < b)
                    part = Segment(
                        a, b, s.computed_at, s.version, s.timestamps_ns[keep], s.values[keep]
                    )
                    self._segments[(name, a)] = part
                    self._points += part.timestamps_ns.shape[0]

    def drop_all(self, name: str) -> None:
        self.drop(name, -(2**63), 2**63 - 1)


def slice_segments(
    segments: list[Segment], start: int, end: int
) -> tuple[Int64Array, Float64Array]:
    """The points of time-ordered, non-overlapping segments in ``[start, end)``.

    One segment gives read-only views (no copy), several one read-only copy.
    """
    if len(segments) == 1:
        ts, vs = segments[0].timestamps_ns, segments[0].values
    else:
        ts = np.concatenate([s.timestamps_ns for s in segments])
        vs = np.concatenate([s.values for s in segments])
        ts.flags.writeable = vs.flags.writeable = False
    a, b = np.searchsorted(ts, (start, end), "left").tolist()
    return ts[a:b], vs[a:b]


class BackgroundWriter:
    """Stores virtual results one batch at a time, off the query path, with a bounded queue.

    A full queue makes the query wait (back-pressure, never unbounded memory).
    A failed store is logged and counted; the results are simply computed again
    next time (they are a cache, nothing is lost).
    """

    def __init__(self, storage: StorageBackend, metrics: object, depth: int = 16) -> None:
        self.storage = storage
        self.metrics = metrics
        self.queue: asyncio.Queue[tuple[str, int, int, Int64Array, Float64Array, int]] = (
            asyncio.Queue(depth)
        )
        self._task: asyncio.Task[None] | None = None

    async def submit(
        self, name: str, start: int, end: int, ts: Int64Array, vs: Float64Array, computed_at: int
    ) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="virtual-writer")
        await self.queue.put((name, start, end, ts, vs, computed_at))

    async def _run(self) -> None:
        while True:
            name, start, end, ts, vs, computed_at = await self.queue.get()
            try:
                await self.storage.write_virtual_results(name, start, end, ts, vs, computed_at)
            except Exception as exc:  # a cache write must never take the service down
                log.warning("storing results of virtual sensor %s failed: %s", name, exc)
                counter = getattr(self.metrics, "virtual_store_errors", None)
                if counter is not None:
                    counter.inc()
            finally:
                self.queue.task_done()

    def discard(self, name: str) -> None:
        """Drop queued (not yet started) stores of ``name`` (its definition changed)."""
        kept = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            self.queue.task_done()
            if item[0] != name:
                kept.append(item)
        for item in kept:
            self.queue.put_nowait(item)

    async def flush(self) -> None:
        """Wait until every queued store is done."""
        await self.queue.join()

    async def close(self, flush_timeout_s: float = 5.0) -> None:
        """Finish the queued stores for up to ``flush_timeout_s`` (they are a cache: what
        is left is computed again when next asked for), then stop."""
        with contextlib.suppress(TimeoutError):
            await wait_for(self.flush(), flush_timeout_s)
        await stop_task(self._task, what="virtual-sensor result writer")
        self._task = None
