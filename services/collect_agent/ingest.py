"""The one pipeline behind every way in: decode, scale, group-commit to the spool, then ack.

MQTT connections, the broker subscription and HTTP ``/write`` hand messages to
:class:`Ingestor`. It classifies each topic (cached), sets DCDB records aside
undecoded (a group of them is decoded with one numpy call at commit), decodes
everything else at once, and gathers acknowledgements. A commit task turns the
gathered group into spool records, waits until the spool has them durable and
only then sends the group's acks. While the spool is over its quota (storage
down) or a commit is far behind, it asks the transports to stop reading
(back-pressure) instead of dropping anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from services.collect_agent import spool_format as fmt
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.spool import Item, Spool, SpoolError
from services.collect_agent.tasks import cancel
from services.common import codec
from services.common.cache import SensorCache
from services.common.errors import PayloadError, SensorNameError
from services.common.logs import RateLimitedLog
from services.common.readings import Batch
from services.common.sensors import JobRecord, SensorMetadata

log = logging.getLogger(__name__)

_JSON_HEADS = frozenset(b"{[ \n\t\r")
_TOPIC_CACHE_MAX = 200_000

# MQTT 5 reason codes for rejected publishes
RC_NOT_AUTHORIZED = 0x87
RC_TOPIC_INVALID = 0x90
RC_PAYLOAD_INVALID = 0x99


class Draining(SpoolError):
    """The agent is draining its spool before it exits: new data goes elsewhere."""


class AckSink(Protocol):
    """Who gets told when a group is durable (an MQTT connection, the subscriber)."""

    def acked(self, qos1: list[int], qos2: list[int], codes: dict[int, int]) -> None: ...

    def not_durable(self) -> None:
        """The spool refused the group: none of these may be acknowledged."""


class _Group:
    """Messages gathered since the last commit."""

    __slots__ = (
        "acks",
        "batches",
        "bytes",
        "controls",
        "messages",
        "names",
        "payloads",
        "rejects",
        "scales",
        "started",
        "waiters",
    )

    def __init__(self) -> None:
        self.names: list[str] = []
        self.payloads: list[bytes] = []
        self.scales: list[float] = []
        self.batches: list[Batch] = []
        self.controls: list[SensorMetadata | JobRecord] = []
        self.acks: dict[AckSink, tuple[list[int], list[int], dict[int, int]]] = {}
        self.waiters: list[asyncio.Future[None]] = []
        self.rejects: dict[str, int] = {}
        self.messages = 0
        self.bytes = 0
        self.started = 0.0


class Ingestor:
    """Decode -> group commit -> ack (see the module docstring)."""

    def __init__(
        self,
        spool: Spool,
        metrics: AgentMetrics,
        cache: SensorCache | None = None,
        commit_delay_ms: float = 0.0,
        max_group_bytes: int = 64 << 20,
    ) -> None:
        self.spool = spool
        self.metrics = metrics
        self.cache = cache
        self.commit_delay_s = commit_delay_ms / 1000
        self.max_group_bytes = max_group_bytes
        self.scales: dict[str, float] = {}
        """sensor -> scale for DCDB integers (from stored and received metadata)."""
        self.paused = False
        self.on_pressure: list[Callable[[bool], None]] = []
        self.readings_spooled = 0
        self.spool_ok = True
        """False while the spool refuses writes (disk full, I/O error): not ready."""
        self.rejected: dict[str, int] = {}
        self.draining = False
        """Shutting down: every way in refuses new data (see :meth:`drain`)."""
        self._bad = RateLimitedLog(log)
        self._topics: dict[bytes, tuple[Any, str]] = {}
        self._group = _Group()
        self._wake = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._task: asyncio.Task[None] | None = None
        self._committing: asyncio.Task[None] | None = None
        self._committed = asyncio.Condition()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self._commit_loop(), name="ingest-commit")
        return self._task

    async def stop(self) -> None:
        """Commit what is gathered (so its acks go out), then stop."""
        await cancel(self._task)
        self._task = None
        if self._committing is not None:
            await asyncio.shield(self._committing)
        await self._commit(self._take())

    # ------------------------------------------------------------------ receiving
    def receive_mqtt(self, sink: AckSink, publishes: list[tuple[Any, ...]], transport: str) -> None:
        """PUBLISH tuples ``(type, qos, topic bytes, packet id, payload)`` from one sink."""
        g = self._group
        acks = g.acks.get(sink)
        if acks is None:
            acks = g.acks[sink] = ([], [], {})
        q1, q2, codes = acks
        now = time.time_ns()
        for p in publishes:
            if p[0] == 3:
                code = self._accept(g, p[2], p[4], now)
            elif p[0] == -4:  # refused by the endpoint's ACL: acknowledged, never stored
                self.reject(g, p[4], f"PUBLISH on {p[2][:80]!r}: not allowed for user {p[5]!r}")
                code = RC_NOT_AUTHORIZED
            else:  # oversized: its body was skipped
                self.reject(g, "too_large", f"PUBLISH of {p[4]} bytes on {p[2][:80]!r}")
                code = RC_PAYLOAD_INVALID
            qos = p[1]
            if qos == 1:
                q1.append(p[3])
                if code:
                    codes[p[3]] = code
            elif qos == 2:
                q2.append(p[3])
                if code:
                    codes[p[3]] = code
        g.messages += len(publishes)
        self.metrics.messages.labels(transport).inc(len(publishes))
        self._wake_commit(g)

    def drain(self) -> None:
        """Take no new data from now on: :meth:`receive_batch` raises :class:`Draining`
        (HTTP answers 503 with Retry-After) and HTTP requests waiting for back-pressure
        to end are let through to be refused."""
        self.draining = True
        self._resumed.set()

    async def flush(self) -> None:
        """Until everything handed in so far is durable and acknowledged (also while
        draining: the MQTT endpoint lets its clients go only after their acks)."""
        g = self._group
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.waiters.append(fut)
        self._wake_commit(g)
        await fut

    def receive_batch(self, batch: Batch, messages: int, transport: str) -> asyncio.Future[None]:
        """Already decoded readings (HTTP /write); the future resolves once durable.

        Raises :class:`Draining` (a SpoolError: nothing is acknowledged) while the agent
        shuts down."""
        if self.draining:
            raise Draining("the collect agent is shutting down; send to another agent")
        g = self._group
        if len(batch):
            g.batches.append(batch)
            g.bytes += 16 * len(batch)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.waiters.append(fut)
        g.messages += messages
        self.metrics.messages.labels(transport).inc(messages)
        self._wake_commit(g)
        return fut

    def _wake_commit(self, g: _Group) -> None:
        if not g.started:
            g.started = time.perf_counter()
        self._wake.set()
        if g.bytes > self.max_group_bytes:
            self._set_paused(True)

    def _accept(self, g: _Group, topic: bytes, payload: bytes, now: int) -> int:
        """Gather one publish; returns 0 or the MQTT 5 reason code of its rejection."""
        entry = self._topics.get(topic)
        if entry is None:
            entry = self._classify(topic)
        kind, name = entry
        g.bytes += len(payload)
        if kind is codec.TopicKind.DATA and payload and not len(payload) & 15:
            if payload[0] not in _JSON_HEADS:
                g.names.append(name)
                g.payloads.append(payload)
                g.scales.append(self.scales.get(name, 1.0))
                return 0
        elif kind.__class__ is str:  # a cached rejection reason
            self.reject(g, kind, name)
            return RC_TOPIC_INVALID
        try:
            decoded = codec.decode_publish(topic.decode("utf-8"), payload, now)
        except PayloadError as exc:
            self.reject(g, exc.reason, f"{name}: {exc}")
            return RC_TOPIC_INVALID if exc.reason == "bad_topic" else RC_PAYLOAD_INVALID
        except Exception as exc:  # a decoder bug must not close connections or kill the subscriber
            self.reject(g, "decoder_error", f"{name}: {type(exc).__name__}: {exc}")
            return RC_PAYLOAD_INVALID
        if decoded.batch is not None and len(decoded.batch):
            batch = decoded.batch
            if decoded.raw_integers:
                scale = self.scales.get(batch.sensors[0], 1.0)
                if scale != 1.0:
                    batch = Batch(
                        batch.sensors, batch.offsets, batch.timestamps_ns, batch.values * scale
                    )
            g.batches.append(batch)
        if decoded.metadata is not None:
            meta = decoded.metadata
            if "scale" in meta.model_fields_set:
                self.scales[meta.name] = meta.scale
            g.controls.append(meta)
            self.metrics.metadata.inc()
        if decoded.job is not None:
            g.controls.append(decoded.job)
            self.metrics.jobs.inc()
        return 0

    def _classify(self, topic: bytes) -> tuple[Any, str]:
        """(TopicKind, sensor name) or (rejection reason, message), cached per topic."""
        entry: tuple[Any, str]
        try:
            entry = codec.classify(topic.decode("utf-8"))
        except UnicodeDecodeError:
            entry = ("bad_topic", f"topic {topic[:80]!r} is not valid UTF-8")
        except SensorNameError as exc:
            entry = ("bad_topic", str(exc))
        except PayloadError as exc:
            entry = (exc.reason, str(exc))
        if len(self._topics) >= _TOPIC_CACHE_MAX:
            self._topics.clear()
        self._topics[topic] = entry
        return entry

    def reject(self, g: _Group | None, reason: str, message: str) -> None:
        """Count (per reason) and log (rate-limited) one bad message."""
        group = g or self._group
        group.rejects[reason] = group.rejects.get(reason, 0) + 1
        self._bad.warning(reason, "rejected (%s): %s", reason, message)
        if g is None:
            self._flush_rejects(group)

    def _flush_rejects(self, g: _Group) -> None:
        for reason, n in g.rejects.items():
            self.metrics.rejected.labels(reason).inc(n)
            self.rejected[reason] = self.rejected.get(reason, 0) + n
        g.rejects.clear()

    # ------------------------------------------------------------------ back-pressure
    def _set_paused(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        self.metrics.backpressure.set(1 if paused else 0)
        if paused:
            self.metrics.backpressure_events.inc()
            self._resumed.clear()
            log.warning(
                "back-pressure on: spool %d/%d bytes, %d readings waiting for storage",
                self.spool.disk_bytes,
                self.spool.max_bytes,
                self.spool.pending_readings,
            )
        else:
            self._resumed.set()
            log.info("back-pressure off")
        for cb in self.on_pressure:
            cb(paused)

    def check_pressure(self) -> None:
        """Re-evaluate back-pressure (after a commit or a drain)."""
        self._set_paused(self.spool.over_quota or self._group.bytes > self.max_group_bytes)

    async def wait_spooled(self, readings: int) -> None:
        """Until at least ``readings`` readings in total were committed to the spool."""
        async with self._committed:
            await self._committed.wait_for(lambda: self.readings_spooled >= readings)

    async def admitted(self) -> None:
        """Until back-pressure is off (HTTP waits here before reading a body); at once
        while draining (the request is then refused)."""
        if not self.draining:
            await self._resumed.wait()

    # ------------------------------------------------------------------ committing
    def _take(self) -> _Group:
        g, self._group = self._group, _Group()
        return g

    async def _commit_loop(self) -> None:
        while True:
            await self._wake.wait()
            if self.commit_delay_s:
                await asyncio.sleep(self.commit_delay_s)
            self._wake.clear()
            self._committing = asyncio.ensure_future(self._commit(self._take()))
            # Shielded: stopping the loop must not cancel a commit between its
            # spool write and its acks.
            await asyncio.shield(self._committing)
            self._committing = None

    def build(self, g: _Group) -> tuple[list[tuple[Item, bytes]], Batch]:
        """Decode the group's DCDB records and encode spool records: controls, then readings."""
        parts = list(g.batches)
        if g.names:
            parts.insert(0, self._decode_dcdb(g))
        batch = Batch.concat(parts)
        items: list[tuple[Item, bytes]] = []
        for c in g.controls:
            body = fmt.encode_metadata(c) if isinstance(c, SensorMetadata) else fmt.encode_job(c)
            items.append((c, body))
        if len(batch):
            items.append((batch, fmt.encode_readings(batch)))
        return items, batch

    def _decode_dcdb(self, g: _Group) -> Batch:
        ts, vs, offsets = codec.decode_dcdb_many(g.payloads, 0)
        names = g.names
        scales = np.asarray(g.scales, dtype=np.float64)
        if bool((ts < 0).any()):
            # uint64 timestamps beyond int64: drop those messages, keep the rest.
            counts = np.diff(offsets)
            bad_series = np.zeros(len(names), dtype=bool)
            bad_series[np.repeat(np.arange(len(names)), counts)[ts < 0]] = True
            keep = np.repeat(~bad_series, counts)
            for i in np.flatnonzero(bad_series).tolist():
                self.reject(g, "bad_timestamp", f"{names[i]}: DCDB timestamp beyond int64 ns")
            names = [n for n, b in zip(names, bad_series.tolist(), strict=True) if not b]
            scales = scales[~bad_series]
            counts = counts[~bad_series]
            ts, vs = ts[keep], vs[keep]
            offsets = np.zeros(len(names) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
        if bool((scales != 1.0).any()):
            vs = vs * (scales if len(vs) == len(scales) else np.repeat(scales, np.diff(offsets)))
        return Batch(names, offsets, ts, vs)

    async def _commit(self, g: _Group) -> None:
        if not g.messages and not g.waiters:
            return
        try:
            try:
                items, batch = self.build(g)
            except Exception as exc:  # a decoder bug must not stop ingest for everyone
                log.exception("cannot build a group commit of %d messages", g.messages)
                raise SpoolError(f"group commit failed: {exc}") from exc
            await self.spool.append(items)
        except SpoolError as exc:
            self.spool_ok = False
            self.metrics.spool_errors.inc()
            log.error("%s; closing %d connections unacknowledged", exc, len(g.acks))
            for sink in g.acks:
                sink.not_durable()
            for fut in g.waiters:
                if not fut.done():
                    fut.set_exception(exc)
            self._flush_rejects(g)
            return
        self.spool_ok = True
        for sink, (q1, q2, codes) in g.acks.items():
            if q1 or q2:
                sink.acked(q1, q2, codes)
        for fut in g.waiters:
            if not fut.done():
                fut.set_result(None)
        n = len(batch)
        self.readings_spooled += n
        self.metrics.readings_spooled.inc(n)
        self.metrics.commits.inc()
        self.metrics.commit_seconds.observe(time.perf_counter() - g.started)
        self._flush_rejects(g)
        if self.cache is not None and n:
            self.cache.put_batch(batch)
        self.check_pressure()
        async with self._committed:
            self._committed.notify_all()
