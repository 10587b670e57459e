"""A bare asyncio MQTT client for tests: sends exact bytes, reads exact answers."""

from __future__ import annotations

import asyncio
import contextlib

from services.collect_agent import mqtt_packets as mp
from tests.support.auth import MQTT_LOGIN


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(
        cls, port: int, client_id: str = "raw", level: int = 4, login: bool = True, **kw: object
    ) -> tuple[RawClient, tuple[int, bytes]]:
        """CONNECT and read the answer; logs in with the test admin token unless ``login``
        is false or ``username``/``password`` are given."""
        if login and "username" not in kw and "password" not in kw:
            kw.update(MQTT_LOGIN)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        await client.send(mp.connect(client_id, level=level, **kw))  # type: ignore[arg-type]
        return client, await client.read()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read(self, wait_s: float = 10.0) -> tuple[int, bytes]:
        """(first byte, body) of the next packet from the server."""
        head = await asyncio.wait_for(self.reader.readexactly(1), wait_s)
        length, shift = 0, 0
        while True:
            b = (await asyncio.wait_for(self.reader.readexactly(1), wait_s))[0]
            length |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        body = await asyncio.wait_for(self.reader.readexactly(length), wait_s) if length else b""
        return head[0], body

    async def closed(self, wait_s: float = 10.0) -> bool:
        """True when the server closes the connection (EOF) within ``wait_s``."""
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), wait_s)
        except (ConnectionResetError, BrokenPipeError):
            return True
        while data:
            data = await asyncio.wait_for(self.reader.read(1 << 16), wait_s)
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await self.writer.wait_closed()
