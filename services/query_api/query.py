"""One query: read a sensor (stored or virtual), convert units, apply operations, resample.

The REST readings route, the Grafana data source and the Prometheus API all
answer through :func:`run`, so the three agree on every number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from services.common.errors import KelvinError, NotFoundError
from services.common.readings import Float64Array, Int64Array, Series
from services.common.storage.base import StorageBackend
from services.common.times import format_iso_short
from services.query_api import limits, operations, units
from services.query_api.catalog import Catalog
from services.query_api.spec import TRANSFORMS, Modifier, Spec


class QueryError(KelvinError, ValueError):
    """A query that cannot be answered as asked (bad interval, too many points)."""


def check_range(start_ns: int, end_ns: int) -> None:
    """QueryError, naming both times in ISO 8601, unless start is before end."""
    if end_ns <= start_ns:
        raise QueryError(
            f"empty time range: start {format_iso_short(start_ns)} is not before end {format_iso_short(end_ns)}"
        )


class VirtualSource(Protocol):
    async def evaluate(self, name: str, start_ns: int, end_ns: int) -> Series: ...


@dataclass(frozen=True, slots=True)
class Result:
    """The answer for one sensor."""

    sensor: str
    label: str
    """CSV value column (DCDB's: ``Value``, ``Delta``, ``avg``...)."""
    unit: str
    timestamps_ns: Int64Array
    values: Float64Array

    def __len__(self) -> int:
        return int(self.timestamps_ns.shape[0])


class Reader:
    """Reads stored or virtual sensors and runs specifications on them."""

    def __init__(
        self,
        storage: StorageBackend,
        catalog: Catalog,
        virtual: VirtualSource | None = None,
        max_points: int = 50_000_000,
    ) -> None:
        self.storage, self.catalog, self.virtual = storage, catalog, virtual
        self.max_points = max_points

    async def series(self, name: str, start_ns: int, end_ns: int, streamed: bool = False) -> Series:
        """Readings of a stored or virtual sensor in ``[start_ns, end_ns)``, charged to the
        request's memory budget unless ``streamed`` (a slice let go once sent)."""
        if self.virtual is not None and await self.catalog.virtual(name) is not None:
            series = await self.virtual.evaluate(name, start_ns, end_ns)
            if not streamed:
                limits.charge(len(series), name)
            return series
        if streamed:
            return await self.storage.read(name, start_ns, end_ns)
        return await limits.read_within(self.storage, name, start_ns, end_ns)

    async def cut_points(self, name: str, start_ns: int, end_ns: int) -> list[int]:
        """Where a stored sensor's blocks begin in ``(start_ns, end_ns)``
        (``storage.cut_points``); none for a virtual sensor, evaluated at any cut."""
        if self.virtual is not None and await self.catalog.virtual(name) is not None:
            return []
        return await self.storage.cut_points(name, start_ns, end_ns)

    async def resolve(self, spec: Spec) -> list[str]:
        """The sensors a specification names; NotFoundError when there are none."""
        if spec.has_wildcard:
            found = await self.catalog.expand(spec.sensor)
            if not found:
                raise NotFoundError(f"no sensor matches {spec.sensor!r}")
            return found
        if not await self.catalog.exists(spec.sensor):
            raise NotFoundError(await self.catalog.missing(spec.sensor))
        return [spec.sensor]

    async def run(
        self,
        spec: Spec,
        start_ns: int,
        end_ns: int,
        interval_ns: int | None = None,
        bucket: str = "avg",
    ) -> list[Result]:
        """Answer a specification for every sensor it names."""
        check_range(start_ns, end_ns)
        if interval_ns is not None and interval_ns <= 0:
            raise QueryError(f"interval must be positive, got {interval_ns} ns")
        out = []
        for name in await self.resolve(spec):
            rolled = await self._rolled_up(spec, name, start_ns, end_ns, interval_ns, bucket)
            if rolled is not None:
                out.append(rolled)
                continue
            raw = await self.series(name, start_ns, end_ns)
            if len(raw) > self.max_points:
                raise QueryError(
                    f"{name}: {len(raw)} readings in range, more than max_points "
                    f"{self.max_points}; narrow the range or resample with interval"
                )
            unit = await self.catalog.unit(name) or ""
            out.append(apply(spec, name, unit, raw, start_ns, interval_ns, bucket))
        return out

    async def _rolled_up(
        self,
        spec: Spec,
        name: str,
        start_ns: int,
        end_ns: int,
        interval_ns: int | None,
        bucket: str,
    ) -> Result | None:
        """A plain resample of a stored sensor answered from the backend's rollups, if it
        has any that fit (same buckets as :func:`operations.aggregate` on the readings)."""
        if interval_ns is None or spec.operations or spec.input_mod is not None:
            return None
        if self.virtual is not None and await self.catalog.virtual(name) is not None:
            return None
        got = await self.storage.read_aggregated(name, start_ns, end_ns, interval_ns, bucket)
        if got is None:
            return None
        unit = "" if bucket == "count" else await self.catalog.unit(name) or ""
        vs, unit = _modify(got.values, unit, spec.output_mod, name)
        return Result(name, bucket, unit, got.timestamps_ns, np.asarray(vs, dtype=np.float64))


def apply(
    spec: Spec,
    name: str,
    unit: str,
    raw: Series,
    start_ns: int,
    interval_ns: int | None,
    bucket: str,
) -> Result:
    """Run ``spec``'s modifiers and operations on readings already read."""
    ts, vs = raw.timestamps_ns, raw.values
    vs, unit = _modify(vs, unit, spec.input_mod, name)
    for op in spec.operations:
        if op in TRANSFORMS:
            ts, vs = operations.transform(op, ts, vs)
            unit = operations.transform_unit(op, unit)
        else:
            ts, vs = operations.aggregate(op, ts, vs, start_ns, interval_ns)
            unit = operations.aggregate_unit(op, unit)
    if interval_ns is not None and spec.aggregate is None:
        ts, vs = operations.aggregate(bucket, ts, vs, start_ns, interval_ns)
        if bucket == "count":
            unit = ""
    vs, unit = _modify(vs, unit, spec.output_mod, name)
    label = spec.label if spec.aggregate or interval_ns is None else bucket
    return Result(name, label, unit, ts, np.asarray(vs, dtype=np.float64))


def _modify(
    vs: Float64Array, unit: str, mod: Modifier | None, name: str
) -> tuple[Float64Array, str]:
    if mod is None:
        return vs, unit
    if mod.factor is not None:
        return vs * mod.factor, unit
    assert mod.unit is not None
    try:
        conv = units.conversion(unit or None, mod.unit)
    except units.UnitError as exc:
        raise units.UnitError(f"{name}: {exc}") from None
    return conv.apply(vs), mod.unit
