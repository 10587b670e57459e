"""snmp against Debian's real snmpd on a free loopback port (v2c and v3 with auth+priv)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest

from services.common.errors import ConfigError, KelvinError
from tests.pusher.conftest import build_plugin
from tests.support.servers import free_port, require_binary

SYS_UPTIME = "1.3.6.1.2.1.1.3.0"
SYS_SERVICES = "1.3.6.1.2.1.1.7.0"
SNMP_IN_PKTS = "1.3.6.1.2.1.11.1.0"


@pytest.fixture(scope="module")
def snmpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    binary = require_binary("snmpd", "snmpd")
    d = tmp_path_factory.mktemp("snmpd")
    port = free_port()
    conf = d / "snmpd.conf"
    conf.write_text(
        f"agentaddress udp:127.0.0.1:{port}\n"
        "rocommunity public 127.0.0.1\n"
        'createUser kelvinv3 SHA "kelvin-auth-pass" AES "kelvin-priv-pass"\n'
        "rouser kelvinv3 priv\n"
        "sysservices 76\n"
        "sysLocation Kelvin test hall\n"
    )
    env = {**os.environ, "SNMP_PERSISTENT_DIR": str(d)}
    proc = subprocess.Popen(
        [binary, "-f", "-Lo", "-C", "-c", str(conf), "-p", str(d / "pid")],
        stdout=open(d / "log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        _wait_snmp(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_snmp(port: int, proc: subprocess.Popen[bytes]) -> None:
    """snmpd listens on UDP: ask it with snmpget until it answers."""
    snmpget = require_binary("snmpget", "snmp")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"snmpd exited with {proc.returncode}")
        r = subprocess.run(
            [
                snmpget,
                "-v2c",
                "-c",
                "public",
                "-t",
                "0.2",
                "-r",
                "0",
                f"127.0.0.1:{port}",
                SYS_SERVICES,
            ],
            capture_output=True,
        )
        if r.returncode == 0:
            return
    raise TimeoutError("snmpd did not answer")


def _agent(port: int, **extra: object) -> dict[str, object]:
    return {
        "name": "pdu1",
        "host": "127.0.0.1",
        "port": port,
        "sensors": [
            {"name": "uptime", "oid": SYS_UPTIME, "unit": "s", "factor": 0.01},
            {"name": "services", "oid": "." + SYS_SERVICES},
            {"name": "missing", "oid": "1.3.6.1.2.1.1.99.0"},
            {"name": "in_pkts", "oid": SNMP_IN_PKTS, "delta": True},
        ],
        **extra,
    }


async def test_v2c_reads_numbers_and_missing_objects(snmpd: int) -> None:
    plugin, (group,) = await build_plugin("snmp", {"agents": [_agent(snmpd)]})
    first = await group.read_async(0)
    second = await group.read_async(0)
    assert [s.name for s in group.sensors][:2] == ["/t/snmp/pdu1/uptime", "/t/snmp/pdu1/services"]
    assert first[1] == 76.0, "sysServices as configured in snmpd.conf"
    assert first[0] > 0 and np.isnan(first[2])
    assert second[3] > first[3], "snmpInPkts counts our own GETs"
    assert group.sensors[0].options.factor == 0.01 and group.sensors[3].options.delta
    await plugin.close()


async def test_v3_with_authentication_and_privacy(snmpd: int) -> None:
    v3 = _agent(
        snmpd, version=3, user="kelvinv3", auth_key="kelvin-auth-pass", priv_key="kelvin-priv-pass"
    )
    plugin, (group,) = await build_plugin("snmp", {"agents": [v3]})
    assert (await group.read_async(0))[1] == 76.0
    await plugin.close()
    wrong = {**v3, "priv_key": "not-the-key!"}
    plugin, (group,) = await build_plugin("snmp", {"agents": [wrong], "timeout_ms": 500})
    with pytest.raises(KelvinError, match="pdu1"):
        await group.read_async(0)
    await plugin.close()


async def test_an_agent_that_does_not_answer_fails_the_read_not_the_plugin() -> None:
    silent = _agent(free_port())
    plugin, (group,) = await build_plugin("snmp", {"agents": [silent], "timeout_ms": 300})
    with pytest.raises(KelvinError, match="No SNMP response"):
        await group.read_async(0)
    await plugin.close()


async def test_bad_oid_is_a_config_error_naming_the_key() -> None:
    bad = {"agents": [{"name": "a", "host": "h", "sensors": [{"name": "x", "oid": "sysUpTime"}]}]}
    with pytest.raises(ConfigError, match=r"pusher\.plugins\.snmp\.agents\.0\.sensors\.0\.oid"):
        await build_plugin("snmp", bad)
