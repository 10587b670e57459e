"""End to end: `kelvin up` as a subprocess on free ports and a temp data dir.

pusher (tester + procfs) -> MQTT -> collect agent -> SQLite -> query API, plus
a third-party MQTT client (Debian's mosquitto_pub) and bad input. The tests in
this module share one `kelvin up` and run in file order; the last one stops it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.common.auth import Role
from tests.support.kelvin import KelvinUp
from tests.support.servers import port_is_free, require_binary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KelvinUp]:
    handle = KelvinUp(tmp_path_factory.mktemp("kelvin-up")).start()
    try:
        yield handle
    finally:
        if handle.stop() != 0:
            print(handle.tail())


def _walk(client: httpx.Client, base: str, prefix: str, want: str, depth: int = 0) -> str | None:
    """Depth-first search for a sensor whose path has a level named ``want``."""
    r = client.get(f"{base}/api/v1/sensors", params={"prefix": prefix})
    if r.status_code != 200 or depth > 8:
        return None
    for child in r.json()["children"]:
        levels = child["name"].split("/")
        if child["is_sensor"] and want in levels:
            return str(child["name"])
        if child["has_children"]:
            found = _walk(client, base, child["name"], want, depth + 1)
            if found:
                return found
    return None


def _readings(client: httpx.Client, base: str, sensor: str, **params: str) -> dict:  # type: ignore[type-arg]
    r = client.get(f"{base}/api/v1/readings", params={"sensor": sensor, "format": "json", **params})
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def test_tester_and_procfs_readings_arrive_within_10_s(up: KelvinUp) -> None:
    deadline = up.spawned_at + 10.0  # counted from the process start, startup included
    counts: dict[str, int] = {}
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            for plugin in ("tester", "procfs"):
                sensor = _walk(client, up.url("query_api"), "/", plugin)
                if sensor:
                    counts[plugin] = _readings(client, up.url("query_api"), sensor, start="now-1m")[
                        "count"
                    ]
            if all(counts.get(p, 0) >= 5 for p in ("tester", "procfs")):
                break
            time.sleep(0.25)
    assert counts.get("tester", 0) >= 5, (counts, up.tail(3000))
    assert counts.get("procfs", 0) >= 5, (counts, up.tail(3000))


def test_csv_has_dcdb_header(up: KelvinUp) -> None:
    with httpx.Client(timeout=5) as client:
        sensor = _walk(client, up.url("query_api"), "/", "tester")
        assert sensor
        r = client.get(
            f"{up.url('query_api')}/api/v1/readings",
            params={"sensor": sensor, "start": "now-1m", "format": "csv"},
        )
    lines = r.text.strip().splitlines()
    assert lines[0] == "Sensor,Time,Value"
    assert lines[1].startswith(f"{sensor},")


def _login(up: KelvinUp, role: Role = Role.WRITE) -> list[str]:
    """mosquitto_pub's login to kelvin up's MQTT endpoint: a token as the password."""
    return ["-u", "e2e", "-P", up.token(role)]


def test_mqtt_publishing_needs_a_write_or_admin_token(up: KelvinUp) -> None:
    """Tokens exist, so the endpoint takes logins only (the pusher's and allocator's come
    from kelvin up); a read token does not publish."""
    mosquitto_pub = require_binary("mosquitto_pub", "mosquitto-clients")
    base = [mosquitto_pub, "-h", "127.0.0.1", "-p", str(up.ports["mqtt"]), "-q", "1",
            "-t", "/e2e/login/value", "-m", "[1]"]  # fmt: skip

    def pub(*login: str) -> int:
        return subprocess.run([*base, *login], capture_output=True, timeout=20).returncode

    assert pub() != 0 and pub(*_login(up, Role.READ)) != 0
    assert pub(*_login(up, Role.WRITE)) == 0 and pub(*_login(up, Role.ADMIN)) == 0


def test_mosquitto_pub_dcdb_record_round_trips_exactly(up: KelvinUp, tmp_path: Path) -> None:
    mosquitto_pub = require_binary("mosquitto_pub", "mosquitto-clients")
    value, ts = -1234567890123, 1_764_500_000_123_456_789
    payload = tmp_path / "record.bin"
    payload.write_bytes(value.to_bytes(8, "little", signed=True) + ts.to_bytes(8, "little"))
    subprocess.run(
        [mosquitto_pub, "-h", "127.0.0.1", "-p", str(up.ports["mqtt"]), "-q", "1", *_login(up),
         "-i", "e2e-probe", "-t", "/e2e/probe/value", "-f", str(payload)],
        check=True, timeout=20,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    with httpx.Client(timeout=5) as client:
        while True:
            r = client.get(
                f"{up.url('query_api')}/api/v1/readings",
                params={
                    "sensor": "/e2e/probe/value",
                    "start": str(ts - 1000),
                    "end": str(ts + 1000),
                },
            )
            if (r.status_code == 200 and r.json()["count"] == 1) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["timestamps_ns"] == [ts]
    assert body["values"] == [float(value)]


def test_unknown_sensor_is_404_with_json_error(up: KelvinUp) -> None:
    with httpx.Client(timeout=5) as client:
        r = client.get(
            f"{up.url('query_api')}/api/v1/readings", params={"sensor": "/no/such/sensor"}
        )
    assert r.status_code == 404
    body = r.json()
    assert body["error"] == "not_found" and "/no/such/sensor" in body["detail"]


def _rejected(client: httpx.Client, base: str, reason: str) -> float:
    total = 0.0
    for line in client.get(f"{base}/metrics").text.splitlines():
        if line.startswith("kelvin_collect_agent_rejected_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_malformed_payload_is_counted_and_service_keeps_serving(up: KelvinUp) -> None:
    mosquitto_pub = require_binary("mosquitto_pub", "mosquitto-clients")
    with httpx.Client(timeout=5) as client:
        before = _rejected(client, up.url("collect_agent"), "bad_length")
        subprocess.run(
            [mosquitto_pub, "-h", "127.0.0.1", "-p", str(up.ports["mqtt"]), "-q", "0",
             *_login(up), "-t", "/e2e/bad/value", "-m", "12345"],
            check=True, timeout=20,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while (
            _rejected(client, up.url("collect_agent"), "bad_length") <= before
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert _rejected(client, up.url("collect_agent"), "bad_length") == before + 1
        # Still serving: a good reading after the bad one is stored.
        subprocess.run(
            [mosquitto_pub, "-h", "127.0.0.1", "-p", str(up.ports["mqtt"]), "-q", "1",
             *_login(up), "-t", "/e2e/good/value", "-m", '{"value": 7.25}'],
            check=True, timeout=20,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = client.get(
                f"{up.url('query_api')}/api/v1/readings",
                params={"sensor": "/e2e/good/value", "start": "now-1m"},
            )
            if r.status_code == 200 and r.json()["count"]:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["values"] == [7.25]
        assert client.get(f"{up.url('collect_agent')}/healthz").status_code == 200


def test_tokens_are_generated_printed_once_and_required_for_changes(up: KelvinUp) -> None:
    admin = up.token(Role.ADMIN)
    assert f"admin  {admin}" in up.output(), "kelvin up prints the tokens it generated"
    mode = (up.data_dir / "auth" / "tokens.json").stat().st_mode & 0o777
    assert mode == 0o600
    body = {"name": "/e2e/meta", "unit": "W"}
    with httpx.Client(timeout=5) as client:
        url = f"{up.url('query_api')}/api/v1/metadata"
        assert client.put(url, json=body).status_code == 401
        write = client.put(url, json=body, headers=up.headers(Role.WRITE))
        assert write.status_code == 403
        assert client.put(url, json=body, headers=up.headers(Role.ADMIN)).status_code == 200
        line = b"e2e v=1 1764500000000000000"
        agent = f"{up.url('collect_agent')}/write"
        assert client.post(agent, content=line).status_code == 401
        assert client.post(agent, content=line, headers=up.headers(Role.WRITE)).status_code == 204


def test_every_service_serves_health_and_metrics(up: KelvinUp) -> None:
    with httpx.Client(timeout=5) as client:
        for key, prefix in [
            ("collect_agent", "kelvin_collect_agent_"),
            ("pusher", "kelvin_pusher_"),
            ("query_api", "kelvin_query_api_"),
            ("allocator", "kelvin_allocator_"),
        ]:
            base = f"http://127.0.0.1:{up.ports[key]}"
            assert client.get(f"{base}/healthz").status_code == 200
            assert client.get(f"{base}/readyz").status_code == 200
            metrics = client.get(f"{base}/metrics").text
            assert prefix in metrics, key
        assert (
            client.get(f"http://127.0.0.1:{up.ports['allocator']}/healthz").json()["status"] == "ok"
        )
        # The allocator logged in to the agent's MQTT endpoint with the admin token.
        allocator = client.get(f"http://127.0.0.1:{up.ports['allocator']}/metrics").text
        assert "kelvin_allocator_mqtt_connected 1.0" in allocator, up.tail(3000)


def test_sigterm_flushes_exits_0_and_frees_every_port(up: KelvinUp) -> None:
    assert up.stop() == 0, up.tail(3000)
    busy = [name for name, port in up.ports.items() if not port_is_free(port)]
    assert not busy, f"still listening after exit: {busy}"
    if os.environ.get("KELVIN_E2E_SHOW_LOG"):
        print(up.output())
