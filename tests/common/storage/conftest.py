"""Fixtures: every storage backend behind one parametrised ``store`` fixture.

``store`` is a :class:`Store`: ``await store.open()`` gives a backend
instance, and every call opens another instance on the same data (same
SQLite file, same InfluxDB database), as the collect agent and the query API
do. InfluxDB servers are real ``influxd`` processes, started once per session;
each test gets its own database.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from services.common.storage import BACKENDS as REGISTRY
from services.common.storage import StorageBackend, StorageSettings, create_storage
from tests.support.clickhouse import (  # noqa: F401 (session fixtures)
    ClickHouse,
    clickhouse_cluster,
    clickhouse_server,
)
from tests.support.influxdb import InfluxDB

_db_ids = itertools.count()

BACKENDS = [k for k in ("sqlite", "influxdb", "clickhouse") if k in REGISTRY]


@pytest.fixture(scope="session")
def influx_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[InfluxDB]]:
    """A real influxd process."""
    servers: list[InfluxDB] = []
    try:
        servers.append(InfluxDB(tmp_path_factory.mktemp("influxdb")).start())
        yield servers
    finally:
        for s in servers:
            s.stop()


class Store:
    """Opens backend instances over one test's data."""

    def __init__(self, kind: str, make: Callable[[], StorageBackend]) -> None:
        self.kind = kind
        self._make = make
        self.opened: list[StorageBackend] = []

    async def open(self) -> StorageBackend:
        backend = self._make()
        if backend.kind == "sqlite":
            shrink_sqlite(backend)
        await backend.open()
        self.opened.append(backend)
        return backend

    async def close(self) -> None:
        for b in self.opened:
            await b.close()


def shrink_sqlite(backend: StorageBackend) -> None:
    """Tiny chunks and frequent compaction, so that small tests cross every code path."""
    from services.common.storage.sqlite import SqliteStorage

    assert isinstance(backend, SqliteStorage)
    backend.store.seal_points = 64
    backend.store.fanout = 3
    backend.settings = backend.settings.model_copy(
        update={"compact_writes": 3, "compact_readings": 200}
    )


def storage_settings(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> StorageSettings:
    if kind == "sqlite":
        return StorageSettings(backend="sqlite", sqlite={"path": tmp_path / "kelvin.sqlite"})
    db = f"test_{next(_db_ids)}"
    if kind == "influxdb":
        servers: list[InfluxDB] = request.getfixturevalue("influx_servers")
        return StorageSettings(backend="influxdb", influxdb=servers[0].settings(db))
    server: ClickHouse = request.getfixturevalue("clickhouse_server")
    return StorageSettings(backend="clickhouse", clickhouse=server.settings(db))


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    kind = request.param
    settings = storage_settings(kind, tmp_path, request)
    s = Store(kind, lambda: create_storage(settings))
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def backend(store: Store) -> StorageBackend:
    """One open instance of the parametrised backend."""
    return await store.open()
