"""InfluxDB specifics: auth, retention policies, retries and error mapping, wire encoding."""

from __future__ import annotations

import http.server
import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.readings import Batch, Series
from services.common.sensors import SensorMetadata
from services.common.storage.influxdb import InfluxStorage
from services.common.storage.influxdb.protocol import (
    SENTINELS,
    decode_values,
    encode_values,
    line_tag,
    lines,
    name_of_tag,
    parse_csv,
    tag_value,
)
from services.common.storage.settings import InfluxSettings
from tests.support.influxdb import InfluxDB
from tests.support.servers import free_port

T0 = 1_700_000_000 * 10**9


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB]:
    """An influxd with authentication on and one admin user."""
    server = InfluxDB(tmp_path_factory.mktemp("influx-auth"), username="admin", password="s3cret")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_user_and_password_auth(secured: InfluxDB) -> None:
    ok = InfluxStorage(secured.settings("authdb"))
    await ok.open()
    await ok.write(Batch.single("/auth/x", [T0], [1.5]))
    assert (await ok.read("/auth/x", T0, T0 + 1)).values.tolist() == [1.5]
    await ok.close()

    bad = InfluxStorage(secured.settings("authdb", password="wrong"))
    with pytest.raises(PermanentStorageError, match=r"HTTP 401.*username/password"):
        await bad.open()


async def test_unreachable_server_is_retryable_after_backoff() -> None:
    settings = InfluxSettings(
        url=f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.001, timeout_s=2
    )
    backend = InfluxStorage(settings)
    with pytest.raises(RetryableStorageError, match="after 3 attempt"):
        await backend.open()
    value = backend.metrics.service.registry.get_sample_value(
        "kelvin_storage_retries_total", {"backend": "influxdb"}
    )
    assert value == 2


async def test_retention_policy_is_created_and_catalog_survives_it(
    influx_servers: list[InfluxDB],
) -> None:
    server = influx_servers[0]
    settings = server.settings("rpdb", retention_policy="short", retention_duration="1h")
    backend = InfluxStorage(settings)
    await backend.open()
    stats = await backend.stats()
    assert stats["retention_policies"]["short"] == "1h0m0s"
    # Readings older than the policy are dropped by the server: counted, not raised.
    now = T0 * 0 + 1_800_000_000 * 10**9
    await backend.write(Batch.single("/rp/x", [10**9, now], [1.0, 2.0]))
    dropped = backend.metrics.service.registry.get_sample_value(
        "kelvin_storage_errors_total", {"backend": "influxdb", "reason": "beyond_retention"}
    )
    assert dropped == 1
    # Metadata sits at time 0 in the catalog policy (autogen), beyond "short".
    await backend.put_metadata(SensorMetadata(name="/rp/x", unit="W"))
    assert (await backend.get_metadata("/rp/x")).unit == "W"  # type: ignore[union-attr]
    await backend.close()

    missing = InfluxStorage(server.settings("rpdb", retention_policy="nope"))
    with pytest.raises(PermanentStorageError, match="retention policy 'nope' does not exist"):
        await missing.open()
    await missing.close()


async def test_bad_measurement_and_out_of_range_time_are_permanent(
    influx_servers: list[InfluxDB],
) -> None:
    with pytest.raises(PermanentStorageError, match="measurement"):
        InfluxStorage(InfluxSettings(measurement="bad name"))
    backend = InfluxStorage(influx_servers[0].settings("rangedb"))
    await backend.open()
    with pytest.raises(PermanentStorageError, match="outside InfluxDB's range"):
        await backend.write(Batch.single("/r/x", [-(2**63)], [1.0]))
    await backend.close()


def _mock_backend(handler: httpx.MockTransport) -> InfluxStorage:
    backend = InfluxStorage(InfluxSettings(retries=3, backoff_s=0.001))
    backend.http.client = httpx.AsyncClient(base_url="http://influx", transport=handler)
    return backend


async def test_status_mapping_retries_5xx_and_honours_retry_after() -> None:
    """A mock transport: InfluxDB cannot be made to answer 503 or 429 on demand."""
    answers = iter([503, 429, 204])
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status = next(answers)
        headers = {"Retry-After": "0"} if status == 429 else {}
        return httpx.Response(
            status, json={"error": "busy"} if status >= 400 else None, headers=headers
        )

    backend = _mock_backend(httpx.MockTransport(handle))
    await backend.write(Batch.single("/m/x", [1], [1.0]))
    assert seen == ["/write"] * 3


async def test_status_mapping_4xx_is_permanent_and_413_splits() -> None:
    bodies: list[bytes] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = request.content
        if b"bad" in body:
            return httpx.Response(400, json={"error": "field type conflict"})
        if body.count(b"\n") > 3:
            return httpx.Response(413, json={"error": "Request Entity Too Large"})
        bodies.append(body)
        return httpx.Response(204)

    backend = _mock_backend(httpx.MockTransport(handle))
    await backend.write(Batch.single("/m/x", np.arange(10), np.arange(10.0)))
    assert b"".join(bodies).count(b"kelvin,sensor=/m/x value=") == 10  # split until accepted
    with pytest.raises(PermanentStorageError, match=r"HTTP 400.*field type conflict"):
        await backend.write(Batch.single("/m/bad", [1], [1.0]))


@given(st.text(min_size=1).filter(lambda t: "\x00" not in t))
def test_tag_encoding_round_trips(text: str) -> None:
    assert name_of_tag(tag_value(text)) == text
    assert "\n" not in line_tag(text) and not line_tag(text).endswith("\\")


