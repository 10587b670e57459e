"""The storage protocol every backend implements (SQLite, InfluxDB, ClickHouse).

All methods are async. Times are int64 ns since the epoch; ranges are
half-open ``[start_ns, end_ns)`` (so a reading at int64's largest value, which
no range reaches, is rejected). Writes are idempotent: a reading with the
same sensor and timestamp as a stored one replaces it (last write wins), so a
redelivered batch never duplicates. Values are any float64, NaN and +-inf
included. Failures raise
:class:`~services.common.errors.RetryableStorageError` (try later) or
:class:`~services.common.errors.PermanentStorageError` (do not retry).

Several instances may open the same store at once (the collect agent writes
while the query API reads, in one process or two); each sees the others'
committed writes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from services.common import names as _names
from services.common.errors import PermanentStorageError, SensorNameError
from services.common.readings import Batch, Float64Array, Int64Array, Series
from services.common.sensors import JobRecord, SensorMetadata


@dataclass(frozen=True, slots=True)
class Child:
    """One entry when browsing the hierarchy under a prefix."""

    name: str
    """Full name, e.g. ``/dc/row0`` under prefix ``/dc``."""
    is_sensor: bool
    """Readings (or metadata) are stored under exactly this name."""
    has_children: bool
    """Names exist below it."""


def check_names(sensors: Sequence[str], backend: str) -> None:
    """Reject a batch with any invalid sensor name, before anything of it is stored."""
    try:
        for n in set(sensors):
            _names.validate(n)
    except SensorNameError as exc:
        raise PermanentStorageError(f"{backend}: batch rejected, nothing stored: {exc}") from exc


def children_of(all_names: Sequence[str], prefix: str) -> list[Child]:
    """Direct children of ``prefix`` among sensor names (every backend lists this way)."""
    kids: dict[str, list[bool]] = {}
    for n in all_names:
        c = _names.child_of(n, prefix)
        if c is None:
            continue
        entry = kids.setdefault(c, [False, False])
        entry[0 if n == c else 1] = True
    return [Child(k, v[0], v[1]) for k, v in sorted(kids.items())]


@dataclass(frozen=True, slots=True)
class VirtualResults:
    """Stored results of a virtual sensor that intersect a requested range."""

    covered: list[tuple[int, int]]
    """Sorted, non-overlapping ``[start, end)`` sub-ranges that were computed and stored."""
    series: Series
    """Stored points inside the requested range (within ``covered``)."""
    computed_at_ns: list[int] = field(default_factory=list)
    """Wall-clock time each covered range was computed (parallel to ``covered``)."""


class StorageBackend(ABC):
    """The one storage interface of Kelvin."""

    kind: ClassVar[str] = "abstract"
    atomic_writes: ClassVar[bool] = True
    """True: a failed :meth:`write` stored nothing of its batch. False: part of
    it may be stored (at-least-once); the caller retries the whole batch, which
    is idempotent."""

    # ------------------------------------------------------------------ lifecycle
    @abstractmethod
    async def open(self) -> None:
        """Connect / create the schema. Raise RetryableStorageError if unreachable."""

    @abstractmethod
    async def close(self) -> None:
        """Flush and release connections. Idempotent."""

    async def ping(self) -> bool:
        """True when the backend answers (readiness)."""
        return True

    # ------------------------------------------------------------------ readings
    @abstractmethod
    async def write(self, batch: Batch) -> None:
        """Store every reading of ``batch`` idempotently (all or nothing where
        :attr:`atomic_writes`). An invalid sensor name anywhere in the batch rejects
        the whole batch before anything is stored (PermanentStorageError)."""

    @abstractmethod
    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        """Readings of one sensor in ``[start_ns, end_ns)``, ascending, no duplicates.

        An unknown sensor gives an empty series; use :meth:`has_sensor` to tell apart.
        """

    async def read_many(
        self, sensors: Sequence[str], start_ns: int, end_ns: int
    ) -> dict[str, Series]:
        """Several sensors at once (backends override to fan out / batch); every
        requested name is a key of the result (empty series when unknown)."""
        return {s: await self.read(s, start_ns, end_ns) for s in sensors}

    async def cut_points(self, sensor: str, start_ns: int, end_ns: int) -> list[int]:
        """Times in ``(start_ns, end_ns)`` at which stored blocks of ``sensor`` begin, in
        order: a range read in slices cut there decodes each block once (where blocks do
        not overlap). Empty where the backend keeps no such blocks (the caller then cuts
        where it likes).

        Optional: backends that read any cut at the same cost keep this default."""
        return []

    @abstractmethod
    async def latest(self, sensor: str) -> tuple[int, float] | None:
        """The newest stored reading of a sensor, or None."""

    async def read_aggregated(
        self, sensor: str, start_ns: int, end_ns: int, interval_ns: int, op: str
    ) -> Series | None:
        """Buckets of ``interval_ns`` (aligned to the epoch) of ``op`` (min, max, avg,
        sum, count; NaN left out, empty buckets omitted) over ``[start_ns, end_ns)``
        from pre-aggregated data, or None when the backend has none that answers
        exactly this (the caller then reads and resamples the raw readings).

        Optional: backends without rollups keep this default."""
        return None

    # ------------------------------------------------------------------ hierarchy
    @abstractmethod
    async def has_sensor(self, sensor: str) -> bool:
        """A sensor with readings or metadata exists under exactly this name."""

    @abstractmethod
    async def sensors(self, prefix: str = "/") -> list[str]:
        """Every sensor name under ``prefix`` (inclusive), sorted."""

    @abstractmethod
    async def children(self, prefix: str = "/") -> list[Child]:
        """Direct children of ``prefix`` in the hierarchy, sorted by name."""

    # ------------------------------------------------------------------ metadata
    @abstractmethod
    async def get_metadata(self, sensor: str) -> SensorMetadata | None: ...

    @abstractmethod
    async def put_metadata(self, meta: SensorMetadata) -> None:
        """Create or merge: fields set in ``meta`` replace stored ones."""

    @abstractmethod
    async def list_metadata(self, prefix: str = "/") -> list[SensorMetadata]: ...

    # ------------------------------------------------------------------ virtual sensors
    @abstractmethod
    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None:
        """Store a virtual-sensor definition (opaque JSON-able dict, owned by the query API)."""

    @abstractmethod
    async def get_virtual(self, name: str) -> dict[str, Any] | None: ...

    @abstractmethod
    async def list_virtual(self) -> dict[str, dict[str, Any]]: ...

    @abstractmethod
    async def delete_virtual(self, name: str) -> bool:
        """Delete a definition and its stored results; False if it did not exist."""

    @abstractmethod
    async def write_virtual_results(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        timestamps_ns: Int64Array,
        values: Float64Array,
        computed_at_ns: int,
    ) -> None:
        """Replace stored points in ``[start_ns, end_ns)`` by these and mark the range
        covered (points outside it are ignored)."""

    @abstractmethod
    async def read_virtual_results(self, name: str, start_ns: int, end_ns: int) -> VirtualResults:
        """Stored coverage and points intersecting ``[start_ns, end_ns)``."""

    @abstractmethod
    async def invalidate_virtual(self, name: str, start_ns: int, end_ns: int) -> None:
        """Forget stored results (coverage and points) inside ``[start_ns, end_ns)``."""

    @abstractmethod
    async def modified_since(self, sensors: Sequence[str], since_ns: int) -> dict[str, int]:
        """For sensors written to after wall-clock ``since_ns``: the smallest reading
        timestamp among those writes (a :meth:`delete_range` counts as a write from
        its start). Lets the query API find late data that invalidates stored
        virtual results.

        Conservative: a backend may report a timestamp earlier than the true one
        (by at most a few seconds, or each sensor's earliest reading when
        ``since_ns`` is older than its write log) and, on InfluxDB, rarely a
        sensor that was not written; it never misses a write."""

    # ------------------------------------------------------------------ jobs
    @abstractmethod
    async def put_job(self, job: JobRecord) -> None:
        """Create or update (job start, then job end) by (domain_id, job_id)."""

    @abstractmethod
    async def jobs(
        self, start_ns: int | None = None, end_ns: int | None = None, node: str | None = None
    ) -> list[JobRecord]:
        """Jobs overlapping ``[start_ns, end_ns)`` (running jobs overlap any later time)."""

    @abstractmethod
    async def get_job(self, job_id: str, domain_id: str = "default") -> JobRecord | None:
        """One job by (domain_id, job_id), as :meth:`jobs` gives it, or None; found by its
        key, not by reading every job."""

    # ------------------------------------------------------------------ retention
    @abstractmethod
    async def delete_range(self, sensor: str, start_ns: int, end_ns: int) -> int:
        """Delete readings of one sensor in a range; returns how many stored points
        were removed (or -1 if the backend cannot tell). Logged for
        :meth:`modified_since`, so virtual results computed from the deleted
        readings are recomputed; truncation and retention are not (results over
        readings aged out stay as history)."""

    @abstractmethod
    async def truncate_before(self, ts_ns: int, prefix: str = "/") -> int:
        """Delete every reading older than ``ts_ns`` under ``prefix``; count as
        :meth:`delete_range`."""

    @abstractmethod
    async def apply_retention(self, now_ns: int) -> int:
        """Delete readings older than each sensor's ``ttl_ms`` (from its metadata)
        at wall-clock ``now_ns``; count as :meth:`delete_range`."""

    @abstractmethod
    async def stats(self) -> dict[str, Any]:
        """Sizes and counts for operators (``kelvin config db stats``)."""
