"""Aggregation operators (``sum by (...)``, ``topk``, ``quantile``, ...) over every step at once.

Series are folded in the order Prometheus meets them (its storage order, which
:class:`~.values.Vector` keeps), one numpy operation per series, so sums and
means are Prometheus' own floating-point results, not merely close to them.
"""

from __future__ import annotations

import numpy as np

from services.common.promnames import Labels
from services.query_api.promql.ast import EvalError
from services.query_api.promql.printer import go_float, go_format_f
from services.query_api.promql.values import F1, F2, Vector, drop_name, keep, with_label, without

_LABEL_NAME_OK = __import__("re").compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _group_labels(lab: Labels, grouping: list[str], without_: bool) -> Labels:
    if without_:
        return without(drop_name(lab), grouping)
    return keep(lab, grouping)


def _groups(v: Vector, grouping: list[str], without_: bool) -> tuple[list[Labels], np.ndarray]:
    """Group labels in first-seen order and each series' group index."""
    index: dict[Labels, int] = {}
    out: list[Labels] = []
    gid = np.empty(len(v), dtype=np.int64)
    first_seen = np.argsort(
        np.where(v.present.any(axis=1), v.present.argmax(axis=1), v.steps), kind="stable"
    )
    for i in first_seen.tolist():
        g = _group_labels(v.labels[i], grouping, without_)
        j = index.get(g)
        if j is None:
            j = index[g] = len(out)
            out.append(g)
        gid[i] = j
    return out, gid


def _int_param(k: F1) -> np.ndarray:
    bad = ~((k <= 9.223372036854775807e18) & (k >= -9.223372036854775808e18))
    if bool(bad.any()):
        raise EvalError(
            f"Scalar value {go_float(float(k[np.flatnonzero(bad)[0]]))} overflows int64"
        )
    return np.trunc(k).astype(np.int64)


def aggregate(
    op: str, v: Vector, grouping: list[str], without_: bool, param: F1 | str | None
) -> Vector:
    steps = v.steps
    if op == "count_values":
        assert isinstance(param, str)
        return _count_values(v, grouping, without_, param)
    if op in ("topk", "bottomk"):
        assert isinstance(param, np.ndarray)
        return _topk(v, grouping, without_, _int_param(param), op == "topk")
    if len(v) == 0:
        return Vector.empty(steps)
    labels, gid = _groups(v, grouping, without_)
    g_count = len(labels)
    vals, pres = v.values, v.present
    count = np.zeros((g_count, steps), dtype=np.int64)
    np.add.at(count, gid, pres.astype(np.int64))
    out: F2
    with np.errstate(all="ignore"):
        if op == "sum":
            out = np.full((g_count, steps), -0.0)  # -0.0 + x is x for every x
            np.add.at(out, gid, np.where(pres, vals, -0.0))
        elif op in ("max", "min"):
            out = np.full((g_count, steps), np.nan)
            ufunc = np.fmax if op == "max" else np.fmin
            ufunc.at(out, gid, np.where(pres, vals, np.nan))
        elif op == "count":
            out = count.astype(np.float64)
        elif op == "group":
            out = np.ones((g_count, steps))
        elif op == "avg":
            out = _avg(vals, pres, gid, g_count)
        elif op in ("stddev", "stdvar"):
            out = _variance(vals, pres, gid, g_count)
            if op == "stddev":
                out = np.sqrt(out)
        elif op == "quantile":
            assert isinstance(param, np.ndarray)
            out = _quantile(vals, pres, gid, g_count, param)
        else:
            raise AssertionError(op)
    return Vector(labels, out, count > 0)


def _avg(vals: F2, pres: np.ndarray, gid: np.ndarray, g_count: int) -> F2:
    steps = vals.shape[1]
    mean = np.zeros((g_count, steps))
    count = np.zeros((g_count, steps))
    for i in range(vals.shape[0]):
        g, p, x = int(gid[i]), pres[i], vals[i]
        mu, n = mean[g], count[g]
        first = p & (n == 0)
        later = p & (n > 0)
        n_new = np.where(p, n + 1, n)
        inf = np.isinf(mu)
        skip = inf & ((np.isinf(x) & ((mu > 0) == (x > 0))) | (~np.isinf(x) & ~np.isnan(x)))
        upd = mu + (x / n_new - mu / n_new)
        mean[g] = np.where(first, x, np.where(later & ~skip, upd, mu))
        count[g] = n_new
    return mean


