"""Kelvin inside a Prometheus setup, with real processes: remote write in, remote read out.

One Debian ``prometheus`` scrapes a real ``prometheus-node-exporter`` and forwards
what it scrapes to Kelvin's collect agent by remote write; it also reads Kelvin's
sensors by remote read and evaluates a recording and an alerting rule over them.
Kelvin runs as ``kelvin run collect-agent`` and ``kelvin run query-api`` on one
SQLite file.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from services.common.auth import Role
from services.common.readings import Batch
from services.common.storage import open_storage
from services.common.storage.settings import StorageSettings
from tests.support.auth import TOKENS, write_config_yaml
from tests.support.prometheus import KelvinService, Prometheus
from tests.support.servers import free_port, require_binary, wait_port

RULES = """
groups:
  - name: kelvin
    interval: 250ms
    rules:
      - record: dc:node_power:sum
        expr: sum(node_power)
      - alert: NodeHot
        expr: node_power > 250
        labels: {severity: page}
        annotations: {summary: "{{ $labels.node }} draws {{ $value }} W"}
"""


@dataclass
class Stack:
    prometheus: str
    agent: str
    query_api: str
    node_exporter: str
    now_s: float


def until(check: Any, timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy (each poll is one request)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


async def _fill(db: Path, now_ns: int) -> None:
    """Node power in Kelvin only (Prometheus sees it through remote read): 10 min back, 2 ahead."""
    storage = await open_storage(StorageSettings(sqlite={"path": str(db)}))
    ts = now_ns + np.arange(-600, 120, 5, dtype=np.int64) * 10**9
    try:
        for n in range(4):
            name = f"/dc/row0/rack0/node{n}/power"
            await storage.write(Batch.single(name, ts, np.full(ts.shape[0], 200.0 + 20 * n)))
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    d = tmp_path_factory.mktemp("peers")
    db = d / "kelvin.sqlite"
    now_ns = time.time_ns() // 10**9 * 10**9
    asyncio.run(_fill(db, now_ns))
    storage = f"storage:\n  sqlite:\n    path: {db}\n" + write_config_yaml()
    ap, qp = free_port(), free_port()
    agent = KelvinService(
        d, "collect-agent",
        f"collect_agent:\n  host: 127.0.0.1\n  port: {ap}\n  mqtt_enabled: false\n"
        f"  spool_dir: {d / 'spool'}\n" + storage, ap,
    ).spawn()  # fmt: skip
    (d / "rules.yml").write_text(RULES)
    qapi = KelvinService(
        d, "query-api",
        f"query_api:\n  host: 127.0.0.1\n  port: {qp}\n  rule_files: [{d / 'rules.yml'}]\n" + storage, qp,
    ).spawn()  # fmt: skip
    ne_port = free_port()
    ne_log = open(d / "node-exporter.log", "wb")  # noqa: SIM115
    ne = subprocess.Popen(
        [require_binary("prometheus-node-exporter", "prometheus-node-exporter"),
         f"--web.listen-address=127.0.0.1:{ne_port}", "--collector.disable-defaults",
         "--collector.loadavg", "--collector.meminfo", "--collector.cpu"],
        stdout=ne_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    prom = Prometheus(
        d,
        f"""global:
  scrape_interval: 250ms
  evaluation_interval: 250ms
scrape_configs:
  - job_name: node
    static_configs: [{{targets: ['127.0.0.1:{ne_port}']}}]
remote_write:
  - url: http://127.0.0.1:{ap}/api/v1/write
    authorization: {{credentials: {TOKENS[Role.WRITE]}}}
    queue_config: {{batch_send_deadline: 200ms, min_backoff: 50ms, max_backoff: 500ms}}
remote_read:
  - url: http://127.0.0.1:{qp}/prometheus/api/v1/read
    read_recent: true
