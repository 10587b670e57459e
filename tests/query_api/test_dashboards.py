"""The Grafana dashboards in charts/kelvin/dashboards/ work against a real query API.

Every panel query on the Kelvin data source is sent, with Grafana's variables
filled in, to Kelvin's Prometheus API over a small simulated hall and must
return data, and again over a site laid out differently (other level names and
depth) with the variables set for it: the dashboards name levels only through
their variables. Every panel on the Prometheus data source names metrics that
Kelvin's services really export.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.collect_agent.metrics import AgentMetrics
from services.common import times
from services.common.metrics import ServiceMetrics
from services.common.readings import Batch
from services.common.sensors import SensorMetadata
from services.pusher.metrics import PusherMetrics
from services.query_api.app import create_service
from services.query_api.context import ApiMetrics
from tests.query_api.conftest import Api, admin_client, make_config

DASHBOARDS = sorted(
    (Path(__file__).resolve().parents[2] / "charts/kelvin/dashboards").glob("*.json")
)
DEMO = {"${site}": "hall", "${node}": "node", "$group": "row", "$member": ".*", "$__range": "1h"}
OTHER = {"${site}": "site", "${node}": "host", "$group": "aisle", "$member": ".*", "$__range": "1h"}


def targets(kind: str) -> list[tuple[str, dict[str, Any], str]]:
    out = []
    for path in DASHBOARDS:
        for p in json.loads(path.read_text())["panels"]:
            for t in p["targets"]:
                if p["datasource"]["uid"] == "${" + kind + "}":
                    out.append((path.stem, t, p["title"]))
    return out


def fill(expr: str, variables: dict[str, str]) -> str:
    for k, v in variables.items():
        expr = expr.replace(k, v)
    assert "$" not in expr.replace("$1", ""), expr
    return expr


@pytest.fixture
async def hall(tmp_path: Path) -> AsyncIterator[Api]:
    """A query API over the simulated hall's sensor names, started under ``--demo``."""
    cfg = make_config(tmp_path, virtual_retry_s=0.05)
    cfg.profile = "demo"
    svc = create_service(cfg)
    await svc.start()
    try:
        now = times.now_ns() // 10**9 * 10**9
        ts = now - np.arange(600, 0, -10, dtype=np.int64) * 10**9
        st = svc.storage
        assert st is not None
        sensors: dict[str, tuple[float, str]] = {}
        for r in range(2):
            for k in range(2):
                for s in range(2):
                    base = f"/hall/row{r}/rack{k}/node{s}"
                    sensors[f"{base}/power"] = (200 + 50 * s, "W")
                    sensors[f"{base}/inlet_temp"] = (22 + r + k / 2, "degC")
        sensors |= {
            "/hall/power": (1800.0, "W"),
            "/hall/cooling_power": (450.0, "W"),
            "/hall/supply_temp": (18.0, "degC"),
        }
        sensors |= allocator_sensors()
        await write_all(st, sensors, ts)
        async with admin_client(svc.port, timeout=30) as c:
            assert svc.definer is not None  # the demo profile defines /hall/pue ...
            await asyncio.wait_for(svc.definer, 30)  # ... once its inputs exist
            assert (await c.get("/api/v1/virtual/hall/pue")).status_code == 200
            yield Api(svc, c)
    finally:
        await svc.stop()


def allocator_sensors() -> dict[str, tuple[float, str]]:
    return {
        f"/kelvin/allocator/{q}": (v, u)
        for q, v, u in [("max_tin_c", 25.0, "°C"), ("supply_c", 18.0, "°C"), ("cop", 4.0, ""),
                        ("computing_kw", 1.8, "kW"), ("cooling_kw", 0.45, "kW"), ("utilization", 0.5, "")]
    }  # fmt: skip


async def write_all(st: Any, sensors: dict[str, tuple[float, str]], ts: np.ndarray) -> None:
    for name, (v, unit) in sensors.items():
        await st.write(Batch.single(name, ts, v + np.sin(np.arange(ts.size))))
        await st.put_metadata(SensorMetadata(name=name, unit=unit))


