"""Schemathesis over the query API's OpenAPI schema: generated requests never cause a 5xx.

Bounded: a few examples per operation, no deadline (the machine is shared).
The console's proxies (another engineer's routes, which reach other services)
are left out; everything else runs against a real SQLite storage with data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from services.common.metrics import ServiceMetrics
from services.common.readings import Batch
from services.common.sensors import SensorMetadata
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from services.query_api.app import create_app
from services.query_api.context import ApiContext
from services.query_api.settings import Settings
from services.query_api.virtual.define import VirtualIn
from services.query_api.virtual.engine import Engine
from tests.query_api.conftest import T0, S


async def _seed(storage: SqliteStorage, ctx: ApiContext) -> None:
    await storage.open()
    ctx.attach(storage)
    for r in range(2):
        name = f"/hall/row{r}/rack0/node0/power"
        await storage.write(Batch.single(name, T0 + np.arange(100) * S, np.linspace(100, 200, 100)))
        await storage.put_metadata(SensorMetadata(name=name, unit="W"))
    assert isinstance(ctx.virtual, Engine)
    await ctx.virtual.put("/hall/total", VirtualIn(expression='sum("/hall/*/rack0/node0/power")'))


SETTINGS = Settings(host="127.0.0.1", port=0, max_points=200_000)
CTX = ApiContext(SETTINGS, ServiceMetrics("query_api"))
APP = create_app(SETTINGS, CTX.metrics.registry, CTX)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path_regex=r"^/console|^/$")


@pytest.fixture(scope="module", autouse=True)
def seeded_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Real SQLite storage with readings, metadata and a virtual sensor behind the app."""
    storage = SqliteStorage(SqliteSettings(path=tmp_path_factory.mktemp("openapi") / "k.sqlite"))
    asyncio.run(_seed(storage, CTX))
    yield
    CTX.detach()
    asyncio.run(storage.close())


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case: Any) -> None:
    case.call_and_validate(checks=[not_a_server_error])
