"""The simpod JSON data source protocol under /grafana, as Grafana sends it."""

from __future__ import annotations

import numpy as np
import pytest

from services.common import times
from tests.query_api.conftest import T0, Api, S

FROM = times.format_iso(T0)
TO = times.format_iso(T0 + 59 * S)


async def hall(api: Api) -> None:
    for r in range(2):
        for k in range(2):
            await api.write(
                f"/hall/row{r}/rack{k}/node0/power",
                np.arange(60),
                np.full(60, 100.0 * (r + 1) + k),
                unit="W",
            )
    await api.write(
        "/hall/row0/rack0/node0/inlet_temp", np.arange(60), 20 + np.arange(60) / 10, unit="degC"
    )


async def test_connection_and_metrics(api: Api) -> None:
    assert (await api.client.get("/grafana/")).status_code == 200
    metrics = (await api.client.post("/grafana/metrics", json={})).json()
    assert metrics[0]["value"] == "sensor"
    assert {p["name"] for p in metrics[0]["payloads"]} == {
        "prefix",
        "sensor",
        "operation",
        "unit",
        "agg",
    }


async def test_payload_options_list_sensors_under_the_prefix(api: Api) -> None:
    await hall(api)
    body = {"metric": "sensor", "payload": {"prefix": "/hall/row1"}, "name": "sensor"}
    opts = (await api.client.post("/grafana/metric-payload-options", json=body)).json()
    assert [o["value"] for o in opts] == [
        "/hall/row1/rack0/node0/power",
        "/hall/row1/rack1/node0/power",
    ]
    body["name"] = "operation"
    ops = [
        o["value"]
        for o in (await api.client.post("/grafana/metric-payload-options", json=body)).json()
    ]
    assert "integral" in ops and "none" in ops


async def test_query_with_payload_and_with_a_typed_specification(api: Api) -> None:
    await hall(api)
    body = {
        "range": {"from": FROM, "to": TO, "raw": {"from": "now-6h", "to": "now"}},
        "intervalMs": 1000,
        "maxDataPoints": 100,
        "targets": [
            {
                "refId": "A",
                "target": "sensor",
                "payload": {"sensor": "/hall/row0/rack1/node0/power", "unit": "kW"},
            },
            {"refId": "B", "target": "sum(/hall/*/*/node0/power)"},
            {"refId": "C", "target": "/hall/row1/*/node0/power"},
            {"refId": "D", "target": "/hall/row0/rack0/node0/power", "hide": True},
        ],
    }
    out = (await api.client.post("/grafana/query", json=body)).json()
    nodes = [f"/hall/row{r}/rack{k}/node0/power" for r in range(2) for k in range(2)]
    assert [o["target"] for o in out] == [
        "/hall/row0/rack1/node0/power [kW]",
        *(f"sum {n} [W]" for n in nodes),  # DCDB's aggregates reduce over time, per sensor
        "/hall/row1/rack0/node0/power [W]",
        "/hall/row1/rack1/node0/power [W]",
    ]
    a = out[0]["datapoints"]
    assert len(a) == 60 and a[0] == [0.101, T0 // 10**6] and a[-1][1] == (T0 + 59 * S) // 10**6
    assert [o["datapoints"] for o in out[1:5]] == [
        [[60 * v, T0 // 10**6]] for v in (100, 101, 200, 201)
    ]


async def test_query_resamples_to_max_data_points(api: Api) -> None:
    await hall(api)
    body = {
        "range": {"from": FROM, "to": TO},
        "intervalMs": 10_000,
        "maxDataPoints": 10,
        "targets": [
            {
                "target": "sensor",
                "payload": {"sensor": "/hall/row0/rack0/node0/inlet_temp", "agg": "max"},
            }
        ],
    }
    pts = (await api.client.post("/grafana/query", json=body)).json()[0]["datapoints"]
    assert len(pts) == 6  # 10 s buckets over 60 s
    assert [p[0] for p in pts] == pytest.approx([20.9, 21.9, 22.9, 23.9, 24.9, 25.9])


async def test_variables_browse_the_hierarchy(api: Api) -> None:
    await hall(api)
    rows = (
        await api.client.post("/grafana/variable", json={"payload": {"target": "/hall"}})
    ).json()
    assert rows == [
        {"__text": "row0", "__value": "/hall/row0"},
        {"__text": "row1", "__value": "/hall/row1"},
    ]
    racks = (await api.client.post("/grafana/variable", json={"payload": "/hall/row0"})).json()
    assert [r["__value"] for r in racks] == ["/hall/row0/rack0", "/hall/row0/rack1"]
    temps = (
        await api.client.post(
            "/grafana/variable", json={"payload": {"target": "/hall/**/inlet_temp"}}
        )
    ).json()
    assert temps == [
        {
            "__text": "/hall/row0/rack0/node0/inlet_temp",
            "__value": "/hall/row0/rack0/node0/inlet_temp",
        }
    ]
    missing = await api.client.post("/grafana/variable", json={"payload": {"target": "/nowhere"}})
    assert missing.status_code == 404


async def test_bad_targets_are_400_with_a_message(api: Api) -> None:
    await hall(api)
    body = {"range": {"from": FROM, "to": TO}, "targets": [{"target": "sensor", "payload": {}}]}
    r = await api.client.post("/grafana/query", json=body)
    assert r.status_code == 400 and "choose a sensor" in r.json()["detail"]
    body = {
        "range": {"from": "soon", "to": TO},
        "targets": [{"target": "/hall/row0/rack0/node0/power"}],
    }
    assert (await api.client.post("/grafana/query", json=body)).json()["error"] == "bad_time"
    body["range"] = {"from": FROM, "to": "3000-01-01T00:00:00Z"}
    r = await api.client.post("/grafana/query", json=body)
    assert r.status_code == 400 and "range.to: time '3000-01-01T00:00:00Z' lies outside" in r.text
    node = {"target": "sensor", "payload": {"sensor": "/hall/row0/rack0/node0/power"}}
    body = {"range": {"from": FROM, "to": TO}, "targets": [node]}
    node["payload"]["agg"] = "median"  # type: ignore[index]
    r = await api.client.post("/grafana/query", json={**body, "maxDataPoints": 1})
    assert r.status_code == 400 and r.json()["error"] == "bad_spec"
    assert "aggregate 'median' is unknown" in r.json()["detail"]


async def test_an_interval_longer_than_the_range_gives_one_bucket(api: Api) -> None:
    await hall(api)
    node = {"target": "sensor", "payload": {"sensor": "/hall/row0/rack0/node0/power"}}
    body = {"range": {"from": FROM, "to": TO}, "targets": [node], "maxDataPoints": 1}
    for interval_ms in (3_600_000, 10**20):
        r = await api.client.post("/grafana/query", json={**body, "intervalMs": interval_ms})
        assert r.status_code == 200, r.text
        assert r.json()[0]["datapoints"] == [[100.0, T0 // 10**6]]  # stamped with the start
