"""The foundation routes: hierarchy browsing and readings as JSON and CSV."""

from __future__ import annotations

import numpy as np
import pytest

from services.common import times
from tests.query_api.conftest import T0, Api, S


async def test_children_of_a_prefix(api: Api) -> None:
    await api.write("/a/b/c", [0], [1.0])
    await api.write("/a/b/d/e", [0], [1.0])
    r = await api.client.get("/api/v1/sensors", params={"prefix": "/a/b"})
    assert r.status_code == 200
    body = r.json()
    assert body["prefix"] == "/a/b"
    kids = {k["name"]: k for k in body["children"]}
    assert kids["/a/b/c"] == {
        "name": "/a/b/c", "label": "c", "is_sensor": True, "has_children": False, "is_virtual": False
    }  # fmt: skip
    assert kids["/a/b/d"]["is_sensor"] is False and kids["/a/b/d"]["has_children"] is True


async def test_unknown_prefix_is_404_json(api: Api) -> None:
    await api.write("/a/b/c", [0], [1.0])
    r = await api.client.get("/api/v1/sensors", params={"prefix": "/nope"})
    assert r.status_code == 404
    assert r.json()["error"] == "not_found" and "/nope" in r.json()["detail"]


async def test_readings_json(api: Api) -> None:
    await api.write("/a/p", [0, 1, 2, 3], [1.0, np.nan, 3.0, 4.0], unit="W")
    r = await api.client.get(
        "/api/v1/readings", params={"sensor": "/a/p", "start": str(T0), "end": str(T0 + 3 * S)}
    )
    assert r.status_code == 200
    body = r.json()
    assert body["sensor"] == "/a/p" and body["unit"] == "W"
    assert body["start_ns"] == T0 and body["end_ns"] == T0 + 3 * S
    assert body["count"] == 3  # the end is exclusive
    assert body["timestamps_ns"] == [T0, T0 + S, T0 + 2 * S]
    assert body["values"] == [1.0, None, 3.0]


async def test_readings_default_range_is_last_hour(api: Api) -> None:
    now = times.now_ns()
    await api.write("/a/p", [(now - T0) / S - 7200, (now - T0) / S - 60], [1.0, 2.0])
    body = (await api.client.get("/api/v1/readings", params={"sensor": "/a/p"})).json()
    assert body["values"] == [2.0]


async def test_readings_csv_iso_and_raw(api: Api) -> None:
    await api.write("/a/p", [0, 0.5], [1.5, np.nan])
    params = {"sensor": "/a/p", "start": str(T0), "end": str(T0 + S), "format": "csv"}
    r = await api.client.get("/api/v1/readings", params=params)
    assert r.headers["content-type"].startswith("text/csv")
    assert r.text.splitlines() == [
        "Sensor,Time,Value",
        "/a/p,2026-05-28T20:26:40.000000000Z,1.5",
        "/a/p,2026-05-28T20:26:40.500000000Z,",
    ]
    r = await api.client.get("/api/v1/readings", params={**params, "time_format": "ns"})
    assert r.text.splitlines()[1:] == [f"/a/p,{T0},1.5", f"/a/p,{T0 + S // 2},"]


