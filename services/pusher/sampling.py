"""Run one group: wall-clock-aligned reads, timeouts, skipped beats, its queue.

Reads happen at the next multiple of the interval since the epoch (``sync``,
DCDB's default), so every node samples on the same instants; readings are
stamped with that instant (``timestamps: tick``) or with the clock after the
read (``timestamps: read``). A read that may block runs in the group's own
worker thread, so a slow source delays only itself; a read that outlives its
timeout is abandoned (the thread finishes on its own) and while it is still
running the group skips beats instead of piling up threads. A read that
overruns the interval makes the group skip the beats it missed, counted.

Groups that sample on the same instant share one timer (:class:`Ticker`): a
node's pusher wakes once per instant, not once per group, which is what a
compute node's jobs see as OS noise.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from services.common.logs import RateLimitedLog
from services.common.tasks import wait_for
from services.pusher.formats import Mask, Route
from services.pusher.metrics import PusherMetrics
from services.pusher.plugins.base import Group, Values
from services.pusher.processing import Processor

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log)

Clock = Callable[[], int]


class Cache(Protocol):
    """What a runner needs of the sensor cache (:class:`services.pusher.cache.SensorCache`)."""

    def points_for(self, interval_s: float) -> int: ...
    def add_block(self, sensors: list[str], points: int) -> int: ...
    def put_row(self, handle: int, timestamp_ns: int, values: Sequence[float]) -> None: ...
    def drop_block(self, handle: int) -> None: ...


def next_tick_ns(now_ns: int, interval_ns: int) -> int:
    """The next multiple of ``interval_ns`` since the epoch, strictly after ``now_ns``."""
    return (now_ns // interval_ns + 1) * interval_ns


def as_floats(raw: Any) -> array[float]:
    """A read's result as ``array('d')``: from an array, a list, or anything with float64
    buffers (a numpy array, as third-party plugins return) without a Python loop."""
    if type(raw) is array and raw.typecode == "d":
        return raw
    try:
        view = memoryview(raw)
    except TypeError:
        return array("d", raw)
    if view.ndim == 1 and view.format in ("d", "<d", "=d") and view.c_contiguous:
        out = array("d")
        out.frombytes(view.cast("B"))
        return out
    return array("d", raw)


class Ticker:
    """One timer per sampling instant, shared by every group that waits for it."""

    def __init__(self) -> None:
        self._waiting: dict[int, list[asyncio.Future[None]]] = {}

    async def until(self, tick_ns: int, clock: Clock) -> None:
        """Return at wall-clock ``tick_ns`` (at once if it has passed)."""
        delay = (tick_ns - clock()) / 1e9
        if delay <= 0:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        waiters = self._waiting.get(tick_ns)
        if waiters is None:
            waiters = self._waiting[tick_ns] = []
            loop.call_at(loop.time() + delay, self._fire, tick_ns)
        waiters.append(fut)
        await fut

    def _fire(self, tick_ns: int) -> None:
        for fut in self._waiting.pop(tick_ns, ()):
            if not fut.done():
                fut.set_result(None)


@dataclass(slots=True)
class Chunk:
    """Queued cycles of one group, handed to the publisher."""

    route: Route
    ts: array[int]
    """(k) timestamps."""
    values: list[Sequence[float]]
    """k rows of n values."""
    mask: list[Mask | None] | None
    """k rows of which values to send (None in a row: all); None = all of every row."""
    readings: int


class GroupRunner:
    """The schedule, processing and queue of one group of one plugin instance."""

    def __init__(
        self,
        plugin: str,
        group: Group,
        cache: Cache,
        sink: Callable[[Chunk], None],
        metrics: PusherMetrics,
        stamp_read_time: bool = False,
        clock: Clock = time.time_ns,
        ticker: Ticker | None = None,
    ) -> None:
        self.plugin = plugin
        self.group = group
        self.opts = group.options
        self.interval_ns = self.opts.interval_ms * 1_000_000
        self.timeout_s = (self.opts.timeout_ms or self.opts.interval_ms) / 1000
        # Metadata objects cost ~1 kB per sensor: build them for the route, then let go.
        self.route = Route([s.metadata(self.opts.interval_ms) for s in group.sensors])
        self.processor = Processor([s.options for s in group.sensors])
        self.cache = cache
        self.block = cache.add_block(
            self.route.names, cache.points_for(self.opts.interval_ms / 1000)
        )
        self.sink = sink
        self.stamp_read_time = stamp_read_time
        self.clock = clock
        self.ticker = ticker or Ticker()
        self.queue: deque[tuple[int, Sequence[float], Mask | None]] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: asyncio.Future[Values] | None = None
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
                await self.ticker.until(tick, self.clock)
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

    async def _read(self, tick: int) -> array[float] | None:
        if self._inflight is not None and not self._inflight.done():
            # The previous (abandoned) read still occupies the worker: skip this beat.
            self.skipped += 1
            self._m_skipped.inc()
            return None
        group = self.group
        try:
            if group.is_async:
                got: Any = await wait_for(group.read_async(tick), self.timeout_s)
            elif group.blocking:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"read-{self.name}")
                loop = asyncio.get_running_loop()
                self._inflight = loop.run_in_executor(self._executor, group.read, tick)
                got = await wait_for(asyncio.shield(self._inflight), self.timeout_s)
            else:
                got = group.read(tick)
            raw = as_floats(got)
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
        if len(raw) != self.route.n:
            self.errors += 1
            self._m_error.inc()
            self.last_error = (
                f"read returned {len(raw)} values; expected {self.route.n}, one per sensor"
            )
            _rlog.warning(self.name, "%s: %s", self.name, self.last_error)
            return None
        self.reads += 1
        self._m_read.inc()
        self.last_error = None
        return raw

    def ingest(self, ts: int, raw: Sequence[float]) -> None:
        """Process one cycle: cache it, queue what is to be sent, hand over when due."""
        p = self.processor.process(raw)
        self.last_read_ns = ts
        if p.invalid:
            self._m_invalid.inc(p.invalid)
        self.cache.put_row(self.block, ts, p.cached)
        mask = p.send_mask
        if mask is None:
            n_send = self.route.n
        else:
            n_send = sum(mask)
            if not n_send:
                return
        self._m_readings.inc(n_send)
        self.queue.append((ts, p.send, mask))
        if len(self.queue) > self.opts.queue_size:
            _, _, old = self.queue.popleft()
            self._m_queue_drop.inc(self.route.n if old is None else sum(old))
        if len(self.queue) >= self.opts.min_values:
            self.sink(self.take())

    def take(self) -> Chunk:
        rows = list(self.queue)
        self.queue.clear()
        ts = array("q", [r[0] for r in rows])
        values = [r[1] for r in rows]
        if all(r[2] is None for r in rows):
            return Chunk(self.route, ts, values, None, self.route.n * len(rows))
        masks = [r[2] for r in rows]
        readings = sum(self.route.n if m is None else sum(m) for m in masks)
        return Chunk(self.route, ts, values, masks, readings)

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