rule_files: [{d / "rules.yml"}]
""",
    )
    try:
        agent.wait()
        qapi.wait()
        wait_port(ne_port, proc=ne)
        prom.start()
        yield Stack(prom.url, agent.url, qapi.url, f"127.0.0.1:{ne_port}", now_ns / 1e9)
    finally:
        prom.stop()
        ne.terminate()
        ne.wait(10)
        ne_log.close()
        qapi.stop()
        agent.stop()


def kelvin_query(stack: Stack, q: str, t: float) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{stack.query_api}/prometheus/api/v1/query", params={"query": q, "time": f"{t:.3f}"}
    )
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]  # type: ignore[no-any-return]


def prom_query(stack: Stack, q: str, t: float) -> list[dict[str, Any]]:
    r = httpx.get(f"{stack.prometheus}/api/v1/query", params={"query": q, "time": f"{t:.3f}"})
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]  # type: ignore[no-any-return]


def test_remote_write_stores_what_prometheus_scraped(stack: Stack) -> None:
    """node_exporter -> Prometheus -> remote write -> Kelvin holds the same samples."""
    sel = f'node_load1{{instance="{stack.node_exporter}"}}'

    def three() -> bool:
        got = kelvin_query(stack, f"count_over_time({sel}[1m])", time.time())
        return bool(got) and float(got[0]["value"][1]) >= 3

    until(three, what="remote write never brought three samples")
    t = float(kelvin_query(stack, f"timestamp({sel})", time.time())[0]["value"][1])
    ours = kelvin_query(stack, f"{sel}[1m]", t)
    assert len(ours) == 1
    assert (
        ours[0]["metric"]["sensor"]
        == f"/prometheus/node_load1/instance={stack.node_exporter}/job=node"
    )
    theirs = [s for s in prom_query(stack, f"{sel}[1m]", t) if "sensor" not in s["metric"]]
    metric = {k: v for k, v in ours[0]["metric"].items() if k != "sensor"}
    assert theirs and metric == theirs[0]["metric"]
    assert ours[0]["values"] == theirs[0]["values"]
    cpu = kelvin_query(
        stack, f'count(node_cpu_seconds_total{{instance="{stack.node_exporter}"}})', t
    )
    assert float(cpu[0]["value"][1]) >= 2  # several series per scrape, one sensor each


def test_prometheus_answers_promql_over_kelvin_by_remote_read(stack: Stack) -> None:
    t = stack.now_s - 30
    for q in ("sum(node_power)", 'node_power{node="node2"}', "max_over_time(node_power[5m])",
              "count(node_power > 210)"):  # fmt: skip
        ours, theirs = kelvin_query(stack, q, t), prom_query(stack, q, t)
        assert theirs and sorted(map(str, ours)) == sorted(map(str, theirs)), q


def test_prometheus_evaluates_rules_over_kelvin(stack: Stack) -> None:
    def firing() -> list[dict[str, Any]]:
        r = httpx.get(f"{stack.prometheus}/api/v1/alerts").json()["data"]["alerts"]
        return [a for a in r if a["state"] == "firing"]

    alerts = until(firing, what="Prometheus never fired the rule over Kelvin's data")
    assert {a["labels"]["node"] for a in alerts} == {"node3"}  # 260 W > 250 W
    assert alerts[0]["annotations"]["summary"] == "node3 draws 260 W"
    recorded = until(
        lambda: prom_query(stack, "dc:node_power:sum", time.time()), what="no recording"
    )
    assert float(recorded[0]["value"][1]) == 200 + 220 + 240 + 260


def shape(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: shape(v) for k, v in sorted(x.items()) if k != "lastError"}
    if isinstance(x, list):
        return [shape(x[0])] if x else []
    return type(x).__name__


def test_kelvin_shows_rules_and_alerts_as_prometheus_does(stack: Stack) -> None:
    """The same rule file in Kelvin and in Prometheus (over Kelvin's data): same API answers."""

    def rules(base: str) -> Any:
        body = httpx.get(f"{base}/api/v1/rules").json()["data"]["groups"]
        hot = next(r for r in body[0]["rules"] if r["name"] == "NodeHot")
        return body if hot["state"] == "firing" else None

    theirs = until(lambda: rules(stack.prometheus), what="Prometheus never fired")
    ours = until(lambda: rules(f"{stack.query_api}/prometheus"), what="Kelvin never fired")
    assert shape(ours) == shape(theirs)
    for o, t in zip(ours[0]["rules"], theirs[0]["rules"], strict=True):
        assert (o["name"], o["type"], o["query"], o["health"], o.get("state")) == (
            t["name"], t["type"], t["query"], t["health"], t.get("state"))  # fmt: skip
    oa = httpx.get(f"{stack.query_api}/prometheus/api/v1/alerts").json()["data"]["alerts"]
    ta = httpx.get(f"{stack.prometheus}/api/v1/alerts").json()["data"]["alerts"]
    assert shape(oa) == shape(ta)
    assert [(a["labels"], a["annotations"], a["value"]) for a in oa] == [
        (a["labels"], a["annotations"], a["value"]) for a in ta
    ]