@pytest.fixture
async def other_site(tmp_path: Path) -> AsyncIterator[Api]:
    """Another layout: /site/aisleA/cabC/hostH (one level less, other names), its own PUE."""
    svc = create_service(make_config(tmp_path))
    await svc.start()
    try:
        now = times.now_ns() // 10**9 * 10**9
        ts = now - np.arange(600, 0, -10, dtype=np.int64) * 10**9
        sensors: dict[str, tuple[float, str]] = {}
        for a in range(3):
            for h in range(2):
                sensors[f"/site/aisle{a}/cab0/host{h}/power"] = (300.0 + h, "W")
                sensors[f"/site/aisle{a}/cab0/host{h}/inlet_temp"] = (21.0 + a, "degC")
        sensors |= {"/site/power": (1800.0, "W"), "/site/cooling_power": (500.0, "W"),
                    "/site/supply_temp": (17.0, "degC"), "/site/pue": (1.3, "")}  # fmt: skip
        sensors |= allocator_sensors()
        assert svc.storage is not None
        await write_all(svc.storage, sensors, ts)
        async with admin_client(svc.port, timeout=30) as c:
            yield Api(svc, c)
    finally:
        await svc.stop()


async def _panels_return_data(api: Api, variables: dict[str, str]) -> None:
    panels = targets("kelvin")
    assert len(panels) > 15
    now = times.now_ns() / 1e9
    for board, target, title in panels:
        expr = fill(target["expr"], variables)
        if target.get("instant"):
            r = await api.client.get("/prometheus/api/v1/query", params={"query": expr})
        else:
            params = {"query": expr, "start": str(now - 600), "end": str(now), "step": "30"}
            r = await api.client.get("/prometheus/api/v1/query_range", params=params)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (board, title, expr, body)
        assert body["data"]["result"], (board, title, expr)


def test_dashboards_are_complete() -> None:
    titles = {json.loads(p.read_text())["title"] for p in DASHBOARDS}
    assert len(DASHBOARDS) == 5 and len(titles) == 5
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)) and d["uid"] == path.stem
        for p in d["panels"]:
            assert p["targets"] and p["datasource"]["uid"] in ("${kelvin}", "${prometheus}"), p[
                "title"
            ]


async def test_kelvin_panels_return_data(hall: Api) -> None:
    await _panels_return_data(hall, DEMO)


async def test_panels_work_for_another_layout(other_site: Api) -> None:
    await _panels_return_data(other_site, OTHER)


async def test_no_query_mixes_levels(hall: Api) -> None:
    """The summed node power is the nodes' sum, not nodes plus the hall total (issue 15)."""
    now = str(times.now_ns() / 1e9)
    got = {}
    for q in ("sum(node_power)", "count(node_power)", "count(hall_power)"):
        r = await hall.client.get("/prometheus/api/v1/query", params={"query": q, "time": now})
        got[q] = float(r.json()["data"]["result"][0]["value"][1])
    assert got["count(node_power)"] == 8 and got["count(hall_power)"] == 1
    # the fixture's nodes: 200 or 250 W plus sin(59) at the newest reading; no hall in it
    assert got["sum(node_power)"] == pytest.approx(4 * 200 + 4 * 250 + 8 * np.sin(59))


async def test_variable_queries_list_values(hall: Api, other_site: Api) -> None:
    for api, variables in ((hall, DEMO), (other_site, OTHER)):
        for path in DASHBOARDS:
            for var in json.loads(path.read_text())["templating"]["list"]:
                if var["type"] != "query":
                    continue
                m = re.fullmatch(
                    r"label_values\((.*), (\w+)\)", fill(var["query"]["query"], variables)
                )
                assert m, var
                r = await api.client.get(
                    f"/prometheus/api/v1/label/{m.group(2)}/values", params={"match[]": m.group(1)}
                )
                assert r.json()["data"], (path.stem, var["name"])


def test_prometheus_panels_name_exported_metrics() -> None:
    pusher, query_api = ServiceMetrics("pusher"), ServiceMetrics("query_api")
    PusherMetrics(pusher)
    ApiMetrics(query_api)
    families = set()
    for reg in [AgentMetrics().service, pusher, query_api]:
        for fam in reg.registry.collect():
            suffix = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
            families.update(fam.name + x for x in suffix.get(fam.type, [""]))
    for board, target, title in targets("prometheus"):
        for metric in re.findall(r"kelvin_[a-z_]+", target["expr"]):
            assert metric in families, (board, title, metric)
