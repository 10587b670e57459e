"""The evaluator: walks the syntax tree once, each node computed at every step of the query.

Semantics are Prometheus 2.x's: an instant selector takes the newest sample in
``[t - lookback, t]`` unless it is a staleness marker; a range selector the
samples in ``[t - range, t]``; ``offset`` shifts and ``@`` pins the reference
time (``start()``/``end()`` are the query's); a subquery evaluates its expression
on its own grid, aligned to multiples of its step, and windows those points.
"""

from __future__ import annotations

import numpy as np

from services.query_api.promql import ast
from services.query_api.promql.aggregate import aggregate
from services.query_api.promql.ast import EvalError, ValueType
from services.query_api.promql.binary import binary
from services.query_api.promql.functions import (
    MATRIX_FUNCTIONS,
    absent_labels,
    call_instant,
    call_matrix,
)
from services.query_api.promql.source import Source
from services.query_api.promql.values import (
    I1,
    Matrix,
    Scalar,
    String,
    Value,
    Vector,
    drop_name,
    is_stale,
    stacked_search,
    windows,
)

DEFAULT_SUBQUERY_STEP_NS = 60 * 10**9
"""A subquery without a step uses Prometheus' default evaluation interval, 1m."""
TOO_MANY = "query processing would load too many samples into memory in query execution"


