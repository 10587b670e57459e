"""Session fixtures: one real Prometheus and one Kelvin query API over the same samples.

Prometheus gets the dataset through ``promtool tsdb create-blocks-from openmetrics``;
Kelvin through its storage (a SQLite file), then ``kelvin run query-api`` serves it
in its own process, as in production.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.common.readings import Batch, Series
from services.common.storage import open_storage
from services.common.storage.settings import StorageSettings
from tests.query_api.promql import dataset
from tests.support.auth import write_config_yaml
from tests.support.prometheus import KelvinService, Prometheus, openmetrics
from tests.support.servers import free_port


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    p = Prometheus(tmp_path_factory.mktemp("prometheus"))
    p.backfill(openmetrics(dataset.prometheus_series()))
    p.start()
    try:
        yield p.url
    finally:
        p.stop()


async def _fill(path: Path) -> None:
    storage = await open_storage(StorageSettings(sqlite={"path": str(path)}))
    try:
        batch = Batch.from_series(Series(n, ts, vs) for n, (ts, vs) in dataset.samples().items())
        await storage.write(batch)
    finally:
        await storage.close()


@pytest.fixture(scope="session")
def kelvin_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("kelvin-promql")
    db = d / "kelvin.sqlite"
    asyncio.run(_fill(db))
    port = free_port()
    config = f"query_api:\n  host: 127.0.0.1\n  port: {port}\nstorage:\n  sqlite:\n    path: {db}\n"
    config += write_config_yaml()
    svc = KelvinService(d, "query-api", config, port).start()
    try:
        assert httpx.get(f"{svc.url}/readyz", timeout=10).status_code == 200
        yield svc.url
    finally:
        svc.stop()
