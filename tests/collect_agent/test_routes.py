"""HTTP API of a running agent: /write and /ping as InfluxDB answers them, REST, auth."""

from __future__ import annotations

import asyncio
import base64
import gzip

import aiomqtt
import httpx
import numpy as np

from benchmarks import loadgen_http as lg
from services.collect_agent.app import CollectAgent
from services.common import codec
from services.common.auth import Role
from tests.collect_agent.conftest import AgentFactory
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.auth import MQTT_LOGIN, TOKENS, headers

TS0 = 1_764_500_000_000_000_000


def http(agent: CollectAgent, role: Role | None = Role.ADMIN) -> httpx.AsyncClient:
    """A client holding ``role``'s token (None: no credential)."""
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{agent.port}", headers=headers(role) if role else {}
    )


async def test_ping_answers_like_influxdb(agent: CollectAgent) -> None:
    async with http(agent) as c:
        r = await c.get("/ping")
        assert r.status_code == 204 and r.headers["X-Influxdb-Version"]
        assert (await c.head("/ping")).status_code == 204
        assert (await c.get("/ping", params={"verbose": "true"})).json()["version"]


async def test_write_stores_lines_with_precision_then_204(agent: CollectAgent) -> None:
    async with http(agent) as c:
        r = await c.post(
            "/write",
            params={"db": "telegraf", "precision": "s"},
            content="cpu,host=n1 user=1.5,idle=97i 1764500000\ncpu,host=n2 user=2 1764500001",
        )
        assert r.status_code == 204, r.text
        r = await c.post(
            "/api/v2/write",
            params={"bucket": "b", "org": "o", "precision": "ms"},
            content=gzip.compress(b"mem,host=n1 used=42 1764500000000"),
            headers={"Content-Encoding": "gzip"},
        )
        assert r.status_code == 204, r.text
    await agent.spool.wait_empty()
    assert agent.storage is not None
    got = await agent.storage.read_many(
        [
            "/influx/cpu/n1/user",
            "/influx/cpu/n1/idle",
            "/influx/cpu/n2/user",
            "/influx/mem/n1/used",
        ],
        0,
        2**62,
    )
    assert {k: (s.timestamps_ns.tolist(), s.values.tolist()) for k, s in got.items()} == {
        "/influx/cpu/n1/user": ([TS0], [1.5]),
        "/influx/cpu/n1/idle": ([TS0], [97.0]),
        "/influx/cpu/n2/user": ([TS0 + 1_000_000_000], [2.0]),
        "/influx/mem/n1/used": ([TS0], [42.0]),
    }


async def test_partial_write_is_400_naming_the_line_and_keeps_good_lines(
    agent: CollectAgent,
) -> None:
    async with http(agent) as c:
        r = await c.post("/write", content="good v=1 1764500000000000000\nbad v=oops\n")
        assert r.status_code == 400
        assert "line 2" in r.json()["error"] and "oops" in r.json()["error"]
        assert (
            await c.post("/write", params={"precision": "fortnights"}, content="m v=1")
        ).status_code == 400
        assert (await c.post("/write", content=b"m v=1 \xff\xfe")).status_code == 400
    await agent.spool.wait_empty()
    assert agent.storage is not None
    assert (await agent.storage.read("/influx/good/v", 0, 2**62)).values.tolist() == [1.0]
    assert agent.ingestor.rejected == {"bad_field": 1, "bad_precision": 1, "bad_utf8": 1}