async def test_dcdb_time_syntax(api: Api) -> None:
    await api.write("/a/p", [0, 10], [1.0, 2.0])
    for start, end in [
        ("2026-05-28T20:26:40Z", "2026-05-28 20:26:45"),
        (str(T0 // S), str((T0 + 5 * S) // 1000)),  # seconds and microseconds
    ]:
        body = (
            await api.client.get(
                "/api/v1/readings", params={"sensor": "/a/p", "start": start, "end": end}
            )
        ).json()
        assert body["values"] == [1.0], (start, end)


async def test_unknown_sensor_is_404_json(api: Api) -> None:
    r = await api.client.get("/api/v1/readings", params={"sensor": "/no/such"})
    assert r.status_code == 404
    assert r.json() == {"error": "not_found", "detail": "sensor '/no/such' does not exist"}


async def test_bad_input_is_400_with_reason_and_counted(api: Api) -> None:
    await api.write("/a/p", [0], [1.0], unit="W")
    cases = {
        "bad_time": {"sensor": "/a/p", "start": "yesterday-ish"},
        "bad_spec": {"sensor": "frobnicate(/a/p)"},
        "bad_unit": {"sensor": "/a/p@kg"},
        "bad_sensor_name": {"sensor": "no-slash"},
        "bad_query": {"sensor": "/a/p", "start": "now", "end": "now-1h"},
    }
    for reason, params in cases.items():
        r = await api.client.get("/api/v1/readings", params=params)
        assert r.status_code == 400, (reason, r.text)
        assert r.json()["error"] == reason
        assert r.json()["detail"]
    metrics = (await api.client.get("/metrics")).text
    for reason in cases:
        assert f'kelvin_query_api_rejects_total{{reason="{reason}"}} 1.0' in metrics


async def test_a_unit_that_cannot_be_had_is_400_in_csv_too(api: Api) -> None:
    await api.write("/a/p", [0], [1.0], unit="W")
    await api.write("/a/none", [0], [1.0])
    for spec, detail in [
        ("/a/p@degC", "cannot convert 'W'"),
        ("/a/none@kW", "the sensor has no unit"),
        ("/a/p@bogus", "unit 'bogus' is not known"),
    ]:
        for sensors in ([spec], ["/a/p", spec]):  # also after another sensor's lines
            r = await api.client.get(
                "/api/v1/readings",
                params={"sensor": sensors, "start": str(T0), "end": str(T0 + S), "format": "csv"},
            )
            assert r.status_code == 400, (sensors, r.text)
            assert r.json()["error"] == "bad_unit" and detail in r.json()["detail"]


async def test_times_and_intervals_beyond_int64_are_400_not_a_broken_stream(api: Api) -> None:
    await api.write("/a/p", [0], [1.0])
    cases = [
        ({"start": "3000-01-01", "end": "3001-01-01"}, "end: time '3001-01-01' lies outside"),
        ({"start": "now-99999999w"}, "start: time 'now-99999999w' lies outside"),
        ({"start": str(T0), "end": str(T0 + S), "interval": "99999999999w"}, "interval:"),
    ]
    for params, detail in cases:
        for fmt in ("json", "csv"):
            r = await api.client.get(
                "/api/v1/readings", params={"sensor": "/a/p", "format": fmt, **params}
            )
            assert r.status_code == 400, (params, r.text)
            assert r.json()["error"] == "bad_time" and detail in r.json()["detail"]


async def test_large_answers_stream_slice_by_slice_and_stay_exact(api: Api) -> None:
    rng = np.random.default_rng(3)
    ts_s = np.cumsum(rng.integers(1, 5_000, 20_000)) / 1000.0
    vals = rng.normal(0, 1e6, 20_000)
    await api.write("/big", ts_s, vals, unit="W")
    params = {"sensor": "/big", "start": str(T0), "end": str(T0 + int(ts_s[-1] * S) + 1)}
    body = (await api.client.get("/api/v1/readings", params=params)).json()
    assert body["count"] == 20_000
    assert body["timestamps_ns"] == (T0 + np.round(ts_s * S).astype(np.int64)).tolist()
    assert body["values"] == vals.tolist()
    kw = (await api.client.get("/api/v1/readings", params={**params, "sensor": "/big@kW"})).json()
    assert kw["unit"] == "kW" and kw["values"] == pytest.approx((vals / 1000).tolist())
    csv = (await api.client.get("/api/v1/readings", params={**params, "format": "csv"})).text
    lines = csv.splitlines()
    assert len(lines) == 20_001 and lines[0] == "Sensor,Time,Value"
    assert [float(x.rsplit(",", 1)[1]) for x in lines[1:]] == vals.tolist()
