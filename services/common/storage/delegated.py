"""The catalog half of the storage protocol, handed to a backend's ``catalog`` object.

Backends that keep metadata, virtual sensors and jobs in their own server
(InfluxDB, ClickHouse) do it in a catalog module with the same method names;
this mixin forwards the protocol's methods to it, so each backend states only
what differs.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from services.common.readings import Float64Array, Int64Array
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.base import VirtualResults


class Catalog(Protocol):
    async def get_metadata(self, sensor: str) -> SensorMetadata | None: ...
    async def put_metadata(self, meta: SensorMetadata) -> None: ...
    async def list_metadata(self, prefix: str) -> list[SensorMetadata]: ...
    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None: ...
    async def get_virtual(self, name: str) -> dict[str, Any] | None: ...
    async def list_virtual(self) -> dict[str, dict[str, Any]]: ...
    async def delete_virtual(self, name: str) -> bool: ...
    async def write_virtual_results(
        self, name: str, start_ns: int, end_ns: int, ts: Int64Array, vs: Float64Array, at: int
    ) -> None: ...
    async def read_virtual_results(
        self, name: str, start_ns: int, end_ns: int
    ) -> VirtualResults: ...
    async def drop_virtual(self, name: str, start_ns: int, end_ns: int) -> None: ...
    async def put_job(self, job: JobRecord) -> None: ...
    async def jobs(
        self, start_ns: int | None, end_ns: int | None, node: str | None
    ) -> list[JobRecord]: ...
    async def get_job(self, job_id: str, domain_id: str) -> JobRecord | None: ...


C = TypeVar("C", bound=Catalog)


class CatalogMethods(Generic[C]):
    """Mix in before :class:`~services.common.storage.base.StorageBackend`."""

    catalog: C

    async def get_metadata(self, sensor: str) -> SensorMetadata | None:
        return await self.catalog.get_metadata(sensor)

    async def put_metadata(self, meta: SensorMetadata) -> None:
        await self.catalog.put_metadata(meta)

    async def list_metadata(self, prefix: str = "/") -> list[SensorMetadata]:
        return await self.catalog.list_metadata(prefix)

    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None:
        await self.catalog.put_virtual(name, definition)

    async def get_virtual(self, name: str) -> dict[str, Any] | None:
        return await self.catalog.get_virtual(name)

    async def list_virtual(self) -> dict[str, dict[str, Any]]:
        return await self.catalog.list_virtual()

    async def delete_virtual(self, name: str) -> bool:
        return await self.catalog.delete_virtual(name)

    async def write_virtual_results(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        timestamps_ns: Int64Array,
        values: Float64Array,
        computed_at_ns: int,
    ) -> None:
        await self.catalog.write_virtual_results(
            name, start_ns, end_ns, timestamps_ns, values, computed_at_ns
        )

    async def read_virtual_results(self, name: str, start_ns: int, end_ns: int) -> VirtualResults:
        return await self.catalog.read_virtual_results(name, start_ns, end_ns)

    async def invalidate_virtual(self, name: str, start_ns: int, end_ns: int) -> None:
        await self.catalog.drop_virtual(name, start_ns, end_ns)

    async def put_job(self, job: JobRecord) -> None:
        await self.catalog.put_job(job)

    async def jobs(
        self, start_ns: int | None = None, end_ns: int | None = None, node: str | None = None
    ) -> list[JobRecord]:
        return await self.catalog.jobs(start_ns, end_ns, node)

    async def get_job(self, job_id: str, domain_id: str = "default") -> JobRecord | None:
        return await self.catalog.get_job(job_id, domain_id)
