"""What every route needs: settings, metrics, storage and the objects built on it.

Storage opens when the service starts (``QueryApiService.open``), after the
app exists, so routes reach it through :class:`ApiContext` at request time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common.errors import RetryableStorageError
from services.common.metrics import ServiceMetrics
from services.common.storage.base import StorageBackend
from services.query_api.catalog import Catalog
from services.query_api.query import Reader, VirtualSource
from services.query_api.settings import Settings

if TYPE_CHECKING:
    from services.common.auth_settings import ServiceAuth

READY = (True, "ready, storage answers")


class ApiMetrics:
    """The query API's own Prometheus metrics."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.registry = metrics
        self.requests = metrics.counter(
            "requests_total", "API requests answered, by route", ["route"]
        )
        self.rejects = metrics.counter(
            "rejects_total", "Requests refused as bad input, by reason", ["reason"]
        )
        self.points = metrics.counter("points_served_total", "Readings sent in responses")
        self.spilled = metrics.counter(
            "answers_spilled_total",
            "Streamed answers whose held part went to a temporary file (response_memory_bytes)",
        )
        self.refused = metrics.counter(
            "queries_refused_total",
            "Data queries refused because max_heavy_queries were running already",
            ["reason"],
        )
        self.virtual_computed = metrics.counter(
            "virtual_points_computed_total", "Virtual-sensor points computed from inputs"
        )
        self.virtual_reused = metrics.counter(
            "virtual_points_reused_total", "Virtual-sensor points served from stored results"
        )
        self.virtual_store_errors = metrics.counter(
            "virtual_store_errors_total", "Virtual-sensor results that could not be stored"
        )
        self.virtual_invalidations = metrics.counter(
            "virtual_invalidations_total", "Stored virtual ranges dropped because inputs changed"
        )


class ApiContext:
    """Shared state of one query API instance."""

    def __init__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        storage: StorageBackend | None = None,
        auth: ServiceAuth | None = None,
    ) -> None:
        self.settings = settings
        self.auth = auth
        """Credentials of this service (its own read token calls the allocator and agent)."""
        self.metrics = ApiMetrics(metrics)
        self._storage: StorageBackend | None = None
        self._catalog: Catalog | None = None
        self._reader: Reader | None = None
        self.virtual: VirtualSource | None = None
        self.rules: Any = None
        """The rule manager (services/query_api/rules), once the service started it."""
        self.readiness: tuple[bool, str] = (storage is not None, "storage not open yet")
        """What ``/readyz`` says: kept current by the service's storage watch."""
        self.profile = "run"
        """How Kelvin was started (``Config.profile``): ``run``, ``up`` or ``demo``."""
        self.configured_virtual: set[str] = set()
        """Virtual sensors the configuration defines (defined again at every start)."""
        if storage is not None:
            self.attach(storage)

    def attach(self, storage: StorageBackend) -> None:
        """Use ``storage`` from now on (called once it is open)."""
        from services.query_api.virtual.engine import Engine

        self._storage = storage
        self.readiness = READY
        self._catalog = Catalog(storage)
        engine = Engine(storage, self._catalog, self.settings, self.metrics)
        self.virtual = engine
        self._reader = Reader(storage, self._catalog, engine, self.settings.max_points)

    async def aclose(self) -> None:
        """Finish background work (stores of virtual results), then detach."""
        from services.query_api.virtual.engine import Engine

        if isinstance(self.virtual, Engine):
            await self.virtual.close()
        self.detach()

    def detach(self) -> None:
        self._storage = self._catalog = self._reader = None
        self.virtual = None
        self.readiness = (False, "storage not open")

    @property
    def storage(self) -> StorageBackend:
        if self._storage is None:
            raise self._no_storage()
        return self._storage

    def _no_storage(self) -> RetryableStorageError:
        """Why there is no storage yet, as ``/readyz`` says it (the console shows this)."""
        return RetryableStorageError(f"query API: storage is not open ({self.readiness[1]})")

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            raise self._no_storage()
        return self._catalog

    @property
    def reader(self) -> Reader:
        if self._reader is None:
            raise self._no_storage()
        return self._reader
