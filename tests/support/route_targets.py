"""The services whose routes tests/test_auth_routes.py walks (see tests/support/route_walk.py).

Each is built as ``kelvin run <service>`` builds it, with the test tokens and reads
that need a token; the walk talks to its real ASGI app (middleware included) in process.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from tests.support.route_walk import Walk, asgi_client, auth_config, fastapi_routes, target


def _service_target(
    module: str, sections: Callable[[Path], dict[str, dict[str, Any]]]
) -> Callable[[Path], AbstractAsyncContextManager[Walk]]:
    """A walk over ``module.create_service`` built from ``sections(tmp_path)``."""

    @asynccontextmanager
    async def walk(tmp_path: Path) -> AsyncIterator[Walk]:
        create = importlib.import_module(module).create_service
        app = create(auth_config(tmp_path, sections(tmp_path))).http.app
        async with asgi_client(app) as c:
            yield fastapi_routes(app), c

    return walk


target("collect-agent")(
    _service_target(
        "services.collect_agent.app",
        lambda d: {
            "collect_agent": {"host": "127.0.0.1", "spool_dir": str(d / "spool")},
            "storage": {"sqlite": {"path": str(d / "agent.sqlite")}},
        },
    )
)
target("query-api")(
    _service_target(
        "services.query_api.app",
        lambda d: {
            "query_api": {"host": "127.0.0.1"},
            "storage": {"sqlite": {"path": str(d / "query.sqlite")}},
        },
    )
)
target("allocator")(
    _service_target(
        "services.allocator.app",
        lambda d: {"allocator": {"host": "127.0.0.1", "state_dir": str(d / "allocator")}},
    )
)
target("slurm-bridge")(
    _service_target(
        "services.slurm_bridge.app",
        # no Slurm is reached: the walk only talks to the bridge's HTTP app
        lambda d: {"slurm_bridge": {"host": "127.0.0.1", "token": "unused-slurm-jwt"}},
    )
)


@target("pusher")
@asynccontextmanager
async def pusher(tmp_path: Path) -> AsyncIterator[Walk]:
    """The pusher's own router (no web framework): a real pusher on a loopback port, its
    routes from ``services.pusher.api`` (the router the server dispatches on)."""
    import httpx

    from services.pusher.app import create_service
    from tests.support.route_walk import RouteInfo
    from tests.support.servers import free_port

    section = {
        "host": "127.0.0.1",
        "port": 0,
        "state_dir": str(tmp_path / "pusher"),
        "brokers": [f"127.0.0.1:{free_port()}"],  # none: the walk needs no broker
        "plugins": {"tester": {"sensors": 1}},
    }
    svc = create_service(auth_config(tmp_path, {"pusher": section}))
    await svc.start()
    try:
        routes = [RouteInfo(m, p, role) for m, p, role in svc.router.table()]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}") as c:
            yield routes, c
    finally:
        await svc.stop()