async def test_oversized_body_is_413_and_a_bad_gzip_body_400_both_counted(
    make_agent: AgentFactory,
) -> None:
    agent = await make_agent(max_payload_bytes=2048)
    async with http(agent) as c:
        r = await c.post("/write", content="m v=1\n" * 1000)
        assert r.status_code == 413
        bomb = gzip.compress(b"m v=1\n" * 10_000)
        r = await c.post("/write", content=bomb, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 413
        r = await c.post("/write", content=b"not gzip", headers={"Content-Encoding": "gzip"})
        assert r.status_code == 400 and "gzip" in r.json()["detail"]
    assert agent.ingestor.rejected == {"too_large": 2, "bad_gzip": 1}


async def test_write_takes_the_write_token_in_every_telegraf_form(agent: CollectAgent) -> None:
    body = "m v=1 1764500000000000000"
    tok = TOKENS[Role.WRITE]
    async with http(agent, None) as c:
        assert (await c.post("/write", content=body)).status_code == 401
        wrong = {"Authorization": "Bearer not-a-token-of-this-agent"}
        assert (await c.post("/write", content=body, headers=wrong)).status_code == 401
        # a read token (Grafana's) may not write
        assert (await c.post("/write", content=body, headers=headers(Role.READ))).status_code == 403
        for auth in (f"Bearer {tok}", f"Token {tok}"):
            r = await c.post("/write", content=body, headers={"Authorization": auth})
            assert r.status_code == 204, auth
        basic = base64.b64encode(f"telegraf:{tok}".encode()).decode()
        r = await c.post("/write", content=body, headers={"Authorization": f"Basic {basic}"})
        assert r.status_code == 204
        r = await c.post("/write", content=body, params={"u": "x", "p": tok})
        assert r.status_code == 204
        # reads are open on loopback
        assert (await c.get("/api/v1/stats")).status_code == 200
    async with http(agent, Role.WRITE) as c:  # a pusher's token: ingest only
        assert (
            await c.delete("/api/v1/cache", params={"sensor": "/influx/m/v"})
        ).status_code == 403
        assert (await c.delete("/api/v1/hosts/nobody")).status_code == 403
    async with http(agent, Role.ADMIN) as c:
        assert (await c.delete("/api/v1/hosts/nobody")).status_code == 404
        assert (
            await c.delete("/api/v1/cache", params={"sensor": "/influx/m/v"})
        ).status_code == 204
        assert (await c.get("/api/v1/latest", params={"sensor": "/influx/m/v"})).status_code == 404


async def test_cache_latest_average_sensors_hosts_and_stats(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    client, _ = await RawClient.connect(agent.mqtt_port, client_id="node17")
    async with aiomqtt.Client(
        "127.0.0.1", agent.mqtt_port, identifier="node18", **MQTT_LOGIN
    ) as pub:
        # 10 for 30 s, then 40 for 10 s: the 40 s time-weighted average is (10*30+40*10)/40.
        await pub.publish(
            "/c/power",
            codec.encode_dcdb([10, 40, 40], [TS0, TS0 + 30 * 10**9, TS0 + 40 * 10**9]),
            qos=1,
        )
        await pub.publish("/c/other", b"bad", qos=1)
        async with http(agent) as c:
            latest = (await c.get("/api/v1/latest", params={"sensor": "/c/power"})).json()
            assert latest == {"sensor": "/c/power", "timestamp_ns": TS0 + 40 * 10**9, "value": 40.0}
            avg = (
                await c.get("/api/v1/average", params={"sensor": "/c/power", "interval": "40s"})
            ).json()
            assert avg["value"] == (10 * 30 + 40 * 10) / 40 and avg["interval_s"] == 40
            assert (
                await c.get("/api/v1/average", params={"sensor": "/c/power", "interval": "zz"})
            ).status_code == 400
            assert (await c.get("/api/v1/latest", params={"sensor": "/c/none"})).status_code == 404
            sensors = (await c.get("/api/v1/sensors", params={"prefix": "/c"})).json()
            assert [s["name"] for s in sensors["sensors"]] == ["/c/power"]
            hosts = (await c.get("/api/v1/hosts")).json()
            assert [h["client_id"] for h in hosts["hosts"]] == ["node17", "node18"]
            assert hosts["hosts"][1]["messages"] == 2
            stats = (await c.get("/api/v1/stats")).json()
            assert stats["rejected"] == {"bad_length": 1}
            assert stats["readings_spooled"] == 3 and stats["connections"] == 2
            metrics = (await c.get("/metrics")).text
            assert 'kelvin_collect_agent_rejected_total{reason="bad_length"} 1.0' in metrics
            assert "kelvin_collect_agent_spool_pending_readings" in metrics
            assert (await c.delete("/api/v1/hosts/node17")).status_code == 204
    assert await client.closed()


async def test_the_benchmark_client_writes_bodies_and_every_reading_is_stored(
    agent: CollectAgent,
) -> None:
    """benchmarks/loadgen_http against a real agent: all 204, every reading read back
    exactly (the benchmark's own count-back)."""
    assert agent.port is not None
    payloads = lg.bodies(3000, 300, 500)
    res = await asyncio.to_thread(
        lg.post_all, agent.port, "/write", payloads, 4, headers(Role.WRITE)
    )
    assert res["statuses"] == {"204": 6}, res
    await agent.spool.wait_empty()
    assert agent.storage is not None
    sensor, ts, vs = lg.expected(3000, 300)
    tags = lg.series_tags(300)
    names = [f"/influx/node/{t[5:].replace(',sensor=', '/')}/value" for t in tags]
    got = await agent.storage.read_many(names, 0, 2**62)
    for s, name in enumerate(names):
        assert np.array_equal(got[name].timestamps_ns, ts[sensor == s]), name
        assert np.array_equal(got[name].values, vs[sensor == s]), name
