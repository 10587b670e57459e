"""Defining a virtual sensor: parse, resolve inputs, check units and cycles, fix the grid.

Everything that can be wrong with a definition is found here, before it is
stored: a syntax error, an unknown input, a dimension mismatch, a declared
unit of the wrong dimension, a cycle through other virtual sensors. The
stored definition (an opaque dict to storage) also fixes the grid interval,
so that results computed at different times line up.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.common import names
from services.common.errors import KelvinError, NotFoundError
from services.query_api.catalog import Catalog, compile_pattern
from services.query_api.virtual import check, parser
from services.query_api.virtual.align import typical_interval_ns

DEFAULT_INTERVAL_MS = 1000
MAX_INTERVAL_MS = 10 * 366 * 86_400_000
"""Ten years: grid steps and gaps stay far inside int64 ns."""
ESTIMATE_WINDOW_NS = 600 * 10**9
"""How far back from the newest reading an input's interval is estimated."""


class DefinitionError(KelvinError, ValueError):
    """A virtual-sensor definition that cannot be accepted (cycle, unknown input...)."""


class VirtualIn(BaseModel):
    """What a user gives to define a virtual sensor."""

    model_config = ConfigDict(extra="forbid")

    expression: str = Field(
        description='e.g. ("/a/power" + "/b/power") / "/it/power", sum("/dc/row0/*/power") / 1000'
    )
    unit: str | None = Field(None, description="Unit of the results, e.g. kW; default inferred")
    interval_ms: int | None = Field(
        None,
        ge=1,
        le=MAX_INTERVAL_MS,
        description="Grid interval; default the finest input's interval",
    )
    max_gap_ms: int | None = Field(
        None,
        ge=1,
        le=MAX_INTERVAL_MS,
        description="Interpolate across input gaps up to this long; default "
        "virtual_gap_factor x each input's interval",
    )
    description: str = ""


def differs(old: dict[str, Any], spec: VirtualIn) -> bool:
    """Whether a stored definition differs from ``spec`` (what redefining would change)."""
    if spec.interval_ms and old.get("interval_ms") != spec.interval_ms:
        return True
    return (
        old.get("expression") != spec.expression
        or old.get("declared_unit") != spec.unit
        or old.get("max_gap_ms") != spec.max_gap_ms
        or old.get("description", "") != spec.description
    )


def _refs_of(defn: dict[str, Any]) -> list[str]:
    return [str(x) for x in defn.get("inputs", [])]


async def define(
    catalog: Catalog, name: str, spec: VirtualIn, now_ns: int | None = None
) -> dict[str, Any]:
    """Validate ``spec`` as virtual sensor ``name``; return the definition to store."""
    names.validate(name)
    if "*" in name:
        raise DefinitionError(f"virtual sensor name {name!r} may not contain '*'")
    if await catalog.storage.has_sensor(name) and await catalog.virtual(name) is None:
        raise DefinitionError(
            f"{name!r} already holds stored readings; choose another name for the virtual sensor"
        )
    tree = parser.parse(spec.expression)
    refs = parser.refs(tree)
    defs = dict(await catalog.virtual_defs())
    expansions: dict[str, list[str]] = {}
    sensor_units: dict[str, str | None] = {}
    for ref in refs:
        if ref.is_pattern:
            members = await catalog.expand(ref.name)
            if compile_pattern(ref.name).fullmatch(name) and name not in members:
                members.append(name)  # the new sensor itself would match: a cycle below
            expansions[ref.name] = sorted(members)
            targets = members
        else:
            if ref.name != name and not await catalog.exists(ref.name):
                raise parser.ExpressionError(
                    f"unknown sensor {ref.name!r}", spec.expression, ref.pos
                )
            targets = [ref.name]
        for t in targets:
            if t not in sensor_units and t != name:
                sensor_units[t] = await catalog.unit(t)
    inputs = sorted({r.name for r in refs})
    _reject_cycles(name, inputs, defs, expansions, await catalog.sensors("/"))
    checked = check.check(tree, spec.expression, sensor_units, expansions)
    candidates = [sensor_units.get(m) for r in refs for m in expansions.get(r.name, [r.name])] + [
        n.unit for n in parser.numbers(tree)
    ]
    unit = check.result_unit(checked, spec.unit, candidates, f"virtual sensor {name}")
    leaves = sorted(sensor_units)
    intervals = {s: await _interval_ms(catalog, s, defs) for s in leaves}
    known = [v for v in intervals.values() if v]
    warnings = list(checked.warnings)
    if spec.interval_ms:
        interval_ms, source = spec.interval_ms, "declared"
    elif known:
        interval_ms, source = min(known), "inputs"
    else:
        interval_ms, source = DEFAULT_INTERVAL_MS, "default"
        warnings.append(
            f"no input has an interval in its metadata or readings to estimate it from; "
            f"the grid interval is {DEFAULT_INTERVAL_MS} ms (set interval_ms to choose)"
        )
    now = now_ns or time.time_ns()
    old = defs.get(name)
    return {
        "name": name,
        "expression": spec.expression,
        "unit": unit,
        "declared_unit": spec.unit,
        "base_unit": str(checked.unit),
        "interval_ms": interval_ms,
        "interval_source": source,
        "max_gap_ms": spec.max_gap_ms,
        "description": spec.description,
        "inputs": inputs,
        "input_intervals_ms": {k: v for k, v in intervals.items() if v},
        "warnings": warnings,
        "created_ns": int(old.get("created_ns", now)) if old else now,
        "updated_ns": now,
    }


