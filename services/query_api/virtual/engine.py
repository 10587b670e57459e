"""Virtual-sensor evaluation: lazy, written back, invalidated by late data.

``evaluate(name, start, end)``:

1. Read the stored results for the range (one storage call).
2. Ask storage whether any input (the stored sensors at the bottom of the
   chain of virtual sensors) was written to after each stored range was
   computed; late data at time *t* drops stored results from *t* minus the
   reach of interpolation and ``delta``/``rate``/``integral`` onward.
3. Compute only the sub-ranges not covered; store them, except the last
   ``virtual_settle_s`` whose inputs are probably still arriving.

A range that was verified against late data is not checked again for writes
older than the previous check (minus an overlap that covers a computation
running concurrently in another replica), so a warm query costs two small
storage calls whatever the age of the results (plus a listing of the sensors
under each wildcard input, which is expanded anew every time).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common.errors import NotFoundError
from services.common.readings import Float64Array, Int64Array, Series
from services.common.storage.base import StorageBackend
from services.query_api import limits, units
from services.query_api.catalog import Catalog
from services.query_api.query import QueryError
from services.query_api.settings import Settings
from services.query_api.virtual import align, define, parser
from services.query_api.virtual.cache import BackgroundWriter, MemoryTier, Segment, slice_segments
from services.query_api.virtual.evaluate import Evaluator

MIN_NS, MAX_NS = -(2**63), 2**63 - 1
CHECK_OVERLAP_NS = 120 * 10**9
"""Longest computation assumed to run in another replica while this one checks (see docstring)."""


@dataclass(frozen=True)
class Compiled:
    """A stored definition, parsed once."""

    name: str
    updated_ns: int
    tree: parser.Node
    lead: int
    interval_ns: int
    to_result: units.Conversion
    max_gap_ns: int | None
    input_intervals_ns: dict[str, int]


class Engine:
    """Evaluates virtual sensors for the query API (see module docstring)."""

    def __init__(
        self, storage: StorageBackend, catalog: Catalog, settings: Settings, metrics: Any
    ) -> None:
        self.storage, self.catalog, self.settings, self.metrics = (
            storage,
            catalog,
            settings,
            metrics,
        )
        self._compiled: dict[str, Compiled] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._generation: dict[str, int] = {}
        """Bumped when a sensor's results are forgotten: results computed before are
        not stored (they may come from the definition, or inputs, it had before)."""
        self._verified: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self.memory = MemoryTier(settings.virtual_memory_points)
        self.writer = BackgroundWriter(storage, metrics)

    async def close(self) -> None:
        """Finish the background stores."""
        await self.writer.close()

    # ------------------------------------------------------------------ definitions
    async def compiled(self, name: str) -> Compiled:
        defn = await self.catalog.virtual(name)
        if defn is None:
            raise NotFoundError(f"virtual sensor {name!r} does not exist")
        updated = int(defn.get("updated_ns", 0))
        hit = self._compiled.get(name)
        if hit is not None and hit.updated_ns == updated:
            return hit
        tree = parser.parse(str(defn["expression"]))
        base = units.parse(str(defn.get("base_unit") or "")) or units.registry().dimensionless
        result = units.parse(str(defn.get("unit") or "")) or base
        comp = Compiled(
            name=name,
            updated_ns=updated,
            tree=tree,
            lead=parser.lead_steps(tree),
            interval_ns=int(defn["interval_ms"]) * 1_000_000,
            to_result=units.linear(base, result),
            max_gap_ns=int(defn["max_gap_ms"]) * 1_000_000 if defn.get("max_gap_ms") else None,
            input_intervals_ns={
                k: int(v) * 1_000_000 for k, v in (defn.get("input_intervals_ms") or {}).items()
            },
        )
        self._compiled[name] = comp
        return comp

    async def put(self, name: str, spec: define.VirtualIn, dry_run: bool = False) -> dict[str, Any]:
        """Validate and store a definition; replacing one drops its and its dependents' results."""
        defn = await define.define(self.catalog, name, spec)
        if dry_run:
            return defn
        # An evaluation of ``name`` in flight finishes (and queues its store) before
        # the results are forgotten; one of a dependent is not stored (generation).
        async with self._lock(name):
            if await self.catalog.virtual(name) is not None:
                for dep in [name, *await self.dependents(name)]:
                    await self.forget(dep)
            await self.storage.put_virtual(name, defn)
            self.catalog.invalidate()
        return defn

    async def delete(self, name: str) -> None:
        if await self.catalog.virtual(name) is None:
            raise NotFoundError(f"virtual sensor {name!r} does not exist")
        users = await self.dependents(name)
        if users:
            raise define.DefinitionError(
                f"virtual sensor {name!r} is used by {', '.join(users)}; delete or redefine those first"
            )
        async with self._lock(name):
            await self.forget(name)
            await self.storage.delete_virtual(name)
            self.catalog.invalidate()
            self._compiled.pop(name, None)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def forget(self, name: str) -> None:
        """Drop every result of ``name``: queued, in memory and stored."""
        self._generation[name] = self._generation.get(name, 0) + 1
        self.writer.discard(name)
        await self.writer.flush()
        self.memory.drop_all(name)
        await self.storage.invalidate_virtual(name, MIN_NS, MAX_NS)

    async def dependents(self, name: str) -> list[str]:
        """Virtual sensors that read ``name``, directly or through others."""
        defs = await self.catalog.virtual_defs()
        out: list[str] = []
        for other in defs:
            if other == name:
                continue
            try:
                _, virtuals = await define.reach(self.catalog, other, 32)
            except (define.DefinitionError, NotFoundError):
                continue
            if name in virtuals:
                out.append(other)
        return sorted(out)

    # ------------------------------------------------------------------ evaluation
    async def evaluate(self, name: str, start_ns: int, end_ns: int) -> Series:
        return await self._evaluate(name, start_ns, end_ns, ())

    async def _evaluate(
        self, name: str, start_ns: int, end_ns: int, stack: tuple[str, ...]
    ) -> Series:
        if name in stack:
            raise QueryError(f"virtual sensor cycle: {' -> '.join([*stack, name])}")
        if len(stack) >= self.settings.virtual_max_depth:
            raise QueryError(
                f"virtual sensors nest deeper than {self.settings.virtual_max_depth}: "
                f"{' -> '.join([*stack, name])}"
            )
        generation = self._generation.get(name, 0)
        comp = await self.compiled(name)
        iv = comp.interval_ns
        # int64 times only, with room for the grid steps read before the first point
        start_ns = max(start_ns, MIN_NS + comp.lead * iv)
        end_ns = min(end_ns, MAX_NS)
        g0 = align.first_grid_point(start_ns, iv)
        if g0 >= end_ns:
            return Series.empty(name)
        points = (end_ns - 1 - g0) // iv + 1
        if points > self.settings.max_points:
            raise QueryError(
                f"virtual sensor {name}: {points} grid points at {iv / 1e6:g} ms, more than "
                f"max_points {self.settings.max_points}; narrow the range"
            )
        async with self._lock(name):
            mem = self.memory.covering(name, comp.updated_ns, g0, end_ns)
            if mem is not None and await self._memory_fresh(name, comp, mem):
                ts, vs = slice_segments(mem, g0, end_ns)
                self.metrics.virtual_reused.inc(ts.shape[0])
                return Series(name, ts, vs)
            stored = await self._fresh_results(name, comp, g0, end_ns)
            parts_ts: list[Int64Array] = [stored.series.timestamps_ns]
            parts_vs: list[Float64Array] = [stored.series.values]
            oldest = min(stored.computed_at_ns, default=MAX_NS)
            self.metrics.virtual_reused.inc(len(stored.series))
            cutoff = await self._cutoff(name, comp)
            for a, b in _missing(g0, end_ns, stored.covered):
                computed_at = time.time_ns()
                oldest = min(oldest, computed_at)
                ts, vs = await self._compute(name, comp, a, b, stack)
                self.metrics.virtual_computed.inc(ts.shape[0])
                if min(b, cutoff) > a and self._generation.get(name, 0) == generation:
                    keep = ts < cutoff
                    await self.writer.submit(
                        name, a, min(b, cutoff), ts[keep], vs[keep], computed_at
                    )
                parts_ts.append(ts)
                parts_vs.append(vs)
        ts, vs = parts_ts[0], parts_vs[0]
        if len(parts_ts) > 1:
            ts, vs = np.concatenate(parts_ts), np.concatenate(parts_vs)
            order = np.argsort(ts, kind="stable")
            ts, vs = ts[order], vs[order]
        # The answer and the memory tier share these arrays (a copy of 100k points
        # costs as much as reading them back from storage): read-only from here on.
        ts.flags.writeable = vs.flags.writeable = False
        settled = min(end_ns, cutoff)
        if settled > g0 and self._generation.get(name, 0) == generation:
            k = int(np.searchsorted(ts, settled, "left"))
            self.memory.put(name, Segment(g0, settled, oldest, comp.updated_ns, ts[:k], vs[:k]))
        return Series(name, ts, vs)

    async def _memory_fresh(self, name: str, comp: Compiled, segs: list[Segment]) -> bool:
        """True when no input changed under the segments since they were computed."""
        checked_at = time.time_ns()
        since = min(self._since(name, s.start, s.computed_at) for s in segs)
        leaves, _ = await define.reach(self.catalog, name, self.settings.virtual_max_depth)
        changed = await self.storage.modified_since(leaves, since)
        if changed:
            stale_from = min(changed.values()) - await self._reach_ns(name, comp)
            if stale_from < max(s.end for s in segs):
                await self._invalidate_chain(name, stale_from)
                return False
        for s in segs:
            self._mark(name, s.start, s.computed_at, checked_at)
        return True

    def _since(self, name: str, start: int, computed_at: int) -> int:
        """Writes after this time can have changed the results (see module docstring)."""
        verified = self._verified.get((name, start, computed_at))
        return computed_at if verified is None else max(computed_at, verified - CHECK_OVERLAP_NS)

    def _mark(self, name: str, start: int, computed_at: int, checked_at: int) -> None:
        self._verified[(name, start, computed_at)] = checked_at
        self._verified.move_to_end((name, start, computed_at))
        while len(self._verified) > 100_000:
            self._verified.popitem(last=False)

    async def _cutoff(self, name: str, comp: Compiled) -> int:
        """Results before this time are settled: stored and kept in memory."""
        settle = max(round(self.settings.virtual_settle_s * 1e9), await self._reach_ns(name, comp))
        return time.time_ns() - settle

    async def _fresh_results(self, name: str, comp: Compiled, g0: int, end_ns: int) -> Any:
        """Stored results for the range, after dropping what late input data made stale."""
        stored = await self.storage.read_virtual_results(name, g0, end_ns)
        if not stored.covered:
            return stored
        checked_at = time.time_ns()
        since = min(
            self._since(name, a, c)
            for (a, _), c in zip(stored.covered, stored.computed_at_ns, strict=True)
        )
        leaves, _ = await define.reach(self.catalog, name, self.settings.virtual_max_depth)
        changed = await self.storage.modified_since(leaves, since)
        if changed:
            reach = await self._reach_ns(name, comp)
            stale_from = min(changed.values()) - reach
            if stale_from < max(b for _, b in stored.covered):
                await self._invalidate_chain(name, stale_from)
                stored = await self.storage.read_virtual_results(name, g0, end_ns)
        for (a, _), c in zip(stored.covered, stored.computed_at_ns, strict=True):
            self._mark(name, a, c, checked_at)
        return stored

    async def _invalidate_chain(self, name: str, from_ns: int) -> None:
        """Drop results from ``from_ns`` on, and those of virtual inputs in between."""
        self.metrics.virtual_invalidations.inc()
        await self.storage.invalidate_virtual(name, from_ns, MAX_NS)
        _, virtuals = await define.reach(self.catalog, name, self.settings.virtual_max_depth)
        for v in virtuals:
            await self.storage.invalidate_virtual(
                v, from_ns - await self._reach_ns(v, None), MAX_NS
            )

    async def _reach_ns(self, name: str, comp: Compiled | None) -> int:
        """How far back a change in an input can move this sensor's results."""
        comp = comp or await self.compiled(name)
        defn = await self.catalog.virtual(name) or {}
        reach = 0
        for ref in defn.get("inputs", []):
            members = await self.catalog.expand(ref) if "*" in ref else [ref]
            for m in members:
                inner = await self._reach_ns(m, None) if await self.catalog.virtual(m) else 0
                reach = max(reach, self._gap_ns(comp, m) + inner)
        return reach + (comp.lead + 1) * comp.interval_ns

    def _gap_ns(self, comp: Compiled, sensor: str) -> int:
        if comp.max_gap_ns is not None:
            return comp.max_gap_ns
        step = comp.input_intervals_ns.get(sensor) or comp.interval_ns
        return round(step * self.settings.virtual_gap_factor)

    async def _compute(
        self, name: str, comp: Compiled, a: int, b: int, stack: tuple[str, ...]
    ) -> tuple[Int64Array, Float64Array]:
        iv = comp.interval_ns
        pts = align.grid(a, b, iv)
        if pts.shape[0] == 0:
            return pts, np.empty(0)
        ext = np.arange(pts[0] - comp.lead * iv, pts[-1] + 1, iv, dtype=np.int64)
        expansions = await define.own_expansions(self.catalog, name)
        cache: dict[str, Float64Array] = {}

        async def fetch(sensor: str) -> Float64Array:
            hit = cache.get(sensor)
            if hit is not None:
                return hit
            gap = self._gap_ns(comp, sensor)
            lo, hi = int(ext[0]) - gap, int(ext[-1]) + gap + 1
            if await self.catalog.virtual(sensor) is not None:
                series = await self._evaluate(sensor, lo, hi, (*stack, name))
            else:
                series = await limits.read_within(self.storage, sensor, lo, hi)
            vals = align.interpolate(series.timestamps_ns, series.values, ext, gap)
            cache[sensor] = _to_base(await self.catalog.unit(sensor)).apply(vals)
            return cache[sensor]

        values = await Evaluator(ext.shape[0], iv, fetch, expansions).run(comp.tree)
        return pts, comp.to_result.apply(values[comp.lead :])


def _missing(start: int, end: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of ``[start, end)`` that no covered range contains."""
    out = []
    at = start
    for a, b in sorted(covered):
        if b <= at:
            continue
        if a > at:
            out.append((at, min(a, end)))
        at = max(at, b)
        if at >= end:
            break
    if at < end:
        out.append((at, end))
    return [(a, b) for a, b in out if b > a]


def _to_base(unit_text: str | None) -> units.Conversion:
    parsed = units.parse(unit_text) if unit_text else None
    if parsed is None:
        return units.Linear(1.0, 0.0)
    return units.to_base(parsed)[1]