def _variance(vals: F2, pres: np.ndarray, gid: np.ndarray, g_count: int) -> F2:
    steps = vals.shape[1]
    mean = np.zeros((g_count, steps))
    acc = np.zeros((g_count, steps))
    count = np.zeros((g_count, steps))
    for i in range(vals.shape[0]):
        g, p, x = int(gid[i]), pres[i], vals[i]
        n = count[g]
        first = p & (n == 0)
        later = p & (n > 0)
        n_new = np.where(p, n + 1, n)
        delta = x - mean[g]
        m_new = mean[g] + delta / n_new
        a_new = acc[g] + delta * (x - m_new)
        mean[g] = np.where(first, x, np.where(later, m_new, mean[g]))
        acc[g] = np.where(first, 0.0, np.where(later, a_new, acc[g]))
        count[g] = n_new
    return acc / count


def _sorted_columns(vals: F2, pres: np.ndarray) -> tuple[F2, np.ndarray]:
    """Each column's present values ascending, NaN first (Prometheus' order), and counts."""
    cls = np.where(pres, np.where(np.isnan(vals), 0, 1), 2)
    filled = np.where(pres & ~np.isnan(vals), vals, 0.0)
    order = np.lexsort((filled, cls), axis=0)
    return np.take_along_axis(vals, order, axis=0), pres.sum(axis=0)


def _quantile(vals: F2, pres: np.ndarray, gid: np.ndarray, g_count: int, q: F1) -> F2:
    steps = vals.shape[1]
    out = np.full((g_count, steps), np.nan)
    for g in range(g_count):
        rows = np.flatnonzero(gid == g)
        s, c = _sorted_columns(vals[rows], pres[rows])
        nf = c.astype(np.float64)
        rank = q * (nf - 1)
        lower = np.maximum(0, np.floor(rank))
        upper = np.minimum(nf - 1, lower + 1)
        weight = rank - np.floor(rank)
        li = np.clip(np.nan_to_num(lower), 0, max(len(rows) - 1, 0)).astype(np.int64)
        ui = np.clip(np.nan_to_num(upper), 0, max(len(rows) - 1, 0)).astype(np.int64)
        cols = np.arange(steps)
        res = s[li, cols] * (1 - weight) + s[ui, cols] * weight
        res = np.where(np.isnan(q), np.nan, np.where(q < 0, -np.inf, np.where(q > 1, np.inf, res)))
        out[g] = res
    return out


def _topk(v: Vector, grouping: list[str], without_: bool, k: np.ndarray, top: bool) -> Vector:
    steps = v.steps
    if len(v) == 0:
        return Vector.empty(steps)
    _, gid = _groups(v, grouping, without_)
    selected = np.zeros_like(v.present)
    order_rows: list[int] = []
    for g in range(int(gid.max()) + 1):
        rows = np.flatnonzero(gid == g)
        vals, pres = v.values[rows], v.present[rows]
        nan = np.isnan(vals)
        cls = np.where(pres, np.where(nan, 1, 0), 2)  # NaN ranks after every number
        filled = np.where(pres & ~nan, -vals if top else vals, 0.0)
        order = np.lexsort((filled, cls), axis=0)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(len(rows))[:, None], axis=0)
        selected[rows] = pres & (rank < k[None, :])
        if steps == 1:
            order_rows.extend(rows[order[:, 0]].tolist())
    out = Vector(list(v.labels), v.values, selected)
    if steps == 1:  # an instant query lists each group's picks best first, as Prometheus does
        out = out.take(np.asarray(order_rows, dtype=np.int64))
    return out.nonempty()


def _count_values(v: Vector, grouping: list[str], without_: bool, value_label: str) -> Vector:
    if not _LABEL_NAME_OK.fullmatch(value_label):
        raise EvalError(f'invalid label name "{value_label}"')
    steps = v.steps
    if len(v) == 0:
        return Vector.empty(steps)
    rows, cols = np.nonzero(v.present)
    vals = v.values[rows, cols]
    bits = vals.view(np.uint64).copy()
    bits[np.isnan(vals)] = np.uint64(0x7FF8000000000001)
    uniq, inverse = np.unique(bits, return_inverse=True)
    texts = [go_format_f(float(x)) for x in uniq.view(np.float64).tolist()]
    n_uniq = uniq.shape[0]
    pairs, pair_of = np.unique(rows * n_uniq + inverse, return_inverse=True)
    index: dict[Labels, int] = {}
    out_labels: list[Labels] = []
    slots = np.empty(pairs.shape[0], dtype=np.int64)
    for j, pair in enumerate(pairs.tolist()):  # one per series and distinct value
        r, u = divmod(pair, n_uniq)
        lab = with_label(v.labels[r], value_label, texts[u])
        g = without(drop_name(lab), grouping) if without_ else keep(lab, [*grouping, value_label])
        slot = index.get(g)
        if slot is None:
            slot = index[g] = len(out_labels)
            out_labels.append(g)
        slots[j] = slot
    keys = slots[pair_of.ravel()]
    counts = np.zeros((len(out_labels), steps))
    np.add.at(counts, (keys, cols), 1.0)
    return Vector(out_labels, counts, counts > 0)