async def _interval_ms(catalog: Catalog, sensor: str, defs: dict[str, Any]) -> int | None:
    """An input's sampling interval: a virtual sensor's grid, metadata, or estimated."""
    if sensor in defs:
        return int(defs[sensor].get("interval_ms") or 0) or None
    meta = await catalog.storage.get_metadata(sensor)
    if meta is not None and meta.interval_ms:
        return int(meta.interval_ms)
    latest = await catalog.storage.latest(sensor)
    if latest is None:
        return None
    recent = await catalog.storage.read(sensor, latest[0] - ESTIMATE_WINDOW_NS, latest[0] + 1)
    step = typical_interval_ns(recent.timestamps_ns)
    return max(1, round(step / 1e6)) if step else None


def _reject_cycles(
    name: str,
    inputs: list[str],
    defs: dict[str, dict[str, Any]],
    expansions: dict[str, list[str]],
    all_names: list[str],
) -> None:
    """Depth-first through virtual inputs; a path back to ``name`` is a cycle."""
    graph = {k: _refs_of(v) for k, v in defs.items()}
    graph[name] = inputs
    universe = sorted({*all_names, *defs, name})

    def successors(node: str) -> list[str]:
        out: list[str] = []
        for ref in graph.get(node, []):
            if "*" in ref:
                members = expansions.get(ref) if node == name else None
                if members is None:
                    rx = compile_pattern(ref)
                    members = [u for u in universe if rx.fullmatch(u)]
                out.extend(m for m in members if m in graph)
            elif ref in graph:
                out.append(ref)
        return out

    path: list[str] = [name]

    def walk(node: str, seen: set[str]) -> None:
        for nxt in successors(node):
            if nxt == name:
                raise DefinitionError(
                    f"virtual sensor {name!r} would depend on itself: {' -> '.join([*path, name])}"
                )
            if nxt in seen:
                continue
            seen.add(nxt)
            path.append(nxt)
            walk(nxt, seen)
            path.pop()

    walk(name, {name})


async def reach(catalog: Catalog, name: str, max_depth: int) -> tuple[list[str], list[str]]:
    """What virtual sensor ``name`` finally reads: (stored sensors, virtual sensors on the way)."""
    stored: set[str] = set()
    virtuals: set[str] = set()

    async def visit(v: str, depth: int) -> None:
        if depth > max_depth:
            raise DefinitionError(f"virtual sensors nest deeper than {max_depth} below {name!r}")
        defn = await catalog.virtual(v)
        if defn is None:
            raise NotFoundError(f"virtual sensor {v!r} does not exist")
        for ref in _refs_of(defn):
            for m in await catalog.expand(ref) if "*" in ref else [ref]:
                if await catalog.virtual(m) is None:
                    stored.add(m)
                elif m not in virtuals and m != name:
                    virtuals.add(m)
                    await visit(m, depth + 1)

    await visit(name, 0)
    return sorted(stored), sorted(virtuals)


async def own_expansions(catalog: Catalog, name: str) -> dict[str, list[str]]:
    """The current members of each wildcard in ``name``'s expression."""
    defn = await catalog.virtual(name) or {}
    return {ref: await catalog.expand(ref) for ref in _refs_of(defn) if "*" in ref}
