"""Credentials and the per-topic ACL of the built-in endpoint, with mosquitto_pub and paho-mqtt."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent
from services.collect_agent.mqtt_auth import MqttAcl, MqttAuth, MqttUserGrant
from services.common import codec
from services.common.auth import Role, hashed
from services.common.mqtt_credentials import SECRET_ENV, derive_password
from services.common.readings import Batch
from tests.collect_agent.conftest import AgentFactory
from tests.collect_agent.paho_client import Paho
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.auth import TOKENS
from tests.support.servers import require_binary

TS0 = 1_764_500_000_000_000_000
REC = codec.encode_dcdb([7], [TS0])
SECRET = "node-secret-for-tests"
ADMIN = TOKENS[Role.ADMIN]


def count(agent: CollectAgent, metric: str, **labels: str) -> float:
    v = agent.metrics.service.registry.get_sample_value(f"kelvin_collect_agent_{metric}", labels)
    return v or 0.0


async def has(agent: CollectAgent, sensor: str) -> bool:
    await agent.spool.wait_empty()
    assert agent.storage is not None
    return await agent.storage.has_sensor(sensor)


def auth(acl: MqttAcl | None = None, tokens: dict[str, str] | None = None) -> MqttAuth:
    return MqttAuth({"rack7": "pw"}, SECRET, acl or MqttAcl(), lambda: tokens or {})


# --------------------------------------------------------------------------- decisions


def test_credentials_resolve_to_roles() -> None:
    a = auth(tokens={"w-token": "write", "a-token": "admin", "r-token": "read"})
    node1 = derive_password(SECRET, "node1").encode()
    assert a.authenticate("node1", node1) == ("node", "node1")
    assert a.authenticate("node2", node1) == "auth_failed"  # a password is one user's only
    assert a.authenticate("rack7", b"pw") == ("node", "rack7")
    assert a.authenticate("anyone", b"w-token") == ("write", "anyone")
    assert a.authenticate(None, b"a-token") == ("admin", None)
    assert a.authenticate("grafana", b"r-token") == "auth_failed"  # reading is not publishing
    assert a.authenticate(None, None) == "auth_missing"
    assert a.authenticate("node1", None) == "auth_failed"


def test_tokens_held_as_verifiers_accept_the_token_only() -> None:
    """The chart gives the agent sha256 verifiers of the tokens, never the tokens."""
    a = auth(tokens={hashed("w-token-0123456789"): "write", "a-token-0123456789": "admin"})
    assert a.authenticate("n", b"w-token-0123456789") == ("write", "n")
    assert a.authenticate("n", b"a-token-0123456789") == ("admin", "n")  # plain ones still
    assert a.authenticate("n", hashed("w-token-0123456789").encode()) == "auth_failed"
    assert a.authenticate("n", b"\xff\xfe") == "auth_failed"  # not UTF-8: no match, no error


def test_acl_patterns_cover_every_topic_form() -> None:
    acl = MqttAcl(
        node_topics=["/%u/#", "/shared/%c/+"],
        users={"alloc": MqttUserGrant(topics=["#"], jobs=True)},
    )
    a = auth(acl)
    n1 = a.identity("node", "node1", "cid")
    allowed = [
        b"/node1/power",
        b"/node1",
        b"/KELVIN_BATCH//node1",
        b"/KELVIN_BATCH//node1/cpu0",
        b"/DCDB_MAP/METADATA//node1/power",
        b"/DCDB_MAP//node1/power",
        b"/shared/cid/temp",
    ]
    denied = {
        b"/node10/power": "denied_topic",
        b"/node2/power": "denied_topic",
        b"/KELVIN_BATCH/": "denied_topic",  # the whole tree
        b"/KELVIN_BATCH//shared/cid": "denied_topic",  # '+' does not cover a subtree
        b"/shared/cid/a/b": "denied_topic",
        b"/DCDB_MAP/METADATA//node2/power": "denied_metadata",
        b"/DCDB_JOBDATA/": "denied_jobs",
    }
    assert [a.decide(n1, t) for t in allowed] == [None] * len(allowed)
    assert {t: a.decide(n1, t) for t in denied} == denied
    assert a.decide(n1, b"/bad//topic") is None  # invalid: the ingestor rejects it itself
    # %u that would widen the filter matches nothing
    assert a.decide(a.identity("node", "a/#", "x"), b"/a/x") == "denied_topic"
    alloc = a.identity("node", "alloc", "x")
    assert a.decide(alloc, b"/DCDB_JOBDATA/") is None and a.decide(alloc, b"/any/x") is None
    writer = a.identity("write", "w", "x")
    assert a.decide(writer, b"/any/x") is None
    assert a.decide(writer, b"/DCDB_JOBDATA/") == "denied_jobs"
    assert a.identity("admin", None, "x").unrestricted


def test_a_batch_name_cannot_leave_its_prefix() -> None:
    batch = Batch.single("/node1/power", [TS0], [1.0])
    _, payload = codec.encode_batch("/node1", batch)
    # Rewrite the relative name "/power" (6 bytes) as "0/powe": /node10/powe
    forged = payload.replace(b"/power", b"0/powe")
    with pytest.raises(codec.PayloadError, match="must be empty or start with '/'"):
        codec.decode_batch("/node1", forged)
    assert codec.decode_batch("/node1", payload).sensors == ["/node1/power"]


def test_derived_password_cli_matches_openssl(tmp_path: Path) -> None:
    out = tmp_path / "password"
    env = {**os.environ, SECRET_ENV: SECRET}
    subprocess.run(
        [sys.executable, "-m", "services.common.mqtt_credentials", "--user", "node1", "--out", str(out)],
        check=True, env=env, timeout=60,
    )  # fmt: skip
    assert out.read_text() == derive_password(SECRET, "node1")
    assert out.stat().st_mode & 0o777 == 0o400
    if shutil.which("openssl"):
        shell = "printf 'kelvin-mqtt:%s' node1 | openssl dgst -sha256 -hmac \"$S\" | cut -d' ' -f2"
        got = subprocess.run(
            ["sh", "-c", shell], env={**env, "S": SECRET}, capture_output=True, text=True
        )
        assert got.stdout.strip() == out.read_text()
    empty = subprocess.run(
        [sys.executable, "-m", "services.common.mqtt_credentials", "--user", "n", "--out", str(out)],
        env={k: v for k, v in os.environ.items() if k != SECRET_ENV}, capture_output=True,
    )  # fmt: skip
    assert empty.returncode == 2 and SECRET_ENV.encode() in empty.stderr


# --------------------------------------------------------------------------- real clients


@pytest.fixture
async def secured(make_agent: AgentFactory) -> CollectAgent:
    return await make_agent(
        mqtt_node_secret=SECRET,
        mqtt_users={"rack7": "rack7-pw"},
        mqtt_acl={"users": {"rack7": {"topics": ["/rack7/#"]}}},
    )


async def test_mosquitto_pub_on_its_prefix_and_denied_elsewhere(secured: CollectAgent) -> None:
    exe = require_binary("mosquitto_pub", "mosquitto-clients")
    pw = derive_password(SECRET, "node1")
    base = ["-h", "127.0.0.1", "-p", str(secured.mqtt_port), "-q", "1", "-m", "[1.5]"]

    async def pub(topic: str, *login: str) -> int:
        proc = await asyncio.create_subprocess_exec(
            exe, *base, "-t", topic, *login, stderr=asyncio.subprocess.PIPE
        )
        await proc.communicate()
        return proc.returncode or 0

    assert await pub("/node1/power", "-u", "node1", "-P", pw) == 0
    # 3.1.1 has no negative PUBACK: acknowledged (so it is not resent forever), not stored
    assert await pub("/node2/power", "-u", "node1", "-P", pw) == 0
    assert await pub("/rack7/n1/temp", "-u", "rack7", "-P", "rack7-pw") == 0
    assert await pub("/node1/temp", "-u", "rack7", "-P", "rack7-pw") == 0
    assert await pub("/node1/x", "-u", "node1", "-P", "wrong") != 0
    assert await pub("/node1/x") != 0
    assert await has(secured, "/node1/power") and await has(secured, "/rack7/n1/temp")
    assert not await has(secured, "/node2/power") and not await has(secured, "/node1/temp")
    assert count(secured, "rejected_total", reason="denied_topic") == 2
    assert count(secured, "mqtt_disconnects_total", reason="auth_failed") == 1
    assert count(secured, "mqtt_disconnects_total", reason="auth_missing") == 1


async def test_paho_v5_gets_reason_codes_and_nothing_denied_is_stored(
    secured: CollectAgent,
) -> None:
    port = secured.mqtt_port
    assert port
    node1 = Paho(port, "n1", "node1", derive_password(SECRET, "node1"))
    assert await asyncio.to_thread(node1.connect) == (0, False)
    batch = Batch.single("/node1/cpu0/user", [TS0], [0.5])
    own_batch = codec.encode_batch("/node1", batch)
    job = json.dumps({"jobid": "1", "starttime": TS0, "endtime": 0, "nodes": ["node1"]})
    cases = [
        ("/node1/power", REC, 0),
        (*own_batch, 0),
        ("/DCDB_MAP/METADATA//node1/power", b'{"unit": "W"}', 0),
        ("/node2/power", REC, mp.RC_NOT_AUTHORIZED),
        ("/DCDB_MAP/METADATA//node2/power", b'{"scale": 1000}', mp.RC_NOT_AUTHORIZED),
        ("/DCDB_JOBDATA/", job.encode(), mp.RC_NOT_AUTHORIZED),
    ]
    for topic, payload, code in cases:
        assert await asyncio.to_thread(node1.publish, topic, payload, 1) == code, topic
    await asyncio.to_thread(node1.close)
    # QoS 2 (paho ignores a PUBREC's reason code, so raw bytes): PUBREC 0x87 ends the flow.
    raw, _ = await RawClient.connect(
        port, "n1", level=5, username="node1", password=derive_password(SECRET, "node1")
    )
    await raw.send(mp.publish("/node2/q2", REC, 2, 9, level=5))
    assert await raw.read() == (0x50, b"\x00\x09\x87")
    await raw.send(mp.ack(mp.PUBREL, 9))
    assert await raw.read() == (0x70, b"\x00\x09\x92")  # no such flow
    await raw.close()
    # A wrong password and no credentials at all are told apart (0x86 / 0x87).
    for login, code in ((("node1", "bad"),), 0x86), (((None, None),), 0x87):
        c = Paho(port, "x", *login[0])
        assert (await asyncio.to_thread(c.connect))[0] == code
        await asyncio.to_thread(c.close)
    # The admin token publishes anything, job records included.
    admin = Paho(port, "ops", "ops", ADMIN)
    assert await asyncio.to_thread(admin.connect) == (0, False)
    assert await asyncio.to_thread(admin.publish, "/DCDB_JOBDATA/", job.encode(), 1) == 0
    await asyncio.to_thread(admin.close)
    assert await has(secured, "/node1/power") and await has(secured, "/node1/cpu0/user")
    assert secured.storage is not None
    assert not await secured.storage.has_sensor("/node2/power")
    assert not await secured.storage.has_sensor("/node2/q2")
    assert await secured.storage.get_metadata("/node2/power") is None
    assert [j.job_id for j in await secured.storage.jobs()] == ["1"]  # the admin's only
    for reason, n in (("denied_topic", 2), ("denied_metadata", 1), ("denied_jobs", 1)):
        assert count(secured, "rejected_total", reason=reason) == n, reason


async def test_a_node_cannot_take_over_another_users_client_id(secured: CollectAgent) -> None:
    assert secured.mqtt_port
    port = secured.mqtt_port
    pw1, pw2 = derive_password(SECRET, "node1"), derive_password(SECRET, "node2")
    first, connack = await RawClient.connect(port, "pusher-a", username="node1", password=pw1)
    assert connack == (0x20, b"\x00\x00")
    other, connack = await RawClient.connect(port, "pusher-a", username="node2", password=pw2)
    assert connack == (0x20, b"\x00\x02") and await other.closed()  # identifier rejected
    await first.send(mp.publish("/node1/still", REC, 1, 1))
    assert await first.read() == (0x40, b"\x00\x01")
    same, connack = await RawClient.connect(port, "pusher-a", username="node1", password=pw1)
    assert connack == (0x20, b"\x00\x00") and await first.closed()  # its own: taken over
    await same.close()
    assert count(secured, "mqtt_disconnects_total", reason="client_id_in_use") == 1


async def test_without_credentials_configured_the_endpoint_is_open(
    make_agent: AgentFactory,
) -> None:
    agent = await make_agent(auth={"mode": "none"})  # --insecure: no tokens at all
    assert agent.mqtt_port and agent.mqtt is not None and not agent.mqtt.auth.required
    client, connack = await RawClient.connect(agent.mqtt_port, "open", login=False)
    assert connack == (0x20, b"\x00\x00")
    await client.send(mp.publish("/DCDB_JOBDATA/", b'{"jobid": "9", "starttime": 1}', 1, 1))
    assert await client.read() == (0x40, b"\x00\x01")
    await client.close()
