"""Connections follow the replicas: agents above their fair share ask clients to move.

Pushers hold one long-lived connection through the collect-agent Service, so
a replica added by ``kubectl scale`` or the HPA would get none until pushers
happen to reconnect. Every ``interval_s`` each agent reads its peers' open
connections (their public ``/metrics``), from a static list of URLs and/or the
addresses a DNS name resolves to (the StatefulSet's headless Service). With
``total`` connections over ``n`` answering agents the fair share is
``ceil(total / n)``; an agent holding more than that plus a tolerance asks the
excess to move, oldest connections first, at most ``rate_per_s`` a second: its
reads stop, what it sent is committed and acknowledged, then MQTT 5 clients get
DISCONNECT 0x9C (use another server) and 3.1.1 clients a plain close. They
reconnect through the Service, which spreads them. Connections older than
``max_age_s`` (each with up to 10 % jitter) are moved the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from services.collect_agent.mqtt_connection import MqttConnection
    from services.collect_agent.mqtt_server import MqttServer

log = logging.getLogger(__name__)

_OPEN = re.compile(rb"^kelvin_collect_agent_mqtt_connections_open (\S+)$", re.M)


def own_addresses() -> set[str]:
    """This host's addresses, to skip itself among the addresses of a DNS name."""
    out = {"127.0.0.1", "::1"}
    with contextlib.suppress(OSError):
        out.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return out


class Peers:
    """The other agents' HTTP base URLs: a static list plus a DNS name's addresses."""

    def __init__(self, urls: Sequence[str], dns_name: str | None, http_port: int) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.dns_name = dns_name
        self.http_port = http_port
        self._own = own_addresses() if dns_name else set()

    async def resolve(self) -> list[str]:
        urls = list(self.urls)
        if self.dns_name:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(
                    self.dns_name, self.http_port, type=socket.SOCK_STREAM
                )
            except OSError as exc:
                log.debug("peers: cannot resolve %s: %s", self.dns_name, exc)
                infos = []
            for addr in sorted({str(i[4][0]) for i in infos} - self._own):
                host = f"[{addr}]" if ":" in addr else addr
                urls.append(f"http://{host}:{self.http_port}")
        return urls


async def peer_connections(client: httpx.AsyncClient, urls: Sequence[str]) -> list[int]:
    """Open MQTT connections of every peer that answered."""

    async def one(url: str) -> int | None:
        try:
            r = await client.get(f"{url}/metrics")
        except httpx.HTTPError:
            return None
        m = _OPEN.search(r.content) if r.status_code == 200 else None
        return int(float(m.group(1))) if m else None

    found = await asyncio.gather(*(one(u) for u in urls))
    return [n for n in found if n is not None]


def excess(own: int, peers: Sequence[int], tolerance: float) -> tuple[int, int]:
    """(connections to move, fair share) for an agent holding ``own``."""
    fair = math.ceil((own + sum(peers)) / (1 + len(peers)))
    slack = max(1, math.ceil(fair * tolerance))
    return (own - fair if own > fair + slack else 0), fair


class Rebalancer:
    """The loop described in the module docstring."""

    def __init__(
        self,
        server: MqttServer,
        peers: Peers | None,
        interval_s: float = 5.0,
        rate_per_s: float = 10.0,
        tolerance: float = 0.1,
        max_age_s: float | None = None,
    ) -> None:
        self.server = server
        self.peers = peers
        self.interval_s = interval_s
        self.rate_per_s = rate_per_s
        self.tolerance = tolerance
        self.max_age_s = max_age_s
        self._burst = max(1.0, rate_per_s * interval_s)
        self._tokens = self._burst
        self._last = time.monotonic()

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=min(2.0, self.interval_s * 2)) as client:
            while True:
                await asyncio.sleep(self.interval_s)
                try:
                    await self.step(client)
                except Exception:  # a bug here must not stop ingest
                    log.exception("MQTT rebalancing step failed")

    def _take(self, wanted: int) -> int:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        n = min(wanted, int(self._tokens))
        self._tokens -= n
        return n

    async def step(self, client: httpx.AsyncClient) -> None:
        conns = self.server.movable()
        if not conns:
            return
        now = time.monotonic()
        aged: list[MqttConnection] = []
        if self.max_age_s is not None:
            limit = self.max_age_s
            aged = [c for c in conns if now - c.connected_mono > limit * (1 + c.age_jitter)]
        over = 0
        if self.peers is not None:
            counts = await peer_connections(client, await self.peers.resolve())
            if counts:
                over, fair = excess(len(self.server.conns), counts, self.tolerance)
                if over:
                    log.info(
                        "MQTT: %d connections here, fair share %d over %d agents: "
                        "asking %d clients to use another agent",
                        len(self.server.conns), fair, 1 + len(counts), over,
                    )  # fmt: skip
        n = self._take(max(over, len(aged)))
        if not n:
            return
        picked = aged[:n]
        if len(picked) < n:
            chosen = set(picked)
            picked += [c for c in conns if c not in chosen][: n - len(picked)]
        by_age = set(aged)
        await self.server.move([c for c in picked if c in by_age], "max_age")
        await self.server.move([c for c in picked if c not in by_age], "rebalance")
