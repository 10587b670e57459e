"""Kelvin's publisher interface and its MQTT implementation (aiomqtt).

The pusher hands every group's queued readings to a :class:`Publisher` as
:class:`~services.pusher.sampling.Chunk` objects and never waits for it. The MQTT
publisher keeps them, unencoded, in one bounded outage buffer
(``buffer_readings``), encodes them when it can send (KVB1 batches, or DCDB's
one PUBLISH per sensor with all its queued readings), and publishes with QoS 0
or 1 through a window of ``max_inflight`` unacknowledged messages.

Delivery: a QoS 1 message counts as sent only on its PUBACK. A message that is
in flight when the connection drops goes back to the head of the buffer and is
sent again after the reconnect, so a broker outage loses nothing inside the
bound; past the bound the oldest readings are dropped, counted
(``kelvin_pusher_readings_dropped_total{reason="buffer_full"}``) and logged.
Brokers are tried in the configured order on every (re)connect: the first one
that answers is used, so traffic returns to the primary once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import zlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import numpy as np

from services.common.logs import RateLimitedLog
from services.common.sensors import SensorMetadata
from services.pusher import spool
from services.pusher.formats import Format, Message, encode, metadata_message
from services.pusher.metrics import PusherMetrics
from services.pusher.sampling import Chunk

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log, period_s=30)


class Publisher(ABC):
    """Where the pusher's readings go. Never blocks the caller."""

    @abstractmethod
    def submit(self, chunk: Chunk) -> None:
        """Take ownership of queued readings."""

    @abstractmethod
    def announce(self, metadata: Sequence[SensorMetadata]) -> None:
        """Metadata to publish now (if connected) and at every connect."""

    @abstractmethod
    def withdraw(self, names: Iterable[str]) -> None:
        """Stop announcing these sensors (their plugin was unloaded)."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None:
        """Flush what can be flushed within the flush timeout, then disconnect."""

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    @abstractmethod
    def status(self) -> dict[str, object]: ...


@dataclass
class MqttOptions:
    brokers: list[tuple[str, int]]
    client_id: str
    format: Format = "kvb1"
    qos: int = 1
    bursty: bool = False
    burst_interval_ms: int = 30_000
    buffer_readings: int = 2_000_000
    max_inflight: int = 64
    batch_max_bytes: int = 1 << 20
    keepalive_s: int = 30
    connect_timeout_s: float = 5.0
    publish_timeout_s: float = 10.0
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 5.0
    flush_timeout_s: float = 5.0
    username: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None
    announce: bool = True
    spool_path: Path | None = None
    """Where readings still unsent at stop are kept for the next start (None = dropped)."""
    extra: dict[str, object] = field(default_factory=dict)


class MqttPublisher(Publisher):
    """Publish through aiomqtt to the first reachable broker of a list."""

    def __init__(self, options: MqttOptions, metrics: PusherMetrics) -> None:
        self.o = options
        self.m = metrics
        self._pending: deque[Chunk] = deque()
        self._pending_readings = 0
        self._outbox: deque[Message] = deque()
        self._outbox_readings = 0
        self._control: deque[Message] = deque()
        self._meta: dict[str, Message] = {}
        """Encoded metadata of every announced sensor, sent again at each connect."""
        self._busy = 0
        """Messages being published right now (awaiting their PUBACK with QoS 1)."""
        self._idle_workers: deque[asyncio.Future[None]] = deque()
        """Workers waiting for work; woken one at a time (64 woken per cycle would cost ~0.5 %)."""
        self._broken = asyncio.Event()
        self._drained = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._connected_to: str | None = None
        self._next_burst = 0.0
        # Spread bursts of many nodes over the interval instead of all at :00.
        self._burst_phase = (zlib.crc32(options.client_id.encode()) % 1000) / 1000
        self.sent_readings = 0
        self.dropped_readings = 0
        self.last_error: str | None = None
        self._m_drop_full = metrics.dropped.labels("buffer_full")
        self._m_msgs_data = metrics.messages.labels("data")
        self._m_msgs_meta = metrics.messages.labels("metadata")

    # ------------------------------------------------------------------ intake

    @property
    def buffered_readings(self) -> int:
        return self._pending_readings + self._outbox_readings

    def submit(self, chunk: Chunk) -> None:
        self._pending.append(chunk)
        self._pending_readings += chunk.readings
        if self.buffered_readings > self.o.buffer_readings:
            self._shed()
        self.m.buffered.set(self.buffered_readings)
        if not self.o.bursty:
            self._kick()

    def _shed(self) -> None:
        lost = 0
        while self.buffered_readings > self.o.buffer_readings:
            if self._outbox:
                msg = self._outbox.popleft()
                self._outbox_readings -= msg.readings
                lost += msg.readings
            elif self._pending:
                chunk = self._pending.popleft()
                self._pending_readings -= chunk.readings
                lost += chunk.readings
            else:
                break
        if lost:
            self.dropped_readings += lost
            self._m_drop_full.inc(lost)
            _rlog.warning(
                "buffer_full",
                "outage buffer full (%d readings, setting buffer_readings): dropped the oldest "
                "%d readings",
                self.o.buffer_readings,
                lost,
            )

    def announce(self, metadata: Sequence[SensorMetadata]) -> None:
        if not self.o.announce:
            return
        messages = [metadata_message(m) for m in metadata]
        for meta, msg in zip(metadata, messages, strict=True):
            self._meta[meta.name] = msg
        if self._connected_to is not None:
            self._control.extend(messages)
            self._kick()

    def withdraw(self, names: Iterable[str]) -> None:
        for n in names:
            self._meta.pop(n, None)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._next_burst = self._next_burst_after(time.time())
        if self.o.spool_path is not None:
            saved = spool.load(self.o.spool_path)
            if saved:
                self._outbox.extend(saved)
                self._outbox_readings += sum(m.readings for m in saved)
                self.m.buffered.set(self.buffered_readings)
                log.info(
                    "%d readings left unsent at the last stop will be sent first",
                    self._outbox_readings,
                )
        self._task = asyncio.create_task(self._run(), name="pusher-mqtt")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._closing = True
        self._kick(everyone=True)
        if self._connected_to is not None and (self.buffered_readings or self._busy):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self.o.flush_timeout_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        left = self.buffered_readings
        if left and self.o.spool_path is not None:
            self._encode_pending()
            try:
                kept = spool.save(self.o.spool_path, list(self._outbox))
                log.warning(
                    "stopping with %d readings not delivered; kept in %s for the next start",
                    kept,
                    self.o.spool_path,
                )
                left = 0
            except OSError as exc:
                log.error("cannot keep unsent readings in %s: %s", self.o.spool_path, exc)
        if left:
            self.dropped_readings += left
            self.m.dropped.labels("shutdown").inc(left)
            log.warning("stopping with %d readings not delivered (no broker reachable)", left)
        self._pending.clear()
        self._outbox.clear()
        self._pending_readings = self._outbox_readings = 0
        self.m.buffered.set(0)

    @property
    def connected(self) -> bool:
        return self._connected_to is not None

    def status(self) -> dict[str, object]:
        return {
            "connected_to": self._connected_to,
            "brokers": [f"{h}:{p}" for h, p in self.o.brokers],
            "format": self.o.format,
            "qos": self.o.qos,
            "buffered_readings": self.buffered_readings,
            "buffer_readings_max": self.o.buffer_readings,
            "inflight_messages": self._busy,
            "sent_readings": self.sent_readings,
            "dropped_readings": self.dropped_readings,
            "last_error": self.last_error,
        }

    # ------------------------------------------------------------------ connection

    async def _run(self) -> None:
        backoff = self.o.reconnect_min_s
        while True:
            for host, port in self.o.brokers:
                endpoint = f"{host}:{port}"
                try:
                    client = aiomqtt.Client(
                        host,
                        port,
                        identifier=self.o.client_id,
                        username=self.o.username,
                        password=self.o.password,
                        tls_context=self.o.tls,
                        keepalive=self.o.keepalive_s,
                        timeout=self.o.connect_timeout_s,
                        clean_session=True,
                        max_inflight_messages=self.o.max_inflight,
                    )
                    client.pending_calls_threshold = 1 << 30  # our window bounds it
                    async with client:
                        backoff = self.o.reconnect_min_s
                        await self._serve(client, endpoint)
                except aiomqtt.MqttError as exc:
                    self.last_error = f"{endpoint}: {exc}"
                    self.m.connect_errors.labels(endpoint).inc()
                    _rlog.warning(
                        f"broker:{endpoint}", "MQTT broker %s: %s; buffering", endpoint, exc
                    )
                except Exception as exc:  # never let the publisher die: readings keep buffering
                    self.last_error = f"{endpoint}: {type(exc).__name__}: {exc}"
                    self.m.connect_errors.labels(endpoint).inc()
                    log.exception("MQTT connection to %s failed unexpectedly", endpoint)
                finally:
                    if self._connected_to is not None:
                        self._connected_to = None
                        self.m.connected.set(0)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.o.reconnect_max_s)

    async def _serve(self, client: aiomqtt.Client, endpoint: str) -> None:
        self._connected_to = endpoint
        self.m.connected.set(1)
        self.m.connects.labels(endpoint).inc()
        log.info("connected to MQTT broker %s", endpoint)
        self._broken.clear()
        self._control = deque(self._meta.values())
        # QoS 1: a window of workers, each awaiting its PUBACK; QoS 0: one writer.
        workers = [
            asyncio.create_task(self._worker(client))
            for _ in range(self.o.max_inflight if self.o.qos else 1)
        ]
        tasks = {
            asyncio.create_task(self._watch(client)),
            asyncio.create_task(self._broken.wait()),
            *workers,
        }
        if self.o.bursty:
            tasks.add(asyncio.create_task(self._burst_timer()))
        self._kick()
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        raise aiomqtt.MqttError("connection lost")

    async def _watch(self, client: aiomqtt.Client) -> None:
        # Nothing is subscribed; the iterator ends with MqttError on disconnect.
        async for _ in client.messages:
            pass

    # ------------------------------------------------------------------ sending

    def _next_burst_after(self, now: float) -> float:
        period = self.o.burst_interval_ms / 1000
        offset = self._burst_phase * period
        return ((now - offset) // period + 1) * period + offset

    def _due(self) -> bool:
        if not self.o.bursty or self._closing:
            return True
        now = time.time()
        if now >= self._next_burst:
            self._next_burst = self._next_burst_after(now)
            return True
        return False

    def _encode_pending(self) -> None:
        chunks = list(self._pending)
        self._pending.clear()
        self._pending_readings = 0
        by_route: dict[int, list[Chunk]] = {}
        for c in chunks:
            by_route.setdefault(id(c.route), []).append(c)
        for group in by_route.values():
            route = group[0].route
            if len(group) == 1:
                ts, values, mask = group[0].ts, group[0].values, group[0].mask
            else:
                ts = np.concatenate([c.ts for c in group])
                values = np.concatenate([c.values for c in group])
                if all(c.mask is None for c in group):
                    mask = None
                else:
                    mask = np.concatenate(
                        [np.ones(c.values.shape, bool) if c.mask is None else c.mask for c in group]
                    )
            for msg in encode(self.o.format, route, ts, values, mask, self.o.batch_max_bytes):
                self._outbox.append(msg)
                self._outbox_readings += msg.readings

    def _next(self) -> Message | None:
        if self._control:
            return self._control.popleft()
        if not self._outbox and self._pending and self._due():
            self._encode_pending()
        if not self._outbox:
            return None
        msg = self._outbox.popleft()
        self._outbox_readings -= msg.readings
        self.m.buffered.set(self.buffered_readings)
        return msg

    def _idle(self) -> bool:
        return not (self._control or self._outbox or self._pending or self._busy)

    def _kick(self, everyone: bool = False) -> None:
        """Wake one idle worker (it wakes the next if more work is waiting), or all."""
        while self._idle_workers:
            fut = self._idle_workers.popleft()
            if not fut.done():
                fut.set_result(None)
                if not everyone:
                    return

    async def _worker(self, client: aiomqtt.Client) -> None:
        loop = asyncio.get_running_loop()
        while True:
            msg = self._next()
            if msg is None:
                if self._closing and self._idle():
                    self._drained.set()
                fut: asyncio.Future[None] = loop.create_future()
                self._idle_workers.append(fut)
                await fut
                continue
            if self._control or self._outbox or (self._pending and not self.o.bursty):
                self._kick()
            self._busy += 1
            try:
                await client.publish(
                    msg.topic, msg.payload, qos=self.o.qos, timeout=self.o.publish_timeout_s
                )
            except BaseException as exc:
                if msg.readings:
                    # Unacknowledged: back to the head of the buffer, sent again after reconnect.
                    self._outbox.appendleft(msg)
                    self._outbox_readings += msg.readings
                    self.m.buffered.set(self.buffered_readings)
                if isinstance(exc, aiomqtt.MqttError):
                    self.last_error = f"publish failed: {exc}"
                    self._broken.set()
                    return
                raise
            finally:
                self._busy -= 1
            if msg.readings:
                self.sent_readings += msg.readings
                self.m.sent.inc(msg.readings)
                self._m_msgs_data.inc()
            else:
                self._m_msgs_meta.inc()
            if self._closing and self._idle():
                self._drained.set()

    async def _burst_timer(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, self._next_burst - time.time()))
            self._kick()
            await asyncio.sleep(0)  # let the workers take the burst before the next wait
            if time.time() >= self._next_burst:
                self._next_burst = self._next_burst_after(time.time())
