"""Storage: one async interface, backends chosen by configuration.

``open_storage(settings)`` returns a ready backend; see :mod:`.base` for the protocol.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from services.common.errors import ConfigError
from services.common.storage.base import Child, StorageBackend, VirtualResults
from services.common.storage.settings import StorageSettings

__all__ = [
    "BACKENDS",
    "Child",
    "StorageBackend",
    "StorageSettings",
    "VirtualResults",
    "create_storage",
    "open_storage",
]


Factory = Callable[[StorageSettings, CollectorRegistry | None], StorageBackend]


def _sqlite(settings: StorageSettings, registry: CollectorRegistry | None) -> StorageBackend:
    from services.common.storage.sqlite import SqliteStorage

    return SqliteStorage(settings.sqlite, registry)


def _influxdb(settings: StorageSettings, registry: CollectorRegistry | None) -> StorageBackend:
    from services.common.storage.influxdb import InfluxStorage

    return InfluxStorage(settings.influxdb, registry)


def _clickhouse(settings: StorageSettings, registry: CollectorRegistry | None) -> StorageBackend:
    from services.common.storage.clickhouse import ClickHouseStorage

    return ClickHouseStorage(settings.clickhouse, registry)


BACKENDS: dict[str, Factory] = {
    "sqlite": _sqlite,
    "influxdb": _influxdb,
    "clickhouse": _clickhouse,
}
"""Backend name -> factory. Backends import lazily so unused drivers never load."""


def create_storage(
    settings: StorageSettings, registry: CollectorRegistry | None = None
) -> StorageBackend:
    """The configured backend, not yet open; its ``kelvin_storage_*`` metrics go to
    ``registry`` (the calling service's) when given."""
    try:
        factory = BACKENDS[settings.backend]
    except KeyError:
        raise ConfigError(
            f"storage.backend {settings.backend!r} is not available; expected one of {', '.join(BACKENDS)}"
        ) from None
    return factory(settings, registry)


async def open_storage(
    settings: StorageSettings, registry: CollectorRegistry | None = None
) -> StorageBackend:
    """Create and open the configured backend."""
    backend = create_storage(settings, registry)
    await backend.open()
    return backend
