"""Failure injection for the contract suite: make one write fail half-way.

Each backend fails where it really can: SQLite inside the write transaction
(after the batch is staged, before the commit), InfluxDB on the wire (the
connection drops after the first line-protocol request of a batch), the
ClickHouse on the wire too (every readings INSERT after the first of a batch,
which goes out in requests of 10 rows, loses its connection).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from services.common.storage import StorageBackend


@contextlib.contextmanager
def inject_write_failure(
    backend: StorageBackend, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    with monkeypatch.context() as m:
        _inject(backend, m)
        yield


def _inject(backend: StorageBackend, m: pytest.MonkeyPatch) -> None:
    if backend.kind == "sqlite":
        from services.common.storage.sqlite import SqliteStorage

        assert isinstance(backend, SqliteStorage)
        real = backend.store.stage

        def stage_then_fail(*args: Any, **kwargs: Any) -> None:
            real(*args, **kwargs)
            raise sqlite3.OperationalError("disk I/O error")

        m.setattr(backend.store, "stage", stage_then_fail)
        return
    if backend.kind == "influxdb":
        from services.common.storage.influxdb import InfluxStorage

        assert isinstance(backend, InfluxStorage)
        _drop_after_first_request(backend, m)
        return
    if backend.kind == "clickhouse":
        _drop_clickhouse_inserts_after_first(backend, m)
        return
    raise AssertionError(f"no failure injection for backend {backend.kind!r}")


def _drop_after_first_request(backend: Any, m: pytest.MonkeyPatch) -> None:
    """Split batches into requests of 10 lines; every request after the first
    fails with a dropped connection, and retries are quick."""
    import httpx

    m.setattr(
        backend.http,
        "settings",
        backend.http.settings.model_copy(update={"retries": 2, "backoff_s": 0.001}),
    )
    m.setattr(backend, "settings", backend.settings.model_copy(update={"write_lines": 10}))
    client = backend.http.client
    real = client.request
    calls = {"write": 0}

    async def flaky(method: str, url: str, **kw: Any) -> httpx.Response:
        if url == "/write":
            calls["write"] += 1
            if calls["write"] > 1:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response")
        return await real(method, url, **kw)

    m.setattr(client, "request", flaky)


def _drop_clickhouse_inserts_after_first(backend: Any, m: pytest.MonkeyPatch) -> None:
    import httpx

    http = backend.http
    m.setattr(http, "settings", http.settings.model_copy(update={"retries": 1, "backoff_s": 0.001}))
    m.setattr(backend, "settings", backend.settings.model_copy(update={"insert_rows": 10}))
    table = backend.schema.name()
    calls = {"insert": 0}
    for client in http.clients:
        real = client.post

        async def flaky(url: str, *, real: Any = real, **kw: Any) -> httpx.Response:
            if kw.get("params", {}).get("query", "").startswith(f"INSERT INTO {table} "):
                calls["insert"] += 1
                if calls["insert"] > 1:
                    raise httpx.RemoteProtocolError(
                        "Server disconnected without sending a response"
                    )
            return await real(url, **kw)

        m.setattr(client, "post", flaky)