def _go_div(a: int, b: int) -> int:
    """Go's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


class Engine:
    def __init__(
        self,
        source: Source,
        lookback_ns: int,
        max_samples: int = 50_000_000,
        default_step_ns: int = DEFAULT_SUBQUERY_STEP_NS,
    ) -> None:
        self.source = source
        self.lookback_ns = lookback_ns
        self.max_samples = max_samples
        self.default_step_ns = default_step_ns

    async def instant(self, expr: ast.Expr, t_ns: int) -> Value:
        return await Evaluator(self, np.array([t_ns], dtype=np.int64), t_ns, t_ns).eval(expr)

    async def range(self, expr: ast.Expr, start_ns: int, end_ns: int, step_ns: int) -> Value:
        steps = np.arange(start_ns, end_ns + 1, step_ns, dtype=np.int64)
        return await Evaluator(self, steps, start_ns, end_ns).eval(expr)


class Evaluator:
    def __init__(self, engine: Engine, steps: I1, query_start: int, query_end: int) -> None:
        self.engine = engine
        self.steps = steps
        self.query_start = query_start
        self.query_end = query_end

    @property
    def nsteps(self) -> int:
        return int(self.steps.shape[0])

    def _pinned(self, at_ns: int | None, at_kw: str | None) -> int | None:
        if at_kw == "start":
            return self.query_start
        if at_kw == "end":
            return self.query_end
        return at_ns

    def _refs(self, offset_ns: int, at_ns: int | None, at_kw: str | None) -> I1:
        pin = self._pinned(at_ns, at_kw)
        base = self.steps if pin is None else np.full(self.nsteps, pin, dtype=np.int64)
        return base - offset_ns

    def _budget(self, samples: int) -> None:
        if samples > self.engine.max_samples:
            raise EvalError(TOO_MANY)

    async def eval(self, e: ast.Expr) -> Value:
        if isinstance(e, ast.NumberLiteral):
            return Scalar(np.full(self.nsteps, e.value))
        if isinstance(e, ast.StringLiteral):
            return String(e.value)
        if isinstance(e, ast.ParenExpr):
            return await self.eval(e.expr)
        if isinstance(e, ast.VectorSelector):
            return await self.vector_selector(e)
        if isinstance(e, ast.MatrixSelector | ast.SubqueryExpr):
            return await self.matrix(e)
        if isinstance(e, ast.UnaryExpr):
            v = await self.eval(e.expr)
            if e.op == "+":
                return v
            if isinstance(v, Scalar):
                return Scalar(-v.values)
            assert isinstance(v, Vector)
            out = Vector(v.labels, -v.values, v.present)
            return out.relabel([drop_name(lab) for lab in v.labels], whole_series=True)
        if isinstance(e, ast.BinaryExpr):
            lhs = await self.eval(e.lhs)
            rhs = await self.eval(e.rhs)
            return binary(e, lhs, rhs)
        if isinstance(e, ast.AggregateExpr):
            param: np.ndarray | str | None = None
            if e.param is not None:
                p = await self.eval(e.param)
                param = p.value if isinstance(p, String) else p.values  # type: ignore[union-attr]
            v = await self.eval(e.expr)
            assert isinstance(v, Vector)
            return aggregate(e.op, v, sorted(e.grouping), e.without, param)
        assert isinstance(e, ast.Call)
        return await self.call(e)

    async def vector_selector(self, e: ast.VectorSelector) -> Vector:
        refs = self._refs(e.offset_ns, e.at_ns, e.at_kw)
        lookback = self.engine.lookback_ns
        if self.nsteps == 0:
            return Vector.empty(0)
        lo, hi = int(refs.min()) - lookback, int(refs.max())
        series = await self.engine.source.select(e.matchers, lo, hi)
        self._budget(len(series) * self.nsteps)
        series = [s for s in series if s.ts.shape[0]]
        if not series:
            return Vector.empty(self.nsteps)
        parts = [s.ts for s in series]
        base = np.zeros(len(parts), dtype=np.int64)
        np.cumsum([p.shape[0] for p in parts[:-1]], out=base[1:])
        idx = stacked_search(parts, refs, "right") - 1  # the newest sample at or before each ref
        safe = np.maximum(idx, base[:, None])
        t = np.concatenate(parts)[safe]
        v = np.concatenate([s.vs for s in series])[safe]
        ok = (idx >= base[:, None]) & (t >= refs - lookback) & ~is_stale(v)
        rows = np.flatnonzero(ok.any(axis=1))
        if not rows.shape[0]:
            return Vector.empty(self.nsteps)
        return Vector([series[i].labels for i in rows.tolist()], v[rows], ok[rows], t[rows])

    async def matrix(self, e: ast.Expr) -> Matrix:
        e = ast.unwrap(e)
        if isinstance(e, ast.SubqueryExpr):
            return await self.subquery(e)
        assert isinstance(e, ast.MatrixSelector)
        vs = e.vs
        ends = self._refs(vs.offset_ns, vs.at_ns, vs.at_kw)
        if self.nsteps == 0:
            return Matrix(
                [],
                np.empty(0, np.int64),
                np.empty(0),
                np.empty((0, 0), np.int64),
                np.empty((0, 0), np.int64),
                ends,
                e.range_ns,
            )
        series = await self.engine.source.select(
            vs.matchers, int(ends.min()) - e.range_ns, int(ends.max())
        )
        labels, ts_parts, vs_parts = [], [], []
        for s in series:
            keep = ~is_stale(s.vs)
            ts, vals = (s.ts, s.vs) if bool(keep.all()) else (s.ts[keep], s.vs[keep])
            if not ts.shape[0]:
                continue
            labels.append(s.labels)
            ts_parts.append(ts)
            vs_parts.append(vals)
        self._budget(sum(p.shape[0] for p in ts_parts) + len(labels) * self.nsteps)
        if not labels:
            return _assemble([], [], [], [], [], ends, e.range_ns, self.nsteps)
        lo = stacked_search(ts_parts, ends - e.range_ns, "left")
        hi = stacked_search(ts_parts, ends, "right")
        return Matrix(labels, np.concatenate(ts_parts), np.concatenate(vs_parts), lo, hi, ends,
                      e.range_ns)  # fmt: skip

    async def subquery(self, e: ast.SubqueryExpr) -> Matrix:
        step = e.step_ns or self.engine.default_step_ns
        pin = self._pinned(e.at_ns, e.at_kw)
        outer = self.steps if pin is None else np.full(self.nsteps, pin, dtype=np.int64)
        ends = outer - e.offset_ns
        if self.nsteps == 0:
            return _assemble([], [], [], [], [], ends, e.range_ns, 0)
        target = int(outer[0]) - e.offset_ns - e.range_ns
        start = step * _go_div(target, step)
        if start < target:
            start += step
        end = int(outer[-1]) - e.offset_ns
        count = max(0, (end - start) // step + 1)
        self._budget(count)
        inner_steps = start + step * np.arange(count, dtype=np.int64)
        inner = Evaluator(self.engine, inner_steps, self.query_start, self.query_end)
        v = await inner.eval(e.expr)
        assert isinstance(v, Vector)
        self._budget(int(v.present.sum()) + len(v) * self.nsteps)
        labels, ts_parts, vs_parts, los, his = [], [], [], [], []
        base = 0
        for i, lab in enumerate(v.labels):
            p = v.present[i]
            ts = inner_steps[p]
            if not ts.shape[0]:
                continue
            lo, hi = windows(ts, base, ends, e.range_ns)
            labels.append(lab)
            ts_parts.append(ts)
            vs_parts.append(v.values[i][p])
            los.append(lo)
            his.append(hi)
            base += ts.shape[0]
        return _assemble(labels, ts_parts, vs_parts, los, his, ends, e.range_ns, self.nsteps)

    async def call(self, e: ast.Call) -> Value:
        name = e.func.name
        if name == "timestamp":
            arg = ast.unwrap(e.args[0])
            if isinstance(arg, ast.VectorSelector):
                return call_instant(e, [await self.vector_selector(arg)], self.steps)
        if name not in MATRIX_FUNCTIONS:
            args = [await self.eval(a) for a in e.args]
            return call_instant(e, args, self.steps)
        index = next(i for i, a in enumerate(e.args) if a.type == ValueType.MATRIX)
        others: list[Value] = []
        for i, a in enumerate(e.args):
            others.append(await self.eval(a) if i != index else String(""))
        m = await self.matrix(e.args[index])
        if name == "absent_over_time":
            found = np.asarray((m.hi > m.lo).any(axis=0), dtype=bool)
            empty = ~found if m.labels else np.ones(self.nsteps, dtype=bool)
            lab = absent_labels(ast.unwrap(e.args[index]))
            return Vector([lab], np.ones((1, self.nsteps)), empty[None, :]).nonempty()
        values, present = call_matrix(name, m, others, self.steps)
        labels = m.labels if name == "last_over_time" else [drop_name(lab) for lab in m.labels]
        # Prometheus refuses equal label sets in a range function's result outright
        return Vector(labels, values, present).nonempty().merged(whole_series=True)


def _assemble(
    labels: list[tuple[tuple[str, str], ...]],
    ts_parts: list[I1],
    vs_parts: list[np.ndarray],
    los: list[I1],
    his: list[I1],
    ends: I1,
    range_ns: int,
    nsteps: int,
) -> Matrix:
    if not labels:
        empty = np.empty((0, nsteps), dtype=np.int64)
        return Matrix([], np.empty(0, np.int64), np.empty(0), empty, empty, ends, range_ns)
    return Matrix(
        labels,
        np.concatenate(ts_parts),
        np.concatenate(vs_parts),
        np.vstack(los),
        np.vstack(his),
        ends,
        range_ns,
    )
