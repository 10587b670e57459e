"""An MQTT "broker" on a loopback port that misbehaves on purpose (for stop and outage tests).

A real socket server speaking just enough MQTT (CONNACK in the client's version,
PUBACK, PINGRESP) to fail the way slow or dead brokers do:

- ``silent``: accepts TCP and reads, never answers (CONNECT hangs);
- ``unacked``: accepts CONNECT, never acknowledges a PUBLISH;
- ``stalls``: acknowledges everything until a PUBLISH larger than ``big`` bytes
  begins, then reads nothing more (the client's socket fills: its DISCONNECT can
  never go out).
"""

from __future__ import annotations

import asyncio


class MisbehavingBroker:
    """``async with MisbehavingBroker(mode) as b:`` listens on ``b.port``."""

    def __init__(self, mode: str, big: int = 1 << 20) -> None:
        assert mode in ("silent", "unacked", "stalls")
        self.mode = mode
        self.big = big
        self.connected = asyncio.Event()
        """Set once a CONNECT was answered."""
        self.published = asyncio.Event()
        """Set once a PUBLISH was read (and, in ``unacked``, left unanswered)."""
        self.stalled = asyncio.Event()
        """Set when a large PUBLISH began and reading stopped (``stalls``)."""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._hold = asyncio.Event()

    async def __aenter__(self) -> MisbehavingBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._hold.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        version = 4
        try:
            while True:
                head = (await reader.readexactly(1))[0]
                length = shift = 0
                while True:
                    byte = (await reader.readexactly(1))[0]
                    length |= (byte & 0x7F) << shift
                    shift += 7
                    if not byte & 0x80:
                        break
                kind = head >> 4
                if kind == 3 and self.mode == "stalls" and length > self.big:
                    self.stalled.set()
                    await self._hold.wait()  # read nothing more: the client's socket fills
                    return
                body = await reader.readexactly(length)
                if self.mode == "silent":
                    continue
                if kind == 1:  # CONNECT: answer in the client's protocol version
                    version = body[6]
                    writer.write(b"\x20\x03\x00\x00\x00" if version == 5 else b"\x20\x02\x00\x00")
                    self.connected.set()
                elif kind == 3:
                    self.published.set()
                    if head & 0x06 and self.mode == "stalls":  # QoS 1: PUBACK
                        topic_len = int.from_bytes(body[:2], "big")
                        writer.write(b"\x40\x02" + body[2 + topic_len : 4 + topic_len])
                elif kind == 12:  # PINGREQ
                    writer.write(b"\xd0\x00")
                elif kind == 14:  # DISCONNECT
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
