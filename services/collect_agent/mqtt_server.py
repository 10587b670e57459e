"""The built-in MQTT endpoint: a purpose-built, publish-only MQTT 3.1/3.1.1/5 server.

Pushers connect here directly; there is no broker. This module holds the
listener, the registry of connections, CONNECT handling (credentials, client
ids, sessions), back-pressure fan-out, the sweeper (connect timeout,
keep-alive, packets stalled half-way, expired sessions), moving clients to
other agents, and the stop that refuses new publishes. A connection is a
:class:`~.mqtt_connection.MqttConnection`; credentials and the ACL are in
:mod:`.mqtt_auth`, the bounds under abuse in :mod:`.mqtt_limits`, sessions in
:mod:`.mqtt_sessions`. Subscriptions are refused (SUBACK failure): this
endpoint only ingests.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.ingest import Ingestor
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.mqtt_auth import MqttAcl, MqttAuth
from services.collect_agent.mqtt_connection import MqttConnection, encode_acks
from services.collect_agent.mqtt_limits import EndpointLimits, Listener, PartialBudget
from services.collect_agent.mqtt_rebalance import Rebalancer
from services.collect_agent.mqtt_sessions import SessionStore
from services.collect_agent.spool import SpoolError
from services.collect_agent.tasks import cancel
from services.common.fdlimits import connection_cap, raise_nofile_limit
from services.common.logs import RateLimitedLog
from services.common.net import bind_tcp, bound_port
from services.common.tasks import wait_for

__all__ = ["EndpointLimits", "MqttConnection", "MqttServer", "encode_acks"]

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 10.0
"""Longest wait for the ingestor to commit what was read before clients are let go."""


class MqttServer:
    """See the module docstring."""

    def __init__(
        self,
        ingestor: Ingestor,
        metrics: AgentMetrics,
        host: str,
        port: int,
        limits: EndpointLimits,
        users: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        auth: MqttAuth | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        """Without ``auth``: ``users`` (if any) are required, with full rights (tests)."""
        self.ingestor = ingestor
        self.metrics = metrics
        self.host, self.requested_port = host, port
        self.limits = limits
        if auth is None:
            acl = MqttAcl(node_topics=["#"])
            auth = MqttAuth(users or {}, None, acl, anonymous=not users)
        self.auth = auth
        self.ssl_context = ssl_context
        self.port: int | None = None
        self.max_connections = limits.max_connections
        self.conns: set[MqttConnection] = set()
        self.by_id: dict[str, MqttConnection] = {}
        self.sessions = sessions or SessionStore(metrics)
        self.budget = PartialBudget(
            max(limits.partial_budget_bytes, 2 * limits.max_packet_bytes), metrics
        )
        self.ids = itertools.count(1)
        self.paused = False
        self.refusing = False
        self.changed = asyncio.Event()
        """Set whenever a connection opens or closes (tests and the rebalancer await it)."""
        self.bad = RateLimitedLog(log)
        self._listener: Listener | None = None
        self._attaching: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.rebalancer: Rebalancer | None = None
        """Set before :meth:`start` to move clients to other agents (see mqtt_rebalance)."""
        self._rebalancing: asyncio.Task[None] | None = None
        self._refused: asyncio.Future[None] | None = None
        ingestor.on_pressure.append(self._on_pressure)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        before, nofile = raise_nofile_limit()
        self.max_connections = connection_cap(self.limits.max_connections, nofile)
        if nofile != before:
            log.info("raised the open-file limit (RLIMIT_NOFILE) from %d to %d", before, nofile)
        if self.max_connections < self.limits.max_connections:
            log.warning(
                "MQTT: max_connections capped at %d (of %d configured): RLIMIT_NOFILE is %d "
                "and the spool, storage and HTTP need descriptors too; raise the hard limit "
                "(ulimit -Hn, LimitNOFILE=) for more",
                self.max_connections, self.limits.max_connections, nofile,
            )  # fmt: skip
        sock = bind_tcp(self.host, self.requested_port, "collect-agent MQTT", "--mqtt-port")
        self.port = bound_port(sock)
        self._listener = Listener(sock, self._on_socket, self.metrics.accept_errors)
        self._listener.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="mqtt-sweeper")
        if self.rebalancer is not None:
            self._rebalancing = asyncio.create_task(self.rebalancer.run(), name="mqtt-rebalance")

    async def refuse_new(self, flush_timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Stop taking publishes, for a shutdown: after it returns no connection is
        accepted, nothing more is read from any client, every publish already read is
        committed to the spool and acknowledged, and every client has been let go
        (MQTT 5: DISCONNECT 0x8B "server shutting down"; 3.1.1: closed). Idempotent;
        the ingestor must still be running."""
        if self._refused is not None:
            await asyncio.shield(self._refused)
            return
        self._refused = asyncio.get_running_loop().create_future()
        self.refusing = True
        await cancel(self._rebalancing)
        self._rebalancing = None
        try:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            conns = [c for c in self.conns if not c.closed]
            for c in conns:
                c.pause("shutdown")
            if conns:
                await self.flush(flush_timeout_s)
            for c in conns:
                c.disconnect(mp.RC_SERVER_SHUTTING_DOWN, "server_shutting_down")
        finally:
            self._refused.set_result(None)

    async def stop(self) -> None:
        if self._sweeper is None and self._listener is None:
            return
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.refusing = True
        await cancel(self._sweeper)
        await cancel(self._rebalancing)
        self._sweeper = self._rebalancing = None
        for t in list(self._attaching):
            t.cancel()
        for conn in list(self.conns):
            conn.disconnect(mp.RC_SERVER_SHUTTING_DOWN, "server_stopping")

    async def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Until what the connections handed to the ingestor so far is durable and acked."""
        try:
            await wait_for(self.ingestor.flush(), timeout_s)
        except (TimeoutError, SpoolError) as exc:
            log.warning("MQTT: publishes read before a disconnect not committed: %s", exc)
            return False
        return True

    # ------------------------------------------------------------------ connections
    def _on_socket(self, sock: socket.socket) -> None:
        # One over the cap is let in to be told so in its CONNACK; beyond that, no
        # descriptor is spent: closed at once.
        if self.refusing or len(self.conns) + len(self._attaching) > self.max_connections:
            sock.close()
            self.metrics.disconnects.labels("too_many_connections").inc()
            self.bad.warning(
                "too_many_connections",
                "MQTT: connection refused at accept: %d open (max_connections %d)",
                len(self.conns), self.max_connections,
            )  # fmt: skip
            return
        task = asyncio.get_running_loop().create_task(self._attach(sock))
        self._attaching.add(task)
        task.add_done_callback(self._attaching.discard)

    async def _attach(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                lambda: MqttConnection(self),
                sock,
                ssl=self.ssl_context,
                ssl_handshake_timeout=self.limits.connect_timeout_s if self.ssl_context else None,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            sock.close()
            self.metrics.disconnects.labels("tls_handshake").inc()
            self.bad.warning("tls_handshake", "MQTT: connection failed before CONNECT: %s", exc)

    def add(self, conn: MqttConnection) -> None:
        self.conns.add(conn)
        self.metrics.connections.set(len(self.conns))
        self.metrics.connections_total.inc()
        self.changed.set()

    def remove(self, conn: MqttConnection, reason: str) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            self.metrics.connections.set(len(self.conns))
            self.metrics.disconnects.labels(reason).inc()
            self.changed.set()
        self.budget.release(conn)
        if self.by_id.get(conn.client_id) is conn:
            del self.by_id[conn.client_id]
        if conn.session is not None:
            self.sessions.detach(conn.client_id, conn.session)
            conn.session = None

    def on_connect(self, conn: MqttConnection, c: mp.Connect) -> bool:
        """Credentials, limits, client id, session; False when refused (and closed)."""
        conn.level = c.level
        codes = mp.CONNACK_V5 if c.level == 5 else mp.CONNACK_V3
        if self.refusing:
            return conn.refuse(codes["unavailable"], "server_shutting_down")
        verdict = self.auth.authenticate(c.username, c.password)
        if isinstance(verdict, str):
            missing = verdict == "auth_missing"
            self.bad.warning(
                verdict,
                "MQTT %s: %s (user %r, client id %r)",
                conn.peer,
                "no user name or password" if missing else "bad user name or password",
                c.username,
                c.client_id,
            )
            return conn.refuse(codes["not_authorized" if missing else "credentials"], verdict)
        role, user = verdict
        if len(self.conns) > self.max_connections:
            return conn.refuse(codes["unavailable"], "too_many_connections")
        props: dict[int, int | bytes] = {}
        client_id = c.client_id
        if not client_id:
            if not c.clean and c.level < 5:
                return conn.refuse(codes["identifier"], "bad_client_id")
            client_id = f"kelvin-auto-{next(self.ids)}"
            if c.level == 5:
                props[0x12] = client_id.encode()
        old = self.by_id.get(client_id)
        if old is not None and old is not conn and old.username != user:
            # Another user's live client id: not theirs to take over.
            self.bad.warning(
                "client_id_in_use",
                "MQTT %s: client id %r is in use by user %r; refused for user %r",
                conn.peer, client_id, old.username, user,
            )  # fmt: skip
            return conn.refuse(codes["identifier"], "client_id_in_use")
        conn.client_id = client_id
        conn.username = user
        conn.identity = self.auth.identity(role, user, client_id)
        conn.allowed = None if conn.identity.unrestricted else conn.identity.allowed
        conn.keepalive_s = c.keepalive_s
        self.take_over(conn)
        expiry_s, announce = self.sessions.expiry(c.level, c.clean, c.properties.get(0x11))
        session, present = self.sessions.open(client_id, user, c.clean, expiry_s)
        conn.session = session
        conn.awaiting_rel = session.awaiting_rel
        if c.level == 5:
            props.update({0x27: self.limits.max_packet_bytes, 0x25: 0, 0x28: 0, 0x29: 0, 0x2A: 0})
            if announce is not None:
                props[0x11] = announce
        conn.connected = True
        conn.connected_at_ns = time.time_ns()
        conn.connected_mono = time.monotonic()
        conn.write(mp.connack(present, 0, c.level, props))
        return True

    def take_over(self, conn: MqttConnection) -> None:
        old = self.by_id.get(conn.client_id)
        if old is not None and old is not conn:
            old.disconnect(mp.RC_SESSION_TAKEN_OVER, "session_taken_over")
        self.by_id[conn.client_id] = conn

    def _on_pressure(self, paused: bool) -> None:
        self.paused = paused
        for conn in self.conns:
            if paused:
                conn.pause("pressure")
            else:
                conn.resume("pressure")

    def clients(self) -> list[dict[str, Any]]:
        return sorted((c.info() for c in self.conns if c.connected), key=lambda d: d["client_id"])

    # ------------------------------------------------------------------ moving clients
    def movable(self) -> list[MqttConnection]:
        """Connected clients that may be asked to move, oldest first."""
        conns = [
            c for c in self.conns if c.connected and not c.closed and "moving" not in c.paused_by
        ]
        conns.sort(key=lambda c: c.connected_mono)
        return conns

    async def move(self, conns: Sequence[MqttConnection], reason: str) -> None:
        """Let clients go to another agent without losing what they sent: stop reading,
        commit and ack what was read, then DISCONNECT 0x9C (MQTT 5) or close."""
        if not conns:
            return
        for c in conns:
            c.pause("moving")
        await self.flush()
        for c in conns:
            c.disconnect(mp.RC_USE_ANOTHER_SERVER, reason)

    # ------------------------------------------------------------------ sweeper
    async def _sweep(self) -> None:
        lim = self.limits
        while True:
            await asyncio.sleep(min(1.0, lim.connect_timeout_s / 2, lim.stall_timeout_s / 2))
            now = time.monotonic()
            self.sessions.sweep()
            for conn in list(self.conns):
                if not conn.connected:
                    if now - conn.created > lim.connect_timeout_s:
                        self.bad.warning(
                            "connect_timeout",
                            "MQTT %s sent no CONNECT in %.0f s",
                            conn.peer,
                            lim.connect_timeout_s,
                        )
                        conn.close("connect_timeout")
                elif conn.stalled_inside_packet and now - conn.last_rx > lim.stall_timeout_s:
                    self.bad.warning(
                        "stalled_packet",
                        "MQTT %s (%s): %d of a %d-byte packet received, then nothing for %.0f s",
                        conn.peer, conn.client_id, conn.buffered_bytes, conn.pending_bytes,
                        lim.stall_timeout_s,
                    )  # fmt: skip
                    conn.disconnect(mp.RC_KEEPALIVE_TIMEOUT, "stalled_packet")
                elif (
                    conn.keepalive_s
                    and not conn.paused_by
                    and now - conn.last_rx > 1.5 * conn.keepalive_s
                ):
                    conn.disconnect(mp.RC_KEEPALIVE_TIMEOUT, "keepalive_timeout")
