"""Kelvin's own HTTP server in tests: started on a free loopback port, always stopped."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from services.common.http import HttpServer


@contextlib.asynccontextmanager
async def serving(server: HttpServer) -> AsyncIterator[int]:
    """Start ``server`` (built with port 0) and give its port; stop it on the way out."""
    await server.start()
    try:
        assert server.port is not None
        yield server.port
    finally:
        await server.stop()
