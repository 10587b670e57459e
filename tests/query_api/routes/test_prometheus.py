"""The Prometheus-compatible API, held against a real Debian ``prometheus`` on loopback.

Both get the same readings (Prometheus through ``promtool tsdb create-blocks-from
openmetrics``, Kelvin through its storage) and the same query forms; their
JSON must agree in structure (keys, types, status, error shapes), in label
sets, and in values where Kelvin implements the same function.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from services.query_api.promeval import labels_of
from tests.query_api.conftest import Api
from tests.support.servers import free_port, require_binary, wait_port

STEP_S = 15
NOW_S = int(time.time()) // 60 * 60
START_S = NOW_S - 3600
END_S = NOW_S - 600
SENSORS = {
    "/hall/row0/rack0/node0/power": lambda i: 200 + 10 * np.sin(i / 7),
    "/hall/row0/rack0/node1/power": lambda i: 150 + (i % 13),
    "/hall/row1/rack0/node0/power": lambda i: 300 - (i % 5) * 2.5,
    "/hall/row0/rack0/node0/inlet_temp": lambda i: 20 + (i % 9) / 4,
    # a counter that resets once
    "/hall/row0/rack0/node0/energy": lambda i: (i if i < 130 else i - 130) * 1000.0 + 5,
}


def samples() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for k, (name, fn) in enumerate(SENSORS.items()):
        idx = np.arange((END_S - START_S) // STEP_S + 1)
        if k == 2:
            idx = idx[(idx < 60) | (idx > 90)]  # a gap longer than the 5 min lookback
        ts = (START_S + idx * STEP_S) * 10**9
        out[name] = (ts.astype(np.int64), np.asarray([fn(i) for i in idx], dtype=np.float64))
    return out


def openmetrics(data: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
    lines: list[str] = []
    families: dict[str, list[str]] = {}
    for name, (ts, vs) in data.items():
        labels = labels_of(name)
        metric = labels.pop("__name__")
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        rows = families.setdefault(metric, [])
        rows.extend(
            f"{metric}{{{lab}}} {v!r} {t / 1e9:.3f}"
            for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
        )
    for metric, rows in families.items():
        lines.append(f"# TYPE {metric} gauge")
        lines.extend(rows)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = require_binary("prometheus", "prometheus")
    promtool = require_binary("promtool", "prometheus")
    d = tmp_path_factory.mktemp("prometheus")
    (d / "data.om").write_text(openmetrics(samples()))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(d / "data.om"), str(d / "tsdb")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
    port = free_port()
    log = open(d / "prometheus.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_port(port, timeout=30, proc=proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/-/ready").status_code != 200:  # ready once the blocks are loaded
            assert time.monotonic() < deadline, (d / "prometheus.log").read_text()[-2000:]
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
async def kelvin(api: Api) -> AsyncIterator[Api]:
    from services.common.readings import Batch

    for name, (ts, vs) in samples().items():
        await api.storage.write(Batch.single(name, ts, vs))
    yield api


def shape(x: Any) -> Any:
    """The structure of a JSON value: keys and types, values replaced by their type."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        kinds = [shape(v) for v in x]
        return [kinds[0]] if kinds and all(k == kinds[0] for k in kinds) else kinds
    return "number" if isinstance(x, int | float) and not isinstance(x, bool) else type(x).__name__


async def both(
    prom: str, kelvin: Api, path: str, params: dict[str, Any], post: bool = False
) -> tuple[Any, Any]:
    async with httpx.AsyncClient(timeout=30) as c:
        if post:
            p = await c.post(f"{prom}/api/v1/{path}", data=params)
            k = await kelvin.client.post(f"/prometheus/api/v1/{path}", data=params)
        else:
            p = await c.get(f"{prom}/api/v1/{path}", params=params)
            k = await kelvin.client.get(f"/prometheus/api/v1/{path}", params=params)
    assert k.status_code == p.status_code, (path, params, p.text[:300], k.text[:300])
    return p.json(), k.json()


def series_values(
    body: dict[str, Any],
) -> dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]:
    out = {}
    for r in body["data"]["result"]:
        key = tuple(sorted(r["metric"].items()))
        pts = r["values"] if "values" in r else [r["value"]]
        out[key] = [(float(t), float(v)) for t, v in pts]
    return out


RANGE = {"start": str(START_S + 300), "end": str(END_S + 240), "step": "60"}
VALUE_QUERIES = [
    "power",
    'power{l2="row0"}',
    'power{sensor=~"/hall/row0/.*", l4!="node1"}',
    '{__name__=~"power|inlet_temp", l2="row0"}',
    "rate(energy[5m])",
    "increase(energy[5m])",
    "delta(inlet_temp[3m])",
    "irate(energy[2m])",
    "avg_over_time(power[5m])",
    "max_over_time(power[5m])",
    "min_over_time(power[5m])",
    "sum_over_time(power[2m])",
    "count_over_time(power[5m])",
    "last_over_time(power[5m])",
    "sum(power)",
    "sum by (l2) (power)",
    "avg without (sensor, l3, l4) (power)",
    "max(power) by (l2)",
    "count(power)",
    "power * 2 - 1",
    "1 - power / 1000",
    "-power",
    "abs(power - 250)",
    "1 + 1",
]


