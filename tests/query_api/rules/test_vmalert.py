"""vmalert (Debian's victoria-metrics) as a second real client of Kelvin's Prometheus API.

It evaluates a rule file against ``/prometheus`` (its datasource), sends what fires
to the real Alertmanager, and writes recording results back to Kelvin's collect
agent by remote write, so a third party closes the loop through both HTTP APIs.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from services.common.auth import Role
from services.common.readings import Batch
from tests.collect_agent.conftest import AgentFactory
from tests.query_api.conftest import Api
from tests.support.alertmanager import Alertmanager
from tests.support.auth import TOKENS
from tests.support.servers import free_port, require_binary, wait_port

RULES = """
groups:
  - name: vm
    interval: 1s
    rules:
      - alert: VmNodeHot
        expr: node_power > 250
        labels: {via: vmalert}
        annotations: {summary: "{{ $labels.node }} at {{ $value }} W"}
      - record: vm:node_power:max
        expr: max(node_power)
"""


async def test_vmalert_evaluates_rules_against_kelvin(
    api: Api, make_agent: AgentFactory, alertmanager: Alertmanager, tmp_path: Path
) -> None:
    binary = require_binary("vmalert", "victoria-metrics")
    agent = await make_agent()
    now = time.time_ns()
    ts = now + np.arange(-120, 60, 5, dtype=np.int64) * 10**9
    for n, w in (("node0", 200.0), ("node1", 280.0)):
        await api.storage.write(
            Batch.single(f"/hall/row0/rack0/{n}/power", ts, np.full(ts.shape[0], w))
        )
    (tmp_path / "vm.yml").write_text(RULES)
    port = free_port()
    log = open(tmp_path / "vmalert.log", "wb")  # noqa: SIM115, ASYNC230
    proc = subprocess.Popen(  # noqa: ASYNC220 (started once; the test then only polls)
        [binary, f"-rule={tmp_path / 'vm.yml'}", f"-datasource.url={api.url}/prometheus",
         f"-notifier.url={alertmanager.url}", f"-remoteWrite.url=http://127.0.0.1:{agent.port}", f"-remoteWrite.bearerToken={TOKENS[Role.WRITE]}",
         "-evaluationInterval=1s", f"-httpListenAddr=127.0.0.1:{port}", "-remoteWrite.flushInterval=200ms"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_port, port, "127.0.0.1", 30.0, proc)
        async with httpx.AsyncClient(timeout=10) as c:

            async def ours() -> list[dict[str, Any]]:
                r = await c.get(f"{alertmanager.url}/api/v2/alerts")
                return [a for a in r.json() if a["labels"].get("via") == "vmalert"]

            deadline = time.monotonic() + 30
            while not (got := await ours()):
                assert time.monotonic() < deadline, (tmp_path / "vmalert.log").read_text()[-2000:]
                await asyncio.sleep(0.1)
            assert (
                got[0]["labels"]["alertname"] == "VmNodeHot" and got[0]["labels"]["node"] == "node1"
            )
            assert got[0]["annotations"]["summary"] == "node1 at 280 W"
            # the recording came back through remote write into the agent's storage
            assert agent.storage is not None
            while True:
                await agent.spool.wait_empty()
                names = [n for n in await agent.storage.sensors("/") if "vm:node_power:max" in n]
                if names:
                    break
                assert time.monotonic() < deadline, (tmp_path / "vmalert.log").read_text()[-2000:]
                await asyncio.sleep(0.1)
            stored = await agent.storage.read(names[0], 0, 2**62)
            assert stored.values.tolist() and set(stored.values.tolist()) == {280.0}
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
