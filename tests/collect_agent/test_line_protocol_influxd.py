"""The reference parser against InfluxDB's own: the same lines refused, the same values stored.

A random corpus (lp_corpus.py; every field key carries its line's number, so
that stored points tell which line they came from and no two lines conflict on
a field's type) is written to a real influxd (Debian ``influxdb`` 1.6) in one
request per precision, and parsed by Kelvin. InfluxDB names each line it cannot
parse in its answer; its stored points are read back with ``SELECT *``. Every
line must be taken or refused alike and every value of a taken line stored
alike, apart from the differences the line-protocol module documents (each
asserted here to be one of them): unsigned integers, times before 1970,
Kelvin's naming limits, and points InfluxDB drops after parsing (a tag or field
named ``time``). Values are compared for lines whose measurement and tags hold
no backslash: InfluxDB 1.6 unescapes those twice in its index and cannot read
them back itself.
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from services.collect_agent.line_protocol import LineProtocol, scan
from tests.collect_agent import lp_corpus
from tests.support.influxdb import InfluxDB

NOW = 1_764_500_000_000_000_000


@pytest.fixture(scope="module")
def influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB]:
    server = InfluxDB(tmp_path_factory.mktemp("influx-lp")).start()
    try:
        yield server
    finally:
        server.stop()


def write(server: InfluxDB, db: str, body: bytes, precision: str) -> str:
    """InfluxDB's error text for the write ('' when it took every line)."""
    server.query(f'CREATE DATABASE "{db}"')
    url = f"{server.url}/write?" + urllib.parse.urlencode({"db": db, "precision": precision})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30):
            return ""
    except urllib.error.HTTPError as exc:
        assert exc.code == 400, exc.code
        return str(json.loads(exc.read())["error"])


def stored(
    server: InfluxDB, db: str
) -> dict[bytes, list[tuple[bytes, dict[bytes, bytes], int, Any]]]:
    """field key -> [(measurement, tags, time ns, value)] of every stored point."""
    out: dict[bytes, list[tuple[bytes, dict[bytes, bytes], int, Any]]] = {}
    params = urllib.parse.urlencode({"db": db, "q": "SELECT * FROM /.*/ GROUP BY *", "epoch": "ns"})
    with urllib.request.urlopen(f"{server.url}/query?{params}", timeout=30) as resp:
        result = json.loads(resp.read())["results"][0]
    for series in result.get("series", []):
        tags = {k.encode(): v.encode() for k, v in (series.get("tags") or {}).items() if v}
        cols = series["columns"]
        for row in series["values"]:
            for col, v in zip(cols[1:], row[1:], strict=True):
                if v is not None:
                    out.setdefault(col.encode(), []).append(
                        (series["name"].encode(), tags, row[0], v)
                    )
    return out


def _kelvin_only_refusal(reason: str, message: str) -> bool:
    """Lines Kelvin refuses and InfluxDB parses, by design (module docstring of line_protocol)."""
    return reason == "bad_topic" or "before 1970" in message or "'time' is not allowed" in message


def _unsigned(point: scan.Point) -> bool:
    return any(raw[-1:] == b"u" and raw[:1] != b'"' for _, raw in point.fields)


@pytest.mark.parametrize("precision", ["ns", "s", "ms"])
def test_same_lines_refused_and_same_values_stored(influx: InfluxDB, precision: str) -> None:
    r = random.Random(f"influxd-{precision}")
    text = lp_corpus.body(r, 400, precision, unique=True)
    body = text.encode()
    error = write(influx, f"lp_{precision}", body, precision)
    points = stored(influx, f"lp_{precision}")
    res = LineProtocol().parse(body, precision, NOW)
    refused = {no: (reason, msg) for no, reason, msg in res.errors}
    taken = kelvin_only = influx_only = 0
    for no, start, end in scan.blocks(body):
        line = body[start:end]
        influx_refused = f"unable to parse '{line.decode()}'" in error
        if no in refused:
            reason, msg = refused[no]
            if not influx_refused:
                assert _kelvin_only_refusal(reason, msg), (no, line, reason, msg)
                kelvin_only += 1
            continue
        point = scan.parse_point(line)
        if influx_refused:
            assert _unsigned(point) and "invalid number" in error, (no, line)
            influx_only += 1
            continue
        taken += 1
        if b"\\" in line.split(b" ", 1)[0]:
            continue  # InfluxDB's index unescapes such names twice: SELECT cannot read them back
        ts = scan.timestamp_ns(point.timestamp, 1, line) if point.timestamp else None
        for key, raw in point.fields:
            value = scan.field_value(raw) if raw else None
            if key == b"time" or value is None:
                continue
            got = [p for p in points.get(key, []) if p[0] == point.measurement]
            assert got, (no, line, key)
            _m, tags, t, v = got[-1]
            assert tags == dict(point.tags), (no, line)
            assert float(v) == value, (no, line, key, v, value)
            if ts is not None:
                scale = {"ns": 1, "s": 10**9, "ms": 10**6}[precision]
                assert t == ts * scale, (no, line)
    assert taken > 80 and len(res.errors) > 150  # the corpus did its job: both kinds of line


@pytest.mark.parametrize(
    "body",
    [
        'a v=1\nb s="x\ny",v=2 5\nc v=3',  # a quoted newline is part of the line
        'a v=1\nb v="open\nc v=3\nd v=4',  # an open quote runs to the end
        "a v=1 5\\\nb v=2\nc v=3",  # a backslash takes the newline with it
        "a\\ b,t\\,k=v\\=w f\\ x=1 5\nc,t=a\\\\ v=1 6",  # escapes in names
        'm,t=x"y v=1 1\nm f"x=1 2\nm v=t"x" 3',  # quotes outside values are plain
        "m v=1 1\r\nm v=2 2\r\n",  # CRLF: refused
        "m,time=1 v=1 1\nm time=1,v=2 2\nn time=3 3",  # parsed, then dropped by InfluxDB
    ],
)
def test_line_ends_and_escapes(influx: InfluxDB, body: str) -> None:
    db = f"edge_{abs(hash(body)) % 10**8}"
    error = write(influx, db, body.encode(), "ns")
    points = stored(influx, db)
    res = LineProtocol().parse(body, "ns", NOW)
    refused = {no for no, _, _ in res.errors}
    blocks = list(scan.blocks(body.encode()))
    for no, start, end in blocks:
        line = body.encode()[start:end]
        if "dropped=" not in error:  # else InfluxDB reports the drops alone
            assert (no in refused) == (f"unable to parse '{line.decode()}'" in error), (no, error)
    names = sorted(
        {
            (m, tuple(sorted(t.items())), k)
            for k, ps in points.items()
            for m, t, _, v in ps
            if not isinstance(v, str)
        }
    )
    ours = sorted(
        {
            (p.measurement, tuple(sorted(p.tags)), k)
            for no, start, end in blocks
            if no not in refused
            for p in [scan.parse_point(body.encode()[start:end])]
            for k, raw in p.fields
            if raw[:1] != b'"' and k != b"time"
        }
    )
    assert names == ours
