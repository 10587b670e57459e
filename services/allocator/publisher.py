"""Decisions as Kelvin sensors over MQTT, so they are stored and charted like any other.

Each snapshot of the hall becomes one KVB1 batch under ``sensor_prefix``
(``/kelvin/allocator/max_tin_c``, ``cooling_kw``, ``utilization``, ...) and,
optionally, one under ``/hall`` with every node's ``predicted_inlet_temp``.
Job starts and ends go to ``/DCDB_JOBDATA/``. Sensor metadata (units) is
sent at every connect. Messages wait in a bounded buffer: a broker that is
down never blocks placement; past the bound the oldest messages are dropped
and counted. Brokers are tried in order on every reconnect.

Stopping is bounded (:meth:`DecisionPublisher.stop`): aiomqtt's ``__aexit__``
waits for the broker and may turn the cancellation into an ``MqttError``, which
the reconnect loop must not take for a lost connection (it would reconnect for
ever), so the loop ends on a stop flag and on a pending cancellation alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections import deque

import aiomqtt
import numpy as np

from services.allocator.metrics import AllocatorMetrics
from services.common import codec
from services.common.logs import RateLimitedLog
from services.common.readings import Batch
from services.common.sensors import SensorMetadata
from services.common.tasks import cancelling, stop_task, wait_event

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log, period_s=30)

UNITS = {
    "max_tin_c": "°C",
    "supply_c": "°C",
    "base_supply_c": "°C",
    "cop": "",
    "computing_kw": "kW",
    "cooling_kw": "kW",
    "utilization": "",
    "min_mttf_years": "years",
    "running_jobs": "",
    "queued_jobs": "",
}


def parse_broker(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        return text, 1883
    return host.strip("[]"), int(port)


class DecisionPublisher:
    """A bounded buffer of MQTT messages and the task that drains it."""

    def __init__(
        self,
        brokers: list[str],
        prefix: str,
        metrics: AllocatorMetrics,
        maxlen: int = 1000,
        qos: int = 1,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        """``timeout_s``: how long one MQTT operation (CONNACK, PUBACK, DISCONNECT) may take."""
        self.brokers = [parse_broker(b) for b in brokers]
        self.prefix = prefix.rstrip("/")
        self.metrics = metrics
        self.qos = qos
        self.username = username
        self.password = password
        self.tls = tls
        self.timeout_s = timeout_s
        self.buffer: deque[tuple[str, bytes]] = deque()
        self.maxlen = maxlen
        self.metadata: list[SensorMetadata] = [
            SensorMetadata(name=f"{self.prefix}/{k}", unit=u or None) for k, u in UNITS.items()
        ]
        self._wake = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.connected = False

    def add_metadata(self, names: list[str], unit: str) -> None:
        self.metadata += [SensorMetadata(name=n, unit=unit) for n in names]

    def offer_values(self, ts_ns: int, values: dict[str, float], prefix: str | None = None) -> None:
        """One KVB1 batch of ``{relative name: value}`` at ``ts_ns`` under ``prefix``."""
        base = self.prefix if prefix is None else prefix.rstrip("/")
        names = [f"{base}/{k}" for k in values]
        batch = Batch.from_rows(names, np.full(len(names), ts_ns), list(values.values()))
        self._offer(*codec.encode_batch(base, batch))

    def offer_job(
        self, job_id: str, start_ns: int, end_ns: int, nodes: list[str], user: str | None = None
    ) -> None:
        doc: dict[str, object] = {
            "jobid": job_id,
            "starttime": start_ns,
            "endtime": end_ns,
            "nodes": nodes,
        }
        if user:
            doc["userid"] = user
        self._offer(codec.JOBDATA_PREFIX, json.dumps(doc).encode())

    def _offer(self, topic: str, payload: bytes) -> None:
        if len(self.buffer) >= self.maxlen:
            self.buffer.popleft()
            self.metrics.publish_dropped.inc()
        self.buffer.append((topic, payload))
        self.metrics.publish_buffer.set(len(self.buffer))
        self._empty.clear()
        self._wake.set()

    def start(self) -> asyncio.Task[None]:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="allocator-publisher")
        return self._task

    async def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Send what the broker takes within ``flush_timeout_s``, then disconnect; ends
        within that plus twice ``timeout_s`` whatever the broker does (a disconnect that
        the broker never lets through is left behind, logged)."""
        if self._task is None:
            return
        if self.connected and self.buffer:
            await wait_event(self._empty, flush_timeout_s)
        self._stopping = True
        self._wake.set()
        # aiomqtt's __aexit__ waits up to timeout_s for the DISCONNECT to go out.
        await stop_task(self._task, 2 * self.timeout_s + 1.0, "allocator MQTT publisher")
        self._task = None

    async def _run(self) -> None:
        backoff = 0.5
        ident = f"kelvin-allocator-{os.getpid()}-{id(self) & 0xFFFF:x}"
        while not self._stopping:
            for host, port in self.brokers:
                try:
                    async with aiomqtt.Client(
                        host,
                        port,
                        identifier=ident,
                        username=self.username,
                        password=self.password,
                        tls_context=self.tls,
                        timeout=self.timeout_s,
                    ) as client:
                        self._set_connected(True)
                        backoff = 0.5
                        await self._announce(client)
                        await self._drain(client)
                except aiomqtt.MqttError as exc:
                    if self._stopping or cancelling():
                        # A stop, not a lost broker: aiomqtt's __aexit__ replaced the
                        # cancellation with its own error; reconnecting would never end.
                        raise asyncio.CancelledError from exc
                    _rlog.warning(
                        f"mqtt:{host}:{port}", "allocator: broker %s:%d: %s", host, port, exc
                    )
                finally:
                    self._set_connected(False)
                if self._stopping:
                    return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    def _set_connected(self, up: bool) -> None:
        self.connected = up
        self.metrics.mqtt_connected.set(1 if up else 0)

    async def _announce(self, client: aiomqtt.Client) -> None:
        for meta in self.metadata:
            topic, payload = codec.encode_metadata(meta)
            await client.publish(topic, payload, qos=self.qos)

    async def _drain(self, client: aiomqtt.Client) -> None:
        while not self._stopping:
            if not self.buffer:
                self._wake.clear()
                await self._wake.wait()
                continue
            topic, payload = self.buffer[0]
            await client.publish(topic, payload, qos=self.qos)
            # only now: a message in flight when the connection drops is sent again
            if self.buffer and self.buffer[0] == (topic, payload):
                self.buffer.popleft()
            if not self.buffer:
                self._empty.set()
            self.metrics.published.inc()
            self.metrics.publish_buffer.set(len(self.buffer))
