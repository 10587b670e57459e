"""External-broker mode: take a share of the stream from an MQTT v5 broker.

N agents subscribe with the same share name (``$share/<group>/<prefix>/#``) and
the broker splits the publishes among them. Acknowledgements are manual: the
PUBACK for a message goes to the broker only once the message is durable in
the spool, so a killed agent's unacknowledged messages are redelivered (to the
same client id when it comes back within the session expiry). The broker's
flow control (our *Receive Maximum*) stops it sending while we stop acking,
which is how back-pressure reaches the broker. Metadata topics are subscribed
without sharing: every agent needs every sensor's scale.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from services.collect_agent.ingest import Ingestor
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.settings import BrokerSettings
from services.collect_agent.tasks import cancel
from services.common import codec, names
from services.common.tasks import cancelling

log = logging.getLogger(__name__)

RECEIVE_MAXIMUM = 4096
"""Unacknowledged messages the broker may have in flight to one agent."""


def topic_filters(group: str, prefixes: list[str]) -> list[tuple[str, SubscribeOptions]]:
    """Shared data and batch filters per prefix, shared job records, unshared metadata."""
    qos1 = SubscribeOptions(qos=1)
    out: list[tuple[str, SubscribeOptions]] = []
    for raw in prefixes:
        p = names.validate_prefix(raw)
        if p == "/":
            out.append((f"$share/{group}//#", qos1))
            continue
        out.append((f"$share/{group}/{p}/#", qos1))
        out.append((f"$share/{group}/{codec.BATCH_PREFIX}{p}/#", qos1))
    if not any(names.validate_prefix(p) == "/" for p in prefixes):
        out.append((f"$share/{group}/{codec.JOBDATA_PREFIX}#", qos1))
    out.append((f"{codec.MAP_PREFIX}#", qos1))
    return out


class _Session:
    """Ack sink for one broker connection; acks for a dead connection are dropped
    (the broker redelivers those messages)."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.alive = True

    def acked(self, qos1: list[int], qos2: list[int], codes: dict[int, int]) -> None:
        if not self.alive:
            return
        paho = self.client._client
        for mid in qos1:
            paho.ack(mid, 1)
        for mid in qos2:
            paho.ack(mid, 2)

    def not_durable(self) -> None:
        self.alive = False  # never ack: redelivered after the reconnect


class Subscriber:
    """Reconnecting aiomqtt subscriber feeding the ingestor (see the module docstring)."""

    def __init__(self, ingestor: Ingestor, metrics: AgentMetrics, settings: BrokerSettings) -> None:
        self.ingestor = ingestor
        self.metrics = metrics
        self.settings = settings
        self.client_id = settings.client_id or f"kelvin-agent-{socket.gethostname()}"
        self.filters = topic_filters(settings.group, settings.prefixes)
        self.connected = False
        self.subscribed = asyncio.Event()
        """Set while the subscription is active (tests and readiness wait on it)."""
        self.lost = asyncio.Event()
        """Set while disconnected after having been subscribed."""
        self.messages = 0
        self.connected_since: float | None = None
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._session: _Session | None = None

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self.run(), name="broker-subscriber")
        return self._task

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    def info(self) -> dict[str, Any]:
        s = self.settings
        return {
            "broker": f"{s.host}:{s.port}",
            "client_id": self.client_id,
            "group": s.group,
            "filters": [f for f, _ in self.filters],
            "connected": self.connected,
            "messages": self.messages,
            "last_error": self.last_error,
        }

    def _client(self) -> aiomqtt.Client:
        s = self.settings
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = s.session_expiry_s
        props.ReceiveMaximum = RECEIVE_MAXIMUM
        client = aiomqtt.Client(
            s.host,
            s.port,
            identifier=self.client_id,
            username=s.username,
            password=s.password,
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=False,
            properties=props,
            keepalive=s.keepalive_s,
            tls_context=ssl.create_default_context() if s.tls else None,
        )
        # Before connecting: a resumed session may deliver at once, and those
        # messages must not be acknowledged before they are spooled.
        client._client.manual_ack_set(True)
        return client

    async def run(self) -> None:
        delay = 0.2
        while True:
            client = self._client()
            session = _Session(client)
            try:
                async with client:
                    await client.subscribe(self.filters)
                    self._session = session
                    self.connected = True
                    self.subscribed.set()
                    self.lost.clear()
                    self.connected_since = time.monotonic()
                    self.metrics.broker_connected.set(1)
                    log.info(
                        "subscribed to %s:%d as %s",
                        self.settings.host,
                        self.settings.port,
                        self.client_id,
                    )
                    delay = 0.2
                    await self._consume(client, session)
            except aiomqtt.MqttError as exc:
                if cancelling():  # stopped while aiomqtt waited for the broker: not a loss
                    raise asyncio.CancelledError from exc
                self.last_error = str(exc)
                log.warning(
                    "broker %s:%d: %s; reconnecting in %.1f s",
                    self.settings.host, self.settings.port, exc, delay,
                )  # fmt: skip
            finally:
                session.alive = False
                self.connected = False
                if self.subscribed.is_set():
                    self.lost.set()
                self.subscribed.clear()
                self.metrics.broker_connected.set(0)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def _consume(self, client: aiomqtt.Client, session: _Session) -> None:
        ing = self.ingestor
        async for msg in client.messages:
            if ing.paused:
                await ing.admitted()
            payload = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
            self.messages += 1
            ing.receive_mqtt(
                session, [(3, msg.qos, msg.topic.value.encode("utf-8"), msg.mid, payload)], "broker"
            )
