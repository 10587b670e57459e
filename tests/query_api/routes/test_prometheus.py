"""Kelvin's own behaviour of the Prometheus API (what the differential suite cannot show).

Prometheus itself answers these differently or not at all: times beyond int64, nesting
deeper than Kelvin's parser allows, readings between milliseconds.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from services.query_api.promql.parser import MAX_DEPTH
from tests.query_api.conftest import T0, Api

S = 10**9


async def test_times_beyond_int64_are_bad_data(api: Api) -> None:
    """Prometheus turns such times into nonsense; Kelvin says which parameter is wrong."""
    for path, params in [
        ("query", {"query": "x", "time": "1e30"}),
        ("query", {"query": "x", "time": "3000-01-01T00:00:00Z"}),
        ("query_range", {"query": "x", "start": "-1e30", "end": "1", "step": "60"}),
        ("query", {"query": "x", "time": "NaN"}),
    ]:
        r = await api.client.get(f"/prometheus/api/v1/{path}", params=params)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["status"] == "error" and body["errorType"] == "bad_data"
        key = "time" if path == "query" else "start"
        assert (
            body["error"]
            == f'invalid parameter "{key}": cannot parse "{params[key]}" to a valid timestamp'
        )


async def test_a_sub_millisecond_step_is_refused(api: Api) -> None:
    """Prometheus truncates 0.0004 s to a zero step and loops; Kelvin refuses it."""
    r = await api.client.get(
        "/prometheus/api/v1/query_range",
        params={"query": "1", "start": "1", "end": "2", "step": "0.0004"},
    )
    assert r.status_code == 400 and "zero or negative" in r.json()["error"]


@pytest.mark.parametrize(
    "query",
    ["(" * 300 + "x" + ")" * 300, "+".join(["1"] * (MAX_DEPTH + 5)), "-" * 300 + "1",
     "2" + "^2" * 300, "sum(" * 200 + "x" + ")" * 200],
    ids=["parens", "chain", "unary", "power", "aggregations"],
)  # fmt: skip
async def test_deep_queries_are_a_400_with_position(api: Api, query: str) -> None:
    before = _rejects(api, "prometheus_too_deep")
    r = await api.client.post("/prometheus/api/v1/query", data={"query": query, "time": "1"})
    assert r.status_code == 400, r.text[:300]
    body = r.json()
    assert body["errorType"] == "bad_data"
    assert body["error"].startswith('invalid parameter "query": 1:')
    assert f"nests deeper than {MAX_DEPTH} levels" in body["error"]
    assert _rejects(api, "prometheus_too_deep") == before + 1


def _rejects(api: Api, reason: str) -> float:
    return float(api.service.ctx.metrics.rejects.labels(reason)._value.get())


async def test_grafana_startup_probes(api: Api) -> None:
    """What Grafana's Prometheus data source asks when it is saved and tested."""
    r = await api.client.get("/prometheus/api/v1/status/buildinfo")
    assert r.json()["data"]["version"].startswith("2.")
    r = await api.client.post(
        "/prometheus/api/v1/query", data={"query": "1+1", "time": "1700000000"}
    )
    assert r.json() == {
        "status": "success",
        "data": {"resultType": "scalar", "result": [1700000000, "2"]},
    }


async def test_rate_between_milliseconds_is_exact(api: Api) -> None:
    """Durations are integer ns differences: rate over readings 1.3 ms apart, at an evaluation
    time between milliseconds of the range, matches exact rational arithmetic."""
    ts = T0 + np.arange(0, 40) * 1_300_001  # not on any millisecond grid
    vs = np.arange(40) * 0.5 + 1000
    await api.write("/lab/node0/counter", (ts - T0) / S, vs)
    t = (T0 + 40_000_000) / S
    r = await api.client.get(
        "/prometheus/api/v1/query", params={"query": "rate(node_counter[30ms])", "time": f"{t:.3f}"}
    )
    got = float(r.json()["data"]["result"][0]["value"][1])
    end = T0 + 40_000_000
    start = end - 30_000_000
    inside = [
        (int(a), Fraction(float(b))) for a, b in zip(ts, vs, strict=True) if start <= a <= end
    ]
    (t0, v0), (t1, v1) = inside[0], inside[-1]
    sampled = Fraction(t1 - t0, S)
    avg = sampled / (len(inside) - 1)
    to_start, to_end = Fraction(t0 - start, S), Fraction(end - t1, S)
    to_start = min(to_start, sampled * v0 / (v1 - v0))
    interval = sampled + (to_start if to_start < avg * Fraction(11, 10) else avg / 2)
    interval += to_end if to_end < avg * Fraction(11, 10) else avg / 2
    want = (v1 - v0) * interval / sampled / Fraction(3, 100)
    assert got == pytest.approx(float(want), rel=1e-14)


async def test_virtual_sensors_are_series(api: Api) -> None:
    await api.write("/a/power", np.arange(30), np.full(30, 100.0))
    await api.write("/b/power", np.arange(30), np.full(30, 50.0))
    r = await api.client.put(
        "/api/v1/virtual/s/total",
        json={"expression": '"/a/power" + "/b/power"', "interval_ms": 1000},
    )
    assert r.status_code in (200, 201), r.text
    r = await api.client.get(
        "/prometheus/api/v1/query", params={"query": "s_total", "time": str(T0 / S + 20)}
    )
    result = r.json()["data"]["result"]
    assert [x["metric"]["sensor"] for x in result] == ["/s/total"]
    assert float(result[0]["value"][1]) == 150.0


async def test_nan_readings_are_values(api: Api) -> None:
    """A stored NaN is a sample (Prometheus keeps NaN series), not a gap."""
    await api.write("/n/node0/x", [0, 1, 2], [1.0, np.nan, 3.0])
    r = await api.client.get(
        "/prometheus/api/v1/query", params={"query": "node_x", "time": str(T0 / S + 1.5)}
    )
    assert r.json()["data"]["result"][0]["value"][1] == "NaN"


async def test_a_staleness_marker_ends_a_series(api: Api) -> None:
    """Prometheus' stale NaN (as remote write brings it) ends the series at once: an
    instant selector after it finds nothing, though the sample before is in the lookback;
    range functions skip it."""
    stale = float(np.array([0x7FF0000000000002], dtype=np.uint64).view(np.float64)[0])
    await api.write("/n/node0/load", [0, 10, 20], [1.0, 2.0, stale])

    async def ask(q: str, t: float) -> list[dict[str, object]]:
        r = await api.client.get(
            "/prometheus/api/v1/query", params={"query": q, "time": str(T0 / S + t)}
        )
        return r.json()["data"]["result"]  # type: ignore[no-any-return]

    assert (await ask("node_load", 15))[0]["value"][1] == "2"
    assert await ask("node_load", 25) == []
    assert (await ask("count_over_time(node_load[1m])", 25))[0]["value"][1] == "2"
    assert (await ask("node_load[1m]", 25))[0]["values"] == [[T0 // S, "1"], [T0 // S + 10, "2"]]


async def test_storage_down_is_503_unavailable(api: Api) -> None:
    await api.storage.close()
    try:
        r = await api.client.get("/prometheus/api/v1/query", params={"query": "up", "time": "1"})
        assert r.status_code == 503, r.text
        assert r.json()["errorType"] == "unavailable"
    finally:
        await api.storage.open()
