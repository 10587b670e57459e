"""Implementations of the PromQL functions, keyed by the names of :mod:`.functions_table`.

Range-vector functions are in :mod:`.windows`; this module has the instant-vector
ones, label manipulation, dates, ``histogram_quantile`` and the dispatch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from services.common.promnames import Labels
from services.query_api.promql import ast, windows
from services.query_api.promql.ast import EvalError, ValueType
from services.query_api.promql.functions_table import DATE_FUNCTIONS, FUNCTIONS
from services.query_api.promql.regex import RegexError, compile_anchored
from services.query_api.promql.values import (
    F1,
    F2,
    I1,
    Matrix,
    Scalar,
    String,
    Value,
    Vector,
    drop_name,
    label,
    seconds,
    with_label,
    without,
)

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_MATH: dict[str, Callable[[F2], F2]] = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "exp": np.exp, "sqrt": np.sqrt,
    "ln": np.log, "log2": np.log2, "log10": np.log10, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh,
    "rad": lambda v: v * math.pi / 180, "deg": lambda v: v * 180 / math.pi,
    "sgn": lambda v: np.where(v < 0, -1.0, np.where(v > 0, 1.0, v)),
}  # fmt: skip


def _mapped(v: Vector, values: F2) -> Vector:
    """New values, ``__name__`` dropped (series that then collide merge or fail per step)."""
    return (
        Vector(v.labels, values, v.present).relabel([drop_name(lab) for lab in v.labels]).nonempty()
    )


def _scalar_row(s: Value) -> F1:
    assert isinstance(s, Scalar)
    return s.values


def absent_labels(node: ast.Expr) -> Labels:
    """The labels ``absent()`` gives: those set by exactly one equality matcher."""
    if isinstance(node, ast.MatrixSelector):
        node = node.vs
    if not isinstance(node, ast.VectorSelector):
        return ()
    out: dict[str, str] = {}
    dropped: set[str] = set()
    for m in node.matchers:
        if m.name == "__name__":
            continue
        if m.op == "=" and m.name not in out and m.name not in dropped:
            out[m.name] = m.value
        else:
            out.pop(m.name, None)
            dropped.add(m.name)
    return tuple(sorted((k, v) for k, v in out.items() if v))


def _one_row(values: F1, present: np.ndarray, labels: Labels = ()) -> Vector:
    return Vector([labels], values[None, :].astype(np.float64), present[None, :]).nonempty()


# ---------------------------------------------------------------------- dates
def _date_parts(secs: np.ndarray, what: str) -> F1:
    return np.asarray(_date_values(secs, what), dtype=np.float64)


def _date_values(secs: np.ndarray, what: str) -> Any:
    days = np.floor_divide(secs, 86_400)
    if what == "hour":
        return ((secs - days * 86_400) // 3600).astype(np.float64)
    if what == "minute":
        return (((secs - days * 86_400) % 3600) // 60).astype(np.float64)
    if what == "day_of_week":
        return ((days + 4) % 7).astype(np.float64)
    d = days.astype("datetime64[D]")
    month_start = d.astype("datetime64[M]")
    if what == "year":
        return (d.astype("datetime64[Y]").astype(np.int64) + 1970).astype(np.float64)
    if what == "month":
        return (month_start.astype(np.int64) % 12 + 1).astype(np.float64)
    if what == "day_of_month":
        return ((d - month_start.astype("datetime64[D]")).astype(np.int64) + 1).astype(np.float64)
    if what == "day_of_year":
        year_start = d.astype("datetime64[Y]").astype("datetime64[D]")
        return ((d - year_start).astype(np.int64) + 1).astype(np.float64)
    if what == "days_in_month":
        nxt = (month_start + 1).astype("datetime64[D]")
        return (nxt - month_start.astype("datetime64[D]")).astype(np.int64).astype(np.float64)
    raise AssertionError(what)


def _date(name: str, args: list[Value], steps: I1) -> Vector:
    if not args:
        secs = steps // 1_000_000_000
        return _one_row(_date_parts(secs, name), np.ones(steps.shape[0], dtype=bool))
    v = args[0]
    assert isinstance(v, Vector)
    finite = np.isfinite(v.values)
    secs = np.trunc(np.where(finite, v.values, 0.0)).astype(np.int64)
    out = np.where(finite, _date_parts(secs.ravel(), name).reshape(secs.shape), np.nan)
    return _mapped(v, out)


# ---------------------------------------------------------------------- labels
def _go_expand(template: str, match: object) -> str:
    """Go's ``regexp.Expand``: ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``."""
    out: list[str] = []
    i = 0
    groups = match.groups()  # type: ignore[attr-defined]
    named = match.groupdict()  # type: ignore[attr-defined]
    while i < len(template):
        c = template[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        if template[i + 1 : i + 2] == "$":
            out.append("$")
            i += 2
            continue
        if template[i + 1 : i + 2] == "{":
            end = template.find("}", i + 2)
            name = template[i + 2 : end] if end > 0 else ""
            if end < 0 or not re.fullmatch(r"[A-Za-z0-9_]+", name):
                out.append(c)
                i += 1
                continue
            i = end + 1
        else:
            m = re.match(r"[A-Za-z0-9_]+", template[i + 1 :])
            if m is None:
                out.append(c)
                i += 1
                continue
            name = m.group()
            i += 1 + len(name)
        if name.isdigit():
            k = int(name)
            if k == 0:
                out.append(match.group(0))  # type: ignore[attr-defined]
            elif k <= len(groups):
                out.append(groups[k - 1] or "")
        else:
            out.append(named.get(name) or "")
    return "".join(out)


def label_replace(v: Vector, dst: str, repl: str, src: str, pattern: str) -> Vector:
    try:
        rx = compile_anchored(pattern)
    except RegexError:
        raise EvalError(f"invalid regular expression in label_replace(): {pattern}") from None
    if not _LABEL_NAME.fullmatch(dst):
        raise EvalError(f"invalid destination label name in label_replace(): {dst}")
    out: list[Labels] = []
    cache: dict[Labels, Labels] = {}
    for lab in v.labels:
        got = cache.get(lab)
        if got is None:
            m = rx.match(label(lab, src))
            got = lab if m is None else with_label(lab, dst, _go_expand(repl, m))
            cache[lab] = got
        out.append(got)
    return Vector(v.labels, v.values, v.present).relabel(out)


def label_join(v: Vector, dst: str, sep: str, srcs: list[str]) -> Vector:
    for s in srcs:
        if not _LABEL_NAME.fullmatch(s):
            raise EvalError(f"invalid source label name in label_join(): {s}")
    if not _LABEL_NAME.fullmatch(dst):
        raise EvalError(f"invalid destination label name in label_join(): {dst}")
    out = [with_label(lab, dst, sep.join(label(lab, s) for s in srcs)) for lab in v.labels]
    return Vector(v.labels, v.values, v.present).relabel(out)


# ---------------------------------------------------------------------- histograms
def go_parse_float(text: str) -> float | None:
    """Go's ``strconv.ParseFloat(s, 64)``, None where Go refuses the text."""
    if not text or "_" in text or text != text.strip():
        return None
    low = text.lower()
    if low in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    if low == "nan":
        return math.nan
    try:
        if "0x" in low:
            return float.fromhex(text)
        return float(text)
    except (ValueError, OverflowError):
        return None


def _bucket_quantile(q: F1, bounds: F1, counts: F2) -> F1:
    """Prometheus' bucketQuantile for buckets present at every one of these steps."""
    with np.errstate(all="ignore"):
        res = np.full(counts.shape[1], np.nan)
        if not math.isinf(bounds[-1]) or bounds[-1] < 0:
            out = res
        else:
            # coalesce buckets of one bound, in sorted order
            keep_rows: list[int] = []
            c = counts.copy()
            for i in range(bounds.shape[0]):
                if keep_rows and bounds[i] == bounds[keep_rows[-1]]:
                    c[keep_rows[-1]] = c[keep_rows[-1]] + c[i]
                else:
                    keep_rows.append(i)
            b, c = bounds[keep_rows], c[keep_rows]
            first_nan = np.isnan(c[0])
            running = np.fmax.accumulate(c, axis=0)
            c = np.where(first_nan[None, :] | np.isnan(c), c, running)
            out = res
            if b.shape[0] >= 2:
                obs = c[-1]
                rank = q * obs
                hit = c[:-1] >= rank[None, :]
                idx = np.where(hit.any(axis=0), hit.argmax(axis=0), b.shape[0] - 1)
                cols = np.arange(c.shape[1])
                prev_bound = np.where(idx > 0, b[np.maximum(idx - 1, 0)], 0.0)
                prev_count = np.where(idx > 0, c[np.maximum(idx - 1, 0), cols], 0.0)
                end = b[np.minimum(idx, b.shape[0] - 1)]
                cnt = c[idx, cols] - prev_count
                value = prev_bound + (end - prev_bound) * ((rank - prev_count) / cnt)
                value = np.where(idx == b.shape[0] - 1, b[-2], value)
                value = np.where((idx == 0) & (b[0] <= 0), b[0], value)
                out = np.where(obs == 0, np.nan, value)
        return np.where(np.isnan(q), np.nan, np.where(q < 0, -np.inf, np.where(q > 1, np.inf, out)))


def histogram_quantile(q: F1, v: Vector) -> Vector:
    steps = v.steps
    groups: dict[Labels, list[tuple[float, int]]] = {}
    for i, lab in enumerate(v.labels):
        bound = go_parse_float(label(lab, "le"))
        if bound is None:
            continue
        groups.setdefault(without(lab, ("__name__", "le")), []).append((bound, i))
    out_labels: list[Labels] = []
    values = np.full((len(groups), steps), np.nan)
    present = np.zeros((len(groups), steps), dtype=bool)
    for g, (lab, members) in enumerate(groups.items()):
        out_labels.append(lab)
        members.sort(key=lambda x: x[0])
        rows = np.asarray([r for _, r in members], dtype=np.int64)
        bounds = np.asarray([b for b, _ in members])
        pres = v.present[rows]
        any_p = pres.any(axis=0)
        present[g] = any_p
        if bool(pres.all()):  # every bucket at every step (the usual case): one pass
            values[g] = _bucket_quantile(q, bounds, v.values[rows])
            continue
        patterns, inverse = np.unique(pres[:, any_p].T, axis=0, return_inverse=True)
        cols = np.flatnonzero(any_p)
        inverse = inverse.ravel()
        for p, pattern in enumerate(patterns):
            sel = cols[inverse == p]
            use = np.flatnonzero(pattern)
            values[g, sel] = _bucket_quantile(q[sel], bounds[use], v.values[rows[use]][:, sel])
    return Vector(out_labels, values, present).nonempty()


# ---------------------------------------------------------------------- dispatch
MATRIX_FUNCTIONS = frozenset(n for n, f in FUNCTIONS.items() if ValueType.MATRIX in f.arg_types)


def call_matrix(name: str, m: Matrix, others: list[Value], steps: I1) -> tuple[F2, np.ndarray]:
    """A function of a range vector: values and presence per series and step."""
    if name in ("rate", "increase", "delta"):
        res = windows.extrapolated(m, name != "delta", name == "rate")
    elif name in ("irate", "idelta"):
        res = windows.instant_value(m, name == "irate")
    elif name == "deriv":
        res = windows.deriv(m)
    elif name == "predict_linear":
        res = windows.predict_linear(m, steps, _scalar_row(others[1]))
    elif name == "holt_winters":
        res = windows.holt_winters(m, _scalar_row(others[1]), _scalar_row(others[2]))
    elif name == "quantile_over_time":
        res = windows.quantile_over_time(m, _scalar_row(others[0]))
    else:
        res = windows.over_time(name, m)
    return windows.shaped(m, res)


def call_instant(node: ast.Call, args: list[Value], steps: I1) -> Value:
    name = node.func.name
    nsteps = steps.shape[0]
    if name in _MATH:
        v = args[0]
        assert isinstance(v, Vector)
        with np.errstate(all="ignore"):
            return _mapped(v, _MATH[name](v.values))
    if name == "time":
        return Scalar(seconds(steps))
    if name == "pi":
        return Scalar(np.full(nsteps, math.pi))
    if name == "scalar":
        v = args[0]
        assert isinstance(v, Vector)
        count = v.present.sum(axis=0)
        total = np.where(v.present, v.values, -0.0).sum(axis=0) if len(v) else np.zeros(nsteps)
        return Scalar(np.where(count == 1, total, np.nan))
    if name == "vector":
        return _one_row(_scalar_row(args[0]), np.ones(nsteps, dtype=bool))
    v0 = args[0] if args else None
    if name in DATE_FUNCTIONS:
        return _date(name, args, steps)
    assert isinstance(v0, Vector) or name in ("histogram_quantile", "histogram_fraction")
    if name == "absent":
        assert isinstance(v0, Vector)
        empty = np.asarray(~v0.present.any(axis=0)) if len(v0) else np.ones(nsteps, dtype=bool)
        return _one_row(np.ones(nsteps), empty, absent_labels(ast.unwrap(node.args[0])))
    if name in ("clamp", "clamp_min", "clamp_max"):
        assert isinstance(v0, Vector)
        with np.errstate(all="ignore"):
            if name == "clamp":
                lo, hi = _scalar_row(args[1])[None, :], _scalar_row(args[2])[None, :]
                out = Vector(v0.labels, v0.values, v0.present & ~(hi < lo))
                return _mapped(out, np.maximum(lo, np.minimum(hi, v0.values)))
            bound = _scalar_row(args[1])[None, :]
            fn = np.minimum if name == "clamp_max" else np.maximum
            return _mapped(v0, fn(bound, v0.values))
    if name == "round":
        assert isinstance(v0, Vector)
        to = _scalar_row(args[1]) if len(args) > 1 else np.ones(nsteps)
        with np.errstate(all="ignore"):
            inv = (1.0 / to)[None, :]
            return _mapped(v0, np.floor(v0.values * inv + 0.5) / inv)
    if name == "timestamp":
        assert isinstance(v0, Vector)
        if v0.times is not None:
            t = seconds(v0.times)
        else:
            t = np.repeat(seconds(steps)[None, :], len(v0), axis=0)
        return _mapped(v0, t)
    if name in ("sort", "sort_desc"):
        assert isinstance(v0, Vector)
        if nsteps != 1 or len(v0) < 2:
            return v0
        vals = v0.values[:, 0]
        key = -vals if name == "sort_desc" else vals
        order = np.lexsort((np.nan_to_num(key), np.isnan(vals)))
        return v0.take(order)
    if name == "label_replace":
        assert isinstance(v0, Vector)
        strs = [_string(a) for a in args[1:]]
        return label_replace(v0, *strs)
    if name == "label_join":
        assert isinstance(v0, Vector)
        strs = [_string(a) for a in args[1:]]
        return label_join(v0, strs[0], strs[1], strs[2:])
    if name == "histogram_quantile":
        v1 = args[1]
        assert isinstance(v1, Vector)
        return histogram_quantile(_scalar_row(args[0]), v1)
    if name in ("histogram_count", "histogram_sum", "histogram_fraction"):
        return Vector.empty(nsteps)  # native histograms only: Kelvin stores floats
    raise EvalError(f"function {name!r} is not implemented")


def _string(v: Value) -> str:
    assert isinstance(v, String)
    return v.value
