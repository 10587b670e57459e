"""Binary operators: arithmetic, comparisons (with ``bool``), set operators and vector matching.

Vector/vector operations pair series by their match signature (``on``/``ignoring``
labels) once, then compute every pair and step in one numpy operation; the checks
Prometheus makes per step (one match per series unless ``group_left``/``group_right``,
unique results) are made over the presence masks.
"""

from __future__ import annotations

import numpy as np

from services.common.promnames import Labels
from services.query_api.promql import ast
from services.query_api.promql.ast import EvalError
from services.query_api.promql.values import (
    F1,
    F2,
    Scalar,
    Value,
    Vector,
    drop_name,
    keep,
    label,
    labels_text,
    with_label,
    without,
)


def _odd_int(y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        frac, whole = np.modf(y)
        small = np.abs(y) < 2.0**53
        odd = small & (frac == 0) & (np.fmod(np.where(small, whole, 0.0), 2) != 0)
    return np.asarray(odd, dtype=bool)


def go_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Go's ``math.Pow``: integer powers by repeated squaring (numpy's vectorised pow
    can be an ulp off), its special cases in its order, the rest via exp(log)."""
    x, y = (np.array(a, dtype=np.float64) for a in np.broadcast_arrays(x, y))
    out = np.full(x.shape, np.nan)
    todo = np.ones(x.shape, dtype=bool)

    def done(mask: np.ndarray, value: np.ndarray | float) -> None:
        nonlocal todo
        m = mask & todo
        out[m] = value[m] if isinstance(value, np.ndarray) else value
        todo &= ~m

    with np.errstate(all="ignore"):
        done((y == 0) | (x == 1), 1.0)
        done(y == 1, x)
        done(np.isnan(x) | np.isnan(y), np.nan)
        neg_zero_odd = np.signbit(x) & _odd_int(y)
        done((x == 0) & (y < 0), np.where(neg_zero_odd, -np.inf, np.inf))
        done((x == 0) & (y > 0), np.where(neg_zero_odd, x, 0.0))
        inf_y = np.isinf(y)
        done(inf_y & (x == -1), 1.0)
        done(inf_y & ((np.abs(x) < 1) == (y > 0)), 0.0)
        done(inf_y, np.inf)
        inf_x = np.isinf(x)
        neg_inf = inf_x & (x < 0)
        # Pow(-Inf, y) = Pow(-0, -y)
        done(neg_inf & (y > 0), np.where(_odd_int(y), -np.inf, np.inf))
        done(neg_inf & (y < 0), np.where(_odd_int(y), -0.0, 0.0))
        done(inf_x & (y < 0), 0.0)
        done(inf_x, np.inf)
        done(y == 0.5, np.sqrt(x))
        done(y == -0.5, 1 / np.sqrt(x))
        yf, yi = np.modf(np.abs(y))
        done((yf != 0) & (x < 0), np.nan)
        huge = yi >= 2.0**63
        done(huge & (x == -1), 1.0)
        done(huge & ((np.abs(x) < 1) == (y > 0)), 0.0)
        done(huge, np.inf)
        if not bool(todo.any()):
            return out
        xs, ys, yf, yi = x[todo], y[todo], yf[todo], yi[todo]
        up = yf > 0.5
        yf = np.where(up, yf - 1, yf)
        yi = np.where(up, yi + 1, yi)
        a1 = np.where(yf != 0, np.exp(yf * np.log(xs)), 1.0)
        ae = np.zeros(xs.shape, dtype=np.int64)
        x1, xe = np.frexp(xs)
        xe = xe.astype(np.int64)
        i = yi.astype(np.int64)
        live = i != 0
        while bool(live.any()):
            blow = live & ((xe < -(1 << 12)) | (xe > (1 << 12)))
            ae = np.where(blow, ae + xe, ae)
            live &= ~blow
            odd = live & ((i & 1) == 1)
            a1 = np.where(odd, a1 * x1, a1)
            ae = np.where(odd, ae + xe, ae)
            x1 = np.where(live, x1 * x1, x1)
            xe = np.where(live, xe << 1, xe)
            small = live & (x1 < 0.5)
            x1 = np.where(small, x1 + x1, x1)
            xe = np.where(small, xe - 1, xe)
            i = np.where(live, i >> 1, i)
            live &= i != 0
        neg = ys < 0
        a1 = np.where(neg, 1 / a1, a1)
        ae = np.where(neg, -ae, ae)
        out[todo] = np.ldexp(a1, np.clip(ae, -(2**31), 2**31 - 1).astype(np.int32))
    return out


def apply(op: str, a: F2 | F1, b: F2 | F1) -> np.ndarray:
    """The operator on floats, as Go computes it (IEEE; ``%`` is math.Mod, ``^`` math.Pow)."""
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        if op == "%":
            return np.fmod(a, b)
        if op == "^":
            return go_pow(np.asarray(a), np.asarray(b))
        if op == "atan2":
            return np.arctan2(a, b)
        if op == "==":
            return np.asarray(a == b)
        if op == "!=":
            return np.asarray(a != b)
        if op == ">":
            return np.asarray(a > b)
        if op == "<":
            return np.asarray(a < b)
        if op == ">=":
            return np.asarray(a >= b)
        if op == "<=":
            return np.asarray(a <= b)
    raise AssertionError(op)


def _drops_name(op: str) -> bool:
    return op in ast.ARITHMETIC


def scalar_scalar(op: str, a: Scalar, b: Scalar) -> Scalar:
    out = apply(op, a.values, b.values)
    return Scalar(out.astype(np.float64))


def vector_scalar(op: str, v: Vector, s: Scalar, swap: bool, return_bool: bool) -> Vector:
    """``v op s`` (or ``s op v`` when ``swap``); a comparison filters or, with bool, gives 0/1."""
    sv = s.values[None, :]
    res = apply(op, sv, v.values) if swap else apply(op, v.values, sv)
    present = v.present
    if op in ast.COMPARISONS:
        keep_ = np.asarray(res, dtype=bool)
        if return_bool:
            values = keep_.astype(np.float64)
        else:
            values = v.values
            present = present & keep_
    else:
        values = np.asarray(res, dtype=np.float64)
    drop = _drops_name(op) or return_bool
    out = Vector(v.labels, values, present)
    if drop:
        out = out.relabel([drop_name(lab) for lab in v.labels])
    return out.nonempty()


def _signature(lab: Labels, m: ast.VectorMatching) -> Labels:
    if m.on:
        return keep(lab, m.labels)
    return without(lab, [*m.labels, "__name__"])


def _presence_by_sig(
    v: Vector, m: ast.VectorMatching
) -> tuple[list[Labels], dict[Labels, np.ndarray]]:
    sigs = [_signature(lab, m) for lab in v.labels]
    anyp: dict[Labels, np.ndarray] = {}
    for sig, row in zip(sigs, v.present, strict=True):
        got = anyp.get(sig)
        anyp[sig] = row.copy() if got is None else got | row
    return sigs, anyp


def set_operation(op: str, lhs: Vector, rhs: Vector, m: ast.VectorMatching) -> Vector:
    steps = lhs.steps
    none = np.zeros(steps, dtype=bool)
    if op in ("and", "unless"):
        lsigs = [_signature(lab, m) for lab in lhs.labels]
        _, rany = _presence_by_sig(rhs, m)
        hit = np.zeros((len(lhs), steps), dtype=bool)
        for i, sig in enumerate(lsigs):
            hit[i] = rany.get(sig, none)
        present = lhs.present & (hit if op == "and" else ~hit)
        return Vector(lhs.labels, lhs.values, present, lhs.times).nonempty()
    _, lany = _presence_by_sig(lhs, m)
    rsigs = [_signature(lab, m) for lab in rhs.labels]
    blocked = np.zeros((len(rhs), steps), dtype=bool)
    for i, sig in enumerate(rsigs):
        blocked[i] = lany.get(sig, none)
    rpresent = rhs.present & ~blocked
    out = Vector(
        lhs.labels + rhs.labels,
        np.concatenate([lhs.values, rhs.values]),
        np.concatenate([lhs.present, rpresent]),
    )
    return out.merged().nonempty()


def vector_vector(
    op: str, lhs: Vector, rhs: Vector, m: ast.VectorMatching, return_bool: bool
) -> Vector:
    steps = lhs.steps
    if len(lhs) == 0 or len(rhs) == 0:
        return Vector.empty(steps)
    swapped = m.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    msigs = [_signature(lab, m) for lab in many.labels]
    by_sig: dict[Labels, list[int]] = {}
    for j, lab in enumerate(one.labels):
        by_sig.setdefault(_signature(lab, m), []).append(j)
    any_many = many.present.any(axis=0)
    for sig, rows in by_sig.items():
        if len(rows) > 1:
            dup = (one.present[rows].sum(axis=0) > 1) & any_many
            if bool(dup.any()):
                t = int(np.flatnonzero(dup)[0])
                both = [one.labels[r] for r in rows if one.present[r, t]][:2]
                side = "left" if swapped else "right"
                raise EvalError(
                    f"found duplicate series for the match group {labels_text(sig)} on the "
                    f"{side} hand-side of the operation: [{labels_text(both[0])}, "
                    f"{labels_text(both[1])}];many-to-many matching not allowed: matching "
                    "labels must be unique on one side"
                )
    li: list[int] = []
    ri: list[int] = []
    out_labels: list[Labels] = []
    pair_sig: list[int] = []
    sig_ids: dict[Labels, int] = {}
    drop = _drops_name(op)
    for i, sig in enumerate(msigs):
        for j in by_sig.get(sig, ()):
            li.append(i)
            ri.append(j)
            pair_sig.append(sig_ids.setdefault(sig, len(sig_ids)))
            out_labels.append(
                _result_labels(many.labels[i], one.labels[j], op, m, return_bool, drop)
            )
    if not li:
        return Vector.empty(steps)
    lv, rv = many.values[li], one.values[ri]
    a, b = (rv, lv) if swapped else (lv, rv)
    present = many.present[li] & one.present[ri]
    res = apply(op, a, b)
    if op in ast.COMPARISONS:
        kept = np.asarray(res, dtype=bool)
        if return_bool:
            values = kept.astype(np.float64)
        else:
            values = a
            present = present & kept
    else:
        values = np.asarray(res, dtype=np.float64)
    _check_unique(present, pair_sig, out_labels, m.card)
    return Vector(out_labels, values, present).merged().nonempty()


def _result_labels(
    many: Labels, one: Labels, op: str, m: ast.VectorMatching, return_bool: bool, drop: bool
) -> Labels:
    lab = drop_name(many) if drop else many
    if m.card == "one-to-one":
        lab = keep(lab, m.labels) if m.on else without(lab, m.labels)
    for name in m.include:
        lab = with_label(lab, name, label(one, name))
    return drop_name(lab) if return_bool else lab


def _check_unique(
    present: np.ndarray, pair_sig: list[int], out_labels: list[Labels], card: str
) -> None:
    sig = np.asarray(pair_sig, dtype=np.int64)
    if card == "one-to-one":
        counts = np.zeros((int(sig.max()) + 1, present.shape[1]), dtype=np.int64)
        np.add.at(counts, sig, present.astype(np.int64))
        if bool((counts > 1).any()):
            raise EvalError(
                "multiple matches for labels: many-to-one matching must be explicit "
                "(group_left/group_right)"
            )
        return
    seen: dict[tuple[int, Labels], int] = {}
    for k, key in enumerate(zip(pair_sig, out_labels, strict=True)):
        prev = seen.get(key)
        if prev is not None and bool((present[prev] & present[k]).any()):
            raise EvalError(
                "multiple matches for labels: grouping labels must ensure unique matches"
            )
        seen[key] = k


def binary(node: ast.BinaryExpr, lhs: Value, rhs: Value) -> Value:
    op = node.op
    if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
        return scalar_scalar(op, lhs, rhs)
    if isinstance(lhs, Vector) and isinstance(rhs, Scalar):
        return vector_scalar(op, lhs, rhs, False, node.return_bool)
    if isinstance(lhs, Scalar) and isinstance(rhs, Vector):
        return vector_scalar(op, rhs, lhs, True, node.return_bool)
    assert isinstance(lhs, Vector) and isinstance(rhs, Vector)
    m = node.matching or ast.VectorMatching()
    if op in ast.SET_OPS:
        return set_operation(op, lhs, rhs, m)
    return vector_vector(op, lhs, rhs, m, node.return_bool)
