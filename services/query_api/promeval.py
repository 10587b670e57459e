"""Evaluating the PromQL subset (:mod:`.promql`) over Kelvin sensors.

Each sensor is one series. Its labels: ``__name__`` (the last level, made a
valid metric name), ``sensor`` (the full name) and ``l1``, ``l2``, ... (one per
hierarchy level), so ``power{l2="row0"}`` selects every power sensor of row 0.
Semantics follow Prometheus 2.x: an instant selector takes the newest
sample at most ``lookback`` old; range windows are ``[t - range, t]``;
``rate``/``increase``/``delta`` extrapolate like Prometheus; arithmetic
and functions other than ``last_over_time`` drop ``__name__``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.common.readings import Float64Array, Int64Array, Series
from services.query_api import promql
from services.query_api.promql import PromQLError
from services.query_api.query import Reader

Labels = dict[str, str]


@dataclass
class VSeries:
    """One series of an instant vector evaluated at every step (NaN = no sample)."""

    labels: Labels
    values: Float64Array


@dataclass
class RSeries:
    """One series of a range vector (instant queries of ``x[5m]``)."""

    labels: Labels
    timestamps_ns: Int64Array
    values: Float64Array


Value = Float64Array | list[VSeries] | list[RSeries]
"""A scalar (one value per step), an instant vector or a range vector."""


def metric_name(level: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_:]", "_", level)
    return name if re.match(r"[A-Za-z_:]", name) else "_" + name


def labels_of(sensor: str) -> Labels:
    levels = sensor[1:].split("/")
    out = {"__name__": metric_name(levels[-1]), "sensor": sensor}
    out.update({f"l{i + 1}": lv for i, lv in enumerate(levels)})
    return out


def matches(labels: Labels, matchers: Sequence[promql.Matcher]) -> bool:
    return all(m.matches(labels.get(m.label, "")) for m in matchers)


class Evaluator:
    """Evaluates one parsed query at ``steps_ns`` (one step for an instant query)."""

    def __init__(
        self,
        reader: Reader,
        steps_ns: Int64Array,
        lookback_ns: int,
        max_series: int,
    ) -> None:
        self.reader = reader
        self.steps = steps_ns
        self.lookback = lookback_ns
        self.max_series = max_series

    async def select(self, matchers: Sequence[promql.Matcher]) -> list[tuple[str, Labels]]:
        exact = [m.value for m in matchers if m.label == "sensor" and m.op == "="]
        candidates = exact[:1] if exact else await self.reader.catalog.sensors("/")
        found = [(s, labels_of(s)) for s in candidates]
        found = [(s, lab) for s, lab in found if matches(lab, matchers)]
        if exact and found and not await self.reader.catalog.exists(exact[0]):
            found = []
        if len(found) > self.max_series:
            raise PromQLError(
                f"the selector matches {len(found)} series, more than prometheus_max_series "
                f"{self.max_series}; narrow it with labels"
            )
        return found

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        s = await self.reader.series(sensor, start_ns, end_ns)
        ok = ~np.isnan(s.values)
        if not bool(ok.all()):
            s = Series(s.sensor, s.timestamps_ns[ok], s.values[ok])
        return s

    async def eval(self, e: promql.Expr) -> Value:
        if isinstance(e, promql.NumberLit):
            return np.full(self.steps.shape[0], e.value)
        if isinstance(e, promql.Selector):
            return await self.selector(e)
        if isinstance(e, promql.Neg):
            v = await self.eval(e.arg)
            if isinstance(v, np.ndarray):
                return -v
            return [VSeries(_drop_name(s.labels), -s.values) for s in _vector(v, "unary -")]
        if isinstance(e, promql.BinOp):
            return binary(e.op, await self.eval(e.left), await self.eval(e.right))
        if isinstance(e, promql.Aggregate):
            return aggregate(e, _vector(await self.eval(e.arg), e.op))
        return await self.func(e)

    async def selector(self, e: promql.Selector) -> Value:
        first, last = int(self.steps[0]), int(self.steps[-1])
        if e.range_s is not None:
            rng = round(e.range_s * 1e9)
            out: list[RSeries] = []
            for sensor, labels in await self.select(e.matchers):
                s = await self.read(sensor, last - rng, last + 1)
                if len(s):
                    out.append(RSeries(labels, s.timestamps_ns, s.values))
            return out
        vec: list[VSeries] = []
        for sensor, labels in await self.select(e.matchers):
            s = await self.read(sensor, first - self.lookback, last + 1)
            idx = np.searchsorted(s.timestamps_ns, self.steps, side="right") - 1
            vals = np.full(self.steps.shape[0], np.nan)
            ok = idx >= 0
            ok[ok] = self.steps[ok] - s.timestamps_ns[idx[ok]] <= self.lookback
            vals[ok] = s.values[idx[ok]]
            if bool(ok.any()):
                vec.append(VSeries(labels, vals))
        return vec

    async def func(self, e: promql.Func) -> Value:
        if e.name == "abs":
            v = await self.eval(e.arg)
            if isinstance(v, np.ndarray):
                return np.abs(v)
            return [VSeries(_drop_name(s.labels), np.abs(s.values)) for s in _vector(v, "abs")]
        sel = e.arg
        assert isinstance(sel, promql.Selector) and sel.range_s is not None
        rng = round(sel.range_s * 1e9)
        first, last = int(self.steps[0]), int(self.steps[-1])
        out: list[VSeries] = []
        for sensor, labels in await self.select(sel.matchers):
            s = await self.read(sensor, first - rng, last + 1)
            vals = over_time(e.name, s.timestamps_ns, s.values, self.steps, rng)
            if bool((~np.isnan(vals)).any()):
                keep = labels if e.name == "last_over_time" else _drop_name(labels)
                out.append(VSeries(keep, vals))
        return out


def _vector(v: Value, what: str) -> list[VSeries]:
    if isinstance(v, np.ndarray) or (v and isinstance(v[0], RSeries)):
        raise PromQLError(f"{what}: expected an instant vector")
    return v  # type: ignore[return-value]


def _drop_name(labels: Labels) -> Labels:
    return {k: v for k, v in labels.items() if k != "__name__"}


def over_time(
    name: str, ts: Int64Array, vs: Float64Array, steps: Int64Array, rng: int
) -> Float64Array:
    """A range function at every step, over the samples in ``[t - rng, t]``."""
    lo = np.searchsorted(ts, steps - rng, side="left")
    hi = np.searchsorted(ts, steps, side="right")
    n = hi - lo
    out = np.full(steps.shape[0], np.nan)
    has = n > 0
    if not bool(has.any()):
        return out
    if name == "count_over_time":
        out[has] = n[has]
    elif name in ("sum_over_time", "avg_over_time"):
        sums = _window_sums(vs, lo, hi)
        out[has] = (sums if name == "sum_over_time" else sums / np.maximum(n, 1))[has]
    elif name == "last_over_time":
        out[has] = vs[hi[has] - 1]
    elif name in ("min_over_time", "max_over_time"):
        fn = np.min if name == "min_over_time" else np.max
        for i in np.flatnonzero(has).tolist():
            out[i] = fn(vs[lo[i] : hi[i]])
    elif name in ("irate", "idelta"):
        two = n >= 2
        a, b = hi[two] - 2, hi[two] - 1
        d = vs[b] - vs[a]
        if name == "irate":
            d = np.where(d < 0, vs[b], d)  # counter reset
            d = d / ((ts[b] - ts[a]) / 1e9)
        out[two] = d
    else:
        out = _extrapolated(name, ts, vs, steps, rng, lo, hi)
    return out


def _window_sums(vs: Float64Array, lo: Int64Array, hi: Int64Array) -> Float64Array:
    """Sums of ``vs[lo:hi]`` per window through prefix sums; an infinity counts only in
    the windows that hold it (a prefix sum would carry it, as NaN, into every later one)."""
    finite = np.isfinite(vs)

    def prefix(x: Float64Array) -> Float64Array:
        return np.concatenate([[0.0], np.cumsum(x)])

    if bool(finite.all()):
        c = prefix(vs)
        return c[hi] - c[lo]
    c = prefix(np.where(finite, vs, 0.0))
    sums = c[hi] - c[lo]
    pos, neg = prefix(vs == np.inf), prefix(vs == -np.inf)
    up, down = pos[hi] - pos[lo] > 0, neg[hi] - neg[lo] > 0
    with np.errstate(invalid="ignore"):
        return np.where(up, np.inf, 0.0) + np.where(down, -np.inf, 0.0) + sums


def _extrapolated(
    name: str,
    ts: Int64Array,
    vs: Float64Array,
    steps: Int64Array,
    rng: int,
    lo: Int64Array,
    hi: Int64Array,
) -> Float64Array:
    """``rate``, ``increase`` and ``delta`` as Prometheus computes them (extrapolatedRate)."""
    out = np.full(steps.shape[0], np.nan)
    ok = (hi - lo) >= 2
    if not bool(ok.any()):
        return out
    is_counter = name in ("rate", "increase")
    a, b = lo[ok], hi[ok] - 1
    result = vs[b] - vs[a]
    if is_counter:
        drops = np.concatenate([[0.0], np.where(np.diff(vs) < 0, vs[:-1], 0.0)])
        cdrops = np.cumsum(drops)
        result = result + (cdrops[b] - cdrops[a])
    t_first, t_last = ts[a] / 1e9, ts[b] / 1e9
    range_start = (steps[ok] - rng) / 1e9
    range_end = steps[ok] / 1e9
    to_start = t_first - range_start
    to_end = range_end - t_last
    sampled = t_last - t_first
    avg_step = sampled / (b - a)
    if is_counter:
        with np.errstate(divide="ignore", invalid="ignore"):
            to_zero = sampled * (vs[a] / result)
        shrink = (result > 0) & (vs[a] >= 0) & (to_zero < to_start)
        to_start = np.where(shrink, to_zero, to_start)
    threshold = avg_step * 1.1
    interval = sampled + np.where(to_start < threshold, to_start, avg_step / 2)
    interval = interval + np.where(to_end < threshold, to_end, avg_step / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        result = result * (interval / sampled)
    if name == "rate":
        result = result / (rng / 1e9)
    out[ok] = result
    return out


def aggregate(e: promql.Aggregate, vec: list[VSeries]) -> list[VSeries]:
    groups: dict[tuple[tuple[str, str], ...], list[VSeries]] = {}
    for s in vec:
        if e.by is not None:
            key = {k: v for k, v in s.labels.items() if k in e.by}
        elif e.without is not None:
            key = {k: v for k, v in s.labels.items() if k not in e.without and k != "__name__"}
        else:
            key = {}
        groups.setdefault(tuple(sorted(key.items())), []).append(s)
    out: list[VSeries] = []
    for group, members in groups.items():
        stack = np.vstack([m.values for m in members])
        present = ~np.isnan(stack)
        count = present.sum(axis=0)
        with np.errstate(all="ignore"):
            if e.op == "sum":
                vals = np.nansum(stack, axis=0)
            elif e.op == "avg":
                vals = np.nansum(stack, axis=0) / count
            elif e.op == "count":
                vals = count.astype(np.float64)
            elif e.op == "min":
                vals = np.nanmin(np.where(present, stack, np.inf), axis=0)
            else:
                vals = np.nanmax(np.where(present, stack, -np.inf), axis=0)
        vals = np.where(count > 0, vals, np.nan)
        out.append(VSeries(dict(group), vals))
    return out


def binary(op: str, left: Value, right: Value) -> Value:
    def apply(a: Float64Array, b: Float64Array) -> Float64Array:
        with np.errstate(all="ignore"):
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            return a / b

    if isinstance(left, np.ndarray) and isinstance(right, np.ndarray):
        return apply(left, right)
    if isinstance(right, np.ndarray):
        return [VSeries(_drop_name(s.labels), apply(s.values, right)) for s in _vector(left, op)]
    if isinstance(left, np.ndarray):
        return [VSeries(_drop_name(s.labels), apply(left, s.values)) for s in _vector(right, op)]
    rhs = {tuple(sorted(_drop_name(s.labels).items())): s for s in _vector(right, op)}
    out = []
    for s in _vector(left, op):
        key = tuple(sorted(_drop_name(s.labels).items()))
        if key in rhs:
            vals = apply(s.values, rhs[key].values)
            if bool((~np.isnan(vals)).any()):
                out.append(VSeries(dict(key), vals))
    return out
