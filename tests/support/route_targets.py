"""The services whose routes tests/test_auth_routes.py walks (see tests/support/route_walk.py).

Each is built as ``kelvin run <service>`` builds it, with the test tokens and reads
that need a token; the walk talks to its real ASGI app (middleware included) in process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.route_walk import Walk, asgi_client, auth_config, fastapi_routes, target


@target("collect-agent")
@asynccontextmanager
async def collect_agent(tmp_path: Path) -> AsyncIterator[Walk]:
    from services.collect_agent.app import create_service

    cfg = auth_config(
        tmp_path,
        {
            "collect_agent": {"host": "127.0.0.1", "spool_dir": str(tmp_path / "spool")},
            "storage": {"sqlite": {"path": str(tmp_path / "agent.sqlite")}},
        },
    )
    app = create_service(cfg).http.app
    async with asgi_client(app) as c:
        yield fastapi_routes(app), c


@target("query-api")
@asynccontextmanager
async def query_api(tmp_path: Path) -> AsyncIterator[Walk]:
    from services.query_api.app import create_service

    cfg = auth_config(
        tmp_path,
        {
            "query_api": {"host": "127.0.0.1"},
            "storage": {"sqlite": {"path": str(tmp_path / "query.sqlite")}},
        },
    )
    app = create_service(cfg).http.app
    async with asgi_client(app) as c:
        yield fastapi_routes(app), c


@target("allocator")
@asynccontextmanager
async def allocator(tmp_path: Path) -> AsyncIterator[Walk]:
    from services.allocator.app import create_service

    cfg = auth_config(
        tmp_path,
        {"allocator": {"host": "127.0.0.1", "state_dir": str(tmp_path / "allocator")}},
    )
    app = create_service(cfg).http.app
    async with asgi_client(app) as c:
        yield fastapi_routes(app), c
