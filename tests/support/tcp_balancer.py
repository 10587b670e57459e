"""A stand-in for a Kubernetes Service in front of collect agents (no cluster runs here).

kube-proxy sends each new connection to one ready endpoint picked at random and
leaves established connections alone; this proxy does the same on loopback, so
tests and benchmarks can add replicas behind one address the way a StatefulSet
scale-up adds endpoints to a Service.
"""

from __future__ import annotations

import asyncio
import contextlib
import random


class Balancer:
    """TCP proxy on a free loopback port; ``backends`` (ports) may change at any time."""

    def __init__(self, backends: list[int] | None = None, seed: int = 1) -> None:
        self.backends = list(backends or [])
        self.port = 0
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> Balancer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._pipes):
                t.cancel()
            await asyncio.gather(*self._pipes, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            if not self.backends:
                return
            port = self._rng.choice(self.backends)
            try:
                br, bw = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return
            try:
                await asyncio.gather(_pump(reader, bw), _pump(br, writer))
            finally:
                bw.close()
        finally:
            writer.close()
            self._pipes.discard(task)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    writer.close()