def test_sentinels_round_trip_and_leave_other_values_alone() -> None:
    vals = np.array([math.nan, math.inf, -math.inf, 1.0, -0.0, 1.7976931348623155e308])
    enc = encode_values(vals)
    assert np.isfinite(enc).all() and enc[3:].tolist() == vals[3:].tolist()
    assert enc[:3].tolist() == [SENTINELS["nan"], SENTINELS["inf"], SENTINELS["-inf"]]
    back = decode_values(enc.copy())
    assert math.isnan(back[0]) and back[1:].tolist() == vals[1:].tolist()


def test_parse_csv_edges() -> None:
    assert parse_csv(b"")[0].shape == (0,)
    ts, vs = parse_csv(b"name,tags,time,value\nkelvin,,5,1.25\n")
    assert ts.tolist() == [5] and vs.tolist() == [1.25]
    with pytest.raises(PermanentStorageError, match="query failed"):
        parse_csv(b'error\n"error parsing query"\n')
    # a chunked answer that fails after its first rows (a later piece has no header)
    later = b'kelvin,,5,1.25\nerror\n"max-select-point limit exceeded"\n'
    with pytest.raises(PermanentStorageError, match=r"query failed: .*max-select-point"):
        parse_csv(later, header=False)
    with pytest.raises(PermanentStorageError, match="unreadable CSV answer"):
        parse_csv(b"kelvin,,5,1.25\nkelvin,,six,1.5\n", header=False)
    ts, _ = parse_csv(b"errors,,5,1.25\nerrors,,6,1.5\n", header=False)  # a measurement
    assert ts.tolist() == [5, 6]


def test_launcher_moves_every_port(influx_servers: list[InfluxDB]) -> None:
    (a,) = influx_servers
    assert len({a.port, a.rpc_port, 8086, 8088}) == 4
    conf = Path(a.log_path).with_name("influxdb.conf").read_text()
    assert f'bind-address = "127.0.0.1:{a.rpc_port}"' in conf
    assert "reporting-enabled = false" in conf


def test_lines_repeat_each_head_for_its_series_only() -> None:
    ts, vs = np.array([1, 2]), np.array([1.0, math.inf])
    assert lines(["a v=", "b v="], [0, 2], ts, vs) == [
        "b v=1.0 1\n",
        f"b v={SENTINELS['inf']!r} 2\n",
    ]
    assert lines(["a v=", "b v="], [1, 1], ts, vs)[0] == "a v=1.0 1\n"


class _Fake2x(http.server.BaseHTTPRequestHandler):
    """Just enough of an InfluxDB 2.x for Kelvin's open(): refuses CREATE DATABASE
    (as 2.x does) and serves the bucket API. A fake: no 2.x server runs here."""

    seen: ClassVar[list[tuple[str, str]]] = []

    def _answer(self, status: int, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path))
        path = self.path.split("?")[0]
        if path == "/ping":
            self._answer(204)
        elif path == "/api/v2/buckets":
            self._answer(200, {"buckets": []})
        elif path == "/api/v2/orgs":
            self._answer(200, {"orgs": [{"id": "0123456789abcdef", "name": "site"}]})
        else:
            self._answer(404, {"message": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length).decode()
        self.seen.append(("POST", self.path + " " + body))
        path = self.path.split("?")[0]
        if path == "/query":
            self._answer(422, {"error": "CREATE DATABASE is not supported"})
        elif path == "/api/v2/buckets":
            sent = json.loads(body)
            sent.update(id="b1", retentionRules=sent.get("retentionRules") or [])
            self._answer(201, sent)
        else:
            self._answer(404, {"message": "not found"})

    def log_message(self, *args: Any) -> None:
        pass


async def test_v2_buckets_are_created_when_create_database_is_refused() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake2x)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        backend = InfluxStorage(
            InfluxSettings(
                url=url,
                database="kelvin",
                retention_policy="short",
                retention_duration="2d",
                token="t0k",
                org="site",
                retries=0,
            )
        )
        await backend.open()
        await backend.close()
    finally:
        server.shutdown()
        server.server_close()
    created = [p for m, p in _Fake2x.seen if m == "POST" and p.startswith("/api/v2/buckets")]
    bodies = {
        json.loads(p.split(" ", 1)[1])["name"]: json.loads(p.split(" ", 1)[1]) for p in created
    }
    assert set(bodies) == {"kelvin/autogen", "kelvin/short"}  # catalog and readings
    assert bodies["kelvin/short"]["retentionRules"][0]["everySeconds"] == 2 * 86400
    assert not bodies["kelvin/autogen"].get("retentionRules")


async def test_a_batch_of_several_requests_logs_its_last_one_too(
    influx_servers: list[InfluxDB], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that computed virtual results between the requests of one batch must
    find that batch in ``modified_since`` of its computation time."""
    backend = InfluxStorage(influx_servers[0].settings("partsdb", write_lines=100))
    await backend.open()
    marks: list[int] = []
    send = backend.http.write

    async def write_then_mark(body: bytes, rp: str | None = None, strict: bool = False) -> None:
        await send(body, rp, strict)
        marks.append(time.time_ns())  # a reader computing now has seen this part only

    monkeypatch.setattr(backend.http, "write", write_then_mark)
    ts = T0 + np.arange(150, dtype=np.int64) * 10**9
    await backend.write(Batch.from_series([Series("/p/a", ts, ts / 1e9), Series("/p/b", ts, ts)]))
    assert len(marks) == 3  # 300 lines in requests of 100
    for mark in marks[:-1]:
        assert await backend.modified_since(["/p/a", "/p/b"], mark) == {"/p/a": T0, "/p/b": T0}
    assert await backend.modified_since(["/p/a", "/p/b"], marks[-1]) == {}
    await backend.close()
