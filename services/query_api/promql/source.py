"""Where the evaluator's series come from: Kelvin's sensors, named as Prometheus series.

Each stored or virtual sensor is one series, its labels from
:func:`services.common.promnames.series_labels`. Selection runs the matchers over
the sensors' labels; readings are read once per query and sensor (a query that
names a series twice reads it once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from services.common.promnames import Labels, series_labels
from services.query_api.promql.ast import EvalError
from services.query_api.promql.regex import Matcher
from services.query_api.promql.values import F1, I1, label
from services.query_api.query import Reader


@dataclass(frozen=True, slots=True)
class RawSeries:
    labels: Labels
    ts: I1
    vs: F1


class Source(Protocol):
    async def select(
        self, matchers: Sequence[Matcher], start_ns: int, end_ns: int
    ) -> list[RawSeries]:
        """Series matching every matcher, sorted by labels, with samples in ``[start, end]``."""
        ...

    async def names(self, matchers: Sequence[Matcher]) -> list[Labels]:
        """Labels of the matching series (no readings)."""
        ...


def matches(labels: Labels, matchers: Sequence[Matcher]) -> bool:
    return all(m.matches(label(labels, m.name)) for m in matchers)


class KelvinSource:
    """Sensors of one query API (storage and virtual sensors) for one query."""

    def __init__(self, reader: Reader, max_series: int) -> None:
        self.reader = reader
        self.max_series = max_series
        self._read: dict[str, tuple[int, int, I1, F1]] = {}

    async def _candidates(self, matchers: Sequence[Matcher]) -> list[tuple[Labels, str]]:
        exact = [m.value for m in matchers if m.name == "sensor" and m.op == "="]
        if exact:
            names = [exact[0]] if await self.reader.catalog.exists(exact[0]) else []
        else:
            names = await self.reader.catalog.sensors("/")
        found = []
        for name in names:
            lab = series_labels(name)
            if matches(lab, matchers):
                found.append((lab, name))
        found.sort()
        if len(found) > self.max_series:
            raise EvalError(
                f"the selector matches {len(found)} series, more than prometheus_max_series "
                f"{self.max_series}; narrow it with labels"
            )
        return found

    async def names(self, matchers: Sequence[Matcher]) -> list[Labels]:
        return [lab for lab, _ in await self._candidates(matchers)]

    async def select(
        self, matchers: Sequence[Matcher], start_ns: int, end_ns: int
    ) -> list[RawSeries]:
        found = await self._candidates(matchers)
        missing = [
            name
            for _, name in found
            if (got := self._read.get(name)) is None or got[0] > start_ns or got[1] < end_ns
        ]
        if missing:
            virtual = await self.reader.catalog.virtual_defs()
            stored = [n for n in missing if n not in virtual]
            end = min(end_ns + 1, 2**63 - 1)  # storage ranges are half-open
            if stored:
                for name, s in (await self.reader.storage.read_many(stored, start_ns, end)).items():
                    self._read[name] = (start_ns, end_ns, s.timestamps_ns, s.values)
            for name in missing:
                if name in virtual:
                    s = await self.reader.series(name, start_ns, end)
                    self._read[name] = (start_ns, end_ns, s.timestamps_ns, s.values)
        out = []
        for lab, name in found:
            lo, hi, ts, vs = self._read[name]
            if lo == start_ns and hi == end_ns:  # read for exactly this range
                out.append(RawSeries(lab, ts, vs))
                continue
            a = int(np.searchsorted(ts, start_ns, side="left"))
            b = int(np.searchsorted(ts, end_ns, side="right"))
            out.append(RawSeries(lab, ts[a:b], vs[a:b]))
        return out
