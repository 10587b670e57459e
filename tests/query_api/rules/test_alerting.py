"""Kelvin's rules on its own PromQL: alerts fire and resolve through a real Alertmanager.

Readings are written with current timestamps; groups evaluate every 100 ms so an
alert's life takes a fraction of a second. Waiting polls the APIs (no fixed sleeps).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from services.common.readings import Batch
from tests.query_api.conftest import Api
from tests.query_api.rules.conftest import RulesApi
from tests.support.alertmanager import Alertmanager

RULES = """
groups:
  - name: hall
    interval: 100ms
    rules:
      - record: row:node_power:sum
        expr: sum by (row) (node_power)
        labels: {source: kelvin}
      - alert: NodeHot
        expr: node_power > 250
        labels: {severity: "page", node: "{{ $labels.node }}"}
        annotations:
          summary: "{{ $labels.node }} draws {{ $value }} W"
          pretty: "{{ $value | humanize }}W"
      - alert: NodeHotForAWhile
        expr: node_power > 250
        for: 1h
"""


async def write_power(api: Api, watts: dict[str, float], span_s: int = 60) -> None:
    now = time.time_ns()
    ts = now + np.arange(-span_s, 10, 5, dtype=np.int64) * 10**9
    for node, w in watts.items():
        await api.storage.write(
            Batch.single(f"/hall/row0/rack0/{node}/power", ts, np.full(ts.shape[0], w))
        )


async def until(check: Any, within_s: float = 20.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_alert_fires_and_resolves_in_alertmanager(
    rules_api: RulesApi, alertmanager: Alertmanager
) -> None:
    api = await rules_api(RULES, alertmanager_urls=[alertmanager.url], alert_resend_delay_s=60,
                          external_labels={"site": "test-fire"})  # fmt: skip
    await write_power(api, {"node0": 200.0, "node1": 300.0})

    def ours() -> list[dict[str, Any]]:
        return [a for a in alertmanager.alerts() if a["labels"].get("site") == "test-fire"]

    got = await until(lambda: [a for a in ours() if a["status"]["state"] == "active"])
    assert len(got) == 1
    a = got[0]
    assert a["labels"]["alertname"] == "NodeHot" and a["labels"]["node"] == "node1"
    assert (
        a["labels"]["severity"] == "page"
        and a["labels"]["sensor"] == "/hall/row0/rack0/node1/power"
    )
    assert "__name__" not in a["labels"]
    assert a["annotations"] == {"summary": "node1 draws 300 W", "pretty": "300W"}
    assert a["generatorURL"].startswith("http://")
    # the condition ends: Kelvin sends it resolved, Alertmanager no longer lists it active
    await write_power(api, {"node1": 100.0}, span_s=0)
    await until(lambda: not [a for a in ours() if a["status"]["state"] == "active"])


async def test_rules_and_alerts_api(rules_api: RulesApi) -> None:
    api = await rules_api(RULES)
    await write_power(api, {"node0": 200.0, "node1": 300.0})

    async def firing() -> Any:
        r = await api.client.get("/prometheus/api/v1/alerts")
        alerts = r.json()["data"]["alerts"]
        return len(alerts) == 2 and alerts  # one group evaluation gives both

    alerts = await until(firing)
    states = {x["labels"]["alertname"]: x["state"] for x in alerts}
    assert states == {"NodeHot": "firing", "NodeHotForAWhile": "pending"}
    nodehot = next(x for x in alerts if x["labels"]["alertname"] == "NodeHot")
    assert nodehot["value"] == "3e+02" and nodehot["activeAt"].endswith("Z")
    body = (await api.client.get("/prometheus/api/v1/rules")).json()
    group = body["data"]["groups"][0]
    assert group["name"] == "hall" and group["interval"] == 0.1 and group["file"].endswith(".yml")
    record, hot, slow = group["rules"]
    assert record["type"] == "recording" and record["query"] == "sum by (row) (node_power)"
    assert record["health"] == "ok" and record["labels"] == {"source": "kelvin"}
    assert hot["type"] == "alerting" and hot["state"] == "firing" and hot["duration"] == 0
    assert hot["annotations"]["summary"] == "{{ $labels.node }} draws {{ $value }} W"
    assert slow["state"] == "pending" and slow["duration"] == 3600
    only = (await api.client.get("/prometheus/api/v1/rules", params={"type": "record"})).json()
    assert [r["name"] for r in only["data"]["groups"][0]["rules"]] == ["row:node_power:sum"]
    assert (
        await api.client.get("/prometheus/api/v1/rules", params={"type": "x"})
    ).status_code == 400


async def test_recorded_series_are_queryable_by_name(rules_api: RulesApi) -> None:
    api = await rules_api(RULES)
    await write_power(api, {"node0": 200.0, "node1": 300.0})

    async def recorded() -> Any:
        r = await api.client.get("/prometheus/api/v1/query", params={"query": "row:node_power:sum"})
        result = r.json()["data"]["result"]
        # both nodes written (an evaluation may fall between the two writes)
        return result if result and result[0]["value"][1] == "500" else None

    got = await until(recorded)
    assert got[0]["metric"]["row"] == "row0" and got[0]["metric"]["source"] == "kelvin"
    assert got[0]["value"][1] == "500"
    assert got[0]["metric"]["sensor"].startswith("/kelvin/rules/row:node_power:sum/")


async def test_rule_metrics_are_exported(rules_api: RulesApi) -> None:
    api = await rules_api(RULES)
    await write_power(api, {"node1": 300.0})

    async def evaluated() -> Any:
        text = (await api.client.get("/metrics")).text
        return 'kelvin_query_api_rule_evaluations_total{rule_group="hall"}' in text and text

    text = await until(evaluated)
    for name in ("rule_evaluation_failures_total", "rule_group_last_duration_seconds",
                 "rule_group_last_evaluation_timestamp_seconds", 'alerts{state="firing"}'):  # fmt: skip
        assert f"kelvin_query_api_{name}" in text


async def test_a_failing_rule_keeps_its_alerts_and_reports_why(rules_api: RulesApi) -> None:
    bad = RULES.replace(
        "node_power > 250",
        'node_power > 250 and on() label_replace(vector(1), "x", "", "x", "(")',
        1,
    )
    api = await rules_api(bad)
    await write_power(api, {"node1": 300.0})

    async def errored() -> Any:
        groups = (await api.client.get("/prometheus/api/v1/rules")).json()["data"]["groups"]
        return [r for r in groups[0]["rules"] if r["health"] == "err"]

    rule = (await until(errored))[0]
    assert "label_replace" in rule["lastError"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("groups: [{name: a, rules: [{alert: X}]}]", "field 'expr' must be set"),
        ("groups: [{name: a, rules: [{alert: X, expr: 'rate(x)'}]}]", "could not parse expression"),
        (
            "groups: [{name: a, rules: [{record: 'bad name', expr: x}]}]",
            "invalid recording rule name",
        ),
        ("groups: [{name: a, rules: [{alert: X, record: y, expr: x}]}]", "exactly one of"),
        (
            "groups: [{name: a, rules: [{alert: X, expr: x, annotations: {s: '{{ if $value }}'}}]}]",
            "'if' is not supported",
        ),
        ("groups: [{name: a, rules: [{alert: X, expr: x, for: 5x}]}]", "not a valid duration"),
        ("groups: [{name: a}, {name: a}]", "repeated"),
        ("groups: [{name: a, rules: [{alert: X, expr: 'x[5m]'}]}]", "range vector"),
    ],
)
def test_bad_rule_files_are_refused_with_the_place(text: str, message: str) -> None:
    from services.common.errors import ConfigError
    from services.query_api.rules.rulefile import parse_groups

    with pytest.raises(ConfigError) as err:
        parse_groups(text, "f.yml", 60 * 10**9)
    assert message in str(err.value) and "f.yml" in str(err.value)


def test_the_shipped_rules_load() -> None:
    from services.query_api.rules.manager import BUILTIN_RULES
    from services.query_api.rules.rulefile import load

    groups = load([BUILTIN_RULES], 60 * 10**9)
    names = {r.name for g in groups for r in g.rules}
    assert {"InletAboveRedline", "SupplyTemperatureOutOfRange", "SensorSilent", "CollectAgentDown",
            "IngestStalled", "SpoolFilling", "StorageUnreachable"} <= names  # fmt: skip


async def test_rules_see_kelvins_own_metrics(rules_api: RulesApi, make_agent: Any) -> None:
    """Service metrics are scraped into the rules' PromQL: the agent's gauges and ``up``."""
    agent = await make_agent()
    rules = """
