"""Virtual-sensor evaluation (placeholder until the engine lands)."""

from __future__ import annotations

from typing import Any

from services.common.errors import NotFoundError
from services.common.readings import Series
from services.common.storage.base import StorageBackend


class Engine:
    def __init__(self, storage: StorageBackend, catalog: Any, settings: Any, metrics: Any) -> None:
        self.storage = storage

    async def evaluate(self, name: str, start_ns: int, end_ns: int) -> Series:
        raise NotFoundError(f"virtual sensor {name!r} cannot be evaluated yet")
