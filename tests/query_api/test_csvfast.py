"""The CSV and JSON writers against Python's own formatting, and compiled against numpy."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from services.common.times import format_iso_many
from services.query_api import csvfast, csvtimes, encode
from tests.support.native import require_native

I64 = st.integers(-(2**63), 2**63 - 1)
SECOND = 10**9


def _check(name: str, ts: np.ndarray, vs: np.ndarray, iso: bool) -> None:
    fast = csvfast.lines(name, ts, vs, iso).decode().split("\n")
    assert fast[-1] == ""  # every line ends with a newline
    times = format_iso_many(ts) if iso else [str(t) for t in ts.tolist()]
    field = '"' + name.replace('"', '""') + '"' if any(c in name for c in ',"') else name
    assert len(fast) - 1 == len(ts)
    for line, t, v in zip(fast[:-1], times, vs.tolist(), strict=True):
        head, _, value = line.rpartition(",")
        assert head == f"{field},{t}"
        if np.isnan(v):
            assert value == ""
        else:  # bit-exact round trip, and Python's digits where it writes no exponent
            assert np.float64(float(value)).tobytes() == np.float64(v).tobytes(), (value, v)
            if v == 0 or 1e-4 <= abs(v) < 1e16:
                assert value == repr(v)


@settings(max_examples=60, deadline=None)
@given(
    ts=hnp.arrays(np.int64, st.integers(1, 300), elements=I64),
    bits=hnp.arrays(np.uint64, 300, elements=st.integers(0, 2**64 - 1)),
    sort=st.booleans(),
    name=st.sampled_from(["/a", "/hall/row0/rack0/node0/power", '/x,"y"']),
)
def test_any_times_and_values_match_python(
    ts: np.ndarray, bits: np.ndarray, sort: bool, name: str
) -> None:
    """Any int64 time (sub-second, before 1970, unsorted) and any float64 bit pattern
    (subnormal, huge, NaN; ±inf takes the Python path)."""
    vs = bits[: ts.shape[0]].view(np.float64).copy()
    ts = np.sort(ts) if sort else ts
    _check(name, ts, vs, iso=True)
    _check(name, np.abs(ts[ts > -(2**63)]), vs[ts > -(2**63)], iso=False)


def test_typical_sensor_data_is_exact_text() -> None:
    """Whole seconds across a day boundary, then sub-second times, 3-decimal values, gaps."""
    t0 = (1_764_547_200 - 5) * SECOND  # 2025-11-30T23:59:55Z
    ts = t0 + np.arange(10, dtype=np.int64) * SECOND
    vs = np.round(np.linspace(-2.5, 250.123, 10), 3)
    vs[3] = np.nan
    out = csvfast.lines("/n/p", ts, vs).decode().splitlines()
    assert out[0] == f"/n/p,2025-11-30T23:59:55.000000000Z,{float(vs[0])!r}"
    assert out[3] == "/n/p,2025-11-30T23:59:58.000000000Z,"
    assert out[5] == f"/n/p,2025-12-01T00:00:00.000000000Z,{float(vs[5])!r}"
    _check("/n/p", ts, vs, iso=True)
    # the same thread formats the next slice with fractions, then whole seconds again
    _check("/n/p", ts + 123_456_789, vs, iso=True)
    _check("/n/p", ts[:4], vs[:4], iso=True)
    _check("/other", ts, vs, iso=False)


def test_answers_too_large_to_keep_scratch_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the size kept per thread, fresh buffers: the kept ones' state must not leak in."""
    monkeypatch.setattr(csvfast, "KEEP_BYTES", 2000)
    monkeypatch.setattr(csvtimes, "KEEP_BYTES", 2000)
    ts = 1_764_547_200 * SECOND + np.arange(100, dtype=np.int64) * SECOND
    vs = np.arange(100) / 7
    for t, n in ((ts, 10), (ts, 100), (ts + 5, 100), (ts + 5, 10), (ts, 100), (ts, 10)):
        _check("/n/p", t[:n], vs[:n], iso=True)


def test_infinities_and_long_values_with_short_heads_take_the_python_path() -> None:
    ts = np.array([1, 2], dtype=np.int64)
    assert csvfast.lines("/a", ts, np.array([np.inf, -np.inf]), iso=False) == (
        b"/a,1,inf\n/a,2,-inf\n"
    )
    tiny = np.array([-2.2250738585072014e-308, 1.0])  # longer than "/a,1," is wide
    assert csvfast.lines("/a", ts, tiny, iso=False) == b"/a,1,-2.2250738585072014e-308\n/a,2,1.0\n"
    assert csvfast.lines("/a", ts[:0], tiny[:0]) == b""


