"""Kelvin's publisher interface and its MQTT implementation (:mod:`services.pusher.mqtt`).

The pusher hands every group's queued readings to a :class:`Publisher` as
:class:`~services.pusher.sampling.Chunk` objects and never waits for it. The MQTT
publisher keeps them, unencoded, in one bounded outage buffer
(``buffer_readings``), encodes them when it can send (KVB1 batches, or DCDB's
one PUBLISH per sensor with all its queued readings), and publishes with QoS 0
or 1 through a window of ``max_inflight`` unacknowledged messages.

Delivery: a QoS 1 message counts as sent only on its PUBACK. Messages in flight
when the connection drops go back to the head of the buffer, in their order,
and are sent again after the reconnect, so a broker outage loses nothing
inside the bound; past the bound the oldest readings are dropped, counted
(``kelvin_pusher_readings_dropped_total{reason="buffer_full"}``) and logged. A
PUBACK whose MQTT 5 reason code refuses the message for good (0x87 not
authorised, 0x90 bad topic, 0x99 bad payload) drops it, counted by reason
(``denied``/``refused``); a refusal that may pass later (0x80, 0x83, 0x97
quota) puts it back and pauses sending for a second.

Reconnecting: brokers are tried in the configured order on every (re)connect,
so traffic returns to the primary once it is back; the waits between rounds
grow from ``reconnect_min_s`` to ``reconnect_max_s`` with full jitter, so a
thousand pushers that lost the same agent do not come back in step. A broker
that asks its clients to move (MQTT 5 DISCONNECT 0x8B shutting down, 0x9C use
another server, 0x9D server moved, as the collect agent does when it drains
or rebalances) is answered at once, after a jitter of up to
``reconnect_jitter_s``, through the same address: behind a Kubernetes Service
that is another agent replica.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
import zlib
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.logs import RateLimitedLog
from services.common.tasks import stop_task, wait_event
from services.pusher import mqtt, spool
from services.pusher.formats import Format, Message, SensorMetadata, encode, metadata_message
from services.pusher.metrics import PusherMetrics
from services.pusher.sampling import Chunk

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log, period_s=30)

_REFUSED_FOR_GOOD = {0x87: "denied", 0x90: "refused", 0x99: "refused", 0x95: "refused"}
"""PUBACK reason codes after which sending the same message again cannot succeed."""


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
    reconnect_jitter_s: float = 1.0
    """Longest wait before reconnecting after a broker asked its clients to move."""
    flush_timeout_s: float = 5.0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_ca: Path | None = None
    """CA bundle to verify the broker with (None: the system's)."""
    tls_server_name: str | None = None
    """Name the broker's certificate must carry (None: the host of the endpoint)."""
    mqtt_version: int | None = None
    """5 or 4 (3.1.1); None = 5, and 3.1.1 for a broker that refuses 5."""
    announce: bool = True
    spool_path: Path | None = None
    """Where readings still unsent at stop are kept for the next start (None = dropped)."""
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class _Out:
    """A message on its way: what it is and whether unsent.bin still holds it."""

    msg: Message
    spooled: bool = False
    sent_at: float = 0.0


class MqttPublisher(Publisher):
    """Publish to the first reachable broker of a list."""

    def __init__(self, options: MqttOptions, metrics: PusherMetrics) -> None:
        self.o = options
        self.m = metrics
        self._pending: deque[Chunk] = deque()
        self._pending_readings = 0
        self._outbox: deque[_Out] = deque()
        self._outbox_readings = 0
        self._control: deque[Message] = deque()
        self._meta: dict[str, Message] = {}
        """Encoded metadata of every announced sensor, sent again at each connect."""
        self._inflight: OrderedDict[int, _Out] = OrderedDict()
        """Unacknowledged QoS 1 messages by packet id, oldest first."""
        self._inflight_readings = 0
        self._next_id = 0
        self._conn: mqtt.Connection | None = None
        self._lost: asyncio.Future[mqtt.MqttError] | None = None
        self._drained = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._pump_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._due_now = False
        """Bursty sending: the burst instant came, encode and send what is pending."""
        self._paused_until = 0.0
        self._connected_to: str | None = None
        self._versions: dict[str, int] = {}
        """Endpoint -> the MQTT version it accepted (3.1.1 brokers refuse 5)."""
        self._next_burst = 0.0
        # Spread bursts of many nodes over the interval instead of all at :00.
        self._burst_phase = (zlib.crc32(options.client_id.encode()) % 1000) / 1000
        self._burst_timer: asyncio.TimerHandle | None = None
        self._spooled = 0
        """Messages read from unsent.bin at start and not yet acknowledged."""
        self._topics: dict[str, bytes] = {}
        self.sent_readings = 0
        self.dropped_readings = 0
        self.last_error: str | None = None
        self._m_drop_full = metrics.dropped.labels("buffer_full")
        self._m_msgs_data = metrics.messages.labels("data")
        self._m_msgs_meta = metrics.messages.labels("metadata")

    # ------------------------------------------------------------------ intake

    @property
    def buffered_readings(self) -> int:
        return self._pending_readings + self._outbox_readings + self._inflight_readings

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
                out = self._outbox.popleft()
                self._outbox_readings -= out.msg.readings
                lost += out.msg.readings
                self._forget_spooled(out)
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
        if self._conn is not None:
            self._control.extend(messages)
            self._kick()

    def withdraw(self, names: Iterable[str]) -> None:
        for n in names:
            self._meta.pop(n, None)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._next_burst = self._next_burst_after(time.time())
        if self.o.spool_path is not None:
            saved = spool.read(self.o.spool_path)
            if saved:
                self._outbox.extend(_Out(m, spooled=True) for m in saved)
                self._outbox_readings += sum(m.readings for m in saved)
                self._spooled = len(saved)
                self.m.buffered.set(self.buffered_readings)
                log.info(
                    "%d readings left unsent at the last stop will be sent first (%s is kept "
                    "until a broker acknowledges them)",
                    self._outbox_readings,
                    self.o.spool_path,
                )
        self._task = asyncio.create_task(self._run(), name="pusher-mqtt")

    async def stop(self) -> None:
        """Flush for up to ``flush_timeout_s``, disconnect, keep the rest in unsent.bin;
        bounded, and unsent.bin is written even when this is cancelled."""
        if self._task is None:
            return
        self._closing = True
        self._kick()
        try:
            if self._conn is not None and (self.buffered_readings or self._control):
                self._drained.clear()
                await wait_event(self._drained, self.o.flush_timeout_s)
            if self._conn is not None:
                self._conn.disconnect()  # a clean DISCONNECT; the unacknowledged are kept below
            await stop_task(self._task, what="pusher MQTT publisher")
        finally:
            self._task = None
            for handle in (self._pump_handle, self._burst_timer):
                if handle is not None:
                    handle.cancel()
            # Its task normally does this as it ends: in flight again -> in the outbox.
            self._lost_connection(mqtt.MqttError("stopped"))
            self._keep_unsent()

    def _keep_unsent(self) -> None:
        left = self.buffered_readings
        path = self.o.spool_path
        if left and path is not None:
            self._encode_pending()
            try:
                kept = spool.save(path, [o.msg for o in self._outbox])
                log.warning(
                    "stopping with %d readings not delivered; kept in %s for the next start",
                    kept,
                    path,
                )
                left = 0
            except OSError as exc:
                log.error("cannot keep unsent readings in %s: %s", path, exc)
        elif not left and path is not None and self._spooled:
            spool.remove(path)  # nothing is left of what it held
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
            "tls": self.o.tls,
            "buffered_readings": self.buffered_readings,
            "buffer_readings_max": self.o.buffer_readings,
            "inflight_messages": len(self._inflight),
            "sent_readings": self.sent_readings,
            "dropped_readings": self.dropped_readings,
            "unsent_file_messages": self._spooled,
            "last_error": self.last_error,
        }

    # ------------------------------------------------------------------ connection

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.o.tls:
            return None
        ctx = ssl.create_default_context(cafile=str(self.o.tls_ca) if self.o.tls_ca else None)
        return ctx

    async def _run(self) -> None:
        backoff = self.o.reconnect_min_s
        tls = self._tls_context()
        while True:
            moved = False
            for host, port in self.o.brokers:
                endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                try:
                    why = await self._session(host, port, endpoint, tls)
                except mqtt.MqttError as exc:
                    self._note_error(endpoint, exc)
                    continue
                except Exception as exc:  # never let the publisher die: readings keep buffering
                    self.last_error = f"{endpoint}: {type(exc).__name__}: {exc}"
                    self.m.connect_errors.labels(endpoint).inc()
                    log.exception("MQTT connection to %s failed unexpectedly", endpoint)
                    continue
                # Connected, then lost: the backoff starts again from its minimum.
                backoff = self.o.reconnect_min_s
                self._note_error(endpoint, why)
                if isinstance(why, mqtt.ServerDisconnect) and why.code in mqtt.MOVE_CODES:
                    moved = True  # the broker asked: back through the same address, soon
                    break
            if moved:
                await asyncio.sleep(random.uniform(0, self.o.reconnect_jitter_s))
                continue
            await asyncio.sleep(random.uniform(self.o.reconnect_min_s, backoff))
            backoff = min(backoff * 2, self.o.reconnect_max_s)

    def _note_error(self, endpoint: str, exc: Exception) -> None:
        self.last_error = f"{endpoint}: {exc}"
        self.m.connect_errors.labels(endpoint).inc()
        if isinstance(exc, mqtt.ServerDisconnect):
            self.m.server_disconnects.labels(f"0x{exc.code:02X}").inc()
            log.info("MQTT broker %s: %s; reconnecting", endpoint, exc)
        else:
            _rlog.warning(f"broker:{endpoint}", "MQTT broker %s: %s; buffering", endpoint, exc)

    async def _session(
        self, host: str, port: int, endpoint: str, tls: ssl.SSLContext | None
    ) -> mqtt.MqttError:
        """Connect and publish until the connection is lost; returns why it was lost.

        Raises MqttError when no connection could be made."""
        loop = asyncio.get_running_loop()
        version = self.o.mqtt_version or self._versions.get(endpoint, 5)
        lost: asyncio.Future[mqtt.MqttError] = loop.create_future()

        def on_lost(exc: mqtt.MqttError) -> None:
            if not lost.done():
                lost.set_result(exc)

        options = mqtt.ConnectOptions(
            host,
            port,
            self.o.client_id,
            self.o.keepalive_s,
            self.o.username,
            self.o.password,
            tls,
            self.o.tls_server_name,
            version,
            self.o.connect_timeout_s,
        )
        try:
            conn = await mqtt.Connection.open(options, self._on_puback, on_lost)
        except mqtt.ConnectRefused as exc:
            if not (exc.wants_older_protocol and self.o.mqtt_version is None):
                raise
            options.version = 4
            conn = await mqtt.Connection.open(options, self._on_puback, on_lost)
        self._versions[endpoint] = options.version
        self._conn, self._lost = conn, lost
        self._connected_to = endpoint
        self.m.connected.set(1)
        self.m.connects.labels(endpoint).inc()
        log.info(
            "connected to MQTT broker %s (MQTT %s%s)",
            endpoint,
            "5" if options.version == 5 else "3.1.1",
            ", TLS" if tls else "",
        )
        self._control = deque(self._meta.values())
        if self.o.bursty:
            self._arm_burst()
        self._kick()
        self._watchdog = loop.call_later(self.o.publish_timeout_s / 2, self._watch)
        try:
            return await lost
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            conn.close()
            self._lost_connection(lost.result() if lost.done() else mqtt.MqttError("cancelled"))

    def _watch(self) -> None:
        """Abandon a connection whose oldest unacknowledged message waits too long."""
        self._watchdog = None
        lost = self._lost
        if self._conn is None or lost is None or lost.done():
            return
        if self._inflight:
            oldest = next(iter(self._inflight.values()))
            if time.monotonic() - oldest.sent_at > self.o.publish_timeout_s:
                lost.set_result(mqtt.MqttError(f"no PUBACK within {self.o.publish_timeout_s:g} s"))
                return
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(self.o.publish_timeout_s / 2, self._watch)

    def _lost_connection(self, why: mqtt.MqttError) -> None:
        if self._conn is None:
            return
        self._conn = None
        self._lost = None
        if self._connected_to is not None:
            self._connected_to = None
            self.m.connected.set(0)
        if self._burst_timer is not None:
            self._burst_timer.cancel()
            self._burst_timer = None
        if self._inflight:
            # Unacknowledged: back to the head of the buffer in their order, sent again.
            back = list(self._inflight.values())
            self._inflight.clear()
            self._inflight_readings = 0
            for out in reversed(back):
                if out.msg.readings:
                    self._outbox.appendleft(out)
                    self._outbox_readings += out.msg.readings
            self.m.buffered.set(self.buffered_readings)
        self.last_error = str(why)

    # ------------------------------------------------------------------ sending

    def _next_burst_after(self, now: float) -> float:
        period = self.o.burst_interval_ms / 1000
        offset = self._burst_phase * period
        return ((now - offset) // period + 1) * period + offset

    def _arm_burst(self) -> None:
        loop = asyncio.get_running_loop()
        delay = max(0.0, self._next_burst - time.time())
        self._burst_timer = loop.call_later(delay, self._burst)

    def _burst(self) -> None:
        self._burst_timer = None
        if time.time() >= self._next_burst:
            self._next_burst = self._next_burst_after(time.time())
            self._due_now = True
        self._pump()
        if self._conn is not None:
            self._arm_burst()

    def _due(self) -> bool:
        if not self.o.bursty or self._closing:
            return True
        if self._due_now:
            self._due_now = False
            return True
        return False

    def _encode_pending(self) -> None:
        chunks = list(self._pending)
        self._pending.clear()
        self._pending_readings = 0
        by_route: dict[int, list[Chunk]] = {}
        for c in chunks:
            by_route.setdefault(id(c.route), []).append(c)
        limit = self.o.batch_max_bytes
        if self._conn is not None:
            # The broker's maximum packet size, less the PUBLISH header and topic.
            limit = min(limit, self._conn.limits.maximum_packet_size - 1024)
        for group in by_route.values():
            route = group[0].route
            ts: list[int] = [t for c in group for t in c.ts]
            values: list[Any] = [row for c in group for row in c.values]
            if all(c.mask is None for c in group):
                mask = None
            else:
                mask = [m for c in group for m in (c.mask or [None] * len(c.ts))]
            for msg in encode(self.o.format, route, ts, values, mask, max(1024, limit)):
                self._outbox.append(_Out(msg))
                self._outbox_readings += msg.readings

    def _next(self) -> _Out | None:
        if self._control:
            return _Out(self._control.popleft())
        if not self._outbox and self._pending and self._due():
            self._encode_pending()
        if not self._outbox:
            return None
        out = self._outbox.popleft()
        self._outbox_readings -= out.msg.readings
        return out

    def _idle(self) -> bool:
        return not (self._control or self._outbox or self._pending or self._inflight)

    def _kick(self) -> None:
        """Send what can be sent, once per loop iteration whatever the number of calls."""
        if self._pump_handle is None and self._conn is not None:
            loop = asyncio.get_running_loop()
            self._pump_handle = loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_handle = None
        conn = self._conn
        if conn is None or conn.closed:
            return
        now = time.monotonic()
        if now < self._paused_until:
            self._pump_handle = asyncio.get_running_loop().call_later(
                self._paused_until - now, self._pump
            )
            return
        qos = self.o.qos
        window = min(self.o.max_inflight, conn.limits.receive_maximum)
        while not qos or len(self._inflight) < window:
            if conn.writable_bytes() > 4 << 20:
                # The socket is behind (a slow broker): look again in a moment.
                self._pump_handle = asyncio.get_running_loop().call_later(0.05, self._pump)
                break
            out = self._next()
            if out is None:
                break
            msg = out.msg
            topic = self._topics.get(msg.topic)
            if topic is None:
                topic = msg.topic.encode("utf-8")
                if len(self._topics) < 100_000:
                    self._topics[msg.topic] = topic
            if qos:
                self._next_id = self._next_id % 65535 + 1
                while self._next_id in self._inflight:
                    self._next_id = self._next_id % 65535 + 1
                out.sent_at = now
                self._inflight[self._next_id] = out
                self._inflight_readings += msg.readings
                conn.publish(topic, msg.payload, 1, self._next_id)
            else:
                conn.publish(topic, msg.payload, 0, 0)  # QoS 0: sent once written
                self._sent(out)
        self.m.buffered.set(self.buffered_readings)
        if self._closing and self._idle():
            self._drained.set()

    def _sent(self, out: _Out) -> None:
        if not out.msg.readings:
            self._m_msgs_meta.inc()
            return
        self.sent_readings += out.msg.readings
        self.m.sent.inc(out.msg.readings)
        self._m_msgs_data.inc()
        self._forget_spooled(out)

    def _forget_spooled(self, out: _Out) -> None:
        if out.spooled:
            out.spooled = False
            self._spooled -= 1
            if self._spooled == 0 and self.o.spool_path is not None:
                spool.remove(self.o.spool_path)
                log.info("every reading left unsent at the last stop was delivered")

    def _on_puback(self, packet_id: int, code: int) -> None:
        out = self._inflight.pop(packet_id, None)
        if out is None:
            return
        self._inflight_readings -= out.msg.readings
        if code < 0x80:
            self._sent(out)
        elif code in _REFUSED_FOR_GOOD:
            why = _REFUSED_FOR_GOOD[code]
            self.dropped_readings += out.msg.readings
            self.m.dropped.labels(why).inc(out.msg.readings)
            self._forget_spooled(out)
            self.last_error = f"broker refused {out.msg.topic}: {mqtt.reason(code)}"
            _rlog.warning(
                f"refused:{code}",
                "broker refused %d readings on %s: %s (dropped, counted as %s)",
                out.msg.readings,
                out.msg.topic,
                mqtt.reason(code),
                why,
            )
        else:
            # Might pass later (quota, a transient error): again, after a pause.
            self._outbox.appendleft(out)
            self._outbox_readings += out.msg.readings
            self._paused_until = time.monotonic() + 1.0
            self.last_error = f"broker answered {mqtt.reason(code)}; retrying"
        self._kick()
