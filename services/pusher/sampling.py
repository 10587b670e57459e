"""Run one group: wall-clock-aligned reads, timeouts, skipped beats, its queue.

Reads happen at the next multiple of the interval since the epoch (``sync``,
DCDB's default), so every node samples on the same instants; readings are
stamped with that instant (``timestamps: tick``) or with the clock after the
read (``timestamps: read``). A read that may block runs in the group's own
worker thread, so a slow source delays only itself; a read that outlives its
timeout is abandoned (the thread finishes on its own) and while it is still
running the group skips beats instead of piling up threads. A read that
overruns the interval makes the group skip the beats it missed, counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from services.common.cache import SensorCache
from services.common.logs import RateLimitedLog
from services.common.readings import Float64Array, Int64Array
from services.pusher.formats import Route
from services.pusher.metrics import PusherMetrics
from services.pusher.plugins.base import Group
from services.pusher.processing import BoolArray, Processor

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log)

Clock = Callable[[], int]


def next_tick_ns(now_ns: int, interval_ns: int) -> int:
    """The next multiple of ``interval_ns`` since the epoch, strictly after ``now_ns``."""
    return (now_ns // interval_ns + 1) * interval_ns


@dataclass(slots=True)
class Chunk:
    """Queued cycles of one group, handed to the publisher."""

    route: Route
    ts: Int64Array
    """(k,) timestamps."""
    values: Float64Array
    """(k, n) values."""
    mask: BoolArray | None
    """(k, n) which values to send; None = all."""
    readings: int


class GroupRunner:
    """The schedule, processing and queue of one group of one plugin instance."""

    def __init__(
        self,
        plugin: str,
        group: Group,
        cache: SensorCache,
        sink: Callable[[Chunk], None],
        metrics: PusherMetrics,
        stamp_read_time: bool = False,
        clock: Clock = time.time_ns,
    ) -> None:
        self.plugin = plugin
        self.group = group
        self.opts = group.options
        self.interval_ns = self.opts.interval_ms * 1_000_000
        self.timeout_s = (self.opts.timeout_ms or self.opts.interval_ms) / 1000
        # Metadata models cost ~1.4 kB per sensor: build them for the route, then let go.
        self.route = Route([s.metadata(self.opts.interval_ms) for s in group.sensors])
        self.processor = Processor([s.options for s in group.sensors])
        self.cache = cache
        self.block = cache.add_block(
            self.route.names, cache.points_for(self.opts.interval_ms / 1000)
        )
        self.sink = sink
        self.stamp_read_time = stamp_read_time
        self.clock = clock
        self.queue: deque[tuple[int, Float64Array, BoolArray | None]] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: asyncio.Future[Float64Array] | None = None
        self.reads = 0
        self.errors = 0
        self.timeouts = 0
        self.skipped = 0
        self.last_error: str | None = None
        self.last_read_ns: int | None = None
        m = metrics
        self._m_read = m.reads.labels(plugin)
        self._m_readings = m.readings.labels(plugin)
        self._m_invalid = m.invalid.labels(plugin)
        self._m_skipped = m.skipped.labels(plugin)
        self._m_timeout = m.read_errors.labels(plugin, "timeout")
        self._m_error = m.read_errors.labels(plugin, "error")
        self._m_queue_drop = m.dropped.labels("queue_full")

    @property
    def name(self) -> str:
        return f"{self.plugin}/{self.group.name}"

    async def run(self) -> None:
        """Sample until cancelled."""
        now = self.clock()
        sync = self.opts.sync
        tick = next_tick_ns(now, self.interval_ns) if sync else now + self.interval_ns
        try:
            while True:
                delay = (tick - self.clock()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                raw = await self._read(tick)
                if raw is not None:
                    self.ingest(self.clock() if self.stamp_read_time else tick, raw)
                now = self.clock()
                steps = max(1, (now - tick) // self.interval_ns + 1)
                if steps > 1:
                    self.skipped += steps - 1
                    self._m_skipped.inc(steps - 1)
                tick += steps * self.interval_ns
        finally:
            self._stop_worker()

    async def _read(self, tick: int) -> Float64Array | None:
        if self._inflight is not None and not self._inflight.done():
            # The previous (abandoned) read still occupies the worker: skip this beat.
            self.skipped += 1
            self._m_skipped.inc()
            return None
        group = self.group
        try:
            if group.is_async:
                raw = await asyncio.wait_for(group.read_async(tick), self.timeout_s)
            elif group.blocking:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"read-{self.name}")
                loop = asyncio.get_running_loop()
                self._inflight = loop.run_in_executor(self._executor, group.read, tick)
                raw = await asyncio.wait_for(asyncio.shield(self._inflight), self.timeout_s)
            else:
                raw = group.read(tick)
        except TimeoutError:
            self.timeouts += 1
            self._m_timeout.inc()
            self.last_error = f"read timed out after {self.timeout_s:g} s"
            _rlog.warning(self.name, "%s: %s", self.name, self.last_error)
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.errors += 1
            self._m_error.inc()
            self.last_error = f"{type(exc).__name__}: {exc}"
            _rlog.warning(self.name, "%s: read failed: %s", self.name, self.last_error)
            return None
        raw = np.asarray(raw, dtype=np.float64)
        if raw.shape != (self.route.n,):
            self.errors += 1
            self._m_error.inc()
            self.last_error = (
                f"read returned {raw.shape} values; expected ({self.route.n},), one per sensor"
            )
            _rlog.warning(self.name, "%s: %s", self.name, self.last_error)
            return None
        self.reads += 1
        self._m_read.inc()
        self.last_error = None
        return raw

    def ingest(self, ts: int, raw: Float64Array) -> None:
        """Process one cycle: cache it, queue what is to be sent, hand over when due."""
        p = self.processor.process(raw)
        self.last_read_ns = ts
        if p.invalid:
            self._m_invalid.inc(p.invalid)
        self.cache.put_rows(self.block, np.array([ts], dtype=np.int64), p.cached)
        if p.send_mask is not None and not p.send_mask.any():
            return
        n_send = len(p.send) if p.send_mask is None else int(np.count_nonzero(p.send_mask))
        self._m_readings.inc(n_send)
        self.queue.append((ts, p.send, p.send_mask))
        if len(self.queue) > self.opts.queue_size:
            _, _, mask = self.queue.popleft()
            lost = self.route.n if mask is None else int(np.count_nonzero(mask))
            self._m_queue_drop.inc(lost)
        if len(self.queue) >= self.opts.min_values:
            self.sink(self.take())

    def take(self) -> Chunk:
        rows = list(self.queue)
        self.queue.clear()
        ts = np.array([r[0] for r in rows], dtype=np.int64)
        values = np.stack([r[1] for r in rows]) if len(rows) > 1 else rows[0][1][None, :]
        if all(r[2] is None for r in rows):
            mask = None
            readings = values.size
        else:
            n = values.shape[1]
            mask = np.stack([np.ones(n, bool) if r[2] is None else r[2] for r in rows])
            readings = int(np.count_nonzero(mask))
        return Chunk(self.route, ts, values, mask, readings)

    def _stop_worker(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
            self._inflight = None

    def close(self) -> None:
        """Release the group (plugin unloaded)."""
        self._stop_worker()
        try:
            self.group.close()
        except Exception:
            log.exception("%s: close failed", self.name)

    def drop_cache(self) -> None:
        self.cache.drop_block(self.block)

    def status(self) -> dict[str, object]:
        return {
            "group": self.group.name,
            "interval_ms": self.opts.interval_ms,
            "sensors": self.route.n,
            "reads": self.reads,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "skipped_beats": self.skipped,
            "last_error": self.last_error,
            "last_read_ns": self.last_read_ns,
            "queued_cycles": len(self.queue),
        }