def _both(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], object]) -> tuple[object, object]:
    """``fn()`` by the compiled encoder and by the numpy/orjson code."""
    compiled = require_native()
    monkeypatch.setattr(csvfast, "compiled", compiled)
    a = fn()
    monkeypatch.setattr(csvfast, "compiled", None)
    return a, fn()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ts=hnp.arrays(np.int64, st.integers(1, 200), elements=I64),
    bits=hnp.arrays(np.uint64, 200, elements=st.integers(0, 2**64 - 1)),
    name=st.sampled_from(["/a", "/hall/row0/rack0/node0/power", '/x,"y"']),
    iso=st.booleans(),
)
def test_the_compiled_writer_writes_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, ts: np.ndarray, bits: np.ndarray, name: str, iso: bool
) -> None:
    """csrc/encode.c beside the numpy code: any time, any value bits (±inf and long values
    behind short heads take the Python path in both), JSON numbers as orjson writes them."""
    vs = bits[: ts.shape[0]].view(np.float64).copy()
    for t in (ts, np.sort(ts), np.abs(ts[ts > -(2**63)]) // 10**9):  # also short raw times
        v = vs[: t.shape[0]]
        a, b = _both(monkeypatch, lambda t=t, v=v: csvfast.lines(name, t, v, iso))
        assert a == b
    for arr in (vs, ts):
        a, b = _both(monkeypatch, lambda arr=arr: bytes(encode.numbers(arr)))
        assert a == b == orjson.dumps(arr, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]


def test_the_compiled_writer_on_the_edges_of_doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every power of two and its neighbours, every power of ten and its neighbours,
    subnormals, the largest double, short decimals: the digits and layout of orjson."""
    vals = []
    for e in range(-1074, 1024):
        p = math.ldexp(1.0, e)
        vals += [p, math.nextafter(p, 0), math.nextafter(p, math.inf)]
    for e in range(-323, 309):
        p = float(f"1e{e}")
        vals += [p, math.nextafter(p, 0), math.nextafter(p, math.inf), 5 * p]
    vals += [i / 1000 for i in range(-5000, 5000)] + [0.0, -0.0, math.nan, math.inf, -math.inf]
    arr = np.array([v for v in vals if not math.isinf(v)] + [-v for v in vals if v == v])
    a, b = _both(monkeypatch, lambda: bytes(encode.numbers(arr)))
    assert a == b
    ts = 1_764_547_200 * SECOND + np.arange(arr.shape[0], dtype=np.int64) * 997_000_003
    a, b = _both(monkeypatch, lambda: csvfast.lines("/e", ts, arr, True))
    assert a == b


def test_the_compiled_writers_shortcuts_write_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """csrc/encode.c takes shortcuts for what sensors send: short decimals (their digits
    without Schubfach), timestamps sharing leading digits, times within one minute and
    on whole seconds. The same bytes as orjson and the numpy code on each shortcut's
    edges: decimals of 0 to 8 places at every magnitude around the shortcut's bounds (1,
    10^8, 10^9) and the doubles next to them, timestamps that cross 10^10 and change
    their leading digits at every step, and times across minutes, days and 1970, on
    whole seconds and between."""
    rng = np.random.default_rng(17)
    vals = []
    for places in range(9):
        for mag in (
            1e-7,
            1e-5,
            1e-3,
            0.5,
            1.0,
            7.0,
            1e3,
            1e7,
            9.9e7,
            1e8,
            1.2e8,
            9.99e8,
            1e9,
            1e10,
        ):
            digits = rng.integers(0, 10**6, 40) / 10**places
            for v in (mag + digits * mag / 10**6, np.round(mag * (1 + digits / 10**6), places)):
                vals += v.tolist()
    vals += [1.0, 1e8, 99999999.999999, 100000000.0, 999999999.999999, 1e9, 0.999999, 1.000001]
    # the one-conversion path's edges: below 10^4 with at most four decimals
    vals += [9999.9999, 9999.99999, 10000.0, 10000.0001, 1.0001, 1.00001, 9999.0, 1000.5]
    vals += [math.nextafter(v, d) for v in list(vals) for d in (0.0, math.inf)]
    arr = np.array(vals + [-v for v in vals])
    assert np.isfinite(arr).all()
    a, b = _both(monkeypatch, lambda: bytes(encode.numbers(arr)))
    assert a == b == orjson.dumps(arr, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    # one at a time: the values a block's two-lane test leaves to the scalar one
    one, _ = _both(
        monkeypatch,
        lambda: b",".join(bytes(encode.numbers(arr[i : i + 1])) for i in range(arr.shape[0])),
    )
    assert one == a
    steps = rng.integers(1, 10**11, 3000).cumsum()
    for ts in (
        (10**10 - 1500 + np.arange(3000)).astype(np.int64),  # crossing 10^10
        (1_764_547_200 * SECOND + steps).astype(np.int64),  # leading digits change
        np.sort(rng.integers(-(2**63), 2**63 - 1, 3000)),
    ):
        a, b = _both(monkeypatch, lambda ts=ts: bytes(encode.numbers(ts)))
        assert a == b == orjson.dumps(ts, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    v = arr[:3000]
    for ts in (
        (1_764_547_140 * SECOND + np.arange(3000) * 997_000_001).astype(np.int64),  # minutes
        # whole seconds (a pusher's default stamps) beside half seconds
        (1_764_547_140 * SECOND + rng.integers(1, 3, 3000).cumsum() * SECOND // 2),
        (-5 * 86400 * SECOND + np.arange(3000) * 61 * 7919 * 10**6).astype(np.int64),  # 1970
        np.sort(rng.integers(-(2**62), 2**62, 3000)),
    ):
        a, b = _both(monkeypatch, lambda ts=ts: csvfast.lines("/hall/row0/rack0/n0/p", ts, v))
        assert a == b
    long_name = "/" + "x" * 40  # longer than the one-block copy of a line's head
    a, b = _both(monkeypatch, lambda: csvfast.lines(long_name, ts, v))
    assert a == b