@pytest.mark.parametrize("query", VALUE_QUERIES)
async def test_query_range_agrees(prometheus: str, kelvin: Api, query: str) -> None:
    p, k = await both(prometheus, kelvin, "query_range", {**RANGE, "query": query})
    assert shape(k) == shape(p)
    assert k["data"]["resultType"] == p["data"]["resultType"] == "matrix"
    pv, kv = series_values(p), series_values(k)
    assert sorted(kv) == sorted(pv), query
    for key, pts in pv.items():
        assert [t for t, _ in kv[key]] == [t for t, _ in pts], (query, key)
        assert [v for _, v in kv[key]] == pytest.approx([v for _, v in pts], rel=1e-9), (query, key)


@pytest.mark.parametrize(
    "query", ["power", "sum by (l2) (power)", "power[2m]", "3 * 2", "rate(energy[5m])"]
)
async def test_instant_query_agrees(prometheus: str, kelvin: Api, query: str) -> None:
    params = {"query": query, "time": str(END_S - 30)}
    p, k = await both(prometheus, kelvin, "query", params)
    assert shape(k) == shape(p), query
    assert k["data"]["resultType"] == p["data"]["resultType"]
    if p["data"]["resultType"] == "scalar":
        assert k["data"]["result"] == p["data"]["result"]
    else:
        pv, kv = series_values(p), series_values(k)
        assert sorted(kv) == sorted(pv)
        for key, pts in pv.items():
            assert [t for t, _ in kv[key]] == [t for t, _ in pts], (query, key)
            assert [v for _, v in kv[key]] == pytest.approx([v for _, v in pts]), (query, key)


async def test_post_form_queries_agree(prometheus: str, kelvin: Api) -> None:
    p, k = await both(prometheus, kelvin, "query_range", {**RANGE, "query": "power"}, post=True)
    assert series_values(k) == series_values(p)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("series", {"match[]": 'power{l2="row0"}', "start": str(START_S), "end": str(END_S)}),
        ("series", {"match[]": ["inlet_temp", '{l3="rack0", l2="row1"}']}),
        ("labels", {}),
        ("label/l2/values", {}),
        ("label/__name__/values", {}),
        ("label/sensor/values", {}),
    ],
)
async def test_metadata_endpoints_agree(
    prometheus: str, kelvin: Api, path: str, params: dict[str, Any]
) -> None:
    p, k = await both(prometheus, kelvin, path, params)
    assert shape(k) == shape(p)
    key = (lambda x: sorted(x.items())) if path == "series" else None
    assert sorted(k["data"], key=key) == sorted(p["data"], key=key)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("query_range", {**RANGE, "query": "power{"}),
        ("query_range", {**RANGE, "query": "foo_bar(power)"}),
        ("query_range", {**RANGE, "query": "rate(power)"}),
        ("query_range", {**RANGE, "query": "power[5m]"}),
        ("query_range", {**RANGE, "query": ""}),
        ("query_range", {"query": "power", "start": "yesterday", "end": "1", "step": "60"}),
        ("query_range", {"query": "power", "start": "10", "end": "1", "step": "60"}),
        ("query_range", {"query": "power", "start": "1", "end": "100", "step": "0"}),
        ("query_range", {"query": "power", "start": "1", "end": "100", "step": "1e-30"}),
        ("query_range", {"query": "power", "start": "1", "end": "100", "step": "1e300"}),
        ("query_range", {"query": "power", "start": "1", "end": "100"}),
        ("query_range", {"query": "power", "start": "0", "end": "100000", "step": "1"}),
        ("query", {"query": 'power{l2=~"("}'}),
        ("query", {"query": "{}"}),
        ("series", {}),
    ],
)
async def test_error_shapes_agree(
    prometheus: str, kelvin: Api, path: str, params: dict[str, Any]
) -> None:
    p, k = await both(prometheus, kelvin, path, params)
    assert shape(k) == shape(p)
    assert k["status"] == p["status"] == "error"
    assert k["errorType"] == p["errorType"]
    assert k["error"]


async def test_times_beyond_int64_are_bad_data(kelvin: Api) -> None:
    """Prometheus turns such times into nonsense; Kelvin says which parameter is wrong."""
    for path, params in [
        ("query", {"query": "power", "time": "1e30"}),
        ("query", {"query": "power", "time": "3000-01-01T00:00:00Z"}),
        ("query_range", {"query": "power", "start": "-1e30", "end": "1", "step": "60"}),
    ]:
        r = await kelvin.client.get(f"/prometheus/api/v1/{path}", params=params)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["status"] == "error" and body["errorType"] == "bad_data"
        key = "time" if path == "query" else "start"
        assert body["error"] == (
            f'invalid parameter "{key}": cannot parse "{params[key]}" to a valid timestamp'
        )


async def test_grafana_startup_probes(kelvin: Api) -> None:
    """What Grafana's Prometheus data source asks when it is saved and tested."""
    r = await kelvin.client.get("/prometheus/api/v1/status/buildinfo")
    assert r.json()["data"]["version"].startswith("2.")
    r = await kelvin.client.post(
        "/prometheus/api/v1/query", data={"query": "1+1", "time": "1700000000"}
    )
    assert r.json() == {
        "status": "success",
        "data": {"resultType": "scalar", "result": [1700000000, "2"]},
    }
