"""Storage: one async interface, backends chosen by configuration.

``open_storage(settings)`` returns a ready backend; see :mod:`.base` for the protocol.
"""

from __future__ import annotations

from collections.abc import Callable

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


def _sqlite(settings: StorageSettings) -> StorageBackend:
    from services.common.storage.sqlite import SqliteStorage

    return SqliteStorage(settings.sqlite)


BACKENDS: dict[str, Callable[[StorageSettings], StorageBackend]] = {
    "sqlite": _sqlite,
}
"""Backend name -> factory. Backends import lazily so unused drivers never load."""


def create_storage(settings: StorageSettings) -> StorageBackend:
    try:
        factory = BACKENDS[settings.backend]
    except KeyError:
        raise ConfigError(
            f"storage.backend {settings.backend!r} is not available; expected one of {', '.join(BACKENDS)}"
        ) from None
    return factory(settings)


async def open_storage(settings: StorageSettings) -> StorageBackend:
    """Create and open the configured backend."""
    backend = create_storage(settings)
    await backend.open()
    return backend
