"""Query results as Prometheus' JSON, written in bulk.

Values are strings in Go's ``FormatFloat(v, 'f', -1, 64)`` form (shortest digits,
never an exponent), times are seconds. A series' points go through orjson in one
call and one regular-expression pass that quotes the values and drops ``.0``, so
a day of 15 s points costs microseconds per series, not a Python call per point;
values orjson writes with an exponent, NaN and infinities take the exact slow path.
Scalars are Go's 'f' format, sample values Prometheus' ``MarshalValue`` ('e' below
1e-6 and from 1e21 on).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

import numpy as np
import orjson

from services.common.promnames import Labels
from services.query_api.promql.printer import go_format_f, prom_value
from services.query_api.promql.values import Matrix, Scalar, String, Value, Vector
from services.query_api.routes.prometheus.params import fmt_time, times_seconds


def _heads(tlist: list[object]) -> np.ndarray:
    """Per step ``"],[<t>,"``: what goes before each value (the first gets ``[[`` instead)."""
    return np.array([b'"],[' + orjson.dumps(t) + b',"' for t in tlist], dtype=object)


def _points(heads: np.ndarray, values: np.ndarray) -> bytes:
    """``[[t,"v"],...]`` for one series, ``heads`` from :func:`_heads` for its points."""
    if bool(np.isfinite(values).all()):
        digits = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)
        if b"e" not in digits:
            vals = digits[1:-1].split(b",")
            body = b"".join(chain.from_iterable(zip(heads.tolist(), vals, strict=True)))
            return (b"[[" + body[4:] + b'"]]').replace(b'.0"', b'"')
    ts = [h[4:-2].decode() for h in heads.tolist()]
    return (
        b"["
        + b",".join(
            b"[" + t.encode() + b',"' + prom_value(v).encode() + b'"]'
            for t, v in zip(ts, values.tolist(), strict=True)
        )
        + b"]"
    )


def _metric(labels: Labels) -> bytes:
    return orjson.dumps(dict(labels))


def _series(labels: Labels, heads: np.ndarray, values: np.ndarray) -> bytes:
    return b'{"metric":' + _metric(labels) + b',"values":' + _points(heads, values) + b"}"


def _sorted_rows(labels: list[Labels]) -> list[int]:
    return sorted(range(len(labels)), key=labels.__getitem__)


def range_result(value: Value, steps: np.ndarray) -> Iterator[bytes]:
    """The ``data`` of a range query: a matrix sorted by labels."""
    yield b'{"resultType":"matrix","result":['
    heads = _heads(times_seconds(steps))
    if isinstance(value, Scalar):
        yield _series((), heads, value.values)
    else:
        assert isinstance(value, Vector)
        first = True
        for i in _sorted_rows(value.labels):
            p = value.present[i]
            if not bool(p.any()):
                continue
            h = heads if bool(p.all()) else heads[p]
            yield (b"" if first else b",") + _series(value.labels[i], h, value.values[i][p])
            first = False
    yield b"]}"


def instant_result(value: Value, t_ns: int) -> Iterator[bytes]:
    """The ``data`` of an instant query (scalar, string, vector or matrix)."""
    t = fmt_time(t_ns)
    if isinstance(value, Scalar):
        yield orjson.dumps(
            {"resultType": "scalar", "result": [t, go_format_f(float(value.values[0]))]}
        )
        return
    if isinstance(value, String):
        yield orjson.dumps({"resultType": "string", "result": [t, value.value]})
        return
    if isinstance(value, Matrix):
        yield b'{"resultType":"matrix","result":['
        first = True
        for i in _sorted_rows(value.labels):
            a, b = int(value.lo[i, 0]), int(value.hi[i, 0])
            if b <= a:
                continue
            heads = _heads(times_seconds(value.ts[a:b]))
            yield (b"" if first else b",") + _series(value.labels[i], heads, value.vs[a:b])
            first = False
        yield b"]}"
        return
    assert isinstance(value, Vector)
    items = [
        {"metric": dict(lab), "value": [t, prom_value(float(value.values[i, 0]))]}
        for i, lab in enumerate(value.labels)
        if value.present[i, 0]
    ]
    yield orjson.dumps({"resultType": "vector", "result": items})


def envelope(data: Iterator[bytes]) -> bytes:
    return b'{"status":"success","data":' + b"".join(data) + b"}"