groups:
  - name: self
    interval: 100ms
    rules:
      - alert: SpoolLimitKnown
        expr: kelvin_collect_agent_spool_limit_bytes > 0
      - alert: DeadAgent
        expr: up{job="kelvin-collect-agent"} == 0
"""
    live = await rules_api(rules, collect_agent_url=f"http://127.0.0.1:{agent.port}")
    dead = await rules_api(rules, collect_agent_url="http://127.0.0.1:9")

    async def names(api: Api) -> Any:
        alerts = (await api.client.get("/prometheus/api/v1/alerts")).json()["data"]["alerts"]
        return {a["labels"]["alertname"] for a in alerts}

    assert await until(lambda: names(live)) == {"SpoolLimitKnown"}
    assert await until(lambda: names(dead)) == {"DeadAgent"}


async def test_the_demo_starts_with_the_hall_rules(tmp_path: Any) -> None:
    from services.query_api.app import create_service
    from tests.query_api.conftest import make_config

    cfg = make_config(tmp_path)
    cfg.profile = "demo"
    svc = create_service(cfg)
    await svc.start()
    try:
        assert svc.ctx.rules is not None
        groups = svc.ctx.rules.rules_api(None)["groups"]
        assert {g["name"] for g in groups} == {"kelvin-hall", "kelvin-services"}
        assert svc.storage is not None
        now = time.time_ns()
        ts = now + np.arange(-120, 10, 5, dtype=np.int64) * 10**9
        await svc.storage.write(
            Batch.single("/hall/row0/rack0/node0/inlet_temp", ts, np.full(ts.shape[0], 35.0))
        )
        hall = next(g for g in svc.ctx.rules.groups if g.group.name == "kelvin-hall")
        await svc.ctx.rules.evaluate(hall, now // 10**6 * 10**6)
        alerts = svc.ctx.rules.alerts_api()
        assert [a["labels"]["alertname"] for a in alerts] == ["InletAboveRedline"]
        assert alerts[0]["state"] == "pending"  # for: 1m
        assert alerts[0]["annotations"]["summary"].startswith(
            "Inlet of /hall/row0/rack0/node0/inlet_temp at 35.0"
        )
    finally:
        await svc.stop()


async def test_a_predicted_inlet_above_the_redline_is_no_alert(tmp_path: Any) -> None:
    """InletAboveRedline counts measured inlets only: the allocator's model writes
    ``predicted_inlet_temp`` beside them (``node_predicted_inlet_temp``), and an operator
    paged for a prediction is paged for nothing."""
    from services.query_api.app import create_service
    from tests.query_api.conftest import make_config

    svc = create_service(make_config(tmp_path, builtin_rules=True))
    await svc.start()
    try:
        assert svc.ctx.rules is not None and svc.storage is not None
        now = time.time_ns() // 10**6 * 10**6
        ts = now + np.arange(-120, 10, 5, dtype=np.int64) * 10**9
        hot = np.full(ts.shape[0], 35.0)
        for name in ("/hall/row0/rack0/node0/inlet_temp", "/hall/row0/rack0/node1/predicted_inlet_temp",
                     "/hall/row0/rack0/node2/predicted_inlet_temp"):  # fmt: skip
            await svc.storage.write(Batch.single(name, ts, hot))
        hall = next(g for g in svc.ctx.rules.groups if g.group.name == "kelvin-hall")
        for at in (now, now + 61 * 10**9):  # pending, then firing after its `for: 1m`
            await svc.ctx.rules.evaluate(hall, at)
        alerts = [
            a for a in svc.ctx.rules.alerts_api() if a["labels"]["alertname"] == "InletAboveRedline"
        ]
        assert [(a["labels"]["sensor"], a["state"]) for a in alerts] == [
            ("/hall/row0/rack0/node0/inlet_temp", "firing")
        ]
    finally:
        await svc.stop()
